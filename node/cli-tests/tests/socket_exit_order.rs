//! A job's sockets are done by the time its `clowder run` ends (issue 25, "exiting
//! improperly"): as with a Linux process, the bytes it wrote are in the peer's socket and its
//! sockets are closed (the peer reads end of file) when the process that stands for it (what
//! `mpirun` waits for) has exited. An LWK job connects to a host Unix socket server, writes one
//! message and exits at once, a dozen times in a row; each time, right when `clowder run`'s exit
//! is seen, the server must already hold the whole message and its end, without waiting.
//! Needs /dev/kvm, the LWK image, clowder-vmm and gcc; skipped, with the reason, otherwise.

use std::io::{ErrorKind, Read};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use clowder_test_support::{lwk_daemon, serve, TempDir};
use clowderd::enclave::Liveness;
use support::{skipped_without, text, vmm_binary};

mod support;

/// Connects to the Unix socket `argv[1]`, writes `argv[2]` and exits without closing it.
const JOB: &str = r#"
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
int main(int argc, char **argv) {
    struct sockaddr_un address = { .sun_family = AF_UNIX };
    if (argc != 3) return 1;
    strncpy(address.sun_path, argv[1], sizeof address.sun_path - 1);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&address, sizeof address) != 0) return 2;
    size_t length = strlen(argv[2]);
    if (write(fd, argv[2], length) != (ssize_t)length) return 3;
    _exit(0);
}
"#;

/// Rounds: before the fix the end came late in 45 of 50 (the job's host sockets closed only
/// after its regions were released); a couple of seconds each.
const ROUNDS: usize = 12;

fn clowder(socket: &Path, dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(support::clowder());
    command.args(args).current_dir(dir).env("CLOWDER_SOCKET", socket);
    command
}

/// The connection the job makes to `listener`, while `run` (its `clowder run`) has not failed.
fn accept_job(listener: &UnixListener, run: &mut Child) -> UnixStream {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match listener.accept() {
            Ok((stream, _)) => return stream,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => panic!("accept: {e}"),
        }
        if let Some(status) = run.try_wait().unwrap() {
            // A connection made just before the exit is still queued.
            if let Ok((stream, _)) = listener.accept() {
                return stream;
            }
            panic!("the job ended ({status}) without connecting");
        }
        assert!(Instant::now() < deadline, "the job did not connect in 120 s");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// What `stream` holds now, and whether its end came: read without waiting.
fn held_now(mut stream: UnixStream) -> (Vec<u8>, bool) {
    stream.set_nonblocking(true).unwrap();
    let mut held = Vec::new();
    let mut buffer = [0u8; 256];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return (held, true),
            Ok(count) => held.extend_from_slice(&buffer[..count]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => return (held, false),
            Err(e) => panic!("reading the job's connection: {e}"),
        }
    }
}

#[test]
fn a_jobs_socket_writes_and_closes_come_before_its_exit() {
    if skipped_without("gcc", "to build the socket program") {
        return;
    }
    let dir = TempDir::new("clowder-socket-exit-order");
    let socket = serve(lwk_daemon(&dir.0, vmm_binary(), Liveness::default()), &dir.0);
    std::fs::write(dir.0.join("job.c"), JOB).unwrap();
    let built = Command::new("gcc").args(["-O2", "-o", "job", "job.c"]).current_dir(&dir.0).status().unwrap();
    assert!(built.success(), "gcc failed for the job");
    let created = clowder(&socket, &dir.0, &["enclave", "create", "--name", "e", "--cores", "1", "--mem", "256M"]).output().unwrap();
    assert!(created.status.success(), "create: {}{}", text(&created.stdout), text(&created.stderr));

    let mut late = Vec::new();
    for round in 0..ROUNDS {
        let path = dir.0.join("server.sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        listener.set_nonblocking(true).unwrap();
        let message = format!("finalize {round}");
        let mut run = clowder(&socket, &dir.0, &["run", "--enclave", "e", "./job", "server.sock", &message]).spawn().unwrap();
        let connection = accept_job(&listener, &mut run);
        let status = run.wait().unwrap();
        let (held, ended) = held_now(connection);
        assert!(status.success(), "round {round}: clowder run ended with {status}");
        if held != message.as_bytes() || !ended {
            late.push(format!("round {round}: held {:?}, end of file {ended}", text(&held)));
        }
    }
    let removed = clowder(&socket, &dir.0, &["enclave", "rm", "e"]).output().unwrap();
    assert!(
        late.is_empty(),
        "{} of {ROUNDS} rounds: clowder run had exited before the server held the job's bytes and end:\n{}",
        late.len(),
        late.join("\n")
    );
    assert!(removed.status.success(), "rm: {}", text(&removed.stderr));
}
