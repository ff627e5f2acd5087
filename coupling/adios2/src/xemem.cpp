#include "xemem.h"
#include "format.h"

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include <sys/mman.h>
#include <unistd.h>

#include <xpmem.h>

namespace clowder_adios
{

namespace
{
[[noreturn]] void Fail(const std::string &what, int err)
{
    throw std::runtime_error("clowder engine: " + what + ": " + std::strerror(err));
}

size_t RoundToPage(size_t n) { return (n + kPage - 1) / kPage * kPage; }
} // namespace

MadeSegment::MadeSegment(size_t capacity, const char *what) : m_Capacity(RoundToPage(capacity))
{
    m_Fd = memfd_create(what, MFD_CLOEXEC);
    if (m_Fd < 0 && errno == ENOSYS)
    {
        // The LWK has no memfd; its /dev/xpmem shares a job's private memory as it is.
        void *p = mmap(nullptr, m_Capacity, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED)
            Fail("mapping " + std::to_string(m_Capacity) + " bytes for " + what +
                     " (MaxStepSize bounds a step buffer)",
                 errno);
        m_Base = static_cast<uint8_t *>(p);
        return;
    }
    if (m_Fd < 0)
        Fail("memfd_create", errno);
    if (ftruncate(m_Fd, static_cast<off_t>(m_Capacity)) != 0)
    {
        int err = errno;
        close(m_Fd);
        Fail("sizing a step buffer of " + std::to_string(m_Capacity) + " bytes", err);
    }
    void *p = mmap(nullptr, m_Capacity, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE,
                   m_Fd, 0);
    if (p == MAP_FAILED)
    {
        int err = errno;
        close(m_Fd);
        Fail("mapping a step buffer of " + std::to_string(m_Capacity) + " bytes", err);
    }
    m_Base = static_cast<uint8_t *>(p);
}

MadeSegment::~MadeSegment()
{
    if (m_Segid > 0)
        xpmem_remove(m_Segid);
    if (m_Base)
        munmap(m_Base, m_Capacity);
    if (m_Fd >= 0)
        close(m_Fd);
}

void MadeSegment::MakeAtLeast(size_t size, const std::string *name)
{
    size_t want = RoundToPage(size);
    if (m_Segid > 0 && m_MadeSize >= want)
        return;
    if (m_Segid > 0)
    {
        xpmem_remove(m_Segid);
        m_Segid = -1;
    }
    m_Segid = name ? xemem_make(m_Base, want, name->c_str())
                   : xpmem_make(m_Base, want, XPMEM_PERMIT_MODE, reinterpret_cast<void *>(0666));
    if (m_Segid <= 0)
    {
        int err = errno;
        m_Segid = -1;
        Fail(name ? "xemem_make of '" + *name + "'" : std::string("xpmem_make of a step"), err);
    }
    m_MadeSize = want;
}

std::unique_ptr<SnapshotRegion> SnapshotRegion::Alloc(size_t capacity)
{
    size_t size = RoundToPage(capacity);
    void *p = xemem_region_alloc(size);
    if (p == reinterpret_cast<void *>(-1))
    {
        if (errno == ENOTSUP)
            return nullptr;
        Fail("xemem_region_alloc of a step buffer of " + std::to_string(size) +
                 " bytes (MaxStepSize bounds it)",
             errno);
    }
    return std::unique_ptr<SnapshotRegion>(new SnapshotRegion(static_cast<uint8_t *>(p), size));
}

SnapshotRegion::~SnapshotRegion() { xemem_region_free(m_Base); }

StepBuffer::Published SnapshotRegion::Publish(size_t)
{
    Withdraw();
    m_Snapshot = xemem_snapshot_make(m_Base, XPMEM_PERMIT_MODE, reinterpret_cast<void *>(0666),
                                     nullptr);
    if (m_Snapshot <= 0)
    {
        m_Snapshot = -1;
        Fail("xemem_snapshot_make of a step", errno);
    }
    return {m_Snapshot, m_Capacity};
}

void SnapshotRegion::Withdraw()
{
    if (m_Snapshot > 0)
        xemem_snapshot_release(m_Snapshot);
    m_Snapshot = -1;
}

int64_t GetPermit(int64_t segid)
{
    xpmem_apid_t apid = xpmem_get(segid, XPMEM_RDWR, XPMEM_PERMIT_MODE, nullptr);
    if (apid > 0)
        return apid;
    if (errno == ENOENT)
        return -1;
    Fail("xpmem_get of segment " + std::to_string(segid), errno);
}

void ReleasePermit(int64_t apid) { xpmem_release(apid); }

std::unique_ptr<Attachment> Attachment::Open(int64_t apid, size_t size)
{
    void *p = xpmem_attach(xpmem_addr{apid, 0}, size, nullptr);
    if (p == reinterpret_cast<void *>(-1))
    {
        if (errno == ENOENT)
            return nullptr;
        Fail("xpmem_attach of permit " + std::to_string(apid), errno);
    }
    return std::unique_ptr<Attachment>(new Attachment(static_cast<uint8_t *>(p), size));
}

Attachment::~Attachment() { xpmem_detach(m_Base); }

int64_t LookupSegid(const std::string &name)
{
    xpmem_segid_t segid = xemem_lookup_segid(name.c_str());
    if (segid > 0)
        return segid;
    if (errno != ENOENT)
        Fail("xemem_lookup_segid of '" + name + "'", errno);
    return -1;
}

} // namespace clowder_adios
