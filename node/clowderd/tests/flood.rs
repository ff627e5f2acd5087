//! No client can take the daemon down: the `clowderd` binary, flooded by an unprivileged user
//! with thousands of connections and with requests that never end, keeps serving root and keeps
//! its enclave; run out of descriptors, it waits and recovers; idle, oversized and never-read
//! requests lose their connection. The flooder is a forked child that becomes `nobody` and makes only
//! system calls (the test process has other threads, so the child must not allocate).

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::FromRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clowder_test_support::{daemon_answers_within, kernel_image, vmm_binary, why_enclaves_cannot_boot, TempDir};
use clowderd::client::Client;
use serde_json::{json, Value};

const NOBODY: libc::uid_t = 65534;

/// A `clowderd` process whose descriptors are limited to `max_files` (soft and hard, so it
/// cannot raise them), with its stderr in `dir`/clowderd.log.
struct Daemon {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
}

impl Daemon {
    fn start(dir: &Path, max_files: u64, options: &[&str]) -> Daemon {
        // `nobody` must reach the socket.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let socket = dir.join("clowderd.sock");
        let log = dir.join("clowderd.log");
        let mut command = Command::new(env!("CARGO_BIN_EXE_clowderd"));
        command
            .args(["--socket", socket.to_str().unwrap(), "--vmm", vmm_binary().to_str().unwrap()])
            .args(["--kernel", kernel_image().to_str().unwrap()])
            .args(options)
            .stderr(File::create(&log).unwrap())
            .stdout(Stdio::null());
        // SAFETY: setrlimit only, between fork and exec.
        unsafe {
            command.pre_exec(move || {
                let limit = libc::rlimit { rlim_cur: max_files, rlim_max: max_files };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().unwrap();
        assert!(daemon_answers_within(&socket, Duration::from_secs(10)), "clowderd did not come up");
        Daemon { child, socket, log }
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    fn call(&self, request: Value) -> Value {
        Client::connect_to(&self.socket).unwrap().call(&request).unwrap()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = clowderd::sys::send_signal(self.child.id(), libc::SIGTERM);
        let _ = self.child.wait();
    }
}

/// A forked child, `nobody`, holding `connections` connections to the daemon and writing a
/// request without end on every `endless_every`-th one for `writing`; then it waits to be
/// killed. `report` gives what the daemon said on the last connection.
struct Flood {
    pid: libc::pid_t,
    report: File,
}

impl Flood {
    fn start(socket: &Path, connections: usize, endless_every: usize, writing: Duration) -> Flood {
        Flood::start_of_kind(socket, libc::SOCK_STREAM, connections, endless_every, writing)
    }

    /// The same flood on a socket of `kind` (the XEMEM broker's is SOCK_SEQPACKET).
    fn start_of_kind(socket: &Path, kind: libc::c_int, connections: usize, endless_every: usize, writing: Duration) -> Flood {
        // Everything the child uses is made here: it must not allocate.
        // SAFETY: sockaddr_un is plain data, valid when zeroed.
        let mut address: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        address.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (slot, byte) in address.sun_path.iter_mut().zip(socket.as_os_str().as_bytes()) {
            *slot = *byte as libc::c_char;
        }
        let mut fds: Vec<libc::c_int> = Vec::with_capacity(connections);
        let chunk = vec![b'x'; 16 * 1024];
        let mut said = [0u8; 512];
        let mut pipe = [0; 2];
        // SAFETY: a pipe into a local array.
        assert_eq!(unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: the child makes only async-signal-safe system calls on memory prepared above,
        // and ends with _exit or is killed.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid > 0 {
            // SAFETY: the write end is ours to close.
            unsafe { libc::close(pipe[1]) };
            // SAFETY: the read end is ours alone and becomes the File.
            return Flood { pid, report: unsafe { File::from_raw_fd(pipe[0]) } };
        }
        // SAFETY: in the forked child: system calls only, on memory prepared before the fork.
        unsafe {
            let limit = libc::rlimit { rlim_cur: connections as u64 + 64, rlim_max: connections as u64 + 64 };
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
            if libc::setgroups(0, std::ptr::null()) != 0 || libc::setgid(NOBODY) != 0 || libc::setuid(NOBODY) != 0 {
                libc::_exit(90);
            }
            for _ in 0..connections {
                // Stream floods write without end, so never block; a seqpacket flood only
                // connects, and waits for the backlog so that every connection gets through.
                let blocking = if kind == libc::SOCK_SEQPACKET { 0 } else { libc::SOCK_NONBLOCK };
                let fd = libc::socket(libc::AF_UNIX, kind | blocking | libc::SOCK_CLOEXEC, 0);
                if fd < 0 {
                    break;
                }
                // A full backlog (EAGAIN) leaves this one unconnected; the flood goes on.
                libc::connect(fd, (&address as *const libc::sockaddr_un).cast(), std::mem::size_of::<libc::sockaddr_un>() as u32);
                fds.push(fd);
            }
            if let Some(&last) = fds.last() {
                let mut poll = libc::pollfd { fd: last, events: libc::POLLIN, revents: 0 };
                if libc::poll(&mut poll, 1, 10_000) > 0 {
                    let count = libc::read(last, said.as_mut_ptr().cast(), said.len());
                    if count > 0 {
                        libc::write(pipe[1], said.as_ptr().cast(), count as usize);
                    }
                }
            }
            libc::close(pipe[1]);
            let started = Instant::now();
            while started.elapsed() < writing {
                for fd in fds.iter().step_by(endless_every) {
                    libc::send(*fd, chunk.as_ptr().cast(), chunk.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL);
                }
                libc::usleep(1000);
            }
            loop {
                libc::pause();
            }
        }
    }

    /// What the daemon said to the flood's last connection.
    fn said(&mut self) -> String {
        let mut text = String::new();
        let _ = self.report.read_to_string(&mut text);
        text
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        // SAFETY: our own child.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
    }
}

fn process_alive(pid: u64) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
}

#[test]
fn a_flood_from_an_unprivileged_user_leaves_the_daemon_and_its_enclave_serving_root() {
    let dir = TempDir::new("clowderd-flood");
    // Without limits, the flood's connections would run this daemon out of descriptors.
    let mut daemon = Daemon::start(&dir.0, 1024, &[]);
    let enclave = match why_enclaves_cannot_boot(&vmm_binary()) {
        Some(why) => {
            eprintln!("no enclave during the flood: {why}");
            None
        }
        None => {
            let created = daemon.call(json!({"op": "create", "name": "keep", "cores": 1, "mem": "64M"}));
            assert_eq!(created["ok"], true, "{created}\n{}", daemon.log());
            Some(created["enclave"]["pid"].as_u64().unwrap())
        }
    };

    let mut flood = Flood::start(&daemon.socket, 3000, 7, Duration::from_secs(4));
    let said = flood.said();
    assert!(said.contains("too many connections: uid 65534"), "the flood's last connection was told: {said:?}");
    // Root is answered all through the flood, promptly.
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(5) {
        let asked = Instant::now();
        let listing = daemon.call(json!({"op": "ls"}));
        assert_eq!(listing["ok"], true, "{listing}");
        assert!(asked.elapsed() < Duration::from_secs(5), "ls took {:?} during the flood", asked.elapsed());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(daemon.alive(), "clowderd died in the flood:\n{}", daemon.log());
    if let Some(vmm) = enclave {
        let listing = daemon.call(json!({"op": "ls"}));
        let enclaves = listing["enclaves"].as_array().unwrap();
        assert!(enclaves.iter().any(|e| e["name"] == "keep" && e["state"] == "ready" && e["pid"] == vmm), "{listing}");
        assert!(process_alive(vmm), "the enclave's VMM is gone");
        let removed = daemon.call(json!({"op": "rm", "name": "keep"}));
        assert_eq!(removed["ok"], true, "{removed}");
    }
}

#[test]
fn a_daemon_out_of_descriptors_waits_and_serves_again() {
    let dir = TempDir::new("clowderd-no-fds");
    // Limits too generous for the descriptors it has: accepting fails with EMFILE.
    let mut daemon = Daemon::start(&dir.0, 96, &["--max-connections", "5000", "--max-connections-per-user", "5000"]);
    let flood = Flood::start(&daemon.socket, 400, usize::MAX, Duration::ZERO);
    std::thread::sleep(Duration::from_secs(3));
    assert!(daemon.alive(), "clowderd exited when it ran out of descriptors:\n{}", daemon.log());
    drop(flood);
    // Once the flood's connections close, the daemon serves again.
    let deadline = Instant::now() + Duration::from_secs(20);
    let answered = loop {
        let reply = Client::connect_to(&daemon.socket).and_then(|mut client| client.call(&json!({"op": "ls"})));
        match reply {
            Ok(reply) if reply["ok"] == true => break true,
            _ if Instant::now() > deadline => break false,
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    assert!(answered, "clowderd did not serve again:\n{}", daemon.log());
    assert!(daemon.log().contains("retrying with back-off"), "{}", daemon.log());
}

/// Reads what the daemon says until it closes the connection (or `limit` passes: then None).
/// A daemon that closes with our request unread resets the connection: that is closed too.
fn read_until_closed(stream: &mut UnixStream, limit: Duration) -> Option<String> {
    stream.set_read_timeout(Some(limit)).unwrap();
    let mut said = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(count) => said.extend_from_slice(&buffer[..count]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(_) => return None,
        }
    }
    Some(String::from_utf8_lossy(&said).into_owned())
}

#[test]
fn idle_oversized_and_never_read_requests_lose_their_connection() {
    let dir = TempDir::new("clowderd-idle");
    let daemon = Daemon::start(&dir.0, 1024, &["--idle-timeout", "1000"]);

    // Nothing sent: closed after the idle timeout, with the reason.
    let mut idle = UnixStream::connect(&daemon.socket).unwrap();
    let started = Instant::now();
    let said = read_until_closed(&mut idle, Duration::from_secs(5)).expect("the idle connection stayed open");
    assert!(said.contains("closing the idle connection"), "{said}");
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());

    // A line trickled out a byte at a time never becomes a request.
    let mut trickle = UnixStream::connect(&daemon.socket).unwrap();
    trickle.set_nonblocking(true).unwrap();
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1500) && trickle.write_all(b" ").is_ok() {
        std::thread::sleep(Duration::from_millis(100));
    }
    trickle.set_nonblocking(false).unwrap();
    let said = read_until_closed(&mut trickle, Duration::from_secs(5)).expect("the trickling connection stayed open");
    assert!(said.contains("closing the idle connection"), "{said}");

    // A line over the cap: refused, and the connection closed rather than read on.
    let mut oversized = UnixStream::connect(&daemon.socket).unwrap();
    let writer = {
        let mut stream = oversized.try_clone().unwrap();
        std::thread::spawn(move || {
            let chunk = vec![b'x'; 64 * 1024];
            while stream.write_all(&chunk).is_ok() {}
        })
    };
    let said = read_until_closed(&mut oversized, Duration::from_secs(5)).expect("the oversized request's connection stayed open");
    assert!(said.contains("longer than 262144 bytes"), "{said}");
    writer.join().unwrap();

    // A client that asks and asks but never reads: once its replies fill the socket, the
    // daemon waits the idle timeout for it to read, then closes the connection.
    let mut deaf = UnixStream::connect(&daemon.socket).unwrap();
    let asking = {
        let mut stream = deaf.try_clone().unwrap();
        std::thread::spawn(move || {
            for _ in 0..20_000 {
                if stream.write_all(b"{\"op\":\"ls\"}\n").is_err() {
                    break;
                }
            }
        })
    };
    std::thread::sleep(Duration::from_secs(3));
    let said = read_until_closed(&mut deaf, Duration::from_secs(5)).expect("the connection of a client that never reads stayed open");
    assert!(said.lines().count() < 20_000, "all {} replies were sent", said.lines().count());
    asking.join().unwrap();

    // Others are served as ever.
    assert_eq!(daemon.call(json!({"op": "ls"}))["ok"], true);
}

#[test]
fn a_flood_of_xemem_broker_connections_is_bounded_per_user() {
    let dir = TempDir::new("clowderd-broker-flood");
    let mut daemon = Daemon::start(&dir.0, 8192, &[]);
    let broker = dir.0.join("xemem.sock");
    assert!(broker.exists(), "no broker socket beside the API's");
    let flood = Flood::start_of_kind(&broker, libc::SOCK_SEQPACKET, 1100, usize::MAX, Duration::ZERO);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !daemon.log().contains("uid 65534 already has 1024 open to the XEMEM broker") {
        assert!(Instant::now() < deadline, "the broker admitted more than 1024 of one user's connections:\n{}", daemon.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    // Root still reaches the broker and the API during the flood.
    let listing = daemon.call(json!({"op": "xemem_ls"}));
    assert_eq!(listing["ok"], true, "{listing}");
    let root = clowderd::sys::connect(&broker).expect("root cannot connect to the broker during the flood");
    drop(root);
    let held = std::fs::read_dir(format!("/proc/{}/fd", daemon.child.id())).unwrap().count();
    assert!(held < 1024 + 200, "clowderd holds {held} descriptors during the flood");
    assert!(daemon.alive(), "clowderd died in the broker flood:\n{}", daemon.log());
    drop(flood);
}
