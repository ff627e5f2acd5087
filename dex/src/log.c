/* DEX's diagnostics (log.h). */
#include "log.h"

#include "rawsys.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const level_names[] = { "error", "warn", "info", "debug", "trace" };
static enum dex_log_level threshold = DEX_LOG_WARN;
static char prefix[48] = "dex";

static int level_named(const char *name, size_t len)
{
	for (int i = 0; i <= DEX_LOG_TRACE; i++)
		if (strlen(level_names[i]) == len && !strncasecmp(name, level_names[i], len))
			return i;
	return -1;
}

int dex_log_parse(const char *spec)
{
	/* "dex=" outranks a bare level wherever it stands, as NAME= does for clowder's other parts */
	int level = DEX_LOG_WARN, own = -1;
	const char *item = spec;
	for (;;) {
		size_t len = strcspn(item, ",");
		const char *eq = memchr(item, '=', len);
		if (eq) {
			/* another component's directive: only "dex=" is ours */
			if ((size_t)(eq - item) == 3 && !strncmp(item, "dex", 3) &&
			    (own = level_named(eq + 1, len - 4)) < 0)
				return -1;
		} else if (len && (level = level_named(item, len)) < 0) {
			return -1;
		}
		if (!item[len])
			return own >= 0 ? own : level;
		item += len + 1;
	}
}

const char *dex_log_init(const char *name)
{
	snprintf(prefix, sizeof(prefix), "%s", name);
	const char *spec = getenv("CLOWDER_LOG");
	if (!spec)
		return NULL;
	int level = dex_log_parse(spec);
	if (level < 0)
		return "CLOWDER_LOG takes error, warn, info, debug or trace (or dex=LEVEL among other directives)";
	threshold = (enum dex_log_level)level;
	return NULL;
}

int dex_log_enabled(enum dex_log_level level)
{
	return level <= threshold;
}

static void write_all_raw(int fd, const char *buf, size_t len)
{
	while (len) {
		long n = raw_syscall(SYS_write, fd, buf, len);
		if (n <= 0)
			return;
		buf += n;
		len -= (size_t)n;
	}
}

static void vlog(enum dex_log_level level, const char *fmt, va_list ap)
{
	char line[512];
	/* warnings read as before ("PREFIX: text"); the others name their level */
	int n = level == DEX_LOG_WARN ? snprintf(line, sizeof(line), "%s: ", prefix)
				      : snprintf(line, sizeof(line), "%s: %s: ", prefix, level_names[level]);
	n += vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	if (n > (int)sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	line[n++] = '\n';
	write_all_raw(2, line, (size_t)n);
}

void dex_log_at(enum dex_log_level level, const char *fmt, ...)
{
	if (!dex_log_enabled(level))
		return;
	va_list ap;
	va_start(ap, fmt);
	vlog(level, fmt, ap);
	va_end(ap);
}

void dex_fatal(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vlog(DEX_LOG_ERROR, fmt, ap);
	va_end(ap);
	raw_syscall(SYS_exit_group, 70, 0, 0);
	__builtin_unreachable();
}
