#include "select.h"

#include <algorithm>
#include <cstring>

namespace clowder_adios
{

size_t CopyIntersection(const uint8_t *block, const adios2::Dims &blockStart,
                        const adios2::Dims &blockCount, uint8_t *out,
                        const adios2::Dims &selStart, const adios2::Dims &selCount,
                        size_t elemSize)
{
    const size_t n = blockStart.size();
    if (n == 0)
    {
        std::memcpy(out, block, elemSize);
        return 1;
    }
    adios2::Dims lo(n), hi(n);
    for (size_t d = 0; d < n; ++d)
    {
        lo[d] = std::max(blockStart[d], selStart[d]);
        hi[d] = std::min(blockStart[d] + blockCount[d], selStart[d] + selCount[d]);
        if (lo[d] >= hi[d])
            return 0;
    }
    // The trailing dimensions the intersection spans whole in both the block and the selection
    // are contiguous in both: one memcpy covers them (the whole array: one memcpy a block).
    size_t inner = n - 1; // runs cover dimensions inner..n-1
    size_t run = hi[n - 1] - lo[n - 1];
    while (inner > 0 && hi[inner] - lo[inner] == blockCount[inner] &&
           hi[inner] - lo[inner] == selCount[inner])
    {
        --inner;
        run *= hi[inner] - lo[inner];
    }
    size_t copied = 0;
    adios2::Dims at = lo; // the first element of the current run; dimensions 0..inner-1 count
    while (true)
    {
        size_t inBlock = 0, inSel = 0;
        for (size_t d = 0; d < n; ++d)
        {
            inBlock = inBlock * blockCount[d] + (at[d] - blockStart[d]);
            inSel = inSel * selCount[d] + (at[d] - selStart[d]);
        }
        std::memcpy(out + inSel * elemSize, block + inBlock * elemSize, run * elemSize);
        copied += run;
        size_t d = inner;
        while (true)
        {
            if (d == 0)
                return copied;
            --d;
            if (++at[d] < hi[d])
                break;
            at[d] = lo[d];
        }
    }
}

} // namespace clowder_adios
