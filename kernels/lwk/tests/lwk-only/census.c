/* The kernel's count of a job's entries (kernels/lwk/src/syscall/census.rs), reported at the
 * job's end: 1000 umask calls (always the kernel's) and 1000 getppid calls (answered in ring 3
 * where SYSCALL stays there, as on PVM: never counted then). test.sh reads the report. */
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(void) {
    long parent = syscall(SYS_getppid);
    for (int i = 0; i < 1000; i++) syscall(SYS_umask, 022);
    for (int i = 0; i < 999; i++)
        if (syscall(SYS_getppid) != parent) return 1;
    printf("2000 calls made\n");
    return 0;
}
