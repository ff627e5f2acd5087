//! Forwarded file I/O (issue 21, point 3): `fileio/fileio.c` in a persistent enclave of a
//! private clowderd (forwarded calls need one) and on the host, on the same core: open+close,
//! stat, and sequential write and read MB/s at 4 KiB, 64 KiB and 8 MiB requests, in a
//! directory of the host's disk and again in one on a tmpfs (`/dev/shm`: the calls' own cost,
//! without the disk's); then open+close and stat with the job's ring-3 calls not served
//! (`CLOWDER_RING3_FILES=off`: the kernel path through the file slots) and with the slots not
//! served (`CLOWDER_FILE_SLOTS=off`: the channel), to compare.

use std::path::Path;
use std::process::Command;

use crate::private_daemon::Daemon;

/// `fileio: <what> <number> <unit>` lines as ("<what> (<unit>)", number).
fn figures(output: &str) -> Vec<(String, f64)> {
    let figure = |line: &str| {
        let mut words = line.rsplitn(3, ' ');
        let (unit, number, what) = (words.next()?, words.next()?.parse().ok()?, words.next()?);
        Some((format!("{what} ({unit})"), number))
    };
    output.lines().filter_map(|line| line.strip_prefix("fileio: ")).filter_map(figure).collect()
}

/// The rows (what, host and enclave figures, target), or why they could not be measured.
pub fn rows(repo: &Path, core: usize, vmm: &Path, lwk: &Path) -> Result<Vec<(String, String, String)>, String> {
    let scratch = std::env::temp_dir().join(format!("lwk-bench-fileio-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let work = scratch.join("work");
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let program = scratch.join("fileio");
    let source = repo.join("kernels/bench/fileio/fileio.c");
    let built = Command::new("musl-gcc").args(["-O2", "-static", "-o"]).arg(&program).arg(&source).status();
    if !built.is_ok_and(|status| status.success()) {
        return Err(format!("musl-gcc could not build {}", source.display()));
    }
    let args = ["200", "64"];
    let tmpfs = Path::new("/dev/shm").join(format!("lwk-bench-fileio-{}", std::process::id()));
    std::fs::create_dir_all(&tmpfs).map_err(|e| format!("{}: {e}", tmpfs.display()))?;
    // The enclave's turns first, each with a daemon of its own: until its enclave is gone the
    // core is not the host's. The kernel path's and the channel's turns time only the calls.
    let in_enclave = |file_slots: bool, ring3: bool, dir: &Path, args: &[&str]| -> Result<String, String> {
        // A directory of its own: the last daemon's socket must not look like this one's.
        let place = scratch.join(format!("daemon-{file_slots}-{ring3}-{}", dir.starts_with("/dev/shm")));
        std::fs::create_dir_all(&place).map_err(|e| format!("{}: {e}", place.display()))?;
        let daemon = Daemon::start_serving_file_slots(repo, &place, vmm, lwk, file_slots, ring3)?;
        daemon.create_enclave(repo, "lwk-bench-io", "512M", core)?;
        let run = daemon.clowder(repo).current_dir(dir).args(["run", "--enclave", "lwk-bench-io"]).arg(&program).args(args).output();
        let _ = daemon.clowder(repo).args(["enclave", "rm", "lwk-bench-io"]).output();
        match run {
            Ok(out) if out.status.success() => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
            other => Err(format!("fileio failed in the enclave: {other:?}")),
        }
    };
    let on_host = |dir: &Path| -> Result<String, String> {
        match Command::new("taskset").current_dir(dir).arg("-c").arg(core.to_string()).arg(&program).args(args).output() {
            Ok(out) if out.status.success() => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
            other => Err(format!("fileio failed on the host: {other:?}")),
        }
    };
    let runs = (|| -> Result<_, String> {
        Ok((
            in_enclave(true, true, &work, &args)?,
            in_enclave(true, true, &tmpfs, &args)?,
            in_enclave(true, false, &work, &["200", "0"])?,
            in_enclave(false, false, &work, &["200", "0"])?,
            on_host(&work)?,
            on_host(&tmpfs)?,
        ))
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    let _ = std::fs::remove_dir_all(&tmpfs);
    let (enclave, enclave_tmpfs, kernel_path, channel, host, host_tmpfs) = runs?;
    let (host, host_tmpfs) = (figures(&host), figures(&host_tmpfs));
    let target = |what: &str| match what {
        "open+close (us)" => "≤ 100 µs",
        "stat (us)" => "≤ 50 µs",
        w if w.contains("8192 KiB") => "≥ 1000 MB/s",
        _ => "-",
    };
    let beside = |ours: Vec<(String, f64)>, theirs: &[(String, f64)], place: &str| -> Vec<(String, String, String)> {
        ours.into_iter()
            .map(|(what, ours)| {
                let theirs = theirs.iter().find(|(name, _)| *name == what).map_or(f64::NAN, |(_, value)| *value);
                (format!("forwarded {what}{place}"), format!("enclave {ours:.1}, host {theirs:.1}"), target(&what).to_string())
            })
            .collect()
    };
    let calls_only = |output: &str, how: &'static str| {
        figures(output)
            .into_iter()
            .filter(|(what, _)| what.ends_with("(us)"))
            .map(move |(what, ours)| (format!("forwarded {what} {how}"), format!("enclave {ours:.1}"), "-".to_string()))
    };
    let tmpfs_rates: Vec<(String, f64)> = figures(&enclave_tmpfs).into_iter().filter(|(what, _)| what.ends_with("(MB/s)")).collect();
    Ok(beside(figures(&enclave), &host, "")
        .into_iter()
        .chain(beside(tmpfs_rates, &host_tmpfs, ", tmpfs"))
        .chain(calls_only(&kernel_path, "on the kernel path (ring-3 calls not served)"))
        .chain(calls_only(&channel, "over the channel (file slots not served)"))
        .collect())
}

#[cfg(test)]
mod tests {
    #[test]
    fn figures_are_read_from_the_programs_lines() {
        let lines = "fileio: open+close 812.5 us\nfileio: read 8192 KiB 943 MB/s\nnoise\n";
        let figures = super::figures(lines);
        assert_eq!(figures, vec![("open+close (us)".to_string(), 812.5), ("read 8192 KiB (MB/s)".to_string(), 943.0)]);
    }
}
