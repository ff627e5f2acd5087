/* later(): what the readiness tests (poll.c, select.c, epoll.c) wait for. */
#ifndef LATER_H
#define LATER_H

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

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
