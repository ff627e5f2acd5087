/*
 * lwk_host_attacher: an LWK job (static musl, the LWK's /dev/xpmem) that attaches a host
 * process's named segment (host_named_owner): lookup through clowderd's name server, get, and
 * attach, which the daemon serves by adding the host owner's memory to the enclave as new
 * guest-physical regions. It checks the owner's pattern (page i starts with 2000 + i), detaches,
 * checks that the detached address faults (SIGSEGV: the kernel parked the attachment, see
 * `park` in kernels/lwk/src/xpmem/mod.rs), and attaches again: the kernel resumes the parked
 * attachment at the same address without asking the host (the attach command through another
 * descriptor is ENOTTY and leaves it parked). It detaches, attaches another range
 * through the same permit (all but the first page: the kernel first detaches the parked one
 * at the host, which keeps one attachment per permit), and the whole segment again (the daemon
 * adds it anew), writes 43 into word 1 of page 0 for the owner to see, and detaches. The owner
 * then removes the segment: attaching again must fail once the host revoked the permit (a
 * parked attachment never outlives its segment). The argument errors are checked on the way.
 * Usage: lwk_host_attacher [PAGES] (default 16, the owner's size; a GiB of them is mapped with
 * a shared directory of 2 MiB leaves).
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include <xpmem.h>
#include "attach_segment.h"

#define PAGE 4096UL

static sigjmp_buf recover;

static void on_segv(int sig)
{
	(void)sig;
	siglongjmp(recover, 1);
}

/* Whether reading `at` faults. */
static int read_faults(const volatile uint64_t *at)
{
	if (sigsetjmp(recover, 1) == 0) {
		(void)*at;
		return 0;
	}
	return 1;
}

int main(int argc, char **argv)
{
	unsigned long pages = argc > 1 ? strtoul(argv[1], NULL, 0) : 16;
	struct sigaction action = { .sa_handler = on_segv };
	sigemptyset(&action.sa_mask);
	sigaction(SIGSEGV, &action, NULL);
	xpmem_apid_t apid;
	int failed = get_named_segment("host-owner-seg", 200, &apid);
	if (failed)
		return failed;
	struct xpmem_addr misaligned = { .apid = apid, .offset = 100 };
	int misaligned_refused = xpmem_attach(misaligned, PAGE, NULL) == (void *)-1 && errno == EINVAL;
	struct xpmem_addr beyond = { .apid = apid, .offset = pages * PAGE };
	int beyond_refused = xpmem_attach(beyond, PAGE, NULL) == (void *)-1 && errno == EINVAL;
	printf("misaligned attach refused: %d, attach beyond the segment refused: %d\n", misaligned_refused, beyond_refused);

	volatile uint64_t *view = attach_segment(apid, pages * PAGE);
	if (!view)
		return ATTACH_FAILED;
	printf("%d of %lu pages hold what the host wrote\n", pages_with_pattern(view, pages, 2000), pages);
	printf("detach: %d\n", xpmem_detach((void *)view));
	printf("the detached view faults: %d (first page), %d (last page)\n", read_faults(view),
	       read_faults(view + (pages - 1) * PAGE / 8));

	/* The attach command on a descriptor that is not /dev/xpmem (standard output) is ENOTTY,
	 * and leaves the parked attachment parked. */
	struct xpmem_cmd_attach through_stdout = { .apid = apid, .offset = 0, .size = pages * PAGE };
	int not_a_device = ioctl(1, XPMEM_CMD_ATTACH, &through_stdout) == -1 && errno == ENOTTY;
	printf("the attach command through standard output: ENOTTY %d, still parked %d\n", not_a_device, read_faults(view));

	/* Again: the parked attachment comes back where it was. */
	struct xpmem_addr address = { .apid = apid, .offset = 0 };
	volatile uint64_t *again = xpmem_attach(address, pages * PAGE, NULL);
	if (again == (void *)-1) {
		printf("second attach failed: errno %d\n", errno);
		return 4;
	}
	printf("second attach: %d of %lu pages, at the first one's address: %d\n", pages_with_pattern(again, pages, 2000),
	       pages, again == view);
	/* The detach command on standard output is ENOTTY too, and leaves the attachment attached. */
	struct xpmem_cmd_detach detach_through_stdout = { .vaddr = (uintptr_t)again };
	not_a_device = ioctl(1, XPMEM_CMD_DETACH, &detach_through_stdout) == -1 && errno == ENOTTY;
	printf("the detach command through standard output: ENOTTY %d, still attached %d\n", not_a_device, !read_faults(again));
	printf("detach: %d\n", xpmem_detach((void *)again));

	/* Another range through the same permit. */
	struct xpmem_addr tail_address = { .apid = apid, .offset = PAGE };
	volatile uint64_t *tail = xpmem_attach(tail_address, (pages - 1) * PAGE, NULL);
	if (tail == (void *)-1) {
		printf("attach of all but the first page failed: errno %d\n", errno);
		return 4;
	}
	printf("all but the first page: %d of %lu pages\n", pages_with_pattern(tail, pages - 1, 2001), pages - 1);
	printf("detach: %d\n", xpmem_detach((void *)tail));

	/* The whole segment once more; the reply goes through it (the owner removes the segment
	 * once it sees it). */
	volatile uint64_t *last = xpmem_attach(address, pages * PAGE, NULL);
	if (last == (void *)-1) {
		printf("last attach failed: errno %d\n", errno);
		return 4;
	}
	printf("last attach: %d of %lu pages\n", pages_with_pattern(last, pages, 2000), pages);
	last[1] = 43;
	printf("detach: %d\n", xpmem_detach((void *)last));
	/* Parked until the owner's remove revokes the permit: attaches meanwhile resume it; the
	 * first one after fails (up to 20 s). */
	int attached_after_remove = 1;
	for (int tries = 0; tries < 2000 && attached_after_remove; tries++) {
		volatile uint64_t *view_now = xpmem_attach(address, pages * PAGE, NULL);
		attached_after_remove = view_now != (void *)-1;
		if (attached_after_remove) {
			xpmem_detach((void *)view_now);
			usleep(10000);
		}
	}
	printf("attach after the owner's remove fails: %d\n", !attached_after_remove);
	/* The remove took the permit with it: a release finds nothing (ENOENT), as with XPMEM. */
	int released = xpmem_release(apid);
	printf("release: %s\n", released == 0 ? "0" : errno == ENOENT ? "ENOENT" : "failed");
	return 0;
}
