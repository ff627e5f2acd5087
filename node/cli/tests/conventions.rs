//! The command line behaves as users expect of a tool: `--help` on every subcommand,
//! `--version`, and a package that depends on the API crate alone (not the daemon, the VMM or
//! KVM), its tests included.

use std::process::{Command, Output};

fn clowder(args: &[&str]) -> Output {
    // No daemon: none of these may need one.
    Command::new(env!("CARGO_BIN_EXE_clowder")).args(args).env("CLOWDER_SOCKET", "/nonexistent/clowderd.sock").output().unwrap()
}

#[test]
fn every_subcommand_has_help() {
    let commands: [&[&str]; 10] = [
        &[],
        &["enclave"],
        &["enclave", "create"],
        &["enclave", "ls"],
        &["enclave", "rm"],
        &["run"],
        &["logs"],
        &["xemem"],
        &["xemem", "ls"],
        &["version"],
    ];
    for words in commands {
        let mut args = words.to_vec();
        args.push("--help");
        let help = clowder(&args);
        let text = String::from_utf8_lossy(&help.stdout);
        assert!(help.status.success(), "{args:?}: {}", String::from_utf8_lossy(&help.stderr));
        let usage = ["Usage: clowder", &words.join(" ")].join(" ");
        assert!(text.contains(usage.trim_end()), "{args:?} should print {usage:?}:\n{text}");
        assert!(text.contains("--json"), "{args:?}: --json is accepted everywhere:\n{text}");
    }
}

#[test]
fn version_is_answered_without_a_daemon() {
    let version = clowder(&["--version"]);
    assert!(version.status.success());
    assert_eq!(String::from_utf8_lossy(&version.stdout).trim(), format!("clowder {}", env!("CARGO_PKG_VERSION")));
}

#[test]
fn the_package_depends_on_neither_the_daemon_nor_the_vmm_nor_kvm() {
    // Dev-dependencies included: the tests that start a real daemon are node/cli-tests.
    let tree = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "--prefix", "none", "-p", "clowder-cli"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&tree.stdout);
    assert!(tree.status.success() && text.contains("clowder-api"), "{}{text}", String::from_utf8_lossy(&tree.stderr));
    let linked: Vec<&str> =
        text.lines().filter(|line| ["kvm", "vmm", "clowderd"].iter().any(|name| line.to_lowercase().contains(name))).collect();
    assert!(linked.is_empty(), "clowder links {linked:?}");
}
