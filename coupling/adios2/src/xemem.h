// RAII over libxpmem for the engine: memory this process makes into a segment, and an
// attachment of another process's segment. Failures throw std::runtime_error naming the call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace clowder_adios
{

// Memory a writer builds a step in and publishes as a segment: a snapshot region (host) or a
// segment of its own (the LWK, which has no snapshots).
class StepBuffer
{
public:
    virtual ~StepBuffer() = default;
    virtual uint8_t *Data() const = 0;
    virtual size_t Capacity() const = 0;
    // Publishes what the first `size` bytes hold now; the segid and the bytes readers attach.
    struct Published
    {
        int64_t segid;
        size_t size;
    };
    virtual Published Publish(size_t size) = 0;
    // Readers are done with the publication: a snapshot is released (a segment stays, to be
    // published again under the same segid).
    virtual void Withdraw() = 0;
    // Whether the next step may be written while readers still read the last one published.
    virtual bool WritableWhilePublished() const = 0;
};

// A memfd of up to `capacity` bytes mapped shared (sparse: only written pages take memory);
// private anonymous memory where there is no memfd (the LWK).
// Memory we map from our own memfd is handed to attachers as it is (libxpmem converts only
// private memory), so publishing costs no copy. The writer reuses these buffers step after
// step under the same segid: its pages stay mapped, and readers' attachments of the same
// runs are handed back by libxpmem without faulting each page in again ("parked").
class MadeSegment : public StepBuffer
{
public:
    MadeSegment(size_t capacity, const char *what);
    ~MadeSegment() override;
    MadeSegment(const MadeSegment &) = delete;
    MadeSegment &operator=(const MadeSegment &) = delete;

    uint8_t *Data() const override { return m_Base; }
    size_t Capacity() const override { return m_Capacity; }
    Published Publish(size_t size) override
    {
        MakeAtLeast(size);
        return {m_Segid, m_MadeSize};
    }
    void Withdraw() override {}
    bool WritableWhilePublished() const override { return false; }
    int64_t Segid() const { return m_Segid; }
    size_t MadeSize() const { return m_MadeSize; }
    // Makes the first `size` bytes (rounded to pages) a segment, named when `name` is given
    // (xemem_make: mode 0666), else xpmem_make with mode 0666; a segment made before that is
    // large enough stays, a smaller one is replaced.
    void MakeAtLeast(size_t size, const std::string *name = nullptr);

private:
    int m_Fd = -1;
    uint8_t *m_Base = nullptr;
    size_t m_Capacity = 0;
    size_t m_MadeSize = 0;
    int64_t m_Segid = -1;
};

// A region (xemem_region_alloc) published as copy-on-write snapshots (xemem_snapshot_make):
// readers of a snapshot keep that version while the writer writes the next step in place,
// its stores going to copies of the pages it touches. Each snapshot is a new segment of the
// whole region; one is out at a time.
class SnapshotRegion : public StepBuffer
{
public:
    // nullptr where there are no regions (the device backend: ENOTSUP).
    static std::unique_ptr<SnapshotRegion> Alloc(size_t capacity);
    ~SnapshotRegion() override; // frees the region: readers keep the pages they mapped
    SnapshotRegion(const SnapshotRegion &) = delete;
    SnapshotRegion &operator=(const SnapshotRegion &) = delete;

    uint8_t *Data() const override { return m_Base; }
    size_t Capacity() const override { return m_Capacity; }
    Published Publish(size_t size) override;
    void Withdraw() override;
    bool WritableWhilePublished() const override { return true; }

private:
    SnapshotRegion(uint8_t *base, size_t capacity) : m_Base(base), m_Capacity(capacity) {}
    uint8_t *m_Base;
    size_t m_Capacity;
    int64_t m_Snapshot = -1;
};

// A permit (xpmem_get) for segid, or -1 when the segment is gone (ENOENT); 0666 segments are
// got read-write, which XPMEM's attach requires.
int64_t GetPermit(int64_t segid);
void ReleasePermit(int64_t apid);

// xpmem_attach of a whole segment through a permit the caller keeps; detached on destruction.
class Attachment
{
public:
    // nullptr when the segment is gone (ENOENT: removed, or its owner exited).
    static std::unique_ptr<Attachment> Open(int64_t apid, size_t size);
    ~Attachment();
    Attachment(const Attachment &) = delete;
    Attachment &operator=(const Attachment &) = delete;

    const uint8_t *Data() const { return m_Base; }
    uint8_t *Writable() const { return m_Base; }
    size_t Size() const { return m_Size; }

private:
    Attachment(uint8_t *base, size_t size) : m_Base(base), m_Size(size) {}
    uint8_t *m_Base;
    size_t m_Size;
};

// The segid made under `name`, or -1 when there is none (yet).
int64_t LookupSegid(const std::string &name);

} // namespace clowder_adios
