//! Start-up of a dynamically linked program beside the same program linked statically, end to
//! end through `clowder run` in a persistent enclave of a private clowderd (issue 21, points 5
//! and 7): gcc's hello both ways, alternating runs. The dynamic one's loader reads its cache and
//! libc from the host through the enclave's forwarded file calls.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use crate::private_daemon::Daemon;

const HELLO: &str = "#include <stdio.h>\nint main(void) { printf(\"hello\\n\"); return 0; }\n";

/// The row (medians of `runs` alternating runs of each build), or why it could not be
/// measured.
pub fn rows(repo: &Path, core: usize, vmm: &Path, lwk: &Path, runs: usize) -> Result<Vec<(String, String, String)>, String> {
    eprintln!("hello start-up, static and dynamic, in a persistent enclave ({runs} runs each)...");
    let scratch = std::env::temp_dir().join(format!("lwk-bench-startup-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    std::fs::write(scratch.join("hello.c"), HELLO).map_err(|e| e.to_string())?;
    for (name, flags) in [("hello-static", &["-static"][..]), ("hello-dynamic", &[][..])] {
        let built = Command::new("gcc").args(["-O2", "-o", name, "hello.c"]).args(flags).current_dir(&scratch).status();
        if !built.is_ok_and(|status| status.success()) {
            return Err(format!("gcc could not build {name}"));
        }
    }
    let daemon = Daemon::start(repo, &scratch, vmm, lwk)?;
    daemon.create_enclave(repo, "lwk-bench-startup", "256M", core)?;
    let time = |program: &str| -> Result<f64, String> {
        let start = Instant::now();
        let out = daemon.clowder(repo).current_dir(&scratch).args(["run", "--enclave", "lwk-bench-startup", program]).output();
        let elapsed = start.elapsed().as_secs_f64() * 1000.0;
        match out {
            Ok(out) if out.status.success() && out.stdout == b"hello\n" => Ok(elapsed),
            out => Err(format!("{program} in the enclave failed: {out:?}")),
        }
    };
    let measured = (|| {
        // One run of each first: the host's page cache, the enclave's first system call.
        time("./hello-static")?;
        time("./hello-dynamic")?;
        let (mut static_ms, mut dynamic_ms) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            static_ms.push(time("./hello-static")?);
            dynamic_ms.push(time("./hello-dynamic")?);
        }
        Ok::<_, String>((crate::median(&mut static_ms), crate::median(&mut dynamic_ms)))
    })();
    let _ = daemon.clowder(repo).args(["enclave", "rm", "lwk-bench-startup"]).output();
    drop(daemon);
    let _ = std::fs::remove_dir_all(&scratch);
    let (s, d) = measured?;
    Ok(vec![(
        "hello start-up end to end (clowder run, 1-core persistent enclave), gcc -static and gcc's default (dynamic)".into(),
        format!("static {s:.0} ms, dynamic {d:.0} ms: {:.2}×", d / s),
        "dynamic ≤ 1.5× static".into(),
    )])
}
