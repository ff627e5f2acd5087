//! The Ping the daemon waits on, judged by the time the enclave could have answered it.
//!
//! A vCPU thread is at any moment running, waiting on a host run queue, or sleeping (a halted
//! guest). Only the waiting is the host's fault: on a host loaded far past its cores (CI beside
//! other work, where a guest's kernel work is emulated at a fraction of its idle speed) the
//! first vCPU, which answers Ping, can spend most of 30 s queued, and a live enclave was removed
//! as hung. So the silence judged leaves that wait out, from the vCPU thread's
//! `/proc/PID/task/TID/schedstat` (running ns, waiting ns, slices) and its state:
//! - runnable now (running or queued; a queued stretch reaches schedstat only once it ends):
//!   the time it ran since the Ping, against four timeouts, since a loaded host emulates the
//!   guest's kernel work slower than its share of a core alone explains; a guest spinning for
//!   good is found then;
//! - halted or stopped: wall time less the waits since the Ping, against the timeout.
//!
//! Machines without a `vcpu0` thread (QEMU) count wall time, as before.

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The name clowder-vmm gives the thread of the enclave's first vCPU.
const FIRST_VCPU_THREAD: &str = "vcpu0";

/// How many timeouts a runnable vCPU may run without answering (see the module comment).
const RUNNABLE_PATIENCE: u32 = 4;

/// The first vCPU's thread, found on first use.
pub struct FirstVcpu {
    vmm: Option<u32>,
    /// Its `/proc/PID/task/TID` directory.
    task: Option<PathBuf>,
}

/// What `schedstat` says of a thread so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Schedule {
    ran: Duration,
    waited: Duration,
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

    fn schedule(&mut self) -> Option<Schedule> {
        parse_schedstat(&self.read("schedstat")?)
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

/// A `schedstat` line: nanoseconds running, nanoseconds runnable but not running, slices.
fn parse_schedstat(schedstat: &str) -> Option<Schedule> {
    let mut fields = schedstat.split_ascii_whitespace().map(|field| field.parse().ok().map(Duration::from_nanos));
    Some(Schedule { ran: fields.next()??, waited: fields.next()?? })
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
    before: Option<Schedule>,
}

impl PendingPing {
    pub fn sent(nonce: u64, vcpu: &mut FirstVcpu) -> Self {
        PendingPing { nonce, sent: Instant::now(), before: vcpu.schedule() }
    }

    /// The silence that counts, if the enclave has left the Ping unanswered past `timeout`
    /// (the vCPU is read only once the wall time passes it, as it rarely does).
    pub fn unanswered(&self, vcpu: &mut FirstVcpu, timeout: Duration) -> Option<Duration> {
        let elapsed = self.sent.elapsed();
        if elapsed <= timeout {
            return None;
        }
        let now = vcpu.schedule();
        let runnable = now.is_some() && vcpu.runnable();
        judge(elapsed, self.before, now, runnable, timeout)
    }
}

/// The silence of a Ping `elapsed` ago, if it is too long (the module comment's rules).
fn judge(elapsed: Duration, before: Option<Schedule>, now: Option<Schedule>, runnable: bool, timeout: Duration) -> Option<Duration> {
    let (silence, allowed) = match (before, now) {
        (Some(before), Some(now)) if runnable => (now.ran.saturating_sub(before.ran), timeout * RUNNABLE_PATIENCE),
        (Some(before), Some(now)) => (elapsed.saturating_sub(now.waited.saturating_sub(before.waited)), timeout),
        _ => (elapsed, timeout),
    };
    (silence > allowed).then_some(silence)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(ran: u64, waited: u64) -> Option<Schedule> {
        Some(Schedule { ran: Duration::from_secs(ran), waited: Duration::from_secs(waited) })
    }

    #[test]
    fn schedstat_is_running_then_waiting() {
        assert_eq!(
            parse_schedstat("2000000000 4500000000 17\n"),
            Some(Schedule { ran: Duration::from_secs(2), waited: Duration::from_millis(4500) })
        );
        assert_eq!(parse_schedstat("123\n"), None);
        assert_eq!(parse_schedstat("123 lots 17"), None);
        assert_eq!(parse_schedstat(""), None);
    }

    #[test]
    fn the_state_follows_the_name_whatever_it_holds() {
        assert_eq!(thread_state("4242 (vcpu0) R 1 2 3"), Some('R'));
        assert_eq!(thread_state("4242 (a) S) (b) T 1"), Some('T'));
        assert_eq!(thread_state("4242 (vcpu0)"), None);
        assert_eq!(thread_state("garbage"), None);
    }

    #[test]
    fn a_runnable_vcpu_is_judged_by_the_time_it_ran() {
        let s = Duration::from_secs;
        let timeout = s(30);
        // 200 s mostly queued, 40 s of it running: slow, not hung.
        assert_eq!(judge(s(200), schedule(10, 100), schedule(50, 250), true, timeout), None);
        // Running 121 s without answering: hung (a guest spinning for good).
        assert_eq!(judge(s(130), schedule(10, 100), schedule(131, 100), true, timeout), Some(s(121)));
    }

    #[test]
    fn a_halted_or_stopped_vcpu_is_judged_by_wall_time_less_its_waits() {
        let s = Duration::from_secs;
        let timeout = s(30);
        // Queued 25 of 50 s, then halted: 25 s count.
        assert_eq!(judge(s(50), schedule(10, 100), schedule(11, 125), false, timeout), None);
        // Never queued (halted or stopped for good): all of it counts.
        assert_eq!(judge(s(31), schedule(10, 100), schedule(10, 100), false, timeout), Some(s(31)));
        // A counter that went backwards is never more than wall time.
        assert_eq!(judge(s(31), schedule(10, 125), schedule(10, 100), false, timeout), Some(s(31)));
    }

    #[test]
    fn without_the_thread_wall_time_counts() {
        let s = Duration::from_secs;
        assert_eq!(judge(s(31), None, schedule(10, 100), true, s(30)), Some(s(31)));
        assert_eq!(judge(s(31), schedule(10, 100), None, false, s(30)), Some(s(31)));
        let mut none = FirstVcpu::of(None);
        assert_eq!((none.schedule(), none.runnable()), (None, false));
        let ping = PendingPing { nonce: 1, sent: Instant::now() - s(2), before: None };
        assert!(ping.unanswered(&mut FirstVcpu::of(Some(std::process::id())), s(1)).is_some());
        assert_eq!(ping.unanswered(&mut none, s(3)), None);
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
        assert!(parse_schedstat(&std::fs::read_to_string(task.join("schedstat")).unwrap()).is_some());
        // Once blocked on the channel (it may still be on its way there): sleeping.
        let state = || thread_state(&std::fs::read_to_string(task.join("stat")).unwrap());
        let deadline = Instant::now() + Duration::from_secs(10);
        while state() != Some('S') && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(state(), Some('S'));
        assert_eq!(find_thread(std::process::id(), "no-such-thread"), None);
        end_tx.send(()).unwrap();
        thread.join().unwrap();
    }
}
