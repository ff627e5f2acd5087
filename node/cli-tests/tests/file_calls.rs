//! Forwarded file calls answer as Linux does (issue 21, point 3), on each of the enclave's
//! paths: the job's ring-3 calls the daemon serves from its request page (the default, on
//! PVM hosts; the calls the daemon does not take in time, and the others, through the kernel),
//! the kernel's file-call slots alone (`CLOWDER_RING3_FILES=off`: the kernel path) and the
//! channel (`CLOWDER_FILE_SLOTS=off`). One static program makes open, stat, fstat, close, lseek, read,
//! write, pread and pwrite calls on host files, good and bad (missing files, closed and
//! read-only descriptors, bad offsets and whences, a directory, a bad buffer), and prints each
//! result with its errno; on the host and in every enclave it must print the same. Open, openat
//! and close (served from ring 3 on the first path) keep Linux's numbers beside the kernel's
//! own descriptors: the lowest free one after closes, dup and fcntl's F_DUPFD, a pipe, fork (a
//! child's close leaves the parent's file open), O_CLOEXEC across execve, F_GETFL and F_GETFD,
//! and EMFILE when the host's or the kernel's table is full. Needs /dev/kvm, the LWK image,
//! clowder-vmm and musl-gcc (skipped, with the reason, otherwise).

use clowder_test_support::build_musl_program;
use clowderd::enclave::Liveness;
use support::{enclave_test_daemon, run_clowder, run_clowder_ok, text};

mod support;

const CALLS: &str = r#"#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
static const char *name(int error) {
    switch (error) {
    case ENOENT: return "ENOENT";
    case EBADF: return "EBADF";
    case EINVAL: return "EINVAL";
    case EFAULT: return "EFAULT";
    case EEXIST: return "EEXIST";
    case EISDIR: return "EISDIR";
    case ENOTDIR: return "ENOTDIR";
    case EACCES: return "EACCES";
    case EMFILE: return "EMFILE";
    default: return strerror(error);
    }
}
static void say(const char *what, long result) {
    if (result < 0)
        printf("%s: -1 %s\n", what, name(errno));
    else
        printf("%s: %ld\n", what, result);
    errno = 0;
}
/* After execve: descriptor CLOEXEC must be closed, KEPT still open; a new open takes the
   lowest free number. The exit status says which failed (an exec'd child's output is lost in
   an enclave today, on every path). */
static int exec_child(int cloexec, int kept) {
    int failed = 0;
    if (fcntl(cloexec, F_GETFD) != -1 || errno != EBADF) failed |= 1;
    if (fcntl(kept, F_GETFD) != 0) failed |= 2;
    int fd = open("data", O_RDONLY);
    if (fd != cloexec) failed |= 4;
    if (close(fd) != 0 || close(kept) != 0) failed |= 8;
    return failed;
}

/* Opens until the tables are full: each number above the last (the lowest free, whatever the
   host run inherited), the last error EMFILE; then a closed number is the next one handed out. */
static void open_many(void) {
    static int fds[2048];
    int count = 0, in_order = 1;
    for (; count < 2048; count++) {
        fds[count] = open("data", O_RDONLY | O_CLOEXEC);
        if (fds[count] < 0) break;
        if (count > 0 && fds[count] <= fds[count - 1]) in_order = 0;
    }
    say("open many: last", count < 2048 ? -1 : 0);
    say("open many: numbers in order", in_order ? 0 : -1);
    say("close one of many", close(fds[count / 2]));
    int again = open("data", O_RDONLY);
    say("open after closing one: its number", again == fds[count / 2] ? 0 : -1);
    for (int i = 0; i < count; i++)
        if (i != count / 2) close(fds[i]);
    close(again);
}

int main(int argc, char **argv) {
    char buffer[64] = {0};
    struct stat st;
    if (argc == 4 && strcmp(argv[1], "child") == 0)
        return exec_child(atoi(argv[2]), atoi(argv[3]));
    say("open missing", open("missing", O_RDONLY));
    int fd = open("data", O_RDWR | O_CREAT | O_TRUNC, 0640);
    say("open data", fd);
    say("write", write(fd, "hello, host", 11));
    say("lseek set 0", lseek(fd, 0, SEEK_SET));
    say("lseek bad whence", lseek(fd, 0, 42));
    say("lseek negative", lseek(fd, -5, SEEK_SET));
    say("lseek end -4", lseek(fd, -4, SEEK_END));
    say("read", read(fd, buffer, sizeof buffer - 1));
    printf("read gave %s\n", buffer);
    say("read at end", read(fd, buffer, sizeof buffer));
    say("lseek back", lseek(fd, 0, SEEK_SET));
    say("read bad buffer", read(fd, (void *)8, 4));
    say("write bad buffer", write(fd, (void *)8, 4));
    say("pwrite", pwrite(fd, "HELLO", 5, 0));
    memset(buffer, 0, sizeof buffer);
    say("pread", pread(fd, buffer, 8, 2));
    printf("pread gave %s\n", buffer);
    say("pread negative", pread(fd, buffer, 8, -1));
    say("fstat", fstat(fd, &st));
    printf("fstat size %lld mode %o links %ld\n", (long long)st.st_size, st.st_mode, (long)st.st_nlink);
    say("stat", stat("data", &st));
    printf("stat size %lld mode %o\n", (long long)st.st_size, st.st_mode);
    say("stat missing", stat("missing", &st));
    say("stat not a directory", stat("data/below", &st));
    say("stat directory", stat(".", &st));
    printf("directory is %s\n", S_ISDIR(st.st_mode) ? "a directory" : "not a directory");
    say("lstat", lstat("data", &st));
    printf("lstat size %lld\n", (long long)st.st_size);
    say("stat bad path", stat((const char *)8, &st));
    say("pread bad buffer", pread(fd, (void *)8, 4, 0));
    say("pwrite at 100", pwrite(fd, "far", 3, 100));
    say("lseek end", lseek(fd, 0, SEEK_END));
    int second = open("data", O_RDONLY);
    say("open again", second);
    say("write read-only", write(second, "x", 1));
    say("close first", close(fd));
    say("open lowest free", fd = open("data", O_RDONLY));
    say("close", close(fd));
    say("close again", close(fd));
    say("read closed", read(fd, buffer, 1));
    say("write closed", write(fd, "x", 1));
    say("fstat closed", fstat(fd, &st));
    say("lseek closed", lseek(fd, 0, SEEK_SET));
    say("close second", close(second));
    say("open exclusive", open("data", O_WRONLY | O_CREAT | O_EXCL, 0600));
    say("open directory for writing", open(".", O_WRONLY));
    say("open the root exclusive", open("/", O_WRONLY | O_CREAT | O_EXCL, 0600));
    say("open below a file", open("data/below", O_RDONLY));
    int a = openat(AT_FDCWD, "data", O_RDONLY);
    say("openat", a);
    say("F_GETFL", fcntl(a, F_GETFL) & (O_ACCMODE | O_APPEND));
    say("close it", close(a));
    a = openat(AT_FDCWD, "data", O_RDWR | O_APPEND);
    say("openat again", a);
    say("F_GETFL of the second", fcntl(a, F_GETFL) & (O_ACCMODE | O_APPEND));
    say("openat missing", openat(AT_FDCWD, "missing", O_RDONLY));
    say("openat absolute missing", openat(AT_FDCWD, "/nonexistent-clowder-test/x", O_RDONLY));
    int d = dup(a);
    say("dup", d);
    say("close the dup's original", close(a));
    say("read through the dup", pread(d, buffer, 5, 0));
    int again = open("data", O_RDONLY);
    say("open takes the original's number", again == a ? 0 : -1);
    int high = fcntl(d, F_DUPFD, 100);
    say("F_DUPFD 100", high >= 100 ? 0 : -1);
    say("close it", close(high));
    say("close the dup", close(d));
    say("close the reopened", close(again));
    int pipes[2];
    say("pipe", pipe(pipes));
    printf("pipe ends %d %d\n", pipes[0], pipes[1]);
    say("open beside the pipe", fd = open("data", O_RDONLY));
    say("close a pipe end", close(pipes[0]));
    say("open in the pipe's place", again = open("data", O_RDONLY));
    say("close it", close(again));
    say("close the other pipe end", close(pipes[1]));
    pid_t child = fork();
    if (child == 0)
        _exit(close(fd) == 0 ? 0 : 1);
    int status = 0;
    waitpid(child, &status, 0);
    say("the child's close", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    say("read after the child's close", pread(fd, buffer, 5, 0));
    say("close after fork", close(fd));
    struct rlimit limit = {1024, 1024};
    setrlimit(RLIMIT_NOFILE, &limit);
    open_many();
    int cloexec = open("data", O_RDONLY | O_CLOEXEC), kept = open("data", O_RDONLY);
    say("F_GETFD of O_CLOEXEC", fcntl(cloexec, F_GETFD));
    say("F_GETFD", fcntl(kept, F_GETFD));
    fflush(stdout);
    char numbers[2][16];
    snprintf(numbers[0], sizeof numbers[0], "%d", cloexec);
    snprintf(numbers[1], sizeof numbers[1], "%d", kept);
    if (fork() == 0) {
        execl(argv[0], argv[0], "child", numbers[0], numbers[1], (char *)0);
        _exit(127);
    }
    wait(&status);
    say("the exec'd child's failed checks", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    say("unlink", unlink("data"));
    say("stat unlinked", stat("data", &st));
    return 0;
}
"#;

#[test]
fn file_calls_answer_as_on_the_host_from_ring_3_through_the_slots_and_the_channel() {
    let Some((dir, socket)) = enclave_test_daemon("clowder-file-calls", Liveness::default()) else { return };
    let program = build_musl_program(&dir.0, "calls", CALLS);
    let work = dir.0.join("work");
    std::fs::create_dir(&work).unwrap();
    let on_host = std::process::Command::new(&program).current_dir(&work).output().unwrap();
    assert!(on_host.status.success(), "{}", text(&on_host.stderr));
    let expected = text(&on_host.stdout);
    assert!(expected.contains("open missing: -1 ENOENT") && expected.contains("open lowest free: 3"), "{expected}");

    let program = program.to_str().unwrap();
    let mut differences = Vec::new();
    for (enclave, slots, ring3) in [("ring3", "on", "on"), ("kernel", "on", "off"), ("channel", "off", "off")] {
        // Read by the daemon when the enclave's kernel publishes its slots, at creation.
        std::env::set_var("CLOWDER_FILE_SLOTS", slots);
        std::env::set_var("CLOWDER_RING3_FILES", ring3);
        run_clowder_ok(&socket, &["enclave", "create", "--name", enclave, "--mem", "64M"], &work);
        std::env::remove_var("CLOWDER_FILE_SLOTS");
        std::env::remove_var("CLOWDER_RING3_FILES");
        let in_enclave = run_clowder(&socket, &["run", "--enclave", enclave, program], &work);
        if text(&in_enclave.stdout) != expected {
            differences.push(format!("{enclave}: {}{}", text(&in_enclave.stdout), text(&in_enclave.stderr)));
        }
        run_clowder_ok(&socket, &["enclave", "rm", enclave], &work);
    }
    assert!(differences.is_empty(), "expected (the host's):\n{expected}\ndifferent:\n{}", differences.join("\n"));
}
