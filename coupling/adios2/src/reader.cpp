#include "reader.h"
#include "select.h"
#include "types.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <unistd.h>

namespace clowder_adios
{

namespace
{
[[noreturn]] void Malformed(const std::string &stream, uint64_t step, const std::string &what)
{
    throw std::runtime_error("clowder engine: stream '" + stream + "': step " +
                             std::to_string(step) + " is malformed: " + what);
}

std::string DimsText(const adios2::Dims &d)
{
    std::string s = "{";
    for (size_t i = 0; i < d.size(); ++i)
        s += (i ? "," : "") + std::to_string(d[i]);
    return s + "}";
}

// n elements of elemSize bytes, or false when that overflows.
bool Bytes(const adios2::Dims &count, size_t elemSize, size_t &out)
{
    size_t n = elemSize;
    for (size_t c : count)
        if (__builtin_mul_overflow(n, c, &n))
            return false;
    out = n;
    return true;
}

size_t ElemSize(const std::string &type)
{
    size_t size = 0;
    DispatchType(type, [&](auto tag) {
        using T = typename decltype(tag)::type;
        size = std::is_same_v<T, std::string> ? 1 : sizeof(T);
    });
    return size;
}
} // namespace

Reader::Reader(adios2::IO io, const std::string &name, adios2::Mode mode)
: PluginEngineInterface(io, name, mode), m_Params(Params::Parse(io.Parameters())),
  m_ControlName(ControlName(m_Params.Stream(io.Name())))
{
    m_Name = m_Params.Stream(io.Name()); // `name` is the plugin's (see Params::streamName)
    if (mode != adios2::Mode::Read)
        throw std::invalid_argument("clowder engine: stream '" + m_Name +
                                    "' is a stream: open it with Mode::Read "
                                    "(random access is not supported)");
    Deadline deadline(m_Params.openTimeoutSecs);
    Backoff backoff;
    while ((m_ControlSegid = LookupSegid(m_ControlName)) < 0)
    {
        if (deadline.Passed())
            throw std::runtime_error("clowder engine: no stream '" + m_Name +
                                     "': no writer made '" + m_ControlName + "' within " +
                                     SecondsText(m_Params.openTimeoutSecs) + " (OpenTimeoutSecs)");
        backoff.Pause();
    }
    // The header says how large the whole control segment is.
    m_ControlApid = GetPermit(m_ControlSegid);
    auto first = m_ControlApid > 0 ? Attachment::Open(m_ControlApid, kPage) : nullptr;
    if (!first)
        throw std::runtime_error("clowder engine: stream '" + m_Name + "' ended while opening");
    ControlView probe(first->Writable(), kPage, m_Name);
    size_t size = ControlSize(probe.QueueSlots(), probe.MaxReaders());
    first.reset();
    m_Control = Attachment::Open(m_ControlApid, size);
    if (!m_Control)
        throw std::runtime_error("clowder engine: stream '" + m_Name + "' ended while opening");
    m_Ctl = ControlView(m_Control->Writable(), size, m_Name);
    m_Presence = std::make_unique<MadeSegment>(kPage, "clowder-adios2-reader");
    m_Presence->MakeAtLeast(kPage);

    for (uint32_t i = 0; i < m_Ctl.MaxReaders() && !m_HaveSlot; ++i)
    {
        ReaderSlot &r = m_Ctl.Reader(i);
        uint64_t none = 0;
        // next_pub first, so the writer never sees our pid with a stale position.
        if (Load(r.pid) == 0)
        {
            m_NextPub = Load(m_Ctl.Header().oldest_pub);
            Store(r.next_pub, m_NextPub);
            Store(r.presence_segid, m_Presence->Segid());
            if (__atomic_compare_exchange_n(&r.pid, &none, static_cast<uint64_t>(getpid()), false,
                                            __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            {
                m_Slot = i;
                m_HaveSlot = true;
            }
        }
    }
    if (!m_HaveSlot)
        throw std::runtime_error("clowder engine: stream '" + m_Name + "' has " +
                                 std::to_string(m_Ctl.MaxReaders()) +
                                 " readers already (the writer's MaxReaders)");
    RegisterReader(m_IO.Name(), this);
}

Reader::~Reader() { Leave(); }

const Attachment *Reader::Attach(int64_t segid, size_t size)
{
    auto it = m_Segments.find(segid);
    if (it != m_Segments.end())
    {
        m_SegmentOrder.erase(std::find(m_SegmentOrder.begin(), m_SegmentOrder.end(), segid));
        m_SegmentOrder.push_back(segid);
        Segment &seg = it->second;
        if (!seg.kept || seg.kept->Size() != size)
        {
            seg.kept.reset();
            seg.kept = Attachment::Open(seg.apid, size);
        }
        return seg.kept.get();
    }
    int64_t apid = GetPermit(segid);
    if (apid < 0)
        return nullptr;
    if (m_SegmentOrder.size() == kMaxSegments)
        ForgetSegment(m_SegmentOrder.front());
    m_Segments.emplace(segid, Segment{apid, nullptr});
    m_SegmentOrder.push_back(segid);
    m_Once = Attachment::Open(apid, size);
    return m_Once.get();
}

void Reader::ForgetSegment(int64_t segid)
{
    auto it = m_Segments.find(segid);
    if (it == m_Segments.end())
        return;
    it->second.kept.reset(); // detached before its permit goes
    ReleasePermit(it->second.apid);
    m_Segments.erase(it);
    m_SegmentOrder.erase(std::find(m_SegmentOrder.begin(), m_SegmentOrder.end(), segid));
}

void Reader::Leave()
{
    UnregisterReader(this);
    m_Current = nullptr;
    m_Once.reset();
    while (!m_SegmentOrder.empty())
        ForgetSegment(m_SegmentOrder.front());
    if (m_HaveSlot)
    {
        Store(m_Ctl.Reader(m_Slot).pid, uint64_t(0));
        m_HaveSlot = false;
    }
    m_Control.reset();
    m_Presence.reset();
    if (m_ControlApid > 0)
        ReleasePermit(m_ControlApid);
    m_ControlApid = -1;
}

bool Reader::WriterGone()
{
    // The broker drops a writer's segments when it exits, however it ends.
    return LookupSegid(m_ControlName) != m_ControlSegid;
}

Reader::Try Reader::TryStep()
{
    StepSlot &slot = m_Ctl.Slot(m_NextPub);
    uint64_t seq = Load(slot.seq);
    uint64_t step = slot.step;
    int64_t segid = slot.segid;
    uint64_t size = slot.size;
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (seq != 2 * m_NextPub + 2 || Load(slot.seq) != seq)
        return Try::Missed; // overwritten: this reader fell behind a queue with no room
    if (size < sizeof(StepHeader) || size > m_Params.maxStepSize)
        Malformed(m_Name, step, "its segment size " + std::to_string(size) + " is out of range");
    try
    {
        m_Current = Attach(segid, size);
    }
    catch (const std::runtime_error &)
    {
        // A writer that died leaves segments the broker can no longer serve (EPROTO).
        if (WriterGone())
            return Try::WriterGone;
        throw;
    }
    if (!m_Current)
    {
        ForgetSegment(segid);
        return Try::Missed; // removed before we came (a late join racing the writer)
    }
    ParseStep(m_Current->Data(), size);
    m_Step = step;
    return Try::Got;
}

void Reader::ParseStep(const uint8_t *base, size_t size)
{
    StepHeader h;
    std::memcpy(&h, base, sizeof h);
    if (std::memcmp(h.magic, kStepMagic, sizeof h.magic) != 0 || h.version != kFormatVersion)
        Malformed(m_Name, h.step, "bad magic or version");
    if (h.total_size > size || h.meta_offset > h.total_size ||
        h.meta_size > h.total_size - h.meta_offset || h.meta_offset % 8 != 0)
        Malformed(m_Name, h.step, "its sizes lie outside the segment");
    m_Vars.clear();
    const uint8_t *p = base + h.meta_offset;
    const uint8_t *end = p + h.meta_size;
    for (uint32_t i = 0; i < h.nvars; ++i)
    {
        VarRecord rec;
        if (size_t(end - p) < sizeof rec)
            Malformed(m_Name, h.step, "variable records run past the metadata");
        std::memcpy(&rec, p, sizeof rec);
        size_t dimsBytes = size_t(rec.ndims) * 3 * sizeof(uint64_t);
        if (rec.record_size % 8 != 0 || rec.record_size > size_t(end - p) ||
            rec.ndims > kMaxDims ||
            sizeof rec + dimsBytes + rec.type_len + size_t(rec.name_len) > rec.record_size ||
            rec.kind > static_cast<uint8_t>(Kind::Value))
            Malformed(m_Name, h.step, "a variable record has bad sizes");
        adios2::Dims dims[3];
        for (int k = 0; k < 3; ++k)
        {
            dims[k].resize(rec.ndims);
            std::memcpy(dims[k].data(), p + sizeof rec + k * rec.ndims * sizeof(uint64_t),
                        rec.ndims * sizeof(uint64_t));
        }
        const char *text = reinterpret_cast<const char *>(p + sizeof rec + dimsBytes);
        std::string type(text, rec.type_len), name(text + rec.type_len, rec.name_len);
        Kind kind = static_cast<Kind>(rec.kind);
        size_t elem = ElemSize(type), want = 0;
        if (elem == 0)
            Malformed(m_Name, h.step, "variable '" + name + "' has unknown type '" + type + "'");
        if (rec.data_offset > h.total_size || rec.data_size > h.total_size - rec.data_offset)
            Malformed(m_Name, h.step, "the data of '" + name + "' lies outside the segment");
        if (type != adios2::GetType<std::string>() &&
            (!Bytes(dims[2], elem, want) || want != rec.data_size ||
             (kind == Kind::Value && rec.ndims != 0) || (kind != Kind::Value && rec.ndims == 0)))
            Malformed(m_Name, h.step, "variable '" + name + "': its count and size disagree");
        if (kind == Kind::GlobalArray)
            for (size_t d = 0; d < rec.ndims; ++d)
                if (dims[1][d] > dims[0][d] || dims[2][d] > dims[0][d] - dims[1][d])
                    Malformed(m_Name, h.step, "a block of '" + name + "' lies outside its shape");
        auto [it, fresh] = m_Vars.try_emplace(name, Var{type, kind, dims[0], {}});
        if (!fresh && (it->second.type != type || it->second.kind != kind ||
                       it->second.shape != dims[0]))
            Malformed(m_Name, h.step, "the blocks of '" + name + "' disagree on type or shape");
        it->second.blocks.push_back(Block{dims[1], dims[2], base + rec.data_offset,
                                          static_cast<size_t>(rec.data_size)});
        p += rec.record_size;
    }
    m_IO.RemoveAllAttributes();
    for (uint32_t i = 0; i < h.nattrs; ++i)
    {
        AttrRecord rec;
        if (size_t(end - p) < sizeof rec)
            Malformed(m_Name, h.step, "attribute records run past the metadata");
        std::memcpy(&rec, p, sizeof rec);
        if (rec.record_size % 8 != 0 || rec.record_size > size_t(end - p) ||
            sizeof rec + rec.type_len + size_t(rec.name_len) + rec.values_size > rec.record_size)
            Malformed(m_Name, h.step, "an attribute record has bad sizes");
        const char *text = reinterpret_cast<const char *>(p + sizeof rec);
        std::string type(text, rec.type_len), name(text + rec.type_len, rec.name_len);
        const uint8_t *values = p + sizeof rec + rec.type_len + rec.name_len;
        bool known = DispatchType(type, [&](auto tag) {
            using T = typename decltype(tag)::type;
            std::vector<T> data;
            if constexpr (std::is_same_v<T, std::complex<float>> ||
                          std::is_same_v<T, std::complex<double>>)
                Malformed(m_Name, h.step, "attribute '" + name + "' is complex");
            else if constexpr (std::is_same_v<T, std::string>)
            {
                size_t at = 0;
                for (uint32_t k = 0; k < rec.nelems; ++k)
                {
                    uint32_t len;
                    if (rec.values_size - at < sizeof len)
                        Malformed(m_Name, h.step, "attribute '" + name + "' is cut short");
                    std::memcpy(&len, values + at, sizeof len);
                    at += sizeof len;
                    if (rec.values_size - at < len)
                        Malformed(m_Name, h.step, "attribute '" + name + "' is cut short");
                    data.emplace_back(reinterpret_cast<const char *>(values + at), len);
                    at += len;
                }
            }
            else
            {
                if (rec.values_size != size_t(rec.nelems) * sizeof(T) || rec.nelems == 0)
                    Malformed(m_Name, h.step, "attribute '" + name + "' has a bad size");
                data.resize(rec.nelems);
                std::memcpy(data.data(), values, rec.values_size);
            }
            if constexpr (!std::is_same_v<T, std::complex<float>> &&
                          !std::is_same_v<T, std::complex<double>>)
            {
                if (rec.is_value && data.size() == 1)
                    m_IO.DefineAttribute<T>(name, data[0], "", "/", true);
                else if (!data.empty())
                    m_IO.DefineAttribute<T>(name, data.data(), data.size(), "", "/", true);
            }
        });
        if (!known)
            Malformed(m_Name, h.step, "attribute '" + name + "' has unknown type '" + type + "'");
        p += rec.record_size;
    }
    DefineStep();
}

void Reader::DefineStep()
{
    // The IO's variables are this step's: others go, and a changed type is defined anew.
    for (const auto &[name, info] : m_IO.AvailableVariables(true))
    {
        auto it = m_Vars.find(name);
        if (it == m_Vars.end() || m_IO.VariableType(name) != it->second.type)
            m_IO.RemoveVariable(name);
    }
    for (const auto &[name, var] : m_Vars)
        DispatchType(var.type, [&](auto tag) {
            using T = typename decltype(tag)::type;
            adios2::Variable<T> v = m_IO.InquireVariable<T>(name);
            const adios2::Dims zeros(var.shape.size(), 0);
            switch (var.kind)
            {
            case Kind::GlobalArray:
                if (!v)
                    m_IO.DefineVariable<T>(name, var.shape, zeros, var.shape);
                else if (v.Shape() != var.shape)
                {
                    v.SetShape(var.shape);
                    v.SetSelection({zeros, var.shape});
                }
                break;
            case Kind::LocalArray:
                if (v)
                    m_IO.RemoveVariable(name);
                m_IO.DefineVariable<T>(name, {}, {}, var.blocks[0].count);
                break;
            case Kind::Value:
                if (!v)
                    m_IO.DefineVariable<T>(name);
                break;
            }
        });
}

adios2::StepStatus Reader::BeginStep(adios2::StepMode, const float timeoutSeconds)
{
    if (!m_Control)
        throw std::logic_error("clowder engine: BeginStep after Close");
    if (m_InStep)
        throw std::logic_error("clowder engine: BeginStep twice without EndStep");
    Deadline deadline(timeoutSeconds);
    Deadline nextWriterCheck(0.1);
    Backoff backoff;
    ReaderSlot &me = m_Ctl.Reader(m_Slot);
    while (true)
    {
        uint64_t oldest = Load(m_Ctl.Header().oldest_pub);
        if (m_NextPub < oldest)
        {
            m_NextPub = oldest; // the steps before went while no reader held them
            Store(me.next_pub, m_NextPub);
        }
        if (m_NextPub < Load(m_Ctl.Header().next_pub))
        {
            switch (TryStep())
            {
            case Try::Got:
                m_InStep = true;
                return adios2::StepStatus::OK;
            case Try::WriterGone:
                return adios2::StepStatus::EndOfStream;
            case Try::Missed:
                break;
            }
            Store(me.next_pub, ++m_NextPub);
            continue;
        }
        if (Load(m_Ctl.Header().state) == kEnded)
            return adios2::StepStatus::EndOfStream;
        if (nextWriterCheck.Passed())
        {
            if (WriterGone())
                return adios2::StepStatus::EndOfStream;
            nextWriterCheck = Deadline(0.1);
        }
        if (deadline.Passed())
            return adios2::StepStatus::NotReady;
        backoff.Pause();
    }
}

void Reader::EndStep()
{
    if (!m_InStep)
        throw std::logic_error("clowder engine: EndStep without BeginStep");
    m_InStep = false;
    m_Current = nullptr;
    m_Once.reset();
    Store(m_Ctl.Reader(m_Slot).next_pub, ++m_NextPub);
}

template <class T>
void Reader::Get(adios2::Variable<T> &variable, T *values)
{
    if (!m_InStep)
        throw std::logic_error("clowder engine: Get of '" + variable.Name() +
                               "' outside BeginStep/EndStep");
    const std::string name = variable.Name();
    auto it = m_Vars.find(name);
    if (it == m_Vars.end())
        throw std::invalid_argument("clowder engine: variable '" + name + "' is not in step " +
                                    std::to_string(m_Step));
    const Var &var = it->second;
    if (var.type != adios2::GetType<T>())
        throw std::invalid_argument("clowder engine: variable '" + name + "' is " + var.type +
                                    ", not " + adios2::GetType<T>());
    if constexpr (std::is_same_v<T, std::string>)
    {
        values->assign(reinterpret_cast<const char *>(var.blocks[0].data), var.blocks[0].size);
    }
    else
    {
        switch (var.kind)
        {
        case Kind::Value:
            std::memcpy(values, var.blocks[0].data, sizeof(T));
            break;
        case Kind::LocalArray:
        {
            size_t id = variable.BlockID();
            if (id >= var.blocks.size())
                throw std::invalid_argument("clowder engine: variable '" + name + "' has " +
                                            std::to_string(var.blocks.size()) +
                                            " block(s), not block " + std::to_string(id));
            std::memcpy(values, var.blocks[id].data, var.blocks[id].size);
            break;
        }
        case Kind::GlobalArray:
        {
            adios2::Dims start = variable.Start(), count = variable.Count();
            bool inside = start.size() == var.shape.size() && count.size() == var.shape.size();
            for (size_t d = 0; inside && d < start.size(); ++d)
                inside = start[d] <= var.shape[d] && count[d] <= var.shape[d] - start[d];
            if (!inside)
                throw std::invalid_argument("clowder engine: selection start " + DimsText(start) +
                                            " count " + DimsText(count) + " of '" + name +
                                            "' lies outside its shape " + DimsText(var.shape));
            for (const Block &b : var.blocks)
                CopyIntersection(b.data, b.start, b.count, reinterpret_cast<uint8_t *>(values),
                                 start, count, sizeof(T));
            break;
        }
        }
    }
}

// Deferred gets are done at once: the step's memory is attached, so there is nothing to
// gather later, and the data is in place before PerformGets/EndStep as deferred mode requires.
#define declare(T)                                                                                 \
    void Reader::DoGetSync(adios2::Variable<T> variable, T *values) { Get(variable, values); }     \
    void Reader::DoGetDeferred(adios2::Variable<T> variable, T *values) { Get(variable, values); }
ADIOS2_FOREACH_STDTYPE_1ARG(declare)
#undef declare

void Reader::DoClose(const int) { Leave(); }

} // namespace clowder_adios
