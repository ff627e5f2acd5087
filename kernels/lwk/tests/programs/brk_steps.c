/* The break moved as glibc's malloc moves it (about 132 KiB at a time) well past 2 MiB, grown
 * across a hole unmapped just above it, then shrunk into the middle of a 2 MiB block and grown
 * again: memory above the hole and memory the break takes again read as zero. */
#include <stdio.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define STEP 135168L

static char *set_break(char *address) { return (char *)syscall(SYS_brk, address); }

static char *page_up(char *address) { return (char *)(((unsigned long)address + 4095) & ~4095UL); }

/* Pages of [from, to) that do not read as zero; each is then written. */
static long nonzero_pages(char *from, char *to, char value) {
    long nonzero = 0;
    for (char *p = page_up(from); p < to; p += 4096) {
        nonzero += *p != 0;
        *p = value;
    }
    return nonzero;
}

int main(void) {
    char *start = set_break(0), *end = start;
    int grew = 1;
    for (int i = 0; i < 48; i++) { /* 6.2 MiB */
        char *next = set_break(end + STEP);
        grew &= next == end + STEP;
        nonzero_pages(end, next, 1);
        end = next;
    }
    char *hole = page_up(end + (1 << 20));
    int unmapped = munmap(hole, 65536) == 0;
    char *beyond = end + (3 << 20);
    int across = set_break(beyond) == beyond;
    long nonzero_across = across ? nonzero_pages(end, beyond, 2) : -1;
    char *middle = start + (3 << 20) + 100;
    int shrank = set_break(middle) == middle;
    int regrew = set_break(beyond) == beyond;
    long nonzero_regrown = regrew ? nonzero_pages(middle, beyond, 3) : -1;
    printf("grew %d unmapped %d grew across %d nonzero %ld shrank %d regrew %d nonzero %ld\n", grew, unmapped, across,
           nonzero_across, shrank, regrew, nonzero_regrown);
    return 0;
}
