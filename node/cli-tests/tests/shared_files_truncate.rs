//! A host file truncated under an enclave job's MAP_SHARED mapping (issue 25 point 2): the
//! job maps 2 MiB of a `/dev/shm` file, the host truncates the file to nothing, and the job
//! then touches a page past the new end. As on Linux, that touch is SIGBUS: a handler sees
//! `BUS_ADRERR` and the address, and a job without one dies of it (clowder run too); its next
//! mmap of the now empty file is refused (EINVAL), its enclave runs the next job and another
//! enclave is untouched. The host tells the kernel asynchronously (within ~20 ms), so the test
//! lets the job touch only once the kernel's log says the pages are gone; a touch before that
//! reads the VMM's zero pages (docs/lwk-syscalls.md's mmap row). Needs /dev/kvm, the LWK
//! image, clowder-vmm and musl-gcc (skipped, with the reason, otherwise).
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use clowder_test_support::build_musl_program;
use clowderd::enclave::Liveness;
use support::{clowder, enclave_test_daemon, run_clowder, run_clowder_ok, text};

mod support;

/// `touch NAME GO caught|uncaught`: maps 2 MiB of the shm file NAME, writes "mapped" at its
/// start, waits (up to 60 s) for the file GO, then says the file's size and reads a byte 1 MiB
/// in: `caught` through a SIGBUS handler (then maps the now empty file again), `uncaught`
/// without one.
/// `hello`: prints hello.
const TOUCH: &str = r#"#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#define SIZE (2 << 20)
static sigjmp_buf back;
static siginfo_t seen;
static void on_bus(int signal, siginfo_t *info, void *context) {
    (void)signal, (void)context;
    seen = *info;
    siglongjmp(back, 1);
}
int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "hello") == 0) return puts("hello") < 0;
    if (argc != 5 || strcmp(argv[1], "touch") != 0) return 2;
    int fd = shm_open(argv[2], O_RDWR | O_CREAT, 0600);
    if (fd < 0 || ftruncate(fd, SIZE) != 0) return 3;
    volatile char *memory = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (memory == MAP_FAILED) return 4;
    memory[SIZE / 2] = 7;
    strcpy((char *)memory, "mapped");
    for (int i = 0; i < 60000 && access(argv[3], F_OK) != 0; i++) usleep(1000);
    struct stat st;
    if (fstat(fd, &st) != 0) return 5;
    printf("truncated to %ld\n", (long)st.st_size);
    fflush(stdout);
    if (strcmp(argv[4], "caught") == 0) {
        struct sigaction action = {.sa_sigaction = on_bus, .sa_flags = SA_SIGINFO};
        if (sigaction(SIGBUS, &action, NULL) != 0) return 6;
        if (sigsetjmp(back, 1) == 0) {
            printf("read %d after the end\n", memory[SIZE / 2]);
        } else {
            printf("SIGBUS: code %d (BUS_ADRERR %d), at the address touched %d\n", seen.si_code, BUS_ADRERR,
                   seen.si_addr == (void *)(memory + SIZE / 2));
        }
        void *again = mmap(NULL, SIZE, PROT_READ, MAP_SHARED, fd, 0);
        printf("mapping it again: %s\n", again != MAP_FAILED ? "mapped" : errno == EINVAL ? "EINVAL" : strerror(errno));
        return 0;
    }
    printf("read %d after the end\n", memory[SIZE / 2]);
    return 0;
}
"#;

/// What the kernel logs once it has unmapped a truncated file's pages from the job.
const UNMAPPED: &str = "unmapped (SIGBUS)";

/// Runs `touch` in enclave `a` (`how`: caught or uncaught): once the job wrote through its
/// mapping the host truncates the file to nothing, and once the kernel says (its `times`th
/// such line in the log) the pages are gone, lets the job touch them. The job's output.
fn truncate_under_job(socket: &Path, dir: &Path, program: &str, how: &str, times: usize) -> Output {
    let name = format!("/clowder-shared-truncate-{}-{how}", std::process::id());
    let file = format!("/dev/shm{name}");
    let go = dir.join(format!("go-{how}"));
    let _ = std::fs::remove_file(&file);
    let job = Command::new(clowder())
        .env("CLOWDER_SOCKET", socket)
        .args(["run", "--enclave", "a", program, "touch", &name, go.to_str().unwrap(), how])
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read(&file).is_ok_and(|bytes| bytes.starts_with(b"mapped")) {
        assert!(Instant::now() < deadline, "the job never wrote through its mapping");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::File::options().write(true).open(&file).unwrap().set_len(0).unwrap();
    loop {
        let logs = text(&run_clowder(socket, &["logs", "a"], dir).stdout);
        if logs.matches(UNMAPPED).count() >= times {
            assert!(logs.contains(&format!("{file} was truncated to 0 bytes")), "no line naming the file in the log: {logs}");
            break;
        }
        assert!(Instant::now() < deadline, "the kernel never unmapped the truncated file's pages: {logs}");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::write(&go, b"").unwrap();
    let output = job.wait_with_output().unwrap();
    std::fs::remove_file(&file).unwrap();
    output
}

#[test]
fn a_touch_past_the_end_of_a_file_truncated_under_a_job_is_sigbus() {
    let Some((dir, socket)) = enclave_test_daemon("clowder-shared-truncate", Liveness::default()) else { return };
    let program = build_musl_program(&dir.0, "touch", TOUCH);
    let program = program.to_str().unwrap();
    for enclave in ["a", "b"] {
        run_clowder_ok(&socket, &["enclave", "create", "--name", enclave, "--mem", "128M"], &dir.0);
    }

    let caught = truncate_under_job(&socket, &dir.0, program, "caught", 1);
    assert_eq!(
        text(&caught.stdout),
        "truncated to 0\nSIGBUS: code 2 (BUS_ADRERR 2), at the address touched 1\nmapping it again: EINVAL\n",
        "{}",
        text(&caught.stderr)
    );
    assert!(caught.status.success(), "{:?}: {}", caught.status, text(&caught.stderr));

    // Without a handler the job dies of it: clowder run dies of the same signal.
    let uncaught = truncate_under_job(&socket, &dir.0, program, "uncaught", 2);
    assert_eq!(text(&uncaught.stdout), "truncated to 0\n", "{}", text(&uncaught.stderr));
    assert_eq!(uncaught.status.signal(), Some(libc::SIGBUS), "{:?}: {}", uncaught.status, text(&uncaught.stderr));

    // Both enclaves stay usable: the jobs' own one and the other.
    for enclave in ["a", "b"] {
        let next = run_clowder(&socket, &["run", "--enclave", enclave, program, "hello"], &dir.0);
        assert_eq!(text(&next.stdout), "hello\n", "enclave {enclave} after the truncation: {}", text(&next.stderr));
    }
    for enclave in ["a", "b"] {
        run_clowder_ok(&socket, &["enclave", "rm", enclave], &dir.0);
    }
}
