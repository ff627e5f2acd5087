/* Pure protocol logic; see protocol.h for the contract. Nothing here may
 * call into libc beyond plain memory helpers: the same code runs inside
 * signal handlers of the runtime and inside the property tests. */
#include "protocol.h"

#include <string.h>

#define ORIGIN 0u
#define BIT(n) (UINT64_C(1) << (n))

/* ---------------------------------------------------------------- directory */

void dsm_dir_init(struct dsm_dir *dir, struct dsm_dir_page *pages, uint32_t npages, unsigned nodes,
		  struct dsm_queued_request *pool, uint32_t pool_size)
{
	dir->pages = pages;
	dir->npages = npages;
	dir->nodes = nodes;
	dir->queue_pool = pool;
	dir->queue_pool_size = pool_size;
	for (uint32_t i = 0; i < pool_size; i++)
		pool[i].next = (i + 1 < pool_size) ? (int32_t)(i + 1) : -1;
	dir->queue_free = pool_size ? 0 : -1;
}

/* Entries are set up on first use: a zeroed entry stands for a page the
 * origin holds alone, so a large directory costs nothing until used. */
static const struct dsm_dir_page initial_page = { .owners = BIT(ORIGIN), .exclusive = 1, .queue_head = -1,
						  .queue_tail = -1, .initialised = 1 };

static struct dsm_dir_page *dir_page(struct dsm_dir *dir, uint32_t page)
{
	struct dsm_dir_page *p = &dir->pages[page];
	if (!p->initialised)
		*p = initial_page;
	return p;
}

static const struct dsm_dir_page *dir_page_const(const struct dsm_dir *dir, uint32_t page)
{
	const struct dsm_dir_page *p = &dir->pages[page];
	return p->initialised ? p : &initial_page;
}

static void emit_action(dsm_emit_fn emit, void *ctx, enum dsm_action_kind kind, unsigned node, uint32_t page,
			enum dsm_access access, bool with_data)
{
	struct dsm_action action = { .kind = (uint8_t)kind, .node = (uint8_t)node, .access = (uint8_t)access,
				     .with_data = with_data, .page = page };
	emit(ctx, &action);
}

static unsigned lowest_node(uint64_t set)
{
	return (unsigned)__builtin_ctzll(set);
}

/* Final step of every request: record the new owners and grant. */
static void complete_request(struct dsm_dir_page *p, uint32_t page, unsigned node, bool write, bool had_copy,
			     dsm_emit_fn emit, void *ctx)
{
	if (write) {
		p->owners = BIT(node);
		p->exclusive = 1;
	} else {
		p->owners |= BIT(node) | BIT(ORIGIN);
		p->exclusive = 0;
	}
	p->busy = 0;
	p->acks_pending = 0;
	/* Origin's own data lives in its backing memory, so it never needs bytes. */
	bool with_data = node != ORIGIN && !had_copy;
	emit_action(emit, ctx, DSM_ACT_GRANT, node, page, write ? DSM_WRITE : DSM_READ, with_data);
}

/* Whether start_request on this idle page completes at once, without
 * asking another node for the page or for invalidations. */
static bool completes_at_once(const struct dsm_dir_page *p, unsigned node, bool write)
{
	if (p->exclusive)
		return lowest_node(p->owners) == ORIGIN;
	return !write || !(p->owners & ~BIT(node) & ~BIT(ORIGIN));
}

/* Serve one request on an idle page. Returns true if it completed now. */
static bool start_request(struct dsm_dir_page *p, uint32_t page, unsigned node, bool write, dsm_emit_fn emit,
			  void *ctx)
{
	bool holds_copy = (p->owners & BIT(node)) != 0;

	if (!write) {
		if (!p->exclusive) {
			complete_request(p, page, node, false, holds_copy, emit, ctx);
			return true;
		}
		unsigned owner = lowest_node(p->owners);
		if (owner == ORIGIN) {
			emit_action(emit, ctx, DSM_ACT_SET_ORIGIN_ACCESS, ORIGIN, page, DSM_READ, false);
			complete_request(p, page, node, false, holds_copy, emit, ctx);
			return true;
		}
		/* A remote writer holds the only current copy: fetch it and let
		 * the writer keep a read-only copy. */
		p->busy = 1;
		p->pending_node = (uint8_t)node;
		p->pending_write = 0;
		p->acks_pending = BIT(owner);
		emit_action(emit, ctx, DSM_ACT_INVALIDATE, owner, page, DSM_READ, true);
		return false;
	}

	if (p->exclusive) {
		unsigned owner = lowest_node(p->owners);
		if (owner == ORIGIN) {
			emit_action(emit, ctx, DSM_ACT_SET_ORIGIN_ACCESS, ORIGIN, page, DSM_NONE, false);
			complete_request(p, page, node, true, false, emit, ctx);
			return true;
		}
		p->busy = 1;
		p->pending_node = (uint8_t)node;
		p->pending_write = 1;
		p->acks_pending = BIT(owner);
		emit_action(emit, ctx, DSM_ACT_INVALIDATE, owner, page, DSM_NONE, true);
		return false;
	}

	/* Shared: every other reader loses its copy. Nobody needs to send data
	 * because the origin holds a current copy. */
	uint64_t remote_readers = p->owners & ~BIT(node) & ~BIT(ORIGIN);
	if (node != ORIGIN)
		emit_action(emit, ctx, DSM_ACT_SET_ORIGIN_ACCESS, ORIGIN, page, DSM_NONE, false);
	for (uint64_t set = remote_readers; set; set &= set - 1)
		emit_action(emit, ctx, DSM_ACT_INVALIDATE, lowest_node(set), page, DSM_NONE, false);
	if (!remote_readers) {
		complete_request(p, page, node, true, holds_copy, emit, ctx);
		return true;
	}
	p->busy = 1;
	p->pending_node = (uint8_t)node;
	p->pending_write = 1;
	p->acks_pending = remote_readers;
	/* Remember whether the requester already has the bytes: its bit may
	 * be cleared below only once the acks arrive, so keep it in owners. */
	p->owners = (p->owners & BIT(node)) | remote_readers;
	return false;
}

static int enqueue(struct dsm_dir *dir, struct dsm_dir_page *p, unsigned node, bool write)
{
	if (dir->queue_free < 0)
		return DSM_E_QUEUE_FULL;
	int32_t slot = dir->queue_free;
	struct dsm_queued_request *q = &dir->queue_pool[slot];
	dir->queue_free = q->next;
	q->next = -1;
	q->node = (uint8_t)node;
	q->write = write;
	if (p->queue_tail >= 0)
		dir->queue_pool[p->queue_tail].next = slot;
	else
		p->queue_head = slot;
	p->queue_tail = slot;
	return DSM_OK;
}

/* True if `node` already holds what it asks for. New requests like that
 * are protocol errors (a node never faults on access it has); a queued one
 * can become satisfied while it waits, e.g. an origin read queued behind a
 * grant that left the origin a reader. */
static bool request_already_satisfied(const struct dsm_dir_page *p, unsigned node, bool write)
{
	if (!(p->owners & BIT(node)))
		return false;
	return write ? p->exclusive : true;
}

static int validate_request(const struct dsm_dir_page *p, unsigned node, bool write)
{
	if (request_already_satisfied(p, node, write))
		return DSM_E_UNEXPECTED;
	return DSM_OK;
}

static void drain_queue(struct dsm_dir *dir, struct dsm_dir_page *p, uint32_t page, dsm_emit_fn emit, void *ctx)
{
	while (!p->busy && p->queue_head >= 0) {
		int32_t slot = p->queue_head;
		struct dsm_queued_request q = dir->queue_pool[slot];
		p->queue_head = q.next;
		if (p->queue_head < 0)
			p->queue_tail = -1;
		dir->queue_pool[slot].next = dir->queue_free;
		dir->queue_free = slot;
		if (request_already_satisfied(p, q.node, q.write)) {
			/* Still answer so the requester's in-flight fault ends,
			 * with the access it actually holds. */
			emit_action(emit, ctx, DSM_ACT_GRANT, q.node, page, p->exclusive ? DSM_WRITE : DSM_READ, false);
			continue;
		}
		start_request(p, page, q.node, q.write, emit, ctx);
	}
}

int dsm_dir_request(struct dsm_dir *dir, uint32_t page, unsigned node, bool write, dsm_emit_fn emit, void *ctx)
{
	if (page >= dir->npages || node >= dir->nodes)
		return DSM_E_RANGE;
	struct dsm_dir_page *p = dir_page(dir, page);
	if (p->busy)
		return enqueue(dir, p, node, write);
	int rc = validate_request(p, node, write);
	if (rc)
		return rc;
	start_request(p, page, node, write, emit, ctx);
	return DSM_OK;
}

/* `node` answered the invalidation of a busy page; it keeps a read-only
 * copy when the invalidation asked for that, unless it released the page. */
static int finish_ack(struct dsm_dir *dir, struct dsm_dir_page *p, uint32_t page, unsigned node, bool released,
		      dsm_emit_fn emit, void *ctx)
{
	p->acks_pending &= ~BIT(node);
	if (p->acks_pending)
		return DSM_OK;

	unsigned requester = p->pending_node;
	bool write = p->pending_write;
	bool had_copy = false;
	if (p->exclusive) {
		/* The writer's copy is now in the origin's memory. On a read the
		 * origin becomes a reader (its mapping turns readable) and so
		 * does the former writer. */
		unsigned former = lowest_node(p->owners);
		if (write) {
			p->owners = 0;
		} else {
			p->owners = (released ? 0 : BIT(former)) | BIT(ORIGIN);
			emit_action(emit, ctx, DSM_ACT_SET_ORIGIN_ACCESS, ORIGIN, page, DSM_READ, false);
		}
		/* The requester cannot have been the exclusive owner (it would
		 * not have faulted), so it needs the bytes; the origin reads its
		 * own backing memory, which complete_request accounts for. */
		had_copy = false;
	} else {
		had_copy = (p->owners & BIT(requester)) != 0;
	}
	complete_request(p, page, requester, write, had_copy, emit, ctx);
	drain_queue(dir, p, page, emit, ctx);
	return DSM_OK;
}

int dsm_dir_ack(struct dsm_dir *dir, uint32_t page, unsigned node, bool with_data, dsm_emit_fn emit, void *ctx)
{
	if (page >= dir->npages || node >= dir->nodes || node == ORIGIN)
		return DSM_E_RANGE;
	struct dsm_dir_page *p = dir_page(dir, page);
	if (!p->busy || !(p->acks_pending & BIT(node)))
		return DSM_E_UNEXPECTED;
	/* Data is expected exactly when we fetched from an exclusive writer. */
	bool expect_data = p->exclusive;
	if (with_data != expect_data)
		return DSM_E_UNEXPECTED;
	return finish_ack(dir, p, page, node, false, emit, ctx);
}

int dsm_dir_release(struct dsm_dir *dir, uint32_t page, unsigned node, dsm_emit_fn emit, void *ctx)
{
	if (page >= dir->npages || node >= dir->nodes || node == ORIGIN)
		return DSM_E_RANGE;
	struct dsm_dir_page *p = dir_page(dir, page);
	if (!(p->owners & BIT(node)) || (p->exclusive && p->owners != BIT(node)))
		return DSM_E_UNEXPECTED;
	if (p->busy)
		return (p->acks_pending & BIT(node)) ? finish_ack(dir, p, page, node, true, emit, ctx)
						     : DSM_E_UNEXPECTED;
	if (p->exclusive) {
		p->owners = BIT(ORIGIN);
		emit_action(emit, ctx, DSM_ACT_SET_ORIGIN_ACCESS, ORIGIN, page, DSM_WRITE, false);
	} else {
		p->owners &= ~BIT(node); /* the origin, an owner, keeps the current bytes */
	}
	return DSM_OK;
}

int dsm_dir_prefetch(struct dsm_dir *dir, uint32_t page, unsigned node, bool write, dsm_emit_fn emit, void *ctx)
{
	if (page >= dir->npages || node >= dir->nodes || node == ORIGIN)
		return DSM_E_RANGE;
	struct dsm_dir_page *p = dir_page(dir, page);
	if (p->busy || request_already_satisfied(p, node, write) || !completes_at_once(p, node, write))
		return 0;
	start_request(p, page, node, write, emit, ctx);
	return 1;
}

unsigned dsm_dir_sole_remote_owner(const struct dsm_dir *dir, uint32_t page)
{
	if (page >= dir->npages)
		return ORIGIN;
	const struct dsm_dir_page *p = dir_page_const(dir, page);
	if (p->busy || !p->exclusive)
		return ORIGIN;
	return lowest_node(p->owners);
}

unsigned dsm_dir_sole_remote_reader(const struct dsm_dir *dir, uint32_t page)
{
	if (page >= dir->npages)
		return ORIGIN;
	const struct dsm_dir_page *p = dir_page_const(dir, page);
	uint64_t remote = p->owners & ~BIT(ORIGIN);
	if (p->busy || p->exclusive || !(p->owners & BIT(ORIGIN)) || !remote || (remote & (remote - 1)))
		return ORIGIN;
	return lowest_node(remote);
}

enum dsm_access dsm_dir_access(const struct dsm_dir *dir, uint32_t page, unsigned node)
{
	const struct dsm_dir_page *p = dir_page_const(dir, page);
	if (!(p->owners & BIT(node)))
		return DSM_NONE;
	return p->exclusive ? DSM_WRITE : DSM_READ;
}

/* ------------------------------------------------------- per-node faults */

enum dsm_fault_decision dsm_node_fault(uint8_t *state, uint8_t *inflight, bool write)
{
	enum dsm_access need = write ? DSM_WRITE : DSM_READ;
	if (*state >= need)
		return DSM_FAULT_RETRY;
	if (*inflight & DSM_REQUESTED)
		return DSM_FAULT_FOLLOW;
	*inflight |= DSM_REQUESTED;
	return DSM_FAULT_LEAD;
}

/* Any answer to a request was sent after the origin had seen every earlier
 * release of the page, so no invalidation can still cross one: both
 * flags clear. */
int dsm_node_grant(uint8_t *state, uint8_t *inflight, enum dsm_access access)
{
	if (!(*inflight & DSM_REQUESTED) || access == DSM_NONE || access > DSM_WRITE)
		return DSM_E_UNEXPECTED;
	*state = (uint8_t)access;
	*inflight = 0;
	return DSM_OK;
}

int dsm_node_decline(uint8_t *inflight)
{
	if (!(*inflight & DSM_REQUESTED))
		return DSM_E_UNEXPECTED;
	*inflight = 0;
	return DSM_OK;
}

int dsm_node_release(uint8_t *state, uint8_t *inflight)
{
	if (*state == DSM_NONE || (*inflight & DSM_REQUESTED))
		return DSM_E_UNEXPECTED;
	*state = DSM_NONE;
	*inflight = DSM_RELEASED;
	return DSM_OK;
}

int dsm_node_invalidate(uint8_t *state, uint8_t *inflight, enum dsm_access new_access)
{
	if (*state == DSM_NONE && (*inflight & DSM_RELEASED) && new_access <= DSM_READ) {
		*inflight &= (uint8_t)~DSM_RELEASED;
		return DSM_CROSSED;
	}
	if (new_access >= *state || new_access > DSM_READ)
		return DSM_E_UNEXPECTED;
	*state = (uint8_t)new_access;
	return DSM_OK;
}

/* ----------------------------------------------------------- wire format */

static const char *const type_names[DEX_MSG_TYPE_END] = {
	[DEX_MSG_HELLO] = "HELLO",
	[DEX_MSG_WELCOME] = "WELCOME",
	[DEX_MSG_PAGE_REQUEST] = "PAGE_REQUEST",
	[DEX_MSG_PAGE_GRANT] = "PAGE_GRANT",
	[DEX_MSG_INVALIDATE] = "INVALIDATE",
	[DEX_MSG_INVALIDATE_ACK] = "INVALIDATE_ACK",
	[DEX_MSG_MIGRATE] = "MIGRATE",
	[DEX_MSG_SYSCALL] = "SYSCALL",
	[DEX_MSG_SYSCALL_REPLY] = "SYSCALL_REPLY",
	[DEX_MSG_SHUTDOWN] = "SHUTDOWN",
	[DEX_MSG_PING] = "PING",
	[DEX_MSG_PONG] = "PONG",
	[DEX_MSG_VMA_REVOKE] = "VMA_REVOKE",
	[DEX_MSG_VMA_REVOKE_ACK] = "VMA_REVOKE_ACK",
	[DEX_MSG_PAGE_PREFETCH] = "PAGE_PREFETCH",
};

const char *dex_msg_type_name(unsigned type)
{
	if (type == 0 || type >= DEX_MSG_TYPE_END)
		return "UNKNOWN";
	return type_names[type];
}

void dex_msg_fill_header(struct dex_msg_header *header, enum dex_msg_type type, unsigned from, uint32_t length,
			 uint32_t sequence)
{
	*header = (struct dex_msg_header){ .magic = DEX_MSG_MAGIC, .type = (uint16_t)type, .from = (uint16_t)from,
					   .length = length, .sequence = sequence };
}

/* Fixed part of each payload; variable data may follow for some types. */
static size_t fixed_size(unsigned type)
{
	switch (type) {
	case DEX_MSG_HELLO: return sizeof(struct dex_msg_hello);
	case DEX_MSG_WELCOME: return sizeof(struct dex_msg_welcome);
	case DEX_MSG_PAGE_REQUEST: return sizeof(struct dex_msg_page_request);
	case DEX_MSG_PAGE_GRANT: return sizeof(struct dex_msg_page_grant);
	case DEX_MSG_INVALIDATE: return sizeof(struct dex_msg_invalidate);
	case DEX_MSG_INVALIDATE_ACK: return sizeof(struct dex_msg_invalidate_ack);
	case DEX_MSG_MIGRATE: return sizeof(struct dex_msg_migrate);
	case DEX_MSG_SYSCALL: return sizeof(struct dex_msg_syscall);
	case DEX_MSG_SYSCALL_REPLY: return sizeof(struct dex_msg_syscall_reply);
	case DEX_MSG_SHUTDOWN: return sizeof(struct dex_msg_shutdown);
	case DEX_MSG_VMA_REVOKE: return sizeof(struct dex_msg_vma_revoke);
	case DEX_MSG_VMA_REVOKE_ACK: return sizeof(struct dex_msg_vma_revoke_ack);
	case DEX_MSG_PAGE_PREFETCH: return sizeof(struct dex_msg_page_prefetch);
	default: return 0;
	}
}

size_t dex_msg_fixed_size(unsigned type)
{
	return type < DEX_MSG_TYPE_END ? fixed_size(type) : 0;
}

const char *dex_msg_check_header(const struct dex_msg_header *h, const struct dex_validation_limits *lim)
{
	if (h->magic != DEX_MSG_MAGIC)
		return "bad magic";
	if (h->type == 0 || h->type >= DEX_MSG_TYPE_END)
		return "unknown message type";
	if (h->from >= lim->nodes)
		return "sender node out of range";
	if (h->length > DEX_MAX_PAYLOAD)
		return "payload too large";
	if (h->length < fixed_size(h->type))
		return "payload shorter than its message type";
	return NULL;
}

static bool page_address_valid(uint64_t address, const struct dex_validation_limits *lim)
{
	if (address % DEX_PAGE_SIZE)
		return false;
	for (unsigned i = 0; i < lim->nregions; i++)
		if (address >= lim->regions[i].start && address < lim->regions[i].end)
			return true;
	return false;
}

/* `pages` pages from `address`, all inside one shared region. */
static bool page_run_valid(uint64_t address, uint64_t pages, const struct dex_validation_limits *lim)
{
	if (address % DEX_PAGE_SIZE || !pages)
		return false;
	for (unsigned i = 0; i < lim->nregions; i++)
		if (address >= lim->regions[i].start && address < lim->regions[i].end)
			return pages <= (lim->regions[i].end - address) / DEX_PAGE_SIZE;
	return false;
}

static const char *check_data_length(uint32_t total, size_t fixed, bool with_data)
{
	size_t want = fixed + (with_data ? DEX_PAGE_SIZE : 0);
	return total == want ? NULL : "page payload length does not match with_data";
}

const char *dex_msg_check(const struct dex_msg_header *h, const void *payload, const struct dex_validation_limits *lim)
{
	const char *why = dex_msg_check_header(h, lim);
	if (why)
		return why;
	size_t fixed = fixed_size(h->type);
	switch (h->type) {
	case DEX_MSG_HELLO: {
		const struct dex_msg_hello *m = payload;
		if (h->length != fixed)
			return "HELLO has trailing bytes";
		if (m->version != DEX_PROTOCOL_VERSION)
			return "protocol version mismatch";
		if (m->nodes != lim->nodes || m->node == 0 || m->node >= lim->nodes || m->node != h->from)
			return "HELLO node numbers inconsistent";
		return NULL;
	}
	case DEX_MSG_WELCOME:
	case DEX_MSG_SHUTDOWN:
	case DEX_MSG_PING:
	case DEX_MSG_PONG:
		return h->length == fixed ? NULL : "trailing bytes";
	case DEX_MSG_PAGE_REQUEST: {
		const struct dex_msg_page_request *m = payload;
		if (h->length != fixed)
			return "PAGE_REQUEST has trailing bytes";
		if (m->write > 1)
			return "PAGE_REQUEST write flag not 0/1";
		if (m->extra > DEX_PREFETCH_MAX)
			return "PAGE_REQUEST asks for too many extra pages";
		return page_run_valid(m->address, 1 + (uint64_t)m->extra, lim) ? NULL
									: "page address outside shared regions";
	}
	case DEX_MSG_PAGE_PREFETCH: {
		const struct dex_msg_page_prefetch *m = payload;
		if (m->count == 0 || m->count > DEX_PREFETCH_MAX)
			return "PAGE_PREFETCH count out of range";
		if (m->access != DSM_READ && m->access != DSM_WRITE)
			return "PAGE_PREFETCH access invalid";
		if (m->granted >> m->count || (m->with_data & ~m->granted))
			return "PAGE_PREFETCH bits name pages not granted or past count";
		if (!page_run_valid(m->address, m->count, lim))
			return "page address outside shared regions";
		size_t want = fixed + (size_t)__builtin_popcountll(m->with_data) * DEX_PAGE_SIZE;
		return h->length == want ? NULL : "PAGE_PREFETCH length does not match its pages";
	}
	case DEX_MSG_PAGE_GRANT: {
		const struct dex_msg_page_grant *m = payload;
		if (m->access != DSM_READ && m->access != DSM_WRITE)
			return "PAGE_GRANT access invalid";
		if (m->with_data > 1)
			return "PAGE_GRANT with_data not 0/1";
		if (!page_address_valid(m->address, lim))
			return "page address outside shared regions";
		return check_data_length(h->length, fixed, m->with_data);
	}
	case DEX_MSG_INVALIDATE: {
		const struct dex_msg_invalidate *m = payload;
		if (h->length != fixed)
			return "INVALIDATE has trailing bytes";
		if (m->access > DSM_READ || m->want_data > 1 || m->count == 0 || m->count > DEX_PREFETCH_MAX)
			return "INVALIDATE fields invalid";
		return page_run_valid(m->address, m->count, lim) ? NULL : "page address outside shared regions";
	}
	case DEX_MSG_INVALIDATE_ACK: {
		const struct dex_msg_invalidate_ack *m = payload;
		if (m->with_data > 1)
			return "INVALIDATE_ACK with_data not 0/1";
		if (m->count == 0 || m->count > DEX_PREFETCH_MAX)
			return "INVALIDATE_ACK count out of range";
		if (!page_run_valid(m->address, m->count, lim))
			return "page address outside shared regions";
		return h->length == fixed + (m->with_data ? (size_t)m->count * DEX_PAGE_SIZE : 0)
			       ? NULL
			       : "INVALIDATE_ACK length does not match its pages";
	}
	case DEX_MSG_MIGRATE: {
		const struct dex_msg_migrate *m = payload;
		if (m->carried_pages > DEX_MIGRATE_MAX_CARRIED || (m->carried_pages && m->target != 0))
			return "MIGRATE carries pages it may not";
		if (m->carried_pages && !page_run_valid(m->carried_address, m->carried_pages, lim))
			return "MIGRATE carries pages outside shared regions";
		if (h->length != fixed + (size_t)m->carried_pages * DEX_PAGE_SIZE)
			return "MIGRATE length does not match its pages";
		if (m->thread >= lim->max_threads)
			return "MIGRATE thread id out of range";
		if (m->target >= lim->nodes)
			return "MIGRATE target out of range";
		if (m->context.rsp == 0 || m->context.rip == 0 || (m->context.rsp & 7))
			return "MIGRATE context implausible";
		return NULL;
	}
	case DEX_MSG_SYSCALL: {
		const struct dex_msg_syscall *m = payload;
		if (m->thread >= lim->max_threads)
			return "SYSCALL thread id out of range";
		if (m->worker >= lim->max_workers)
			return "SYSCALL worker out of range";
		if (m->data_length > DEX_SYSCALL_MAX_DATA || h->length != fixed + m->data_length)
			return "SYSCALL data length inconsistent";
		return NULL;
	}
	case DEX_MSG_SYSCALL_REPLY: {
		const struct dex_msg_syscall_reply *m = payload;
		if (m->worker >= lim->max_workers)
			return "SYSCALL_REPLY worker out of range";
		if (m->data_length > DEX_SYSCALL_MAX_DATA || h->length != fixed + m->data_length)
			return "SYSCALL_REPLY data length inconsistent";
		return NULL;
	}
	case DEX_MSG_VMA_REVOKE: {
		const struct dex_msg_vma_revoke *m = payload;
		if (h->length != fixed)
			return "VMA_REVOKE has trailing bytes";
		if (m->rights > 7 || !m->length || (m->start | m->length) % DEX_PAGE_SIZE)
			return "VMA_REVOKE fields invalid";
		if (!page_address_valid(m->start, lim) || !page_address_valid(m->start + m->length - DEX_PAGE_SIZE, lim))
			return "VMA_REVOKE range outside shared regions";
		return NULL;
	}
	case DEX_MSG_VMA_REVOKE_ACK:
		return h->length == fixed ? NULL : "VMA_REVOKE_ACK has trailing bytes";
	default:
		return "unknown message type";
	}
}
