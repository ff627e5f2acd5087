/*
 * lwk_revoked_attacher: an LWK job (static musl, the LWK's /dev/xpmem) that attaches a named
 * segment (by default "host-revoke-seg" of host_revoking_owner, whose page i starts with
 * 3000 + i), checks the owner's pattern, writes 44 into word 1 of page 0 for the owner to see,
 * and then touches the attachment until the owner takes the memory away, which must raise
 * SIGBUS inside the attachment.
 *
 *   lwk_revoked_attacher MODE [THREADS [NAME BASE]]
 *   MODE handler                            a SIGBUS handler reports the faulting address and
 *                                           the job goes on: detach (0) and release (ENOENT:
 *                                           the permit went with the segment). With threads = 2
 *                                           a second thread (on the enclave's second CPU)
 *                                           touches the attachment too and must fault as well.
 *   MODE default                            no handler: the job dies of SIGBUS (status 135).
 *   NAME BASE                               another segment and pattern (lwk_peer_owner's).
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xpmem.h>
#include "attach_segment.h"

#define PAGE 4096UL
#define PAGES 16
#define TOUCH_SECONDS 30

static volatile uint64_t *view;
static __thread sigjmp_buf touch_jump;
static __thread volatile uintptr_t fault_address;

static void on_sigbus(int signal, siginfo_t *info, void *context)
{
	(void)signal;
	(void)context;
	fault_address = (uintptr_t)info->si_addr;
	siglongjmp(touch_jump, 1);
}

/* Reads every page of the attachment until SIGBUS (or TOUCH_SECONDS): returns the faulting
 * address, 0 if none came. */
static uintptr_t touch_until_sigbus(void)
{
	if (sigsetjmp(touch_jump, 1))
		return fault_address;
	time_t end = time(NULL) + TOUCH_SECONDS;
	while (time(NULL) < end)
		for (unsigned long page = 0; page < PAGES; page++)
			(void)view[page * PAGE / 8];
	return 0;
}

static int inside(uintptr_t address)
{
	return address >= (uintptr_t)view && address < (uintptr_t)view + PAGES * PAGE;
}

static void *second_toucher(void *unused)
{
	(void)unused;
	return (void *)touch_until_sigbus();
}

int main(int argc, char **argv)
{
	int handler = argc > 1 && strcmp(argv[1], "handler") == 0;
	int threads = argc > 2 ? atoi(argv[2]) : 1;
	const char *name = argc > 4 ? argv[3] : "host-revoke-seg";
	uint64_t base = argc > 4 ? strtoull(argv[4], NULL, 0) : 3000;
	xpmem_apid_t apid;
	int failed = get_named_segment(name, 400, &apid);
	if (failed)
		return failed;
	int matching;
	view = attach_and_check(apid, PAGES, base, "the owner's pattern", &matching);
	if (!view)
		return ATTACH_FAILED;
	if (handler) {
		struct sigaction action;
		memset(&action, 0, sizeof action);
		action.sa_sigaction = on_sigbus;
		action.sa_flags = SA_SIGINFO;
		sigaction(SIGBUS, &action, NULL);
	}
	pthread_t second;
	if (threads == 2 && pthread_create(&second, NULL, second_toucher, NULL) != 0) {
		printf("pthread_create failed\n");
		return 4;
	}
	view[1] = 44;
	printf("wrote 44; touching until the memory goes\n");
	fflush(stdout);
	uintptr_t fault = touch_until_sigbus();
	printf("main thread: SIGBUS inside the attachment: %d\n", fault != 0 && inside(fault));
	if (threads == 2) {
		void *result;
		pthread_join(second, &result);
		printf("second thread: SIGBUS inside the attachment: %d\n", (uintptr_t)result != 0 && inside((uintptr_t)result));
	}
	printf("detach: %d\n", xpmem_detach((void *)view));
	int released = xpmem_release(apid);
	printf("release: %d (errno %d)\n", released, released ? errno : 0);
	return 0;
}
