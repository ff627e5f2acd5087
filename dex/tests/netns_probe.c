/* Reports how many distinct network namespaces the nodes run in: 1 under
 * plain dexrun, N under dexrun --netns. readlink is not delegated, so on a
 * node it names that node's namespace. */
#include <dex.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(void)
{
	char seen[32][64];
	int distinct = 0;
	for (int node = 0; node < dex_nodes(); node++) {
		if (node != 0)
			dex_migrate(node);
		char ns[64] = "";
		if (readlink("/proc/self/ns/net", ns, sizeof(ns) - 1) < 0)
			return 1;
		int known = 0;
		for (int i = 0; i < distinct; i++)
			known |= !strcmp(seen[i], ns);
		if (!known)
			strcpy(seen[distinct++], ns);
		if (node != 0)
			dex_migrate(0);
	}
	printf("network namespaces: %d distinct for %d nodes\n", distinct, dex_nodes());
	return 0;
}
