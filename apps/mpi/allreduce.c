/*
 * allreduce: MPI_Allreduce (sum of doubles) over all ranks, in the manner of IMB's Allreduce:
 * for each size from 8 B to MAX_BYTES (x8), ITERS calls after a few warm-up ones; rank 0 prints
 *
 *   allreduce: BYTES bytes  RANKS ranks  TIME us
 *
 * with TIME per call in the median of ten timed blocks of calls (timing.h). Every call's
 * result is checked (element i sums rank+i over the ranks), so a wrong reduction fails with
 * status 1.
 *
 *   allreduce [MAX_BYTES] [ITERS] [CRASH_RANK]   defaults 1048576 and 200; with CRASH_RANK that
 *                                                rank dies of SIGSEGV after the first size
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "../args.h"
#include "timing.h"

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc > 4) {
        if (rank == 0) fprintf(stderr, "usage: allreduce [MAX_BYTES] [ITERS] [CRASH_RANK]\n");
        MPI_Finalize();
        return 2;
    }
    long max_bytes = argc > 1 ? arg_integer("allreduce", "MAX_BYTES", argv[1], 8, 1L << 26) : 1L << 20;
    long iters = argc > 2 ? arg_integer("allreduce", "ITERS", argv[2], 1, 10000000) : 200;
    long crash_rank = argc > 3 ? arg_integer("allreduce", "CRASH_RANK", argv[3], 0, size - 1) : -1;
    long count_max = max_bytes / 8;
    double *in = malloc(count_max * sizeof(double)), *out = malloc(count_max * sizeof(double));
    if (!in || !out) {
        fprintf(stderr, "allreduce: out of memory for %ld bytes\n", max_bytes);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    for (long i = 0; i < count_max; i++) in[i] = rank + i;
    int bad = 0;
    for (long count = 1; count <= count_max; count *= 8) {
        long calls = count <= 8192 ? iters : iters * 8192 / count;
        long block_calls = per_block(calls);
        double blocks[BLOCKS];
        long last = count - 1;
        MPI_Barrier(MPI_COMM_WORLD);
        for (int block = -1; block < BLOCKS; block++) { /* block -1: warm-up */
            double start = MPI_Wtime();
            for (long i = 0; i < block_calls; i++) {
                MPI_Allreduce(in, out, (int)count, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
                bad |= out[last] != (double)size * (size - 1) / 2 + (double)size * last;
            }
            if (block >= 0) blocks[block] = MPI_Wtime() - start;
        }
        double each = median_block(blocks) / block_calls;
        if (rank == 0) printf("allreduce: %ld bytes  %d ranks  %.2f us\n", count * 8, size, each * 1e6);
        if (rank == crash_rank) {
            fprintf(stderr, "allreduce: rank %d crashes now, as asked\n", rank);
            fflush(stderr);
            *(volatile int *)0 = 1;
        }
    }
    int any_bad = 0;
    MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
    if (rank == 0) printf("allreduce: %s\n", any_bad ? "results NOT verified" : "results verified");
    fflush(stdout); /* before MPI_Finalize, as mpicg's */
    free(in);
    free(out);
    MPI_Finalize();
    return any_bad;
}
