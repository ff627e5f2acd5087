/* libdex runtime: start-up, transport, and the DSM fault path.
 *
 * This is the thin shell around protocol.c: it maps the shared regions,
 * turns SIGSEGV into protocol requests, applies the directory's actions
 * (send a message, change a page protection) and moves page bytes through
 * an always-writable alias of each region. */
#include "internal.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/personality.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

struct dex_runtime dex_rt = { .nodes = 1 };
__thread int dex_tls_runtime_thread;

#define DEX_THREAD_MAGIC 0xde7ull

/* ------------------------------------------------------------ diagnostics */

static void write_all_raw(int fd, const char *buf, size_t len)
{
	while (len) {
		long n = raw_syscall(SYS_write, fd, buf, len);
		if (n <= 0)
			return;
		buf += n;
		len -= (size_t)n;
	}
}

static void vlog(const char *level, const char *fmt, va_list ap)
{
	char line[512];
	int n = snprintf(line, sizeof(line), "dex[node %u]: %s", dex_rt.node, level);
	n += vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	if (n > (int)sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	line[n++] = '\n';
	write_all_raw(2, line, (size_t)n);
}

void dex_log(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vlog("", fmt, ap);
	va_end(ap);
}

void dex_fatal(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vlog("error: ", fmt, ap);
	va_end(ap);
	raw_syscall(SYS_exit_group, 70, 0, 0);
	__builtin_unreachable();
}

uint64_t dex_env_number(const char *name, uint64_t fallback, uint64_t max)
{
	const char *text = getenv(name);
	if (!text)
		return fallback;
	char *end;
	errno = 0;
	unsigned long long value = strtoull(text, &end, 10);
	if (errno || end == text || *end || *text == '-' || value > max)
		dex_fatal("%s must be a whole number from 0 to %llu, not '%s'", name, (unsigned long long)max, text);
	return value;
}

uint64_t dex_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* -------------------------------------------------------------- transport */

/* The TCP transport: one connected socket per peer (the bootstrap socket
 * itself), written with sendmsg and read with recvfrom. Both are plain system
 * calls, so they are safe from signal handlers and any thread. */
static int tcp_send(unsigned peer, struct iovec *iov, int iovcnt)
{
	int fd = dex_rt.peers[peer].fd;
	size_t left = 0;
	for (int i = 0; i < iovcnt; i++)
		left += iov[i].iov_len;
	while (left) {
		/* sendmsg with MSG_NOSIGNAL: a dead peer must produce our error
		 * message, not a silent SIGPIPE death. */
		struct msghdr msg = { .msg_iov = iov, .msg_iovlen = (size_t)iovcnt };
		long n = raw_syscall(SYS_sendmsg, fd, &msg, MSG_NOSIGNAL);
		if (n == -EINTR)
			continue;
		if (n <= 0)
			return -1;
		left -= (size_t)n;
		for (int i = 0; i < iovcnt && n; i++) {
			size_t take = (size_t)n < iov[i].iov_len ? (size_t)n : iov[i].iov_len;
			iov[i].iov_base = (char *)iov[i].iov_base + take;
			iov[i].iov_len -= take;
			n -= (long)take;
		}
	}
	return 0;
}

/* With DEX_POLL_US, a receiver that had data within that many microseconds
 * polls its socket rather than sleeping in it, so the next message costs no
 * wake-up of an idle CPU (tens of microseconds in a virtual machine); after
 * a quiet spell it blocks again, under the socket's receive timeout. The
 * socket itself stays blocking: senders share it. */
static bool receiver_polls(const struct dex_peer *p)
{
	return dex_rt.receive_poll_ns && dex_now_ns() - p->last_data_ns < dex_rt.receive_poll_ns;
}

/* Returns 1 on success, 0 on orderly EOF, -1 on error, -2 when the peer
 * sent nothing for the peer timeout (SO_RCVTIMEO). */
static int tcp_receive(unsigned peer, void *buf, size_t len)
{
	struct dex_peer *p = &dex_rt.peers[peer];
	char *bytes = buf;
	size_t got = 0;
	while (got < len) {
		bool polling = receiver_polls(p);
		long n = raw_syscall6(SYS_recvfrom, p->fd, (long)(bytes + got), (long)(len - got),
				      polling ? MSG_DONTWAIT : 0, 0, 0);
		if (n == -EAGAIN && polling) {
			raw_syscall(SYS_sched_yield, 0, 0, 0);
			continue;
		}
		if (n == -EINTR)
			continue;
		if (n == 0)
			return got ? -1 : 0;
		if (n == -EAGAIN)
			return -2;
		if (n < 0)
			return -1;
		got += (size_t)n;
		if (dex_rt.receive_poll_ns)
			p->last_data_ns = dex_now_ns();
	}
	return 1;
}

static int tcp_connect(void)
{
	return 0; /* the bootstrap sockets are the data path */
}

static void tcp_flush(void)
{
}

static const struct dex_transport tcp_transport = {
	.name = "tcp", .connect = tcp_connect, .send = tcp_send, .receive = tcp_receive, .flush = tcp_flush,
};

/* HELLO/WELCOME always travel over TCP (the bootstrap); dex_transport
 * switches to the selected transport once it has connected. */
const struct dex_transport *dex_transport = &tcp_transport;
static const struct dex_transport *selected_transport = &tcp_transport;

static void connect_selected_transport(void)
{
	int was_runtime = dex_tls_runtime_thread;
	dex_tls_runtime_thread = DEX_TRANSPORT_THREAD;
	int rc = selected_transport->connect();
	dex_tls_runtime_thread = was_runtime;
	if (rc != 0)
		dex_fatal("the %s transport could not connect %s", selected_transport->name,
			  dex_rt.node == 0 ? "the nodes" : "to the origin");
	dex_transport = selected_transport;
}

/* Sends one message whose data is gathered from `ndata` buffers (page
 * bytes straight from the alias: no staging copy). */
static int dex_sendv(unsigned peer, enum dex_msg_type type, const void *fixed, size_t fixed_len,
		     const struct iovec *data, int ndata)
{
	struct dex_peer *p = &dex_rt.peers[peer];
	struct dex_msg_header h;
	struct iovec iov[2 + DEX_PREFETCH_MAX];
	size_t length = fixed_len;
	iov[0] = (struct iovec){ &h, sizeof(h) };
	iov[1] = (struct iovec){ (void *)fixed, fixed_len };
	for (int i = 0; i < ndata; i++) {
		iov[2 + i] = data[i];
		length += data[i].iov_len;
	}
	dex_lock_acquire(&p->send_lock);
	dex_msg_fill_header(&h, type, dex_rt.node, (uint32_t)length, ++p->sequence);
	int rc = dex_transport->send(peer, iov, 2 + ndata);
	dex_lock_release(&p->send_lock);
	if (rc && !dex_rt.shutting_down)
		dex_fatal("connection to node %u broken while sending %s", peer, dex_msg_type_name(type));
	return rc;
}

int dex_send(unsigned peer, enum dex_msg_type type, const void *fixed, size_t fixed_len, const void *data,
	     size_t data_len)
{
	struct iovec d = { (void *)data, data_len };
	return dex_sendv(peer, type, fixed, fixed_len, &d, data_len ? 1 : 0);
}

static struct dex_validation_limits limits(void)
{
	return (struct dex_validation_limits){ .nodes = dex_rt.nodes, .max_threads = DEX_MAX_THREADS,
					       .max_workers = DEX_MAX_WORKERS, .regions = dex_rt.bounds,
					       .nregions = dex_rt.nregions };
}

static int64_t page_index(uintptr_t addr);
static char *page_alias(uint32_t page);

/* Page bytes this side expects (grants on a node; acknowledgements and a
 * returning thread's stack top at the origin) are read straight into the
 * alias of the pages they are for, once the fixed part has been validated:
 * no staging copy. The pages are ones this process has asked for (or, at
 * the origin, busy pages it fetches, or a node's pages coming home with a
 * thread), inaccessible to the application until the handler grants them;
 * a message found unexpected there stops the run as before. */
static bool data_goes_to_alias(const struct dex_msg_header *h)
{
	if (dex_rt.node == 0)
		return h->type == DEX_MSG_INVALIDATE_ACK || h->type == DEX_MSG_MIGRATE;
	return h->type == DEX_MSG_PAGE_GRANT || h->type == DEX_MSG_PAGE_PREFETCH;
}

static int receive_into_alias(unsigned peer, const struct dex_msg_header *h, char *payload)
{
	switch (h->type) {
	case DEX_MSG_PAGE_GRANT: {
		const struct dex_msg_page_grant *m = (const void *)payload;
		if (!m->with_data)
			return 1;
		return dex_transport->receive(peer, page_alias((uint32_t)page_index(m->address)), DEX_PAGE_SIZE);
	}
	case DEX_MSG_PAGE_PREFETCH: {
		const struct dex_msg_page_prefetch *m = (const void *)payload;
		uint32_t first = (uint32_t)page_index(m->address);
		for (uint32_t i = 0; i < m->count;) {
			if (!(m->with_data & (UINT64_C(1) << i))) {
				i++;
				continue;
			}
			uint32_t j = i + 1;
			while (j < m->count && (m->with_data & (UINT64_C(1) << j)))
				j++;
			int rc = dex_transport->receive(peer, page_alias(first + i), (size_t)(j - i) * DEX_PAGE_SIZE);
			if (rc != 1)
				return rc;
			i = j;
		}
		return 1;
	}
	case DEX_MSG_INVALIDATE_ACK: {
		const struct dex_msg_invalidate_ack *m = (const void *)payload;
		if (!m->with_data)
			return 1;
		return dex_transport->receive(peer, page_alias((uint32_t)page_index(m->address)),
					      (size_t)m->count * DEX_PAGE_SIZE);
	}
	case DEX_MSG_MIGRATE: {
		/* A thread's stack top coming home, released by `peer`
		 * (dex_dsm_accept_carried). While the directory has `peer` as
		 * a page's writer, only `peer`'s own messages, read here in
		 * order, write the page's alias: the bytes go straight there.
		 * A read-only copy's bytes are the origin's already; they, and
		 * those of a page `peer` does not hold (a release the directory
		 * then rejects), land past the fixed part and are dropped. */
		const struct dex_msg_migrate *m = (const void *)payload;
		uint32_t first = (uint32_t)page_index(m->carried_address);
		for (uint32_t page = first; page < first + m->carried_pages; page++) {
			dex_lock_acquire(&dex_rt.dsm_lock);
			bool written = dsm_dir_access(&dex_rt.dir, page, peer) == DSM_WRITE;
			dex_lock_release(&dex_rt.dsm_lock);
			int rc = dex_transport->receive(peer, written ? page_alias(page) : payload + sizeof(*m),
							DEX_PAGE_SIZE);
			if (rc != 1)
				return rc;
		}
		return 1;
	}
	default:
		return 1;
	}
}

/* Reads one validated message. Returns 1, 0 on EOF; malformed input is fatal:
 * after a corrupt message neither side can trust the shared state. Page
 * bytes that data_goes_to_alias are in place, not in `payload`. */
static int receive_message(unsigned peer, struct dex_msg_header *h, char *payload)
{
	int rc = dex_transport->receive(peer, h, sizeof(*h));
	if (rc <= 0)
		return rc;
	struct dex_validation_limits lim = limits();
	const char *why = dex_msg_check_header(h, &lim);
	if (why)
		dex_fatal("rejected malformed message from node %u: %s", peer, why);
	bool to_alias = data_goes_to_alias(h);
	size_t first_part = to_alias ? dex_msg_fixed_size(h->type) : h->length;
	rc = dex_transport->receive(peer, payload, first_part);
	if (rc != 1)
		return rc == 0 ? -1 : rc;
	why = dex_msg_check(h, payload, &lim); /* reads the fixed part only */
	if (why)
		dex_fatal("rejected %s from node %u: %s", dex_msg_type_name(h->type), peer, why);
	if (h->from != peer)
		dex_fatal("message from node %u arrived on node %u's connection", h->from, peer);
	if (to_alias) {
		rc = receive_into_alias(peer, h, payload);
		if (rc != 1)
			return rc == 0 ? -1 : rc;
	}
	return 1;
}

/* ---------------------------------------------------------------- threads */

/* Nearly every message fits in a buffer's first page: fault it in when
 * the buffer is made, not on a thread's first migration. */
static void touch_first_page(char *buffer)
{
	*(volatile char *)buffer = 0;
}

/* A receiver's buffer for one message's payload. */
static char *receive_buffer(void)
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
static struct dex_thread *dex_self_in_handler(const ucontext_t *uc)
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

void dex_print_stats(void)
{
	if (!getenv("DEX_STATS"))
		return;
	uint64_t in = dex_rt.migrations_in;
	dex_log("stats: faults %llu read %llu write, %llu pages received, %llu pages granted by prefetch, "
		"%llu invalidations served, "
		"%llu syscalls delegated, %llu arrivals (mean %.1f us in flight), %llu workers created",
		(unsigned long long)dex_rt.faults_read, (unsigned long long)dex_rt.faults_write,
		(unsigned long long)dex_rt.pages_received, (unsigned long long)dex_rt.pages_prefetched,
		(unsigned long long)dex_rt.invalidations_served,
		(unsigned long long)dex_rt.syscalls_delegated, (unsigned long long)in,
		in ? dex_rt.migration_ns_total / 1e3 / (double)in : 0.0, (unsigned long long)dex_rt.workers_created);
	dex_log("stats: layout: %llu rights queries, %llu revokes broadcast (origin) or applied (node)",
		(unsigned long long)dex_rt.layout_queries, (unsigned long long)dex_rt.layout_revokes);
	dex_log("stats: readahead: %llu next windows asked for at a marker", (unsigned long long)dex_rt.readahead_markers);
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
static bool changed_while_polling(const uint32_t *word, uint32_t seen, uint64_t since_ns, uintptr_t alias)
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
	if (changed_while_polling(&t->mail.ready, 0, dex_rt.receive_poll_ns ? dex_now_ns() : 0, 0))
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

/* ------------------------------------------------------------------- DSM */

bool dex_in_shared(uintptr_t addr)
{
	for (unsigned i = 0; i < dex_rt.nregions; i++)
		if (addr >= dex_rt.regions[i].start && addr < dex_rt.regions[i].end)
			return true;
	return false;
}

static int64_t page_index(uintptr_t addr)
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

static char *page_alias(uint32_t page)
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
	int64_t page = page_index(page_addr);
	if (page < 0)
		return;
	dex_lock_acquire(&dex_rt.dsm_lock);
	protect_page((uint32_t)page, (enum dsm_access)dex_rt.page_state[page]);
	dex_lock_release(&dex_rt.dsm_lock);
}

char *dex_dsm_alias_of(uintptr_t addr)
{
	int64_t page = page_index(addr);
	return page < 0 ? NULL : page_alias((uint32_t)page) + addr % DEX_PAGE_SIZE;
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
 * access, at most GRANT_HOLD_MAX_NS. Without it two nodes that spin on one
 * page (a flag, a lock word) take it from each other between a grant and
 * its use again and again: a 2000-turn ping-pong made 5,000 to 380,000
 * faults, more the shorter the round trips against a thread's wake-up
 * (Mirage's hold window). One entry per page (calloc'd, so untouched pages
 * cost no memory): any number of faults in flight are held. */
#define GRANT_USE_NS 5000ull
#define GRANT_HOLD_MAX_NS 500000ull
#define GRANT_AWAITED UINT64_MAX /* granted_ns while the request travels */
static struct grant_hold {
	uint64_t granted_ns; /* 0: no fault of this process waits for it */
	uint64_t resumed_ns; /* 0 until the faulting thread resumed */
} *grant_holds;

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
			if (now - granted >= GRANT_HOLD_MAX_NS || (resumed && now - resumed >= GRANT_USE_NS))
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
			dex_send(a->node, DEX_MSG_PAGE_GRANT, &m, sizeof(m), a->with_data ? page_alias(a->page) : NULL,
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
	if (changed_while_polling(&dex_rt.dsm_epoch, seen, since_ns, alias))
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
		wait_for_epoch_change(seen, addr, start, asked ? (uintptr_t)page_alias(page) : 0);
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
		int64_t page = page_index(p);
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
	int64_t first = page_index(addr), last = page_index(addr + len - 1);
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
		 m->carried_pages ? page_alias((uint32_t)page_index(m->carried_address)) : NULL,
		 (size_t)m->carried_pages * DEX_PAGE_SIZE);
	dex_lock_release(&dex_rt.dsm_lock);
}

/* The origin's side: the pages a MIGRATE from `from` carries, whose bytes
 * are in place (receive_into_alias), become the origin's (dsm_dir_release). */
void dex_dsm_accept_carried(unsigned from, const struct dex_msg_migrate *m)
{
	if (!m->carried_pages)
		return;
	uint32_t first = (uint32_t)page_index(m->carried_address);
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

static void restore_default_and_return(int sig)
{
	struct kernel_sigaction act = { SIG_DFL, 0, 0, 0 };
	raw_syscall6(SYS_rt_sigaction, sig, (long)&act, 0, 8, 0, 0);
}

static void on_sigsegv(int sig, siginfo_t *si, void *ucontext)
{
	ucontext_t *uc = ucontext;
	uintptr_t addr = (uintptr_t)si->si_addr;
	int64_t page = dex_rt.active ? page_index(addr) : -1;
	if (page < 0 || si->si_code != SEGV_ACCERR) {
		dex_log("segmentation fault at address %#lx (instruction %#llx)", (unsigned long)addr,
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

/* ------------------------------------------------------------- receivers */

/* The page's bytes, if any, are in its alias already (receive_message). */
static void node_handle_grant(const struct dex_msg_page_grant *m)
{
	uint32_t page = (uint32_t)page_index(m->address);
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

static void node_handle_prefetch(const struct dex_msg_page_prefetch *m)
{
	uint32_t first = (uint32_t)page_index(m->address);
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
	dex_send(0, DEX_MSG_INVALIDATE_ACK, &ack, sizeof(ack), with_data ? page_alias(first) : NULL,
		 with_data ? (size_t)count * DEX_PAGE_SIZE : 0);
}

static void node_handle_invalidate(const struct dex_msg_invalidate *m)
{
	uint32_t first = (uint32_t)page_index(m->address);
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

static void node_receive_loop(void)
{
	char *payload = receive_buffer();
	struct dex_msg_header h;
	for (;;) {
		int rc = receive_message(0, &h, payload);
		if (rc <= 0) {
			if (dex_rt.shutting_down) {
				dex_trace_flush();
				dex_print_stats();
				raw_syscall(SYS_exit_group, 0, 0, 0);
			}
			if (rc == -2)
				dex_fatal("the origin sent nothing for %u s (stopped or unreachable); stopping",
					  dex_rt.peer_timeout_s);
			dex_fatal("lost connection to the origin (origin exited or was killed); stopping");
		}
		switch (h.type) {
		case DEX_MSG_PAGE_GRANT:
			node_handle_grant((const void *)payload);
			break;
		case DEX_MSG_PAGE_PREFETCH:
			node_handle_prefetch((const void *)payload);
			break;
		case DEX_MSG_INVALIDATE:
			node_handle_invalidate((const void *)payload);
			break;
		case DEX_MSG_MIGRATE:
			dex_node_handle_migrate(&h, (const void *)payload);
			break;
		case DEX_MSG_SYSCALL_REPLY: {
			const struct dex_msg_syscall_reply *m = (const void *)payload;
			if (m->worker >= dex_rt.nworkers)
				dex_fatal("rejected SYSCALL_REPLY for unknown worker %u", m->worker);
			dex_mail_post(dex_rt.workers[m->worker], &h, payload);
			break;
		}
		case DEX_MSG_PING:
			dex_send(0, DEX_MSG_PONG, NULL, 0, NULL, 0);
			break;
		case DEX_MSG_VMA_REVOKE:
			dex_vma_node_revoke((const void *)payload);
			break;
		case DEX_MSG_SHUTDOWN:
			/* The origin is finishing but may still read pages we
			 * hold (exit handlers, stdio): keep serving until its
			 * connection closes, then leave quietly. */
			dex_rt.shutting_down = 1;
			break;
		default:
			dex_fatal("rejected unexpected %s from the origin", dex_msg_type_name(h.type));
		}
	}
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
		char *bytes = page_alias(first + i);
		if (nruns && (char *)runs[nruns - 1].iov_base + runs[nruns - 1].iov_len == bytes)
			runs[nruns - 1].iov_len += DEX_PAGE_SIZE;
		else
			runs[nruns++] = (struct iovec){ bytes, DEX_PAGE_SIZE };
	}
	dex_sendv(peer, DEX_MSG_PAGE_PREFETCH, &batch.grants, sizeof(batch.grants), runs, nruns);
	return 0;
}

static void *origin_receive_loop(void *arg)
{
	unsigned peer = (unsigned)(uintptr_t)arg;
	dex_tls_runtime_thread = 1;
	dex_thread_create_block(DEX_ROLE_SERVICE);
	char *payload = receive_buffer();
	struct dex_msg_header h;
	for (;;) {
		int rc = receive_message(peer, &h, payload);
		if (rc <= 0) {
			if (dex_rt.shutting_down)
				return NULL;
			if (rc == -2)
				dex_fatal("node %u sent nothing for %u s (stopped or unreachable); stopping all nodes",
					  peer, dex_rt.peer_timeout_s);
			dex_fatal("node %u disconnected (%s); stopping all nodes", peer,
				  rc == 0 ? "connection closed: node exited or was killed" : "connection error");
		}
		switch (h.type) {
		case DEX_MSG_PONG:
			break;
		case DEX_MSG_VMA_REVOKE_ACK:
			dex_vma_origin_revoke_ack(peer, (const void *)payload);
			break;
		case DEX_MSG_PAGE_REQUEST: {
			const struct dex_msg_page_request *m = (const void *)payload;
			uint32_t page = (uint32_t)page_index(m->address);
			hold_recent_grants(page, 1 + m->extra);
			dex_lock_acquire(&dex_rt.dsm_lock);
			int err = dsm_dir_request(&dex_rt.dir, page, peer, m->write, origin_apply, NULL);
			if (!err && m->extra)
				err = origin_answer_prefetch(peer, page + 1, m->extra, m->write);
			dex_lock_release(&dex_rt.dsm_lock);
			if (err)
				dex_fatal("rejected PAGE_REQUEST from node %u for %#llx (%d)", peer,
					  (unsigned long long)m->address, err);
			break;
		}
		case DEX_MSG_INVALIDATE_ACK: {
			const struct dex_msg_invalidate_ack *m = (const void *)payload;
			uint32_t first = (uint32_t)page_index(m->address);
			dex_lock_acquire(&dex_rt.dsm_lock);
			if (m->with_data) /* the bytes are in place (receive_message) */
				dex_rt.pages_received += m->count;
			for (uint32_t page = first; page < first + m->count; page++) {
				int err = dsm_dir_ack(&dex_rt.dir, page, peer, m->with_data, origin_apply, NULL);
				if (err)
					dex_fatal("rejected INVALIDATE_ACK from node %u for %#llx (%d)", peer,
						  (unsigned long long)page_address(page), err);
			}
			dex_lock_release(&dex_rt.dsm_lock);
			break;
		}
		case DEX_MSG_MIGRATE:
			dex_origin_handle_migrate(&h, (const void *)payload);
			break;
		case DEX_MSG_SYSCALL: {
			const struct dex_msg_syscall *m = (const void *)payload;
			struct dex_thread *t = dex_rt.threads[m->thread];
			if (!t || dex_rt.thread_location[m->thread] != peer)
				dex_fatal("rejected SYSCALL from node %u for thread %u that is not there", peer,
					  m->thread);
			dex_mail_post(t, &h, payload);
			break;
		}
		default:
			dex_fatal("rejected unexpected %s from node %u", dex_msg_type_name(h.type), peer);
		}
	}
}

/* Keeps every connection busy so that silence means trouble: each side's
 * socket has a receive timeout of peer_timeout_s, and pings go out several
 * times per timeout. */
static void *origin_pinger(void *arg)
{
	(void)arg;
	dex_tls_runtime_thread = 1;
	dex_thread_create_block(DEX_ROLE_SERVICE);
	struct timespec period = { .tv_sec = 0, .tv_nsec = 250000000 };
	while (!dex_rt.shutting_down) {
		for (unsigned n = 1; n < dex_rt.nodes && !dex_rt.shutting_down; n++)
			dex_send(n, DEX_MSG_PING, NULL, 0, NULL, 0);
		nanosleep(&period, NULL);
	}
	return NULL;
}

static void set_receive_timeout(int fd)
{
	struct timeval tv = { .tv_sec = dex_rt.peer_timeout_s };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

void dex_origin_shutdown_nodes(int status)
{
	if (!dex_rt.active || dex_rt.node != 0)
		return;
	if (__atomic_exchange_n(&dex_rt.shutting_down, 1, __ATOMIC_ACQ_REL))
		return;
	struct dex_msg_shutdown m = { .status = status };
	for (unsigned n = 1; n < dex_rt.nodes; n++)
		dex_send(n, DEX_MSG_SHUTDOWN, &m, sizeof(m), NULL, 0);
	dex_transport->flush();
	dex_trace_flush();
	dex_print_stats();
}

/* --------------------------------------------------------------- regions */

struct exe_writable {
	uintptr_t start, end, relro_end;
};

static int find_exe_writable(struct dl_phdr_info *info, size_t size, void *arg)
{
	(void)size;
	struct exe_writable *w = arg;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
		if (ph->p_type == PT_LOAD && (ph->p_flags & PF_W)) {
			w->start = lo;
			w->end = lo + ph->p_memsz;
		} else if (ph->p_type == PT_GNU_RELRO) {
			w->relro_end = lo + ph->p_memsz;
		}
	}
	return 1; /* the first object is the executable */
}

static uintptr_t page_up(uintptr_t x)
{
	return (x + DEX_PAGE_SIZE - 1) & ~(uintptr_t)(DEX_PAGE_SIZE - 1);
}

/* Backs [start, end) with a memfd mapped twice: the application's view at
 * the same address (protected per page by the protocol) and a private alias
 * the runtime reads and writes page bytes through. */
static void add_region(uintptr_t start, uintptr_t end, bool replace_existing, const char *name)
{
	size_t len = end - start;
	int fd = memfd_create(name, MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)len) != 0)
		dex_fatal("memfd for %s failed", name);
	if (replace_existing && pwrite(fd, (void *)start, len, 0) != (ssize_t)len)
		dex_fatal("copying %s into its memfd failed", name);
	int flags = MAP_SHARED | (replace_existing ? MAP_FIXED : MAP_FIXED_NOREPLACE);
	void *view = mmap((void *)start, len, PROT_READ | PROT_WRITE, flags, fd, 0);
	if (view != (void *)start)
		dex_fatal("cannot map %s at %#lx (address in use?)", name, (unsigned long)start);
	void *alias = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (alias == MAP_FAILED)
		dex_fatal("cannot map alias of %s", name);
	struct dsm_region *r = &dex_rt.regions[dex_rt.nregions];
	r->fd = fd; /* kept: the origin allocates heap memory ahead (alloc.c) */
	r->start = start;
	r->end = end;
	r->alias = alias;
	r->first_page = dex_rt.total_pages;
	dex_rt.bounds[dex_rt.nregions] = (struct dex_region_bounds){ start, end };
	dex_rt.total_pages += (uint32_t)(len / DEX_PAGE_SIZE);
	dex_rt.nregions++;
}

static size_t heap_bytes(void)
{
	size_t v = dex_env_number("DEX_HEAP_MB", 1024, 1u << 24);
	return (v ? v : 1024) << 20;
}

static void setup_regions(void)
{
	struct exe_writable w = { 0 };
	dl_iterate_phdr(find_exe_writable, &w);
	uintptr_t start = page_up(w.relro_end > w.start ? w.relro_end : w.start);
	uintptr_t end = page_up(w.end);
	if (end > start)
		add_region(start, end, true, "dex-globals");
	add_region(DEX_HEAP_BASE, DEX_HEAP_BASE + heap_bytes(), false, "dex-heap");

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

static int find_own_text(struct dl_phdr_info *info, size_t size, void *arg)
{
	(void)size;
	uintptr_t self = (uintptr_t)arg;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
		if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X) && self >= lo && self < lo + ph->p_memsz) {
			dex_rt.text_start = lo;
			dex_rt.text_end = lo + ph->p_memsz;
			return 1;
		}
	}
	return 0;
}

/* ------------------------------------------------------------- start-up */

static void fingerprint(uint64_t out[DEX_FINGERPRINT_WORDS])
{
	out[0] = dex_rt.nregions ? dex_rt.regions[0].start : 0;
	out[1] = dex_rt.nregions ? dex_rt.regions[0].end : 0;
	out[2] = dex_rt.text_start;
	out[3] = (uintptr_t)&memcpy;
	out[4] = getauxval(AT_SYSINFO_EHDR);
	out[5] = getauxval(AT_BASE);
	out[6] = dex_rt.regions[dex_rt.nregions - 1].end;
	out[7] = dex_rt.total_pages;
}

static void tune_socket(int fd)
{
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static int read_with_timeout(int fd, void *buf, size_t len, int timeout_ms)
{
	char *p = buf;
	size_t got = 0;
	while (got < len) {
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		if (poll(&pfd, 1, timeout_ms) != 1)
			return -1;
		ssize_t n = read(fd, p + got, len - got);
		if (n <= 0)
			return -1;
		got += (size_t)n;
	}
	return 0;
}

struct joining {
	struct dex_msg_header h;
	struct dex_msg_hello hello;
};

/* A joining node's HELLO; NULL, or why it is refused. */
static const char *read_hello(int fd, struct joining *in, const struct dex_validation_limits *lim,
			      const uint64_t mine[DEX_FINGERPRINT_WORDS])
{
	const char *why;
	if (read_with_timeout(fd, &in->h, sizeof(in->h), 5000) != 0)
		return "no HELLO within 5 s";
	if ((why = dex_msg_check_header(&in->h, lim)) != NULL)
		return why;
	if (in->h.type != DEX_MSG_HELLO || in->h.length != sizeof(in->hello))
		return "first message is not HELLO";
	if (read_with_timeout(fd, &in->hello, sizeof(in->hello), 5000) != 0)
		return "truncated HELLO";
	if ((why = dex_msg_check(&in->h, &in->hello, lim)) != NULL)
		return why;
	if (dex_rt.peers[in->hello.node].fd > 0)
		return "node number already joined";
	if (memcmp(in->hello.fingerprint, mine, DEX_FINGERPRINT_WORDS * sizeof(uint64_t)) != 0)
		return "address-space layout differs (same binary and ASLR off required)";
	return NULL;
}

static void origin_accept_nodes(int listen_fd, const struct dex_auth_key *key)
{
	uint64_t mine[DEX_FINGERPRINT_WORDS];
	fingerprint(mine);
	unsigned joined = 0;
	unsigned wait_s = (unsigned)dex_env_number("DEX_JOIN_TIMEOUT", 20, 86400);
	if (!wait_s)
		wait_s = 20;
	uint64_t deadline = dex_now_ns() + wait_s * 1000000000ull;
	struct dex_validation_limits lim = limits();
	while (joined < dex_rt.nodes - 1) {
		int64_t left_ms = (int64_t)(deadline - dex_now_ns()) / 1000000;
		struct pollfd pfd = { .fd = listen_fd, .events = POLLIN };
		if (left_ms <= 0 || poll(&pfd, 1, (int)left_ms) != 1)
			dex_fatal("only %u of %u nodes joined within %u s", joined, dex_rt.nodes - 1, wait_s);
		int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0)
			continue;
		tune_socket(fd);
		struct joining in = { 0 };
		uint8_t session[DEX_AUTH_BYTES];
		/* one stranger at a time, for at most 5 s: the run's secret first */
		const char *why = dex_auth_serve(fd, key, session);
		if (!why)
			why = read_hello(fd, &in, &lim, mine);
		struct dex_msg_welcome welcome = { .status = why ? 1 : 0 };
		struct dex_msg_header wh;
		dex_msg_fill_header(&wh, DEX_MSG_WELCOME, 0, sizeof(welcome), 0);
		if (why) {
			dex_log("rejected a joining connection: %s", why);
			if (in.h.magic == DEX_MSG_MAGIC) {
				struct iovec iov[2] = { { &wh, sizeof(wh) }, { &welcome, sizeof(welcome) } };
				(void)!writev(fd, iov, 2);
			}
			close(fd);
			continue;
		}
		struct iovec iov[2] = { { &wh, sizeof(wh) }, { &welcome, sizeof(welcome) } };
		if (writev(fd, iov, 2) != (ssize_t)(sizeof(wh) + sizeof(welcome)))
			dex_fatal("cannot welcome node %u", in.hello.node);
		dex_rt.peers[in.hello.node].fd = fd;
		memcpy(dex_rt.peers[in.hello.node].session, session, sizeof(session));
		joined++;
	}
	close(listen_fd);
	for (unsigned n = 1; n < dex_rt.nodes; n++) {
		set_receive_timeout(dex_rt.peers[n].fd);
	}
	connect_selected_transport();
	for (unsigned n = 1; n < dex_rt.nodes; n++)
		dex_start_service_thread(origin_receive_loop, (void *)(uintptr_t)n);
	dex_start_service_thread(origin_pinger, NULL);
}

static void node_join_origin(uint32_t ip, int port, const struct dex_auth_key *key)
{
	int fd = -1;
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	sa.sin_addr.s_addr = htonl(ip);
	for (int attempt = 0; attempt < 100; attempt++) {
		fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			break;
		close(fd);
		fd = -1;
		usleep(50000);
	}
	if (fd < 0)
		dex_fatal("cannot connect to the origin on port %d", port);
	tune_socket(fd);
	/* the origin takes joining nodes one at a time: wait as long as for WELCOME */
	const char *why = dex_auth_join(fd, key, 20000, dex_rt.peers[0].session);
	if (why)
		dex_fatal("cannot join the origin: %s", why);
	dex_rt.peers[0].fd = fd;
	struct dex_msg_hello hello = { .version = DEX_PROTOCOL_VERSION, .node = dex_rt.node, .nodes = dex_rt.nodes };
	fingerprint(hello.fingerprint);
	dex_send(0, DEX_MSG_HELLO, &hello, sizeof(hello), NULL, 0);
	struct {
		struct dex_msg_header h;
		struct dex_msg_welcome w;
	} reply;
	if (read_with_timeout(fd, &reply, sizeof(reply), 20000) != 0 || reply.h.type != DEX_MSG_WELCOME)
		dex_fatal("the origin did not answer HELLO");
	if (reply.w.status != 0)
		dex_fatal("the origin rejected this node (see its log)");
	set_receive_timeout(fd);
}

/* DEX_TRANSPORT=tcp (default) or ucx. UCX lives in libdex-ucx.so beside
 * libdex.so; every node loads it at the same point of start-up, before the
 * layout fingerprint, so the address spaces stay identical. */
static void select_transport(void)
{
	const char *name = getenv("DEX_TRANSPORT");
	if (!name || !*name || !strcmp(name, "tcp"))
		return;
	if (strcmp(name, "ucx") != 0)
		dex_fatal("unknown DEX_TRANSPORT=%s (tcp or ucx)", name);
	Dl_info self;
	char path[4096];
	if (!dladdr((void *)select_transport, &self) || !self.dli_fname ||
	    strlen(self.dli_fname) + sizeof("libdex-ucx.so") >= sizeof(path))
		dex_fatal("cannot locate libdex.so to find libdex-ucx.so");
	strcpy(path, self.dli_fname);
	char *slash = strrchr(path, '/');
	strcpy(slash ? slash + 1 : path, "libdex-ucx.so");
	/* UCX's own SIGSEGV/SIGBUS handlers would replace the runtime's fault
	 * handler, and its malloc/mmap hooks would patch the calls the runtime
	 * makes on signal stacks: both off. libucs reads these when loaded. */
	setenv("UCX_ERROR_SIGNALS", "", 1);
	setenv("UCX_HANDLE_ERRORS", "none", 1);
	setenv("UCX_MEM_MALLOC_HOOKS", "no", 1);
	setenv("UCX_MEM_MMAP_HOOK_MODE", "none", 1);
	void *module = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!module)
		dex_fatal("UCX transport unavailable: %s (build dex with libucx-dev installed)", dlerror());
	dex_transport_open_fn open_ucx = (dex_transport_open_fn)dlsym(module, "dex_ucx_transport_open");
	int was_runtime = dex_tls_runtime_thread;
	dex_tls_runtime_thread = DEX_TRANSPORT_THREAD;
	selected_transport = open_ucx ? open_ucx() : NULL;
	dex_tls_runtime_thread = was_runtime;
	if (!selected_transport)
		dex_fatal("UCX transport failed to initialise");
}

static long find_tid_offset(void)
{
	/* glibc keeps the kernel thread id in struct pthread, which starts at
	 * the thread pointer; it must be cleared by hand when a thread exits
	 * (see syscall.c), so locate the field once. */
	const pid_t *self = (const pid_t *)dex_get_fs_base();
	pid_t tid = (pid_t)raw_syscall(SYS_gettid, 0, 0, 0);
	for (long i = 4; i < 2048 / (long)sizeof(pid_t); i++)
		if (self[i] == tid)
			return i * (long)sizeof(pid_t);
	return -1;
}

/* glibc passes argc, argv and envp to ELF constructors. */
__attribute__((constructor(101))) static void dex_init(int argc, char **argv, char **envp)
{
	const char *boot = getenv("DEX_BOOT");
	/* The process's main thread never runs application code under DEX
	 * (main runs on a migratable thread), so its allocations stay local. */
	dex_tls_runtime_thread = 1;
	dex_threads_init();
	dex_barriers_init();
	if (!boot)
		return;
	unsigned node, nodes, port, ip[4];
	int listen_fd;
	if (sscanf(boot, "node=%u,nodes=%u,port=%u,fd=%d,host=%u.%u.%u.%u", &node, &nodes, &port, &listen_fd, &ip[0],
		   &ip[1], &ip[2], &ip[3]) != 8 ||
	    nodes == 0 || nodes > DEX_MAX_NODES || node >= nodes || ip[0] > 255 || ip[1] > 255 || ip[2] > 255 ||
	    ip[3] > 255)
		dex_fatal("malformed DEX_BOOT=%s", boot);
	uint32_t origin_ip = ip[0] << 24 | ip[1] << 16 | ip[2] << 8 | ip[3];
	dex_rt.node = node;
	dex_rt.nodes = nodes;
	/* The settings, read once the node is known so that a bad one's message
	 * names it. Waiting threads block at once by default: on a machine with fewer
	 * cores than busy threads, spinning steals the CPU from the thread
	 * being waited for (measured: 25 us vs 120 us per migration on 2
	 * vCPUs). DEX_SPIN=N polls N times first, for dedicated cores. */
	dex_rt.spin_iterations = (unsigned)dex_env_number("DEX_SPIN", 0, UINT32_MAX);
	/* Receivers sleep in their sockets by default for the same reason;
	 * DEX_POLL_US=N polls for N us after each message, for dedicated
	 * cores (as RDMA runtimes poll their completion queues). At most a
	 * second: a silent peer is noticed that much after the timeout. */
	dex_rt.receive_poll_ns = dex_env_number("DEX_POLL_US", 0, 1000000) * 1000ull;
	dex_rt.fault_timeout_ns = dex_env_number("DEX_FAULT_TIMEOUT", 30, 86400) * 1000000000ull;
	dex_rt.peer_timeout_s = (unsigned)dex_env_number("DEX_PEER_TIMEOUT", 5, 86400);
	if (!dex_rt.peer_timeout_s)
		dex_rt.peer_timeout_s = 5;
	if (nodes == 1) {
		close(listen_fd);
		return;
	}
	/* every connection of the run proves it knows the run's secret (auth.h) */
	const char *secret = getenv(DEX_AUTH_ENV);
	struct dex_auth_key key;
	const char *bad_secret = secret ? dex_auth_key_from_hex(secret, &key) : "it is not set";
	if (bad_secret)
		dex_fatal("%s: %s (dexrun sets it for every process of a run)", DEX_AUTH_ENV, bad_secret);
	if (!(personality(0xffffffff) & ADDR_NO_RANDOMIZE)) {
		/* Started by hand with randomisation on: turn it off and run the
		 * same program again, so its layout matches the other nodes'. */
		(void)argc;
		if (personality(ADDR_NO_RANDOMIZE) == -1)
			dex_fatal("cannot turn off address-space randomisation");
		execve("/proc/self/exe", argv, envp);
		dex_fatal("re-executing with randomisation off failed");
	}
	dex_rt.active = true;
	select_transport();
	dl_iterate_phdr(find_own_text, (void *)(uintptr_t)dex_init);
	if (!dex_rt.text_start)
		dex_fatal("cannot locate libdex's code");
	dex_rt.tid_offset = find_tid_offset();
	if (dex_rt.tid_offset < 0)
		dex_fatal("cannot find the thread id in glibc's thread descriptor");

	/* Node stdio is private to each process: keep it unbuffered so output
	 * written on a node reaches the origin's descriptors at once. */
	if (node == 0)
		setvbuf(stdout, NULL, _IOLBF, BUFSIZ);
	else
		setvbuf(stdout, NULL, _IONBF, 0);

	setup_regions();
	dex_vma_init();
	dex_trace_init();
	dex_install_signal_handlers();
	if (node == 0) {
		size_t pool = 16384;
		struct dsm_dir_page *pages = calloc(dex_rt.total_pages, sizeof(*pages));
		struct dsm_queued_request *queue = calloc(pool, sizeof(*queue));
		if (!pages || !queue)
			dex_fatal("out of memory for the directory");
		dsm_dir_init(&dex_rt.dir, pages, dex_rt.total_pages, nodes, queue, (uint32_t)pool);
		dex_heap_init_origin();
		origin_accept_nodes(listen_fd, &key);
		return;
	}
	close(listen_fd);
	dex_thread_create_block(DEX_ROLE_SERVICE);
	node_join_origin(origin_ip, (int)port, &key);
	connect_selected_transport();
	dex_node_start_workers();
	node_receive_loop();
}
