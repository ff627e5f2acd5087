//! `clowder enclave create` takes sizes and core lists as clowder-vmm does (the `hwspec`
//! crate): `--mem 256MiB` was refused here while `clowder-vmm --mem 256MiB` was accepted
//! (issue 23). The daemon runs in this process on a socket in a temp directory.

use clowder_test_support::{skipped, why_enclaves_cannot_boot};
use clowderd::enclave::Liveness;
use support::{assert_says, run_clowder, test_daemon, text, vmm_binary};

mod support;

/// Without booting anything: the size is read, and what is refused is refused in hwspec's words.
#[test]
fn create_reads_sizes_and_core_lists_as_clowder_vmm_does() {
    let (dir, socket) = test_daemon("clowder-cli-sizes", Liveness::default());
    let create =
        |mem: &str, cores: &str| run_clowder(&socket, &["enclave", "create", "--name", "s", "--core-list", cores, "--mem", mem], &dir.0);

    // 256MiB gets past the size: what stops this request is the core nobody has.
    let unknown_core = create("256MiB", "8191");
    assert!(!unknown_core.status.success());
    assert_says(&unknown_core, "core 8191 is not online");

    let ambiguous = create("256MB", "0");
    assert!(!ambiguous.status.success());
    assert_says(&ambiguous, "\"256MB\" is not a size: KB, MB, GB and TB are ambiguous");
    let fraction = create("1.5G", "0");
    assert_says(&fraction, "\"1.5G\" is not a size: expected a whole number of bytes");
    let repeated = create("256MiB", "1,1");
    assert_says(&repeated, "\"1,1\" is not a CPU list: CPU 1 is listed twice");
    let descending = create("256MiB", "3-1");
    assert_says(&descending, "\"3-1\" is not a CPU list: the range 3-1 goes down");
}

/// Booted: the enclave has the memory asked for, listed in the form the daemon reads back.
#[test]
fn an_enclave_of_256mib_is_created() {
    if skipped(why_enclaves_cannot_boot(&vmm_binary())) {
        return;
    }
    let (dir, socket) = test_daemon("clowder-cli-256mib", Liveness::default());
    let created = run_clowder(&socket, &["enclave", "create", "--name", "mib", "--cores", "1", "--mem", "256MiB"], &dir.0);
    assert!(created.status.success(), "create: {}", text(&created.stderr));
    let listed = run_clowder(&socket, &["enclave", "ls"], &dir.0);
    let table = String::from_utf8_lossy(&listed.stdout);
    assert!(table.lines().any(|line| line.starts_with("mib ") && line.contains(" 256M ")), "{table}");
    let removed = run_clowder(&socket, &["enclave", "rm", "mib"], &dir.0);
    assert!(removed.status.success(), "rm: {}", text(&removed.stderr));
}
