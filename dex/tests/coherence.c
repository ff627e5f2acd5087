/* Coherence tests across nodes; each prints "PASS <name>" or "FAIL ...".
 *   mutex     - a counter under a pthread mutex, threads on every node
 *   barrier   - pthread_barrier phases; each phase checks everyone's writes
 *   condvar   - a producer/consumer queue with a condition variable
 *   pingpong  - two threads on two nodes writing one page alternately
 *   stackread - a thread migrates many times; others read its stack data
 *   stackhome - a thread writes its stack top on node 1 and goes home
 *               (carrying that page); the origin checks and rewrites it,
 *               then a thread on the last node reads the origin's bytes
 *   coalesce  - threads on one node fault on the same pages together
 *   mmap      - an anonymous mapping made on a node is usable at the origin
 *   fileio    - open/write/read/fstat/close on a node; read() at the origin
 *               into a page the node holds
 *   mapmove   - mmap and write on node 1, read on the last node; mremap there
 *   unmap     - munmap on the last node; node 1 and the origin then fault
 *   protect   - mprotect(PROT_READ) at the origin; a write on node 1 faults
 *   brk       - brk grown on node 1, used everywhere, shrunk, grown again
 *   affinity  - threads set their own CPU masks at the origin and migrate
 *               to the last node and back: each finds its mask as it set it
 * (the last four want 3 nodes; SIGSEGV is caught with sigaction+siglongjmp)
 * usage: coherence TEST [threads] [iterations] */
#include <dex.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/syscall.h>
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
static long serial_returns; /* PTHREAD_BARRIER_SERIAL_THREAD: one per round */

static void barrier_wait_counted(void)
{
	if (pthread_barrier_wait(&barrier) == PTHREAD_BARRIER_SERIAL_THREAD)
		__atomic_fetch_add(&serial_returns, 1, __ATOMIC_RELAXED);
}

static void *barrier_worker(void *arg)
{
	int index = (int)(long)arg;
	go(node_for(index));
	long bad = 0;
	for (long phase = 1; phase <= iterations; phase++) {
		phase_marks[index] = phase;
		barrier_wait_counted();
		for (int t = 0; t < threads; t++)
			if (phase_marks[t] != phase)
				bad++;
		barrier_wait_counted();
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

/* stackhome: the block lies in the traveller's frame, just above
 * dex_migrate's, so in the stack page(s) a thread going home carries. */
#define HOME_BLOCK 256
static volatile unsigned char *volatile home_block;
static volatile long home_round;    /* the round whose origin bytes are in home_block */
static volatile long checked_round; /* the last round the remote reader checked */

static unsigned char home_byte(long round, int i, int node)
{
	return (unsigned char)(round * 31 + i * 7 + node * 101);
}

static void *home_traveller(void *arg)
{
	(void)arg;
	volatile unsigned char block[HOME_BLOCK];
	long bad = 0;
	home_block = block;
	for (long r = 1; r <= iterations; r++) {
		go(1);
		for (int i = 0; i < HOME_BLOCK; i++)
			block[i] = home_byte(r, i, 1);
		go(0);
		for (int i = 0; i < HOME_BLOCK; i++)
			bad += block[i] != home_byte(r, i, 1); /* node 1's bytes came home */
		for (int i = 0; i < HOME_BLOCK; i++)
			block[i] = home_byte(r, i, 0);
		home_round = r;
		while (checked_round != r)
			;
	}
	return (void *)bad;
}

static void *home_reader(void *arg)
{
	(void)arg;
	go(dex_nodes() - 1);
	long bad = 0;
	for (long r = 1; r <= iterations; r++) {
		while (home_round != r)
			;
		for (int i = 0; i < HOME_BLOCK; i++)
			bad += home_block[i] != home_byte(r, i, 0); /* no stale copy of node 1's */
		checked_round = r;
	}
	go(0);
	return (void *)bad;
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

/* --- layout changes (mmap/munmap/mprotect/mremap/brk run at the origin) */

#define PAGE 4096
static sigjmp_buf fault_jump;
static void *volatile fault_address;
static volatile int fault_code;
static long layout_problems;

static void on_segv(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)uc;
	fault_address = si->si_addr;
	fault_code = si->si_code;
	siglongjmp(fault_jump, 1);
}

static void catch_segv(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_segv;
	sa.sa_flags = SA_SIGINFO;
	sigaction(SIGSEGV, &sa, NULL);
}

/* 0: the access went through; else the si_code of the SIGSEGV it raised. */
static int access_faults(volatile char *p, int write)
{
	fault_address = NULL;
	if (sigsetjmp(fault_jump, 1) == 0) {
		if (write)
			*p = 42;
		else
			(void)*p;
		return 0;
	}
	if (fault_address != (void *)p) {
		printf("FAIL fault reported at %p for an access to %p\n", fault_address, (void *)p);
		layout_problems++;
	}
	return fault_code;
}

static void expect(int ok, const char *what)
{
	if (!ok) {
		printf("FAIL on node %d: %s\n", dex_node(), what);
		layout_problems++;
	}
}

static int last_node(void)
{
	return dex_nodes() - 1;
}

/* `pages` fresh pages mapped on node 1 and filled there with `byte`, so that node 1 holds
 * every page, writable (the caller is left on node 1). */
static char *held_by_node1(long pages, int byte)
{
	go(1);
	char *m = mmap(NULL, pages * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	expect(m != MAP_FAILED, "mmap on node 1");
	memset(m, byte, pages * PAGE);
	return m;
}

static void *mapmove_worker(void *arg)
{
	(void)arg;
	go(1);
	unsigned char *m = mmap(NULL, MAPPED_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	expect(m != MAP_FAILED, "mmap on node 1");
	for (long i = 0; i < MAPPED_BYTES; i++)
		m[i] = (unsigned char)(i * 13);
	go(last_node());
	long wrong = 0;
	for (long i = 0; i < MAPPED_BYTES; i++)
		wrong += m[i] != (unsigned char)(i * 13);
	expect(wrong == 0, "node 1's writes read back on the last node");
	/* Grown with a move on the last node: the bytes follow, the old range is gone. */
	unsigned char *grown = mremap(m, MAPPED_BYTES, 2 * MAPPED_BYTES, MREMAP_MAYMOVE);
	expect(grown != MAP_FAILED, "mremap grows");
	for (long i = 0; grown != MAP_FAILED && i < MAPPED_BYTES; i++)
		wrong += grown[i] != (unsigned char)(i * 13);
	expect(wrong == 0, "mremap kept the bytes");
	if (grown != MAP_FAILED && grown != m)
		expect(access_faults((volatile char *)m, 0) == SEGV_MAPERR, "the old range faults after mremap");
	go(1);
	if (grown != MAP_FAILED) {
		/* write() from a buffer node 1 has not seen: the runtime learns
		 * its mapping while copying it into the delegated call */
		int null_fd = open("/dev/null", O_WRONLY);
		expect(write(null_fd, grown + MAPPED_BYTES / 2, 3 * PAGE) == 3 * PAGE, "write() from the moved mapping");
		close(null_fd);
		grown[2 * MAPPED_BYTES - 1] = 7; /* growth learnt on demand */
		expect(munmap(grown, 2 * MAPPED_BYTES) == 0, "munmap");
	}
	go(0);
	return NULL;
}

static void *unmap_worker(void *arg)
{
	(void)arg;
	char *m = held_by_node1(16, 1);
	go(last_node());
	expect(munmap(m + 4 * PAGE, 8 * PAGE) == 0, "munmap of the middle on the last node");
	expect(access_faults(m + 5 * PAGE, 0) == SEGV_MAPERR, "read after munmap faults on the last node");
	go(1);
	expect(access_faults(m + 4 * PAGE, 0) == SEGV_MAPERR, "read after munmap faults on node 1");
	expect(access_faults(m + 11 * PAGE + 5, 1) == SEGV_MAPERR, "write after munmap faults on node 1");
	expect(access_faults(m + 3 * PAGE, 1) == 0 && access_faults(m + 12 * PAGE, 1) == 0,
	       "the pages around the hole stay mapped on node 1");
	go(0);
	expect(access_faults(m + 7 * PAGE, 0) == SEGV_MAPERR, "read after munmap faults at the origin");
	expect(m[3 * PAGE] == 42 && m[12 * PAGE] == 42, "the rest of the mapping is intact at the origin");
	munmap(m, 16 * PAGE);
	expect(access_faults(m, 0) == SEGV_MAPERR, "whole mapping gone");
	/* The address range is handed out again, zeroed, on every node. */
	char *again = mmap(NULL, 8 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	expect(again >= m && again < m + 16 * PAGE, "an unmapped range is reused");
	go(1);
	long nonzero = 0;
	for (long i = 0; i < 8 * PAGE; i++)
		nonzero += again[i] != 0;
	expect(nonzero == 0, "a reused range reads as zeroes on node 1");
	go(0);
	munmap(again, 8 * PAGE);
	return NULL;
}

static void *protect_worker(void *arg)
{
	(void)arg;
	char *m = held_by_node1(4, 3);
	go(0);
	expect(mprotect(m, 4 * PAGE, PROT_READ) == 0, "mprotect read-only at the origin");
	expect(access_faults(m, 1) == SEGV_ACCERR, "write faults at the origin");
	go(1);
	expect(access_faults(m + PAGE, 0) == 0 && m[PAGE] == 3, "read still works on node 1");
	expect(access_faults(m + 2 * PAGE, 1) == SEGV_ACCERR, "write faults on node 1");
	expect(m[2 * PAGE] == 3, "the refused write left the byte alone");
	/* Upgrading again (from a node) is growth: node 1 learns it on demand. */
	expect(mprotect(m, 4 * PAGE, PROT_READ | PROT_WRITE) == 0, "mprotect back to read-write on node 1");
	expect(access_faults(m + 2 * PAGE, 1) == 0, "write works again on node 1");
	go(last_node());
	expect(access_faults(m + 3 * PAGE, 1) == 0 && m[2 * PAGE] == 42, "and on the last node");
	expect(mprotect(m, 4 * PAGE, PROT_NONE) == 0, "mprotect PROT_NONE on the last node");
	go(1);
	expect(access_faults(m, 0) == SEGV_ACCERR, "PROT_NONE: read faults on node 1");
	go(0);
	munmap(m, 4 * PAGE);
	return NULL;
}

static void *brk_worker(void *arg)
{
	(void)arg;
	go(1);
	char *base = (char *)syscall(SYS_brk, 0);
	char *top = (char *)syscall(SYS_brk, base + 3 * PAGE + 100);
	expect(top == base + 3 * PAGE + 100, "brk grows on node 1");
	for (long i = 0; i < 3 * PAGE + 100; i++)
		expect(base[i] == 0 || (printf("byte %ld\n", i), 0), "fresh brk memory is zero");
	memset(base, 9, 3 * PAGE + 100);
	go(last_node());
	expect((char *)syscall(SYS_brk, 0) == top, "the break is the same on the last node");
	expect(base[3 * PAGE + 99] == 9 && base[0] == 9, "node 1's writes seen on the last node");
	expect((char *)syscall(SYS_brk, base + PAGE) == base + PAGE, "brk shrinks on the last node");
	go(1);
	expect(access_faults(base + 2 * PAGE, 0) == SEGV_MAPERR, "shrunk brk faults on node 1");
	expect(base[PAGE - 1] == 9, "below the break stays");
	go(0);
	expect(access_faults(base + 3 * PAGE, 1) == SEGV_MAPERR, "shrunk brk faults at the origin");
	expect((char *)syscall(SYS_brk, base + 4 * PAGE) == base + 4 * PAGE, "brk grows again at the origin");
	expect(base[2 * PAGE] == 0 && base[3 * PAGE + 50] == 0, "regrown brk memory is zero");
	go(1);
	expect(base[2 * PAGE + 1] == 0 && access_faults(base + 4 * PAGE - 1, 1) == 0, "node 1 learns the regrowth");
	syscall(SYS_brk, base);
	go(last_node());
	/* glibc's sbrk() moves the same shared break (libdex interposes it) */
	char *old_break = sbrk(2 * PAGE);
	expect(old_break == base && sbrk(0) == base + 2 * PAGE, "sbrk on the last node");
	memset(old_break, 5, 2 * PAGE);
	go(0);
	expect(base[2 * PAGE - 1] == 5, "sbrk memory seen at the origin");
	expect(sbrk(-2 * PAGE) == base + 2 * PAGE, "sbrk shrinks at the origin");
	return NULL;
}

/* affinity: the runtime narrows a parked home thread's mask for its
 * wake-up; the application's own mask must be back when it runs. Each
 * thread cycles through every single online CPU and the full set. */
static void *affinity_worker(void *arg)
{
	(void)arg;
	cpu_set_t all, want, got;
	long bad = 0;
	if (sched_getaffinity(0, sizeof(all), &all) != 0)
		return (void *)1L;
	int ncpus = CPU_COUNT(&all), cpu = -1;
	for (long r = 0; r < iterations; r++) {
		if (r % (ncpus + 1) == (long)ncpus) {
			want = all;
		} else {
			do
				cpu = (cpu + 1) % CPU_SETSIZE;
			while (!CPU_ISSET(cpu, &all));
			CPU_ZERO(&want);
			CPU_SET(cpu, &want);
		}
		if (sched_setaffinity(0, sizeof(want), &want) != 0)
			return (void *)1L;
		go(dex_nodes() - 1);
		go(0);
		bad += sched_getaffinity(0, sizeof(got), &got) != 0 || !CPU_EQUAL(&got, &want);
	}
	sched_setaffinity(0, sizeof(all), &all);
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
		fprintf(stderr, "usage: %s mutex|barrier|condvar|pingpong|stackread|stackhome|... [threads] [iterations]\n", argv[0]);
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
		int destroyed = pthread_barrier_destroy(&barrier);
		int ok = !bad && serial_returns == 2 * iterations && destroyed == 0;
		printf("%s barrier: %ld stale reads over %ld phases, %ld serial returns (want %ld), destroy %d\n",
		       ok ? "PASS" : "FAIL", bad, iterations, serial_returns, 2 * iterations, destroyed);
		return !ok;
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
	if (!strcmp(test, "stackhome")) {
		pthread_t reader = spawn(home_reader, 0);
		long bad = join(spawn(home_traveller, 0));
		bad += join(reader);
		printf("%s stackhome: %ld stale bytes in %ld returns\n", bad ? "FAIL" : "PASS", bad, iterations);
		return bad != 0;
	}
	if (!strcmp(test, "affinity")) {
		long bad = 0;
		for (int i = 0; i < threads; i++)
			tid[i] = spawn(affinity_worker, i);
		for (int i = 0; i < threads; i++)
			bad += join(tid[i]);
		printf("%s affinity: %ld masks not as the threads set them after %ld returns each\n", bad ? "FAIL" : "PASS",
		       bad, iterations);
		return bad != 0;
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
	if (!strcmp(test, "mapmove") || !strcmp(test, "unmap") || !strcmp(test, "protect") || !strcmp(test, "brk")) {
		void *(*worker)(void *) = !strcmp(test, "mapmove") ? mapmove_worker
					  : !strcmp(test, "unmap") ? unmap_worker
					  : !strcmp(test, "protect") ? protect_worker : brk_worker;
		catch_segv();
		join(spawn(worker, 0));
		printf("%s %s: %ld problems\n", layout_problems ? "FAIL" : "PASS", test, layout_problems);
		return layout_problems != 0;
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
