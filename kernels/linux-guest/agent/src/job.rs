//! One job: the host's binary and input files copied out of the regions the host placed them in,
//! then run as an ordinary Linux process with the job's argv, env and working directory; its
//! stdout and stderr are read on threads of their own and its end waited for on a third.

use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::Sender;

use enclave_proto::{LaunchJob, Stream};

use crate::session::PhysicalMemory;

pub struct Settings {
    /// Where each job's binary goes (`<root>/job-<id>/`), removed when the job ends.
    pub root: PathBuf,
}

/// What a job's threads tell the session.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    Output {
        job: u32,
        stream: Stream,
        data: Vec<u8>,
    },
    /// The process ended, after all its output was queued: status as a shell shows it.
    Exited {
        job: u32,
        status: u32,
    },
}

pub struct Job {
    pid: i32,
}

impl Job {
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) has no memory effects; a process that already ended gives ESRCH.
        unsafe { libc::kill(self.pid, signal) };
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

/// Status as a shell shows it: the exit code, or 128 + the signal that killed it.
fn shell_status(status: std::process::ExitStatus) -> u32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u32 & 0xff,
        (None, Some(signal)) => 128 + signal as u32,
        (None, None) => 255,
    }
}

fn write_file(path: &Path, data: &[u8], mode: u32) -> Result<(), Refusal> {
    let failed = |what: &str, e: std::io::Error| refuse(e.raw_os_error().unwrap_or(libc::EIO), format!("{what} {}: {e}", path.display()));
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| failed("creating the directory of", e))?;
    }
    std::fs::write(path, data).map_err(|e| failed("writing", e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|e| failed("setting the mode of", e))
}

pub fn start(launch: &LaunchJob<'_>, memory: &dyn PhysicalMemory, settings: &Settings, events: Sender<Event>) -> Result<Job, Refusal> {
    let job = launch.job;
    let argv: Vec<&[u8]> = launch.argv.iter().collect();
    let Some(program) = argv.first() else {
        return Err(refuse(libc::EINVAL, "the job has no argv[0]"));
    };
    let cwd = PathBuf::from(OsStr::from_bytes(launch.cwd));
    std::fs::create_dir_all(&cwd)
        .map_err(|e| refuse(e.raw_os_error().unwrap_or(libc::EIO), format!("creating the working directory {}: {e}", cwd.display())))?;
    for file in launch.files.iter() {
        let data = memory.read(file.gpa, file.len).map_err(|e| refuse(libc::EFAULT, e))?;
        write_file(&input_path(&cwd, file.name)?, &data, 0o644)?;
    }
    let directory = settings.root.join(format!("job-{job}"));
    let base = Path::new(OsStr::from_bytes(launch.binary.name)).file_name().unwrap_or(OsStr::new("program")).to_owned();
    let binary = directory.join(base);
    let image = memory.read(launch.binary.gpa, launch.binary.len).map_err(|e| refuse(libc::EFAULT, e))?;
    write_file(&binary, &image, 0o755)?;
    drop(image);

    let mut child = Command::new(&binary)
        .arg0(OsStr::from_bytes(program))
        .args(argv[1..].iter().map(|a| OsStr::from_bytes(a)))
        .env_clear()
        .envs(launch.env.iter().filter_map(|pair| {
            let split = pair.iter().position(|&b| b == b'=')?;
            Some((OsStr::from_bytes(&pair[..split]), OsStr::from_bytes(&pair[split + 1..])))
        }))
        .current_dir(&cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            let _ = std::fs::remove_dir_all(&directory);
            let name = String::from_utf8_lossy(program);
            refuse(e.raw_os_error().unwrap_or(libc::EIO), format!("{name}: {e}"))
        })?;
    let pid = child.id() as i32;
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
    std::thread::spawn(move || {
        let status = child.wait().map(shell_status).unwrap_or(255);
        for reader in readers {
            let _ = reader.join();
        }
        let _ = std::fs::remove_dir_all(&directory);
        let _ = events.send(Event::Exited { job, status });
    });
    Ok(Job { pid })
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
}
