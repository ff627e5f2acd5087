/* dexnode: the agent that starts DEX nodes on its host for dexrun --hosts.
 *
 *   dexnode [--listen ADDRESS[:PORT]] [--once]
 *
 * Listens on ADDRESS:PORT (default 0.0.0.0:7450). For each connection from
 * dexrun it runs the requested program, with the same working directory,
 * arguments and environment as dexrun sent, and with address-space
 * randomisation off, so the node's layout matches the origin's when this
 * host has the same binary and libraries at the same paths (the origin
 * checks that at HELLO and refuses a node whose layout differs). The node's
 * stdout and stderr travel back to dexrun, then its wait status. When
 * dexrun's connection closes (dexrun ended, was killed or Ctrl-C'd) the
 * node is killed.
 *
 * Whoever can connect can run programs as the agent's user: bind it to an
 * address of the cluster's private network only. --once serves one
 * connection and exits (tests). See node_agent_wire.h for the protocol. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "node_agent_wire.h"

static void fail_to_dexrun(int conn, const char *what)
{
	char msg[512];
	int n = snprintf(msg, sizeof(msg), "dexnode: %s: %s", what, strerror(errno));
	agent_put_frame(conn, 'x', msg, (uint32_t)n);
}

/* Reads the start request; fills argv and envp (NULL-terminated). */
static int read_request(int conn, char **cwd, char ***argv, char ***envp)
{
	char magic[8];
	uint32_t count;
	if (agent_read_all(conn, magic, sizeof(magic)) || memcmp(magic, AGENT_MAGIC, 8) != 0 ||
	    agent_read_all(conn, &count, sizeof(count)) || count < 3 || count > AGENT_MAX_STRINGS)
		return -1;
	char **strings = calloc(count + 2, sizeof(char *));
	if (!strings)
		return -1;
	for (uint32_t i = 0; i < count; i++)
		if (!(strings[i] = agent_get_string(conn)))
			return -1;
	long nargs = strtol(strings[1], NULL, 10);
	if (nargs < 1 || nargs > (long)count - 2)
		return -1;
	*cwd = strings[0];
	/* argv = strings[2 .. 2+nargs), envp = the rest; each NULL-terminated:
	 * shift the environment one slot to make room for argv's NULL. */
	memmove(&strings[3 + nargs], &strings[2 + nargs], (count - 2 - (size_t)nargs) * sizeof(char *));
	strings[2 + nargs] = NULL;
	strings[count + 1] = NULL;
	*argv = &strings[2];
	*envp = &strings[3 + nargs];
	return 0;
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

static void serve(int conn)
{
	char *cwd, **argv, **envp;
	if (read_request(conn, &cwd, &argv, &envp) != 0) {
		fprintf(stderr, "dexnode: malformed start request\n");
		return;
	}
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
		if (personality(ADDR_NO_RANDOMIZE) < 0 || chdir(cwd) != 0) {
			fprintf(stderr, "dexnode: cannot enter %s with ASLR off: %s\n", cwd, strerror(errno));
			_exit(127);
		}
		/* PATH from the request, as dexrun's own execvp would search it */
		for (char **e = envp; *e; e++)
			if (!strncmp(*e, "PATH=", 5))
				setenv("PATH", *e + 5, 1);
		execvpe(argv[0], argv, envp);
		fprintf(stderr, "dexnode: cannot run %s in %s: %s\n", argv[0], cwd, strerror(errno));
		_exit(127);
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

int main(int argc, char **argv)
{
	const char *listen_at = "0.0.0.0";
	int once = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--listen") && i + 1 < argc)
			listen_at = argv[++i];
		else if (!strcmp(argv[i], "--once"))
			once = 1;
		else {
			fprintf(stderr, "dexnode: unknown option (or one missing its value): '%s'\n"
					"usage: dexnode [--listen ADDRESS[:PORT]] [--once]\n",
				argv[i]);
			return 2;
		}
	}
	char address[64];
	snprintf(address, sizeof(address), "%s", listen_at);
	int port = AGENT_DEFAULT_PORT;
	char *colon = strchr(address, ':');
	if (colon) {
		*colon = 0;
		port = (int)agent_whole_number(colon + 1, 1, 65535);
		if (port < 0) {
			fprintf(stderr, "dexnode: port '%s' is not a number from 1 to 65535\n", colon + 1);
			return 2;
		}
	}
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int one = 1;
	int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (inet_pton(AF_INET, address, &sa.sin_addr) != 1) {
		fprintf(stderr, "dexnode: bad address %s\n", address);
		return 2;
	}
	setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(listener, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(listener, 16) != 0) {
		fprintf(stderr, "dexnode: cannot listen on %s:%d: %s\n", address, port, strerror(errno));
		return 1;
	}
	signal(SIGPIPE, SIG_IGN);
	signal(SIGCHLD, SIG_DFL);
	fprintf(stderr, "dexnode: listening on %s:%d\n", address, port);
	for (;;) {
		int conn = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
		if (conn < 0)
			continue;
		setsockopt(conn, IPPROTO_TCP, 1 /* TCP_NODELAY */, &one, sizeof(one));
		pid_t server = fork();
		if (server == 0) {
			close(listener);
			serve(conn);
			_exit(0);
		}
		close(conn);
		if (once) {
			waitpid(server, NULL, 0);
			return 0;
		}
		while (waitpid(-1, NULL, WNOHANG) > 0)
			; /* reap finished servers */
	}
}
