//! Linux virtual machines as enclaves (`clowder enclave create --kind linux`).
//!
//! The machine is a `clowder-vmm` booting a Linux kernel (by default the small one
//! `scripts/linux-kernel.sh` builds) with an initramfs whose `/init` is the enclave agent
//! (`kernels/linux-guest/agent`). The agent speaks the same enclave protocol as the LWK over
//! the same channel, from user space, so everything after the boot - `Hello`, pings, jobs,
//! their files, output and exit, the failure handling - is the LWK enclave's own code
//! (`enclave.rs`). What differs is only how the machine starts and how long its boot may take.
//! On PVM the VMM adds what the kernel must not use there (`vmm::arch::cpuid::LINUX_ON_PVM`).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::console::LogBook;
use crate::machine::{start_vmm_reporting, vmm_command, Launcher, Machine, MachineSpec, Populated, VmmLauncher};

/// How long a Linux kernel may take from the VMM's start to the agent's `Hello`: the whole
/// boot is emulated kernel code on PVM (docs/linux-guest.md has the measured times).
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(900);

/// The kernel command line (the VMM appends its `clowder.*` words). `panic=-1`: a panicking
/// guest resets at once, which ends the VMM and so the enclave; `quiet`: every console byte is
/// an exit.
const COMMAND_LINE: &str = "console=ttyS0 panic=-1 quiet";

/// Where the daemon finds its default guest when `create` names none.
pub const KERNEL_VARIABLE: &str = "CLOWDER_LINUX_KERNEL";
pub const INITRD_VARIABLE: &str = "CLOWDER_LINUX_INITRD";

/// What a `create --kind linux` asked for: host paths, or the daemon's defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinuxRequest {
    pub kernel: Option<String>,
    pub initrd: Option<String>,
}

/// The kernel and initramfs, opened as the daemon and checked readable by the requesting user.
/// The VMM reads them through this process's descriptors (`/proc/PID/fd/N`), so what was
/// checked is what boots even if the paths change meanwhile.
pub struct LinuxGuest {
    kernel: File,
    initrd: File,
}

impl LinuxGuest {
    /// Opens the guest for user `uid` (root may name any file; another user only files they
    /// own and may read, or that everyone may read).
    pub fn open(request: &LinuxRequest, uid: u32) -> Result<LinuxGuest, String> {
        let pick = |given: &Option<String>, variable: &str, what: &str| -> Result<PathBuf, String> {
            given.clone().or_else(|| std::env::var(variable).ok()).map(PathBuf::from).ok_or_else(|| {
                format!("no Linux {what}: pass --{what} FILE (scripts/linux-kernel.sh builds both), or start clowderd with {variable} set")
            })
        };
        let kernel = open_readable(&pick(&request.kernel, KERNEL_VARIABLE, "kernel")?, uid)?;
        let initrd = open_readable(&pick(&request.initrd, INITRD_VARIABLE, "initrd")?, uid)?;
        Ok(LinuxGuest { kernel, initrd })
    }
}

fn open_readable(path: &Path, uid: u32) -> Result<File, String> {
    let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let metadata = file.metadata().map_err(|e| format!("{}: {e}", path.display()))?;
    if !metadata.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    if !may_read(uid, metadata.uid(), metadata.mode()) {
        return Err(format!("{} is not readable by uid {uid}", path.display()));
    }
    Ok(file)
}

/// Whether `uid` may read a file of `owner` with `mode`, judged without groups (a file shared
/// with a group only is refused: the daemon does not take on the user's groups here).
fn may_read(uid: u32, owner: u32, mode: u32) -> bool {
    uid == 0 || (uid == owner && mode & 0o400 != 0) || mode & 0o004 != 0
}

fn descriptor_path(file: &File) -> String {
    format!("/proc/{}/fd/{}", std::process::id(), file.as_raw_fd())
}

/// The `clowder-vmm` command line of a Linux enclave.
pub fn linux_command(vmm: &Path, guest: &LinuxGuest, spec: &MachineSpec) -> std::process::Command {
    let mut command = vmm_command(vmm, Path::new(&descriptor_path(&guest.kernel)), spec);
    command.arg("--module").arg(descriptor_path(&guest.initrd)).arg("--cmdline").arg(COMMAND_LINE);
    command
}

/// [`Launcher::launch_linux`] for `clowder-vmm`.
pub fn launch_vmm(
    launcher: &VmmLauncher,
    spec: &MachineSpec,
    guest: &LinuxGuest,
    log: Arc<LogBook>,
    progress: &mut dyn FnMut(Populated),
) -> Result<Box<dyn Machine>, String> {
    let control_path = launcher.runtime_dir.join(format!("{}.vmm.sock", spec.name));
    log.push(format!("clowderd: starting clowder-vmm for Linux enclave {}", spec.name));
    start_vmm_reporting(with_xemem_device(linux_command(&launcher.vmm, guest, spec), launcher, spec), control_path, log, progress)
}

/// Where a Linux enclave's VMM serves its XEMEM PCI device (docs/xemem-pci.md) for the daemon
/// to connect to, beside its control socket.
pub fn xemem_sockets(runtime_dir: &Path, name: &str) -> crate::xemem::vm::VmSockets {
    crate::xemem::vm::VmSockets {
        mailbox: runtime_dir.join(format!("{name}.xemem-pci.sock")),
        control: runtime_dir.join(format!("{name}.vmm.sock")),
    }
}

/// The VMM gives the guest the XEMEM PCI device, its mailbox served by this daemon.
fn with_xemem_device(mut command: std::process::Command, launcher: &VmmLauncher, spec: &MachineSpec) -> std::process::Command {
    command.env("CLOWDER_VMM_XEMEM_PCI", xemem_sockets(&launcher.runtime_dir, &spec.name).mailbox);
    command
}

/// The daemon's launcher, made to start Linux machines: what `Enclave::start` is given for a
/// `linux` enclave.
pub struct LinuxLauncher<'a> {
    pub inner: &'a dyn Launcher,
    pub guest: LinuxGuest,
}

impl Launcher for LinuxLauncher<'_> {
    fn launch(&self, spec: &MachineSpec, log: Arc<LogBook>, progress: &mut dyn FnMut(Populated)) -> Result<Box<dyn Machine>, String> {
        self.inner.launch_linux(spec, &self.guest, log, progress)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_files_the_user_may_read_boot() {
        assert!(may_read(0, 1000, 0o000), "root reads anything");
        assert!(may_read(1000, 1000, 0o400));
        assert!(!may_read(1000, 1000, 0o040), "the owner's own bits decide for the owner");
        assert!(may_read(1001, 0, 0o644));
        assert!(!may_read(1001, 0, 0o640), "a group-only file is refused");
        assert!(!may_read(1001, 0, 0o600));
    }

    #[test]
    fn the_guest_is_named_by_request_or_variable_and_checked() {
        let dir = std::env::temp_dir().join(format!("clowder-linux-enclave-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let kernel = dir.join("vmlinux");
        std::fs::write(&kernel, b"kernel").unwrap();
        let missing = LinuxRequest { kernel: Some(kernel.display().to_string()), initrd: Some(dir.join("absent").display().to_string()) };
        let error = LinuxGuest::open(&missing, 0).err().unwrap();
        assert!(error.contains("absent"), "{error}");
        let directory = LinuxRequest { kernel: Some(dir.display().to_string()), initrd: Some(kernel.display().to_string()) };
        assert!(LinuxGuest::open(&directory, 0).err().unwrap().contains("not a regular file"));
        std::fs::set_permissions(&kernel, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let private = LinuxRequest { kernel: Some(kernel.display().to_string()), initrd: Some(kernel.display().to_string()) };
        assert!(LinuxGuest::open(&private, 4242).err().unwrap().contains("not readable by uid 4242"));
        let guest = LinuxGuest::open(&private, 0).unwrap();
        let spec = MachineSpec { name: "vm".into(), cores: vec![1], memory: 256 << 20, hugepages: false };
        let command = linux_command(Path::new("clowder-vmm"), &guest, &spec);
        let args: Vec<String> = command.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert!(args.windows(2).any(|w| w[0] == "--module" && w[1].starts_with("/proc/")), "{args:?}");
        assert!(args.windows(2).any(|w| w[0] == "--cmdline" && w[1] == COMMAND_LINE), "{args:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
