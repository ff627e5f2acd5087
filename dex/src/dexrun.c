/* dexrun: start a DEX program on N local processes ("nodes").
 *
 *   dexrun -n N [--transport tcp|ucx] [--netns] [--timeout SEC] ./app args...
 *
 * Node 0 (the origin) runs main(); nodes 1..N-1 run the same binary, which
 * libdex turns into workers that serve migrated threads. All of them start
 * with address-space randomisation off, an environment of identical size
 * and the same arguments, so code, globals, the shared heap and the vDSO sit
 * at the same addresses everywhere. The origin's exit status is dexrun's;
 * any node failing, a timeout, or Ctrl-C ends every process.
 *
 * --netns puts every node other than the origin in its own network
 * namespace, joined to dexrun's by a veth pair (10.S.N.1 on dexrun's side,
 * 10.S.N.2 in the node's), so node traffic crosses a network interface
 * instead of loopback. The namespace and its veth pair vanish with the
 * node process. Needs root (CAP_NET_ADMIN) and iproute2.
 *
 * --hosts FILE runs nodes 1..N-1 on other hosts, one per line of FILE in
 * order ("[USER@]HOST[:PORT]"; blank lines and '#' comments ignored); -n
 * defaults to 1 + the number of hosts. dexrun starts each over ssh
 * (run_over_ssh): `ssh HOST 'dexrun' --node-stdin`, the start request
 * (working directory, arguments, environment with DEX_RUN_SECRET and
 * DEX_BOOT naming the origin by this host's address on the route to that
 * host) on ssh's standard input, so the secret is on no command line. With
 * --secret-file FILE the hosts run dexnode agents instead (src/dexnode.c,
 * default port 7450): for each remote node dexrun forks a local proxy
 * process that proves the agents' secret, sends the same request, relays
 * the node's output and ends with the node's status; killing the proxy
 * closes the connection and the agent kills the node. The binary, its
 * libraries, dexrun and the working directory must exist at the same paths
 * on every host; a host whose binary or libraries differ is refused by the
 * origin's layout check at HELLO.
 *
 * Every run has its own key: random, except with agents: derived
 * from the agents' secret and a random run id, which the agents use to give
 * their nodes the same key (node_agent_wire.h). Every process of the run
 * finds it in DEX_RUN_SECRET and the nodes' connections to the origin prove
 * it (auth.h): a process without it cannot join the run. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "node_agent_wire.h"
#include "version.h"

#define MAX_NODES 32
#define DEX_STRINGIFY(x) DEX_STRINGIFY_(x)
#define DEX_STRINGIFY_(x) #x
#define GRACE_SECONDS 3

static pid_t children[MAX_NODES];
static int child_fds[MAX_NODES]; /* pidfds: readable once the child has ended; -1 if unavailable */
static int nchildren;
static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
	interrupted = sig;
}

struct remote_host {
	char address[128];
	int port;
};
static struct remote_host hosts[MAX_NODES];
static int nhosts;
static struct dex_auth_key agent_key; /* --secret-file, for --hosts */
static char run_id[DEX_AUTH_HEX + 1];  /* --hosts: what the agents derive the run's key from */

static int read_hosts_file(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		dex_error("cannot read hosts file %s: %s", path, strerror(errno));
		return -1;
	}
	char line[256];
	while (fgets(line, sizeof(line), f)) {
		char *hash = strchr(line, '#');
		if (hash)
			*hash = 0;
		char word[128];
		if (sscanf(line, "%127s", word) != 1)
			continue;
		if (nhosts == MAX_NODES - 1) {
			dex_error("more than %d hosts in %s", MAX_NODES - 1, path);
			fclose(f);
			return -1;
		}
		struct remote_host *h = &hosts[nhosts++];
		h->port = 0; /* the launcher's default: ssh's, or the agents' 7450 */
		char *colon = strchr(word, ':');
		if (colon) {
			*colon = 0;
			long port = agent_whole_number(colon + 1, 1, 65535);
			if (port < 0) {
				dex_error("%s: port '%s' of host %s is not a number from 1 to 65535", path, colon + 1,
					  word);
				fclose(f);
				return -1;
			}
			h->port = (int)port;
		}
		snprintf(h->address, sizeof(h->address), "%s", word);
	}
	fclose(f);
	if (!nhosts) {
		dex_error("no hosts in %s", path);
		return -1;
	}
	return 0;
}

static void put_string(char **at, const char *text)
{
	uint32_t len = (uint32_t)strlen(text);
	memcpy(*at, &len, sizeof(len));
	memcpy(*at + sizeof(len), text, len);
	*at += sizeof(len) + len;
}

/* The start request (node_agent_wire.h): the run id stands in for the
 * run's key, which the agent derives from it. 0, or -1 if the agent hung up
 * or the request is too large. */
static int send_request(int conn, const char *cwd, char **args, bool with_run_id)
{
	extern char **environ;
	static const char secret_entry[] = DEX_AUTH_ENV "=";
	char id_entry[sizeof(secret_entry) + DEX_AUTH_HEX];
	snprintf(id_entry, sizeof(id_entry), "%s%s", secret_entry, run_id);
	uint32_t nargs = 0, nenv = 0;
	while (args[nargs])
		nargs++;
	while (environ[nenv])
		nenv++;
	char nargs_text[16];
	snprintf(nargs_text, sizeof(nargs_text), "%u", nargs);
	const char *strings[2 + nargs + nenv];
	strings[0] = cwd;
	strings[1] = nargs_text;
	for (uint32_t i = 0; i < nargs; i++)
		strings[2 + i] = args[i];
	for (uint32_t i = 0; i < nenv; i++)
		strings[2 + nargs + i] =
			!with_run_id || strncmp(environ[i], secret_entry, sizeof(secret_entry) - 1) ? environ[i] : id_entry;
	uint32_t count = 2 + nargs + nenv;
	size_t size = sizeof(count);
	for (uint32_t i = 0; i < count; i++)
		size += sizeof(uint32_t) + strlen(strings[i]);
	if (size > AGENT_MAX_REQUEST) {
		dex_error("arguments and environment exceed the start request's %u bytes", AGENT_MAX_REQUEST);
		return -1;
	}
	char *body = malloc(size), *at = body;
	if (!body)
		return -1;
	memcpy(at, &count, sizeof(count));
	at += sizeof(count);
	for (uint32_t i = 0; i < count; i++)
		put_string(&at, strings[i]);
	uint32_t size32 = (uint32_t)size;
	int bad = dex_write_all(conn, AGENT_MAGIC, 8) || dex_write_all(conn, &size32, sizeof(size32)) ||
		  dex_write_all(conn, body, size);
	free(body);
	return bad ? -1 : 0;
}

/* Runs in the forked proxy of a remote node: connect to the host's agent,
 * start the node there, relay its output, and end the way it ended. */
static void run_on_host(const struct remote_host *h, const char *boot_format, char **args)
{
	struct remote_host with_port = *h;
	if (!with_port.port)
		with_port.port = AGENT_DEFAULT_PORT;
	h = &with_port;
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *found;
	char port[16];
	snprintf(port, sizeof(port), "%d", h->port);
	if (getaddrinfo(h->address, port, &hints, &found) != 0) {
		dex_error("cannot resolve host %s", h->address);
		_exit(127);
	}
	int conn = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (conn < 0 || connect(conn, found->ai_addr, found->ai_addrlen) != 0) {
		dex_error("no dexnode agent at %s:%d: %s", h->address, h->port, strerror(errno));
		_exit(127);
	}
	int one = 1;
	setsockopt(conn, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	uint8_t session[DEX_AUTH_BYTES];
	const char *refused = dex_auth_join(conn, &agent_key, DEX_AUTH_TIMEOUT_MS, session);
	if (refused) {
		dex_error("the dexnode agent at %s:%d: %s", h->address, h->port, refused);
		_exit(127);
	}
	/* the node reaches the origin at the address this host used */
	struct sockaddr_in local;
	socklen_t len = sizeof(local);
	getsockname(conn, (struct sockaddr *)&local, &len);
	uint32_t ip = ntohl(local.sin_addr.s_addr);
	char origin[16], boot[96];
	snprintf(origin, sizeof(origin), "%03u.%03u.%03u.%03u", ip >> 24, (ip >> 16) & 255, (ip >> 8) & 255, ip & 255);
	snprintf(boot, sizeof(boot), boot_format, origin);
	setenv("DEX_BOOT", boot, 1);

	char cwd[4096];
	if (!getcwd(cwd, sizeof(cwd))) {
		dex_error("getcwd: %s", strerror(errno));
		_exit(127);
	}
	if (send_request(conn, cwd, args, true) != 0) {
		dex_error("the agent at %s:%d hung up", h->address, h->port);
		_exit(127);
	}
	for (;;) {
		char head[5];
		uint32_t length;
		if (dex_read_all(conn, head, sizeof(head)))
			break;
		memcpy(&length, head + 1, sizeof(length));
		char *data = length <= AGENT_MAX_STRING ? malloc(length + 1) : NULL;
		if (!data || dex_read_all(conn, data, length))
			break;
		data[length] = 0;
		if (head[0] == 'o')
			dex_write_all(1, data, length);
		else if (head[0] == 'e' || head[0] == 'x')
			dex_write_all(2, data, length);
		if (head[0] == 'x')
			_exit(127);
		if (head[0] == 's') {
			int status = atoi(data);
			if (WIFSIGNALED(status)) {
				/* die the same way, so dexrun names the signal */
				signal(WTERMSIG(status), SIG_DFL);
				raise(WTERMSIG(status));
			}
			_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
		}
		free(data);
	}
	dex_error("lost the dexnode agent at %s:%d", h->address, h->port);
	_exit(1);
}

/* The address of this host that `h` reaches it at: the local end of the
 * route to it (a UDP "connection" sends nothing). 0 if there is none. */
static uint32_t address_towards(const struct remote_host *h)
{
	const char *at = strrchr(h->address, '@'); /* [USER@]HOST */
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_DGRAM }, *found;
	if (getaddrinfo(at ? at + 1 : h->address, "9", &hints, &found) != 0)
		return 0;
	struct sockaddr_in local = { 0 };
	socklen_t len = sizeof(local);
	int probe = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (probe < 0 || connect(probe, found->ai_addr, found->ai_addrlen) != 0 ||
	    getsockname(probe, (struct sockaddr *)&local, &len) != 0)
		local.sin_addr.s_addr = 0;
	if (probe >= 0)
		close(probe);
	freeaddrinfo(found);
	return ntohl(local.sin_addr.s_addr);
}

/* Runs in the forked child of a remote node: becomes `ssh HOST dexrun
 * --node-stdin`, whose standard input carries the start request (working
 * directory, arguments, the environment with the run's secret), so that
 * the secret is on no command line. The node's output and status come back
 * through ssh; ssh's own options come from DEX_SSH (default "ssh": words,
 * no quoting) and the user's ssh configuration. */
static void run_over_ssh(const struct remote_host *h, const char *boot_format, char **args)
{
	uint32_t ip = address_towards(h);
	if (!ip) {
		dex_error("no route to host %s", h->address);
		_exit(127);
	}
	char origin[16], boot[96], cwd[4096], self[4096];
	snprintf(origin, sizeof(origin), "%03u.%03u.%03u.%03u", ip >> 24, (ip >> 16) & 255, (ip >> 8) & 255, ip & 255);
	snprintf(boot, sizeof(boot), boot_format, origin);
	setenv("DEX_BOOT", boot, 1);
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (!getcwd(cwd, sizeof(cwd)) || n <= 0 || (size_t)n >= sizeof(self) - 1) {
		dex_error("cannot name the working directory or dexrun itself: %s", strerror(errno));
		_exit(127);
	}
	self[n] = 0;
	if (strchr(self, '\'')) {
		dex_error("dexrun's path %s has a quote, which the remote shell would misread", self);
		_exit(127);
	}
	int request[2];
	if (pipe(request) != 0) {
		dex_error("pipe: %s", strerror(errno));
		_exit(127);
	}
	pid_t writer = fork();
	if (writer == 0) {
		close(request[0]);
		_exit(send_request(request[1], cwd, args, false) ? 1 : 0);
	}
	close(request[1]);
	if (writer < 0 || dup2(request[0], 0) != 0) {
		dex_error("cannot hand the start request to ssh: %s", strerror(errno));
		_exit(127);
	}
	close(request[0]);
	const char *ssh = getenv("DEX_SSH");
	char words[1024], remote[4200], port[16];
	snprintf(words, sizeof(words), "%s", ssh && *ssh ? ssh : "ssh");
	snprintf(remote, sizeof(remote), "'%s' --node-stdin", self);
	snprintf(port, sizeof(port), "%d", h->port);
	char *argv[80], *save;
	int argc = 0;
	for (char *w = strtok_r(words, " \t", &save); w && argc < 70; w = strtok_r(NULL, " \t", &save))
		argv[argc++] = w;
	argv[argc++] = "-T";
	argv[argc++] = "-o";
	argv[argc++] = "BatchMode=yes";
	if (h->port) {
		argv[argc++] = "-p";
		argv[argc++] = port;
	}
	argv[argc++] = (char *)h->address;
	argv[argc++] = remote;
	argv[argc] = NULL;
	execvp(argv[0], argv);
	dex_error("cannot run %s: %s", argv[0], strerror(errno));
	_exit(127);
}

/* dexrun --node-stdin, as ssh runs it on a host: the start request on
 * standard input, then this process becomes the node. */
static int node_from_stdin(void)
{
	struct agent_request req;
	const char *why = agent_read_request(0, &req);
	if (why) {
		dex_error("--node-stdin: %s", why);
		return 2;
	}
	agent_exec_request(&req);
}

/* The run's key into DEX_RUN_SECRET (see the top). 0, or -1 after saying why not. */
static int make_run_key(const char *secret_file)
{
	struct dex_auth_key key, id;
	char hex[DEX_AUTH_HEX + 1];
	if (secret_file && !nhosts) {
		dex_error("--secret-file is for --hosts through dexnode agents");
		return -1;
	}
	const char *bad = secret_file ? dex_auth_key_from_file(secret_file, &agent_key) : NULL;
	if (bad) {
		dex_error("secret file %s: %s", secret_file, bad);
		return -1;
	}
	/* agents: the key is derived from a random run id; else random itself */
	if (dex_auth_random(secret_file ? id.bytes : key.bytes, sizeof(key.bytes)) != 0) {
		dex_error("getrandom: %s", strerror(errno));
		return -1;
	}
	if (secret_file) {
		dex_auth_key_to_hex(&id, run_id);
		dex_auth_derive(&agent_key, AGENT_RUN_LABEL, run_id, DEX_AUTH_HEX, &key);
	}
	dex_auth_key_to_hex(&key, hex);
	setenv(DEX_AUTH_ENV, hex, 1);
	return 0;
}

/* Says what is wrong with the command line (if `problem`), then how to use it, and exits. */
static void usage(const char *problem, const char *word)
{
	if (problem)
		fprintf(stderr, word ? "dexrun: %s '%s'\n" : "dexrun: %s\n", problem, word);
	fprintf(stderr, "usage: dexrun [-n N] [--transport tcp|ucx] [--netns | --hosts FILE [--secret-file FILE]] "
			"[--timeout SECONDS] program [args...]\n");
	exit(2);
}

/* --help, on stdout (help2man makes dexrun's man page from it). */
static void help(void)
{
	printf("usage: dexrun [-n N] [--transport tcp|ucx] [--netns | --hosts FILE [--secret-file FILE]] "
	       "[--timeout SECONDS] program [args...]\n"
	       "Runs a DEX program on N nodes: node 0 runs main(), the others serve the threads it migrates.\n\n"
	       "  -n N                 number of nodes (default with --hosts: 1 + the hosts)\n"
	       "  --transport tcp|ucx  how nodes talk (default tcp; DEX_TRANSPORT)\n"
	       "  --netns              every node but the origin in its own network namespace (root)\n"
	       "  --hosts FILE         nodes 1..N-1 on the hosts of FILE ([USER@]HOST[:PORT] a line), over ssh\n"
	       "  --secret-file FILE   with --hosts: through dexnode agents sharing this secret instead of ssh\n"
	       "  --timeout SECONDS    end the run after this long (0: never)\n"
	       "  --help, --version    this text; dexrun's version\n");
	exit(0);
}


/* Wires a node's fresh network namespace to ours with a veth pair. */
static int connect_namespace(pid_t pid, int node, unsigned subnet)
{
	char cmd[768];
	int id = (int)getpid();
	snprintf(cmd, sizeof(cmd),
		 "ip link add dx%dh%d type veth peer name dx%dn%d netns %d && "
		 "ip addr add 10.%u.%d.1/24 dev dx%dh%d && ip link set dx%dh%d up && "
		 "nsenter -t %d -n sh -c 'ip addr add 10.%u.%d.2/24 dev dx%dn%d && ip link set dx%dn%d up && "
		 "ip link set lo up'",
		 id, node, id, node, (int)pid, subnet, node, id, node, id, node, (int)pid, subnet, node, id, node, id,
		 node);
	return system(cmd);
}

static double now_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Sleeps until a child ends, a signal arrives or `seconds` pass. Waiting
 * on pidfds rather than polling waitpid every few milliseconds: the end
 * of a run is noticed at once (polling added 5-15 ms to every run). */
static void wait_for_children(double seconds)
{
	struct pollfd pfd[MAX_NODES];
	int n = 0;
	for (int i = 0; i < nchildren; i++) {
		if (children[i] <= 0)
			continue;
		if (child_fds[i] < 0) { /* no pidfd (kernel before 5.3): poll */
			usleep(5000);
			return;
		}
		pfd[n++] = (struct pollfd){ .fd = child_fds[i], .events = POLLIN };
	}
	if (seconds < 0)
		seconds = 0;
	if (seconds > 1)
		seconds = 1; /* callers loop and look at their deadlines again */
	(void)poll(pfd, (nfds_t)n, (int)(seconds * 1000) + 1); /* EINTR: a signal to look at */
}

static void forget_child(int i)
{
	children[i] = -1;
	if (child_fds[i] >= 0)
		close(child_fds[i]);
	child_fds[i] = -1;
}

static int index_of(pid_t pid)
{
	for (int i = 0; i < nchildren; i++)
		if (children[i] == pid)
			return i;
	return -1;
}

static int alive_count(void)
{
	int n = 0;
	for (int i = 0; i < nchildren; i++)
		n += children[i] > 0;
	return n;
}

static void signal_all(int sig)
{
	for (int i = 0; i < nchildren; i++)
		if (children[i] > 0)
			kill(children[i], sig);
}

static void describe(int node, int status, char *out, size_t len)
{
	if (WIFEXITED(status))
		snprintf(out, len, "node %d exited with status %d", node, WEXITSTATUS(status));
	else
		snprintf(out, len, "node %d was killed by signal %d (%s)", node, WTERMSIG(status),
			 strsignal(WTERMSIG(status)));
}

static int signalled; /* set once dexrun itself starts ending nodes */
static int failed_node = -1;

/* Reports a node that ended abnormally by itself (not by our signals). */
static void note_exit(int node, int status)
{
	if (signalled || (WIFEXITED(status) && WEXITSTATUS(status) == 0))
		return;
	if (node > 0 && failed_node < 0)
		failed_node = node;
	if (node > 0 || !WIFEXITED(status)) {
		char why[160];
		describe(node, status, why, sizeof(why));
		dex_error("%s", why);
	}
}

/* Reaps children until all are gone or `deadline` passes. Records the
 * origin's status. Returns the number still alive. */
static int reap_until(double deadline, int *origin_status)
{
	while (alive_count()) {
		int status;
		pid_t pid = waitpid(-1, &status, WNOHANG);
		if (pid > 0) {
			int i = index_of(pid);
			if (i >= 0) {
				forget_child(i);
				note_exit(i, status);
				if (i == 0)
					*origin_status = status;
			}
			continue;
		}
		double left = deadline - now_seconds();
		if (left <= 0)
			break;
		wait_for_children(left);
	}
	return alive_count();
}

static void end_everyone(int *origin_status)
{
	signalled = 1;
	signal_all(SIGTERM);
	if (reap_until(now_seconds() + GRACE_SECONDS, origin_status)) {
		signal_all(SIGKILL);
		reap_until(now_seconds() + 10, origin_status);
	}
}

static int exit_code_of(int status)
{
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	return 128 + WTERMSIG(status);
}

int main(int argc, char **argv)
{
	int nodes = 0, use_netns = 0;
	const char *secret_file = NULL;
	double timeout = 0;
	const char *bad_log = dex_log_init("dexrun");
	if (bad_log) {
		dex_error("%s, not '%s'", bad_log, getenv("CLOWDER_LOG"));
		return 2;
	}
	if (argc == 2 && !strcmp(argv[1], "--node-stdin"))
		return node_from_stdin();
	int i = 1;
	for (; i < argc && argv[i][0] == '-'; i++) {
		if (!strcmp(argv[i], "--help"))
			help();
		else if (!strcmp(argv[i], "--version")) {
			printf("dexrun (clowder DEX) " DEX_RELEASE "\n");
			return 0;
		} else if (!strcmp(argv[i], "-n") && i + 1 < argc) {
			nodes = (int)agent_whole_number(argv[++i], 1, MAX_NODES);
			if (nodes < 0)
				usage("-n takes a node count from 1 to " DEX_STRINGIFY(MAX_NODES) ", not", argv[i]);
		} else if (!strcmp(argv[i], "--transport") && i + 1 < argc) {
			/* every node reads DEX_TRANSPORT; ucx needs build/libdex-ucx.so */
			if (strcmp(argv[++i], "tcp") != 0 && strcmp(argv[i], "ucx") != 0) {
				dex_error("unknown transport '%s' (tcp or ucx)", argv[i]);
				return 2;
			}
			setenv("DEX_TRANSPORT", argv[i], 1);
		} else if (!strcmp(argv[i], "--hosts") && i + 1 < argc) {
			if (read_hosts_file(argv[++i]) != 0)
				return 2;
		} else if (!strcmp(argv[i], "--secret-file") && i + 1 < argc) {
			secret_file = argv[++i];
		} else if (!strcmp(argv[i], "--netns"))
			use_netns = 1;
		else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) {
			char *end;
			timeout = strtod(argv[++i], &end);
			if (end == argv[i] || *end || !(timeout >= 0))
				usage("--timeout takes seconds (0: none), not", argv[i]);
		} else
			usage("unknown option (or one missing its value):", argv[i]);
	}
	if (nhosts && !nodes)
		nodes = 1 + nhosts;
	if (i >= argc)
		usage("no program to run", NULL);
	if (nodes < 1)
		usage("say how many nodes with -n N, or give --hosts FILE", NULL);
	if (nodes > MAX_NODES) /* checked above; said again for the compiler's sake (format widths) */
		usage("too many nodes", NULL);
	if (nhosts && (use_netns || nodes > 1 + nhosts)) {
		dex_error("%s", use_netns ? "--hosts and --netns exclude each other"
					  : "more nodes than hosts in the hosts file");
		return 2;
	}

	if (make_run_key(secret_file) != 0)
		return 2;

	int listener = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = { .sin_family = AF_INET };
	/* with namespaces the nodes arrive over their veth interfaces */
	sa.sin_addr.s_addr = htonl(use_netns || nhosts ? INADDR_ANY : INADDR_LOOPBACK);
	socklen_t salen = sizeof(sa);
	if (listener < 0 || bind(listener, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(listener, 64) != 0 ||
	    getsockname(listener, (struct sockaddr *)&sa, &salen) != 0) {
		dex_error("listen: %s", strerror(errno));
		return 1;
	}

	/* Fixed-width values keep every process's environment the same size,
	 * and so its initial stack and everything laid out after it. rseq is
	 * off because the kernel would write the rseq area, which is inside
	 * the thread descriptor in shared memory, from kernel mode. */
	char boot[96];
	setenv("GLIBC_TUNABLES", "glibc.pthread.rseq=0", 1);
	struct sigaction sact = { .sa_handler = on_signal };
	sigaction(SIGINT, &sact, NULL);
	sigaction(SIGTERM, &sact, NULL);
	sigaction(SIGHUP, &sact, NULL);

	unsigned subnet = 100 + (unsigned)getpid() % 100;
	for (int n = 0; n < nodes; n++) {
		bool own_namespace = use_netns && n > 0;
		char host[16] = "127.000.000.001";
		if (own_namespace)
			snprintf(host, sizeof(host), "010.%03u.%03d.001", subnet, n);
		snprintf(boot, sizeof(boot), "node=%03d,nodes=%03d,port=%05d,fd=%04d,host=%s", n, nodes,
			 ntohs(sa.sin_port), listener, host);
		setenv("DEX_BOOT", boot, 1);
		int ready[2] = { -1, -1 }, go[2] = { -1, -1 };
		if (own_namespace && (pipe(ready) != 0 || pipe(go) != 0)) {
			dex_error("pipe: %s", strerror(errno));
			end_everyone(&(int){ 0 });
			return 1;
		}
		pid_t pid = fork();
		if (pid < 0) {
			dex_error("fork: %s", strerror(errno));
			end_everyone(&(int){ 0 });
			return 1;
		}
		if (pid == 0) {
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			if (getppid() == 1)
				_exit(1);
			signal(SIGINT, SIG_DFL);
			signal(SIGTERM, SIG_DFL);
			signal(SIGHUP, SIG_DFL);
			if (personality(ADDR_NO_RANDOMIZE) < 0) {
				dex_error("personality: %s", strerror(errno));
				_exit(127);
			}
			if (nhosts && n > 0) {
				char boot_format[96];
				/* fd -001: the listener is not inherited over there (same width) */
				snprintf(boot_format, sizeof(boot_format), "node=%03d,nodes=%03d,port=%05d,fd=%04d,host=%%s", n,
					 nodes, ntohs(sa.sin_port), -1);
				if (secret_file)
					run_on_host(&hosts[n - 1], boot_format, argv + i);
				run_over_ssh(&hosts[n - 1], boot_format, argv + i);
			}
			if (own_namespace) {
				char c = 0;
				if (unshare(CLONE_NEWNET) != 0) {
					dex_error("unshare(CLONE_NEWNET): %s", strerror(errno));
					_exit(127);
				}
				/* wait until dexrun has plugged in the veth pair */
				if (write(ready[1], "r", 1) != 1 || read(go[0], &c, 1) != 1)
					_exit(127);
				close(ready[1]);
				close(go[0]);
			}
			execvp(argv[i], argv + i);
			dex_error("cannot run %s: %s", argv[i], strerror(errno));
			_exit(127);
		}
		child_fds[nchildren] = (int)syscall(SYS_pidfd_open, pid, 0);
		children[nchildren++] = pid;
		if (own_namespace) {
			char c;
			close(ready[1]);
			close(go[0]);
			if (read(ready[0], &c, 1) != 1 || connect_namespace(pid, n, subnet) != 0 || write(go[1], "g", 1) != 1) {
				dex_error("cannot connect node %d's network namespace", n);
				end_everyone(&(int){ 0 });
				return 1;
			}
			close(ready[0]);
			close(go[1]);
		}
	}
	close(listener);

	double deadline = timeout > 0 ? now_seconds() + timeout : 0;
	int origin_status = 0;
	while (alive_count()) {
		if (interrupted) {
			dex_warn("interrupted (signal %d); stopping all %d nodes", (int)interrupted, nodes);
			end_everyone(&origin_status);
			return 130;
		}
		if (deadline && now_seconds() > deadline) {
			dex_error("timeout after %.0f s; stopping all nodes", timeout);
			end_everyone(&origin_status);
			return 124;
		}
		int status;
		pid_t pid = waitpid(-1, &status, WNOHANG);
		if (pid <= 0) {
			wait_for_children(deadline ? deadline - now_seconds() : 1.0);
			continue;
		}
		int n = index_of(pid);
		if (n < 0)
			continue;
		forget_child(n);
		if (n == 0) {
			origin_status = status;
			/* Nodes leave on the origin's SHUTDOWN or when its socket
			 * closes; anything still running after the grace is killed. */
			note_exit(0, status);
			if (reap_until(now_seconds() + GRACE_SECONDS, &origin_status)) {
				signalled = 1;
				signal_all(SIGKILL);
				reap_until(now_seconds() + 10, &origin_status);
			}
			break;
		}
		note_exit(n, status);
		if (failed_node >= 0) {
			/* Let the origin report the broken connection itself first. */
			if (reap_until(now_seconds() + GRACE_SECONDS, &origin_status))
				end_everyone(&origin_status);
			break;
		}
	}
	int code = exit_code_of(origin_status);
	if (failed_node >= 0 && code == 0)
		code = 1;
	return code;
}
