/*
 * lwk_remapping_owner: an LWK job that exports 17 pages as the XEMEM segment "lwk-remap-seg":
 * page 0 is a mailbox, pages 1..16 are a hole at first (nothing mapped there). When the host
 * writes 1 into the mailbox's first word, the job maps memory over the hole, writes 2000 + i
 * at the start of data page i and answers 2 in the mailbox; it then waits for 3 and exits.
 * The segment's id stays; what backs it changes (the kernel maps a job's memory at a fixed
 * offset, so a remap of the same address would find the same frames: a hole that fills is a
 * change of frames). With host_remap_attacher this checks that a host process attaching
 * again sees the new memory, although clowderd reuses an owner's answer while the owner
 * kernel maps nothing.
 * node/clowderd/tests/xemem_lwk.rs drives both.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <xpmem.h>
#include "patterned_segment.h"

#define PAGE 4096UL
#define DATA_PAGES 16

int main(void)
{
	char *memory = mmap(NULL, (DATA_PAGES + 1) * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (memory == MAP_FAILED)
		return 2;
	volatile uint64_t *mailbox = (volatile uint64_t *)memory;
	volatile uint64_t *data = (volatile uint64_t *)(memory + PAGE);
	if (munmap((void *)data, DATA_PAGES * PAGE) != 0)
		return 2;
	xpmem_segid_t segid = xemem_make(memory, (DATA_PAGES + 1) * PAGE, "lwk-remap-seg");
	if (segid <= 0) {
		printf("xemem_make failed: errno %d\n", errno);
		return 1;
	}
	fflush(stdout);
	if (!spin_for_word(mailbox, 1, 20)) {
		printf("timed out waiting for the host's request\n");
		return 3;
	}
	if (mmap((void *)data, DATA_PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != (void *)data) {
		printf("mapping the data pages failed: errno %d\n", errno);
		return 4;
	}
	fill_with_pattern(data, DATA_PAGES, 2000);
	printf("mapped the data pages\n");
	fflush(stdout);
	*mailbox = 2;
	int done = spin_for_word(mailbox, 3, 20);
	printf(done ? "the host is done\n" : "timed out waiting for the host\n");
	xpmem_remove(segid);
	return done ? 0 : 5;
}
