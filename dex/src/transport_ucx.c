/* The UCX transport (DEX_TRANSPORT=ucx, dexrun --transport ucx), built as
 * libdex-ucx.so and loaded by libdex only when selected.
 *
 * UCX's worker/endpoint API (ucp) with tagged messages: one message of the
 * runtime (header + payload, at most DEX_MAX_PAYLOAD bytes) is one tagged
 * send whose tag is the sender's node number (low 8 bits) under a value
 * derived from the bootstrap connection's session key (auth.h), so that a
 * process that finds the worker's address cannot inject messages; UCX
 * keeps messages between two endpoints in order. Workers' addresses travel
 * through PMIx when a PMIx launcher started the run (launch.c), else over
 * the TCP bootstrap socket that carried the authentication and
 * HELLO/WELCOME; that socket then stays open only to notice a peer's death
 * at once (its EOF), since UCX's shared-memory transports give no such
 * signal. UCX picks its transports from UCX_TLS as
 * usual (shared memory and TCP on loopback; InfiniBand or RoCE where
 * present); this file names none.
 *
 * Threads. UCX may allocate, take locks and use TLS, and the runtime sends
 * from SIGSEGV/SIGSYS handlers on threads whose TLS may be a missing shared
 * page, so UCX is called from exactly two places:
 *   - the process's main thread while libdex starts (open: ucp_config_read,
 *     ucp_init, ucp_worker_create, ucp_worker_get_efd; local_address, for
 *     PMIx: ucp_worker_get_address) and inside connect() before any
 *     application thread runs (ucp_worker_get_address,
 *     ucp_ep_create, ucp_worker_release_address, the start-up exchange's
 *     ucp_tag_send_nbx, ucp_tag_recv_nbx, ucp_worker_progress,
 *     ucp_request_check_status, ucp_request_cancel and ucp_request_free,
 *     the first receive);
 *   - afterwards only the "pump": the service thread this file starts, or
 *     in a process with one peer the receiver thread itself while it waits
 *     for a message (ucx_receive_pumping): ucp_worker_progress,
 *     ucp_worker_arm, ucp_tag_send_nbx, ucp_tag_recv_nbx,
 *     ucp_tag_recv_request_test, ucp_request_check_status, ucp_request_free.
 * The worker is UCS_THREAD_MODE_SERIALIZED for that hand-over. send() and
 * receive() are libdex's queued transport (transport_queue.c): rings
 * between the runtime's threads and the pump, raw system calls only. */
#include "internal.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

/* ------------------------------------------------------------------ state */

static struct {
	ucp_context_h context;
	ucp_worker_h worker;
	ucp_ep_h endpoints[DEX_MAX_NODES];
	int worker_fd;   /* UCX's wake-up descriptor */
	/* the one posted receive */
	char *receive_buffer;
	void *receive_request;
	bool receive_done;
	ucp_tag_recv_info_t receive_info;
	/* Tags of this run's messages per peer (dex_auth_tag): a process that
	 * reaches the worker without the run's secret cannot forge them. */
	uint64_t tag_out[DEX_MAX_NODES], tag_in[DEX_MAX_NODES];
	unsigned rejected;
	uint64_t busy_ns; /* when the pump last moved a message (DEX_POLL_US) */
	/* start-up: this worker's address, and the peers' when a launcher
	 * (PMIx) carried them; else they travel over the bootstrap sockets */
	ucp_address_t *address;
	size_t address_length;
	void *peer_addresses[DEX_MAX_NODES];
	bool addresses_given;
} ucx;

#define RECEIVE_CAPACITY (sizeof(struct dex_msg_header) + DEX_MAX_PAYLOAD)

/* ------------------------------------------------------------- the pump */

static void post_receive(void)
{
	/* Always a request: UCX 1.13 leaves recv_info stale when a receive
	 * completes immediately, so the length is read with the test call. */
	ucp_request_param_t param = { .op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL };
	ucs_status_ptr_t req = ucp_tag_recv_nbx(ucx.worker, ucx.receive_buffer, RECEIVE_CAPACITY, 0, 0, &param);
	if (UCS_PTR_IS_ERR(req))
		dex_fatal("UCX receive failed: %s", ucs_status_string(UCS_PTR_STATUS(req)));
	ucx.receive_request = req;
	ucx.receive_done = false;
}

/* Moves completed receives into their peers' inbound rings. Returns true
 * if it moved any; a message whose ring is full stays in the receive
 * buffer (no new receive is posted, so UCX keeps later ones queued in
 * order) until the receiver thread makes room. */
static bool deliver_received(void)
{
	bool moved = false;
	for (;;) {
		if (!ucx.receive_done) {
			if (ucp_tag_recv_request_test(ucx.receive_request, &ucx.receive_info) == UCS_INPROGRESS)
				return moved;
			ucp_request_free(ucx.receive_request);
			ucx.receive_request = NULL;
			ucx.receive_done = true;
		}
		uint64_t tag = ucx.receive_info.sender_tag;
		unsigned from = (unsigned)(tag & 0xff);
		size_t length = ucx.receive_info.length;
		if (from >= DEX_MAX_NODES || !dex_queue_is_peer(from) || tag != ucx.tag_in[from]) {
			/* a stranger's message is dropped, and the run goes on */
			if (ucx.rejected++ < 8)
				dex_warn("UCX transport: dropped a message tagged %#llx, not from a node of this run",
					(unsigned long long)tag);
			post_receive();
			continue;
		}
		if (!dex_queue_deliver(from, ucx.receive_buffer, length))
			return moved;
		moved = true;
		post_receive();
	}
}

static void progress_all(void)
{
	while (ucp_worker_progress(ucx.worker))
		;
	deliver_received();
}

/* EOF or an error on a bootstrap socket means that process is gone: take
 * what UCX already holds from it, then close its inbound ring so its
 * receiver reports the loss like the TCP transport would. */
static void check_bootstrap_sockets(int timeout_ms)
{
	struct pollfd fds[DEX_MAX_NODES + 2];
	unsigned peer_of[DEX_MAX_NODES + 2];
	nfds_t n = 0;
	fds[n++] = (struct pollfd){ .fd = dex_queue_wake_fd(), .events = POLLIN };
	if (ucx.worker_fd >= 0)
		fds[n++] = (struct pollfd){ .fd = ucx.worker_fd, .events = POLLIN };
	nfds_t first_peer = n;
	for (unsigned p = 0; p < dex_rt.nodes; p++) {
		if (!dex_queue_is_peer(p) || dex_queue_peer_is_gone(p))
			continue;
		peer_of[n] = p;
		fds[n++] = (struct pollfd){ .fd = dex_rt.peers[p].fd, .events = POLLIN };
	}
	if (raw_syscall(SYS_poll, fds, n, timeout_ms) <= 0)
		return;
	for (nfds_t i = first_peer; i < n; i++) {
		if (!fds[i].revents)
			continue;
		char byte;
		long got = raw_syscall6(SYS_recvfrom, fds[i].fd, (long)&byte, 1, MSG_DONTWAIT, 0, 0);
		if (got == -EAGAIN || got == -EINTR)
			continue;
		for (int round = 0; round < 100; round++)
			progress_all();
		dex_queue_peer_gone(peer_of[i]);
	}
}

static void send_outbound(void)
{
	const void *message;
	unsigned peer;
	size_t length;
	while ((message = dex_queue_next_outbound(&peer, &length))) {
		if (!dex_queue_peer_is_gone(peer)) {
			ucp_request_param_t param = { .op_attr_mask = 0 };
			ucs_status_ptr_t req = ucp_tag_send_nbx(ucx.endpoints[peer], message, length, ucx.tag_out[peer], &param);
			if (UCS_PTR_IS_ERR(req)) {
				dex_queue_peer_gone(peer);
			} else if (req) {
				/* The ring record is the send buffer: keep it until UCX is
				 * done with it, receiving meanwhile so that two pumps sending
				 * to each other cannot wait on each other. */
				unsigned spins = 0;
				while (ucp_request_check_status(req) == UCS_INPROGRESS && !dex_queue_peer_is_gone(peer)) {
					progress_all();
					if (++spins % 1024 == 0)
						check_bootstrap_sockets(0);
				}
				ucp_request_free(req);
			}
		}
		dex_queue_pop_outbound();
	}
}

/* One round of the pump's work: queued messages out, UCX's progress,
 * received messages into their rings. Returns true if it moved anything. */
static bool pump_round(void)
{
	bool busy = false;
	unsigned peer;
	size_t length;
	/* Queued messages first: a receiver that pumps has usually just
	 * queued an answer, and progress would only delay it. */
	if (dex_queue_next_outbound(&peer, &length)) {
		send_outbound();
		busy = true;
	}
	while (ucp_worker_progress(ucx.worker))
		busy = true;
	busy |= deliver_received();
	if (busy)
		ucx.busy_ns = dex_now_ns();
	return busy;
}

/* After a round with nothing to do. DEX_SPIN=N polls N more times, as the
 * runtime's own waits do; DEX_POLL_US=N keeps polling, yielding the CPU
 * between rounds, for N us after the pump last moved a message (the
 * receivers' setting: a message that follows another finds the pump awake
 * instead of waking a halted CPU). Otherwise it sleeps until UCX, a sender
 * or a peer's bootstrap socket wakes it. */
static void pump_idle(void)
{
	unsigned peer;
	size_t length;
	bool busy = false;
	for (unsigned i = 0; i < dex_rt.spin_iterations && !busy; i++) {
		busy = ucp_worker_progress(ucx.worker) != 0 || dex_queue_next_outbound(&peer, &length);
		cpu_relax();
	}
	if (busy)
		return;
	if (dex_rt.receive_poll_ns && dex_now_ns() - ucx.busy_ns < dex_rt.receive_poll_ns) {
		raw_syscall(SYS_sched_yield, 0, 0, 0);
		return;
	}
	if (!dex_queue_pump_may_sleep())
		return;
	if (ucx.worker_fd >= 0 && ucp_worker_arm(ucx.worker) == UCS_ERR_BUSY) {
		dex_queue_pump_awake();
		return;
	}
	/* A message held for a full inbound ring, or no UCX wake-up
	 * descriptor: look again in a millisecond. */
	check_bootstrap_sockets(ucx.receive_done || ucx.worker_fd < 0 ? 1 : 1000);
	dex_queue_pump_awake();
}

static void *pump_thread(void *arg)
{
	(void)arg;
	dex_tls_runtime_thread = DEX_TRANSPORT_THREAD;
	dex_thread_create_block(DEX_ROLE_SERVICE);
	for (;;)
		if (!pump_round())
			pump_idle();
	return NULL;
}

/* A process with one peer (every node; the origin of a two-node run) has
 * one receiver thread, which pumps UCX itself while it waits for a
 * message: no pump thread, and one thread fewer to hand each message to
 * on its way in and out. Its ring's futex is not needed: the pump that
 * fills the ring is the thread that reads it. */
static void pump_while_waiting(uint32_t *published, uint32_t seen)
{
	(void)published;
	(void)seen;
	if (!pump_round())
		pump_idle();
}

static void pump_round_for_sender(void)
{
	(void)pump_round();
}

static int ucx_receive_pumping(unsigned peer, void *buf, size_t len)
{
	static bool pumping; /* the one receiver thread's, set on its first call */
	if (!pumping) {
		dex_tls_runtime_thread = DEX_TRANSPORT_THREAD; /* threads UCX starts are its own */
		dex_queue_pumped_by_receiver(pump_round_for_sender);
		pumping = true;
	}
	return dex_queue_receive_waiting(peer, buf, len, pump_while_waiting);
}

/* ------------------------------------------------- start-up (main thread) */

static int write_blob(int fd, const void *data, uint32_t length)
{
	/* MSG_NOSIGNAL: a node that died meanwhile is an error, not SIGPIPE */
	if (send(fd, &length, sizeof(length), MSG_NOSIGNAL) != (ssize_t)sizeof(length))
		return -1;
	return send(fd, data, length, MSG_NOSIGNAL) == (ssize_t)length ? 0 : -1;
}

/* The bootstrap sockets carry a receive timeout (the peer timeout); the
 * origin sends its address only once every node joined, so keep waiting. */
static int read_exact(int fd, void *buf, size_t len)
{
	uint64_t deadline = dex_now_ns() + 60000000000ull;
	size_t got = 0;
	while (got < len) {
		ssize_t n = read(fd, (char *)buf + got, len - got);
		if (n > 0) {
			got += (size_t)n;
			continue;
		}
		if (n < 0 && (errno == EAGAIN || errno == EINTR) && dex_now_ns() < deadline)
			continue;
		return -1;
	}
	return 0;
}

static void *read_blob(int fd)
{
	uint32_t length;
	if (read_exact(fd, &length, sizeof(length)) != 0 || length == 0 || length > (1u << 20))
		return NULL;
	void *data = malloc(length);
	if (data && read_exact(fd, data, length) != 0) {
		free(data);
		return NULL;
	}
	return data;
}

static int connect_endpoint(unsigned peer, void *address)
{
	ucp_ep_params_t params = { .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS,
				   .address = address };
	ucs_status_t st = ucp_ep_create(ucx.worker, &params, &ucx.endpoints[peer]);
	if (st != UCS_OK) {
		dex_error("UCX endpoint to node %u: %s", peer, ucs_status_string(st));
		return -1;
	}
	return 0;
}

/* A peer's bootstrap socket readable during start-up: it closed (nothing
 * else is sent on it once the addresses are exchanged). */
static bool peer_hung_up(void)
{
	for (unsigned p = 0; p < dex_rt.nodes; p++) {
		struct pollfd fd = { .fd = dex_rt.peers[p].fd, .events = POLLIN };
		if (dex_queue_is_peer(p) && raw_syscall(SYS_poll, &fd, 1, 0) > 0)
			return true;
	}
	return false;
}

/* Waits for a UCX request of the start-up exchange, progressing, and
 * yielding when nothing moved: a third process waiting for its turn spun
 * against the two exchanging on 2 vCPUs (a 3-node start 27 -> 95 ms).
 * False if it failed, a peer hung up or the peer timeout passed. */
static bool wait_request(ucs_status_ptr_t req, uint64_t deadline_ns)
{
	if (UCS_PTR_IS_ERR(req))
		return false;
	if (!req)
		return true;
	ucs_status_t st;
	unsigned spins = 0;
	while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS) {
		if (++spins % 1024 == 0 && (dex_now_ns() > deadline_ns || peer_hung_up()))
			break;
		if (!ucp_worker_progress(ucx.worker))
			raw_syscall(SYS_sched_yield, 0, 0, 0);
	}
	if (st == UCS_INPROGRESS)
		ucp_request_cancel(ucx.worker, req);
	ucp_request_free(req);
	return st == UCS_OK;
}

/* UCX's shared-memory paths (FIFO elements and their receive buffers) are
 * fresh memory: a process's first lap over them took page faults on both
 * sides, 12-18 us of a thread's first return to the origin. Laps of
 * page-sized messages at start-up (160: two and a half of UCX's default
 * 64-entry FIFO), before the first receive that matches any tag is posted,
 * take those faults off the application's time. Ping-pong, the origin
 * serving one node at a time: each message is expected when it comes, and
 * both ends finish together, so the application's first message does not
 * queue behind the exchange (sent all at once, they did: first forward
 * migration 127 -> 350 us). */
enum { WARM_UP_ROUNDS = 160, WARM_UP_BYTES = 8000 };
#define WARM_UP_TAG (UINT64_C(1) << 63)

static bool warm_up_send(unsigned peer, void *buffer, uint64_t deadline_ns)
{
	ucp_request_param_t param = { .op_attr_mask = 0 };
	return wait_request(ucp_tag_send_nbx(ucx.endpoints[peer], buffer, WARM_UP_BYTES, WARM_UP_TAG | ucx.tag_out[peer], &param),
			    deadline_ns);
}

static bool warm_up_receive(unsigned peer, void *buffer, uint64_t deadline_ns)
{
	ucp_request_param_t param = { .op_attr_mask = 0 };
	return wait_request(ucp_tag_recv_nbx(ucx.worker, buffer, WARM_UP_BYTES, WARM_UP_TAG | ucx.tag_in[peer], ~UINT64_C(0), &param),
			    deadline_ns);
}

static int warm_up_paths(void)
{
	char *buffer = calloc(1, WARM_UP_BYTES);
	if (!buffer)
		return -1;
	uint64_t deadline_ns = dex_now_ns() + dex_rt.peer_timeout_s * 1000000000ull;
	bool ok = true;
	for (unsigned p = 0; p < dex_rt.nodes && ok; p++) {
		if (!dex_queue_is_peer(p))
			continue;
		for (unsigned i = 0; i < WARM_UP_ROUNDS && ok; i++)
			ok = dex_rt.node == 0 ? warm_up_send(p, buffer, deadline_ns) && warm_up_receive(p, buffer, deadline_ns)
					      : warm_up_receive(p, buffer, deadline_ns) && warm_up_send(p, buffer, deadline_ns);
	}
	free(buffer);
	if (!ok)
		dex_error("UCX: the start-up exchange with the other nodes did not complete");
	return ok ? 0 : -1;
}

static struct dex_transport ucx_transport;

static int ucx_local_address(const void **address, size_t *length)
{
	if (!ucx.address && ucp_worker_get_address(ucx.worker, &ucx.address, &ucx.address_length) != UCS_OK)
		return -1;
	*address = ucx.address;
	*length = ucx.address_length;
	return 0;
}

static int ucx_peer_address(unsigned peer, const void *address, size_t length)
{
	if (peer >= DEX_MAX_NODES || !length || !(ucx.peer_addresses[peer] = malloc(length)))
		return -1;
	memcpy(ucx.peer_addresses[peer], address, length);
	ucx.addresses_given = true;
	return 0;
}

/* Origin: send its address to every node, then read theirs. Node: the
 * reverse. All on the bootstrap sockets, before any data flows. */
static int exchange_addresses(void)
{
	for (unsigned p = 0; p < dex_rt.nodes; p++)
		if (dex_queue_is_peer(p) && dex_rt.node == 0 &&
		    write_blob(dex_rt.peers[p].fd, ucx.address, (uint32_t)ucx.address_length) != 0)
			return -1;
	for (unsigned p = 0; p < dex_rt.nodes; p++) {
		if (dex_queue_is_peer(p) && !(ucx.peer_addresses[p] = read_blob(dex_rt.peers[p].fd))) {
			dex_error("no UCX address from node %u", p);
			return -1;
		}
	}
	if (dex_rt.node != 0 && write_blob(dex_rt.peers[0].fd, ucx.address, (uint32_t)ucx.address_length) != 0)
		return -1;
	return 0;
}

static int ucx_connect(void)
{
	const void *mine;
	size_t mine_length;
	if (ucx_local_address(&mine, &mine_length) != 0 || (!ucx.addresses_given && exchange_addresses() != 0))
		return -1;
	dex_debug("UCX: workers' addresses %s", ucx.addresses_given ? "from the launcher (PMIx)" : "over the bootstrap sockets");
	for (unsigned p = 0; p < dex_rt.nodes; p++) {
		if (!dex_queue_is_peer(p))
			continue;
		if (!ucx.peer_addresses[p]) {
			dex_error("no UCX address from node %u", p);
			return -1;
		}
		int rc = connect_endpoint(p, ucx.peer_addresses[p]);
		free(ucx.peer_addresses[p]);
		ucx.peer_addresses[p] = NULL;
		if (rc != 0)
			return -1;
	}
	ucp_worker_release_address(ucx.worker, ucx.address);
	ucx.address = NULL;

	for (unsigned p = 0; p < dex_rt.nodes; p++) {
		if (!dex_queue_is_peer(p))
			continue;
		ucx.tag_out[p] = dex_auth_tag(dex_rt.peers[p].session, dex_rt.node);
		ucx.tag_in[p] = dex_auth_tag(dex_rt.peers[p].session, p);
	}
	if (warm_up_paths() != 0)
		return -1;
	dex_queue_init();
	ucx.receive_buffer = malloc(RECEIVE_CAPACITY);
	if (!ucx.receive_buffer)
		return -1;
	post_receive();
	unsigned peers = 0;
	for (unsigned p = 0; p < dex_rt.nodes; p++)
		peers += dex_queue_is_peer(p);
	if (peers == 1)
		ucx_transport.receive = ucx_receive_pumping;
	else
		dex_start_service_thread(pump_thread, NULL);
	return 0;
}

static struct dex_transport ucx_transport = {
	.name = "ucx", .connect = ucx_connect, .send = dex_queue_send, .receive = dex_queue_receive,
	.flush = dex_queue_flush, .local_address = ucx_local_address, .peer_address = ucx_peer_address,
};

/* Called while libdex starts, before the shared regions exist: ucp_init
 * loads UCX's transport modules (and their libraries, whose constructors
 * may read copy-relocated globals such as stderr in the executable's data,
 * which on a node is not yet protected then), and every node loads them at
 * the same point, keeping the address spaces identical. */
const struct dex_transport *dex_ucx_transport_open(void)
{
	ucp_config_t *config;
	if (ucp_config_read(NULL, NULL, &config) != UCS_OK)
		return NULL;
	ucp_params_t params = { .field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP };
	ucs_status_t st = ucp_init(&params, config, &ucx.context);
	ucp_config_release(config);
	if (st != UCS_OK) {
		dex_error("ucp_init: %s", ucs_status_string(st));
		return NULL;
	}
	ucp_worker_params_t wparams = { .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
					.thread_mode = UCS_THREAD_MODE_SERIALIZED };
	st = ucp_worker_create(ucx.context, &wparams, &ucx.worker);
	if (st != UCS_OK) {
		dex_error("ucp_worker_create: %s", ucs_status_string(st));
		return NULL;
	}
	if (ucp_worker_get_efd(ucx.worker, &ucx.worker_fd) != UCS_OK)
		ucx.worker_fd = -1;
	return &ucx_transport;
}
