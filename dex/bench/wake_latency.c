/*
 * wake_latency: the floor this host puts under every DEX message. Two processes, pinned to
 * CPUs 0 and 1 (or both to CPU 0), pass messages back and forth 20,000 times:
 *   pipe:      one byte each way (two wake-ups, nothing else);
 *   tcp-page:  over loopback TCP (TCP_NODELAY, as DEX's transport), a 64-byte request answered
 *              by 4 KiB plus a 64-byte header: what a remote page fault sends, without DEX;
 *   tcp-page-polling: the same with both readers polling (non-blocking reads in a loop, as
 *              DEX's receivers with DEX_POLL_US), so neither side sleeps.
 * Prints the mean round trip in microseconds, one line each: "pipe-same-cpu US",
 * "pipe-cross-cpu US", "tcp-page-same-cpu US", "tcp-page-cross-cpu US",
 * "tcp-page-polling-cross-cpu US".
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { ROUNDS = 20000, REQUEST = 64, REPLY = 4096 + 64 };

static int read_flags; /* MSG_DONTWAIT: poll (sockets only) */

static void pin(int cpu)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	sched_setaffinity(0, sizeof set, &set);
}

static int read_exactly(int fd, char *buf, size_t len)
{
	for (size_t got = 0; got < len;) {
		ssize_t n = read_flags ? recv(fd, buf + got, len - got, read_flags) : read(fd, buf + got, len - got);
		if (n < 0 && errno == EAGAIN)
			continue;
		if (n <= 0)
			return -1;
		got += (size_t)n;
	}
	return 0;
}

static int write_exactly(int fd, const char *buf, size_t len)
{
	for (size_t put = 0; put < len;) {
		ssize_t n = write(fd, buf + put, len - put);
		if (n <= 0)
			return -1;
		put += (size_t)n;
	}
	return 0;
}

/* The child answers on `answer_fd` what it reads on `ask_fd`; the parent (CPU 0) times the
 * round trips on its own ends. Returns the mean round trip in microseconds. */
static double time_round_trips(int other_cpu, int ask_fd, int answer_fd, int parent_out, int parent_in,
			       size_t request, size_t reply)
{
	static char buf[REPLY];
	pid_t child = fork();
	if (child == 0) {
		pin(other_cpu);
		for (int i = 0; i < ROUNDS; i++)
			if (read_exactly(ask_fd, buf, request) || write_exactly(answer_fd, buf, reply))
				_exit(1);
		_exit(0);
	}
	pin(0);
	struct timespec start, end;
	clock_gettime(CLOCK_MONOTONIC, &start);
	for (int i = 0; i < ROUNDS; i++)
		if (write_exactly(parent_out, buf, request) || read_exactly(parent_in, buf, reply)) {
			fprintf(stderr, "wake_latency: round trip failed\n");
			exit(1);
		}
	clock_gettime(CLOCK_MONOTONIC, &end);
	waitpid(child, NULL, 0);
	return ((end.tv_sec - start.tv_sec) * 1e9 + (end.tv_nsec - start.tv_nsec)) / ROUNDS / 1000.0;
}

static double pipe_round_trip_us(int other_cpu)
{
	read_flags = 0;
	int there[2], back[2];
	if (pipe(there) || pipe(back))
		exit(1);
	double us = time_round_trips(other_cpu, there[0], back[1], there[1], back[0], 1, 1);
	for (int i = 0; i < 2; i++) {
		close(there[i]);
		close(back[i]);
	}
	return us;
}

static double tcp_page_round_trip_us(int other_cpu, int flags)
{
	read_flags = flags;
	struct sockaddr_in addr = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t addr_len = sizeof addr;
	int listener = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	if (listener < 0 || bind(listener, (struct sockaddr *)&addr, sizeof addr) ||
	    getsockname(listener, (struct sockaddr *)&addr, &addr_len) || listen(listener, 1)) {
		perror("wake_latency: loopback listener");
		exit(1);
	}
	int near = socket(AF_INET, SOCK_STREAM, 0);
	if (near < 0 || connect(near, (struct sockaddr *)&addr, sizeof addr)) {
		perror("wake_latency: loopback connect");
		exit(1);
	}
	int far = accept(listener, NULL, NULL);
	if (far < 0) {
		perror("wake_latency: loopback accept");
		exit(1);
	}
	setsockopt(near, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	setsockopt(far, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	double us = time_round_trips(other_cpu, far, far, near, near, REQUEST, REPLY);
	close(near);
	close(far);
	close(listener);
	return us;
}

int main(void)
{
	printf("pipe-same-cpu %.1f\n", pipe_round_trip_us(0));
	printf("pipe-cross-cpu %.1f\n", pipe_round_trip_us(1));
	printf("tcp-page-same-cpu %.1f\n", tcp_page_round_trip_us(0, 0));
	printf("tcp-page-cross-cpu %.1f\n", tcp_page_round_trip_us(1, 0));
	printf("tcp-page-polling-cross-cpu %.1f\n", tcp_page_round_trip_us(1, MSG_DONTWAIT));
	return 0;
}
