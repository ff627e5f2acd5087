/* The clocks as libc reads them (through the vDSO where the kernel offers one): a vDSO is
 * announced, the clocks agree with each other and never go backwards, and a million reads
 * take well under a second (a system call per read would take tens of seconds on PVM). */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/time.h>
#include <time.h>

#define READS 1000000

static long long nanoseconds(const struct timespec *time) {
    return time->tv_sec * 1000000000LL + time->tv_nsec;
}

int main(void) {
    const unsigned char *vdso = (const unsigned char *)getauxval(AT_SYSINFO_EHDR);
    printf("vDSO announced, an ELF image: %d\n", vdso != NULL && memcmp(vdso, "\177ELF", 4) == 0);

    struct timespec start, previous, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    previous = start;
    long backwards = 0;
    for (int i = 0; i < READS; i++) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (nanoseconds(&now) < nanoseconds(&previous))
            backwards++;
        previous = now;
    }
    long long elapsed = nanoseconds(&previous) - nanoseconds(&start);
    printf("%d monotonic reads, backwards steps: %ld\n", READS, backwards);
    printf("%d reads in under 0.5 s: %d\n", READS, elapsed < 500000000LL);
    if (elapsed >= 500000000LL)
        fprintf(stderr, "%d reads took %lld ms\n", READS, elapsed / 1000000);

    /* time() and gettimeofday() bracket clock_gettime(CLOCK_REALTIME). Linux's time() reads
     * the coarse clock, updated on timer ticks, which can still show the previous second just
     * after CLOCK_REALTIME crossed into the next: allow it that one second. */
    struct timespec realtime;
    struct timeval wall;
    time_t before = time(NULL);
    clock_gettime(CLOCK_REALTIME, &realtime);
    gettimeofday(&wall, NULL);
    time_t after = time(NULL);
    printf("time() <= CLOCK_REALTIME <= time(): %d\n", before <= realtime.tv_sec && realtime.tv_sec <= after + 1);
    long long realtime_us = realtime.tv_sec * 1000000LL + realtime.tv_nsec / 1000;
    long long wall_us = wall.tv_sec * 1000000LL + wall.tv_usec;
    printf("gettimeofday within 1 s after CLOCK_REALTIME: %d\n", wall_us >= realtime_us && wall_us - realtime_us < 1000000);
    printf("realtime after 2020: %d\n", realtime.tv_sec > 1577836800);

    /* The coarse and boot-time clocks, and the ones the vDSO leaves to the kernel. */
    struct timespec coarse, boot, cpu;
    clock_gettime(CLOCK_MONOTONIC, &now);
    int coarse_result = clock_gettime(CLOCK_MONOTONIC_COARSE, &coarse);
    int boot_result = clock_gettime(CLOCK_BOOTTIME, &boot);
    printf("MONOTONIC_COARSE %d, not before MONOTONIC - 10 ms: %d\n", coarse_result, nanoseconds(&coarse) >= nanoseconds(&now) - 10000000);
    printf("BOOTTIME %d, not before MONOTONIC: %d\n", boot_result, nanoseconds(&boot) >= nanoseconds(&now));
    printf("PROCESS_CPUTIME_ID %d\n", clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu));
    printf("bad clock id fails: %d\n", clock_gettime(12345, &cpu) != 0);
    printf("sched_getcpu >= 0: %d\n", sched_getcpu() >= 0);
    return 0;
}
