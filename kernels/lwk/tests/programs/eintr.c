/* Blocking calls interrupted by a signal another thread sends (tgkill, or kill to the
   process): futex waits, nanosleep and clock_nanosleep (with the time left written back),
   pause, sem_wait. Each ends with EINTR once the handler has run, except a futex wait
   without timeout when the handler has SA_RESTART: it is restarted and ends when woken. A
   signal the sleeper blocks does not interrupt it. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define FUTEX_WAIT_PRIVATE 128
#define FUTEX_WAKE_PRIVATE 129

static volatile sig_atomic_t handled;
static void on_usr1(int sig) { (void)sig; handled++; }

static pid_t sleeper_tid;
static volatile int call_returned;
static volatile int futex_word;

enum how { BY_TGKILL, BY_KILL };

struct sender_plan {
    enum how how;
    int signals_before_wake; /* 0: keep signalling until the call returns */
};

/* Signals the sleeper every 20 ms until its call returns (a signal that arrives before it
   blocks runs the handler and the call still blocks: the next one interrupts it), or sends
   a fixed number and then wakes its futex. */
static void *sender(void *argument) {
    const struct sender_plan *plan = argument;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    for (int sent = 0; !call_returned; sent++) {
        /* Before the wake, time for the restarted wait to begin (a signal delivery is tens
           of thousands of emulated kernel instructions on PVM). */
        usleep(plan->signals_before_wake && sent == plan->signals_before_wake ? 300000 : 20000);
        if (plan->signals_before_wake && sent == plan->signals_before_wake) {
            futex_word = 1;
            syscall(SYS_futex, &futex_word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
            break;
        }
        if (call_returned) break;
        if (plan->how == BY_KILL) kill(getpid(), SIGUSR1);
        else syscall(SYS_tgkill, getpid(), sleeper_tid, SIGUSR1);
    }
    return NULL;
}

static pthread_t start_sender(struct sender_plan *plan) {
    pthread_t thread;
    handled = 0;
    call_returned = 0;
    futex_word = 0;
    pthread_create(&thread, NULL, sender, plan);
    return thread;
}

static void finish(pthread_t thread, const char *what, long result, int error) {
    call_returned = 1;
    pthread_join(thread, NULL);
    printf("%s: %ld %s, handler ran: %s\n", what, result, result < 0 ? strerror(error) : "",
           handled ? "yes" : "no");
}

static void use_handler(int flags) {
    struct sigaction action = {0};
    action.sa_handler = on_usr1;
    action.sa_flags = flags;
    sigemptyset(&action.sa_mask);
    sigaction(SIGUSR1, &action, NULL);
}

static int seconds_left_between(const struct timespec *left, double low, double high) {
    double seconds = left->tv_sec + left->tv_nsec / 1e9;
    return seconds > low && seconds <= high;
}

int main(void) {
    sleeper_tid = syscall(SYS_gettid);
    struct sender_plan by_tgkill = {BY_TGKILL, 0}, by_kill = {BY_KILL, 0}, twice_then_wake = {BY_TGKILL, 2};
    pthread_t thread;
    long result;

    use_handler(0);
    thread = start_sender(&by_tgkill);
    result = syscall(SYS_futex, &futex_word, FUTEX_WAIT_PRIVATE, 0, NULL, NULL, 0);
    finish(thread, "futex wait", result, errno);

    struct timespec timeout = {30, 0};
    thread = start_sender(&by_tgkill);
    result = syscall(SYS_futex, &futex_word, FUTEX_WAIT_PRIVATE, 0, &timeout, NULL, 0);
    finish(thread, "futex wait with timeout", result, errno);

    struct timespec request = {10, 0}, left = {0, 0};
    thread = start_sender(&by_tgkill);
    result = nanosleep(&request, &left);
    finish(thread, "nanosleep", result, errno);
    printf("nanosleep: time left between 5 and 10 s: %d\n", seconds_left_between(&left, 5, 10));

    left.tv_sec = 0;
    thread = start_sender(&by_kill);
    result = clock_nanosleep(CLOCK_MONOTONIC, 0, &request, &left);
    finish(thread, "clock_nanosleep (kill to the process)", -result, result);
    printf("clock_nanosleep: time left between 5 and 10 s: %d\n", seconds_left_between(&left, 5, 10));

    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += 10;
    left.tv_sec = 12345;
    thread = start_sender(&by_tgkill);
    result = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &deadline, &left);
    finish(thread, "clock_nanosleep absolute", -result, result);
    printf("clock_nanosleep absolute: rem untouched: %d\n", left.tv_sec == 12345);

    thread = start_sender(&by_kill);
    result = pause();
    finish(thread, "pause (kill to the process)", result, errno);

    /* Through libc: sem_wait reports the interrupted futex wait. */
    sem_t semaphore;
    sem_init(&semaphore, 0, 0);
    thread = start_sender(&by_tgkill);
    result = sem_wait(&semaphore);
    finish(thread, "sem_wait", result, errno);

    /* SA_RESTART: a futex wait without timeout goes on after the handler; sleeps and timed
       waits still end with EINTR. */
    use_handler(SA_RESTART);
    thread = start_sender(&twice_then_wake);
    result = syscall(SYS_futex, &futex_word, FUTEX_WAIT_PRIVATE, 0, NULL, NULL, 0);
    /* Restarted, it ends woken (0) or, had the wake come before the restart, with EAGAIN
       (the word changed): both print 0. EINTR would mean no restart. */
    int error = errno;
    finish(thread, "futex wait, SA_RESTART", result < 0 && error == EAGAIN ? 0 : result, error);

    thread = start_sender(&by_tgkill);
    result = syscall(SYS_futex, &futex_word, FUTEX_WAIT_PRIVATE, 0, &timeout, NULL, 0);
    finish(thread, "futex wait with timeout, SA_RESTART", result, errno);

    thread = start_sender(&by_tgkill);
    result = nanosleep(&request, NULL);
    finish(thread, "nanosleep, SA_RESTART", result, errno);

    /* Blocked: the signal stays pending and the sleep runs to its end. */
    sigset_t usr1, pending;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    sigprocmask(SIG_BLOCK, &usr1, NULL);
    struct timespec short_sleep = {0, 200 * 1000 * 1000};
    thread = start_sender(&by_tgkill);
    result = nanosleep(&short_sleep, NULL);
    finish(thread, "nanosleep with SIGUSR1 blocked", result, errno);
    sigpending(&pending);
    printf("pending after the sleep: %d\n", sigismember(&pending, SIGUSR1));
    sigprocmask(SIG_UNBLOCK, &usr1, NULL);
    printf("after unblocking: handler ran: %s\n", handled ? "yes" : "no");
    fflush(stdout);
    return 0;
}
