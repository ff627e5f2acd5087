/*
 * Host -> host XPMEM attach throughput, as XEMEM's Fig. 5/6 and Table 2 measure it: an owner
 * process exports one region; another process attaches it repeatedly and we report
 * bytes attached per second of attach time.
 *
 *   attach_bench BACKING MIB ITERATIONS MODE
 *     BACKING     4k (private anonymous memory, converted to memfd backing at make time)
 *                 2m (a 2 MiB hugetlb memfd, shared as it is)
 *     MODE        attach (attach only), touch (attach + touch one int per page),
 *                 read (attach + read every byte, summed as 64-bit words)
 *
 * Prints one line: backing, MiB, iterations, mode, GB/s, median attach us, detach us, and the
 * single-core read bandwidth of a local buffer of the same size in the same run (the limit the
 * attach+read figure is held against).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <xpmem.h>

#define PAGE 4096UL

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *what)
{
	fprintf(stderr, "attach_bench: %s: %s\n", what, strerror(errno));
	exit(1);
}

static int compare(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static uint64_t sum_words(const uint64_t *p, size_t bytes)
{
	uint64_t a = 0, b = 0, c = 0, d = 0;
	for (size_t i = 0; i < bytes / 8; i += 4) {
		a += p[i];
		b += p[i + 1];
		c += p[i + 2];
		d += p[i + 3];
	}
	return a + b + c + d;
}

static void *owner_region(int huge, size_t bytes)
{
	void *p;
	if (huge) {
		int fd = memfd_create("bench", MFD_CLOEXEC | MFD_HUGETLB | (21 << 26) /* MFD_HUGE_2MB */);
		if (fd < 0 || ftruncate(fd, bytes) < 0)
			die("hugetlb memfd (reserve vm.nr_hugepages)");
		p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	} else {
		p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	}
	if (p == MAP_FAILED)
		die("mmap");
	for (size_t i = 0; i < bytes; i += PAGE)
		((volatile char *)p)[i] = (char)(i / PAGE);
	return p;
}

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: %s 4k|2m MIB ITERATIONS attach|touch|read\n", argv[0]);
		return 2;
	}
	int huge = !strcmp(argv[1], "2m");
	size_t bytes = (size_t)atol(argv[2]) << 20;
	int iterations = atoi(argv[3]);
	const char *mode = argv[4];
	int touch = !strcmp(mode, "touch"), read_all = !strcmp(mode, "read");
	int sync[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sync) < 0)
		die("socketpair");
	pid_t owner = fork();
	if (owner == 0) {
		void *p = owner_region(huge, bytes);
		xpmem_segid_t segid = xpmem_make(p, bytes, XPMEM_PERMIT_MODE, (void *)0600);
		if (segid <= 0)
			die("xpmem_make");
		if (write(sync[1], &segid, sizeof segid) != sizeof segid)
			die("write");
		char done;
		if (read(sync[1], &done, 1) < 0)
			die("read");
		xpmem_remove(segid);
		_exit(0);
	}
	xpmem_segid_t segid;
	if (read(sync[0], &segid, sizeof segid) != sizeof segid)
		die("owner failed");
	xpmem_apid_t apid = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
	if (apid <= 0)
		die("xpmem_get");

	/* The limit: one core reading a local buffer of the same size. */
	uint64_t *local = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (local == MAP_FAILED)
		die("local buffer");
	memset(local, 1, bytes);
	double best_read = 1e9;
	uint64_t sink = 0;
	for (int i = 0; i < 3; i++) {
		double t0 = now();
		sink += sum_words(local, bytes);
		double t = now() - t0;
		if (t < best_read)
			best_read = t;
	}
	munmap(local, bytes);

	double *attach_times = malloc(iterations * sizeof *attach_times);
	double total = 0, detach_total = 0;
	for (int i = 0; i < iterations; i++) {
		double t0 = now();
		char *p = xpmem_attach((struct xpmem_addr){ apid, 0 }, bytes, NULL);
		if (p == (void *)-1)
			die("xpmem_attach");
		if (touch)
			for (size_t at = 0; at < bytes; at += PAGE)
				sink += ((volatile char *)p)[at];
		if (read_all)
			sink += sum_words((const uint64_t *)p, bytes);
		double t1 = now();
		if (xpmem_detach(p) < 0)
			die("xpmem_detach");
		detach_total += now() - t1;
		attach_times[i] = t1 - t0;
		total += t1 - t0;
	}
	qsort(attach_times, iterations, sizeof *attach_times, compare);
	printf("%s %zu %d %s %.2f %.1f %.1f %.2f %llu\n", argv[1], bytes >> 20, iterations, mode,
	       (double)bytes * iterations / total / 1e9, attach_times[iterations / 2] * 1e6,
	       detach_total / iterations * 1e6, (double)bytes / best_read / 1e9, (unsigned long long)(sink & 1));
	xpmem_release(apid);
	if (write(sync[0], "x", 1) < 0)
		die("write");
	waitpid(owner, NULL, 0);
	return 0;
}
