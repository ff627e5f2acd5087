// The engine's parameters, read from the IO's parameters (set in code or in an ADIOS2 XML/YAML
// configuration). Keys are case-insensitive, as ADIOS2's own engines take them; an unknown key
// or a value that does not parse is refused with a one-line error naming it.
#pragma once

#include <adios2/common/ADIOSTypes.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace clowder_adios
{

enum class QueueFullPolicy
{
    Block,
    Discard
};

struct Params
{
    uint32_t queueLimit = 4;             // QueueLimit: published steps kept for readers
    QueueFullPolicy policy = QueueFullPolicy::Block; // QueueFullPolicy: Block | Discard
    uint32_t rendezvousReaderCount = 1;  // RendezvousReaderCount: readers the writer waits for
    uint32_t maxReaders = 16;            // MaxReaders
    double openTimeoutSecs = 60;         // OpenTimeoutSecs: writer's rendezvous, reader's wait
    double closeTimeoutSecs = 60;        // CloseTimeoutSecs: writer waits for readers to drain
    uint64_t maxStepSize = uint64_t(64) << 30; // MaxStepSize: bytes of one step, at most

    static Params Parse(const adios2::Params &io);
};

} // namespace clowder_adios
