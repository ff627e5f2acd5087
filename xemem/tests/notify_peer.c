/*
 * notify_peer OWN PEER wait|signal: XEMEM's signals between two parties, each the owner of one
 * named segment and an attacher (permit holder) of the other's. One source, built for the host
 * (glibc, libxpmem and the broker) and as a static musl LWK job (/dev/xpmem), so any pair of
 * host and enclaves can play it.
 *   - makes the one-page segment OWN and takes its notify descriptor (made blocking);
 *   - "wait": reads the descriptor (blocks until PEER's party signals OWN), then looks PEER up
 *     and signals it;
 *   - "signal": looks PEER up (retrying while it does not exist yet), signals it, then polls
 *     the descriptor (POLLIN, 60 s at most) and reads it;
 *   - removes OWN once the peer has had time to look it up (the "wait" party removes last).
 * Prints "made OWN", "signalled PEER" and "woke N" lines; exits 0 when all went well.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <xpmem.h>

#define PAGE 4096UL

static void pause_ms(long ms)
{
	struct timespec delay = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000 };
	nanosleep(&delay, NULL);
}

static int signal_peer(const char *peer)
{
	xpmem_segid_t segid = -1;
	for (int attempt = 0; attempt < 600 && segid < 0; attempt++) {
		segid = xemem_lookup_segid(peer);
		if (segid < 0)
			pause_ms(50);
	}
	if (segid < 0) {
		printf("FAIL lookup %s: %s\n", peer, strerror(errno));
		return -1;
	}
	xpmem_apid_t apid = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
	if (apid < 0) {
		printf("FAIL get %s: %s\n", peer, strerror(errno));
		return -1;
	}
	if (xemem_signal(apid) != 0) {
		printf("FAIL signal %s: %s\n", peer, strerror(errno));
		return -1;
	}
	printf("signalled %s\n", peer);
	fflush(stdout);
	xpmem_release(apid);
	return 0;
}

static int wait_for_signal(int fd, int by_poll)
{
	if (by_poll) {
		struct pollfd entry = { .fd = fd, .events = POLLIN };
		int ready = poll(&entry, 1, 60000);
		if (ready != 1 || entry.revents != POLLIN) {
			printf("FAIL poll of the notify descriptor: %d, revents %#x (%s)\n", ready, entry.revents, strerror(errno));
			return -1;
		}
		printf("polled readable\n");
	}
	uint64_t count = 0;
	ssize_t got = read(fd, &count, sizeof count);
	if (got != 8) {
		printf("FAIL read of the notify descriptor: %zd (%s)\n", got, strerror(errno));
		return -1;
	}
	printf("woke %llu\n", (unsigned long long)count);
	fflush(stdout);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 4 || (strcmp(argv[3], "wait") && strcmp(argv[3], "signal"))) {
		fprintf(stderr, "usage: notify_peer OWN PEER wait|signal\n");
		return 2;
	}
	const char *own = argv[1], *peer = argv[2];
	int waits_first = !strcmp(argv[3], "wait");
	char *memory = mmap(NULL, 2 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (memory == MAP_FAILED)
		return 2;
	memory[0] = 1;
	xpmem_segid_t segid = xemem_make(memory, PAGE, own);
	int fd = segid > 0 ? xemem_notify_fd(segid) : -1;
	if (fd < 0) {
		printf("FAIL make %s or its notify descriptor: %s\n", own, strerror(errno));
		return 1;
	}
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
	printf("made %s\n", own);
	fflush(stdout);
	int failed = waits_first ? wait_for_signal(fd, 0) < 0 || signal_peer(peer) < 0
				 : signal_peer(peer) < 0 || wait_for_signal(fd, 1) < 0;
	/* The peer looks this segment up before it waits or after it woke: give it time. */
	pause_ms(waits_first ? 1000 : 200);
	if (xpmem_remove(segid) != 0) {
		printf("FAIL remove: %s\n", strerror(errno));
		failed = 1;
	}
	return failed ? 1 : 0;
}
