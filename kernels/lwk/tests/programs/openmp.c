/* GCC OpenMP: a parallel reduction and a parallel loop over an array, with 4 threads.
   lwk-test: libcs=glibc flags=-fopenmp */
#include <omp.h>
#include <stdio.h>

#define N 1000000

static double values[N];

int main(void) {
    omp_set_num_threads(4);
    double sum = 0;
#pragma omp parallel for reduction(+ : sum)
    for (int i = 0; i < N; i++) {
        values[i] = i * 0.5;
        sum += values[i];
    }
    int threads = 0;
#pragma omp parallel
    {
#pragma omp atomic
        threads++;
    }
    long checksum = 0;
#pragma omp parallel for reduction(+ : checksum) schedule(static)
    for (int i = 0; i < N; i++)
        checksum += (long)values[i] % 7;
    printf("sum %.1f, threads %d, checksum %ld\n", sum, threads, checksum);
    return 0;
}
