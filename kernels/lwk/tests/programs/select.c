/* select and pselect6 on pipes and the standard streams, as Linux answers: readiness by set,
   the counts and the sets written back, EBADF/EINVAL/EFAULT, nfds past FD_SETSIZE, timeouts
   (the time left written back by the raw select call), wakes by another process, a signal
   ending the wait (EINTR after a handler) and pselect6's mask. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/select.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "readiness.h"

/* Descriptor names for the output (the numbers may differ from run to run on the host). */
static const char *names[FD_SETSIZE];

/* The descriptors below `limit` in `set`, by name. */
static void print_set(const char *name, fd_set *set, int limit) {
    printf(" %s{", name);
    for (int fd = 0; fd < limit; fd++)
        if (FD_ISSET(fd, set))
            printf(" %s", names[fd] ? names[fd] : "?");
    printf(" }");
}

static void show(const char *what, int result, fd_set *r, fd_set *w, fd_set *e, int limit) {
    printf("%s: %d", what, result);
    if (result < 0)
        printf(" (%s)", strerror(errno));
    if (r) print_set("r", r, limit);
    if (w) print_set("w", w, limit);
    if (e) print_set("e", e, limit);
    printf("\n");
}

int main(void) {
    int p[2];
    if (pipe(p) < 0)
        return 1;
    int limit = p[1] + 1;
    int closed = dup(p[0]);
    close(closed);
    names[0] = "stdin"; names[1] = "stdout"; names[2] = "stderr";
    names[p[0]] = "p0"; names[p[1]] = "p1"; names[closed] = "closed";
    if (closed + 1 > limit)
        limit = closed + 1;
    fd_set r, w, e;
    struct timeval zero = { 0, 0 };

    FD_ZERO(&r); FD_ZERO(&w); FD_ZERO(&e);
    FD_SET(p[0], &r); FD_SET(p[1], &w); FD_SET(p[0], &e); FD_SET(p[1], &e);
    show("empty pipe", select(limit, &r, &w, &e, &zero), &r, &w, &e, limit);

    (void)!write(p[1], "ab", 2);
    FD_ZERO(&r); FD_ZERO(&w); FD_SET(p[0], &r); FD_SET(p[1], &w);
    show("two bytes in", select(limit, &r, &w, NULL, &zero), &r, &w, NULL, limit);
    /* The same descriptor in two sets counts twice. */
    FD_ZERO(&r); FD_ZERO(&w); FD_SET(p[0], &r); FD_SET(p[0], &w); FD_SET(p[1], &r); FD_SET(p[1], &w);
    show("both ends in both sets", select(limit, &r, &w, NULL, &zero), &r, &w, NULL, limit);
    char buffer[8];
    (void)!read(p[0], buffer, sizeof buffer);

    /* The standard streams: /dev/null and a file on the host, the console in the LWK. */
    FD_ZERO(&r); FD_ZERO(&w); FD_SET(0, &r); FD_SET(1, &w); FD_SET(2, &w);
    show("stdin readable, stdout and stderr writable", select(3, &r, &w, NULL, &zero), &r, &w, NULL, 3);

    /* Bits past nfds are not looked at, and come back clear. */
    FD_ZERO(&r); FD_SET(1, &r); FD_SET(p[0], &r);
    show("nfds 2 ignores p0", select(2, &r, NULL, NULL, &zero), &r, NULL, NULL, limit);

    /* Errors: a closed descriptor (the sets stay as they were), negative nfds, a bad set. */
    FD_ZERO(&r); FD_SET(p[0], &r); FD_SET(closed, &r);
    show("a closed fd", select(limit, &r, NULL, NULL, &zero), &r, NULL, NULL, limit);
    FD_ZERO(&r);
    show("nfds -1", select(-1, &r, NULL, NULL, &zero), NULL, NULL, NULL, 0);
    errno = 0;
    int result = syscall(SYS_select, limit, (fd_set *)8, NULL, NULL, &zero);
    printf("unreadable set: %d (%s)\n", result, strerror(errno));
    FD_ZERO(&r); FD_SET(1, &r);
    show("nfds past FD_SETSIZE", select(FD_SETSIZE + 1000, &r, NULL, NULL, &zero), &r, NULL, NULL, 3);

    /* Timeouts. */
    struct timeval bad = { 0, -1 };
    FD_ZERO(&r); FD_SET(p[0], &r);
    show("tv_usec -1", select(limit, &r, NULL, NULL, &bad), NULL, NULL, NULL, 0);
    struct timeval negative = { -1, 0 };
    show("tv_sec -1", select(limit, &r, NULL, NULL, &negative), NULL, NULL, NULL, 0);
    long long start = now_ms();
    struct timeval wait = { 0, 60 * 1000 };
    FD_ZERO(&r); FD_SET(p[0], &r);
    result = syscall(SYS_select, limit, &r, NULL, NULL, &wait);
    printf("timeout 60 ms: %d, waited at least 60 ms: %s, left %ld.%06ld, set cleared: %s\n", result,
           now_ms() - start >= 60 ? "yes" : "no", (long)wait.tv_sec, (long)wait.tv_usec, FD_ISSET(p[0], &r) ? "no" : "yes");
    /* Microseconds past a second carry over (no EINVAL); the time left comes back. */
    struct timeval carried = { 2, 1500000 };
    FD_ZERO(&w); FD_SET(p[1], &w);
    result = syscall(SYS_select, limit, NULL, &w, NULL, &carried);
    printf("tv_usec 1500000 with a ready fd: %d, left between 3 and 3.5 s: %s\n", result,
           carried.tv_sec == 3 && carried.tv_usec > 0 && carried.tv_usec < 500000 ? "yes" : "no");
    start = now_ms();
    result = select(0, NULL, NULL, NULL, &(struct timeval){ 0, 30 * 1000 });
    printf("no sets, 30 ms: %d, waited at least 30 ms: %s\n", result, now_ms() - start >= 30 ? "yes" : "no");

    /* Another process's write ends a wait without a timeout. */
    pid_t child = later(50, p[1]);
    FD_ZERO(&r); FD_SET(p[0], &r);
    show("another process writes", select(limit, &r, NULL, NULL, NULL), &r, NULL, NULL, limit);
    waitpid(child, NULL, 0);
    (void)!read(p[0], buffer, sizeof buffer);

    /* A signal with a handler ends the wait with EINTR, SA_RESTART or not. */
    count_sigusr1(SA_RESTART);
    child = later(50, -1);
    FD_ZERO(&r); FD_SET(p[0], &r);
    result = select(limit, &r, NULL, NULL, NULL);
    report_interrupted("select", result);
    waitpid(child, NULL, 0);

    /* pselect6: SIGUSR1 blocked, let through only while it waits. */
    sigset_t block, unblocked;
    child = usr1_during_masked_wait(&block, &unblocked);
    struct timespec long_wait = { 10, 0 };
    FD_ZERO(&r); FD_SET(p[0], &r);
    result = pselect(limit, &r, NULL, NULL, &long_wait, &unblocked);
    report_let_through("pselect", result);
    waitpid(child, NULL, 0);
    /* A blocked signal pending does not end it; a ready pipe with a let-through signal
       pending still wins. */
    kill(getpid(), SIGUSR1);
    start = now_ms();
    struct timespec short_wait = { 0, 30 * 1000000 };
    FD_ZERO(&r); FD_SET(p[0], &r);
    result = pselect(limit, &r, NULL, NULL, &short_wait, &block);
    printf("pselect, pending SIGUSR1 still blocked: %d, waited at least 30 ms: %s, handled %d\n", result,
           now_ms() - start >= 30 ? "yes" : "no", handled);
    (void)!write(p[1], "y", 1);
    FD_ZERO(&r); FD_SET(p[0], &r);
    result = pselect(limit, &r, NULL, NULL, &short_wait, &unblocked);
    printf("pselect, ready pipe and a pending signal let through: %d, handled %d\n", result, handled);
    (void)!read(p[0], buffer, sizeof buffer);
    sigprocmask(SIG_UNBLOCK, &block, NULL);
    printf("after unblocking: handled %d\n", handled);

    /* The raw pselect6: its sixth argument, the timespec's checks, the time written back. */
    struct { const sigset_t *mask; size_t size; } mask_argument = { &unblocked, 4 };
    struct timespec zero_ts = { 0, 0 };
    FD_ZERO(&r); FD_SET(p[0], &r);
    errno = 0;
    result = syscall(SYS_pselect6, limit, &r, NULL, NULL, &zero_ts, &mask_argument);
    printf("pselect6 with a 4-byte mask: %d (%s)\n", result, strerror(errno));
    mask_argument.mask = NULL;
    result = syscall(SYS_pselect6, limit, &r, NULL, NULL, &zero_ts, &mask_argument);
    printf("pselect6 with a NULL mask and size 4: %d\n", result);
    struct timespec bad_ts = { 0, 1000000000 };
    errno = 0;
    result = syscall(SYS_pselect6, limit, &r, NULL, NULL, &bad_ts, NULL);
    printf("pselect6 with tv_nsec 10^9: %d (%s)\n", result, strerror(errno));
    struct timespec left = { 0, 20 * 1000000 };
    FD_ZERO(&r); FD_SET(p[0], &r);
    result = syscall(SYS_pselect6, limit, &r, NULL, NULL, &left, NULL);
    printf("pselect6 timeout 20 ms: %d, left %ld.%09ld\n", result, (long)left.tv_sec, left.tv_nsec);

    /* Ends: the read end is readable once the write end closes (end of file), the write end
       readable and writable (in error) once the read end closes. */
    int q[2];
    if (pipe(q) < 0)
        return 1;
    names[q[0]] = "q0"; names[q[1]] = "q1";
    close(q[1]);
    FD_ZERO(&r); FD_SET(q[0], &r);
    show("read end, write end closed", select(q[0] + 1, &r, NULL, NULL, &zero), &r, NULL, NULL, q[0] + 1);
    close(p[0]);
    FD_ZERO(&r); FD_ZERO(&w); FD_SET(p[1], &r); FD_SET(p[1], &w);
    show("write end, read end closed", select(limit, &r, &w, NULL, &zero), &r, &w, NULL, limit);
    return 0;
}
