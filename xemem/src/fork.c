/*
 * fork(): a child gets converted memory back as private copies (pthread_atfork).
 */
#include "xpmem_internal.h"


/* fork() must give the child the converted memory as it was at the fork, privately. The
 * child copies it (below); until it has, the forking thread waits for the child's word and the
 * parent's backings are read-only, so its other threads' writes park in the SIGSEGV handler.
 * The freeze starts in the parent handler, after fork: freezing before it could deadlock, as a
 * thread parked while holding a malloc lock would stop glibc's fork from taking that lock. A
 * write by another parent thread in the moment between fork and freeze may reach the child
 * (single-threaded parents have no such moment). */
int fork_sync[2] = { -1, -1 };
struct placement *frozen;
static size_t frozen_count;

/* From the signal handler, while a fork is in progress (the list does not change then). */
int in_backing(uintptr_t addr)
{
	for (size_t i = 0; i < frozen_count; i++)
		if (addr >= frozen[i].start && addr < frozen[i].end)
			return 1;
	return 0;
}

void atfork_prepare(void)
{
	pthread_mutex_lock(&call_lock);
	pthread_mutex_lock(&table_lock);
	frozen_count = 0;
	if (backing_count == 0 || pipe2(fork_sync, O_CLOEXEC) < 0) {
		fork_sync[0] = fork_sync[1] = -1;
		return;
	}
	free(frozen);
	frozen = placements(0, UINTPTR_MAX, &frozen_count);
	if (!frozen)
		frozen_count = 0;
}

void atfork_parent(void)
{
	if (fork_sync[0] >= 0) {
		install_parking();
		atomic_fetch_add(&protection_epoch, 1);
		atomic_store(&frozen_for_fork, 1);
		for (size_t i = 0; i < frozen_count; i++)
			if (frozen[i].prot & PROT_WRITE)
				mprotect((void *)frozen[i].start, frozen[i].end - frozen[i].start,
					 frozen[i].prot & ~PROT_WRITE);
		close(fork_sync[1]);
		char done;
		while (read(fork_sync[0], &done, 1) < 0 && errno == EINTR)
			; /* 1 byte: copied; 0: the child died first. Either way the child is done. */
		close(fork_sync[0]);
		fork_sync[0] = fork_sync[1] = -1;
		for (size_t i = 0; i < frozen_count; i++)
			if (frozen[i].prot & PROT_WRITE)
				mprotect((void *)frozen[i].start, frozen[i].end - frozen[i].start, frozen[i].prot);
		atomic_store(&frozen_for_fork, 0);
		atomic_fetch_add(&protection_epoch, 1);
	}
	pthread_mutex_unlock(&table_lock);
	pthread_mutex_unlock(&call_lock);
}

/* In the child: converted memory becomes private again (a copy, as fork would have given it),
 * segments and permits stay the parent's, attachments are gone (MADV_DONTFORK), and the
 * broker connections are the parent's, so the child drops its copies. */
void atfork_child(void)
{
	for (size_t i = 0; i < frozen_count; i++) {
		size_t len = frozen[i].end - frozen[i].start;
		char *copy = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (copy != MAP_FAILED) {
			copy_nonzero_pages(copy, (const char *)frozen[i].start, len);
			mprotect(copy, len, frozen[i].prot);
			if (mremap(copy, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)frozen[i].start) == MAP_FAILED)
				munmap(copy, len);
		}
	}
	frozen_count = 0;
	for (size_t i = 0; i < backing_count; i++)
		close(backings[i].fd);
	backing_count = 0;
	if (fork_sync[1] >= 0) {
		if (write(fork_sync[1], "x", 1) < 0) {
			/* the parent sees EOF when we exit; nothing else to do */
		}
		close(fork_sync[0]);
		close(fork_sync[1]);
		fork_sync[0] = fork_sync[1] = -1;
	}
	for (size_t i = 0; i < segment_count; i++)
		if (segments[i].notify_fd >= 0)
			close(segments[i].notify_fd);
	segment_count = 0;
	/* Attachments, parked ones too, are not inherited (MADV_DONTFORK). */
	for (size_t i = 0; i < attachment_count; i++)
		free(attachments[i].runs);
	attachment_count = 0;
	message_permit_count = 0; /* the parent's */
	if (call_fd >= 0)
		close(call_fd);
	if (serve_fd >= 0)
		close(serve_fd);
	call_fd = serve_fd = -1;
	pthread_mutex_unlock(&table_lock);
	pthread_mutex_unlock(&call_lock);
}
