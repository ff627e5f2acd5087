/* Whole GiBs of a large anonymous mapping, which the LWK maps with one shared directory of
   2 MiB leaves each where the CPU has no 1 GiB pages (src/arch/paging.rs, SHARED_DIRECTORY):
   their contents and rights survive mprotect of a whole GiB and back, mprotect of one block
   and munmap of one page inside them (the GiB gets its own directory first). (Unmapping a
   whole GiB and mapping it again is left to the XEMEM tests: a job's memory given back is
   cleared before it is handed out again, emulated kernel work without a host to ask.)
   lwk-test: mem=3G */
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>

#define GIB (1UL << 30)
#define BLOCK (2UL << 20)
#define PAGE 4096UL

static sigjmp_buf recover;

static void on_segv(int sig) {
    (void)sig;
    siglongjmp(recover, 1);
}

/* Whether touching `at` (reading, or writing 1 there) faults. */
static int faults(volatile char *at, int write) {
    if (sigsetjmp(recover, 1) == 0) {
        if (write)
            *at = 1;
        else
            (void)*at;
        return 0;
    }
    return 1;
}

/* Each 2 MiB block of [start, start + len) begins with its offset from `base`. */
static void stamp(char *base, char *start, size_t len) {
    for (char *block = start; block < start + len; block += BLOCK)
        *(uint64_t *)block = block - base;
}

static size_t stamped(char *base, char *start, size_t len) {
    size_t count = 0;
    for (char *block = start; block < start + len; block += BLOCK)
        count += *(uint64_t *)block == (uint64_t)(block - base);
    return count;
}

int main(void) {
    struct sigaction action = {.sa_handler = on_segv};
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, NULL);

    size_t len = 2 * GIB;
    char *map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) {
        puts("mmap failed");
        return 1;
    }
    /* A whole GiB lies inside two, wherever the mapping starts. */
    char *whole = (char *)(((uintptr_t)map + GIB - 1) & ~(GIB - 1));
    stamp(map, map, len);
    printf("blocks stamped: %zu of %zu\n", stamped(map, map, len), len / BLOCK);

    printf("whole GiB read-only: %d\n", mprotect(whole, GIB, PROT_READ));
    printf("  write faults %d, read faults %d, below it writable %d\n", faults(whole + 7 * BLOCK + 64, 1),
           faults(whole + 7 * BLOCK + 64, 0), !faults(whole - BLOCK + 64, 1));
    printf("whole GiB writable again: %d\n", mprotect(whole, GIB, PROT_READ | PROT_WRITE));
    printf("  write faults %d\n", faults(whole + 7 * BLOCK + 64, 1));

    char *read_only = whole + 5 * BLOCK;
    printf("one block read-only: %d\n", mprotect(read_only, BLOCK, PROT_READ));
    printf("  write faults %d, read faults %d, next block writable %d, previous block writable %d\n",
           faults(read_only + 64, 1), faults(read_only + 64, 0), !faults(read_only + BLOCK + 64, 1),
           !faults(read_only - BLOCK + 64, 1));

    char *hole = whole + GIB / 2 + 3 * PAGE;
    printf("one page unmapped: %d\n", munmap(hole, PAGE));
    printf("  hole faults %d, page before %d, page after %d\n", faults(hole, 0), faults(hole - PAGE, 0),
           faults(hole + PAGE, 0));
    printf("blocks still stamped: %zu of %zu\n", stamped(map, map, len), len / BLOCK);

    return munmap(map, len);
}
