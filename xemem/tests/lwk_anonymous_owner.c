/*
 * lwk_anonymous_owner: an LWK job that exports 16 pages with XPMEM's anonymous xpmem_make
 * (mode 0666), prints the segid in full, and waits up to 30 s for a host process
 * (host_segid_attacher, given that segid) to write 45 into word 1 of page 0, and for the file
 * released-SEGID in its directory, which the test creates once that process has detached and
 * released (a remove before that would take the process's permit: its release would fail);
 * then it removes the segment. Page i starts with 5000 + i. In a connected enclave the segid comes from the
 * host's name server and names this enclave, so any process on the machine can use it.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <xpmem.h>

#define PAGE 4096UL
#define PAGES 16

int main(void)
{
	volatile uint64_t *memory = mmap(NULL, PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (memory == MAP_FAILED)
		return 2;
	for (unsigned long page = 0; page < PAGES; page++)
		memory[page * PAGE / 8] = 5000 + page;
	xpmem_segid_t segid = xpmem_make((void *)memory, PAGES * PAGE, XPMEM_PERMIT_MODE, (void *)0666);
	if (segid <= 0) {
		printf("xpmem_make failed: errno %d\n", errno);
		return 1;
	}
	printf("segid %lld\n", (long long)segid);
	fflush(stdout);
	time_t deadline = time(NULL) + 30;
	while (memory[1] != 45 && time(NULL) < deadline)
		;
	printf(memory[1] == 45 ? "the host wrote 45\n" : "timed out waiting for the host\n");
	char released[64];
	snprintf(released, sizeof released, "released-%lld", (long long)segid);
	while (access(released, F_OK) != 0 && time(NULL) < deadline)
		usleep(10000);
	printf("remove: %d\n", xpmem_remove(segid));
	return memory[1] == 45 ? 0 : 3;
}
