//! statfs and fstatfs of host paths from an enclave job answer as on the host (issue 25: Open
//! MPI's `mmap` shared-memory component and UCX's `posix` transport ask it of /dev/shm): one
//! static program prints the stable fields (type, block size, blocks, name length, fragment
//! size, flags; not the free counts, which others change) of /dev/shm, the working directory (by
//! its absolute path: "." names the job's own file system) and an open file, and the errors of
//! a missing path and a closed descriptor; in an enclave it must print the same as on the host. Needs /dev/kvm, the LWK image, clowder-vmm and musl-gcc
//! (skipped, with the reason, otherwise).

use clowder_test_support::build_musl_program;
use clowderd::enclave::Liveness;
use support::{enclave_test_daemon, run_clowder, run_clowder_ok, text};

mod support;

const CALLS: &str = r#"#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/vfs.h>
#include <unistd.h>
static void show(const char *what, int result, const struct statfs *fs) {
    if (result < 0) {
        printf("%s: -1 %s\n", what, strerror(errno));
        return;
    }
    printf("%s: type %#lx bsize %ld blocks %lu namelen %ld frsize %ld flags %#lx\n", what, (long)fs->f_type,
           (long)fs->f_bsize, (unsigned long)fs->f_blocks, (long)fs->f_namelen, (long)fs->f_frsize, (long)fs->f_flags);
}
int main(void) {
    struct statfs fs;
    show("statfs /dev/shm", statfs("/dev/shm", &fs), &fs);
    char cwd[4096];
    show("statfs of the working directory", statfs(getcwd(cwd, sizeof cwd), &fs), &fs);
    int fd = open("/dev/shm", O_RDONLY | O_DIRECTORY);
    show("fstatfs /dev/shm", fstatfs(fd, &fs), &fs);
    close(fd);
    show("fstatfs closed", fstatfs(fd, &fs), &fs);
    show("statfs missing", statfs("missing/file", &fs), &fs);
    return 0;
}
"#;

#[test]
fn statfs_of_host_paths_answers_as_on_the_host() {
    let Some((dir, socket)) = enclave_test_daemon("clowder-statfs", Liveness::default()) else { return };
    let program = build_musl_program(&dir.0, "statfs", CALLS);
    // Not the program's own directory, which the job's in-memory file system holds.
    let work = dir.0.join("work");
    std::fs::create_dir(&work).unwrap();
    let on_host = std::process::Command::new(&program).current_dir(&work).output().unwrap();
    assert!(on_host.status.success(), "{}", text(&on_host.stderr));
    let expected = text(&on_host.stdout);
    assert!(expected.contains("statfs /dev/shm: type 0x1021994"), "tmpfs on the host: {expected}");
    run_clowder_ok(&socket, &["enclave", "create", "--name", "a", "--mem", "64M"], &dir.0);
    let in_enclave = run_clowder(&socket, &["run", "--enclave", "a", program.to_str().unwrap()], &work);
    assert_eq!(text(&in_enclave.stdout), expected, "{}", text(&in_enclave.stderr));
    run_clowder_ok(&socket, &["enclave", "rm", "a"], &dir.0);
}
