#include "params.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

namespace clowder_adios
{

namespace
{
std::string Lower(std::string s)
{
    std::transform(s.begin(), s.end(), s.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return s;
}

[[noreturn]] void Bad(const std::string &key, const std::string &value, const char *want)
{
    throw std::invalid_argument("clowder engine: parameter " + key + "=\"" + value +
                                "\" is not " + want);
}

uint64_t Unsigned(const std::string &key, const std::string &value, uint64_t lo, uint64_t hi)
{
    errno = 0;
    char *end = nullptr;
    unsigned long long v = std::strtoull(value.c_str(), &end, 10);
    if (value.empty() || value[0] == '-' || *end != '\0' || errno != 0 || v < lo || v > hi)
        Bad(key, value,
            ("an integer in " + std::to_string(lo) + ".." + std::to_string(hi)).c_str());
    return v;
}

double Seconds(const std::string &key, const std::string &value)
{
    char *end = nullptr;
    double v = std::strtod(value.c_str(), &end);
    if (value.empty() || *end != '\0' || !std::isfinite(v) || v < 0 || v > 1e6)
        Bad(key, value, "a number of seconds in 0..1e6");
    return v;
}
} // namespace

Params Params::Parse(const adios2::Params &io)
{
    Params p;
    for (const auto &[rawKey, value] : io)
    {
        std::string key = Lower(rawKey);
        if (key == "pluginname" || key == "pluginlibrary")
            continue;
        if (key == "queuelimit")
            p.queueLimit = static_cast<uint32_t>(Unsigned(rawKey, value, 1, 4096));
        else if (key == "queuefullpolicy")
        {
            std::string v = Lower(value);
            if (v == "block")
                p.policy = QueueFullPolicy::Block;
            else if (v == "discard")
                p.policy = QueueFullPolicy::Discard;
            else
                Bad(rawKey, value, "Block or Discard");
        }
        else if (key == "rendezvousreadercount")
            p.rendezvousReaderCount = static_cast<uint32_t>(Unsigned(rawKey, value, 0, 4096));
        else if (key == "maxreaders")
            p.maxReaders = static_cast<uint32_t>(Unsigned(rawKey, value, 1, 4096));
        else if (key == "opentimeoutsecs")
            p.openTimeoutSecs = Seconds(rawKey, value);
        else if (key == "closetimeoutsecs")
            p.closeTimeoutSecs = Seconds(rawKey, value);
        else if (key == "streamname")
            p.streamName = value;
        else if (key == "stepsnapshots")
        {
            std::string v = Lower(value);
            if (v != "true" && v != "false")
                Bad(rawKey, value, "true or false");
            p.stepSnapshots = v == "true";
        }
        else if (key == "maxstepsize")
            p.maxStepSize = Unsigned(rawKey, value, 4096, uint64_t(1) << 46);
        else
            throw std::invalid_argument("clowder engine: unknown parameter " + rawKey +
                                        " (known: QueueLimit, QueueFullPolicy, "
                                        "RendezvousReaderCount, MaxReaders, OpenTimeoutSecs, "
                                        "CloseTimeoutSecs, MaxStepSize, StepSnapshots, StreamName)");
    }
    if (p.rendezvousReaderCount > p.maxReaders)
        throw std::invalid_argument("clowder engine: RendezvousReaderCount " +
                                    std::to_string(p.rendezvousReaderCount) +
                                    " exceeds MaxReaders " + std::to_string(p.maxReaders));
    return p;
}

} // namespace clowder_adios
