/* Application threads under DEX.
 *
 * pthread_create is interposed so that every application thread gets its
 * stack (and with it glibc's thread descriptor and static TLS, which glibc
 * carves from the top of a caller-provided stack) in the shared heap: those
 * pages then follow the thread to any node. main() itself runs on such a
 * thread (dex_run_main). Calls that edit glibc's process-wide lists
 * (create, join, exit) are made at the origin. */
#include "internal.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../include/dex.h"

#define DEFAULT_STACK_BYTES (2u << 20)
#define MAIN_STACK_BYTES (8u << 20)
#define DESCRIPTOR_PREFAULT_BYTES (64u << 10)

static int (*real_pthread_create)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
static int (*real_pthread_join)(pthread_t, void **);
static void (*real_pthread_exit)(void *) __attribute__((noreturn));
static void (*real_exit)(int) __attribute__((noreturn));

struct shared_stack {
	uintptr_t base;
	size_t size;
};
static struct shared_stack stacks[DEX_MAX_THREADS];
static struct dex_lock stacks_lock;

void dex_threads_init(void)
{
	real_pthread_create = dlsym(RTLD_NEXT, "pthread_create");
	real_pthread_join = dlsym(RTLD_NEXT, "pthread_join");
	real_pthread_exit = dlsym(RTLD_NEXT, "pthread_exit");
	real_exit = dlsym(RTLD_NEXT, "exit");
	if (!real_pthread_create || !real_pthread_join || !real_pthread_exit || !real_exit)
		dex_fatal("cannot find libc's pthread functions");
}

int dex_real_pthread_create(void *thread, const void *attr, void *(*fn)(void *), void *arg)
{
	return real_pthread_create(thread, attr, fn, arg);
}

struct start_info {
	void *(*fn)(void *);
	void *arg;
};

static void *start_app_thread(void *p)
{
	struct start_info start = *(struct start_info *)p;
	free(p);
	struct dex_thread *t = dex_thread_create_block(DEX_ROLE_APP_ORIGIN);
	uint32_t id = dex_thread_id_alloc();
	t->thread_id = id;
	dex_rt.thread_location[id] = 0;
	__atomic_store_n(&dex_rt.threads[id], t, __ATOMIC_RELEASE);
	t->sud_selector = 1;
	dex_arm_dispatch(t);
	void *result = start.fn(start.arg);
	if (dex_rt.node != 0)
		dex_migrate(0);
	return result;
}

/* Thread ids name a thread in messages; ids of exited threads are reused. */
uint32_t dex_thread_id_alloc(void)
{
	uint32_t id;
	dex_lock_acquire(&dex_rt.thread_ids_lock);
	if (dex_rt.nfree_thread_ids)
		id = dex_rt.free_thread_ids[--dex_rt.nfree_thread_ids];
	else
		id = dex_rt.next_thread_id++;
	dex_lock_release(&dex_rt.thread_ids_lock);
	if (id >= DEX_MAX_THREADS)
		dex_fatal("more than %d threads alive", DEX_MAX_THREADS);
	return id;
}

void dex_thread_id_free(uint32_t id)
{
	dex_lock_acquire(&dex_rt.thread_ids_lock);
	dex_rt.free_thread_ids[dex_rt.nfree_thread_ids++] = id;
	dex_lock_release(&dex_rt.thread_ids_lock);
}

static void remember_stack(uintptr_t base, size_t size)
{
	dex_lock_acquire(&stacks_lock);
	for (int i = 0; i < DEX_MAX_THREADS; i++) {
		if (!stacks[i].base) {
			stacks[i] = (struct shared_stack){ base, size };
			break;
		}
	}
	dex_lock_release(&stacks_lock);
}

static void release_stack_of(pthread_t thread)
{
	uintptr_t descriptor = (uintptr_t)thread;
	struct shared_stack found = { 0, 0 };
	dex_lock_acquire(&stacks_lock);
	for (int i = 0; i < DEX_MAX_THREADS; i++) {
		if (stacks[i].base && descriptor >= stacks[i].base && descriptor < stacks[i].base + stacks[i].size) {
			found = stacks[i];
			stacks[i].base = 0;
			break;
		}
	}
	dex_lock_release(&stacks_lock);
	if (found.base)
		dex_heap_free_pages((void *)found.base, found.size);
}

/* Runs `call` at the origin: hop there and back if needed. */
#define AT_ORIGIN(call)                                                                                            \
	do {                                                                                                       \
		int home_ = dex_node();                                                                            \
		if (home_ != 0)                                                                                    \
			dex_migrate(0);                                                                            \
		call;                                                                                              \
		if (home_ != 0)                                                                                    \
			dex_migrate(home_);                                                                        \
	} while (0)

static int create_with_shared_stack(pthread_t *thread, const pthread_attr_t *attr, void *(*fn)(void *), void *arg,
				    size_t default_size)
{
	size_t size = default_size;
	int detach = PTHREAD_CREATE_JOINABLE;
	if (attr) {
		void *given;
		size_t given_size;
		if (pthread_attr_getstack(attr, &given, &given_size) == 0 && given)
			return real_pthread_create(thread, attr, fn, arg); /* the caller chose its stack */
		pthread_attr_getstacksize(attr, &size);
		pthread_attr_getdetachstate(attr, &detach);
	}
	size = (size + DEX_PAGE_SIZE - 1) & ~(size_t)(DEX_PAGE_SIZE - 1);
	char *stack = dex_heap_alloc_pages(size);
	if (!stack)
		return EAGAIN;
	struct start_info *start = malloc(sizeof(*start));
	if (!start) {
		dex_heap_free_pages(stack, size);
		return EAGAIN;
	}
	*start = (struct start_info){ fn, arg };
	pthread_attr_t shared;
	pthread_attr_init(&shared);
	pthread_attr_setdetachstate(&shared, detach);
	pthread_attr_setstack(&shared, stack, size);

	/* clone() writes the new thread's id into its descriptor from kernel
	 * mode, so the descriptor's pages must be writable here first. */
	dex_prefault((uintptr_t)stack + size - DESCRIPTOR_PREFAULT_BYTES, DESCRIPTOR_PREFAULT_BYTES, true);
	struct dex_thread *self = dex_self();
	char selector = self ? self->sud_selector : 0;
	int was_runtime = dex_tls_runtime_thread;
	/* clone cannot be run from a signal handler: let glibc issue it. */
	if (self)
		self->sud_selector = 0;
	dex_tls_runtime_thread = 1;
	int rc = real_pthread_create(thread, &shared, start_app_thread, start);
	dex_tls_runtime_thread = was_runtime;
	if (self)
		self->sud_selector = selector;
	pthread_attr_destroy(&shared);
	if (rc) {
		free(start);
		dex_heap_free_pages(stack, size);
		return rc;
	}
	if (detach == PTHREAD_CREATE_JOINABLE)
		remember_stack((uintptr_t)stack, size);
	return 0;
}

/* Threads a library (UCX, PMIx) creates for itself are runtime
 * threads: local stack and local malloc, never migrated. */
static void *start_transport_thread(void *p)
{
	struct start_info start = *(struct start_info *)p;
	free(p);
	dex_tls_runtime_thread = 1;
	return start.fn(start.arg);
}

int pthread_create(pthread_t *thread, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
	/* a library's thread (UCX, PMIx) is a runtime thread even when made
	 * before the run is active (PMIx starts before the layout is set up) */
	if (dex_tls_runtime_thread == DEX_TRANSPORT_THREAD) {
		struct start_info *start = malloc(sizeof(*start));
		if (!start)
			return EAGAIN;
		*start = (struct start_info){ fn, arg };
		int rc = real_pthread_create(thread, attr, start_transport_thread, start);
		if (rc)
			free(start);
		return rc;
	}
	if (!dex_rt.active)
		return real_pthread_create(thread, attr, fn, arg);
	int rc;
	AT_ORIGIN(rc = create_with_shared_stack(thread, attr, fn, arg, DEFAULT_STACK_BYTES));
	return rc;
}

int pthread_join(pthread_t thread, void **result)
{
	if (!dex_rt.active)
		return real_pthread_join(thread, result);
	int rc;
	AT_ORIGIN(rc = real_pthread_join(thread, result));
	if (rc == 0)
		release_stack_of(thread);
	return rc;
}

void pthread_exit(void *result)
{
	if (dex_rt.active && dex_node() != 0)
		dex_migrate(0);
	real_pthread_exit(result);
}

void exit(int status)
{
	/* atexit handlers and stdio buffers are the origin's. */
	if (dex_rt.active && dex_node() != 0)
		dex_migrate(0);
	if (dex_rt.active)
		dex_origin_shutdown_nodes(status);
	real_exit(status);
}

struct main_call {
	int (*main_fn)(int, char **, char **);
	int argc;
	char **argv;
	char **envp;
	int status;
};

static void *run_main(void *p)
{
	/* `call` is in libdex's own (per-process) memory: touch it at home. */
	struct main_call *call = p;
	int status = call->main_fn(call->argc, call->argv, call->envp);
	if (dex_node() != 0)
		dex_migrate(0);
	call->status = status;
	return NULL;
}

/* Called by the application's wrapped main (dex_start.o). */
int dex_run_main(int (*main_fn)(int, char **, char **), int argc, char **argv, char **envp)
{
	if (!dex_rt.active)
		return main_fn(argc, argv, envp);
	static struct main_call call;
	call = (struct main_call){ main_fn, argc, argv, envp, 0 };
	pthread_t thread;
	int rc;
	AT_ORIGIN(rc = create_with_shared_stack(&thread, NULL, run_main, &call, MAIN_STACK_BYTES));
	if (rc)
		dex_fatal("cannot start main on a migratable thread (%d)", rc);
	pthread_join(thread, NULL);
	dex_origin_shutdown_nodes(call.status);
	return call.status;
}
