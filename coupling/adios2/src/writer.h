// The writing side of the clowder engine: ADIOS2's Puts and attributes handed to a
// StreamWriter (stream_writer.h), which copies each block once into the step's shared buffer
// and publishes the step as one XEMEM segment at EndStep.
#pragma once

#include "stream_writer.h"

#include <adios2/plugin/PluginEngineInterface.h>

#include <memory>
#include <string>

namespace clowder_adios
{

class Writer : public adios2::plugin::PluginEngineInterface
{
public:
    Writer(adios2::IO io, const std::string &name, adios2::Mode mode);

    adios2::StepStatus BeginStep(adios2::StepMode mode, const float timeoutSeconds) override;
    void EndStep() override;
    size_t CurrentStep() const override { return m_Stream->Step(); }
    void DoClose(const int transportIndex) override;

#define declare(T)                                                                                 \
    void DoPutSync(adios2::Variable<T> variable, const T *values) override;                        \
    void DoPutDeferred(adios2::Variable<T> variable, const T *values) override;
    ADIOS2_FOREACH_STDTYPE_1ARG(declare)
#undef declare

private:
    template <class T>
    void Put(adios2::Variable<T> &variable, const T *values);
    void AddAttributes();

    std::unique_ptr<StreamWriter> m_Stream;
};

} // namespace clowder_adios
