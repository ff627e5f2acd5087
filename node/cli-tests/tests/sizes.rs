//! `clowder enclave create` takes sizes and core lists as clowder-vmm does (the `hwspec`
//! crate): `--mem 256MiB` was refused here while `clowder-vmm --mem 256MiB` was accepted
//! (issue 23). The daemon runs in this process on a socket in a temp directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use clowder_test_support::{lwk_daemon, serve, why_enclaves_cannot_boot, TempDir};
use clowderd::enclave::Liveness;
use support::vmm_binary;

mod support;

fn clowder(socket: &Path, args: &[&str], cwd: &Path) -> Output {
    Command::new(support::clowder()).args(args).current_dir(cwd).env("CLOWDER_SOCKET", socket).output().unwrap()
}

fn start_daemon(dir: &Path) -> PathBuf {
    serve(lwk_daemon(dir, vmm_binary(), Liveness::default()), dir)
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Without booting anything: the size is read, and what is refused is refused in hwspec's words.
#[test]
fn create_reads_sizes_and_core_lists_as_clowder_vmm_does() {
    let dir = TempDir::new("clowder-cli-sizes");
    let socket = start_daemon(&dir.0);
    let create =
        |mem: &str, cores: &str| clowder(&socket, &["enclave", "create", "--name", "s", "--core-list", cores, "--mem", mem], &dir.0);

    // 256MiB gets past the size: what stops this request is the core nobody has.
    let unknown_core = create("256MiB", "8191");
    assert!(!unknown_core.status.success());
    assert!(stderr(&unknown_core).contains("core 8191 is not online"), "{}", stderr(&unknown_core));

    let ambiguous = create("256MB", "0");
    assert!(!ambiguous.status.success());
    assert!(stderr(&ambiguous).contains("\"256MB\" is not a size: KB, MB, GB and TB are ambiguous"), "{}", stderr(&ambiguous));
    let fraction = create("1.5G", "0");
    assert!(stderr(&fraction).contains("\"1.5G\" is not a size: expected a whole number of bytes"), "{}", stderr(&fraction));
    let repeated = create("256MiB", "1,1");
    assert!(stderr(&repeated).contains("\"1,1\" is not a CPU list: CPU 1 is listed twice"), "{}", stderr(&repeated));
    let descending = create("256MiB", "3-1");
    assert!(stderr(&descending).contains("\"3-1\" is not a CPU list: the range 3-1 goes down"), "{}", stderr(&descending));
}

/// Booted: the enclave has the memory asked for, listed in the form the daemon reads back.
#[test]
fn an_enclave_of_256mib_is_created() {
    if let Some(why) = why_enclaves_cannot_boot(&vmm_binary()) {
        eprintln!("skipped: {why}");
        return;
    }
    let dir = TempDir::new("clowder-cli-256mib");
    let socket = start_daemon(&dir.0);
    let created = clowder(&socket, &["enclave", "create", "--name", "mib", "--cores", "1", "--mem", "256MiB"], &dir.0);
    assert!(created.status.success(), "create: {}", stderr(&created));
    let listed = clowder(&socket, &["enclave", "ls"], &dir.0);
    let table = String::from_utf8_lossy(&listed.stdout);
    assert!(table.lines().any(|line| line.starts_with("mib ") && line.contains(" 256M ")), "{table}");
    let removed = clowder(&socket, &["enclave", "rm", "mib"], &dir.0);
    assert!(removed.status.success(), "rm: {}", stderr(&removed));
}
