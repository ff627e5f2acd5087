/* Thread migration.
 *
 * A migrating thread saves its callee-saved registers inside dex_migrate()
 * (its stack and TLS are shared memory), leaves that stack, and ships the
 * registers. On a node a pooled worker adopts them: it switches its thread
 * pointer to the app thread's TLS and jumps; the stack pages follow through
 * the DSM on demand. At the origin the thread's own OS thread parks on a
 * private stack and serves the thread's delegated system calls until the
 * thread comes back, so the kernel's view of the thread (tid, futex waits,
 * file descriptors) stays at home. */
#include "internal.h"

#include <asm/prctl.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>

#include "../include/dex.h"

__asm__(".text\n"
	".globl dex_context_save\n"
	".hidden dex_context_save\n"
	".type dex_context_save,@function\n"
	"dex_context_save:\n"
	"	movq %rbx, 0(%rdi)\n"
	"	movq %rbp, 8(%rdi)\n"
	"	movq %r12, 16(%rdi)\n"
	"	movq %r13, 24(%rdi)\n"
	"	movq %r14, 32(%rdi)\n"
	"	movq %r15, 40(%rdi)\n"
	"	leaq 8(%rsp), %rax\n"
	"	movq %rax, 48(%rdi)\n"
	"	movq (%rsp), %rax\n"
	"	movq %rax, 56(%rdi)\n"
	"	stmxcsr 72(%rdi)\n"
	"	fnstcw 76(%rdi)\n"
	"	xorl %eax, %eax\n"
	"	ret\n"
	".size dex_context_save, .-dex_context_save\n"

	".globl dex_context_resume\n"
	".hidden dex_context_resume\n"
	".type dex_context_resume,@function\n"
	"dex_context_resume:\n"
	"	movq 0(%rdi), %rbx\n"
	"	movq 8(%rdi), %rbp\n"
	"	movq 16(%rdi), %r12\n"
	"	movq 24(%rdi), %r13\n"
	"	movq 32(%rdi), %r14\n"
	"	movq 40(%rdi), %r15\n"
	"	ldmxcsr 72(%rdi)\n"
	"	fldcw 76(%rdi)\n"
	"	movq 48(%rdi), %rsp\n"
	"	movl %esi, %eax\n"
	"	jmpq *56(%rdi)\n"
	".size dex_context_resume, .-dex_context_resume\n"

	".globl dex_call_on_stack\n"
	".hidden dex_call_on_stack\n"
	".type dex_call_on_stack,@function\n"
	"dex_call_on_stack:\n"
	"	movq %rdi, %rsp\n"
	"	movq %rdx, %rdi\n"
	"	callq *%rsi\n"
	"	ud2\n"
	".size dex_call_on_stack, .-dex_call_on_stack\n"

	".globl dex_sigreturn_trampoline\n"
	".hidden dex_sigreturn_trampoline\n"
	".type dex_sigreturn_trampoline,@function\n"
	"dex_sigreturn_trampoline:\n"
	"	movq $15, %rax\n"
	"	syscall\n"
	"	ud2\n"
	".size dex_sigreturn_trampoline, .-dex_sigreturn_trampoline\n");

uint64_t dex_get_fs_base(void)
{
	uint64_t fs = 0;
	raw_syscall(SYS_arch_prctl, ARCH_GET_FS, &fs, 0);
	return fs;
}

void dex_set_fs_base(uint64_t fs)
{
	raw_syscall(SYS_arch_prctl, ARCH_SET_FS, fs, 0);
}

/* The first thing a resumed thread does is read and then write its stack
 * (return address, locals): taking the page for writing up front costs one
 * fault instead of a read fault followed by an upgrade. The receiver that
 * hands the thread over already asks for it (dex_dsm_fetch_ahead), so the
 * request travels while the thread wakes up. */
#define STACK_TOP_CLAIM 256
#define STACK_TOP_CLAIM_BYTES (STACK_TOP_CLAIM + 64)
static void claim_stack_top(const struct dex_context *c)
{
	dex_prefault(c->rsp - STACK_TOP_CLAIM, STACK_TOP_CLAIM_BYTES, true);
}

static void send_migrate(unsigned peer, const struct dex_thread *t)
{
	struct dex_msg_migrate m = { .thread = t->thread_id, .target = t->migrate_target, .sent_ns = t->departed_ns,
				     .trace_tag = t->trace_tag, .context = t->app_context };
	if (peer == 0 && m.target == 0)
		dex_dsm_send_migrate_home(&m, m.context.rsp - STACK_TOP_CLAIM, STACK_TOP_CLAIM_BYTES);
	else
		dex_send(peer, DEX_MSG_MIGRATE, &m, sizeof(m), NULL, 0);
}

/* A returning thread's home thread sleeps on the CPU it last ran on, which
 * on a quiet machine is mostly not the receiver's: waking it there is a
 * cross-CPU wake-up, and where idle vCPUs halt (this machine's setting) a
 * trip through the hypervisor, about 17 us. So the receiver narrows the home
 * thread's affinity to its own CPU before waking it, making the hand-off a
 * local context switch, and the home thread restores the application's mask
 * (read just before, so exactly the one it had) before the application runs
 * again. A CPU the application keeps the thread off is left alone. Only a
 * home thread that sleeps: one that polls (DEX_POLL_US) is running on its
 * own CPU already, and narrowing it moved it onto this busy one to wait
 * its turn (later backward 17.3 -> 13.3 us over TCP with polling). */
static void pin_home_thread_here(struct dex_thread *t)
{
	int cpu = sched_getcpu();
	long bytes = raw_syscall(SYS_sched_getaffinity, t->os_tid, sizeof(t->app_affinity), t->app_affinity);
	if (cpu < 0 || bytes <= 0 || (long)cpu >= bytes * 8)
		return;
	uint64_t cpu_bit = UINT64_C(1) << (cpu % 64);
	if (!(t->app_affinity[cpu / 64] & cpu_bit))
		return;
	uint64_t here[sizeof(t->app_affinity) / sizeof(uint64_t)] = { 0 };
	here[cpu / 64] = cpu_bit;
	if (raw_syscall(SYS_sched_setaffinity, t->os_tid, bytes, here) == 0)
		t->app_affinity_bytes = (uint32_t)bytes;
}

static void restore_app_affinity(struct dex_thread *t)
{
	if (!t->app_affinity_bytes)
		return;
	raw_syscall(SYS_sched_setaffinity, 0, t->app_affinity_bytes, t->app_affinity);
	t->app_affinity_bytes = 0;
}

/* Origin side, on the thread's private runtime stack: hand the context to
 * the target and serve the thread until it returns home. */
static void origin_depart_and_park(void *arg)
{
	struct dex_thread *t = arg;
	__atomic_store_n(&dex_rt.thread_location[t->thread_id], (uint8_t)t->migrate_target, __ATOMIC_RELEASE);
	send_migrate(t->migrate_target, t);
	for (;;) {
		dex_mail_wait(t);
		if (t->mail.type == DEX_MSG_MIGRATE) {
			restore_app_affinity(t);
			const struct dex_msg_migrate *m = (const void *)t->mail.payload;
			t->app_context = m->context;
			t->trace_tag = m->trace_tag;
			dex_note_arrival(m->sent_ns);
			__atomic_store_n(&t->mail.ready, 0, __ATOMIC_RELEASE);
			dex_rt.thread_location[t->thread_id] = 0;
			claim_stack_top(&t->app_context);
			dex_context_resume(&t->app_context, 1);
		}
		dex_origin_run_delegated(t, t->mail.from, (const void *)t->mail.payload);
	}
}

int dex_migrate(int target)
{
	if (target < 0 || (unsigned)target >= dex_rt.nodes)
		return EINVAL;
	if ((unsigned)target == dex_rt.node)
		return EBUSY;
	struct dex_thread *t = dex_self();
	if (!t || (t->role != DEX_ROLE_APP_ORIGIN && t->role != DEX_ROLE_WORKER))
		return EPERM; /* not a thread started through pthread_create under dexrun */
	t->migrate_target = (uint32_t)target;
	if (dex_context_save(&t->app_context) != 0)
		return 0; /* resumed on the target node; `t` belongs to the old one */
	t->app_context.fs_base = dex_get_fs_base();
	t->departed_ns = dex_now_ns();
	if (t->role == DEX_ROLE_APP_ORIGIN)
		dex_call_on_stack((char *)t + DEX_SIGNAL_STACK_OFFSET, origin_depart_and_park, t);
	t->sud_selector = 0;
	dex_set_fs_base(t->own_fs_base);
	dex_context_resume(&t->pool_context, DEX_DEPARTED);
}

/* A pooled worker on a node: adopt contexts until the process ends. */
static void *worker_main(void *arg)
{
	struct dex_thread *t = arg;
	dex_tls_runtime_thread = 1;
	t->own_fs_base = dex_get_fs_base();
	stack_t ss = { .ss_sp = (char *)t + DEX_SIGNAL_STACK_OFFSET,
		       .ss_size = DEX_THREAD_BLOCK - DEX_SIGNAL_STACK_OFFSET };
	if (raw_syscall(SYS_sigaltstack, &ss, 0, 0) != 0)
		dex_fatal("sigaltstack failed in worker");
	dex_arm_dispatch(t);
	for (;;) {
		dex_mail_wait(t);
		if (t->mail.type != DEX_MSG_MIGRATE)
			dex_fatal("worker %u got unexpected %s", t->worker, dex_msg_type_name(t->mail.type));
		const struct dex_msg_migrate *m = (const void *)t->mail.payload;
		t->thread_id = m->thread;
		t->trace_tag = m->trace_tag;
		t->app_context = m->context;
		__atomic_store_n(&t->mail.ready, 0, __ATOMIC_RELEASE);
		dex_note_arrival(m->sent_ns);
		if (dex_context_save(&t->pool_context) == 0) {
			claim_stack_top(&t->app_context);
			dex_set_fs_base(t->app_context.fs_base);
			t->sud_selector = 1;
			dex_context_resume(&t->app_context, 1);
		}
		/* The thread left this node from dex_migrate: we are back on the
		 * worker's own stack and TLS with dispatch allowed. */
		dex_lock_acquire(&dex_rt.workers_lock);
		dex_rt.worker_idle[t->worker] = 1;
		dex_lock_release(&dex_rt.workers_lock);
		send_migrate(0, t);
	}
	return NULL;
}

/* With workers_lock held: a new pooled worker, started by the caller. */
static struct dex_thread *new_worker(bool idle)
{
	if (dex_rt.nworkers == DEX_MAX_WORKERS)
		dex_fatal("more than %d threads on this node", DEX_MAX_WORKERS);
	struct dex_thread *t = dex_thread_block_alloc(DEX_ROLE_WORKER);
	t->worker = dex_rt.nworkers;
	dex_rt.workers[t->worker] = t;
	dex_rt.worker_idle[t->worker] = idle;
	dex_rt.nworkers++;
	dex_rt.workers_created++;
	return t;
}

/* A node keeps one idle worker ready, so an arriving thread never waits
 * for a thread to be created (about 80 us idle, milliseconds on a loaded
 * machine). */
static void start_spare_worker(void)
{
	dex_lock_acquire(&dex_rt.workers_lock);
	struct dex_thread *spare = new_worker(true);
	dex_lock_release(&dex_rt.workers_lock);
	dex_start_service_thread(worker_main, spare);
}

/* Replacements are created by a thread of their own, not by the receiver:
 * the receiver serves the origin's page requests, and the thread that just
 * arrived is about to need them (a new spare used to delay its first
 * migration back by tens of microseconds). */
static uint32_t spare_wanted; /* futex word */

static void *spare_maker(void *arg)
{
	(void)arg;
	dex_tls_runtime_thread = 1;
	dex_thread_create_block(DEX_ROLE_SERVICE);
	for (;;) {
		while (!__atomic_exchange_n(&spare_wanted, 0, __ATOMIC_ACQ_REL))
			futex_wait_while(&spare_wanted, 0);
		start_spare_worker();
	}
	return NULL;
}

/* Two idle workers from the start: the first thread to arrive takes one
 * and leaves the other as the spare, so no worker is created while that
 * thread runs here. Creating one then (mmap, clone, the new thread's own
 * set-up) overlapped the thread's first return to the origin and cost it
 * tens of microseconds on 2 vCPUs: the mprotect of its released stack top
 * waited for the mmap lock, and both wanted the same CPUs. */
void dex_node_start_workers(void)
{
	start_spare_worker();
	start_spare_worker();
	dex_start_service_thread(spare_maker, NULL);
}

void dex_node_handle_migrate(const struct dex_msg_header *h, const struct dex_msg_migrate *m)
{
	if (m->target != dex_rt.node)
		dex_fatal("rejected MIGRATE for node %u", m->target);
	struct dex_thread *t = NULL;
	bool fresh = false, spare_left = false;
	dex_lock_acquire(&dex_rt.workers_lock);
	for (uint32_t i = 0; i < dex_rt.nworkers; i++) {
		if (!dex_rt.worker_idle[i])
			continue;
		if (!t) {
			dex_rt.worker_idle[i] = 0;
			t = dex_rt.workers[i];
		} else {
			spare_left = true;
			break;
		}
	}
	if (!t) {
		t = new_worker(false);
		fresh = true;
	}
	dex_lock_release(&dex_rt.workers_lock);
	dex_dsm_fetch_ahead(m->context.rsp - STACK_TOP_CLAIM, STACK_TOP_CLAIM_BYTES, true);
	dex_mail_post(t, h, m);
	if (fresh)
		dex_start_service_thread(worker_main, t);
	if (!spare_left) {
		__atomic_store_n(&spare_wanted, 1, __ATOMIC_RELEASE);
		raw_futex(&spare_wanted, FUTEX_WAKE, 1);
	}
}

void dex_origin_handle_migrate(const struct dex_msg_header *h, const struct dex_msg_migrate *m)
{
	struct dex_thread *t = dex_rt.threads[m->thread];
	if (!t || dex_rt.thread_location[m->thread] != h->from)
		dex_fatal("rejected MIGRATE from node %u for thread %u that is not there", h->from, m->thread);
	if (m->target == 0) {
		dex_dsm_accept_carried(h->from, m);
		dex_dsm_fetch_ahead(m->context.rsp - STACK_TOP_CLAIM, STACK_TOP_CLAIM_BYTES, true);
		if (__atomic_load_n(&t->mail.sleeping, __ATOMIC_SEQ_CST)) /* see pin_home_thread_here */
			pin_home_thread_here(t);
		dex_mail_post(t, h, m);
		return;
	}
	/* Node-to-node: the origin relays and records where the thread is. */
	__atomic_store_n(&dex_rt.thread_location[m->thread], (uint8_t)m->target, __ATOMIC_RELEASE);
	dex_send(m->target, DEX_MSG_MIGRATE, m, sizeof(*m), NULL, 0);
}

/* ---------------------------------------------------------- public API */

void dex_trace_tag(unsigned long tag)
{
	struct dex_thread *t = dex_self();
	if (t)
		t->trace_tag = tag;
}

int dex_node(void)
{
	return (int)dex_rt.node;
}

int dex_nodes(void)
{
	return (int)dex_rt.nodes;
}

int migrate(int nid, void (*callback)(void *), void *arg)
{
	int rc = dex_migrate(nid);
	if (rc == 0 && callback)
		callback(arg);
	return rc;
}

int popcorn_get_node_info(int *current, struct popcorn_node_info *info)
{
	*current = dex_node();
	for (int i = 0; i < POPCORN_MAX_NODES; i++) {
		info[i].status = (unsigned)i < dex_rt.nodes ? 1 : 0;
		info[i].arch = 0; /* all nodes run x86-64 */
		info[i].distance = i == *current ? 0 : 1;
	}
	return 0;
}

int popcorn_gettid(void)
{
	/* The home thread id, kept in glibc's descriptor in shared memory, so
	 * the answer does not change when the thread migrates. */
	if (!dex_rt.active)
		return (int)raw_syscall(SYS_gettid, 0, 0, 0);
	return *(const int *)(dex_get_fs_base() + (uint64_t)dex_rt.tid_offset);
}
