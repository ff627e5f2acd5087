/*
 * host_scattered_owner: host_named_owner's segment ("host-owner-seg", page i starting with
 * 2000 + i, waiting for an LWK job to write 43 into word 1 of page 0, then removed), made of
 * single 4 KiB pages of one memfd in scattered order: page i of the segment is page
 * (i * 7) % PAGES of the file. Its answer to an attach is one run per page, all of one file,
 * as a Linux VM owner's is; clowderd must give the attaching enclave ONE region of them.
 * node/clowderd/tests/xemem_scattered.rs drives it with lwk_host_attacher.
 * Usage: host_scattered_owner [PAGES] (default 4001; not a multiple of 7).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xpmem.h>
#include "patterned_segment.h"

int main(int argc, char **argv)
{
	unsigned long pages = argc > 1 ? strtoul(argv[1], NULL, 0) : 4001;
	if (pages == 0 || pages % 7 == 0) {
		printf("PAGES must be a positive number and not a multiple of 7\n");
		return 2;
	}
	int fd = memfd_create("scattered-owner", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, pages * 4096) != 0) {
		printf("no memfd\n");
		return 2;
	}
	char *base = mmap(NULL, pages * 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (base == MAP_FAILED) {
		printf("no memory\n");
		return 2;
	}
	for (unsigned long i = 0; i < pages; i++) {
		void *page = mmap(base + i * 4096, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd,
				  (off_t)((i * 7) % pages * 4096));
		if (page == MAP_FAILED) {
			printf("mapping page %lu failed\n", i);
			return 2;
		}
	}
	volatile uint64_t *buffer = (volatile uint64_t *)base;
	fill_with_pattern(buffer, pages, 2000);
	xpmem_segid_t segid = xemem_make(base, pages * 4096, "host-owner-seg");
	if (segid <= 0) {
		printf("make failed\n");
		return 2;
	}
	printf("made a segment of enclave %lld\n", (long long)(segid >> 32));
	fflush(stdout);
	/* Up to 60 s: the LWK job is built and started after this line appears. */
	if (!report_write(wait_for_word(&buffer[1], 43, 6000), "the LWK", 43))
		return 3;
	printf("remove: %d\n", xpmem_remove(segid));
	return 0;
}
