/* A thread woken (a mutex handed over) by a thread that then waits for the host in the kernel
   (XPMEM makes and removes: the name server's answers) and afterwards spins in user mode
   without entering the kernel again, on the one CPU of a persistent enclave: MPI_Finalize's
   case, where UCX's fence spins in ucp_worker_progress after xpmem calls while PMIx's progress
   thread waits for the CPU. The woken thread must get the CPU within moments; the spinner gives
   up after 10 s, so that a kernel that lets the spinner keep the CPU fails instead of hanging.
   Prints one line and exits 0 (ran) or 1 (starved). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <xpmem.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int woken_ran;
static char exported[4096] __attribute__((aligned(4096)));

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *waiter(void *unused) {
    (void)unused;
    pthread_mutex_lock(&lock); /* blocks: main holds it */
    atomic_store(&woken_ran, 1);
    pthread_mutex_unlock(&lock);
    return NULL;
}

int main(void) {
    pthread_mutex_lock(&lock);
    pthread_t thread;
    if (pthread_create(&thread, NULL, waiter, NULL) != 0) {
        printf("FAIL: pthread_create\n");
        return 2;
    }
    struct timespec pause = { 0, 100 * 1000 * 1000 };
    nanosleep(&pause, NULL); /* the waiter blocks on the lock meanwhile */
    pthread_mutex_unlock(&lock); /* the waiter is queued for this CPU */
    /* Host round trips in the kernel until the time slice has surely ended during one. */
    double started = now_seconds();
    int calls = 0;
    while (now_seconds() < started + 0.2 && !atomic_load(&woken_ran)) {
        xpmem_segid_t segment = xpmem_make(exported, sizeof exported, XPMEM_PERMIT_MODE, (void *)0600);
        if (segment == -1 || xpmem_remove(segment) != 0) {
            printf("FAIL: xpmem_make/xpmem_remove in the enclave\n");
            return 2;
        }
        calls++;
    }
    /* Then spin in user mode only (clock_gettime is answered in ring 3). */
    double spin_start = now_seconds();
    for (unsigned long spins = 0; !atomic_load(&woken_ran); spins++)
        if (spins % (1 << 20) == 0 && now_seconds() > spin_start + 10) {
            printf("the woken thread did not run in 10 s beside the spinning one (%d host round trips)\n", calls);
            return 1;
        }
    pthread_join(thread, NULL);
    printf("the woken thread ran beside the spinning one\n");
    return 0;
}
