/*
 * XPMEM attach throughput, as XEMEM's Fig. 5/6 and Table 2 measure it: an owner exports one
 * region; an attacher attaches it repeatedly and we report bytes attached per second of attach
 * time. The same source runs on the host and, built statically with musl, as an LWK job.
 *
 *   attach_bench BACKING MIB ITERATIONS MODE
 *       host -> host: forks the owner, attaches from the parent (one mode; in read mode the
 *       owner first prints its own read of the region, "owner-read MIB GB/S")
 *   attach_bench own NAME BACKING MIB [SECONDS]
 *       prints its own read of a region of MIB ("owner-read MIB GB/S"), exports it as the
 *       named segment NAME (xemem_make), prints "made", and waits until an
 *       attacher signals that it has finished (bench_common.h), at most SECONDS (default 900),
 *       then removes it
 *   attach_bench serve BACKING SECONDS NAME:MIB...
 *       as own, for each NAME:MIB in turn, over one region whose pages are written once as the
 *       sizes first need them (in a Linux VM on a PVM host each first touch of a page is
 *       emulated guest kernel work, minutes a GiB): the segment NAME is its first MIB
 *   attach_bench attach NAME MIB ATTACHES TOUCHES [MODE...] [local=LMIB[@FILE]]
 *       finds NAME (another enclave's segment), gets it and runs the modes given, or every mode
 *       (attach: ATTACHES times; the others: TOUCHES times), then signals the owner; local=LMIB
 *       sizes the local buffer (below); @FILE makes it FILE (on tmpfs) mapped shared, allocated
 *       by the first job that maps it at that size and kept by the file for the next ones: in a
 *       Linux VM on a PVM host a first touch is emulated guest kernel work (about 14 minutes a
 *       GiB), paid once per guest instead of once per job
 *
 *     BACKING     4k (private anonymous memory; on the host converted to memfd backing at make
 *                 time) or 2m (a 2 MiB hugetlb memfd, shared as it is; host only)
 *     MODE        attach (attach only), prefault (attach with every page mapped at once: host
 *                 libxpmem's CLOWDER_XEMEM_PREFAULT=1), touch (attach + touch one int per page),
 *                 read (attach + read every byte, summed as 64-bit words)
 *
 * One line per mode: mode, MiB, iterations, GB/s, median attach us, mean detach us, the
 * single-core read bandwidth of a local buffer in the same run (the limit attach+read is held
 * against: in read mode the median of reads interleaved with its iterations, otherwise the
 * best of three at the start), that buffer's MiB (the region's size, halved until it fits: an
 * LWK enclave cannot hold a second copy of a large region; or local=LMIB, read repeatedly for
 * a per-byte rate: in a Linux VM on a PVM host each first touch of a page is emulated guest
 * kernel work, minutes for a buffer of the region's size), and in read mode the median of the
 * attached memory's second read in each iteration (same pages, no attach; 0 in the other
 * modes). Each mode's line follows a "first MODE MIB US" line: its first iteration's attach (+
 * touch/read) alone, what a segment not attached before costs (later ones may find it mapped).
 * In an LWK job, the attach role adds a "self"
 * line: the job attaching its own buffer of the region's size through the enclave's own name
 * server (the kernel's resolve + map with no host involved), the kernel's share of a host
 * attach.
 */
#include "bench_common.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>

static const char *program = "attach_bench";
/* Where the sums end up, so the compiler keeps the reads. */
static volatile uint64_t kept_sum;

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

/* Writes a pattern byte into each page of [from, to) of the region at P: its first touch. */
static void fill_region(char *p, size_t from, size_t to)
{
	/* Allocated by one system call rather than a fault per page where the kernel can (Linux
	 * 5.14): in a Linux VM on PVM every fault is an emulated kernel entry and exit. */
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
	if (to > from)
		madvise(p + from, to - from, MADV_POPULATE_WRITE);
	for (size_t i = from; i < to; i += PAGE)
		((volatile char *)p)[i] = (char)(i / PAGE);
}

/* An owner's region of BYTES, mapped but not touched. */
static char *map_owner_region(int huge, size_t bytes)
{
	void *p;
	if (huge) {
		int fd = memfd_create("bench", MFD_CLOEXEC | MFD_HUGETLB | (21 << 26) /* MFD_HUGE_2MB */);
		if (fd < 0 || ftruncate(fd, bytes) < 0)
			die(program, "hugetlb memfd (reserve vm.nr_hugepages)");
		p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	} else {
		/* 8 MiB above whatever lies below, left untouched: a small mapping may merge with a
		 * thread stack, whose 8 MiB above its guard a host owner's library never exports
		 * (holes, which a Linux VM attacher cannot place). */
		p = mmap(NULL, bytes + (8UL << 20), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		p = p == MAP_FAILED ? p : (char *)p + (8UL << 20);
	}
	if (p == MAP_FAILED)
		die(program, "mmap");
	return p;
}

/* The owner's own single-core read of its region (median of 5, before the make: no attacher
 * reads at the same time), printed as "owner-read MIB GB/S": how fast its pages read to
 * anyone (a 4 KiB host owner's private pages, which the make then copies into a memfd). */
static void print_owner_read(const void *p, size_t bytes)
{
	double times[5];
	uint64_t sum = 0;
	for (int i = 0; i < 5; i++) {
		double t0 = now();
		sum += sum_words(p, bytes);
		times[i] = now() - t0;
	}
	kept_sum += sum;
	printf("owner-read %zu %.2f\n", bytes >> 20, bytes / quantile(times, 5, 0.5) / 1e9);
	fflush(stdout);
}

static int parse_backing(const char *text)
{
	if (!strcmp(text, "4k") || !strcmp(text, "2m"))
		return !strcmp(text, "2m");
	fprintf(stderr, "%s: backing must be 4k or 2m, got %s\n", program, text);
	exit(2);
}

static size_t parse_mib(const char *text)
{
	return (size_t)parse_whole(program, text, 65536, "MIB") << 20;
}

static int parse_count(const char *text)
{
	return (int)parse_whole(program, text, 1000000, "a count");
}

/* A local buffer read by one core: the size of the region, halved until it fits, down to 16 MiB
 * (or the region's size if smaller). It stays mapped while the modes run: read mode times it
 * once per iteration, side by side with the attach + read it is held against. */
struct local_read {
	double gbs; /* best of three reads at the start: the figure of the modes that do not read */
	size_t bytes;
	uint64_t *buffer;
};

/* Seconds one core takes to sum the local buffer. */
static double time_local_read(const struct local_read *local, uint64_t *sink)
{
	double t0 = now();
	*sink += sum_words(local->buffer, local->bytes);
	return now() - t0;
}

/* BYTES of private memory, on 2 MiB pages where the machine has them free (the fastest a core
 * reads, as it reads a 2 MiB source through an attachment); MAP_FAILED if there is no room. */
static void *map_local_buffer(size_t bytes)
{
	const size_t huge = 2UL << 20;
	int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE;
	void *p = bytes % huge == 0 ? mmap(NULL, bytes, PROT_READ | PROT_WRITE, flags | MAP_HUGETLB, -1, 0) : MAP_FAILED;
	if (p != MAP_FAILED)
		return p;
	p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
	if (p != MAP_FAILED && bytes % huge == 0)
		fprintf(stderr, "%s: local buffer of %zu MiB on 4 KiB pages (no free hugepages)\n", program, bytes >> 20);
	return p;
}

/* BYTES of FILE mapped shared, its pages allocated by the first job that maps it at that size
 * (fallocate; tmpfs clears each page at its first fault, so that job's mapping is the slow one)
 * and kept by the file for the next ones; mapped whole at once (MAP_POPULATE: a tmpfs file's
 * cleared pages are mapped many per fault). Exits with
 * a message when the file system has no room (a tmpfs holds half the RAM by default: written
 * through a mapping, a page past that would be SIGBUS). */
static void *map_local_file(const char *path, size_t bytes)
{
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	struct stat st;
	struct statvfs fs;
	if (fd < 0 || fstat(fd, &st) < 0 || fstatvfs(fd, &fs) < 0)
		die(program, path);
	if (st.st_size != (off_t)bytes) {
		unsigned long long room = (unsigned long long)fs.f_bavail * fs.f_frsize + (unsigned long long)st.st_blocks * 512;
		if (room < bytes) {
			fprintf(stderr, "%s: local buffer: %s has room for %llu MiB, not %zu\n", program, path, room >> 20,
				bytes >> 20);
			exit(1);
		}
		int error = ftruncate(fd, 0) < 0 ? errno : posix_fallocate(fd, 0, (off_t)bytes);
		if (error) {
			errno = error;
			die(program, path);
		}
	}
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
	if (p == MAP_FAILED)
		die(program, path);
	close(fd);
	return p;
}

/* A local buffer of `bytes` (halved until it fits, down to 16 MiB; or FILE's, see
 * map_local_file) and its best read rate. */
static struct local_read local_read_bandwidth(size_t bytes, const char *file, uint64_t *sink)
{
	uint64_t *buffer = MAP_FAILED;
	size_t smallest = bytes < (16UL << 20) ? bytes : (16UL << 20);
	if (file)
		buffer = map_local_file(file, bytes);
	else
		for (; bytes >= smallest; bytes /= 2) {
			buffer = map_local_buffer(bytes);
			if (buffer != MAP_FAILED)
				break;
		}
	if (buffer == MAP_FAILED)
		die(program, "local buffer");
	if (!file)
		memset(buffer, 1, bytes);
	struct local_read local = { 0, bytes, buffer };
	double best = 1e9;
	for (int i = 0; i < 3; i++) {
		double t = time_local_read(&local, sink);
		if (t < best)
			best = t;
	}
	local.gbs = bytes / best / 1e9;
	return local;
}

static void free_local_read(struct local_read *local)
{
	munmap(local->buffer, local->bytes);
	local->buffer = NULL;
}

enum mode { ATTACH, PREFAULT, TOUCH, READ };
static const char *const mode_names[] = { "attach", "prefault", "touch", "read" };

static enum mode parse_mode(const char *text)
{
	for (int m = ATTACH; m <= READ; m++)
		if (!strcmp(text, mode_names[m]))
			return m;
	fprintf(stderr, "%s: mode must be attach, prefault, touch or read, got %s\n", program, text);
	exit(2);
}

/* Attaches the permit's BYTES ITERATIONS times in MODE; prints the mode's line. In read mode
 * each iteration also reads the local buffer first and the attached memory a second time before
 * the detach (the same pages, mapped: what a read of that memory costs without the attach), and
 * the local and re-read figures printed are the medians of those reads (the machine's load moves
 * all three alike); the other modes print the best of the local reads at the start and no
 * re-read (0). */
static void measure(const char *label, xpmem_apid_t apid, size_t bytes, int iterations, enum mode mode, const struct local_read *local, uint64_t *sink)
{
	setenv("CLOWDER_XEMEM_PREFAULT", mode == PREFAULT ? "1" : "0", 1);
	double *attach_times = malloc(iterations * sizeof *attach_times);
	double *local_times = malloc(iterations * sizeof *local_times);
	double *reread_times = malloc(iterations * sizeof *reread_times);
	if (!attach_times || !local_times || !reread_times)
		die(program, "malloc");
	double total = 0, detach_total = 0;
	for (int i = 0; i < iterations; i++) {
		if (mode == READ)
			local_times[i] = time_local_read(local, sink);
		double t0 = now();
		char *p = xpmem_attach((struct xpmem_addr){ apid, 0 }, bytes, NULL);
		if (p == (void *)-1)
			die(program, "xpmem_attach");
		if (mode == TOUCH)
			for (size_t at = 0; at < bytes; at += PAGE)
				*sink += ((volatile char *)p)[at];
		if (mode == READ)
			*sink += sum_words((const uint64_t *)p, bytes);
		double t1 = now();
		if (mode == READ) {
			*sink += sum_words((const uint64_t *)p, bytes);
			reread_times[i] = now() - t1;
		}
		double t2 = now();
		if (xpmem_detach(p) < 0)
			die(program, "xpmem_detach");
		detach_total += now() - t2;
		attach_times[i] = t1 - t0;
		total += t1 - t0;
	}
	/* Before the quantiles sort the times: the first attach is the one a new segment costs. */
	printf("first %s %zu %.1f\n", label, bytes >> 20, attach_times[0] * 1e6);
	double local_gbs = mode == READ ? local->bytes / quantile(local_times, iterations, 0.5) / 1e9 : local->gbs;
	double reread_gbs = mode == READ ? bytes / quantile(reread_times, iterations, 0.5) / 1e9 : 0;
	printf("%s %zu %d %.2f %.1f %.1f %.2f %zu %.2f\n", label, bytes >> 20, iterations, (double)bytes * iterations / total / 1e9,
	       quantile(attach_times, iterations, 0.5) * 1e6, detach_total / iterations * 1e6, local_gbs, local->bytes >> 20, reread_gbs);
	fflush(stdout);
	free(attach_times);
	free(local_times);
	free(reread_times);
}

/* host -> host: the owner is a forked child, the rendezvous a socketpair. */
static int run_pair(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: %s 4k|2m MIB ITERATIONS attach|prefault|touch|read\n", argv[0]);
		return 2;
	}
	int huge = parse_backing(argv[1]);
	size_t bytes = parse_mib(argv[2]);
	int iterations = parse_count(argv[3]);
	enum mode mode = parse_mode(argv[4]);
	int sync[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sync) < 0)
		die(program, "socketpair");
	pid_t owner = fork();
	if (owner == 0) {
		char *p = map_owner_region(huge, bytes);
		fill_region(p, 0, bytes);
		if (mode == READ)
			print_owner_read(p, bytes);
		xpmem_segid_t segid = xpmem_make(p, bytes, XPMEM_PERMIT_MODE, (void *)0600);
		if (segid <= 0)
			die(program, "xpmem_make");
		if (write(sync[1], &segid, sizeof segid) != sizeof segid)
			die(program, "write");
		char done;
		if (read(sync[1], &done, 1) < 0)
			die(program, "read");
		xpmem_remove(segid);
		_exit(0);
	}
	xpmem_segid_t segid;
	if (read(sync[0], &segid, sizeof segid) != sizeof segid)
		die(program, "owner failed");
	xpmem_apid_t apid = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
	if (apid <= 0)
		die(program, "xpmem_get");
	uint64_t sink = 0;
	struct local_read local = local_read_bandwidth(bytes, NULL, &sink);
	measure(mode_names[mode], apid, bytes, iterations, mode, &local, &sink);
	free_local_read(&local);
	xpmem_release(apid);
	if (write(sync[0], "x", 1) < 0)
		die(program, "write");
	waitpid(owner, NULL, 0);
	kept_sum = sink;
	return 0;
}

/* The owner roles' segment: the first BYTES of P (written) exported as NAME until its attacher
 * signals (at most SECONDS), then removed. 0, or 1 when no attacher signalled. */
static int serve_segment(char *p, size_t bytes, const char *name, int seconds)
{
	print_owner_read(p, bytes);
	/* Its last word back to what fill_region left (0): an earlier segment of this size over the
	 * same pages was signalled there. */
	((volatile uint64_t *)p)[bytes / 8 - 1] = 0;
	xpmem_segid_t segid = xemem_make(p, bytes, name);
	if (segid <= 0)
		die(program, "xemem_make");
	printf("made %s: segment of enclave %lld\n", name, (long long)(segid >> 32));
	fflush(stdout);
	int waited = wait_done(p, bytes, seconds);
	if (xpmem_remove(segid) < 0)
		die(program, "xpmem_remove");
	if (waited < 0) {
		fprintf(stderr, "%s: no attacher signalled within %d s\n", program, seconds);
		return 1;
	}
	printf("removed %s\n", name);
	fflush(stdout);
	return 0;
}

static int run_owner(int argc, char **argv)
{
	if (argc != 5 && argc != 6) {
		fprintf(stderr, "usage: %s own NAME 4k|2m MIB [SECONDS]\n", argv[0]);
		return 2;
	}
	const char *name = argv[2];
	int huge = parse_backing(argv[3]);
	size_t bytes = parse_mib(argv[4]);
	int seconds = argc == 6 ? parse_count(argv[5]) : 900;
	char *p = map_owner_region(huge, bytes);
	fill_region(p, 0, bytes);
	return serve_segment(p, bytes, name, seconds);
}

/* NAME:MIB's size in bytes, its name ended at the colon; exits with status 2 on bad input. */
static size_t parse_served(char *entry)
{
	char *colon = strchr(entry, ':');
	if (!colon || colon == entry || colon - entry > XEMEM_NAME_MAX) {
		fprintf(stderr, "%s: serve takes NAME:MIB (a name of 1-%d characters), got %s\n", program, XEMEM_NAME_MAX, entry);
		exit(2);
	}
	*colon = '\0';
	return parse_mib(colon + 1);
}

static int run_server(int argc, char **argv)
{
	if (argc < 5) {
		fprintf(stderr, "usage: %s serve 4k|2m SECONDS NAME:MIB...\n", argv[0]);
		return 2;
	}
	int huge = parse_backing(argv[2]);
	int seconds = parse_count(argv[3]);
	size_t *sizes = calloc(argc, sizeof *sizes), largest = 0, written = 0;
	if (!sizes)
		die(program, "calloc");
	for (int i = 4; i < argc; i++) {
		sizes[i] = parse_served(argv[i]);
		largest = sizes[i] > largest ? sizes[i] : largest;
	}
	char *p = map_owner_region(huge, largest);
	for (int i = 4; i < argc; i++) {
		if (sizes[i] > written) {
			fill_region(p, written, sizes[i]);
			written = sizes[i];
		}
		if (serve_segment(p, sizes[i], argv[i], seconds))
			return 1;
	}
	free(sizes);
	return 0;
}

/* The kernel's share of an attach in an LWK job: the job attaches its own buffer of the same
 * size through the enclave's own name server, with no host involved. */
static void measure_self_attach(size_t bytes, int iterations, const struct local_read *local, uint64_t *sink)
{
	void *own = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (own == MAP_FAILED) {
		printf("self %zu 0 skipped: no room for a second buffer of this size in the enclave\n", bytes >> 20);
		return;
	}
	xpmem_segid_t segid = xpmem_make(own, bytes, XPMEM_PERMIT_MODE, (void *)0600);
	xpmem_apid_t apid = segid > 0 ? xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL) : -1;
	if (apid <= 0)
		die(program, "self make/get");
	measure("self", apid, bytes, iterations, ATTACH, local, sink);
	xpmem_release(apid);
	xpmem_remove(segid);
	munmap(own, bytes);
}

static int run_attacher(int argc, char **argv)
{
	if (argc < 6) {
		fprintf(stderr, "usage: %s attach NAME MIB ATTACHES TOUCHES [MODE...] [local=LMIB[@FILE]]\n", argv[0]);
		return 2;
	}
	size_t bytes = parse_mib(argv[3]);
	int attaches = parse_count(argv[4]), touches = parse_count(argv[5]);
	/* Which modes to run: all by default (prefault only on the host). */
	int wanted[READ + 1] = { 1, 1, 1, 1 };
	size_t local_bytes = bytes;
	const char *local_file = NULL;
	if (argc > 6 && strncmp(argv[argc - 1], "local=", 6) == 0) {
		char *setting = argv[--argc] + 6, *at = strchr(setting, '@');
		if (at) {
			*at = '\0';
			local_file = at + 1;
			if (!*local_file) {
				fprintf(stderr, "%s: local=LMIB@FILE names no file\n", program);
				return 2;
			}
		}
		local_bytes = parse_mib(setting);
	}
	if (argc > 6) {
		memset(wanted, 0, sizeof wanted);
		for (int i = 6; i < argc; i++)
			wanted[parse_mode(argv[i])] = 1;
	}
	xpmem_segid_t segid = find_named(program, argv[2]);
	xpmem_apid_t apid = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
	if (apid <= 0)
		die(program, "xpmem_get");
	uint64_t sink = 0;
	struct local_read local = local_read_bandwidth(local_bytes, local_file, &sink);
	/* In an LWK job (the device backend) every attach maps every page: no prefault mode. */
	int device = open("/dev/xpmem", O_RDWR);
	int in_lwk = device >= 0;
	if (in_lwk)
		close(device);
	wanted[PREFAULT] &= !in_lwk;
	for (int m = ATTACH; m <= READ; m++)
		if (wanted[m])
			measure(mode_names[m], apid, bytes, m == ATTACH ? attaches : touches, m, &local, &sink);
	/* Room for the kernel-share measurement's own buffer. */
	free_local_read(&local);
	signal_done(program, apid, bytes);
	xpmem_release(apid);
	if (in_lwk && wanted[ATTACH])
		measure_self_attach(bytes, touches, &local, &sink);
	kept_sum = sink;
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "own"))
		return run_owner(argc, argv);
	if (argc > 1 && !strcmp(argv[1], "serve"))
		return run_server(argc, argv);
	if (argc > 1 && !strcmp(argv[1], "attach"))
		return run_attacher(argc, argv);
	return run_pair(argc, argv);
}
