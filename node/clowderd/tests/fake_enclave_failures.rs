//! What a fake enclave's failures do to the daemon (`fake_enclave/`): launch failures and
//! malformed messages, crashed, hung, panicked and corrupting enclaves, and removals.

use clowderd::enclave::Liveness;
use serde_json::json;

mod fake_enclave;

use fake_enclave::{daemon_with_enclave, quick_liveness, start_daemon};

#[test]
fn launch_failures_and_malformed_messages_get_clear_errors() {
    let (daemon, work) = daemon_with_enclave("malformed", Liveness::default(), "sim");
    let (reply, _, _) = daemon.run("sim", &["prog", "launch-fails"], &work.0, &[]);
    assert_eq!(reply["ok"], false);
    assert!(reply["error"].as_str().unwrap().contains("not an ELF executable"), "{reply}");

    let (reply, stdout, _) = daemon.run("sim", &["prog", "garbage"], &work.0, &[]);
    assert_eq!(reply["status"], 0, "{reply}");
    assert_eq!(stdout, "still here\n");
    let logs = daemon.call(json!({"op": "logs", "name": "sim"}))["lines"].to_string();
    assert!(logs.contains("unknown message kind 0x7777"), "{logs}");
    assert!(logs.contains("message truncated"), "{logs}");
    assert!(logs.contains("continuation frame without a start frame"), "{logs}");
}

#[test]
fn a_failed_enclave_is_removed_and_the_others_keep_working() {
    let (daemon, work) = daemon_with_enclave("containment", quick_liveness(), "survivor");
    // Each failure in turn, in an enclave beside the survivor (the host may have two cores).
    let failures = [
        ("crashes", "crash", "triple-faulted", "its machine ended"),
        ("hangs", "hang", "stopped answering Ping", "Ping"),
        ("panics", "panic", "fake kernel gave up", "panicked"),
        ("corrupts", "corrupt", "channel corrupted by the enclave", "channel corrupted"),
    ];
    for (name, script, job_error, removal) in failures {
        daemon.create(name);
        let (reply, _, _) = daemon.run(name, &["prog", script], &work.0, &[]);
        assert_eq!(reply["ok"], false);
        assert!(reply["error"].as_str().unwrap().contains(job_error), "{reply}");
        assert!(daemon.wait_until_removed(name).contains(removal));
        let (reply, stdout, _) = daemon.run("survivor", &["prog", "echo", "fine"], &work.0, &[]);
        assert_eq!(reply["status"], 0, "{reply}");
        assert_eq!(stdout, "fine\n");
    }
    let logs = daemon.call(json!({"op": "logs", "name": "hangs"}));
    assert!(logs["removed"].as_str().unwrap().contains("Ping"), "{logs}");
}

#[test]
fn removing_an_enclave_frees_its_cores_and_ends_its_jobs() {
    let daemon = start_daemon("remove", Liveness::default());
    daemon.create("a");
    let reply = daemon.call(json!({"op": "rm", "name": "a"}));
    assert_eq!(reply["ok"], true, "{reply}");
    assert!(reply["how"].as_str().unwrap().contains("the fake kernel shut down"), "Shutdown reaches the kernel: {reply}");
    let reply = daemon.call(json!({"op": "rm", "name": "a"}));
    assert!(reply["error"].as_str().unwrap().contains("no enclave named a"), "{reply}");
    // Its core is free again: as many one-core enclaves as usable cores fit.
    let usable = clowderd::cores::usable_cores().unwrap().len();
    for index in 0..usable {
        daemon.create(&format!("e{index}"));
    }
    let reply = daemon.call(json!({"op": "create", "name": "one-too-many", "cores": 1, "mem": "16M"}));
    assert!(reply["error"].as_str().unwrap().contains("only 0 free"), "{reply}");
}
