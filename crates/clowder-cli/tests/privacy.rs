//! What one user's job keeps from other users: its arguments and environment are on no
//! process's command line (a one-shot enclave's VMM reads its kernel command line from a
//! private descriptor). The daemon runs in this process on a socket in a temp directory; needs
//! /dev/kvm, the LWK image, clowder-vmm and musl-gcc (skipped, with the reason, otherwise).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use clowder_test_support::{lwk_daemon, serve, TempDir};
use clowderd::client::Client;
use clowderd::enclave::Liveness;
use serde_json::{json, Value};
use support::{missing_requirement, vmm_binary};

mod support;

/// Builds a static musl program from C source in `dir`.
fn build_program(dir: &Path, name: &str, source: &str) -> PathBuf {
    let source_path = dir.join(format!("{name}.c"));
    std::fs::write(&source_path, source).unwrap();
    let binary = dir.join(name);
    let status = Command::new("musl-gcc").args(["-static", "-O2", "-o"]).arg(&binary).arg(&source_path).status().unwrap();
    assert!(status.success(), "musl-gcc failed for {name}");
    binary
}

/// Says what it was given, then sleeps long enough for every command line to be looked at.
const TELL_AND_SLEEP: &str = r#"#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(int argc, char **argv) {
    printf("token %s arg %s\n", getenv("API_TOKEN"), argc > 1 ? argv[1] : "none");
    fflush(stdout);
    sleep(3);
    return 0;
}
"#;

/// Every process's command line that holds `secret`, as "PID: LINE".
fn command_lines_holding(secret: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(line) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let line = String::from_utf8_lossy(&line).replace('\0', " ");
        if line.contains(secret) {
            found.push(format!("{}: {line}", entry.file_name().to_string_lossy()));
        }
    }
    found
}

#[test]
fn a_jobs_arguments_and_environment_are_on_no_command_line() {
    if let Some(why) = missing_requirement() {
        eprintln!("skipped: {why}");
        return;
    }
    let dir = TempDir::new("clowder-privacy-cmdline");
    let socket = serve(lwk_daemon(&dir.0, vmm_binary(), Liveness::default()), &dir.0);
    let program = build_program(&dir.0, "tell", TELL_AND_SLEEP);
    let token = format!("tok{}en", std::process::id());
    let argument = format!("arg{}ument", std::process::id());

    // The job goes through the API, so that not even a client's command line holds them.
    let job = {
        let (socket, token, argument) = (socket.clone(), token.clone(), argument.clone());
        std::thread::spawn(move || {
            let binary = File::open(&program).unwrap();
            let cwd = File::open(program.parent().unwrap()).unwrap();
            let request = json!({"op": "run", "argv": ["./tell", argument], "env": [format!("API_TOKEN={token}")], "cwd": "/"});
            let mut output = String::new();
            let reply = Client::connect_to(&socket)
                .unwrap()
                .call_streaming(&request, &[binary.as_raw_fd(), cwd.as_raw_fd()], &mut |event: &Value| {
                    output.push_str(event["text"].as_str().unwrap_or(""));
                })
                .unwrap();
            (reply, output)
        })
    };
    let mut looked_while_running = 0;
    while !job.is_finished() {
        let listing = Client::connect_to(&socket).unwrap().call(&json!({"op": "ls"})).unwrap();
        let running = listing["enclaves"].as_array().unwrap().iter().any(|e| e["pid"].is_u64());
        for secret in [&token, &argument] {
            let holders = command_lines_holding(secret);
            assert!(holders.is_empty(), "{secret} is on a command line: {holders:?}");
        }
        if running {
            looked_while_running += 1;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let (reply, output) = job.join().unwrap();
    assert_eq!(reply["status"], 0, "{reply}");
    assert!(output.contains(&format!("token {token} arg {argument}")), "the job was given them all the same: {output:?}");
    assert!(looked_while_running > 5, "the command lines were looked at while the enclave ran only {looked_while_running} times");
}
