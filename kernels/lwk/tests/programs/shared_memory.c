/* Shared anonymous memory across fork, as MPI libraries and shm runtimes use it: a
 * MAP_SHARED | MAP_ANONYMOUS mapping written before fork is seen by the child, the child's
 * writes are seen by the parent (a private mapping's are not), two children count into one
 * word concurrently with atomics, a large (2 MiB pages) mapping is shared whole, a partial
 * munmap in the child leaves the parent's mapping intact, mprotect works on shared memory,
 * and a grandchild shares with its grandparent. */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAGE 4096
#define LARGE (8u << 20)
#define COUNT 20000

static int wait_child(pid_t pid) {
    int status;
    if (waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int main(void) {
    unsigned *shared = mmap(NULL, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    unsigned *private = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *large = mmap(NULL, LARGE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED || private == MAP_FAILED || large == MAP_FAILED) {
        printf("mmap failed: %s\n", strerror(errno));
        return 1;
    }
    printf("fresh shared memory reads zero: %d\n", shared[0] == 0 && shared[4 * PAGE / 4 - 1] == 0 && large[LARGE - 1] == 0);
    shared[0] = 11;
    private[0] = 11;

    pid_t child = fork();
    if (child == 0) {
        int saw = shared[0];
        shared[1] = 22;
        private[0] = 99;
        shared[PAGE / 4] = 33; /* the second page */
        memset(large, 0x5a, LARGE);
        _exit(saw == 11 ? 0 : 1);
    }
    printf("child saw the parent's write: %d\n", wait_child(child) == 0);
    printf("parent sees the child's writes: %u %u\n", shared[1], shared[PAGE / 4]);
    printf("private stays private: %u\n", private[0]);
    int whole = 1;
    for (unsigned i = 0; i < LARGE; i += 4093)
        whole &= large[i] == 0x5a;
    printf("large mapping shared whole: %d\n", whole && large[LARGE - 1] == 0x5a);

    /* Two children count into one word at once. */
    shared[2] = 0;
    pid_t counters[2];
    for (int i = 0; i < 2; i++) {
        counters[i] = fork();
        if (counters[i] == 0) {
            for (int n = 0; n < COUNT; n++) {
                __atomic_fetch_add(&shared[2], 1, __ATOMIC_SEQ_CST);
                if (n % 1000 == 0)
                    sched_yield();
            }
            _exit(0);
        }
    }
    wait_child(counters[0]);
    wait_child(counters[1]);
    printf("two children counted %u (expected %u)\n", shared[2], 2 * COUNT);

    /* The child unmaps part of its view and protects the rest: the parent's stays. */
    child = fork();
    if (child == 0) {
        if (munmap(&shared[PAGE / 4], PAGE) != 0)
            _exit(2);
        if (mprotect(shared, PAGE, PROT_READ) != 0)
            _exit(3);
        shared[3 * PAGE / 4] = 44; /* the third page, still mapped and writable */
        /* A grandchild writes through its grandparent's mapping. */
        pid_t grandchild = fork();
        if (grandchild == 0) {
            shared[2 * PAGE / 4] = 55;
            _exit(0);
        }
        _exit(wait_child(grandchild));
    }
    printf("child unmapped and protected part: status %d\n", wait_child(child));
    printf("parent's view after that: %u %u %u\n", shared[PAGE / 4], shared[3 * PAGE / 4], shared[2 * PAGE / 4]);
    shared[0] = 12; /* still writable here */
    printf("parent still writes its first page: %u\n", shared[0]);

    /* A read-only view in the parent: a write faults in the child that inherits it. */
    if (mprotect(shared, 4 * PAGE, PROT_READ) != 0) {
        printf("mprotect failed: %s\n", strerror(errno));
        return 1;
    }
    child = fork();
    if (child == 0) {
        shared[0] = 1;
        _exit(0);
    }
    printf("a write to an inherited read-only shared page: status %d\n", wait_child(child));
    printf("munmap of the shared mappings: %d %d\n", munmap(shared, 4 * PAGE), munmap(large, LARGE));
    return 0;
}
