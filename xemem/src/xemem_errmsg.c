/*
 * xemem_errmsg: why the calling thread's last broker call failed.
 */
#include "xpmem_internal.h"

#include <strings.h>

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

/* CLOWDER_LOG, read as DEX and clowder's programs read it (crates/log): directives separated
 * by commas, each a level (error, warn, info, debug, trace, any case) or NAME=LEVEL, where
 * NAME=xemem is this library's and outranks a bare level. The library says nothing above
 * debug, so only whether debug is on matters. A value it cannot read is said once on stderr
 * and leaves the default (warn): a library does not end its program over it. */
static const char *const level_names[] = { "error", "warn", "info", "debug", "trace" };
enum { LEVEL_WARN = 1, LEVEL_DEBUG = 3 };
static int log_level = LEVEL_WARN;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;

static int level_named(const char *name, size_t len)
{
	for (int i = 0; i < (int)(sizeof level_names / sizeof *level_names); i++)
		if (strlen(level_names[i]) == len && !strncasecmp(name, level_names[i], len))
			return i;
	return -1;
}

/* The level CLOWDER_LOG's value `spec` gives libxpmem, or -1 if the value is not valid. */
static int parse_log_level(const char *spec)
{
	int bare = LEVEL_WARN, own = -1;
	for (const char *item = spec;; item++) {
		size_t len = strcspn(item, ",");
		const char *eq = memchr(item, '=', len);
		if (eq) {
			int level = level_named(eq + 1, len - (size_t)(eq + 1 - item));
			if (level < 0 || eq == item)
				return -1;
			if (eq - item == 5 && !strncmp(item, "xemem", 5))
				own = level;
		} else if (len && (bare = level_named(item, len)) < 0) {
			return -1;
		}
		item += len;
		if (!*item)
			return own >= 0 ? own : bare;
	}
}

static void read_log_level(void)
{
	const char *spec = getenv("CLOWDER_LOG");
	const char *old = getenv("CLOWDER_XEMEM_DEBUG"); /* the name before CLOWDER_LOG; still honoured */
	int level = spec ? parse_log_level(spec) : LEVEL_WARN;
	if (level < 0) {
		fprintf(stderr, "libxpmem: CLOWDER_LOG takes error, warn, info, debug or trace (or xemem=LEVEL among "
				"other directives), not '%s'\n", spec);
		level = LEVEL_WARN;
	}
	log_level = old && old[0] == '1' ? LEVEL_DEBUG : level;
}

/* Keeps a failed answer's reason for xemem_errmsg and, at CLOWDER_LOG's debug level, says
 * which call failed and why. */
void note_reason(const struct wire_answer *answer)
{
	pthread_once(&log_once, read_log_level);
	last_reason = answer->error ? answer->results[0] : 0;
	if (!answer->error || log_level < LEVEL_DEBUG)
		return;
	const char *text = reason_text(last_reason);
	fprintf(stderr, "libxpmem: broker op %u failed (%s)%s%s\n", answer->op, strerror(answer->error), text ? ": " : "",
		text ? text : "");
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
