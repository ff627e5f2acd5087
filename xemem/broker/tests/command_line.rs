//! `xemem-broker`'s command line: help, and mistakes refused before anything is served (a
//! mistyped option once became the name of a socket the broker listened on).

use std::process::Command;

fn broker(args: &[&str], dir: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_xemem-broker")).args(args).current_dir(dir).output().unwrap()
}

#[test]
fn help_and_mistakes_end_at_once_and_name_the_problem() {
    let dir = std::env::temp_dir().join(format!("xemem-broker-args-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let help = broker(&["--help"], &dir);
    assert_eq!(help.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&help.stdout).starts_with("usage: xemem-broker [SOCKET]"));
    let unknown = broker(&["--frob"], &dir);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unknown.stderr).starts_with("xemem-broker: unknown option --frob"));
    let two = broker(&["a.sock", "b.sock"], &dir);
    assert_eq!(two.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&two.stderr).starts_with("xemem-broker: one socket path at most"));
    let made: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert!(made.is_empty(), "nothing is created for a mistake: {made:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
