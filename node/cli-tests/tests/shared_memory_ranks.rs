//! Open MPI's shared-memory (vader) set-up between ranks in two LWK enclaves and on the host,
//! without MPI (`apps/mpi/shm_ring.c`): a job in enclave a creates a /dev/shm file as Open
//! MPI's shmem mmap component does (ftruncate to a size that is not whole pages, MAP_SHARED),
//! a job in enclave b and a host process map it later, and the three pass a counter round
//! through it, polling memory only. Each checks that no other has its pid: Open MPI takes a
//! segment whose creator has the caller's pid for the caller's own and maps nothing, which hung
//! vader between enclaves while every LWK numbered its processes from 1. A job's first process
//! has its launcher's host pid (`LaunchJob::pid`), which the test checks against `clowder
//! run`'s. Then, in one enclave job: the file grown after a first mapping, the same range
//! mapped twice, a mapping at an offset. Needs /dev/kvm, the LWK image, clowder-vmm and
//! musl-gcc (skipped, with the reason, otherwise).

use std::process::{Command, Stdio};

use clowder_test_support::build_musl_program;
use clowderd::enclave::Liveness;
use support::{clowder, enclave_test_daemon, run_clowder_ok, text};

mod support;

const SHM_RING: &str = include_str!("../../../apps/mpi/shm_ring.c");

#[test]
fn ranks_in_two_enclaves_and_on_the_host_share_a_segment_with_distinct_pids() {
    let Some((dir, socket)) = enclave_test_daemon("clowder-shm-ranks", Liveness::default()) else { return };
    let program = build_musl_program(&dir.0, "shm_ring", SHM_RING);
    let program = program.to_str().unwrap();
    let file = format!("/dev/shm/clowder-shm-ranks-{}", std::process::id());
    for enclave in ["a", "b"] {
        run_clowder_ok(&socket, &["enclave", "create", "--name", enclave, "--mem", "128M"], &dir.0);
    }
    let start = |command: &mut Command| command.current_dir(&dir.0).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let ring = |me: &'static str| ["ring", file.as_str(), me, "3", "200"];
    let in_enclave = |enclave: &str, me: &'static str| {
        start(Command::new(clowder()).env("CLOWDER_SOCKET", &socket).args(["run", "--enclave", enclave, program]).args(ring(me)))
    };
    // The creator first, as in MPI_Init; the others wait for its file.
    let creator = in_enclave("a", "0");
    let peer = in_enclave("b", "1");
    let host = start(Command::new(program).args(ring("2")));
    let ended: Vec<_> = [creator, peer, host].into_iter().map(|child| (child.id(), child.wait_with_output().unwrap())).collect();
    let said: Vec<String> = ended.iter().map(|(_, output)| text(&output.stdout) + &text(&output.stderr)).collect();
    let left = std::fs::remove_file(&file).is_ok();
    for (me, (launcher, output)) in ended.iter().enumerate() {
        let expected = format!("ring {me} of 3: pid {launcher}, 200 rounds, ");
        assert!(output.status.success() && said[me].starts_with(&expected), "participant {me}: expected {expected:?}; all said {said:#?}");
    }
    assert!(!left, "the creator removes its file at the end");

    let checks = format!("{file}-checks");
    let checked = run_clowder_ok(&socket, &["run", "--enclave", "b", program, "checks", &checks], &dir.0);
    assert_eq!(text(&checked.stdout), "checks: grown file, two mappings, offset mapping, pread: all see each other's stores\n");
    for enclave in ["a", "b"] {
        run_clowder_ok(&socket, &["enclave", "rm", enclave], &dir.0);
    }
}
