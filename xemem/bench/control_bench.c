/*
 * Latency of XPMEM control operations. Prints "OPERATION COUNT MEDIAN_US P99_US" lines.
 *
 *   control_bench ITERATIONS
 *       host process to host process: xpmem_get + xpmem_release of another process's segment,
 *       and xpmem_make + xpmem_remove of a 1-page segment (already converted after the first
 *       round)
 *   control_bench named NAME MIB ITERATIONS
 *       across enclaves: get + release of the named segment NAME (MIB long; another enclave's),
 *       and the named make + remove (xemem_make) of a 1-page segment of this process; from an
 *       LWK job both go through the enclave's node to clowderd. Then signals NAME's owner
 *       that it may go (bench_common.h).
 */
#include "bench_common.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>

static const char *program = "control_bench";

static void report(const char *what, double *samples, int n)
{
	double median = quantile(samples, n, 0.5), p99 = quantile(samples, n, 0.99);
	printf("%s %d %.1f %.1f\n", what, n, median, p99);
	fflush(stdout);
}

static int parse_count(const char *text)
{
	return (int)parse_whole(program, text, 1000000, "an iteration count");
}

/* get + release of SEGID, N times, into SAMPLES (us). */
static void time_get_release(xpmem_segid_t segid, double *samples, int n)
{
	for (int i = 0; i < n; i++) {
		double t0 = now();
		xpmem_apid_t apid = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
		if (apid <= 0 || xpmem_release(apid) < 0)
			die(program, "get/release");
		samples[i] = (now() - t0) * 1e6;
	}
	report("get+release", samples, n);
}

static double *new_samples(int n)
{
	double *samples = malloc(n * sizeof *samples);
	if (!samples)
		die(program, "malloc");
	return samples;
}

static void *one_page(void)
{
	void *page = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (page == MAP_FAILED)
		die(program, "mmap");
	*(volatile char *)page = 1;
	return page;
}

static int run_pair(int n)
{
	int sync[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sync) < 0)
		die(program, "socketpair");
	pid_t owner = fork();
	if (owner == 0) {
		xpmem_segid_t segid = xpmem_make(one_page(), PAGE, XPMEM_PERMIT_MODE, (void *)0600);
		if (segid <= 0 || write(sync[1], &segid, sizeof segid) != sizeof segid)
			_exit(1);
		char done;
		if (read(sync[1], &done, 1) < 0)
			_exit(1);
		_exit(0);
	}
	xpmem_segid_t segid;
	if (read(sync[0], &segid, sizeof segid) != sizeof segid) {
		fprintf(stderr, "%s: owner failed\n", program);
		return 1;
	}
	double *samples = new_samples(n);
	time_get_release(segid, samples, n);
	void *mine = one_page();
	for (int i = 0; i < n; i++) {
		double t0 = now();
		xpmem_segid_t s = xpmem_make(mine, PAGE, XPMEM_PERMIT_MODE, (void *)0600);
		if (s <= 0 || xpmem_remove(s) < 0)
			die(program, "make/remove");
		samples[i] = (now() - t0) * 1e6;
	}
	report("make+remove", samples, n);
	if (write(sync[0], "x", 1) < 0)
		die(program, "write");
	waitpid(owner, NULL, 0);
	return 0;
}

static int run_named(const char *name, const char *mib_text, int n)
{
	long mib = parse_whole(program, mib_text, 65536, "MIB");
	xpmem_segid_t segid = find_named(program, name);
	double *samples = new_samples(n);
	time_get_release(segid, samples, n);
	char own_name[64];
	snprintf(own_name, sizeof own_name, "%.40s-control", name);
	void *mine = one_page();
	for (int i = 0; i < n; i++) {
		double t0 = now();
		xpmem_segid_t s = xemem_make(mine, PAGE, own_name);
		if (s <= 0 || xpmem_remove(s) < 0)
			die(program, "named make/remove");
		samples[i] = (now() - t0) * 1e6;
	}
	report("make+remove", samples, n);
	xpmem_apid_t apid = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
	if (apid <= 0)
		die(program, "xpmem_get");
	signal_done(program, apid, (size_t)mib << 20);
	xpmem_release(apid);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 5 && !strcmp(argv[1], "named"))
		return run_named(argv[2], argv[3], parse_count(argv[4]));
	if (argc == 2)
		return run_pair(parse_count(argv[1]));
	fprintf(stderr, "usage: %s ITERATIONS | %s named NAME MIB ITERATIONS\n", argv[0], argv[0]);
	return 2;
}
