/*
 * host_keeper NAME BASE: a host owner that removes its segment only when told. It exports 16
 * private pages as NAME (page i starts with BASE + i), prints its segid's enclave, then the
 * segid, and waits for a line on stdin: "remove" removes the segment and prints "remove:
 * RESULT (errno E)"; end of input exits without removing. So an attacher's SIGBUS can only
 * come from the daemons (node/clowderd/tests/xemem_multihop.rs: a sub-manager that dies, an
 * upstream daemon that restarts).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xpmem.h>

#define PAGE 4096UL
#define PAGES 16

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: host_keeper NAME BASE\n");
		return 64;
	}
	uint64_t base = strtoull(argv[2], NULL, 0);
	volatile uint64_t *buffer = mmap(NULL, PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buffer == MAP_FAILED)
		return 1;
	for (unsigned long page = 0; page < PAGES; page++)
		buffer[page * PAGE / 8] = base + page;
	xpmem_segid_t segid = xemem_make((void *)buffer, PAGES * PAGE, argv[1]);
	if (segid <= 0) {
		printf("make failed: errno %d\n", errno);
		return 2;
	}
	printf("made a segment of enclave %lld\n", (long long)(segid >> 32));
	printf("segid %lld\n", (long long)segid);
	fflush(stdout);
	char line[64];
	if (fgets(line, sizeof line, stdin) && strncmp(line, "remove", 6) == 0) {
		errno = 0;
		int removed = xpmem_remove(segid);
		printf("remove: %d (errno %d)\n", removed, removed == 0 ? 0 : errno);
		fflush(stdout);
	}
	return 0;
}
