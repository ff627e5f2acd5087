/*
 * What the in-situ simulation (sim.c) and its analytics (analytics.c) share, wherever each runs
 * (host process or LWK enclave): a header page, and the data: the simulation's solution vector,
 * repeated to fill the analytics' data size (the paper's STREAM input, up to 512 MB).
 *
 * One-time attachment: the header page and the data are one XEMEM segment (the simulation's
 * own memory) that the analytics attaches once; through POSIX files, the same layout is one
 * file's content. Recurring attachment: the header page alone is the named segment (or file);
 * every interval the simulation makes a new region with that interval's data and puts its
 * segment id in the header (files: a new file insitu-data.K.bin); the analytics gets,
 * attaches, reads, detaches and releases it, answers "taken", and the simulation removes it.
 * Through files the analytics' answers go to a second file.
 *
 * The handshake, one interval at a time (k counts from 1):
 *   simulation: writes the vector's checksum and iteration, then published = k (release);
 *   analytics:  sees published == k, copies the vector into private memory, sets taken = k;
 *               runs the STREAM kernels over its copy, sets analysed = k;
 *   simulation: synchronous, waits for analysed == k; asynchronous, waits only for taken == k
 *               (the copy: the vector must not change under it), then computes on while the
 *               analytics' kernels run.
 *   at the end: the simulation sets finished; the analytics sets left (xemem) and detaches;
 *               only then does the simulation remove the segment (an attacher reading a
 *               removed segment faults).
 * Every wait spins with a timeout, so a missing partner costs seconds, never a hang.
 */
#ifndef CLOWDER_INSITU_H
#define CLOWDER_INSITU_H

#include <stdint.h>
#include <stdio.h>
#include <time.h>

#define INSITU_MAGIC 0x7573746973696e69ULL /* "insitu" */
#define INSITU_PAGE 4096UL
#define INSITU_SYNCHRONOUS 1u /* flags: the simulation waits for the analysis */
#define INSITU_RECURRING 2u   /* flags: a new region (file) per interval */

struct insitu_header {
    uint64_t magic;
    uint64_t vector_length; /* doubles of data (after the header page, one-time) */
    uint64_t interval_count;
    uint64_t flags;
    /* written by the simulation */
    uint64_t published; /* last interval published; the vector below is that interval's */
    uint64_t iteration; /* CG iteration of the published vector */
    uint64_t checksum;  /* insitu_checksum of the published vector */
    uint64_t finished;  /* 1 once the simulation publishes nothing more */
    int64_t segid;      /* recurring: the published interval's region */
    /* written by the analytics; its own cache line, away from the simulation's words */
    uint64_t pad[7];
    uint64_t taken;    /* last interval copied */
    uint64_t analysed; /* last interval whose kernels ran */
    uint64_t left;     /* 1 once it has seen "finished" and reads no more: the segment may go */
};

/* Monotonic seconds, for both sides' waiting deadlines. */
static inline double insitu_now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* How long to wait for the partner: BASE seconds plus 1 s per 4 MiB of data, since staging,
 * exporting and copying the data grow with it (a 512 MB recurring interval took 11 s on a loaded
 * host, 73 s in an LWK enclave whose kernel this PVM host emulates). */
static inline double insitu_patience(uint64_t length, double base) { return base + length * 8.0 / (4 << 20); }

/* Ordered loads and stores: the partner may run on another CPU, in another kernel. */
static inline uint64_t insitu_load(const uint64_t *word) { return __atomic_load_n(word, __ATOMIC_ACQUIRE); }
static inline void insitu_store(uint64_t *word, uint64_t value) { __atomic_store_n(word, value, __ATOMIC_RELEASE); }

/* An exact checksum of the vector's bits (FNV-1a over 64-bit words): equal only if the
 * analytics saw the very values the simulation published. */
static inline uint64_t insitu_checksum(const double *vector, uint64_t length) {
    uint64_t hash = 0xcbf29ce484222325ULL;
    const uint64_t *words = (const uint64_t *)vector;
    for (uint64_t i = 0; i < length; i++) {
        hash ^= words[i];
        hash *= 0x100000001b3ULL;
    }
    return hash;
}

/* Bytes of LENGTH doubles, rounded up to whole pages. */
static inline uint64_t insitu_data_bytes(uint64_t length) {
    return (length * sizeof(double) + INSITU_PAGE - 1) / INSITU_PAGE * INSITU_PAGE;
}

/* Bytes of the one-time layout (header page + data). */
static inline uint64_t insitu_bytes(uint64_t length) { return INSITU_PAGE + insitu_data_bytes(length); }

/* The data file of interval K in recurring mode, under DIR. */
static inline void insitu_data_path(char *path, size_t size, const char *dir, uint64_t k) {
    snprintf(path, size, "%s/insitu-data.%llu.bin", dir, (unsigned long long)k);
}

#endif
