//! CLOWDER_LOG as `clowderd` reads it: a bad value stops the daemon in one line naming it;
//! levels choose its lines; a stderr that is the journal's stream (JOURNAL_STREAM names its
//! device and inode, as systemd sets it) gets syslog priority prefixes, any other plain lines.

use std::process::{Command, Stdio};
use std::time::Duration;

use clowder_log::testing::stderr_to_log;
use clowder_test_support::{daemon_answers_within, TempDir};

/// What a daemon that came up on a socket in `dir` and was sent SIGTERM wrote on stderr.
fn stderr_of_a_run(dir: &TempDir, level: Option<&str>, journal: bool) -> String {
    let socket = dir.0.join("run/clowderd.sock");
    let log = dir.0.join("stderr");
    let mut command = Command::new(env!("CARGO_BIN_EXE_clowderd"));
    command
        .args(["--config", "/dev/null", "--socket", socket.to_str().unwrap(), "--kernel", env!("CARGO_BIN_EXE_clowderd")])
        .stdout(Stdio::null());
    stderr_to_log(&mut command, &log, level, journal);
    let mut daemon = command.spawn().unwrap();
    let answered = daemon_answers_within(&socket, Duration::from_secs(10));
    clowderd::sys::send_signal(daemon.id(), libc::SIGTERM).unwrap();
    daemon.wait().unwrap();
    assert!(answered, "clowderd did not come up: {}", std::fs::read_to_string(&log).unwrap());
    std::fs::read_to_string(&log).unwrap()
}

#[test]
fn a_bad_value_stops_the_daemon_naming_it() {
    let refused = Command::new(env!("CARGO_BIN_EXE_clowderd"))
        .args(["--config", "/dev/null"])
        .env("CLOWDER_LOG", "clowderd=verbose")
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&refused.stderr),
        "clowderd: CLOWDER_LOG takes error, warn, info, debug or trace (or NAME=LEVEL among other directives), not 'clowderd=verbose'\n"
    );
}

#[test]
fn levels_and_the_journal_choose_the_lines() {
    let dir = TempDir::new("clowderd-log-levels");
    let socket = dir.0.join("run/clowderd.sock");
    let listening = format!("listening on {} (XEMEM on {})", socket.display(), dir.0.join("run/xemem.sock").display());

    let plain = stderr_of_a_run(&dir, None, false);
    assert_eq!(plain, format!("clowderd: {listening}\nclowderd: signal 15: removing all enclaves\n"));
    let quiet = stderr_of_a_run(&dir, Some("warn"), false);
    assert_eq!(quiet, "", "info lines shown at warn");
    let debug = stderr_of_a_run(&dir, Some("warn,clowderd=debug"), false);
    assert!(debug.starts_with("clowderd: debug: LWK image ") && debug.contains(&listening), "{debug}");

    let journal = stderr_of_a_run(&dir, None, true);
    assert_eq!(journal, format!("<6>{listening}\n<6>signal 15: removing all enclaves\n"));
}
