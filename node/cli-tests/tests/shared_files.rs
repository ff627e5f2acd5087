//! MAP_SHARED mappings of host files from enclave jobs (issue 25, point 2): the file's own
//! pages are mapped, so two enclaves' jobs and a host process share a `/dev/shm` file
//! (`shm_open`, `ftruncate`, `mmap`) and see each other's writes as they happen, with no file
//! call on the data path: each takes its turn by polling a word of the mapping, writes its tag
//! and waits for the others'. Then, in an enclave: a forked child's writes through an inherited
//! mapping, 80 map/unmap cycles (a region per mapping, of which a job may hold 64: each
//! `munmap` must give its region back), and the refusals (a range past the file's end EINVAL,
//! a writable mapping of a read-only descriptor EACCES, and making one writable later EINVAL,
//! where Linux says EACCES). Needs /dev/kvm, the LWK image,
//! clowder-vmm and musl-gcc (skipped, with the reason, otherwise).

use std::process::{Command, Stdio};

use clowder_test_support::build_musl_program;
use clowderd::enclave::Liveness;
use support::{clowder, enclave_test_daemon, run_clowder_ok, text};

mod support;

const SHM: &str = r#"#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#define SIZE (4 << 20)
#define MIB (1 << 20)

static volatile unsigned *map_file(const char *name, int create) {
    int fd = shm_open(name, O_RDWR | (create ? O_CREAT : 0), 0600);
    if (fd < 0 || ftruncate(fd, SIZE) != 0) {
        printf("shm_open/ftruncate %s: %s\n", name, strerror(errno));
        exit(1);
    }
    void *memory = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (memory == MAP_FAILED) {
        printf("mmap %s: %s\n", name, strerror(errno));
        exit(1);
    }
    close(fd);
    return memory;
}

/* Waits (polling memory only) until the turn word is `turn`. */
static void wait_for_turn(volatile unsigned *turn_word, unsigned turn) {
    for (int waited = 0; __atomic_load_n(turn_word, __ATOMIC_ACQUIRE) != turn; waited++) {
        if (waited > 240000) {
            printf("gave up waiting for turn %u (at %u)\n", turn, *turn_word);
            exit(1);
        }
        struct timespec pause = {0, 500000};
        nanosleep(&pause, NULL);
    }
}

static int ring(const char *name, unsigned me, unsigned all) {
    volatile unsigned *shared = map_file(name, 1);
    wait_for_turn(shared, me);
    snprintf((char *)shared + (me + 1) * MIB / 2 + 123, 32, "tag of participant %u", me);
    __atomic_store_n(shared, me + 1, __ATOMIC_RELEASE);
    wait_for_turn(shared, all);
    for (unsigned other = 0; other < all; other++)
        printf("%u sees: %s\n", me, (char *)shared + (other + 1) * MIB / 2 + 123);
    return munmap((void *)shared, SIZE) == 0 ? 0 : 1;
}

static const char *errno_name(void) {
    return errno == EINVAL ? "EINVAL" : errno == EACCES ? "EACCES" : strerror(errno);
}

static int checks(const char *name) {
    volatile unsigned *shared = map_file(name, 1);
    shared[0] = 1;
    pid_t child = fork();
    if (child < 0) {
        printf("fork: %s\n", strerror(errno));
        return 1;
    }
    if (child == 0) {
        shared[1] = shared[0] + 41;
        _exit(0);
    }
    int status;
    waitpid(child, &status, 0);
    printf("a forked child wrote %u\n", shared[1]);
    munmap((void *)shared, SIZE);
    int cycles = 0;
    for (int i = 0; i < 80; i++) {
        volatile unsigned *again = map_file(name, 0);
        again[i + 2] = i;
        cycles += again[i + 2] == (unsigned)i && again[1] == 42;
        if (munmap((void *)again, SIZE) != 0)
            break;
    }
    printf("%d map/unmap cycles\n", cycles);
    int fd = shm_open(name, O_RDWR, 0);
    void *past_end = mmap(NULL, SIZE + 4096, PROT_READ, MAP_SHARED, fd, 0);
    printf("past the end: %s\n", past_end == MAP_FAILED ? errno_name() : "mapped");
    close(fd);
    fd = shm_open(name, O_RDONLY, 0);
    void *writable = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    printf("writable of read-only: %s\n", writable == MAP_FAILED ? errno_name() : "mapped");
    void *readable = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
    printf("read-only of read-only: %s, word %u\n", readable == MAP_FAILED ? errno_name() : "mapped",
           readable == MAP_FAILED ? 0 : ((unsigned *)readable)[1]);
    int made_writable = mprotect(readable, 4096, PROT_READ | PROT_WRITE);
    printf("made writable: %s\n", made_writable == 0 ? "yes" : errno_name());
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "ring") == 0)
        return ring(argv[2], atoi(argv[3]), atoi(argv[4]));
    if (argc == 3 && strcmp(argv[1], "checks") == 0)
        return checks(argv[2]);
    return 2;
}
"#;

#[test]
fn two_enclaves_and_a_host_process_share_a_dev_shm_file() {
    let Some((dir, socket)) = enclave_test_daemon("clowder-shared-files", Liveness::default()) else { return };
    let program = build_musl_program(&dir.0, "shm", SHM);
    let program = program.to_str().unwrap();
    let name = format!("/clowder-shared-files-{}", std::process::id());
    let file = format!("/dev/shm{name}");
    let _ = std::fs::remove_file(&file);
    for enclave in ["a", "b"] {
        run_clowder_ok(&socket, &["enclave", "create", "--name", enclave, "--mem", "128M"], &dir.0);
    }
    // All three at once: each waits for its turn in the file itself.
    let start = |command: &mut Command| command.current_dir(&dir.0).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let host = start(Command::new(program).args(["ring", &name, "0", "3"]));
    let enclaves: Vec<_> = ["a", "b"]
        .iter()
        .zip(["1", "2"])
        .map(|(enclave, me)| {
            start(Command::new(clowder()).env("CLOWDER_SOCKET", &socket).args([
                "run",
                "--enclave",
                enclave,
                program,
                "ring",
                &name,
                me,
                "3",
            ]))
        })
        .collect();
    for (who, child) in std::iter::once(("host", host)).chain(["a", "b"].into_iter().zip(enclaves)) {
        let output = child.wait_with_output().unwrap();
        let me = match who {
            "host" => 0,
            "a" => 1,
            _ => 2,
        };
        let expected: String = (0..3).map(|other| format!("{me} sees: tag of participant {other}\n")).collect();
        assert_eq!(text(&output.stdout), expected, "{who}: {}", text(&output.stderr));
        assert!(output.status.success(), "{who}: {}", text(&output.stderr));
    }

    let checked = run_clowder_ok(&socket, &["run", "--enclave", "a", program, "checks", &name], &dir.0);
    assert_eq!(
        text(&checked.stdout),
        "a forked child wrote 42\n80 map/unmap cycles\npast the end: EINVAL\nwritable of read-only: EACCES\nread-only of read-only: mapped, word 42\nmade writable: EINVAL\n",
        "{}",
        text(&checked.stderr)
    );
    // The host sees what the enclave's processes wrote.
    let bytes = std::fs::read(&file).unwrap();
    assert_eq!(u32::from_ne_bytes(bytes[4..8].try_into().unwrap()), 42);
    std::fs::remove_file(&file).unwrap();
    for enclave in ["a", "b"] {
        run_clowder_ok(&socket, &["enclave", "rm", enclave], &dir.0);
    }
}
