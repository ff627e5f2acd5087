// Copies the part of one written block that falls inside a reader's selection (row-major
// boxes of any number of dimensions): one memcpy per contiguous run, whole trailing
// dimensions merged into one run.
#pragma once

#include <adios2/common/ADIOSTypes.h>

#include <cstddef>
#include <cstdint>

namespace clowder_adios
{

// block: data of the box (blockStart, blockCount); out: the box (selStart, selCount).
// Returns the number of elements copied.
size_t CopyIntersection(const uint8_t *block, const adios2::Dims &blockStart,
                        const adios2::Dims &blockCount, uint8_t *out,
                        const adios2::Dims &selStart, const adios2::Dims &selCount,
                        size_t elemSize);

} // namespace clowder_adios
