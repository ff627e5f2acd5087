/*
 * The broker link: the SOCK_SEQPACKET connection to the segment broker, packets with
 * descriptors (SCM_RIGHTS), and one request/answer call.
 */
#include "xpmem_internal.h"

/* $CLOWDER_XEMEM_SOCKET; else xemem.sock beside the daemon's socket ($CLOWDER_SOCKET, which
 * moves the daemon and every client); else /run/clowder/xemem.sock. */
static const char *socket_path(void)
{
	static char beside_daemon[sizeof(((struct sockaddr_un *)0)->sun_path)];
	const char *path = getenv("CLOWDER_XEMEM_SOCKET");
	if (path && *path)
		return path;
	const char *daemon = getenv("CLOWDER_SOCKET");
	const char *slash = daemon ? strrchr(daemon, '/') : NULL;
	if (slash && (size_t)(slash - daemon) + sizeof "/xemem.sock" <= sizeof beside_daemon) {
		memcpy(beside_daemon, daemon, slash - daemon);
		strcpy(beside_daemon + (slash - daemon), "/xemem.sock");
		return beside_daemon;
	}
	return "/run/clowder/xemem.sock";
}

int connect_broker(void)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	const char *path = socket_path();
	if (strlen(path) >= sizeof addr.sun_path) {
		errno = ENAMETOOLONG;
		return -1;
	}
	strcpy(addr.sun_path, path);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
		int saved = errno;
		close(fd);
		errno = saved;
		return -1;
	}
	return fd;
}

int send_packet(int fd, const void *bytes, size_t len, const int *fds, int nfds)
{
	struct iovec iov = { .iov_base = (void *)bytes, .iov_len = len };
	union {
		char buf[CMSG_SPACE(WIRE_MAX_FDS * sizeof(int))];
		struct cmsghdr align;
	} control;
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	if (nfds > 0) {
		msg.msg_control = control.buf;
		msg.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
		struct cmsghdr *header = CMSG_FIRSTHDR(&msg);
		header->cmsg_level = SOL_SOCKET;
		header->cmsg_type = SCM_RIGHTS;
		header->cmsg_len = CMSG_LEN(nfds * sizeof(int));
		memcpy(CMSG_DATA(header), fds, nfds * sizeof(int));
	}
	ssize_t sent;
	do
		sent = sendmsg(fd, &msg, MSG_NOSIGNAL);
	while (sent < 0 && errno == EINTR);
	return sent < 0 ? -1 : 0;
}

/* Receives one packet; descriptors land in fds (up to WIRE_MAX_FDS). Returns its length,
 * 0 when the peer closed, -1 on error. */
ssize_t receive_packet(int fd, void *bytes, size_t len, int *fds, int *nfds)
{
	struct iovec iov = { .iov_base = bytes, .iov_len = len };
	union {
		char buf[CMSG_SPACE(WIRE_MAX_FDS * sizeof(int))];
		struct cmsghdr align;
	} control;
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
			      .msg_controllen = sizeof control.buf };
	ssize_t got;
	do
		got = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
	while (got < 0 && errno == EINTR);
	*nfds = 0;
	if (got < 0)
		return -1;
	for (struct cmsghdr *h = CMSG_FIRSTHDR(&msg); h; h = CMSG_NXTHDR(&msg, h)) {
		if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS)
			continue;
		int n = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (int i = 0; i < n; i++) {
			int received;
			memcpy(&received, CMSG_DATA(h) + i * sizeof(int), sizeof(int));
			if (*nfds < WIRE_MAX_FDS)
				fds[(*nfds)++] = received;
			else
				close(received);
		}
	}
	if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
		for (int i = 0; i < *nfds; i++)
			close(fds[i]);
		*nfds = 0;
		errno = EPROTO;
		return -1;
	}
	return got;
}

void close_all(int *fds, int nfds)
{
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
}

pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
void register_atfork(void)
{
	pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

/* One request and its answer. With runs != NULL the answer's runs and descriptors are
 * returned (the caller closes the descriptors); otherwise any are closed. Returns 0, or -1
 * with errno (the broker's errno, or a connection error). Call with call_lock held. */

int call_locked(struct wire_request *request, size_t name_len, struct wire_answer *answer,
		       struct wire_run *runs, int *fds, int *nfds)
{
	last_reason = 0;
	static char buffer[sizeof(struct wire_answer) + WIRE_MAX_RUNS * sizeof(struct wire_run)];
	int local_nfds = 0;
	int received_fds[WIRE_MAX_FDS];
	for (int attempt = 0; attempt < 2; attempt++) {
		if (call_fd < 0) {
			call_fd = connect_broker();
			if (call_fd < 0)
				return -1;
		}
		request->magic = WIRE_MAGIC;
		request->version = WIRE_VERSION;
		if (send_packet(call_fd, request, 64 + name_len, NULL, 0) < 0) {
			/* A broker restart leaves a dead connection: reconnect once. */
			close(call_fd);
			call_fd = -1;
			continue;
		}
		ssize_t got = receive_packet(call_fd, buffer, sizeof buffer, received_fds, &local_nfds);
		if (got <= 0) {
			int saved = got == 0 ? ECONNRESET : errno;
			close(call_fd);
			call_fd = -1;
			errno = saved;
			return -1;
		}
		memcpy(answer, buffer, sizeof *answer);
		size_t expected = sizeof *answer + (size_t)answer->runs * sizeof(struct wire_run);
		if ((size_t)got < sizeof *answer || answer->magic != WIRE_MAGIC || answer->op != request->op ||
		    answer->runs > WIRE_MAX_RUNS || (size_t)got != expected) {
			close_all(received_fds, local_nfds);
			errno = EPROTO;
			return -1;
		}
		note_reason(answer);
		if (answer->error) {
			close_all(received_fds, local_nfds);
			errno = answer->error;
			return -1;
		}
		if (runs) {
			memcpy(runs, buffer + sizeof *answer, answer->runs * sizeof(struct wire_run));
			memcpy(fds, received_fds, local_nfds * sizeof(int));
			*nfds = local_nfds;
		} else {
			close_all(received_fds, local_nfds);
		}
		return 0;
	}
	errno = ECONNRESET;
	return -1;
}

int call(uint16_t op, const uint64_t *args, int nargs, const char *name, struct wire_answer *answer)
{
	struct wire_request request = { .op = op };
	for (int i = 0; i < nargs; i++)
		request.args[i] = args[i];
	size_t name_len = name ? strlen(name) : 0;
	if (name_len > XEMEM_NAME_MAX) {
		errno = EINVAL;
		return -1;
	}
	if (name_len)
		memcpy(request.name, name, name_len);
	pthread_once(&atfork_once, register_atfork);
	pthread_mutex_lock(&call_lock);
	int result = call_locked(&request, name_len, answer, NULL, NULL, NULL);
	int saved = errno;
	pthread_mutex_unlock(&call_lock);
	errno = saved;
	return result;
}

/* A broker call whose one argument is a permit (release, signal); a non-positive apid is
 * EINVAL, as XPMEM's. */
int permit_call(uint16_t op, xpmem_apid_t apid)
{
	if (apid <= 0) {
		errno = EINVAL;
		return -1;
	}
	struct wire_answer answer;
	uint64_t args[] = { (uint64_t)apid };
	return call(op, args, 1, NULL, &answer);
}
