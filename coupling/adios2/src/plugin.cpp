// The entry points ADIOS2's plugin engine looks up in PluginLibrary (interface version 2).
#include "reader.h"
#include "writer.h"

static_assert(ADIOS2_PLUGIN_ENGINE_INTERFACE == 2, "built for ADIOS2's plugin interface v2");

extern "C" {

adios2::plugin::PluginEngineInterface *EngineCreate(adios2::IO io, const std::string &name,
                                                    const adios2::Mode mode)
{
    if (mode == adios2::Mode::Read || mode == adios2::Mode::ReadRandomAccess)
        return new clowder_adios::Reader(io, name, mode);
    return new clowder_adios::Writer(io, name, mode);
}

void EngineDestroy(adios2::plugin::PluginEngineInterface *engine) { delete engine; }
}
