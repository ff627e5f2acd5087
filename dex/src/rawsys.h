/* Raw system calls and a futex lock for the runtime.
 *
 * Why not libc: (1) under Syscall User Dispatch every system call made from
 * outside libdex's own text traps, so the runtime must issue its calls from
 * its own code; (2) libc wrappers write errno, which lives in the TLS of the
 * thread, and a migrated thread's TLS is shared memory that may be absent
 * while we are handling exactly that fault. */
#ifndef DEX_RAWSYS_H
#define DEX_RAWSYS_H

#include <linux/futex.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/syscall.h>

static inline long raw_syscall6(long n, long a1, long a2, long a3, long a4, long a5, long a6)
{
	register long r10 __asm__("r10") = a4;
	register long r8 __asm__("r8") = a5;
	register long r9 __asm__("r9") = a6;
	long ret;
	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "a"(n), "D"(a1), "S"(a2), "d"(a3), "r"(r10), "r"(r8), "r"(r9)
			 : "rcx", "r11", "memory");
	return ret;
}

#define raw_syscall(n, a1, a2, a3) raw_syscall6((n), (long)(a1), (long)(a2), (long)(a3), 0, 0, 0)

static inline long raw_futex(uint32_t *word, int op, uint32_t val)
{
	return raw_syscall6(SYS_futex, (long)word, op | FUTEX_PRIVATE_FLAG, val, 0, 0, 0);
}

static inline void futex_wait_while(uint32_t *word, uint32_t val)
{
	raw_futex(word, FUTEX_WAIT, val);
}

static inline void futex_wake_all(uint32_t *word)
{
	raw_futex(word, FUTEX_WAKE, INT32_MAX);
}

static inline void cpu_relax(void)
{
	__asm__ volatile("pause" ::: "memory");
}

/* 0 free, 1 held, 2 held with waiters. */
struct dex_lock {
	uint32_t word;
};

static inline void dex_lock_acquire(struct dex_lock *l)
{
	uint32_t expected = 0;
	if (__atomic_compare_exchange_n(&l->word, &expected, 1, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
		return;
	while (__atomic_exchange_n(&l->word, 2, __ATOMIC_ACQUIRE) != 0)
		futex_wait_while(&l->word, 2);
}

static inline void dex_lock_release(struct dex_lock *l)
{
	if (__atomic_exchange_n(&l->word, 0, __ATOMIC_RELEASE) == 2)
		raw_futex(&l->word, FUTEX_WAKE, 1);
}

#endif
