//! Opt-in: boots Debian's stock kernel (`linux-image-amd64`) with a tiny initramfs and waits for
//! "Linux version" on the serial console; and boots the project's small guest kernel to its
//! enclave agent. Not in the default run: on a PVM host every guest kernel instruction is
//! emulated, so a full boot takes many minutes.
//!
//!     make test-linux            # the Debian kernel
//!     make test-linux-enclave    # the small kernel and its agent
//!     # or: cargo test --release -p clowder-vmm --test linux_boot -- --ignored --nocapture
//!     # CLOWDER_LINUX_TO_INIT=1 also waits (up to an hour) for the initramfs's /init to run.
//!
//! The kernel is fetched with apt-get (the Debian package registry), its compressed payload is
//! unpacked to the uncompressed `vmlinux`, which carries a PVH entry note, so the guest skips the
//! decompressor (most of a bzImage boot here). Files are cached in target/linux-guest.
//! On PVM the VMM adds `clearcpuid=...` for Linux guests (vmm/core/src/arch/cpuid.rs).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const VERSION_TIMEOUT: Duration = Duration::from_secs(600);
const INIT_TIMEOUT: Duration = Duration::from_secs(3600);
const INIT_MESSAGE: &str = "clowder: init is running in the Linux guest";

/// The initramfs's /init: says hello and powers the VM off through the exit port.
const INIT_SOURCE: &str = r#"
#include <stdio.h>
#include <sys/io.h>
#include <unistd.h>
int main(void) {
    printf("clowder: init is running in the Linux guest\n");
    fflush(stdout);
    if (ioperm(0xf4, 1, 1) == 0) outb(0, 0xf4);
    for (;;) pause();
}
"#;

fn run(command: &mut Command) -> Vec<u8> {
    let out = command.output().unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(out.status.success(), "{command:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

fn work_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/linux-guest");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Downloads the kernel package and unpacks its payload to an ELF vmlinux.
fn vmlinux(dir: &Path) -> PathBuf {
    let vmlinux = dir.join("vmlinux");
    if vmlinux.exists() {
        return vmlinux;
    }
    let depends = String::from_utf8(run(Command::new("apt-cache").args(["depends", "linux-image-amd64"]))).unwrap();
    let package = depends
        .lines()
        .find_map(|l| l.trim().strip_prefix("Depends: ").filter(|p| p.starts_with("linux-image-")))
        .expect("linux-image-amd64 depends on a versioned kernel package (run apt-get update)")
        .to_string();
    run(Command::new("apt-get").args(["download", &package]).current_dir(dir));
    let deb = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .expect("downloaded .deb");
    let tar = run(Command::new("dpkg-deb").arg("--fsys-tarfile").arg(&deb));
    let mut untar =
        Command::new("tar").args(["-x", "--wildcards", "./boot/vmlinuz-*"]).current_dir(dir).stdin(Stdio::piped()).spawn().unwrap();
    std::io::Write::write_all(untar.stdin.as_mut().unwrap(), &tar).unwrap();
    drop(untar.stdin.take());
    assert!(untar.wait().unwrap().success());
    let vmlinuz = std::fs::read_dir(dir.join("boot")).unwrap().flatten().next().expect("vmlinuz").path();
    let image = std::fs::read(vmlinuz).unwrap();
    const XZ_MAGIC: &[u8] = b"\xfd7zXZ\x00";
    let start = image.windows(XZ_MAGIC.len()).position(|w| w == XZ_MAGIC).expect("an xz-compressed payload");
    let payload = dir.join("payload.xz");
    std::fs::write(&payload, &image[start..]).unwrap();
    let elf = run(Command::new("xz").args(["-dc", "--single-stream"]).arg(&payload));
    assert_eq!(&elf[..4], b"\x7fELF", "the payload is the vmlinux ELF");
    std::fs::write(&vmlinux, elf).unwrap();
    vmlinux
}

/// One entry of a "newc" cpio archive.
fn cpio_entry(archive: &mut Vec<u8>, name: &str, data: &[u8], mode: u32, inode: u32) {
    let name_len = name.len() + 1;
    let fields = [inode, mode, 0, 0, 1, 0, data.len() as u32, 0, 0, 0, 0, name_len as u32, 0];
    archive.extend_from_slice(b"070701");
    for field in fields {
        archive.extend_from_slice(format!("{field:08X}").as_bytes());
    }
    archive.extend_from_slice(name.as_bytes());
    archive.push(0);
    archive.resize(archive.len().div_ceil(4) * 4, 0);
    archive.extend_from_slice(data);
    archive.resize(archive.len().div_ceil(4) * 4, 0);
}

fn initramfs(dir: &Path) -> PathBuf {
    let source = dir.join("init.c");
    let init = dir.join("init");
    std::fs::write(&source, INIT_SOURCE).unwrap();
    run(Command::new("musl-gcc").args(["-static", "-O2", "-o"]).arg(&init).arg(&source));
    let mut archive = Vec::new();
    cpio_entry(&mut archive, "init", &std::fs::read(&init).unwrap(), 0o100755, 1);
    cpio_entry(&mut archive, "TRAILER!!!", &[], 0, 0);
    let path = dir.join("initramfs.cpio");
    std::fs::write(&path, archive).unwrap();
    path
}

/// Starts clowder-vmm on `kernel` and `initrd` with `args`; its console lines arrive on the
/// receiver.
fn boot(kernel: &Path, initrd: &Path, args: &[&str]) -> (std::process::Child, mpsc::Receiver<String>) {
    let mut vmm = Command::new(env!("CARGO_BIN_EXE_clowder-vmm"))
        .arg("--kernel")
        .arg(kernel)
        .arg("--module")
        .arg(initrd)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("clowder-vmm starts");
    let (lines_tx, lines) = mpsc::channel();
    let stdout = vmm.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                return;
            }
        }
    });
    (vmm, lines)
}

/// Waits for a console line containing `needle`: how long after `started` it came.
fn wait_for(lines: &mpsc::Receiver<String>, started: Instant, needle: &str, timeout: Duration) -> Option<Duration> {
    let deadline = started + timeout;
    while let Ok(line) = lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        if line.contains(needle) {
            println!("{:>8.1} s  {line}", started.elapsed().as_secs_f64());
            return Some(started.elapsed());
        }
    }
    None
}

#[test]
#[ignore = "slow: boots a stock Linux kernel (make test-linux)"]
fn debian_kernel_prints_its_banner() {
    if !Path::new("/dev/kvm").exists() {
        eprintln!("skipped: /dev/kvm is absent");
        return;
    }
    let dir = work_dir();
    let kernel = vmlinux(&dir);
    let initrd = initramfs(&dir);
    let to_init = std::env::var_os("CLOWDER_LINUX_TO_INIT").is_some();
    let started = Instant::now();
    let args = ["--mem", "512M", "--cpus", "1", "--unclaimed-ports", "log", "--cmdline", "console=ttyS0 earlyprintk=ttyS0 panic=-1"];
    let (mut vmm, lines) = boot(&kernel, &initrd, &args);
    let banner = wait_for(&lines, started, "Linux version", VERSION_TIMEOUT);
    let init = if banner.is_some() && to_init { wait_for(&lines, started, INIT_MESSAGE, INIT_TIMEOUT) } else { None };
    let _ = vmm.kill();
    let _ = vmm.wait();
    let banner = banner.unwrap_or_else(|| panic!("no \"Linux version\" within {VERSION_TIMEOUT:?}"));
    println!("\"Linux version\" after {:.1} s", banner.as_secs_f64());
    if to_init {
        let init = init.unwrap_or_else(|| panic!("/init did not run within {INIT_TIMEOUT:?}"));
        println!("/init ran after {:.1} s", init.as_secs_f64());
    }
}

/// The output of one of the repository's scripts: the path it prints last.
fn script_output(args: &[&str]) -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/linux-kernel.sh");
    let out = run(Command::new(script).args(args));
    PathBuf::from(String::from_utf8(out).unwrap().lines().last().expect("a path").trim())
}

/// The small guest kernel (scripts/linux-kernel.sh, built once per machine and cached) boots
/// to its initramfs's agent, whose system calls and /dev/mem mapping of the channel work: it
/// says Hello on the channel and on the console. `make test-linux-enclave`.
#[test]
#[ignore = "slow: boots the small Linux guest kernel to its agent (make test-linux-enclave)"]
fn small_kernel_boots_to_the_agent() {
    if !Path::new("/dev/kvm").exists() {
        eprintln!("skipped: /dev/kvm is absent");
        return;
    }
    let kernel = script_output(&[]);
    let initrd = script_output(&["initramfs"]);
    let started = Instant::now();
    let (mut vmm, lines) = boot(&kernel, &initrd, &["--mem", "128M", "--cpus", "1", "--cmdline", "console=ttyS0 panic=-1 quiet"]);
    let hello = wait_for(&lines, started, "clowder-agent: Hello sent", INIT_TIMEOUT);
    let _ = vmm.kill();
    let _ = vmm.wait();
    let hello = hello.unwrap_or_else(|| panic!("the agent did not say Hello within {INIT_TIMEOUT:?}"));
    println!("create to Hello: {:.1} s", hello.as_secs_f64());
}
