/* dexnode: the agent that starts DEX nodes on its host for dexrun --hosts.
 *
 *   dexnode --secret-file FILE [--listen ADDRESS[:PORT]] [--once]
 *
 * Listens on ADDRESS:PORT (default 127.0.0.1:7450: give the address of the
 * cluster's private network to serve other hosts). Every connection must
 * first prove it knows the agent's secret (FILE: 64 hex digits, readable
 * only by its owner; the same file dexrun --secret-file reads) in a
 * challenge-response (auth.h); one that does not within 5 s is closed, and
 * at most MAX_PENDING connections may be unauthenticated at a time (more
 * are refused at once). Each refusal is one line on stderr. Nothing is
 * forked for a connection before it has authenticated.
 *
 * For an authenticated request the agent runs the requested program, with
 * the same working directory, arguments and environment as dexrun sent,
 * the run's key derived from the run id in place (node_agent_wire.h), and
 * with address-space randomisation off, so the node's layout matches the
 * origin's when this host has the same binary and libraries at the same
 * paths (the origin checks that at HELLO and refuses a node whose layout
 * differs). The node's stdout and stderr travel back to dexrun, then its
 * wait status. When dexrun's connection closes (dexrun ended, was killed or
 * Ctrl-C'd) the node is killed. --once serves one authenticated connection
 * and exits (tests). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "node_agent_wire.h"
#include "version.h"

/* Unauthenticated connections at a time: enough for dexrun's proxies of a
 * 32-node run arriving together to queue briefly, few enough that strangers
 * cannot exhaust descriptors. */
#define MAX_PENDING 16

static struct dex_auth_key agent_key;

static void fail_to_dexrun(int conn, const char *what)
{
	char msg[512];
	int n = snprintf(msg, sizeof(msg), "dexnode: %s: %s", what, strerror(errno));
	agent_put_frame(conn, 'x', msg, (uint32_t)n);
}

/* Reads the start request after authentication (the socket carries a
 * receive timeout) and gives the node the run's key. NULL, or why not. */
static const char *read_request(int conn, struct agent_request *req)
{
	const char *why = agent_read_request(conn, req);
	if (why)
		return why;
	struct dex_auth_key run_key;
	dex_auth_derive(&agent_key, AGENT_RUN_LABEL, req->run_id, DEX_AUTH_HEX, &run_key);
	dex_auth_key_to_hex(&run_key, req->run_id); /* same length: 64 hex digits */
	return NULL;
}

static void relay(int from_fd, int conn, char kind, int *open_flag)
{
	char buf[65536];
	ssize_t n = read(from_fd, buf, sizeof(buf));
	if (n > 0)
		agent_put_frame(conn, kind, buf, (uint32_t)n);
	else if (n == 0 || errno != EINTR) {
		close(from_fd);
		*open_flag = 0;
	}
}

/* Runs in a child forked for one authenticated connection. */
static void serve(int conn, const char *peer)
{
	struct agent_request req;
	struct timeval limit = { .tv_sec = DEX_AUTH_TIMEOUT_MS / 1000 }, none = { 0 };
	setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
	const char *why = read_request(conn, &req);
	if (why) {
		dex_warn("refused the request from %s: %s", peer, why);
		return;
	}
	setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof(none));
	int out[2], err[2];
	if (pipe(out) != 0 || pipe(err) != 0) {
		fail_to_dexrun(conn, "pipe");
		return;
	}
	pid_t node = fork();
	if (node < 0) {
		fail_to_dexrun(conn, "fork");
		return;
	}
	if (node == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		int devnull = open("/dev/null", O_RDONLY);
		dup2(devnull, 0);
		dup2(out[1], 1);
		dup2(err[1], 2);
		close(out[0]);
		close(err[0]);
		close(conn);
		signal(SIGPIPE, SIG_DFL);
		agent_exec_request(&req);
	}
	close(out[1]);
	close(err[1]);
	int out_open = 1, err_open = 1, status = 0;
	for (;;) {
		struct pollfd fds[3] = { { conn, POLLIN, 0 }, { out_open ? out[0] : -1, POLLIN, 0 },
					 { err_open ? err[0] : -1, POLLIN, 0 } };
		if (poll(fds, 3, 100) < 0 && errno != EINTR)
			break;
		if (fds[0].revents) {
			/* dexrun sends nothing after the request: readable means gone */
			kill(node, SIGKILL);
			waitpid(node, NULL, 0);
			return;
		}
		if (fds[1].revents)
			relay(out[0], conn, 'o', &out_open);
		if (fds[2].revents)
			relay(err[0], conn, 'e', &err_open);
		if (!out_open && !err_open)
			break;
	}
	if (waitpid(node, &status, 0) != node)
		status = 0x7f00; /* not reaped: report exit status 127 */
	char text[32];
	int n = snprintf(text, sizeof(text), "%d", status);
	agent_put_frame(conn, 's', text, (uint32_t)n);
}

/* A connection that has not authenticated yet: the agent's challenge is
 * out, the client's proof is being read (without blocking) until it is
 * complete or the deadline passes. */
struct pending {
	int fd;
	double deadline;
	size_t got;
	struct dex_auth_exchange exchange;
	uint8_t proof[DEX_AUTH_PROOF_BYTES];
	char peer[64];
};
static struct pending pending[MAX_PENDING];
static int npending;

static double now_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void drop_pending(int i, const char *why)
{
	if (why)
		dex_warn("closed the connection from %s: %s", pending[i].peer, why);
	close(pending[i].fd);
	pending[i] = pending[--npending];
}

static void accept_one(int listener)
{
	struct sockaddr_in from;
	socklen_t len = sizeof(from);
	int conn = accept4(listener, (struct sockaddr *)&from, &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
	if (conn < 0)
		return;
	char peer[64];
	snprintf(peer, sizeof(peer), "%s:%d", inet_ntoa(from.sin_addr), ntohs(from.sin_port));
	if (npending == MAX_PENDING) {
		dex_warn("refused the connection from %s: %d unauthenticated connections already", peer,
			 MAX_PENDING);
		close(conn);
		return;
	}
	struct pending *p = &pending[npending];
	uint8_t challenge[DEX_AUTH_CHALLENGE_BYTES];
	/* a fresh socket's buffer takes the 40 bytes at once */
	if (dex_auth_challenge(&p->exchange, challenge) != 0 ||
	    send(conn, challenge, sizeof(challenge), MSG_NOSIGNAL) != (ssize_t)sizeof(challenge)) {
		close(conn);
		return;
	}
	p->fd = conn;
	p->got = 0;
	p->deadline = now_seconds() + DEX_AUTH_TIMEOUT_MS / 1000.0;
	snprintf(p->peer, sizeof(p->peer), "%s", peer);
	npending++;
}

/* Reads what pending connection `i` sent; once its proof is complete,
 * either refuses it or answers and forks its server. Returns the server's
 * pid, 0 while still pending, -1 if the connection was closed. */
static pid_t advance_pending(int i, int listener)
{
	struct pending *p = &pending[i];
	ssize_t n = recv(p->fd, p->proof + p->got, sizeof(p->proof) - p->got, 0);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return 0;
	if (n <= 0) {
		drop_pending(i, "closed before authenticating");
		return -1;
	}
	p->got += (size_t)n;
	if (p->got < sizeof(p->proof))
		return 0;
	uint8_t answer[DEX_AUTH_BYTES], session[DEX_AUTH_BYTES];
	if (!dex_auth_check_proof(&agent_key, &p->exchange, p->proof, answer, session)) {
		drop_pending(i, "wrong secret (authentication failed)");
		return -1;
	}
	int flags = fcntl(p->fd, F_GETFL);
	fcntl(p->fd, F_SETFL, flags & ~O_NONBLOCK);
	if (send(p->fd, answer, sizeof(answer), MSG_NOSIGNAL) != (ssize_t)sizeof(answer)) {
		drop_pending(i, "closed while authenticating");
		return -1;
	}
	int one = 1;
	setsockopt(p->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	pid_t server = fork();
	if (server == 0) {
		close(listener);
		for (int j = 0; j < npending; j++)
			if (j != i)
				close(pending[j].fd);
		serve(p->fd, p->peer);
		_exit(0);
	}
	if (server < 0)
		dex_error("cannot serve %s: fork: %s", p->peer, strerror(errno));
	drop_pending(i, NULL);
	return server < 0 ? -1 : server;
}

#define DEXNODE_USAGE "usage: dexnode --secret-file FILE [--listen ADDRESS[:PORT]] [--once] | --help | --version\n"

/* --help, on stdout (help2man makes dexnode's man page from it). */
static void help(void)
{
	printf("%s", DEXNODE_USAGE);
	printf("\nStarts DEX nodes on this host for dexrun --hosts FILE --secret-file FILE: each connection\n"
	       "must prove it knows the secret within 5 s; the node then runs with dexrun's working\n"
	       "directory, arguments and environment, its output and exit status sent back to dexrun,\n"
	       "and is killed when dexrun's connection closes.\n\n"
	       "  --secret-file FILE       the agents' secret: 64 hex digits, readable only by its owner\n"
	       "  --listen ADDRESS[:PORT]  where to listen (default 127.0.0.1:%d; give the address of\n"
	       "                           the cluster's private network to serve other hosts)\n"
	       "  --once                   serve one authenticated connection, then exit\n"
	       "  --help, --version        this text; dexnode's version\n",
	       AGENT_DEFAULT_PORT);
}

int main(int argc, char **argv)
{
	const char *listen_at = "127.0.0.1", *secret_file = NULL;
	int once = 0;
	const char *bad_log = dex_log_init("dexnode");
	if (bad_log) {
		dex_error("%s, not '%s'", bad_log, getenv("CLOWDER_LOG"));
		return 2;
	}
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--listen") && i + 1 < argc)
			listen_at = argv[++i];
		else if (!strcmp(argv[i], "--secret-file") && i + 1 < argc)
			secret_file = argv[++i];
		else if (!strcmp(argv[i], "--once"))
			once = 1;
		else if (!strcmp(argv[i], "--version")) {
			printf("dexnode (clowder DEX) " DEX_RELEASE "\n");
			return 0;
		} else if (!strcmp(argv[i], "--help")) {
			help();
			return 0;
		} else {
			fprintf(stderr, "dexnode: unknown option (or one missing its value): '%s'\n%s", argv[i],
				DEXNODE_USAGE);
			return 2;
		}
	}
	if (!secret_file) {
		dex_error("no secret: give --secret-file FILE (64 hex digits, readable only by its "
			  "owner; dexrun --hosts reads the same file)");
		return 2;
	}
	const char *bad = dex_auth_key_from_file(secret_file, &agent_key);
	if (bad) {
		dex_error("secret file %s: %s", secret_file, bad);
		return 2;
	}
	char address[64];
	snprintf(address, sizeof(address), "%s", listen_at);
	int port = AGENT_DEFAULT_PORT;
	char *colon = strchr(address, ':');
	if (colon) {
		*colon = 0;
		port = (int)agent_whole_number(colon + 1, 1, 65535);
		if (port < 0) {
			dex_error("port '%s' is not a number from 1 to 65535", colon + 1);
			return 2;
		}
	}
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int one = 1;
	if (inet_pton(AF_INET, address, &sa.sin_addr) != 1) {
		dex_error("bad address %s", address);
		return 2;
	}
	int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(listener, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(listener, 16) != 0) {
		dex_error("cannot listen on %s:%d: %s", address, port, strerror(errno));
		return 1;
	}
	signal(SIGPIPE, SIG_IGN);
	signal(SIGCHLD, SIG_DFL);
	dex_info("listening on %s:%d", address, port);
	pid_t served = 0;
	for (;;) {
		while (waitpid(-1, NULL, WNOHANG) > 0)
			; /* reap finished servers */
		if (once && served && kill(served, 0) != 0)
			return 0;
		struct pollfd fds[1 + MAX_PENDING];
		fds[0] = (struct pollfd){ .fd = once && served ? -1 : listener, .events = POLLIN };
		double now = now_seconds(), wake = now + 1; /* at least once a second: reaping */
		for (int i = 0; i < npending; i++) {
			fds[1 + i] = (struct pollfd){ .fd = pending[i].fd, .events = POLLIN };
			if (pending[i].deadline < wake)
				wake = pending[i].deadline;
		}
		int count = npending;
		if (poll(fds, (nfds_t)(1 + count), (int)((wake - now) * 1000) + 1) < 0 && errno != EINTR)
			return 1;
		now = now_seconds();
		/* from the last, so that dropping (which moves the last into
		 * the hole) never skips one */
		for (int i = count - 1; i >= 0; i--) {
			if (fds[1 + i].revents) {
				pid_t server = advance_pending(i, listener);
				if (server > 0 && once)
					served = server;
			} else if (now >= pending[i].deadline)
				drop_pending(i, "no authentication within 5 s");
		}
		if (fds[0].revents)
			accept_one(listener);
	}
}
