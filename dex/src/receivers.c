/* libdex receivers: the loops that read each peer's messages and act on
 * them (a node's one loop, the origin's one per node), the origin's pinger,
 * and the orderly shutdown of a run. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

void dex_node_receive_loop(void)
{
	char *payload = dex_receive_buffer();
	struct dex_msg_header h;
	for (;;) {
		int rc = dex_receive_message(0, &h, payload);
		if (rc <= 0) {
			if (dex_rt.shutting_down) {
				dex_trace_flush();
				dex_print_stats();
				raw_syscall(SYS_exit_group, 0, 0, 0);
			}
			if (rc == -2)
				dex_fatal("the origin sent nothing for %u s (stopped or unreachable); stopping",
					  dex_rt.peer_timeout_s);
			dex_fatal("lost connection to the origin (origin exited or was killed); stopping");
		}
		switch (h.type) {
		case DEX_MSG_PAGE_GRANT:
			dex_node_handle_grant((const void *)payload);
			break;
		case DEX_MSG_PAGE_PREFETCH:
			dex_node_handle_prefetch((const void *)payload);
			break;
		case DEX_MSG_INVALIDATE:
			dex_node_handle_invalidate((const void *)payload);
			break;
		case DEX_MSG_MIGRATE:
			dex_node_handle_migrate(&h, (const void *)payload);
			break;
		case DEX_MSG_SYSCALL_REPLY: {
			const struct dex_msg_syscall_reply *m = (const void *)payload;
			if (m->worker >= dex_rt.nworkers)
				dex_fatal("rejected SYSCALL_REPLY for unknown worker %u", m->worker);
			dex_mail_post(dex_rt.workers[m->worker], &h, payload);
			break;
		}
		case DEX_MSG_PING:
			dex_send(0, DEX_MSG_PONG, NULL, 0, NULL, 0);
			break;
		case DEX_MSG_VMA_REVOKE:
			dex_vma_node_revoke((const void *)payload);
			break;
		case DEX_MSG_SHUTDOWN:
			/* The origin is finishing but may still read pages we
			 * hold (exit handlers, stdio): keep serving until its
			 * connection closes, then leave quietly. */
			dex_rt.shutting_down = 1;
			break;
		default:
			dex_fatal("rejected unexpected %s from the origin", dex_msg_type_name(h.type));
		}
	}
}

void *dex_origin_receive_loop(void *arg)
{
	unsigned peer = (unsigned)(uintptr_t)arg;
	dex_tls_runtime_thread = 1;
	dex_thread_create_block(DEX_ROLE_SERVICE);
	char *payload = dex_receive_buffer();
	struct dex_msg_header h;
	for (;;) {
		int rc = dex_receive_message(peer, &h, payload);
		if (rc <= 0) {
			if (dex_rt.shutting_down)
				return NULL;
			if (rc == -2)
				dex_fatal("node %u sent nothing for %u s (stopped or unreachable); stopping all nodes",
					  peer, dex_rt.peer_timeout_s);
			dex_fatal("node %u disconnected (%s); stopping all nodes", peer,
				  rc == 0 ? "connection closed: node exited or was killed" : "connection error");
		}
		switch (h.type) {
		case DEX_MSG_PONG:
			break;
		case DEX_MSG_VMA_REVOKE_ACK:
			dex_vma_origin_revoke_ack(peer, (const void *)payload);
			break;
		case DEX_MSG_PAGE_REQUEST:
			dex_origin_handle_page_request(peer, (const void *)payload);
			break;
		case DEX_MSG_INVALIDATE_ACK:
			dex_origin_handle_invalidate_ack(peer, (const void *)payload);
			break;
		case DEX_MSG_MIGRATE:
			dex_origin_handle_migrate(&h, (const void *)payload);
			break;
		case DEX_MSG_SYSCALL: {
			const struct dex_msg_syscall *m = (const void *)payload;
			struct dex_thread *t = dex_rt.threads[m->thread];
			if (!t || dex_rt.thread_location[m->thread] != peer)
				dex_fatal("rejected SYSCALL from node %u for thread %u that is not there", peer,
					  m->thread);
			dex_mail_post(t, &h, payload);
			break;
		}
		default:
			dex_fatal("rejected unexpected %s from node %u", dex_msg_type_name(h.type), peer);
		}
	}
}

/* Keeps every connection busy so that silence means trouble: each side's
 * socket has a receive timeout of peer_timeout_s, and pings go out several
 * times per timeout. */
void *dex_origin_pinger(void *arg)
{
	(void)arg;
	dex_tls_runtime_thread = 1;
	dex_thread_create_block(DEX_ROLE_SERVICE);
	struct timespec period = { .tv_sec = 0, .tv_nsec = 250000000 };
	while (!dex_rt.shutting_down) {
		for (unsigned n = 1; n < dex_rt.nodes && !dex_rt.shutting_down; n++)
			dex_send(n, DEX_MSG_PING, NULL, 0, NULL, 0);
		nanosleep(&period, NULL);
	}
	return NULL;
}

void dex_set_receive_timeout(int fd)
{
	struct timeval tv = { .tv_sec = dex_rt.peer_timeout_s };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

void dex_origin_shutdown_nodes(int status)
{
	if (!dex_rt.active || dex_rt.node != 0)
		return;
	if (__atomic_exchange_n(&dex_rt.shutting_down, 1, __ATOMIC_ACQ_REL))
		return;
	struct dex_msg_shutdown m = { .status = status };
	for (unsigned n = 1; n < dex_rt.nodes; n++)
		dex_send(n, DEX_MSG_SHUTDOWN, &m, sizeof(m), NULL, 0);
	dex_transport->flush();
	dex_trace_flush();
	dex_print_stats();
}
