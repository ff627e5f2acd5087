/*
 * xpmem_detach: unmap an attachment.
 */
#include "xpmem_internal.h"

/*
 * xpmem_detach - unmaps the attachment that contains `vaddr` (large ones are parked for a
 * cheap re-attach; the address reads as unmapped either way, as XPMEM's).
 *
 * Returns 0 (also when nothing is mapped at vaddr), or -1 with errno EINVAL when vaddr lies in
 * memory that is not an attachment.
 */
EXPORT int xpmem_detach(void *vaddr)
{
	if (use_device()) {
		uint64_t address = (uintptr_t)vaddr;
		return (int)device_call(XPMEM_CMD_DETACH, &address);
	}
	uintptr_t addr = (uintptr_t)vaddr;
	pthread_mutex_lock(&table_lock);
	for (size_t i = 0; i < attachment_count; i++) {
		struct attachment a = attachments[i];
		if (a.parked || addr < a.base || addr >= a.base + a.size)
			continue;
		if (!a.nruns || park_attachment(i) < 0)
			forget_attachment(i, 1);
		pthread_mutex_unlock(&table_lock);
		struct wire_answer answer;
		uint64_t args[] = { (uint64_t)a.apid };
		call(OP_DETACH, args, 1, NULL, &answer); /* bookkeeping only: the mapping is gone */
		return 0;
	}
	pthread_mutex_unlock(&table_lock);
	/* Not an attachment: nothing mapped there is fine, anything else is EINVAL (as XPMEM). */
	if (msync((void *)(addr & ~(PAGE - 1)), PAGE, MS_ASYNC) < 0 && errno == ENOMEM)
		return 0;
	errno = EINVAL;
	return -1;
}
