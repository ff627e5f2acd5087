/*
 * lwk_snapshot_writer: an LWK job that publishes a snapshot of a region (page-table
 * copy-on-write in the kernel) for a host reader, host_snapshot_reader.c;
 * node/clowderd/tests/xemem_lwk_snapshot.rs drives both.
 *   1. fills a region of 2 MiB and 8 pages (page i starts with 5000 + i) and publishes it as
 *      the named snapshot "lwk-snapshot";
 *   2. waits (notify descriptor) for the reader's signal that it has read it, rewrites every
 *      page (9000 + i) and says so by making the named segment "lwk-snapshot-rewritten";
 *   3. waits for the reader's second signal (it read the snapshot again: unchanged), releases
 *      the snapshot, frees the region and checks the enclave's free memory is back.
 * Prints what it did; exits 0 when everything held.
 */
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/sysinfo.h>
#include <unistd.h>
#include <xpmem.h>

#define PAGE 4096UL
#define PAGES (512 + 8)
/* Page tables and the kernel's bookkeeping, which the job keeps till it ends. */
#define KERNEL_SLACK (32 * (long)PAGE)

static long free_memory(void)
{
	struct sysinfo info;
	return sysinfo(&info) == 0 ? (long)(info.freeram * info.mem_unit) : -1;
}

/* Waits up to 30 s for a signal to the owner of segid. */
static int signalled(xpmem_segid_t segid)
{
	struct pollfd ready = { .fd = xemem_notify_fd(segid), .events = POLLIN };
	uint64_t count;
	return ready.fd >= 0 && poll(&ready, 1, 30000) == 1 && read(ready.fd, &count, sizeof count) == sizeof count;
}

int main(void)
{
	long before = free_memory();
	volatile uint64_t *region = xemem_region_alloc(PAGES * PAGE);
	if (region == (void *)-1) {
		perror("xemem_region_alloc");
		return 1;
	}
	for (unsigned long i = 0; i < PAGES; i++)
		region[i * PAGE / 8] = 5000 + i;
	xpmem_segid_t snapshot = xemem_snapshot_make((void *)region, XPMEM_PERMIT_MODE, (void *)0666, "lwk-snapshot");
	if (snapshot <= 0) {
		perror("xemem_snapshot_make");
		return 1;
	}
	printf("snapshot made\n");
	fflush(stdout);
	if (!signalled(snapshot)) {
		printf("the reader never signalled\n");
		return 2;
	}
	for (unsigned long i = 0; i < PAGES; i++)
		region[i * PAGE / 8] = 9000 + i;
	int rewritten = 1;
	for (unsigned long i = 0; i < PAGES; i++)
		rewritten &= region[i * PAGE / 8] == 9000 + i;
	printf(rewritten ? "rewrote every page\n" : "the writer lost its own stores\n");
	/* Not over the region: a segment there is refused while the snapshot is out. */
	static uint64_t flag_page[PAGE / 8] __attribute__((aligned(PAGE)));
	xpmem_segid_t flag = xemem_make(flag_page, PAGE, "lwk-snapshot-rewritten");
	fflush(stdout);
	int read_again = signalled(snapshot);
	printf(read_again ? "the reader read it again\n" : "no second signal\n");
	int released = xemem_snapshot_release(snapshot) == 0;
	printf(released ? "released\n" : "release failed\n");
	xpmem_remove(flag);
	int freed = xemem_region_free((void *)region) == 0;
	long after = free_memory();
	int back = freed && after >= before - KERNEL_SLACK;
	printf(back ? "the region's memory is back\n" : "the region's memory is not back (%ld -> %ld)\n", before, after);
	return flag > 0 && rewritten && read_again && released && back ? 0 : 3;
}
