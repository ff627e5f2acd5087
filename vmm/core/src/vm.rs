//! A virtual machine: KVM objects, memory, devices, vCPU threads, and the lifecycle API an
//! embedding program (clowder-vmm, the node daemon) drives: start, pause, resume, stop, wait.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvm_bindings::{kvm_enable_cap, KVM_CAP_X86_USER_SPACE_MSR, KVM_MAX_CPUID_ENTRIES, KVM_MSR_EXIT_REASON_FILTER};
use kvm_ioctls::{Kvm, MsrFilterDefaultAction, MsrFilterRange, MsrFilterRangeFlags, VcpuFd, VmFd};
use vmm_config::{SmpStart, UnclaimedPorts, VmConfig};

use crate::arch::memmap::GuestLayout;
use crate::boot::{self, BootPlan};
use crate::devices::{self, ChannelEndpoint, DeviceEnv, Report};
use crate::hooks::{DeviceHandle, ExitCounters, HookKey, HookRegistry};
use crate::interrupts::InterruptRouter;
use crate::memory::{FileRun, GuestMemory, RegionAccess, RegionInfo};
use crate::profile::{InstructionProfile, ProfileRequests};
use crate::stop::{RegisterDump, StopReason};
use crate::vcpu::{self, UnhandledPorts, VcpuKick};
use crate::VmError;

/// The TSS KVM needs on Intel hosts, placed in the MMIO hole out of the guest's way.
const KVM_TSS_ADDRESS: usize = 0xfffb_d000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunState {
    Created,
    Running,
    Paused,
    Stopping,
}

/// Timestamps and reports the guest produced, for tests and benchmarks.
#[derive(Debug, Default)]
pub struct GuestEvents {
    pub ready_at: Option<Instant>,
    pub first_exit_at: Option<Instant>,
    pub reports: Vec<Report>,
}

/// State the vCPU threads, devices, the watchdog and the owner share.
pub struct VmShared {
    pub counters: ExitCounters,
    pub events: Mutex<GuestEvents>,
    pub created_at: Instant,
    /// The run state and how many vCPUs are parked in `wait_runnable`.
    state: Mutex<(RunState, usize)>,
    /// Mirrors `state == Running` for the lock-free fast path.
    running: AtomicBool,
    state_changed: Condvar,
    stop_reason: Mutex<Option<StopReason>>,
    first_exit_seen: AtomicBool,
    /// One slot per vCPU, filled while its thread runs: kicking a thread after it ended would
    /// signal a dead thread and write into an unmapped kvm_run page.
    kicks: Mutex<Vec<Option<VcpuKick>>>,
    /// Where each vCPU was when the watchdog stopped it: a hung guest makes no exit whose
    /// report could carry its registers.
    watchdog_registers: Mutex<Vec<(usize, Box<RegisterDump>)>>,
    pub profile_requests: ProfileRequests,
}

impl VmShared {
    fn new(vcpus: usize) -> Self {
        VmShared {
            counters: ExitCounters::new(vcpus),
            events: Mutex::new(GuestEvents::default()),
            created_at: Instant::now(),
            state: Mutex::new((RunState::Created, 0)),
            running: AtomicBool::new(false),
            state_changed: Condvar::new(),
            stop_reason: Mutex::new(None),
            first_exit_seen: AtomicBool::new(false),
            kicks: Mutex::new(Vec::new()),
            watchdog_registers: Mutex::new(Vec::new()),
            profile_requests: ProfileRequests::default(),
        }
    }

    /// Called on every exit; the watchdog reads liveness from the exit counters instead of a
    /// clock here, so this stays a single load once the first exit is recorded.
    #[inline]
    pub fn note_first_exit(&self) {
        if !self.first_exit_seen.load(Ordering::Relaxed) {
            self.record_first_exit();
        }
    }

    #[cold]
    fn record_first_exit(&self) {
        if !self.first_exit_seen.swap(true, Ordering::Relaxed) {
            self.events.lock().unwrap().first_exit_at.get_or_insert_with(Instant::now);
        }
    }

    /// Blocks a vCPU thread while the VM is paused; returns the state that let it go.
    #[inline]
    pub fn wait_runnable(&self) -> RunState {
        // Fast path, taken on every exit: no lock while the VM simply runs.
        if self.running.load(Ordering::Acquire) {
            return RunState::Running;
        }
        self.wait_runnable_slow()
    }

    #[cold]
    fn wait_runnable_slow(&self) -> RunState {
        let mut guard = self.state.lock().unwrap();
        loop {
            match guard.0 {
                RunState::Paused | RunState::Created => {
                    guard.1 += 1; // one more vCPU parked
                    self.state_changed.notify_all();
                    guard = self.state_changed.wait(guard).unwrap();
                    guard.1 -= 1;
                }
                state => return state,
            }
        }
    }

    fn kick(&self, vcpu: usize) {
        if let Some(Some(kick)) = self.kicks.lock().unwrap().get(vcpu) {
            kick.kick();
        }
    }

    fn kick_all(&self) {
        for kick in self.kicks.lock().unwrap().iter().flatten() {
            kick.kick();
        }
    }

    pub fn register_kick(&self, vcpu: usize, kick: VcpuKick) {
        let mut kicks = self.kicks.lock().unwrap();
        if kicks.len() <= vcpu {
            kicks.resize_with(vcpu + 1, || None);
        }
        kicks[vcpu] = Some(kick);
    }

    /// Called by a vCPU thread as it leaves its loop: nobody may kick it after this returns.
    pub fn retire_kick(&self, vcpu: usize) {
        if let Some(slot) = self.kicks.lock().unwrap().get_mut(vcpu) {
            *slot = None;
        }
    }

    /// Records the first reason given and stops every vCPU.
    pub fn stop(&self, reason: StopReason) {
        {
            let mut stop = self.stop_reason.lock().unwrap();
            if stop.is_none() {
                *stop = Some(reason);
            }
        }
        let mut guard = self.state.lock().unwrap();
        self.set_state(&mut guard, RunState::Stopping);
        self.state_changed.notify_all();
        drop(guard);
        self.kick_all();
    }

    pub fn state(&self) -> RunState {
        self.state.lock().unwrap().0
    }

    /// Changes the state under its lock and keeps the lock-free mirror in step.
    fn set_state(&self, guard: &mut std::sync::MutexGuard<'_, (RunState, usize)>, state: RunState) {
        guard.0 = state;
        self.running.store(state == RunState::Running, Ordering::Release);
    }

    pub fn stop_reason(&self) -> Option<StopReason> {
        self.stop_reason.lock().unwrap().clone()
    }

    /// Called by each vCPU thread as it leaves its loop after a watchdog stop.
    pub fn record_watchdog_registers(&self, vcpu: usize, registers: Box<RegisterDump>) {
        self.watchdog_registers.lock().unwrap().push((vcpu, registers));
    }

    /// The registers of every vCPU the watchdog stopped, by vCPU index (complete once `wait`
    /// has returned).
    pub fn watchdog_registers(&self) -> Vec<(usize, Box<RegisterDump>)> {
        let mut registers = self.watchdog_registers.lock().unwrap().clone();
        registers.sort_by_key(|(vcpu, _)| *vcpu);
        registers
    }
}

/// A device an embedding program adds beside the configured ones.
pub struct ExtraDevice {
    pub name: String,
    pub keys: Vec<HookKey>,
    pub device: DeviceHandle,
}

/// The parts of a VM that can be shared with other threads (control socket, tests).
pub struct VmHandle {
    pub shared: Arc<VmShared>,
    vm_fd: Arc<VmFd>,
    memory: Mutex<GuestMemory>,
    channel: Option<ChannelEndpoint>,
    registry: Arc<HookRegistry>,
    vcpu_count: usize,
}

impl VmHandle {
    /// Parks every vCPU outside KVM_RUN; returns when all are parked.
    pub fn pause(&self) -> Result<(), VmError> {
        let mut guard = self.shared.state.lock().unwrap();
        match guard.0 {
            RunState::Running => {}
            RunState::Paused => return Ok(()),
            // Not started yet: no vCPU runs guest code, so there is nothing to wait for; `start`
            // then leaves the VM paused until `resume`.
            RunState::Created => {
                self.shared.set_state(&mut guard, RunState::Paused);
                return Ok(());
            }
            RunState::Stopping => return Err(VmError::State("cannot pause a VM that is stopping".into())),
        }
        self.shared.set_state(&mut guard, RunState::Paused);
        drop(guard);
        self.shared.kick_all();
        let mut guard = self.shared.state.lock().unwrap();
        while guard.0 == RunState::Paused && guard.1 < self.vcpu_count {
            guard = self.shared.state_changed.wait(guard).unwrap();
        }
        Ok(())
    }

    pub fn resume(&self) -> Result<(), VmError> {
        let mut guard = self.shared.state.lock().unwrap();
        match guard.0 {
            RunState::Paused => {
                self.shared.set_state(&mut guard, RunState::Running);
                self.shared.state_changed.notify_all();
                Ok(())
            }
            RunState::Running => Ok(()),
            other => Err(VmError::State(format!("cannot resume a VM that is {other:?}"))),
        }
    }

    pub fn stop(&self) {
        self.shared.stop(StopReason::Requested);
    }

    pub fn state(&self) -> RunState {
        self.shared.state()
    }

    /// The RAM memfd: clients map guest memory from it (offset = guest-physical address for low
    /// RAM; see `translate`).
    pub fn memfd(&self) -> RawFd {
        self.memory.lock().unwrap().memfd().as_raw_fd()
    }

    pub fn layout(&self) -> GuestLayout {
        self.memory.lock().unwrap().layout().clone()
    }

    pub fn channel(&self) -> Option<&ChannelEndpoint> {
        self.channel.as_ref()
    }

    pub fn add_region(&self, fd: RawFd, offset: u64, len: u64, gpa: Option<u64>, access: RegionAccess) -> Result<RegionInfo, VmError> {
        Ok(self.memory.lock().unwrap().add_region(&self.vm_fd, fd, offset, len, gpa, access)?)
    }

    /// Maps `pieces` (offset, length) of `fd` end to end as one region (see
    /// [`GuestMemory::add_pieces`]).
    pub fn add_pieces(&self, fd: RawFd, pieces: &[(u64, u64)], gpa: Option<u64>, access: RegionAccess) -> Result<RegionInfo, VmError> {
        Ok(self.memory.lock().unwrap().add_pieces(&self.vm_fd, fd, pieces, gpa, access)?)
    }

    pub fn remove_region(&self, slot: u32) -> Result<RegionInfo, VmError> {
        Ok(self.memory.lock().unwrap().remove_region(&self.vm_fd, slot)?)
    }

    pub fn regions(&self) -> Vec<RegionInfo> {
        self.memory.lock().unwrap().regions()
    }

    /// Host address of a run-time region's mapping in this process.
    pub fn region_host_address(&self, slot: u32) -> Option<*mut u8> {
        self.memory.lock().unwrap().region_host_address(slot)
    }

    /// Runs of (fd, offset, len) behind `[gpa, gpa+len)`. The descriptors belong to the VM and
    /// stay valid while the backing memory does.
    pub fn translate(&self, gpa: u64, len: u64) -> Result<Vec<FileRun>, VmError> {
        Ok(self.memory.lock().unwrap().translate(gpa, len)?)
    }

    /// Copies guest memory out (tests, diagnostics).
    pub fn read_guest(&self, gpa: u64, buf: &mut [u8]) -> Result<(), VmError> {
        use vm_memory::{Bytes, GuestAddress};
        let memory = self.memory.lock().unwrap();
        memory
            .guest_memory()
            .read_slice(buf, GuestAddress(gpa))
            .map_err(|e| VmError::State(format!("reading guest memory at {gpa:#x}: {e}")))
    }

    pub fn exit_counters(&self) -> Vec<(&'static str, u64)> {
        self.shared.counters.snapshot()
    }

    pub fn reports(&self) -> Vec<Report> {
        self.shared.events.lock().unwrap().reports.clone()
    }

    /// Single-steps `steps` instructions of `vcpu` while the guest runs and classifies them
    /// (see `profile`). Waits at most `timeout`.
    pub fn profile_instructions(&self, vcpu: usize, steps: u64, timeout: Duration) -> Result<InstructionProfile, VmError> {
        if vcpu >= self.vcpu_count {
            return Err(VmError::State(format!("no vCPU {vcpu}: the VM has {}", self.vcpu_count)));
        }
        if steps == 0 || steps > crate::profile::MAX_STEPS {
            return Err(VmError::State(format!("steps must be 1 to {}", crate::profile::MAX_STEPS)));
        }
        if self.state() != RunState::Running {
            return Err(VmError::State(format!("cannot profile a VM that is {:?}", self.state())));
        }
        let reply = self.shared.profile_requests.submit(vcpu, steps).map_err(VmError::State)?;
        self.shared.kick(vcpu);
        reply.recv_timeout(timeout).map_err(|_| {
            self.shared.profile_requests.cancel();
            VmError::State(format!("vCPU {vcpu} did not finish {steps} steps within {timeout:?}"))
        })
    }

    /// Every device hook, as (device name, key).
    pub fn hooks(&self) -> Vec<(String, HookKey)> {
        self.registry.all()
    }
}

pub struct Vm {
    handle: Arc<VmHandle>,
    _kvm: Kvm,
    config: VmConfig,
    plan: BootPlan,
    pending_vcpus: Vec<VcpuFd>,
    threads: Vec<JoinHandle<()>>,
    watchdog: Option<JoinHandle<()>>,
}

fn kvm_err(what: &str) -> impl Fn(kvm_ioctls::Error) -> VmError + '_ {
    move |e| VmError::Kvm(format!("{what}: {e}"))
}

vmm_sys_util::ioctl_io_nr!(KVM_REINJECT_CONTROL, kvm_bindings::KVMIO, 0x71);

/// A Linux guest ticks on the PIT (it finds no MP or ACPI table, so it runs in "virtual wire"
/// mode), and on PVM each tick is a few hundred emulated instructions. KVM's PIT replays the
/// ticks a descheduled vCPU missed, so on a loaded host the guest spends its time catching up
/// ticks and the boot stretches, which costs more ticks: turned off, a missed tick is dropped
/// (Linux keeps time from kvm-clock, not by counting ticks). Kept on the PIT rather than the
/// local APIC's TSC-deadline timer on purpose: with an MP table Linux ticks on the LAPIC in
/// one-shot mode, and until it switches to high resolution (kvm-clock, late in the boot) it
/// replays every missed period itself, which on this host at a load of 8 never caught up
/// (docs/linux-guest.md).
fn no_pit_reinjection(vm: &VmFd) -> Result<(), VmError> {
    let control = kvm_bindings::kvm_reinject_control { pit_reinject: 0, ..Default::default() };
    // SAFETY: KVM_REINJECT_CONTROL reads a kvm_reinject_control, which outlives the call.
    let rc = unsafe { vmm_sys_util::ioctl::ioctl_with_ref(vm, KVM_REINJECT_CONTROL(), &control) };
    if rc < 0 {
        return Err(VmError::Kvm(format!("turning off PIT tick re-injection: {}", std::io::Error::last_os_error())));
    }
    Ok(())
}

impl Vm {
    /// Builds a VM from a validated configuration: KVM objects, memory, devices, kernel, vCPUs.
    /// Nothing runs until `start`.
    pub fn new(config: VmConfig) -> Result<Vm, VmError> {
        Self::with_devices(config, Vec::new())
    }

    /// Like `new`, with devices the embedding program provides beside the configured ones.
    pub fn with_devices(config: VmConfig, extra: Vec<ExtraDevice>) -> Result<Vm, VmError> {
        let kvm = Kvm::new().map_err(kvm_err("opening /dev/kvm"))?;
        let vm_fd = kvm.create_vm().map_err(kvm_err("creating the VM"))?;
        vm_fd.set_tss_address(KVM_TSS_ADDRESS).map_err(kvm_err("setting the TSS address"))?;
        vm_fd.create_irq_chip().map_err(kvm_err("creating the in-kernel irqchip"))?;
        vm_fd
            .create_pit2(kvm_bindings::kvm_pit_config { flags: kvm_bindings::KVM_PIT_SPEAKER_DUMMY, ..Default::default() })
            .map_err(kvm_err("creating the PIT"))?;

        let channel_size = config
            .devices
            .iter()
            .find_map(|d| match d.kind {
                vmm_config::DeviceKind::Channel { size, .. } => Some(size),
                _ => None,
            })
            .unwrap_or(0);
        let layout = GuestLayout::new(config.memory.size, channel_size).map_err(|e| VmError::Config(format!("memory.size: {e}")))?;
        let memory = GuestMemory::new(&vm_fd, layout, config.memory.backing)?;

        let shared = Arc::new(VmShared::new(config.vcpus.len()));
        let mut registry = HookRegistry::new();
        let mut interrupts = InterruptRouter::default();
        let mut cmdline_extra = Vec::new();
        let mut channel = None;
        {
            let mut env = DeviceEnv {
                vm: &vm_fd,
                memory: &memory,
                shared: &shared,
                registry: &mut registry,
                interrupts: &mut interrupts,
                cmdline_extra: &mut cmdline_extra,
                channel: &mut channel,
            };
            for device in &config.devices {
                devices::create(device, &mut env)?;
            }
        }
        for extra in extra {
            for key in &extra.keys {
                registry
                    .hook(&extra.name, *key, extra.device.clone())
                    .map_err(|e| VmError::Config(format!("device.{}: {e}", extra.name)))?;
            }
        }
        interrupts.commit(&vm_fd).map_err(kvm_err("setting interrupt routes"))?;
        enable_msr_hooks(&vm_fd, &registry.hooked_msrs())?;
        cmdline_extra.push(format!("clowder.cpus={}", config.vcpus.len()));
        // The smallest piece of RAM the host can share with another VM: a guest kernel that
        // publishes a word for others to read keeps it alone in such a piece.
        cmdline_extra.push(format!("clowder.ram_page={:#x}", config.memory.backing.page_size()));

        let plan = boot::load(&memory, &config.boot, &cmdline_extra)?;
        if plan.linux_guest {
            no_pit_reinjection(&vm_fd)?;
        }
        let supported = kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES).map_err(kvm_err("reading supported CPUID"))?;
        let sipi = config.boot.smp == SmpStart::Sipi;
        let quirks = crate::arch::cpuid::HostQuirks::for_guest(plan.linux_guest);
        let mut vcpus = Vec::with_capacity(config.vcpus.len());
        for index in 0..config.vcpus.len() {
            let vcpu = vm_fd.create_vcpu(index as u64).map_err(|e| VmError::Kvm(format!("creating vCPU {index}: {e}")))?;
            vcpu::configure(&vcpu, index, config.vcpus.len(), &supported, plan.start_mode(index, sipi), quirks)?;
            vcpus.push(vcpu);
        }
        vcpu::install_kick_handler()?;

        let handle = Arc::new(VmHandle {
            shared,
            vm_fd: Arc::new(vm_fd),
            memory: Mutex::new(memory),
            channel,
            registry: Arc::new(registry),
            vcpu_count: config.vcpus.len(),
        });
        Ok(Vm { handle, _kvm: kvm, config, plan, pending_vcpus: vcpus, threads: Vec::new(), watchdog: None })
    }

    pub fn handle(&self) -> Arc<VmHandle> {
        self.handle.clone()
    }

    pub fn boot_plan(&self) -> BootPlan {
        self.plan
    }

    /// Starts one pinned thread per vCPU (and the watchdog, if configured).
    pub fn start(&mut self) -> Result<(), VmError> {
        if self.pending_vcpus.is_empty() {
            return Err(VmError::State("the VM was already started".into()));
        }
        let policy = match (self.config.boot.unclaimed_ports, self.plan.protocol) {
            (UnclaimedPorts::Log, _) => UnhandledPorts::LogOnce,
            (UnclaimedPorts::Auto, _) if self.plan.linux_guest => UnhandledPorts::LogOnce,
            (UnclaimedPorts::Fail, _) | (UnclaimedPorts::Auto, _) => UnhandledPorts::Fail,
        };
        let shared = self.handle.shared.clone();
        for (index, mut vcpu) in self.pending_vcpus.drain(..).enumerate() {
            let core = self.config.vcpus[index].host_core;
            let registry = self.handle.registry.clone();
            let memory = self.handle.memory.lock().unwrap().guest_memory().clone();
            let thread_shared = shared.clone();
            let (ready_tx, ready_rx) = std::sync::mpsc::channel();
            let thread = std::thread::Builder::new()
                .name(format!("vcpu{index}"))
                .spawn(move || {
                    let pinned = core.map(vcpu::pin_to_core).transpose();
                    // Kickable from here until run_loop retires the entry, just before the vCPU
                    // (and its kvm_run page) goes away.
                    thread_shared.register_kick(index, VcpuKick::for_current_thread(&mut vcpu));
                    let _ = ready_tx.send(pinned.map(|_| ()));
                    vcpu::run_loop(vcpu, index, registry, thread_shared, policy, memory);
                })
                .map_err(|e| VmError::State(format!("spawning vCPU thread {index}: {e}")))?;
            if let Ok(Err(e)) = ready_rx.recv() {
                shared.stop(StopReason::Internal { vcpu: Some(index), what: format!("pinning to core {core:?}: {e}") });
            }
            self.threads.push(thread);
        }
        if let Some(timeout_ms) = self.config.watchdog_ms {
            let shared = shared.clone();
            self.watchdog = Some(
                std::thread::Builder::new()
                    .name("watchdog".into())
                    .spawn(move || watchdog(&shared, timeout_ms))
                    .map_err(|e| VmError::State(format!("spawning the watchdog: {e}")))?,
            );
        }
        let mut guard = shared.state.lock().unwrap();
        if guard.0 == RunState::Created {
            shared.set_state(&mut guard, RunState::Running);
        }
        shared.state_changed.notify_all();
        Ok(())
    }

    /// Waits for the VM to stop and returns why. vCPU threads are joined.
    pub fn wait(&mut self) -> StopReason {
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        if let Some(w) = self.watchdog.take() {
            let _ = w.join();
        }
        self.handle.shared.stop_reason().unwrap_or(StopReason::Requested)
    }

    /// Waits at most `timeout`; `None` if the VM is still running then.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<StopReason> {
        let deadline = Instant::now() + timeout;
        while self.handle.shared.state() != RunState::Stopping {
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Some(self.wait())
    }

    pub fn pause(&self) -> Result<(), VmError> {
        self.handle.pause()
    }
    pub fn resume(&self) -> Result<(), VmError> {
        self.handle.resume()
    }
    pub fn stop(&self) {
        self.handle.stop()
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.handle.shared.stop(StopReason::Requested);
            self.wait();
        }
    }
}

/// Ends the VM when no vCPU has taken an exit for `timeout_ms` while it runs. Liveness is the
/// total of the exit counters, so the exit path pays nothing for the watchdog.
fn watchdog(shared: &VmShared, timeout_ms: u64) {
    let tick = Duration::from_millis((timeout_ms / 4).clamp(1, 100));
    let mut last_total = shared.counters.total();
    let mut last_change = Instant::now();
    loop {
        std::thread::sleep(tick);
        let total = shared.counters.total();
        let state = shared.state();
        if state == RunState::Stopping {
            return;
        }
        // Time spent paused does not count against the guest.
        if total != last_total || state != RunState::Running {
            last_total = total;
            last_change = Instant::now();
            continue;
        }
        let silent = last_change.elapsed().as_millis() as u64;
        if silent >= timeout_ms {
            shared.stop(StopReason::Watchdog { silent_ms: silent });
            return;
        }
    }
}

/// Asks KVM to send accesses to the hooked MSRs to user space (KVM_X86_SET_MSR_FILTER denies them
/// in the kernel, and KVM_CAP_X86_USER_SPACE_MSR turns "denied" into a user-space exit).
fn enable_msr_hooks(vm: &VmFd, msrs: &[u32]) -> Result<(), VmError> {
    if msrs.is_empty() {
        return Ok(());
    }
    let cap = kvm_enable_cap { cap: KVM_CAP_X86_USER_SPACE_MSR, args: [KVM_MSR_EXIT_REASON_FILTER as u64, 0, 0, 0], ..Default::default() };
    vm.enable_cap(&cap).map_err(kvm_err("enabling user-space MSR exits"))?;
    let deny = [0u8; 1];
    let ranges: Vec<MsrFilterRange> = msrs
        .iter()
        .map(|&base| MsrFilterRange { flags: MsrFilterRangeFlags::READ | MsrFilterRangeFlags::WRITE, base, msr_count: 1, bitmap: &deny })
        .collect();
    if ranges.len() > kvm_bindings::KVM_MSR_FILTER_MAX_RANGES as usize {
        return Err(VmError::Config(format!(
            "device: {} hooked MSRs, KVM filters at most {}",
            ranges.len(),
            kvm_bindings::KVM_MSR_FILTER_MAX_RANGES
        )));
    }
    vm.set_msr_filter(MsrFilterDefaultAction::ALLOW, &ranges).map_err(kvm_err("setting the MSR filter"))
}
