//! The Ping the daemon waits on, judged by the time the enclave could have answered it.
//!
//! A vCPU thread is at any moment running, waiting on a host run queue, or sleeping (a halted
//! guest). Only the waiting is the host's fault: on a host loaded far past its cores (CI beside
//! other work, where a guest's kernel work is emulated at a fraction of its idle speed) the
//! first vCPU, which answers Ping, can spend most of 30 s queued, and a live enclave was removed
//! as hung. So a Ping's silence counts wall time less that wait, read from the vCPU thread's
//! `/proc/PID/task/TID/schedstat` (running ns, waiting ns, slices); a guest spinning or halted
//! for good still runs out its timeout. A wait still going on is added to the count only once
//! it ends, so a runnable vCPU is given four times the timeout before it is judged (a guest
//! spinning for good is still found then); a halted or stopped one is not. Machines without a
//! `vcpu0` thread (QEMU) count wall time, as before.

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The name clowder-vmm gives the thread of the enclave's first vCPU.
const FIRST_VCPU_THREAD: &str = "vcpu0";

/// How many timeouts a runnable vCPU is given (see the module comment).
const RUNNABLE_PATIENCE: u32 = 4;

/// The first vCPU's thread, found on first use.
pub struct FirstVcpu {
    vmm: Option<u32>,
    /// Its `/proc/PID/task/TID` directory.
    task: Option<PathBuf>,
}

impl FirstVcpu {
    pub fn of(vmm: Option<u32>) -> Self {
        FirstVcpu { vmm, task: None }
    }

    fn read(&mut self, file: &str) -> Option<String> {
        if self.task.is_none() {
            self.task = find_thread(self.vmm?, FIRST_VCPU_THREAD);
        }
        std::fs::read_to_string(self.task.as_ref()?.join(file)).ok()
    }

    /// Its total run-queue wait so far; `None` where it cannot be read.
    fn waited(&mut self) -> Option<Duration> {
        run_queue_wait(&self.read("schedstat")?)
    }

    /// Whether it is running or queued to run (state `R`), rather than halted or stopped.
    fn runnable(&mut self) -> bool {
        self.read("stat").is_some_and(|stat| thread_state(&stat) == Some('R'))
    }
}

/// The `/proc/PID/task/TID` directory of `pid`'s thread called `name`.
fn find_thread(pid: u32, name: &str) -> Option<PathBuf> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    tasks
        .flatten()
        .map(|task| task.path())
        .find(|task| std::fs::read_to_string(task.join("comm")).is_ok_and(|comm| comm.trim_end() == name))
}

/// The second field of a `schedstat` line: nanoseconds spent runnable but not running.
fn run_queue_wait(schedstat: &str) -> Option<Duration> {
    let mut fields = schedstat.split_ascii_whitespace();
    let _running = fields.next()?;
    fields.next()?.parse().ok().map(Duration::from_nanos)
}

/// The state letter of a `/proc/.../stat` line, after the parenthesised name (which may hold
/// anything).
fn thread_state(stat: &str) -> Option<char> {
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// A Ping sent and not yet answered.
pub struct PendingPing {
    pub nonce: u64,
    sent: Instant,
    waited_before: Option<Duration>,
}

impl PendingPing {
    pub fn sent(nonce: u64, vcpu: &mut FirstVcpu) -> Self {
        PendingPing { nonce, sent: Instant::now(), waited_before: vcpu.waited() }
    }

    /// The silence that counts, if the enclave has left the Ping unanswered past `timeout`:
    /// wall time less the vCPU's run-queue wait since the Ping (read only once the wall time
    /// passes `timeout`, as it rarely does).
    pub fn unanswered(&self, vcpu: &mut FirstVcpu, timeout: Duration) -> Option<Duration> {
        let elapsed = self.sent.elapsed();
        if elapsed <= timeout {
            return None;
        }
        let silence = judged_silence(elapsed, self.waited_before, vcpu.waited());
        let allowed = if vcpu.runnable() { timeout * RUNNABLE_PATIENCE } else { timeout };
        (silence > allowed).then_some(silence)
    }
}

fn judged_silence(elapsed: Duration, waited_before: Option<Duration>, waited_now: Option<Duration>) -> Duration {
    match (waited_before, waited_now) {
        (Some(before), Some(now)) => elapsed.saturating_sub(now.saturating_sub(before)),
        _ => elapsed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_is_the_second_schedstat_field() {
        assert_eq!(run_queue_wait("123 4500000000 17\n"), Some(Duration::from_millis(4500)));
        assert_eq!(run_queue_wait("123\n"), None);
        assert_eq!(run_queue_wait("123 lots 17"), None);
        assert_eq!(run_queue_wait(""), None);
    }

    #[test]
    fn the_state_follows_the_name_whatever_it_holds() {
        assert_eq!(thread_state("4242 (vcpu0) R 1 2 3"), Some('R'));
        assert_eq!(thread_state("4242 (a) S) (b) T 1"), Some('T'));
        assert_eq!(thread_state("4242 (vcpu0)"), None);
        assert_eq!(thread_state("garbage"), None);
    }

    #[test]
    fn silence_is_wall_time_less_the_wait_since_the_ping() {
        let s = Duration::from_secs;
        // Queued 25 of 31 s: 6 s count.
        assert_eq!(judged_silence(s(31), Some(s(100)), Some(s(125))), s(6));
        // Never queued (spinning on its own core, or halted): all of it counts.
        assert_eq!(judged_silence(s(31), Some(s(100)), Some(s(100))), s(31));
        // Unreadable, or a counter that went backwards: wall time, never more.
        assert_eq!(judged_silence(s(31), None, Some(s(125))), s(31));
        assert_eq!(judged_silence(s(31), Some(s(100)), None), s(31));
        assert_eq!(judged_silence(s(31), Some(s(125)), Some(s(100))), s(31));
        assert_eq!(judged_silence(s(31), Some(s(0)), Some(s(40))), s(0));
    }

    #[test]
    fn a_machine_without_the_thread_counts_wall_time() {
        let mut none = FirstVcpu::of(None);
        assert_eq!((none.waited(), none.runnable()), (None, false));
        let ping = PendingPing { nonce: 1, sent: Instant::now() - Duration::from_secs(2), waited_before: None };
        assert!(ping.unanswered(&mut FirstVcpu::of(Some(std::process::id())), Duration::from_secs(1)).is_some());
        assert_eq!(ping.unanswered(&mut none, Duration::from_secs(3)), None);
    }

    #[test]
    fn this_process_threads_are_found_by_name() {
        let (started_tx, started) = std::sync::mpsc::channel();
        let (end_tx, end) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("ping-test-thr".into())
            .spawn(move || {
                // The thread names itself once it runs.
                started_tx.send(()).unwrap();
                end.recv().unwrap();
            })
            .unwrap();
        started.recv().unwrap();
        let task = find_thread(std::process::id(), "ping-test-thr").expect("the named thread");
        assert!(run_queue_wait(&std::fs::read_to_string(task.join("schedstat")).unwrap()).is_some());
        // Blocked on the channel: sleeping.
        assert_eq!(thread_state(&std::fs::read_to_string(task.join("stat")).unwrap()), Some('S'));
        assert_eq!(find_thread(std::process::id(), "no-such-thread"), None);
        end_tx.send(()).unwrap();
        thread.join().unwrap();
    }
}
