/* Touches N MiB of fresh anonymous memory, one write per 4 KiB page, and prints what a first
 * touch costs: `touch_pages MIB...` prints, per size, the time per page of the first pass
 * (a page fault each: the guest kernel's fault path and page clearing, emulated on PVM), of a
 * second pass over the same pages (no fault: user code, native), the process's system time,
 * and /proc/vmstat's fault and allocation counters where the kernel keeps them (the small guest
 * kernel does not: no CONFIG_VM_EVENT_COUNTERS).
 * Run as a job in a Linux enclave (docs/linux-guest.md, "Touching memory"), or as /init of a
 * bare initramfs, where it mounts /proc itself and reboots the VM at its end. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static double system_seconds(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_stime.tv_sec + u.ru_stime.tv_usec / 1e6;
}

/* The /proc/vmstat counters worth seeing around a first touch. */
static const char *const COUNTERS[] = {"pgfault", "pgalloc_normal", "pgalloc_dma32", "thp_fault_alloc", "compact_stall"};
#define NCOUNTERS (sizeof COUNTERS / sizeof *COUNTERS)

/* Reads the counters into values (-1: not kept); how many were found. */
static int vmstat(long long *values) {
    char name[64];
    long long value;
    int found = 0;
    for (size_t i = 0; i < NCOUNTERS; i++) values[i] = -1;
    FILE *f = fopen("/proc/vmstat", "r");
    if (!f) return 0;
    while (fscanf(f, "%63s %lld", name, &value) == 2)
        for (size_t i = 0; i < NCOUNTERS; i++)
            if (!strcmp(name, COUNTERS[i])) values[i] = value, found++;
    fclose(f);
    return found;
}

static int touch(long mib) {
    size_t bytes = (size_t)mib << 20, pages = bytes / 4096;
    volatile unsigned char *memory = mmap(0, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    long long before[NCOUNTERS], after[NCOUNTERS];
    int counted = vmstat(before);
    double system = system_seconds(), start = now();
    for (size_t i = 0; i < bytes; i += 4096) memory[i] = 1;
    double first = now() - start;
    system = system_seconds() - system;
    vmstat(after);
    start = now();
    for (size_t i = 0; i < bytes; i += 4096) memory[i] = 2;
    double second = now() - start;
    printf("touch_pages: %ld MiB, %zu pages: first touch %.1f us a page (%.2f s, system %.2f s), again %.3f us a page\n", mib,
           pages, first / pages * 1e6, first, system, second / pages * 1e6);
    if (counted) {
        printf("touch_pages: %ld MiB vmstat:", mib);
        for (size_t i = 0; i < NCOUNTERS; i++)
            if (before[i] >= 0) printf(" %s +%lld", COUNTERS[i], after[i] - before[i]);
        printf("\n");
    }
    fflush(stdout);
    munmap((void *)memory, bytes);
    return 0;
}

int main(int argc, char **argv) {
    int as_init = getpid() == 1;
    if (as_init) mount("proc", "/proc", "proc", 0, 0);
    if (argc < 2) {
        fprintf(stderr, "usage: touch_pages MIB...\n");
        return 2;
    }
    int failed = 0;
    for (int i = 1; i < argc; i++) {
        char *end;
        long mib = strtol(argv[i], &end, 10);
        if (*end || mib < 1 || mib > 65536) {
            fprintf(stderr, "touch_pages: %s: not a size in MiB (1 to 65536)\n", argv[i]);
            return 2;
        }
        failed |= touch(mib);
    }
    if (as_init) {
        printf("touch_pages: done\n");
        fflush(stdout);
        reboot(RB_AUTOBOOT);
    }
    return failed;
}
