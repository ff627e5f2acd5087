//! Forwarded file calls answer as Linux does (issue 21, point 3), on each of the enclave's
//! paths: the job's ring-3 calls the daemon serves from its request page (the default, on
//! PVM hosts; the calls the daemon does not take in time, and the others, through the kernel),
//! the kernel's file-call slots alone (`CLOWDER_RING3_FILES=off`: the kernel path) and the
//! channel (`CLOWDER_FILE_SLOTS=off`). One static program makes open, stat, fstat, close, lseek, read,
//! write, pread and pwrite calls on host files, good and bad (missing files, closed and
//! read-only descriptors, bad offsets and whences, a directory, a bad buffer), and prints each
//! result with its errno; on the host and in both enclaves it must print the same. Needs
//! /dev/kvm, the LWK image, clowder-vmm and musl-gcc (skipped, with the reason, otherwise).

use clowder_test_support::build_musl_program;
use clowderd::enclave::Liveness;
use support::{enclave_test_daemon, run_clowder, run_clowder_ok, text};

mod support;

const CALLS: &str = r#"#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
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
int main(void) {
    char buffer[64] = {0};
    struct stat st;
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
    say("open below a file", open("data/below", O_RDONLY));
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
    for (enclave, slots, ring3) in [("ring3", "on", "on"), ("kernel", "on", "off"), ("channel", "off", "off")] {
        // Read by the daemon when the enclave's kernel publishes its slots, at creation.
        std::env::set_var("CLOWDER_FILE_SLOTS", slots);
        std::env::set_var("CLOWDER_RING3_FILES", ring3);
        run_clowder_ok(&socket, &["enclave", "create", "--name", enclave, "--mem", "64M"], &work);
        std::env::remove_var("CLOWDER_FILE_SLOTS");
        std::env::remove_var("CLOWDER_RING3_FILES");
        let in_enclave = run_clowder(&socket, &["run", "--enclave", enclave, program], &work);
        assert_eq!(text(&in_enclave.stdout), expected, "{enclave}: {}", text(&in_enclave.stderr));
        run_clowder_ok(&socket, &["enclave", "rm", enclave], &work);
    }
}
