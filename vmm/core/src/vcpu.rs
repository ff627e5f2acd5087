//! vCPU setup and the per-vCPU thread: pinned to its host core, it runs KVM_RUN and hands every
//! exit to the hook registry. Pause, resume and stop interrupt KVM_RUN with `immediate_exit` and a
//! signal.

use std::os::fd::AsRawFd;
use std::sync::Arc;

use kvm_bindings::{kvm_fpu, kvm_mp_state, kvm_msr_entry, CpuId, Msrs, KVM_MP_STATE_RUNNABLE};
use kvm_ioctls::{SyncReg, VcpuExit, VcpuFd};

use crate::arch::{cpuid, regs};
use crate::hooks::{Claim, ExitContext, ExitKind, HookRegistry, Outcome, Request};
use crate::stop::{RegisterDump, StopReason};
use crate::vm::{RunState, VmShared};
use crate::VmError;
use crate::{emulate, profile};

const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
const MISC_ENABLE_FAST_STRING: u64 = 1;
const MSR_MTRR_DEF_TYPE: u32 = 0x2ff;
/// MTRRs enabled, default type write-back: without it a Linux guest runs uncached.
const MTRR_ENABLE_WRITE_BACK: u64 = (1 << 11) | 6;
const APIC_LVT_LINT0: usize = 0x350;
const APIC_LVT_LINT1: usize = 0x360;
const APIC_MODE_EXTINT: u32 = 0x7 << 8;
const APIC_MODE_NMI: u32 = 0x4 << 8;
/// Legacy POST-code port: Linux writes it for I/O delays; always ignored.
pub const POST_CODE_PORT: u16 = 0x80;

/// Sets up CPUID, MSRs, FPU, LAPIC and, for vCPUs that start at once, their registers.
pub fn configure(
    vcpu: &VcpuFd,
    index: usize,
    count: usize,
    supported_cpuid: &CpuId,
    start: Option<regs::StartMode>,
    quirks: cpuid::HostQuirks,
) -> Result<(), VmError> {
    let err = |what: &str, e: kvm_ioctls::Error| VmError::Kvm(format!("vCPU {index}: {what}: {e}"));
    let mut cpuid = supported_cpuid.clone();
    cpuid::patch_for_vcpu(cpuid.as_mut_slice(), index as u32, count as u32, quirks);
    vcpu.set_cpuid2(&cpuid).map_err(|e| err("set CPUID", e))?;

    let msrs = Msrs::from_entries(&[
        kvm_msr_entry { index: MSR_IA32_MISC_ENABLE, data: MISC_ENABLE_FAST_STRING, ..Default::default() },
        kvm_msr_entry { index: MSR_MTRR_DEF_TYPE, data: MTRR_ENABLE_WRITE_BACK, ..Default::default() },
    ])
    .expect("two MSRs fit");
    vcpu.set_msrs(&msrs).map_err(|e| err("set MSRs", e))?;
    let fpu = kvm_fpu { fcw: 0x37f, mxcsr: 0x1f80, ..Default::default() };
    vcpu.set_fpu(&fpu).map_err(|e| err("set FPU", e))?;

    let mut lapic = vcpu.get_lapic().map_err(|e| err("get LAPIC", e))?;
    let mut set_lvt = |offset: usize, mode: u32| {
        // kvm_lapic_state holds the registers as C chars (i8): reinterpret each byte.
        let field = &mut lapic.regs[offset..offset + 4];
        let old = u32::from_le_bytes([field[0] as u8, field[1] as u8, field[2] as u8, field[3] as u8]);
        let value = (old & !0x700) | mode;
        for (slot, byte) in field.iter_mut().zip(value.to_le_bytes()) {
            *slot = byte as i8;
        }
    };
    set_lvt(APIC_LVT_LINT0, APIC_MODE_EXTINT);
    set_lvt(APIC_LVT_LINT1, APIC_MODE_NMI);
    vcpu.set_lapic(&lapic).map_err(|e| err("set LAPIC", e))?;

    if let Some(mode) = start {
        let sregs = vcpu.get_sregs().map_err(|e| err("get sregs", e))?;
        vcpu.set_sregs(&regs::special_registers(sregs, mode)).map_err(|e| err("set sregs", e))?;
        vcpu.set_regs(&regs::general_registers(mode)).map_err(|e| err("set regs", e))?;
        if index != 0 {
            // Application processors start waiting for SIPI; these ones start at once.
            vcpu.set_mp_state(kvm_mp_state { mp_state: KVM_MP_STATE_RUNNABLE }).map_err(|e| err("set MP state", e))?;
        }
    }
    Ok(())
}

/// Reads the registers for a failure report (best effort: a dump must never fail the report, so
/// a set that cannot be read shows as zeros).
pub fn register_dump(vcpu: &VcpuFd) -> Box<RegisterDump> {
    let r = vcpu.get_regs().unwrap_or_default();
    let s = vcpu.get_sregs().unwrap_or_default();
    Box::new(RegisterDump {
        rip: r.rip,
        rsp: r.rsp,
        rflags: r.rflags,
        rax: r.rax,
        rbx: r.rbx,
        rcx: r.rcx,
        rdx: r.rdx,
        rsi: r.rsi,
        rdi: r.rdi,
        rbp: r.rbp,
        cr0: s.cr0,
        cr2: s.cr2,
        cr3: s.cr3,
        cr4: s.cr4,
        efer: s.efer,
        cs: s.cs.selector,
        cpl: s.cs.dpl,
    })
}

/// What the kicker needs to interrupt a vCPU thread.
pub struct VcpuKick {
    thread: libc::pthread_t,
    /// `kvm_run.immediate_exit` of this vCPU (the kvm_run page is shared with the kernel).
    immediate_exit: *mut u8,
}

// SAFETY: used only under the VM's kick-table lock, while the owning vCPU thread is alive.
unsafe impl Send for VcpuKick {}

impl VcpuKick {
    /// The kick for the calling thread, which runs `vcpu`.
    pub fn for_current_thread(vcpu: &mut VcpuFd) -> Self {
        // SAFETY: pthread_self has no preconditions.
        let thread = unsafe { libc::pthread_self() };
        VcpuKick { thread, immediate_exit: &mut vcpu.get_kvm_run().immediate_exit as *mut u8 }
    }

    /// Makes the vCPU leave KVM_RUN (or not enter it) and look at the VM state.
    pub fn kick(&self) {
        // SAFETY: the entry is retired (under the same lock the caller holds) before the vCPU
        // thread drops its VcpuFd, so the kvm_run page and the thread are both alive here.
        unsafe {
            std::ptr::write_volatile(self.immediate_exit, 1);
            libc::pthread_kill(self.thread, kick_signal());
        }
    }
}

pub fn kick_signal() -> i32 {
    libc::SIGRTMIN()
}

extern "C" fn ignore_signal(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

/// Installs the do-nothing handler that makes the kick signal interrupt KVM_RUN with EINTR.
pub fn install_kick_handler() -> Result<(), VmError> {
    vmm_sys_util::signal::register_signal_handler(kick_signal(), ignore_signal)
        .map_err(|e| VmError::Kvm(format!("installing the vCPU kick signal handler: {e}")))
}

pub fn pin_to_core(core: usize) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET stays in bounds for core < 1024.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// What the loop does after one exit.
enum ExitAction {
    Continue,
    Stop(StopReason),
    /// The guest is at fault; the loop adds its registers to the report.
    Fault(Failure),
    /// A write to the hypercall port: the arguments are in the registers.
    Hypercall {
        width: usize,
    },
    /// One instruction of an instruction-profile window.
    SingleStep,
}

enum Failure {
    TripleFault,
    /// KVM_EXIT_INTERNAL_ERROR: the details are in kvm_run, read once the exit is released.
    KvmInternal,
    Unhandled(String),
    Device {
        device: String,
        reason: String,
    },
}

/// The vCPU thread body: runs until the VM stops, then returns.
pub fn run_loop(
    mut vcpu: VcpuFd,
    index: usize,
    registry: Arc<HookRegistry>,
    shared: Arc<VmShared>,
    policy: UnhandledPorts,
    memory: vm_memory::GuestMemoryMmap,
) {
    let mut ports = PortState::default();
    // Have KVM copy the general registers into kvm_run on every exit: a hypercall then reads its
    // arguments and writes its result without KVM_GET_REGS/KVM_SET_REGS, which cost ~20 µs each
    // on PVM (the copy itself is ~150 bytes).
    vcpu.set_sync_valid_reg(SyncReg::Register);
    let mut stepping: Option<profile::Stepping> = None;
    let kvm_run = vcpu.get_kvm_run() as *const kvm_bindings::kvm_run;
    let mut efault_retries = 0;
    while shared.wait_runnable() == RunState::Running {
        if stepping.is_none() && shared.profile_requests.is_pending() {
            stepping = profile::start_if_requested(&shared.profile_requests, index, &mut vcpu);
        }
        let ctx = ExitContext { vcpu: index, vcpu_fd: Some(vcpu.as_raw_fd()) };
        let action = match vcpu.run() {
            Ok(exit) => {
                shared.note_first_exit();
                efault_retries = 0;
                // The width of one port access (kvm-ioctls gives only the bytes of all of them).
                // SAFETY: kvm_run is the vCPU's mapped run page; for port exits the io member is
                // the live one, and it is only read here, not aliased by the exit's data slice.
                let io_size = unsafe { (*kvm_run).__bindgen_anon_1.io.size } as usize;
                dispatch(exit, &ctx, &registry, &shared, policy, &mut ports, io_size)
            }
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                vcpu.set_kvm_immediate_exit(0);
                shared.counters.count(index, ExitKind::Interrupted);
                ExitAction::Continue
            }
            // A host file shrank under a run-time region (`memory` module comment): its tail
            // becomes zero pages and the access is retried; any other EFAULT stops the VM.
            Err(e) if e.errno() == libc::EFAULT && retry_after_efault(&mut efault_retries) => ExitAction::Continue,
            Err(e) => ExitAction::Stop(StopReason::Internal { vcpu: Some(index), what: format!("KVM_RUN failed: {e}") }),
        };
        let action = match action {
            ExitAction::Hypercall { width } => hypercall(&mut vcpu, &ctx, &registry, width),
            ExitAction::SingleStep => match stepping.as_mut() {
                Some(window) => {
                    if window.step(&mut vcpu, &memory) {
                        stepping = None;
                    }
                    ExitAction::Continue
                }
                None => ExitAction::Fault(Failure::Unhandled("a debug exit with no instruction profile running".into())),
            },
            ExitAction::Fault(Failure::KvmInternal) if emulation_failed(&mut vcpu) && emulate::carry_out(&mut vcpu, &memory).is_some() => {
                shared.counters.count(index, ExitKind::Emulated);
                ExitAction::Continue
            }
            other => other,
        };
        let reason = match action {
            ExitAction::Continue | ExitAction::Hypercall { .. } | ExitAction::SingleStep => continue,
            ExitAction::Stop(reason) => reason,
            ExitAction::Fault(fault) => {
                let regs = register_dump(&vcpu);
                match fault {
                    Failure::TripleFault => StopReason::TripleFault { vcpu: index, regs },
                    Failure::KvmInternal => internal_error(&mut vcpu, index, regs),
                    Failure::Unhandled(what) => StopReason::UnhandledExit { vcpu: index, what, regs },
                    Failure::Device { device, reason } => StopReason::DeviceError { vcpu: index, device, reason, regs },
                }
            }
        };
        shared.stop(reason);
    }
    shared.retire_kick(index);
    if let Some(window) = stepping {
        window.abandon(&mut vcpu);
    }
    if matches!(shared.stop_reason(), Some(StopReason::Watchdog { .. })) {
        shared.record_watchdog_registers(index, register_dump(&vcpu));
    }
}

/// Whether a failed `KVM_RUN` (EFAULT) may be retried: a tail of a truncated file was covered
/// now (logged), or a moment ago by another vCPU (a few retries, not forever: an EFAULT of
/// another cause while some file is truncated must still stop the VM).
fn retry_after_efault(retries: &mut u32) -> bool {
    let Some(lines) = crate::memory::cover_truncated_files() else { return false };
    for line in &lines {
        log::warn!("{line}");
    }
    *retries = if lines.is_empty() { *retries + 1 } else { 0 };
    *retries <= 3
}

/// What to do with port I/O nobody claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnhandledPorts {
    /// Stop the VM and report it (our own kernels: an unclaimed port is a bug).
    Fail,
    /// Reads return all ones, writes are dropped; each port is logged once (Linux probes
    /// legacy ports that are not there).
    LogOnce,
}

fn run_device(claim: crate::hooks::Claim<'_>, ctx: &ExitContext, request: Request<'_>) -> ExitAction {
    let result = claim.device.lock().unwrap().handle(ctx, request);
    match result {
        Ok(Outcome::Continue) => ExitAction::Continue,
        Ok(Outcome::Stop(reason)) => ExitAction::Stop(reason),
        Err(e) => ExitAction::Fault(Failure::Device { device: claim.name.to_string(), reason: e.0 }),
    }
}

/// A vCPU's memory of the ports it used.
#[derive(Default)]
struct PortState<'r> {
    /// Unclaimed ports already logged (each is logged once).
    reported: std::collections::BTreeSet<u16>,
    /// The last port looked up and its owner: a guest usually hits the same port again (a polled
    /// status register, a data port), and the registry does not change once the VM runs.
    last: Option<(u16, Claim<'r>)>,
}

impl<'r> PortState<'r> {
    /// What an access to a port nobody claims does, under `policy`.
    #[cold]
    fn unclaimed(&mut self, port: u16, write: bool, policy: UnhandledPorts, ctx: &ExitContext) -> ExitAction {
        if policy == UnhandledPorts::Fail {
            let dir = if write { "write to" } else { "read from" };
            return ExitAction::Fault(Failure::Unhandled(format!("{dir} port {port:#x}, which no device claims")));
        }
        if self.reported.insert(port) {
            log::warn!("vCPU {}: ignoring accesses to unclaimed port {port:#x}", ctx.vcpu);
        }
        ExitAction::Continue
    }

    /// The owner of `port`, through the one-entry cache.
    #[inline]
    fn owner(&mut self, registry: &'r HookRegistry, port: u16) -> Option<Claim<'r>> {
        match self.last {
            Some((cached, claim)) if cached == port => Some(claim),
            _ => {
                let claim = registry.port(port)?;
                self.last = Some((port, claim));
                Some(claim)
            }
        }
    }
}

fn dispatch<'r>(
    exit: VcpuExit<'_>,
    ctx: &ExitContext,
    registry: &'r HookRegistry,
    shared: &VmShared,
    policy: UnhandledPorts,
    ports: &mut PortState<'r>,
    io_size: usize,
) -> ExitAction {
    let counters = &shared.counters;
    match exit {
        VcpuExit::IoOut(port, data) => {
            counters.count(ctx.vcpu, ExitKind::PortOut);
            if Some(port) == registry.hypercall_port() {
                counters.count(ctx.vcpu, ExitKind::Hypercall);
                return ExitAction::Hypercall { width: data.len() };
            }
            if port == POST_CODE_PORT {
                return ExitAction::Continue;
            }
            match ports.owner(registry, port) {
                Some(claim) => {
                    let offset = port - base_port(claim.key);
                    // A string instruction (`rep outsb`) carries several accesses in one exit.
                    for element in data.chunks(io_size.min(data.len()).max(1)) {
                        let action = run_device(claim, ctx, Request::PortWrite { offset, data: element });
                        if !matches!(action, ExitAction::Continue) {
                            return action;
                        }
                    }
                    ExitAction::Continue
                }
                None => ports.unclaimed(port, true, policy, ctx),
            }
        }
        VcpuExit::IoIn(port, data) => {
            counters.count(ctx.vcpu, ExitKind::PortIn);
            match ports.owner(registry, port) {
                Some(claim) => {
                    let offset = port - base_port(claim.key);
                    let size = io_size.min(data.len()).max(1);
                    for element in data.chunks_mut(size) {
                        let action = run_device(claim, ctx, Request::PortRead { offset, data: element });
                        if !matches!(action, ExitAction::Continue) {
                            return action;
                        }
                    }
                    ExitAction::Continue
                }
                None => {
                    data.fill(0xff);
                    if port == POST_CODE_PORT {
                        ExitAction::Continue
                    } else {
                        ports.unclaimed(port, false, policy, ctx)
                    }
                }
            }
        }
        VcpuExit::MmioRead(addr, data) => {
            counters.count(ctx.vcpu, ExitKind::MmioRead);
            run_mmio(registry, ctx, addr, ("read", data.len()), |offset| Request::MmioRead { offset, data })
        }
        VcpuExit::MmioWrite(addr, data) => {
            counters.count(ctx.vcpu, ExitKind::MmioWrite);
            run_mmio(registry, ctx, addr, ("write", data.len()), |offset| Request::MmioWrite { offset, data })
        }
        VcpuExit::X86Rdmsr(msr) => {
            counters.count(ctx.vcpu, ExitKind::MsrRead);
            run_msr(registry, ctx, msr.index, msr.error, Request::MsrRead { index: msr.index, value: msr.data })
        }
        VcpuExit::X86Wrmsr(msr) => {
            counters.count(ctx.vcpu, ExitKind::MsrWrite);
            run_msr(registry, ctx, msr.index, msr.error, Request::MsrWrite { index: msr.index, value: msr.data })
        }
        VcpuExit::Hlt => {
            // With the in-kernel LAPIC, HLT only reaches user space if the kernel gave up on it.
            counters.count(ctx.vcpu, ExitKind::Halt);
            ExitAction::Continue
        }
        VcpuExit::Debug(_) => ExitAction::SingleStep,
        VcpuExit::Shutdown => {
            counters.count(ctx.vcpu, ExitKind::Shutdown);
            ExitAction::Fault(Failure::TripleFault)
        }
        VcpuExit::FailEntry(reason, cpu) => {
            counters.count(ctx.vcpu, ExitKind::Other);
            ExitAction::Stop(StopReason::Internal {
                vcpu: Some(ctx.vcpu),
                what: format!("KVM could not enter the guest (hardware reason {reason:#x}, cpu {cpu})"),
            })
        }
        VcpuExit::InternalError => {
            counters.count(ctx.vcpu, ExitKind::Other);
            ExitAction::Fault(Failure::KvmInternal)
        }
        other => {
            counters.count(ctx.vcpu, ExitKind::Other);
            ExitAction::Fault(Failure::Unhandled(format!("exit {other:?}, which the VMM does not implement")))
        }
    }
}

/// Whether the last exit was KVM's emulator giving up on an instruction.
fn emulation_failed(vcpu: &mut VcpuFd) -> bool {
    // SAFETY: called only after KVM_EXIT_INTERNAL_ERROR, so `internal` is the live union member.
    unsafe { vcpu.get_kvm_run().__bindgen_anon_1.internal.suberror == emulate::INTERNAL_ERROR_EMULATION }
}

/// KVM_INTERNAL_ERROR_DELIVERY_EV: an exception occurred while delivering another one.
const INTERNAL_ERROR_DELIVERY: u32 = 3;

/// Classifies KVM_EXIT_INTERNAL_ERROR. A fault while delivering an exception is what a triple
/// fault is on hardware; PVM (where guest kernel code is emulated) reports it this way instead
/// of KVM_EXIT_SHUTDOWN, so both end up as `TripleFault`.
fn internal_error(vcpu: &mut VcpuFd, index: usize, regs: Box<RegisterDump>) -> StopReason {
    // SAFETY: the last exit was KVM_EXIT_INTERNAL_ERROR, so `internal` is the live union member.
    let suberror = unsafe { vcpu.get_kvm_run().__bindgen_anon_1.internal.suberror };
    if suberror == INTERNAL_ERROR_DELIVERY {
        return StopReason::TripleFault { vcpu: index, regs };
    }
    let what = match suberror {
        1 => "KVM could not emulate an instruction".to_string(),
        2 => "KVM met a simultaneous exception".to_string(),
        n => format!("KVM internal error (suberror {n})"),
    };
    StopReason::UnhandledExit { vcpu: index, what, regs }
}

fn base_port(key: crate::hooks::HookKey) -> u16 {
    match key {
        crate::hooks::HookKey::Port { base, .. } => base,
        _ => unreachable!("port lookups return port hooks"),
    }
}

/// Runs the device claiming MMIO address `addr` on `request(offset into its range)`; a fault
/// naming the access (`read` or `write`, and its size) where no device claims the address.
fn run_mmio<'d>(
    registry: &HookRegistry,
    ctx: &ExitContext,
    addr: u64,
    (access, len): (&str, usize),
    request: impl FnOnce(u64) -> Request<'d>,
) -> ExitAction {
    match registry.mmio(addr) {
        Some(claim) => run_device(claim, ctx, request(addr - base_mmio(claim.key))),
        None => ExitAction::Fault(Failure::Unhandled(format!("{len}-byte MMIO {access} at {addr:#x}, which no device claims"))),
    }
}

/// Runs the device hooking MSR `index` on `request`. Only hooked MSRs are filtered to user
/// space: any other is the guest touching an MSR that does not exist, answered (`error`) with
/// #GP, as on hardware.
fn run_msr(registry: &HookRegistry, ctx: &ExitContext, index: u32, error: &mut u8, request: Request<'_>) -> ExitAction {
    match registry.msr(index) {
        Some(claim) => run_device(claim, ctx, request),
        None => {
            *error = 1;
            ExitAction::Continue
        }
    }
}

fn base_mmio(key: crate::hooks::HookKey) -> u64 {
    match key {
        crate::hooks::HookKey::Mmio { base, .. } => base,
        _ => unreachable!("MMIO lookups return MMIO hooks"),
    }
}

/// Decodes a hypercall from the registers (synced into kvm_run at the exit), runs its owner and
/// returns the result in RAX.
fn hypercall(vcpu: &mut VcpuFd, ctx: &ExitContext, registry: &HookRegistry, width: usize) -> ExitAction {
    if width != 4 {
        return ExitAction::Fault(Failure::Device {
            device: "hypercall".into(),
            reason: format!("the hypercall port takes a 4-byte write (out %eax), got {width} bytes"),
        });
    }
    let regs = vcpu.sync_regs().regs;
    let nr = regs.rax as u32;
    let args = [regs.rdi, regs.rsi, regs.r8, regs.r9];
    let mut result: i64 = -(libc::ENOSYS as i64);
    let action = match registry.hypercall(nr) {
        Some(claim) => run_device(claim, ctx, Request::Hypercall { nr, args, result: &mut result }),
        None => ExitAction::Continue,
    };
    vcpu.sync_regs_mut().regs.rax = result as u64;
    vcpu.set_sync_dirty_reg(SyncReg::Register);
    action
}
