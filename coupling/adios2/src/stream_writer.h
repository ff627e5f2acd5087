// The writing end of a clowder stream, apart from ADIOS2: the named control segment, the
// queue of published steps and the readers' places in it, and the step being written (blocks
// copied in at once, metadata records, published by EndStep as one segment). On the host a
// step is a copy-on-write snapshot of a region (xemem.h's SnapshotRegion): with the queue full
// the writer rewrites the oldest queued step's region in place while its readers still read
// that step's snapshot, and waits (Block) or drops the step (Discard) only at EndStep. The ADIOS2
// engine (writer.h) and the C writer API (clowder_adios2.h) both write through it, so both
// publish the same format (format.h) under the same rules.
#pragma once

#include "control.h"
#include "format.h"
#include "params.h"
#include "xemem.h"

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace clowder_adios
{

class StreamWriter
{
public:
    // Makes the control segment and waits for RendezvousReaderCount readers.
    StreamWriter(const std::string &stream, const Params &params);
    ~StreamWriter(); // without Close: the queued steps go at once
    StreamWriter(const StreamWriter &) = delete;
    StreamWriter &operator=(const StreamWriter &) = delete;

    void BeginStep();
    bool InStep() const { return m_InStep; }
    // One block of a variable into the current step (a step is opened if none is): shape,
    // start and count as ADIOS2 has them (shape empty for local arrays, all empty for values).
    void AddBlock(const std::string &name, const std::string &type, Kind kind,
                  const std::vector<size_t> &shape, const std::vector<size_t> &start,
                  const std::vector<size_t> &count, const void *data, size_t bytes);
    // An attribute's record: values as format.h lays them out.
    void AddAttribute(const std::string &name, const std::string &type, bool isValue,
                      uint32_t nelems, const std::vector<uint8_t> &values);
    // Publishes the step, waiting for room (Block) or dropping it (Discard) when readers
    // have the queue full.
    void EndStep();
    // Ends an open step, waits for readers to read what is queued (CloseTimeoutSecs), then
    // removes the stream's segments.
    void Close();
    size_t Step() const { return m_Step; }
    const std::string &Name() const { return m_Name; }

private:
    // Removes publications every live reader has passed; returns the number of live readers.
    uint32_t Reclaim();
    // Publications below `least` leave the queue.
    void Drop(uint64_t least);
    uint32_t LiveReaders();
    bool QueueFull() const;
    // A buffer for the next step: one no publication holds, else a new one while there may
    // be more, else (snapshots) the oldest publication's, rewritten under its snapshot.
    StepBuffer *TakeBuffer();
    std::unique_ptr<StepBuffer> NewBuffer();
    // Publication `pub` leaves the queue; `reuse`: its buffer may hold later steps (else it
    // goes: a reader that raced our reclaim may be reading it).
    void Unqueue(uint64_t pub, bool reuse);
    // The step being written moves to a region of at least `need` bytes.
    void Grow(size_t need);
    void Publish(size_t size);
    void Finish(bool drain);

    Params m_Params;
    std::string m_Name;
    std::string m_ControlName;
    std::unique_ptr<MadeSegment> m_Control;
    ControlView m_Ctl;
    std::vector<std::unique_ptr<StepBuffer>> m_Buffers;
    std::map<uint64_t, StepBuffer *> m_Published; // by publication number
    std::set<const StepBuffer *> m_Queued;        // the buffers m_Published holds
    bool m_Snapshots;                             // regions, while the library has them
    // A region's size: the largest step so far (the first one kInitialRegion), so that its
    // page tables, which write tracking fills for the whole region, follow the data.
    size_t m_RegionSize;
    static constexpr size_t kInitialRegion = size_t(16) << 20;
    Deadline m_NextPresenceCheck{0};
    uint64_t m_NextPub = 0;
    uint64_t m_Oldest = 0;

    StepBuffer *m_Current = nullptr;        // the step being written
    size_t m_Used = 0;                      // bytes of m_Current taken by data
    std::vector<uint8_t> m_Meta;
    uint32_t m_NVars = 0;
    uint32_t m_NAttrs = 0;
    size_t m_Step = 0;
    bool m_InStep = false;
    bool m_Closed = false;
};

} // namespace clowder_adios
