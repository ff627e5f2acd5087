// The control segment seen through its layout (format.h), with the atomics both sides use,
// and the waiting helpers. The counts that size it are copied once and checked, so a segment
// changed under us cannot move an index out of bounds.
#pragma once

#include "format.h"

#include <adios2/common/ADIOSTypes.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace clowder_adios
{

// Sequentially consistent: a reader stores its position then loads oldest_pub, the writer
// stores oldest_pub then loads the positions, and one of them must see the other's store
// (Writer::Reclaim relies on it).
template <class T>
T Load(const T &field)
{
    return __atomic_load_n(&field, __ATOMIC_SEQ_CST);
}

template <class T>
void Store(T &field, T value)
{
    __atomic_store_n(&field, value, __ATOMIC_SEQ_CST);
}

class ControlView
{
public:
    ControlView() = default;
    // Checks magic, version and that the counts fit in `size` bytes; throws otherwise.
    ControlView(uint8_t *base, size_t size, const std::string &stream);

    ControlHeader &Header() const { return *reinterpret_cast<ControlHeader *>(m_Base); }
    StepSlot &Slot(uint64_t pub) const
    {
        return reinterpret_cast<StepSlot *>(m_Base + sizeof(ControlHeader))[pub % m_QueueSlots];
    }
    ReaderSlot &Reader(uint32_t i) const
    {
        return reinterpret_cast<ReaderSlot *>(m_Base + sizeof(ControlHeader) +
                                              m_QueueSlots * sizeof(StepSlot))[i];
    }
    uint32_t QueueSlots() const { return m_QueueSlots; }
    uint32_t MaxReaders() const { return m_MaxReaders; }

private:
    uint8_t *m_Base = nullptr;
    uint32_t m_QueueSlots = 1;
    uint32_t m_MaxReaders = 0;
};

// Polling with a growing pause: quick answers for a step that is about to come, and a
// near-idle core while a reader waits for a slow writer (1 ms at most between looks).
class Backoff
{
public:
    void Pause();

private:
    unsigned m_Rounds = 0;
};

// A deadline `seconds` from now; negative seconds never pass.
class Deadline
{
public:
    explicit Deadline(double seconds);
    bool Passed() const;

private:
    bool m_Forever;
    std::chrono::steady_clock::time_point m_At;
};

// "1.5 s": seconds as people write them, for messages.
std::string SecondsText(double seconds);

// The control segment's XEMEM name for a stream; throws when it cannot be one.
std::string ControlName(const std::string &stream);

} // namespace clowder_adios
