//! `clowder run` as a launcher's rank (issue 25): `mpirun` and `srun` start it with their
//! variables and read its end. The job sees the launcher's variables (`--env` still wins, other
//! variables stay out); a job that dies of a signal ends `clowder run` by the same signal, so
//! the launcher reports a crashed rank; a `clowder run` killed by the launcher ends its job, and
//! the enclave runs the next one. The daemon runs in this process on a socket in a temp dir.

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clowder_api::client::Client;
use clowder_test_support::build_musl_program;
use clowderd::enclave::Liveness;
use serde_json::{json, Value};
use support::{clowder, enclave_test_daemon, run_clowder, run_clowder_ok, text};

mod support;

/// `rank env NAME...` prints each NAME=value (or NAME unset); `rank segv` writes through a null
/// pointer; `rank spin` says so and spins.
const RANK: &str = r#"#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "env")) {
        for (int i = 2; i < argc; i++) {
            const char *value = getenv(argv[i]);
            printf("%s%s%s\n", argv[i], value ? "=" : " unset", value ? value : "");
        }
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "segv")) {
        *(volatile int *)0 = 1;
        return 0;
    }
    printf("spinning\n");
    fflush(stdout);
    for (;;) {}
}
"#;

fn jobs_of(socket: &std::path::Path, name: &str) -> u64 {
    let list: Value = Client::connect_to(socket).unwrap().call(&json!({"op": "ls"})).unwrap();
    let enclave = list["enclaves"].as_array().unwrap().iter().find(|e| e["name"] == name).cloned();
    enclave.unwrap_or_else(|| panic!("enclave {name} is gone: {list}"))["jobs"].as_u64().unwrap()
}

#[test]
fn a_launchers_rank_gets_its_variables_and_the_launcher_gets_the_ranks_end() {
    let Some((dir, socket)) = enclave_test_daemon("clowder-cli-launcher", Liveness::default()) else {
        return;
    };
    build_musl_program(&dir.0, "rank", RANK);
    run_clowder_ok(&socket, &["enclave", "create", "--name", "a", "--cores", "1", "--mem", "64M"], &dir.0);

    // The launcher's families pass, --env overrides one of them, and the rest stay out.
    let env = Command::new(clowder())
        .args(["run", "--enclave", "a", "--env", "SLURM_PROCID=9", "./rank", "env"])
        .args(["OMPI_COMM_WORLD_RANK", "PMIX_NAMESPACE", "SLURM_PROCID", "UNRELATED"])
        .current_dir(&dir.0)
        .env("CLOWDER_SOCKET", &socket)
        .env("OMPI_COMM_WORLD_RANK", "3")
        .env("PMIX_NAMESPACE", "prterun-x-1@1")
        .env("SLURM_PROCID", "5")
        .env("UNRELATED", "1")
        .output()
        .unwrap();
    assert!(env.status.success(), "{}", text(&env.stderr));
    assert_eq!(text(&env.stdout), "OMPI_COMM_WORLD_RANK=3\nPMIX_NAMESPACE=prterun-x-1@1\nSLURM_PROCID=9\nUNRELATED unset\n");

    // A rank that crashes: clowder run dies of the same signal, as the rank would on the host.
    let crashed = run_clowder(&socket, &["run", "--enclave", "a", "./rank", "segv"], &dir.0);
    assert_eq!(crashed.status.signal(), Some(11), "{:?}: {}", crashed.status, text(&crashed.stderr));

    // The launcher ends the rank's clowder run (SIGTERM, as mpirun does): the job ends with it.
    for signal in [libc::SIGTERM, libc::SIGKILL] {
        let mut rank = Command::new(clowder())
            .args(["run", "--enclave", "a", "./rank", "spin"])
            .current_dir(&dir.0)
            .env("CLOWDER_SOCKET", &socket)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut said = [0u8; 9];
        std::io::Read::read_exact(rank.stdout.as_mut().unwrap(), &mut said).unwrap();
        assert_eq!(&said, b"spinning\n");
        assert_eq!(jobs_of(&socket, "a"), 1);
        unsafe { libc::kill(rank.id() as i32, signal) };
        assert_eq!(rank.wait().unwrap().signal(), Some(signal));
        let deadline = Instant::now() + Duration::from_secs(10);
        while jobs_of(&socket, "a") != 0 {
            assert!(Instant::now() < deadline, "the job outlived its clowder run (signal {signal}) by 10 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    // The enclave survives all of it and runs the next job.
    let next = run_clowder_ok(&socket, &["run", "--enclave", "a", "./rank", "env", "OMPI_COMM_WORLD_RANK"], &dir.0);
    assert_eq!(text(&next.stdout), "OMPI_COMM_WORLD_RANK unset\n");
    run_clowder_ok(&socket, &["enclave", "rm", "a"], &dir.0);
}
