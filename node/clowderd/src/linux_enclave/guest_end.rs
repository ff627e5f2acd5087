//! Why a Linux enclave's machine ended, in the guest's words where it left some.
//!
//! A panicking guest kernel resets itself at once (`panic=-1`) by a triple fault (`reboot=t`:
//! no keyboard-controller or BIOS reset, which this VMM has not), so the VMM reports only "the
//! guest triple-faulted". The console says why just before: Linux prints `Kernel panic - not
//! syncing: REASON` at the highest level, which `quiet` keeps. The enclave's removal reason
//! (`clowder enclave ls`) names that panic.

use std::fs::File;
use std::sync::Arc;
use std::time::Duration;

use crate::console::LogBook;
use crate::machine::{ChannelParts, Machine, RegionAccess, SharedRegion};

/// What Linux prints when it panics.
const PANIC_MARK: &str = "Kernel panic - not syncing: ";
/// How far back in the log to look: a panic prints a backtrace after its line.
const PANIC_LINES: usize = 200;
/// The console's last lines may still be on their way from the ended VMM's pipe.
const CONSOLE_GRACE: Duration = Duration::from_millis(300);

/// The panic of process 1 (the agent) ending with status 0: it returns 0 only after the host's
/// Shutdown, and Linux ends the machine when init ends, so this is the orderly end.
const AGENT_SHUT_DOWN: &str = "Attempted to kill init! exitcode=0x00000000";

/// How the machine ended (`ended`, the VMM's exit), with the guest's panic if its console
/// shows one among `lines`.
pub fn explain(ended: &str, lines: &[String]) -> String {
    let panic = lines.iter().rev().find_map(|line| line.split_once(PANIC_MARK).map(|(_, reason)| reason.trim()));
    match panic {
        Some(AGENT_SHUT_DOWN) => format!("the guest's agent shut down as asked; {ended}"),
        Some(reason) => format!("the guest kernel panicked ({reason}); {ended}"),
        None => ended.to_string(),
    }
}

/// A Linux guest's machine: the VMM's, whose end [`explain`]s itself from the enclave's log.
pub struct LinuxMachine {
    inner: Box<dyn Machine>,
    log: Arc<LogBook>,
    ended: Option<String>,
}

impl LinuxMachine {
    pub fn new(inner: Box<dyn Machine>, log: Arc<LogBook>) -> LinuxMachine {
        LinuxMachine { inner, log, ended: None }
    }

    fn explained(&mut self, ended: String) -> String {
        if !self.log.tail(PANIC_LINES).iter().any(|line| line.contains(PANIC_MARK)) {
            std::thread::sleep(CONSOLE_GRACE);
        }
        let reason = explain(&ended, &self.log.tail(PANIC_LINES));
        self.ended = Some(reason.clone());
        reason
    }
}

impl Machine for LinuxMachine {
    fn pid(&self) -> Option<u32> {
        self.inner.pid()
    }

    fn channel(&mut self) -> Result<ChannelParts, String> {
        self.inner.channel()
    }

    fn add_region(&mut self, file: &File, len: u64) -> Result<SharedRegion, String> {
        self.inner.add_region(file, len)
    }

    fn remove_region(&mut self, slot: u32) -> Result<(), String> {
        self.inner.remove_region(slot)
    }

    fn add_region_range(&mut self, file: &File, offset: u64, len: u64, access: RegionAccess) -> Result<SharedRegion, String> {
        self.inner.add_region_range(file, offset, len, access)
    }

    fn ended(&mut self) -> Option<String> {
        if self.ended.is_none() {
            let ended = self.inner.ended()?;
            return Some(self.explained(ended));
        }
        self.ended.clone()
    }

    fn shut_down(&mut self, grace: Duration) -> String {
        match self.ended() {
            Some(ended) => ended,
            None => self.inner.shut_down(grace),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A VMM that has ended (or not) as told.
    struct Ends(Option<&'static str>);

    impl Machine for Ends {
        fn pid(&self) -> Option<u32> {
            None
        }
        fn channel(&mut self) -> Result<ChannelParts, String> {
            Err("no channel".into())
        }
        fn add_region(&mut self, _: &File, _: u64) -> Result<SharedRegion, String> {
            Err("no regions".into())
        }
        fn remove_region(&mut self, _: u32) -> Result<(), String> {
            Err("no regions".into())
        }
        fn ended(&mut self) -> Option<String> {
            self.0.map(str::to_string)
        }
        fn shut_down(&mut self, _: Duration) -> String {
            self.0.unwrap_or("clowder-vmm stopped on signal 15 (SIGTERM)").to_string()
        }
    }

    const TRIPLE: &str = "the guest triple-faulted (status 125)";

    #[test]
    fn a_panic_on_the_console_is_the_reason() {
        let log = Arc::new(LogBook::new(1000));
        log.push("console: sysrq: Trigger a crash");
        log.push("console: Kernel panic - not syncing: sysrq triggered crash");
        log.push("console: CPU: 0 PID: 57 Comm: panic Not tainted 6.1.192 #1");
        let mut machine = LinuxMachine::new(Box::new(Ends(Some(TRIPLE))), log);
        let reason = machine.ended().unwrap();
        assert_eq!(reason, format!("the guest kernel panicked (sysrq triggered crash); {TRIPLE}"));
        assert_eq!(machine.shut_down(Duration::ZERO), reason, "the same reason once ended");
    }

    #[test]
    fn without_a_panic_the_vmm_says_how_it_ended() {
        let log = Arc::new(LogBook::new(1000));
        log.push("console: clowder-agent: Hello sent");
        let mut machine = LinuxMachine::new(Box::new(Ends(Some("clowder-vmm was killed by signal 9 (SIGKILL)"))), log.clone());
        assert_eq!(machine.ended().unwrap(), "clowder-vmm was killed by signal 9 (SIGKILL)");
        let mut running = LinuxMachine::new(Box::new(Ends(None)), log);
        assert_eq!(running.ended(), None);
        assert_eq!(running.shut_down(Duration::ZERO), "clowder-vmm stopped on signal 15 (SIGTERM)");
    }

    #[test]
    fn the_latest_panic_line_counts() {
        let lines = [
            "console: Kernel panic - not syncing: first".to_string(),
            "console: Kernel panic - not syncing: Attempted to kill init!".to_string(),
        ];
        assert_eq!(explain("x", &lines), "the guest kernel panicked (Attempted to kill init!); x");
        assert_eq!(explain("x", &[]), "x");
    }

    #[test]
    fn the_agent_ending_after_shutdown_is_no_panic_but_its_failure_is() {
        let shut_down = ["console: Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000000".to_string()];
        assert_eq!(explain("x", &shut_down), "the guest's agent shut down as asked; x");
        let failed = ["console: Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000100".to_string()];
        assert_eq!(explain("x", &failed), "the guest kernel panicked (Attempted to kill init! exitcode=0x00000100); x");
    }
}
