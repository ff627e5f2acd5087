//! A host file truncated under an enclave job's MAP_SHARED mapping (issue 25 point 2): the
//! job maps 2 MiB of a `/dev/shm` file, the host truncates the file to nothing, and the job
//! then touches a page past the new end. That used to hang the job for good (PVM retried the
//! access inside KVM_RUN; a stock KVM fails it and the VM stopped); now the VMM gives the
//! mapping zero pages there and logs the file's name, the job runs on (and its next mmap of
//! the now empty file is refused, EINVAL), its enclave runs the next job and another enclave is untouched.
//! (Linux kills the process by SIGBUS: not yet done, docs/lwk-syscalls.md's mmap row.) Needs
//! /dev/kvm, the LWK image, clowder-vmm and musl-gcc (skipped, with the reason, otherwise).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clowder_test_support::build_musl_program;
use clowderd::enclave::Liveness;
use support::{clowder, enclave_test_daemon, run_clowder, run_clowder_ok, text};

mod support;

/// `touch NAME`: maps 2 MiB of the shm file NAME, writes "mapped" at its start, waits (by
/// fstat, up to 60 s) until the host truncated the file, then reads a byte 1 MiB in and maps
/// the (now empty) file again.
/// `hello`: prints hello.
const TOUCH: &str = r#"#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#define SIZE (2 << 20)
int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "hello") == 0) return puts("hello") < 0;
    if (argc != 3 || strcmp(argv[1], "touch") != 0) return 2;
    int fd = shm_open(argv[2], O_RDWR | O_CREAT, 0600);
    if (fd < 0 || ftruncate(fd, SIZE) != 0) return 3;
    volatile char *memory = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (memory == MAP_FAILED) return 4;
    memory[SIZE / 2] = 7;
    strcpy((char *)memory, "mapped");
    struct stat st;
    for (int i = 0; i < 60000; i++) {
        if (fstat(fd, &st) != 0) return 5;
        if (st.st_size == 0) break;
        usleep(1000);
    }
    printf("truncated to %ld\n", (long)st.st_size);
    fflush(stdout);
    printf("read %d after the end\n", memory[SIZE / 2]);
    void *again = mmap(NULL, SIZE, PROT_READ, MAP_SHARED, fd, 0);
    printf("mapping it again: %s\n", again != MAP_FAILED ? "mapped" : errno == EINVAL ? "EINVAL" : strerror(errno));
    return 0;
}
"#;

#[test]
fn truncating_a_mapped_file_under_a_job_leaves_its_vm_and_enclaves_running() {
    let Some((dir, socket)) = enclave_test_daemon("clowder-shared-truncate", Liveness::default()) else { return };
    let program = build_musl_program(&dir.0, "touch", TOUCH);
    let program = program.to_str().unwrap();
    let name = format!("/clowder-shared-truncate-{}", std::process::id());
    let file = format!("/dev/shm{name}");
    let _ = std::fs::remove_file(&file);
    for enclave in ["a", "b"] {
        run_clowder_ok(&socket, &["enclave", "create", "--name", enclave, "--mem", "128M"], &dir.0);
    }
    let job = Command::new(clowder())
        .env("CLOWDER_SOCKET", &socket)
        .args(["run", "--enclave", "a", program, "touch", &name])
        .current_dir(&dir.0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Once the job wrote through its mapping, the host takes the file's pages away.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read(&file).is_ok_and(|bytes| bytes.starts_with(b"mapped")) {
        assert!(Instant::now() < deadline, "the job never wrote through its mapping");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::File::options().write(true).open(&file).unwrap().set_len(0).unwrap();
    let output = job.wait_with_output().unwrap();
    std::fs::remove_file(&file).unwrap();
    // The byte written before the truncation is gone: a zero page, not the VM's end.
    assert_eq!(text(&output.stdout), "truncated to 0\nread 0 after the end\nmapping it again: EINVAL\n", "{}", text(&output.stderr));
    assert!(output.status.success(), "{:?}: {}", output.status, text(&output.stderr));

    // Both enclaves stay usable: the job's own one and the other.
    for enclave in ["a", "b"] {
        let next = run_clowder(&socket, &["run", "--enclave", enclave, program, "hello"], &dir.0);
        assert_eq!(text(&next.stdout), "hello\n", "enclave {enclave} after the truncation: {}", text(&next.stderr));
    }
    let logs = text(&run_clowder(&socket, &["logs", "a"], &dir.0).stdout);
    assert!(logs.contains(&format!("{file} was truncated to 0 bytes")), "no line naming the file in the log: {logs}");
    for enclave in ["a", "b"] {
        run_clowder_ok(&socket, &["enclave", "rm", enclave], &dir.0);
    }
}
