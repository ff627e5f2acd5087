/* poll and ppoll on pipes, the console and closed descriptors: readiness as Linux reports it,
   timeouts, a wake by another process's write, hang-up and error ends, a signal ending the
   wait (EINTR after a handler) and ppoll's mask. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "readiness.h"

static void show(const char *what, int result, struct pollfd *fds, int count) {
    printf("%s: %d", what, result);
    if (result < 0)
        printf(" (%s)", strerror(errno));
    for (int i = 0; i < count; i++)
        printf(" [fd%s %#x]", fds[i].fd < 0 ? " -1" : "", fds[i].revents);
    printf("\n");
}

int main(void) {
    int p[2];
    if (pipe(p) < 0)
        return 1;
    struct pollfd fds[4] = {
        { .fd = p[0], .events = POLLIN },
        { .fd = p[1], .events = POLLOUT },
        { .fd = -1, .events = POLLIN },
        { .fd = 99, .events = POLLIN },
    };
    show("empty pipe, closed fd 99", poll(fds, 4, 0), fds, 4);
    (void)!write(p[1], "ab", 2);
    show("two bytes in", poll(fds, 2, 0), fds, 2);
    char buffer[8];
    (void)!read(p[0], buffer, sizeof buffer);

    long long start = now_ms();
    int result = poll(fds, 1, 60);
    printf("timeout 60 ms: %d, waited at least 60 ms: %s\n", result, now_ms() - start >= 60 ? "yes" : "no");
    struct timespec short_wait = { 0, 30 * 1000000 };
    start = now_ms();
    result = ppoll(fds, 1, &short_wait, NULL);
    printf("ppoll timeout 30 ms: %d, waited at least 30 ms: %s\n", result, now_ms() - start >= 30 ? "yes" : "no");

    pid_t child = later(50, p[1]);
    show("another process writes (no timeout)", poll(fds, 1, -1), fds, 1);
    waitpid(child, NULL, 0);
    (void)!read(p[0], buffer, sizeof buffer);

    count_sigusr1(0);
    child = later(50, -1);
    show("a signal ends the wait", poll(fds, 1, -1), fds, 1);
    printf("handled %d\n", (int)handled);
    waitpid(child, NULL, 0);

    /* ppoll's mask blocks SIGUSR1 while it waits: the byte wakes it, the signal waits. */
    sigset_t block, old;
    block_sigusr1(&block, &old);
    kill(getpid(), SIGUSR1);
    sigset_t empty;
    sigemptyset(&empty);
    handled = 0;
    child = later(50, p[1]);
    show("ppoll with an empty mask, SIGUSR1 pending", ppoll(fds, 1, NULL, &empty), fds, 1);
    printf("handled %d\n", (int)handled);
    waitpid(child, NULL, 0);
    (void)!read(p[0], buffer, sizeof buffer);
    child = later(30, p[1]);
    sigset_t usr1_blocked = block;
    handled = 0;
    kill(getpid(), SIGUSR1);
    /* Pending and blocked throughout: the byte ends this one. */
    show("ppoll blocking SIGUSR1", ppoll(fds, 1, NULL, &usr1_blocked), fds, 1);
    printf("handled %d\n", (int)handled);
    waitpid(child, NULL, 0);
    sigprocmask(SIG_SETMASK, &old, NULL);
    printf("handled after unblocking %d\n", (int)handled);

    close(p[1]);
    show("write end closed, a byte left", poll(fds, 1, -1), fds, 1);
    (void)!read(p[0], buffer, sizeof buffer);
    show("write end closed, drained", poll(fds, 1, -1), fds, 1);

    int q[2];
    if (pipe(q) < 0)
        return 1;
    close(q[0]);
    struct pollfd writer = { .fd = q[1], .events = POLLOUT };
    show("read end closed", poll(&writer, 1, 0), &writer, 1);
    return 0;
}
