/* The queued transport half that runs in libdex itself.
 *
 * A transport built on a library that must not be called from signal
 * handlers or foreign threads (UCX) runs that library on one "pump"
 * service thread. Everything else talks to the pump through these rings in
 * private memory: send() (any thread, inside SIGSEGV/SIGSYS handlers too)
 * copies the message into the outbound ring under a futex lock and wakes
 * the pump through an eventfd if it sleeps; receive() (a peer's receiver
 * thread) reads that peer's inbound ring, which only the pump fills.
 *
 * This code lives in libdex.so, not in the transport's module, because
 * Syscall User Dispatch exempts only libdex's own text: a raw system call
 * issued from another object on an application thread would be trapped
 * and delegated. */
#include "internal.h"

#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ rings */

/* A byte ring of variable-length records: [u32 length][u32 peer][bytes],
 * 8-byte aligned; a record that would cross the end is preceded by a wrap
 * marker. head and tail only grow; the consumer owns head, the producer
 * (under a lock when there are several) owns tail. */
/* Seven of the largest messages. Populated when made: a ring's first lap
 * through pages never touched cost a page fault per 4 KiB message, half
 * the time of a remote page fault (measured: 2.5 of 4.7 us in the
 * origin's answer), for as long as a 16 MiB ring took to wrap. */
#define RING_BYTES (2u << 20)
#define RECORD_WRAP UINT32_MAX

struct ring {
	char *bytes;
	uint64_t head, tail;
	uint32_t published; /* futex word: bumped after every put */
	uint32_t closed;    /* inbound: the peer is gone, no more puts */
	uint32_t read_offset; /* inbound: bytes of the head record consumed */
};

struct record {
	uint32_t length;
	uint32_t peer;
};

static uint64_t record_span(uint32_t length)
{
	return sizeof(struct record) + (((uint64_t)length + 7) & ~7ull);
}

static void ring_init(struct ring *r)
{
	r->bytes = (char *)raw_syscall6(SYS_mmap, 0, RING_BYTES, PROT_READ | PROT_WRITE,
					MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if ((long)r->bytes < 0 && (long)r->bytes > -4096)
		dex_fatal("UCX transport: cannot map a message ring");
}

/* Appends one record gathered from iov; false when it does not fit now. */
static bool ring_put(struct ring *r, unsigned peer, const struct iovec *iov, int iovcnt, uint32_t length)
{
	uint64_t head = __atomic_load_n(&r->head, __ATOMIC_ACQUIRE);
	uint64_t tail = r->tail;
	uint64_t at = tail % RING_BYTES, span = record_span(length);
	uint64_t padding = at + span > RING_BYTES ? RING_BYTES - at : 0;
	if (tail + padding + span - head > RING_BYTES)
		return false;
	if (padding) {
		((struct record *)(r->bytes + at))->length = RECORD_WRAP;
		tail += padding;
		at = 0;
	}
	struct record *rec = (struct record *)(r->bytes + at);
	rec->length = length;
	rec->peer = peer;
	char *out = (char *)(rec + 1);
	for (int i = 0; i < iovcnt; i++) {
		memcpy(out, iov[i].iov_base, iov[i].iov_len);
		out += iov[i].iov_len;
	}
	__atomic_store_n(&r->tail, tail + span, __ATOMIC_RELEASE);
	__atomic_add_fetch(&r->published, 1, __ATOMIC_RELEASE);
	return true;
}

/* The oldest record, or NULL when the ring is empty (consumer only). */
static struct record *ring_peek(struct ring *r)
{
	for (;;) {
		uint64_t head = r->head;
		if (head == __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE))
			return NULL;
		uint64_t at = head % RING_BYTES;
		struct record *rec = (struct record *)(r->bytes + at);
		if (rec->length != RECORD_WRAP)
			return rec;
		__atomic_store_n(&r->head, head + (RING_BYTES - at), __ATOMIC_RELEASE);
	}
}

static void ring_pop(struct ring *r, const struct record *rec)
{
	__atomic_store_n(&r->head, r->head + record_span(rec->length), __ATOMIC_RELEASE);
}

/* ------------------------------------------------------------------ state */

static struct {
	int wake_fd;
	uint32_t pump_sleeping;
	struct dex_lock outbound_lock;
	struct ring outbound;
	struct ring inbound[DEX_MAX_NODES];
	bool peer_gone[DEX_MAX_NODES];
	/* A receiver thread that pumps (dex_queue_pumped_by_receiver), and
	 * its round: a send it makes into a full ring pumps instead of
	 * waiting for itself. */
	void (*receiver_round)(void);
	long receiver_tid;
} queue;

bool dex_queue_is_peer(unsigned n)
{
	/* the origin talks to every node, a node only to the origin */
	return n < dex_rt.nodes && n != dex_rt.node && (dex_rt.node == 0 || n == 0);
}

static void wake_pump(void)
{
	uint64_t one = 1;
	raw_syscall(SYS_write, queue.wake_fd, &one, sizeof(one));
}

/* ------------------------------------------------- send/receive (any thread) */

int dex_queue_send(unsigned peer, struct iovec *iov, int iovcnt)
{
	size_t length = 0;
	for (int i = 0; i < iovcnt; i++)
		length += iov[i].iov_len;
	for (;;) {
		if (__atomic_load_n(&queue.peer_gone[peer], __ATOMIC_ACQUIRE)) {
			/* Like a TCP socket whose peer closed: the sender learns of it
			 * only after its receiver has read everything the peer sent
			 * (a SHUTDOWN may still be queued there); until then the
			 * message is silently dropped. */
			return ring_peek(&queue.inbound[peer]) ? 0 : -1;
		}
		dex_lock_acquire(&queue.outbound_lock);
		bool queued = ring_put(&queue.outbound, peer, iov, iovcnt, (uint32_t)length);
		dex_lock_release(&queue.outbound_lock);
		/* Dekker with the pump's sleep: the put is published before we
		 * read pump_sleeping; the pump sets it before its last look. */
		__atomic_thread_fence(__ATOMIC_SEQ_CST);
		if (__atomic_load_n(&queue.pump_sleeping, __ATOMIC_SEQ_CST))
			wake_pump();
		if (queued)
			return 0;
		/* Ring full: the pump is draining it, unless the pump is us. */
		if (queue.receiver_round && raw_syscall(SYS_gettid, 0, 0, 0) == queue.receiver_tid)
			queue.receiver_round();
		else
			raw_syscall(SYS_sched_yield, 0, 0, 0);
	}
}

void dex_queue_pumped_by_receiver(void (*round)(void))
{
	queue.receiver_tid = raw_syscall(SYS_gettid, 0, 0, 0);
	__atomic_store_n(&queue.receiver_round, round, __ATOMIC_RELEASE);
}

/* The receiver's wait while its ring is empty: until the pump publishes
 * into it (or a quarter second passes, for the peer timeout's sake). */
static void wait_for_pump(uint32_t *published, uint32_t seen)
{
	struct timespec tick = { .tv_sec = 0, .tv_nsec = 250000000 };
	raw_syscall6(SYS_futex, (long)published, FUTEX_WAIT | FUTEX_PRIVATE_FLAG, seen, (long)&tick, 0, 0);
}

int dex_queue_receive(unsigned peer, void *buf, size_t len)
{
	return dex_queue_receive_waiting(peer, buf, len, wait_for_pump);
}

int dex_queue_receive_waiting(unsigned peer, void *buf, size_t len, dex_queue_wait_fn wait)
{
	struct ring *r = &queue.inbound[peer];
	char *out = buf;
	size_t got = 0;
	uint64_t waited_since = 0;
	while (got < len) {
		uint32_t seen = __atomic_load_n(&r->published, __ATOMIC_ACQUIRE);
		struct record *rec = ring_peek(r);
		if (!rec) {
			if (__atomic_load_n(&r->closed, __ATOMIC_ACQUIRE) && !ring_peek(r))
				return got ? -1 : 0;
			uint64_t now = dex_now_ns();
			if (!waited_since)
				waited_since = now;
			else if (now - waited_since >= (uint64_t)dex_rt.peer_timeout_s * 1000000000ull)
				return -2;
			wait(&r->published, seen);
			continue;
		}
		waited_since = 0;
		size_t take = rec->length - r->read_offset;
		if (take > len - got)
			take = len - got;
		memcpy(out + got, (char *)(rec + 1) + r->read_offset, take);
		got += take;
		r->read_offset += (uint32_t)take;
		if (r->read_offset == rec->length) {
			r->read_offset = 0;
			ring_pop(r, rec);
			__atomic_thread_fence(__ATOMIC_SEQ_CST);
			if (__atomic_load_n(&queue.pump_sleeping, __ATOMIC_SEQ_CST))
				wake_pump(); /* it may be holding a message for this ring */
		}
	}
	return 1;
}

void dex_queue_flush(void)
{
	/* The SHUTDOWN just queued must reach UCX before the origin exits. */
	uint64_t deadline = dex_now_ns() + 2000000000ull;
	while (__atomic_load_n(&queue.outbound.head, __ATOMIC_ACQUIRE) !=
	       __atomic_load_n(&queue.outbound.tail, __ATOMIC_ACQUIRE) && dex_now_ns() < deadline) {
		wake_pump();
		struct timespec pause = { .tv_sec = 0, .tv_nsec = 100000 };
		raw_syscall(SYS_nanosleep, &pause, 0, 0);
	}
}

void dex_queue_peer_gone(unsigned peer)
{
	__atomic_store_n(&queue.peer_gone[peer], true, __ATOMIC_RELEASE);
	__atomic_store_n(&queue.inbound[peer].closed, 1, __ATOMIC_RELEASE);
	__atomic_add_fetch(&queue.inbound[peer].published, 1, __ATOMIC_RELEASE);
	futex_wake_all(&queue.inbound[peer].published);
}

void dex_queue_init(void)
{
	for (unsigned p = 0; p < dex_rt.nodes; p++)
		if (dex_queue_is_peer(p))
			ring_init(&queue.inbound[p]);
	ring_init(&queue.outbound);
	queue.wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (queue.wake_fd < 0)
		dex_fatal("queued transport: no eventfd");
}

int dex_queue_wake_fd(void)
{
	return queue.wake_fd;
}

bool dex_queue_peer_is_gone(unsigned peer)
{
	return __atomic_load_n(&queue.peer_gone[peer], __ATOMIC_ACQUIRE);
}

const void *dex_queue_next_outbound(unsigned *peer, size_t *length)
{
	struct record *rec = ring_peek(&queue.outbound);
	if (!rec)
		return NULL;
	*peer = rec->peer;
	*length = rec->length;
	return rec + 1;
}

void dex_queue_pop_outbound(void)
{
	ring_pop(&queue.outbound, ring_peek(&queue.outbound));
}

bool dex_queue_deliver(unsigned from, const void *data, size_t length)
{
	struct iovec iov = { (void *)data, length };
	if (!ring_put(&queue.inbound[from], from, &iov, 1, (uint32_t)length))
		return false;
	/* A receiver that pumps is the thread delivering: nobody sleeps on the ring. */
	if (!queue.receiver_round)
		futex_wake_all(&queue.inbound[from].published);
	return true;
}

/* The pump announces it is about to sleep, then looks for work one last
 * time; senders read the flag after publishing (Dekker), so no wake-up is
 * lost. Returns true if the pump may sleep. */
bool dex_queue_pump_may_sleep(void)
{
	__atomic_store_n(&queue.pump_sleeping, 1, __ATOMIC_SEQ_CST);
	if (ring_peek(&queue.outbound)) {
		__atomic_store_n(&queue.pump_sleeping, 0, __ATOMIC_SEQ_CST);
		return false;
	}
	return true;
}

void dex_queue_pump_awake(void)
{
	__atomic_store_n(&queue.pump_sleeping, 0, __ATOMIC_SEQ_CST);
	uint64_t count;
	raw_syscall(SYS_read, queue.wake_fd, &count, sizeof(count));
}
