/* Where this process stands in its run, from the launcher that started it:
 * dexrun's DEX_BOOT gives the node number, the node count, the origin's
 * address and port, and the origin its listening socket. */
#include "internal.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *dex_open_module(const char *file)
{
	Dl_info self;
	char path[4096];
	if (!dladdr((void *)dex_open_module, &self) || !self.dli_fname ||
	    strlen(self.dli_fname) + strlen(file) >= sizeof(path))
		dex_fatal("cannot locate libdex.so to find %s", file);
	strcpy(path, self.dli_fname);
	char *slash = strrchr(path, '/');
	strcpy(slash ? slash + 1 : path, file);
	void *module = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!module)
		dex_fatal("%s unavailable: %s", file, dlerror());
	return module;
}

static void from_dexrun(struct dex_launch *run, const char *boot)
{
	unsigned ip[4];
	if (sscanf(boot, "node=%u,nodes=%u,port=%u,fd=%d,host=%u.%u.%u.%u", &run->node, &run->nodes, &run->port,
		   &run->listen_fd, &ip[0], &ip[1], &ip[2], &ip[3]) != 8 ||
	    run->nodes == 0 || run->nodes > DEX_MAX_NODES || run->node >= run->nodes || run->port > 65535 ||
	    ip[0] > 255 || ip[1] > 255 || ip[2] > 255 || ip[3] > 255)
		dex_fatal("malformed DEX_BOOT=%s", boot);
	run->origin[0] = ip[0] << 24 | ip[1] << 16 | ip[2] << 8 | ip[3];
	run->norigins = 1;
}

bool dex_launch_from_env(struct dex_launch *run)
{
	*run = (struct dex_launch){ .listen_fd = -1 };
	const char *boot = getenv("DEX_BOOT");
	if (!boot)
		return false;
	from_dexrun(run, boot);
	return true;
}
