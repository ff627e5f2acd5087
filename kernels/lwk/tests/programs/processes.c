/* Processes: fork, vfork, posix_spawn, execve (of /proc/self/exe), wait4/waitpid/waitid with
 * exit codes, signals and WNOHANG, getppid, process groups, pipes (blocking reads and writes
 * beyond the pipe's capacity, end of file, EPIPE and SIGPIPE), O_CLOEXEC across execve,
 * caught signals reset by execve, SIGCHLD, setsid, a signal to a group, O_NONBLOCK pipes, waitid
 * WNOWAIT, byte order across the pipe buffer's end and EFAULT reads. Prints no pids: they differ from the host's. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;
static volatile sig_atomic_t sigchld_seen;
static void on_sigchld(int signal) { (void)signal; sigchld_seen = 1; }
static void on_usr1(int signal) { (void)signal; }
static int blocked_reader_fd;
static void *read_forever(void *arg) {
    char byte;
    (void)arg;
    read(blocked_reader_fd, &byte, 1);
    return NULL;
}

static void report(const char *what, int status) {
    if (WIFEXITED(status))
        printf("%s: exited %d\n", what, WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        printf("%s: killed by signal %d\n", what, WTERMSIG(status));
    else
        printf("%s: status %#x\n", what, status);
}

static int wait_for(pid_t pid, const char *what) {
    int status;
    if (waitpid(pid, &status, 0) != pid) {
        printf("%s: waitpid failed: %s\n", what, strerror(errno));
        return -1;
    }
    report(what, status);
    return status;
}

/* The image execve starts: which descriptors survived, what SIGUSR1 does now. */
static int exec_child(char **argv) {
    struct sigaction action;
    sigaction(SIGUSR1, NULL, &action);
    int kept = fcntl(6, F_GETFD) >= 0;
    int closed = fcntl(5, F_GETFD) < 0 && errno == EBADF;
    printf("exec'd %s %s: fd 6 kept %d, O_CLOEXEC fd 5 closed %d, SIGUSR1 %s\n", argv[0], argv[2], kept, closed,
           action.sa_handler == SIG_DFL ? "default" : "still caught");
    return 42;
}

int main(int argc, char **argv) {
    if (argc > 2 && strcmp(argv[1], "exec-child") == 0)
        return exec_child(argv);
    struct sigaction chld = {.sa_handler = on_sigchld};
    sigaction(SIGCHLD, &chld, NULL);
    fflush(stdout);

    /* fork, exit code, getppid */
    pid_t me = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        printf("child: parent is the forker %d\n", getppid() == me);
        fflush(stdout);
        _exit(7);
    }
    wait_for(pid, "fork");

    /* the child's memory is a copy: its writes stay its own */
    static int shared_word = 1;
    pid = fork();
    if (pid == 0) {
        shared_word = 99;
        _exit(shared_word == 99 ? 0 : 1);
    }
    wait_for(pid, "child writes its copy");
    printf("parent still sees %d\n", shared_word);

    /* children killed by signals */
    pid = fork();
    if (pid == 0) {
        kill(getpid(), SIGKILL);
        _exit(1);
    }
    wait_for(pid, "kill -9 self");
    pid = fork();
    if (pid == 0) {
        *(volatile int *)16 = 1;
        _exit(1);
    }
    wait_for(pid, "segfault");
    pid = fork();
    if (pid == 0) {
        for (;;) pause();
    }
    kill(pid, SIGTERM);
    wait_for(pid, "SIGTERM from the parent");

    /* WNOHANG while the child blocks reading a pipe; end of file when the parent closes it */
    int pipe_fds[2];
    if (pipe(pipe_fds) != 0) return 10;
    pid = fork();
    if (pid == 0) {
        close(pipe_fds[1]);
        char byte;
        ssize_t got = read(pipe_fds[0], &byte, 1);
        _exit(got == 0 ? 5 : 6);
    }
    close(pipe_fds[0]);
    int status;
    printf("WNOHANG while it waits: %d\n", waitpid(pid, &status, WNOHANG));
    close(pipe_fds[1]);
    wait_for(pid, "reader at end of file");

    /* 200000 bytes through a 64 KiB pipe: the writer blocks until the reader catches up */
    if (pipe(pipe_fds) != 0) return 11;
    pid = fork();
    if (pid == 0) {
        close(pipe_fds[0]);
        static char block[200000];
        for (size_t i = 0; i < sizeof block; i++) block[i] = (char)(i * 7);
        ssize_t written = write(pipe_fds[1], block, sizeof block);
        _exit(written == (ssize_t)sizeof block ? 0 : 1);
    }
    close(pipe_fds[1]);
    unsigned long total = 0, sum = 0;
    char buffer[8192];
    ssize_t got;
    while ((got = read(pipe_fds[0], buffer, sizeof buffer)) > 0) {
        for (ssize_t i = 0; i < got; i++) sum += (unsigned char)buffer[i];
        total += got;
    }
    close(pipe_fds[0]);
    printf("read %lu bytes, sum %lu\n", total, sum);
    wait_for(pid, "writer");

    /* no reader: EPIPE with SIGPIPE ignored, death by SIGPIPE otherwise */
    if (pipe(pipe_fds) != 0) return 12;
    close(pipe_fds[0]);
    signal(SIGPIPE, SIG_IGN);
    ssize_t written = write(pipe_fds[1], "x", 1);
    int error = errno;
    printf("write without reader: %zd (%s)\n", written, strerror(error));
    signal(SIGPIPE, SIG_DFL);
    pid = fork();
    if (pid == 0) {
        write(pipe_fds[1], "x", 1);
        _exit(0);
    }
    close(pipe_fds[1]);
    wait_for(pid, "writer without reader");

    /* exit_group while another thread waits in a pipe read: the process ends, and the reader's
       end of the pipe with it */
    if (pipe(pipe_fds) != 0) return 17;
    pid = fork();
    if (pid == 0) {
        pthread_t reader;
        blocked_reader_fd = pipe_fds[0];
        close(pipe_fds[1]);
        pthread_create(&reader, NULL, read_forever, NULL);
        struct timespec pause_time = {0, 50000000};
        nanosleep(&pause_time, NULL);
        exit(5);
    }
    close(pipe_fds[0]);
    wait_for(pid, "exit_group with a thread in read");
    signal(SIGPIPE, SIG_IGN);
    written = write(pipe_fds[1], "x", 1);
    error = errno;
    printf("then the pipe has no reader: %zd (%s)\n", written, strerror(error));
    signal(SIGPIPE, SIG_DFL);
    close(pipe_fds[1]);

    /* execve: O_CLOEXEC descriptors close, others stay; a caught signal goes back to default */
    if (pipe(pipe_fds) != 0) return 13;
    dup3(pipe_fds[0], 5, O_CLOEXEC);
    dup2(pipe_fds[0], 6);
    struct sigaction usr1 = {.sa_handler = on_usr1};
    sigaction(SIGUSR1, &usr1, NULL);
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        char *child_argv[] = {"processes-image", "exec-child", "by-fork", NULL};
        execve("/proc/self/exe", child_argv, environ);
        _exit(99);
    }
    wait_for(pid, "fork and execve");
    char *missing_argv[] = {"missing", NULL};
    int result = execve("/no/such/program", missing_argv, environ);
    error = errno;
    printf("execve of a missing file: %d (%s)\n", result, strerror(error));

    /* vfork: the parent waits for the child's exit */
    pid = vfork();
    if (pid == 0)
        _exit(3);
    wait_for(pid, "vfork");

    /* posix_spawn (CLONE_VM | CLONE_VFORK under both libcs) */
    char *spawn_argv[] = {"processes-image", "exec-child", "by-posix_spawn", NULL};
    fflush(stdout);
    if (posix_spawn(&pid, "/proc/self/exe", NULL, NULL, spawn_argv, environ) != 0) return 14;
    wait_for(pid, "posix_spawn");

    /* process groups */
    pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        _exit(getpgid(0) == getpid() ? 0 : 1);
    }
    wait_for(pid, "own group");
    printf("parent's group unchanged %d\n", getpgid(0) == getpgrp());
    pid = fork();
    if (pid == 0) {
        pid_t session = setsid();
        _exit(session == getpid() && getsid(0) == getpid() && getpgrp() == getpid() ? 0 : 1);
    }
    wait_for(pid, "setsid");

    /* a signal to a process group */
    pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        for (;;) pause();
    }
    setpgid(pid, pid); /* either side may do it first */
    kill(-pid, SIGTERM);
    wait_for(pid, "kill of its group");

    /* O_NONBLOCK: an empty pipe reads EAGAIN; status flags */
    if (pipe2(pipe_fds, O_NONBLOCK) != 0) return 16;
    got = read(pipe_fds[0], buffer, 1);
    error = errno;
    printf("non-blocking empty read: %zd (%s)\n", got, strerror(error));
    printf("flags: read end O_NONBLOCK %d, write end O_WRONLY %d\n", (fcntl(pipe_fds[0], F_GETFL) & O_NONBLOCK) != 0,
           (fcntl(pipe_fds[1], F_GETFL) & O_ACCMODE) == O_WRONLY);
    close(pipe_fds[0]);
    close(pipe_fds[1]);

    /* bytes keep their order across the end of the pipe's buffer (odd sizes, so the last
       bytes of a copy are not a whole word); a read into a bad buffer is EFAULT and takes
       nothing */
    if (pipe(pipe_fds) != 0) return 17;
    static char sent[40000], received[40000];
    int out_of_order = 0;
    for (int round = 0; round < 5; round++) {
        size_t len = sizeof sent - (size_t)round * 7;
        for (size_t i = 0; i < len; i++) sent[i] = (char)(i * 13 + (size_t)round);
        if (write(pipe_fds[1], sent, len) != (ssize_t)len) return 18;
        for (size_t have = 0; have < len;) {
            got = read(pipe_fds[0], received + have, len - have);
            if (got <= 0) return 19;
            have += (size_t)got;
        }
        out_of_order += memcmp(sent, received, len) != 0;
    }
    printf("5 rounds through the pipe's buffer, out of order: %d\n", out_of_order);
    if (write(pipe_fds[1], "ten bytes!", 10) != 10) return 20;
    void *volatile bad_buffer = (void *)8; /* volatile: the compiler need not see it is bad */
    got = read(pipe_fds[0], bad_buffer, 10);
    error = errno;
    printf("read into a bad buffer: %zd (%s); then %zd bytes\n", got, strerror(error),
           read(pipe_fds[0], buffer, sizeof buffer));
    close(pipe_fds[0]);
    close(pipe_fds[1]);

    /* waitid, then nothing left to wait for */
    pid = fork();
    if (pid == 0)
        _exit(9);
    siginfo_t info;
    memset(&info, 0, sizeof info);
    if (waitid(P_PID, pid, &info, WEXITED) != 0) return 15;
    printf("waitid: signo %d code %d status %d right pid %d\n", info.si_signo, info.si_code, info.si_status, info.si_pid == pid);
    pid = fork();
    if (pid == 0)
        _exit(8);
    memset(&info, 0, sizeof info);
    waitid(P_PID, pid, &info, WEXITED | WNOWAIT);
    printf("waitid WNOWAIT: status %d, still waitable %d\n", info.si_status, waitpid(pid, &status, 0) == pid && WEXITSTATUS(status) == 8);
    result = wait(&status);
    error = errno;
    printf("wait with no children: %d (%s)\n", result, strerror(error));
    printf("SIGCHLD seen %d\n", (int)sigchld_seen);
    return 0;
}
