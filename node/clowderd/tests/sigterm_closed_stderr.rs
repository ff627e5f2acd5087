//! SIGTERM stops the daemon even when its stderr is a pipe nobody reads any more (a log reader
//! that went away): the signal's one log line must not take the signal handling down with it.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clowder_test_support::{daemon_answers_within, TempDir};

#[test]
fn sigterm_stops_the_daemon_after_its_stderr_reader_is_gone() {
    let dir = TempDir::new("clowderd-closed-stderr");
    let socket = dir.0.join("run/clowderd.sock");
    let mut daemon = Command::new(env!("CARGO_BIN_EXE_clowderd"))
        .args(["--config", "/dev/null", "--socket", socket.to_str().unwrap(), "--kernel", env!("CARGO_BIN_EXE_clowderd")])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let answered = daemon_answers_within(&socket, Duration::from_secs(10));
    drop(daemon.stderr.take());
    clowderd::sys::send_signal(daemon.id(), libc::SIGTERM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut status = None;
    while status.is_none() && Instant::now() < deadline {
        status = daemon.try_wait().unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    if status.is_none() {
        let _ = daemon.kill();
        let _ = daemon.wait();
    }
    assert!(answered, "clowderd did not come up");
    assert!(status.is_some_and(|s| s.success()), "clowderd ignored SIGTERM once its stderr was closed: {status:?}");
}
