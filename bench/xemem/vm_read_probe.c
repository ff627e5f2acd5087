/*
 * Where an attach + read's time goes in a Linux VM (issue 26, Table 2's "attach + read at least
 * 90% of a local read"): one process gets another enclave's named segment and, ROUNDS times,
 * runs each phase on its own, one second apart (the vCPU idles between them, so the host's
 * per-interval KVM counters on the VMM's vCPU thread, e.g. perf stat -I on kvm_emulate_insn and
 * kvm_mmu_set_spte, show each phase apart):
 *
 *   local    read of a private buffer of LMIB (populated at the start)
 *   attach   xpmem_attach of the segment's MIB
 *   read     first read of every word of the attachment
 *   reread   the same again (the pages now mapped)
 *   detach   xpmem_detach
 *   local2   the private buffer again, after the detach
 *
 *   vm_read_probe NAME MIB ROUNDS LMIB
 *
 * One line per phase: "probe ROUND PHASE START_S US GB/S MINFLT STIME_US NIVCSW": START_S since
 * the program's start, the guest's own page faults (minor), the guest kernel's time and the
 * involuntary context switches of the process during the phase (getrusage), which separate the
 * guest's own work from the host's (a shadow-paging fault is invisible to the guest). Then
 * signals the owner (bench_common.h). Built like attach_bench (node/clowderd/tests/support).
 */
#include "../../xemem/bench/bench_common.h"

#include <sys/mman.h>
#include <sys/resource.h>

static const char *program = "vm_read_probe";
static volatile uint64_t kept_sum;

static uint64_t sum_words(const uint64_t *p, size_t bytes)
{
	uint64_t sum = 0;
	for (size_t i = 0; i < bytes / 8; i++)
		sum += p[i];
	return sum;
}

struct phase {
	double start;
	struct rusage usage;
};

static double started;

static struct phase phase_begin(void)
{
	struct phase phase;
	getrusage(RUSAGE_SELF, &phase.usage);
	phase.start = now();
	return phase;
}

static double usecs(struct timeval t)
{
	return t.tv_sec * 1e6 + t.tv_usec;
}

/* Prints the phase's line; BYTES is what it read (0: no rate). */
static void phase_end(const struct phase *phase, int round, const char *name, size_t bytes)
{
	double seconds = now() - phase->start;
	struct rusage usage;
	getrusage(RUSAGE_SELF, &usage);
	printf("probe %d %s %.3f %.1f %.2f %ld %.0f %ld\n", round, name, phase->start - started, seconds * 1e6,
	       bytes ? bytes / seconds / 1e9 : 0.0, usage.ru_minflt - phase->usage.ru_minflt,
	       usecs(usage.ru_stime) - usecs(phase->usage.ru_stime), usage.ru_nivcsw - phase->usage.ru_nivcsw);
	fflush(stdout);
	sleep_ms(1000);
}

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: %s NAME MIB ROUNDS LMIB\n", program);
		return 2;
	}
	size_t bytes = (size_t)parse_whole(program, argv[2], 1 << 20, "MIB") << 20;
	int rounds = (int)parse_whole(program, argv[3], 1000, "ROUNDS");
	size_t local_bytes = (size_t)parse_whole(program, argv[4], 1 << 20, "LMIB") << 20;
	started = now();
	uint64_t *local = mmap(NULL, local_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (local == MAP_FAILED)
		die(program, "local buffer");
	xpmem_apid_t apid = xpmem_get(find_named(program, argv[1]), XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
	if (apid <= 0)
		die(program, "xpmem_get");
	printf("probe - ready %.3f %zu MiB, local %zu MiB\n", now() - started, bytes >> 20, local_bytes >> 20);
	uint64_t sum = 0;
	for (int round = 0; round < rounds; round++) {
		struct phase phase = phase_begin();
		sum += sum_words(local, local_bytes);
		phase_end(&phase, round, "local", local_bytes);
		phase = phase_begin();
		uint64_t *p = xpmem_attach((struct xpmem_addr){ apid, 0 }, bytes, NULL);
		if (p == (void *)-1)
			die(program, "xpmem_attach");
		phase_end(&phase, round, "attach", 0);
		phase = phase_begin();
		sum += sum_words(p, bytes);
		phase_end(&phase, round, "read", bytes);
		phase = phase_begin();
		sum += sum_words(p, bytes);
		phase_end(&phase, round, "reread", bytes);
		phase = phase_begin();
		if (xpmem_detach(p) < 0)
			die(program, "xpmem_detach");
		phase_end(&phase, round, "detach", 0);
		phase = phase_begin();
		sum += sum_words(local, local_bytes);
		phase_end(&phase, round, "local2", local_bytes);
	}
	kept_sum = sum;
	signal_done(program, apid, bytes);
	xpmem_release(apid);
	return 0;
}
