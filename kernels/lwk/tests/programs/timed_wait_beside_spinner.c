/* A thread in a timed wait (poll, epoll_wait, futex, nanosleep: 50 ms each) beside a thread
   that spins in user mode on the same CPU: each wait must end by its timeout and the waiter get
   the CPU back within a time slice, though the CPU never idles (MPI_Finalize's case: UCX's
   fence spins while PMIx's progress thread waits in epoll_wait). The spinner gives up after
   10 s so that a kernel that never ends the waits fails the test instead of hanging it. */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define FUTEX_WAIT_PRIVATE 128 /* musl has no <linux/futex.h> */

static atomic_int waiter_done;

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void report(const char *what, int result, double started) {
    double took = now_seconds() - started;
    if (took >= 0.045 && took < 0.5)
        printf("%s: %d, returned by its 50 ms timeout within 0.5 s\n", what, result);
    else
        printf("%s: %d, returned after %.3f s\n", what, result, took);
}

static void pin_to_cpu0(void) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(0, &one);
    sched_setaffinity(0, sizeof one, &one);
}

static void *waiter(void *unused) {
    (void)unused;
    pin_to_cpu0();
    double started = now_seconds();
    report("poll", poll(NULL, 0, 50), started);

    int epoll = epoll_create1(0);
    struct epoll_event event;
    started = now_seconds();
    report("epoll_wait", epoll_wait(epoll, &event, 1, 50), started);
    close(epoll);

    int word = 0;
    struct timespec timeout = { 0, 50 * 1000 * 1000 };
    started = now_seconds();
    report("futex wait", (int)syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, 0, &timeout, NULL, 0), started);

    started = now_seconds();
    report("nanosleep", nanosleep(&timeout, NULL), started);
    atomic_store(&waiter_done, 1);
    return NULL;
}

int main(void) {
    /* Both threads on one CPU, whatever the machine has. */
    pin_to_cpu0();
    pthread_t thread;
    pthread_create(&thread, NULL, waiter, NULL);
    double give_up = now_seconds() + 10;
    for (unsigned long spins = 0; !atomic_load(&waiter_done); spins++)
        if (spins % (1 << 20) == 0 && now_seconds() > give_up) {
            printf("the waiter did not finish in 10 s beside the spinning thread\n");
            return 1;
        }
    pthread_join(thread, NULL);
    printf("done\n");
    return 0;
}
