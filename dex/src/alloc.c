/* The shared heap: malloc and friends for application threads.
 *
 * Application threads allocate from a window at the same fixed address on
 * every node, managed by the DSM, so a pointer handed to a thread on
 * another node stays valid. The allocator's own state lives in the first
 * page of the window and is protected by a pthread mutex there, which works
 * across nodes because futex calls are delegated to the origin.
 * Runtime threads, and everything before the window exists, use glibc's
 * allocator; free() tells the two apart by address. */
#include "internal.h"

#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <string.h>

#include "../include/dex.h"

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

#define HEADER_BYTES 16u
#define HEADER_MAGIC 0xde5a110cu
#define SMALL_CLASSES 7 /* blocks of 32 .. 2048 bytes including the header */
#define STATE_BYTES DEX_PAGE_SIZE

enum block_kind { BLOCK_SMALL = 1, BLOCK_LARGE, BLOCK_ALIGNED };

struct block_header {
	uint32_t magic;
	uint32_t kind;
	uint64_t value; /* small: class; large: pages; aligned: underlying pointer */
};

struct free_span {
	uintptr_t next;
	size_t pages;
};

struct heap_state {
	pthread_mutex_t lock;
	uintptr_t bump, limit;
	uintptr_t small_free[SMALL_CLASSES];
	uintptr_t spans;
	/* The application's SIGSEGV action, here so that every node sees the
	 * one set on any node (the runtime owns the real handler). */
	struct dex_app_segv_action app_segv;
};

static bool heap_in_use(void)
{
	return dex_rt.active && !dex_tls_runtime_thread;
}

static bool in_heap(const void *p)
{
	const struct dsm_region *r = &dex_rt.regions[dex_rt.nregions ? dex_rt.nregions - 1 : 0];
	return dex_rt.active && (uintptr_t)p >= r->start && (uintptr_t)p < r->end;
}

static void *populator(void *arg);

void dex_heap_init_origin(void)
{
	struct heap_state *h = (struct heap_state *)DEX_HEAP_BASE;
	pthread_mutex_init(&h->lock, NULL);
	h->bump = DEX_HEAP_BASE + STATE_BYTES;
	h->limit = dex_vma_area_start(); /* above it: vma.c's mapped area */
	dex_start_service_thread(populator, NULL);
}

static struct heap_state *state(void)
{
	return (struct heap_state *)DEX_HEAP_BASE;
}

/* With the lock held: first fit over free spans, else bump. */
static uintptr_t take_pages(struct heap_state *h, size_t pages)
{
	uintptr_t *link = &h->spans;
	while (*link) {
		struct free_span *span = (struct free_span *)*link;
		if (span->pages >= pages) {
			uintptr_t start = *link;
			if (span->pages > pages) {
				struct free_span *rest = (struct free_span *)(start + pages * DEX_PAGE_SIZE);
				rest->next = span->next;
				rest->pages = span->pages - pages;
				*link = (uintptr_t)rest;
			} else {
				*link = span->next;
			}
			return start;
		}
		link = &span->next;
	}
	size_t bytes = pages * DEX_PAGE_SIZE;
	if (h->limit - h->bump < bytes)
		return 0;
	uintptr_t start = h->bump;
	h->bump += bytes;
	return start;
}

static void give_pages(struct heap_state *h, uintptr_t start, size_t pages)
{
	struct free_span *span = (struct free_span *)start;
	span->pages = pages;
	span->next = h->spans;
	h->spans = start;
}

void *dex_heap_alloc_pages(size_t bytes)
{
	struct heap_state *h = state();
	size_t pages = (bytes + DEX_PAGE_SIZE - 1) / DEX_PAGE_SIZE;
	pthread_mutex_lock(&h->lock);
	uintptr_t p = take_pages(h, pages);
	pthread_mutex_unlock(&h->lock);
	return (void *)p;
}

void dex_heap_free_pages(void *p, size_t bytes)
{
	struct heap_state *h = state();
	pthread_mutex_lock(&h->lock);
	give_pages(h, (uintptr_t)p, (bytes + DEX_PAGE_SIZE - 1) / DEX_PAGE_SIZE);
	pthread_mutex_unlock(&h->lock);
}

static int size_class(size_t total)
{
	for (int c = 0; c < SMALL_CLASSES; c++)
		if (total <= (32u << c))
			return c;
	return -1;
}

static void *heap_malloc(size_t size)
{
	struct heap_state *h = state();
	if (size > h->limit - DEX_HEAP_BASE)
		return NULL;
	size_t total = size + HEADER_BYTES;
	int c = size_class(total);
	struct block_header *b = NULL;
	size_t fresh_bytes = 0;
	pthread_mutex_lock(&h->lock);
	if (c >= 0) {
		if (!h->small_free[c]) {
			uintptr_t page = take_pages(h, 1);
			size_t block = 32u << c;
			for (uintptr_t p = page; page && p + block <= page + DEX_PAGE_SIZE; p += block) {
				*(uintptr_t *)(p + HEADER_BYTES) = h->small_free[c];
				h->small_free[c] = p;
			}
		}
		if (h->small_free[c]) {
			b = (struct block_header *)h->small_free[c];
			h->small_free[c] = *(uintptr_t *)((uintptr_t)b + HEADER_BYTES);
			b->kind = BLOCK_SMALL;
			b->value = (uint64_t)c;
		}
	} else {
		size_t pages = (total + DEX_PAGE_SIZE - 1) / DEX_PAGE_SIZE;
		uintptr_t bump = h->bump;
		b = (struct block_header *)take_pages(h, pages);
		if (b) {
			b->kind = BLOCK_LARGE;
			b->value = pages;
			if ((uintptr_t)b == bump) /* fresh space, not a freed span */
				fresh_bytes = pages * DEX_PAGE_SIZE;
		}
	}
	pthread_mutex_unlock(&h->lock);
	if (!b)
		return NULL;
	if (fresh_bytes)
		dex_heap_populate((uintptr_t)b, fresh_bytes);
	b->magic = HEADER_MAGIC;
	return (char *)b + HEADER_BYTES;
}

/* Allocating the origin's fresh heap memory ahead of its first use.
 * Shared memory is a memfd, and a first write to a memfd page costs about
 * twice an anonymous page's (allocation, page cache and dirty accounting
 * inside the fault): a program filling its inputs at the origin (BLK:
 * 48 MiB) took 11 ms longer than without DEX. A large block handed out
 * from fresh heap space at the origin is therefore allocated in the memfd
 * (fallocate) by a runtime thread, 1 MiB at a time from the block's start
 * (several blocks in turn), while the program starts writing it: its
 * faults then find the pages there. Only blocks of at least POPULATE_MIN bytes (large arrays, not
 * thread stacks or small objects), at most POPULATE_MAX of each; memory a
 * program allocates but never touches is then allocated all the same. */
#define POPULATE_MIN (1u << 20)
#define POPULATE_MAX ((size_t)256 << 20)
#define POPULATE_STEP ((size_t)1 << 20)

/* Blocks being allocated ahead, taken round robin 1 MiB at a time: a
 * program often allocates several arrays and then fills them together. */
#define POPULATE_SLOTS 8
static struct {
	uintptr_t done, target;
} populating[POPULATE_SLOTS]; /* local memory, under populate_lock */
static unsigned populate_next;
static uint32_t populate_wake; /* futex word */
static struct dex_lock populate_lock;

static void *populator(void *arg)
{
	(void)arg;
	dex_tls_runtime_thread = 1;
	dex_thread_create_block(DEX_ROLE_SERVICE);
	const struct dsm_region *heap = &dex_rt.regions[dex_rt.nregions - 1];
	unsigned turn = 0;
	for (;;) {
		uint32_t seen = __atomic_load_n(&populate_wake, __ATOMIC_ACQUIRE);
		uintptr_t from = 0, to = 0;
		dex_lock_acquire(&populate_lock);
		for (unsigned i = 0; i < POPULATE_SLOTS && from == to; i++) {
			unsigned slot = (turn + i) % POPULATE_SLOTS;
			from = populating[slot].done;
			to = populating[slot].target;
			if (to > from + POPULATE_STEP)
				to = from + POPULATE_STEP;
			populating[slot].done = to;
			turn = slot + 1;
		}
		dex_lock_release(&populate_lock);
		if (from >= to) {
			futex_wait_while(&populate_wake, seen);
			continue;
		}
		raw_syscall6(SYS_fallocate, heap->fd, 0, (long)(from - heap->start), (long)(to - from), 0, 0);
	}
	return NULL;
}

void dex_heap_populate(uintptr_t start, size_t bytes)
{
	if (!dex_rt.active || dex_rt.node != 0 || bytes < POPULATE_MIN)
		return;
	if (bytes > POPULATE_MAX)
		bytes = POPULATE_MAX;
	dex_lock_acquire(&populate_lock);
	unsigned slot = populate_next++ % POPULATE_SLOTS; /* replaces the oldest */
	populating[slot].done = start;
	populating[slot].target = start + bytes;
	dex_lock_release(&populate_lock);
	__atomic_add_fetch(&populate_wake, 1, __ATOMIC_RELEASE);
	raw_futex(&populate_wake, FUTEX_WAKE, 1);
}

static struct block_header *header_of(void *p)
{
	struct block_header *b = (struct block_header *)((char *)p - HEADER_BYTES);
	if (b->magic != HEADER_MAGIC)
		dex_fatal("free() of a pointer the shared heap did not allocate: %p", p);
	return b;
}

static void heap_free(void *p)
{
	struct block_header *b = header_of(p);
	if (b->kind == BLOCK_ALIGNED) {
		heap_free((void *)b->value);
		return;
	}
	struct heap_state *h = state();
	pthread_mutex_lock(&h->lock);
	if (b->kind == BLOCK_SMALL) {
		*(uintptr_t *)((uintptr_t)b + HEADER_BYTES) = h->small_free[b->value];
		h->small_free[b->value] = (uintptr_t)b;
	} else {
		give_pages(h, (uintptr_t)b, b->value);
	}
	pthread_mutex_unlock(&h->lock);
}

static size_t usable_size(void *p)
{
	struct block_header *b = header_of(p);
	switch (b->kind) {
	case BLOCK_SMALL: return (32u << b->value) - HEADER_BYTES;
	case BLOCK_LARGE: return b->value * DEX_PAGE_SIZE - HEADER_BYTES;
	default: {
		void *under = (void *)b->value;
		return usable_size(under) - (size_t)((char *)p - (char *)under);
	}
	}
}

static void *heap_memalign(size_t alignment, size_t size)
{
	if (alignment <= HEADER_BYTES)
		return heap_malloc(size);
	char *under = heap_malloc(size + alignment + HEADER_BYTES);
	if (!under)
		return NULL;
	uintptr_t p = ((uintptr_t)under + HEADER_BYTES + alignment - 1) & ~(uintptr_t)(alignment - 1);
	struct block_header *b = (struct block_header *)(p - HEADER_BYTES);
	b->magic = HEADER_MAGIC;
	b->kind = BLOCK_ALIGNED;
	b->value = (uint64_t)(uintptr_t)under;
	return (void *)p;
}

struct dex_app_segv_action *dex_heap_app_segv_action(void)
{
	return &state()->app_segv;
}

/* ------------------------------------------------ interposed allocator */

void *malloc(size_t size)
{
	if (!heap_in_use())
		return __libc_malloc(size);
	void *p = heap_malloc(size);
	if (!p)
		errno = ENOMEM;
	return p;
}

void free(void *p)
{
	if (!p)
		return;
	if (in_heap(p))
		heap_free(p);
	else
		__libc_free(p);
}

void *calloc(size_t n, size_t size)
{
	if (!heap_in_use())
		return __libc_calloc(n, size);
	if (size && n > SIZE_MAX / size) {
		errno = ENOMEM;
		return NULL;
	}
	/* heap_malloc, not malloc: GCC would fuse malloc+memset into a call
	 * to calloc, i.e. back into this function. */
	void *p = heap_malloc(n * size);
	if (p)
		memset(p, 0, n * size);
	else
		errno = ENOMEM;
	return p;
}

void *realloc(void *old, size_t size)
{
	if (!old)
		return malloc(size);
	if (!in_heap(old) && !heap_in_use())
		return __libc_realloc(old, size);
	if (!size) {
		free(old);
		return NULL;
	}
	size_t have = malloc_usable_size(old);
	if (in_heap(old) && have >= size)
		return old;
	void *p = malloc(size);
	if (!p)
		return NULL;
	memcpy(p, old, have < size ? have : size);
	free(old);
	return p;
}

size_t malloc_usable_size(void *p)
{
	static size_t (*libc_usable_size)(void *);
	if (!p)
		return 0;
	if (in_heap(p))
		return usable_size(p);
	if (!libc_usable_size)
		libc_usable_size = (size_t (*)(void *))dlsym(RTLD_NEXT, "malloc_usable_size");
	return libc_usable_size(p);
}

void *memalign(size_t alignment, size_t size)
{
	if (!heap_in_use())
		return __libc_memalign(alignment, size);
	void *p = heap_memalign(alignment, size);
	if (!p)
		errno = ENOMEM;
	return p;
}

int posix_memalign(void **out, size_t alignment, size_t size)
{
	if (alignment < sizeof(void *) || (alignment & (alignment - 1)))
		return EINVAL;
	void *p = memalign(alignment, size);
	if (!p)
		return ENOMEM;
	*out = p;
	return 0;
}

void *aligned_alloc(size_t alignment, size_t size)
{
	return memalign(alignment, size);
}

void *valloc(size_t size)
{
	return memalign(DEX_PAGE_SIZE, size);
}

void *pvalloc(size_t size)
{
	return memalign(DEX_PAGE_SIZE, (size + DEX_PAGE_SIZE - 1) & ~(size_t)(DEX_PAGE_SIZE - 1));
}

void *dex_malloc_aligned(size_t size)
{
	return memalign(DEX_PAGE_SIZE, (size + DEX_PAGE_SIZE - 1) & ~(size_t)(DEX_PAGE_SIZE - 1));
}

/* glibc's sbrk keeps its own copy of the break, which on the origin is the
 * kernel's (glibc's malloc of runtime threads uses it). Application threads
 * get the shared break of the mapped area (vma.c) instead. */
int brk(void *addr)
{
	if (!heap_in_use()) {
		static int (*libc_brk)(void *);
		if (!libc_brk)
			libc_brk = (int (*)(void *))dlsym(RTLD_NEXT, "brk");
		return libc_brk(addr);
	}
	if (dex_vma_brk((uintptr_t)addr) != (long)(uintptr_t)addr) {
		errno = ENOMEM;
		return -1;
	}
	return 0;
}

void *sbrk(intptr_t increment)
{
	if (!heap_in_use()) {
		static void *(*libc_sbrk)(intptr_t);
		if (!libc_sbrk)
			libc_sbrk = (void *(*)(intptr_t))dlsym(RTLD_NEXT, "sbrk");
		return libc_sbrk(increment);
	}
	long current = dex_vma_brk(0);
	if (!increment)
		return (void *)current;
	uintptr_t wanted = (uintptr_t)current + (uintptr_t)increment;
	if (dex_vma_brk(wanted) != (long)wanted) {
		errno = ENOMEM;
		return (void *)-1;
	}
	return (void *)current;
}
