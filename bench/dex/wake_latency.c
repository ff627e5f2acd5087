/*
 * wake_latency: what this host charges for waking a thread on another CPU, the floor under
 * every DEX message here. Two processes pass a byte back and forth through pipes, 20,000
 * times, pinned to CPUs 0 and 1 (or both to CPU 0); prints the mean round trip (two wake-ups)
 * in microseconds: "same-cpu US" and "cross-cpu US".
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void pin(int cpu)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	sched_setaffinity(0, sizeof set, &set);
}

static double round_trip_us(int other_cpu)
{
	enum { ROUNDS = 20000 };
	int there[2], back[2];
	char byte = 0;
	if (pipe(there) || pipe(back))
		exit(1);
	pid_t child = fork();
	if (child == 0) {
		pin(other_cpu);
		for (int i = 0; i < ROUNDS; i++)
			if (read(there[0], &byte, 1) != 1 || write(back[1], &byte, 1) != 1)
				_exit(1);
		_exit(0);
	}
	pin(0);
	struct timespec start, end;
	clock_gettime(CLOCK_MONOTONIC, &start);
	for (int i = 0; i < ROUNDS; i++)
		if (write(there[1], &byte, 1) != 1 || read(back[0], &byte, 1) != 1)
			exit(1);
	clock_gettime(CLOCK_MONOTONIC, &end);
	waitpid(child, NULL, 0);
	for (int i = 0; i < 2; i++) {
		close(there[i]);
		close(back[i]);
	}
	return ((end.tv_sec - start.tv_sec) * 1e9 + (end.tv_nsec - start.tv_nsec)) / ROUNDS / 1000.0;
}

int main(void)
{
	printf("same-cpu %.1f\n", round_trip_us(0));
	printf("cross-cpu %.1f\n", round_trip_us(1));
	return 0;
}
