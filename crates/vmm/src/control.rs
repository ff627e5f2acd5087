//! The control socket: a Unix stream socket on which another process (the node daemon, a test,
//! the CLI) drives a running VM. One JSON object per line in each direction; file descriptors
//! travel with SCM_RIGHTS on the same message as their line.
//!
//! Requests (`op`): `stats`, `pause`, `resume`, `stop`, `memory` (→ RAM memfd), `channel`
//! (→ RAM memfd, doorbell eventfd, interrupt eventfd), `add_region` (with one fd: `offset`, `len`,
//! optional `gpa`, optional `read_only`), `remove_region` (`slot`), `translate` (`gpa`, `len` → runs naming the fds
//! sent with the reply), `profile` (`vcpu`, `steps`: single-step that many instructions and
//! count kernel/user instructions, kernel entries and the most stepped kernel addresses). Replies have `"ok": true` or `"ok": false, "error": "..."`; a malformed
//! request gets an error reply and the connection stays usable.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;

use serde_json::{json, Value};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use crate::memory::RegionAccess;
use crate::vm::VmHandle;

/// Longest request line accepted; longer input is answered with an error and dropped.
const MAX_LINE: usize = 64 * 1024;
/// At most this many descriptors may come with one request.
const MAX_FDS: usize = 4;

/// Reads one newline-terminated message and the descriptors that came with it.
pub fn recv_message(stream: &UnixStream, pending: &mut Vec<u8>) -> io::Result<Option<(Vec<u8>, Vec<File>)>> {
    let mut files = Vec::new();
    loop {
        if let Some(pos) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=pos).collect();
            return Ok(Some((line[..line.len() - 1].to_vec(), files)));
        }
        if pending.len() > MAX_LINE {
            pending.clear();
            return Err(io::Error::new(io::ErrorKind::InvalidData, format!("message longer than {MAX_LINE} bytes")));
        }
        let mut buf = [0u8; 4096];
        let mut fds = [-1 as RawFd; MAX_FDS];
        let mut iov = [libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() }];
        // SAFETY: the iovec points at `buf`, which lives across the call.
        let (n, nfds) = unsafe { stream.recv_with_fds(&mut iov, &mut fds) }.map_err(io::Error::from)?;
        for fd in &fds[..nfds] {
            // SAFETY: descriptors just received are owned by nobody else.
            files.push(unsafe { File::from_raw_fd(*fd) });
        }
        if n == 0 {
            return Ok(None);
        }
        pending.extend_from_slice(&buf[..n]);
    }
}

/// Sends one line with descriptors attached.
pub fn send_message(stream: &UnixStream, value: &Value, fds: &[RawFd]) -> io::Result<()> {
    let mut line = value.to_string().into_bytes();
    line.push(b'\n');
    if fds.is_empty() {
        return (&*stream).write_all(&line);
    }
    let sent = stream.send_with_fds(&[&line[..]], fds).map_err(io::Error::from)?;
    (&*stream).write_all(&line[sent..])
}

fn error(message: impl Into<String>) -> (Value, Vec<RawFd>) {
    (json!({"ok": false, "error": message.into()}), Vec::new())
}

fn field_u64(request: &Value, key: &str) -> Result<u64, String> {
    request.get(key).and_then(Value::as_u64).ok_or_else(|| format!("request needs a non-negative integer `{key}`"))
}

/// Answers one request.
pub fn handle_request(vm: &VmHandle, line: &[u8], files: &[File]) -> (Value, Vec<RawFd>) {
    let request: Value = match serde_json::from_slice(line) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => return error("a request is a JSON object with an `op`"),
        Err(e) => return error(format!("malformed request: {e}")),
    };
    let Some(op) = request.get("op").and_then(Value::as_str) else {
        return error("request has no string `op`");
    };
    let ok = |extra: Value| {
        let mut reply = json!({"ok": true});
        if let (Value::Object(r), Value::Object(e)) = (&mut reply, extra) {
            r.extend(e);
        }
        reply
    };
    match op {
        "stats" => {
            let exits: serde_json::Map<String, Value> =
                vm.exit_counters().into_iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
            let regions: Vec<Value> =
                vm.regions().iter().map(|r| json!({"slot": r.slot, "gpa": r.gpa, "len": r.len})).collect();
            (ok(json!({"state": format!("{:?}", vm.state()), "exits": exits, "regions": regions})), vec![])
        }
        "pause" => match vm.pause() {
            Ok(()) => (ok(json!({})), vec![]),
            Err(e) => error(e.to_string()),
        },
        "resume" => match vm.resume() {
            Ok(()) => (ok(json!({})), vec![]),
            Err(e) => error(e.to_string()),
        },
        "stop" => {
            vm.stop();
            (ok(json!({})), vec![])
        }
        "memory" => {
            let layout = vm.layout();
            let ranges: Vec<Value> = layout
                .ram_ranges()
                .map(|r| json!({"gpa": r.gpa, "size": r.size, "file_offset": r.file_offset}))
                .collect();
            (ok(json!({"size": layout.ram_size(), "ranges": ranges})), vec![vm.memfd()])
        }
        "channel" => match vm.channel() {
            Some(c) => (
                ok(json!({
                    "gpa": c.gpa, "size": c.size, "memfd_offset": c.memfd_offset,
                    "vector": c.vector, "doorbell_port": c.doorbell_port,
                    "fds": ["memfd", "doorbell", "interrupt"],
                })),
                vec![vm.memfd(), c.doorbell.as_raw_fd(), c.interrupt.as_raw_fd()],
            ),
            None => error("this VM has no channel device"),
        },
        "add_region" => {
            let [file] = files else {
                return error(format!("add_region needs exactly one file descriptor, got {}", files.len()));
            };
            let (offset, len) = match (field_u64(&request, "offset"), field_u64(&request, "len")) {
                (Ok(o), Ok(l)) => (o, l),
                (Err(e), _) | (_, Err(e)) => return error(e),
            };
            let gpa = request.get("gpa").and_then(Value::as_u64);
            let access = match request.get("read_only") {
                None | Some(Value::Bool(false)) => RegionAccess::ReadWrite,
                Some(Value::Bool(true)) => RegionAccess::ReadOnly,
                Some(other) => return error(format!("`read_only` must be true or false, got {other}")),
            };
            match vm.add_region(file.as_raw_fd(), offset, len, gpa, access) {
                Ok(r) => (ok(json!({"slot": r.slot, "gpa": r.gpa, "len": r.len})), vec![]),
                Err(e) => error(e.to_string()),
            }
        }
        "remove_region" => match field_u64(&request, "slot").map(|s| vm.remove_region(s as u32)) {
            Ok(Ok(r)) => (ok(json!({"slot": r.slot, "gpa": r.gpa, "len": r.len})), vec![]),
            Ok(Err(e)) => error(e.to_string()),
            Err(e) => error(e),
        },
        "translate" => {
            let (gpa, len) = match (field_u64(&request, "gpa"), field_u64(&request, "len")) {
                (Ok(g), Ok(l)) => (g, l),
                (Err(e), _) | (_, Err(e)) => return error(e),
            };
            match vm.translate(gpa, len) {
                Ok(runs) => {
                    let mut fds: Vec<RawFd> = Vec::new();
                    let runs: Vec<Value> = runs
                        .iter()
                        .map(|r| {
                            let index = fds.iter().position(|f| *f == r.fd).unwrap_or_else(|| {
                                fds.push(r.fd);
                                fds.len() - 1
                            });
                            json!({"fd_index": index, "offset": r.offset, "len": r.len})
                        })
                        .collect();
                    if fds.len() > MAX_FDS {
                        return error(format!("range spans {} backing files, at most {MAX_FDS} per reply", fds.len()));
                    }
                    (ok(json!({"runs": runs})), fds)
                }
                Err(e) => error(e.to_string()),
            }
        }
        "profile" => {
            let (vcpu, steps) = match (field_u64(&request, "vcpu"), field_u64(&request, "steps")) {
                (Ok(v), Ok(s)) => (v as usize, s),
                (Err(e), _) | (_, Err(e)) => return error(e),
            };
            match vm.profile_instructions(vcpu, steps, std::time::Duration::from_secs(60)) {
                Ok(p) => (
                    ok(json!({
                        "steps": p.steps, "kernel": p.kernel, "user": p.user,
                        "kernel_entries": p.kernel_entries, "kernel_per_entry": p.kernel_per_entry(),
                        "hot_kernel_addresses": p.hot_kernel_addresses.iter()
                            .map(|&(rip, count)| json!([format!("{rip:#x}"), count])).collect::<Vec<_>>(),
                    })),
                    vec![],
                ),
                Err(e) => error(e.to_string()),
            }
        }
        other => error(format!(
            "unknown op {other:?} (stats, pause, resume, stop, memory, channel, add_region, remove_region, translate, profile)"
        )),
    }
}

fn serve_connection(vm: &VmHandle, stream: UnixStream) {
    let mut pending = Vec::new();
    loop {
        let (reply, fds) = match recv_message(&stream, &mut pending) {
            Ok(Some((line, files))) => handle_request(vm, &line, &files),
            Ok(None) => return,
            Err(e) if e.kind() == io::ErrorKind::InvalidData => error(e.to_string()),
            Err(_) => return,
        };
        if send_message(&stream, &reply, &fds).is_err() {
            return;
        }
    }
}

/// Listens on `path` and serves every connection on its own thread until the process exits.
pub fn serve(vm: Arc<VmHandle>, path: &Path) -> io::Result<()> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    std::thread::Builder::new().name("control".into()).spawn(move || {
        for stream in listener.incoming().flatten() {
            let vm = vm.clone();
            let _ = std::thread::Builder::new().name("control-conn".into()).spawn(move || serve_connection(&vm, stream));
        }
    })?;
    Ok(())
}

/// A client of the control socket.
pub struct ControlClient {
    stream: UnixStream,
    pending: Vec<u8>,
}

impl ControlClient {
    pub fn connect(path: &Path) -> io::Result<Self> {
        Ok(ControlClient { stream: UnixStream::connect(path)?, pending: Vec::new() })
    }

    /// Sends a request (with descriptors) and returns the reply and the descriptors it carried.
    pub fn call(&mut self, request: &Value, fds: &[RawFd]) -> io::Result<(Value, Vec<File>)> {
        send_message(&self.stream, request, fds)?;
        let (line, files) = recv_message(&self.stream, &mut self.pending)?
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "the VMM closed the control socket"))?;
        let reply = serde_json::from_slice(&line).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        Ok((reply, files))
    }
}
