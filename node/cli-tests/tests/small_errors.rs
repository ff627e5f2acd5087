//! Small mistakes of the CLI and the API that used to be answered wrongly (issue 22): `--cores 0`,
//! many `--file` inputs, a missing program after an enclave's name, and persistent enclaves
//! named like one-shot ones. The daemon runs in this process on a socket in a temp directory.

use std::time::Duration;

use clowderd::client::Client;
use clowderd::enclave::Liveness;
use serde_json::json;
use support::{assert_says, missing_requirement, run_clowder, test_daemon, text};

mod support;

/// The hello comes late from a machine shared with builds: more time than the default.
fn liveness() -> Liveness {
    Liveness { hello_timeout: Duration::from_secs(10), ..Liveness::default() }
}

#[test]
fn cores_are_a_count_and_a_core_list_names_core_0() {
    let (dir, socket) = test_daemon("clowder-cli-cores", liveness());
    let zero = run_clowder(&socket, &["enclave", "create", "--name", "x", "--cores", "0", "--mem", "64M"], &dir.0);
    assert_eq!(zero.status.code(), Some(2));
    assert_says(&zero, "name core 0 with --core-list 0");
    let zero = run_clowder(&socket, &["run", "--cores", "0", "./prog"], &dir.0);
    assert_says(&zero, "--core-list 0");
    // The API: a number counts, a string names; 0 as a number says how to name core 0.
    let reply = Client::connect_to(&socket).unwrap().call(&json!({"op": "create", "name": "x", "cores": 0, "mem": "64M"})).unwrap();
    assert!(reply["error"].as_str().unwrap().contains("core list string such as \"0\""), "{reply}");
}

#[test]
fn many_input_files_are_all_delivered_or_refused_with_a_reason() {
    let (dir, socket) = test_daemon("clowder-cli-files", liveness());
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
        run_clowder(&socket, &line, &dir.0)
    };
    // 40 inputs (42 descriptors, more than one message holds) reach the daemon, which then
    // looks for the enclave.
    let forty = run(40);
    assert_says(&forty, "no enclave named ghost");
    let too_many = run(129);
    assert_says(&too_many, "at most 128 --file inputs, not 129");

    // Straight to the API, more descriptors than a request may carry: a reason, not silence.
    let files: Vec<std::fs::File> = (0..140).map(|_| std::fs::File::open("/dev/null").unwrap()).collect();
    let fds: Vec<i32> = files.iter().map(std::os::fd::AsRawFd::as_raw_fd).collect();
    let request = json!({"op": "run", "enclave": "ghost", "argv": ["prog"], "cwd": "/"});
    let reply = Client::connect_to(&socket).unwrap().call_streaming(&request, &fds, &mut |_| {}).unwrap();
    assert!(reply["error"].as_str().unwrap().contains("more than 130 file descriptors"), "{reply}");
}

#[test]
fn an_environment_entry_taken_from_the_clis_environment_must_be_there() {
    let (dir, socket) = test_daemon("clowder-cli-env", liveness());
    let unset = run_clowder(&socket, &["run", "--env", "CLOWDER_TEST_SURELY_UNSET", "./prog"], &dir.0);
    assert_eq!(unset.status.code(), Some(1));
    assert_says(&unset, "CLOWDER_TEST_SURELY_UNSET is not set in this environment");
}

#[test]
fn enclave_names_like_one_shot_ones_are_refused() {
    let (dir, socket) = test_daemon("clowder-cli-run-n", liveness());
    let created = run_clowder(&socket, &["enclave", "create", "--name", "run-1", "--mem", "64M"], &dir.0);
    assert_eq!(created.status.code(), Some(1));
    assert_says(&created, "names run-N are kept for one-shot enclaves");
}

#[test]
fn a_missing_program_after_an_enclaves_name_is_the_one_named() {
    let (dir, socket) = test_daemon("clowder-cli-missing", liveness());
    // Neither an enclave nor a file: the first word is the program that cannot be opened.
    let neither = run_clowder(&socket, &["run", "p1", "./missing"], &dir.0);
    assert_says(&neither, "cannot open p1");
    if let Some(why) = missing_requirement() {
        eprintln!("the rest skipped: {why}");
        return;
    }
    let created = run_clowder(&socket, &["enclave", "create", "--name", "p1", "--mem", "64M"], &dir.0);
    assert!(created.status.success(), "{}", text(&created.stderr));
    let missing = run_clowder(&socket, &["run", "p1", "./missing"], &dir.0);
    assert_eq!(missing.status.code(), Some(1));
    assert_says(&missing, "cannot open ./missing: No such file");
    let removed = run_clowder(&socket, &["enclave", "rm", "p1"], &dir.0);
    assert!(removed.status.success(), "{}", text(&removed.stderr));
}
