/*
 * What the in-situ simulation (sim.c, in an LWK enclave) and its analytics (analytics.c, on the
 * host) share: a header page followed by the simulation's solution vector. Through XEMEM both
 * map the same pages (the simulation's own memory); through POSIX files the same layout is the
 * file's content, and the analytics' answers go to a second file.
 *
 * The handshake, one interval at a time (k counts from 1):
 *   simulation: writes the vector's checksum and iteration, then published = k (release);
 *   analytics:  sees published == k, copies the vector into private memory, sets taken = k;
 *               runs the STREAM kernels over its copy, sets analysed = k;
 *   simulation: synchronous, waits for analysed == k; asynchronous, waits only for taken == k
 *               (the copy: the vector must not change under it), then computes on while the
 *               analytics' kernels run.
 * Every wait spins with a timeout, so a missing partner costs seconds, never a hang.
 */
#ifndef CLOWDER_INSITU_H
#define CLOWDER_INSITU_H

#include <stdint.h>
#include <time.h>

#define INSITU_MAGIC 0x7573746973696e69ULL /* "insitu" */
#define INSITU_PAGE 4096UL
#define INSITU_SYNCHRONOUS 1u /* flags: the simulation waits for the analysis */

struct insitu_header {
    uint64_t magic;
    uint64_t vector_length; /* doubles after the header page */
    uint64_t interval_count;
    uint64_t flags;
    /* written by the simulation */
    uint64_t published; /* last interval published; the vector below is that interval's */
    uint64_t iteration; /* CG iteration of the published vector */
    uint64_t checksum;  /* insitu_checksum of the published vector */
    uint64_t finished;  /* 1 once the simulation publishes nothing more */
    /* written by the analytics; its own cache line, away from the simulation's words */
    uint64_t pad[8];
    uint64_t taken;    /* last interval copied */
    uint64_t analysed; /* last interval whose kernels ran */
};

/* Monotonic seconds, for both sides' waiting deadlines. */
static inline double insitu_now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

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

/* Bytes of the shared layout (header page + vector), rounded up to whole pages. */
static inline uint64_t insitu_bytes(uint64_t vector_length) {
    return INSITU_PAGE + (vector_length * sizeof(double) + INSITU_PAGE - 1) / INSITU_PAGE * INSITU_PAGE;
}

#endif
