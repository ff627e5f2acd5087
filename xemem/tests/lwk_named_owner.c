/*
 * lwk_named_owner: an LWK job that exports 16 pages as the XEMEM segment "lwk-owner-seg"
 * (xemem_make through the LWK's /dev/xpmem, registered with clowderd's name server), then waits
 * up to 20 s for a host process to write 42 into it through its attachment (zero-copy: the
 * host maps the enclave's own pages). crates/clowderd/tests/xemem_lwk.rs drives it.
 * Page i holds 1000 + i in its first word; the host writes word 1 of page 0.
 * With the argument "keep" it exits right after making the segment, without removing it: the
 * kernel must remove it from the name server when the job ends.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <xpmem.h>

#define PAGE 4096UL
#define PAGES 16

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	volatile uint64_t *memory = mmap(NULL, PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (memory == MAP_FAILED)
		return 2;
	for (unsigned long page = 0; page < PAGES; page++)
		memory[page * PAGE / 8] = 1000 + page;
	xpmem_segid_t segid = xemem_make((void *)memory, PAGES * PAGE, "lwk-owner-seg");
	if (segid <= 0) {
		printf("xemem_make failed: errno %d\n", errno);
		return 1;
	}
	printf("made a segment of enclave %lld\n", (long long)(segid >> 32));
	fflush(stdout);
	if (argc > 1 && !strcmp(argv[1], "keep"))
		return 0;
	double deadline = now() + 20;
	while (memory[1] != 42 && now() < deadline)
		;
	printf(memory[1] == 42 ? "the host wrote 42\n" : "timed out waiting for the host\n");
	printf("remove: %d\n", xpmem_remove(segid));
	return memory[1] == 42 ? 0 : 3;
}
