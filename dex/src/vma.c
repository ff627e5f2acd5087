/* Address-space layout changes (DEX section III-D, on-demand VMA sync).
 *
 * The top quarter of the shared window is the "mapped area": anonymous
 * mmap()s and the emulated brk() of application threads live there. Each
 * of its pages has rights (a dsm_access: NONE = unmapped, READ, WRITE =
 * read-write). The origin owns the authoritative table and runs every
 * mmap/munmap/mprotect/mremap/brk (nodes delegate them). Rights that shrink
 * are broadcast to every node, and acknowledged, before the call returns,
 * so no node keeps a stale mapping; rights that grow are not sent: a node
 * caches only rights it was told, and a fault its cache does not allow is
 * checked with the origin before it counts as a real SIGSEGV.
 *
 * Page protections stay the DSM's job; they are capped by the page's rights
 * wherever the DSM sets them (dsm.c protect_page). */
#include "internal.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#ifndef MREMAP_MAYMOVE
#define MREMAP_MAYMOVE 1
#endif

static uintptr_t area_start, area_end;   /* the mapped area */
static uintptr_t brk_start, brk_limit;   /* its first part: brk's range */
static uint8_t *rights;                  /* origin: the truth; node: what it was told */

/* origin only, under layout_lock */
static struct dex_lock layout_lock;
static uintptr_t mmap_next;              /* bump above every range handed out */
/* Unmapped ranges, handed out again first-fit. A full list only leaks
 * address space. */
#define FREE_RANGES 256
static struct free_range {
	uintptr_t start, size;
} free_ranges[FREE_RANGES];
static unsigned nfree_ranges;
static uintptr_t brk_current, brk_high_water;
static uint32_t revoke_generation;       /* bumped before each broadcast */
static uint32_t revoke_acks_pending;     /* futex word */

/* node only */
static struct dex_lock cache_lock;
static uint32_t revoke_generation_seen;

static size_t area_index(uintptr_t addr)
{
	return (addr - area_start) / DEX_PAGE_SIZE;
}

static bool in_area(uintptr_t addr)
{
	return rights && addr >= area_start && addr < area_end;
}

static uintptr_t page_up(uintptr_t x)
{
	return (x + DEX_PAGE_SIZE - 1) & ~(uintptr_t)(DEX_PAGE_SIZE - 1);
}

#define MAPPED 4u
#define ACCESS(r) ((r) & 3u)

static uint8_t rights_of_prot(long prot)
{
	if (prot & PROT_WRITE)
		return MAPPED | DSM_WRITE;
	return MAPPED | (prot & PROT_READ ? DSM_READ : DSM_NONE);
}

void dex_vma_init(void)
{
	const struct dsm_region *heap = &dex_rt.regions[dex_rt.nregions - 1];
	area_end = heap->end;
	area_start = area_end - (area_end - heap->start) / 4;
	brk_start = area_start;
	brk_limit = area_start + (area_end - area_start) / 4;
	size_t pages = (area_end - area_start) / DEX_PAGE_SIZE;
	long table = raw_syscall6(SYS_mmap, 0, (long)pages, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (table < 0)
		dex_fatal("out of memory for the mapping table");
	rights = (uint8_t *)table;
	mmap_next = brk_limit;
	brk_current = brk_high_water = brk_start;
	/* Nothing is mapped yet: the origin's view of the area must fault
	 * (nodes start with every shared page inaccessible anyway). */
	if (dex_rt.node == 0)
		raw_syscall(SYS_mprotect, area_start, area_end - area_start, PROT_NONE);
}

uintptr_t dex_vma_area_start(void)
{
	return area_start;
}

enum dsm_access dex_vma_cap(uintptr_t page_addr)
{
	return in_area(page_addr) ? (enum dsm_access)ACCESS(__atomic_load_n(&rights[area_index(page_addr)], __ATOMIC_ACQUIRE))
				  : DSM_WRITE;
}

bool dex_vma_is_mapped(uintptr_t addr)
{
	return !in_area(addr) || (__atomic_load_n(&rights[area_index(addr)], __ATOMIC_ACQUIRE) & MAPPED);
}

static void reprotect_range(uintptr_t start, uintptr_t end)
{
	for (uintptr_t p = start; p < end; p += DEX_PAGE_SIZE)
		dex_dsm_reprotect(p);
}

static void set_rights(uintptr_t start, uintptr_t end, uint8_t value)
{
	for (uintptr_t p = start; p < end; p += DEX_PAGE_SIZE)
		__atomic_store_n(&rights[area_index(p)], value, __ATOMIC_SEQ_CST);
}

/* Unmapped memory goes back to the kernel: the memfd's pages are freed. */
static void release_memory(uintptr_t start, uintptr_t end)
{
	raw_syscall(SYS_madvise, (long)dex_dsm_alias_of(start), (long)(end - start), MADV_REMOVE);
}

/* Origin, under layout_lock, after the table says the new rights: every
 * node caps its cache and protections, and we wait until all did. */
static void broadcast_revoke(uintptr_t start, uintptr_t end, uint8_t value)
{
	uint32_t generation = __atomic_add_fetch(&revoke_generation, 1, __ATOMIC_SEQ_CST);
	dex_rt.layout_revokes++;
	struct dex_msg_vma_revoke m = { .start = start, .length = end - start, .rights = value,
					.generation = generation };
	__atomic_store_n(&revoke_acks_pending, dex_rt.nodes - 1, __ATOMIC_SEQ_CST);
	for (unsigned n = 1; n < dex_rt.nodes; n++)
		dex_send(n, DEX_MSG_VMA_REVOKE, &m, sizeof(m), NULL, 0);
	uint64_t since = dex_now_ns();
	struct timespec tick = { .tv_sec = 1 };
	uint32_t pending;
	while ((pending = __atomic_load_n(&revoke_acks_pending, __ATOMIC_ACQUIRE)) != 0) {
		raw_syscall6(SYS_futex, (long)&revoke_acks_pending, FUTEX_WAIT | FUTEX_PRIVATE_FLAG, pending,
			     (long)&tick, 0, 0);
		if (dex_now_ns() - since > dex_rt.fault_timeout_ns)
			dex_fatal("a node did not acknowledge an unmap or protection change; stopping");
	}
	reprotect_range(start, end);
}

void dex_vma_origin_revoke_ack(unsigned from, const struct dex_msg_vma_revoke_ack *m)
{
	if (m->generation != __atomic_load_n(&revoke_generation, __ATOMIC_ACQUIRE) ||
	    !__atomic_load_n(&revoke_acks_pending, __ATOMIC_ACQUIRE))
		dex_fatal("rejected VMA_REVOKE_ACK from node %u: no such change pending", from);
	if (__atomic_sub_fetch(&revoke_acks_pending, 1, __ATOMIC_ACQ_REL) == 0)
		raw_futex(&revoke_acks_pending, FUTEX_WAKE | FUTEX_PRIVATE_FLAG, 1);
}

void dex_vma_node_revoke(const struct dex_msg_vma_revoke *m)
{
	uintptr_t start = m->start, end = m->start + m->length;
	if (!in_area(start) || end > area_end)
		dex_fatal("rejected VMA_REVOKE for %#llx outside the mapped area", (unsigned long long)start);
	dex_lock_acquire(&cache_lock);
	revoke_generation_seen = m->generation;
	for (uintptr_t p = start; p < end; p += DEX_PAGE_SIZE) {
		/* Cap what this node was told; pages it never asked about stay unknown. */
		uint8_t *r = &rights[area_index(p)];
		if (*r && (ACCESS(*r) > ACCESS(m->rights) || !(m->rights & MAPPED)))
			__atomic_store_n(r, (uint8_t)m->rights, __ATOMIC_RELEASE);
	}
	dex_lock_release(&cache_lock);
	reprotect_range(start, end);
	if (!(m->rights & MAPPED))
		release_memory(start, end);
	dex_rt.layout_revokes++; /* only the receiver thread applies revokes */
	struct dex_msg_vma_revoke_ack ack = { .generation = m->generation };
	dex_send(0, DEX_MSG_VMA_REVOKE_ACK, &ack, sizeof(ack), NULL, 0);
}

/* Origin: answer a node's question about an address. The result packs the
 * generation (so the node can tell an answer overtaken by a revoke), how
 * many pages from the address share the rights, and the rights. */
static long answer_query(uintptr_t addr)
{
	if (!in_area(addr))
		return -EINVAL;
	uint64_t generation = __atomic_load_n(&revoke_generation, __ATOMIC_SEQ_CST);
	size_t first = area_index(addr), total = (area_end - area_start) / DEX_PAGE_SIZE;
	uint8_t value = __atomic_load_n(&rights[first], __ATOMIC_SEQ_CST);
	size_t run = 1;
	while (first + run < total && run < 4096 && __atomic_load_n(&rights[first + run], __ATOMIC_SEQ_CST) == value)
		run++;
	return (long)(generation << 32 | run << 8 | value);
}

/* Node: learn the rights around addr from the origin. */
static void node_learn(uintptr_t addr)
{
	uintptr_t page = addr & ~(uintptr_t)(DEX_PAGE_SIZE - 1);
	for (;;) {
		long answer = dex_ask_origin_rights(page);
		__atomic_add_fetch(&dex_rt.layout_queries, 1, __ATOMIC_RELAXED);
		if (answer == -EBUSY)
			return; /* cannot ask now: the access is refused */
		if (answer < 0)
			dex_fatal("the origin refused a mapping query for %#lx (%ld)", (unsigned long)addr, answer);
		uint32_t generation = (uint32_t)((uint64_t)answer >> 32);
		size_t run = ((uint64_t)answer >> 8) & 0xffffff;
		uint8_t value = (uint8_t)(answer & 0xff);
		dex_lock_acquire(&cache_lock);
		/* A revoke applied after the origin answered makes the answer stale. */
		bool current = (int32_t)(generation - revoke_generation_seen) >= 0;
		if (current)
			for (size_t i = 0; i < run; i++)
				__atomic_store_n(&rights[area_index(page) + i], value, __ATOMIC_RELEASE);
		dex_lock_release(&cache_lock);
		if (current) {
			if (ACCESS(value) != DSM_NONE)
				reprotect_range(page, page + run * DEX_PAGE_SIZE);
			return;
		}
	}
}

bool dex_vma_allows(uintptr_t addr, bool write)
{
	if (!in_area(addr))
		return true;
	enum dsm_access need = write ? DSM_WRITE : DSM_READ;
	if (dex_vma_cap(addr) >= need)
		return true;
	if (dex_rt.node == 0)
		return false;
	node_learn(addr);
	return dex_vma_cap(addr) >= need;
}

bool dex_vma_allows_range(uintptr_t addr, size_t len, bool write)
{
	if (!len)
		return true;
	uintptr_t first = addr & ~(uintptr_t)(DEX_PAGE_SIZE - 1);
	for (uintptr_t p = first; p < addr + len; p += DEX_PAGE_SIZE)
		if (!dex_vma_allows(p, write))
			return false;
	return true;
}

bool dex_vma_is_layout_call(long nr, const long a[6])
{
	switch (nr) {
	case SYS_mmap:
		return a[0] == 0 &&
		       ((int)a[3] & (MAP_ANONYMOUS | MAP_PRIVATE | MAP_SHARED | MAP_FIXED)) == (MAP_ANONYMOUS | MAP_PRIVATE) &&
		       !(a[2] & ~(long)(PROT_READ | PROT_WRITE));
	case SYS_munmap:
	case SYS_mprotect:
	case SYS_mremap:
		return dex_in_shared((uintptr_t)a[0]);
	case SYS_brk:
		return true;
	default:
		return false;
	}
}

/* ------------------------------------------------ the origin's changes */

static uintptr_t take_free_range(size_t size)
{
	for (unsigned i = 0; i < nfree_ranges; i++) {
		struct free_range *f = &free_ranges[i];
		if (f->size < size)
			continue;
		uintptr_t start = f->start;
		f->start += size;
		f->size -= size;
		if (!f->size)
			*f = free_ranges[--nfree_ranges];
		return start;
	}
	return 0;
}

static void give_free_range(uintptr_t start, uintptr_t end)
{
	if (start < end && start >= brk_limit && nfree_ranges < FREE_RANGES)
		free_ranges[nfree_ranges++] = (struct free_range){ start, end - start };
}

static long do_mmap(size_t length, uint8_t value)
{
	size_t size = page_up(length);
	if (!size || size > area_end - brk_limit)
		return -ENOMEM;
	uintptr_t start = take_free_range(size);
	if (!start) {
		if (size > area_end - mmap_next)
			return -ENOMEM;
		start = mmap_next;
		mmap_next += size;
		set_rights(start, start + size, value); /* growth: nodes learn on demand */
		reprotect_range(start, start + size);
		return (long)start;
	}
	/* A reused range: unmapping released every node's copy, but a grant
	 * racing the unmap may have left old bytes somewhere; Linux hands out
	 * zeroes, so write them through the DSM. */
	set_rights(start, start + size, MAPPED | DSM_WRITE);
	reprotect_range(start, start + size);
	memset((void *)start, 0, size);
	if (value != (MAPPED | DSM_WRITE)) {
		/* a node may have learnt read-write meanwhile */
		set_rights(start, start + size, value);
		broadcast_revoke(start, start + size, value);
	}
	return (long)start;
}

static long do_munmap(uintptr_t start, size_t length)
{
	uintptr_t end = page_up(start + length);
	if (start % DEX_PAGE_SIZE || !length)
		return -EINVAL;
	if (end > area_end)
		end = area_end;
	uintptr_t run = 0;
	bool any_mapped = false;
	for (uintptr_t p = start; p < end; p += DEX_PAGE_SIZE) {
		bool mapped = rights[area_index(p)] & MAPPED;
		any_mapped |= mapped;
		if (mapped && !run)
			run = p;
		if (!mapped && run) {
			give_free_range(run, p);
			run = 0;
		}
	}
	if (run)
		give_free_range(run, end);
	if (!any_mapped)
		return 0; /* nothing to tell the nodes */
	set_rights(start, end, 0);
	broadcast_revoke(start, end, 0);
	release_memory(start, end);
	return 0;
}

static long do_mprotect(uintptr_t start, size_t length, long prot)
{
	uintptr_t end = page_up(start + length);
	if (start % DEX_PAGE_SIZE || (prot & ~(long)(PROT_READ | PROT_WRITE)))
		return -EINVAL;
	if (end > area_end)
		return -ENOMEM;
	bool lowers = false;
	for (uintptr_t p = start; p < end; p += DEX_PAGE_SIZE) {
		uint8_t r = rights[area_index(p)];
		if (!(r & MAPPED))
			return -ENOMEM; /* as Linux: part of the range is not mapped */
		lowers |= ACCESS(r) > ACCESS(rights_of_prot(prot));
	}
	set_rights(start, end, rights_of_prot(prot));
	if (lowers)
		broadcast_revoke(start, end, rights_of_prot(prot));
	else
		reprotect_range(start, end);
	return 0;
}

static long do_mremap(uintptr_t old, size_t old_length, size_t new_length, long flags)
{
	size_t old_size = page_up(old_length), new_size = page_up(new_length);
	if (old % DEX_PAGE_SIZE || !new_size)
		return -EINVAL;
	if (new_size <= old_size) {
		if (new_size < old_size)
			do_munmap(old + new_size, old_size - new_size);
		return (long)old;
	}
	if (!(flags & MREMAP_MAYMOVE))
		return -ENOMEM;
	uint8_t value = rights[area_index(old)];
	long moved = do_mmap(new_size, MAPPED | DSM_WRITE); /* writable while we copy */
	if (moved < 0)
		return moved;
	/* Copied through the DSM: the bytes may be on any node. */
	memcpy((void *)moved, (const void *)old, old_size);
	if (value != (MAPPED | DSM_WRITE)) {
		set_rights((uintptr_t)moved, (uintptr_t)moved + new_size, value);
		broadcast_revoke((uintptr_t)moved, (uintptr_t)moved + new_size, value);
	}
	do_munmap(old, old_size);
	return moved;
}

/* brk with the kernel's semantics (the new break, or the old one if the
 * request cannot be met), in the first part of the mapped area. */
static long do_brk(uintptr_t wanted)
{
	if (wanted < brk_start || wanted > brk_limit)
		return (long)brk_current;
	uintptr_t old_top = page_up(brk_current), new_top = page_up(wanted);
	if (new_top > old_top) {
		set_rights(old_top, new_top, MAPPED | DSM_WRITE);
		reprotect_range(old_top, new_top);
		/* Pages given back earlier still hold old bytes somewhere in
		 * the DSM; Linux hands out zeroes. */
		uintptr_t reused_end = new_top < brk_high_water ? new_top : brk_high_water;
		if (reused_end > old_top)
			memset((void *)old_top, 0, reused_end - old_top);
		if (new_top > brk_high_water)
			brk_high_water = new_top;
	} else if (new_top < old_top) {
		set_rights(new_top, old_top, 0);
		broadcast_revoke(new_top, old_top, 0);
		release_memory(new_top, old_top);
	}
	brk_current = wanted;
	return (long)wanted;
}

bool dex_vma_origin_call(long nr, const long a[6], long *ret)
{
	if (nr == DEX_VMA_QUERY_CALL) {
		*ret = answer_query((uintptr_t)a[0]);
		return true;
	}
	if (!rights || !dex_vma_is_layout_call(nr, a))
		return false;
	uintptr_t addr = (uintptr_t)a[0];
	/* Globals and the malloc heap belong to the DSM and are never given
	 * back: changes there succeed without effect, as before. */
	if (nr != SYS_mmap && nr != SYS_brk && !in_area(addr)) {
		*ret = nr == SYS_mremap ? -ENOMEM : 0;
		return true;
	}
	dex_lock_acquire(&layout_lock);
	switch (nr) {
	case SYS_mmap: *ret = do_mmap((size_t)a[1], rights_of_prot(a[2])); break;
	case SYS_munmap: *ret = do_munmap(addr, (size_t)a[1]); break;
	case SYS_mprotect: *ret = do_mprotect(addr, (size_t)a[1], a[2]); break;
	case SYS_mremap: *ret = do_mremap(addr, (size_t)a[1], (size_t)a[2], a[3]); break;
	default: *ret = do_brk(addr); break;
	}
	dex_lock_release(&layout_lock);
	return true;
}

/* brk from libdex's own code (the interposed brk/sbrk): not trapped by
 * Syscall User Dispatch, so routed here by hand. */
long dex_vma_brk(uintptr_t wanted)
{
	long a[6] = { (long)wanted };
	long ret;
	if (dex_rt.node != 0)
		return dex_delegate_call(SYS_brk, a);
	dex_vma_origin_call(SYS_brk, a, &ret);
	return ret;
}
