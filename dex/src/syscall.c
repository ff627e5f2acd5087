/* System calls of application threads, caught with Syscall User Dispatch.
 *
 * Every application thread runs with dispatch armed; libdex's own text is
 * exempt, so the handler and the runtime issue real system calls freely.
 *   - On a node, calls whose state lives at the origin (futex on shared
 *     memory, file I/O, open/close/stat) are shipped to the thread's home
 *     OS thread at the origin, which runs them and answers.
 *   - At the origin, calls that make the kernel touch shared pages are run
 *     after faulting those pages in (the kernel would otherwise fail them
 *     with EFAULT: a protected page cannot be faulted in from kernel mode).
 *   - Thread and process exit are steered home first, so glibc's per-process
 *     bookkeeping and the kernel's thread id stay at the origin. */
#include "internal.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <ucontext.h>

#include "../include/dex.h"

#ifndef PR_SET_SYSCALL_USER_DISPATCH
#define PR_SET_SYSCALL_USER_DISPATCH 59
#define PR_SYS_DISPATCH_ON 1
#endif

#define FUTEX_COMMAND(op) ((op) & ~(FUTEX_PRIVATE_FLAG | FUTEX_CLOCK_REALTIME))
#define EFAULT_RETRIES 1000

void dex_arm_dispatch(struct dex_thread *t)
{
	long rc = raw_syscall6(SYS_prctl, PR_SET_SYSCALL_USER_DISPATCH, PR_SYS_DISPATCH_ON, (long)dex_rt.text_start,
			       (long)(dex_rt.text_end - dex_rt.text_start), (long)&t->sud_selector, 0);
	if (rc != 0)
		dex_fatal("Syscall User Dispatch unavailable (%ld); Linux 5.11+ required", rc);
}

static bool futex_has_timeout(int command)
{
	return command == FUTEX_WAIT || command == FUTEX_WAIT_BITSET || command == FUTEX_LOCK_PI ||
	       command == FUTEX_WAIT_REQUEUE_PI || command == 13 /* FUTEX_LOCK_PI2 */;
}

/* Makes the futex words present with the access the kernel will need, then
 * runs the call; a page stolen in between shows up as EFAULT and we retry. */
static long futex_with_shared_words(const long a[6])
{
	int command = FUTEX_COMMAND((int)a[1]);
	for (int attempt = 0;; attempt++) {
		switch (command) {
		case FUTEX_WAIT:
		case FUTEX_WAIT_BITSET:
		case FUTEX_CMP_REQUEUE:
			dex_prefault((uintptr_t)a[0], 4, false);
			break;
		case FUTEX_WAKE_OP:
			dex_prefault((uintptr_t)a[4], 4, true);
			break;
		case FUTEX_LOCK_PI:
		case FUTEX_UNLOCK_PI:
		case FUTEX_TRYLOCK_PI:
		case FUTEX_WAIT_REQUEUE_PI:
		case FUTEX_CMP_REQUEUE_PI:
		case 13:
			dex_prefault((uintptr_t)a[0], 4, true);
			break;
		default:
			break;
		}
		long ret = raw_syscall6(SYS_futex, a[0], a[1], a[2], a[3], a[4], a[5]);
		if (ret != -EFAULT || attempt == EFAULT_RETRIES)
			return ret;
	}
}

/* Origin: run the call, faulting in shared pages that it names whenever the
 * kernel reports EFAULT. Buffers of the common I/O calls are faulted in up
 * front with their full length. */
static long origin_syscall(long nr, long a[6])
{
	if (nr == SYS_futex)
		return dex_in_shared((uintptr_t)a[0]) ? futex_with_shared_words(a)
						      : raw_syscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
	for (int attempt = 0;; attempt++) {
		switch (nr) {
		case SYS_read:
		case SYS_pread64:
			dex_prefault((uintptr_t)a[1], (size_t)a[2], true);
			break;
		case SYS_write:
		case SYS_pwrite64:
			dex_prefault((uintptr_t)a[1], (size_t)a[2], false);
			break;
		case SYS_readv:
		case SYS_writev: {
			const struct iovec *iov = (const struct iovec *)a[1];
			for (long i = 0; i < a[2] && i < 1024; i++)
				dex_prefault((uintptr_t)iov[i].iov_base, iov[i].iov_len, nr == SYS_readv);
			break;
		}
		default:
			if (attempt > 0)
				for (int i = 0; i < 6; i++)
					if (dex_in_shared((uintptr_t)a[i]))
						dex_prefault((uintptr_t)a[i], 1, true);
			break;
		}
		long ret = raw_syscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
		if (ret != -EFAULT || attempt == EFAULT_RETRIES)
			return ret;
	}
}

static size_t bounded(long len)
{
	if (len < 0)
		return 0;
	return (size_t)len < DEX_SYSCALL_MAX_DATA ? (size_t)len : DEX_SYSCALL_MAX_DATA;
}

/* The case labels of the calls a node ships with their arguments alone and
 * the origin runs as they are: one list for node_delegates and
 * dex_origin_run_delegated, so that they cannot disagree. */
#define ARGUMENTS_ONLY_CALLS \
	case SYS_close: \
	case SYS_lseek: \
	case SYS_fsync: \
	case SYS_fdatasync: \
	case SYS_ftruncate: \
	case SYS_dup: \
	case SYS_dup2: \
	case SYS_dup3: \
	case SYS_fcntl: \
	case SYS_getpid: \
	case SYS_getppid

/* Which calls a node ships home, and what data travels with them. */
static bool node_delegates(long nr, const long a[6])
{
	switch (nr) {
	case SYS_futex:
		return dex_in_shared((uintptr_t)a[0]);
	case SYS_read:
	case SYS_pread64:
	case SYS_readv:
	case SYS_write:
	case SYS_pwrite64:
	case SYS_writev:
	case SYS_openat:
	case SYS_fstat:
	case SYS_newfstatat:
	case SYS_unlink:
	case SYS_unlinkat:
	case DEX_VMA_QUERY_CALL:
	ARGUMENTS_ONLY_CALLS:
		return true;
	default:
		return dex_vma_is_layout_call(nr, a); /* the origin owns the layout */
	}
}

static size_t copy_string(char *dst, const char *src, size_t cap)
{
	size_t n = 0;
	while (n + 1 < cap && src[n])
		n++;
	memcpy(dst, src, n);
	dst[n] = 0;
	return n + 1;
}

static long node_delegate(struct dex_thread *self, long nr, long a[6])
{
	struct dex_msg_syscall *m = (struct dex_msg_syscall *)self->scratch;
	char *data = self->scratch + sizeof(*m);
	size_t length = 0;
	long number = nr;
	m->thread = self->thread_id;
	m->worker = self->worker;
	for (int i = 0; i < 6; i++)
		m->args[i] = (uint64_t)a[i];
	switch (nr) {
	case SYS_write:
	case SYS_pwrite64:
		length = bounded(a[2]);
		memcpy(data, (const void *)a[1], length);
		break;
	case SYS_writev: {
		/* Gathered into one write; a short count is a legal writev result. */
		const struct iovec *iov = (const struct iovec *)a[1];
		for (long i = 0; i < a[2] && length < DEX_SYSCALL_MAX_DATA; i++) {
			size_t take = bounded((long)(DEX_SYSCALL_MAX_DATA - length));
			if (take > iov[i].iov_len)
				take = iov[i].iov_len;
			memcpy(data + length, iov[i].iov_base, take);
			length += take;
		}
		number = SYS_write;
		m->args[2] = length;
		break;
	}
	case SYS_readv: {
		/* Served as a read into the first buffer: a short read is legal. */
		const struct iovec *iov = (const struct iovec *)a[1];
		number = SYS_read;
		m->args[1] = (uint64_t)iov[0].iov_base;
		m->args[2] = a[2] > 0 ? iov[0].iov_len : 0;
		a[1] = (long)iov[0].iov_base;
		break;
	}
	case SYS_openat:
	case SYS_newfstatat:
	case SYS_unlinkat:
		length = copy_string(data, (const char *)a[1], DEX_SYSCALL_MAX_DATA);
		break;
	case SYS_unlink:
		length = copy_string(data, (const char *)a[0], DEX_SYSCALL_MAX_DATA);
		break;
	case SYS_futex:
		if (futex_has_timeout(FUTEX_COMMAND((int)a[1])) && a[3]) {
			length = sizeof(struct timespec);
			memcpy(data, (const void *)a[3], length);
		}
		break;
	default:
		break;
	}
	/* Results are copied into the caller's memory below, while this
	 * thread's mailbox still holds the reply: learn the buffer's mapping
	 * rights first, since asking the origin uses the same mailbox. */
	uintptr_t result_buffer = number == SYS_newfstatat ? (uintptr_t)a[2] : (uintptr_t)a[1];
	size_t result_length = number == SYS_fstat || number == SYS_newfstatat ? sizeof(struct stat)
			       : number == SYS_read || number == SYS_pread64 ? bounded(a[2]) : 0;
	if (result_length && !dex_vma_allows_range(result_buffer, result_length, true))
		return -EFAULT;
	m->number = (uint64_t)number;
	m->data_length = (uint32_t)length;
	dex_send(0, DEX_MSG_SYSCALL, m, sizeof(*m) + length, NULL, 0);
	dex_mail_wait(self);
	const struct dex_msg_syscall_reply *r = (const void *)self->mail.payload;
	const char *out = self->mail.payload + sizeof(*r);
	long result = r->result;
	/* Copy results into the caller's memory from user mode, where a shared
	 * page fault is an ordinary DSM fault. */
	switch (number) {
	case SYS_read:
	case SYS_pread64:
		memcpy((void *)a[1], out, r->data_length);
		break;
	case SYS_fstat:
		memcpy((void *)a[1], out, r->data_length);
		break;
	case SYS_newfstatat:
		memcpy((void *)a[2], out, r->data_length);
		break;
	default:
		break;
	}
	__atomic_store_n(&self->mail.ready, 0, __ATOMIC_RELEASE);
	__atomic_add_fetch(&dex_rt.syscalls_delegated, 1, __ATOMIC_RELAXED);
	return result;
}

long dex_delegate_call(long nr, long a[6])
{
	return node_delegate(dex_self(), nr, a);
}

/* A node's mapping question. The fault that asks may come from inside
 * node_delegate while it fills the thread's scratch buffer (copying a
 * write() buffer in the mapped area), so the message is built here, not
 * in scratch; the mailbox is free then, as the call is not sent yet. */
long dex_ask_origin_rights(uintptr_t page)
{
	struct dex_thread *self = dex_self();
	/* A reply still in the mailbox: the fault is node_delegate copying
	 * results into a buffer whose rights it checked before sending, so it
	 * was unmapped meanwhile. Asking would clobber the reply; refuse. */
	if (__atomic_load_n(&self->mail.ready, __ATOMIC_ACQUIRE))
		return -EBUSY;
	struct dex_msg_syscall m = { .thread = self->thread_id, .worker = self->worker,
				     .number = (uint64_t)DEX_VMA_QUERY_CALL, .args = { page } };
	dex_send(0, DEX_MSG_SYSCALL, &m, sizeof(m), NULL, 0);
	dex_mail_wait(self);
	long result = ((const struct dex_msg_syscall_reply *)self->mail.payload)->result;
	__atomic_store_n(&self->mail.ready, 0, __ATOMIC_RELEASE);
	return result;
}

void dex_origin_run_delegated(struct dex_thread *t, unsigned from, const struct dex_msg_syscall *m)
{
	long a[6];
	for (int i = 0; i < 6; i++)
		a[i] = (long)m->args[i];
	const char *data = (const char *)(m + 1);
	struct dex_msg_syscall_reply *r = (struct dex_msg_syscall_reply *)t->scratch;
	char *out = t->scratch + sizeof(*r);
	size_t out_length = 0;
	long nr = (long)m->number;
	long ret;
	bool has_path = m->data_length > 0 && data[m->data_length - 1] == 0;
	switch (nr) {
	case SYS_write:
	case SYS_pwrite64:
		a[1] = (long)data;
		a[2] = (long)m->data_length;
		ret = raw_syscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
		break;
	case SYS_read:
	case SYS_pread64:
		a[1] = (long)out;
		a[2] = (long)bounded(a[2]);
		ret = raw_syscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
		out_length = ret > 0 ? (size_t)ret : 0;
		break;
	case SYS_openat:
	case SYS_unlinkat:
		a[1] = (long)data;
		ret = has_path ? raw_syscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5]) : -EINVAL;
		break;
	case SYS_unlink:
		a[0] = (long)data;
		ret = has_path ? raw_syscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5]) : -EINVAL;
		break;
	case SYS_newfstatat:
		a[1] = (long)data;
		a[2] = (long)out;
		ret = has_path ? raw_syscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5]) : -EINVAL;
		out_length = ret == 0 ? sizeof(struct stat) : 0;
		break;
	case SYS_fstat:
		a[1] = (long)out;
		ret = raw_syscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
		out_length = ret == 0 ? sizeof(struct stat) : 0;
		break;
	case SYS_futex:
		if (!dex_in_shared((uintptr_t)a[0])) {
			ret = -EINVAL;
			break;
		}
		if (m->data_length == sizeof(struct timespec))
			a[3] = (long)data;
		ret = futex_with_shared_words(a);
		break;
	ARGUMENTS_ONLY_CALLS:
		ret = raw_syscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
		break;
	case DEX_BARRIER_CALL:
		ret = dex_origin_barrier_call(a);
		break;
	default:
		if (!dex_vma_origin_call(nr, a, &ret))
			ret = -ENOSYS; /* nodes only ship the calls listed above */
		break;
	}
	r->worker = m->worker;
	r->data_length = (uint32_t)out_length;
	r->result = ret;
	/* The request is consumed; the node may send the next one as soon as
	 * it has this reply. */
	__atomic_store_n(&t->mail.ready, 0, __ATOMIC_RELEASE);
	dex_send(from, DEX_MSG_SYSCALL_REPLY, r, sizeof(*r) + out_length, NULL, 0);
}

#define SIGBIT(s) (UINT64_C(1) << ((s) - 1))

/* Inside the handler the kernel restores uc_sigmask on return, so a mask
 * change must be made there. SIGSEGV and SIGSYS stay deliverable: the DSM
 * and dispatch depend on them. */
static long emulate_sigprocmask(ucontext_t *uc, const long a[6])
{
	uint64_t *mask = (uint64_t *)&uc->uc_sigmask;
	uint64_t current = *mask;
	if (a[1]) {
		uint64_t set = *(const uint64_t *)a[1];
		switch (a[0]) {
		case SIG_BLOCK: current |= set; break;
		case SIG_UNBLOCK: current &= ~set; break;
		case SIG_SETMASK: current = set; break;
		default: return -EINVAL;
		}
	}
	if (a[2])
		*(uint64_t *)a[2] = *mask;
	*mask = current & ~(SIGBIT(SIGSEGV) | SIGBIT(SIGSYS));
	return 0;
}

/* Application handlers must return through a restorer inside libdex, or
 * their rt_sigreturn would trap; SIGSEGV and SIGSYS belong to the runtime. */
static long guarded_sigaction(const long a[6])
{
	int sig = (int)a[0];
	const struct kernel_sigaction *act = (const void *)a[1];
	if (sig == SIGSEGV && dex_rt.active) {
		/* Kept in shared memory: a genuine fault (an unmapped or
		 * read-only page) on any node runs it (dex_deliver_app_sigsegv). */
		struct dex_app_segv_action *saved = dex_heap_app_segv_action();
		if (a[2]) {
			struct kernel_sigaction *old = (void *)a[2];
			*old = (struct kernel_sigaction){ .handler = saved->handler, .flags = saved->flags };
		}
		if (act) {
			saved->handler = act->handler;
			saved->flags = act->flags;
		}
		return 0;
	}
	if (act && (sig == SIGSEGV || sig == SIGSYS))
		return a[2] ? raw_syscall6(SYS_rt_sigaction, sig, 0, a[2], a[3], 0, 0) : 0;
	if (!act)
		return raw_syscall6(SYS_rt_sigaction, sig, 0, a[2], a[3], 0, 0);
	struct kernel_sigaction copy = *act;
	if (copy.flags & SA_RESTORER)
		copy.restorer = (void *)dex_sigreturn_trampoline;
	return raw_syscall6(SYS_rt_sigaction, sig, (long)&copy, a[2], a[3], 0, 0);
}

/* Continue the interrupted thread in `fn(arg)` instead of the system call. */
static void redirect(ucontext_t *uc, void (*fn)(long), long arg)
{
	greg_t *g = uc->uc_mcontext.gregs;
	uintptr_t sp = ((uintptr_t)g[REG_RSP] - 256) & ~(uintptr_t)15;
	g[REG_RSP] = (greg_t)(sp - 8); /* as if called: fn never returns */
	g[REG_RIP] = (greg_t)fn;
	g[REG_RDI] = arg;
}

/* A fault the mapping rights refuse is the application's own: run its
 * SIGSEGV handler as the kernel would, or die of SIGSEGV without one.
 * Called from the runtime's handler, where SIGSEGV is blocked; it is
 * unblocked first because reading the action, and the application's
 * handler itself, may take DSM faults. */
void dex_deliver_app_sigsegv(void *siginfo, void *ucontext, int code)
{
	siginfo_t *si = siginfo;
	uint64_t unblock = SIGBIT(SIGSEGV);
	raw_syscall6(SYS_rt_sigprocmask, SIG_UNBLOCK, (long)&unblock, 0, 8, 0, 0);
	struct dex_app_segv_action action = *dex_heap_app_segv_action();
	if (action.handler == SIG_DFL || action.handler == SIG_IGN) {
		struct kernel_sigaction dfl = { SIG_DFL, 0, 0, 0 };
		raw_syscall6(SYS_rt_sigaction, SIGSEGV, (long)&dfl, 0, 8, 0, 0);
		return; /* the access runs again and the kernel ends the process */
	}
	si->si_code = code;
	if (action.flags & SA_SIGINFO)
		((void (*)(int, siginfo_t *, void *))action.handler)(SIGSEGV, si, ucontext);
	else
		((void (*)(int))action.handler)(SIGSEGV);
}

void dex_sigsys_handler(int sig, void *info, void *ucontext)
{
	(void)sig;
	siginfo_t *si = info;
	ucontext_t *uc = ucontext;
	greg_t *g = uc->uc_mcontext.gregs;
	long nr = si->si_syscall;
	long a[6] = { g[REG_RDI], g[REG_RSI], g[REG_RDX], g[REG_R10], g[REG_R8], g[REG_R9] };
	long ret;
	switch (nr) {
	case SYS_rt_sigprocmask:
		ret = emulate_sigprocmask(uc, a);
		break;
	case SYS_rt_sigaction:
		ret = guarded_sigaction(a);
		break;
	case SYS_exit:
		redirect(uc, dex_thread_exit_here, a[0]);
		return;
	case SYS_exit_group:
		redirect(uc, dex_process_exit_here, a[0]);
		return;
	default:
		if (dex_rt.node == 0 && dex_vma_origin_call(nr, a, &ret))
			break;
		if (dex_rt.node == 0)
			ret = origin_syscall(nr, a);
		else if (node_delegates(nr, a))
			ret = node_delegate(dex_self(), nr, a);
		else
			ret = raw_syscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
		break;
	}
	g[REG_RAX] = ret;
}

/* Last steps of an exiting thread, on its block's private stack: the
 * joiner may free the shared stack as soon as it sees the tid cleared. */
static void finish_thread_exit(void *tid_word)
{
	int *tid = tid_word;
	__atomic_store_n(tid, 0, __ATOMIC_RELEASE);
	/* glibc's pthread_join waits on this word as a shared futex. */
	raw_syscall6(SYS_futex, (long)tid, FUTEX_WAKE, INT32_MAX, 0, 0, 0);
	raw_syscall6(SYS_futex, (long)tid, FUTEX_WAKE | FUTEX_PRIVATE_FLAG, INT32_MAX, 0, 0, 0);
	for (;;)
		raw_syscall(SYS_exit, 0, 0, 0);
}

/* A thread ends at home. The kernel's own "clear tid and wake the joiner"
 * at exit would write a shared page from kernel mode, which fails silently
 * if the page is elsewhere, so it is done by hand in user mode; the kernel
 * instead clears the block's exit_word, which tells the block allocator
 * when this OS thread is really gone. The thread id is free at once. */
void dex_thread_exit_here(long code)
{
	(void)code; /* a thread's exit code is not observable under pthreads */
	if (dex_rt.node != 0)
		dex_migrate(0);
	struct dex_thread *t = dex_self();
	int *tid = (int *)(dex_get_fs_base() + (uint64_t)dex_rt.tid_offset);
	if (!t || t->role != DEX_ROLE_APP_ORIGIN) {
		raw_syscall(SYS_set_tid_address, 0, 0, 0);
		finish_thread_exit(tid);
	}
	t->exit_word = (uint32_t)raw_syscall(SYS_gettid, 0, 0, 0);
	raw_syscall(SYS_set_tid_address, &t->exit_word, 0, 0);
	dex_rt.threads[t->thread_id] = NULL;
	dex_thread_id_free(t->thread_id);
	dex_thread_retire_block(t);
	dex_call_on_stack((char *)t + DEX_SIGNAL_STACK_OFFSET, finish_thread_exit, tid);
}

void dex_process_exit_here(long code)
{
	if (dex_rt.node != 0)
		dex_migrate(0);
	dex_origin_shutdown_nodes((int)code);
	for (;;)
		raw_syscall(SYS_exit_group, code, 0, 0);
}
