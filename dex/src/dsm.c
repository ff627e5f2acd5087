/* libdex DSM: the fault path. SIGSEGV becomes a protocol request; the
 * directory's actions (send a message, change a page protection) are
 * applied here; page bytes move through an always-writable alias of each
 * region; faults stream ahead through runs of pages. */
#include "internal.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <ucontext.h>

/* ------------------------------------------------------------------- DSM */

bool dex_in_shared(uintptr_t addr)
{
	for (unsigned i = 0; i < dex_rt.nregions; i++)
		if (addr >= dex_rt.regions[i].start && addr < dex_rt.regions[i].end)
			return true;
	return false;
}

int64_t dex_page_index(uintptr_t addr)
{
	for (unsigned i = 0; i < dex_rt.nregions; i++) {
		const struct dsm_region *r = &dex_rt.regions[i];
		if (addr >= r->start && addr < r->end)
			return r->first_page + (int64_t)((addr - r->start) / DEX_PAGE_SIZE);
	}
	return -1;
}

static const struct dsm_region *region_of_page(uint32_t page)
{
	for (unsigned i = dex_rt.nregions; i-- > 0;)
		if (page >= dex_rt.regions[i].first_page)
			return &dex_rt.regions[i];
	return &dex_rt.regions[0];
}

static uintptr_t page_address(uint32_t page)
{
	const struct dsm_region *r = region_of_page(page);
	return r->start + (uintptr_t)(page - r->first_page) * DEX_PAGE_SIZE;
}

char *dex_page_alias(uint32_t page)
{
	const struct dsm_region *r = region_of_page(page);
	return r->alias + (size_t)(page - r->first_page) * DEX_PAGE_SIZE;
}

/* The DSM's access, capped by the page's mapping rights (vma.c): a page
 * unmapped or made read-only stays so whatever copy the DSM holds. */
static enum dsm_access capped_access(uint32_t page, enum dsm_access access)
{
	enum dsm_access cap = dex_vma_cap(page_address(page));
	return access > cap ? cap : access;
}

/* `count` pages from `first` (in one region) get `access`, capped page by
 * page; one mprotect per run of equal protection. */
static void protect_pages(uint32_t first, uint32_t count, enum dsm_access access)
{
	static const int prot[] = { PROT_NONE, PROT_READ, PROT_READ | PROT_WRITE };
	for (uint32_t start = first, end = first + count; start < end;) {
		enum dsm_access run_access = capped_access(start, access);
		uint32_t stop = start + 1;
		while (stop < end && capped_access(stop, access) == run_access)
			stop++;
		if (raw_syscall(SYS_mprotect, page_address(start), (size_t)(stop - start) * DEX_PAGE_SIZE,
				prot[run_access]) != 0)
			dex_fatal("mprotect of shared page failed (vm.max_map_count too low?)");
		start = stop;
	}
}

static void protect_page(uint32_t page, enum dsm_access access)
{
	protect_pages(page, 1, access);
}

void dex_dsm_reprotect(uintptr_t page_addr)
{
	int64_t page = dex_page_index(page_addr);
	if (page < 0)
		return;
	dex_lock_acquire(&dex_rt.dsm_lock);
	protect_page((uint32_t)page, (enum dsm_access)dex_rt.page_state[page]);
	dex_lock_release(&dex_rt.dsm_lock);
}

char *dex_dsm_alias_of(uintptr_t addr)
{
	int64_t page = dex_page_index(addr);
	return page < 0 ? NULL : dex_page_alias((uint32_t)page) + addr % DEX_PAGE_SIZE;
}

/* Threads waiting for a grant in the futex (wait_for_epoch_change): a
 * grant wakes them only if there are any, since the wake is a system call
 * on the grant's path. Dekker: a waiter counts itself before it reads the
 * epoch, the granter bumps the epoch before it reads the count. */
static uint32_t epoch_sleepers;

static void bump_epoch(void)
{
	__atomic_add_fetch(&dex_rt.dsm_epoch, 1, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&epoch_sleepers, __ATOMIC_SEQ_CST))
		futex_wake_all(&dex_rt.dsm_epoch);
}

/* Decisions made together that travel in one message: the grants of a
 * node's prefetched pages (one PAGE_PREFETCH), or the invalidations of a
 * run of one node's pages for the origin's readahead (one INVALIDATE).
 * origin_apply's context; without one every decision is sent alone. */
struct apply_batch {
	struct dex_msg_page_prefetch grants; /* collecting while .count != 0 */
	uint32_t first_page;
	/* The origin's own new access to each page (KEEP_ACCESS: unchanged),
	 * applied before the granted pages' bytes are copied. */
	uint8_t origin_access[DEX_PREFETCH_MAX];
	bool collect_invalidations;
	unsigned invalidated_node;
	struct dex_msg_invalidate invalidations;
};

#define KEEP_ACCESS UINT8_MAX

static void batch_grant(struct apply_batch *batch, const struct dsm_action *a)
{
	uint64_t bit = UINT64_C(1) << (a->page - batch->first_page);
	batch->grants.granted |= bit;
	if (a->with_data)
		batch->grants.with_data |= bit;
}

/* Applies the origin's access changes a prefetch answer decided, one
 * mprotect per run of equal access. */
static void batch_apply_origin_access(struct apply_batch *batch)
{
	const uint8_t *access = batch->origin_access;
	for (uint32_t start = 0, count = batch->grants.count; start < count;) {
		uint32_t stop = start + 1;
		while (stop < count && access[stop] == access[start])
			stop++;
		if (access[start] != KEEP_ACCESS) {
			protect_pages(batch->first_page + start, stop - start, (enum dsm_access)access[start]);
			memset(&dex_rt.page_state[batch->first_page + start], access[start], stop - start);
		}
		start = stop;
	}
}

static void batch_invalidation(struct apply_batch *batch, const struct dsm_action *a)
{
	struct dex_msg_invalidate *run = &batch->invalidations;
	uintptr_t addr = page_address(a->page);
	if (!run->count) {
		*run = (struct dex_msg_invalidate){ .address = addr, .access = a->access, .want_data = a->with_data };
		batch->invalidated_node = a->node;
	} else if (a->node != batch->invalidated_node || addr != run->address + run->count * DEX_PAGE_SIZE ||
		   a->access != run->access || a->with_data != run->want_data) {
		dex_fatal("internal error: readahead invalidation of %#lx does not extend the run", (unsigned long)addr);
	}
	run->count++;
}

/* This process's grants of faulted pages: taking one away (a node's
 * invalidation, the origin's answer to another node's request) waits until
 * the thread that faulted on it has resumed and had a moment to make its
 * access, at most dex_rt.grant_hold_ns (DEX_GRANT_HOLD_US). Without it two nodes that spin on one
 * page (a flag, a lock word) take it from each other between a grant and
 * its use again and again: a 2000-turn ping-pong made 5,000 to 380,000
 * faults, more the shorter the round trips against a thread's wake-up
 * (Mirage's hold window). One entry per page (calloc'd, so untouched pages
 * cost no memory): any number of faults in flight are held. */
#define GRANT_USE_NS 5000ull
#define GRANT_AWAITED UINT64_MAX /* granted_ns while the request travels */
static struct grant_hold {
	uint64_t granted_ns; /* 0: no fault of this process waits for it */
	uint64_t resumed_ns; /* 0 until the faulting thread resumed */
} *grant_holds;

/* The per-page tables, once the regions are known: the origin starts as
 * every page's writer, a node with no page at all. */
void dex_dsm_tables_init(void)
{
	dex_rt.page_state = calloc(dex_rt.total_pages, 1);
	dex_rt.page_inflight = calloc(dex_rt.total_pages, 1);
	grant_holds = calloc(dex_rt.total_pages, sizeof(*grant_holds));
	if (!dex_rt.page_state || !dex_rt.page_inflight || !grant_holds)
		dex_fatal("out of memory for page tables");
	enum dsm_access initial = dex_rt.node == 0 ? DSM_WRITE : DSM_NONE;
	memset(dex_rt.page_state, initial, dex_rt.total_pages);
	if (dex_rt.node != 0)
		for (unsigned i = 0; i < dex_rt.nregions; i++)
			mprotect((void *)dex_rt.regions[i].start, dex_rt.regions[i].end - dex_rt.regions[i].start,
				 PROT_NONE);
}

/* With dsm_lock held: a thread faulted on `page` and asked for it (pages
 * fetched ahead with nobody waiting are not held). */
static void note_request(uint32_t page)
{
	__atomic_store_n(&grant_holds[page].resumed_ns, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&grant_holds[page].granted_ns, GRANT_AWAITED, __ATOMIC_RELEASE);
}

/* With dsm_lock held: `page` was granted to this process. */
static void note_grant(uint32_t page)
{
	if (grant_holds[page].granted_ns == GRANT_AWAITED)
		__atomic_store_n(&grant_holds[page].granted_ns, dex_now_ns(), __ATOMIC_RELEASE);
}

/* The faulting thread, its access about to be retried. */
static void note_grant_used(uint32_t page)
{
	__atomic_store_n(&grant_holds[page].resumed_ns, dex_now_ns(), __ATOMIC_RELEASE);
}

/* The receiver, before it takes [first, first + count) from this process. */
static void hold_recent_grants(uint32_t first, uint32_t count)
{
	for (uint32_t page = first; page < first + count; page++) {
		struct grant_hold *g = &grant_holds[page];
		uint64_t granted = __atomic_load_n(&g->granted_ns, __ATOMIC_ACQUIRE);
		if (!granted || granted == GRANT_AWAITED)
			continue;
		for (;;) {
			uint64_t now = dex_now_ns(), resumed = __atomic_load_n(&g->resumed_ns, __ATOMIC_ACQUIRE);
			if (now - granted >= dex_rt.grant_hold_ns || (resumed && now - resumed >= GRANT_USE_NS))
				break;
			raw_syscall(SYS_sched_yield, 0, 0, 0);
		}
	}
}

/* Executes one directory decision at the origin; called with dsm_lock held
 * so that messages to a node leave in the order they were decided. */
static void origin_apply(void *ctx, const struct dsm_action *a)
{
	struct apply_batch *batch = ctx;
	uintptr_t addr = page_address(a->page);
	if (batch && batch->grants.count && a->kind == DSM_ACT_GRANT) {
		batch_grant(batch, a);
		return;
	}
	if (batch && batch->grants.count && a->kind == DSM_ACT_SET_ORIGIN_ACCESS) {
		batch->origin_access[a->page - batch->first_page] = a->access;
		return;
	}
	if (batch && batch->collect_invalidations && a->kind == DSM_ACT_INVALIDATE) {
		batch_invalidation(batch, a);
		return;
	}
	switch (a->kind) {
	case DSM_ACT_INVALIDATE: {
		struct dex_msg_invalidate m = { .address = addr, .access = a->access, .want_data = a->with_data,
						.count = 1 };
		dex_send(a->node, DEX_MSG_INVALIDATE, &m, sizeof(m), NULL, 0);
		break;
	}
	case DSM_ACT_GRANT:
		if (a->node == 0) {
			/* The directory is the truth for the origin's access: a
			 * queued request may be answered with more than it asked. */
			enum dsm_access access = dsm_dir_access(&dex_rt.dir, a->page, 0);
			protect_page(a->page, access);
			dex_rt.page_state[a->page] = (uint8_t)access;
			dex_rt.page_inflight[a->page] = 0;
			note_grant(a->page);
			bump_epoch();
		} else {
			struct dex_msg_page_grant m = { .address = addr, .access = a->access,
							.with_data = a->with_data };
			dex_send(a->node, DEX_MSG_PAGE_GRANT, &m, sizeof(m), a->with_data ? dex_page_alias(a->page) : NULL,
				 a->with_data ? DEX_PAGE_SIZE : 0);
		}
		break;
	case DSM_ACT_SET_ORIGIN_ACCESS:
		protect_page(a->page, a->access);
		dex_rt.page_state[a->page] = a->access;
		break;
	}
}

/* Waits for any grant. A page that does not arrive within the fault
 * timeout means a peer is alive but not answering (stopped, livelocked):
 * stop with a message rather than hang; a dead peer is caught sooner by
 * its closed connection. `alias` (0: none) is the page the awaited grant
 * will be written into, backed while the request travels. */
static void wait_for_epoch_change(uint32_t seen, uintptr_t addr, uint64_t since_ns, uintptr_t alias)
{
	if (dex_changed_while_polling(&dex_rt.dsm_epoch, seen, since_ns, alias))
		return;
	struct timespec tick = { .tv_sec = 1 };
	__atomic_add_fetch(&epoch_sleepers, 1, __ATOMIC_SEQ_CST);
	while (__atomic_load_n(&dex_rt.dsm_epoch, __ATOMIC_SEQ_CST) == seen) {
		raw_syscall6(SYS_futex, (long)&dex_rt.dsm_epoch, FUTEX_WAIT | FUTEX_PRIVATE_FLAG, seen, (long)&tick, 0,
			     0);
		if (dex_now_ns() - since_ns > dex_rt.fault_timeout_ns)
			dex_fatal("page %#lx not granted within %llu s: a node is not responding; stopping",
				  (unsigned long)addr, (unsigned long long)(dex_rt.fault_timeout_ns / 1000000000ull));
	}
	__atomic_sub_fetch(&epoch_sleepers, 1, __ATOMIC_RELAXED);
}

static uint32_t region_end_page(uint32_t page)
{
	const struct dsm_region *r = region_of_page(page);
	return r->first_page + (uint32_t)((r->end - r->start) / DEX_PAGE_SIZE);
}

/* Readahead on a node: a fault where one of the thread's recent requests
 * ended continues a stream, which asks for twice as many following pages
 * as last time (1, 2, 4 ... DEX_PREFETCH_MAX); any other fault starts a
 * stream that asks for none, so scattered accesses never fetch what they
 * do not use. The faulting page's grant travels first, so the thread
 * resumes while the rest of a window is still on its way. */
/* Windows of at least this many pages carry a readahead marker. */
#define READAHEAD_MARKER_MIN_WINDOW 16u

static uint32_t stream_window(struct dex_thread *self, uint32_t page, bool write, struct dex_fault_stream **stream)
{
	uint32_t now = ++self->stream_clock;
	struct dex_fault_stream *oldest = &self->streams[0];
	for (unsigned i = 0; i < DEX_FAULT_STREAMS; i++) {
		struct dex_fault_stream *s = &self->streams[i];
		if (s->next_page == page && s->write == write) {
			*stream = s;
			s->last_use = now;
			return s->window ? (s->window * 2u > DEX_PREFETCH_MAX ? DEX_PREFETCH_MAX : s->window * 2u) : 1;
		}
		if (s->last_use < oldest->last_use)
			oldest = s;
	}
	/* Least recently used, not round robin: a loop reading two arrays
	 * and updating a third starts a new stream whenever the update's
	 * window runs ahead of its reads, and round robin then evicted the
	 * long-running streams of the other arrays, whose windows restarted
	 * at one page (k-means: three times as many requests). */
	*oldest = (struct dex_fault_stream){ .write = write, .last_use = now };
	*stream = oldest;
	return 0;
}

/* With dsm_lock held, for a page this thread leads: claims, as their
 * leader, up to the stream's window (at most `limit`) of the following
 * pages in the same region that this process lacks, has not asked for and
 * `eligible` accepts; returns how many. */
static uint32_t claim_following(struct dex_thread *self, uint32_t page, bool write, uint32_t limit,
				bool (*eligible)(uint32_t page, bool write, unsigned arg), unsigned arg)
{
	if (!self)
		return 0;
	struct dex_fault_stream *stream;
	uint32_t window = stream_window(self, page, write, &stream);
	uint32_t end = region_end_page(page), extra = 0;
	while (extra < window && extra < limit && page + 1 + extra < end) {
		uint32_t next = page + 1 + extra;
		if (!eligible(next, write, arg) ||
		    dsm_node_fault(&dex_rt.page_state[next], &dex_rt.page_inflight[next], write) != DSM_FAULT_LEAD)
			break;
		extra++;
	}
	stream->next_page = page + 1 + extra;
	stream->window = (uint8_t)window;
	return extra;
}

/* A node prefetches pages whose rights it already knows (asking the origin
 * would need dsm_lock released); the origin grants or declines each. */
static bool node_may_prefetch(uint32_t page, bool write, unsigned unused)
{
	(void)unused;
	return dex_vma_cap(page_address(page)) >= (write ? DSM_WRITE : DSM_READ);
}

/* With dsm_lock held, on a node, for a fault on a page whose access this
 * process already holds: a readahead marker (node_handle_prefetch), or a
 * grant that landed between the trap and the lock. Either way the page
 * gets the protection it was granted; a marker inside one of the thread's
 * streams also asks for that stream's next window, without waiting. */
static void readahead_marker_hit(struct dex_thread *self, uint32_t page)
{
	protect_page(page, (enum dsm_access)dex_rt.page_state[page]);
	if (!self)
		return;
	for (unsigned i = 0; i < DEX_FAULT_STREAMS; i++) {
		struct dex_fault_stream *s = &self->streams[i];
		uint32_t next = s->next_page;
		bool write = s->write;
		if (!s->window || page >= next || next - page > s->window)
			continue;
		if (next >= region_end_page(page) || !node_may_prefetch(next, write, 0) ||
		    dsm_node_fault(&dex_rt.page_state[next], &dex_rt.page_inflight[next], write) != DSM_FAULT_LEAD)
			return;
		dex_rt.readahead_markers++;
		struct dex_msg_page_request m = {
			.address = page_address(next), .write = write,
			.extra = claim_following(self, next, write, DEX_PREFETCH_MAX, node_may_prefetch, 0)
		};
		dex_send(0, DEX_MSG_PAGE_REQUEST, &m, sizeof(m), NULL, 0);
		return;
	}
}

/* The origin reads ahead only through pages that `owner` alone holds, so
 * that one invalidation message fetches them all. */
static bool origin_may_read_ahead(uint32_t page, bool write, unsigned owner)
{
	return !write && dsm_dir_sole_remote_owner(&dex_rt.dir, page) == owner;
}

/* The origin writes ahead through pages of one kind: all held by `owner`
 * alone (fetched with their bytes) or all shared read-only by the origin
 * and `owner` (only invalidated), so that one INVALIDATE run covers them. */
#define SHARED_KIND 0x100u
static unsigned origin_write_kind(uint32_t page)
{
	unsigned reader = dsm_dir_sole_remote_reader(&dex_rt.dir, page);
	return reader ? reader | SHARED_KIND : dsm_dir_sole_remote_owner(&dex_rt.dir, page);
}

static bool origin_may_write_ahead(uint32_t page, bool write, unsigned kind)
{
	return write && origin_write_kind(page) == kind;
}

/* The origin's own fault, with dsm_lock held. A fault continuing one of
 * the thread's fault streams on a page that one node alone holds (a read
 * or a write) or, for a write, that the origin shares with one node, also
 * fetches or invalidates the following pages of that same kind, in one
 * INVALIDATE run and one acknowledgement: the origin reads ahead, and
 * invalidations of pages it writes in order are batched. */
static void origin_fault(struct dex_thread *self, uint32_t page, bool write)
{
	unsigned kind = write ? origin_write_kind(page) : dsm_dir_sole_remote_owner(&dex_rt.dir, page);
	unsigned owner = kind & ~SHARED_KIND;
	struct apply_batch batch = { .collect_invalidations = owner != 0 };
	uint32_t extra = owner ? claim_following(self, page, write, DEX_PREFETCH_MAX - 1,
						 write ? origin_may_write_ahead : origin_may_read_ahead,
						 write ? kind : owner)
			       : 0;
	for (uint32_t i = 0; i <= extra; i++) {
		int rc = dsm_dir_request(&dex_rt.dir, page + i, 0, write, origin_apply, &batch);
		if (rc)
			dex_fatal("directory refused the origin's own fault (%d)", rc);
	}
	if (batch.invalidations.count)
		dex_send(owner, DEX_MSG_INVALIDATE, &batch.invalidations, sizeof(batch.invalidations), NULL, 0);
}

/* Leader/follower: the first thread faulting on a page sends the request,
 * later ones wait for the grant and re-run their access. `self` is the
 * faulting thread's block (NULL if unknown). */
static void dsm_fault(struct dex_thread *self, uint32_t page, bool write, uintptr_t addr, uint64_t ip)
{
	uint64_t start = dex_now_ns();
	bool led = false;
	for (bool first_pass = true;; first_pass = false) {
		dex_lock_acquire(&dex_rt.dsm_lock);
		uint32_t seen = dex_rt.dsm_epoch;
		enum dsm_fault_decision d = dsm_node_fault(&dex_rt.page_state[page], &dex_rt.page_inflight[page], write);
		if (d == DSM_FAULT_RETRY && first_pass && dex_rt.node != 0)
			readahead_marker_hit(self, page);
		if (d == DSM_FAULT_LEAD) {
			led = true;
			if (write)
				dex_rt.faults_write++;
			else
				dex_rt.faults_read++;
			note_request(page);
			if (dex_rt.node == 0) {
				origin_fault(self, page, write);
			} else {
				struct dex_msg_page_request m = {
					.address = page_address(page), .write = write,
					.extra = claim_following(self, page, write, DEX_PREFETCH_MAX, node_may_prefetch, 0)
				};
				dex_send(0, DEX_MSG_PAGE_REQUEST, &m, sizeof(m), NULL, 0);
			}
		}
		dex_lock_release(&dex_rt.dsm_lock);
		if (d == DSM_FAULT_RETRY)
			break;
		bool asked = led && first_pass && dex_rt.node != 0;
		wait_for_epoch_change(seen, addr, start, asked ? (uintptr_t)dex_page_alias(page) : 0);
	}
	note_grant_used(page);
	if (dex_tracing) {
		enum dex_trace_kind kind = write ? (led ? DEX_TRACE_WRITE : DEX_TRACE_WRITE_COALESCED)
						 : (led ? DEX_TRACE_READ : DEX_TRACE_READ_COALESCED);
		dex_trace_record(kind, self ? self->thread_id : UINT32_MAX,
				 self ? self->trace_tag : 0, ip, addr, start, dex_now_ns());
	}
}

void dex_prefault(uintptr_t addr, size_t len, bool write)
{
	if (!dex_rt.active || !len)
		return;
	uintptr_t first = addr & ~(uintptr_t)(DEX_PAGE_SIZE - 1);
	for (uintptr_t p = first; p < addr + len; p += DEX_PAGE_SIZE) {
		uintptr_t touch = p < addr ? addr : p;
		if (!dex_in_shared(touch) || !dex_vma_allows(touch, write))
			continue; /* unmapped: the kernel reports EFAULT, as on Linux */
		if (write)
			__atomic_fetch_or((volatile char *)touch, 0, __ATOMIC_RELAXED);
		else
			(void)*(volatile const char *)touch;
	}
}

/* Sends this process's request for the pages of [addr, addr + len) that
 * it lacks and nobody here has asked for, without waiting: a thread
 * touching them later finds the request in flight (or already granted). */
void dex_dsm_fetch_ahead(uintptr_t addr, size_t len, bool write)
{
	if (!dex_rt.active || !len)
		return;
	uintptr_t first = addr & ~(uintptr_t)(DEX_PAGE_SIZE - 1);
	for (uintptr_t p = first; p < addr + len; p += DEX_PAGE_SIZE) {
		int64_t page = dex_page_index(p);
		if (page < 0 || dex_vma_cap(p) < (write ? DSM_WRITE : DSM_READ))
			continue;
		dex_lock_acquire(&dex_rt.dsm_lock);
		if (dsm_node_fault(&dex_rt.page_state[page], &dex_rt.page_inflight[page], write) == DSM_FAULT_LEAD) {
			if (dex_rt.node == 0) {
				origin_fault(NULL, (uint32_t)page, write);
			} else {
				struct dex_msg_page_request m = { .address = p, .write = write };
				dex_send(0, DEX_MSG_PAGE_REQUEST, &m, sizeof(m), NULL, 0);
			}
		}
		dex_lock_release(&dex_rt.dsm_lock);
	}
}

/* Sends `m`, a thread's MIGRATE towards the origin, carrying the pages of
 * [addr, addr + len) (at most DEX_MIGRATE_MAX_CARRIED, the top of its
 * stack) that this node holds, released to the origin: the thread's home
 * then resumes it without fetching them or invalidating our copies. Under
 * dsm_lock, so that no later request of ours for those pages overtakes
 * the release. */
void dex_dsm_send_migrate_home(struct dex_msg_migrate *m, uintptr_t addr, size_t len)
{
	int64_t first = dex_page_index(addr), last = dex_page_index(addr + len - 1);
	dex_lock_acquire(&dex_rt.dsm_lock);
	m->carried_pages = 0;
	for (int64_t page = first; page >= 0 && page <= last && m->carried_pages < DEX_MIGRATE_MAX_CARRIED; page++) {
		if (region_of_page((uint32_t)page) != region_of_page((uint32_t)first) ||
		    dsm_node_release(&dex_rt.page_state[page], &dex_rt.page_inflight[page]) != DSM_OK) {
			if (m->carried_pages)
				break; /* keep the run contiguous */
			continue;
		}
		/* Protect first, then copy: no local thread can change the
		 * bytes after the mprotect returns. */
		protect_page((uint32_t)page, DSM_NONE);
		if (!m->carried_pages)
			m->carried_address = page_address((uint32_t)page);
		m->carried_pages++;
	}
	dex_send(0, DEX_MSG_MIGRATE, m, sizeof(*m),
		 m->carried_pages ? dex_page_alias((uint32_t)dex_page_index(m->carried_address)) : NULL,
		 (size_t)m->carried_pages * DEX_PAGE_SIZE);
	dex_lock_release(&dex_rt.dsm_lock);
}

/* The origin's side: the pages a MIGRATE from `from` carries, whose bytes
 * are in place (receive_into_alias), become the origin's (dsm_dir_release). */
void dex_dsm_accept_carried(unsigned from, const struct dex_msg_migrate *m)
{
	if (!m->carried_pages)
		return;
	uint32_t first = (uint32_t)dex_page_index(m->carried_address);
	dex_lock_acquire(&dex_rt.dsm_lock);
	for (uint32_t page = first; page < first + m->carried_pages; page++) {
		int err = dsm_dir_release(&dex_rt.dir, page, from, origin_apply, NULL);
		if (err)
			dex_fatal("rejected MIGRATE from node %u carrying %#llx (%d)", from,
				  (unsigned long long)page_address(page), err);
	}
	dex_rt.pages_received += m->carried_pages;
	dex_lock_release(&dex_rt.dsm_lock);
}

/* A node applying what the origin sent; the origin answering a node's prefetch. */

/* The page's bytes, if any, are in its alias already (receive_message). */
void dex_node_handle_grant(const struct dex_msg_page_grant *m)
{
	uint32_t page = (uint32_t)dex_page_index(m->address);
	dex_lock_acquire(&dex_rt.dsm_lock);
	if (dsm_node_grant(&dex_rt.page_state[page], &dex_rt.page_inflight[page], m->access) != DSM_OK)
		dex_fatal("rejected PAGE_GRANT for %#llx: no request in flight", (unsigned long long)m->address);
	if (m->with_data)
		dex_rt.pages_received++;
	protect_page(page, m->access);
	note_grant(page);
	dex_lock_release(&dex_rt.dsm_lock);
	bump_epoch();
}

void dex_node_handle_prefetch(const struct dex_msg_page_prefetch *m)
{
	uint32_t first = (uint32_t)dex_page_index(m->address);
	/* A long read window leaves its middle page's protection as it was:
	 * the first touch there traps locally (readahead_marker_hit) and asks
	 * for the next window while the thread reads the second half of this
	 * one, so a stream does not stop for a round trip at every window.
	 * Write windows have none: asking ahead past the end of what a thread
	 * writes would take pages from their other writers. */
	uint32_t marker = m->access == DSM_READ && m->count >= READAHEAD_MARKER_MIN_WINDOW ? first + m->count / 2
											   : UINT32_MAX;
	dex_lock_acquire(&dex_rt.dsm_lock);
	uint32_t run_start = first; /* granted pages not yet protected */
	for (uint32_t i = 0; i < m->count; i++) {
		uint32_t page = first + i;
		bool granted = m->granted & (UINT64_C(1) << i);
		int rc = granted ? dsm_node_grant(&dex_rt.page_state[page], &dex_rt.page_inflight[page], m->access)
				 : dsm_node_decline(&dex_rt.page_inflight[page]);
		if (rc != DSM_OK)
			dex_fatal("rejected PAGE_PREFETCH for %#llx: not asked for", (unsigned long long)page_address(page));
		if (!granted || page == marker) {
			protect_pages(run_start, page - run_start, m->access);
			run_start = page + 1;
			if (!granted)
				continue;
		}
		dex_rt.pages_prefetched++;
		if (m->with_data & (UINT64_C(1) << i))
			dex_rt.pages_received++; /* its bytes are in place (receive_message) */
	}
	protect_pages(run_start, first + m->count - run_start, m->access);
	dex_lock_release(&dex_rt.dsm_lock);
	bump_epoch();
}

/* Lowers `count` pages from `first` to `access` and acknowledges their
 * invalidation, with their bytes if wanted (a run lies in one region, whose
 * alias is contiguous). Protect first, then read: no local thread can
 * change the bytes after the mprotect returns. */
static void node_ack_invalidations(uint32_t first, uint32_t count, enum dsm_access access, bool with_data)
{
	if (!count)
		return;
	protect_pages(first, count, access);
	struct dex_msg_invalidate_ack ack = { .address = page_address(first), .with_data = with_data, .count = count };
	dex_send(0, DEX_MSG_INVALIDATE_ACK, &ack, sizeof(ack), with_data ? dex_page_alias(first) : NULL,
		 with_data ? (size_t)count * DEX_PAGE_SIZE : 0);
}

void dex_node_handle_invalidate(const struct dex_msg_invalidate *m)
{
	uint32_t first = (uint32_t)dex_page_index(m->address);
	uint64_t start = dex_tracing ? dex_now_ns() : 0;
	hold_recent_grants(first, m->count);
	dex_lock_acquire(&dex_rt.dsm_lock);
	/* Pages whose invalidation crossed our release of them are not
	 * acknowledged (the release was the answer); the rest are, in runs. */
	uint32_t run_start = first;
	for (uint32_t page = first; page < first + m->count; page++) {
		uint8_t held = dex_rt.page_state[page];
		int rc = dsm_node_invalidate(&dex_rt.page_state[page], &dex_rt.page_inflight[page], m->access);
		if (rc == DSM_CROSSED) {
			node_ack_invalidations(run_start, page - run_start, m->access, m->want_data);
			run_start = page + 1;
			continue;
		}
		if (rc != DSM_OK)
			dex_fatal("rejected INVALIDATE for %#llx: holding access %u",
				  (unsigned long long)page_address(page), held);
		dex_rt.invalidations_served++;
	}
	node_ack_invalidations(run_start, first + m->count - run_start, m->access, m->want_data);
	dex_lock_release(&dex_rt.dsm_lock);
	if (dex_tracing)
		for (uint32_t i = 0; i < m->count; i++)
			dex_trace_record(DEX_TRACE_INVALIDATE, UINT32_MAX, 0, 0, m->address + i * DEX_PAGE_SIZE, start,
					 dex_now_ns());
}

/* With dsm_lock held: grants or declines the `count` pages from `first`
 * that `peer` asked for beyond its faulting page, in one answer. */
static int origin_answer_prefetch(unsigned peer, uint32_t first, uint32_t count, bool write)
{
	struct apply_batch batch = { .grants = { .address = page_address(first), .count = count,
						 .access = write ? DSM_WRITE : DSM_READ },
				     .first_page = first };
	memset(batch.origin_access, KEEP_ACCESS, sizeof(batch.origin_access));
	for (uint32_t i = 0; i < count; i++) {
		int granted = dsm_dir_prefetch(&dex_rt.dir, first + i, peer, write, origin_apply, &batch);
		if (granted < 0)
			return granted;
	}
	/* Protect first, then send: no thread here can change the bytes of a
	 * page it may no longer write once the mprotect returns, and the
	 * pages' bytes go out from the alias itself, run by run. */
	batch_apply_origin_access(&batch);
	struct iovec runs[DEX_PREFETCH_MAX];
	int nruns = 0;
	for (uint32_t i = 0; i < count; i++) {
		if (!(batch.grants.with_data & (UINT64_C(1) << i)))
			continue;
		char *bytes = dex_page_alias(first + i);
		if (nruns && (char *)runs[nruns - 1].iov_base + runs[nruns - 1].iov_len == bytes)
			runs[nruns - 1].iov_len += DEX_PAGE_SIZE;
		else
			runs[nruns++] = (struct iovec){ bytes, DEX_PAGE_SIZE };
	}
	dex_sendv(peer, DEX_MSG_PAGE_PREFETCH, &batch.grants, sizeof(batch.grants), runs, nruns);
	return 0;
}

/* The origin serving a node's fault (and the pages it asks for ahead). */
void dex_origin_handle_page_request(unsigned peer, const struct dex_msg_page_request *m)
{
	uint32_t page = (uint32_t)dex_page_index(m->address);
	hold_recent_grants(page, 1 + m->extra);
	dex_lock_acquire(&dex_rt.dsm_lock);
	int err = dsm_dir_request(&dex_rt.dir, page, peer, m->write, origin_apply, NULL);
	if (!err && m->extra)
		err = origin_answer_prefetch(peer, page + 1, m->extra, m->write);
	dex_lock_release(&dex_rt.dsm_lock);
	if (err)
		dex_fatal("rejected PAGE_REQUEST from node %u for %#llx (%d)", peer, (unsigned long long)m->address,
			  err);
}

/* A node gave pages up; their bytes, if any, are in place (dex_receive_message). */
void dex_origin_handle_invalidate_ack(unsigned peer, const struct dex_msg_invalidate_ack *m)
{
	uint32_t first = (uint32_t)dex_page_index(m->address);
	dex_lock_acquire(&dex_rt.dsm_lock);
	if (m->with_data)
		dex_rt.pages_received += m->count;
	for (uint32_t page = first; page < first + m->count; page++) {
		int err = dsm_dir_ack(&dex_rt.dir, page, peer, m->with_data, origin_apply, NULL);
		if (err)
			dex_fatal("rejected INVALIDATE_ACK from node %u for %#llx (%d)", peer,
				  (unsigned long long)page_address(page), err);
	}
	dex_lock_release(&dex_rt.dsm_lock);
}

static void restore_default_and_return(int sig)
{
	struct kernel_sigaction act = { SIG_DFL, 0, 0, 0 };
	raw_syscall6(SYS_rt_sigaction, sig, (long)&act, 0, 8, 0, 0);
}

static void on_sigsegv(int sig, siginfo_t *si, void *ucontext)
{
	ucontext_t *uc = ucontext;
	uintptr_t addr = (uintptr_t)si->si_addr;
	int64_t page = dex_rt.active ? dex_page_index(addr) : -1;
	if (page < 0 || si->si_code != SEGV_ACCERR) {
		dex_error("segmentation fault at address %#lx (instruction %#llx)", (unsigned long)addr,
			(unsigned long long)uc->uc_mcontext.gregs[REG_RIP]);
		restore_default_and_return(sig);
		return;
	}
	struct dex_thread *self = dex_self_in_handler(uc);
	if (self && self->role == DEX_ROLE_SERVICE)
		dex_fatal("runtime thread touched shared page %#lx", (unsigned long)addr);
	bool write = (uc->uc_mcontext.gregs[REG_ERR] & 2) != 0;
	if (!dex_vma_allows(addr, write)) {
		dex_deliver_app_sigsegv(si, uc, dex_vma_is_mapped(addr) ? SEGV_ACCERR : SEGV_MAPERR);
		return;
	}
	dsm_fault(self, (uint32_t)page, write, addr, (uint64_t)uc->uc_mcontext.gregs[REG_RIP]);
}

/* Installed with our own restorer so that returning from the handler does
 * not issue rt_sigreturn from libc's text, which would itself trap under
 * Syscall User Dispatch. */
static void install_handler(int sig, void *handler)
{
	struct kernel_sigaction act = { .handler = handler,
					.flags = SA_SIGINFO | SA_ONSTACK | SA_RESTORER,
					.restorer = (void *)dex_sigreturn_trampoline,
					.mask = 0 };
	if (raw_syscall6(SYS_rt_sigaction, sig, (long)&act, 0, 8, 0, 0) != 0)
		dex_fatal("cannot install handler for signal %d", sig);
}

void dex_install_signal_handlers(void)
{
	install_handler(SIGSEGV, (void *)on_sigsegv);
	install_handler(SIGSYS, (void *)dex_sigsys_handler);
}
