//! What happens on a trap: system calls go to the table, a fault in the job ends the job with
//! Linux's status for the signal it would have received, a fault in the kernel is a panic.

use crate::arch::apic;
use crate::arch::trap::{self, TrapFrame, SIGNAL_CHECK_VECTOR, SYSCALL_VECTOR};
use crate::arch::{cpu, fastcall, fpu};
use crate::console::log;
use crate::{job, sched, signal, syscall};
use core::sync::atomic::{AtomicBool, Ordering};

static RING3_SYSCALL_REPORTED: AtomicBool = AtomicBool::new(false);

const EXCEPTION_NAMES: [&str; 32] = [
    "divide error",
    "debug",
    "NMI",
    "breakpoint",
    "overflow",
    "bound range",
    "invalid opcode",
    "device not available",
    "double fault",
    "coprocessor segment overrun",
    "invalid TSS",
    "segment not present",
    "stack fault",
    "general protection",
    "page fault",
    "reserved",
    "x87 floating point",
    "alignment check",
    "machine check",
    "SIMD floating point",
    "virtualization",
    "control protection",
    "reserved",
    "reserved",
    "reserved",
    "reserved",
    "reserved",
    "reserved",
    "hypervisor injection",
    "VMM communication",
    "security",
    "reserved",
];

/// The signal Linux sends for a user-mode exception, and its name.
fn signal_for(vector: u64) -> (u8, &'static str) {
    match vector {
        0 | 16 | 19 => (8, "SIGFPE"),
        6 => (4, "SIGILL"),
        1 | 3 => (5, "SIGTRAP"),
        17 => (7, "SIGBUS"),
        _ => (11, "SIGSEGV"),
    }
}

/// Whether system calls arrive through the ring-3 SYSCALL page: new address spaces map it.
pub fn ring3_syscall_page_in_use() -> bool {
    RING3_SYSCALL_REPORTED.load(Ordering::Relaxed)
}

pub fn handle(frame: &mut TrapFrame) {
    if fpu::is_stub_frame(frame) {
        return handle_stub_trap(frame);
    }
    if frame.vector == apic::TICK_VECTOR as u64 {
        apic::end_of_interrupt();
        // The tick IPI also carries TLB shootdowns (`sched::shoot_down_user_tlbs`).
        sched::flush_tlb_if_stale();
        syscall::census::count_tick();
        if frame.is_from_user() {
            sched::tick();
        } else {
            sched::tick_missed();
        }
    } else if frame.vector == SIGNAL_CHECK_VECTOR {
        // The short system-call path saw a signal due; the delivery below takes it.
    } else if frame.vector == SYSCALL_VECTOR {
        frame.rax = dispatch_with_frame(frame);
    } else if frame.is_syscall_left_in_ring3() {
        if !RING3_SYSCALL_REPORTED.swap(true, Ordering::Relaxed) {
            log!("SYSCALL stays in ring 3 on this host: system calls arrive as ud2 faults");
            job::map_ring3_syscall_page();
            let scale = crate::clock::tsc_scale();
            fastcall::publish_constants(scale.boot_tsc, scale.multiplier, scale.shift, scale.boot_realtime_ns, &kernel_path_utsname());
        }
        // Each CPU learns it from its own first system call: LSTAR is per CPU.
        trap::redirect_syscall_to_ring3_page();
        frame.return_as_syscall();
        frame.rax = dispatch_with_frame(frame);
    } else if frame.vector == 14 && frame.is_from_user() && frame.error_code & 0b11 == 0b11 && crate::xpmem::copy_on_write(cpu::read_cr2())
    {
        // A store to a page of a snapshot region (XEMEM's TCASM) got its own copy: retried.
    } else if frame.is_from_user() {
        if frame.vector == 14 {
            syscall::census::count_user_fault();
        }
        // A page fault inside an XPMEM attachment (a hole, a removed segment) or past the end
        // of a host file mapped shared (truncated under it) is SIGBUS.
        let address = cpu::read_cr2();
        let bus_error = frame.vector == 14 && (crate::xpmem::is_attachment_fault(address) || job::is_past_shared_file_end(address));
        let (fault_signal, name) = if bus_error { (7, "SIGBUS") } else { signal_for(frame.vector) };
        if !signal::deliver_fault(frame, fault_signal, address) {
            job::kill_for_fault(fault_signal, name, frame);
        }
    } else if !trap::recover_user_copy_fault(frame) {
        kernel_fault(frame);
    }
    if frame.is_from_user() {
        sched::retake_missed_tick();
    }
    if frame.is_from_user() && trap::signal_check_requested() {
        sched::exit_if_doomed();
        signal::deliver_pending(frame);
    }
}

/// A trap from a ring-3 XSAVE stub the kernel is running (`arch::fpu`): a tick is taken
/// later, the first touch of a thread's save area in its process maps it, anything else
/// gives the stub up (its caller sees the failure: a bad signal frame, say).
fn handle_stub_trap(frame: &mut TrapFrame) {
    let cpu = crate::arch::tables::current_cpu();
    if frame.vector == apic::TICK_VECTOR as u64 {
        apic::end_of_interrupt();
        sched::flush_tlb_if_stale();
        fpu::defer_tick(cpu);
        return;
    }
    const PRESENT: u64 = 1;
    let address = cpu::read_cr2();
    // Only an area the kernel asked this stub to use, or the stub page the job unmapped, and
    // only where nothing is mapped.
    if frame.vector == 14 && frame.error_code & PRESENT == 0 {
        let mapped = match fpu::area_slot_of(cpu, address) {
            Some(slot) => job::map_save_area(slot),
            None => address >> 12 == fpu::STUB_PAGE >> 12 && job::map_xstate_stub_page_again(),
        };
        if mapped {
            return;
        }
    }
    fpu::abandon_stub(frame)
}

/// A system call that sees the caller's registers (RIP is already the return address).
fn dispatch_with_frame(frame: &mut TrapFrame) -> u64 {
    let args = [frame.rdi, frame.rsi, frame.rdx, frame.r10, frame.r8, frame.r9];
    syscall::dispatch(frame.rax, &mut syscall::Call { args, frame: Some(frame) })
}

fn kernel_fault(frame: &TrapFrame) -> ! {
    let name = EXCEPTION_NAMES.get(frame.vector as usize).copied().unwrap_or("unknown");
    log!("kernel fault: {} (vector {}, error {:#x}) at rip {:#x}", name, frame.vector, frame.error_code, frame.rip);
    log!("  cr2 {:#018x} cr3 {:#018x} rsp {:#018x} rflags {:#x}", cpu::read_cr2(), cpu::read_cr3(), frame.rsp, frame.rflags);
    log!("  rax {:#018x} rbx {:#018x} rcx {:#018x} rdx {:#018x}", frame.rax, frame.rbx, frame.rcx, frame.rdx);
    log!("  rsi {:#018x} rdi {:#018x} rbp {:#018x} r8  {:#018x}", frame.rsi, frame.rdi, frame.rbp, frame.r8);
    log!("  r9  {:#018x} r10 {:#018x} r11 {:#018x} r12 {:#018x}", frame.r9, frame.r10, frame.r11, frame.r12);
    log!("  r13 {:#018x} r14 {:#018x} r15 {:#018x}", frame.r13, frame.r14, frame.r15);
    panic!("unhandled {} in the kernel", name);
}

/// uname's record as the kernel path gives it, for the ring-3 path to give the same: the call
/// itself writes it into the spare part of the running process's fast-call scratch page.
fn kernel_path_utsname() -> [u8; fastcall::UTSNAME_SIZE] {
    const UNAME: u64 = 63;
    let mut record = [0; fastcall::UTSNAME_SIZE];
    let call = &mut syscall::Call { args: [fastcall::SCRATCH_SPARE, 0, 0, 0, 0, 0], frame: None };
    let written = syscall::dispatch(UNAME, call) == 0 && trap::copy_from_user(&mut record, fastcall::SCRATCH_SPARE).is_ok();
    assert!(written, "uname failed in the fast-call scratch page");
    record
}
