/* pthreads: create/join, a mutex-protected counter, a condition variable hand-off, a
   barrier, thread ids and thread-local storage. Output does not depend on scheduling. */
#include <pthread.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

#define THREADS 4
#define ROUNDS 1000

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static pthread_barrier_t barrier;
static long counter;
static int turn;
static __thread int thread_local_value;
static int distinct_tids[THREADS];

static void *worker(void *argument) {
    int index = (int)(long)argument;
    thread_local_value = index * 10;
    distinct_tids[index] = (pid_t)syscall(SYS_gettid) != getpid();
    for (int i = 0; i < ROUNDS; i++) {
        pthread_mutex_lock(&lock);
        counter++;
        pthread_mutex_unlock(&lock);
        if (i % 100 == 0)
            sched_yield();
    }
    pthread_barrier_wait(&barrier);
    /* Take turns in index order through the condition variable. */
    pthread_mutex_lock(&lock);
    while (turn != index)
        pthread_cond_wait(&changed, &lock);
    printf("thread %d: counter %ld after the barrier, tls %d\n", index, counter, thread_local_value);
    turn++;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
    return (void *)(long)(index + 100);
}

int main(void) {
    pthread_t threads[THREADS];
    pthread_barrier_init(&barrier, NULL, THREADS);
    thread_local_value = -1;
    for (long i = 0; i < THREADS; i++)
        if (pthread_create(&threads[i], NULL, worker, (void *)i) != 0)
            return 1;
    long sum = 0;
    for (int i = 0; i < THREADS; i++) {
        void *result;
        pthread_join(threads[i], &result);
        sum += (long)result;
    }
    int distinct = 0;
    for (int i = 0; i < THREADS; i++)
        distinct += distinct_tids[i];
    printf("joined: sum of results %ld, counter %ld, distinct tids %d, main tls %d\n", sum, counter, distinct, thread_local_value);
    return 0;
}
