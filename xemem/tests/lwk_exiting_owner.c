/*
 * lwk_exiting_owner: a forked process of an LWK job exports memory and exits while a host
 * process (host_lwk_exit_watcher.c) has it attached; the job goes on and reuses memory.
 * kernels/lwk/tests/xemem-exit-order.sh drives both.
 *   1. child A fills PAGES pages with PATTERN_A, makes them the named segment
 *      "lwk-exit-order-seg" and waits on its notify descriptor;
 *   2. the host watcher attaches the segment, checks it and signals it: child A exits at once,
 *      without removing the segment (it goes with the process);
 *   3. the parent, as soon as A is reaped, forks child B, which maps as much memory and
 *      writes PATTERN_B over it for two seconds (the job's allocator is free to hand B the
 *      frames A had).
 * The kernel must remove A's segment, and the daemon revoke the host's attachment, before A's
 * frames are freed (cleared) or reused: the watcher must see PATTERN_A until its SIGBUS.
 * Prints one line per step; exits 0 when the job's own steps worked.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xpmem.h>

#define PAGE 4096UL
#define PAGES 16
#define PATTERN_A 0x4141414141414141ULL
#define PATTERN_B 0x4242424242424242ULL

static uint64_t *pages(void)
{
	uint64_t *memory = mmap(NULL, PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return memory == MAP_FAILED ? NULL : memory;
}

static void fill(uint64_t *memory, uint64_t pattern)
{
	for (unsigned long i = 0; i < PAGES * PAGE / sizeof *memory; i++)
		memory[i] = pattern;
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

int main(void)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	pid_t owner = fork();
	if (owner == 0) {
		uint64_t *memory = pages();
		if (!memory)
			_exit(2);
		fill(memory, PATTERN_A);
		xpmem_segid_t segid = xemem_make(memory, PAGES * PAGE, "lwk-exit-order-seg");
		int notify = segid > 0 ? xemem_notify_fd(segid) : -1;
		if (notify < 0) {
			printf("owner: make or notify descriptor failed (errno %d)\n", errno);
			_exit(3);
		}
		fcntl(notify, F_SETFL, fcntl(notify, F_GETFL) & ~O_NONBLOCK);
		printf("owner: made lwk-exit-order-seg\n");
		uint64_t count = 0;
		if (read(notify, &count, sizeof count) != sizeof count)
			_exit(4);
		/* Out at once, the segment still made. */
		_exit(0);
	}
	int status = -1;
	waitpid(owner, &status, 0);
	printf("owner exited with %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
	pid_t reuser = fork();
	if (reuser == 0) {
		uint64_t *memory = pages();
		if (!memory)
			_exit(2);
		double end = now() + 2;
		while (now() < end)
			fill(memory, PATTERN_B);
		_exit(0);
	}
	waitpid(reuser, &status, 0);
	printf("reuser exited with %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
	return 0;
}
