/* A large anonymous region mapped, filled and unmapped again and again, as the in-situ
   simulation's recurring workflow does every interval: each new mapping reuses memory the
   last one dirtied, and must read as zero in every word; MADV_DONTNEED of part of it must too,
   and mremap that moves it must keep its bytes and give zeroed memory past them. In a
   persistent enclave the dirty memory is cleared by the host (node/cli-tests/tests/
   large_regions.rs runs this twice in one enclave, so a job also never sees the previous
   job's data); here, standalone, by the kernel.
   argv[1]: MiB per region (default 48, over half the 128 MiB machine's heap, so the second
   round cannot avoid the first one's memory; small, as clowder-vmm's kernel clears it in
   emulated code); argv[2]: rounds (default 3).
   lwk-test: mem=128M */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

/* Words of [words, words + count) that are not zero. */
static size_t nonzero_words(const uint64_t *words, size_t count) {
    size_t found = 0;
    for (size_t i = 0; i < count; i++)
        found += words[i] != 0;
    return found;
}

static void fill(uint64_t *words, size_t count, uint64_t seed) {
    for (size_t i = 0; i < count; i++)
        words[i] = seed ^ (i * 0x9e3779b97f4a7c15ULL) ^ 0xa5a5a5a5a5a5a5a5ULL;
}

/* argv[index] as a positive number, or `otherwise` (test.sh passes words). */
static size_t number(int argc, char **argv, int index, size_t otherwise) {
    char *end;
    size_t value = index < argc ? strtoul(argv[index], &end, 10) : 0;
    return value > 0 && *end == 0 ? value : otherwise;
}

int main(int argc, char **argv) {
    size_t mib = number(argc, argv, 1, 48), rounds = number(argc, argv, 2, 3);
    size_t bytes = mib << 20, words = bytes / 8;
    int failed = 0;
    for (size_t round = 0; round < rounds; round++) {
        uint64_t *region = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (region == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        size_t dirty = nonzero_words(region, words);
        printf("round %zu: %zu MiB mapped, %zu nonzero words\n", round, mib, dirty);
        failed |= dirty != 0;
        fill(region, words, round);
        /* The second quarter thrown away: it reads as zero, the rest keeps its data. */
        if (madvise((char *)region + bytes / 4, bytes / 4, MADV_DONTNEED) != 0) {
            perror("madvise");
            return 1;
        }
        size_t discarded = nonzero_words(region + words / 4, words / 4);
        int kept = region[0] == (round ^ 0xa5a5a5a5a5a5a5a5ULL) && nonzero_words(region + words / 2, words / 2) == words / 2;
        printf("round %zu: after MADV_DONTNEED of a quarter, %zu nonzero words there, the rest %s\n", round, discarded,
               kept ? "kept" : "LOST");
        failed |= discarded != 0 || !kept;
        if (munmap(region, bytes) != 0) {
            perror("munmap");
            return 1;
        }
    }
    /* A small mapping moved by growing: its bytes come along, what is past them is zero. */
    size_t small = 1 << 20;
    uint64_t *moving = mmap(NULL, small, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint64_t *blocker = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (moving == MAP_FAILED || blocker == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    fill(moving, small / 8, 7);
    uint64_t *moved = mremap(moving, small, 8 * small, MREMAP_MAYMOVE);
    if (moved == MAP_FAILED) {
        perror("mremap");
        return 1;
    }
    int same = moved[0] == (7 ^ 0xa5a5a5a5a5a5a5a5ULL) && nonzero_words(moved, small / 8) == small / 8;
    size_t beyond = nonzero_words(moved + small / 8, 7 * small / 8);
    printf("mremap: bytes %s, %zu nonzero words past them\n", same ? "kept" : "LOST", beyond);
    failed |= !same || beyond != 0;
    printf("%s\n", failed ? "FAILED" : "ok");
    return failed;
}
