/*
 * triad: a vector-code triad, a[i] = b[i] + s * c[i], written with AVX2 or AVX-512 intrinsics,
 * in THREADS threads that each own their arrays. Meant to run with every thread on one core, so
 * that two threads per core share it by time slices: a kernel that lost vector state between
 * them would give wrong sums, and one that saved it slowly would lose bandwidth.
 *
 *   triad ISA THREADS [N] [REPEATS]     ISA avx2 or avx512; THREADS 1..64; defaults: N 16384
 *                                       doubles per array (three arrays per thread, cache
 *                                       resident), REPEATS 100000
 *
 * Prints the total MB/s of all threads (24 bytes per element: two reads, one write) over the
 * wall time from the first thread's start to the last thread's end, and checks every element.
 * Exit status 0 when verified, 1 when not, 2 on bad arguments or an ISA the CPU (or its
 * kernel's XCR0) does not offer.
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../args.h"

static long n, repeats;
static int use_avx512;
static pthread_barrier_t start;

struct worker {
    pthread_t thread;
    double *a, *b, *c;
    double began, ended;
    int ok;
};

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

__attribute__((target("avx2,fma"))) static void triad_avx2(double *a, const double *b, const double *c, double s) {
    __m256d vs = _mm256_set1_pd(s);
    for (long i = 0; i < n; i += 4)
        _mm256_store_pd(a + i, _mm256_fmadd_pd(vs, _mm256_load_pd(c + i), _mm256_load_pd(b + i)));
}

__attribute__((target("avx512f"))) static void triad_avx512(double *a, const double *b, const double *c, double s) {
    __m512d vs = _mm512_set1_pd(s);
    for (long i = 0; i < n; i += 8)
        _mm512_store_pd(a + i, _mm512_fmadd_pd(vs, _mm512_load_pd(c + i), _mm512_load_pd(b + i)));
}

static void *work(void *arg) {
    struct worker *w = arg;
    pthread_barrier_wait(&start);
    w->began = now();
    for (long r = 0; r < repeats; r++) {
        /* s alternates so that a stale register or a lost upper half shows in the result. */
        double s = r & 1 ? 3.0 : 2.0;
        if (use_avx512)
            triad_avx512(w->a, w->b, w->c, s);
        else
            triad_avx2(w->a, w->b, w->c, s);
    }
    w->ended = now();
    double s = (repeats - 1) & 1 ? 3.0 : 2.0;
    w->ok = 1;
    for (long i = 0; i < n; i++)
        if (w->a[i] != w->b[i] + s * w->c[i]) w->ok = 0;
    return NULL;
}

static double *array(double value) {
    double *p = aligned_alloc(64, n * sizeof(double));
    if (!p) {
        fprintf(stderr, "triad: cannot allocate %ld doubles\n", n);
        exit(2);
    }
    for (long i = 0; i < n; i++) p[i] = value + (double)(i % 7);
    return p;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 5 || (strcmp(argv[1], "avx2") != 0 && strcmp(argv[1], "avx512") != 0)) {
        fprintf(stderr, "usage: triad avx2|avx512 THREADS [N] [REPEATS]\n");
        return 2;
    }
    use_avx512 = strcmp(argv[1], "avx512") == 0;
    int threads = (int)arg_integer("triad", "THREADS", argv[2], 1, 64);
    n = argc > 3 ? arg_integer("triad", "N", argv[3], 8, 1L << 28) : 16384;
    repeats = argc > 4 ? arg_integer("triad", "REPEATS", argv[4], 1, 1000000000) : 100000;
    if (n % 8) {
        fprintf(stderr, "triad: N must be a multiple of 8, got %ld\n", n);
        return 2;
    }
    __builtin_cpu_init();
    if (!(use_avx512 ? __builtin_cpu_supports("avx512f") : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) {
        fprintf(stderr, "triad: %s is not offered here (CPUID and XCR0)\n", argv[1]);
        return 2;
    }
    struct worker *workers = calloc(threads, sizeof *workers);
    pthread_barrier_init(&start, NULL, threads + 1);
    for (int t = 0; t < threads; t++) {
        workers[t].a = array(0);
        workers[t].b = array(1 + t);
        workers[t].c = array(2 + t);
        if (pthread_create(&workers[t].thread, NULL, work, &workers[t]) != 0) {
            fprintf(stderr, "triad: cannot start thread %d\n", t);
            return 2;
        }
    }
    pthread_barrier_wait(&start);
    int ok = 1;
    /* Timed from the first thread's start to the last one's end, as the threads see them: the
       main thread may run only once they are done (one core, a real-time policy). */
    double began = 1e300, ended = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(workers[t].thread, NULL);
        ok &= workers[t].ok;
        began = workers[t].began < began ? workers[t].began : began;
        ended = workers[t].ended > ended ? workers[t].ended : ended;
    }
    double seconds = ended - began;
    printf("triad: %s, %d threads, %ld doubles x %ld repeats each: %.0f MB/s in %.3f s\n", argv[1], threads, n, repeats,
           24.0 * n * repeats * threads / seconds / 1e6, seconds);
    printf("triad: %s\n", ok ? "results verified" : "results NOT verified");
    return ok ? 0 : 1;
}
