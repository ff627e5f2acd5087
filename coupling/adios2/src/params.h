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
    // StepSnapshots: each step a copy-on-write snapshot of a region the writer rewrites in
    // place (true), or a segment of its own per queued step (false; always so in the LWK).
    // Off by default: a Put copies the whole variable, so a snapshot's writer pays every page
    // twice (its copy, then the fold into the region) plus a write fault per page, for
    // nothing a reader sees: 64 MiB steps cost the writer ~20x a segment's (docs/adios2.md).
    bool stepSnapshots = false;
    // StreamName: what writer and readers meet by. ADIOS2's plugin interface (v2) hands the
    // engine the plugin's name where other engines get the name given to Open, so the stream
    // is the IO's name unless this parameter names it.
    std::string streamName;

    static Params Parse(const adios2::Params &io);
    // StreamName, or else the IO's name.
    std::string Stream(const std::string &ioName) const
    {
        return streamName.empty() ? ioName : streamName;
    }
};

} // namespace clowder_adios
