/* The threads of a process ending on two CPUs at once, 100 times: a child's two threads spin
 * while its main thread calls _exit (exit_group: they end at their next tick). Each ending
 * thread lets go of what it holds in its process (its vector state area, its clear-child-tid
 * word) while the process still exists; the last one to end takes the process away. The LWK
 * panicked ("the calling thread's process") when a thread let go after the last had ended,
 * which took down an enclave whose MPI ranks ended beside each other. It needs two CPUs, so
 * test.sh runs it under clowder-vmm with two vCPUs only. */
#include <pthread.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static void *spin(void *unused) {
    for (;;) __asm__ volatile("" ::: "memory");
    return unused;
}

int main(void) {
    int ended = 0;
    for (int i = 0; i < 100; i++) {
        pid_t pid = fork();
        if (pid < 0) return 10;
        if (pid == 0) {
            /* Small stacks: a forked child's heap has little room (the LWK's fork). */
            pthread_attr_t small;
            pthread_attr_init(&small);
            pthread_attr_setstacksize(&small, 64 << 10);
            pthread_t threads[2];
            for (int k = 0; k < 2; k++)
                if (pthread_create(&threads[k], &small, spin, NULL) != 0) _exit(11);
            usleep(1000);
            _exit(7);
        }
        int status = -1;
        if (waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 7)
            ended++;
        else if (ended == i)
            printf("child %d: wait status %#x\n", i, status);
    }
    printf("%d of 100 children ended with status 7\n", ended);
    return 0;
}
