//! One job: the host's binary and input files copied out of the regions the host placed them in,
//! then run as an ordinary Linux process with the job's argv, env and working directory; its
//! stdout and stderr are read on threads of their own and its end waited for on a third.
//!
//! Where the host serves files (`host_files`), the job runs chrooted in a view of its owner's
//! host files instead, its binary still the copy (under `/run`, the guest's in that view); its
//! input files (`--file`) are copied into the guest all the same, for a kernel without FUSE.

use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, RwLock};

use enclave_proto::{LaunchJob, Stream};

use crate::host_files::{self, Forwarder, Mounted};
use crate::session::{PhysicalMemory, Waking};
use crate::Mapping;

pub struct Settings {
    /// Where each job's binary goes (`<root>/job-<id>/`), removed when the job ends.
    pub root: PathBuf,
}

/// What a job's threads tell the session.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// The process runs.
    Started {
        job: u32,
    },
    /// It could not be started: errno and reason, for `LaunchFailed`.
    Failed {
        job: u32,
        errno: i32,
        reason: String,
    },
    Output {
        job: u32,
        stream: Stream,
        data: Vec<u8>,
    },
    /// The process ended, after all its output was queued: its exit code, or
    /// `KILLED_BY_SIGNAL` + the signal that killed it (enclave-proto).
    Exited {
        job: u32,
        status: u32,
    },
}

pub struct Job {
    control: Arc<Control>,
}

impl Job {
    /// Signals the process. Before it runs the signal waits for it: a SIGKILL (the host's
    /// `KillJob`) ends the launch at its next step (no process is started), another signal is
    /// sent as soon as the process exists.
    pub fn signal(&self, signal: i32) {
        let mut state = self.control.lock();
        match state.process {
            // SAFETY: kill(2) has no memory effects; the process is not reaped yet (`Control`).
            Some(pid) => unsafe {
                libc::kill(pid, signal);
            },
            None if !state.ended && state.pending != Some(libc::SIGKILL) => state.pending = Some(signal),
            None => {}
        }
    }
}

/// What the session and the job's thread share. A signal goes to the process only while it is
/// neither reaped nor yet to be started: the thread records the process under the lock once
/// it is spawned (sending what came meanwhile), and takes it out under the lock before it
/// reaps it, so a pid the kernel has given to another process since is never signalled.
#[derive(Default)]
struct Control(Mutex<ControlState>);

#[derive(Default)]
struct ControlState {
    /// The running process, until it is reaped.
    process: Option<i32>,
    /// A signal that came before the process existed.
    pending: Option<i32>,
    ended: bool,
}

impl Control {
    fn lock(&self) -> std::sync::MutexGuard<'_, ControlState> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether the host killed the job before its process ran.
    fn killed(&self) -> bool {
        self.lock().pending == Some(libc::SIGKILL)
    }
}

/// A launch refused: errno and reason, for `LaunchFailed`.
pub type Refusal = (i32, String);

fn refuse(errno: i32, reason: impl Into<String>) -> Refusal {
    (errno, reason.into())
}

/// Where an input file named `name` goes: below `cwd` unless absolute; never through `..`.
fn input_path(cwd: &Path, name: &[u8]) -> Result<PathBuf, Refusal> {
    let name = Path::new(OsStr::from_bytes(name));
    if name.components().any(|c| c == Component::ParentDir) {
        return Err(refuse(libc::EINVAL, format!("input file name {} leaves its directory", name.display())));
    }
    Ok(cwd.join(name))
}

/// `JobExited`'s status for a job killed by `signal`.
fn killed_status(signal: i32) -> u32 {
    enclave_proto::KILLED_BY_SIGNAL + signal as u32
}

/// `JobExited`'s status: the exit code, or the signal that killed the process.
fn job_status(status: std::process::ExitStatus) -> u32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u32 & 0xff,
        (None, Some(signal)) => killed_status(signal),
        (None, None) => 255,
    }
}

/// execve refuses a binary (ETXTBSY) while any process holds it open for writing, and a child
/// forked by another thread holds copies of all our descriptors until it execs (O_CLOEXEC acts
/// only then). Jobs start on threads of their own, so one job's binary being written while
/// another job forks let the first job's launch fail now and then. Writers share this lock; a
/// spawn, fork to exec (`Command::spawn` returns once the child has exec'd), has it alone.
static FORKING: RwLock<()> = RwLock::new(());

/// Spawns `command` while no job file is open for writing (see [`FORKING`]).
fn spawn_alone(command: &mut Command) -> std::io::Result<std::process::Child> {
    let _alone = FORKING.write().unwrap_or_else(|poisoned| poisoned.into_inner());
    command.spawn()
}

/// How many times a copy whose bytes the guest kernel did not keep is made again before the
/// launch fails.
const COPY_TRIES: u32 = 3;

/// Writes `data` (the host's region itself, mapped) to a new file at `path`, checked: the copy
/// is made by [`copy_into`] and read back through a mapping of its own; one that differs is
/// made again, and after [`COPY_TRIES`] the launch fails with `EIO` rather than run something
/// else than the host's file.
fn write_file(path: &Path, data: &[u8], mode: u32) -> Result<(), Refusal> {
    write_file_with(path, data, mode, copy_into)
}

/// [`write_file`] with the copy made by `copy` (a test's stands in for a faulty kernel).
fn write_file_with(path: &Path, data: &[u8], mode: u32, copy: impl Fn(&File, &[u8]) -> std::io::Result<()>) -> Result<(), Refusal> {
    let _writing = FORKING.read().unwrap_or_else(|poisoned| poisoned.into_inner());
    let failed = |what: &str, e: std::io::Error| refuse(e.raw_os_error().unwrap_or(libc::EIO), format!("{what} {}: {e}", path.display()));
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| failed("creating the directory of", e))?;
    }
    let mut differs = 0;
    for attempt in 1..=COPY_TRIES {
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path).map_err(|e| failed("creating", e))?;
        copy(&file, data).map_err(|e| failed("writing", e))?;
        match first_difference(&file, data).map_err(|e| failed("reading back", e))? {
            None => {
                return std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|e| failed("setting the mode of", e))
            }
            Some(at) => {
                // The console, hence the enclave's log: a sign of the guest kernel's trouble.
                eprintln!("clowder-agent: the copy of {} differed from the host's at byte {at} (try {attempt})", path.display());
                differs = at;
            }
        }
    }
    Err(refuse(
        libc::EIO,
        format!("the copy of {} differed from the host's file at byte {differs} each of {COPY_TRIES} times", path.display()),
    ))
}

/// Copies `data` into `file` through a shared mapping, in user mode. Not write(2): on PVM the
/// guest kernel's copy from the user's buffer is emulated, and the emulation now and then put
/// 64 other bytes at the start of a page (seen in booted VMs, 2026-11-29: a 7 MB `--file`'s
/// first 64 bytes, python3's ELF header, hence its ENOEXEC; docs/linux-guest.md). In user mode
/// the copy runs natively; the kernel only allocates the pages.
fn copy_into(file: &File, data: &[u8]) -> std::io::Result<()> {
    file.set_len(data.len() as u64)?;
    if !data.is_empty() {
        Mapping::new(file, 0, data.len(), libc::PROT_READ | libc::PROT_WRITE, libc::MAP_POPULATE)?.fill(data);
    }
    Ok(())
}

/// Where `file`'s bytes first differ from `data` (its length included), read through a fresh
/// mapping: the guest's page cache as exec and the job will see it.
fn first_difference(file: &File, data: &[u8]) -> std::io::Result<Option<usize>> {
    let len = file.metadata()?.len();
    if len != data.len() as u64 {
        return Ok(Some(data.len().min(len as usize)));
    }
    if data.is_empty() {
        return Ok(None);
    }
    let kept = Mapping::new(file, 0, data.len(), libc::PROT_READ, libc::MAP_POPULATE)?;
    Ok(kept.bytes().iter().zip(data).position(|(kept, wanted)| kept != wanted))
}

/// Starts the job on a thread of its own, which copies its binary and input files into the
/// guest and reports [`Event::Started`] or [`Event::Failed`]. Nothing slow happens on the
/// session's thread: copying a large binary (python3's 6 MiB) is seconds of emulated kernel
/// work on a loaded PVM host, during which Pings went unanswered; and a job with host files
/// must mount them first, whose first lookups go through the session.
pub fn start(
    launch: &LaunchJob<'_>,
    memory: Arc<dyn PhysicalMemory + Send + Sync>,
    settings: &Settings,
    events: Waking<Event>,
    host_files: Option<Forwarder>,
) -> Result<Job, Refusal> {
    let job = launch.job;
    let argv: Vec<Vec<u8>> = launch.argv.iter().map(<[u8]>::to_vec).collect();
    if argv.is_empty() {
        return Err(refuse(libc::EINVAL, "the job has no argv[0]"));
    }
    let cwd = PathBuf::from(OsStr::from_bytes(launch.cwd));
    let directory = settings.root.join(format!("job-{job}"));
    let base = Path::new(OsStr::from_bytes(launch.binary.name)).file_name().unwrap_or(OsStr::new("program")).to_owned();
    let binary = directory.join(base);
    let mut copies = vec![Placed { path: binary.clone(), gpa: launch.binary.gpa, len: launch.binary.len, mode: 0o755 }];
    for file in launch.files.iter() {
        copies.push(Placed { path: input_path(&cwd, file.name)?, gpa: file.gpa, len: file.len, mode: 0o644 });
    }
    let env: Vec<(Vec<u8>, Vec<u8>)> = launch
        .env
        .iter()
        .filter_map(|pair| {
            let split = pair.iter().position(|&b| b == b'=')?;
            Some((pair[..split].to_vec(), pair[split + 1..].to_vec()))
        })
        .collect();
    let control = Arc::new(Control::default());
    let process = Process { job, argv, env, cwd, binary, directory, control: control.clone() };
    std::thread::spawn(move || match process.place(&*memory, &copies) {
        Ok(()) => process.run(host_files, events),
        Err(Stop::Refused(refusal)) => process.failed(&events, refusal),
        Err(Stop::Killed) => process.killed_before_it_ran(&events),
    });
    Ok(Job { control })
}

/// Why a launch went no further.
enum Stop {
    Refused(Refusal),
    /// The host killed the job first.
    Killed,
}

impl From<Refusal> for Stop {
    fn from(refusal: Refusal) -> Stop {
        Stop::Refused(refusal)
    }
}

/// A file the host placed in guest memory, and where it goes in the guest.
struct Placed {
    path: PathBuf,
    gpa: u64,
    len: u64,
    mode: u32,
}

/// What the job's thread needs to run it.
struct Process {
    job: u32,
    argv: Vec<Vec<u8>>,
    env: Vec<(Vec<u8>, Vec<u8>)>,
    cwd: PathBuf,
    binary: PathBuf,
    directory: PathBuf,
    control: Arc<Control>,
}

impl Process {
    /// The working directory (also with host files: the job falls back to the guest's own
    /// files if they cannot be mounted), the binary and the input files.
    /// Stops at a kill from the host before each file.
    fn place(&self, memory: &dyn PhysicalMemory, copies: &[Placed]) -> Result<(), Stop> {
        std::fs::create_dir_all(&self.cwd).map_err(|e| {
            refuse(e.raw_os_error().unwrap_or(libc::EIO), format!("creating the working directory {}: {e}", self.cwd.display()))
        })?;
        for copy in copies {
            if self.control.killed() {
                return Err(Stop::Killed);
            }
            let mut written = Ok(());
            memory
                .with_bytes(copy.gpa, copy.len, &mut |data| written = write_file(&copy.path, data, copy.mode))
                .map_err(|e| refuse(libc::EFAULT, e))?;
            written?;
        }
        Ok(())
    }

    fn command(&self, root: Option<&Path>) -> Result<Command, Refusal> {
        let mut command = Command::new(&self.binary);
        command
            .arg0(OsStr::from_bytes(&self.argv[0]))
            .args(self.argv[1..].iter().map(|a| OsStr::from_bytes(a)))
            .env_clear()
            .envs(self.env.iter().map(|(name, value)| (OsStr::from_bytes(name), OsStr::from_bytes(value))))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let Some(root) = root else {
            command.current_dir(&self.cwd);
            return Ok(command);
        };
        let c =
            |path: &Path| std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| refuse(libc::EINVAL, "a path with a NUL byte"));
        let (root, cwd) = (c(root)?, c(&self.cwd)?);
        // SAFETY: the closure runs in the forked child before exec and calls only chroot(2) and
        // chdir(2), which are async-signal-safe, on strings made before the fork.
        unsafe {
            command.pre_exec(move || {
                if libc::chroot(root.as_ptr()) != 0 || libc::chdir(cwd.as_ptr()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Ok(command)
    }

    /// Removes the binary and the (empty, unmounted) directories; never recursively, so a
    /// mount left behind is not emptied.
    fn clean_up(&self) {
        let _ = std::fs::remove_file(&self.binary);
        let _ = std::fs::remove_dir(self.directory.join("root"));
        let _ = std::fs::remove_dir(&self.directory);
    }

    fn failed(&self, events: &Waking<Event>, (errno, reason): Refusal) {
        self.ended();
        self.clean_up();
        let _ = events.send(Event::Failed { job: self.job, errno, reason });
    }

    /// Killed by the host before its process ran: it ends as a killed process would.
    fn killed_before_it_ran(&self, events: &Waking<Event>) {
        self.ended();
        self.clean_up();
        eprintln!("clowder-agent: job {} was killed before its process started", self.job);
        let _ = events.send(Event::Exited { job: self.job, status: killed_status(libc::SIGKILL) });
    }

    /// No process of this job is to be signalled any more.
    fn ended(&self) {
        let mut state = self.control.lock();
        state.process = None;
        state.ended = true;
    }

    /// Records the spawned process, sending it a signal that came while it was being started.
    fn running(&self, pid: i32) {
        let mut state = self.control.lock();
        state.process = Some(pid);
        if let Some(signal) = state.pending.take() {
            // SAFETY: kill(2) has no memory effects; the child is not reaped yet.
            unsafe { libc::kill(pid, signal) };
        }
    }

    /// Waits for the child to end and reaps it, out of [`Control`] first (see there).
    fn wait(&self, child: &mut std::process::Child) -> u32 {
        let pid = child.id() as libc::id_t;
        loop {
            // SAFETY: a zeroed siginfo_t is valid; waitid writes into it. WNOWAIT leaves the
            // child to be reaped below.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            let waited = unsafe { libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::WNOWAIT) };
            if waited == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                break;
            }
        }
        self.ended();
        child.wait().map_or(255, job_status)
    }

    fn run(self, host_files: Option<Forwarder>, events: Waking<Event>) {
        let job = self.job;
        // A kernel without FUSE still runs the job, in the guest's own files (static programs
        // and their input files work there); the console, hence the enclave's log, says why.
        let started = std::time::Instant::now();
        let mounted: Option<Mounted> = host_files.and_then(|forwarder| {
            host_files::mount_host_tree(job, &self.directory.join("root"), forwarder)
                .map_err(|e| eprintln!("clowder-agent: job {job} runs without the host's files: {e}"))
                .ok()
        });
        if mounted.is_some() {
            eprintln!("clowder-agent: job {job}: the host's files mounted in {} ms", started.elapsed().as_millis());
        }
        if self.control.killed() {
            drop(mounted);
            return self.killed_before_it_ran(&events);
        }
        let spawned = self.command(mounted.as_ref().map(|m| m.root.as_path())).and_then(|mut command| {
            spawn_alone(&mut command).map_err(|e| {
                let name = String::from_utf8_lossy(&self.argv[0]);
                refuse(e.raw_os_error().unwrap_or(libc::EIO), format!("{name}: {e}"))
            })
        });
        let mut child = match spawned {
            Ok(child) => child,
            Err(refusal) => {
                drop(mounted);
                return self.failed(&events, refusal);
            }
        };
        self.running(child.id() as i32);
        let _ = events.send(Event::Started { job });
        let readers = [
            (Stream::Stdout, Box::new(child.stdout.take().expect("piped")) as Box<dyn Read + Send>),
            (Stream::Stderr, Box::new(child.stderr.take().expect("piped"))),
        ]
        .map(|(stream, mut source)| {
            let events = events.clone();
            std::thread::spawn(move || {
                let mut buffer = vec![0u8; 64 << 10];
                while let Ok(n) = source.read(&mut buffer) {
                    if n == 0 || events.send(Event::Output { job, stream, data: buffer[..n].to_vec() }).is_err() {
                        break;
                    }
                }
            })
        });
        let status = self.wait(&mut child);
        for reader in readers {
            let _ = reader.join();
        }
        drop(mounted);
        self.clean_up();
        let _ = events.send(Event::Exited { job, status });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_files_stay_below_the_working_directory_unless_absolute() {
        let cwd = Path::new("/home/u/run");
        assert_eq!(input_path(cwd, b"in.dat").unwrap(), Path::new("/home/u/run/in.dat"));
        assert_eq!(input_path(cwd, b"sub/in.dat").unwrap(), Path::new("/home/u/run/sub/in.dat"));
        assert_eq!(input_path(cwd, b"/data/in.dat").unwrap(), Path::new("/data/in.dat"));
        assert_eq!(input_path(cwd, b"../x").unwrap_err().0, libc::EINVAL);
        assert_eq!(input_path(cwd, b"a/../../x").unwrap_err().0, libc::EINVAL);
    }

    /// A file of `len` bytes unlike any shift of itself (each 8-byte word holds its index).
    fn pattern(len: usize) -> Vec<u8> {
        (0..len.div_ceil(8) as u64).flat_map(|i| (0xc10d_0000_0000_0000 | i).to_le_bytes()).take(len).collect()
    }

    /// What the guest kernel did on PVM now and then (docs/linux-guest.md): the copy's first
    /// 64 bytes replaced by others.
    fn copy_with_its_first_line_replaced(file: &File, data: &[u8]) -> std::io::Result<()> {
        let mut wrong = data.to_vec();
        wrong[..64].copy_from_slice(&0x6761_0000_002b_8007u64.to_le_bytes().repeat(8));
        copy_into(file, &wrong)
    }

    #[test]
    fn a_placed_file_is_the_hosts_byte_for_byte() {
        let directory = std::env::temp_dir().join(format!("clowder-agent-copy-{}", std::process::id()));
        for len in [0, 1, 4095, 4096, 7 << 20 | 123] {
            let (path, data) = (directory.join(format!("f{len}")), pattern(len));
            write_file(&path, &data, 0o640).unwrap();
            assert!(std::fs::read(&path).unwrap() == data, "{len} bytes");
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o640);
        }
        let _ = std::fs::remove_dir_all(&directory);
    }

    /// A copy the guest kernel did not keep as written is made again; the job never gets it.
    #[test]
    fn a_copy_that_came_out_wrong_is_made_again() {
        let path = std::env::temp_dir().join(format!("clowder-agent-recopy-{}/python3", std::process::id()));
        let data = pattern(3 << 20);
        let tries = std::cell::Cell::new(0);
        let flaky = |file: &File, data: &[u8]| {
            tries.set(tries.get() + 1);
            if tries.get() == 1 {
                copy_with_its_first_line_replaced(file, data)
            } else {
                copy_into(file, data)
            }
        };
        write_file_with(&path, &data, 0o755, flaky).unwrap();
        assert_eq!(tries.get(), 2);
        assert!(std::fs::read(&path).unwrap() == data, "the second copy is the one kept");
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    /// One that keeps coming out wrong fails the launch, naming the file and the byte.
    #[test]
    fn a_copy_that_stays_wrong_fails_the_launch() {
        let path = std::env::temp_dir().join(format!("clowder-agent-badcopy-{}/in.dat", std::process::id()));
        let (errno, reason) = write_file_with(&path, &pattern(8192), 0o644, copy_with_its_first_line_replaced).unwrap_err();
        assert_eq!(errno, libc::EIO);
        assert!(reason.contains("in.dat differed from the host's file at byte 0 each of 3 times"), "{reason}");
        let short = write_file_with(&path, &pattern(8192), 0o644, |file, data| copy_into(file, &data[..100])).unwrap_err();
        assert!(short.1.contains("at byte 100"), "{}", short.1);
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    /// Threads that each write a binary and run it, as concurrent launches do, never meet
    /// ETXTBSY (they did before writes and spawns were kept apart).
    #[test]
    fn binaries_written_while_others_spawn_run() {
        let program = std::fs::read("/bin/true").unwrap();
        let directory = std::env::temp_dir().join(format!("clowder-agent-txtbsy-{}", std::process::id()));
        let threads: Vec<_> = (0..6)
            .map(|thread| {
                let (program, directory) = (program.clone(), directory.clone());
                std::thread::spawn(move || {
                    for round in 0..40 {
                        let binary = directory.join(format!("true-{thread}-{round}"));
                        write_file(&binary, &program, 0o755).unwrap();
                        let status = spawn_alone(&mut Command::new(&binary)).and_then(|mut child| child.wait());
                        assert!(status.as_ref().is_ok_and(|s| s.success()), "round {round} of thread {thread}: {status:?}");
                        std::fs::remove_file(&binary).unwrap();
                    }
                })
            })
            .collect();
        let results: Vec<_> = threads.into_iter().map(|t| t.join()).collect();
        let _ = std::fs::remove_dir_all(&directory);
        assert!(results.iter().all(Result::is_ok), "a launch failed (see above)");
    }
}
