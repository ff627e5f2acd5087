//! A dynamically linked program in a persistent LWK enclave executes other dynamically linked
//! programs of the host (execve reads the program, and its interpreter where the job lacks it,
//! from the host as the job's user sees them): Debian's /bin/sh runs /usr/bin/env, which runs
//! true; a C program execs /bin/echo; a command substitution forks and execs. What cannot be
//! executed fails as on Linux, seen through the shell's words and status: a missing
//! interpreter (127), a file without an execute bit (126), a missing program (127), an
//! interpreter that is not ELF (126, ELIBBAD), one without an execute bit (126, EACCES). Each
//! run's output, error output and status must equal the host's. A one-shot run (no --enclave) of a
//! dynamically linked program gets an enclave made for it and removed after. Needs /dev/kvm,
//! the LWK image, clowder-vmm, gcc and /bin/sh; skipped, with the reason, otherwise.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use clowder_test_support::TempDir;
use clowderd::enclave::Liveness;
use support::{run_clowder, run_clowder_ok, skipped_without, start_daemon, text};

mod support;

/// execs /bin/echo with its own arguments.
const EXEC_ECHO: &str = r#"#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    argv[0] = "echo";
    execv("/bin/echo", argv);
    perror("execv");
    return 1;
}
"#;

const PATH: &str = "PATH=/usr/local/bin:/usr/bin:/bin";

/// `args` in enclave `e` and on the host, with PATH alone in the environment: the same
/// output, error output and status.
fn same_as_host(socket: &Path, dir: &Path, args: &[&str]) -> String {
    let mut run_args = vec!["run", "--enclave", "e", "--env", PATH];
    run_args.extend(args);
    let enclave = run_clowder(socket, &run_args, dir);
    let (name, value) = PATH.split_once('=').unwrap();
    let host = Command::new(args[0]).args(&args[1..]).env_clear().env(name, value).current_dir(dir).output().unwrap();
    assert_eq!(text(&enclave.stdout), text(&host.stdout), "{args:?}: enclave stderr {}", text(&enclave.stderr));
    assert_eq!(text(&enclave.stderr), text(&host.stderr), "{args:?}");
    assert_eq!(enclave.status.code(), host.status.code(), "{args:?}");
    text(&enclave.stdout)
}

/// Builds `dir/exec-echo.c` as `dir/name` (dynamically linked), with `interpreter` as its
/// PT_INTERP if given.
fn build_exec_echo(dir: &Path, name: &str, interpreter: Option<&Path>) {
    let linker = interpreter.map(|path| format!("-Wl,--dynamic-linker={}", path.display()));
    let built = Command::new("gcc").args(["-O2", "-o", name, "exec-echo.c"]).args(&linker).current_dir(dir).status().unwrap();
    assert!(built.success(), "gcc failed for {name}");
}

#[test]
fn dynamic_programs_execute_host_programs() {
    if skipped_without("gcc", "to build the test programs") || !Path::new("/bin/sh").exists() {
        return;
    }
    let dir = TempDir::new("clowder-dynamic-exec");
    let socket = start_daemon(&dir.0, Liveness::default());
    std::fs::write(dir.0.join("exec-echo.c"), EXEC_ECHO).unwrap();
    build_exec_echo(&dir.0, "exec-echo", None);
    build_exec_echo(&dir.0, "no-interpreter", Some(Path::new("/no/such/ld.so")));
    std::fs::write(dir.0.join("data.txt"), "not a program\n").unwrap();
    // An interpreter that is not an ELF file (but may be executed): execve's ELIBBAD; a real
    // one without an execute bit: EACCES.
    let corrupt = dir.0.join("corrupt-ld.so");
    std::fs::write(&corrupt, [b'x'; 200]).unwrap();
    std::fs::set_permissions(&corrupt, PermissionsExt::from_mode(0o755)).unwrap();
    build_exec_echo(&dir.0, "corrupt-interpreter", Some(&corrupt));
    let unexecutable = dir.0.join("unexecutable-ld.so");
    std::fs::copy("/lib64/ld-linux-x86-64.so.2", &unexecutable).unwrap();
    std::fs::set_permissions(&unexecutable, PermissionsExt::from_mode(0o644)).unwrap();
    build_exec_echo(&dir.0, "unexecutable-interpreter", Some(&unexecutable));
    run_clowder_ok(&socket, &["enclave", "create", "--name", "e", "--cores", "1", "--mem", "512M"], &dir.0);

    let shell = same_as_host(&socket, &dir.0, &["/bin/sh", "-c", "/usr/bin/env true; echo env true: $?; env false; echo env false: $?"]);
    assert_eq!(shell, "env true: 0\nenv false: 1\n");
    assert_eq!(same_as_host(&socket, &dir.0, &["./exec-echo", "from", "echo"]), "from echo\n");
    assert_eq!(same_as_host(&socket, &dir.0, &["/bin/sh", "-c", "echo $(/bin/echo nested) $(./exec-echo twice)"]), "nested twice\n");
    // Twice in one job: the second run of a program uses the copy the first read.
    same_as_host(&socket, &dir.0, &["/bin/sh", "-c", "./exec-echo one; ./exec-echo two"]);
    let failures = "./no-interpreter; echo missing interpreter: $?; ./data.txt; echo not executable: $?; ./nothing; echo missing: $?; \
                    ./corrupt-interpreter; echo corrupt interpreter: $?; ./unexecutable-interpreter; echo unexecutable interpreter: $?";
    let shell = same_as_host(&socket, &dir.0, &["/bin/sh", "-c", failures]);
    let expected = "missing interpreter: 127\nnot executable: 126\nmissing: 127\ncorrupt interpreter: 126\nunexecutable interpreter: 126\n";
    assert_eq!(shell, expected);

    run_clowder_ok(&socket, &["enclave", "rm", "e"], &dir.0);

    // One-shot: the same program without --enclave, then with its libraries missing (the
    // loader's words and 127, as on the host); no enclave is left behind.
    let one_shot = run_clowder(&socket, &["run", "./exec-echo", "one", "shot"], &dir.0);
    assert_eq!((text(&one_shot.stdout).as_str(), one_shot.status.code()), ("one shot\n", Some(0)), "{}", text(&one_shot.stderr));
    let missing = run_clowder(&socket, &["run", "./no-interpreter"], &dir.0);
    assert_eq!(missing.status.code(), Some(127));
    assert_eq!(text(&missing.stderr), "./no-interpreter: cannot execute: required file not found\n");
    let listing = run_clowder_ok(&socket, &["enclave", "ls", "--json"], &dir.0);
    let listing: serde_json::Value = serde_json::from_slice(&listing.stdout).unwrap();
    assert_eq!(listing["enclaves"], serde_json::json!([]), "no enclave is left");
}
