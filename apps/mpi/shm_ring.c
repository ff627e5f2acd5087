/*
 * shm_ring: Open MPI's shared-memory (vader) set-up and data path without MPI, for ranks in
 * different enclaves and on the host: one participant creates a /dev/shm file the way Open
 * MPI's shmem mmap component does (open O_CREAT, ftruncate to a size that is not whole pages,
 * mmap MAP_SHARED, a header with its pid), the others open and map it later, once it exists,
 * and all pass a counter round through it, polling memory only:
 *
 *   shm_ring ring FILE ME N ROUNDS   participant ME of N (0 creates FILE); prints its pid and
 *                                    the round trip, e.g. "ring 1 of 3: pid 7, 1000 rounds, 3.2 us a hop"
 *   shm_ring checks FILE             in one process: the file grown by ftruncate after a first
 *                                    mapping, the same file mapped twice, a mapping at an offset
 *
 * Each participant checks that no other has its pid: Open MPI takes a segment whose creator
 * has the caller's pid for the caller's own and maps nothing (opal/mca/shmem/mmap). Exits 0 when
 * all is seen as on Linux, 1 with one line saying what was not.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SIZE ((4 << 20) + 8) /* vader's segment and Open MPI's 8-byte header */
#define MAGIC 0x5641444552u  /* "VADER" */
#define MAX_PARTIES 8
#define GIVE_UP_NS (120ull * 1000000000) /* a hang is a failure, not a stuck test */

struct header {
    uint64_t magic;
    int32_t pids[MAX_PARTIES]; /* each participant's getpid() once attached */
    uint32_t attached;
    uint32_t counter;
    uint32_t failed; /* a participant gave up: the others stop waiting */
};

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void fail(const char *what) {
    printf("shm_ring: %s: %s\n", what, errno ? strerror(errno) : "no");
    exit(1);
}

static void *map(int fd, size_t len, off_t offset) {
    void *memory = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, offset);
    if (memory == MAP_FAILED) fail("mmap");
    return memory;
}

/* The creator's order: create, size, map, then fill the header. */
static struct header *create(const char *file) {
    unlink(file);
    int fd = open(file, O_CREAT | O_RDWR, 0600);
    if (fd < 0) fail("open O_CREAT");
    if (ftruncate(fd, SIZE) != 0) fail("ftruncate");
    struct header *shared = map(fd, SIZE, 0);
    close(fd);
    return shared;
}

/* A peer's: open once the file exists at its full size, map it. */
static struct header *attach(const char *file, uint64_t deadline) {
    for (;;) {
        struct stat st;
        int fd = open(file, O_RDWR);
        if (fd >= 0 && fstat(fd, &st) == 0 && st.st_size == SIZE) {
            struct header *shared = map(fd, SIZE, 0);
            close(fd);
            return shared;
        }
        if (fd >= 0) close(fd);
        if (now_ns() > deadline) fail("the creator's file never appeared");
        usleep(1000);
    }
}

static void give_up(struct header *shared) {
    __atomic_store_n(&shared->failed, 1, __ATOMIC_RELEASE);
    exit(1);
}

static void wait_until(struct header *shared, uint32_t *word, uint32_t value, uint64_t deadline, const char *what) {
    while (__atomic_load_n(word, __ATOMIC_ACQUIRE) < value) {
        if (__atomic_load_n(&shared->failed, __ATOMIC_ACQUIRE)) {
            printf("shm_ring: another participant failed while this one waited for %s\n", what);
            exit(1);
        }
        if (now_ns() > deadline) {
            printf("shm_ring: gave up waiting for %s (%u of %u)\n", what, *word, value);
            give_up(shared);
        }
    }
}

static int ring(const char *file, int me, int parties, uint32_t rounds) {
    uint64_t deadline = now_ns() + GIVE_UP_NS;
    if (parties < 2 || parties > MAX_PARTIES || me < 0 || me >= parties) return 2;
    struct header *shared = me == 0 ? create(file) : attach(file, deadline);
    if (me == 0) {
        shared->magic = MAGIC;
        __atomic_store_n(&shared->attached, 1, __ATOMIC_RELEASE);
    } else {
        wait_until(shared, &shared->attached, 1, deadline, "the creator's header");
        if (shared->magic != MAGIC) {
            printf("shm_ring: the creator's header is not in this mapping\n");
            give_up(shared);
        }
    }
    shared->pids[me] = getpid();
    /* Participants attach in turn, so that each sees the pids before it. */
    wait_until(shared, &shared->attached, me + 1, deadline, "the earlier participants");
    for (int other = 0; other < me; other++)
        if (shared->pids[other] == shared->pids[me]) {
            printf("shm_ring: participants %d and %d both have pid %d\n", other, me, (int)shared->pids[me]);
            give_up(shared);
        }
    __atomic_store_n(&shared->attached, me + 2, __ATOMIC_RELEASE);
    wait_until(shared, &shared->attached, parties + 1, deadline, "every participant to attach");
    /* The counter goes round: participant i moves it from k*N+i to k*N+i+1. */
    uint64_t start = now_ns();
    uint32_t last = rounds * parties;
    for (uint32_t turn = me; turn < last; turn += parties) {
        wait_until(shared, &shared->counter, turn, deadline, "the counter");
        if (__atomic_load_n(&shared->counter, __ATOMIC_ACQUIRE) != turn) {
            printf("shm_ring: the counter skipped turn %u\n", turn);
            give_up(shared);
        }
        __atomic_store_n(&shared->counter, turn + 1, __ATOMIC_RELEASE);
    }
    wait_until(shared, &shared->counter, last, deadline, "the last turn");
    double hop_us = (now_ns() - start) / 1e3 / last;
    printf("ring %d of %d: pid %d, %u rounds, %.2f us a hop\n", me, parties, (int)getpid(), rounds, hop_us);
    if (me == 0) unlink(file);
    return munmap(shared, SIZE) == 0 ? 0 : 1;
}

static int checks(const char *file) {
    long page = sysconf(_SC_PAGESIZE);
    unlink(file);
    int fd = open(file, O_CREAT | O_RDWR, 0600);
    if (fd < 0 || ftruncate(fd, page) != 0) fail("open/ftruncate");
    volatile uint32_t *first = map(fd, page, 0);
    first[0] = 11;
    /* Grown after the first mapping, as a segment that is resized. */
    if (ftruncate(fd, 4 * page) != 0) fail("ftruncate to grow");
    volatile uint32_t *whole = map(fd, 4 * page, 0);
    if (whole[0] != 11) fail("the grown file's mapping does not see the first one's store");
    whole[0] = 12;
    if (first[0] != 12) fail("the first mapping does not see the grown one's store");
    /* The same range mapped twice, and a mapping at an offset. */
    volatile uint32_t *again = map(fd, 4 * page, 0);
    volatile uint32_t *third_page = map(fd, page, 2 * page);
    whole[2 * page / 4 + 5] = 13;
    if (again[2 * page / 4 + 5] != 13 || third_page[5] != 13) fail("a second mapping, or one at an offset, does not see a store");
    third_page[6] = 14;
    if (whole[2 * page / 4 + 6] != 14 || again[2 * page / 4 + 6] != 14) fail("a store through the offset mapping is not seen");
    /* And through the file itself. */
    uint32_t read_back = 0;
    if (pread(fd, &read_back, 4, 2 * page + 24) != 4 || read_back != 14) fail("pread does not see a store through a mapping");
    close(fd);
    unlink(file);
    printf("checks: grown file, two mappings, offset mapping, pread: all see each other's stores\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 6 && strcmp(argv[1], "ring") == 0) return ring(argv[2], atoi(argv[3]), atoi(argv[4]), (uint32_t)atoi(argv[5]));
    if (argc == 3 && strcmp(argv[1], "checks") == 0) return checks(argv[2]);
    fprintf(stderr, "usage: shm_ring ring FILE ME N ROUNDS | shm_ring checks FILE\n");
    return 2;
}
