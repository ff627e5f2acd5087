/* epoll on pipes, as Linux answers: epoll_create/epoll_create1's checks; epoll_ctl's errors in
   Linux's order (EFAULT, EBADF, EPERM for a regular file, EINVAL, EEXIST, ENOENT) and
   EPOLLEXCLUSIVE's rules; epoll_wait's maxevents and EFAULT checks, level-triggered
   readiness, hang-up and error ends, a small maxevents serving every ready pipe in turn,
   EPOLLONESHOT, EPOLLET (per write, not per read; a read that makes room in a full pipe for
   the write end), interests ending with their open file (not with a descriptor while a dup
   lives), timeouts, wakes by another process, a signal ending the wait (EINTR even with
   SA_RESTART), epoll_pwait's mask and epoll_pwait2's timespec; an epoll descriptor in poll
   and select, and read/write/fcntl on it; nested instances (ELOOP for loops and depth). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "readiness.h"

#ifndef SYS_epoll_pwait2
#define SYS_epoll_pwait2 441
#endif

static void result(const char *what, int value) {
    if (value < 0)
        printf("%s: %d (%s)\n", what, value, strerror(errno));
    else
        printf("%s: %d\n", what, value);
}

static int by_data(const void *a, const void *b) {
    uint64_t x = ((const struct epoll_event *)a)->data.u64, y = ((const struct epoll_event *)b)->data.u64;
    return (x > y) - (x < y);
}

/* epoll_wait with `timeout` ms; prints the count and each event (data, events), sorted by
   data unless `in_order`. */
static int show_wait(const char *what, int ep, int max, int timeout, int in_order) {
    struct epoll_event events[16];
    memset(events, 0, sizeof events);
    int count = epoll_wait(ep, events, max, timeout);
    printf("%s: %d", what, count);
    if (count < 0)
        printf(" (%s)", strerror(errno));
    if (count > 0 && !in_order)
        qsort(events, count, sizeof events[0], by_data);
    for (int i = 0; i < count; i++)
        printf(" [%llu %#x]", (unsigned long long)events[i].data.u64, events[i].events);
    printf("\n");
    return count;
}

static int add(int ep, int fd, uint32_t events, uint64_t data) {
    struct epoll_event event = { .events = events, .data.u64 = data };
    return epoll_ctl(ep, EPOLL_CTL_ADD, fd, &event);
}

static int modify(int ep, int fd, uint32_t events, uint64_t data) {
    struct epoll_event event = { .events = events, .data.u64 = data };
    return epoll_ctl(ep, EPOLL_CTL_MOD, fd, &event);
}

static void drain(int fd) {
    char buffer[256];
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    while (read(fd, buffer, sizeof buffer) > 0) {
    }
    fcntl(fd, F_SETFL, flags);
}

int main(void) {
    char buffer[64];
    errno = 0;
    result("epoll_create1(0x10)", epoll_create1(0x10));
    result("epoll_create(0)", epoll_create(0));
    result("epoll_create(-1)", epoll_create(-1));
    int old = epoll_create(1);
    printf("epoll_create(1) works: %s\n", old >= 0 ? "yes" : "no");
    close(old);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    printf("epoll_create1(EPOLL_CLOEXEC): FD_CLOEXEC %d, F_GETFL %#x\n", fcntl(ep, F_GETFD), fcntl(ep, F_GETFL) & O_ACCMODE);
    result("read from the epoll fd", read(ep, buffer, 8));
    result("write to the epoll fd", write(ep, "x", 1));

    int p[2], q[2];
    if (pipe(p) < 0 || pipe(q) < 0)
        return 1;
    int file = open("files/input.txt", O_RDONLY);
    int closed = dup(p[0]);
    close(closed);

    /* epoll_ctl's errors. */
    result("ADD with an unreadable event", epoll_ctl(ep, EPOLL_CTL_ADD, p[0], (struct epoll_event *)8));
    result("ADD to a closed epfd", add(closed, p[0], EPOLLIN, 0));
    result("ADD of a closed fd", add(ep, closed, EPOLLIN, 0));
    result("ADD of a regular file", add(ep, file, EPOLLIN, 0));
    result("ADD to an epfd that is a pipe", add(p[0], q[0], EPOLLIN, 0));
    result("ADD of the epfd to itself", add(ep, ep, EPOLLIN, 0));
    result("op 7", epoll_ctl(ep, 7, p[0], &(struct epoll_event){ .events = EPOLLIN }));
    result("MOD of an absent fd", modify(ep, p[0], EPOLLIN, 0));
    result("DEL of an absent fd", epoll_ctl(ep, EPOLL_CTL_DEL, p[0], NULL));
    result("ADD EPOLLEXCLUSIVE|EPOLLONESHOT", add(ep, p[0], EPOLLIN | EPOLLEXCLUSIVE | EPOLLONESHOT, 0));
    result("ADD EPOLLEXCLUSIVE|EPOLLIN", add(ep, q[0], EPOLLIN | EPOLLEXCLUSIVE, 9));
    result("MOD of an exclusive interest", modify(ep, q[0], EPOLLIN, 9));
    result("MOD with EPOLLEXCLUSIVE", modify(ep, q[0], EPOLLIN | EPOLLEXCLUSIVE, 9));
    result("DEL (NULL event)", epoll_ctl(ep, EPOLL_CTL_DEL, q[0], NULL));

    /* epoll_wait's checks. */
    struct epoll_event events[4];
    result("maxevents 0", epoll_wait(ep, events, 0, 0));
    result("maxevents -1", epoll_wait(ep, events, -1, 0));
    result("epoll_wait on a pipe", epoll_wait(p[0], events, 4, 0));
    result("epoll_wait on a closed fd", epoll_wait(closed, events, 4, 0));
    result("events in the kernel half", epoll_wait(ep, (struct epoll_event *)0xffff800000000000ull, 1, 0));

    /* Level-triggered: readable while bytes wait. */
    result("ADD p0 EPOLLIN", add(ep, p[0], EPOLLIN, 1));
    result("ADD p0 again", add(ep, p[0], EPOLLIN, 1));
    result("ADD p1 EPOLLOUT", add(ep, p[1], EPOLLOUT, 2));
    result("p1 ready, NULL events", epoll_wait(ep, NULL, 1, 0));
    result("DEL p1", epoll_ctl(ep, EPOLL_CTL_DEL, p[1], NULL));
    result("nothing ready, NULL events", epoll_wait(ep, NULL, 1, 0));
    show_wait("empty pipe", ep, 4, 0, 0);
    (void)!write(p[1], "ab", 2);
    result("something ready, NULL events", epoll_wait(ep, NULL, 1, 0));
    show_wait("two bytes in", ep, 4, 0, 0);
    show_wait("still there (level)", ep, 4, 0, 0);
    (void)!read(p[0], buffer, sizeof buffer);
    long long start = now_ms();
    int count = epoll_wait(ep, events, 4, 60);
    printf("timeout 60 ms: %d, waited at least 60 ms: %s\n", count, now_ms() - start >= 60 ? "yes" : "no");
    pid_t child = later(50, p[1]);
    show_wait("another process writes (no timeout)", ep, 4, -1, 0);
    waitpid(child, NULL, 0);
    drain(p[0]);

    /* MOD changes the events and the data. */
    result("MOD p0 to EPOLLOUT", modify(ep, p[0], EPOLLOUT, 11));
    (void)!write(p[1], "c", 1);
    show_wait("p0 ready to read, watched for EPOLLOUT", ep, 4, 0, 0);
    result("MOD p0 back to EPOLLIN", modify(ep, p[0], EPOLLIN, 12));
    show_wait("p0 watched for EPOLLIN", ep, 4, 0, 0);
    drain(p[0]);

    /* A small maxevents: three ready pipes come in turn. */
    int a[2], b[2], c[2];
    if (pipe(a) < 0 || pipe(b) < 0 || pipe(c) < 0)
        return 1;
    int ep2 = epoll_create1(0);
    add(ep2, a[0], EPOLLIN, 100);
    add(ep2, b[0], EPOLLIN, 200);
    add(ep2, c[0], EPOLLIN, 300);
    (void)!write(a[1], "a", 1);
    (void)!write(b[1], "b", 1);
    (void)!write(c[1], "c", 1);
    show_wait("three ready, maxevents 2", ep2, 2, 0, 1);
    show_wait("then", ep2, 2, 0, 1);
    show_wait("then", ep2, 2, 0, 1);

    /* The epoll descriptor itself: readable in poll and select while something is due. */
    struct pollfd poll_entry = { .fd = ep2, .events = POLLIN | POLLOUT };
    count = poll(&poll_entry, 1, 0);
    printf("poll of an epoll fd with events due: %d %#x\n", count, poll_entry.revents);
    fd_set readable;
    FD_ZERO(&readable);
    FD_SET(ep2, &readable);
    struct timeval zero = { 0, 0 };
    printf("select of it: %d\n", select(ep2 + 1, &readable, NULL, NULL, &zero));
    drain(a[0]); drain(b[0]); drain(c[0]);
    count = poll(&poll_entry, 1, 0);
    printf("poll of it, nothing due: %d %#x\n", count, poll_entry.revents);
    child = later(50, b[1]);
    count = poll(&poll_entry, 1, 5000);
    printf("poll of it, another process writes: %d %#x\n", count, poll_entry.revents);
    waitpid(child, NULL, 0);
    drain(b[0]);

    /* An interest lives as long as its open file: closing the only descriptor ends it, closing
       one of two (a dup) does not. */
    int dup_of_a = dup(a[0]);
    close(a[0]);
    (void)!write(a[1], "a", 1);
    show_wait("a0 closed, its dup still open", ep2, 4, 0, 0);
    result("DEL of the closed number", epoll_ctl(ep2, EPOLL_CTL_DEL, a[0], NULL));
    result("DEL of the dup's number", epoll_ctl(ep2, EPOLL_CTL_DEL, dup_of_a, NULL));
    close(dup_of_a);
    (void)!write(c[1], "c", 1);
    close(c[0]);
    show_wait("a0 and c0 closed for good", ep2, 4, 0, 0);
    result("ADD of c0's number, now closed", add(ep2, c[0], EPOLLIN, 300));

    /* Ends: hang-up (EPOLLHUP whatever was asked) and error. */
    int h[2];
    if (pipe(h) < 0)
        return 1;
    add(ep2, h[0], 0, 400);
    add(ep2, h[1], EPOLLOUT, 500);
    show_wait("h0 watched for nothing, h1 for EPOLLOUT", ep2, 4, 0, 0);
    (void)!write(h[1], "z", 1);
    close(h[1]);
    show_wait("h1 closed, a byte left in h0", ep2, 4, 0, 0);
    drain(h[0]);
    show_wait("h0 drained", ep2, 4, 0, 0);
    int g[2];
    if (pipe(g) < 0)
        return 1;
    add(ep2, g[1], EPOLLOUT, 600);
    close(g[0]);
    show_wait("g0 closed, g1 watched for EPOLLOUT", ep2, 4, 0, 0);
    close(g[1]);
    close(h[0]);

    /* EPOLLONESHOT: once, then nothing until MOD. */
    int ep3 = epoll_create1(0);
    int o[2];
    if (pipe(o) < 0)
        return 1;
    add(ep3, o[0], EPOLLIN | EPOLLONESHOT, 700);
    (void)!write(o[1], "o", 1);
    show_wait("one-shot, ready", ep3, 4, 0, 0);
    (void)!write(o[1], "o", 1);
    show_wait("one-shot, after it fired", ep3, 4, 0, 0);
    close(o[1]);
    show_wait("one-shot, write end closed", ep3, 4, 0, 0);
    result("MOD of the one-shot", modify(ep3, o[0], EPOLLIN | EPOLLONESHOT, 701));
    show_wait("one-shot, armed again", ep3, 4, 0, 0);
    result("ADD of the fired one-shot", add(ep3, o[0], EPOLLIN, 702));
    close(o[0]);

    /* EPOLLET: once per write, not again for a partial read. */
    int t[2];
    if (pipe(t) < 0)
        return 1;
    add(ep3, t[0], EPOLLIN | EPOLLET, 800);
    show_wait("edge-triggered, empty", ep3, 4, 0, 0);
    (void)!write(t[1], "abc", 3);
    show_wait("edge-triggered, a write", ep3, 4, 0, 0);
    show_wait("edge-triggered, again", ep3, 4, 0, 0);
    (void)!read(t[0], buffer, 1);
    show_wait("edge-triggered, after a partial read", ep3, 4, 0, 0);
    (void)!write(t[1], "d", 1);
    show_wait("edge-triggered, another write", ep3, 4, 0, 0);
    result("MOD of the edge-triggered interest", modify(ep3, t[0], EPOLLIN | EPOLLET, 801));
    show_wait("edge-triggered, after MOD", ep3, 4, 0, 0);
    drain(t[0]);
    show_wait("edge-triggered, drained", ep3, 4, 0, 0);
    /* Its write end: reported again only when a read makes room in a full pipe. */
    add(ep3, t[1], EPOLLOUT | EPOLLET, 900);
    show_wait("edge-triggered write end", ep3, 4, 0, 0);
    (void)!write(t[1], "e", 1);
    (void)!read(t[0], buffer, 1);
    show_wait("edge-triggered write end, a read of a pipe not full", ep3, 4, 0, 0);
    epoll_ctl(ep3, EPOLL_CTL_DEL, t[0], NULL);
    fcntl(t[1], F_SETFL, O_NONBLOCK);
    static char big[4096];
    int filled = 0, written;
    while ((written = write(t[1], big, sizeof big)) > 0)
        filled += written;
    printf("filled the pipe: %d bytes\n", filled);
    show_wait("edge-triggered write end, pipe full", ep3, 4, 0, 0);
    (void)!read(t[0], big, sizeof big);
    show_wait("edge-triggered write end, a read of the full pipe", ep3, 4, 0, 0);
    show_wait("edge-triggered write end, again", ep3, 4, 0, 0);
    close(t[0]);
    show_wait("edge-triggered write end, read end closed", ep3, 4, 0, 0);
    close(t[1]);

    /* Nesting: an epoll instance watching another, readable while the inner one has an
       event due; loops and chains nested too deep are ELOOP. */
    int outer = epoll_create1(0), inner = epoll_create1(0);
    int n[2];
    if (pipe(n) < 0)
        return 1;
    add(inner, n[0], EPOLLIN, 1000);
    result("ADD of an epoll fd to another", add(outer, inner, EPOLLIN, 1001));
    show_wait("outer, inner has nothing due", outer, 4, 0, 0);
    (void)!write(n[1], "n", 1);
    show_wait("outer, inner has a pipe ready", outer, 4, 0, 0);
    show_wait("inner", inner, 4, 0, 0);
    drain(n[0]);
    child = later(50, n[1]);
    show_wait("outer, another process writes to the inner's pipe", outer, 4, -1, 0);
    waitpid(child, NULL, 0);
    drain(n[0]);
    result("ADD of the outer to the inner (a loop)", add(inner, outer, EPOLLIN, 0));
    int outer_again = dup(outer);
    result("ADD of a dup of the epfd to itself", add(outer, outer_again, EPOLLIN, 0));
    close(outer_again);
    result("EPOLLEXCLUSIVE on an epoll target", add(ep3, inner, EPOLLIN | EPOLLEXCLUSIVE, 0));
    int chain[6];
    for (int i = 0; i < 6; i++)
        chain[i] = epoll_create1(0);
    printf("a chain of six, each added to the one above:");
    for (int i = 5; i > 0; i--) {
        int added = add(chain[i - 1], chain[i], EPOLLIN, i);
        printf(" %d%s", added, added < 0 ? (errno == ELOOP ? " (ELOOP)" : " (?)") : "");
    }
    printf("\n");
    for (int i = 0; i < 6; i++)
        close(chain[i]);
    close(n[0]);
    close(n[1]);

    /* Signals: EINTR after a handler, even with SA_RESTART. */
    count_sigusr1(SA_RESTART);
    child = later(50, -1);
    count = epoll_wait(ep, events, 4, -1);
    report_interrupted("epoll_wait", count);
    waitpid(child, NULL, 0);

    /* epoll_pwait: SIGUSR1 blocked, let through only while it waits. */
    sigset_t block, unblocked;
    child = usr1_during_masked_wait(&block, &unblocked);
    count = epoll_pwait(ep, events, 4, 10000, &unblocked);
    report_let_through("epoll_pwait", count);
    waitpid(child, NULL, 0);
    kill(getpid(), SIGUSR1);
    start = now_ms();
    count = epoll_pwait(ep, events, 4, 30, &block);
    printf("epoll_pwait, pending SIGUSR1 still blocked: %d, waited at least 30 ms: %s, handled %d\n", count,
           now_ms() - start >= 30 ? "yes" : "no", handled);
    (void)!write(p[1], "y", 1);
    count = epoll_pwait(ep, events, 4, 30, &unblocked);
    printf("epoll_pwait, ready pipe and a pending signal let through: %d, handled %d\n", count, handled);
    sigprocmask(SIG_UNBLOCK, &block, NULL);
    printf("after unblocking: handled %d\n", handled);
    errno = 0;
    count = syscall(SYS_epoll_pwait, ep, events, 4, 0, &unblocked, 4);
    printf("epoll_pwait with a 4-byte mask: %d (%s)\n", count, strerror(errno));
    count = syscall(SYS_epoll_pwait, ep, events, 4, 0, NULL, 4);
    printf("epoll_pwait with a NULL mask and size 4: %d\n", count);

    /* epoll_pwait2: a timespec timeout. */
    struct timespec bad = { 0, 1000000000 };
    errno = 0;
    count = syscall(SYS_epoll_pwait2, ep, events, 4, &bad, NULL, 8);
    printf("epoll_pwait2 with tv_nsec 10^9: %d (%s)\n", count, strerror(errno));
    count = syscall(SYS_epoll_pwait2, ep, events, 4, NULL, NULL, 8);
    printf("epoll_pwait2, no timeout, p0 ready: %d\n", count);
    drain(p[0]);
    struct timespec wait = { 0, 30 * 1000000 };
    start = now_ms();
    count = syscall(SYS_epoll_pwait2, ep, events, 4, &wait, NULL, 8);
    printf("epoll_pwait2 timeout 30 ms: %d, waited at least 30 ms: %s\n", count, now_ms() - start >= 30 ? "yes" : "no");

    /* A forked child shares the instance. */
    child = fork();
    if (child == 0) {
        (void)!write(p[1], "k", 1);
        count = epoll_wait(ep, events, 4, 0);
        _exit(count == 1 && events[0].data.u64 == 12 ? 0 : 1);
    }
    int status;
    waitpid(child, &status, 0);
    printf("a child sees the parent's interests: %s\n", WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "yes" : "no");
    show_wait("the parent too", ep, 4, 0, 0);
    return 0;
}
