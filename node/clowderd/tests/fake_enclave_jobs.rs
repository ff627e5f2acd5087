//! Jobs in a fake enclave: output, statuses, inputs, a client that goes away, and the API's
//! answers (`fake_enclave/`).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use clowderd::enclave::Liveness;
use serde_json::{json, Value};

mod fake_enclave;

use fake_enclave::{daemon_with_enclave, quick_liveness, start_daemon};

#[test]
fn jobs_stream_output_and_return_their_status() {
    let (daemon, work) = daemon_with_enclave("jobs", Liveness::default(), "sim");
    let (reply, stdout, _) = daemon.run("sim", &["prog", "echo", "hello", "enclave"], &work.0, &[]);
    assert_eq!(reply["ok"], true, "{reply}");
    assert_eq!(reply["status"], 0);
    assert_eq!(stdout, "hello enclave\n");

    assert_eq!(reply["job"], 1);

    // A program the enclave cannot run is refused, and takes no job number.
    let script = work.0.join("script.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
    let (refused, _, _) = daemon.run_program(&script, "sim", &["script.sh"], &work.0, &[], None);
    assert_eq!(refused["ok"], false, "{refused}");
    assert!(refused["error"].as_str().unwrap().contains("script.sh is not an ELF executable"), "{refused}");

    let (reply, _, _) = daemon.run("sim", &["prog", "exit", "42"], &work.0, &[]);
    assert_eq!(reply["status"], 42);
    assert_eq!(reply["job"], 2, "job numbers follow each other: {reply}");

    // Output longer than a ring message arrives in order, on the right stream.
    let (reply, stdout, stderr) = daemon.run("sim", &["prog", "big"], &work.0, &[]);
    assert_eq!(reply["status"], 0);
    assert_eq!(stdout.len(), 2000);
    assert!(stdout.starts_with("abcdefghijklmnopqrstuvwxyzabc"));
    assert_eq!(stderr, "to stderr\n");

    let list = daemon.call(json!({"op": "ls"}));
    assert_eq!(list["enclaves"][0]["name"], "sim");
    assert_eq!(list["enclaves"][0]["state"], "ready");
    assert_eq!(list["enclaves"][0]["jobs"], 0);
}

#[test]
fn a_quiet_job_is_killed_when_its_client_goes_away() {
    let (daemon, work) = daemon_with_enclave("client-gone", quick_liveness(), "sim");
    let binary = File::open(&daemon.program).unwrap();
    let dir = File::open(&work.0).unwrap();
    let request = json!({
        "op": "run", "enclave": "sim", "argv": ["prog", "quiet-until-killed"], "cwd": work.0.to_str().unwrap(), "files": [],
    });
    let stream = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    let limits = clowder_api::codec::Limits { max_line: 1 << 20, max_fds: 0, timeout: None };
    let mut socket = clowder_api::codec::LineSocket::new(stream, limits);
    socket.send(&request, &[binary.as_raw_fd(), dir.as_raw_fd()]).unwrap();
    let (started, _) = socket.receive_json::<serde_json::Value>().unwrap().unwrap();
    assert_eq!(started["event"], "started", "{started}");
    assert_eq!(daemon.call(json!({"op": "ls"}))["enclaves"][0]["jobs"], 1);
    // The job prints nothing, so no failed write tells the daemon; the hang-up alone must.
    drop(socket);
    let deadline = Instant::now() + Duration::from_secs(5);
    while daemon.call(json!({"op": "ls"}))["enclaves"][0]["jobs"] != 0 {
        assert!(Instant::now() < deadline, "the job outlived its client by 5 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let logs = daemon.call(json!({"op": "logs", "name": "sim"}));
    assert!(logs.to_string().contains("exited with status 137"), "{logs}");
}

#[test]
fn the_binary_and_input_files_are_shared_into_the_enclave() {
    let (daemon, work) = daemon_with_enclave("inputs", Liveness::default(), "sim");
    let input = work.0.join("params.txt");
    std::fs::write(&input, "nx=64").unwrap();
    let (reply, stdout, _) = daemon.run("sim", &["/path/to/prog", "inputs"], &work.0, &[("params.txt", &input)]);
    assert_eq!(reply["ok"], true, "{reply}");
    let binary_len = std::fs::metadata(&daemon.program).unwrap().len();
    assert!(stdout.contains(&format!("binary prog {binary_len} bytes, starts [127, 69, 76, 70]")), "{stdout}");
    assert!(stdout.contains("input params.txt: nx=64"), "{stdout}");
    assert!(stdout.contains(&format!("cwd {}", work.0.display())), "{stdout}");
}

#[test]
fn the_api_answers_its_version_and_types_every_error() {
    let daemon = start_daemon("typed", Liveness::default());
    let version = daemon.call(json!({"op": "version"}));
    assert_eq!(version["ok"], true, "{version}");
    assert_eq!(version["api_version"], clowder_api::API_VERSION, "{version}");
    assert_eq!(version["daemon_version"], env!("CARGO_PKG_VERSION"), "{version}");
    // Each error names what is wrong and says what kind of error it is.
    let expect = |request: Value, kind: &str, words: &str| {
        let reply = daemon.call(request);
        assert_eq!((&reply["ok"], &reply["kind"]), (&json!(false), &json!(kind)), "{reply}");
        assert!(reply["error"].as_str().unwrap().contains(words), "{reply}");
    };
    expect(json!({"op": "create", "name": "a", "mem": "16M", "cor": 1}), "invalid_argument", "unknown field `cor`");
    expect(json!({"op": "rm", "name": 7}), "invalid_argument", "`name`");
    expect(json!({"op": "ls", "verbose": true}), "invalid_argument", "unknown field `verbose`");
    expect(json!({"op": "version", "client": 1}), "invalid_argument", "`version`");
    expect(json!({"op": "rm", "name": "nope"}), "not_found", "no enclave named nope");
    daemon.create("twice");
    expect(json!({"op": "create", "name": "twice", "cores": 1, "mem": "16M"}), "already_exists", "already exists");
    expect(json!({"op": "xemem_ls"}), "unavailable", "without an XEMEM broker");
    // The typed client reads the same replies.
    let listed: clowder_api::daemon::LsReply = daemon.client().request(&clowder_api::daemon::Request::Ls).unwrap();
    assert_eq!(listed.enclaves.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["twice"]);
}
