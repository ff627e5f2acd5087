/* Coherence tests across nodes; each prints "PASS <name>" or "FAIL ...".
 *   mutex     - a counter under a pthread mutex, threads on every node
 *   barrier   - pthread_barrier phases; each phase checks everyone's writes
 *   condvar   - a producer/consumer queue with a condition variable
 *   pingpong  - two threads on two nodes writing one page alternately
 *   stackread - a thread migrates many times; others read its stack data
 *   coalesce  - threads on one node fault on the same pages together
 *   mmap      - an anonymous mapping made on a node is usable at the origin
 *   fileio    - open/write/read/fstat/close on a node; read() at the origin
 *               into a page the node holds
 * usage: coherence TEST [threads] [iterations] */
#include <dex.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int threads = 4;
static long iterations = 2000;

static pthread_mutex_t counter_lock = PTHREAD_MUTEX_INITIALIZER;
static long counter;

static int node_for(int index)
{
	return index % dex_nodes();
}

static void go(int node)
{
	if (node != dex_node() && dex_migrate(node) != 0) {
		printf("FAIL migrate to %d\n", node);
		exit(1);
	}
}

static void *mutex_worker(void *arg)
{
	int index = (int)(long)arg;
	go(node_for(index));
	for (long i = 0; i < iterations; i++) {
		pthread_mutex_lock(&counter_lock);
		counter++;
		pthread_mutex_unlock(&counter_lock);
	}
	go(0);
	return NULL;
}

static pthread_barrier_t barrier;
static long *phase_marks; /* one slot per thread, all in one page */

static void *barrier_worker(void *arg)
{
	int index = (int)(long)arg;
	go(node_for(index));
	long bad = 0;
	for (long phase = 1; phase <= iterations; phase++) {
		phase_marks[index] = phase;
		pthread_barrier_wait(&barrier);
		for (int t = 0; t < threads; t++)
			if (phase_marks[t] != phase)
				bad++;
		pthread_barrier_wait(&barrier);
	}
	go(0);
	return (void *)bad;
}

#define QUEUE 16
static struct {
	pthread_mutex_t lock;
	pthread_cond_t changed;
	long items[QUEUE];
	int head, count;
} queue = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, { 0 }, 0, 0 };

static void *producer(void *arg)
{
	go(node_for((int)(long)arg));
	for (long i = 1; i <= iterations; i++) {
		pthread_mutex_lock(&queue.lock);
		while (queue.count == QUEUE)
			pthread_cond_wait(&queue.changed, &queue.lock);
		queue.items[(queue.head + queue.count++) % QUEUE] = i;
		pthread_cond_broadcast(&queue.changed);
		pthread_mutex_unlock(&queue.lock);
	}
	go(0);
	return NULL;
}

static void *consumer(void *arg)
{
	go(node_for((int)(long)arg));
	long sum = 0;
	for (long i = 1; i <= iterations; i++) {
		pthread_mutex_lock(&queue.lock);
		while (queue.count == 0)
			pthread_cond_wait(&queue.changed, &queue.lock);
		sum += queue.items[queue.head];
		queue.head = (queue.head + 1) % QUEUE;
		queue.count--;
		pthread_cond_broadcast(&queue.changed);
		pthread_mutex_unlock(&queue.lock);
	}
	go(0);
	return (void *)sum;
}

/* Two threads take turns on one word: each waits for the other's value,
 * so every step moves the page between nodes (the paper's contention
 * microbenchmark, with a strict order so the result is checkable). */
static volatile long turn;

static void *pingpong_worker(void *arg)
{
	long me = (long)arg;
	go(me == 0 ? 0 : dex_nodes() - 1);
	for (long i = 0; i < iterations; i++) {
		while (turn % 2 != me)
			;
		turn++;
	}
	go(0);
	return NULL;
}

static volatile long *volatile published_stack_value;
static volatile int traveller_done;

static void *traveller(void *arg)
{
	(void)arg;
	volatile long on_my_stack = 0;
	published_stack_value = &on_my_stack;
	for (long i = 1; i <= iterations; i++) {
		go((int)(i % dex_nodes()));
		on_my_stack = i;
	}
	go(0);
	traveller_done = 1;
	/* Keep the frame alive until the readers stop. */
	while (published_stack_value)
		;
	return NULL;
}

static void *stack_reader(void *arg)
{
	go(node_for((int)(long)arg));
	long last = 0, regressions = 0;
	while (!published_stack_value)
		;
	while (!traveller_done) {
		long v = *published_stack_value;
		if (v < last)
			regressions++; /* sequential consistency: never go back */
		last = v;
	}
	go(0);
	return (void *)regressions;
}

/* Several threads on the last node read the same pages at the same time;
 * with DEX_TRACE the trace shows one request per page and the other
 * threads' faults coalesced onto it. */
#define COALESCE_PAGES 256
static char *fresh_pages;
static pthread_barrier_t start_line;

static void *same_pages_reader(void *arg)
{
	(void)arg;
	go(dex_nodes() - 1);
	pthread_barrier_wait(&start_line);
	long sum = 0;
	for (long p = 0; p < COALESCE_PAGES; p++)
		sum += fresh_pages[p * 4096];
	go(0);
	return (void *)sum;
}

/* File I/O from a node goes to the origin's descriptors; read() writes
 * into shared buffers wherever their pages currently are. */
static char file_text[] = "written through a delegated write() on a node\n";
static char file_path[64];
static char *node_written; /* heap buffer last written on the node */

static void *file_worker(void *arg)
{
	(void)arg;
	go(dex_nodes() - 1);
	long bad = 0;
	snprintf(file_path, sizeof(file_path), "/tmp/dex-fileio-%d", (int)getpid());
	int fd = open(file_path, O_CREAT | O_TRUNC | O_RDWR, 0600);
	size_t len = strlen(file_text);
	bad += fd < 0;
	bad += write(fd, file_text, len) != (ssize_t)len;
	bad += lseek(fd, 0, SEEK_SET) != 0;
	char on_stack[128] = { 0 };
	bad += read(fd, on_stack, sizeof(on_stack)) != (ssize_t)len; /* into this node's stack page */
	bad += memcmp(on_stack, file_text, len) != 0;
	struct stat st;
	bad += fstat(fd, &st) != 0 || st.st_size != (off_t)len;
	bad += close(fd) != 0;
	memset(node_written, 'n', 4096); /* the node now owns this page */
	go(0);
	return (void *)bad;
}

/* mmap() on a node returns memory every node can use. */
static unsigned char *mapped;
#define MAPPED_BYTES (1 << 20)

static void *mapper(void *arg)
{
	(void)arg;
	go(dex_nodes() - 1);
	mapped = mmap(NULL, MAPPED_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	long bad = mapped == MAP_FAILED;
	for (long i = 0; !bad && i < MAPPED_BYTES; i++) {
		bad += mapped[i] != 0; /* fresh mappings are zero */
		mapped[i] = (unsigned char)(i * 7);
	}
	go(0);
	return (void *)bad;
}

static pthread_t spawn(void *(*fn)(void *), long arg)
{
	pthread_t t;
	if (pthread_create(&t, NULL, fn, (void *)arg) != 0) {
		printf("FAIL pthread_create\n");
		exit(1);
	}
	return t;
}

static long join(pthread_t t)
{
	void *r;
	pthread_join(t, &r);
	return (long)r;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s mutex|barrier|condvar|pingpong|stackread [threads] [iterations]\n", argv[0]);
		return 2;
	}
	if (argc > 2)
		threads = atoi(argv[2]);
	if (argc > 3)
		iterations = atol(argv[3]);
	const char *test = argv[1];
	pthread_t tid[64];
	if (!strcmp(test, "mutex")) {
		for (int i = 0; i < threads; i++)
			tid[i] = spawn(mutex_worker, i);
		for (int i = 0; i < threads; i++)
			join(tid[i]);
		long want = threads * iterations;
		printf("%s mutex: counter %ld, expected %ld on %d nodes\n", counter == want ? "PASS" : "FAIL", counter,
		       want, dex_nodes());
		return counter != want;
	}
	if (!strcmp(test, "barrier")) {
		phase_marks = calloc((size_t)threads, sizeof(long));
		pthread_barrier_init(&barrier, NULL, (unsigned)threads);
		for (int i = 0; i < threads; i++)
			tid[i] = spawn(barrier_worker, i);
		long bad = 0;
		for (int i = 0; i < threads; i++)
			bad += join(tid[i]);
		printf("%s barrier: %ld stale reads over %ld phases\n", bad ? "FAIL" : "PASS", bad, iterations);
		return bad != 0;
	}
	if (!strcmp(test, "condvar")) {
		pthread_t p = spawn(producer, 1), c = spawn(consumer, 2);
		join(p);
		long sum = join(c), want = iterations * (iterations + 1) / 2;
		printf("%s condvar: sum %ld, expected %ld\n", sum == want ? "PASS" : "FAIL", sum, want);
		return sum != want;
	}
	if (!strcmp(test, "pingpong")) {
		pthread_t a = spawn(pingpong_worker, 0), b = spawn(pingpong_worker, 1);
		join(a);
		join(b);
		printf("%s pingpong: turn %ld, expected %ld\n", turn == 2 * iterations ? "PASS" : "FAIL", turn,
		       2 * iterations);
		return turn != 2 * iterations;
	}
	if (!strcmp(test, "stackread")) {
		pthread_t t = spawn(traveller, 0);
		long regressions = 0;
		for (int i = 1; i < threads; i++)
			tid[i] = spawn(stack_reader, i);
		for (int i = 1; i < threads; i++)
			regressions += join(tid[i]);
		published_stack_value = NULL;
		join(t);
		printf("%s stackread: %ld regressions while the owner migrated %ld times\n",
		       regressions ? "FAIL" : "PASS", regressions, iterations);
		return regressions != 0;
	}
	if (!strcmp(test, "fileio")) {
		node_written = dex_malloc_aligned(4096);
		long bad = join(spawn(file_worker, 0));
		/* At the origin, the kernel fills a buffer whose page the node
		 * holds: the runtime must fetch it first or read() gets EFAULT. */
		int fd = open(file_path, O_RDONLY);
		ssize_t got = read(fd, node_written, 4096);
		size_t len = strlen(file_text);
		bad += got != (ssize_t)len || memcmp(node_written, file_text, len) != 0 || node_written[len] != 'n';
		close(fd);
		unlink(file_path);
		printf("%s fileio: %ld problems (read returned %zd)\n", bad ? "FAIL" : "PASS", bad, got);
		return bad != 0;
	}
	if (!strcmp(test, "mmap")) {
		long bad = join(spawn(mapper, 0));
		for (long i = 0; !bad && i < MAPPED_BYTES; i++)
			bad += mapped[i] != (unsigned char)(i * 7);
		bad += munmap(mapped, MAPPED_BYTES) != 0;
		printf("%s mmap: %ld problems with 1 MiB mapped and written on node %d\n", bad ? "FAIL" : "PASS", bad,
		       dex_nodes() - 1);
		return bad != 0;
	}
	if (!strcmp(test, "coalesce")) {
		fresh_pages = dex_malloc_aligned(COALESCE_PAGES * 4096);
		for (long p = 0; p < COALESCE_PAGES; p++)
			fresh_pages[p * 4096] = 1;
		pthread_barrier_init(&start_line, NULL, (unsigned)threads);
		long total = 0;
		for (int i = 0; i < threads; i++)
			tid[i] = spawn(same_pages_reader, i);
		for (int i = 0; i < threads; i++)
			total += join(tid[i]);
		long want = (long)threads * COALESCE_PAGES;
		printf("%s coalesce: sum %ld, expected %ld\n", total == want ? "PASS" : "FAIL", total, want);
		return total != want;
	}
	fprintf(stderr, "unknown test %s\n", test);
	return 2;
}
