/*
 * host_remap_attacher: a process that attaches lwk_remapping_owner's segment three times
 * while its data pages are a hole (clowderd answers the later attaches from the owner's
 * earlier answer while the owner kernel maps nothing; for an LWK job, it also keeps the
 * attachment's regions between them), asks the job to map its data pages through a second
 * permit's attachment, waits for it, and attaches again through the first: the new attachment
 * must show the job's new memory (2000 + i); the old answer's hole would raise SIGBUS. The
 * same program runs on the host and as an LWK job in another enclave (one attachment per
 * permit at a time there, hence the second permit).
 */
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <xpmem.h>
#include "attach_segment.h"
#include "named_segment.h"

#define PAGE 4096UL
#define DATA_PAGES 16
#define SIZE ((DATA_PAGES + 1) * PAGE)

int main(void)
{
	xpmem_segid_t segid = wait_for_named_segment("lwk-remap-seg", 400);
	if (segid <= 0)
		return 1;
	xpmem_apid_t apid = get_segment(segid);
	if (apid <= 0)
		return GET_FAILED;
	for (int attach = 1; attach <= 3; attach++) {
		volatile uint64_t *view = attach_segment(apid, SIZE);
		if (!view)
			return ATTACH_FAILED;
		printf("attach %d: the mailbox reads %llu\n", attach, (unsigned long long)view[0]);
		xpmem_detach((void *)view);
	}
	fflush(stdout);
	xpmem_apid_t mailbox_apid = get_segment(segid);
	if (mailbox_apid <= 0)
		return GET_FAILED;
	volatile uint64_t *mailbox = attach_segment(mailbox_apid, SIZE);
	if (!mailbox)
		return ATTACH_FAILED;
	*mailbox = 1;
	struct timespec start, t;
	clock_gettime(CLOCK_MONOTONIC, &start);
	do
		clock_gettime(CLOCK_MONOTONIC, &t);
	while (*mailbox != 2 && t.tv_sec - start.tv_sec < 20);
	int remapped = *mailbox == 2;
	printf(remapped ? "the job mapped its data pages\n" : "the job did not map its data pages\n");
	fflush(stdout);
	volatile uint64_t *view = attach_segment(apid, SIZE);
	if (!view)
		return ATTACH_FAILED;
	int fresh = pages_with_pattern(view + PAGE / 8, DATA_PAGES, 2000);
	printf("attached again: %d of %d data pages hold the new data\n", fresh, DATA_PAGES);
	xpmem_detach((void *)view);
	*mailbox = 3;
	xpmem_detach((void *)mailbox);
	xpmem_release(mailbox_apid);
	xpmem_release(apid);
	return remapped && fresh == DATA_PAGES ? 0 : 4;
}
