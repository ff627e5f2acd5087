//! What one user's enclaves and jobs keep from other users: a job's arguments and environment
//! are on no process's command line (a one-shot enclave's VMM reads its kernel command line
//! from a private descriptor); an enclave is used and removed only by its owner, the group it
//! is shared with, and root, who alone read its log; a job's arguments in it, and what a
//! one-shot job runs, only the job's owner and root see. The daemon runs in this process on a socket in a temp directory; the users are
//! unprivileged uids the CLI runs as (setpriv). Needs /dev/kvm, the LWK image, clowder-vmm and
//! musl-gcc (skipped, with the reason, otherwise).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use clowder_test_support::build_musl_program;
use clowder_test_support::{daemon_config, kernel_image, serve, TempDir};
use clowderd::client::Client;
use clowderd::daemon::Daemon;
use clowderd::enclave::Liveness;
use clowderd::machine::VmmLauncher;
use serde_json::{json, Value};
use support::{enclave_test_daemon, skipped_without, text, vmm_binary};

mod support;

/// Says what it was given, then sleeps `argv[2]` seconds (3 without).
const TELL_AND_SLEEP: &str = r#"#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(int argc, char **argv) {
    printf("token %s arg %s\n", getenv("API_TOKEN"), argc > 1 ? argv[1] : "none");
    fflush(stdout);
    sleep(argc > 2 ? atoi(argv[2]) : 3);
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
    let Some((dir, socket)) = enclave_test_daemon("clowder-privacy-cmdline", Liveness::default()) else { return };
    let program = build_musl_program(&dir.0, "tell", TELL_AND_SLEEP);
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

/// The group whose members may create enclaves in this test's daemon, and one to share with.
const ADMINS: u32 = 4242;
const SHARERS: u32 = 4343;

/// An unprivileged user of the daemon at `socket`, running the CLI in `dir`.
struct User<'a> {
    uid: u32,
    groups: &'a [u32],
    socket: &'a Path,
    dir: &'a Path,
}

impl User<'_> {
    fn command(&self, args: &[&str]) -> Command {
        let groups: Vec<String> = self.groups.iter().map(u32::to_string).collect();
        let mut command = Command::new("setpriv");
        command
            .args(["--reuid", &self.uid.to_string(), "--regid", &self.uid.to_string(), "--groups", &groups.join(",")])
            .arg(support::clowder())
            .args(args)
            .env("CLOWDER_SOCKET", self.socket)
            .current_dir(self.dir);
        command
    }

    fn clowder(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    /// `--json` output, one value per line.
    fn json(&self, args: &[&str]) -> Vec<Value> {
        let mut line = vec!["--json"];
        line.extend(args);
        let output = self.clowder(&line);
        String::from_utf8_lossy(&output.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }
}

fn denied(output: &Output, uid: u32) -> bool {
    output.status.code() == Some(1) && text(&output.stderr).contains(&format!("permission denied: you (uid {uid})"))
}

#[test]
fn enclaves_belong_to_their_creator_and_logs_to_the_jobs_owner() {
    if skipped_without("setpriv", "to act as unprivileged users") {
        return;
    }
    let dir = TempDir::new("clowder-privacy-owners");
    std::fs::set_permissions(&dir.0, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut config = daemon_config(vmm_binary(), kernel_image(), Liveness::default());
    config.admin_group = Some(ADMINS);
    let launcher = VmmLauncher { vmm: vmm_binary(), kernel: kernel_image(), runtime_dir: dir.0.clone() };
    let socket = serve(Daemon::new(config, Box::new(launcher)), &dir.0);
    build_musl_program(&dir.0, "tell", TELL_AND_SLEEP);
    let alice = User { uid: 4001, groups: &[ADMINS, SHARERS], socket: &socket, dir: &dir.0 };
    let bob = User { uid: 4002, groups: &[ADMINS, SHARERS], socket: &socket, dir: &dir.0 };
    let carol = User { uid: 4003, groups: &[ADMINS], socket: &socket, dir: &dir.0 };
    let root = |request: Value| Client::connect_to(&socket).unwrap().call(&request).unwrap();

    // Alice's own enclave: bob may see it, not use or remove it, nor read its log.
    let created = alice.clowder(&["enclave", "create", "--name", "mine", "--mem", "64M"]);
    assert!(created.status.success(), "{}", text(&created.stderr));
    let listing = bob.json(&["enclave", "ls"]);
    let mine = &listing[0]["enclaves"][0];
    assert_eq!((mine["name"].as_str(), mine["owner_uid"].as_u64(), &mine["share_group"]), (Some("mine"), Some(4001), &Value::Null));
    assert!(text(&bob.clowder(&["enclave", "ls"]).stdout).contains("OWNER"));
    assert!(denied(&bob.clowder(&["enclave", "rm", "mine"]), 4002));
    assert!(denied(&bob.clowder(&["run", "--enclave", "mine", "./tell", "bob"]), 4002));
    let job = alice.clowder(&["run", "--enclave", "mine", "./tell", "alice-secret", "0"]);
    assert!(text(&job.stdout).contains("arg alice-secret"), "{}{}", text(&job.stdout), text(&job.stderr));
    let bobs_look = bob.clowder(&["logs", "mine"]);
    assert!(denied(&bobs_look, 4002), "{}", text(&bobs_look.stderr));
    assert!(!text(&bobs_look.stdout).contains("alice-secret"));
    assert!(text(&alice.clowder(&["logs", "mine"]).stdout).contains("alice-secret"), "the owner reads her log");

    // Bob's one-shot job: alice sees it exists, not what it runs nor its log.
    let mut bobs_job = bob.command(&["run", "./tell", "bob-secret", "4"]).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let one_shot = loop {
        let listing = alice.json(&["enclave", "ls"]);
        let found = listing[0]["enclaves"].as_array().unwrap().iter().find(|e| e["mode"] == "one-shot").cloned();
        if let Some(found) = found {
            break found;
        }
        assert!(std::time::Instant::now() < deadline, "bob's one-shot enclave never showed up");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!((one_shot["state"].as_str(), one_shot["owner_uid"].as_u64()), (Some("running"), Some(4002)), "{one_shot}");
    let name = one_shot["name"].as_str().unwrap();
    assert!(denied(&alice.clowder(&["logs", name]), 4001));
    assert!(denied(&alice.clowder(&["enclave", "rm", name]), 4001));
    let seen_by_bob = bob.json(&["enclave", "ls"]);
    assert!(seen_by_bob[0]["enclaves"].as_array().unwrap().iter().any(|e| e["state"] == "running ./tell"), "{seen_by_bob:?}");
    assert!(bobs_job.wait().unwrap().success());

    // Root may do anything.
    assert_eq!(root(json!({"op": "logs", "name": "mine"}))["ok"], true);
    assert_eq!(root(json!({"op": "rm", "name": "mine"}))["ok"], true);

    // Shared with a group: its members use and remove it; one may share only with one's own group.
    let refused = carol.clowder(&["enclave", "create", "--name", "c", "--mem", "64M", "--share-group", &SHARERS.to_string()]);
    assert!(text(&refused.stderr).contains("uid 4003) are not in group 4343"), "{}", text(&refused.stderr));
    let shared = alice.clowder(&["enclave", "create", "--name", "shared", "--mem", "64M", "--share-group", &SHARERS.to_string()]);
    assert!(shared.status.success(), "{}", text(&shared.stderr));
    assert!(denied(&carol.clowder(&["run", "--enclave", "shared", "./tell", "carol", "0"]), 4003));
    let bobs_run = bob.clowder(&["run", "--enclave", "shared", "./tell", "bob-shared", "0"]);
    assert!(text(&bobs_run.stdout).contains("arg bob-shared"), "{}", text(&bobs_run.stderr));
    let alices_run = alice.clowder(&["run", "--enclave", "shared", "./tell", "alice-shared", "0"]);
    assert!(text(&alices_run.stdout).contains("arg alice-shared"), "{}", text(&alices_run.stderr));
    // Each member reads the shared enclave's log, but only their own jobs' arguments.
    let (bobs_log, alices_log) = (text(&bob.clowder(&["logs", "shared"]).stdout), text(&alice.clowder(&["logs", "shared"]).stdout));
    assert!(bobs_log.contains("bob-shared") && !bobs_log.contains("alice-shared"), "{bobs_log}");
    assert!(alices_log.contains("alice-shared") && !alices_log.contains("bob-shared"), "{alices_log}");
    assert!(denied(&carol.clowder(&["logs", "shared"]), 4003));
    let removed = bob.clowder(&["enclave", "rm", "shared"]);
    assert!(removed.status.success(), "{}", text(&removed.stderr));
}
