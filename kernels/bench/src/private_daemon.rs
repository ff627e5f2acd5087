//! A clowderd of this run's own, on a socket in a scratch directory, for the rows that need a
//! persistent enclave (forwarded file calls, start-up through `clowder run`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// The daemon; stopped when dropped.
pub struct Daemon {
    child: Child,
    socket: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: kill has no memory effects; the pid is our own child's.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

impl Daemon {
    /// Starts the repository's clowderd with `vmm` and `lwk` (isolating enclave cores), its
    /// socket and log in `scratch`, and waits for the socket.
    pub fn start(repo: &Path, scratch: &Path, vmm: &Path, lwk: &Path) -> Result<Daemon, String> {
        Daemon::start_serving_file_slots(repo, scratch, vmm, lwk, true, true)
    }

    /// `start`, with the kernels' file-call slots served or not (`CLOWDER_FILE_SLOTS=off`: every
    /// forwarded call takes the channel), and the jobs' ring-3 file calls served or not
    /// (`CLOWDER_RING3_FILES=off`: each takes the kernel path).
    pub fn start_serving_file_slots(
        repo: &Path,
        scratch: &Path,
        vmm: &Path,
        lwk: &Path,
        file_slots: bool,
        ring3: bool,
    ) -> Result<Daemon, String> {
        let socket = scratch.join("clowderd.sock");
        let child = Command::new(repo.join("target/release/clowderd"))
            .env("CLOWDER_FILE_SLOTS", if file_slots { "on" } else { "off" })
            .env("CLOWDER_RING3_FILES", if ring3 { "on" } else { "off" })
            .arg("--socket")
            .arg(&socket)
            .arg("--vmm")
            .arg(vmm)
            .arg("--kernel")
            .arg(lwk)
            .arg("--isolate-cores")
            .stderr(std::fs::File::create(scratch.join("clowderd.log")).map_err(|e| e.to_string())?)
            .spawn()
            .map_err(|e| format!("starting clowderd: {e}"))?;
        let daemon = Daemon { child, socket };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !daemon.socket.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(daemon)
    }

    /// A `clowder` command talking to this daemon.
    pub fn clowder(&self, repo: &Path) -> Command {
        let mut command = Command::new(repo.join("target/release/clowder"));
        command.env("CLOWDER_SOCKET", &self.socket);
        command
    }

    /// Creates the persistent enclave `name` of `mem` (`512M`) on `core`.
    pub fn create_enclave(&self, repo: &Path, name: &str, mem: &str, core: usize) -> Result<(), String> {
        let created =
            self.clowder(repo).args(["enclave", "create", "--name", name, "--mem", mem, "--core-list"]).arg(core.to_string()).output();
        match created {
            Ok(out) if out.status.success() => Ok(()),
            Ok(out) => Err(format!("creating the enclave: {}", String::from_utf8_lossy(&out.stderr).trim())),
            Err(e) => Err(format!("running clowder: {e}")),
        }
    }
}
