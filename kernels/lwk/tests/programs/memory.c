/* brk and mmap through malloc: small and large blocks, calloc zeroing, realloc growth. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(void) {
    unsigned long sum = 0;
    for (int round = 0; round < 3; round++) {
        char *small[64];
        for (int i = 0; i < 64; i++) {
            small[i] = malloc(24 + i * 40);
            memset(small[i], i, 24 + i * 40);
        }
        for (int i = 0; i < 64; i++) {
            sum += (unsigned char)small[i][i];
            free(small[i]);
        }
    }
    size_t big = 32u << 20;
    unsigned char *large = malloc(big);
    for (size_t i = 0; i < big; i += 4096)
        large[i] = (unsigned char)(i >> 12);
    for (size_t i = 0; i < big; i += 4096)
        sum += large[i];
    large = realloc(large, 2 * big);
    for (size_t i = 0; i < big; i += 4096)
        sum += large[i];
    free(large);

    unsigned long *zeroed = calloc(1 << 20, sizeof *zeroed);
    unsigned long nonzero = 0;
    for (size_t i = 0; i < 1 << 20; i++)
        nonzero += zeroed[i] != 0;
    free(zeroed);

    /* Memory given back and taken again must read as zero. */
    for (int round = 0; round < 4; round++) {
        unsigned char *mapped = mmap(NULL, 3 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (mapped == MAP_FAILED)
            return 1;
        for (size_t i = 0; i < (3 << 20); i += 512)
            nonzero += mapped[i] != 0;
        memset(mapped, 0xab, 3 << 20);
        munmap(mapped, 3 << 20);
    }

    /* The raw brk system call (musl's sbrk refuses to move the break). */
    char *before = (char *)syscall(SYS_brk, 0);
    char *grown = (char *)syscall(SYS_brk, before + (1 << 20));
    memset(before, 7, 1 << 20);
    char *shrunk = (char *)syscall(SYS_brk, before);
    char *regrown = (char *)syscall(SYS_brk, before + 4096);
    nonzero += before[0] != 0; /* a page given back and taken again is zero */
    printf("sum %lu nonzero %lu brk grew %d shrank %d regrew %d\n", sum, nonzero, grown == before + (1 << 20), shrunk == before, regrown == before + 4096);
    return 0;
}
