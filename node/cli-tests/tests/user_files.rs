//! A job in a persistent enclave reaches the host's files as its user does on the host (issue
//! 21, point 4): an input by absolute path outside its working directory, through symbolic
//! links, with the user's groups, and not a root-only file nor a directory the user may not
//! write. The same static program runs on the host (setpriv, as the user) and in the enclave,
//! and says the same. Confined (`clowder run --confine DIR`), the job reaches nothing outside
//! DIR. The daemon runs in this process; the user is an unprivileged uid the CLI runs as. Needs
//! /dev/kvm, the LWK image, clowder-vmm, musl-gcc and setpriv (skipped, with the reason,
//! otherwise).

use std::os::unix::fs::{chown, symlink, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};

use clowder_test_support::{build_musl_program, daemon_config, kernel_image, serve, TempDir};
use clowderd::daemon::Daemon;
use clowderd::enclave::Liveness;
use clowderd::machine::VmmLauncher;
use support::{skipped_without, text, vmm_binary};

mod support;

const USER: u32 = 4101;
const ADMINS: u32 = 4242;
/// A supplementary group of the user's that opens one input.
const READERS: u32 = 4545;

/// Opens each path it is given (`w:` in front to create it for writing) and says what came of
/// it, one line each: the first bytes, or the error as errno's name.
const OPENER: &str = r#"#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *path = argv[i];
        int writing = strncmp(path, "w:", 2) == 0;
        if (writing) path += 2;
        int fd = writing ? open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644) : open(path, O_RDONLY);
        if (fd < 0) {
            printf("%s: %s\n", argv[i], errno == EACCES ? "EACCES" : errno == ENOENT ? "ENOENT" : strerror(errno));
            continue;
        }
        char data[64] = {0};
        ssize_t got = writing ? write(fd, "made", 4) : read(fd, data, sizeof data - 1);
        printf("%s: %s %zd\n", argv[i], writing ? "wrote" : data, got);
        close(fd);
    }
    return 0;
}
"#;

fn as_user(socket: &Path, cwd: &Path, program: &str, args: &[&str]) -> Output {
    let groups = format!("{ADMINS},{READERS}");
    Command::new("setpriv")
        .args(["--reuid", &USER.to_string(), "--regid", &USER.to_string(), "--groups", &groups])
        .arg(program)
        .args(args)
        .env("CLOWDER_SOCKET", socket)
        .current_dir(cwd)
        .output()
        .unwrap()
}

#[test]
fn jobs_open_the_users_files_as_on_the_host_unless_confined() {
    if skipped_without("setpriv", "to act as an unprivileged user") {
        return;
    }
    let dir = TempDir::new("clowder-user-files");
    let mode = |path: &Path, mode: u32| std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    mode(&dir.0, 0o755);
    let (run, inputs, closed) = (dir.0.join("run"), dir.0.join("inputs"), dir.0.join("roots"));
    for made in [&run, &inputs, &closed] {
        std::fs::create_dir(made).unwrap();
        mode(made, 0o755);
    }
    chown(&run, Some(USER), Some(USER)).unwrap();
    std::fs::write(inputs.join("deck"), "input deck").unwrap();
    std::fs::write(inputs.join("secret"), "root only").unwrap();
    mode(&inputs.join("secret"), 0o600);
    std::fs::write(inputs.join("readers"), "for readers").unwrap();
    chown(inputs.join("readers"), Some(0), Some(READERS)).unwrap();
    mode(&inputs.join("readers"), 0o640);
    symlink(inputs.join("deck"), run.join("link-to-deck")).unwrap();
    symlink("../inputs/secret", run.join("link-to-secret")).unwrap();
    let program = build_musl_program(&dir.0, "opener", OPENER);

    let mut config = daemon_config(vmm_binary(), kernel_image(), Liveness::default());
    config.admin_group = Some(ADMINS);
    let launcher = VmmLauncher { vmm: vmm_binary(), kernel: kernel_image(), runtime_dir: dir.0.clone() };
    let socket = serve(Daemon::new(config, Box::new(launcher)), &dir.0);
    let clowder = support::clowder();
    let created = as_user(&socket, &run, clowder, &["enclave", "create", "--name", "files", "--mem", "64M"]);
    assert!(created.status.success(), "{}", text(&created.stderr));

    let deck = inputs.join("deck");
    let (secret, readers, forbidden) = (inputs.join("secret"), inputs.join("readers"), format!("w:{}", closed.join("new").display()));
    let paths = [
        deck.to_str().unwrap(),
        secret.to_str().unwrap(),
        readers.to_str().unwrap(),
        &forbidden,
        "link-to-deck",
        "link-to-secret",
        "../inputs/deck",
        "w:mine",
    ];
    let on_host = as_user(&socket, &run, program.to_str().unwrap(), &paths);
    assert!(on_host.status.success(), "{}", text(&on_host.stderr));
    std::fs::remove_file(run.join("mine")).unwrap();
    let expected = text(&on_host.stdout);
    assert!(
        expected.contains(": input deck 10") && expected.contains("secret: EACCES") && expected.contains(": for readers 11"),
        "{expected}"
    );

    let mut job = vec!["run", "--enclave", "files", program.to_str().unwrap()];
    job.extend(paths);
    let in_enclave = as_user(&socket, &run, clowder, &job);
    assert_eq!(text(&in_enclave.stdout), expected, "the enclave as the host: {}", text(&in_enclave.stderr));
    let made = std::fs::metadata(run.join("mine")).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&made), USER, "created as the user");

    // Confined to its directory: nothing outside it, by any spelling.
    let mut confined = vec!["run", "--enclave", "files", "--confine", run.to_str().unwrap(), program.to_str().unwrap()];
    confined.extend([deck.to_str().unwrap(), "link-to-deck", "../inputs/deck", "w:mine"]);
    let confined = as_user(&socket, &run, clowder, &confined);
    let said = text(&confined.stdout);
    let expected_confined = format!("{}: EACCES\nlink-to-deck: EACCES\n../inputs/deck: EACCES\nw:mine: wrote 4\n", deck.display());
    assert_eq!(said, expected_confined, "{}", text(&confined.stderr));

    let removed = as_user(&socket, &run, clowder, &["enclave", "rm", "files"]);
    assert!(removed.status.success(), "{}", text(&removed.stderr));
}
