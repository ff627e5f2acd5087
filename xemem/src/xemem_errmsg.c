/*
 * xemem_errmsg: why the calling thread's last broker call failed.
 */
#include "xpmem_internal.h"

/* The reason code (xemem::Error::code) of the calling thread's last failed broker call, or 0:
 * see xemem_errmsg. */
__thread uint64_t last_reason __attribute__((tls_model("initial-exec")));

/* Reasons an errno does not tell apart (codes: xemem::Error::code). */
static const char *reason_text(uint64_t code)
{
	switch (code) {
	case WIRE_REASON_WHOLE_PAGES_ONLY:
		return "the segment's memory is on 2 MiB pages (a hugepage enclave's RAM), which another "
		       "process can map only whole: attach whole, aligned 2 MiB pages of it (offset and size "
		       "multiples of 2 MiB over memory its owner exported in whole pages)";
	default:
		return NULL;
	}
}

/* Keeps a failed answer's reason for xemem_errmsg and, under CLOWDER_XEMEM_DEBUG=1, says it. */
void note_reason(const struct wire_answer *answer)
{
	last_reason = answer->error ? answer->results[0] : 0;
	const char *text = reason_text(last_reason);
	const char *debug = getenv("CLOWDER_XEMEM_DEBUG");
	if (text && debug && debug[0] == '1')
		fprintf(stderr, "libxpmem: broker op %u failed (%s): %s\n", answer->op, strerror(answer->error), text);
}

/*
 * xemem_errmsg - why the calling thread's last broker call failed, when errno alone does not
 * say it (today: an attach of a hugepage enclave's memory that is not whole, aligned 2 MiB
 * pages).
 *
 * Returns a sentence owned by the library, or NULL (success, a reason errno names well enough,
 * or the device backend).
 */
EXPORT const char *xemem_errmsg(void)
{
	return reason_text(last_reason);
}
