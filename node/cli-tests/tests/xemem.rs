//! clowderd hosts XEMEM: the `clowderd` binary, started with CLOWDER_SOCKET in a temp
//! directory, serves the XEMEM broker beside its API socket; two host processes using
//! libxpmem share a named segment through it, `clowder xemem ls` lists the segment (table and
//! --json), and malformed requests on either socket get errors while the daemon keeps serving.
//!
//! Needs a C compiler and make (libxpmem is built with `make -C xemem`); skipped without them.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::time::Duration;

use clowder_test_support::{daemon_answers_within, workspace_root, TempDir};
use serde_json::{json, Value};

/// The clowderd binary of this build. `cargo test` of the workspace builds it beside the CLI;
/// `cargo test -p clowder-cli` does not, so then it is built here.
fn daemon_binary() -> PathBuf {
    let beside_cli = Path::new(support::clowder()).with_file_name("clowderd");
    if !beside_cli.is_file() {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut build = Command::new(cargo);
        build.args(["build", "-p", "clowderd", "--bin", "clowderd"]).current_dir(workspace_root());
        if beside_cli.parent().and_then(Path::file_name).is_some_and(|profile| profile == "release") {
            build.arg("--release");
        }
        assert!(build.status().unwrap().success(), "building clowderd failed");
    }
    beside_cli
}

/// Builds libxpmem and the peer program linked against it; None (with the reason printed)
/// where there is no C toolchain.
fn build_peer(dir: &Path) -> Option<PathBuf> {
    let xemem = workspace_root().join("xemem");
    match Command::new("make").arg("-s").arg("-C").arg(&xemem).status() {
        Ok(status) if status.success() => {}
        other => {
            eprintln!("skipped: cannot build libxpmem with make -C xemem ({other:?})");
            return None;
        }
    }
    let peer = dir.join("peer");
    let status = Command::new("cc")
        .args(["-O2", "-Wall", "-o"])
        .arg(&peer)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/xemem/peer.c"))
        .arg(format!("-I{}", xemem.join("build/include").display()))
        .arg(format!("-L{}", xemem.join("build/lib").display()))
        .arg(format!("-Wl,-rpath,{}", xemem.join("build/lib").display()))
        .arg("-lxpmem")
        .status()
        .unwrap();
    assert!(status.success(), "compiling the peer program failed");
    Some(peer)
}

struct RunningDaemon {
    child: Child,
    socket: PathBuf,
}

impl RunningDaemon {
    /// Starts clowderd the way a user would on a private socket: CLOWDER_SOCKET only, so the
    /// XEMEM socket lands where `xemem_host::default_socket_path()` and libxpmem expect it.
    fn start(dir: &Path) -> RunningDaemon {
        let socket = dir.join("clowderd.sock");
        let child = Command::new(daemon_binary())
            // Nothing boots here: any existing file stands in for the kernel image.
            .args(["--kernel", support::clowder()])
            .env("CLOWDER_SOCKET", &socket)
            .env_remove("CLOWDER_XEMEM_SOCKET")
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        assert!(daemon_answers_within(&socket, Duration::from_secs(10)), "clowderd did not come up");
        RunningDaemon { child, socket }
    }

    fn clowder(&self, args: &[&str]) -> Output {
        Command::new(support::clowder()).args(args).env("CLOWDER_SOCKET", &self.socket).output().unwrap()
    }

    /// Sends one line as it is (it need not be valid JSON) and returns the reply.
    fn call_raw(&self, line: &str) -> Value {
        let mut stream = std::os::unix::net::UnixStream::connect(&self.socket).unwrap();
        stream.write_all(format!("{line}\n").as_bytes()).unwrap();
        let mut reply = String::new();
        BufReader::new(stream).read_line(&mut reply).unwrap();
        serde_json::from_str(&reply).unwrap()
    }
}

impl Drop for RunningDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A host process holding a named segment until its stdin closes.
struct Owner {
    child: Child,
    stdin: Option<ChildStdin>,
    segid: i64,
}

fn start_owner(peer: &Path, socket: &Path, name: &str, pages: usize) -> Owner {
    let mut child = Command::new(peer)
        .args(["owner", name, &pages.to_string()])
        .env("CLOWDER_SOCKET", socket)
        .env_remove("CLOWDER_XEMEM_SOCKET")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let segid = line.trim().parse().unwrap_or_else(|_| panic!("the owner printed {line:?} instead of a segid"));
    Owner { stdin: child.stdin.take(), child, segid }
}

impl Owner {
    /// Closes stdin: the owner removes its segment and exits.
    fn finish(mut self) {
        drop(self.stdin.take());
        assert!(self.child.wait().unwrap().success(), "the owner's xpmem_remove failed");
    }
}

fn attach(peer: &Path, socket: &Path, name: &str, pages: usize) -> Output {
    Command::new(peer)
        .args(["attach", name, &pages.to_string()])
        .env("CLOWDER_SOCKET", socket)
        .env_remove("CLOWDER_XEMEM_SOCKET")
        .output()
        .unwrap()
}

/// Sends one raw packet on the broker's SOCK_SEQPACKET socket and returns the answer's length.
fn broker_answer_length(socket: &Path, packet: &[u8]) -> isize {
    // SAFETY: plain socket calls on a descriptor we own; the address is zeroed, then filled
    // within its bounds; buffers are valid for the lengths given.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0);
        let mut address: libc::sockaddr_un = std::mem::zeroed();
        address.sun_family = libc::AF_UNIX as libc::sa_family_t;
        let path = socket.as_os_str().as_encoded_bytes();
        assert!(path.len() < address.sun_path.len());
        for (slot, byte) in address.sun_path.iter_mut().zip(path) {
            *slot = *byte as libc::c_char;
        }
        let connected = libc::connect(fd, (&address as *const libc::sockaddr_un).cast(), std::mem::size_of::<libc::sockaddr_un>() as u32);
        assert_eq!(connected, 0, "connecting to the broker: {}", std::io::Error::last_os_error());
        assert_eq!(libc::send(fd, packet.as_ptr().cast(), packet.len(), 0), packet.len() as isize);
        let timeout = libc::timeval { tv_sec: 5, tv_usec: 0 };
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&timeout as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        );
        let mut answer = [0u8; 4096];
        let length = libc::recv(fd, answer.as_mut_ptr().cast(), answer.len(), 0);
        libc::close(fd);
        length
    }
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

#[test]
fn clowderd_hosts_xemem_and_lists_segments() {
    let dir = TempDir::new("clowder-cli-xemem");
    let Some(peer) = build_peer(&dir.0) else { return };
    let mut daemon = RunningDaemon::start(&dir.0);

    // The broker's socket: beside the API socket, a socket file, open to every local user.
    let xemem_socket = dir.0.join("xemem.sock");
    let metadata = std::fs::metadata(&xemem_socket).expect("clowderd made no xemem.sock beside its socket");
    assert!(metadata.file_type().is_socket());
    assert_eq!(metadata.permissions().mode() & 0o777, 0o666);

    let empty = daemon.clowder(&["xemem", "ls"]);
    assert!(empty.status.success(), "{}", text(&empty));
    assert!(text(&empty).contains("no XEMEM segments"), "{}", text(&empty));

    // Two host processes: one makes a named segment, the other gets, attaches and reads it.
    let pages = 16;
    let owner = start_owner(&peer, &daemon.socket, "clowder-test-vector", pages);
    let attached = attach(&peer, &daemon.socket, "clowder-test-vector", pages);
    assert!(attached.status.success(), "attacher: {}", text(&attached));
    assert!(text(&attached).contains("ok 65536 bytes"));

    let table = daemon.clowder(&["xemem", "ls"]);
    assert!(table.status.success(), "{}", text(&table));
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    eprintln!("clowder xemem ls:\n{table}");
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["SEGID", "OWNER", "PID", "SIZE", "NAME"]);
    let row: Vec<&str> = lines.next().expect("no segment row").split_whitespace().collect();
    let pid = owner.child.id().to_string();
    assert_eq!(row, [format!("{:#x}", owner.segid).as_str(), "host", &pid, "64K", "clowder-test-vector"], "{table}");

    let json_output = daemon.clowder(&["--json", "xemem", "ls"]);
    let reply: Value = serde_json::from_slice(&json_output.stdout).expect("--json prints one JSON object");
    assert_eq!(reply["ok"], true);
    assert_eq!(reply["socket"], xemem_socket.display().to_string());
    assert_eq!(
        reply["segments"],
        json!([{"segid": owner.segid, "segid_hex": format!("{:#x}", owner.segid), "owner_enclave": 1,
                "owner_process": owner.child.id(), "size": 65536, "name": "clowder-test-vector"}])
    );

    // Malformed requests get errors, on the API socket and on the broker's.
    for line in [r#"{"op":"xemem_ls","verbose":true}"#, r#"{"op":"xemem_ls""#, "xemem ls"] {
        let reply = daemon.call_raw(line);
        assert_eq!(reply["ok"], false, "{line}: {reply}");
    }
    for packet in [&b"\x01"[..], b"garbage that is no broker packet at all", &[0xff; 600][..]] {
        assert!(broker_answer_length(&xemem_socket, packet) > 0, "the broker did not answer {packet:?}");
    }
    // ... and the daemon survives: it still lists, and the segment can still be attached.
    assert!(daemon.child.try_wait().unwrap().is_none(), "clowderd died");
    let again = attach(&peer, &daemon.socket, "clowder-test-vector", pages);
    assert!(again.status.success(), "attacher after malformed packets: {}", text(&again));
    assert_eq!(daemon.call_raw(r#"{"op":"xemem_ls"}"#)["segments"].as_array().unwrap().len(), 1);

    // Removed by its owner: gone from the listing.
    owner.finish();
    let after = daemon.clowder(&["xemem", "ls"]);
    assert!(text(&after).contains("no XEMEM segments"), "{}", text(&after));

    // A clean exit removes both sockets.
    clowderd::sys::send_signal(daemon.child.id(), libc::SIGTERM).unwrap();
    assert!(daemon.child.wait().unwrap().success());
    assert!(!daemon.socket.exists() && !xemem_socket.exists(), "sockets left behind");
}
