/*
 * The owner's service thread: answers the broker's FETCH (resolving a range to runs of
 * files), NOTIFY and REVOKE requests, and revokes by itself when the broker goes away.
 */
#include "xpmem_internal.h"

/* An open descriptor of this process for the file (major:minor, inode), or -1. */
static int find_open_fd(unsigned major, unsigned minor, unsigned long inode)
{
	DIR *dir = opendir("/proc/self/fd");
	if (!dir)
		return -1;
	int found = -1;
	for (struct dirent *entry; (entry = readdir(dir));) {
		char *end;
		long fd = strtol(entry->d_name, &end, 10);
		struct stat st;
		if (*end || fd == dirfd(dir) || fstat(fd, &st) < 0)
			continue;
		if (S_ISREG(st.st_mode) && st.st_ino == inode && major(st.st_dev) == major && minor(st.st_dev) == minor) {
			found = fd;
			break;
		}
	}
	closedir(dir);
	return found;
}

struct fetch {
	struct wire_run runs[WIRE_MAX_RUNS];
	int nruns;
	int fds[WIRE_MAX_FDS];
	int nfds;
	int close_after[WIRE_MAX_FDS]; /* opened just for this answer */
};

static int fetch_fd_index(struct fetch *f, int fd, int close_after)
{
	for (int i = 0; i < f->nfds; i++)
		if (f->fds[i] == fd) {
			if (close_after)
				close(fd);
			return i;
		}
	if (f->nfds == WIRE_MAX_FDS)
		return -1;
	f->fds[f->nfds] = fd;
	f->close_after[f->nfds] = close_after;
	return f->nfds++;
}

/* Appends a run, merging it with the previous one when they are contiguous. */
static int fetch_add(struct fetch *f, uint32_t fd_index, uint32_t flags, uint64_t offset, uint64_t length)
{
	if (fd_index == WIRE_HOLE)
		offset = 0;
	if (f->nruns > 0) {
		struct wire_run *last = &f->runs[f->nruns - 1];
		if (last->fd_index == fd_index && last->flags == flags &&
		    (fd_index == WIRE_HOLE || last->offset + last->length == offset)) {
			last->length += length;
			return 0;
		}
	}
	if (f->nruns == WIRE_MAX_RUNS)
		return -1;
	f->runs[f->nruns++] = (struct wire_run){ .fd_index = fd_index, .flags = flags, .offset = offset, .length = length };
	return 0;
}

/* Resolves [lo, hi) of this process to runs, converting private memory on the way. */
static int resolve(uintptr_t lo, uintptr_t hi, struct fetch *f)
{
	pthread_mutex_lock(&table_lock);
	size_t count;
	struct mapping *maps = prepared_maps(lo, hi, &count);
	uintptr_t cursor = lo;
	int failed = 0;
	for (size_t i = 0; i < count && !failed; i++) {
		struct mapping *m = &maps[i];
		if (m->end <= lo || m->start >= hi)
			continue;
		uintptr_t start = m->start > lo ? m->start : lo;
		uintptr_t end = m->end < hi ? m->end : hi;
		if (start > cursor)
			failed |= fetch_add(f, WIRE_HOLE, 0, 0, start - cursor);
		cursor = end;
		int index = -1;
		uint32_t flags = 0;
		if (m->perms[3] == 's' && m->inode != 0 && m->perms[0] == 'r') {
			struct backing *b = backing_for(m->major, m->minor, m->inode);
			if (b) {
				index = fetch_fd_index(f, b->fd, 0);
				flags = WIRE_REVOCABLE;
				b->handed_out = 1;
			} else {
				int fd = find_open_fd(m->major, m->minor, m->inode);
				int opened = 0;
				if (fd < 0) {
					/* A shared mapping whose descriptor was closed: map_files names it
					 * (needs CAP_SYS_ADMIN on most kernels). */
					char path[96];
					snprintf(path, sizeof path, "/proc/self/map_files/%lx-%lx", m->start, m->end);
					fd = open(path, O_RDWR | O_CLOEXEC);
					opened = fd >= 0;
				}
				if (fd >= 0)
					index = fetch_fd_index(f, fd, opened);
			}
		}
		if (index < 0)
			failed |= fetch_add(f, WIRE_HOLE, 0, 0, end - start);
		else
			failed |= fetch_add(f, index, flags, m->offset + (start - m->start), end - start);
	}
	if (cursor < hi && !failed)
		failed |= fetch_add(f, WIRE_HOLE, 0, 0, hi - cursor);
	free(maps);
	pthread_mutex_unlock(&table_lock);
	return failed ? -1 : 0;
}

/* Answers the broker; sequence echoes the request's (args[6] -> results[5]) so the broker can
 * tell a late answer from the one it waits for. */
static void serve_answer(int fd, uint16_t op, uint64_t sequence, int error, struct fetch *f)
{
	static char buffer[sizeof(struct wire_answer) + WIRE_MAX_RUNS * sizeof(struct wire_run)];
	struct wire_answer answer = { .magic = WIRE_MAGIC, .version = WIRE_VERSION, .op = op, .error = error };
	answer.results[5] = sequence;
	size_t len = sizeof answer;
	int with_runs = f && !error;
	if (with_runs) {
		answer.runs = f->nruns;
		memcpy(buffer + sizeof answer, f->runs, f->nruns * sizeof(struct wire_run));
		len += f->nruns * sizeof(struct wire_run);
	}
	memcpy(buffer, &answer, sizeof answer);
	send_packet(fd, buffer, len, with_runs ? f->fds : NULL, with_runs ? f->nfds : 0);
}

static void notify_segment(xpmem_segid_t segid)
{
	pthread_mutex_lock(&table_lock);
	int fd = notify_fd_of(segid);
	uint64_t one = 1;
	if (fd >= 0 && write(fd, &one, sizeof one) < 0) {
		/* the counter is saturated: the owner has plenty to read already */
	}
	pthread_mutex_unlock(&table_lock);
}


/* Another enclave's segment is gone: every attachment made through apid now maps the empty
 * memfd instead, so touching it raises SIGBUS as after an XPMEM remove. The attachment stays
 * in the table until the application detaches it. table_lock held. */
static void revoke_attachments_locked(xpmem_apid_t apid)
{
	drop_parked(apid);
	int hole = hole_descriptor();
	for (size_t i = 0; i < attachment_count; i++) {
		struct attachment *a = &attachments[i];
		if (a->apid != apid)
			continue;
		if (hole < 0 || mmap((void *)a->base, a->size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, hole, 0) == MAP_FAILED)
			mmap((void *)a->base, a->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
		madvise((void *)a->base, a->size, MADV_DONTFORK);
	}
}

/* Permits whose attachments the broker revokes by message (other enclaves' segments, and
 * every segment under a sub-manager daemon): see broker_gone. table_lock guards them. */
xpmem_apid_t *message_permits;
size_t message_permit_count, message_permit_capacity;

void forget_message_permit(xpmem_apid_t apid)
{
	for (size_t i = 0; i < message_permit_count; i++)
		if (message_permits[i] == apid)
			message_permits[i--] = message_permits[--message_permit_count];
}

/* The broker closed the serving connection: the daemon is gone (killed, crashed). The
 * enclaves whose memory we map stop with it, and nobody is left to revoke our attachments of
 * their memory, so we do it ourselves: each maps the empty memfd (SIGBUS on the next touch,
 * as after a remove), which also lets go of the enclave's RAM memfd. A later get opens a new
 * serving connection (a restarted daemon). */
static void broker_gone(int fd)
{
	pthread_mutex_lock(&table_lock);
	for (size_t i = 0; i < message_permit_count; i++)
		revoke_attachments_locked(message_permits[i]);
	message_permit_count = 0;
	pthread_mutex_unlock(&table_lock);
	pthread_mutex_lock(&call_lock);
	if (serve_fd == fd) {
		close(fd);
		serve_fd = -1;
	}
	pthread_mutex_unlock(&call_lock);
}

static void *serve(void *arg)
{
	int fd = (int)(intptr_t)arg;
	static struct fetch fetch;
	pthread_attr_t attr;
	if (pthread_getattr_np(pthread_self(), &attr) == 0) {
		void *stack;
		size_t size;
		if (pthread_attr_getstack(&attr, &stack, &size) == 0) {
			pthread_mutex_lock(&table_lock);
			service_stack_lo = (uintptr_t)stack;
			service_stack_hi = (uintptr_t)stack + size;
			pthread_mutex_unlock(&table_lock);
		}
		pthread_attr_destroy(&attr);
	}
	for (;;) {
		struct wire_request request;
		int fds[WIRE_MAX_FDS], nfds;
		ssize_t got = receive_packet(fd, &request, sizeof request, fds, &nfds);
		close_all(fds, nfds);
		if (got < 0 && errno == EPROTO)
			continue; /* a packet too large was dropped; the connection holds */
		if (got <= 0) {
			broker_gone(fd);
			break;
		}
		if ((size_t)got < 64 || request.magic != WIRE_MAGIC || request.version != WIRE_VERSION) {
			serve_answer(fd, 0, 0, EPROTO, NULL);
			continue;
		}
		if (request.op == OP_FETCH) {
			uint64_t lo = request.args[0], len = request.args[1];
			if (lo % PAGE || len % PAGE || len == 0 || lo + len < lo || lo + len > USER_LIMIT) {
				serve_answer(fd, request.op, request.args[6], EINVAL, NULL);
				continue;
			}
			fetch.nruns = fetch.nfds = 0;
			int failed = resolve(lo, lo + len, &fetch);
			serve_answer(fd, request.op, request.args[6], failed ? ENOMEM : 0, &fetch);
			for (int i = 0; i < fetch.nfds; i++)
				if (fetch.close_after[i])
					close(fetch.fds[i]);
		} else if (request.op == OP_NOTIFY) {
			notify_segment((xpmem_segid_t)request.args[0]);
			serve_answer(fd, request.op, request.args[6], 0, NULL);
		} else if (request.op == OP_REVOKE) {
			pthread_mutex_lock(&table_lock);
			revoke_attachments_locked((xpmem_apid_t)request.args[0]);
			pthread_mutex_unlock(&table_lock);
			serve_answer(fd, request.op, request.args[6], 0, NULL);
		} else {
			serve_answer(fd, request.op, request.args[6], EINVAL, NULL);
		}
	}
	return NULL;
}

/* Opens the serving connection and starts the service thread (once per process). */
int ensure_serving(void)
{
	pthread_once(&atfork_once, register_atfork);
	pthread_mutex_lock(&call_lock);
	int result = 0;
	if (serve_fd < 0) {
		int fd = connect_broker();
		struct wire_request request = { .magic = WIRE_MAGIC, .version = WIRE_VERSION, .op = OP_SERVE };
		struct wire_answer answer;
		int fds[WIRE_MAX_FDS], nfds = 0;
		if (fd < 0 || send_packet(fd, &request, 64, NULL, 0) < 0 ||
		    receive_packet(fd, &answer, sizeof answer, fds, &nfds) != sizeof answer || answer.error) {
			int saved = errno ? errno : ECONNREFUSED;
			close_all(fds, nfds);
			if (fd >= 0)
				close(fd);
			result = -1;
			errno = saved;
		} else {
			pthread_t thread;
			pthread_attr_t attr;
			sigset_t all, old;
			pthread_attr_init(&attr);
			pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
			/* Signals are the application's business: the service thread takes none, except
			 * the faults it may raise itself: it must be able to park on memory another
			 * thread is converting (a blocked SIGSEGV would kill the process instead). */
			sigfillset(&all);
			sigdelset(&all, SIGSEGV);
			sigdelset(&all, SIGBUS);
			sigdelset(&all, SIGILL);
			sigdelset(&all, SIGFPE);
			pthread_sigmask(SIG_SETMASK, &all, &old);
			if (pthread_create(&thread, &attr, serve, (void *)(intptr_t)fd) != 0) {
				close(fd);
				result = -1;
				errno = EAGAIN;
			} else {
				serve_fd = fd;
			}
			pthread_sigmask(SIG_SETMASK, &old, NULL);
			pthread_attr_destroy(&attr);
		}
	}
	pthread_mutex_unlock(&call_lock);
	return result;
}
