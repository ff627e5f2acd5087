/*
 * insitu-analytics: the analytics half of the in-situ composition (see sim.c and insitu.h), a
 * host process or an LWK job. At every interval the simulation publishes, it copies the data
 * into private memory (STREAM's copy kernel, its source the simulation's memory), checks the
 * copy's checksum against the one the simulation published, answers "taken", runs STREAM's
 * scale, add and triad kernels ROUNDS times over private arrays, and answers "analysed".
 *
 *   insitu-analytics xemem once|recurring NAME LENGTH [ROUNDS]
 *   insitu-analytics files once|recurring DIR  LENGTH [ROUNDS]
 *
 * once: the named XEMEM segment (header + data), attached once; or DIR/insitu-vector.bin.
 * recurring: the named segment is the header page; each interval's region is got, attached,
 * read, detached and released (or DIR/insitu-data.K.bin opened, read and closed) before the
 * answer "taken", so the simulation can remove it.
 * LENGTH is the data's length in doubles, so the one attach can cover the whole segment; it
 * must match the header's. ROUNDS defaults to 5.
 * Prints a line per interval and the kernels' bandwidth (MB/s, 10^6 bytes, STREAM's counting);
 * exit 0 if every interval's checksum matched, 1 otherwise, 2 on bad input.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
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
    int use_files, recurring;
    const char *where;
    struct insitu_header *header; /* xemem: the attached header; files: a private copy */
    const double *vector;         /* xemem: the attached vector */
    int vector_file, answer_file;
};

/* The simulation's memory is gone under us (its enclave failed, or it removed the segment):
 * a read of the attachment faults. Say so instead of dying of SIGBUS. */
static void on_bus_error(int signal) {
    static const char message[] = "insitu-analytics: the simulation's memory went away (its enclave failed?)\n";
    (void)signal;
    if (write(STDERR_FILENO, message, sizeof message - 1) < 0) {
        /* nothing more to say */
    }
    _exit(1);
}

static int attach_segment(struct source *s, const char *name, uint64_t length) {
    uint64_t bytes = s->recurring ? INSITU_PAGE : insitu_bytes(length);
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
    void *memory = xpmem_attach(address, bytes, NULL);
    if (memory == (void *)-1) {
        fprintf(stderr, "insitu-analytics: xpmem_attach of %llu bytes: %s\n", (unsigned long long)bytes, strerror(errno));
        return -1;
    }
    s->header = memory;
    s->vector = s->recurring ? NULL : (const double *)((char *)memory + INSITU_PAGE);
    printf("insitu-analytics: attached \"%s\" (enclave %lld), %llu bytes, once%s\n", name, (long long)(segid >> 32),
           (unsigned long long)bytes, s->recurring ? "; a region of each interval's data every interval" : "");
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

static void copy_kernel(double *into, const double *from, uint64_t length) {
    for (uint64_t i = 0; i < length; i++) into[i] = from[i];
}

/* Recurring, xemem: interval's region, got, attached, copied, detached and released. */
static int copy_region(int64_t segid, double *into, uint64_t length) {
    xpmem_apid_t apid = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, NULL);
    if (apid <= 0) {
        fprintf(stderr, "insitu-analytics: xpmem_get of the interval's region %llx: %s\n", (unsigned long long)segid,
                strerror(errno));
        return -1;
    }
    struct xpmem_addr address = {.apid = apid, .offset = 0};
    const double *data = xpmem_attach(address, insitu_data_bytes(length), NULL);
    int status = 0;
    if (data == (void *)-1) {
        fprintf(stderr, "insitu-analytics: xpmem_attach of the interval's region: %s\n", strerror(errno));
        status = -1;
    } else {
        copy_kernel(into, data, length);
        if (xpmem_detach((void *)data)) {
            fprintf(stderr, "insitu-analytics: xpmem_detach: %s\n", strerror(errno));
            status = -1;
        }
    }
    if (xpmem_release(apid)) {
        fprintf(stderr, "insitu-analytics: xpmem_release: %s\n", strerror(errno));
        status = -1;
    }
    return status;
}

/* Reads LENGTH doubles at OFFSET of PATH into INTO. */
static int read_file(const char *path, double *into, uint64_t length, off_t offset, int fd) {
    size_t bytes = length * sizeof(double);
    int own = fd < 0;
    if (own && (fd = open(path, O_RDONLY)) < 0) {
        fprintf(stderr, "insitu-analytics: %s: %s\n", path, strerror(errno));
        return -1;
    }
    ssize_t got = pread(fd, into, bytes, offset);
    if (own)
        close(fd);
    if (got != (ssize_t)bytes) {
        fprintf(stderr, "insitu-analytics: %s: read %zd of %zu bytes\n", path, got, bytes);
        return -1;
    }
    return 0;
}

/* STREAM's copy kernel with interval K's data as its source: shared pages, or read(). */
static int copy_vector(struct source *s, uint64_t k, double *into, uint64_t length) {
    char path[4096];
    if (!s->use_files) {
        if (s->recurring)
            return copy_region(s->header->segid, into, length);
        copy_kernel(into, s->vector, length);
        return 0;
    }
    if (!s->recurring)
        return read_file("insitu-vector.bin", into, length, INSITU_PAGE, s->vector_file);
    insitu_data_path(path, sizeof path, s->where, k);
    return read_file(path, into, length, 0, -1);
}

int main(int argc, char **argv) {
    if (argc < 5 || argc > 6 || (strcmp(argv[1], "xemem") && strcmp(argv[1], "files")) ||
        (strcmp(argv[2], "once") && strcmp(argv[2], "recurring"))) {
        fprintf(stderr, "usage: insitu-analytics xemem|files once|recurring NAME|DIR LENGTH [ROUNDS]\n");
        return 2;
    }
    struct source source = {
        .use_files = !strcmp(argv[1], "files"), .recurring = !strcmp(argv[2], "recurring"), .where = argv[3]};
    uint64_t length = (uint64_t)arg_integer("insitu-analytics", "LENGTH", argv[4], 1, 1L << 31);
    int rounds = argc > 5 ? (int)arg_integer("insitu-analytics", "ROUNDS", argv[5], 1, 1000) : 5;
    signal(SIGBUS, on_bus_error);
    if (source.use_files ? open_files(&source, source.where) : attach_segment(&source, source.where, length))
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
    double deadline = insitu_now_seconds() + insitu_patience(length, START_WAIT_SECONDS);
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
            if (!(h->flags & INSITU_RECURRING) != !source.recurring) {
                fprintf(stderr, "insitu-analytics: the simulation publishes %s, not %s\n",
                        h->flags & INSITU_RECURRING ? "recurring" : "once", argv[2]);
                return 1;
            }
            uint64_t expected = h->checksum, iteration = h->iteration;
            double t = insitu_now_seconds();
            if (copy_vector(&source, published, a, length)) {
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
            deadline = insitu_now_seconds() + insitu_patience(length, WAIT_SECONDS);
            continue;
        }
        if (insitu_load(&h->finished) && published == seen) {
            if (!source.use_files) {
                insitu_store(&h->left, 1);
                xpmem_detach(h);
            }
            break;
        }
        if (insitu_now_seconds() > deadline) {
            fprintf(stderr, "insitu-analytics: nothing from the simulation for %.0f s\n", insitu_patience(length, WAIT_SECONDS));
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
