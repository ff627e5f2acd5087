/*
 * host_lwk_exit_watcher: a host process that attaches the segment lwk_exiting_owner.c's
 * forked owner makes ("lwk-exit-order-seg"), checks that every page holds PATTERN_A, signals
 * the segment (the owner then exits) and reads every page until the read raises SIGBUS (the
 * segment was removed and the attachment revoked) or 30 s pass. Before the SIGBUS the pages
 * must still hold PATTERN_A: anything else (zeros, PATTERN_B) means the LWK freed or reused
 * the owner's frames while this process still mapped them. Prints the verdict; exits 0 when
 * SIGBUS came first. kernels/lwk/tests/xemem-exit-order.sh drives it.
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include <xpmem.h>

#define PAGE 4096UL
#define PAGES 16
#define PATTERN_A 0x4141414141414141ULL

static sigjmp_buf faulted;

static void on_sigbus(int sig)
{
	(void)sig;
	siglongjmp(faulted, 1);
}

int main(void)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	xpmem_segid_t segid = -1;
	for (int tries = 0; tries < 600 && segid <= 0; tries++) {
		segid = xemem_lookup_segid("lwk-exit-order-seg");
		if (segid <= 0)
			usleep(50000);
	}
	if (segid <= 0) {
		printf("no segment named lwk-exit-order-seg (errno %d)\n", errno);
		return 1;
	}
	xpmem_apid_t apid = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
	struct xpmem_addr addr = { .apid = apid, .offset = 0 };
	volatile uint64_t *memory = apid > 0 ? xpmem_attach(addr, PAGES * PAGE, NULL) : (void *)-1;
	if (memory == (void *)-1) {
		printf("get/attach failed: errno %d\n", errno);
		return 1;
	}
	for (unsigned long page = 0; page < PAGES; page++) {
		if (memory[page * PAGE / 8] != PATTERN_A || memory[(page + 1) * PAGE / 8 - 1] != PATTERN_A) {
			printf("attached, but page %lu does not hold the owner's pattern\n", page);
			return 1;
		}
	}
	printf("attached: %d pages hold the owner's pattern\n", PAGES);
	struct sigaction action = { .sa_handler = on_sigbus };
	sigaction(SIGBUS, &action, NULL);
	if (xemem_signal(apid) != 0) {
		printf("signal failed: errno %d\n", errno);
		return 1;
	}
	volatile unsigned long rounds = 0;
	if (sigsetjmp(faulted, 1)) {
		printf("SIGBUS with the owner's pattern intact until then (%lu rounds)\n", rounds);
		return 0;
	}
	struct timespec start, now;
	clock_gettime(CLOCK_MONOTONIC, &start);
	do {
		for (unsigned long word = 0; word < PAGES * PAGE / 8; word += 64) {
			uint64_t value = memory[word];
			if (value != PATTERN_A) {
				printf("FAIL: word %lu held %#llx before any SIGBUS: the owner's frames were freed or reused while attached\n",
				       word, (unsigned long long)value);
				return 1;
			}
		}
		rounds++;
		clock_gettime(CLOCK_MONOTONIC, &now);
	} while (now.tv_sec - start.tv_sec < 30);
	printf("FAIL: no SIGBUS within 30 s after the owner exited\n");
	return 1;
}
