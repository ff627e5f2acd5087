//! Small mistakes of the CLI and the API that used to be answered wrongly (issue 22): `--cores 0`,
//! many `--file` inputs, a missing program after an enclave's name, and persistent enclaves
//! named like one-shot ones. The daemon runs in this process on a socket in a temp directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use clowder_test_support::{lwk_daemon, serve, TempDir};
use clowderd::client::Client;
use clowderd::enclave::Liveness;
use serde_json::json;
use support::{missing_requirement, vmm_binary};

mod support;

fn start_daemon(dir: &Path) -> PathBuf {
    let liveness = Liveness { hello_timeout: Duration::from_secs(10), ..Liveness::default() };
    serve(lwk_daemon(dir, vmm_binary(), liveness), dir)
}

fn clowder(socket: &Path, args: &[&str], cwd: &Path) -> Output {
    Command::new(support::clowder()).args(args).current_dir(cwd).env("CLOWDER_SOCKET", socket).output().unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn cores_are_a_count_and_a_core_list_names_core_0() {
    let dir = TempDir::new("clowder-cli-cores");
    let socket = start_daemon(&dir.0);
    let zero = clowder(&socket, &["enclave", "create", "--name", "x", "--cores", "0", "--mem", "64M"], &dir.0);
    assert_eq!(zero.status.code(), Some(2));
    assert!(stderr(&zero).contains("name core 0 with --core-list 0"), "{}", stderr(&zero));
    let zero = clowder(&socket, &["run", "--cores", "0", "./prog"], &dir.0);
    assert!(stderr(&zero).contains("--core-list 0"), "{}", stderr(&zero));
    // The API: a number counts, a string names; 0 as a number says how to name core 0.
    let reply = Client::connect_to(&socket).unwrap().call(&json!({"op": "create", "name": "x", "cores": 0, "mem": "64M"})).unwrap();
    assert!(reply["error"].as_str().unwrap().contains("core list string such as \"0\""), "{reply}");
}

#[test]
fn many_input_files_are_all_delivered_or_refused_with_a_reason() {
    let dir = TempDir::new("clowder-cli-files");
    let socket = start_daemon(&dir.0);
    let mut args: Vec<String> = vec!["run".into(), "--enclave".into(), "ghost".into()];
    for index in 0..129 {
        let name = format!("input-{index}");
        std::fs::write(dir.0.join(&name), "x").unwrap();
        args.extend(["--file".into(), name]);
    }
    std::fs::write(dir.0.join("prog"), "not run").unwrap();
    let run = |files: usize| {
        let mut line: Vec<&str> = args[..3 + 2 * files].iter().map(String::as_str).collect();
        line.push("./prog");
        clowder(&socket, &line, &dir.0)
    };
    // 40 inputs (42 descriptors, more than one message holds) reach the daemon, which then
    // looks for the enclave.
    let forty = run(40);
    assert!(stderr(&forty).contains("no enclave named ghost"), "{}", stderr(&forty));
    let too_many = run(129);
    assert!(stderr(&too_many).contains("at most 128 --file inputs, not 129"), "{}", stderr(&too_many));

    // Straight to the API, more descriptors than a request may carry: a reason, not silence.
    let files: Vec<std::fs::File> = (0..140).map(|_| std::fs::File::open("/dev/null").unwrap()).collect();
    let fds: Vec<i32> = files.iter().map(std::os::fd::AsRawFd::as_raw_fd).collect();
    let request = json!({"op": "run", "enclave": "ghost", "argv": ["prog"], "cwd": "/"});
    let reply = Client::connect_to(&socket).unwrap().call_streaming(&request, &fds, &mut |_| {}).unwrap();
    assert!(reply["error"].as_str().unwrap().contains("more than 130 file descriptors"), "{reply}");
}

#[test]
fn an_environment_entry_taken_from_the_clis_environment_must_be_there() {
    let dir = TempDir::new("clowder-cli-env");
    let socket = start_daemon(&dir.0);
    let unset = clowder(&socket, &["run", "--env", "CLOWDER_TEST_SURELY_UNSET", "./prog"], &dir.0);
    assert_eq!(unset.status.code(), Some(1));
    assert!(stderr(&unset).contains("CLOWDER_TEST_SURELY_UNSET is not set in this environment"), "{}", stderr(&unset));
}

#[test]
fn enclave_names_like_one_shot_ones_are_refused() {
    let dir = TempDir::new("clowder-cli-run-n");
    let socket = start_daemon(&dir.0);
    let created = clowder(&socket, &["enclave", "create", "--name", "run-1", "--mem", "64M"], &dir.0);
    assert_eq!(created.status.code(), Some(1));
    assert!(stderr(&created).contains("names run-N are kept for one-shot enclaves"), "{}", stderr(&created));
}

#[test]
fn a_missing_program_after_an_enclaves_name_is_the_one_named() {
    let dir = TempDir::new("clowder-cli-missing");
    let socket = start_daemon(&dir.0);
    // Neither an enclave nor a file: the first word is the program that cannot be opened.
    let neither = clowder(&socket, &["run", "p1", "./missing"], &dir.0);
    assert!(stderr(&neither).contains("cannot open p1"), "{}", stderr(&neither));
    if let Some(why) = missing_requirement() {
        eprintln!("the rest skipped: {why}");
        return;
    }
    let created = clowder(&socket, &["enclave", "create", "--name", "p1", "--mem", "64M"], &dir.0);
    assert!(created.status.success(), "{}", stderr(&created));
    let missing = clowder(&socket, &["run", "p1", "./missing"], &dir.0);
    assert_eq!(missing.status.code(), Some(1));
    assert!(stderr(&missing).contains("cannot open ./missing: No such file"), "{}", stderr(&missing));
    let removed = clowder(&socket, &["enclave", "rm", "p1"], &dir.0);
    assert!(removed.status.success(), "{}", stderr(&removed));
}
