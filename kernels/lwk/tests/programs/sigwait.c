/* Waiting for signals: sigpending, sigtimedwait/sigwaitinfo (siginfo of tgkill and kill,
   EAGAIN on timeout, EINTR by another signal, a wait in another thread), sigsuspend (the
   handler sees the old mask in its ucontext, the mask comes back afterwards). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

static volatile sig_atomic_t handled, handler_saw_usr1_in_old_mask, handler_blocked_usr1;

static void on_signal(int sig, siginfo_t *info, void *context) {
    (void)info;
    ucontext_t *uc = context;
    sigset_t now;
    handled = sig;
    handler_saw_usr1_in_old_mask = sigismember(&uc->uc_sigmask, SIGUSR1);
    sigprocmask(SIG_SETMASK, NULL, &now);
    handler_blocked_usr1 = sigismember(&now, SIGUSR1);
}

static void print_info(const char *what, int result, const siginfo_t *info) {
    if (result < 0) {
        printf("%s: -1 %s\n", what, strerror(errno));
        return;
    }
    printf("%s: signal %d, si_signo %d, si_code %d, si_pid is ours %d, si_uid is ours %d\n", what, result,
           info->si_signo, info->si_code, info->si_pid == getpid(), info->si_uid == getuid());
}

static double seconds_since(const struct timespec *start) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (now.tv_sec - start->tv_sec) + (now.tv_nsec - start->tv_nsec) / 1e9;
}

static pid_t main_tid;
static volatile int waiter_ready;

/* Sends `signal` to the process (kill) after the main thread is (most likely) waiting;
   sigwaitinfo takes it whenever it arrives, since every thread blocks it. */
static void *kill_later(void *argument) {
    usleep(30000);
    kill(getpid(), (int)(long)argument);
    return NULL;
}

/* Sends SIGUSR2 to the main thread every 20 ms until it stops waiting. */
static volatile int main_done;
static void *interrupt_main(void *argument) {
    (void)argument;
    while (!main_done) {
        usleep(20000);
        if (!main_done) syscall(SYS_tgkill, getpid(), main_tid, SIGUSR2);
    }
    return NULL;
}

static volatile int waiter_signal, waiter_code;
static void *waiter(void *argument) {
    sigset_t *set = argument;
    siginfo_t info;
    waiter_ready = 1;
    waiter_signal = sigwaitinfo(set, &info);
    waiter_code = info.si_code;
    return NULL;
}

int main(void) {
    main_tid = syscall(SYS_gettid);
    struct sigaction action = {0};
    action.sa_sigaction = on_signal;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    sigaction(SIGUSR1, &action, NULL);
    sigaction(SIGUSR2, &action, NULL);

    sigset_t usr1, usr1_usr2, empty, pending, now;
    sigemptyset(&empty);
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    usr1_usr2 = usr1;
    sigaddset(&usr1_usr2, SIGUSR2);
    sigprocmask(SIG_BLOCK, &usr1, NULL);

    int result;
    /* Nothing pending: a zero timeout is EAGAIN at once, a short one after its time. */
    siginfo_t info;
    struct timespec zero = {0, 0}, short_wait = {0, 100 * 1000 * 1000}, start;
    print_info("sigtimedwait, nothing pending, zero timeout", sigtimedwait(&usr1, &info, &zero), &info);
    clock_gettime(CLOCK_MONOTONIC, &start);
    print_info("sigtimedwait, nothing pending, 100 ms", sigtimedwait(&usr1, &info, &short_wait), &info);
    printf("waited at least 100 ms: %d\n", seconds_since(&start) >= 0.1);

    /* Pending and blocked: sigpending shows it, sigtimedwait takes it without the handler. */
    raise(SIGUSR1);
    sigpending(&pending);
    printf("pending after raise: USR1 %d\n", sigismember(&pending, SIGUSR1));
    memset(&info, 0, sizeof info);
    print_info("sigtimedwait after raise", sigtimedwait(&usr1, &info, &zero), &info);
    sigpending(&pending);
    printf("pending after sigtimedwait: USR1 %d, handler ran %d\n", sigismember(&pending, SIGUSR1), handled);

    kill(getpid(), SIGUSR1);
    memset(&info, 0, sizeof info);
    print_info("sigwaitinfo after kill", sigwaitinfo(&usr1, &info), &info);

    /* Waiting with nothing pending: another thread's kill to the process ends the wait. */
    pthread_t thread;
    pthread_create(&thread, NULL, kill_later, (void *)(long)SIGUSR1);
    memset(&info, 0, sizeof info);
    print_info("sigwaitinfo, kill from another thread", sigwaitinfo(&usr1, &info), &info);
    pthread_join(thread, NULL);

    int taken = 0;
    pthread_create(&thread, NULL, kill_later, (void *)(long)SIGUSR1);
    printf("sigwait: %d, ", sigwait(&usr1, &taken));
    printf("signal %d\n", taken);
    pthread_join(thread, NULL);

    /* Another signal, unblocked and handled, interrupts the wait: EINTR (the system call
       itself: musl's sigtimedwait tries again after EINTR). */
    main_done = 0;
    pthread_create(&thread, NULL, interrupt_main, NULL);
    handled = 0;
    result = syscall(SYS_rt_sigtimedwait, &usr1, &info, NULL, 8);
    print_info("rt_sigtimedwait interrupted by SIGUSR2", result, &info);
    main_done = 1;
    pthread_join(thread, NULL);
    printf("handler ran for %d\n", handled);

    /* A thread waiting in sigwaitinfo takes a signal sent to the process. */
    waiter_ready = 0;
    pthread_t waiting_thread;
    pthread_create(&waiting_thread, NULL, waiter, &usr1);
    while (!waiter_ready) usleep(1000);
    usleep(30000);
    kill(getpid(), SIGUSR1);
    pthread_join(waiting_thread, NULL);
    printf("waiting thread took signal %d, si_code %d\n", waiter_signal, waiter_code);

    /* sigsuspend: USR1 (blocked) arrives during the wait; the handler sees the old mask in
       its ucontext; the call ends with EINTR and USR1 is blocked again. */
    handled = 0;
    pthread_create(&thread, NULL, kill_later, (void *)(long)SIGUSR1);
    result = sigsuspend(&empty);
    int error = errno;
    pthread_join(thread, NULL);
    sigprocmask(SIG_SETMASK, NULL, &now);
    printf("sigsuspend: %d %s, handler ran for %d, old mask in ucontext had USR1 %d, USR1 blocked in the handler %d, "
           "USR1 blocked after %d\n",
           result, strerror(error), handled, handler_saw_usr1_in_old_mask, handler_blocked_usr1,
           sigismember(&now, SIGUSR1));

    /* Pending before sigsuspend: delivered at once. */
    raise(SIGUSR1);
    handled = 0;
    result = sigsuspend(&empty);
    printf("sigsuspend with USR1 pending: %d %s, handler ran for %d\n", result, strerror(errno), handled);

    /* Bad arguments. */
    struct timespec bad = {0, 1000000000};
    print_info("rt_sigtimedwait with sigsetsize 4", syscall(SYS_rt_sigtimedwait, &usr1, NULL, &zero, 4), &info);
    print_info("sigtimedwait with tv_nsec 10^9", sigtimedwait(&usr1, &info, &bad), &info);
    print_info("rt_sigsuspend with a bad pointer", syscall(SYS_rt_sigsuspend, (void *)8, 8), &info);
    /* A thread still waiting in sigwaitinfo when its process exits ends with it (the
       process is a child: the job's first process ending ends the whole job at once). */
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        sigset_t never;
        sigemptyset(&never);
        sigaddset(&never, SIGTERM);
        sigprocmask(SIG_BLOCK, &never, NULL);
        pthread_create(&waiting_thread, NULL, waiter, &never);
        usleep(30000);
        exit(4);
    }
    int status = 0;
    waitpid(child, &status, 0);
    printf("child exited with a thread in sigwaitinfo: status %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    fflush(stdout);
    return 0;
}
