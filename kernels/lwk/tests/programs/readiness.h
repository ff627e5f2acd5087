/* What the readiness tests (poll.c, select.c, epoll.c) share: a child that wakes the waiter
   later, a SIGUSR1 handler that counts, and a millisecond clock. */
#ifndef READINESS_H
#define READINESS_H

#include <signal.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t handled;
static void on_signal(int sig) { (void)sig; handled++; }

static long long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000LL + t.tv_nsec / 1000000;
}

/* A child that, after `delay_ms`, writes a byte to `fd` (or, if fd is -1, sends SIGUSR1 to its
   parent), then exits. */
static pid_t later(int delay_ms, int fd) {
    pid_t parent = getpid();
    pid_t child = fork();
    if (child == 0) {
        usleep(delay_ms * 1000);
        if (fd >= 0)
            (void)!write(fd, "x", 1);
        else
            kill(parent, SIGUSR1);
        _exit(0);
    }
    return child;
}

#endif
