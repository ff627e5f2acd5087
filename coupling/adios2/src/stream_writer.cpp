#include "stream_writer.h"

#include <algorithm>
#include <cstring>
#include <iostream>
#include <stdexcept>
#include <unistd.h>

namespace clowder_adios
{

namespace
{
size_t Align(size_t n, size_t a) { return (n + a - 1) / a * a; }

void Append(std::vector<uint8_t> &out, const void *p, size_t n)
{
    const uint8_t *b = static_cast<const uint8_t *>(p);
    out.insert(out.end(), b, b + n);
}

void PadTo8(std::vector<uint8_t> &out) { out.resize(Align(out.size(), 8), 0); }

// False once the reader's presence segment is gone; an error other than ENOENT (a busy
// broker) is no proof of death.
bool Present(int64_t presenceSegid)
{
    int64_t apid;
    try
    {
        apid = GetPermit(presenceSegid);
    }
    catch (const std::runtime_error &)
    {
        return true;
    }
    if (apid < 0)
        return false;
    ReleasePermit(apid);
    return true;
}
} // namespace

StreamWriter::StreamWriter(const std::string &stream, const Params &params)
: m_Params(params), m_Name(stream), m_ControlName(ControlName(stream)),
  m_Snapshots(params.stepSnapshots),
  m_RegionSize(std::min<size_t>(params.maxStepSize, kInitialRegion))
{
    size_t size = ControlSize(m_Params.queueLimit, m_Params.maxReaders);
    m_Control = std::make_unique<MadeSegment>(size, "clowder-adios2-control");
    auto &h = *reinterpret_cast<ControlHeader *>(m_Control->Data());
    std::memcpy(h.magic, kControlMagic, sizeof h.magic);
    h.version = kFormatVersion;
    h.queue_slots = m_Params.queueLimit;
    h.max_readers = m_Params.maxReaders;
    h.writer_pid = static_cast<uint64_t>(getpid());
    m_Control->MakeAtLeast(size, &m_ControlName);
    m_Ctl = ControlView(m_Control->Data(), size, m_Name);

    // As SST's RendezvousReaderCount: Open returns once that many readers are attached.
    Deadline deadline(m_Params.openTimeoutSecs);
    Backoff backoff;
    while (LiveReaders() < m_Params.rendezvousReaderCount)
    {
        if (deadline.Passed())
            throw std::runtime_error("clowder engine: stream '" + m_Name + "': " +
                                     std::to_string(m_Params.rendezvousReaderCount) +
                                     " reader(s) expected (RendezvousReaderCount), " +
                                     std::to_string(LiveReaders()) + " came within " +
                                     SecondsText(m_Params.openTimeoutSecs));
        backoff.Pause();
    }
}

StreamWriter::~StreamWriter()
{
    if (!m_Closed)
        Finish(false);
}

uint32_t StreamWriter::LiveReaders()
{
    // Asking the broker about every reader costs two calls each: at most every 0.1 s.
    bool check = m_NextPresenceCheck.Passed();
    if (check)
        m_NextPresenceCheck = Deadline(0.1);
    uint32_t live = 0;
    for (uint32_t i = 0; i < m_Ctl.MaxReaders(); ++i)
    {
        ReaderSlot &r = m_Ctl.Reader(i);
        uint64_t pid = Load(r.pid);
        if (pid == 0)
            continue;
        if (!check || Present(Load(r.presence_segid)))
            ++live;
        else // a reader that died gives its place back
            __atomic_compare_exchange_n(&r.pid, &pid, uint64_t(0), false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE);
    }
    return live;
}

uint32_t StreamWriter::Reclaim()
{
    uint32_t live = LiveReaders();
    if (live == 0)
        return 0; // nobody to wait for: keep the queue for readers that join later
    uint64_t least = m_NextPub;
    for (uint32_t i = 0; i < m_Ctl.MaxReaders(); ++i)
    {
        ReaderSlot &r = m_Ctl.Reader(i);
        if (Load(r.pid) != 0)
            least = std::min(least, std::max(Load(r.next_pub), m_Oldest));
    }
    if (least > m_Oldest)
        Drop(least);
    return live;
}

void StreamWriter::Drop(uint64_t least)
{
    Store(m_Ctl.Header().oldest_pub, least);
    // A reader that joined while we looked may have read oldest_pub before our store and
    // start below `least`: it has stored its position by now, so we see it here. The buffers
    // it might read are dropped (its attachment keeps their memory), not reused.
    uint64_t guard = least;
    for (uint32_t i = 0; i < m_Ctl.MaxReaders(); ++i)
    {
        ReaderSlot &r = m_Ctl.Reader(i);
        if (Load(r.pid) != 0)
            guard = std::min(guard, std::max(Load(r.next_pub), m_Oldest));
    }
    for (; m_Oldest < least; ++m_Oldest)
        Unqueue(m_Oldest, m_Oldest < guard);
}

void StreamWriter::Unqueue(uint64_t pub, bool reuse)
{
    auto it = m_Published.find(pub);
    if (it == m_Published.end())
        return;
    StepBuffer *buffer = it->second;
    m_Published.erase(it);
    m_Queued.erase(buffer);
    buffer->Withdraw();
    if (reuse && buffer->Capacity() >= m_RegionSize)
        return;
    if (buffer == m_Current)
    {
        // The step being written lies in it: it moves to a buffer of its own.
        std::unique_ptr<StepBuffer> moved = NewBuffer();
        std::memcpy(moved->Data(), buffer->Data(), m_Used);
        m_Current = moved.get();
        m_Buffers.push_back(std::move(moved));
    }
    m_Buffers.erase(std::find_if(m_Buffers.begin(), m_Buffers.end(),
                                 [&](const auto &b) { return b.get() == buffer; }));
}

void StreamWriter::Grow(size_t need)
{
    // Room for the metadata and a slightly larger next step, so that a step grows once.
    m_RegionSize =
        std::min<size_t>(m_Params.maxStepSize, std::max(2 * m_RegionSize, need + need / 16));
    std::unique_ptr<StepBuffer> bigger = NewBuffer();
    std::memcpy(bigger->Data(), m_Current->Data(), m_Used);
    StepBuffer *old = m_Current;
    m_Current = bigger.get();
    m_Buffers.push_back(std::move(bigger));
    if (!m_Queued.count(old)) // a queued one goes once its readers are done (Unqueue)
        m_Buffers.erase(std::find_if(m_Buffers.begin(), m_Buffers.end(),
                                     [&](const auto &b) { return b.get() == old; }));
}

std::unique_ptr<StepBuffer> StreamWriter::NewBuffer()
{
    if (m_Snapshots)
    {
        if (auto region = SnapshotRegion::Alloc(m_RegionSize))
            return region;
        m_Snapshots = false; // no regions here (the LWK)
    }
    return std::make_unique<MadeSegment>(m_Params.maxStepSize, "clowder-adios2-step");
}

StepBuffer *StreamWriter::TakeBuffer()
{
    // Free regions smaller than the largest step so far go.
    m_Buffers.erase(std::remove_if(m_Buffers.begin(), m_Buffers.end(),
                                   [&](const auto &b) {
                                       return !m_Queued.count(b.get()) &&
                                              b->Capacity() < m_RegionSize;
                                   }),
                    m_Buffers.end());
    for (const auto &b : m_Buffers)
        if (!m_Queued.count(b.get()))
            return b.get();
    // Segments: at most QueueLimit queued, so QueueLimit + 1 buffers at most. Regions: at
    // most QueueLimit; with all queued the queue is full, and the oldest step's region is
    // rewritten under its snapshot while its readers finish.
    bool inPlace = !m_Buffers.empty() && m_Buffers.front()->WritableWhilePublished();
    if (!inPlace || m_Buffers.size() < m_Ctl.QueueSlots())
    {
        m_Buffers.push_back(NewBuffer());
        return m_Buffers.back().get();
    }
    return m_Published.begin()->second;
}

bool StreamWriter::QueueFull() const { return m_NextPub - m_Oldest >= m_Ctl.QueueSlots(); }

void StreamWriter::BeginStep()
{
    if (m_Closed)
        throw std::logic_error("clowder engine: BeginStep after Close");
    if (m_InStep)
        throw std::logic_error("clowder engine: BeginStep twice without EndStep");
    Reclaim(); // so that a buffer the readers have left is taken before a queued one
    m_Current = TakeBuffer();
    m_Used = kPage;
    m_Meta.clear();
    m_NVars = m_NAttrs = 0;
    m_InStep = true;
}

void StreamWriter::AddBlock(const std::string &name, const std::string &type, Kind kind,
                            const std::vector<size_t> &shape, const std::vector<size_t> &start,
                            const std::vector<size_t> &count, const void *data, size_t bytes)
{
    if (!m_InStep)
        BeginStep(); // a Put outside steps opens one, as BP5
    if (count.size() > kMaxDims)
        throw std::invalid_argument("clowder engine: variable '" + name + "' has more than " +
                                    std::to_string(kMaxDims) + " dimensions");
    size_t at = Align(m_Used, kDataAlign);
    if (m_Snapshots && at + bytes > m_Current->Capacity() && at + bytes >= at &&
        at + bytes <= m_Params.maxStepSize)
        Grow(at + bytes);
    if (bytes > m_Current->Capacity() || at > m_Current->Capacity() - bytes)
        throw std::runtime_error("clowder engine: step " + std::to_string(m_Step) + " of '" +
                                 m_Name + "' exceeds MaxStepSize (" +
                                 std::to_string(m_Params.maxStepSize) + " bytes) at '" + name +
                                 "'");
    std::memcpy(m_Current->Data() + at, data, bytes);
    m_Used = at + bytes;

    VarRecord rec{};
    rec.kind = static_cast<uint8_t>(kind);
    rec.ndims = static_cast<uint8_t>(count.size());
    rec.type_len = static_cast<uint8_t>(type.size());
    rec.name_len = static_cast<uint32_t>(name.size());
    rec.data_offset = at;
    rec.data_size = bytes;
    size_t begin = m_Meta.size();
    Append(m_Meta, &rec, sizeof rec);
    for (const std::vector<size_t> *dims : {&shape, &start, &count})
        for (size_t d = 0; d < count.size(); ++d)
        {
            uint64_t v = d < dims->size() ? (*dims)[d] : 0;
            Append(m_Meta, &v, sizeof v);
        }
    Append(m_Meta, type.data(), type.size());
    Append(m_Meta, name.data(), name.size());
    PadTo8(m_Meta);
    reinterpret_cast<VarRecord *>(m_Meta.data() + begin)->record_size =
        static_cast<uint32_t>(m_Meta.size() - begin);
    ++m_NVars;
}

void StreamWriter::AddAttribute(const std::string &name, const std::string &type, bool isValue,
                                uint32_t nelems, const std::vector<uint8_t> &values)
{
    if (!m_InStep)
        BeginStep();
    AttrRecord rec{};
    rec.type_len = static_cast<uint8_t>(type.size());
    rec.is_value = isValue ? 1 : 0;
    rec.name_len = static_cast<uint32_t>(name.size());
    rec.nelems = nelems;
    rec.values_size = values.size();
    size_t begin = m_Meta.size();
    Append(m_Meta, &rec, sizeof rec);
    Append(m_Meta, type.data(), type.size());
    Append(m_Meta, name.data(), name.size());
    Append(m_Meta, values.data(), values.size());
    PadTo8(m_Meta);
    reinterpret_cast<AttrRecord *>(m_Meta.data() + begin)->record_size =
        static_cast<uint32_t>(m_Meta.size() - begin);
    ++m_NAttrs;
}

void StreamWriter::EndStep()
{
    if (!m_InStep)
        throw std::logic_error("clowder engine: EndStep without BeginStep");
    m_InStep = false;
    size_t metaAt = Align(m_Used, 8);
    size_t total = metaAt + m_Meta.size();
    if (m_Snapshots && total > m_Current->Capacity() && total <= m_Params.maxStepSize)
        Grow(total);
    if (total > m_Current->Capacity())
        throw std::runtime_error("clowder engine: step " + std::to_string(m_Step) +
                                 " exceeds MaxStepSize with its metadata");
    std::memcpy(m_Current->Data() + metaAt, m_Meta.data(), m_Meta.size());
    auto &h = *reinterpret_cast<StepHeader *>(m_Current->Data());
    std::memcpy(h.magic, kStepMagic, sizeof h.magic);
    h.version = kFormatVersion;
    h.nvars = m_NVars;
    h.nattrs = m_NAttrs;
    h.step = m_Step;
    h.total_size = total;
    h.meta_offset = metaAt;
    h.meta_size = m_Meta.size();

    m_Used = total; // what a move of the buffer (Unqueue) copies

    ++m_Step;
    Backoff backoff;
    // A region holding a queued step is published again only once that step has left.
    while (true)
    {
        uint32_t live = Reclaim();
        if (!QueueFull() && !m_Queued.count(m_Current))
            break;
        if (live == 0)
            Drop(m_Oldest + 1); // nobody reads: the oldest goes, so a joiner sees the latest
        else if (m_Params.policy == QueueFullPolicy::Discard)
        {
            m_Current = nullptr; // its buffer is taken again by a later step
            return;
        }
        else
            backoff.Pause();
    }
    Publish(total);
}

void StreamWriter::Publish(size_t size)
{
    StepBuffer::Published made = m_Current->Publish(size);
    StepSlot &slot = m_Ctl.Slot(m_NextPub);
    Store(slot.seq, 2 * m_NextPub + 1);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    slot.step = m_Step - 1;
    slot.segid = made.segid;
    slot.size = made.size; // the whole segment, so readers' attachments park
    Store(slot.seq, 2 * m_NextPub + 2);
    m_Published[m_NextPub] = m_Current;
    m_Queued.insert(m_Current);
    m_Current = nullptr;
    Store(m_Ctl.Header().next_pub, ++m_NextPub);
}

void StreamWriter::Finish(bool drain)
{
    m_Closed = true;
    Store(m_Ctl.Header().state, kEnded);
    if (drain)
    {
        // The steps stay until every reader has read them or gone (CloseTimeoutSecs at most).
        Deadline deadline(m_Params.closeTimeoutSecs);
        Backoff backoff;
        while (Reclaim() > 0 && m_Oldest < m_NextPub)
        {
            if (deadline.Passed())
            {
                std::cerr << "clowder engine: stream '" << m_Name << "': closing with "
                          << (m_NextPub - m_Oldest)
                          << " step(s) unread after CloseTimeoutSecs\n";
                break;
            }
            backoff.Pause();
        }
        // A reader that read every step still uses the control segment until it leaves (its
        // last EndStep, its Close); removing the segment under it is SIGBUS there. A slow
        // reader (an LWK job) is still on its way out when the drain above ends.
        while (LiveReaders() > 0 && !deadline.Passed())
            backoff.Pause();
    }
    m_Published.clear();
    m_Queued.clear();
    m_Current = nullptr;
    m_Buffers.clear(); // segments removed, regions freed: readers keep what they mapped
    m_Control.reset();
}

void StreamWriter::Close()
{
    if (m_Closed)
        return;
    if (m_InStep)
        EndStep();
    Finish(true);
}

} // namespace clowder_adios
