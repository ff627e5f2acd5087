/*
 * libxpmem for host processes, with no kernel module (clowder XEMEM).
 *
 * The library talks to the segment broker (xemem/broker: standalone `xemem-broker`, or
 * embedded in clowderd) over a SOCK_SEQPACKET Unix socket: $CLOWDER_XEMEM_SOCKET, else
 * xemem.sock beside $CLOWDER_SOCKET, else /run/clowder/xemem.sock. The packet layout is
 * xemem/broker/src/wire.rs.
 *
 * Sharing works by file descriptor. An owner's memory must be nameable by a file, so:
 *  - memfd-backed (and other MAP_SHARED file) mappings are handed out as they are;
 *  - private writable memory (heap, anonymous mmap, .data/.bss) is converted in place into
 *    memfd-backed shared memory: copy it into a fresh memfd, then mmap(MAP_FIXED|MAP_SHARED)
 *    the memfd over the same addresses. Contents and addresses stay; only the backing changes.
 *    Explicit ranges are converted by xpmem_make; a whole-address-space segment converts each
 *    range lazily, when somebody attaches it.
 *  - everything else (the main stack, read-only or PROT_NONE mappings, gaps) is a hole: an
 *    attacher touching it gets SIGBUS, as XPMEM gives for unmapped source pages.
 * A per-process service thread answers the broker's FETCH requests with runs of
 * (memfd, offset, length) and passes the memfds with SCM_RIGHTS; the attacher mmaps them into
 * one reserved range. No page is copied at attach time, and the cost grows with the number of
 * mappings in the range, not the number of pages.
 *
 * Revocation (SIGBUS after remove or owner exit): an attacher's mapping of a converted memfd
 * dies when that memfd is truncated. On xpmem_remove the owner first moves its own pages to a
 * new memfd (one copy of the pages it handed out), then truncates the old one; when the owner
 * exits, the broker truncates the converted memfds it saw. See docs/xemem.md for the caveats
 * (memfds the application made itself are not revoked; overlapping segments share backing).
 *
 * Conversions are safe against concurrent writers in the owner: the range is made read-only
 * while it is copied, and a temporary SIGSEGV handler parks any thread that writes to it until
 * the shared mapping is in place, then lets the write happen there. fork() children get their
 * converted memory back as private copy-on-write-like memory (pthread_atfork), so a child
 * cannot scribble on its parent's exported pages.
 */
#ifndef XPMEM_INTERNAL_H
#define XPMEM_INTERNAL_H

#define _GNU_SOURCE
#include <dirent.h>
#include <link.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include "xpmem.h"

#define EXPORT __attribute__((visibility("default")))

#define PAGE 4096UL
#define HUGE_PAGE (2UL << 20)
#define USER_LIMIT 0x7ffffffff000UL

/* ---- the broker protocol (xemem/broker/src/wire.rs; xemem/broker/tests/c_layout.rs
 * checks this C view against it) ---------------------------------------------------------- */

#define WIRE_MAGIC 0x4d4d4558u
#define WIRE_VERSION 1
#define WIRE_HOLE 0xffffffffu
#define WIRE_REVOCABLE 1u
#define WIRE_MAX_RUNS 4096
#define WIRE_MAX_FDS 250
/* A failed answer's reason code in results[0] (xemem::Error::code) that errno does not tell apart. */
#define WIRE_REASON_WHOLE_PAGES_ONLY 8

enum {
	OP_HELLO = 1, OP_SERVE = 2, OP_MAKE = 3, OP_REMOVE = 4, OP_GET = 5, OP_RELEASE = 6,
	OP_ATTACH = 7, OP_DETACH = 8, OP_LOOKUP = 9, OP_SIGNAL = 10, OP_FETCH = 16, OP_NOTIFY = 17,
	OP_REVOKE = 18,
};
/* In a GET's answer (results[2]): attachments through the permit are revoked by
 * OP_REVOKE (another enclave's memory, which cannot be truncated under us). */
#define WIRE_GET_REVOKED_BY_MESSAGE 1u

struct wire_request {
	uint32_t magic;
	uint16_t version, op;
	uint64_t args[7];
	char name[XEMEM_NAME_MAX];
};

struct wire_answer {
	uint32_t magic;
	uint16_t version, op;
	int32_t error;
	uint32_t runs;
	uint64_t results[6];
};

struct wire_run {
	uint32_t fd_index, flags;
	uint64_t offset, length, zero;
};

_Static_assert(sizeof(struct wire_answer) == 64, "answer header is 64 bytes");
_Static_assert(sizeof(struct wire_run) == 32, "a run is 32 bytes");
_Static_assert(offsetof(struct wire_request, name) == 64, "request header is 64 bytes");

/* A memfd this library made by converting private memory. Where it is mapped is read from
 * /proc/self/maps whenever needed, never remembered: the application may munmap, mremap
 * (realloc does) or mprotect it at will. */
struct backing {
	int fd;
	size_t len;
	dev_t dev;
	ino_t ino;
	int handed_out; /* given to an attacher: revoke on remove */
};

/* A region of xemem_region_alloc (xemem_snapshot_region.c) and its snapshot. */
struct region {
	uintptr_t base;
	size_t size;
	int fd;                 /* memfd: the region's memory, and the snapshot while one is out */
	char *side;             /* a second shared view of the memfd, kept: what the snapshot's
				   segment exports, and where the writer's pages are written back */
	xpmem_segid_t snapshot; /* the snapshot's segid while it is out, else 0 */
	int published;          /* a snapshot is out */
	int private_view;       /* the writer's view is MAP_PRIVATE over the memfd: from the first
				   snapshot on, until an export folds it back to shared */
	int uffd;               /* the userfaultfd tracking stores into the private view, or -1 */
	unsigned protect_all;   /* tracked folds left that protect every written page again, as
				   the written pages move (xemem_snapshot_fold.c) */
	unsigned moves;         /* times in a row they were seen moving: the next stretch of such
				   folds is 4 << moves (at most 64) */
	int stretch_ended;      /* the last fold ended such a stretch (the next one finds only
				   pages written since, so cannot tell whether they move) */
};

/* One current mapping of a backing (from /proc/self/maps). */
struct placement {
	uintptr_t start, end;
	uint64_t offset;
	int prot;
	size_t backing;
};

/* Segments this process made. */
struct segment {
	xpmem_segid_t segid;
	uintptr_t vaddr;
	size_t size;
	int notify_fd;
};

/* One run of an attachment as the owner's answer named it: a range of a file. */
struct run_identity {
	dev_t dev;
	ino_t ino;
	uint64_t offset, length;
};

/* Attachments this process holds. */
struct attachment {
	uintptr_t base;
	size_t size;
	xpmem_apid_t apid;
	int64_t offset; /* in the segment */
	/* The runs it maps, for taking it up again (see park_attachment); none when it has a hole
	 * or is too small to be worth it. */
	struct run_identity *runs;
	uint32_t nruns;
	/* Detached by the application and moved where it never looks: see park_attachment. */
	int parked;
	uint64_t parked_order;
};

struct mapping {
	uintptr_t start, end;
	char perms[5];
	uint64_t offset;
	unsigned major, minor;
	unsigned long inode;
	char path[64];
	int after_guard; /* directly above a PROT_NONE mapping: how glibc lays out thread stacks */
};


/*
 * What each file offers the others. Everything here has hidden visibility (-fvisibility=hidden),
 * and the static library's objects are merged with those symbols made local
 * (objcopy --localize-hidden), so none of these names can clash with an application's.
 */
/* backend_pci.c (a Linux VM's XEMEM PCI device; device.c routes commands to it) */
int pci_probe(void);
long pci_call(unsigned long command, void *argument);
void *pci_map_run_file(const char *env, const char *fallback, size_t size, const char **path);
/* pci_board.c (the VM backend's attachment board, read by the guest agent to deliver SIGBUS) */
int pci_board_note(uint64_t window_offset, uint64_t len);
void pci_board_clear(int slot);

/* broker.c */
int connect_broker(void);
int send_packet(int fd, const void *bytes, size_t len, const int *fds, int nfds);
ssize_t receive_packet(int fd, void *bytes, size_t len, int *fds, int *nfds);
void close_all(int *fds, int nfds);
extern pthread_once_t atfork_once;
void register_atfork(void);
int call_locked(struct wire_request *request, size_t name_len, struct wire_answer *answer,
		       struct wire_run *runs, int *fds, int *nfds);
int call(uint16_t op, const uint64_t *args, int nargs, const char *name, struct wire_answer *answer);
int permit_call(uint16_t op, xpmem_apid_t apid);

/* convert.c */
extern _Atomic int frozen_for_fork;
extern _Atomic uint64_t protection_epoch;
void install_parking(void);
void guard_end(void);
void copy_nonzero_pages(char *dst, const char *src, size_t len);
int move_to_memfd(uintptr_t addr, size_t len, int prot);
int add_backing(int fd, size_t len);
struct backing *backing_for(unsigned major, unsigned minor, unsigned long inode);
struct placement *placements(uintptr_t lo, uintptr_t hi, size_t *count);
void drop_backing(size_t index);
void prune_backings(void);
struct mapping *prepared_maps(uintptr_t lo, uintptr_t hi, size_t *count);

/* device.c */
int use_device(void);
int device_open(void);
long device_call(unsigned long command, void *argument);
xpmem_segid_t device_make_segment(void *vaddr, size_t size, int permit_type, void *permit_value);
xpmem_apid_t device_get_access(xpmem_segid_t segid, int flags, int permit_type);
void *device_attach_segment(struct xpmem_addr addr, size_t size, void *vaddr);
void device_notify_forget(xpmem_segid_t segid);
int device_notify_fd(xpmem_segid_t segid);
void *device_region_alloc(size_t size);
int device_region_free(void *base);
xpmem_segid_t device_snapshot_make(void *base, int permit_type, void *permit_value, const char *name);
int device_snapshot_release(xpmem_segid_t segid);

/* fork.c */
extern int fork_sync[2];
extern struct placement *frozen;
int in_backing(uintptr_t addr);
void atfork_prepare(void);
void atfork_parent(void);
void atfork_child(void);

/* maps.c */
struct mapping *read_maps(uintptr_t lo, uintptr_t hi, size_t *count);
int convertible(const struct mapping *m);
int prot_of(const struct mapping *m);
extern uintptr_t service_stack_lo, service_stack_hi;
int convertible_parts(const struct mapping *m, uintptr_t start, uintptr_t end, uintptr_t parts[8][2]);
struct mapping *read_shared_file_maps(uintptr_t lo, uintptr_t hi, size_t *count);

/* owner_service.c */
extern xpmem_apid_t *message_permits;
extern size_t message_permit_count, message_permit_capacity;
void forget_message_permit(xpmem_apid_t apid);
int ensure_serving(void);

/* parking.c */
void forget_attachment(size_t index, int unmap);
void drop_parked(xpmem_apid_t apid);
int move_runs(const struct attachment *a, char *to);
int park_attachment(size_t index);
uint32_t run_identities(const struct wire_run *runs, uint32_t nruns, const int *fds, struct run_identity **out);
long take_parked(xpmem_apid_t apid, int64_t offset, size_t len, const struct run_identity *ids, uint32_t nids);
int hole_descriptor(void);
int overlaps_attachment(uintptr_t lo, uintptr_t hi);
void *reserve(size_t len);

/* state.c */
extern pthread_mutex_t call_lock;
extern pthread_mutex_t table_lock;
extern int call_fd;
extern int serve_fd;
extern struct backing *backings;
extern size_t backing_count, backing_capacity;
extern struct segment *segments;
extern size_t segment_count, segment_capacity;
extern struct attachment *attachments;
extern size_t attachment_count, attachment_capacity;
extern int hole_fd;
int grow(void **array, size_t *capacity, size_t count, size_t item);

/* xemem_snapshot_region.c; lock order: region_lock, call_lock, table_lock */
extern pthread_mutex_t region_lock;
extern struct region *regions;
extern size_t region_count, region_capacity;
struct region *region_at(uintptr_t base);
xpmem_segid_t make_outside_snapshots(void *vaddr, size_t size, int permit_type, void *permit_value, const char *name);

/* xemem_snapshot_fold.c */
int fold(struct region *r, int share);
void track_writes(struct region *r);
void untrack_writes(struct region *r);

/* xemem_snapshot_release.c */
void withdraw_snapshot(struct region *r);

/* xemem_errmsg.c */
extern __thread uint64_t last_reason __attribute__((tls_model("initial-exec")));
void note_reason(const struct wire_answer *answer);

/* xemem_notify_fd.c */
int notify_fd_of(xpmem_segid_t segid);

/* xpmem_make.c */
xpmem_segid_t make(void *vaddr, size_t size, int permit_type, void *permit_value, const char *name);

#endif
