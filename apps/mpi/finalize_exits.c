/*
 * finalize_exits.so (LD_PRELOAD; make test-mpi): a rank whose stdout is no terminal, so fully
 * buffered (as an LWK job's is), and whose MPI_Finalize never returns: it ends the process at
 * once, as a launcher's kill of a rank hung there does. A program that printed its results
 * before MPI_Finalize without flushing them loses them here; apps/mpi's programs must not.
 */
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>

__attribute__((constructor)) static void fully_buffered(void) { setvbuf(stdout, NULL, _IOFBF, 1 << 16); }

int MPI_Finalize(void) { _exit(0); }
