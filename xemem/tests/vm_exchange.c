/*
 * One XPMEM program on both sides of a Linux VM (node/clowderd/tests/xemem_linux_vm.rs): run as
 * `vm_exchange host` on the host (libxpmem's broker backend) and `vm_exchange guest` in the VM
 * (the same static binary: libxpmem finds the XEMEM PCI device there by itself).
 *
 * Each side makes a named segment of PAGES pages whose page i starts with TAG|i ("host-to-vm"
 * by the host, "vm-to-host" by the guest), looks up the other's, attaches it, checks every page,
 * then writes DONE into word 1 of the other's first page and waits for the other to do the same
 * in its own. Then, in turn:
 *  - the host signals the guest's segment (xemem_signal); the guest's notify descriptor (an
 *    eventfd its agent's keeper writes) counts it;
 *  - the guest signals the host's segment; the host's notify descriptor counts it;
 *  - the guest removes its segment: the host, still attached, must get SIGBUS touching it;
 *  - the host removes its segment: the guest, still attached, must get SIGBUS touching it (sent
 *    by the guest agent once the VMM saw the touch: si_code SI_USER, a few milliseconds late,
 *    reading all ones meanwhile; docs/xemem-pci.md).
 * It prints what it saw; status 0 when everything held.
 *
 * `vm_exchange leave` (guest) and `vm_exchange stay` (host): a guest process makes "vm-leaves",
 * waits for the host to attach it and ends without removing it; the host must then get SIGBUS
 * touching it (the agent's keeper removed it), never anything but what the guest wrote (the
 * guest kernel reusing the freed pages).
 *
 * `vm_exchange vmhost` plays the host's part in a second VM (VM<->VM): the same exchange, its
 * SIGBUS sent by its own agent (SI_USER) as in any VM attacher.
 */
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <xpmem.h>

#define PAGES 256
#define PAGE 4096UL
#define HOST_TAG 0x484f535400000000ULL  /* "HOST" */
#define GUEST_TAG 0x4755455300000000ULL /* "GUES" */
#define DONE 0xd0d0d0d0d0d0d0d0ULL

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static int fail(const char *what)
{
	printf("%s failed: %s (%s)\n", what, strerror(errno), xemem_errmsg());
	return 1;
}

/* Private memory of `size` bytes at least 8 MiB above anything below it: the kernel may merge
 * a small mapping with a thread stack (libxpmem's own service thread's, in a static binary),
 * and a host owner's library keeps the 8 MiB above a stack's guard out of every export (they
 * read as a hole to attachers, which a VM cannot place). The 8 MiB below stay untouched. */
static volatile uint64_t *away_from_stacks(size_t size)
{
	char *p = mmap(NULL, size + (8UL << 20), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? MAP_FAILED : (volatile uint64_t *)(p + (8UL << 20));
}

static sigjmp_buf touch_jump;
static volatile uintptr_t fault_address;
static volatile int fault_code;

static void on_sigbus(int signal, siginfo_t *info, void *context)
{
	(void)signal;
	(void)context;
	fault_address = (uintptr_t)info->si_addr;
	fault_code = info->si_code;
	siglongjmp(touch_jump, 1);
}

/* Waits for a signal to the segment whose notify descriptor is `fd`: 0, or 1 after `timeout`. */
static int signalled(const char *who, int fd, const char *name, double timeout)
{
	struct pollfd ready = {.fd = fd, .events = POLLIN};
	uint64_t count = 0;
	if (poll(&ready, 1, (int)(timeout * 1000)) != 1 || read(fd, &count, sizeof count) != sizeof count || count == 0) {
		printf("%s: no signal to %s\n", who, name);
		return 1;
	}
	printf("%s: the other side signalled %s (%llu)\n", who, name, (unsigned long long)count);
	fflush(stdout);
	return 0;
}

/* Touches `view` until SIGBUS (the other side removed it): 0, or 1 after `timeout`. A host
 * attacher's comes from its kernel at the touched address; a VM attacher's from its agent
 * (SI_USER, no address: docs/xemem-pci.md), milliseconds after a touch. */
static int touched_until_sigbus(const char *who, volatile uint64_t *view, const char *name, int in_vm, double timeout)
{
	struct sigaction action = {.sa_sigaction = on_sigbus, .sa_flags = SA_SIGINFO};
	sigaction(SIGBUS, &action, NULL);
	static volatile uint64_t touches;
	static volatile double start;
	if (!sigsetjmp(touch_jump, 1)) {
		start = now();
		for (touches = 0; now() - start < timeout; touches++) {
			for (uint64_t i = 0; i < PAGES; i++)
				(void)view[i * PAGE / 8];
			/* A VM attacher's touch of a revoked page is an exit to the VMM: spin gently. */
			if (in_vm)
				usleep(1000);
		}
		printf("%s: no SIGBUS touching %s after the other side removed it\n", who, name);
		return 1;
	}
	int inside = fault_address >= (uintptr_t)view && fault_address < (uintptr_t)view + PAGES * PAGE;
	if (in_vm) {
		printf("%s: SIGBUS (%s) touching %s once the other side removed it (%.3f s, %llu rounds)\n", who,
		       fault_code == SI_USER ? "SI_USER" : "not SI_USER", name, now() - start, (unsigned long long)touches);
		fflush(stdout);
		return fault_code != SI_USER;
	}
	printf("%s: SIGBUS %s %s once the guest removed it\n", who, inside ? "inside" : "outside", name);
	fflush(stdout);
	return !inside;
}

#define LEAVE_TAG 0x4c45415600000000ULL /* "LEAV" */

/* The guest's side of the exit case: export, wait to be attached, end without removing. */
static int leave(void)
{
	volatile uint64_t *own = mmap(NULL, PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (own == MAP_FAILED)
		return fail("mmap");
	for (uint64_t i = 0; i < PAGES; i++)
		own[i * PAGE / 8] = LEAVE_TAG | i;
	if (xemem_make((void *)own, PAGES * PAGE, "vm-leaves") < 0)
		return fail("xemem_make");
	printf("leave: made vm-leaves\n");
	fflush(stdout);
	double start = now();
	while (own[1] != DONE) {
		if (now() - start > 600) {
			printf("leave: the host never attached vm-leaves\n");
			return 1;
		}
		usleep(10000);
	}
	printf("leave: attached by the host; ending without removing vm-leaves\n");
	return 0;
}

/* The host's side: attach, then read until SIGBUS; anything but the guest's data fails. */
static int stay(void)
{
	double start = now();
	xpmem_segid_t segid;
	while ((segid = xemem_lookup_segid("vm-leaves")) < 0) {
		if (now() - start > 600)
			return fail("xemem_lookup_segid");
		usleep(100000);
	}
	xpmem_apid_t apid = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, (void *)0666);
	if (apid < 0)
		return fail("xpmem_get");
	struct xpmem_addr addr = {.apid = apid, .offset = 0};
	volatile uint64_t *view = xpmem_attach(addr, PAGES * PAGE, NULL);
	if (view == MAP_FAILED || view == NULL)
		return fail("xpmem_attach");
	struct sigaction action = {.sa_sigaction = on_sigbus, .sa_flags = SA_SIGINFO};
	sigaction(SIGBUS, &action, NULL);
	static volatile uint64_t rounds;
	if (!sigsetjmp(touch_jump, 1)) {
		view[1] = DONE;
		start = now();
		for (rounds = 0; now() - start < 300; rounds++)
			for (uint64_t i = 0; i < PAGES; i++) {
				uint64_t word = view[i * PAGE / 8];
				if (word != (LEAVE_TAG | i)) {
					printf("host: vm-leaves page %llu reads %#llx after %llu rounds, not what the guest wrote\n",
					       (unsigned long long)i, (unsigned long long)word, (unsigned long long)rounds);
					return 1;
				}
			}
		printf("host: no SIGBUS touching vm-leaves 300 s after attaching it\n");
		return 1;
	}
	int inside = fault_address >= (uintptr_t)view && fault_address < (uintptr_t)view + PAGES * PAGE;
	printf("host: SIGBUS %s vm-leaves once its guest process ended (%llu rounds of the guest's data before)\n",
	       inside ? "inside" : "outside", (unsigned long long)rounds);
	return !inside;
}

int main(int argc, char **argv)
{
	if (argc == 2 && !strcmp(argv[1], "leave"))
		return leave();
	if (argc == 2 && !strcmp(argv[1], "stay"))
		return stay();
	if (argc != 2 || (strcmp(argv[1], "host") && strcmp(argv[1], "guest") && strcmp(argv[1], "vmhost"))) {
		fprintf(stderr, "usage: vm_exchange host|guest|vmhost|leave|stay\n");
		return 2;
	}
	int vm_host = !strcmp(argv[1], "vmhost"), host = vm_host || !strcmp(argv[1], "host");
	const char *mine = host ? "host-to-vm" : "vm-to-host", *theirs = host ? "vm-to-host" : "host-to-vm";
	uint64_t tag = host ? HOST_TAG : GUEST_TAG, their_tag = host ? GUEST_TAG : HOST_TAG;
	double timeout = 600;

	volatile uint64_t *own = away_from_stacks(PAGES * PAGE);
	if (own == MAP_FAILED)
		return fail("mmap");
	for (uint64_t i = 0; i < PAGES; i++)
		own[i * PAGE / 8] = tag | i;
	xpmem_segid_t segid = xemem_make((void *)own, PAGES * PAGE, mine);
	if (segid < 0)
		return fail("xemem_make");
	/* Asked for before anyone can signal it. */
	int notify = xemem_notify_fd(segid);
	if (notify < 0)
		return fail("xemem_notify_fd");
	printf("%s: made %s\n", argv[1], mine);
	fflush(stdout);

	double start = now();
	xpmem_segid_t other;
	while ((other = xemem_lookup_segid(theirs)) < 0) {
		if (now() - start > timeout)
			return fail("xemem_lookup_segid");
		usleep(100000);
	}
	xpmem_apid_t apid = xpmem_get(other, XPMEM_RDWR, XPMEM_PERMIT_MODE, (void *)0666);
	if (apid < 0)
		return fail("xpmem_get");
	struct xpmem_addr addr = {.apid = apid, .offset = 0};
	double attach_start = now();
	volatile uint64_t *view = xpmem_attach(addr, PAGES * PAGE, NULL);
	if (view == MAP_FAILED || view == NULL)
		return fail("xpmem_attach");
	double attached = now() - attach_start;
	unsigned good = 0;
	for (uint64_t i = 0; i < PAGES; i++)
		good += view[i * PAGE / 8] == (their_tag | i);
	printf("%s: %u of %u pages of %s hold what the other side wrote (attach %.3f ms)\n", argv[1], good, PAGES, theirs,
	       attached * 1e3);
	view[1] = DONE;
	fflush(stdout);

	start = now();
	while (own[1] != DONE) {
		if (now() - start > timeout) {
			printf("%s: the other side never wrote into %s\n", argv[1], mine);
			return 1;
		}
		usleep(10000);
	}
	printf("%s: the other side wrote into %s\n", argv[1], mine);
	fflush(stdout);
	int status = good == PAGES ? 0 : 1;
	if (host) {
		if (xemem_signal(apid))
			return fail("xemem_signal");
		printf("%s: signalled %s\n", argv[1], theirs);
		fflush(stdout);
		if (signalled(argv[1], notify, mine, timeout) || touched_until_sigbus(argv[1], view, theirs, vm_host, timeout))
			return 1;
		/* Last: the guest, still attached, then sees this segment go. */
		if (xpmem_remove(segid))
			return fail("xpmem_remove");
		/* The permit went with the guest's segment: detach and release may say so. */
		xpmem_detach((void *)view);
		xpmem_release(apid);
	} else {
		if (signalled(argv[1], notify, mine, timeout))
			return 1;
		if (xemem_signal(apid))
			return fail("xemem_signal");
		if (xpmem_remove(segid))
			return fail("xpmem_remove");
		printf("guest: signalled host-to-vm and removed vm-to-host\n");
		fflush(stdout);
		if (touched_until_sigbus(argv[1], view, theirs, 1, timeout))
			return 1;
		if (xpmem_detach((void *)view))
			return fail("xpmem_detach");
		xpmem_release(apid);
	}
	return status;
}
