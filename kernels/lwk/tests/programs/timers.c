/* Timed waits: nanosleep, clock_nanosleep and a futex wait that times out. */
#include <errno.h>
#include <string.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* From <linux/futex.h>, which musl-gcc cannot see. */
#define FUTEX_WAIT_PRIVATE 128

static long elapsed_ms(struct timespec *start) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (now.tv_sec - start->tv_sec) * 1000 + (now.tv_nsec - start->tv_nsec) / 1000000;
}

int main(void) {
    struct timespec start, pause = {0, 30 * 1000000};
    clock_gettime(CLOCK_MONOTONIC, &start);
    int result = nanosleep(&pause, NULL);
    printf("nanosleep %d, at least 30 ms: %d\n", result, elapsed_ms(&start) >= 30);

    clock_gettime(CLOCK_MONOTONIC, &start);
    struct timespec until = start;
    until.tv_nsec += 20 * 1000000;
    if (until.tv_nsec >= 1000000000) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000;
    }
    result = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL);
    printf("clock_nanosleep %d, at least 20 ms: %d\n", result, elapsed_ms(&start) >= 20);

    int word = 0;
    struct timespec timeout = {0, 10 * 1000000};
    clock_gettime(CLOCK_MONOTONIC, &start);
    long waited = syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, 0, &timeout, NULL, 0);
    printf("futex wait %ld %s, at least 10 ms: %d\n", waited, waited ? strerror(errno) : "", elapsed_ms(&start) >= 10);
    errno = 0;
    waited = syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, 1, &timeout, NULL, 0);
    printf("futex wait on a changed word %ld %s\n", waited, strerror(errno));
    return 0;
}
