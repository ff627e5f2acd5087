/* Four threads wait with no timeout: for a pipe, one in epoll_wait, one in poll; one in recv
 * on a socket (the host's: a Unix socketpair) and one in read of an XEMEM notification
 * descriptor, which the host may end, while the main thread spins in user mode for 3 s on the
 * enclave's one CPU, then writes a byte to the pipe and the socket and signals the segment.
 * Each waiter must wake once, for its news: tests/quiet-poll.sh checks, from the kernel's
 * count of the job's entries, that they did not wake (two timer ticks each) every 100 ms
 * meanwhile. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <xpmem.h>
#include "clowder_test.h"

static int pipe_ends[2], socket_ends[2], notify_fd;
static char exported[4096] __attribute__((aligned(4096)));

static void *epoll_waiter(void *unused) {
    (void)unused;
    int epoll = epoll_create1(0);
    struct epoll_event event = {.events = EPOLLIN}, got;
    if (epoll < 0 || epoll_ctl(epoll, EPOLL_CTL_ADD, pipe_ends[0], &event) != 0) return "epoll set-up failed";
    return epoll_wait(epoll, &got, 1, -1) == 1 ? NULL : "epoll_wait did not report the pipe";
}

static void *poll_waiter(void *unused) {
    (void)unused;
    struct pollfd entry = {.fd = pipe_ends[0], .events = POLLIN};
    return poll(&entry, 1, -1) == 1 && (entry.revents & POLLIN) ? NULL : "poll did not report the pipe";
}

static void *socket_waiter(void *unused) {
    (void)unused;
    char byte;
    return recv(socket_ends[0], &byte, 1, 0) == 1 ? NULL : "recv did not get the byte";
}

static void *notify_reader(void *unused) {
    (void)unused;
    uint64_t count;
    return read(notify_fd, &count, sizeof count) == sizeof count && count == 1 ? NULL : "the notify read did not get the signal";
}

int main(void) {
    void *(*waiters[])(void *) = {epoll_waiter, poll_waiter, socket_waiter, notify_reader};
    pthread_t threads[4];
    xpmem_segid_t segid = xpmem_make(exported, sizeof exported, XPMEM_PERMIT_MODE, (void *)0600);
    xpmem_apid_t apid = segid > 0 ? xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL) : -1;
    notify_fd = segid > 0 ? xemem_notify_fd(segid) : -1;
    /* The library's descriptor is non-blocking, as the host's eventfd: this reader waits. */
    if (pipe(pipe_ends) != 0 || socketpair(AF_UNIX, SOCK_STREAM, 0, socket_ends) != 0 || apid < 0 || notify_fd < 0 ||
        fcntl(notify_fd, F_SETFL, 0) != 0) {
        puts("set-up failed");
        return 1;
    }
    for (int i = 0; i < 4; i++)
        if (pthread_create(&threads[i], NULL, waiters[i], NULL) != 0) {
            puts("set-up failed");
            return 1;
        }
    for (double end = now() + 3; now() < end;) {
    }
    if (write(pipe_ends[1], "x", 1) != 1 || send(socket_ends[1], "x", 1, 0) != 1 || xemem_signal(apid) != 0) return 1;
    for (int i = 0; i < 4; i++) {
        void *error;
        pthread_join(threads[i], &error);
        if (error) {
            puts(error);
            return 1;
        }
    }
    puts("all four waiters woke for their news");
    return 0;
}
