/* The wire between dexrun and a dexnode agent (dexrun --hosts FILE).
 *
 * dexrun connects; the agent challenges it and both prove they know the
 * agent's secret (auth.h: nothing else is read from a connection first).
 * Then dexrun sends one start request:
 *   "DEXNODE2", u32 size, then `size` bytes (at most AGENT_MAX_REQUEST):
 *   u32 count, then count strings (u32 length + bytes, no NUL inside):
 *   the working directory, the number of arguments as a decimal string,
 *   the arguments, then the environment entries.
 * The environment has one DEX_RUN_SECRET entry, whose value is the run's id
 * (64 hex digits, not secret): the agent gives the node the run's key in
 * its place, HMAC(agent secret, "dex run" | id) in hex (agent_run_key), as
 * dexrun gave the origin. The entry keeps its length and place, so the
 * node's environment has the size the origin's has.
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

#include "auth.h"

#define AGENT_MAGIC "DEXNODE2"
#define AGENT_DEFAULT_PORT 7450
#define AGENT_MAX_STRINGS 65536
#define AGENT_MAX_STRING (1u << 20)
#define AGENT_MAX_REQUEST (4u << 20)
#define AGENT_RUN_LABEL "dex run"

/* A parsed start request (node_agent_request.c). */
struct agent_request {
	char *cwd;
	char **argv;     /* NULL-terminated */
	char **envp;     /* NULL-terminated */
	char *run_id;    /* the value of envp's DEX_RUN_SECRET entry */
	char **strings;  /* what agent_request_free releases */
	char *storage;
};

/* Parses a request body of `len` bytes; NULL, or a static reason. On
 * success the caller releases it with agent_request_free. */
const char *agent_parse_request(const uint8_t *body, size_t len, struct agent_request *req);
void agent_request_free(struct agent_request *req);
/* node_start.c: reads a request from `fd` (NULL, or why not); becomes the
 * node it describes (chdir, ASLR off, exec), or exits with status 127. */
const char *agent_read_request(int fd, struct agent_request *req);
void agent_exec_request(const struct agent_request *req) __attribute__((noreturn));

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

static inline int agent_put_frame(int fd, char kind, const void *data, uint32_t len)
{
	char head[5];
	head[0] = kind;
	memcpy(head + 1, &len, sizeof(len));
	return dex_write_all(fd, head, sizeof(head)) || dex_write_all(fd, data, len) ? -1 : 0;
}

#endif
