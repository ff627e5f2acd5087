/*
 * lwk_fork_device: in an LWK enclave the XPMEM device serves the job's first process only
 * (its segments and attachments live in that address space): a forked child's calls fail
 * with EPERM, while the parent's keep working before and after the fork.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xpmem.h>

#define PAGE 4096UL

int main(void)
{
	char *memory = mmap(NULL, 2 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (memory == MAP_FAILED)
		return 2;
	xpmem_segid_t before = xpmem_make(memory, PAGE, XPMEM_PERMIT_MODE, (void *)0600);
	printf("parent make before fork: %s\n", before > 0 ? "ok" : "failed");
	fflush(stdout);
	pid_t child = fork();
	if (child == 0) {
		xpmem_segid_t segid = xpmem_make(memory + PAGE, PAGE, XPMEM_PERMIT_MODE, (void *)0600);
		int refused = segid == -1 && errno == EPERM;
		printf("child make: %s\n", refused ? "EPERM" : "not refused");
		fflush(stdout);
		_exit(refused ? 0 : 1);
	}
	int status = -1;
	waitpid(child, &status, 0);
	printf("child exited %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
	xpmem_segid_t after = xpmem_make(memory + PAGE, PAGE, XPMEM_PERMIT_MODE, (void *)0600);
	printf("parent make after fork: %s\n", after > 0 ? "ok" : "failed");
	printf("removes: %d %d\n", xpmem_remove(before), xpmem_remove(after));
	return 0;
}
