//! `clowder enclave create` of an enclave large enough that populating its memory takes a
//! moment (2 GiB of 4 KiB pages: seconds on this machine) shows how far it got (issue 23): the
//! daemon sends `progress` events before the reply to a client that asks for them, with figures
//! that only go up; the CLI prints one line per report when stderr is not a terminal, and
//! none with `--json`, whose output is the daemon's lines alone and which asks for none. The
//! daemon runs in this process on a socket in a temp directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use clowder_api::client::Client;
use clowder_api::daemon::{JobEvent, Named, Request};
use clowder_test_support::{lwk_daemon, serve, skipped, why_enclaves_cannot_boot, TempDir};
use clowderd::enclave::Liveness;
use serde_json::json;
use support::vmm_binary;

mod support;

const MEM_MIB: u64 = 2048;

fn clowder(socket: &Path, args: &[&str]) -> Output {
    Command::new(support::clowder()).args(args).env("CLOWDER_SOCKET", socket).output().unwrap()
}

fn start_daemon(dir: &Path) -> PathBuf {
    serve(lwk_daemon(dir, vmm_binary(), Liveness::default()), dir)
}

fn remove(socket: &Path, name: &str) {
    let removed = clowder(socket, &["enclave", "rm", name]);
    assert!(removed.status.success(), "rm {name}: {}", String::from_utf8_lossy(&removed.stderr));
}

/// The (done, total) pairs of a list of progress reports, checked to be sane: each total the
/// enclave's memory, done rising and never past it, time going on.
fn check_monotonic(reports: &[(u64, u64, u64)]) {
    assert!(!reports.is_empty(), "no progress before the reply");
    for pair in reports.windows(2) {
        let ((done, _, ms), (next_done, _, next_ms)) = (pair[0], pair[1]);
        assert!(next_done >= done && next_ms >= ms, "progress went back: {reports:?}");
    }
    for &(done, total, _) in reports {
        assert!(total == MEM_MIB && done > 0 && done <= total, "insane figures: {reports:?}");
    }
}

#[test]
fn create_shows_progress_while_memory_is_populated() {
    if skipped(why_enclaves_cannot_boot(&vmm_binary())) {
        return;
    }
    let dir = TempDir::new("clowder-cli-progress");
    let socket = start_daemon(&dir.0);

    // The API: events before the reply, in order.
    let request = json!({"op": "create", "name": "api", "mem": MEM_MIB << 20, "progress": true});
    let mut client = Client::connect_to(&socket).unwrap();
    let mut reports = Vec::new();
    let reply = client.call_streaming(&request, &[], &mut |line| match serde_json::from_value::<JobEvent>(line.clone()) {
        Ok(JobEvent::Progress { done_mib, total_mib, elapsed_ms }) => reports.push((done_mib, total_mib, elapsed_ms)),
        other => panic!("an event other than progress before create's reply: {line} ({other:?})"),
    });
    let reply = reply.unwrap();
    assert_eq!(reply["ok"], true, "{reply}");
    check_monotonic(&reports);
    // An old client's create (no `progress`) gets its reply as the first line.
    let quiet = client.call(&Request::Rm(Named { name: "api".into() })).unwrap();
    assert_eq!(quiet["ok"], true, "{quiet}");

    // The CLI, stderr a pipe: one line per report, then the result on stdout.
    let created = clowder(&socket, &["enclave", "create", "--name", "cli", "--mem", &format!("{MEM_MIB}M")]);
    let stderr = String::from_utf8_lossy(&created.stderr);
    assert!(created.status.success(), "create: {stderr}");
    assert!(!stderr.contains('\r'), "a carriage return in a pipe: {stderr:?}");
    let reports: Vec<(u64, u64, u64)> = stderr
        .lines()
        .filter_map(|line| line.strip_prefix("clowder: populating memory: "))
        .map(|line| {
            let words: Vec<&str> = line.split(' ').collect();
            let seconds: f64 = words[6].parse().unwrap();
            (words[0].parse().unwrap(), words[2].parse().unwrap(), (seconds * 1000.0) as u64)
        })
        .collect();
    check_monotonic(&reports);
    assert!(String::from_utf8_lossy(&created.stdout).starts_with("created enclave cli"), "{created:?}");
    remove(&socket, "cli");

    // --json: the daemon's lines alone, and no progress among them.
    let json = clowder(&socket, &["--json", "enclave", "create", "--name", "json", "--mem", &format!("{MEM_MIB}M")]);
    assert!(json.status.success(), "create --json: {}", String::from_utf8_lossy(&json.stderr));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&json.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(lines.len() == 1 && lines[0]["ok"] == true, "{lines:?}");
    assert!(json.stderr.is_empty(), "{}", String::from_utf8_lossy(&json.stderr));
    remove(&socket, "json");
}
