/* libdex start-up: the constructor reads DEX_BOOT, settles the layout,
 * and joins the run: the origin accepts its nodes, each proving the run's
 * secret and sending HELLO with its layout fingerprint; a node connects,
 * then becomes its receive loop. */
#include "internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <link.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <sys/uio.h>
#include <unistd.h>

struct dex_runtime dex_rt = { .nodes = 1 };
__thread int dex_tls_runtime_thread;

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
	struct dex_validation_limits lim = dex_limits();
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
			dex_warn("rejected a joining connection: %s", why);
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
		dex_debug("node %u joined (%u of %u)", in.hello.node, joined, dex_rt.nodes - 1);
	}
	close(listen_fd);
	for (unsigned n = 1; n < dex_rt.nodes; n++) {
		dex_set_receive_timeout(dex_rt.peers[n].fd);
	}
	dex_connect_selected_transport();
	for (unsigned n = 1; n < dex_rt.nodes; n++)
		dex_start_service_thread(dex_origin_receive_loop, (void *)(uintptr_t)n);
	dex_start_service_thread(dex_origin_pinger, NULL);
}

/* A connection to the origin at one of its addresses, tried in turn: the
 * origin may still be starting (dexrun starts all at once). A connect gives
 * up after a second, so an unreachable address costs only that. */
static int connect_origin(const struct dex_launch *run)
{
	struct timeval give_up = { .tv_sec = 1 };
	for (int attempt = 0; attempt < 100; attempt++) {
		for (unsigned i = 0; i < run->norigins; i++) {
			struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)run->port),
						  .sin_addr.s_addr = htonl(run->origin[i]) };
			int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
			setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &give_up, sizeof(give_up));
			if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
				return fd;
			close(fd);
		}
		usleep(50000);
	}
	dex_fatal("cannot connect to the origin on port %u", run->port);
}

static void node_join_origin(const struct dex_launch *run, const struct dex_auth_key *key)
{
	int fd = connect_origin(run);
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
	dex_debug("joined the origin");
	dex_set_receive_timeout(fd);
}

/* glibc keeps the kernel thread id in struct pthread, which starts at the
 * thread pointer; it must be cleared by hand when a thread exits (see
 * syscall.c), so locate the field once. glibc gives the kernel that very
 * field as each thread's clear-tid address (set_tid_address at start-up),
 * which PR_GET_TID_ADDRESS reads back. Searching the descriptor for the id
 * is only the fallback (a kernel without CONFIG_CHECKPOINT_RESTORE), and
 * then the id must occur once: the upper half of the descriptor's own
 * address (0x7fff) is the thread id of a process whose pid is 32767, and
 * clearing that word instead left every pthread_join waiting for ever.
 * Returns -1 if the field cannot be told apart. */
static long find_tid_offset(void)
{
	enum { SEARCHED = 2048 };
	uintptr_t self = dex_get_fs_base();
	pid_t tid = (pid_t)raw_syscall(SYS_gettid, 0, 0, 0);
	pid_t *field = NULL;
	if (prctl(PR_GET_TID_ADDRESS, &field, 0, 0, 0) == 0 && (uintptr_t)field >= self &&
	    (uintptr_t)field < self + SEARCHED && *field == tid)
		return (long)((uintptr_t)field - self);
	const pid_t *words = (const pid_t *)self;
	long found = -1;
	for (long i = 0; i < SEARCHED / (long)sizeof(pid_t); i++) {
		if (words[i] != tid)
			continue;
		if (found >= 0)
			return -1;
		found = i * (long)sizeof(pid_t);
	}
	return found;
}

/* Started with randomisation on (by hand, or by a launcher that does not
 * turn it off) or with glibc's rseq on: turn them off and run the same
 * program again, so that its layout matches the other nodes' and the kernel
 * never writes the rseq area, which lies in the thread descriptor and so in
 * shared memory for the application's threads (dexrun sets both). */
static void without_aslr_and_rseq(char **argv)
{
	static const char rseq_off[] = "glibc.pthread.rseq=0";
	const char *tunables = getenv("GLIBC_TUNABLES");
	bool rseq_on = !tunables || !strstr(tunables, rseq_off);
	if ((personality(0xffffffff) & ADDR_NO_RANDOMIZE) && !rseq_on)
		return;
	if (personality(ADDR_NO_RANDOMIZE) == -1)
		dex_fatal("cannot turn off address-space randomisation");
	if (rseq_on) {
		char all[1024];
		if (snprintf(all, sizeof(all), "%s%s%s", tunables ? tunables : "", tunables ? ":" : "", rseq_off) >=
		    (int)sizeof(all))
			dex_fatal("GLIBC_TUNABLES is too long to add %s", rseq_off);
		setenv("GLIBC_TUNABLES", all, 1);
	}
	execve("/proc/self/exe", argv, environ);
	dex_fatal("re-executing with randomisation off failed");
}

/* glibc passes argc, argv (and envp) to ELF constructors. */
__attribute__((constructor(101))) static void dex_init(int argc, char **argv)
{
	(void)argc;
	/* The process's main thread never runs application code under DEX
	 * (main runs on a migratable thread), so its allocations stay local. */
	dex_tls_runtime_thread = 1;
	dex_threads_init();
	dex_barriers_init();
	struct dex_launch run;
	if (!dex_launch_from_env(&run))
		return;
	dex_rt.node = run.node;
	char log_prefix[32];
	snprintf(log_prefix, sizeof(log_prefix), "dex[node %u]", run.node);
	const char *bad_log = dex_log_init(log_prefix);
	if (bad_log)
		dex_fatal("%s, not '%s'", bad_log, getenv("CLOWDER_LOG"));
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
	/* How long a grant waits for its faulting thread (dsm.c): a busy host
	 * wakes threads later than 500 us, and DEX_GRANT_HOLD_US lets it wait
	 * longer. At most a second, as a stuck thread holds the page that long. */
	dex_rt.grant_hold_ns = dex_env_number("DEX_GRANT_HOLD_US", 500, 1000000) * 1000ull;
	dex_rt.fault_timeout_ns = dex_env_number("DEX_FAULT_TIMEOUT", 30, 86400) * 1000000000ull;
	dex_rt.peer_timeout_s = (unsigned)dex_env_number("DEX_PEER_TIMEOUT", 5, 86400);
	if (!dex_rt.peer_timeout_s)
		dex_rt.peer_timeout_s = 5;
	if (run.pmix) {
		/* before PMIx connects: re-executing would drop that connection */
		without_aslr_and_rseq(argv);
		dex_launch_pmix_start(&run);
	}
	dex_rt.nodes = run.nodes;
	if (run.nodes == 1) {
		if (run.listen_fd >= 0)
			close(run.listen_fd);
		return;
	}
	/* every connection of the run proves it knows the run's secret (auth.h) */
	const char *secret = getenv(DEX_AUTH_ENV);
	struct dex_auth_key key;
	const char *bad_secret = secret ? dex_auth_key_from_hex(secret, &key) : "it is not set";
	if (bad_secret)
		dex_fatal("%s: %s (the launcher passes it to every process of a run: dexrun sets it; "
			  "with mpirun, export it and add -x %s)",
			  DEX_AUTH_ENV, bad_secret, DEX_AUTH_ENV);
	without_aslr_and_rseq(argv);
	dex_rt.active = true;
	dex_select_transport();
	if (run.pmix)
		dex_launch_pmix_exchange(&run);
	dl_iterate_phdr(dex_find_own_text, (void *)(uintptr_t)dex_init);
	if (!dex_rt.text_start)
		dex_fatal("cannot locate libdex's code");
	dex_rt.tid_offset = find_tid_offset();
	if (dex_rt.tid_offset < 0)
		dex_fatal("cannot locate the thread id in glibc's thread descriptor (no prctl PR_GET_TID_ADDRESS "
			  "in this kernel, and its value is not found there exactly once)");

	/* Node stdio is private to each process: keep it unbuffered so output
	 * written on a node reaches the origin's descriptors at once. */
	if (run.node == 0)
		setvbuf(stdout, NULL, _IOLBF, BUFSIZ);
	else
		setvbuf(stdout, NULL, _IONBF, 0);

	dex_setup_regions();
	dex_vma_init();
	dex_trace_init();
	dex_install_signal_handlers();
	if (run.node == 0) {
		size_t pool = 16384;
		struct dsm_dir_page *pages = calloc(dex_rt.total_pages, sizeof(*pages));
		struct dsm_queued_request *queue = calloc(pool, sizeof(*queue));
		if (!pages || !queue)
			dex_fatal("out of memory for the directory");
		dsm_dir_init(&dex_rt.dir, pages, dex_rt.total_pages, run.nodes, queue, (uint32_t)pool);
		dex_heap_init_origin();
		origin_accept_nodes(run.listen_fd, &key);
		return;
	}
	if (run.listen_fd >= 0)
		close(run.listen_fd);
	dex_thread_create_block(DEX_ROLE_SERVICE);
	node_join_origin(&run, &key);
	dex_connect_selected_transport();
	dex_node_start_workers();
	dex_node_receive_loop();
}
