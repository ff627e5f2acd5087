/* What the readiness tests (poll.c, select.c, epoll.c) share: a child that wakes the waiter
   later, a SIGUSR1 handler that counts, blocking SIGUSR1, a millisecond clock, and the
   set-up and reports of the signal cases. */
#ifndef READINESS_H
#define READINESS_H

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t handled;
static void on_signal(int sig) { (void)sig; handled++; }

/* SIGUSR1 counts in `handled` from now on; `flags` as sigaction's (SA_RESTART or 0). */
static void count_sigusr1(int flags) {
    struct sigaction action = { .sa_handler = on_signal, .sa_flags = flags };
    sigemptyset(&action.sa_mask);
    sigaction(SIGUSR1, &action, NULL);
}

/* Sets `usr1` to {SIGUSR1} and blocks it; the mask before goes to `old` unless it is NULL. */
static void block_sigusr1(sigset_t *usr1, sigset_t *old) {
    sigemptyset(usr1);
    sigaddset(usr1, SIGUSR1);
    sigprocmask(SIG_BLOCK, usr1, old);
}

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

/* Reports a wait of `call` that SIGUSR1 ended: its `result` and errno, and the handler count. */
static inline void report_interrupted(const char *call, int result) {
    printf("signal during %s: %d (%s), handled %d\n", call, result, result < 0 ? strerror(errno) : "-", handled);
}

/* Set-up for a wait that lets SIGUSR1 through only while it waits: blocks it (`usr1` =
   {SIGUSR1}), sets `none` to the empty mask to wait with, zeroes `handled`, and returns a
   child that sends SIGUSR1 in 50 ms. */
static inline pid_t usr1_during_masked_wait(sigset_t *usr1, sigset_t *none) {
    block_sigusr1(usr1, NULL);
    sigemptyset(none);
    handled = 0;
    return later(50, -1);
}

/* Reports the wait `call` that let SIGUSR1 through: its `result` and errno, the handler count,
   and whether SIGUSR1 is blocked again after it. */
static inline void report_let_through(const char *call, int result) {
    sigset_t now;
    sigprocmask(SIG_BLOCK, NULL, &now);
    printf("%s with SIGUSR1 let through: %d (%s), handled %d, blocked again: %s\n", call, result,
           result < 0 ? strerror(errno) : "-", handled, sigismember(&now, SIGUSR1) ? "yes" : "no");
}

#endif
