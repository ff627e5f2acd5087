/* Smallest end-to-end check: a thread visits every node, reads and writes a
 * global and a heap object there, prints from there, and comes home. */
#include <dex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long visits;
static char greeting[64] = "written at the origin";

int main(void)
{
	long *heap_counter = malloc(sizeof(*heap_counter));
	*heap_counter = 100;
	int on_stack = 7;
	for (int node = 1; node < dex_nodes(); node++) {
		int rc = dex_migrate(node);
		if (rc != 0 || dex_node() != node) {
			printf("migrate to %d failed: rc %d, now on %d\n", node, rc, dex_node());
			return 1;
		}
		visits++;
		(*heap_counter)++;
		on_stack += node;
		printf("node %d sees greeting '%s', visits %ld\n", dex_node(), greeting, visits);
		snprintf(greeting, sizeof(greeting), "written on node %d", node);
		if (dex_migrate(0) != 0 || dex_node() != 0) {
			printf("migrate back failed\n");
			return 1;
		}
	}
	int expect_stack = 7;
	for (int node = 1; node < dex_nodes(); node++)
		expect_stack += node;
	printf("back on node %d: visits %ld heap %ld stack %d greeting '%s'\n", dex_node(), visits, *heap_counter,
	       on_stack, greeting);
	int ok = visits == dex_nodes() - 1 && *heap_counter == 100 + visits && on_stack == expect_stack;
	free(heap_counter);
	return ok ? 0 : 3;
}
