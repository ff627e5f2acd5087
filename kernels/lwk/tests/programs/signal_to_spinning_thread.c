/* A signal to a thread that computes without system calls: on another CPU it is interrupted
   (tick IPI) to take it; on the same CPU it takes it when the time slice brings it back. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
static volatile int got, started;
static void on_usr1(int sig) { got = sig; }
static void *worker(void *arg) { (void)arg; started = 1; while (!got) __asm__ volatile("pause"); return NULL; }
int main(void) {
    signal(SIGUSR1, on_usr1);
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
    while (!started) sched_yield();
    pthread_kill(t, SIGUSR1);
    pthread_join(t, NULL);
    printf("worker took signal %d\n", got);
    return 0;
}
