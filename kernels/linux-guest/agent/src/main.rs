//! clowder's Linux enclave agent: the `/init` of the small Linux guest's initramfs. It mounts
//! the file systems a job expects, maps the enclave channel through `/dev/mem` at the
//! guest-physical address the VMM put on the kernel command line (`clowder.channel=<gpa>,<size>`,
//! docs/guest-abi.md), says `Hello`, and then serves the daemon as the LWK does, from ring 3:
//! no guest kernel module, no kernel code of ours beyond what the kernel already has.
//!
//! The job's binary and input files arrive as regions the host added above guest RAM; the agent
//! reads them through `/dev/mem` too (the kernel is built without STRICT_DEVMEM).

mod host_files;
mod job;
mod session;
mod xemem_board;
mod xemem_keeper;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::Duration;

use clowder_channel::Channel;
use session::{FileWindow, Next, PhysicalMemory, Session};

/// How long the agent waits for the host between rounds: short after a busy round or while a
/// file call is with the host (it answers within its poll period), doubling up to the most
/// while nothing happens. Each wake-up costs tens of microseconds of emulated kernel code on
/// PVM; at a fixed 2 ms the idle loop alone took most of what a loaded host gave the guest.
/// Jobs' events and file calls wake the loop at once (`session::Waking`).
const WAIT_MIN: Duration = Duration::from_millis(1);
const WAIT_FILE_CALL: Duration = Duration::from_millis(2);
const WAIT_MAX: Duration = Duration::from_millis(50);
/// A gap between two rounds worth telling the host about.
const SLOW_ROUND: Duration = Duration::from_secs(5);

/// `<key><gpa>,<size>` from the kernel command line (both hex, `0x` optional).
fn location(cmdline: &str, key: &str) -> Option<(u64, u64)> {
    let value = cmdline.split_whitespace().find_map(|word| word.strip_prefix(key))?;
    let (gpa, size) = value.split_once(',')?;
    let hex = |text: &str| u64::from_str_radix(text.trim_start_matches("0x"), 16).ok();
    Some((hex(gpa)?, hex(size)?))
}

/// `clowder.channel=<gpa>,<size>`.
fn channel_location(cmdline: &str) -> Option<(u64, usize)> {
    let (gpa, size) = location(cmdline, "clowder.channel=")?;
    Some((gpa, usize::try_from(size).ok()?))
}

/// `clowder.files=<gpa>,<size>`: the file window, page aligned and at least a page.
fn file_window(cmdline: &str) -> Option<FileWindow> {
    let (gpa, size) = location(cmdline, "clowder.files=")?;
    let size = u32::try_from(size).ok().filter(|&size| size >= 4096 && size % 4096 == 0)?;
    (gpa % 4096 == 0).then_some(FileWindow { gpa, size })
}

/// Guest-physical memory through `/dev/mem`.
struct DevMem {
    file: File,
    /// The file window, mapped once: every forwarded read is copied out of it, and a fresh
    /// mapping per call (its page faults, the munmap) is emulated kernel work on PVM.
    window: Option<(u64, Mapping)>,
}

/// A shared mapping of a file (`/dev/mem`, or a job's copy of a file), unmapped on drop.
pub(crate) struct Mapping {
    base: *mut u8,
    length: usize,
}

impl Mapping {
    /// Maps `length` bytes of `file` from the page-aligned `offset`, shared, with `prot` and
    /// `flags` (beside `MAP_SHARED`).
    pub(crate) fn new(file: &File, offset: u64, length: usize, prot: libc::c_int, flags: libc::c_int) -> std::io::Result<Mapping> {
        // SAFETY: a fresh shared mapping of the file; the kernel checks the range and the result
        // is checked below.
        let base =
            unsafe { libc::mmap(std::ptr::null_mut(), length, prot, libc::MAP_SHARED | flags, file.as_raw_fd(), offset as libc::off_t) };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping { base: base.cast(), length })
    }

    /// The mapped bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is `length` bytes long, readable, and lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.base, self.length) }
    }

    /// Copies `data` to the start of a writable mapping, in user mode.
    pub(crate) fn fill(&mut self, data: &[u8]) {
        assert!(data.len() <= self.length, "{} bytes into a {}-byte mapping", data.len(), self.length);
        // SAFETY: the mapping is writable (the caller mapped it so), at least `data.len()` bytes
        // long (checked above), owned by `self` and borrowed mutably here.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.base, data.len()) };
    }
}

impl DevMem {
    fn open() -> Result<DevMem, String> {
        let file = std::fs::OpenOptions::new().read(true).write(true).open("/dev/mem").map_err(|e| format!("opening /dev/mem: {e}"))?;
        Ok(DevMem { file, window: None })
    }

    /// Maps `window` for good, its pages faulted in now (`MAP_POPULATE`).
    fn keep_mapped(&mut self, window: FileWindow) -> Result<(), String> {
        let (mapping, _) = self.map_with(window.gpa, window.size as usize, libc::MAP_POPULATE)?;
        self.window = Some((window.gpa, mapping));
        Ok(())
    }

    /// Maps `[gpa, gpa + len)`, widened to whole pages; returns the mapping and the offset of
    /// `gpa` in it.
    fn map(&self, gpa: u64, len: usize) -> Result<(Mapping, usize), String> {
        self.map_with(gpa, len, 0)
    }

    fn map_with(&self, gpa: u64, len: usize, flags: libc::c_int) -> Result<(Mapping, usize), String> {
        let start = gpa & !0xfff;
        let offset = (gpa - start) as usize;
        let length = (offset + len).div_ceil(4096) * 4096;
        let mapping = Mapping::new(&self.file, start, length, libc::PROT_READ | libc::PROT_WRITE, flags)
            .map_err(|e| format!("mapping guest-physical {gpa:#x}+{len:#x} from /dev/mem: {e}"))?;
        Ok((mapping, offset))
    }
}

// SAFETY: a mapping is copied out of (and the file window also into, by the session's thread
// alone) after it is made, and unmapped once, on drop; the window's bytes are written by the
// host or the session between calls, never while one is being copied (one file call is with
// the host at a time).
unsafe impl Send for Mapping {}
// SAFETY: as above: shared references only copy bytes out of a mapping, or into the window.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `DevMem::map` with this base and length.
        unsafe { libc::munmap(self.base.cast(), self.length) };
    }
}

impl PhysicalMemory for DevMem {
    fn read(&self, gpa: u64, len: u64) -> Result<Vec<u8>, String> {
        let len = usize::try_from(len).map_err(|_| format!("a {len}-byte file does not fit this guest"))?;
        if let Some((base, window)) = &self.window {
            if gpa >= *base && gpa - base + len as u64 <= window.length as u64 {
                // SAFETY: the window's mapping covers `gpa - base .. + len` (checked above) and
                // lives as long as `self`.
                return Ok(unsafe { std::slice::from_raw_parts(window.base.add((gpa - base) as usize), len) }.to_vec());
            }
        }
        let (mapping, offset) = self.map(gpa, len)?;
        // Copied in user mode: on PVM a copy by the kernel (read(2) of /dev/mem) is emulated.
        // SAFETY: the mapping covers `offset..offset + len` and lives until the end of this scope.
        Ok(unsafe { std::slice::from_raw_parts(mapping.base.add(offset), len) }.to_vec())
    }

    fn with_bytes(&self, gpa: u64, len: u64, with: &mut dyn FnMut(&[u8])) -> Result<(), String> {
        let len = usize::try_from(len).map_err(|_| format!("a {len}-byte file does not fit this guest"))?;
        if len == 0 {
            with(&[]);
            return Ok(());
        }
        let (mapping, offset) = self.map(gpa, len)?;
        with(&mapping.bytes()[offset..offset + len]);
        Ok(())
    }

    /// Only the file window is written (what a job writes to a host file, on its way).
    fn write(&self, gpa: u64, data: &[u8]) -> Result<(), String> {
        match &self.window {
            Some((base, window)) if gpa >= *base && gpa - base + data.len() as u64 <= window.length as u64 => {
                // SAFETY: the window's mapping covers the range (checked above), is writable and
                // lives as long as `self`; the host reads it only after the call is sent.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), window.base.add((gpa - base) as usize), data.len()) };
                Ok(())
            }
            _ => Err(format!("{gpa:#x}+{:#x} is outside the file window", data.len())),
        }
    }
}

/// As process 1: the file systems jobs and the agent need.
fn mount_file_systems() {
    for (source, target, kind) in [
        ("proc", "/proc", "proc"),
        ("sysfs", "/sys", "sysfs"),
        ("devtmpfs", "/dev", "devtmpfs"),
        ("tmpfs", "/tmp", "tmpfs"),
        ("tmpfs", "/run", "tmpfs"),
    ] {
        let _ = std::fs::create_dir_all(target);
        let c = |s: &str| std::ffi::CString::new(s).expect("no NUL");
        let (source_c, target_c, kind_c) = (c(source), c(target), c(kind));
        // SAFETY: plain mount(2) with NUL-terminated strings that outlive the call.
        if unsafe { libc::mount(source_c.as_ptr(), target_c.as_ptr(), kind_c.as_ptr(), 0, std::ptr::null()) } != 0 {
            eprintln!("clowder-agent: mounting {kind} on {target}: {}", std::io::Error::last_os_error());
        }
    }
}

fn run() -> Result<(), String> {
    if std::process::id() == 1 {
        mount_file_systems();
    }
    let cmdline = std::fs::read_to_string("/proc/cmdline").map_err(|e| format!("reading /proc/cmdline: {e}"))?;
    let (gpa, size) = channel_location(&cmdline).ok_or("no clowder.channel=<gpa>,<size> on the kernel command line")?;
    let mut memory = DevMem::open()?;
    let (mapping, _) = memory.map(gpa, size)?;
    // SAFETY: the mapping is page aligned, `size` bytes long and kept for the whole session
    // (`mapping` lives until this function returns); the host accesses it only atomically.
    let channel = unsafe { Channel::attach(mapping.base, size) }.map_err(|e| format!("the channel at {gpa:#x}: {e:?}"))?;
    let endpoint = channel.guest_end().map_err(|e| format!("the channel at {gpa:#x}: {e:?}"))?;
    let vcpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u16;
    // SAFETY: sysconf has no memory effects.
    let ram = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) as u64 * libc::sysconf(libc::_SC_PAGESIZE) as u64 };
    // Without a window (another kernel command line) jobs run in the guest's own files.
    let window = file_window(&cmdline);
    if let Some(window) = window {
        memory.keep_mapped(window)?;
    }
    let mut session = Session::new(endpoint, memory, job::Settings { root: PathBuf::from("/run/clowder") }, window);
    // Before any job runs: an XEMEM export's pages must never outlive the keeper's watch.
    if let Some(registry) = xemem_keeper::start() {
        session.deliver_xemem_to(registry);
    }
    session.hello(vcpus, ram)?;
    println!("clowder-agent: Hello sent ({vcpus} vCPUs, {} MiB)", ram >> 20);
    let mut last_round = std::time::Instant::now();
    let mut wait = WAIT_MIN;
    loop {
        // A round that comes late explains a Ping the host judged lost: this loop held up (by
        // a blocking call) or the whole guest starved (a loaded PVM host emulates its kernel).
        let late = last_round.elapsed();
        if late > SLOW_ROUND + wait {
            session.log(&format!("agent: the session loop was away for {:.1} s", late.as_secs_f64()))?;
        }
        let round = session.poll()?;
        last_round = std::time::Instant::now();
        match round {
            (_, Next::Shutdown) => return Ok(()),
            (true, Next::Continue) => wait = WAIT_MIN,
            (false, Next::Continue) => {
                std::thread::park_timeout(if session.awaiting_host() { wait.min(WAIT_FILE_CALL) } else { wait });
                wait = (wait * 2).min(WAIT_MAX);
            }
        }
    }
}

fn main() {
    // Process 1 ending panics the kernel, which ends the machine: what the daemon expects after
    // Shutdown, and the only honest outcome of a broken channel. The status tells the two apart
    // in the panic line the daemon reads (exitcode=0x00000000 only after Shutdown).
    match run() {
        Ok(()) => println!("clowder-agent: shut down by the host"),
        Err(e) => {
            eprintln!("clowder-agent: {e}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_channel_is_found_on_the_command_line() {
        let line = "console=ttyS0 noxsave clowder.cpus=1 clowder.channel=0x7ff0000,0x10000 clowder.channel_vector=0x40";
        assert_eq!(channel_location(line), Some((0x7ff_0000, 0x10000)));
        assert_eq!(channel_location("clowder.channel=1000,3000"), Some((0x1000, 0x3000)));
        assert_eq!(channel_location("console=ttyS0"), None);
        assert_eq!(channel_location("clowder.channel=0x1000"), None);
        assert_eq!(channel_location("clowder.channel=zz,0x1000"), None);
    }

    #[test]
    fn the_file_window_is_found_and_checked() {
        let line = "memmap=256K$0x7fb0000 clowder.files=0x7fb0000,0x40000 clowder.channel=0x7ff0000,0x10000";
        assert_eq!(file_window(line), Some(FileWindow { gpa: 0x7fb_0000, size: 0x40000 }));
        assert_eq!(file_window("clowder.files=0x7fb0100,0x40000"), None, "unaligned");
        assert_eq!(file_window("clowder.files=0x7fb0000,0x10"), None, "below a page");
        assert_eq!(file_window("clowder.files=0x1000,0x100000000"), None, "too large");
        assert_eq!(file_window("console=ttyS0"), None);
    }
}

#[cfg(test)]
mod session_tests;
