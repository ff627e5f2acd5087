/*
 * xpmem.h: the XPMEM user API (SGI/Cray/LANL XPMEM, as used by UCX, Open MPI, MPICH, GASNet)
 * implemented by clowder's libxpmem, plus XEMEM's extensions (named segments, signals,
 * copy-on-write snapshots).
 *
 * Source- and binary-compatible with the Linux XPMEM user library (libxpmem.so.0): the same
 * types, constants, functions and struct layout. Programs built against XPMEM's header link
 * against this library unchanged, and the reverse.
 *
 * Semantics worth knowing (they follow XPMEM's):
 *  - xpmem_make's permission travels in the pointer value: (void *)0600. xpmem_get ignores
 *    its permit value (Open MPI passes 0666), and access is checked like SysV IPC.
 *  - xpmem_make(0, XPMEM_MAXADDR_SIZE, ...) exports the whole address space; attach offsets
 *    into it are the owner's virtual addresses.
 *  - Every function returns -1 with errno set on failure, except xpmem_attach, which returns
 *    (void *)-1. EINVAL: alignment, range, flags; ENOENT: unknown ids; EACCES: permissions.
 *  - After xpmem_remove or the owner's exit, touching an attachment raises SIGBUS; so does
 *    touching a part of it whose source has no memory. Attachments are not inherited by fork.
 */
#ifndef _XPMEM_H
#define _XPMEM_H

#include <asm/ioctl.h>
#include <linux/types.h>
#include <stddef.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef __s64 xpmem_segid_t; /* segment id: > 0 when valid */
typedef __s64 xpmem_apid_t;  /* access permit id: > 0 when valid */

/* What xpmem_attach maps: a permit and an offset into its segment. */
struct xpmem_addr {
	xpmem_apid_t apid;
	off_t offset;
};

/* As a make size: everything from vaddr to the end of the address space. */
#define XPMEM_MAXADDR_SIZE (size_t)(-1L)

/* xpmem_get flags. */
#define XPMEM_RDONLY 0x1
#define XPMEM_RDWR 0x2

/* Permit types: the only one is a SysV-style octal mode carried as the permit value. */
#define XPMEM_PERMIT_MODE 0x1

/* errno a forked child sees with XPMEM's kernel module on its inherited descriptor. */
#define XPMEM_ERRNO_NOPROC 2004

/* The version this library reports: the XPMEM 2.6 user ABI. */
#ifndef XPMEM_CURRENT_VERSION
#define XPMEM_CURRENT_VERSION 0x00026005
#endif

/*
 * The kernel interface, as XPMEM's header publishes it: the device, its ioctl commands and
 * their argument structs (x86-64 layouts). The library uses them when /dev/xpmem exists (the
 * XPMEM module, or the lightweight kernel's device); applications normally need none of this.
 */
#define XPMEM_DEV_PATH "/dev/xpmem"
#define XPMEM_IOC_MAGIC 'x'
#define XPMEM_CMD_VERSION _IO(XPMEM_IOC_MAGIC, 0)
#define XPMEM_CMD_MAKE _IO(XPMEM_IOC_MAGIC, 1)
#define XPMEM_CMD_REMOVE _IO(XPMEM_IOC_MAGIC, 2)
#define XPMEM_CMD_GET _IO(XPMEM_IOC_MAGIC, 3)
#define XPMEM_CMD_RELEASE _IO(XPMEM_IOC_MAGIC, 4)
#define XPMEM_CMD_ATTACH _IO(XPMEM_IOC_MAGIC, 5)
#define XPMEM_CMD_DETACH _IO(XPMEM_IOC_MAGIC, 6)
#define XPMEM_CMD_FORK_BEGIN _IO(XPMEM_IOC_MAGIC, 7)
#define XPMEM_CMD_FORK_END _IO(XPMEM_IOC_MAGIC, 8)

struct xpmem_cmd_make {
	__u64 vaddr;
	size_t size;
	int permit_type;
	__u64 permit_value;
	xpmem_segid_t segid; /* out */
};

struct xpmem_cmd_remove {
	xpmem_segid_t segid;
};

struct xpmem_cmd_get {
	xpmem_segid_t segid;
	int flags;
	int permit_type;
	__u64 permit_value; /* must be 0: the permit value of xpmem_get is never sent */
	xpmem_apid_t apid;  /* out */
};

struct xpmem_cmd_release {
	xpmem_apid_t apid;
};

struct xpmem_cmd_attach {
	xpmem_apid_t apid;
	off_t offset;
	size_t size;
	__u64 vaddr; /* in: fixed address or 0; out: where it was mapped */
	int fd;      /* unused */
	int flags;   /* unused */
};

struct xpmem_cmd_detach {
	__u64 vaddr;
};

/* Opens the way to XPMEM now (the device, or the broker); optional: every call does it. */
int xpmem_init(void);
/* One XPMEM_CMD_* / XEMEM_CMD_* command with its struct, as ioctl(2) on /dev/xpmem; carried out
 * by the library over the broker where there is no device. */
int xpmem_ioctl(int cmd, void *arg);
int xpmem_version(void);
xpmem_segid_t xpmem_make(void *vaddr, size_t size, int permit_type, void *permit_value);
int xpmem_remove(xpmem_segid_t segid);
xpmem_apid_t xpmem_get(xpmem_segid_t segid, int flags, int permit_type, void *permit_value);
int xpmem_release(xpmem_apid_t apid);
void *xpmem_attach(struct xpmem_addr addr, size_t size, void *vaddr);
int xpmem_detach(void *vaddr);

/*
 * XEMEM extensions (clowder). Named segments are made with mode 0666 (XEMEM's global mode);
 * names are 1..63 printable ASCII characters without spaces, unique system-wide.
 */
#define XEMEM_NAME_MAX 63
xpmem_segid_t xemem_make(void *vaddr, size_t size, const char *name);
/* The segid made under name, or -1 (errno ENOENT) if there is none (yet). */
xpmem_segid_t xemem_lookup_segid(const char *name);
/* An attacher holding apid wakes the segment's owner. */
int xemem_signal(xpmem_apid_t apid);
/* The owner's side: a descriptor (eventfd) that becomes readable when attachers signal the
 * segment; read(2) an 8-byte count of signals since the last read. Owned by the library. */
int xemem_notify_fd(xpmem_segid_t segid);
/* Why the calling thread's last call into the broker failed, when the errno alone does not
 * say it: a sentence, or NULL (success, a reason errno names well enough, or the device
 * backend, which has no reasons). Today: an attach of a hugepage enclave's memory that is not
 * whole, aligned 2 MiB pages (EINVAL). The errnos stay XPMEM's. With CLOWDER_LOG=debug (or
 * xemem=debug among its directives; CLOWDER_XEMEM_DEBUG=1 is the older name) in the environment
 * the library also prints each failed broker call, with this reason, on stderr. */
const char *xemem_errmsg(void);

/*
 * XEMEM snapshots (TCASM: copy-on-write versions of a region). A writer
 * allocates a region with xemem_region_alloc and writes it as ordinary memory; at a consistent
 * point it publishes the region's contents as a snapshot segment with xemem_snapshot_make.
 * Readers get and attach that segment as any other (xpmem_get with XPMEM_RDWR, as XPMEM's
 * attach requires) and see that version, unchanged, while the writer goes on writing: each
 * page the writer then touches is copied once, by the kernel, into memory of its own, and the
 * next snapshot copies the pages written since into the region's memory. So a snapshot costs
 * in proportion to the pages written between snapshots, not to the region's size, and the
 * pages the writer only reads stay mapped. Where the kernel tracks stores for the library
 * (userfaultfd's asynchronous write-protect, Linux 6.7), the writer keeps its copies of the
 * pages it has written (memory up to the region's size again); elsewhere each snapshot drops
 * them. xemem_snapshot_release withdraws the segment.
 * Rules:
 *  - one snapshot per region at a time (EBUSY for a second one): readers are done, and say so
 *    (xemem_signal, or the application's own protocol), before the writer releases; a reader
 *    still attached after the release reads that version until the writer's next snapshot,
 *    and the writer's data from then on;
 *  - readers attach read-write, as XPMEM maps every attachment; the permission mode guards
 *    the snapshot, as it guards any segment: a reader allowed to write could change what the
 *    other readers, and through the next snapshot the writer, see. Readers map it read-only
 *    (mprotect PROT_READ, or the Python API's default);
 *  - the writer's other threads do not store into the region while xemem_snapshot_make runs
 *    (it moves pages under them): take snapshots between steps;
 *  - xpmem_make/xemem_make over a region refuse while a snapshot is out (EBUSY); otherwise they
 *    first fold the writer's pages back into the region's memory, which is then exported live
 *    as any shared memory, until its next snapshot. A region inside a segment of this process
 *    cannot be snapshotted (EBUSY);
 *  - when the writer exits, or frees the region, readers keep the snapshot's pages, still
 *    consistent (nothing writes them any more), until they detach: no SIGBUS;
 *  - a forked child shares the region's memory until the region's first snapshot, and gets a
 *    copy-on-write copy of the writer's view from then on; snapshots are the parent's to make
 *    and release.
 * In the lightweight kernel (the device backend) the kernel does it with page tables: a region
 * is memory of its own, mapped in a window of the job's; a snapshot write-protects it and
 * exports the frames it has; the writer's first store to each page then faults and gets a
 * fresh copy (a kernel entry and a 4 KiB copy per page written), and release hands the kept
 * frames back for later copies. The writer keeps its copies; a fork child does not inherit
 * regions; a region goes with the process that allocated it (its snapshot's attachments
 * revoked, as any segment's). The Linux-VM PCI backend has no snapshots: ENOTSUP.
 */
/* A new region of `size` bytes (rounded up to pages), zero-filled, read-write: memfd-backed
 * shared memory. Returns its address, or (void *)-1 with errno (EINVAL: size 0; ENOMEM). */
void *xemem_region_alloc(size_t size);
/* Frees a region (releasing its snapshot if one is out). 0, or -1 with errno (EINVAL: not a
 * region's address). */
int xemem_region_free(void *region);
/* Publishes the current contents of the region at `region` as a read-only snapshot segment,
 * with xpmem_make's permit, and under a machine-wide name (as xemem_make's) when `name` is not
 * NULL. Returns the snapshot's segid, or -1 with errno (EINVAL: not a region; EBUSY: a
 * snapshot is out, or the region is exported; the broker's errnos). */
xpmem_segid_t xemem_snapshot_make(void *region, int permit_type, void *permit_value, const char *name);
/* Withdraws snapshot `segid`: new gets and attaches fail. Returns 0, or -1 with errno (ENOENT:
 * not a snapshot of this process that is out). */
int xemem_snapshot_release(xpmem_segid_t segid);

/*
 * XEMEM's extensions on a device (the lightweight kernel's /dev/xpmem), numbered above XPMEM's
 * own commands. MAKE_NAMED: a segment with mode 0666 and a name, known to the name server of
 * the whole machine when the enclave is connected to clowderd.
 */
#define XEMEM_CMD_MAKE_NAMED _IO(XPMEM_IOC_MAGIC, 0x10)
struct xemem_cmd_make_named {
	__u64 vaddr;
	__u64 size;
	char name[XEMEM_NAME_MAX + 1]; /* NUL-terminated */
	xpmem_segid_t segid;           /* out */
};

/* LOOKUP: the segid of a named segment, from the enclave's own names or, when the enclave is
 * connected to clowderd, the whole machine's (host processes' xemem_make segments included). */
#define XEMEM_CMD_LOOKUP _IO(XPMEM_IOC_MAGIC, 0x11)
struct xemem_cmd_lookup {
	char name[XEMEM_NAME_MAX + 1]; /* NUL-terminated */
	xpmem_segid_t segid;           /* out */
};

/* SIGNAL: xemem_signal on a device. The caller's permit apid wakes the segment's owner (in
 * the same enclave, another enclave or a host process when the enclave is connected). */
#define XEMEM_CMD_SIGNAL _IO(XPMEM_IOC_MAGIC, 0x12)
struct xemem_cmd_signal {
	xpmem_apid_t apid;
};

/* NOTIFY_FD: a new descriptor for the caller's own segment segid that reads as an eventfd: an
 * 8-byte count of signals since the last read, waiting while it is 0 (EAGAIN with
 * O_NONBLOCK). flags: O_NONBLOCK and O_CLOEXEC, nothing else. Every descriptor of one segment
 * shares its count. xemem_notify_fd asks once per segment (O_NONBLOCK | O_CLOEXEC, as the
 * host's eventfd) and keeps the descriptor. */
#define XEMEM_CMD_NOTIFY_FD _IO(XPMEM_IOC_MAGIC, 0x13)
struct xemem_cmd_notify_fd {
	xpmem_segid_t segid;
	int flags;
	int fd; /* out */
};

/* Snapshots on a device (the lightweight kernel's page-table copy-on-write): what
 * xemem_region_alloc, xemem_region_free, xemem_snapshot_make and xemem_snapshot_release ask of
 * it. REGION_ALLOC: `size` in, the region's address out (`vaddr`); REGION_FREE: `vaddr` in.
 * SNAPSHOT_MAKE: an empty `name` is none. */
#define XEMEM_CMD_REGION_ALLOC _IO(XPMEM_IOC_MAGIC, 0x14)
#define XEMEM_CMD_REGION_FREE _IO(XPMEM_IOC_MAGIC, 0x15)
struct xemem_cmd_region {
	__u64 size;
	__u64 vaddr;
};
#define XEMEM_CMD_SNAPSHOT_MAKE _IO(XPMEM_IOC_MAGIC, 0x16)
struct xemem_cmd_snapshot_make {
	__u64 vaddr;
	int permit_type;
	int reserved; /* 0 */
	__u64 permit_value;
	char name[XEMEM_NAME_MAX + 1]; /* NUL-terminated */
	xpmem_segid_t segid;           /* out */
};
#define XEMEM_CMD_SNAPSHOT_RELEASE _IO(XPMEM_IOC_MAGIC, 0x17)
struct xemem_cmd_snapshot_release {
	xpmem_segid_t segid;
};

#ifdef __cplusplus
}
#endif

#endif /* _XPMEM_H */
