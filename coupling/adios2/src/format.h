// The on-segment format of a clowder ADIOS2 stream (docs/adios2.md describes it in prose).
// A stream is one named control segment plus one segment per published step. Every field a
// reader takes from a segment is checked before use: the writer is a peer, not trusted.
#pragma once

#include <cstddef>
#include <cstdint>

namespace clowder_adios
{

constexpr uint32_t kFormatVersion = 1;
constexpr char kControlMagic[8] = {'C', 'L', 'W', 'D', 'A', 'C', 'T', 'L'};
constexpr char kStepMagic[8] = {'C', 'L', 'W', 'D', 'A', 'S', 'T', 'P'};
constexpr size_t kPage = 4096;
// The control segment's XEMEM name is this prefix + the stream name.
constexpr const char *kNamePrefix = "adios2:";

// Control segment: ControlHeader, then queue_slots StepSlots, then max_readers ReaderSlots.
// The fields the other side changes are read and written with atomics.
struct ControlHeader
{
    char magic[8];
    uint32_t version;
    uint32_t queue_slots;
    uint32_t max_readers;
    uint32_t reserved0;
    uint64_t writer_pid;
    uint64_t state;      // kOpen, then kEnded once the writer closes
    uint64_t next_pub;   // publications 0..next_pub-1 have been made
    uint64_t oldest_pub; // publications below this are gone (removed)
    uint64_t reserved[9];
};
constexpr uint64_t kOpen = 0;
constexpr uint64_t kEnded = 1;

// Publication p lives in slot p % queue_slots; seq is 2p+2 once it is valid, odd while the
// writer changes the slot (a seqlock), 0 when never used.
struct StepSlot
{
    uint64_t seq;
    uint64_t step; // the writer's step number (discarded steps leave gaps)
    int64_t segid;
    uint64_t size;
};

// A reader owns a slot while pid != 0 (its process id where it runs: a token, not looked up);
// next_pub is the first publication it may still read: the writer removes no publication at
// or above it. presence_segid is a one-page segment the reader made: XEMEM forgets it when
// the reader's process ends, however it ends and in whichever enclave it ran, so it tells
// the writer that the reader is gone (a pid means nothing across enclaves).
struct ReaderSlot
{
    uint64_t pid;
    uint64_t next_pub;
    int64_t presence_segid;
    uint64_t reserved;
};

inline size_t ControlSize(uint32_t queueSlots, uint32_t maxReaders)
{
    size_t bytes = sizeof(ControlHeader) + queueSlots * sizeof(StepSlot) +
                   maxReaders * sizeof(ReaderSlot);
    return (bytes + kPage - 1) / kPage * kPage;
}

// Step segment: StepHeader at 0, the blocks' data from kPage on (each 64-byte aligned), then
// the metadata: nvars VarRecords and nattrs AttrRecords, each 8-byte aligned.
struct StepHeader
{
    char magic[8];
    uint32_t version;
    uint32_t nvars;
    uint32_t nattrs;
    uint32_t reserved0;
    uint64_t step;
    uint64_t total_size;
    uint64_t meta_offset;
    uint64_t meta_size;
};

enum class Kind : uint8_t
{
    GlobalArray = 0,
    LocalArray = 1,
    Value = 2, // a global value; strings too
};

// Followed by 3 * ndims uint64 (shape, start, count; shape is empty for local arrays), the type
// name (adios2::GetType<T>()) and the variable's name, padded to 8 bytes.
struct VarRecord
{
    uint32_t record_size;
    uint8_t kind;
    uint8_t ndims;
    uint8_t type_len;
    uint8_t reserved0;
    uint32_t name_len;
    uint32_t reserved1;
    uint64_t data_offset; // from the start of the segment
    uint64_t data_size;
};

// Followed by the type name, the attribute's name and its nelems values: for strings each as
// a uint32 length and its bytes; padded to 8 bytes.
struct AttrRecord
{
    uint32_t record_size;
    uint8_t type_len;
    uint8_t is_value;
    uint16_t reserved0;
    uint32_t name_len;
    uint32_t nelems;
    uint64_t values_size;
};

// The layout is the format: other implementations (a C writer, tests/forged_writer.py) write
// these sizes and offsets.
static_assert(sizeof(ControlHeader) == 128 && sizeof(StepSlot) == 32 && sizeof(ReaderSlot) == 32);
static_assert(sizeof(StepHeader) == 56 && sizeof(VarRecord) == 32 && sizeof(AttrRecord) == 24);

constexpr size_t kMaxDims = 32;
constexpr size_t kDataAlign = 64;

} // namespace clowder_adios
