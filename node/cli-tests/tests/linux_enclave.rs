//! A Linux virtual machine as an enclave, end to end under a real daemon: `clowder enclave
//! create --kind linux` boots the project's small kernel (scripts/linux-kernel.sh) with the
//! agent's initramfs, and `clowder run` runs a host program in it with its output, error output
//! and exit status (a crash as the signal), and dynamically linked host programs run as they are
//! in a view of the user's host files (the agent's FUSE file system, served by the daemon as
//! the user). Opt-in (`make test-linux-enclave`): on a PVM host the
//! boot is minutes of emulated kernel code, and a cold kernel build about 15 minutes.

mod support;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use clowder_test_support::build_musl_program;
use clowderd::enclave::Liveness;
use support::{enclave_test_daemon, run_clowder, run_clowder_ok, text};

const HELLO: &str = r#"#include <stdio.h>
int main(int argc, char **argv) {
    printf("hello from %s with %d arguments\n", argv[0], argc - 1);
    fprintf(stderr, "to stderr\n");
    return 3;
}
"#;

const CRASH: &str = "int main(void) { *(volatile int *)0 = 1; return 0; }\n";

/// Panics the guest kernel (as root in the guest, as the tests run): SysRq's crash.
const PANIC: &str = r#"#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
int main(void) {
    int fd = open("/proc/sysrq-trigger", O_WRONLY);
    if (fd < 0) { perror("/proc/sysrq-trigger"); return 1; }
    if (write(fd, "c", 1) != 1) perror("write");
    return 2;
}
"#;

/// What scripts/linux-kernel.sh ARGS prints last: the path it built (or found cached).
fn built(args: &[&str]) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let output = Command::new(root.join("scripts/linux-kernel.sh")).args(args).output().unwrap();
    assert!(output.status.success(), "scripts/linux-kernel.sh {args:?}: {}", text(&output.stderr));
    PathBuf::from(text(&output.stdout).lines().last().unwrap_or_default())
}

#[test]
#[ignore = "boots a Linux guest: minutes on a PVM host (make test-linux-enclave)"]
fn a_linux_enclave_runs_host_programs_with_their_output_and_status() {
    let Some((dir, socket)) = enclave_test_daemon("clowder-linux-enclave", Liveness::default()) else { return };
    // A kernel named by CLOWDER_LINUX_KERNEL (the daemon's variable) saves a build.
    let kernel = std::env::var_os("CLOWDER_LINUX_KERNEL").map_or_else(|| built(&[]), PathBuf::from);
    let initrd = built(&["initramfs"]);
    build_musl_program(&dir.0, "hello", HELLO);
    build_musl_program(&dir.0, "crash", CRASH);
    let (kernel, initrd) = (kernel.to_str().unwrap(), initrd.to_str().unwrap());
    let create = ["enclave", "create", "--name", "vm", "--kind", "linux", "--cores", "1", "--mem", "256M"];
    run_clowder_ok(&socket, &[&create[..], &["--kernel", kernel, "--initrd", initrd]].concat(), &dir.0);
    let listing = run_clowder_ok(&socket, &["enclave", "ls"], &dir.0);
    assert!(text(&listing.stdout).lines().any(|line| line.starts_with("vm ") && line.contains(" linux ")), "{}", text(&listing.stdout));

    let hello = run_clowder(&socket, &["run", "vm", "./hello", "a", "b"], &dir.0);
    assert_eq!(text(&hello.stdout), "hello from ./hello with 2 arguments\n", "stderr: {}", text(&hello.stderr));
    assert_eq!(text(&hello.stderr), "to stderr\n");
    assert_eq!(hello.status.code(), Some(3));

    // A job that crashes ends `clowder run` by its signal; the enclave takes the next job.
    let crash = run_clowder(&socket, &["run", "vm", "./crash"], &dir.0);
    assert_eq!(crash.status.signal(), Some(libc::SIGSEGV), "{:?}: {}", crash.status, text(&crash.stderr));
    let again = run_clowder(&socket, &["run", "vm", "./hello"], &dir.0);
    assert_eq!(again.status.code(), Some(3), "stderr: {}", text(&again.stderr));

    // Dynamic host programs: their interpreter, libraries and modules come from the host, and
    // a directory reads as on the host (names, modes, owners, sizes, times). Only where the
    // daemon (this process) serves host files: CLOWDER_LINUX_HOST_FILES=1 make test-linux-enclave.
    if std::env::var_os("CLOWDER_LINUX_HOST_FILES").is_some() {
        dynamic_programs(&socket, &dir.0);
    }
    run_clowder_ok(&socket, &["enclave", "rm", "vm"], &dir.0);
}

/// A job that panics the guest kernel removes only its enclave, with the panic as the reason;
/// the daemon and an LWK enclave beside it go on and run a job.
#[test]
#[ignore = "boots a Linux guest: minutes on a PVM host (make test-linux-enclave)"]
fn a_guest_panic_removes_only_its_enclave() {
    let Some((dir, socket)) = enclave_test_daemon("clowder-linux-panic", Liveness::default()) else { return };
    let kernel = std::env::var_os("CLOWDER_LINUX_KERNEL").map_or_else(|| built(&[]), PathBuf::from);
    let initrd = built(&["initramfs"]);
    build_musl_program(&dir.0, "hello", HELLO);
    build_musl_program(&dir.0, "panic", PANIC);
    run_clowder_ok(&socket, &["enclave", "create", "--name", "lwk", "--cores", "1", "--mem", "64M"], &dir.0);
    let (kernel, initrd) = (kernel.to_str().unwrap(), initrd.to_str().unwrap());
    let create = ["enclave", "create", "--name", "vm", "--kind", "linux", "--cores", "1", "--mem", "256M"];
    run_clowder_ok(&socket, &[&create[..], &["--kernel", kernel, "--initrd", initrd]].concat(), &dir.0);

    let panic = run_clowder(&socket, &["run", "vm", "./panic"], &dir.0);
    assert!(!panic.status.success(), "the job cannot end well: {:?}", panic.status);
    assert!(text(&panic.stderr).contains("the guest kernel panicked (sysrq triggered crash)"), "{}", text(&panic.stderr));
    let listing = text(&run_clowder_ok(&socket, &["enclave", "ls"], &dir.0).stdout);
    assert!(!listing.lines().any(|line| line.starts_with("vm ")), "{listing}");
    assert!(listing.lines().any(|line| line.starts_with("lwk ")), "{listing}");
    assert!(
        listing.contains("  vm: its machine ended: the guest kernel panicked (sysrq triggered crash); the guest triple-faulted"),
        "{listing}"
    );

    let after = run_clowder(&socket, &["run", "lwk", "./hello"], &dir.0);
    assert_eq!(text(&after.stdout), "hello from ./hello with 0 arguments\n", "stderr: {}", text(&after.stderr));
    assert_eq!(after.status.code(), Some(3));
    run_clowder_ok(&socket, &["enclave", "rm", "lwk"], &dir.0);
}

fn dynamic_programs(socket: &Path, dir: &Path) {
    let listing = dir.join("listing");
    std::fs::create_dir_all(listing.join("sub")).unwrap();
    std::fs::write(listing.join("data.txt"), "twelve bytes").unwrap();
    std::fs::write(listing.join("script.sh"), "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(listing.join("script.sh"), std::os::unix::fs::PermissionsExt::from_mode(0o751)).unwrap();
    let script = "import json, sys; print(json.dumps({'argv': sys.argv[1:], 'sum': sum(range(10))}))";
    let started = std::time::Instant::now();
    let python = run_clowder(socket, &["run", "vm", "/usr/bin/python3", "-c", script, "x"], dir);
    println!("python3 -c 'import json ...' in the Linux enclave: {:.1} s", started.elapsed().as_secs_f64());
    assert_eq!(text(&python.stdout), "{\"argv\": [\"x\"], \"sum\": 45}\n", "stderr: {}", text(&python.stderr));
    assert_eq!(python.status.code(), Some(0));
    let ls = ["/bin/ls", "-ln", "--time-style=+%s", "listing"];
    let on_host = Command::new(ls[0]).args(&ls[1..]).env_clear().current_dir(dir).output().unwrap();
    let started = std::time::Instant::now();
    let in_vm = run_clowder(socket, &[&["run", "vm"][..], &ls[..]].concat(), dir);
    println!("ls -ln in the Linux enclave: {:.1} s", started.elapsed().as_secs_f64());
    assert_eq!(text(&in_vm.stdout), text(&on_host.stdout), "stderr: {}", text(&in_vm.stderr));
    let missing = run_clowder(socket, &["run", "vm", "/bin/ls", "absent"], dir);
    assert_eq!(missing.status.code(), Some(2), "ls of a missing file fails as on the host");
    assert!(text(&missing.stderr).contains("No such file or directory"), "{}", text(&missing.stderr));
}
