#include "control.h"

#include <cstring>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <xpmem.h>

namespace clowder_adios
{

ControlView::ControlView(uint8_t *base, size_t size, const std::string &stream) : m_Base(base)
{
    if (size < sizeof(ControlHeader))
        throw std::runtime_error("clowder engine: stream '" + stream +
                                 "': control segment too small");
    const ControlHeader &h = Header();
    if (std::memcmp(h.magic, kControlMagic, sizeof h.magic) != 0)
        throw std::runtime_error("clowder engine: '" + ControlName(stream) +
                                 "' is not a clowder ADIOS2 stream");
    if (h.version != kFormatVersion)
        throw std::runtime_error("clowder engine: stream '" + stream + "' has format version " +
                                 std::to_string(h.version) + ", this engine reads " +
                                 std::to_string(kFormatVersion));
    uint32_t q = h.queue_slots, r = h.max_readers;
    if (q == 0 || q > 4096 || r == 0 || r > 4096 || ControlSize(q, r) > size)
        throw std::runtime_error("clowder engine: stream '" + stream +
                                 "': control segment has bad sizes");
    m_QueueSlots = q;
    m_MaxReaders = r;
}

void Backoff::Pause()
{
    if (m_Rounds < 50)
    {
        ++m_Rounds;
        std::this_thread::yield();
        return;
    }
    unsigned us = 20u << std::min(m_Rounds++ - 50, 6u); // 20 us .. 1.28 ms
    std::this_thread::sleep_for(std::chrono::microseconds(std::min(us, 1000u)));
}

Deadline::Deadline(double seconds)
: m_Forever(seconds < 0),
  m_At(std::chrono::steady_clock::now() +
       std::chrono::duration_cast<std::chrono::steady_clock::duration>(
           std::chrono::duration<double>(m_Forever ? 0 : seconds)))
{
}

bool Deadline::Passed() const { return !m_Forever && std::chrono::steady_clock::now() >= m_At; }

std::string SecondsText(double seconds)
{
    std::ostringstream out;
    out << seconds << " s";
    return out.str();
}

std::string ControlName(const std::string &stream)
{
    std::string name = kNamePrefix + stream;
    if (stream.empty() || name.size() > XEMEM_NAME_MAX)
        throw std::invalid_argument("clowder engine: stream name '" + stream +
                                    "' must have 1.." +
                                    std::to_string(XEMEM_NAME_MAX - std::strlen(kNamePrefix)) +
                                    " characters");
    for (unsigned char c : stream)
        if (c <= ' ' || c > '~')
            throw std::invalid_argument("clowder engine: stream name '" + stream +
                                        "' must be printable ASCII without spaces");
    return name;
}

} // namespace clowder_adios
