/* DEX's diagnostics, shared by libdex, dexrun and dexnode: one line per
 * message on stderr, "PREFIX: [level: ]text", shown when its level is at or
 * above CLOWDER_LOG's (error, warn, info, debug, trace; default warn).
 *
 * CLOWDER_LOG takes a level, or comma-separated "target=level" directives
 * as Rust's env_logger does: a bare level or "dex=level" applies here,
 * other targets are ignored. Messages are written with one raw write(2)
 * and no allocation, so the runtime may log from signal handlers. */
#ifndef DEX_LOG_H
#define DEX_LOG_H

enum dex_log_level { DEX_LOG_ERROR, DEX_LOG_WARN, DEX_LOG_INFO, DEX_LOG_DEBUG, DEX_LOG_TRACE };

/* Reads CLOWDER_LOG and sets the prefix (at most 47 bytes). NULL, or why
 * CLOWDER_LOG is not understood (the default level then stays). */
const char *dex_log_init(const char *prefix);
/* The level a CLOWDER_LOG value selects for DEX, or -1 if it is not valid. */
int dex_log_parse(const char *spec);
int dex_log_enabled(enum dex_log_level level);
void dex_log_at(enum dex_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Logs at error level whatever CLOWDER_LOG says, then exits with status 70. */
void dex_fatal(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

#define dex_error(...) dex_log_at(DEX_LOG_ERROR, __VA_ARGS__)
#define dex_warn(...) dex_log_at(DEX_LOG_WARN, __VA_ARGS__)
#define dex_info(...) dex_log_at(DEX_LOG_INFO, __VA_ARGS__)
#define dex_debug(...) dex_log_at(DEX_LOG_DEBUG, __VA_ARGS__)

#endif
