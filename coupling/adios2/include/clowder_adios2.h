/*
 * clowder_adios2.h: write a clowder ADIOS2 stream from C without ADIOS2, for programs that
 * cannot carry ADIOS2 (static programs in an LWK enclave, small codes). The steps are the
 * same segments the ADIOS2 plugin engine publishes (docs/adios2.md), so any ADIOS2 reader
 * with PluginName=clowder reads them: C++, C, Python. Link libclowder_adios2_writer.a (C++
 * inside: add -lstdc++) and libxpmem.
 *
 * Every call returns 0 (open: the writer) on success, or -1 (open: NULL) with a one-line
 * message from clowder_adios2_error(); a writer is not to be used after close.
 */
#ifndef CLOWDER_ADIOS2_H
#define CLOWDER_ADIOS2_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct clowder_adios2_writer clowder_adios2_writer;

/* Opens stream `stream` for writing. params: the engine's parameters as "Key=Value" pairs
 * separated by commas ("QueueLimit=2,RendezvousReaderCount=0"), or NULL. Waits for
 * RendezvousReaderCount readers (1 unless said). */
clowder_adios2_writer *clowder_adios2_open(const char *stream, const char *params);
int clowder_adios2_begin_step(clowder_adios2_writer *writer);
/* One block of variable `name` of ADIOS2 type `type` ("int8_t" ... "uint64_t", "float",
 * "double", "char"): ndims 0 is a value (data points to it); otherwise shape, start and count
 * have ndims entries each for a global array, or shape and start are NULL for a local array.
 * The data is copied before the call returns. */
int clowder_adios2_put(clowder_adios2_writer *writer, const char *name, const char *type,
		       size_t ndims, const size_t *shape, const size_t *start, const size_t *count,
		       const void *data);
/* A string value. */
int clowder_adios2_put_string(clowder_adios2_writer *writer, const char *name, const char *value);
/* A string attribute, published with every step from now on (a second call changes it). */
int clowder_adios2_attribute_string(clowder_adios2_writer *writer, const char *name,
				    const char *value);
int clowder_adios2_end_step(clowder_adios2_writer *writer);
/* Ends an open step, lets readers read what is queued, removes the stream, frees the writer. */
int clowder_adios2_close(clowder_adios2_writer *writer);
/* Why the calling thread's last failed call failed. */
const char *clowder_adios2_error(void);

#ifdef __cplusplus
}
#endif

#endif /* CLOWDER_ADIOS2_H */
