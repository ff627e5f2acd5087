/*
 * Latency of XPMEM control operations between host processes: xpmem_get + xpmem_release of
 * another process's segment, and xpmem_make + xpmem_remove of a 1-page segment (explicit,
 * already converted after the first round). Prints median and p99 in microseconds.
 *   control_bench ITERATIONS
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <xpmem.h>

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static int compare(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static void report(const char *what, double *samples, int n)
{
	qsort(samples, n, sizeof *samples, compare);
	printf("%s %d %.1f %.1f\n", what, n, samples[n / 2], samples[(int)(n * 0.99)]);
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 2000;
	int sync[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sync) < 0)
		return 1;
	pid_t owner = fork();
	if (owner == 0) {
		void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		xpmem_segid_t segid = xpmem_make(p, 4096, XPMEM_PERMIT_MODE, (void *)0600);
		if (segid <= 0 || write(sync[1], &segid, sizeof segid) != sizeof segid)
			_exit(1);
		char done;
		if (read(sync[1], &done, 1) < 0)
			_exit(1);
		_exit(0);
	}
	xpmem_segid_t segid;
	if (read(sync[0], &segid, sizeof segid) != sizeof segid) {
		fprintf(stderr, "control_bench: owner failed\n");
		return 1;
	}
	double *samples = malloc(n * sizeof *samples);
	for (int i = 0; i < n; i++) {
		double t0 = now_us();
		xpmem_apid_t apid = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
		if (apid <= 0 || xpmem_release(apid) < 0) {
			fprintf(stderr, "control_bench: get/release: %s\n", strerror(errno));
			return 1;
		}
		samples[i] = now_us() - t0;
	}
	report("get+release", samples, n);
	void *mine = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	for (int i = 0; i < n; i++) {
		double t0 = now_us();
		xpmem_segid_t s = xpmem_make(mine, 4096, XPMEM_PERMIT_MODE, (void *)0600);
		if (s <= 0 || xpmem_remove(s) < 0) {
			fprintf(stderr, "control_bench: make/remove: %s\n", strerror(errno));
			return 1;
		}
		samples[i] = now_us() - t0;
	}
	report("make+remove", samples, n);
	if (write(sync[0], "x", 1) < 0)
		return 1;
	waitpid(owner, NULL, 0);
	return 0;
}
