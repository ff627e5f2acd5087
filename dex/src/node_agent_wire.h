/* The wire between dexrun and a dexnode agent (dexrun --hosts FILE).
 *
 * dexrun connects to the agent and sends one start request:
 *   "DEXNODE1", u32 count, then count strings (u32 length + bytes):
 *   the working directory, the number of arguments as a decimal string,
 *   the arguments, then the environment entries.
 * The agent answers with frames, u8 kind + u32 length + bytes:
 *   'o' / 'e'  bytes the node wrote to its stdout / stderr,
 *   'x'        the agent could not start the node (a message),
 *   's'        the node ended: its wait status as a decimal string; last.
 * Closing the connection from dexrun's side kills the node.
 * Integers are in the host's byte order: every host of a DEX run is x86-64. */
#ifndef DEX_NODE_AGENT_WIRE_H
#define DEX_NODE_AGENT_WIRE_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define AGENT_MAGIC "DEXNODE1"
#define AGENT_DEFAULT_PORT 7450
#define AGENT_MAX_STRINGS 65536
#define AGENT_MAX_STRING (1u << 20)

/* `text` as a whole number from `low` to `high`, or -1 (for ports and counts given on
 * command lines and in hosts files). */
static inline long agent_whole_number(const char *text, long low, long high)
{
	char *end;
	errno = 0;
	long value = strtol(text, &end, 10);
	if (errno || end == text || *end || value < low || value > high)
		return -1;
	return value;
}

static inline int agent_write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;
	while (len) {
		ssize_t n = write(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static inline int agent_read_all(int fd, void *buf, size_t len)
{
	char *p = buf;
	while (len) {
		ssize_t n = read(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static inline int agent_put_string(int fd, const char *s)
{
	uint32_t len = (uint32_t)strlen(s);
	return agent_write_all(fd, &len, sizeof(len)) || agent_write_all(fd, s, len) ? -1 : 0;
}

/* Returns a malloc'ed, NUL-terminated string, or NULL. */
static inline char *agent_get_string(int fd)
{
	uint32_t len;
	if (agent_read_all(fd, &len, sizeof(len)) || len > AGENT_MAX_STRING)
		return NULL;
	char *s = malloc(len + 1);
	if (!s || agent_read_all(fd, s, len)) {
		free(s);
		return NULL;
	}
	s[len] = 0;
	return s;
}

static inline int agent_put_frame(int fd, char kind, const void *data, uint32_t len)
{
	char head[5];
	head[0] = kind;
	memcpy(head + 1, &len, sizeof(len));
	return agent_write_all(fd, head, sizeof(head)) || agent_write_all(fd, data, len) ? -1 : 0;
}

#endif
