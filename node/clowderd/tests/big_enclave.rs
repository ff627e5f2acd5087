//! Big enclaves (issue 22, point 6): an enclave of most of the machine's memory is created, runs
//! a job and is removed, with 2 MiB pages and with 4 KiB pages. Populating that much guest RAM
//! takes far longer than any fixed timeout: the VMM reports its progress and the daemon waits
//! while it goes on, logging it. Opt-in (they take minutes and most of the machine's memory):
//! `cargo test --release -p clowderd --test big_enclave -- --ignored --test-threads 1`;
//! `CLOWDER_BIG_ENCLAVE=SIZE` changes the size (16G by default). Each prints its creation time
//! per GiB. Needs /dev/kvm, musl-gcc, the LWK image and clowder-vmm; skipped otherwise.

use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Instant;

use clowderd::client::Client;
use clowderd::memory::{format_size, parse_size};
use serde_json::{json, Value};

mod support;
use clowder_test_support::{build_musl_program, TOUCH_HEAP_JOB};
use support::processes::Daemon;
use support::{missing_job_requirement, TempDir};

const HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";
const FREE_HUGEPAGES: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages";

fn count(path: &str) -> u64 {
    std::fs::read_to_string(path).unwrap().trim().parse().unwrap()
}

/// Grows the hugepage pool by what `bytes` needs beyond the free pages; puts it back when dropped.
struct HugepageReservation(u64);

impl HugepageReservation {
    fn reserve(bytes: u64) -> Result<HugepageReservation, String> {
        let pool = count(HUGEPAGES);
        let reservation = HugepageReservation(pool);
        let needed = bytes >> 21;
        let free = count(FREE_HUGEPAGES);
        if free < needed {
            std::fs::write(HUGEPAGES, (pool + needed - free).to_string()).map_err(|e| format!("growing {HUGEPAGES}: {e}"))?;
            if count(FREE_HUGEPAGES) < needed {
                return Err(format!("the kernel gave only {} free hugepages of {needed}", count(FREE_HUGEPAGES)));
            }
        }
        Ok(reservation)
    }
}

impl Drop for HugepageReservation {
    fn drop(&mut self) {
        let _ = std::fs::write(HUGEPAGES, self.0.to_string());
    }
}

fn run_job(socket: &Path, enclave: &str, job: &Path, argv: &[&str], cwd: &Path) -> (Value, String) {
    let binary = std::fs::File::open(job).unwrap();
    let directory = std::fs::File::open(cwd).unwrap();
    let request = json!({"op": "run", "enclave": enclave, "argv": argv, "cwd": cwd.to_str().unwrap(), "files": []});
    let mut output = String::new();
    let reply = Client::connect_to(socket)
        .unwrap()
        .call_streaming(&request, &[binary.as_raw_fd(), directory.as_raw_fd()], &mut |event| {
            if let Some(text) = event["text"].as_str() {
                output.push_str(text);
            }
        })
        .unwrap();
    (reply, output)
}

fn big_enclave_runs_a_job(hugepages: bool) {
    if let Some(why) = missing_job_requirement() {
        eprintln!("skipped: {why}");
        return;
    }
    let size = std::env::var("CLOWDER_BIG_ENCLAVE").map_or(16 << 30, |size| parse_size(&size).expect("CLOWDER_BIG_ENCLAVE"));
    let pages = if hugepages { "2m" } else { "4k" };
    let dir = TempDir::new(&format!("clowderd-big-{pages}"));
    let job = build_musl_program(&dir.0, "touch", TOUCH_HEAP_JOB);
    let _reservation = hugepages.then(|| HugepageReservation::reserve(size).unwrap());
    let daemon = Daemon::start_with_machines(&dir.0, None);

    let started = Instant::now();
    let created = daemon.call(json!({"op": "create", "name": "big", "cores": 1, "mem": format_size(size), "hugepages": hugepages}));
    let seconds = started.elapsed().as_secs_f64();
    assert_eq!(created["ok"], true, "{created}\n{}", daemon.log());
    let gib = size as f64 / (1u64 << 30) as f64;
    eprintln!("created a {} enclave of {pages} pages in {seconds:.1} s: {:.2} s per GiB", format_size(size), seconds / gib);
    if seconds > 10.0 {
        assert!(daemon.log().contains("guest RAM populated: "), "the daemon logs the progress:\n{}", daemon.log());
    }

    let (reply, output) = run_job(&daemon.dir.join("clowderd.sock"), "big", &job, &["touch", "1024"], &dir.0);
    assert_eq!(reply["status"], 0, "{reply}\n{}", daemon.log());
    assert_eq!(output, "touched 1024 MiB, sum 0\n");

    let removed = daemon.call(json!({"op": "rm", "name": "big"}));
    assert_eq!(removed["ok"], true, "{removed}");
}

#[test]
#[ignore = "opt-in: minutes and most of the machine's memory"]
fn a_16_gib_enclave_of_2_mib_pages_is_created_runs_a_job_and_is_removed() {
    big_enclave_runs_a_job(true);
}

#[test]
#[ignore = "opt-in: minutes and most of the machine's memory"]
fn a_16_gib_enclave_of_4_kib_pages_is_created_runs_a_job_and_is_removed() {
    big_enclave_runs_a_job(false);
}
