/* Shared declarations of the libdex runtime (not installed). */
#ifndef DEX_INTERNAL_H
#define DEX_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>
#include <link.h>
#include <ucontext.h>

#include "auth.h"
#include "log.h"
#include "protocol.h"
#include "rawsys.h"

/* The kernel's layout for rt_sigaction (glibc's struct differs). */
#ifndef SA_RESTORER
#define SA_RESTORER 0x04000000
#endif
struct kernel_sigaction {
	void *handler;
	unsigned long flags;
	void *restorer;
	uint64_t mask;
};

#define DEX_MAX_THREADS 1024  /* app threads, numbered by the origin */
#define DEX_MAX_WORKERS 256   /* pooled worker threads per node */
#define DEX_HEAP_BASE 0x600000000000ull

/* Every OS thread the runtime knows gets one 256 KiB-aligned block of local
 * (never shared) memory: this header, a runtime stack used while the app
 * stack belongs to another node, and the signal stack. Signal handlers find
 * the header by masking their stack pointer, so they never touch TLS. */
#define DEX_THREAD_BLOCK (256u * 1024u)
#define DEX_RUNTIME_STACK_OFFSET (4u * 1024u)
#define DEX_SIGNAL_STACK_OFFSET (128u * 1024u)

enum dex_thread_role {
	DEX_ROLE_APP_ORIGIN = 1, /* an application thread's home OS thread */
	DEX_ROLE_WORKER,         /* node thread that runs migrated contexts */
	DEX_ROLE_SERVICE,        /* receivers and other runtime threads */
};

enum { DEX_DEPARTED = 2 }; /* pool context resumed because the app left */

struct dex_mailbox {
	uint32_t ready; /* futex word: 1 when a message waits */
	uint32_t sleeping; /* the owner waits in the futex: a post wakes it */
	uint16_t type;
	uint16_t from;
	uint32_t length;
	char *payload; /* DEX_MAX_PAYLOAD bytes of local memory */
};

/* A run of pages a thread faults through in order (prefetch, dsm.c). */
struct dex_fault_stream {
	uint32_t next_page; /* the page after the last one requested */
	uint8_t window;     /* extra pages asked for last time */
	uint8_t write;
	uint32_t last_use;  /* the thread's stream_clock when last continued */
};
#define DEX_FAULT_STREAMS 8

struct dex_thread {
	uint32_t role;
	uint32_t thread_id;   /* app thread currently running here */
	uint32_t worker;      /* node-local worker index */
	uint32_t migrate_target;
	/* Syscall User Dispatch selector: the kernel reads it on every system
	 * call, so it must live in local memory, not in the app's TLS. */
	volatile char sud_selector;
	uint64_t own_fs_base;
	int32_t os_tid;       /* the kernel's id of this OS thread */
	uint64_t departed_ns;
	uint64_t trace_tag;   /* of the app thread running here */
	struct dex_context app_context;
	struct dex_context pool_context;
	struct dex_mailbox mail;
	struct dex_fault_stream streams[DEX_FAULT_STREAMS];
	uint32_t stream_clock; /* a new stream replaces the least recently used */
	char *scratch; /* DEX_MAX_PAYLOAD bytes for building messages */
	/* Origin: the application's CPU mask of this home thread while the
	 * receiver has it narrowed for a wake-up (migrate.c); 0 bytes when not. */
	uint64_t app_affinity[16];
	uint32_t app_affinity_bytes;
	/* Retired blocks are reused only after their OS thread is gone: the
	 * kernel clears exit_word (CLONE_CHILD_CLEARTID-style, through
	 * set_tid_address) when that thread has exited. */
	uint32_t exit_word;
	struct dex_thread *next_retired;
};

struct dsm_region {
	uintptr_t start, end; /* app view, page aligned */
	char *alias;          /* always-writable view of the same memory */
	uint32_t first_page;  /* global page index of start */
	int fd;               /* the memfd behind both views */
};

struct dex_peer {
	int fd;
	struct dex_lock send_lock;
	uint32_t sequence;
	uint64_t last_data_ns; /* the receiver's last read that returned bytes (polling) */
	uint8_t session[DEX_AUTH_BYTES]; /* the connection's session key (auth.h) */
};

/* The seam between the runtime and a wire. The runtime frames, validates
 * and orders messages itself; a transport only moves bytes between the
 * origin and a node, reliably and in order. Contract (see README):
 *   connect  once, on the process's main thread, after the TCP bootstrap
 *            (HELLO/WELCOME) has filled dex_rt.peers[].fd; 0 or -1;
 *   send     any thread, also inside SIGSEGV/SIGSYS handlers on threads
 *            whose TLS may be a missing shared page, with the peer's
 *            send_lock held: only raw system calls, no malloc, no TLS;
 *            the whole message (iov) or -1 if the peer is gone;
 *   receive  the peer's receiver thread only: len bytes, returning 1, 0 at
 *            orderly end, -1 on error, -2 after peer_timeout_s of silence;
 *   flush    returns when every message sent so far has left this process
 *            (called before the origin exits). */
struct dex_transport {
	const char *name;
	int (*connect)(void);
	int (*send)(unsigned peer, struct iovec *iov, int iovcnt);
	int (*receive)(unsigned peer, void *buf, size_t len);
	void (*flush)(void);
	/* Optional, for a launcher that carries addresses (PMIx), on the main
	 * thread before connect: this process's transport address (the
	 * transport keeps it until connect), and a peer's, which connect then
	 * uses instead of exchanging addresses itself. */
	int (*local_address)(const void **address, size_t *length);
	int (*peer_address)(unsigned peer, const void *address, size_t length);
};
extern const struct dex_transport *dex_transport;
/* Entry point of build/libdex-ucx.so, loaded with dlopen when
 * DEX_TRANSPORT=ucx so that TCP runs never load UCX. */
typedef const struct dex_transport *(*dex_transport_open_fn)(void);

/* transport_queue.c: rings between the runtime's threads and a transport's
 * single pump thread (used by the UCX transport). */
int dex_queue_send(unsigned peer, struct iovec *iov, int iovcnt);
int dex_queue_receive(unsigned peer, void *buf, size_t len);
/* dex_queue_receive with another wait while the ring is empty: `wait` is
 * called with the ring's futex word and the value seen, and returns when
 * there may be more (at least every quarter second: the peer timeout). */
typedef void (*dex_queue_wait_fn)(uint32_t *published, uint32_t seen);
int dex_queue_receive_waiting(unsigned peer, void *buf, size_t len, dex_queue_wait_fn wait);
void dex_queue_flush(void);
void dex_queue_init(void);
bool dex_queue_is_peer(unsigned n);
int dex_queue_wake_fd(void);
void dex_queue_peer_gone(unsigned peer);
bool dex_queue_peer_is_gone(unsigned peer);
const void *dex_queue_next_outbound(unsigned *peer, size_t *length);
void dex_queue_pop_outbound(void);
bool dex_queue_deliver(unsigned from, const void *data, size_t length);
bool dex_queue_pump_may_sleep(void);
/* The calling receiver thread pumps (the transport has no pump thread):
 * `round` is one round of its pump, run by its own sends into a full ring. */
void dex_queue_pumped_by_receiver(void (*round)(void));
void dex_queue_pump_awake(void);

struct dex_runtime {
	bool active;   /* running under dexrun with more than one node */
	unsigned node; /* this process */
	unsigned nodes;
	struct dex_peer peers[DEX_MAX_NODES]; /* origin: all nodes; node: [0] */
	struct dsm_region regions[2];
	unsigned nregions;
	struct dex_region_bounds bounds[2];
	uint32_t total_pages;
	uint8_t *page_state;
	uint8_t *page_inflight;
	uint32_t dsm_epoch; /* futex word bumped by every grant */
	struct dex_lock dsm_lock;
	struct dsm_dir dir; /* origin only */
	uintptr_t text_start, text_end; /* libdex code: exempt from dispatch */
	struct dex_thread *threads[DEX_MAX_THREADS];  /* origin: by thread id */
	uint8_t thread_location[DEX_MAX_THREADS];      /* origin: node running it */
	uint32_t next_thread_id;
	uint32_t free_thread_ids[DEX_MAX_THREADS];
	uint32_t nfree_thread_ids;
	struct dex_lock thread_ids_lock;
	struct dex_thread *retired_blocks;
	struct dex_lock blocks_lock;
	struct dex_thread *workers[DEX_MAX_WORKERS];   /* node: by index */
	uint32_t worker_idle[DEX_MAX_WORKERS];
	uint32_t nworkers;
	struct dex_lock workers_lock;
	int shutting_down;
	unsigned spin_iterations;
	uint64_t receive_poll_ns; /* DEX_POLL_US: receivers poll this long after data */
	uint64_t grant_hold_ns; /* DEX_GRANT_HOLD_US: longest hold of a fresh grant */
	uint64_t fault_timeout_ns; /* DEX_FAULT_TIMEOUT seconds, default 30 */
	unsigned peer_timeout_s;   /* DEX_PEER_TIMEOUT: silence that means a peer is gone */
	long tid_offset; /* offset of tid in glibc's struct pthread */
	/* counters, printed at exit with DEX_STATS=1 */
	uint64_t faults_read, faults_write, pages_received, invalidations_served, syscalls_delegated;
	uint64_t pages_prefetched;
	uint64_t readahead_markers; /* next windows asked for at a marker */
	uint64_t migrations_in, migration_ns_total, workers_created;
	uint64_t layout_queries, layout_revokes; /* vma.c */
};

extern struct dex_runtime dex_rt;
/* 0 on application threads; 1 on runtime threads (malloc stays local);
 * DEX_TRANSPORT_THREAD while a transport's library runs (connect, the UCX
 * pump): threads it creates become runtime threads too. */
extern __thread int dex_tls_runtime_thread;
#define DEX_TRANSPORT_THREAD 2

/* launch.c: this process's place in its run, from dexrun or PMIx */
#define DEX_LAUNCH_ORIGINS 8 /* addresses of the origin a node tries */
#define DEX_LAUNCH_TEXT 160  /* room for them as text */
struct dex_launch {
	unsigned node, nodes;
	int listen_fd; /* the origin's; -1 elsewhere */
	unsigned port;
	unsigned norigins;
	uint32_t origin[DEX_LAUNCH_ORIGINS]; /* host byte order */
	bool pmix;
};
/* false if no launcher started this process as part of a run */
bool dex_launch_from_env(struct dex_launch *run);
void dex_launch_pmix_start(struct dex_launch *run);
void dex_launch_pmix_exchange(struct dex_launch *run);
/* dlopen of a module installed beside libdex (libdex-ucx.so, libdex-pmix.so) */
void *dex_open_module(const char *file);

/* startup.c: the constructor, joining the run, and the settings */
uint64_t dex_now_ns(void);
/* The environment variable `name` as a whole number up to `max`, or
 * `fallback` when unset; anything else stops the run naming it. */
uint64_t dex_env_number(const char *name, uint64_t fallback, uint64_t max);

/* transport_tcp.c: the TCP transport, choosing a transport, framing */
void dex_select_transport(void);
/* The transport dex_connect_selected_transport will connect. */
const struct dex_transport *dex_selected_transport(void);
void dex_connect_selected_transport(void);
/* Sends a message whose data is gathered from `ndata` buffers. */
int dex_sendv(unsigned peer, enum dex_msg_type type, const void *fixed, size_t fixed_len,
	      const struct iovec *data, int ndata);
int dex_send(unsigned peer, enum dex_msg_type type, const void *fixed, size_t fixed_len, const void *data,
	     size_t data_len);
/* Reads one validated message from `peer`: 1, 0 at its orderly end, or
 * below 0 (the transport's codes); malformed input stops the run. */
int dex_receive_message(unsigned peer, struct dex_msg_header *h, char *payload);
struct dex_validation_limits dex_limits(void);

/* thread_blocks.c: per-thread blocks, mailboxes, service threads, stats */
struct dex_thread *dex_thread_block_alloc(enum dex_thread_role role);
struct dex_thread *dex_thread_create_block(enum dex_thread_role role);
void dex_thread_retire_block(struct dex_thread *t);
struct dex_thread *dex_self(void);
struct dex_thread *dex_self_in_handler(const ucontext_t *uc);
char *dex_receive_buffer(void);
bool dex_changed_while_polling(const uint32_t *word, uint32_t seen, uint64_t since_ns, uintptr_t alias);
void dex_mail_wait(struct dex_thread *t);
void dex_mail_post(struct dex_thread *t, const struct dex_msg_header *h, const void *payload);
void dex_start_service_thread(void *(*fn)(void *), void *arg);
void dex_note_arrival(uint64_t sent_ns);
void dex_print_stats(void);

/* dsm.c: page tables, the fault path, applying the directory's actions */
void dex_dsm_tables_init(void);
bool dex_in_shared(uintptr_t addr);
int64_t dex_page_index(uintptr_t addr);
char *dex_page_alias(uint32_t page);
void dex_node_handle_grant(const struct dex_msg_page_grant *m);
void dex_node_handle_prefetch(const struct dex_msg_page_prefetch *m);
void dex_node_handle_invalidate(const struct dex_msg_invalidate *m);
void dex_origin_handle_page_request(unsigned peer, const struct dex_msg_page_request *m);
void dex_origin_handle_invalidate_ack(unsigned peer, const struct dex_msg_invalidate_ack *m);
void dex_install_signal_handlers(void);
void dex_prefault(uintptr_t addr, size_t len, bool write);
void dex_dsm_fetch_ahead(uintptr_t addr, size_t len, bool write);
void dex_dsm_send_migrate_home(struct dex_msg_migrate *m, uintptr_t addr, size_t len);
void dex_dsm_accept_carried(unsigned from, const struct dex_msg_migrate *m);
void dex_dsm_reprotect(uintptr_t page_addr);
char *dex_dsm_alias_of(uintptr_t addr);

/* receivers.c: the receive loops, the pinger, shutting a run down */
void dex_node_receive_loop(void);
void *dex_origin_receive_loop(void *peer);
void *dex_origin_pinger(void *arg);
void dex_set_receive_timeout(int fd);
void dex_origin_shutdown_nodes(int status);

/* regions.c: the shared regions and libdex's own code */
void dex_setup_regions(void);
int dex_find_own_text(struct dl_phdr_info *info, size_t size, void *arg);

/* migrate.c */
int dex_context_save(struct dex_context *c) __attribute__((returns_twice));
void dex_context_resume(const struct dex_context *c, int value) __attribute__((noreturn));
void dex_call_on_stack(void *stack_top, void (*fn)(void *), void *arg) __attribute__((noreturn));
void dex_sigreturn_trampoline(void);
uint64_t dex_get_fs_base(void);
void dex_set_fs_base(uint64_t fs);
void dex_node_handle_migrate(const struct dex_msg_header *h, const struct dex_msg_migrate *m);
void dex_node_start_workers(void);
void dex_origin_handle_migrate(const struct dex_msg_header *h, const struct dex_msg_migrate *m);

/* syscall.c */
void dex_arm_dispatch(struct dex_thread *t);
void dex_sigsys_handler(int sig, void *info, void *ucontext);
void dex_deliver_app_sigsegv(void *siginfo, void *ucontext, int code);
void dex_origin_run_delegated(struct dex_thread *t, unsigned from, const struct dex_msg_syscall *m);
void dex_thread_exit_here(long code) __attribute__((noreturn));
void dex_process_exit_here(long code) __attribute__((noreturn));
long dex_delegate_call(long nr, long a[6]);
long dex_ask_origin_rights(uintptr_t page);

/* trace.c: the fault profiler (DEX_TRACE=file) */
enum dex_trace_kind {
	DEX_TRACE_READ = 'R',            /* this fault sent the request */
	DEX_TRACE_WRITE = 'W',
	DEX_TRACE_READ_COALESCED = 'r',  /* resolved by another thread's request */
	DEX_TRACE_WRITE_COALESCED = 'w',
	DEX_TRACE_INVALIDATE = 'I',      /* an invalidation served for the origin */
};
void dex_trace_init(void);
void dex_trace_record(enum dex_trace_kind kind, uint32_t thread, uint64_t tag, uint64_t ip, uint64_t addr,
		      uint64_t start_ns, uint64_t end_ns);
void dex_trace_flush(void);
extern bool dex_tracing;

/* alloc.c */
void dex_heap_init_origin(void);
void dex_heap_populate(uintptr_t start, size_t bytes);
void *dex_heap_alloc_pages(size_t bytes);
void dex_heap_free_pages(void *p, size_t bytes);
struct dex_app_segv_action {
	void *handler;
	unsigned long flags;
};
struct dex_app_segv_action *dex_heap_app_segv_action(void);

/* vma.c: the layout of the mapped area (mmap, munmap, mprotect, mremap, brk) */
#define DEX_VMA_QUERY_CALL 0x7fff0001L /* pseudo system call: a node asks the origin for rights */
void dex_vma_init(void);
uintptr_t dex_vma_area_start(void);
enum dsm_access dex_vma_cap(uintptr_t page_addr);
bool dex_vma_allows(uintptr_t addr, bool write);
bool dex_vma_is_mapped(uintptr_t addr);
bool dex_vma_allows_range(uintptr_t addr, size_t len, bool write);
bool dex_vma_is_layout_call(long nr, const long a[6]);
bool dex_vma_origin_call(long nr, const long a[6], long *ret);
long dex_vma_brk(uintptr_t wanted);
void dex_vma_node_revoke(const struct dex_msg_vma_revoke *m);
void dex_vma_origin_revoke_ack(unsigned from, const struct dex_msg_vma_revoke_ack *m);

/* barrier.c: pthread barriers run at the origin */
#define DEX_BARRIER_CALL 0x7fff0002L /* pseudo system call: a node's thread waits at a barrier */
void dex_barriers_init(void);
long dex_origin_barrier_call(const long a[6]);

/* threads.c */
uint32_t dex_thread_id_alloc(void);
void dex_thread_id_free(uint32_t id);
void dex_threads_init(void);
int dex_real_pthread_create(void *thread, const void *attr, void *(*fn)(void *), void *arg);

#endif
