// What the engine's C APIs (include/clowder_adios2.h, include/clowder_adios2_read.h) share:
// a C call never lets an exception out; it returns -1 and keeps the message for the caller.
#pragma once

#include <stdexcept>
#include <string>

namespace clowder_adios
{

// Runs fn: 0, or -1 with the exception's message in lastError.
template <class Fn>
int Guard(std::string &lastError, Fn &&fn)
{
    try
    {
        fn();
        return 0;
    }
    catch (const std::exception &e)
    {
        lastError = e.what();
        return -1;
    }
}

} // namespace clowder_adios
