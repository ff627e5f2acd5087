/* Many short-lived threads: each hops to a node, bumps a counter under a
 * mutex and returns. More threads are created over the run than the
 * runtime has thread ids, so ids, runtime blocks and shared stacks must be
 * recycled as threads exit and are joined.
 * usage: thread_churn [threads in total] [batch] */
#include <dex.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static long finished;

static void *visit(void *arg)
{
	dex_migrate((int)((long)arg % dex_nodes()));
	pthread_mutex_lock(&lock);
	finished++;
	pthread_mutex_unlock(&lock);
	dex_migrate(0);
	return arg;
}

int main(int argc, char **argv)
{
	long total = argc > 1 ? atol(argv[1]) : 3000;
	int batch = argc > 2 ? atoi(argv[2]) : 8;
	pthread_t tids[64];
	long wrong = 0;
	for (long done = 0; done < total; done += batch) {
		for (int i = 0; i < batch; i++)
			if (pthread_create(&tids[i], NULL, visit, (void *)(done + i)) != 0)
				wrong++;
		for (int i = 0; i < batch; i++) {
			void *r;
			pthread_join(tids[i], &r);
			wrong += (long)r != done + i;
		}
	}
	int ok = !wrong && finished == total;
	printf("%s churn: %ld threads finished of %ld, %ld wrong results\n", ok ? "PASS" : "FAIL", finished, total,
	       wrong);
	return !ok;
}
