/* DEX: distributed execution in user space.
 *
 * Link with libdex (see dex/bin/dexcc) and start with `dexrun -n N ./app`.
 * Node 0 is the origin: main() and every thread start there; a thread moves
 * to another node with dex_migrate() and continues there with the same
 * stack, registers and thread-local storage. Globals, the heap and thread
 * stacks stay sequentially consistent across nodes at page granularity;
 * futex, file and exit system calls run at the origin, so pthread
 * synchronisation and printf work from any node. */
#ifndef DEX_H
#define DEX_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Moves the calling thread to `node` and returns there. Returns 0 on
 * success, EINVAL for a node out of range, EBUSY if already on that node,
 * EPERM for a thread libdex does not manage (one not created with
 * pthread_create in a program started by dexrun). */
int dex_migrate(int node);

/* The node the calling thread runs on (0 = origin), and the node count. */
int dex_node(void);
int dex_nodes(void);

/* Page-aligned, page-rounded allocation: objects that never share a page
 * with others, so threads on different nodes do not falsely share. Release
 * with free(). */
void *dex_malloc_aligned(size_t size);

/* Profiler: label the calling thread's subsequent faults with `tag` in the
 * DEX_TRACE record (e.g. a phase or loop number); the tag moves with the
 * thread. */
void dex_trace_tag(unsigned long tag);

/* Popcorn Linux compatibility (popcorn-kernel-lib's migrate.h). */
#define POPCORN_MAX_NODES 32
struct popcorn_node_info {
	unsigned int status; /* 1 when the node is online */
	int arch;
	int distance;
};
int migrate(int nid, void (*callback)(void *), void *arg);
#define popcorn_migrate(nid) migrate((nid), NULL, NULL)
int popcorn_get_node_info(int *current, struct popcorn_node_info *info);
int popcorn_gettid(void);

#ifdef __cplusplus
}
#endif

#endif
