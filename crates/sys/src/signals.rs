//! SIGTERM and SIGINT for a process that tears itself down on them: blocked everywhere, taken by
//! one waiting thread (rustix offers no sigwait).

/// SIGTERM and SIGINT, blocked in the thread that called [`TerminationSignals::block`] and
/// every thread started after it, so only [`TerminationSignals::wait`] receives them.
pub struct TerminationSignals(libc::sigset_t);

impl TerminationSignals {
    /// Blocks the two signals; call it before starting any thread.
    pub fn block() -> Self {
        // SAFETY: plain signal-mask manipulation on a zeroed set we own.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            Self(set)
        }
    }

    /// Waits for one of the two signals and returns its number; None if the wait failed.
    pub fn wait(&self) -> Option<i32> {
        let mut signal = 0;
        // SAFETY: waits on the set blocked in every thread; writes only `signal`.
        (unsafe { libc::sigwait(&self.0, &mut signal) } == 0).then_some(signal)
    }
}
