/* Where this process stands in its run, from whichever launcher started it:
 * dexrun (DEX_BOOT: node number, node count, the origin's address and port,
 * the origin's listening socket) or a PMIx launcher such as mpirun, prterun
 * or srun (PMIX_RANK: the rank is the node number and rank 0 the origin,
 * which listens on a port of its own and hands its addresses to the others
 * through PMIx, in libdex-pmix.so). Either way every connection then proves
 * the run's secret, DEX_RUN_SECRET, which the launcher passes to all. */
#include "internal.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

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
	if (boot) {
		from_dexrun(run, boot);
		return true;
	}
	const char *rank = getenv("PMIX_RANK");
	if (!rank || !getenv("PMIX_NAMESPACE"))
		return false;
	/* the node number now, for messages; the count once PMIx answers */
	char *end;
	unsigned long node = strtoul(rank, &end, 10);
	if (end == rank || *end || node >= DEX_MAX_NODES)
		dex_fatal("PMIX_RANK=%s: DEX runs have at most %d processes", rank, DEX_MAX_NODES);
	run->node = (unsigned)node;
	run->pmix = true;
	return true;
}

typedef const char *(*pmix_start_fn)(unsigned *rank, unsigned *size);
typedef int (*pmix_got_fn)(unsigned rank, const void *address, size_t length);
typedef const char *(*pmix_share_fn)(const char *mine, char *origin, size_t origin_len, const void *address,
				     size_t address_length, pmix_got_fn got);
static pmix_share_fn pmix_share;

/* Calls into PMIx as a runtime thread: its threads become runtime threads. */
#define AS_RUNTIME(call)                                                  \
	({                                                                \
		int was_runtime_ = dex_tls_runtime_thread;                \
		dex_tls_runtime_thread = DEX_TRANSPORT_THREAD;            \
		__typeof__(call) result_ = (call);                        \
		dex_tls_runtime_thread = was_runtime_;                    \
		result_;                                                  \
	})

void dex_launch_pmix_start(struct dex_launch *run)
{
	void *module = dex_open_module("libdex-pmix.so");
	pmix_start_fn start = (pmix_start_fn)dlsym(module, "dex_pmix_start");
	pmix_share = (pmix_share_fn)dlsym(module, "dex_pmix_share_origin");
	if (!start || !pmix_share)
		dex_fatal("libdex-pmix.so lacks its entry points");
	unsigned rank, size;
	const char *why = AS_RUNTIME(start(&rank, &size));
	if (why)
		dex_fatal("PMIx: %s", why);
	if (rank != run->node || size == 0 || size > DEX_MAX_NODES)
		dex_fatal("PMIx: rank %u of %u; DEX runs have 1 to %d processes", rank, size, DEX_MAX_NODES);
	run->nodes = size;
}

/* The origin's IPv4 addresses, the loopback one only if there is no other
 * (then the run is on one host), as "PORT ADDRESS...". */
static void describe_origin(char *out, size_t len, unsigned port)
{
	int n = snprintf(out, len, "%u", port), found = 0;
	struct ifaddrs *all;
	if (getifaddrs(&all) == 0) {
		for (struct ifaddrs *i = all; i; i = i->ifa_next) {
			if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) ||
			    (i->ifa_flags & IFF_LOOPBACK) || found == DEX_LAUNCH_ORIGINS)
				continue;
			char text[INET_ADDRSTRLEN];
			inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, text, sizeof(text));
			n += snprintf(out + n, len - (size_t)n, " %s", text);
			found++;
		}
		freeifaddrs(all);
	}
	if (!found)
		snprintf(out + n, len - (size_t)n, " 127.0.0.1");
}

static void parse_origin(struct dex_launch *run, const char *text)
{
	char copy[DEX_LAUNCH_TEXT], *save, *word;
	snprintf(copy, sizeof(copy), "%s", text);
	word = strtok_r(copy, " ", &save);
	char *end;
	unsigned long port = word ? strtoul(word, &end, 10) : 0;
	if (!word || *end || port == 0 || port > 65535)
		dex_fatal("PMIx: rank 0's address '%s' names no port", text);
	run->port = (unsigned)port;
	while ((word = strtok_r(NULL, " ", &save)) && run->norigins < DEX_LAUNCH_ORIGINS) {
		struct in_addr a;
		if (inet_pton(AF_INET, word, &a) != 1)
			dex_fatal("PMIx: rank 0's address '%s' is not IPv4", word);
		run->origin[run->norigins++] = ntohl(a.s_addr);
	}
	if (!run->norigins)
		dex_fatal("PMIx: rank 0 gave no address");
}

void dex_launch_pmix_exchange(struct dex_launch *run)
{
	char mine[DEX_LAUNCH_TEXT], origin[DEX_LAUNCH_TEXT];
	if (run->node == 0) {
		struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY) };
		socklen_t salen = sizeof(sa);
		run->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (run->listen_fd < 0 || bind(run->listen_fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
		    listen(run->listen_fd, DEX_MAX_NODES) != 0 ||
		    getsockname(run->listen_fd, (struct sockaddr *)&sa, &salen) != 0)
			dex_fatal("cannot listen for the nodes");
		describe_origin(mine, sizeof(mine), ntohs(sa.sin_port));
	}
	/* the transport's address too, if it takes one (UCX's worker) */
	const struct dex_transport *transport = dex_selected_transport();
	const void *address = NULL;
	size_t address_length = 0;
	if (transport->local_address && transport->local_address(&address, &address_length) != 0)
		dex_fatal("the %s transport has no address to publish", transport->name);
	const char *why = AS_RUNTIME(pmix_share(run->node == 0 ? mine : NULL, origin, sizeof(origin), address,
						address_length, transport->peer_address));
	if (why)
		dex_fatal("PMIx: exchanging the origin's address: %s", why);
	dex_debug("PMIx: the origin listens at %s", origin);
	if (run->node != 0)
		parse_origin(run, origin);
}
