//! CLOWDER_LOG as `xemem-broker` reads it (the shared crates/log): levels filter its lines, a
//! bad value is refused in one line, and a stderr that is the journal's stream (JOURNAL_STREAM
//! names its device and inode) gets syslog priority prefixes instead of the program's name.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clowder_log::testing::stderr_to_log;

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(name: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("xemem-broker-log-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

/// The broker on `socket` with stderr to `log`; `journal`: JOURNAL_STREAM names that file.
fn broker(socket: &Path, log: &Path, level: Option<&str>, journal: bool) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_xemem-broker"));
    command.arg(socket).stdin(Stdio::null()).stdout(Stdio::null());
    stderr_to_log(&mut command, log, level, journal);
    command.spawn().unwrap()
}

/// What a broker serving on a fresh socket wrote once it has listened for a moment.
fn serving_log(dir: &Path, level: Option<&str>, journal: bool) -> String {
    let (socket, log) = (dir.join("xemem.sock"), dir.join("stderr"));
    let _ = std::fs::remove_file(&socket);
    let mut child = broker(&socket, &log, level, journal);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    // The line follows the bind at once; give a filtered-out line the same chance to appear.
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap();
    child.wait().unwrap();
    std::fs::read_to_string(&log).unwrap()
}

/// What a broker that cannot listen (its socket's directory is a file) wrote, and its status.
fn failing_log(dir: &Path, level: Option<&str>, journal: bool) -> (Option<i32>, String) {
    std::fs::write(dir.join("not-a-dir"), "").unwrap();
    let log = dir.join("stderr");
    let status = broker(&dir.join("not-a-dir/xemem.sock"), &log, level, journal).wait().unwrap();
    (status.code(), std::fs::read_to_string(&log).unwrap())
}

#[test]
fn levels_choose_the_lines_on_plain_stderr() {
    let dir = scratch("plain");
    let socket = dir.0.join("xemem.sock");
    assert_eq!(serving_log(&dir.0, None, false), format!("xemem-broker: listening on {}\n", socket.display()));
    assert_eq!(serving_log(&dir.0, Some("debug"), false), format!("xemem-broker: listening on {}\n", socket.display()));
    assert_eq!(serving_log(&dir.0, Some("warn"), false), "", "info hidden at warn");
    assert_eq!(serving_log(&dir.0, Some("info,xemem=warn"), false), "", "a component's level outranks the bare one");
    assert_eq!(serving_log(&dir.0, Some("dex=debug"), false), format!("xemem-broker: listening on {}\n", socket.display()));

    let (status, log) = failing_log(&dir.0, Some("error"), false);
    assert_eq!(status, Some(1));
    let bad = dir.0.join("not-a-dir/xemem.sock");
    assert!(log.starts_with(&format!("xemem-broker: error: {}: ", bad.display())) && log.lines().count() == 1, "{log:?}");
}

#[test]
fn a_bad_value_is_refused_naming_it() {
    let dir = scratch("bad");
    let (status, log) = failing_log(&dir.0, Some("info,loud"), false);
    assert_eq!(status, Some(2));
    assert_eq!(
        log,
        "xemem-broker: CLOWDER_LOG takes error, warn, info, debug or trace (or NAME=LEVEL among other directives), not 'info,loud'\n"
    );
}

#[test]
fn the_journal_gets_priorities() {
    let dir = scratch("journal");
    let socket = dir.0.join("xemem.sock");
    assert_eq!(serving_log(&dir.0, None, true), format!("<6>listening on {}\n", socket.display()));
    let (status, log) = failing_log(&dir.0, None, true);
    assert_eq!(status, Some(1));
    assert!(log.starts_with(&format!("<3>{}: ", dir.0.join("not-a-dir/xemem.sock").display())) && log.lines().count() == 1, "{log:?}");
}
