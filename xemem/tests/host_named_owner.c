/*
 * host_named_owner: a host process that exports PAGES pages of private memory as the named
 * segment "host-owner-seg" (libxpmem -> clowderd's broker), page i starting with 2000 + i, and
 * waits for an LWK job (lwk_host_attacher) to write 43 into word 1 of page 0 through its
 * attachment, then removes the segment. crates/clowderd/tests/xemem_lwk.rs drives both.
 * Usage: host_named_owner [PAGES] (default 16).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xpmem.h>

#define PAGE 4096UL

int main(int argc, char **argv)
{
	unsigned long pages = argc > 1 ? strtoul(argv[1], NULL, 0) : 16;
	volatile uint64_t *buffer = mmap(NULL, pages * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buffer == MAP_FAILED)
		return 1;
	for (unsigned long page = 0; page < pages; page++)
		buffer[page * PAGE / 8] = 2000 + page;
	xpmem_segid_t segid = xemem_make((void *)buffer, pages * PAGE, "host-owner-seg");
	if (segid <= 0) {
		printf("make failed: errno %d\n", errno);
		return 2;
	}
	printf("made host-owner-seg\n");
	fflush(stdout);
	/* Up to 60 s: the LWK job is built and started after this line appears. */
	for (int tries = 0; tries < 6000 && buffer[1] != 43; tries++)
		usleep(10000);
	if (buffer[1] != 43) {
		printf("the LWK job never wrote\n");
		return 3;
	}
	printf("the LWK wrote 43\n");
	printf("remove: %d\n", xpmem_remove(segid));
	return 0;
}
