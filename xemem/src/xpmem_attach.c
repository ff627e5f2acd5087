/*
 * xpmem_attach: map a segment (through a permit) into this process.
 */
#include "xpmem_internal.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/* CLOWDER_XEMEM_PREFAULT=1: attach maps every page at once (default: lazily, on first touch,
 * as XPMEM does locally). */
static int prefault_requested(void)
{
	const char *value = getenv("CLOWDER_XEMEM_PREFAULT");
	return value && value[0] == '1';
}

/*
 * xpmem_attach - maps `size` bytes of the segment behind permit addr.apid, from addr.offset,
 * into this process: at `vaddr` when it is not NULL (MAP_FIXED semantics, page-aligned), else
 * where the library chooses (2 MiB-aligned when the size allows). No page is copied: the
 * owner's files are mapped. Touching a part whose source has no memory, or any part after the
 * segment's removal or its owner's exit, raises SIGBUS. Not inherited by fork.
 *
 * Returns the address, or (void *)-1 with errno (EINVAL: alignment, range, a fixed address over
 * an attachment or this process's exported memory; ENOENT: unknown permit).
 */
EXPORT void *xpmem_attach(struct xpmem_addr addr, size_t size, void *vaddr)
{
	if (use_device())
		return device_attach_segment(addr, size, vaddr);
	uintptr_t fixed = (uintptr_t)vaddr;
	if (addr.offset < 0 || addr.offset % PAGE || fixed % PAGE || size == 0 || size > USER_LIMIT || addr.apid <= 0) {
		errno = EINVAL;
		return (void *)-1;
	}
	size_t len = (size + PAGE - 1) & ~(PAGE - 1);
	if (fixed && (fixed + len < fixed || fixed + len > USER_LIMIT)) {
		errno = EINVAL;
		return (void *)-1;
	}
	static struct wire_run runs[WIRE_MAX_RUNS];
	int fds[WIRE_MAX_FDS], nfds = 0;
	struct wire_request request = { .op = OP_ATTACH, .args = { (uint64_t)addr.apid, (uint64_t)addr.offset, len } };
	struct wire_answer answer;
	pthread_once(&atfork_once, register_atfork);
	pthread_mutex_lock(&call_lock);
	if (call_locked(&request, 0, &answer, runs, fds, &nfds) < 0) {
		int saved = errno;
		pthread_mutex_unlock(&call_lock);
		errno = saved;
		return (void *)-1;
	}
	/* runs is static: keep call_lock until they are mapped. */
	int error = 0;
	uint64_t total = 0;
	for (uint32_t i = 0; i < answer.runs; i++) {
		total += runs[i].length;
		if (runs[i].fd_index != WIRE_HOLE && runs[i].fd_index >= (uint32_t)nfds)
			error = EPROTO;
	}
	if (total != len)
		error = EPROTO;
	pthread_mutex_lock(&table_lock);
	if (!error && fixed && overlaps_attachment(fixed, fixed + len))
		error = EINVAL;
	if (!error && fixed) {
		/* Nor over exported memory of our own (XPMEM refuses a self attach over its source):
		 * MAP_FIXED would silently replace the very pages being attached. */
		size_t mine;
		struct placement *own = placements(fixed, fixed + len, &mine);
		if (mine > 0)
			error = EINVAL;
		free(own);
	}
	/* The runs' identities: a parked attachment of the same runs is handed out again. */
	struct run_identity *ids = NULL;
	uint32_t nids = !error && len >= HUGE_PAGE ? run_identities(runs, answer.runs, fds, &ids) : 0;
	long parked = nids ? take_parked(addr.apid, addr.offset, len, ids, nids) : -1;
	char *base = MAP_FAILED;
	if (!error && parked >= 0) {
		struct attachment *a = &attachments[parked];
		if (fixed && fixed != a->base) {
			/* Moved to the address asked for, run by run as it was parked. */
			if (move_runs(a, (char *)fixed) < 0)
				error = errno ? errno : ENOMEM;
			if (error) {
				forget_attachment((size_t)parked, 1);
				mmap((void *)fixed, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
			} else {
				a->base = fixed;
			}
		}
		if (!error) {
			a->parked = 0;
			base = (char *)a->base;
		}
		free(ids);
		pthread_mutex_unlock(&table_lock);
		close_all(fds, nfds);
		if (error)
			goto undo;
		pthread_mutex_unlock(&call_lock);
		return base;
	}
	if (!error) {
		base = fixed ? (char *)fixed : reserve(len);
		if (base == MAP_FAILED)
			error = ENOMEM;
	}
	uint64_t at = 0;
	for (uint32_t i = 0; i < answer.runs && !error; i++) {
		int fd = runs[i].fd_index == WIRE_HOLE ? hole_descriptor() : fds[runs[i].fd_index];
		off_t offset = runs[i].fd_index == WIRE_HOLE ? 0 : (off_t)runs[i].offset;
		if (fd < 0 || mmap(base + at, runs[i].length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, offset) ==
				      MAP_FAILED)
			error = errno ? errno : ENOMEM;
		at += runs[i].length;
	}
	if (!error) {
		/* XPMEM attachments are VM_DONTCOPY: a forked child does not have them. */
		madvise(base, len, MADV_DONTFORK);
		if (prefault_requested()) {
			/* Map every page now, in one pass per run, instead of one fault per page later
			 * (XEMEM's cross-enclave attach is eager too). Holes stay unmapped. */
			uint64_t run_at = 0;
			for (uint32_t i = 0; i < answer.runs; i++) {
				if (runs[i].fd_index != WIRE_HOLE)
					madvise(base + run_at, runs[i].length, MADV_POPULATE_WRITE);
				run_at += runs[i].length;
			}
		}
		if (grow((void **)&attachments, &attachment_capacity, attachment_count, sizeof *attachments) < 0)
			error = ENOMEM;
		else {
			attachments[attachment_count++] = (struct attachment){
				.base = (uintptr_t)base, .size = len, .apid = addr.apid, .offset = addr.offset, .runs = ids, .nruns = nids
			};
			ids = NULL;
		}
	}
	free(ids);
	if (error && base != MAP_FAILED) {
		if (fixed)
			mmap(base, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
		else
			munmap(base, len);
	}
	pthread_mutex_unlock(&table_lock);
	close_all(fds, nfds);
undo:
	if (error) {
		/* The broker counted the attachment; take it back. */
		struct wire_request undo = { .op = OP_DETACH, .args = { (uint64_t)addr.apid } };
		call_locked(&undo, 0, &answer, NULL, NULL, NULL);
	}
	pthread_mutex_unlock(&call_lock);
	if (error) {
		errno = error;
		return (void *)-1;
	}
	return base;
}
