/*
 * pingpong: MPI ping-pong between ranks 0 and 1 (any others wait at the barrier), in the manner
 * of IMB's PingPong: for each message size from 1 B to MAX_BYTES (doubling), ITERS round trips
 * after a few warm-up ones; rank 0 prints one line per size:
 *
 *   pingpong: BYTES bytes  LATENCY us  BANDWIDTH MB/s
 *
 * where LATENCY is half a round trip, the median of ten timed blocks of round trips
 * (timing.h), and BANDWIDTH is BYTES / LATENCY. The data is
 * checked at every size (the last byte rank 1 sends back is its own), so a transport that
 * loses or mixes messages fails with status 1.
 *
 *   pingpong [MAX_BYTES] [ITERS]     defaults 4194304 and 1000 (fewer for large messages)
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../args.h"
#include "timing.h"

/* One round trip of `bytes` between ranks 0 and 1; whether rank 0 got back other than rank 1's
   byte. */
static int round_trip(char *buffer, long bytes, int rank) {
    if (rank == 0) {
        buffer[bytes - 1] = 0;
        MPI_Send(buffer, (int)bytes, MPI_CHAR, 1, 0, MPI_COMM_WORLD);
        MPI_Recv(buffer, (int)bytes, MPI_CHAR, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        return buffer[bytes - 1] != 1;
    }
    if (rank == 1) {
        MPI_Recv(buffer, (int)bytes, MPI_CHAR, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        buffer[bytes - 1] = 1;
        MPI_Send(buffer, (int)bytes, MPI_CHAR, 0, 0, MPI_COMM_WORLD);
    }
    return 0;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc > 3) {
        if (rank == 0) fprintf(stderr, "usage: pingpong [MAX_BYTES] [ITERS]\n");
        MPI_Finalize();
        return 2;
    }
    long max_bytes = argc > 1 ? arg_integer("pingpong", "MAX_BYTES", argv[1], 1, 1L << 28) : 4L << 20;
    long base_iters = argc > 2 ? arg_integer("pingpong", "ITERS", argv[2], 1, 10000000) : 1000;
    if (size < 2) {
        if (rank == 0) fprintf(stderr, "pingpong: needs at least 2 ranks, got %d\n", size);
        MPI_Finalize();
        return 2;
    }
    char *buffer = malloc(max_bytes);
    if (!buffer) {
        fprintf(stderr, "pingpong: out of memory for %ld bytes\n", max_bytes);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int bad = 0;
    for (long bytes = 1; bytes <= max_bytes; bytes *= 2) {
        /* about the same time per size: fewer round trips for large messages */
        long iters = bytes <= 65536 ? base_iters : base_iters * 65536 / bytes;
        if (iters < 10) iters = 10;
        long each = per_block(iters);
        double blocks[BLOCKS];
        MPI_Barrier(MPI_COMM_WORLD);
        for (int i = 0; i < 5; i++) bad |= round_trip(buffer, bytes, rank); /* warm-up */
        for (int block = 0; block < BLOCKS; block++) {
            double start = MPI_Wtime();
            for (long i = 0; i < each; i++) bad |= round_trip(buffer, bytes, rank);
            blocks[block] = MPI_Wtime() - start;
        }
        double half_trip = median_block(blocks) / each / 2;
        if (rank == 0)
            printf("pingpong: %ld bytes  %.2f us  %.1f MB/s\n", bytes, half_trip * 1e6, bytes / half_trip / 1e6);
    }
    if (rank == 0) printf("pingpong: %s\n", bad ? "data NOT verified" : "data verified");
    /* Out before MPI_Finalize: a launcher that kills a rank hung there (see docs/mpi.md) would
       otherwise drop the results still in stdio's buffer. */
    fflush(stdout);
    free(buffer);
    MPI_Finalize();
    return bad;
}
