/*
 * lwk_peer_owner MODE: an LWK job that exports 16 pages as the named segment "lwk-peer-seg"
 * (page i starts with 6000 + i) for a job in another enclave (lwk_revoked_attacher) and waits
 * up to 60 s for it to write 44 into word 1 of page 0. Then, with MODE "remove", it removes
 * the segment (the attacher must get SIGBUS) and checks its own data; with MODE "hold" it
 * keeps spinning until its enclave is removed (the attacher must get SIGBUS then).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xpmem.h>
#include "patterned_segment.h"

#define PAGES 16

int main(int argc, char **argv)
{
	xpmem_segid_t segid;
	volatile uint64_t *memory = export_patterned_segment(PAGES, 6000, "lwk-peer-seg", "xemem_make", &segid);
	if (!memory)
		return 1;
	if (!report_write(spin_for_word(&memory[1], 44, 60), "the other enclave", 44))
		return 3;
	if (argc > 1 && strcmp(argv[1], "hold") == 0) {
		time_t deadline = time(NULL) + 60;
		while (time(NULL) < deadline)
			;
		return 4;
	}
	usleep(200000);
	printf("remove: %d\n", xpmem_remove(segid));
	int intact = pages_with_pattern(memory, PAGES, 6000) == PAGES;
	printf("owner data intact: %d\n", intact);
	return intact ? 0 : 5;
}
