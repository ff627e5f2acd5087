/*
 * insitu-sim: the simulation half of the in-situ composition of the XEMEM paper (section 6), in
 * small. It runs hpccg's conjugate-gradient solver (apps/hpccg/cg.c) over a sequence of time
 * steps and, every INTERVAL iterations, publishes its solution vector to an analytics process:
 *
 *   insitu-sim xemem sync|async NAME NX NY NZ [ITERATIONS [INTERVAL]]
 *   insitu-sim files sync|async DIR  NX NY NZ [ITERATIONS [INTERVAL]]
 *
 * xemem: the solution vector itself lives in memory exported as the named XEMEM segment NAME
 *        (header page + vector, see insitu.h); the analytics maps the very same pages, so a
 *        publish is a few stores. In an LWK enclave xemem_make goes through the LWK's
 *        /dev/xpmem to clowderd's name server.
 * files: each publish writes the vector and the header to DIR/insitu-vector.bin and polls
 *        DIR/insitu-answer.bin for the analytics' answer (in an enclave, relative paths are the
 *        host's, through the LWK's forwarded file calls), as a POSIX-file transport would.
 * sync waits for the analytics to finish each interval; async only for its copy (insitu.h).
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

/* How the vector reaches the analytics: shared pages, or two files. */
struct transport {
    int use_files;
    struct insitu_header *header; /* xemem: the exported header; files: a private copy */
    double *vector;               /* the solution vector (exported memory, for xemem) */
    xpmem_segid_t segid;
    int vector_file, answer_file;
};

/* The field step s converges to: smooth in space, moving with s. */
static void exact_solution(long n, long step, double *u) {
    for (long i = 0; i < n; i++)
        u[i] = 1.0 + 0.5 * sin(0.3 * step + 0.001 * i);
}

static int open_transport(struct transport *t, const char *where, long n, long intervals, unsigned flags) {
    size_t bytes = insitu_bytes(n);
    if (!t->use_files) {
        /* One mapping, page aligned, as xemem_make wants; the LWK backs it with 2 MiB pages
         * where it can, so the export is a handful of frame runs. */
        void *memory = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (memory == MAP_FAILED) {
            perror("insitu-sim: mmap");
            return -1;
        }
        t->header = memory;
        t->vector = (double *)((char *)memory + INSITU_PAGE);
    } else {
        t->header = cg_checked_malloc(sizeof *t->header);
        t->vector = cg_checked_malloc(n * sizeof(double));
    }
    memset(t->header, 0, sizeof *t->header);
    t->header->magic = INSITU_MAGIC;
    t->header->vector_length = n;
    t->header->interval_count = intervals;
    t->header->flags = flags;
    for (long i = 0; i < n; i++) t->vector[i] = 0;
    if (!t->use_files) {
        t->segid = xemem_make(t->header, bytes, where);
        if (t->segid <= 0) {
            fprintf(stderr, "insitu-sim: xemem_make(%s, %zu bytes) failed: %s\n", where, bytes, strerror(errno));
            return -1;
        }
        printf("insitu-sim: exported %zu bytes as the XEMEM segment \"%s\" of enclave %lld\n", bytes, where,
               (long long)(t->segid >> 32));
        return 0;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/insitu-answer.bin", where);
    t->answer_file = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    uint64_t no_answer[2] = {0, 0};
    if (t->answer_file < 0 || pwrite(t->answer_file, no_answer, sizeof no_answer, 0) != sizeof no_answer) {
        fprintf(stderr, "insitu-sim: %s: %s\n", path, strerror(errno));
        return -1;
    }
    /* The vector file appears last, complete with its header: the analytics waits for it. */
    snprintf(path, sizeof path, "%s/insitu-vector.bin", where);
    t->vector_file = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (t->vector_file < 0 || pwrite(t->vector_file, t->header, sizeof *t->header, 0) != sizeof *t->header) {
        fprintf(stderr, "insitu-sim: %s: %s\n", path, strerror(errno));
        return -1;
    }
    printf("insitu-sim: coupling through the files %s and insitu-answer.bin\n", path);
    return 0;
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

/* Writes everything the analytics reads: for files, the vector first and the header last, so
 * a header announcing interval k always follows a complete vector. */
static void publish(struct transport *t, uint64_t interval, uint64_t iteration, uint64_t checksum, int finished) {
    struct insitu_header *h = t->header;
    h->iteration = iteration;
    h->checksum = checksum;
    insitu_store(&h->published, interval);
    insitu_store(&h->finished, finished);
    if (t->use_files) {
        size_t bytes = h->vector_length * sizeof(double);
        if (!finished && pwrite(t->vector_file, t->vector, bytes, INSITU_PAGE) != (ssize_t)bytes)
            fprintf(stderr, "insitu-sim: writing the vector: %s\n", strerror(errno));
        if (pwrite(t->vector_file, h, sizeof *h, 0) != sizeof *h)
            fprintf(stderr, "insitu-sim: writing the header: %s\n", strerror(errno));
    }
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
    if (argc < 7 || argc > 9 || (strcmp(argv[1], "xemem") && strcmp(argv[1], "files")) ||
        (strcmp(argv[2], "sync") && strcmp(argv[2], "async"))) {
        fprintf(stderr, "usage: insitu-sim xemem|files sync|async NAME|DIR NX NY NZ [ITERATIONS [INTERVAL]]\n");
        return 2;
    }
    struct transport transport = {.use_files = !strcmp(argv[1], "files")};
    int synchronous = !strcmp(argv[2], "sync");
    const char *where = argv[3];
    struct cg_problem p = {0};
    p.nx = arg_integer("insitu-sim", "NX", argv[4], 1, 1024);
    p.ny = arg_integer("insitu-sim", "NY", argv[5], 1, 1024);
    p.nz = arg_integer("insitu-sim", "NZ", argv[6], 1, 1024);
    long iterations = argc > 7 ? arg_integer("insitu-sim", "ITERATIONS", argv[7], 1, 1000000) : 600;
    long interval_length = argc > 8 ? arg_integer("insitu-sim", "INTERVAL", argv[8], 1, iterations) : 40;
    long intervals = iterations / interval_length;
    long n = p.nx * p.ny * p.nz;
    if (transport.use_files == 0 && strlen(where) > XEMEM_NAME_MAX) {
        fprintf(stderr, "insitu-sim: a segment name has at most %d characters\n", XEMEM_NAME_MAX);
        return 2;
    }

    double *b = cg_checked_malloc(n * sizeof(double));
    double *exact = cg_checked_malloc(n * sizeof(double));
    double t_start = insitu_now_seconds();
    cg_build_problem(&p, b);
    if (open_transport(&transport, where, n, intervals, synchronous ? INSITU_SYNCHRONOUS : 0))
        return 1;
    struct cg_state cg = {
        .problem = &p,
        .b = b,
        .x = transport.vector,
        .r = cg_checked_malloc(n * sizeof(double)),
        .dir = cg_checked_malloc(n * sizeof(double)),
        .ap = cg_checked_malloc(n * sizeof(double)),
    };
    printf("insitu-sim: %s, %s; %ld x %ld x %ld grid, %ld rows, %ld iterations, %ld intervals of %ld\n",
           argv[1], argv[2], p.nx, p.ny, p.nz, n, iterations, intervals, interval_length);
    fflush(stdout);

    long step = 0, steps_verified = 0, steps_done = 0, unanswered = 0;
    double step_start_norm = 0, compute = 0, publishing = 0, waiting = 0, worst_error = 0;
    double t_loop = insitu_now_seconds(), t_mark = t_loop;
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
            uint64_t checksum = insitu_checksum(cg.x, n);
            publish(&transport, k, iter, checksum, 0);
            double t_published = insitu_now_seconds();
            publishing += t_published - t_publish;
            /* After one silence the analytics is likely gone: do not wait the full time again. */
            double timeout = unanswered ? 1.0 : k == 1 ? FIRST_WAIT_SECONDS : WAIT_SECONDS;
            int answered = wait_for_analytics(&transport, k, synchronous, timeout) == 0;
            unanswered += !answered;
            t_mark = insitu_now_seconds();
            waiting += t_mark - t_published;
            printf("insitu-sim: interval %ld iteration %ld checksum %016llx%s\n", k, iter,
                   (unsigned long long)checksum, answered ? "" : " (no answer from the analytics)");
        }
    }
    compute += insitu_now_seconds() - t_mark;
    publish(&transport, intervals, iterations, transport.header->checksum, 1);
    double total = insitu_now_seconds() - t_start;
    if (!transport.use_files && xpmem_remove(transport.segid))
        fprintf(stderr, "insitu-sim: xpmem_remove: %s\n", strerror(errno));
    printf("insitu-sim: %ld time steps converged, %ld verified (max error %.3e)\n", steps_done, steps_verified, worst_error);
    printf("insitu-sim: total %.3f s (setup and %ld iterations), compute %.3f s, publishing %.3f s, waiting for the analytics %.3f s\n",
           total, iterations, compute, publishing, waiting);
    printf("insitu-sim: per interval: compute %.2f ms, publish %.2f ms, wait %.2f ms; %.1f MFLOP/s\n", 1e3 * compute / intervals,
           1e3 * publishing / intervals, 1e3 * waiting / intervals, iterations * cg_flops_per_iteration(&p) / compute / 1e6);
    int ok = steps_done > 0 && steps_verified == steps_done && unanswered == 0;
    printf("insitu-sim: %s\n", ok ? "done, every interval answered" : "FAILED");
    return ok ? 0 : 1;
}
