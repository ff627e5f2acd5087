/* Per-thread CPU time: CLOCK_THREAD_CPUTIME_ID, getrusage(RUSAGE_THREAD) and the clocks of
 * pthread_getcpuclockid count each thread's own time on a CPU, not the wall clock's: a thread
 * that sleeps gains almost none, two threads spinning on one CPU each get about half. The
 * bounds are loose (the host run shares its CPU with whatever else runs, and in an enclave
 * the time a vCPU is descheduled counts as its running thread's); the output is the same
 * wherever they hold. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static int failures;

static void check(int ok, const char *what)
{
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    failures += !ok;
}

static int64_t ns_of(clockid_t clock)
{
    struct timespec time;
    if (clock_gettime(clock, &time) != 0)
        return -1;
    return (int64_t)time.tv_sec * 1000000000 + time.tv_nsec;
}

static int64_t thread_usage_ns(void)
{
    struct rusage usage;
    getrusage(RUSAGE_THREAD, &usage);
    return ((int64_t)usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1000000000
           + ((int64_t)usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1000;
}

/* Spins until this thread's own CPU time has grown by `ns`. */
static void spin_for(int64_t ns)
{
    int64_t start = ns_of(CLOCK_THREAD_CPUTIME_ID);
    while (ns_of(CLOCK_THREAD_CPUTIME_ID) - start < ns)
        ;
}

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static int stage;
static int64_t sleeper_own_ns, sleeper_usage_ns;

static void wait_for_stage(int wanted)
{
    pthread_mutex_lock(&lock);
    while (stage < wanted)
        pthread_cond_wait(&changed, &lock);
    pthread_mutex_unlock(&lock);
}

static void set_stage(int value)
{
    pthread_mutex_lock(&lock);
    stage = value;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
}

/* Waits (blocked) while the main thread spins, then reports its own time. */
static void *sleeper(void *unused)
{
    (void)unused;
    set_stage(1);
    wait_for_stage(2);
    sleeper_own_ns = ns_of(CLOCK_THREAD_CPUTIME_ID);
    sleeper_usage_ns = thread_usage_ns();
    return 0;
}

static cpu_set_t first_cpu;
static volatile int spinning = 1;
static int64_t spinner_ns;

static void *spinner(void *unused)
{
    (void)unused;
    sched_setaffinity(0, sizeof first_cpu, &first_cpu);
    int64_t start = ns_of(CLOCK_THREAD_CPUTIME_ID);
    while (spinning)
        ;
    spinner_ns = ns_of(CLOCK_THREAD_CPUTIME_ID) - start;
    return 0;
}

int main(void)
{
    setvbuf(stdout, 0, _IOLBF, 0);
    /* Sleeping costs no CPU time. */
    int64_t wall = ns_of(CLOCK_MONOTONIC), own = ns_of(CLOCK_THREAD_CPUTIME_ID), usage = thread_usage_ns();
    struct timespec nap = { 1, 0 };
    nanosleep(&nap, 0);
    check(ns_of(CLOCK_MONOTONIC) - wall >= 1000000000, "1 s slept by the clock");
    check(ns_of(CLOCK_THREAD_CPUTIME_ID) - own < 400000000, "the sleeping thread's clock gained less than 400 ms");
    check(thread_usage_ns() - usage < 400000000, "the sleeping thread's RUSAGE_THREAD gained less than 400 ms");

    /* Another thread's clock (pthread_getcpuclockid): it waits while this one spins 300 ms. */
    pthread_t thread;
    pthread_create(&thread, 0, sleeper, 0);
    wait_for_stage(1);
    clockid_t sleeper_clock, own_clock, process_clock;
    check(pthread_getcpuclockid(thread, &sleeper_clock) == 0 && pthread_getcpuclockid(pthread_self(), &own_clock) == 0,
          "pthread_getcpuclockid");
    check(clock_getcpuclockid(0, &process_clock) == 0, "clock_getcpuclockid");
    int64_t own_before = ns_of(own_clock), process_before = ns_of(process_clock);
    spin_for(300000000);
    int64_t sleeper_seen = ns_of(sleeper_clock), own_gained = ns_of(own_clock) - own_before;
    check(own_before >= 0 && own_gained >= 300000000, "this thread's clock by its id gained its 300 ms of spinning");
    check(ns_of(process_clock) - process_before >= 300000000, "the process's clock by its id gained at least as much");
    check(sleeper_seen >= 0 && sleeper_seen < 150000000, "the waiting thread's clock by its id: less than 150 ms");
    struct timespec resolution;
    check(clock_getres(sleeper_clock, &resolution) == 0, "clock_getres of a thread's clock");
    set_stage(2);
    pthread_join(thread, 0);
    check(sleeper_own_ns < 150000000 && sleeper_usage_ns < 150000000, "the waiting thread's own clock and RUSAGE_THREAD: less than 150 ms");

    /* Two threads spinning on one CPU share it: neither gets 85% of the wall time. */
    CPU_ZERO(&first_cpu);
    CPU_SET(0, &first_cpu);
    sched_setaffinity(0, sizeof first_cpu, &first_cpu);
    pthread_create(&thread, 0, spinner, 0);
    int64_t start = ns_of(CLOCK_THREAD_CPUTIME_ID);
    wall = ns_of(CLOCK_MONOTONIC);
    while (ns_of(CLOCK_MONOTONIC) - wall < 600000000)
        ;
    int64_t main_ns = ns_of(CLOCK_THREAD_CPUTIME_ID) - start;
    spinning = 0;
    pthread_join(thread, 0);
    check(main_ns > 0 && main_ns < 510000000 && spinner_ns > 0 && spinner_ns < 510000000,
          "two threads spinning on one CPU for 600 ms: each less than 510 ms");

    /* What Linux refuses: sleeping on a thread's CPU clock, a clock of the fourth kind. */
    check(clock_nanosleep(CLOCK_THREAD_CPUTIME_ID, 0, &nap, 0) == EINVAL, "clock_nanosleep on the thread's clock: EINVAL");
    check(ns_of((clockid_t)((~0u << 3) | 7)) == -1 && errno == EINVAL, "a CPU clock of kind 3: EINVAL");
    printf("%d failures\n", failures);
    return failures != 0;
}
