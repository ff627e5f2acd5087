/* libdex messaging: the TCP transport (the bootstrap sockets are the data
 * path), the choice of transport, and framing: dex_send gathers a message,
 * receive_message reads and validates one, page bytes straight into the
 * alias of the pages they are for. */
#include "internal.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

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

void dex_connect_selected_transport(void)
{
	int was_runtime = dex_tls_runtime_thread;
	dex_tls_runtime_thread = DEX_TRANSPORT_THREAD;
	int rc = selected_transport->connect();
	dex_tls_runtime_thread = was_runtime;
	if (rc != 0)
		dex_fatal("the %s transport could not connect %s", selected_transport->name,
			  dex_rt.node == 0 ? "the nodes" : "to the origin");
	dex_transport = selected_transport;
	dex_debug("%s transport connected", dex_transport->name);
}

const struct dex_transport *dex_selected_transport(void)
{
	return selected_transport;
}

/* DEX_TRANSPORT=tcp (default) or ucx. UCX lives in libdex-ucx.so beside
 * libdex.so; every node loads it at the same point of start-up, before the
 * layout fingerprint, so the address spaces stay identical. */
void dex_select_transport(void)
{
	const char *name = getenv("DEX_TRANSPORT");
	if (!name || !*name || !strcmp(name, "tcp"))
		return;
	if (strcmp(name, "ucx") != 0)
		dex_fatal("unknown DEX_TRANSPORT=%s (tcp or ucx)", name);
	/* UCX's own SIGSEGV/SIGBUS handlers would replace the runtime's fault
	 * handler, and its malloc/mmap hooks would patch the calls the runtime
	 * makes on signal stacks: both off. libucs reads these when loaded. */
	setenv("UCX_ERROR_SIGNALS", "", 1);
	setenv("UCX_HANDLE_ERRORS", "none", 1);
	setenv("UCX_MEM_MALLOC_HOOKS", "no", 1);
	setenv("UCX_MEM_MMAP_HOOK_MODE", "none", 1);
	void *module = dex_open_module("libdex-ucx.so");
	dex_transport_open_fn open_ucx = (dex_transport_open_fn)dlsym(module, "dex_ucx_transport_open");
	int was_runtime = dex_tls_runtime_thread;
	dex_tls_runtime_thread = DEX_TRANSPORT_THREAD;
	selected_transport = open_ucx ? open_ucx() : NULL;
	dex_tls_runtime_thread = was_runtime;
	if (!selected_transport)
		dex_fatal("UCX transport failed to initialise");
}

/* Sends one message whose data is gathered from `ndata` buffers (page
 * bytes straight from the alias: no staging copy). */
int dex_sendv(unsigned peer, enum dex_msg_type type, const void *fixed, size_t fixed_len,
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

struct dex_validation_limits dex_limits(void)
{
	return (struct dex_validation_limits){ .nodes = dex_rt.nodes, .max_threads = DEX_MAX_THREADS,
					       .max_workers = DEX_MAX_WORKERS, .regions = dex_rt.bounds,
					       .nregions = dex_rt.nregions };
}


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
		return dex_transport->receive(peer, dex_page_alias((uint32_t)dex_page_index(m->address)), DEX_PAGE_SIZE);
	}
	case DEX_MSG_PAGE_PREFETCH: {
		const struct dex_msg_page_prefetch *m = (const void *)payload;
		uint32_t first = (uint32_t)dex_page_index(m->address);
		for (uint32_t i = 0; i < m->count;) {
			if (!(m->with_data & (UINT64_C(1) << i))) {
				i++;
				continue;
			}
			uint32_t j = i + 1;
			while (j < m->count && (m->with_data & (UINT64_C(1) << j)))
				j++;
			int rc = dex_transport->receive(peer, dex_page_alias(first + i), (size_t)(j - i) * DEX_PAGE_SIZE);
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
		return dex_transport->receive(peer, dex_page_alias((uint32_t)dex_page_index(m->address)),
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
		uint32_t first = (uint32_t)dex_page_index(m->carried_address);
		for (uint32_t page = first; page < first + m->carried_pages; page++) {
			dex_lock_acquire(&dex_rt.dsm_lock);
			bool written = dsm_dir_access(&dex_rt.dir, page, peer) == DSM_WRITE;
			dex_lock_release(&dex_rt.dsm_lock);
			int rc = dex_transport->receive(peer, written ? dex_page_alias(page) : payload + sizeof(*m),
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
int dex_receive_message(unsigned peer, struct dex_msg_header *h, char *payload)
{
	int rc = dex_transport->receive(peer, h, sizeof(*h));
	if (rc <= 0)
		return rc;
	struct dex_validation_limits lim = dex_limits();
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
