// The writing side of the clowder engine: each step's blocks are copied once, at Put, into a
// fresh shared memfd that EndStep publishes as one XEMEM segment (header, data, metadata);
// the stream's named control segment lists the published steps and the readers.
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

class Writer : public adios2::plugin::PluginEngineInterface
{
public:
    Writer(adios2::IO io, const std::string &name, adios2::Mode mode);
    ~Writer() override;

    adios2::StepStatus BeginStep(adios2::StepMode mode, const float timeoutSeconds) override;
    void EndStep() override;
    size_t CurrentStep() const override { return m_Step; }
    void DoClose(const int transportIndex) override;

#define declare(T)                                                                                 \
    void DoPutSync(adios2::Variable<T> variable, const T *values) override;                        \
    void DoPutDeferred(adios2::Variable<T> variable, const T *values) override;
    ADIOS2_FOREACH_STDTYPE_1ARG(declare)
#undef declare

private:
    template <class T>
    void Put(adios2::Variable<T> &variable, const T *values);
    void AddBlock(const std::string &name, const std::string &type, Kind kind,
                  const adios2::Dims &shape, const adios2::Dims &start,
                  const adios2::Dims &count, const void *data, size_t bytes);
    void AddAttributes();
    // Removes publications every live reader has passed; returns the number of live readers.
    uint32_t Reclaim();
    uint32_t LiveReaders();
    bool QueueFull() const;
    void Publish(std::unique_ptr<MadeSegment> step, size_t size);
    void Finish(bool drain);

    Params m_Params;
    std::string m_ControlName;
    std::unique_ptr<MadeSegment> m_Control;
    ControlView m_Ctl;
    std::map<uint64_t, std::unique_ptr<MadeSegment>> m_Published; // by publication number
    std::vector<std::unique_ptr<MadeSegment>> m_Pool; // buffers no reader can still read
    static constexpr size_t kPoolMax = 2;
    Deadline m_NextPresenceCheck{0};
    uint64_t m_NextPub = 0;
    uint64_t m_Oldest = 0;

    std::unique_ptr<MadeSegment> m_Current; // the step being written
    size_t m_Used = 0;                      // bytes of m_Current taken by data
    std::vector<uint8_t> m_Meta;
    uint32_t m_NVars = 0;
    uint32_t m_NAttrs = 0;
    size_t m_Step = 0;
    bool m_InStep = false;
    bool m_Closed = false;
};

} // namespace clowder_adios
