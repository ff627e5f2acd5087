/*
 * lwk_named_owner: an LWK job that exports 16 pages as the XEMEM segment "lwk-owner-seg"
 * (xemem_make through the LWK's /dev/xpmem, registered with clowderd's name server), then waits
 * up to 20 s for a host process to write 42 into it through its attachment (zero-copy: the
 * host maps the enclave's own pages). node/clowderd/tests/xemem_lwk.rs drives it.
 * Page i holds 1000 + i in its first word; the host writes word 1 of page 0.
 * With the argument "keep" it exits right after making the segment, without removing it: the
 * kernel must remove it from the name server when the job ends.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <xpmem.h>
#include "patterned_segment.h"

#define PAGES 16

int main(int argc, char **argv)
{
	xpmem_segid_t segid;
	volatile uint64_t *memory = export_patterned_segment(PAGES, 1000, "lwk-owner-seg", "xemem_make", &segid);
	if (!memory)
		return 1;
	if (argc > 1 && !strcmp(argv[1], "keep"))
		return 0;
	int written = spin_for_word(&memory[1], 42, 20);
	printf(written ? "the host wrote 42\n" : "timed out waiting for the host\n");
	printf("remove: %d\n", xpmem_remove(segid));
	return written ? 0 : 3;
}
