//! Touches of revoked placements: how a guest attacher gets SIGBUS with no guest kernel module
//! (docs/xemem-pci.md, "SIGBUS in a guest attacher").
//!
//! An attached placement is backed by memory slots until its segment is revoked (the daemon
//! removes them); from then on a guest access there is an MMIO exit that `WindowHoles`
//! answers with all ones. Such an access from user mode (CPL 3; a guest kernel access, e.g. a
//! `read` of `/dev/mem`, is never acted on) inside a placement the guest still has attached is
//! a touch after revocation: it is queued here and a thread of the VMM reports it to the
//! daemon (`MailboxHost::reporter`), which tells the guest agent, which sends SIGBUS to the
//! processes that attached the placement. The vCPU never waits for that: it gets all ones and
//! goes on, and the signal comes milliseconds later.
//!
//! A guest spinning on a revoked placement exits at every access: reports are limited to one
//! per placement per `REPORT_INTERVAL` (`Limiter`, which the daemon applies again), so the
//! daemon and the agent see at most that many, whatever the guest does.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The least time between two reports of one placement (the guest agent signals each
/// attachment once; a report that finds its attacher signalled already is dropped there).
pub const REPORT_INTERVAL: Duration = Duration::from_millis(100);

/// At most one event per key per `REPORT_INTERVAL`.
#[derive(Debug, Default)]
pub struct Limiter {
    last: HashMap<u64, Instant>,
}

impl Limiter {
    /// Whether an event for `key` at `now` may go on (it is then counted as the last one).
    pub fn allow(&mut self, key: u64, now: Instant) -> bool {
        match self.last.get(&key) {
            Some(&last) if now.saturating_duration_since(last) < REPORT_INTERVAL => false,
            _ => {
                self.last.insert(key, now);
                true
            }
        }
    }

    /// `key` is gone (its placement detached): its history with it.
    pub fn forget(&mut self, key: u64) {
        self.last.remove(&key);
    }
}

/// One touch of a revoked placement, as reported to the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Touch {
    /// The daemon's token for the attachment (`MailboxHost::place`'s answer).
    pub token: u32,
    /// Where the placement starts in the window (what the guest library registered).
    pub window_offset: u64,
}

#[derive(Debug, Clone, Copy)]
struct Placement {
    len: u64,
    touch: Touch,
}

#[derive(Default)]
struct State {
    /// Attached placements by guest-physical address.
    attached: BTreeMap<u64, Placement>,
    limiter: Limiter,
    pending: Vec<Touch>,
}

/// The attached placements, shared by the mailbox (which attaches and detaches them) and the
/// window's holes (which see the touches), and the touches waiting to be reported.
#[derive(Default)]
pub struct Touches {
    state: Mutex<State>,
    wake: Condvar,
}

/// The current privilege level of a user-mode access.
const USER: u8 = 3;

impl Touches {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `len` bytes at `gpa` are attached, at `touch.window_offset` of the window.
    pub fn attached(&self, gpa: u64, len: u64, touch: Touch) {
        self.state().attached.insert(gpa, Placement { len, touch });
    }

    /// The placement at `gpa` was detached.
    pub fn detached(&self, gpa: u64) {
        let mut state = self.state();
        state.attached.remove(&gpa);
        state.limiter.forget(gpa);
    }

    /// A hole access at `gpa` by a vCPU whose privilege level `cpl` gives (asked only inside
    /// an attached placement: it costs an ioctl; `None`, unknown, is not acted on): whether a
    /// report was queued (a user-mode access inside an attached placement, not reported within
    /// `REPORT_INTERVAL`).
    pub fn touched(&self, gpa: u64, cpl: impl FnOnce() -> Option<u8>, now: Instant) -> bool {
        let mut state = self.state();
        let Some((&start, placement)) = state.attached.range(..=gpa).next_back() else { return false };
        let placement = *placement;
        if gpa - start >= placement.len || cpl() != Some(USER) || !state.limiter.allow(start, now) {
            return false;
        }
        state.pending.push(placement.touch);
        self.wake.notify_one();
        true
    }

    /// The touches to report, once there are some (the reporting thread).
    pub fn wait(&self) -> Vec<Touch> {
        let mut state = self.state();
        while state.pending.is_empty() {
            state = self.wake.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        std::mem::take(&mut state.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPA: u64 = 1 << 45;

    #[test]
    fn only_user_mode_touches_inside_attached_placements_are_reported_once_an_interval() {
        let touches = Touches::default();
        let t0 = Instant::now();
        touches.attached(GPA + (2 << 20), 0x3000, Touch { token: 7, window_offset: 2 << 20 });
        let inside = GPA + (2 << 20) + 0x2ff8;
        assert!(!touches.touched(inside, || Some(0), t0), "a kernel-mode access");
        assert!(!touches.touched(inside, || None, t0), "an unknown privilege level");
        assert!(!touches.touched(GPA + (2 << 20) + 0x3000, || Some(3), t0), "past the attachment's length");
        assert!(!touches.touched(GPA + 0x1000, || Some(3), t0), "below any placement");
        assert!(touches.touched(inside, || Some(3), t0));
        assert!(!touches.touched(GPA + (2 << 20), || Some(3), t0 + Duration::from_millis(50)), "within the interval");
        assert!(touches.touched(GPA + (2 << 20), || Some(3), t0 + REPORT_INTERVAL), "after it");
        assert_eq!(touches.wait(), [Touch { token: 7, window_offset: 2 << 20 }; 2]);
        touches.detached(GPA + (2 << 20));
        assert!(!touches.touched(inside, || Some(3), t0 + REPORT_INTERVAL * 3), "detached");
        // Attached again at the same place: reported at once.
        touches.attached(GPA + (2 << 20), 0x1000, Touch { token: 8, window_offset: 2 << 20 });
        assert!(touches.touched(GPA + (2 << 20), || Some(3), t0 + REPORT_INTERVAL * 3));
    }

    #[test]
    fn the_limiter_keeps_each_key_apart() {
        let mut limiter = Limiter::default();
        let t0 = Instant::now();
        assert!(limiter.allow(1, t0));
        assert!(limiter.allow(2, t0), "another key");
        assert!(!limiter.allow(1, t0 + REPORT_INTERVAL / 2));
        assert!(limiter.allow(1, t0 + REPORT_INTERVAL));
        limiter.forget(2);
        assert!(limiter.allow(2, t0 + Duration::from_millis(1)), "forgotten");
    }
}
