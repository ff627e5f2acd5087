// The reading side of the clowder engine: BeginStep finds the next published step in the
// stream's control segment, attaches its segment (no copy) and checks its metadata; Get
// copies the selection straight from the attached memory into the caller's buffer, and
// BlockData hands out a pointer into it (include/clowder_adios2_read.h).
#pragma once

#include "clowder_adios2_read.h"
#include "control.h"
#include "params.h"
#include "xemem.h"

#include <adios2/plugin/PluginEngineInterface.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace clowder_adios
{

class Reader : public adios2::plugin::PluginEngineInterface
{
public:
    Reader(adios2::IO io, const std::string &name, adios2::Mode mode);
    ~Reader() override;

    adios2::StepStatus BeginStep(adios2::StepMode mode, const float timeoutSeconds) override;
    void EndStep() override;
    size_t CurrentStep() const override { return m_Step; }
    void DoClose(const int transportIndex) override;

    // The blocks of `varName` in the current step for Engine::BlocksInfo (Start, Count,
    // BlockID; Min and Max are not computed: 0). The step asked is not looked at, as ADIOS2's
    // streaming engines do (Python's blocks_info asks for 0); none outside a step; nullptr for
    // strings (ADIOS2 wants a C string there), which ADIOS2 reports as unsupported.
    adios2::MinVarInfo *MinBlocksInfo(const std::string &varName,
                                      const size_t /*step*/) const override;
    // Block `block` of variable `name` in the current step, in place (clowder_adios2_block);
    // type: the ADIOS2 type name the caller expects, or nullptr for any. Throws on misuse.
    void BlockData(const std::string &name, const char *type, size_t block,
                   clowder_adios2_block &out) const;

#define declare(T)                                                                                 \
    void DoGetSync(adios2::Variable<T> variable, T *values) override;                              \
    void DoGetDeferred(adios2::Variable<T> variable, T *values) override;
    ADIOS2_FOREACH_STDTYPE_1ARG(declare)
#undef declare

private:
    struct Block
    {
        adios2::Dims start, count;
        const uint8_t *data;
        size_t size;
    };
    struct Var
    {
        std::string type;
        Kind kind;
        adios2::Dims shape;
        std::vector<Block> blocks;
    };

    enum class Try
    {
        Got,        // publication m_NextPub is attached and its metadata read
        Missed,     // it is gone (overwritten or removed): the next one may be there
        WriterGone, // its writer exited before we attached it
    };
    Try TryStep();
    void ParseStep(const uint8_t *base, size_t size);
    void DefineStep();
    bool WriterGone();
    // The step segment segid attached (size bytes), nullptr when it is gone. Its permit is
    // kept, and so is the attachment once the segid comes back (the writer reuses its
    // buffers under the same segids): a reused buffer then costs no attach and no detach
    // (together ~2-4 ms a 64 MiB step, libxpmem moving the mapping to park it and back). A
    // segid seen once (a snapshot step, a first use) is detached at EndStep instead, so old
    // snapshots are not held.
    const Attachment *Attach(int64_t segid, size_t size);
    void ForgetSegment(int64_t segid);
    template <class T>
    void Get(adios2::Variable<T> &variable, T *values);
    void Leave();

    Params m_Params;
    std::string m_ControlName;
    int64_t m_ControlSegid = -1;
    int64_t m_ControlApid = -1;
    std::unique_ptr<Attachment> m_Control;
    std::unique_ptr<MadeSegment> m_Presence; // see ReaderSlot::presence_segid
    ControlView m_Ctl;
    uint32_t m_Slot = 0;
    bool m_HaveSlot = false;
    uint64_t m_NextPub = 0;
    struct Segment
    {
        int64_t apid;
        std::unique_ptr<Attachment> kept; // once the segid came back
    };
    std::map<int64_t, Segment> m_Segments; // segid ->
    std::vector<int64_t> m_SegmentOrder;   // segids, least recently used first
    static constexpr size_t kMaxSegments = 16;
    std::unique_ptr<Attachment> m_Once; // the current step's segment when seen the first time
    const Attachment *m_Current = nullptr;
    std::map<std::string, Var> m_Vars;
    size_t m_Step = 0;
    bool m_InStep = false;
};

// The open readers by their IO's name, for clowder_adios2_block_data (zero_copy.cpp).
void RegisterReader(const std::string &ioName, Reader *reader);
void UnregisterReader(Reader *reader);

} // namespace clowder_adios
