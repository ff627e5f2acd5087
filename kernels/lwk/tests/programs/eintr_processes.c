/* Signals interrupting the waits of processes: a read of an empty pipe and wait4 for a child
   that has not ended return EINTR after a handler without SA_RESTART and are restarted after
   one with it; a caught SIGCHLD interrupts pause. The signals come from a child process. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t handled;
static void on_signal(int sig) { (void)sig; handled++; }

static void use_handler(int signal_number, int flags) {
    struct sigaction action = {0};
    action.sa_handler = on_signal;
    action.sa_flags = flags;
    sigemptyset(&action.sa_mask);
    sigaction(signal_number, &action, NULL);
}

/* A child that sends SIGUSR1 to its parent every 20 ms, `count` times (0: until killed),
   then writes one byte to `pipe_write` (if not -1) and sleeps until killed. */
static pid_t start_signalling_child(int count, int pipe_write) {
    pid_t parent = getpid();
    pid_t child = fork();
    if (child == 0) {
        for (int sent = 0; count == 0 || sent < count; sent++) {
            usleep(20000);
            kill(parent, SIGUSR1);
        }
        if (pipe_write >= 0) write(pipe_write, "x", 1);
        for (;;) pause();
    }
    return child;
}

static void stop_child(pid_t child) {
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
}

static void report(const char *what, long result, int error) {
    printf("%s: %ld %s, handler ran: %s\n", what, result, result < 0 ? strerror(error) : "", handled ? "yes" : "no");
}

int main(void) {
    int ends[2];
    char byte;
    long result;
    pid_t child;

    use_handler(SIGUSR1, 0);
    pipe(ends);
    handled = 0;
    child = start_signalling_child(0, -1);
    result = read(ends[0], &byte, 1);
    report("read of an empty pipe", result, errno);
    stop_child(child);

    use_handler(SIGUSR1, SA_RESTART);
    handled = 0;
    child = start_signalling_child(2, ends[1]);
    result = read(ends[0], &byte, 1);
    report("read of an empty pipe, SA_RESTART", result, errno);
    stop_child(child);

    use_handler(SIGUSR1, 0);
    handled = 0;
    child = start_signalling_child(0, -1);
    int status;
    result = waitpid(child, &status, 0);
    report("waitpid", result, errno);
    stop_child(child);

    /* SA_RESTART: waitpid goes on after the child's two signals until the child ends
       (another child kills it after 200 ms). */
    use_handler(SIGUSR1, SA_RESTART);
    handled = 0;
    child = start_signalling_child(2, -1);
    pid_t killer = fork();
    if (killer == 0) {
        usleep(200000);
        kill(child, SIGKILL);
        _exit(0);
    }
    result = waitpid(child, &status, 0);
    report("waitpid, SA_RESTART", result == child ? 0 : -1, errno);
    printf("child killed by signal %d\n", WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    waitpid(killer, NULL, 0);

    /* A caught SIGCHLD ends pause. */
    use_handler(SIGCHLD, 0);
    handled = 0;
    child = fork();
    if (child == 0) {
        usleep(20000);
        _exit(3);
    }
    result = pause();
    report("pause until SIGCHLD", result, errno);
    waitpid(child, &status, 0);
    printf("child status %d\n", WEXITSTATUS(status));
    fflush(stdout);
    return 0;
}
