/* Starting a node from a start request (node_agent_wire.h), shared by the
 * dexnode agent and `dexrun --node-stdin`, which ssh runs on each host of
 * `dexrun --hosts`: read the request, then become the node. */
#include "log.h"
#include "node_agent_wire.h"

#include <stdio.h>
#include <sys/personality.h>

const char *agent_read_request(int fd, struct agent_request *req)
{
	char magic[8];
	uint32_t size;
	if (dex_read_all(fd, magic, sizeof(magic)) || dex_read_all(fd, &size, sizeof(size)))
		return "no start request";
	if (memcmp(magic, AGENT_MAGIC, 8) != 0)
		return "not a start request (dexrun of another version?)";
	if (size > AGENT_MAX_REQUEST)
		return "request too large";
	uint8_t *body = malloc(size ? size : 1);
	const char *why = !body || dex_read_all(fd, body, size) ? "truncated start request"
								   : agent_parse_request(body, size, req);
	free(body); /* the request holds copies of the strings */
	return why;
}

void agent_exec_request(const struct agent_request *req)
{
	if (personality(ADDR_NO_RANDOMIZE) < 0 || chdir(req->cwd) != 0) {
		dex_error("cannot enter %s with ASLR off: %s", req->cwd, strerror(errno));
		_exit(127);
	}
	/* PATH from the request, as dexrun's own execvp would search it */
	for (char **e = req->envp; *e; e++)
		if (!strncmp(*e, "PATH=", 5))
			setenv("PATH", *e + 5, 1);
	execvpe(req->argv[0], req->argv, req->envp);
	dex_error("cannot run %s in %s: %s", req->argv[0], req->cwd, strerror(errno));
	_exit(127);
}
