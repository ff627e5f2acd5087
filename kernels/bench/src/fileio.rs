//! Forwarded file I/O (issue 21, point 3): `fileio/fileio.c` in a persistent enclave of a
//! private clowderd (forwarded calls need one) and on the host, on the same core: open+close,
//! stat, and sequential write and read MB/s at 4 KiB, 64 KiB and 8 MiB requests; and the
//! calls again with the kernel's file slots not served (`CLOWDER_FILE_SLOTS=off`), through the
//! channel, to compare.

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
    // The enclave's turns first, each with a daemon of its own: until its enclave is gone the
    // core is not the host's. The channel's turn (file slots not served) times only the calls.
    let in_enclave = |file_slots: bool, args: &[&str]| -> Result<String, String> {
        // A directory of its own: the last daemon's socket must not look like this one's.
        let place = scratch.join(if file_slots { "slots" } else { "channel" });
        std::fs::create_dir_all(&place).map_err(|e| format!("{}: {e}", place.display()))?;
        let daemon = Daemon::start_serving_file_slots(repo, &place, vmm, lwk, file_slots)?;
        daemon.create_enclave(repo, "lwk-bench-io", "512M", core)?;
        let run = daemon.clowder(repo).current_dir(&work).args(["run", "--enclave", "lwk-bench-io"]).arg(&program).args(args).output();
        let _ = daemon.clowder(repo).args(["enclave", "rm", "lwk-bench-io"]).output();
        match run {
            Ok(out) if out.status.success() => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
            other => Err(format!("fileio failed in the enclave: {other:?}")),
        }
    };
    let enclave = in_enclave(true, &args);
    let channel = in_enclave(false, &["200", "0"]);
    let host = Command::new("taskset").current_dir(&work).arg("-c").arg(core.to_string()).arg(&program).args(args).output();
    let _ = std::fs::remove_dir_all(&scratch);
    let (enclave, channel, host) = match (enclave, channel, host) {
        (Ok(enclave), Ok(channel), Ok(host)) if host.status.success() => {
            (enclave, channel, String::from_utf8_lossy(&host.stdout).into_owned())
        }
        (enclave, channel, host) => return Err(format!("fileio failed: enclave {enclave:?}, channel {channel:?}, host {host:?}")),
    };
    let host = figures(&host);
    let channel: Vec<(String, f64)> = figures(&channel).into_iter().filter(|(what, _)| what.ends_with("(us)")).collect();
    let channel_rows = channel.into_iter().map(|(what, ours)| {
        (format!("forwarded {what} over the channel (file slots not served)"), format!("enclave {ours:.1}"), "-".to_string())
    });
    Ok(figures(&enclave)
        .into_iter()
        .map(|(what, ours)| {
            let theirs = host.iter().find(|(name, _)| *name == what).map_or(f64::NAN, |(_, value)| *value);
            let target = match what.as_str() {
                "open+close (us)" => "≤ 100 µs",
                "stat (us)" => "≤ 50 µs",
                w if w.contains("8192 KiB") => "≥ 1000 MB/s",
                _ => "-",
            };
            (format!("forwarded {what}"), format!("enclave {ours:.1}, host {theirs:.1}"), target.to_string())
        })
        .chain(channel_rows)
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
