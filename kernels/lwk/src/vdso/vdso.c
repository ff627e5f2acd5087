/*
 * The lightweight kernel's vDSO: clock reads in user mode.
 *
 * A system call costs tens of microseconds on a host that emulates guest kernel code
 * (shared/notes/pvm.md), while user code runs natively. So the clocks are computed here from
 * RDTSC and the page the kernel fills before the job starts (`clowder_vdso_data`, mapped
 * read-only one page below this image), with the same arithmetic as the kernel's `clock`
 * module, so that a time read here and one read through a system call agree.
 *
 * Built freestanding (no libc, no relocations): every reference is PC-relative.
 */

#include <stdint.h>

/* Must match `VdsoData` in mod.rs. */
struct clowder_vdso_data {
    /* Odd while the kernel rewrites the page; readers retry. */
    uint32_t sequence;
    /* nanoseconds = ((tsc - boot_tsc) * tsc_multiplier) >> tsc_shift */
    uint32_t tsc_shift;
    uint64_t boot_tsc;
    uint64_t tsc_multiplier;
    uint64_t boot_realtime_ns;
};

extern const volatile struct clowder_vdso_data clowder_vdso_data __attribute__((visibility("hidden")));

struct clowder_timespec { int64_t tv_sec; int64_t tv_nsec; };
struct clowder_timeval { int64_t tv_sec; int64_t tv_usec; };

#define NANOS_PER_SECOND 1000000000ull

enum {
    CLOCK_REALTIME = 0,
    CLOCK_MONOTONIC = 1,
    CLOCK_MONOTONIC_RAW = 4,
    CLOCK_REALTIME_COARSE = 5,
    CLOCK_MONOTONIC_COARSE = 6,
    CLOCK_BOOTTIME = 7,
    CLOCK_TAI = 11,
};

enum { SYS_clock_gettime = 228, SYS_getcpu = 309 };

static long system_call3(long number, long first, long second, long third)
{
    long result;
    __asm__ volatile("syscall" : "=a"(result) : "a"(number), "D"(first), "S"(second), "d"(third) : "rcx", "r11", "memory");
    return result;
}

/* LFENCE keeps the TSC read from moving ahead of earlier loads, so two reads on different
 * CPUs ordered by memory are ordered in time too. */
static uint64_t read_tsc_ordered(void)
{
    uint32_t low, high;
    __asm__ volatile("lfence; rdtsc" : "=a"(low), "=d"(high) :: "memory");
    return (uint64_t)high << 32 | low;
}

struct clock_reading { uint64_t monotonic_ns; uint64_t realtime_base_ns; };

static struct clock_reading read_clock(void)
{
    const volatile struct clowder_vdso_data *data = &clowder_vdso_data;
    for (;;) {
        uint32_t sequence = data->sequence;
        __asm__ volatile("" ::: "memory");
        uint64_t boot_tsc = data->boot_tsc;
        uint64_t multiplier = data->tsc_multiplier;
        uint32_t shift = data->tsc_shift;
        uint64_t realtime_base = data->boot_realtime_ns;
        uint64_t ticks = read_tsc_ordered() - boot_tsc;
        __asm__ volatile("" ::: "memory");
        if ((sequence & 1) || sequence != data->sequence)
            continue;
        struct clock_reading reading = {
            (uint64_t)(((unsigned __int128)ticks * multiplier) >> shift),
            realtime_base,
        };
        return reading;
    }
}

static uint64_t realtime_ns(void)
{
    struct clock_reading reading = read_clock();
    return reading.realtime_base_ns + reading.monotonic_ns;
}

int __vdso_clock_gettime(int clock, struct clowder_timespec *time)
{
    uint64_t nanoseconds;
    switch (clock) {
    case CLOCK_REALTIME:
    case CLOCK_REALTIME_COARSE:
    case CLOCK_TAI:
        nanoseconds = realtime_ns();
        break;
    case CLOCK_MONOTONIC:
    case CLOCK_MONOTONIC_RAW:
    case CLOCK_MONOTONIC_COARSE:
    case CLOCK_BOOTTIME:
        nanoseconds = read_clock().monotonic_ns;
        break;
    default:
        /* CPU-time clocks, bad ids: the kernel decides, as on Linux. */
        return (int)system_call3(SYS_clock_gettime, clock, (long)time, 0);
    }
    time->tv_sec = (int64_t)(nanoseconds / NANOS_PER_SECOND);
    time->tv_nsec = (int64_t)(nanoseconds % NANOS_PER_SECOND);
    return 0;
}

int __vdso_gettimeofday(struct clowder_timeval *time, void *zone)
{
    uint64_t nanoseconds = realtime_ns();
    if (time) {
        time->tv_sec = (int64_t)(nanoseconds / NANOS_PER_SECOND);
        time->tv_usec = (int64_t)(nanoseconds % NANOS_PER_SECOND / 1000);
    }
    if (zone) {
        /* struct timezone: minutes west of UTC and DST type, both 0 (UTC). */
        ((int32_t *)zone)[0] = 0;
        ((int32_t *)zone)[1] = 0;
    }
    return 0;
}

int64_t __vdso_time(int64_t *seconds_out)
{
    int64_t seconds = (int64_t)(realtime_ns() / NANOS_PER_SECOND);
    if (seconds_out)
        *seconds_out = seconds;
    return seconds;
}

/* Which CPU a thread is on is only known to the kernel here: RDTSCP and RDPID are not offered
 * on every host this kernel runs on (PVM), and SGDT in user mode shows the host's table there. */
int __vdso_getcpu(unsigned *cpu, unsigned *node, void *cache)
{
    (void)cache;
    return (int)system_call3(SYS_getcpu, (long)cpu, (long)node, 0);
}

/* The unprefixed names Linux's vDSO also exports. */
int clock_gettime(int, struct clowder_timespec *) __attribute__((weak, alias("__vdso_clock_gettime")));
int gettimeofday(struct clowder_timeval *, void *) __attribute__((weak, alias("__vdso_gettimeofday")));
int64_t time(int64_t *) __attribute__((weak, alias("__vdso_time")));
int getcpu(unsigned *, unsigned *, void *) __attribute__((weak, alias("__vdso_getcpu")));
