/* libdex thread blocks: each OS thread's local block (header, runtime
 * stack, signal stack), finding one's own from any context, the mailbox a
 * migrating thread waits on, statistics and service threads. */
#include "internal.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>

/* Nearly every message fits in a buffer's first page: fault it in when
 * the buffer is made, not on a thread's first migration. */
static void touch_first_page(char *buffer)
{
	*(volatile char *)buffer = 0;
}

/* A receiver's buffer for one message's payload. */
char *dex_receive_buffer(void)
{
	char *payload = malloc(DEX_MAX_PAYLOAD);
	if (!payload)
		dex_fatal("out of memory for a receive buffer");
	touch_first_page(payload);
	return payload;
}

static struct dex_thread *reuse_retired_block(void)
{
	struct dex_thread *found = NULL;
	dex_lock_acquire(&dex_rt.blocks_lock);
	for (struct dex_thread **link = &dex_rt.retired_blocks; *link; link = &(*link)->next_retired) {
		if (__atomic_load_n(&(*link)->exit_word, __ATOMIC_ACQUIRE) == 0) {
			found = *link;
			*link = found->next_retired;
			break;
		}
	}
	dex_lock_release(&dex_rt.blocks_lock);
	return found;
}

void dex_thread_retire_block(struct dex_thread *t)
{
	dex_lock_acquire(&dex_rt.blocks_lock);
	t->next_retired = dex_rt.retired_blocks;
	dex_rt.retired_blocks = t;
	dex_lock_release(&dex_rt.blocks_lock);
}

struct dex_thread *dex_thread_block_alloc(enum dex_thread_role role)
{
	struct dex_thread *old = reuse_retired_block();
	if (old) {
		char *payload = old->mail.payload, *scratch = old->scratch;
		memset(old, 0, sizeof(*old));
		old->role = role;
		old->mail.payload = payload;
		old->scratch = scratch;
		return old;
	}
	size_t span = 2 * DEX_THREAD_BLOCK;
	char *raw = (char *)raw_syscall6(SYS_mmap, 0, (long)span, PROT_READ | PROT_WRITE,
					 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if ((long)raw < 0 && (long)raw > -4096)
		dex_fatal("cannot map thread block");
	uintptr_t base = ((uintptr_t)raw + DEX_THREAD_BLOCK - 1) & ~(uintptr_t)(DEX_THREAD_BLOCK - 1);
	if (base > (uintptr_t)raw)
		raw_syscall(SYS_munmap, raw, base - (uintptr_t)raw, 0);
	uintptr_t tail = base + DEX_THREAD_BLOCK;
	if ((uintptr_t)raw + span > tail)
		raw_syscall(SYS_munmap, tail, (uintptr_t)raw + span - tail, 0);

	struct dex_thread *t = (struct dex_thread *)base;
	t->role = role;
	t->sud_selector = 0;
	char *buffers = (char *)raw_syscall6(SYS_mmap, 0, 2 * DEX_MAX_PAYLOAD, PROT_READ | PROT_WRITE,
					     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if ((long)buffers < 0 && (long)buffers > -4096)
		dex_fatal("cannot map thread buffers");
	t->mail.payload = buffers;
	t->scratch = buffers + DEX_MAX_PAYLOAD;
	touch_first_page(t->mail.payload);
	touch_first_page(t->scratch);
	return t;
}

/* Allocates a block and makes it the calling thread's signal stack. */
struct dex_thread *dex_thread_create_block(enum dex_thread_role role)
{
	struct dex_thread *t = dex_thread_block_alloc(role);
	uintptr_t base = (uintptr_t)t;
	stack_t ss = { .ss_sp = (void *)(base + DEX_SIGNAL_STACK_OFFSET),
		       .ss_size = DEX_THREAD_BLOCK - DEX_SIGNAL_STACK_OFFSET };
	if (raw_syscall(SYS_sigaltstack, &ss, 0, 0) != 0)
		dex_fatal("sigaltstack failed");
	t->own_fs_base = dex_get_fs_base();
	t->os_tid = (int32_t)raw_syscall(SYS_gettid, 0, 0, 0);
	return t;
}

/* The block whose signal stack `ss` describes, or NULL. */
static struct dex_thread *block_of_signal_stack(const stack_t *ss)
{
	if (ss->ss_flags & SS_DISABLE)
		return NULL;
	uintptr_t base = (uintptr_t)ss->ss_sp - DEX_SIGNAL_STACK_OFFSET;
	return base & (DEX_THREAD_BLOCK - 1) ? NULL : (struct dex_thread *)base;
}

/* In a signal handler: the kernel saved the thread's signal stack in the
 * frame (uc_stack), so no sigaltstack call is needed on a fault's path. */
struct dex_thread *dex_self_in_handler(const ucontext_t *uc)
{
	return block_of_signal_stack(&uc->uc_stack);
}

struct dex_thread *dex_self(void)
{
	stack_t ss;
	long rc;
	/* On an application thread `ss` is on the shared stack, whose page
	 * another node may have just taken: the kernel cannot fault it in and
	 * returns EFAULT (dex_migrate then failed with EPERM now and then in
	 * the stackread test). Take the page from user mode and ask again. */
	while ((rc = raw_syscall(SYS_sigaltstack, 0, &ss, 0)) == -EFAULT)
		dex_prefault((uintptr_t)&ss, sizeof(ss), true);
	return rc == 0 ? block_of_signal_stack(&ss) : NULL;
}

/* A migrated context arrived here; sent_ns is the sender's clock, which is
 * this machine's CLOCK_MONOTONIC as long as all nodes share a host. */
void dex_note_arrival(uint64_t sent_ns)
{
	__atomic_add_fetch(&dex_rt.migrations_in, 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(&dex_rt.migration_ns_total, dex_now_ns() - sent_ns, __ATOMIC_RELAXED);
}

/* Asked for with DEX_STATS, so printed at warn level: the default shows them. */
void dex_print_stats(void)
{
	if (!getenv("DEX_STATS"))
		return;
	uint64_t in = dex_rt.migrations_in;
	dex_warn("stats: faults %llu read %llu write, %llu pages received, %llu pages granted by prefetch, "
		"%llu invalidations served, "
		"%llu syscalls delegated, %llu arrivals (mean %.1f us in flight), %llu workers created",
		(unsigned long long)dex_rt.faults_read, (unsigned long long)dex_rt.faults_write,
		(unsigned long long)dex_rt.pages_received, (unsigned long long)dex_rt.pages_prefetched,
		(unsigned long long)dex_rt.invalidations_served,
		(unsigned long long)dex_rt.syscalls_delegated, (unsigned long long)in,
		in ? dex_rt.migration_ns_total / 1e3 / (double)in : 0.0, (unsigned long long)dex_rt.workers_created);
	dex_warn("stats: layout: %llu rights queries, %llu revokes broadcast (origin) or applied (node)",
		(unsigned long long)dex_rt.layout_queries, (unsigned long long)dex_rt.layout_revokes);
	dex_warn("stats: readahead: %llu next windows asked for at a marker", (unsigned long long)dex_rt.readahead_markers);
}

/* Makes sure the alias page at `alias` is backed, without changing its
 * bytes: a node's first grant of a page otherwise allocates it in the
 * receiver, on the answer's path (2.8 of 16 us of a remote fault over
 * UCX). Atomic, so a grant being copied in meanwhile loses nothing. */
static void back_alias_page(uintptr_t alias)
{
	__atomic_fetch_or((volatile char *)alias, 0, __ATOMIC_RELAXED);
}

/* The first part of every wait of the runtime (a grant, a thread's mail):
 * whether *word moved off `seen` while the waiter may still poll. DEX_SPIN
 * spins first; with polling receivers (DEX_POLL_US) the answer is usually a
 * few microseconds away, so the waiter then yields the CPU until `since_ns`
 * plus the receivers' window rather than sleep and be woken (measured over
 * UCX: 16.4 against 18.1 us per remote fault). `alias` (0: none) is the
 * page an awaited grant will be written into: backed after the first
 * yield, once a pump that shares this CPU has had its turn to send the
 * request (before it, 16-18 us; after, 13.9), or before the caller sleeps. */
bool dex_changed_while_polling(const uint32_t *word, uint32_t seen, uint64_t since_ns, uintptr_t alias)
{
	for (unsigned i = 0; i < dex_rt.spin_iterations; i++) {
		if (__atomic_load_n(word, __ATOMIC_ACQUIRE) != seen)
			return true;
		cpu_relax();
	}
	while (dex_rt.receive_poll_ns && dex_now_ns() - since_ns < dex_rt.receive_poll_ns) {
		if (__atomic_load_n(word, __ATOMIC_ACQUIRE) != seen)
			return true;
		raw_syscall(SYS_sched_yield, 0, 0, 0);
		if (alias) {
			back_alias_page(alias);
			alias = 0;
		}
	}
	if (alias)
		back_alias_page(alias);
	return false;
}

/* Polls as a fault's wait does, then sleeps; a post wakes it only if it
 * sleeps (Dekker, as the epoch). */
void dex_mail_wait(struct dex_thread *t)
{
	if (dex_changed_while_polling(&t->mail.ready, 0, dex_rt.receive_poll_ns ? dex_now_ns() : 0, 0))
		return;
	__atomic_store_n(&t->mail.sleeping, 1, __ATOMIC_SEQ_CST);
	while (!__atomic_load_n(&t->mail.ready, __ATOMIC_SEQ_CST))
		futex_wait_while(&t->mail.ready, 0);
	__atomic_store_n(&t->mail.sleeping, 0, __ATOMIC_RELAXED);
}

void dex_mail_post(struct dex_thread *t, const struct dex_msg_header *h, const void *payload)
{
	if (__atomic_load_n(&t->mail.ready, __ATOMIC_ACQUIRE))
		dex_fatal("unexpected %s from node %u: thread busy", dex_msg_type_name(h->type), h->from);
	/* A MIGRATE's carried pages went to the DSM; the thread needs only
	 * the fixed part. */
	uint32_t length = h->type == DEX_MSG_MIGRATE ? (uint32_t)sizeof(struct dex_msg_migrate) : h->length;
	memcpy(t->mail.payload, payload, length);
	t->mail.type = h->type;
	t->mail.from = h->from;
	t->mail.length = length;
	__atomic_store_n(&t->mail.ready, 1, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&t->mail.sleeping, __ATOMIC_SEQ_CST))
		raw_futex(&t->mail.ready, FUTEX_WAKE, 1);
}

void dex_start_service_thread(void *(*fn)(void *), void *arg)
{
	unsigned long thread;
	if (dex_real_pthread_create(&thread, NULL, fn, arg) != 0)
		dex_fatal("cannot start runtime thread");
}
