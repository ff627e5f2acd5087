//! Issue 21's compute rows: the C++ mini-app `minicg` (points 6: at least 95% of host MFLOPS
//! with either timer, static and dynamic) and the AVX2/AVX-512 triad with one and two threads
//! per core (point 7). Both sides run under SCHED_RR at priority 10 when we are root, so that
//! the other work of a loaded machine does not decide the ratio (RR, not FIFO: two threads on
//! one core still take turns on the host, as they do in the enclave).
//! Dynamic programs run from an archive holding the program, its interpreter and libraries
//! (as `ldd` names them) and `/etc/ld.so.cache`, as the LWK's own tests run them.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{alternating_medians, number_after, share_of_host, Setup};

type Row = (String, String, String);

/// `command` run under SCHED_RR priority 10 (as root; unchanged otherwise).
fn realtime(command: Command) -> Command {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return command;
    }
    let mut wrapped = Command::new("chrt");
    wrapped.args(["-r", "10"]).arg(command.get_program()).args(command.get_args());
    wrapped
}

fn output_of(command: Command, what: &str) -> String {
    let out = realtime(command).stderr(Stdio::inherit()).output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{what} failed ({}): {text}", out.status);
    text.lines().filter(|l| !l.starts_with("[lwk]")).map(|l| format!("{l}\n")).collect()
}

fn host(setup: &Setup, app: &str, args: &[&str]) -> String {
    let mut command = Command::new("taskset");
    command.arg("-c").arg(setup.core.to_string()).arg(setup.app(app)).args(args);
    output_of(command, &format!("{app} on the host"))
}

fn enclave(setup: &Setup, app: &str, args: &[&str]) -> String {
    let mut command = setup.enclave_command(app, args, "1G", "");
    command.args(["--backing", setup.backing]);
    output_of(command, &format!("{app} in the enclave"))
}

/// A directory holding, for each dynamic program, an archive named as the program: the job's
/// file system with what it needs to run. Removed when dropped.
struct Archives(PathBuf);

impl Drop for Archives {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Archives {
    fn new() -> Archives {
        let dir = std::env::temp_dir().join(format!("lwk-bench-archives-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        Archives(dir)
    }

    /// Builds `<dir>/<name>`: `program` as `name`, its interpreter and libraries, and the
    /// loader's cache, each stored under the path the loader opens (symlinks followed).
    fn add(&self, program: &Path, name: &str) -> Result<(), String> {
        let ldd = Command::new("ldd").arg(program).output().map_err(|e| format!("ldd: {e}"))?;
        let mut files: Vec<(String, PathBuf)> = vec![(name.to_string(), program.to_path_buf())];
        for line in String::from_utf8_lossy(&ldd.stdout).lines() {
            // "libm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
            if let Some(path) = line.split_whitespace().find(|word| word.starts_with('/')) {
                files.push((path.trim_start_matches('/').to_string(), PathBuf::from(path)));
            }
        }
        files.push(("etc/ld.so.cache".into(), PathBuf::from("/etc/ld.so.cache")));
        let stage = self.0.join(format!("{name}.files"));
        for (stored, source) in &files {
            let target = stage.join(stored);
            std::fs::create_dir_all(target.parent().unwrap()).map_err(|e| e.to_string())?;
            std::fs::copy(source, &target).map_err(|e| format!("{}: {e}", source.display()))?;
        }
        let archive = std::fs::File::create(self.0.join(name)).map_err(|e| e.to_string())?;
        let mut cpio = Command::new("busybox")
            .args(["cpio", "-o", "-H", "newc"])
            .current_dir(&stage)
            .stdin(Stdio::piped())
            .stdout(archive)
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("busybox cpio: {e}"))?;
        let names: String = files.iter().map(|(stored, _)| format!("{stored}\n")).collect();
        std::io::Write::write_all(cpio.stdin.as_mut().unwrap(), names.as_bytes()).map_err(|e| e.to_string())?;
        drop(cpio.stdin.take());
        match cpio.wait() {
            Ok(status) if status.success() => Ok(()),
            other => Err(format!("busybox cpio: {other:?}")),
        }
    }
}

/// minicg's total MFLOPS, host and enclave alternating, for each timer, static and dynamic.
pub fn minicg_rows(setup: &Setup, runs: usize) -> Vec<Row> {
    let args = ["64", "64", "64"];
    let archives = Archives::new();
    let in_archives = Setup { apps: archives.0.clone(), vmm: setup.vmm.clone(), lwk: setup.lwk.clone(), ..*setup };
    let mut rows = Vec::new();
    for (app, what) in [
        ("minicg", "getrusage timer, static"),
        ("minicg-wall", "gettimeofday timer, static"),
        ("minicg-dyn", "getrusage timer, dynamic"),
        ("minicg-wall-dyn", "gettimeofday timer, dynamic"),
    ] {
        let dynamic = app.ends_with("-dyn");
        if dynamic {
            if let Err(why) = archives.add(&setup.app(app), app) {
                eprintln!("lwk-bench: no {app} row: {why}");
                continue;
            }
        }
        eprintln!("{app} 64³ ({runs} runs each, alternating host and enclave)...");
        let mflops = |text: String| number_after(&text, "minicg: MFLOPS", "total");
        let (h, e) = alternating_medians(
            runs,
            || mflops(host(setup, app, &args)),
            || mflops(enclave(if dynamic { &in_archives } else { setup }, app, &args)),
        );
        rows.push((format!("minicg 64³ C++ CG ({what}; total MFLOPS)"), share_of_host(h, e), "≥ 95% of host".into()));
    }
    rows
}

/// The triad's MB/s with AVX2 and AVX-512 (where offered), one and two threads on one core.
pub fn triad_rows(setup: &Setup, runs: usize) -> Vec<Row> {
    let mut rows = Vec::new();
    for isa in ["avx2", "avx512"] {
        let offered = Command::new(setup.app("triad")).args([isa, "1", "8", "1"]).stdout(Stdio::null()).stderr(Stdio::null()).status();
        if !offered.is_ok_and(|status| status.success()) {
            eprintln!("lwk-bench: no {isa} triad row: this CPU does not offer {isa}");
            continue;
        }
        for threads in ["1", "2"] {
            eprintln!("triad {isa}, {threads} thread(s) per core ({runs} runs each)...");
            let bandwidth = |text: String| number_after(&text, "triad:", "each:");
            let (h, e) = alternating_medians(
                runs,
                || bandwidth(host(setup, "triad", &[isa, threads])),
                || bandwidth(enclave(setup, "triad", &[isa, threads])),
            );
            rows.push((
                format!("{isa} triad, {threads} thread(s) on one core (16384 doubles per array, cache resident; MB/s)"),
                share_of_host(h, e),
                "-".into(),
            ));
        }
    }
    rows
}
