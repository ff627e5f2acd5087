/*
 * rma: MPI one-sided communication (issue 25 point 4: ranks "do RMA" into each other's memory):
 * every rank exposes a window of BYTES (MPI_Win_allocate), then for ROUNDS rounds puts a block
 * stamped with its rank and the round into its right neighbour's window and gets its left
 * neighbour's block back out of that neighbour's window, each round closed by MPI_Win_fence.
 * Every byte put and got is checked; rank 0 prints
 *
 *   rma: BYTES bytes  RANKS ranks  ROUNDS rounds  TIME us a round
 *   rma: puts and gets verified
 *
 * and a wrong byte fails with status 1.
 *
 *   rma [BYTES] [ROUNDS]   defaults 1048576 and 20
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../args.h"

static unsigned char stamp(int rank, long round, long i) {
    return (unsigned char)(rank * 31 + round * 7 + i);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc > 3) {
        if (rank == 0) fprintf(stderr, "usage: rma [BYTES] [ROUNDS]\n");
        MPI_Finalize();
        return 2;
    }
    long bytes = argc > 1 ? arg_integer("rma", "BYTES", argv[1], 1, 1L << 28) : 1L << 20;
    long rounds = argc > 2 ? arg_integer("rma", "ROUNDS", argv[2], 1, 1000000) : 20;
    unsigned char *window, *block = malloc(bytes), *got = malloc(bytes);
    MPI_Win win;
    if (!block || !got || MPI_Win_allocate(bytes, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &window, &win) != MPI_SUCCESS) {
        fprintf(stderr, "rma: no memory or window for %ld bytes\n", bytes);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    long wrong = 0;
    MPI_Win_fence(0, win);
    double start = MPI_Wtime();
    for (long round = 0; round < rounds; round++) {
        for (long i = 0; i < bytes; i++) block[i] = stamp(rank, round, i);
        MPI_Put(block, (int)bytes, MPI_BYTE, right, 0, (int)bytes, MPI_BYTE, win);
        MPI_Win_fence(0, win);
        /* This rank's window holds its left neighbour's block now, and the left neighbour's
         * window holds the block of the rank left of it: get that one. */
        MPI_Get(got, (int)bytes, MPI_BYTE, left, 0, (int)bytes, MPI_BYTE, win);
        MPI_Win_fence(0, win);
        int left_of_left = (left + size - 1) % size;
        for (long i = 0; i < bytes; i++) {
            wrong += window[i] != stamp(left, round, i);
            wrong += got[i] != stamp(left_of_left, round, i);
        }
        MPI_Win_fence(0, win);
    }
    double elapsed = MPI_Wtime() - start;
    long all_wrong = 0;
    MPI_Reduce(&wrong, &all_wrong, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("rma: %ld bytes  %d ranks  %ld rounds  %.2f us a round\n", bytes, size, rounds, elapsed * 1e6 / rounds);
        if (all_wrong)
            printf("rma: %ld wrong bytes\n", all_wrong);
        else
            printf("rma: puts and gets verified\n");
    }
    MPI_Win_free(&win);
    free(block);
    free(got);
    MPI_Finalize();
    return all_wrong ? 1 : 0;
}
