/* exit() called on a node: the process ends with that status, output
 * printed on the node before it and buffered at the origin is not lost. */
#include <dex.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
	int status = argc > 1 ? atoi(argv[1]) : 0;
	printf("origin line before migrating\n");
	int last = dex_nodes() - 1;
	if (last > 0 && dex_migrate(last) != 0)
		return 99;
	printf("exiting with %d from node %d\n", status, dex_node());
	exit(status);
}
