/* What the readiness tests (poll.c, select.c, epoll.c) share: a child that wakes the waiter
   later, a SIGUSR1 handler that counts, blocking SIGUSR1, and a millisecond clock. */
#ifndef READINESS_H
#define READINESS_H

#include <signal.h>
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

#endif
