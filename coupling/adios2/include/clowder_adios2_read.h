/*
 * clowder_adios2_read.h: zero-copy reading for ADIOS2 readers of the clowder engine. Between
 * BeginStep and EndStep, clowder_adios2_block_data points the caller at a block of a
 * variable where the writer published it (the step's XEMEM segment, attached by the engine):
 * no copy, the analysis reads the simulation's memory in place.
 *
 * Why not ADIOS2's own call: ADIOS2's zero-copy read is Engine::Get(Variable<T>,
 * Variable<T>::Info &) then Info::Data() (the Inline engine's), reached through core::Engine's
 * DoGetBlockSync/DoGetBlockDeferred. ADIOS2 2.12's plugin interface (v2,
 * PluginEngineInterface.h) has no such call, and its PluginEngine forwards none: on a plugin
 * engine that Get dereferences a null block info (SIGSEGV, seen with 2.12.1), and the Infos
 * of Engine::BlocksInfo carry no data pointer. Neither the C nor the Python bindings have
 * one. So the engine library, libclowder_adios2.so (PluginLibrary), exports this; link it or
 * look the symbol up (dlsym, Python's ctypes on the same path: the loader hands back the copy
 * ADIOS2 loaded).
 *
 * Every call returns 0 on success, or -1 with a one-line message from
 * clowder_adios2_read_error() (thread-local).
 */
#ifndef CLOWDER_ADIOS2_READ_H
#define CLOWDER_ADIOS2_READ_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CLOWDER_ADIOS2_MAX_DIMS 32

struct clowder_adios2_block
{
    /* The block's first element, row-major, in the step's segment. Valid until the reader's
     * EndStep (the step's attachment is held until then; the writer does not reuse the
     * step's memory before every reader has ended it); read-only by contract. */
    const void *data;
    size_t nbytes;  /* the block's bytes (a string: its length) */
    size_t nblocks; /* the variable's blocks in this step */
    uint64_t step;  /* the writer's step number (CurrentStep()) */
    size_t ndims;   /* 0 for a value */
    /* Global arrays: the variable's shape and where the block lies in it. Local arrays: shape
     * and start are 0s. */
    uint64_t shape[CLOWDER_ADIOS2_MAX_DIMS];
    uint64_t start[CLOWDER_ADIOS2_MAX_DIMS];
    uint64_t count[CLOWDER_ADIOS2_MAX_DIMS];
};

/* Block `block` (0 .. nblocks-1, as ADIOS2's BlockID counts them) of variable `variable` in
 * the current step of the clowder reader open on the ADIOS2 IO named `io` (IO::Name()). type:
 * the ADIOS2 type name the caller reads it as (adios2::GetType<T>(): "double", "int32_t",
 * "string", ...), or NULL for any. Errors: no reader (or more than one) open on that IO,
 * outside BeginStep/EndStep, an unknown variable, another type, a block out of range. */
int clowder_adios2_block_data(const char *io, const char *variable, const char *type,
                              size_t block, struct clowder_adios2_block *out);

const char *clowder_adios2_read_error(void);

#ifdef __cplusplus
}
#endif

#endif
