// The reading side of the clowder engine: BeginStep finds the next published step in the
// stream's control segment, attaches its segment (no copy) and checks its metadata; Get
// copies the selection straight from the attached memory into the caller's buffer.
#pragma once

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
    // A permit for a step segment, kept: the writer reuses its buffers under the same segids,
    // and an attachment through the same permit comes back without page faults.
    int64_t Permit(int64_t segid);
    void ForgetPermit(int64_t segid);
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
    std::unique_ptr<Attachment> m_Current;
    std::map<int64_t, int64_t> m_Permits; // segid -> apid
    std::vector<int64_t> m_PermitOrder;   // segids, oldest first
    static constexpr size_t kMaxPermits = 16;
    std::map<std::string, Var> m_Vars;
    size_t m_Step = 0;
    bool m_InStep = false;
};

} // namespace clowder_adios
