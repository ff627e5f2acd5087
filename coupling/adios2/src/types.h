// Dispatch from an ADIOS2 type name (adios2::GetType<T>(), as stored on the segment) to code
// templated on the type.
#pragma once

#include <adios2/common/ADIOSMacros.h>
#include <adios2/cxx/Types.h>

#include <complex>
#include <string>

namespace clowder_adios
{

template <class T>
struct TypeTag
{
    using type = T;
};

// Calls fn(TypeTag<T>{}) for the type named `name`; false when no type has that name.
template <class Fn>
bool DispatchType(const std::string &name, Fn &&fn)
{
#define clowder_dispatch(T)                                                                        \
    if (name == adios2::GetType<T>())                                                              \
    {                                                                                              \
        fn(TypeTag<T>{});                                                                          \
        return true;                                                                               \
    }
    ADIOS2_FOREACH_STDTYPE_1ARG(clowder_dispatch)
#undef clowder_dispatch
    return false;
}

} // namespace clowder_adios
