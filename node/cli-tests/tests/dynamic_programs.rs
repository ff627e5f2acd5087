//! Dynamically linked programs in a persistent LWK enclave, end to end through the CLI: the
//! daemon sends the program's interpreter (PT_INTERP) with it, and the kernel reads the
//! loader's cache, the shared libraries and what lies beside them from the host (read-only,
//! with the user's rights), mapping them with private file mappings. gcc's and g++'s default
//! builds give the host's output; Debian's python3 imports json and math; a library in the
//! working directory is found through LD_LIBRARY_PATH and dlopen; a missing interpreter and a
//! missing library end with status 127 and the words a Linux shell and the loader use; a
//! corrupt library is the loader's error. Needs /dev/kvm, the LWK image, clowder-vmm, gcc and
//! g++ (python3's case /usr/bin/python3); skipped, with the reason, otherwise.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use clowder_test_support::{lwk_daemon, serve, TempDir};
use clowderd::enclave::Liveness;
use support::{skipped_without, vmm_binary};

mod support;

fn clowder(socket: &Path, args: &[&str], cwd: &Path) -> Output {
    Command::new(support::clowder()).args(args).current_dir(cwd).env("CLOWDER_SOCKET", socket).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Builds `dir/name` from `source` (kept as `dir/name.EXTENSION`) with `compiler`'s defaults
/// (dynamically linked) and `flags`.
fn build(dir: &Path, compiler: &str, name: &str, extension: &str, source: &str, flags: &[&str]) -> PathBuf {
    let source_path = dir.join(format!("{name}.{extension}"));
    std::fs::write(&source_path, source).unwrap();
    let binary = dir.join(name);
    let status = Command::new(compiler).arg("-O2").arg("-o").arg(&binary).arg(&source_path).args(flags).current_dir(dir).status().unwrap();
    assert!(status.success(), "{compiler} failed for {name}");
    binary
}

/// Arguments, environment, a file of the working directory read with stdio, and status 3.
const HELLO: &str = r#"#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) printf("argv[%d] = %s\n", i, argv[i]);
    printf("GREETING = %s\n", getenv("GREETING") ? getenv("GREETING") : "(unset)");
    char line[64] = "";
    FILE *input = fopen("input.txt", "r");
    if (!input || !fgets(line, sizeof line, input)) return 10;
    printf("input: %s", line);
    return 3;
}
"#;

/// iostream, std::vector, std::string, an exception thrown and caught (libstdc++, libgcc_s).
const CPP: &str = r#"#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>
int main() {
    std::vector<std::string> words{"dynamic", "c++", "in", "an", "enclave"};
    std::string joined;
    for (const auto &word : words) joined += word + " ";
    std::cout << joined << words.size() << std::endl;
    try {
        throw std::runtime_error("caught");
    } catch (const std::exception &error) {
        std::cout << error.what() << std::endl;
    }
    return 0;
}
"#;

/// A library for LD_LIBRARY_PATH and dlopen.
const LIBRARY: &str = r#"int library_twice(int value) { return 2 * value; }
"#;

/// Calls the library it was linked against.
const USES_LIBRARY: &str = r#"#include <stdio.h>
int library_twice(int);
int main(void) { printf("library_twice(21) = %d\n", library_twice(21)); return 0; }
"#;

/// dlopen of each argument: the library's answer, or the loader's error.
const DLOPEN: &str = r#"#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        void *library = dlopen(argv[i], RTLD_NOW);
        if (!library) { printf("%s\n", dlerror()); continue; }
        int (*twice)(int) = (int (*)(int))dlsym(library, "library_twice");
        printf("%s: library_twice(4) = %d\n", argv[i], twice ? twice(4) : -1);
        dlclose(library);
    }
    return 0;
}
"#;

/// Runs `args` in enclave `e` and on the host (the program and its arguments as given), and
/// checks that output and status agree.
fn same_as_host(socket: &Path, dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut run_args = vec!["run", "--enclave", "e"];
    let env_args: Vec<String> = env.iter().map(|(name, value)| format!("{name}={value}")).collect();
    for entry in &env_args {
        run_args.extend(["--env", entry.as_str()]);
    }
    run_args.extend(args);
    let enclave = clowder(socket, &run_args, dir);
    let host = Command::new(args[0]).args(&args[1..]).env_clear().envs(env.iter().copied()).current_dir(dir).output().unwrap();
    assert_eq!(text(&enclave.stdout), text(&host.stdout), "{args:?}: enclave stderr {}", text(&enclave.stderr));
    assert_eq!(enclave.status.code(), host.status.code(), "{args:?}: enclave stderr {}", text(&enclave.stderr));
    enclave
}

#[test]
fn dynamically_linked_programs_run_in_a_persistent_enclave() {
    if skipped_without("g++", "to build the C++ program") {
        return;
    }
    let dir = TempDir::new("clowder-dynamic");
    let socket = serve(lwk_daemon(&dir.0, vmm_binary(), Liveness::default()), &dir.0);
    std::fs::write(dir.0.join("input.txt"), "the input\n").unwrap();
    build(&dir.0, "gcc", "hello", "c", HELLO, &[]);
    build(&dir.0, "g++", "cpp", "cpp", CPP, &[]);
    std::fs::create_dir(dir.0.join("lib")).unwrap();
    build(&dir.0, "gcc", "lib/libclowdertwice.so", "c", LIBRARY, &["-shared", "-fPIC"]);
    build(&dir.0, "gcc", "uses-library", "c", USES_LIBRARY, &["-Llib", "-lclowdertwice"]);
    build(&dir.0, "gcc", "dlopen", "c", DLOPEN, &[]);
    build(&dir.0, "gcc", "no-interpreter", "c", "int main(void) { return 0; }\n", &["-Wl,--dynamic-linker=/no/such/ld.so"]);
    std::fs::write(dir.0.join("libcorrupt.so"), [b'x'; 200]).unwrap();

    let created = clowder(&socket, &["enclave", "create", "--name", "e", "--cores", "1", "--mem", "512M"], &dir.0);
    assert!(created.status.success(), "create: {}{}", text(&created.stdout), text(&created.stderr));

    let hello = same_as_host(&socket, &dir.0, &["./hello", "one", "two words"], &[("GREETING", "hi")]);
    assert_eq!(hello.status.code(), Some(3));
    same_as_host(&socket, &dir.0, &["./cpp"], &[]);
    // The library lies in the working directory: found through LD_LIBRARY_PATH (relative, as
    // the loader resolves it from the working directory), and by path with dlopen.
    let linked = same_as_host(&socket, &dir.0, &["./uses-library"], &[("LD_LIBRARY_PATH", "lib")]);
    assert_eq!(text(&linked.stdout), "library_twice(21) = 42\n");
    let opened = same_as_host(&socket, &dir.0, &["./dlopen", "./lib/libclowdertwice.so", "./libcorrupt.so", "libm.so.6"], &[]);
    assert!(text(&opened.stdout).contains("./libcorrupt.so: invalid ELF header"), "{}", text(&opened.stdout));

    // Without the search path, the loader's message and 127, as on the host.
    let missing = clowder(&socket, &["run", "--enclave", "e", "./uses-library"], &dir.0);
    assert_eq!(missing.status.code(), Some(127));
    let expected = "./uses-library: error while loading shared libraries: libclowdertwice.so: cannot open shared object file: No such file or directory\n";
    assert_eq!(text(&missing.stderr), expected);
    let no_interpreter = clowder(&socket, &["run", "--enclave", "e", "./no-interpreter"], &dir.0);
    assert_eq!(no_interpreter.status.code(), Some(127));
    assert_eq!(text(&no_interpreter.stderr), "./no-interpreter: cannot execute: required file not found\n");

    if Path::new("/usr/bin/python3").exists() {
        let start = Instant::now();
        let python =
            clowder(&socket, &["run", "--enclave", "e", "/usr/bin/python3", "-c", "import json, math; print(json.dumps(math.pi))"], &dir.0);
        eprintln!("python3 -c 'import json, math; ...' in the enclave: {:.2} s", start.elapsed().as_secs_f64());
        assert_eq!(text(&python.stdout), "3.141592653589793\n", "stderr: {}", text(&python.stderr));
        assert_eq!(python.status.code(), Some(0));
    } else {
        eprintln!("python3's case skipped: no /usr/bin/python3");
    }

    // A login's variables, as ADIOS2 and other libraries expect (getenv("HOME") unchecked), and
    // what --env names wins.
    let env = clowder(&socket, &["run", "--enclave", "e", "--env", "USER=given", "/usr/bin/printenv", "HOME", "USER", "PATH"], &dir.0);
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let account = std::process::Command::new("getent").args(["passwd", &uid.to_string()]).output().unwrap();
    let home = text(&account.stdout).split(':').nth(5).unwrap_or_default().to_string();
    assert_eq!(text(&env.stdout), format!("{home}\ngiven\n/usr/local/bin:/usr/bin:/bin\n"), "stderr: {}", text(&env.stderr));

    let removed = clowder(&socket, &["enclave", "rm", "e"], &dir.0);
    assert!(removed.status.success(), "rm: {}", text(&removed.stderr));
}
