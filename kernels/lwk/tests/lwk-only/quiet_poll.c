/* Two threads wait for a pipe with no timeout, one in epoll_wait, one in poll, while the main
 * thread spins in user mode for 3 s on the enclave's one CPU, then writes a byte. Each waiter
 * must wake once, for the byte: tests/quiet-poll.sh checks, from the kernel's count of the
 * job's entries, that they did not wake (two timer ticks each) every 100 ms meanwhile. */
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

static int pipe_ends[2];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t); /* the vDSO's: no kernel entry */
    return t.tv_sec + t.tv_nsec / 1e9;
}

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

int main(void) {
    pthread_t threads[2];
    if (pipe(pipe_ends) != 0 || pthread_create(&threads[0], NULL, epoll_waiter, NULL) != 0 ||
        pthread_create(&threads[1], NULL, poll_waiter, NULL) != 0) {
        puts("set-up failed");
        return 1;
    }
    for (double end = now() + 3; now() < end;) {
    }
    if (write(pipe_ends[1], "x", 1) != 1) return 1;
    for (int i = 0; i < 2; i++) {
        void *error;
        pthread_join(threads[i], &error);
        if (error) {
            puts(error);
            return 1;
        }
    }
    puts("both waiters woke for the byte");
    return 0;
}
