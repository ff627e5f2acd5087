/* sched_getaffinity / sched_setaffinity / sched_getcpu: a thread pinned to the last CPU it
   may use runs there, before and after a yield. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>

static int last_cpu;

static void *pinned(void *unused) {
    (void)unused;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(last_cpu, &set);
    int result = sched_setaffinity(0, sizeof set, &set);
    int before = sched_getcpu();
    sched_yield();
    int after = sched_getcpu();
    printf("setaffinity %d, on the chosen cpu %d and after a yield %d\n", result, before == last_cpu, after == last_cpu);
    return NULL;
}

int main(void) {
    cpu_set_t set;
    int result = sched_getaffinity(0, sizeof set, &set);
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
        if (CPU_ISSET(cpu, &set))
            last_cpu = cpu;
    printf("getaffinity %d, at least one cpu %d\n", result, CPU_COUNT(&set) > 0);
    pthread_t thread;
    pthread_create(&thread, NULL, pinned, NULL);
    pthread_join(thread, NULL);
    /* The main thread moves too (from CPU 0, when there are several). */
    cpu_set_t last;
    CPU_ZERO(&last);
    CPU_SET(last_cpu, &last);
    result = sched_setaffinity(0, sizeof last, &last);
    printf("main moved %d, runs there %d\n", result, sched_getcpu() == last_cpu);
    cpu_set_t empty;
    CPU_ZERO(&empty);
    printf("empty mask rejected %d\n", sched_setaffinity(0, sizeof empty, &empty) == -1);
    return 0;
}
