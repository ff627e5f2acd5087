/*
 * insitu-analytics: the analytics half of the in-situ composition (see sim.c and insitu.h), a
 * host process. At every interval the simulation publishes, it copies the solution vector into
 * private memory (STREAM's copy kernel, its source the simulation's memory), checks the copy's
 * checksum against the one the simulation published, answers "taken", runs STREAM's scale, add
 * and triad kernels ROUNDS times over private arrays, and answers "analysed".
 *
 *   insitu-analytics xemem NAME LENGTH [ROUNDS]   the named XEMEM segment, attached once
 *   insitu-analytics files DIR  LENGTH [ROUNDS]   DIR/insitu-vector.bin and DIR/insitu-answer.bin
 *
 * LENGTH is the vector's length in doubles (NX*NY*NZ of the simulation), so the one attach can
 * cover the whole segment; it must match the header's. ROUNDS defaults to 5.
 * Prints a line per interval and the kernels' bandwidth (MB/s, 10^6 bytes, STREAM's counting);
 * exit 0 if every interval's checksum matched, 1 otherwise, 2 on bad input.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xpmem.h>

#include "../args.h"
#include "insitu.h"

#define START_WAIT_SECONDS 30.0 /* the simulation's enclave job may still be starting */
#define WAIT_SECONDS 15.0

/* Where the header and vector are read from. */
struct source {
    int use_files;
    struct insitu_header *header; /* xemem: the attached header; files: a private copy */
    const double *vector;         /* xemem: the attached vector */
    int vector_file, answer_file;
};

static int attach_segment(struct source *s, const char *name, uint64_t length) {
    double deadline = insitu_now_seconds() + START_WAIT_SECONDS;
    xpmem_segid_t segid;
    while ((segid = xemem_lookup_segid(name)) <= 0) {
        if (insitu_now_seconds() > deadline) {
            fprintf(stderr, "insitu-analytics: no XEMEM segment named \"%s\": %s\n", name, strerror(errno));
            return -1;
        }
        usleep(10000);
    }
    xpmem_apid_t apid = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
    if (apid <= 0) {
        fprintf(stderr, "insitu-analytics: xpmem_get: %s\n", strerror(errno));
        return -1;
    }
    struct xpmem_addr address = {.apid = apid, .offset = 0};
    void *memory = xpmem_attach(address, insitu_bytes(length), NULL);
    if (memory == (void *)-1) {
        fprintf(stderr, "insitu-analytics: xpmem_attach of %llu bytes: %s\n", (unsigned long long)insitu_bytes(length),
                strerror(errno));
        return -1;
    }
    s->header = memory;
    s->vector = (const double *)((char *)memory + INSITU_PAGE);
    printf("insitu-analytics: attached \"%s\" (enclave %lld), %llu bytes, once\n", name, (long long)(segid >> 32),
           (unsigned long long)insitu_bytes(length));
    return 0;
}

static int read_header_file(struct source *s) {
    return pread(s->vector_file, s->header, sizeof *s->header, 0) == sizeof *s->header ? 0 : -1;
}

static int open_files(struct source *s, const char *dir) {
    char vector_path[4096], answer_path[4096];
    snprintf(vector_path, sizeof vector_path, "%s/insitu-vector.bin", dir);
    snprintf(answer_path, sizeof answer_path, "%s/insitu-answer.bin", dir);
    s->header = calloc(1, sizeof *s->header);
    double deadline = insitu_now_seconds() + START_WAIT_SECONDS;
    /* The simulation creates the answer file, then the vector file with a whole header. */
    while ((s->vector_file = open(vector_path, O_RDONLY)) < 0 || read_header_file(s) ||
           s->header->magic != INSITU_MAGIC) {
        if (s->vector_file >= 0)
            close(s->vector_file);
        if (insitu_now_seconds() > deadline) {
            fprintf(stderr, "insitu-analytics: %s never appeared\n", vector_path);
            return -1;
        }
        usleep(10000);
    }
    s->answer_file = open(answer_path, O_WRONLY);
    if (s->answer_file < 0) {
        fprintf(stderr, "insitu-analytics: %s: %s\n", answer_path, strerror(errno));
        return -1;
    }
    printf("insitu-analytics: reading %s\n", vector_path);
    return 0;
}

/* Fetches the header's words the simulation changes (from the file, for files). */
static void refresh(struct source *s) {
    if (s->use_files)
        read_header_file(s);
}

static void answer(struct source *s, uint64_t taken, uint64_t analysed) {
    if (!s->use_files) {
        insitu_store(&s->header->taken, taken);
        insitu_store(&s->header->analysed, analysed);
        return;
    }
    uint64_t words[2] = {taken, analysed};
    if (pwrite(s->answer_file, words, sizeof words, 0) != sizeof words)
        fprintf(stderr, "insitu-analytics: writing the answer: %s\n", strerror(errno));
}

/* STREAM's copy kernel with the simulation's vector as its source: shared pages, or read(). */
static int copy_vector(struct source *s, double *into, uint64_t length) {
    if (!s->use_files) {
        for (uint64_t i = 0; i < length; i++) into[i] = s->vector[i];
        return 0;
    }
    size_t bytes = length * sizeof(double);
    return pread(s->vector_file, into, bytes, INSITU_PAGE) == (ssize_t)bytes ? 0 : -1;
}

int main(int argc, char **argv) {
    if (argc < 4 || argc > 5 || (strcmp(argv[1], "xemem") && strcmp(argv[1], "files"))) {
        fprintf(stderr, "usage: insitu-analytics xemem|files NAME|DIR LENGTH [ROUNDS]\n");
        return 2;
    }
    struct source source = {.use_files = !strcmp(argv[1], "files")};
    uint64_t length = (uint64_t)arg_integer("insitu-analytics", "LENGTH", argv[3], 1, 1L << 31);
    int rounds = argc > 4 ? (int)arg_integer("insitu-analytics", "ROUNDS", argv[4], 1, 1000) : 5;
    if (source.use_files ? open_files(&source, argv[2]) : attach_segment(&source, argv[2], length))
        return 1;
    double *a = malloc(length * sizeof *a), *b = malloc(length * sizeof *b), *c = malloc(length * sizeof *c);
    if (!a || !b || !c) {
        fprintf(stderr, "insitu-analytics: cannot allocate 3 x %llu doubles\n", (unsigned long long)length);
        return 2;
    }
    /* Touch the private arrays once, so no interval pays their first faults. */
    memset(a, 0, length * sizeof *a);
    memset(b, 0, length * sizeof *b);
    memset(c, 0, length * sizeof *c);

    const double scalar = 3.0;
    double seconds[4] = {0, 0, 0, 0}; /* copy, scale, add, triad: summed over intervals */
    long kernel_runs[4] = {0, 0, 0, 0};
    long intervals = 0, matching = 0;
    uint64_t seen = 0;
    double deadline = insitu_now_seconds() + START_WAIT_SECONDS;
    for (;;) {
        refresh(&source);
        struct insitu_header *h = source.header;
        uint64_t published = insitu_load(&h->published);
        if (published > seen) {
            if (h->magic != INSITU_MAGIC || h->vector_length != length) {
                fprintf(stderr, "insitu-analytics: the header says %llu doubles, not %llu\n",
                        (unsigned long long)h->vector_length, (unsigned long long)length);
                return 1;
            }
            uint64_t expected = h->checksum, iteration = h->iteration;
            double t = insitu_now_seconds();
            if (copy_vector(&source, a, length)) {
                fprintf(stderr, "insitu-analytics: reading the vector failed\n");
                return 1;
            }
            seconds[0] += insitu_now_seconds() - t;
            kernel_runs[0]++;
            uint64_t checksum = insitu_checksum(a, length);
            answer(&source, published, seen);
            for (int r = 0; r < rounds; r++) {
                t = insitu_now_seconds();
                for (uint64_t i = 0; i < length; i++) b[i] = scalar * a[i];
                seconds[1] += insitu_now_seconds() - t;
                t = insitu_now_seconds();
                for (uint64_t i = 0; i < length; i++) c[i] = a[i] + b[i];
                seconds[2] += insitu_now_seconds() - t;
                t = insitu_now_seconds();
                for (uint64_t i = 0; i < length; i++) a[i] = b[i] + scalar * c[i];
                seconds[3] += insitu_now_seconds() - t;
            }
            kernel_runs[1] += rounds, kernel_runs[2] += rounds, kernel_runs[3] += rounds;
            answer(&source, published, published);
            intervals++;
            matching += checksum == expected;
            printf("insitu-analytics: interval %llu iteration %llu checksum %016llx %s\n", (unsigned long long)published,
                   (unsigned long long)iteration, (unsigned long long)checksum,
                   checksum == expected ? "(matches the published one)" : "(DIFFERS from the published one)");
            seen = published;
            deadline = insitu_now_seconds() + WAIT_SECONDS;
            continue;
        }
        if (insitu_load(&h->finished) && published == seen)
            break;
        if (insitu_now_seconds() > deadline) {
            fprintf(stderr, "insitu-analytics: nothing from the simulation for %.0f s\n", WAIT_SECONDS);
            break;
        }
        /* Files are polled gently; shared memory is spun on, as the paper's flags are. */
        if (source.use_files)
            usleep(50);
    }
    const char *names[4] = {"copy", "scale", "add", "triad"};
    const double arrays[4] = {2, 2, 3, 3};
    printf("insitu-analytics: %ld intervals, %ld checksums matched; kernels over %.1f MB:", intervals, matching,
           length * 8 / 1e6);
    for (int k = 0; k < 4; k++)
        printf(" %s %.0f MB/s%s", names[k],
               seconds[k] > 0 ? arrays[k] * 8.0 * length * kernel_runs[k] / seconds[k] / 1e6 : 0.0, k < 3 ? "," : "\n");
    int ok = intervals > 0 && matching == intervals;
    printf("insitu-analytics: %s\n", ok ? "every interval's data verified" : "FAILED");
    return ok ? 0 : 1;
}
