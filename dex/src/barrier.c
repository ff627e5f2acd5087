/* pthread barriers run at the origin.
 *
 * glibc's barrier is a few words that every arriving thread updates with
 * atomic instructions and a futex. Under the DSM that made the barrier's
 * page travel to every node at every round (one write fault per arrival,
 * another when a waiter leaves) and shipped the futex wait or wake home
 * on top (delegation, syscall.c). DEX delegates futexes to the origin;
 * here the whole barrier goes there: its state lives in the origin's own
 * memory and is only ever touched there, by threads running there and by
 * the home threads of threads on other nodes, which ask their home thread
 * to wait for them (one DEX_BARRIER_CALL message and its reply, like a
 * delegated system call). The application's pthread_barrier_t only names
 * that state and is written by init and destroy alone, so a round costs a
 * node thread one round trip and moves no page.
 *
 * Barriers outside the shared regions (none in practice) and programs not
 * under dexrun use glibc's. The process-shared attribute is accepted but
 * means nothing across DEX nodes (they are not processes sharing a
 * mapping). */
#include "internal.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>

#define BARRIER_MAGIC 0xdeba7714u
#define MAX_BARRIERS 4096

/* What the application's pthread_barrier_t holds: the name of a barrier
 * whose state lives in the origin's own memory. The object is written
 * only by init and destroy, so waiting never writes the application's
 * page: a node may keep a read copy of whatever shares that page with
 * the barrier (k-means reads its iteration count beside it every round). */
struct barrier_ref {
	uint32_t magic;
	uint32_t slot;
	uint32_t generation;
};
_Static_assert(sizeof(struct barrier_ref) <= sizeof(pthread_barrier_t), "barrier does not fit");

struct origin_barrier {
	uint32_t count;   /* threads per round */
	uint32_t arrived; /* in the current round */
	uint32_t round;   /* futex word: bumped when a round completes */
	uint32_t inside;  /* futex word: threads between arriving and leaving */
	uint32_t generation;
	bool used;
};
static struct origin_barrier barriers[MAX_BARRIERS]; /* the origin's own memory */
static struct dex_lock barriers_lock;
static uint32_t next_slot;

enum { BARRIER_WAIT = 1, BARRIER_DESTROY = 2, BARRIER_INIT = 3 };

static int (*real_init)(pthread_barrier_t *, const pthread_barrierattr_t *, unsigned);
static int (*real_wait)(pthread_barrier_t *);
static int (*real_destroy)(pthread_barrier_t *);

void dex_barriers_init(void)
{
	real_init = dlsym(RTLD_NEXT, "pthread_barrier_init");
	real_wait = dlsym(RTLD_NEXT, "pthread_barrier_wait");
	real_destroy = dlsym(RTLD_NEXT, "pthread_barrier_destroy");
	if (!real_init || !real_wait || !real_destroy)
		dex_fatal("cannot find libc's pthread barrier functions");
}

static bool handled_here(const void *barrier)
{
	return dex_rt.active && dex_in_shared((uintptr_t)barrier) &&
	       dex_in_shared((uintptr_t)barrier + sizeof(struct barrier_ref) - 1);
}

static long origin_init(struct barrier_ref *ref, unsigned long count)
{
	if (count == 0 || count > INT32_MAX)
		return EINVAL;
	uint32_t slot = MAX_BARRIERS, generation = 0;
	dex_lock_acquire(&barriers_lock);
	for (uint32_t i = 0; i < MAX_BARRIERS; i++) {
		uint32_t candidate = (next_slot + i) % MAX_BARRIERS;
		if (!barriers[candidate].used) {
			slot = candidate;
			break;
		}
	}
	if (slot < MAX_BARRIERS) {
		struct origin_barrier *b = &barriers[slot];
		generation = b->generation + 1;
		*b = (struct origin_barrier){ .count = (uint32_t)count, .round = b->round, .generation = generation,
					      .used = true };
		next_slot = slot + 1;
	}
	dex_lock_release(&barriers_lock);
	if (slot == MAX_BARRIERS)
		return EAGAIN;
	/* Through the DSM, at the origin: the one write of the object. */
	*ref = (struct barrier_ref){ .magic = BARRIER_MAGIC, .slot = slot, .generation = generation };
	return 0;
}

/* Reading the object needs only a read copy here. */
static struct origin_barrier *lookup(const struct barrier_ref *ref)
{
	struct barrier_ref r = *ref;
	if (r.magic != BARRIER_MAGIC || r.slot >= MAX_BARRIERS)
		return NULL;
	struct origin_barrier *b = &barriers[r.slot];
	return __atomic_load_n(&b->used, __ATOMIC_ACQUIRE) && b->generation == r.generation ? b : NULL;
}

static long origin_wait(struct origin_barrier *b)
{
	__atomic_add_fetch(&b->inside, 1, __ATOMIC_ACQ_REL);
	uint32_t round = __atomic_load_n(&b->round, __ATOMIC_ACQUIRE);
	long result = 0;
	if (__atomic_add_fetch(&b->arrived, 1, __ATOMIC_ACQ_REL) == __atomic_load_n(&b->count, __ATOMIC_RELAXED)) {
		/* The last arrival opens the next round before releasing this one. */
		__atomic_store_n(&b->arrived, 0, __ATOMIC_RELAXED);
		__atomic_store_n(&b->round, round + 1, __ATOMIC_RELEASE);
		futex_wake_all(&b->round);
		result = PTHREAD_BARRIER_SERIAL_THREAD;
	} else {
		while (__atomic_load_n(&b->round, __ATOMIC_ACQUIRE) == round)
			futex_wait_while(&b->round, round);
	}
	if (__atomic_sub_fetch(&b->inside, 1, __ATOMIC_ACQ_REL) == 0)
		futex_wake_all(&b->inside); /* a destroy may be waiting for us to leave */
	return result;
}

/* As glibc's: waits until threads released by the last round have left. */
static long origin_destroy(struct barrier_ref *ref, struct origin_barrier *b)
{
	uint32_t inside;
	while ((inside = __atomic_load_n(&b->inside, __ATOMIC_ACQUIRE)) != 0) {
		if (__atomic_load_n(&b->arrived, __ATOMIC_ACQUIRE) != 0)
			return EBUSY; /* threads are blocked in a round */
		futex_wait_while(&b->inside, inside);
	}
	dex_lock_acquire(&barriers_lock);
	__atomic_store_n(&b->used, false, __ATOMIC_RELEASE);
	dex_lock_release(&barriers_lock);
	ref->magic = 0;
	return 0;
}

/* At the origin: a barrier operation for a thread running here, or for a
 * node's thread by its home thread (dex_origin_run_delegated). */
long dex_origin_barrier_call(const long a[6])
{
	struct barrier_ref *ref = (struct barrier_ref *)a[0];
	if (!handled_here(ref))
		return EINVAL;
	if (a[1] == BARRIER_INIT)
		return origin_init(ref, (unsigned long)a[2]);
	struct origin_barrier *b = lookup(ref);
	if (!b)
		return EINVAL;
	switch (a[1]) {
	case BARRIER_WAIT:
		return origin_wait(b);
	case BARRIER_DESTROY:
		return origin_destroy(ref, b);
	default:
		return EINVAL;
	}
}

/* On a node the barrier's object is never touched: the call goes home. */
static int barrier_call(pthread_barrier_t *barrier, long op, long arg)
{
	long a[6] = { (long)barrier, op, arg };
	if (dex_rt.node == 0)
		return (int)dex_origin_barrier_call(a);
	return (int)dex_delegate_call(DEX_BARRIER_CALL, a);
}

int pthread_barrier_init(pthread_barrier_t *barrier, const pthread_barrierattr_t *attr, unsigned count)
{
	if (!handled_here(barrier))
		return real_init(barrier, attr, count);
	return barrier_call(barrier, BARRIER_INIT, (long)count);
}

int pthread_barrier_wait(pthread_barrier_t *barrier)
{
	if (!handled_here(barrier))
		return real_wait(barrier);
	return barrier_call(barrier, BARRIER_WAIT, 0);
}

int pthread_barrier_destroy(pthread_barrier_t *barrier)
{
	if (!handled_here(barrier))
		return real_destroy(barrier);
	return barrier_call(barrier, BARRIER_DESTROY, 0);
}
