/* Signal handlers: delivery and return with every register and the vector registers intact,
   siginfo of sent signals, masks and pending signals delivered on unmask, SA_NODEFER,
   SA_RESETHAND, SIG_IGN, the old action read back, and a signal to another thread. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t handled, depth, max_depth;
static int last_code, last_pid_matches;
static char order[64];

static void note(const char *what) {
    strncat(order, what, sizeof order - strlen(order) - 1);
}

static void on_usr1(int sig, siginfo_t *info, void *context) {
    (void)context;
    handled++;
    last_code = info->si_code;
    last_pid_matches = info->si_pid == getpid();
    /* Clobber vector registers: the interrupted code must not see it. */
    volatile double scratch = 1.0;
    for (int i = 0; i < 10; i++) scratch = scratch * 3.5 + sig;
    note("H");
}

static void on_nested(int sig) {
    depth++;
    if (depth > max_depth) max_depth = depth;
    if (handled++ == 0) raise(sig);
    depth--;
}

static volatile sig_atomic_t worker_got;
static pthread_t worker_thread;

static void on_worker_signal(int sig) {
    (void)sig;
    worker_got = pthread_equal(pthread_self(), worker_thread) ? 1 : 2;
}

static void *worker(void *arg) {
    (void)arg;
    while (!worker_got) sched_yield();
    return NULL;
}

int main(void) {
    struct sigaction action = {0}, old;
    action.sa_sigaction = on_usr1;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGUSR1, &action, NULL) != 0) return 10;
    sigaction(SIGUSR1, NULL, &old);
    printf("old action is the handler: %d, SA_SIGINFO: %d\n", old.sa_sigaction == on_usr1, !!(old.sa_flags & SA_SIGINFO));

    volatile double value = 1.25;
    raise(SIGUSR1);
    value *= 2;
    printf("raise: handled %d, si_code %d (SI_TKILL %d), pid matches %d, value %.2f\n", handled, last_code, SI_TKILL, last_pid_matches, value);

    kill(getpid(), SIGUSR1);
    printf("kill: handled %d, si_code %d (SI_USER %d), pid matches %d\n", handled, last_code, SI_USER, last_pid_matches);

    /* Masked: pending until unblocked, then delivered before sigprocmask returns. */
    sigset_t block, pending;
    sigemptyset(&block);
    sigaddset(&block, SIGUSR1);
    sigprocmask(SIG_BLOCK, &block, NULL);
    note("b");
    raise(SIGUSR1);
    note("r");
    sigpending(&pending);
    printf("while blocked: handled %d, pending %d\n", handled, sigismember(&pending, SIGUSR1));
    sigprocmask(SIG_UNBLOCK, &block, NULL);
    note("u");
    sigpending(&pending);
    printf("after unblock: handled %d, pending %d, order %s\n", handled, sigismember(&pending, SIGUSR1), order);

    /* The handler's own signal is blocked while it runs, unless SA_NODEFER. */
    struct sigaction nested = {0};
    nested.sa_handler = on_nested;
    sigaction(SIGUSR2, &nested, NULL);
    handled = 0, depth = 0, max_depth = 0;
    raise(SIGUSR2);
    printf("deferred: runs %d, deepest %d\n", handled, max_depth);
    nested.sa_flags = SA_NODEFER;
    sigaction(SIGUSR2, &nested, NULL);
    handled = 0, depth = 0, max_depth = 0;
    raise(SIGUSR2);
    printf("SA_NODEFER: runs %d, deepest %d\n", handled, max_depth);

    /* SA_RESETHAND: the second time, the default action; SIG_IGN: nothing. */
    nested.sa_flags = SA_RESETHAND;
    sigaction(SIGUSR2, &nested, NULL);
    handled = 0;
    sigaction(SIGUSR2, NULL, &old);
    printf("SA_RESETHAND before: handler set %d\n", old.sa_handler == on_nested);
    handled = 1; /* no re-raise from the handler */
    raise(SIGUSR2);
    sigaction(SIGUSR2, NULL, &old);
    printf("SA_RESETHAND after: handler is SIG_DFL %d\n", old.sa_handler == SIG_DFL);
    signal(SIGUSR2, SIG_IGN);
    raise(SIGUSR2);
    printf("SIG_IGN: still running\n");

    /* The old mask comes back after a handler, whatever it blocked. */
    sigset_t now;
    sigprocmask(SIG_SETMASK, NULL, &now);
    printf("mask after handlers: USR1 %d USR2 %d\n", sigismember(&now, SIGUSR1), sigismember(&now, SIGUSR2));

    /* To another thread. */
    signal(SIGUSR1, on_worker_signal);
    pthread_create(&worker_thread, NULL, worker, NULL);
    pthread_kill(worker_thread, SIGUSR1);
    pthread_join(worker_thread, NULL);
    printf("pthread_kill: taken by the worker %d\n", worker_got == 1);
    fflush(stdout);
    return 0;
}
