/* libFuzzer target: dexnode's start request parser (node_agent_request.c),
 * which reads the body an authenticated dexrun sends. Every string it
 * returns must be readable and NUL-terminated, argv and envp
 * NULL-terminated, and the run id inside the body's environment. */
#include <string.h>

#include "../src/node_agent_wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct agent_request req;
	if (agent_parse_request(data, size, &req) != NULL)
		return 0;
	/* the run id lies inside its environment entry: not counted twice */
	size_t total = strlen(req.cwd);
	for (char **a = req.argv; *a; a++)
		total += strlen(*a);
	for (char **e = req.envp; *e; e++)
		total += strlen(*e);
	if (total > size || strlen(req.run_id) != DEX_AUTH_HEX)
		abort();
	agent_request_free(&req);
	return 0;
}
