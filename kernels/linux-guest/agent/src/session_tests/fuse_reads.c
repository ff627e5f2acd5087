/* Host files read through a Linux enclave's FUSE mount (kernels/linux-guest/agent) must hold
 * exactly the host's bytes, both as each FUSE reply brings them and as the guest kernel keeps
 * them in its page cache afterwards.
 *
 *   fuse_reads write [SIZE...]  makes fuse-reads-SIZE in the working directory (run on the host)
 *   fuse_reads check [SIZE...]  reads each of them back four ways and checks every byte:
 *     1. read(2) from the start in pieces of awkward sizes (1 byte to past one FUSE reply);
 *     2. pread(2) at offsets on both sides of page, readahead and reply boundaries;
 *     3. through a shared mapping (page faults);
 *     4. read(2) again without dropping the cache: the bytes the guest kernel kept.
 *   Before 2 and 3 the file's cached pages are dropped (POSIX_FADV_DONTNEED), so those bytes
 *   come through FUSE replies again. Prints "fuse-reads-SIZE: SIZE bytes exact, fnv1a64 H"
 *   per file (H over the bytes of pass 1), or the first byte that differs, and exits 1.
 *
 * Without sizes, those of SIZES: on both sides of a page, of the readahead and of one reply, and
 * a file of many replies.
 *
 * Byte o of file SIZE is byte o % 8 (little-endian) of (o / 8 + 1) * 0x9E3779B97F4A7C15 ^ SIZE:
 * a byte from another offset or another file shows. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* One FUSE reply here is at most 256 KiB (the agent's file window), readahead 128 KiB. */
#define REPLY (256 << 10)
static const char *const SIZES[] = {"0", "1", "4095", "4096", "4097", "131073", "262143", "262144", "262145", "3158073"};

static unsigned char expected(unsigned long long size, unsigned long long o) {
    unsigned long long word = ((o / 8 + 1) * 0x9E3779B97F4A7C15ULL) ^ size;
    return (unsigned char)(word >> (o % 8 * 8));
}

static char name[64];

/* Whether buf holds the file's bytes [at, at + n); says where it does not. */
static int same(unsigned long long size, const char *how, const unsigned char *buf, unsigned long long at, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (buf[i] != expected(size, at + i)) {
            printf("%s: %s of %zu bytes at %llu: byte %llu is 0x%02x, the host's is 0x%02x\n", name, how, n, at, at + i, buf[i],
                   expected(size, at + i));
            return 0;
        }
    return 1;
}

/* pread until n bytes or the end; the count read, or -1. */
static long long pread_all(int fd, unsigned char *buf, size_t n, unsigned long long at) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, buf + got, n - got, (off_t)(at + got));
        if (r < 0) return -1;
        if (r == 0) break;
        got += (size_t)r;
    }
    return (long long)got;
}

static int write_file(unsigned long long size) {
    static unsigned char buf[1 << 16];
    int fd = open(name, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) { perror(name); return 1; }
    for (unsigned long long at = 0; at < size;) {
        size_t n = size - at < sizeof buf ? (size_t)(size - at) : sizeof buf;
        for (size_t i = 0; i < n; i++) buf[i] = expected(size, at + i);
        if (write(fd, buf, n) != (ssize_t)n) { perror(name); return 1; }
        at += n;
    }
    return close(fd) != 0;
}

static int check_file(unsigned long long size, unsigned char *buf) {
    static const size_t pieces[] = {4095, 1, 4097, REPLY + 1, 8192, (128 << 10) - 1, REPLY, 3, 65536};
    int fd = open(name, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) { perror(name); return 1; }
    if ((unsigned long long)st.st_size != size) { printf("%s: %lld bytes, the host's %llu\n", name, (long long)st.st_size, size); return 1; }

    unsigned long long at = 0, hash = 0xcbf29ce484222325ULL;
    for (unsigned k = 0;; k++) {
        size_t want = pieces[k % (sizeof pieces / sizeof *pieces)];
        ssize_t n = read(fd, buf, want);
        if (n < 0) { perror(name); return 1; }
        if (n == 0) break;
        if (!same(size, "read", buf, at, (size_t)n)) return 1;
        for (ssize_t i = 0; i < n; i++) hash = (hash ^ buf[i]) * 0x100000001b3ULL;
        at += (unsigned long long)n;
    }
    if (at != size) { printf("%s: read ended at %llu of %llu\n", name, at, size); return 1; }

    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    const unsigned long long offsets[] = {0, 1, 4095, 4096, 4097, (128 << 10) - 1, 128 << 10, (128 << 10) + 1, REPLY - 1, REPLY,
                                          REPLY + 1, size / 2 + 5, size > 4097 ? size - 4097 : 0, size ? size - 1 : 0, size, size + 4096};
    const size_t lengths[] = {1, 4096, REPLY + 3};
    for (unsigned i = 0; i < sizeof offsets / sizeof *offsets; i++)
        for (unsigned j = 0; j < sizeof lengths / sizeof *lengths; j++) {
            unsigned long long o = offsets[i], left = o < size ? size - o : 0;
            size_t want = lengths[j], should = left < want ? (size_t)left : want;
            long long n = pread_all(fd, buf, want, o);
            if (n < 0) { perror(name); return 1; }
            if ((size_t)n != should) { printf("%s: pread of %zu at %llu gave %lld bytes, not %zu\n", name, want, o, n, should); return 1; }
            if (!same(size, "pread", buf, o, should)) return 1;
        }

    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    if (size) {
        unsigned char *map = mmap(0, size, PROT_READ, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED) { perror(name); return 1; }
        int ok = same(size, "mapping", map, 0, size);
        munmap(map, size);
        if (!ok) return 1;
    }

    at = 0;
    for (ssize_t n; (n = pread(fd, buf, 1 << 20, (off_t)at)) > 0; at += (unsigned long long)n)
        if (!same(size, "cached read", buf, at, (size_t)n)) return 1;
    if (at != size) { printf("%s: the cached read ended at %llu of %llu\n", name, at, size); return 1; }
    close(fd);
    printf("%s: %llu bytes exact, fnv1a64 %016llx\n", name, size, hash);
    return 0;
}

int main(int argc, char **argv) {
    int writing = argc > 1 && strcmp(argv[1], "write") == 0;
    if (argc < 2 || (!writing && strcmp(argv[1], "check") != 0)) {
        fprintf(stderr, "usage: fuse_reads write|check [SIZE...]\n");
        return 2;
    }
    const char *const *sizes = argc > 2 ? (const char *const *)argv + 2 : SIZES;
    int count = argc > 2 ? argc - 2 : (int)(sizeof SIZES / sizeof *SIZES);
    unsigned char *buf = malloc(REPLY + 3 > 1 << 20 ? REPLY + 3 : 1 << 20);
    if (!buf) return 2;
    for (int i = 0; i < count; i++) {
        char *end;
        unsigned long long size = strtoull(sizes[i], &end, 10);
        if (*end || end == sizes[i]) { fprintf(stderr, "not a size: %s\n", sizes[i]); return 2; }
        snprintf(name, sizeof name, "fuse-reads-%llu", size);
        if (writing ? write_file(size) : check_file(size, buf)) return 1;
    }
    return 0;
}
