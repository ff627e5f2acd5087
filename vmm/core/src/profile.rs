//! Instruction profiling by single-stepping: a window of N guest instructions on one vCPU,
//! classified as kernel (CPL 0) or user (CPL 3), with the number of entries into the kernel.
//! On PVM hosts, where every guest kernel instruction is emulated, this is how a kernel path's
//! length (e.g. a system call's) is measured: kernel instructions per entry.
//!
//! PVM single-steps only guest kernel code (user code runs natively, untraced), so an entry is
//! recognised as the first step after a return to user mode (IRETQ or SYSRETQ); on hardware
//! virtualization user instructions are stepped too and counted as user.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Mutex;

use kvm_bindings::{kvm_guest_debug, KVM_GUESTDBG_ENABLE, KVM_GUESTDBG_SINGLESTEP};
use kvm_ioctls::{SyncReg, VcpuFd};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// Longest window one request may ask for (each step is a VM exit).
pub const MAX_STEPS: u64 = 10_000_000;

/// Kernel instruction addresses reported per profile, the most executed first.
pub const HOT_ADDRESSES: usize = 1024;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstructionProfile {
    pub steps: u64,
    pub kernel: u64,
    pub user: u64,
    /// Transitions from a user-mode instruction to a kernel-mode one (system calls, faults,
    /// interrupts taken in user mode).
    pub kernel_entries: u64,
    /// The kernel instruction addresses stepped most often, with their counts (at most
    /// [`HOT_ADDRESSES`], the most executed first): where a slow kernel path spends its
    /// emulated instructions (symbolise with the kernel's ELF).
    pub hot_kernel_addresses: Vec<(u64, u64)>,
}

impl InstructionProfile {
    /// Kernel instructions per entry into the kernel, if there was any.
    pub fn kernel_per_entry(&self) -> Option<f64> {
        (self.kernel_entries > 0).then(|| self.kernel as f64 / self.kernel_entries as f64)
    }

    /// Keeps the `HOT_ADDRESSES` most counted addresses, ties by address.
    fn set_hot_addresses(&mut self, counts: &std::collections::HashMap<u64, u64>) {
        let mut hot: Vec<(u64, u64)> = counts.iter().map(|(&rip, &count)| (rip, count)).collect();
        hot.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        hot.truncate(HOT_ADDRESSES);
        self.hot_kernel_addresses = hot;
    }

    /// `returned_to_user`: the previous step was an IRETQ/SYSRETQ back to user mode.
    fn record(&mut self, cpl: u8, previous_cpl: Option<u8>, returned_to_user: bool) {
        self.steps += 1;
        if cpl == 0 {
            self.kernel += 1;
            if previous_cpl == Some(3) || returned_to_user {
                self.kernel_entries += 1;
            }
        } else {
            self.user += 1;
        }
    }
}

struct Request {
    vcpu: usize,
    steps: u64,
    reply: Sender<InstructionProfile>,
}

/// One outstanding request at a time, polled by the vCPU threads with a single load.
#[derive(Default)]
pub struct ProfileRequests {
    pending: AtomicBool,
    request: Mutex<Option<Request>>,
}

impl ProfileRequests {
    /// Queues a request; the caller kicks the vCPU and waits on the receiver.
    pub fn submit(&self, vcpu: usize, steps: u64) -> Result<Receiver<InstructionProfile>, String> {
        let mut slot = self.request.lock().unwrap();
        if slot.is_some() {
            return Err("another instruction profile is in progress".into());
        }
        let (reply, receiver) = mpsc::channel();
        *slot = Some(Request { vcpu, steps, reply });
        self.pending.store(true, Ordering::Release);
        Ok(receiver)
    }

    /// Withdraws an unanswered request (the caller timed out).
    pub fn cancel(&self) {
        *self.request.lock().unwrap() = None;
        self.pending.store(false, Ordering::Release);
    }

    /// One load: checked by every vCPU on every exit.
    #[inline]
    pub fn is_pending(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }

    fn take_for(&self, vcpu: usize) -> Option<Request> {
        let mut slot = self.request.lock().unwrap();
        if slot.as_ref().is_some_and(|r| r.vcpu == vcpu) {
            self.pending.store(false, Ordering::Release);
            return slot.take();
        }
        None
    }
}

/// A window being stepped on one vCPU.
pub struct Stepping {
    remaining: u64,
    profile: InstructionProfile,
    previous_cpl: Option<u8>,
    previous_rip: Option<u64>,
    /// Steps per kernel instruction address.
    kernel_rips: std::collections::HashMap<u64, u64>,
    reply: Sender<InstructionProfile>,
}

/// Whether the instruction at `code` returns to user mode: IRETQ (48 cf) or SYSRETQ (48 0f 07).
fn returns_to_user(code: [u8; 3]) -> bool {
    matches!(code, [0x48, 0xcf, _] | [0x48, 0x0f, 0x07])
}

/// The first bytes of the instruction at guest-virtual `rip`, through the vCPU's page tables.
fn code_at(vcpu: &VcpuFd, memory: &GuestMemoryMmap, rip: u64) -> Option<[u8; 3]> {
    let translation = vcpu.translate_gva(rip).ok()?;
    if translation.valid == 0 {
        return None;
    }
    let mut code = [0u8; 3];
    memory.read_slice(&mut code, GuestAddress(translation.physical_address)).ok()?;
    Some(code)
}

fn set_single_step(vcpu: &mut VcpuFd, on: bool) -> Result<(), kvm_ioctls::Error> {
    let control = if on { KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_SINGLESTEP } else { 0 };
    if on {
        vcpu.set_sync_valid_reg(SyncReg::SystemRegister);
    } else {
        vcpu.clear_sync_valid_reg(SyncReg::SystemRegister);
    }
    vcpu.set_guest_debug(&kvm_guest_debug { control, ..Default::default() })
}

/// Starts stepping if a request for this vCPU is waiting.
pub fn start_if_requested(requests: &ProfileRequests, vcpu_index: usize, vcpu: &mut VcpuFd) -> Option<Stepping> {
    let request = requests.take_for(vcpu_index)?;
    set_single_step(vcpu, true).ok()?;
    Some(Stepping {
        remaining: request.steps,
        profile: InstructionProfile::default(),
        previous_cpl: None,
        previous_rip: None,
        kernel_rips: std::collections::HashMap::new(),
        reply: request.reply,
    })
}

impl Stepping {
    /// Accounts one single-step exit; returns true when the window is complete (stepping is
    /// then switched off and the profile sent).
    pub fn step(&mut self, vcpu: &mut VcpuFd, memory: &GuestMemoryMmap) -> bool {
        // The current privilege level is the RPL of CS (synced into kvm_run at each exit).
        let synced = vcpu.sync_regs();
        let cpl = (synced.sregs.cs.selector & 3) as u8;
        let returned_to_user = self.previous_rip.and_then(|rip| code_at(vcpu, memory, rip)).is_some_and(returns_to_user);
        self.profile.record(cpl, self.previous_cpl, returned_to_user);
        if cpl == 0 {
            *self.kernel_rips.entry(synced.regs.rip).or_default() += 1;
        }
        self.previous_cpl = Some(cpl);
        self.previous_rip = Some(synced.regs.rip);
        self.remaining -= 1;
        if self.remaining > 0 {
            return false;
        }
        self.finish(vcpu);
        true
    }

    /// Ends the window early (the VM stops): stepping off, whatever was counted is sent.
    pub fn abandon(mut self, vcpu: &mut VcpuFd) {
        self.finish(vcpu);
    }

    fn finish(&mut self, vcpu: &mut VcpuFd) {
        let _ = set_single_step(vcpu, false);
        self.profile.set_hot_addresses(&self.kernel_rips);
        let _ = self.reply.send(std::mem::take(&mut self.profile));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_count_user_to_kernel_transitions() {
        let mut p = InstructionProfile::default();
        let mut previous = None;
        for cpl in [3, 3, 0, 0, 0, 3, 0, 0, 3] {
            p.record(cpl, previous, false);
            previous = Some(cpl);
        }
        assert_eq!((p.steps, p.kernel, p.user, p.kernel_entries), (9, 5, 4, 2));
        assert_eq!(p.kernel_per_entry(), Some(2.5));
        // Kernel-only stepping (PVM): entries are the steps after a return to user mode.
        p.record(0, Some(0), true);
        assert_eq!(p.kernel_entries, 3);
        assert!(returns_to_user([0x48, 0xcf, 0x00]));
        assert!(returns_to_user([0x48, 0x0f, 0x07]));
        assert!(!returns_to_user([0x48, 0x89, 0xc7]));
        assert_eq!(InstructionProfile::default().kernel_per_entry(), None);
    }

    #[test]
    fn hot_addresses_are_the_most_stepped_first_and_bounded() {
        let mut counts: std::collections::HashMap<u64, u64> = (0..2 * HOT_ADDRESSES as u64).map(|rip| (0x1000 + rip, 1)).collect();
        counts.insert(0xffff_8000, 50);
        counts.insert(0xffff_9000, 70);
        let mut p = InstructionProfile::default();
        p.set_hot_addresses(&counts);
        assert_eq!(p.hot_kernel_addresses.len(), HOT_ADDRESSES);
        assert_eq!(p.hot_kernel_addresses[0], (0xffff_9000, 70));
        assert_eq!(p.hot_kernel_addresses[1], (0xffff_8000, 50));
        assert_eq!(p.hot_kernel_addresses[2], (0x1000, 1), "ties in address order");
    }

    #[test]
    fn one_request_at_a_time_and_only_for_its_vcpu() {
        let requests = ProfileRequests::default();
        let _rx = requests.submit(1, 10).unwrap();
        assert!(requests.submit(0, 10).is_err());
        assert!(requests.take_for(0).is_none());
        assert!(requests.take_for(1).is_some());
        assert!(requests.take_for(1).is_none());
        let _rx = requests.submit(0, 10).unwrap();
        requests.cancel();
        assert!(requests.take_for(0).is_none());
    }
}
