/*
 * insitu-sim: the simulation half of the in-situ composition of the XEMEM paper (section 6), in
 * small. It runs hpccg's conjugate-gradient solver (apps/hpccg/cg.c) over a sequence of time
 * steps and, every INTERVAL iterations, publishes its data to an analytics process:
 *
 *   insitu-sim xemem|files sync|async once|recurring NAME|DIR NX NY NZ [ITERATIONS [INTERVAL [DATA_MB]]]
 *
 * xemem: the data lives in memory exported as XEMEM segments (insitu.h): once, the solution
 *        vector itself is the named segment NAME, attached once, so a publish is a few stores;
 *        recurring, NAME is the header page and every interval's data is a new region
 *        (xpmem_make, removed once the analytics has released it). In an LWK enclave
 *        xemem_make goes through the LWK's /dev/xpmem; on the host, to clowderd's broker.
 * files: each publish writes the data and the header to DIR/insitu-vector.bin (recurring: the
 *        data to a new DIR/insitu-data.K.bin, removed once read) and polls DIR/insitu-answer.bin
 *        for the analytics' answer, as a POSIX-file transport would.
 * sync waits for the analytics to finish each interval; async only for its copy (insitu.h).
 * DATA_MB (MiB, default 0: the vector alone) is the analytics' data size: the vector repeated
 * to fill it, the paper's 512 MB at most.
 *
 * A time step solves A x = A u_s, u_s a smooth field that changes with the step, starting from
 * the previous step's x, until the residual falls by 1e-10; ITERATIONS counts CG iterations
 * over all steps (default 600, INTERVAL 40: the paper's 15 communication points).
 * Prints one line per interval (its checksum), then totals; exit 0 if every step's solution was
 * verified and every interval answered, 1 otherwise, 2 on bad input.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <xpmem.h>

#include "../args.h"
#include "cg.h"
#include "insitu.h"

#define FIRST_WAIT_SECONDS 30.0 /* the analytics may still be starting */
#define WAIT_SECONDS 10.0

/* How the data reaches the analytics: shared pages, or files. */
struct transport {
    int use_files, recurring;
    const char *where;            /* the segment's name, or the files' directory */
    struct insitu_header *header; /* xemem: the exported header; files: a private copy */
    double *data;                 /* once: the data (exported memory, for xemem); recurring: NULL */
    uint64_t length;              /* doubles of data */
    xpmem_segid_t segid;          /* the named segment */
    int vector_file, answer_file;
    /* recurring: the published interval's region (xemem) */
    void *region;
    xpmem_segid_t region_segid;
};

/* The field step s converges to: smooth in space, moving with s. */
static void exact_solution(long n, long step, double *u) {
    for (long i = 0; i < n; i++)
        u[i] = 1.0 + 0.5 * sin(0.3 * step + 0.001 * i);
}

/* DATA holds LENGTH doubles: the vector X of N, repeated (X may be DATA itself). */
static void fill_tiled(double *data, uint64_t length, const double *x, uint64_t n) {
    if (data != x)
        memcpy(data, x, (n < length ? n : length) * sizeof(double));
    for (uint64_t done = n; done < length; done *= 2)
        memcpy(data + done, data, (done < length - done ? done : length - done) * sizeof(double));
}

/* Page-aligned anonymous memory, as xemem_make wants; the LWK backs it with 2 MiB pages where
 * it can, so an export is a handful of frame runs. */
static void *map_pages(size_t bytes) {
    void *memory = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) {
        fprintf(stderr, "insitu-sim: mmap of %zu bytes: %s\n", bytes, strerror(errno));
        return NULL;
    }
    return memory;
}

static int open_transport(struct transport *t, long intervals, unsigned flags) {
    size_t bytes = t->recurring ? INSITU_PAGE : insitu_bytes(t->length);
    if (!t->use_files) {
        void *memory = map_pages(bytes);
        if (!memory)
            return -1;
        t->header = memory;
        t->data = t->recurring ? NULL : (double *)((char *)memory + INSITU_PAGE);
    } else {
        t->header = cg_checked_malloc(sizeof *t->header);
        t->data = t->recurring ? NULL : cg_checked_malloc(t->length * sizeof(double));
    }
    memset(t->header, 0, sizeof *t->header);
    t->header->magic = INSITU_MAGIC;
    t->header->vector_length = t->length;
    t->header->interval_count = intervals;
    t->header->flags = flags;
    if (t->data)
        memset(t->data, 0, t->length * sizeof(double));
    if (!t->use_files) {
        t->segid = xemem_make(t->header, bytes, t->where);
        if (t->segid <= 0) {
            fprintf(stderr, "insitu-sim: xemem_make(%s, %zu bytes) failed: %s\n", t->where, bytes, strerror(errno));
            return -1;
        }
        printf("insitu-sim: exported %zu bytes as the XEMEM segment \"%s\" of enclave %lld\n", bytes, t->where,
               (long long)(t->segid >> 32));
        return 0;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/insitu-answer.bin", t->where);
    t->answer_file = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    uint64_t no_answer[2] = {0, 0};
    if (t->answer_file < 0 || pwrite(t->answer_file, no_answer, sizeof no_answer, 0) != sizeof no_answer) {
        fprintf(stderr, "insitu-sim: %s: %s\n", path, strerror(errno));
        return -1;
    }
    /* The vector file appears last, complete with its header: the analytics waits for it. */
    snprintf(path, sizeof path, "%s/insitu-vector.bin", t->where);
    t->vector_file = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (t->vector_file < 0 || pwrite(t->vector_file, t->header, sizeof *t->header, 0) != sizeof *t->header) {
        fprintf(stderr, "insitu-sim: %s: %s\n", path, strerror(errno));
        return -1;
    }
    printf("insitu-sim: coupling through the files %s and insitu-answer.bin\n", path);
    return 0;
}

/* Recurring, xemem: a new region holding interval K's data, exported; its id goes in the
 * header. Returns the data's checksum through *checksum, or -1. */
static int make_region(struct transport *t, const double *x, uint64_t n, uint64_t *checksum) {
    size_t bytes = insitu_data_bytes(t->length);
    if (!(t->region = map_pages(bytes)))
        return -1;
    fill_tiled(t->region, t->length, x, n);
    *checksum = insitu_checksum(t->region, t->length);
    /* 0666, as xemem_make gives the named header segment: a job in another LWK enclave is
     * refused a 0600 segment (EACCES). */
    t->region_segid = xpmem_make(t->region, bytes, XPMEM_PERMIT_MODE, (void *)0666);
    if (t->region_segid <= 0) {
        fprintf(stderr, "insitu-sim: xpmem_make of %zu bytes: %s\n", bytes, strerror(errno));
        munmap(t->region, bytes);
        t->region = NULL;
        return -1;
    }
    t->header->segid = t->region_segid;
    return 0;
}

/* Recurring: the interval's region (file) is gone once the analytics has released it. */
static void remove_region(struct transport *t, uint64_t k) {
    if (t->use_files) {
        char path[4096];
        insitu_data_path(path, sizeof path, t->where, k);
        if (unlink(path))
            fprintf(stderr, "insitu-sim: removing %s: %s\n", path, strerror(errno));
        return;
    }
    if (!t->region)
        return;
    if (xpmem_remove(t->region_segid))
        fprintf(stderr, "insitu-sim: xpmem_remove of interval %llu's region: %s\n", (unsigned long long)k,
                strerror(errno));
    munmap(t->region, insitu_data_bytes(t->length));
    t->region = NULL;
}

/* Writes LENGTH doubles of DATA at OFFSET of FD. */
static int write_data(int fd, const double *data, uint64_t length, off_t offset) {
    size_t bytes = length * sizeof(double);
    if (pwrite(fd, data, bytes, offset) != (ssize_t)bytes) {
        fprintf(stderr, "insitu-sim: writing the data: %s\n", strerror(errno));
        return -1;
    }
    return 0;
}

/* Puts interval K's data where the analytics reads it (X, the solution vector of N doubles,
 * repeated); returns its checksum through *checksum, or -1. Once through XEMEM, X is the
 * exported data itself. */
static int stage_data(struct transport *t, uint64_t k, const double *x, uint64_t n, uint64_t *checksum) {
    if (!t->recurring) {
        fill_tiled(t->data, t->length, x, n);
        *checksum = insitu_checksum(t->data, t->length);
        return t->use_files ? write_data(t->vector_file, t->data, t->length, INSITU_PAGE) : 0;
    }
    if (!t->use_files)
        return make_region(t, x, n, checksum);
    double *data = cg_checked_malloc(t->length * sizeof(double));
    fill_tiled(data, t->length, x, n);
    *checksum = insitu_checksum(data, t->length);
    char path[4096];
    insitu_data_path(path, sizeof path, t->where, k);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644), status = -1;
    if (fd < 0)
        fprintf(stderr, "insitu-sim: %s: %s\n", path, strerror(errno));
    else
        status = write_data(fd, data, t->length, 0);
    if (fd >= 0)
        close(fd);
    free(data);
    return status;
}

/* The analytics' progress: shared words, or the answer file's two words. */
static void read_answer(struct transport *t, uint64_t *taken, uint64_t *analysed) {
    if (!t->use_files) {
        *taken = insitu_load(&t->header->taken);
        *analysed = insitu_load(&t->header->analysed);
        return;
    }
    uint64_t words[2] = {0, 0};
    if (pread(t->answer_file, words, sizeof words, 0) == sizeof words) {
        *taken = words[0];
        *analysed = words[1];
    }
}

/* Announces the staged interval: for files, the header is written after the data, so a header
 * announcing interval k always follows complete data. */
static void publish(struct transport *t, uint64_t interval, uint64_t iteration, uint64_t checksum, int finished) {
    struct insitu_header *h = t->header;
    h->iteration = iteration;
    h->checksum = checksum;
    insitu_store(&h->published, interval);
    insitu_store(&h->finished, finished);
    if (t->use_files && pwrite(t->vector_file, h, sizeof *h, 0) != sizeof *h)
        fprintf(stderr, "insitu-sim: writing the header: %s\n", strerror(errno));
}

/* Spins until the analytics has answered interval k (copied it, or analysed it when
 * synchronous); returns 0, or -1 after the timeout. */
static int wait_for_analytics(struct transport *t, uint64_t interval, int synchronous, double timeout) {
    double deadline = insitu_now_seconds() + timeout;
    for (unsigned long spins = 0;; spins++) {
        uint64_t taken = 0, analysed = 0;
        read_answer(t, &taken, &analysed);
        if ((synchronous ? analysed : taken) >= interval)
            return 0;
        /* Reading the clock costs more than a shared load: look at it now and then. */
        if ((t->use_files || spins % 1024 == 0) && insitu_now_seconds() > deadline)
            return -1;
    }
}

int main(int argc, char **argv) {
    if (argc < 8 || argc > 11 || (strcmp(argv[1], "xemem") && strcmp(argv[1], "files")) ||
        (strcmp(argv[2], "sync") && strcmp(argv[2], "async")) ||
        (strcmp(argv[3], "once") && strcmp(argv[3], "recurring"))) {
        fprintf(stderr, "usage: insitu-sim xemem|files sync|async once|recurring NAME|DIR NX NY NZ "
                        "[ITERATIONS [INTERVAL [DATA_MB]]]\n");
        return 2;
    }
    struct transport transport = {
        .use_files = !strcmp(argv[1], "files"), .recurring = !strcmp(argv[3], "recurring"), .where = argv[4]};
    int synchronous = !strcmp(argv[2], "sync");
    struct cg_problem p = {0};
    p.nx = arg_integer("insitu-sim", "NX", argv[5], 1, 1024);
    p.ny = arg_integer("insitu-sim", "NY", argv[6], 1, 1024);
    p.nz = arg_integer("insitu-sim", "NZ", argv[7], 1, 1024);
    long iterations = argc > 8 ? arg_integer("insitu-sim", "ITERATIONS", argv[8], 1, 1000000) : 600;
    long interval_length = argc > 9 ? arg_integer("insitu-sim", "INTERVAL", argv[9], 1, iterations) : 40;
    long data_mb = argc > 10 ? arg_integer("insitu-sim", "DATA_MB", argv[10], 0, 512) : 0;
    long intervals = iterations / interval_length;
    long n = p.nx * p.ny * p.nz;
    uint64_t data_length = (uint64_t)data_mb << 17; /* MiB in doubles */
    transport.length = data_length > (uint64_t)n ? data_length : (uint64_t)n;
    if (transport.use_files == 0 && strlen(transport.where) > XEMEM_NAME_MAX) {
        fprintf(stderr, "insitu-sim: a segment name has at most %d characters\n", XEMEM_NAME_MAX);
        return 2;
    }

    double *b = cg_checked_malloc(n * sizeof(double));
    double *exact = cg_checked_malloc(n * sizeof(double));
    double t_start = insitu_now_seconds();
    cg_build_problem(&p, b);
    unsigned flags = (synchronous ? INSITU_SYNCHRONOUS : 0) | (transport.recurring ? INSITU_RECURRING : 0);
    if (open_transport(&transport, intervals, flags))
        return 1;
    /* Once through XEMEM, the solution vector is the exported data's start: zero-copy. */
    int x_exported = !transport.use_files && !transport.recurring;
    struct cg_state cg = {
        .problem = &p,
        .b = b,
        .x = x_exported ? transport.data : cg_checked_malloc(n * sizeof(double)),
        .r = cg_checked_malloc(n * sizeof(double)),
        .dir = cg_checked_malloc(n * sizeof(double)),
        .ap = cg_checked_malloc(n * sizeof(double)),
    };
    if (!x_exported)
        memset(cg.x, 0, n * sizeof(double));
    printf("insitu-sim: %s, %s, %s; %ld x %ld x %ld grid, %ld rows, %llu doubles of data, %ld iterations, "
           "%ld intervals of %ld\n",
           argv[1], argv[2], argv[3], p.nx, p.ny, p.nz, n, (unsigned long long)transport.length, iterations, intervals,
           interval_length);
    fflush(stdout);

    long step = 0, steps_verified = 0, steps_done = 0, unanswered = 0, unstaged = 0;
    double step_start_norm = 0, compute = 0, publishing = 0, waiting = 0, worst_error = 0;
    double t_loop = insitu_now_seconds(), t_mark = t_loop;
    uint64_t checksum = 0;
    for (long iter = 1; iter <= iterations; iter++) {
        if (iter == 1 || cg.normr <= 1e-10 * step_start_norm) {
            if (iter > 1) {
                /* The step converged: check it against the field it should have found. */
                double error = 0;
                for (long i = 0; i < n; i++) error = fmax(error, fabs(cg.x[i] - exact[i]));
                worst_error = fmax(worst_error, error);
                steps_verified += error < 1e-6;
                steps_done++;
            }
            step++;
            exact_solution(n, step, exact);
            cg_sparse_multiply(&p, exact, b);
            cg_start(&cg);
            step_start_norm = cg.normr;
        }
        cg_iterate(&cg);
        if (iter % interval_length == 0) {
            long k = iter / interval_length;
            double t_publish = insitu_now_seconds();
            compute += t_publish - t_mark;
            if (stage_data(&transport, k, cg.x, n, &checksum)) {
                unstaged++;
                break;
            }
            publish(&transport, k, iter, checksum, 0);
            double t_published = insitu_now_seconds();
            publishing += t_published - t_publish;
            /* After one silence the analytics is likely gone: do not wait the full time again. */
            double timeout = unanswered ? 1.0 : insitu_patience(transport.length, k == 1 ? FIRST_WAIT_SECONDS : WAIT_SECONDS);
            int answered = wait_for_analytics(&transport, k, synchronous, timeout) == 0;
            unanswered += !answered;
            t_mark = insitu_now_seconds();
            waiting += t_mark - t_published;
            if (transport.recurring) {
                remove_region(&transport, k);
                double t_removed = insitu_now_seconds();
                publishing += t_removed - t_mark;
                t_mark = t_removed;
            }
            printf("insitu-sim: interval %ld iteration %ld checksum %016llx%s\n", k, iter,
                   (unsigned long long)checksum, answered ? "" : " (no answer from the analytics)");
        }
    }
    compute += insitu_now_seconds() - t_mark;
    publish(&transport, intervals, iterations, checksum, 1);
    double total = insitu_now_seconds() - t_start;
    if (!transport.use_files) {
        double deadline = insitu_now_seconds() + (unanswered ? 1.0 : insitu_patience(transport.length, WAIT_SECONDS));
        while (!insitu_load(&transport.header->left) && insitu_now_seconds() < deadline)
            usleep(100);
        if (xpmem_remove(transport.segid))
            fprintf(stderr, "insitu-sim: xpmem_remove: %s\n", strerror(errno));
    }
    printf("insitu-sim: %ld time steps converged, %ld verified (max error %.3e)\n", steps_done, steps_verified, worst_error);
    printf("insitu-sim: total %.3f s (setup and %ld iterations), compute %.3f s, publishing %.3f s, waiting for the analytics %.3f s\n",
           total, iterations, compute, publishing, waiting);
    printf("insitu-sim: per interval: compute %.2f ms, publish %.2f ms, wait %.2f ms; %.1f MFLOP/s\n", 1e3 * compute / intervals,
           1e3 * publishing / intervals, 1e3 * waiting / intervals, iterations * cg_flops_per_iteration(&p) / compute / 1e6);
    int ok = steps_done > 0 && steps_verified == steps_done && unanswered == 0 && unstaged == 0;
    printf("insitu-sim: %s\n", ok ? "done, every interval answered" : "FAILED");
    return ok ? 0 : 1;
}
