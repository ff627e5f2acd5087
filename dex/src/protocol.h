/* Pure DEX protocol logic: no system calls, no global state, no allocation.
 *
 * Three parts live here so they can be unit- and property-tested in isolation
 * (tests/test_protocol.c) while the runtime (dsm.c, receivers.c) only moves bytes and
 * changes page protections:
 *   1. the home directory at the origin (multi-reader / single-writer pages),
 *   2. the per-node fault bookkeeping (leader/follower coalescing),
 *   3. the wire format and its validation.
 */
#ifndef DEX_PROTOCOL_H
#define DEX_PROTOCOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DEX_MAX_NODES 32
#define DEX_PAGE_SIZE 4096u

/* Access a node holds on a page. Ordered: a larger value allows more. */
enum dsm_access { DSM_NONE = 0, DSM_READ = 1, DSM_WRITE = 2 };

/* ---------------------------------------------------------------- directory */

/* One page as seen by the home directory at the origin (node 0).
 * Invariants when the page is not busy:
 *   exclusive  -> exactly one owner, which may write;
 *   !exclusive -> the origin is an owner and every owner holds a read-only
 *                 current copy (so the origin can always serve readers). */
struct dsm_dir_page {
	uint64_t owners;        /* bit n set: node n holds the current copy */
	uint64_t acks_pending;  /* invalidations not yet acknowledged */
	int32_t queue_head;     /* requests waiting while busy, FIFO */
	int32_t queue_tail;
	uint8_t exclusive;
	uint8_t busy;
	uint8_t pending_node;   /* request being served while busy */
	uint8_t pending_write;
	uint8_t initialised;    /* 0: never used, the origin holds it alone */
};

struct dsm_queued_request {
	int32_t next;
	uint8_t node;
	uint8_t write;
};

struct dsm_dir {
	struct dsm_dir_page *pages;
	uint32_t npages;
	unsigned nodes;
	struct dsm_queued_request *queue_pool;
	uint32_t queue_pool_size;
	int32_t queue_free;
};

enum dsm_action_kind {
	/* Ask a remote node to drop to `access` (NONE or READ); `with_data`
	 * means it must send its copy back in the acknowledgement. */
	DSM_ACT_INVALIDATE,
	/* Give `node` the `access` it asked for. For node 0 this completes the
	 * origin's own fault. `with_data` false is the DEX "short" grant: the
	 * requester already holds the current bytes. */
	DSM_ACT_GRANT,
	/* Change the origin's own mapping as a side effect of someone else's
	 * request (downgrade or drop); the origin's bytes stay in its backing
	 * memory and remain the source for grants while it is an owner. */
	DSM_ACT_SET_ORIGIN_ACCESS,
};

struct dsm_action {
	uint8_t kind;
	uint8_t node;
	uint8_t access;
	uint8_t with_data;
	uint32_t page;
};

typedef void (*dsm_emit_fn)(void *ctx, const struct dsm_action *action);

enum dsm_error {
	DSM_OK = 0,
	DSM_E_RANGE = -1,       /* page or node out of range */
	DSM_E_UNEXPECTED = -2,  /* request or ack that the state does not allow */
	DSM_E_QUEUE_FULL = -3,
	DSM_CROSSED = 1,        /* an invalidation that crossed our release: nothing to do */
};

/* Caller provides all memory; pool[] is initialised here, pages[] must be
 * zeroed (calloc): every page starts owned exclusively by the origin, and
 * its entry is filled in on first use, so an untouched directory costs no
 * memory writes (1 GiB of heap is 8 MiB of directory). */
void dsm_dir_init(struct dsm_dir *dir, struct dsm_dir_page *pages, uint32_t npages, unsigned nodes,
		  struct dsm_queued_request *pool, uint32_t pool_size);

/* A node faulted on `page`. Emits the actions needed now; if other nodes
 * must be contacted first the page becomes busy and the grant is emitted by
 * the dsm_dir_ack that completes it. Requests arriving while busy queue. */
int dsm_dir_request(struct dsm_dir *dir, uint32_t page, unsigned node, bool write, dsm_emit_fn emit,
		    void *ctx);

/* Node `node` acknowledged an invalidation of `page`; `with_data` tells
 * whether it carried the page (already stored in the origin's backing
 * memory by the caller). */
int dsm_dir_ack(struct dsm_dir *dir, uint32_t page, unsigned node, bool with_data, dsm_emit_fn emit,
		void *ctx);

/* Prefetch: a node that asks for a page may also ask for some following
 * pages. Each extra page is granted only if that contacts no other node:
 * the page is idle and, for a read, no remote node writes it or, for a
 * write, no other remote node holds it. Returns 1 if granted (the actions
 * are emitted as for a request), 0 if declined (nothing changes), or an
 * error. */
int dsm_dir_prefetch(struct dsm_dir *dir, uint32_t page, unsigned node, bool write, dsm_emit_fn emit,
		     void *ctx);

/* `node` gave up its copy of `page` on its own (a thread leaving the node
 * took its stack top along). A writable copy comes with its bytes, which
 * the caller stores in the origin's backing memory first (when
 * dsm_dir_access says the node holds DSM_WRITE); the origin then holds the
 * page alone. A read-only copy is simply dropped. If an invalidation of
 * that copy was in flight, the release answers it, and the node drops the
 * invalidation when it arrives (dsm_node_invalidate returns DSM_CROSSED). */
int dsm_dir_release(struct dsm_dir *dir, uint32_t page, unsigned node, dsm_emit_fn emit, void *ctx);

/* The node that alone holds `page` (writable) if the page is idle, so
 * that fetching it is one invalidation of that node; 0 otherwise. The
 * origin reads ahead only through pages of one such node. */
unsigned dsm_dir_sole_remote_owner(const struct dsm_dir *dir, uint32_t page);

/* The one remote node that holds `page` read-only beside the origin, if
 * the page is idle and shared by exactly those two, so that the origin's
 * write needs one invalidation of that node (no data); 0 otherwise. The
 * origin's write readahead goes only through pages of one such node. */
unsigned dsm_dir_sole_remote_reader(const struct dsm_dir *dir, uint32_t page);

/* Access `node` holds according to the directory (only meaningful when
 * the page is not busy). */
enum dsm_access dsm_dir_access(const struct dsm_dir *dir, uint32_t page, unsigned node);

/* ------------------------------------------------------- per-node faults */

enum dsm_fault_decision {
	DSM_FAULT_RETRY,   /* access already sufficient: re-run the instruction */
	DSM_FAULT_FOLLOW,  /* another thread is fetching this page: wait, retry */
	DSM_FAULT_LEAD,    /* send the request; inflight is now set */
};

/* state/inflight are one byte per page, owned by the node. inflight holds
 * DSM_REQUESTED while a request is in flight and DSM_RELEASED after a
 * release until the next answer (an invalidation may have crossed it). */
enum { DSM_REQUESTED = 1, DSM_RELEASED = 2 };
enum dsm_fault_decision dsm_node_fault(uint8_t *state, uint8_t *inflight, bool write);
/* A grant arrived: valid only for a page with a request in flight. */
int dsm_node_grant(uint8_t *state, uint8_t *inflight, enum dsm_access access);
/* Gives up a page held, with no request in flight (see dsm_dir_release);
 * the node then holds nothing. */
int dsm_node_release(uint8_t *state, uint8_t *inflight);
/* The origin declined a prefetched page: valid only for a page with a
 * request in flight; the access held stays. */
int dsm_node_decline(uint8_t *inflight);
/* An invalidation arrived: valid if it lowers the access we hold, or if it
 * crossed our release of the page (DSM_CROSSED: no acknowledgement, the
 * release was it). */
int dsm_node_invalidate(uint8_t *state, uint8_t *inflight, enum dsm_access new_access);

/* ----------------------------------------------------------- wire format */

#define DEX_MSG_MAGIC 0xDE58u
#define DEX_PROTOCOL_VERSION 1u
#define DEX_MAX_PAYLOAD (256u * 1024u)
#define DEX_SYSCALL_MAX_DATA (32u * 1024u)
/* Most pages a request may ask for beyond the faulting one (the answer's
 * data must fit one payload; one bit each in a 64-bit map). */
#define DEX_PREFETCH_MAX 63u

enum dex_msg_type {
	DEX_MSG_HELLO = 1,         /* node -> origin, first message */
	DEX_MSG_WELCOME,           /* origin -> node, layout accepted */
	DEX_MSG_PAGE_REQUEST,      /* node -> origin */
	DEX_MSG_PAGE_GRANT,        /* origin -> node, optional page data */
	DEX_MSG_INVALIDATE,        /* origin -> node */
	DEX_MSG_INVALIDATE_ACK,    /* node -> origin, optional page data */
	DEX_MSG_MIGRATE,           /* either way: run this thread context there */
	DEX_MSG_SYSCALL,           /* node -> origin: delegated system call */
	DEX_MSG_SYSCALL_REPLY,     /* origin -> node */
	DEX_MSG_SHUTDOWN,          /* origin -> node: program finished */
	DEX_MSG_PING,              /* origin -> node, periodically: are you there? */
	DEX_MSG_PONG,              /* node -> origin */
	DEX_MSG_VMA_REVOKE,        /* origin -> node: a range lost rights (munmap, mprotect down) */
	DEX_MSG_VMA_REVOKE_ACK,    /* node -> origin: applied */
	DEX_MSG_PAGE_PREFETCH,     /* origin -> node: answer for a request's extra pages */
	DEX_MSG_TYPE_END
};

struct dex_msg_header {
	uint16_t magic;
	uint16_t type;
	uint16_t from;
	uint16_t reserved;
	uint32_t length; /* payload bytes after this header */
	uint32_t sequence;
};

#define DEX_FINGERPRINT_WORDS 8
struct dex_msg_hello {
	uint32_t version;
	uint32_t node;
	uint32_t nodes;
	uint32_t reserved;
	/* addresses that must agree for "same address space" to hold */
	uint64_t fingerprint[DEX_FINGERPRINT_WORDS];
};

struct dex_msg_welcome {
	uint32_t status;
	uint32_t reserved;
};

struct dex_msg_page_request {
	uint64_t address;
	uint32_t write;
	uint32_t extra; /* following pages also wanted (prefetch), <= DEX_PREFETCH_MAX */
};

/* Followed by DEX_PAGE_SIZE bytes when with_data. */
struct dex_msg_page_grant {
	uint64_t address;
	uint32_t access;
	uint32_t with_data;
};

/* Answer for the `count` pages after a request's page: bit i of `granted`
 * set means page i (from `address`) is granted `access`, clear means
 * declined. The pages whose `with_data` bit is set follow, in order. */
struct dex_msg_page_prefetch {
	uint64_t address;
	uint32_t count;
	uint32_t access;
	uint64_t granted;
	uint64_t with_data;
};

/* `count` pages from `address` (more than one when the origin reads ahead
 * through pages the node writes). */
struct dex_msg_invalidate {
	uint64_t address;
	uint32_t access; /* new access: NONE or READ */
	uint32_t want_data;
	uint32_t count; /* 1 ... DEX_PREFETCH_MAX (the acknowledgement carries them all) */
	uint32_t reserved;
};

/* Followed by count * DEX_PAGE_SIZE bytes when with_data. */
struct dex_msg_invalidate_ack {
	uint64_t address;
	uint32_t with_data;
	uint32_t count;
};

/* Callee-saved state of a thread stopped inside dex_migrate(). */
struct dex_context {
	uint64_t rbx, rbp, r12, r13, r14, r15, rsp, rip;
	uint64_t fs_base;
	uint32_t mxcsr;
	uint16_t fpu_control;
	uint16_t reserved;
};

/* Followed by carried_pages pages: the top of the thread's stack, which
 * the sending node released to the origin (only towards the origin). */
struct dex_msg_migrate {
	uint32_t thread;  /* dex thread id, issued by the origin */
	uint32_t target;  /* node that must run the context */
	uint64_t sent_ns; /* for latency accounting */
	uint64_t trace_tag; /* the thread's profiler tag (dex_trace_tag) */
	struct dex_context context;
	uint64_t carried_address;
	uint32_t carried_pages; /* 0 ... DEX_MIGRATE_MAX_CARRIED */
	uint32_t reserved;
};
#define DEX_MIGRATE_MAX_CARRIED 2u

/* Followed by data_length bytes (buffer contents, path, iovec data...). */
struct dex_msg_syscall {
	uint32_t thread;
	uint32_t worker;  /* where the reply goes on the calling node */
	uint64_t number;
	uint64_t args[6];
	uint32_t data_length;
	uint32_t reserved;
};

/* Followed by data_length bytes (e.g. what read() returned). */
struct dex_msg_syscall_reply {
	uint32_t worker;
	uint32_t data_length;
	int64_t result;
};

/* The origin lowered the rights of [start, start + length) to `rights`
 * (0 for munmap, else 4 | the dsm_access left); nodes cap what they cache and their
 * page protections, then acknowledge with the same generation. */
struct dex_msg_vma_revoke {
	uint64_t start;
	uint64_t length;
	uint32_t rights;
	uint32_t generation;
};

struct dex_msg_vma_revoke_ack {
	uint32_t generation;
	uint32_t reserved;
};

struct dex_msg_shutdown {
	int32_t status;
	uint32_t reserved;
};

/* Address ranges a peer may name in page messages. */
struct dex_region_bounds {
	uint64_t start;
	uint64_t end; /* exclusive, page aligned */
};

struct dex_validation_limits {
	unsigned nodes;
	unsigned max_threads;
	unsigned max_workers;
	const struct dex_region_bounds *regions;
	unsigned nregions;
};

/* Checks a header before its payload is read. Returns NULL if acceptable or
 * a static string saying why not. */
const char *dex_msg_check_header(const struct dex_msg_header *header, const struct dex_validation_limits *lim);

/* Checks a complete message. Returns NULL or a static reason. */
const char *dex_msg_check(const struct dex_msg_header *header, const void *payload,
			  const struct dex_validation_limits *lim);

void dex_msg_fill_header(struct dex_msg_header *header, enum dex_msg_type type, unsigned from,
			 uint32_t length, uint32_t sequence);

const char *dex_msg_type_name(unsigned type);

/* Bytes of a message type's fixed part (what dex_msg_check reads). */
size_t dex_msg_fixed_size(unsigned type);

#endif
