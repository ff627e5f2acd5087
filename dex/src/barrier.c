/* pthread barriers run at the origin.
 *
 * glibc's barrier is a few words that every arriving thread updates with
 * atomic instructions and a futex. Under the DSM that made the barrier's
 * page travel to every node at every round (one write fault per arrival,
 * another when a waiter leaves) and shipped the futex wait or wake home
 * on top (delegation, syscall.c). DEX delegates futexes to the origin;
 * here the whole barrier goes there: a barrier's words are only ever
 * touched at the origin, by threads running there and by the home threads
 * of threads on other nodes, which ask their home thread to wait for them
 * (one DEX_BARRIER_CALL message and its reply, like a delegated system
 * call). The page holding the barrier stays at the origin, so a round
 * costs a node thread one round trip.
 *
 * Barriers outside the shared regions (none in practice) and programs not
 * under dexrun use glibc's. The process-shared attribute is accepted but
 * means nothing across DEX nodes (they are not processes sharing a
 * mapping). */
#include "internal.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>

#define BARRIER_MAGIC 0xdeba7713u

struct origin_barrier {
	uint32_t magic;
	uint32_t count;   /* threads per round */
	uint32_t arrived; /* in the current round */
	uint32_t round;   /* futex word: bumped when a round completes */
	uint32_t inside;  /* futex word: threads between arriving and leaving */
};
_Static_assert(sizeof(struct origin_barrier) <= sizeof(pthread_barrier_t), "barrier does not fit");

enum { BARRIER_WAIT = 1, BARRIER_DESTROY = 2 };

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
	       dex_in_shared((uintptr_t)barrier + sizeof(struct origin_barrier) - 1);
}

/* Sleeps while *word == seen. The kernel reads the word, which must then
 * be present here: a page another node took is fetched and the wait
 * tried again. */
static void wait_on_word(uint32_t *word, uint32_t seen)
{
	long rc = raw_syscall6(SYS_futex, (long)word, FUTEX_WAIT | FUTEX_PRIVATE_FLAG, seen, 0, 0, 0);
	if (rc == -EFAULT)
		dex_prefault((uintptr_t)word, sizeof(*word), false);
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
			wait_on_word(&b->round, round);
	}
	if (__atomic_sub_fetch(&b->inside, 1, __ATOMIC_ACQ_REL) == 0)
		futex_wake_all(&b->inside); /* a destroy may be waiting for us to leave */
	return result;
}

/* As glibc's: waits until threads released by the last round have left. */
static long origin_destroy(struct origin_barrier *b)
{
	uint32_t inside;
	while ((inside = __atomic_load_n(&b->inside, __ATOMIC_ACQUIRE)) != 0) {
		if (__atomic_load_n(&b->arrived, __ATOMIC_ACQUIRE) != 0)
			return EBUSY; /* threads are blocked in a round */
		wait_on_word(&b->inside, inside);
	}
	__atomic_store_n(&b->magic, 0, __ATOMIC_RELEASE);
	return 0;
}

/* At the origin: a barrier operation for a thread running here, or for a
 * node's thread by its home thread (dex_origin_run_delegated). */
long dex_origin_barrier_call(const long a[6])
{
	struct origin_barrier *b = (struct origin_barrier *)a[0];
	if (!handled_here(b) || __atomic_load_n(&b->magic, __ATOMIC_ACQUIRE) != BARRIER_MAGIC)
		return EINVAL;
	switch (a[1]) {
	case BARRIER_WAIT:
		return origin_wait(b);
	case BARRIER_DESTROY:
		return origin_destroy(b);
	default:
		return EINVAL;
	}
}

/* On a node the barrier's words are never touched: the call goes home. */
static int barrier_call(pthread_barrier_t *barrier, long op)
{
	long a[6] = { (long)barrier, op };
	if (dex_rt.node == 0)
		return (int)dex_origin_barrier_call(a);
	return (int)dex_delegate_call(DEX_BARRIER_CALL, a);
}

int pthread_barrier_init(pthread_barrier_t *barrier, const pthread_barrierattr_t *attr, unsigned count)
{
	if (!handled_here(barrier))
		return real_init(barrier, attr, count);
	if (count == 0 || count > INT32_MAX)
		return EINVAL;
	/* Plain stores through the DSM, wherever the caller runs. */
	struct origin_barrier *b = (struct origin_barrier *)barrier;
	*b = (struct origin_barrier){ .magic = BARRIER_MAGIC, .count = count };
	return 0;
}

int pthread_barrier_wait(pthread_barrier_t *barrier)
{
	if (!handled_here(barrier))
		return real_wait(barrier);
	return barrier_call(barrier, BARRIER_WAIT);
}

int pthread_barrier_destroy(pthread_barrier_t *barrier)
{
	if (!handled_here(barrier))
		return real_destroy(barrier);
	return barrier_call(barrier, BARRIER_DESTROY);
}
