//! Sockets of enclave jobs, the daemon's side (`enclave_proto::socket`): each job that makes a
//! socket gets a helper process (`sockets_helper`, clowderd run with `--socket-helper`) that
//! is the job's user on the host (uid, gid, groups, and the RLIMIT_NOFILE of the `clowder run`
//! that launched the job) and holds the job's host sockets. So a connection from an enclave is
//! the user's connection (the same firewall, the same limits: EMFILE at the user's own limit, no
//! privileged port unless the user may bind one), and the daemon's descriptors and rights are
//! never spent on a job's sockets.
//!
//! The pump hands each `SocketRequest` to the helper as it came (one seqpacket each); a thread
//! per helper sends the helper's answers and readiness reports to the enclave, after checking
//! that each is a socket message of this job (the helper runs as the user: its word is not
//! trusted further than that). The helper ends with the job (killed when the job's slot goes),
//! or with the daemon (PR_SET_PDEATHSIG).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use enclave_proto::{HostMessage, MAX_MESSAGE_LEN};

use crate::guest_ram::GuestRam;
use crate::hio::Identity;
use crate::link::Sender;
use crate::sys;

/// The argument that makes `clowderd` a job's socket helper.
pub const HELPER_ARGUMENT: &str = "--socket-helper";
/// Where the helper finds its control socket and the enclave's RAM.
pub const CONTROL_FD: i32 = 3;
pub const MEMORY_FD: i32 = 4;

/// The user's descriptor limit, as the launching `clowder run` had it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserLimits {
    pub files: (u64, u64),
}

impl UserLimits {
    /// The limits of process `pid` (the client): by prlimit, else from `/proc/PID/limits`
    /// (where the daemon lacks CAP_SYS_RESOURCE, as in some containers); the daemon's defaults
    /// when neither can be read (the client already went).
    pub fn of_process(pid: i32) -> UserLimits {
        let mut limit = libc::rlimit64 { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: prlimit64 only writes the rlimit we own; a NULL new limit changes nothing.
        if unsafe { libc::prlimit64(pid, libc::RLIMIT_NOFILE, std::ptr::null(), &mut limit) } == 0 {
            return UserLimits { files: (limit.rlim_cur, limit.rlim_max) };
        }
        let from_proc = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok().and_then(|text| {
            let line = text.lines().find(|line| line.starts_with("Max open files"))?;
            let mut values = line["Max open files".len()..].split_whitespace().map(|value| match value {
                "unlimited" => Some(u64::MAX),
                number => number.parse().ok(),
            });
            Some((values.next()??, values.next()??))
        });
        UserLimits { files: from_proc.unwrap_or((1024, 4096)) }
    }
}

/// What a job's helper is started with, kept until the job makes its first socket.
pub struct HelperSpec {
    pub job: u32,
    pub owner: Identity,
    pub limits: UserLimits,
    /// The job's working directory: relative Unix-socket paths start there.
    pub cwd: String,
}

/// A job's sockets: its helper, started at the first request.
pub enum JobSockets {
    Idle(HelperSpec),
    Running(Helper),
    /// The helper could not start: every request answers this errno.
    Failed(i32),
}

pub struct Helper {
    child: Child,
    control: Arc<OwnedFd>,
    relay: Option<JoinHandle<()>>,
}

impl JobSockets {
    pub fn new(spec: HelperSpec) -> JobSockets {
        JobSockets::Idle(spec)
    }

    /// Hands one `SocketRequest` (its encoded bytes) to the job's helper, starting it first if
    /// needed; `Err` is the errno to answer with (and why, for the log) when there is no helper.
    pub fn forward(&mut self, bytes: &[u8], ram: &GuestRam, sender: &Arc<Mutex<Sender>>) -> Result<(), (i32, String)> {
        if let JobSockets::Idle(spec) = self {
            match Helper::start(spec, ram, sender.clone()) {
                Ok(helper) => *self = JobSockets::Running(helper),
                Err(e) => {
                    *self = JobSockets::Failed(libc::ENOBUFS);
                    return Err((libc::ENOBUFS, format!("cannot start the job's socket helper: {e}")));
                }
            }
        }
        match self {
            JobSockets::Running(helper) => {
                sys::send(&helper.control, bytes, &[]).map_err(|e| (libc::EPIPE, format!("the job's socket helper is gone: {e}")))
            }
            JobSockets::Failed(errno) => Err((*errno, "the job's socket helper did not start".into())),
            JobSockets::Idle(_) => unreachable!("started above"),
        }
    }
}

fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: socketpair writes two descriptors into the array we own.
    if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both are fresh descriptors nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The program to run as the helper: this one when it is clowderd, else (the daemon embedded in
/// a test) the clowderd built beside it or one directory up (cargo's `deps/`).
fn helper_program() -> io::Result<std::path::PathBuf> {
    let exe = std::env::current_exe()?;
    if exe.file_name().is_some_and(|name| name == "clowderd") {
        return Ok(exe);
    }
    exe.ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join("clowderd"))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no clowderd beside {} to serve sockets", exe.display())))
}

/// The RAM layout as the helper's arguments: `gpa:size:offset,...` and `gpa:size`.
fn layout_arguments(ram: &GuestRam) -> (String, String) {
    let (_, ranges, reserved) = ram.layout();
    let ranges: Vec<String> = ranges.iter().map(|range| format!("{}:{}:{}", range.gpa, range.size, range.file_offset)).collect();
    (ranges.join(","), format!("{}:{}", reserved.0, reserved.1))
}

impl Helper {
    fn start(spec: &HelperSpec, ram: &GuestRam, sender: Arc<Mutex<Sender>>) -> io::Result<Helper> {
        let (ours, theirs) = seqpacket_pair()?;
        let memfd: File = ram.layout().0.try_clone()?;
        let (ranges, reserved) = layout_arguments(ram);
        let groups: Vec<String> = spec.owner.groups.iter().map(u32::to_string).collect();
        let mut command = Command::new(helper_program()?);
        command
            .arg(HELPER_ARGUMENT)
            .args([
                spec.job.to_string(),
                spec.owner.uid.to_string(),
                spec.owner.gid.to_string(),
                groups.join(","),
                format!("{}:{}", spec.limits.files.0, spec.limits.files.1),
                ranges,
                reserved,
            ])
            .current_dir(&spec.cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let (control_fd, memory_fd) = (theirs.as_raw_fd(), memfd.as_raw_fd());
        // SAFETY: between fork and exec only dup2 and prctl run, both async-signal-safe.
        unsafe {
            command.pre_exec(move || {
                if libc::dup2(control_fd, CONTROL_FD) < 0 || libc::dup2(memory_fd, MEMORY_FD) < 0 {
                    return Err(io::Error::last_os_error());
                }
                // The helper does not outlive the daemon.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = command.spawn()?;
        drop(theirs);
        let control = Arc::new(ours);
        let relay = {
            let control = control.clone();
            let job = spec.job;
            std::thread::Builder::new().name(format!("sockets-{job}")).spawn(move || relay(job, &control, &sender))?
        };
        Ok(Helper { child, control, relay: Some(relay) })
    }
}

/// Sends what the helper says to the enclave until the helper ends: only socket answers and
/// readiness reports of its own job.
fn relay(job: u32, control: &OwnedFd, sender: &Mutex<Sender>) {
    let mut buffer = vec![0u8; MAX_MESSAGE_LEN];
    loop {
        let length = match sys::receive(control, &mut buffer) {
            Ok((0, _)) | Err(_) => return,
            Ok((length, _)) => length,
        };
        match HostMessage::decode(&buffer[..length]) {
            Ok(message @ (HostMessage::SocketResult { job: from, .. } | HostMessage::SocketReady { job: from, .. })) if from == job => {
                if sender.lock().unwrap().send(&message).is_err() {
                    return;
                }
            }
            _ => log::warn!("job {job}'s socket helper sent something that is not a socket message of its job; ignored"),
        }
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // SAFETY: shutdown on a descriptor we own wakes the relay's receive with end of file.
        unsafe { libc::shutdown(self.control.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(relay) = self.relay.take() {
            let _ = relay.join();
        }
    }
}
