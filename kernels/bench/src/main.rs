//! `lwk-bench`: issue 3's measurements. Each program (apps/, built static with musl) runs on the
//! host pinned to a core and in a lightweight-kernel enclave whose vCPU is pinned to the same
//! core, alternating, in one run. Prints a table beside the papers' figures and writes
//! docs/results/lwk-bench.md. RUNS (default 5) repetitions of each; OUT sets the file.
//! The forwarded file I/O rows run `fileio/fileio.c` in a persistent enclave of a private
//! clowderd (`fileio.rs`); `lwk-bench files` prints only them.
//! The C++ mini-app and vector triad rows are `compute.rs`'s; `lwk-bench compute` prints only them.
//! `lwk-bench big` measures only the creation time per GiB (enclaves of each BIG_MEM size,
//! default 4G; e.g. BIG_MEM=4G,16G) and replaces that section of the file; `lwk-bench calls`
//! and `lwk-bench startup` print only the system-call costs or the dynamic start-up row.

mod compute;
mod fileio;
#[path = "../../../vmm/bench/src/measure.rs"]
mod measure;
mod private_daemon;
mod startup;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use measure::{median, monotonic_ns};
use serde_json::json;
use vmm::control::ControlClient;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// The medians of `runs` measurements taken alternately on the host and in the enclave:
/// (host, enclave).
fn alternating_medians(runs: usize, mut host: impl FnMut() -> f64, mut enclave: impl FnMut() -> f64) -> (f64, f64) {
    let (mut on_host, mut in_enclave) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    for _ in 0..runs {
        on_host.push(host());
        in_enclave.push(enclave());
    }
    (median(&mut on_host), median(&mut in_enclave))
}

/// A rate on both sides and the enclave's share of the host's: "host H, enclave E: P%".
fn share_of_host(host: f64, enclave: f64) -> String {
    format!("host {host:.0}, enclave {enclave:.0}: {:.1}%", 100.0 * enclave / host)
}

struct Setup {
    vmm: PathBuf,
    lwk: PathBuf,
    apps: PathBuf,
    core: usize,
    /// Pages backing the 1 GiB enclave of the STREAM, hpccg and selfish runs: 2m when the
    /// hugepage pool can hold it (as `clowder enclave create --hugepages` gives), else 4k.
    backing: &'static str,
}

impl Setup {
    fn app(&self, name: &str) -> PathBuf {
        let path = self.apps.join(name);
        assert!(path.exists(), "{} is missing: run make -C apps", path.display());
        path
    }

    fn host(&self, app: &str, args: &[&str]) -> String {
        let out =
            Command::new("taskset").arg("-c").arg(self.core.to_string()).arg(self.app(app)).args(args).output().expect("taskset runs");
        assert!(out.status.success(), "{app} on the host failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    /// `kernel_options` go before the job's command line (`lwk.heap=16M`).
    fn enclave_command(&self, app: &str, args: &[&str], mem: &str, kernel_options: &str) -> Command {
        let mut command = Command::new(&self.vmm);
        command
            .arg("--kernel")
            .arg(&self.lwk)
            .arg("--module")
            .arg(self.app(app))
            .args(["--mem", mem, "--cpus", "1", "--cores", &self.core.to_string(), "--serial", "stdout"])
            .arg("--cmdline")
            .arg(format!("{kernel_options} -- {app} {}", args.join(" ")).trim_start());
        command
    }

    /// The job's output (the kernel's own `[lwk]` lines removed).
    fn enclave(&self, app: &str, args: &[&str]) -> String {
        let out = self.enclave_command(app, args, "1G", "").args(["--backing", self.backing]).output().expect("clowder-vmm runs");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(out.status.success(), "{app} in the enclave failed ({}): {text}{}", out.status, String::from_utf8_lossy(&out.stderr));
        text.lines().filter(|l| !l.starts_with("[lwk]")).map(|l| format!("{l}\n")).collect()
    }
}

/// The first number after `label` on the line that starts with `prefix`.
fn number_after(text: &str, prefix: &str, label: &str) -> f64 {
    let line = text.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no line {prefix:?} in:\n{text}"));
    let rest = &line[line.find(label).unwrap_or_else(|| panic!("no {label:?} in {line:?}")) + label.len()..];
    rest.trim_start().split(|c: char| !(c.is_ascii_digit() || c == '.')).next().unwrap().parse().unwrap()
}

fn stream_best(text: &str, kernel: &str) -> f64 {
    number_after(text, kernel, kernel)
}

/// Where the big-enclave section starts in the results file.
const BIG_HEADING: &str = "## Creation time per GiB";

/// Seconds from starting clowder-vmm to the guest's first exit (its RAM is populated before the
/// guest starts), and to the process's end after a one-call job: medians of `runs`.
fn creation_seconds(setup: &Setup, mem: &str, backing: &str, runs: usize) -> (f64, f64) {
    let (mut created, mut lifecycle) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let t0 = monotonic_ns();
        let out = setup
            // A small heap: the LWK's default for a one-shot job fails in some sizes (4-5 GiB).
            .enclave_command("syscall-loop", &["1"], mem, "lwk.heap=16M")
            .args(["--backing", backing])
            .env("CLOWDER_VMM_TIMING", "1")
            .stdout(Stdio::null())
            .output()
            .expect("clowder-vmm runs");
        let end = monotonic_ns();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "a {mem} enclave ({backing} pages) failed: {stderr}");
        let first_exit: u128 = number_after(&stderr, "clowder-vmm timing:", "first_exit_ns=") as u128;
        created.push((first_exit - t0) as f64 / 1e9);
        lifecycle.push((end - t0) as f64 / 1e9);
    }
    (median(&mut created), median(&mut lifecycle))
}

const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";
const FREE_HUGEPAGES: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages";

fn read_count(path: &str) -> u64 {
    std::fs::read_to_string(path).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}

/// The hugepage pool grown until `pages` are free (as root), for as long as it lives; then the
/// pool as it was. Held only around the 2m runs: the pool's pages are lost to the 4k ones.
struct HugepagePool(u64);

impl HugepagePool {
    fn with_free(pages: u64) -> Option<HugepagePool> {
        let (pool, free) = (read_count(NR_HUGEPAGES), read_count(FREE_HUGEPAGES));
        let grown = HugepagePool(pool);
        if free < pages {
            // Free memory in pieces gives fewer hugepages than it holds: compact it first.
            let _ = std::fs::write("/proc/sys/vm/compact_memory", "1");
            let _ = std::fs::write(NR_HUGEPAGES, (pool + pages - free).to_string());
        }
        (read_count(FREE_HUGEPAGES) >= pages).then_some(grown)
    }
}

impl Drop for HugepagePool {
    fn drop(&mut self) {
        let _ = std::fs::write(NR_HUGEPAGES, self.0.to_string());
    }
}

/// The creation time per GiB of guest RAM, per backing: enclaves of each BIG_MEM size (a comma
/// list, 4G by default) against 64 MiB ones.
fn big_section(setup: &Setup, runs: usize) -> String {
    let sizes = std::env::var("BIG_MEM").unwrap_or_else(|_| "4G".into());
    let mut table = String::from("| measurement | clowder | target / anchor |\n|---|---|---|\n");
    for (big, backing) in sizes.split(',').flat_map(|big| [(big, "4k"), (big, "2m")]) {
        let gib: u64 = big.strip_suffix(['G', 'g']).and_then(|n| n.parse().ok()).expect("BIG_MEM: sizes in GiB, e.g. 4G,16G");
        // One run of most of the machine's memory takes a minute here.
        let runs = if gib > 8 { 1 } else { runs };
        let _pool = match backing {
            "2m" => match HugepagePool::with_free(gib * 512) {
                Some(pool) => Some(pool),
                None => {
                    eprintln!("skipping the 2m creation row: {big} needs {} free hugepages", gib * 512);
                    continue;
                }
            },
            _ => None,
        };
        eprintln!("creation time of {big} and 64 MiB enclaves, {backing} pages ({runs} runs each)...");
        let (small_created, _) = creation_seconds(setup, "64M", backing, runs);
        let (big_created, big_lifecycle) = creation_seconds(setup, big, backing, runs);
        table.push_str(&format!(
            "| enclave creation per GiB of RAM ({backing} pages; clowder-vmm start → first guest exit, {big} against 64 MiB) \
             | {:.2} s per GiB ({big}: {big_created:.2} s created, {big_lifecycle:.2} s create → job exit → teardown; 64 MiB: {:.3} s) \
             | scales with memory; no fixed limit (clowderd waits while the VMM reports progress) |\n",
            (big_created - small_created) / (gib as f64 - 1.0 / 16.0),
            small_created
        ));
    }
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load.split_whitespace().next().unwrap_or("?");
    format!(
        "{BIG_HEADING}\n\n{date}; {} CPUs, core {}, load average {load} when it ended; medians of {runs} runs \
         (one above 8 GiB; `lwk-bench big`). Populating guest RAM dominates: every page is allocated before the guest starts.\n\n{table}",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        setup.core
    )
}

/// The calls the LWK answers in ring 3 where SYSCALL stays there (PVM: `arch/fastcall.rs`),
/// as `syscall-loop` names them.
const FAST_CALLS: [&str; 11] =
    ["getpid", "gettid", "getppid", "getuid", "uname", "getrusage", "times", "clock-cputime", "clock_getres", "getcpu", "sched_yield"];

/// Each call's round trip, host and enclave (medians of three runs), and getpid's on the
/// enclave's kernel path.
fn call_cost_rows(setup: &Setup) -> Vec<(String, String, String)> {
    eprintln!("system-call round trips, host and enclave...");
    let cost = |text: String| number_after(&text, "syscall-loop", "calls,") / 1000.0;
    let mut rows = Vec::new();
    // The median of three runs each: one run on a loaded machine can be twice the next.
    for call in FAST_CALLS {
        let enclave_us = median(&mut (0..3).map(|_| cost(setup.enclave("syscall-loop", &["20000", call]))).collect::<Vec<_>>());
        let host_us = median(&mut (0..3).map(|_| cost(setup.host("syscall-loop", &["1000000", call]))).collect::<Vec<_>>());
        rows.push((
            format!("{call} round trip"),
            format!("enclave {enclave_us:.2} µs (host {host_us:.2} µs)"),
            "≤ 2 µs in the enclave".into(),
        ));
    }
    let kernel_path = setup.enclave_command("syscall-loop", &["2000"], "256M", "lwk.fastcalls=off").output().expect("clowder-vmm runs");
    assert!(kernel_path.status.success(), "syscall-loop with lwk.fastcalls=off failed ({})", kernel_path.status);
    rows.push((
        "getpid round trip on the kernel path (lwk.fastcalls=off)".into(),
        format!("enclave {:.2} µs", cost(String::from_utf8_lossy(&kernel_path.stdout).into_owned())),
        "-".into(),
    ));
    rows
}

fn table_of(rows: &[(String, String, String)]) -> String {
    let mut table = String::from("| measurement | clowder | target / anchor |\n|---|---|---|\n");
    for (what, ours, anchor) in rows {
        table.push_str(&format!("| {what} | {ours} | {anchor} |\n"));
    }
    table
}

fn main() {
    let runs: usize = std::env::var("RUNS").ok().and_then(|r| r.parse().ok()).unwrap_or(5);
    // What the figures were measured on and beside: the CPU and the load when the run began.
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines().find_map(|l| l.strip_prefix("model name").map(|m| m.trim_start_matches([' ', '\t', ':']).to_string()))
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let load_at_start = std::fs::read_to_string("/proc/loadavg").unwrap_or_default().split(' ').take(3).collect::<Vec<_>>().join(" ");
    let repo = repo();
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let free_hugepages: u64 = std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let setup = Setup {
        backing: if free_hugepages >= 512 { "2m" } else { "4k" },
        vmm: repo.join("target/release/clowder-vmm"),
        lwk: repo.join("kernels/target/x86_64-unknown-none/release/lwk"),
        apps: repo.join("build/apps"),
        core: cores - 1,
    };
    assert!(setup.vmm.exists() && setup.lwk.exists(), "build first: make build");
    let out = std::env::var("OUT").unwrap_or_else(|_| repo.join("docs/results/lwk-bench.md").display().to_string());
    if std::env::args().nth(1).as_deref() == Some("big") {
        let section = big_section(&setup, runs.min(3));
        println!("{section}");
        let existing = std::fs::read_to_string(&out).unwrap_or_default();
        let kept = existing.split(&format!("\n{BIG_HEADING}")).next().unwrap_or("").trim_end();
        match std::fs::write(&out, format!("{kept}\n\n{section}")) {
            Ok(()) => eprintln!("wrote {out}"),
            Err(e) => eprintln!("lwk-bench: cannot write {out}: {e}"),
        }
        return;
    }
    if std::env::args().nth(1).as_deref() == Some("startup") {
        // `lwk-bench startup`: only the dynamic and static start-up row, printed.
        match startup::rows(&repo, setup.core, &setup.vmm, &setup.lwk, runs) {
            Ok(rows) => println!("{}", table_of(&rows)),
            Err(why) => eprintln!("lwk-bench: no start-up row: {why}"),
        }
        return;
    }
    if std::env::args().nth(1).as_deref() == Some("calls") {
        // `lwk-bench calls`: only the system-call costs, printed (the results file stays).
        println!("{}", table_of(&call_cost_rows(&setup)));
        return;
    }
    if std::env::args().nth(1).as_deref() == Some("compute") {
        // `lwk-bench compute`: only the C++ mini-app and triad rows, printed (the results file stays).
        let mut rows = compute::minicg_rows(&setup, runs);
        rows.extend(compute::triad_rows(&setup, runs));
        println!("{}", table_of(&rows));
        return;
    }
    if std::env::args().nth(1).as_deref() == Some("files") {
        // `lwk-bench files`: only the forwarded file I/O rows, printed (the results file stays).
        match fileio::rows(&repo, setup.core, &setup.vmm, &setup.lwk) {
            Ok(rows) => println!("{}", table_of(&rows)),
            Err(why) => eprintln!("lwk-bench: no file I/O rows: {why}"),
        }
        return;
    }
    let mut rows: Vec<(String, String, String)> = Vec::new();

    eprintln!("STREAM ({runs} runs each, alternating host and enclave)...");
    let stream_args = ["20000000", "10"];
    let kernels = ["copy", "scale", "add", "triad"];
    let mut host_bw = vec![Vec::new(); 4];
    let mut lwk_bw = vec![Vec::new(); 4];
    for _ in 0..runs {
        let host = setup.host("stream", &stream_args);
        let lwk = setup.enclave("stream", &stream_args);
        for (k, name) in kernels.iter().enumerate() {
            host_bw[k].push(stream_best(&host, name));
            lwk_bw[k].push(stream_best(&lwk, name));
        }
    }
    for (k, name) in kernels.iter().enumerate() {
        let (h, l) = (median(&mut host_bw[k]), median(&mut lwk_bw[k]));
        rows.push((
            format!("STREAM {name} (best of 10, MB/s)"),
            share_of_host(h, l),
            "≥ 98% of host (Palacios/Kitten: within 5% of native)".into(),
        ));
    }

    eprintln!("hpccg ({runs} runs each)...");
    let cg_args = ["48", "48", "48"];
    let (h, l) = alternating_medians(
        runs,
        || number_after(&setup.host("hpccg", &cg_args), "hpccg: setup", "solve"),
        || number_after(&setup.enclave("hpccg", &cg_args), "hpccg: setup", "solve"),
    );
    rows.push((
        "hpccg 48³ solve time".into(),
        format!("host {h:.3} s, enclave {l:.3} s: {:.1}% of host speed", 100.0 * h / l),
        "≥ 98% of host".into(),
    ));
    rows.extend(compute::minicg_rows(&setup, runs));
    rows.extend(compute::triad_rows(&setup, runs));

    eprintln!("selfish detour (3 alternating runs of 5 s each)...");
    let detour_line = |t: &str| t.lines().find(|l| l.contains(" detours, ")).unwrap_or("").trim_start_matches("selfish: ").to_string();
    let detours = |t: &str| -> f64 { detour_line(t).split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(f64::NAN) };
    // The run with the median detour count on each side (host interrupts come in bursts, so a
    // single run of each says little).
    let (mut host_runs, mut lwk_runs) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        host_runs.push(setup.host("selfish", &["5", "0", "list"]));
        lwk_runs.push(setup.enclave("selfish", &["5", "0", "list"]));
    }
    host_runs.sort_by(|a, b| detours(a).total_cmp(&detours(b)));
    lwk_runs.sort_by(|a, b| detours(a).total_cmp(&detours(b)));
    let (host, lwk) = (&host_runs[1], &lwk_runs[1]);
    // Every detour of the two median runs, for the figure (bench/plot.py lwk).
    let mut detour_list = String::from("side\tat_us\tlength_us\n");
    for (side, output) in [("host", host), ("enclave", lwk)] {
        for line in output.lines().filter_map(|line| line.strip_prefix("detour ")) {
            detour_list.push_str(&format!("{side}\t{}\n", line.replace(' ', "\t")));
        }
    }
    let detours_out = std::path::Path::new(&out).with_file_name("lwk-detours.tsv");
    if let Err(e) = std::fs::write(&detours_out, detour_list) {
        eprintln!("lwk-bench: cannot write {}: {e}", detours_out.display());
    }
    rows.push(("selfish detour, host (median of 3 runs)".into(), detour_line(host), "-".into()));
    rows.push((
        "selfish detour, enclave (median of 3 runs)".into(),
        detour_line(lwk),
        format!("no detours of its own (not more than the host's): {}", if detours(lwk) <= detours(host) { "yes" } else { "no" }),
    ));

    eprintln!("enclave create → hello → teardown (20 runs per backing)...");
    for backing in ["4k", "2m"] {
        if backing == "2m" && free_hugepages < 32 {
            eprintln!("skipping the 2m lifecycle row: reserve 32 hugepages (sysctl vm.nr_hugepages=32)");
            continue;
        }
        let mut lifecycle = Vec::new();
        for _ in 0..20 {
            let t0 = Instant::now();
            let status = setup
                .enclave_command("syscall-loop", &["1"], "64M", "")
                .args(["--backing", backing])
                .stdout(Stdio::null())
                .status()
                .unwrap();
            assert!(status.success());
            lifecycle.push(t0.elapsed().as_secs_f64() * 1000.0);
        }
        rows.push((
            format!("enclave create → job exit → teardown (64 MiB, {backing} pages, one clowder-vmm)"),
            format!("{:.1} ms", median(&mut lifecycle)),
            "≤ 150 ms (a Pisces enclave boots in about 1.5 s)".into(),
        ));
    }

    rows.extend(call_cost_rows(&setup));
    eprintln!("kernel-mode instructions per getpid on the kernel path...");
    let socket = std::env::temp_dir().join(format!("lwk-bench-{}.sock", std::process::id()));
    let mut job = setup
        .enclave_command("syscall-loop", &["100000000"], "256M", "lwk.fastcalls=off")
        .arg("--control")
        .arg(&socket)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut client = loop {
        if let Ok(c) = ControlClient::connect(&socket) {
            break c;
        }
        assert!(Instant::now() < deadline, "no control socket");
        std::thread::sleep(Duration::from_millis(20));
    };
    std::thread::sleep(Duration::from_millis(800)); // let the job reach its loop
    let (profile, _) = client.call(&json!({"op": "profile", "vcpu": 0, "steps": 20000}), &[]).unwrap();
    let _ = client.call(&json!({"op": "stop"}), &[]);
    let _ = job.wait();
    let per_entry = profile["kernel_per_entry"].as_f64().unwrap_or(f64::NAN);
    rows.push((
        "kernel-mode instructions per getpid on the kernel path (lwk.fastcalls=off, single-stepped)".into(),
        format!("{per_entry:.0} ({} kernel steps over {} entries)", profile["kernel"], profile["kernel_entries"]),
        "≤ 200".into(),
    ));

    eprintln!("forwarded file I/O (a persistent enclave of a private clowderd, same core)...");
    match fileio::rows(&repo, setup.core, &setup.vmm, &setup.lwk) {
        Ok(io_rows) => rows.extend(io_rows),
        Err(why) => eprintln!("lwk-bench: no file I/O rows: {why}"),
    }
    match startup::rows(&repo, setup.core, &setup.vmm, &setup.lwk, runs) {
        Ok(startup_rows) => rows.extend(startup_rows),
        Err(why) => eprintln!("lwk-bench: no start-up row: {why}"),
    }

    let table = table_of(&rows);
    println!("{table}");
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let report = format!(
        "# Lightweight-kernel enclave benchmarks\n\n{date}; {cores} CPUs ({cpu}, PVM), host core {} for both sides, load average {load_at_start} at the start; \
         medians of {runs} runs measured side by side in one run of `make bench` (`target/release/lwk-bench`). \
         The STREAM, hpccg and selfish enclaves have 1 GiB of RAM backed by {} pages (2 MiB when the hugepage \
         pool holds 512 free pages: `kernels/bench/run.sh` reserves them when run as root); the host runs the \
         same static binary with Linux's defaults.\n\n{table}\nEvery detour of the median selfish runs, host and \
         enclave: [lwk-detours.png](lwk-detours.png) (`bench/plot.py lwk`, from lwk-detours.tsv). The enclave's \
         kernel has no timer tick; its detours are the host's interruptions of its vCPU, each of which costs a VM \
         exit and re-entry on top.\n\n{}",
        setup.core,
        setup.backing,
        big_section(&setup, runs.min(3))
    );
    match std::fs::write(&out, report) {
        Ok(()) => eprintln!("wrote {out}"),
        Err(e) => eprintln!("lwk-bench: cannot write {out}: {e}"),
    }
}
