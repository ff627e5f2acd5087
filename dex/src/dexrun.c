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
 * node process. Needs root (CAP_NET_ADMIN) and iproute2. */
#include <arpa/inet.h>
#include <errno.h>
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
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_NODES 32
#define GRACE_SECONDS 3

static pid_t children[MAX_NODES];
static int nchildren;
static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
	interrupted = sig;
}

static void usage(void)
{
	fprintf(stderr, "usage: dexrun -n N [--transport tcp|ucx] [--netns] [--timeout SECONDS] program [args...]\n");
	exit(2);
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
		fprintf(stderr, "dexrun: %s\n", why);
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
				children[i] = -1;
				note_exit(i, status);
				if (i == 0)
					*origin_status = status;
			}
			continue;
		}
		if (now_seconds() >= deadline)
			break;
		usleep(10000);
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
	double timeout = 0;
	int i = 1;
	for (; i < argc && argv[i][0] == '-'; i++) {
		if (!strcmp(argv[i], "-n") && i + 1 < argc)
			nodes = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--transport") && i + 1 < argc) {
			/* every node reads DEX_TRANSPORT; ucx needs build/libdex-ucx.so */
			if (strcmp(argv[++i], "tcp") != 0 && strcmp(argv[i], "ucx") != 0) {
				fprintf(stderr, "dexrun: unknown transport '%s' (tcp or ucx)\n", argv[i]);
				return 2;
			}
			setenv("DEX_TRANSPORT", argv[i], 1);
		} else if (!strcmp(argv[i], "--netns"))
			use_netns = 1;
		else if (!strcmp(argv[i], "--timeout") && i + 1 < argc)
			timeout = atof(argv[++i]);
		else
			usage();
	}
	if (i >= argc || nodes < 1 || nodes > MAX_NODES)
		usage();

	int listener = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = { .sin_family = AF_INET };
	/* with namespaces the nodes arrive over their veth interfaces */
	sa.sin_addr.s_addr = htonl(use_netns ? INADDR_ANY : INADDR_LOOPBACK);
	socklen_t salen = sizeof(sa);
	if (listener < 0 || bind(listener, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(listener, 64) != 0 ||
	    getsockname(listener, (struct sockaddr *)&sa, &salen) != 0) {
		perror("dexrun: listen");
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
			perror("dexrun: pipe");
			end_everyone(&(int){ 0 });
			return 1;
		}
		pid_t pid = fork();
		if (pid < 0) {
			perror("dexrun: fork");
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
				perror("dexrun: personality");
				_exit(127);
			}
			if (own_namespace) {
				char c = 0;
				if (unshare(CLONE_NEWNET) != 0) {
					perror("dexrun: unshare(CLONE_NEWNET)");
					_exit(127);
				}
				/* wait until dexrun has plugged in the veth pair */
				if (write(ready[1], "r", 1) != 1 || read(go[0], &c, 1) != 1)
					_exit(127);
				close(ready[1]);
				close(go[0]);
			}
			execvp(argv[i], argv + i);
			fprintf(stderr, "dexrun: cannot run %s: %s\n", argv[i], strerror(errno));
			_exit(127);
		}
		children[nchildren++] = pid;
		if (own_namespace) {
			char c;
			close(ready[1]);
			close(go[0]);
			if (read(ready[0], &c, 1) != 1 || connect_namespace(pid, n, subnet) != 0 || write(go[1], "g", 1) != 1) {
				fprintf(stderr, "dexrun: cannot connect node %d's network namespace\n", n);
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
			fprintf(stderr, "dexrun: interrupted (signal %d); stopping all %d nodes\n", (int)interrupted,
				nodes);
			end_everyone(&origin_status);
			return 130;
		}
		if (deadline && now_seconds() > deadline) {
			fprintf(stderr, "dexrun: timeout after %.0f s; stopping all nodes\n", timeout);
			end_everyone(&origin_status);
			return 124;
		}
		int status;
		pid_t pid = waitpid(-1, &status, WNOHANG);
		if (pid <= 0) {
			usleep(5000);
			continue;
		}
		int n = index_of(pid);
		if (n < 0)
			continue;
		children[n] = -1;
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
