//! Forwarded file calls from a fake enclave's jobs (`fake_enclave/`): confined to the working
//! directory, or with the user's reach.

use clowderd::enclave::Liveness;
use serde_json::json;

mod fake_enclave;

use fake_enclave::daemon_with_enclave;

#[test]
fn forwarded_file_calls_stay_inside_the_working_directory() {
    let (daemon, outer) = daemon_with_enclave("files", Liveness::default(), "sim");
    let work = outer.0.join("work");
    std::fs::create_dir(&work).unwrap();
    std::fs::write(work.join("input.txt"), "input data").unwrap();
    std::os::unix::fs::symlink("/etc", work.join("link-out")).unwrap();
    let (reply, stdout, _) = daemon.run_program(&daemon.program, "sim", &["prog", "files"], &work, &[], Some(&work));
    assert!(!stdout.contains("FAIL"), "{stdout}");
    assert_eq!(reply["status"], 0, "{reply}\n{stdout}");
    assert!(!outer.0.join("outside.txt").exists(), "a file was created outside the job's directory");
    assert!(work.join("results").is_dir());
    assert!(!work.join("out.txt").exists(), "unlink reached the host");
    let logs = daemon.call(json!({"op": "logs", "name": "sim"}));
    let logs = logs["lines"].to_string();
    assert!(logs.contains("leaves the job's directory"), "refusals are logged: {logs}");
}

#[test]
fn unconfined_jobs_reach_the_users_files_and_move_data_directly() {
    let (daemon, outer) = daemon_with_enclave("user-files", Liveness::default(), "sim");
    let (work, inputs) = (outer.0.join("work"), outer.0.join("inputs"));
    std::fs::create_dir(&work).unwrap();
    std::fs::create_dir(&inputs).unwrap();
    let deck: Vec<u8> = (0..2u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(inputs.join("deck"), &deck).unwrap();
    let input = inputs.join("deck");
    let (reply, stdout, _) = daemon.run("sim", &["prog", "user-files", input.to_str().unwrap()], &work, &[]);
    assert!(!stdout.contains("FAIL"), "{stdout}");
    assert_eq!(reply["status"], 0, "{reply}\n{stdout}");
    assert!(std::fs::read(work.join("copy")).unwrap() == deck, "the write reached the host whole");
    // Confined to its directory, the same job may not name the input.
    let (reply, stdout, _) =
        daemon.run_program(&daemon.program, "sim", &["prog", "user-files", input.to_str().unwrap()], &work, &[], Some(&work));
    assert!(stdout.contains("FAIL open an input by absolute path outside"), "{stdout}");
    assert_ne!(reply["status"], 0);
    // A confinement that does not hold the working directory is refused before the job runs.
    let (reply, _, _) = daemon.run_program(&daemon.program, "sim", &["prog", "echo"], &work, &[], Some(&inputs));
    assert!(reply["error"].as_str().unwrap_or("").contains("outside the confinement directory"), "{reply}");
}

/// A call on the channel right after one through a file slot is served at once: the daemon's
/// pump used to poll the slots for a second after each call they carried, reading nothing from
/// the channel meanwhile, so such a call waited up to 1 s (an LWK job's calls with long paths
/// took 0.4-0.9 s each, the first one of a job 1.1 s).
#[test]
fn a_channel_call_after_a_file_slot_call_is_not_kept_waiting() {
    let (daemon, work) = daemon_with_enclave("slot-then-channel", Liveness::default(), "sim");
    std::fs::write(work.0.join("input.txt"), "input data").unwrap();
    let (reply, stdout, _) = daemon.run("sim", &["prog", "slot-then-channel"], &work.0, &[]);
    assert!(!stdout.contains("FAIL"), "{stdout}");
    assert_eq!(reply["status"], 0, "{reply}\n{stdout}");
    let slowest: u64 = stdout
        .lines()
        .find_map(|line| line.strip_prefix("slowest channel call after a slot call: ")?.strip_suffix(" ms")?.parse().ok())
        .unwrap_or_else(|| panic!("{stdout}"));
    eprintln!("slowest channel call after a slot call: {slowest} ms");
    assert!(slowest < 300, "a channel call waited {slowest} ms behind the pump's polling of the file slots\n{stdout}");
}
