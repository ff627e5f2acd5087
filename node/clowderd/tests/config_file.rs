//! The `clowderd` binary and its configuration file (`--config PATH`; /etc/clowder/clowderd.toml
//! by default): the file is read, flags override it, and a bad or missing explicit file stops the
//! daemon with one line naming the file and the key.

use std::process::{Command, Output};
use std::time::Duration;

use clowder_test_support::{daemon_answers_within, TempDir};

fn clowderd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_clowderd")).args(args).env_remove("CLOWDER_KERNEL").env_remove("CLOWDER_SOCKET").output().unwrap()
}

fn first_stderr_line(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).lines().next().unwrap_or_default().to_string()
}

#[test]
fn the_file_is_read_and_flags_override_it() {
    let dir = TempDir::new("clowderd-config-file");
    let socket = dir.0.join("run/clowderd.sock");
    let config = dir.0.join("clowderd.toml");
    // The file's kernel does not exist; the flag's (any file: nothing boots here) must win, and
    // the daemon must listen where the file says.
    std::fs::write(&config, format!("socket = {:?}\nkernel = \"/nonexistent/lwk\"\n", socket.to_str().unwrap())).unwrap();
    let mut daemon = Command::new(env!("CARGO_BIN_EXE_clowderd"))
        .args(["--config", config.to_str().unwrap(), "--kernel", env!("CARGO_BIN_EXE_clowderd")])
        .env_remove("CLOWDER_KERNEL")
        .env_remove("CLOWDER_SOCKET")
        .spawn()
        .unwrap();
    let answered = daemon_answers_within(&socket, Duration::from_secs(10));
    clowderd::sys::send_signal(daemon.id(), libc::SIGTERM).unwrap();
    daemon.wait().unwrap();
    assert!(answered, "clowderd did not listen on the socket its configuration names");

    let without_flag = clowderd(&["--config", config.to_str().unwrap()]);
    assert_eq!(without_flag.status.code(), Some(2));
    assert!(first_stderr_line(&without_flag).contains("no LWK image at \"/nonexistent/lwk\""), "{without_flag:?}");
}

#[test]
fn a_bad_or_missing_explicit_file_is_refused_in_one_line() {
    let dir = TempDir::new("clowderd-config-bad");
    let config = dir.0.join("clowderd.toml");
    std::fs::write(&config, "socket = \"/tmp/x.sock\"\npingtimeout = 5\n").unwrap();
    let unknown = clowderd(&["--config", config.to_str().unwrap()]);
    assert_eq!(unknown.status.code(), Some(2));
    let line = first_stderr_line(&unknown);
    assert!(line.starts_with(&format!("clowderd: {}: pingtimeout: line 2: unknown field `pingtimeout`", config.display())), "{line}");

    std::fs::write(&config, "oneshot-mem = \"lots\"\n").unwrap();
    let bad_size = clowderd(&["--config", config.to_str().unwrap()]);
    assert_eq!(bad_size.status.code(), Some(2));
    assert!(first_stderr_line(&bad_size).starts_with(&format!("clowderd: {}: oneshot-mem: ", config.display())), "{bad_size:?}");

    let missing = clowderd(&["--config", dir.0.join("absent.toml").to_str().unwrap()]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(first_stderr_line(&missing).contains("absent.toml: cannot read the configuration"), "{missing:?}");
}
