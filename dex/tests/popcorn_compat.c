/* A program written against Popcorn's <migrate.h>: query the nodes, hop to
 * node 1 with a callback, come back; the Popcorn error codes hold. */
#include <errno.h>
#include <migrate.h>
#include <stdio.h>

static int callback_node = -1;

static void on_arrival(void *arg)
{
	*(int *)arg = dex_node();
}

int main(void)
{
	int current;
	struct popcorn_node_info info[POPCORN_MAX_NODES];
	popcorn_get_node_info(&current, info);
	int online = 0;
	for (int i = 0; i < POPCORN_MAX_NODES; i++)
		online += info[i].status == 1;
	int tid_before = popcorn_gettid();
	int rc_bad = migrate(POPCORN_MAX_NODES + 3, NULL, NULL);
	int rc_here = popcorn_migrate(current);
	int rc_go = migrate(1, on_arrival, &callback_node);
	int tid_there = popcorn_gettid();
	int rc_back = popcorn_migrate(0);
	int ok = current == 0 && online == dex_nodes() && rc_bad == EINVAL && rc_here == EBUSY && rc_go == 0 &&
		 callback_node == 1 && rc_back == 0 && tid_there == tid_before;
	printf("%s popcorn: online %d, EINVAL %d, EBUSY %d, callback on node %d, tid kept %d\n", ok ? "PASS" : "FAIL",
	       online, rc_bad == EINVAL, rc_here == EBUSY, callback_node, tid_there == tid_before);
	return !ok;
}
