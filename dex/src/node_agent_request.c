/* The dexnode start request's parser (node_agent_wire.h): a buffer in, the
 * program's directory, arguments and environment out. Kept apart from the
 * agent's sockets so the fuzz target (fuzz/agent_request.c) runs this very
 * code. */
#include "node_agent_wire.h"

#include <string.h>

static int take_u32(const uint8_t **p, const uint8_t *end, uint32_t *value)
{
	if ((size_t)(end - *p) < sizeof(*value))
		return -1;
	memcpy(value, *p, sizeof(*value));
	*p += sizeof(*value);
	return 0;
}

const char *agent_parse_request(const uint8_t *body, size_t len, struct agent_request *req)
{
	const uint8_t *p = body, *end = body + len;
	uint32_t count;
	memset(req, 0, sizeof(*req));
	if (len > AGENT_MAX_REQUEST)
		return "request too large";
	if (take_u32(&p, end, &count) != 0 || count < 3 || count > AGENT_MAX_STRINGS)
		return "string count missing or out of range";
	/* every string is at least its 4-byte length: bounds the allocation by the body */
	if (count > (size_t)(end - p) / 4)
		return "more strings than the request holds";
	/* the strings, each NUL-terminated, fit in the body's size */
	req->storage = malloc(len + 1);
	/* argv's NULL between the arguments and the environment, and the last NULL */
	req->strings = calloc((size_t)count + 2, sizeof(char *));
	if (!req->storage || !req->strings) {
		agent_request_free(req);
		return "out of memory";
	}
	char *out = req->storage;
	for (uint32_t i = 0; i < count; i++) {
		uint32_t n;
		if (take_u32(&p, end, &n) != 0 || n > AGENT_MAX_STRING || n > (size_t)(end - p)) {
			agent_request_free(req);
			return "string runs past the request";
		}
		if (memchr(p, 0, n)) {
			agent_request_free(req);
			return "string with a NUL byte";
		}
		memcpy(out, p, n);
		out[n] = 0;
		req->strings[i] = out;
		out += n + 1;
		p += n;
	}
	if (p != end) {
		agent_request_free(req);
		return "bytes after the last string";
	}
	long nargs = agent_whole_number(req->strings[1], 1, (long)count - 2);
	if (nargs < 0) {
		agent_request_free(req);
		return "argument count missing or out of range";
	}
	/* argv = strings[2 .. 2+nargs), envp = the rest; each NULL-terminated:
	 * shift the environment one slot to make room for argv's NULL. */
	char **strings = req->strings;
	memmove(&strings[3 + nargs], &strings[2 + nargs], (count - 2 - (size_t)nargs) * sizeof(char *));
	strings[2 + nargs] = NULL;
	strings[count + 1] = NULL;
	req->cwd = strings[0];
	req->argv = &strings[2];
	req->envp = &strings[3 + nargs];
	static const char entry[] = DEX_AUTH_ENV "=";
	for (char **e = req->envp; *e; e++) {
		if (strncmp(*e, entry, sizeof(entry) - 1) != 0)
			continue;
		if (req->run_id) {
			agent_request_free(req);
			return "two " DEX_AUTH_ENV " entries";
		}
		req->run_id = *e + sizeof(entry) - 1;
	}
	struct dex_auth_key id;
	if (!req->run_id || dex_auth_key_from_hex(req->run_id, &id) != NULL) {
		agent_request_free(req);
		return "no run id (" DEX_AUTH_ENV " of 64 hex digits) in the environment";
	}
	return NULL;
}

void agent_request_free(struct agent_request *req)
{
	free(req->strings);
	free(req->storage);
	memset(req, 0, sizeof(*req));
}
