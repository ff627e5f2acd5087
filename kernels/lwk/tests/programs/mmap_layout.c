/* The address-space layout a program may probe, as Linux's default (top-down) one: the break
 * right above the program, mappings top-down from below the stack (each new one below the
 * last), far above the break; MAP_FIXED and MAP_FIXED_NOREPLACE at an address of the mapping
 * area; a forked child sees its parent's mappings at their addresses. Only yes/no answers
 * are printed (the addresses themselves are randomised on the host). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures;

static void check(int ok, const char *what)
{
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    failures += !ok;
}

static char *anonymous(size_t len)
{
    return mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
}

int main(void)
{
    setvbuf(stdout, 0, _IOLBF, 0);
    int on_stack;
    uintptr_t stack = (uintptr_t)&on_stack, program = (uintptr_t)&main;
    char *brk_start = sbrk(0);
    char *first = anonymous(4096), *second = anonymous(4096), *large = anonymous(8 << 20);
    check(first != MAP_FAILED && second != MAP_FAILED && large != MAP_FAILED, "three anonymous mappings");
    check((uintptr_t)brk_start > program && (uintptr_t)brk_start - program < (1ul << 32), "the break starts right above the program");
    check(stack > (uintptr_t)first && stack - (uintptr_t)first < (1ul << 41), "mappings lie within 2 TiB below the stack");
    check((uintptr_t)first - (uintptr_t)brk_start > (1ul << 42), "far above the break");
    check(second < first && large < second, "each new mapping below the last (top-down)");
    memset(large, 7, 8 << 20);

    /* The break grows into the room above it, below every mapping. */
    uintptr_t old_break = (uintptr_t)syscall(SYS_brk, 0); /* (musl's sbrk only reads) */
    uintptr_t new_break = (uintptr_t)syscall(SYS_brk, old_break + (1 << 20));
    check(new_break == old_break + (1 << 20) && new_break < (uintptr_t)large, "the break grows by 1 MiB, below the mappings");

    /* MAP_FIXED over a mapping replaces it; MAP_FIXED_NOREPLACE over it is EEXIST, over a
       hole it maps there. */
    first[0] = 1;
    char *fixed = mmap(first, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    check(fixed == first && first[0] == 0, "MAP_FIXED over a mapping: there, zeroed");
    errno = 0;
    char *refused = mmap(second, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    check(refused == MAP_FAILED && errno == EEXIST, "MAP_FIXED_NOREPLACE over a mapping: EEXIST");
    munmap(second, 4096);
    char *placed = mmap(second, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    check(placed == second, "MAP_FIXED_NOREPLACE over a hole: there");
    /* A reservation with pieces placed in it, as a dynamic loader does. */
    char *reservation = mmap(0, 64 << 10, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *piece = mmap(reservation + (16 << 10), 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    check(reservation != MAP_FAILED && piece == reservation + (16 << 10), "MAP_FIXED inside a PROT_NONE reservation");
    piece[0] = 3;
    check(mprotect(piece, 8192, PROT_READ) == 0 && mremap(large, 8 << 20, 4 << 20, 0) == large, "mprotect and mremap of mappings");

    /* A child sees the same mappings at the same addresses, and its own go in the same area. */
    pid_t child = fork();
    if (child == 0) {
        char *own = anonymous(4096);
        int same = large[(4 << 20) - 1] == 7 && piece[0] == 3 && own != MAP_FAILED && stack - (uintptr_t)own < (1ul << 41);
        _exit(same ? 0 : 1);
    }
    int status;
    waitpid(child, &status, 0);
    check(WIFEXITED(status) && WEXITSTATUS(status) == 0, "a forked child sees its parent's mappings where they were");
    printf("%d failures\n", failures);
    return failures != 0;
}
