//! The local APIC: only what the kernel needs to start CPUs and to wake an idle one sleeping
//! in HLT. x2APIC mode (MSR access, handled inside KVM) when the CPU has it, else xAPIC
//! through its MMIO page (QEMU TCG), which the caller maps into the physical-memory window.

use super::cpu;
use super::phys;
use core::arch::{asm, global_asm};
use core::sync::atomic::{AtomicU64, Ordering};

pub const WAKE_VECTOR: usize = 0xf0;
/// The scheduler's tick: the TSC-deadline timer, or an IPI from a CPU that queued a thread here.
pub const TICK_VECTOR: usize = 0xf1;
pub const SPURIOUS_VECTOR: usize = 0xff;

const MSR_APIC_BASE: u32 = 0x1b;
const X2APIC_MSR_BASE: u32 = 0x800;
/// Register offsets in the xAPIC page; the x2APIC MSR is 0x800 + offset / 16.
const ID: u32 = 0x20;
const TPR: u32 = 0x80;
const EOI: u32 = 0xb0;
const SPURIOUS: u32 = 0xf0;
const ICR_LOW: u32 = 0x300;
const ICR_HIGH: u32 = 0x310;
const LVT_TIMER: u32 = 0x320;
const TIMER_INITIAL_COUNT: u32 = 0x380;
const TIMER_CURRENT_COUNT: u32 = 0x390;
const TIMER_DIVIDE: u32 = 0x3e0;
const MSR_TSC_DEADLINE: u32 = 0x6e0;

/// Whether the local APIC timer runs in TSC-deadline mode (set once, by CPU 0 first).
static HAS_TSC_DEADLINE: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);
/// Without TSC-deadline mode (QEMU TCG): APIC timer ticks per TSC tick, times 2^32, measured
/// at start-up, to turn deadlines into one-shot counts. 0: no timer.
static APIC_TICKS_PER_TSC: AtomicU64 = AtomicU64::new(0);

/// Measures the APIC timer (divide by 1) against the TSC over 2^20 APIC ticks.
fn calibrate_one_shot_timer() {
    const SPAN: u32 = 1 << 20;
    write(TIMER_DIVIDE, 0b1011);
    write(LVT_TIMER, TICK_VECTOR as u32 | 1 << 16); // one-shot, masked while measuring
    write(TIMER_INITIAL_COUNT, u32::MAX);
    let start = cpu::read_tsc();
    while u32::MAX - read(TIMER_CURRENT_COUNT) < SPAN {
        core::hint::spin_loop();
    }
    let elapsed = (cpu::read_tsc() - start).max(1);
    write(TIMER_INITIAL_COUNT, 0);
    APIC_TICKS_PER_TSC.store(((SPAN as u64) << 32) / elapsed, Ordering::Relaxed);
    write(LVT_TIMER, TICK_VECTOR as u32); // one-shot, unmasked
}

/// 0 in x2APIC mode; else the virtual address of the xAPIC page. Also read by the wake-up
/// handler to acknowledge the interrupt.
#[no_mangle]
static XAPIC_PAGE: AtomicU64 = AtomicU64::new(0);

global_asm!(
    r#"
    .text
    .global wake_interrupt, spurious_interrupt
    /* The wake-up IPI only ends a HLT: acknowledge it and return. */
wake_interrupt:
    push %rax
    push %rcx
    push %rdx
    mov XAPIC_PAGE(%rip), %rax
    test %rax, %rax
    jz 1f
    movl $0, {eoi}(%rax)               /* xAPIC EOI */
    jmp 2f
1:  mov ${eoi_msr}, %ecx              /* x2APIC EOI */
    xor %eax, %eax
    xor %edx, %edx
    wrmsr
2:  pop %rdx
    pop %rcx
    pop %rax
    iretq
spurious_interrupt:
    iretq
"#,
    eoi = const EOI,
    eoi_msr = const X2APIC_MSR_BASE + EOI / 16,
    options(att_syntax)
);

extern "C" {
    static wake_interrupt: u8;
    static spurious_interrupt: u8;
}

pub fn wake_handler() -> u64 {
    &raw const wake_interrupt as u64
}

pub fn spurious_handler() -> u64 {
    &raw const spurious_interrupt as u64
}

fn write(register: u32, value: u32) {
    match XAPIC_PAGE.load(Ordering::Relaxed) {
        0 => cpu::write_msr(X2APIC_MSR_BASE + register / 16, value as u64),
        // SAFETY: the xAPIC page is mapped (see `init_local_apic`); its registers take 32-bit
        // stores.
        page => unsafe { ((page + register as u64) as *mut u32).write_volatile(value) },
    }
}

fn read(register: u32) -> u32 {
    match XAPIC_PAGE.load(Ordering::Relaxed) {
        0 => cpu::read_msr(X2APIC_MSR_BASE + register / 16) as u32,
        // SAFETY: as `write`.
        page => unsafe { ((page + register as u64) as *const u32).read_volatile() },
    }
}

fn send_ipi(destination: u32, command: u32) {
    match XAPIC_PAGE.load(Ordering::Relaxed) {
        0 => cpu::write_msr(X2APIC_MSR_BASE + ICR_LOW / 16, (destination as u64) << 32 | command as u64),
        _ => {
            write(ICR_HIGH, destination << 24);
            write(ICR_LOW, command);
        }
    }
}

/// Where the xAPIC page is (physical), if this CPU has an APIC but no x2APIC: the caller
/// maps it into the physical-memory window before `init_local_apic`.
pub fn xapic_page_needing_a_mapping() -> Option<u64> {
    let features = cpu::cpuid(1, 0);
    (features.ecx & (1 << 21) == 0 && features.edx & (1 << 9) != 0).then(|| cpu::read_msr(MSR_APIC_BASE) & 0xf_ffff_f000)
}

/// Enables this CPU's local APIC (x2APIC mode if it has it); returns its APIC id, or `None`
/// without an APIC (then idle CPUs poll instead of sleeping, and no other CPU starts).
pub fn init_local_apic() -> Option<u32> {
    let features = cpu::cpuid(1, 0);
    if features.ecx & (1 << 21) != 0 {
        cpu::write_msr(MSR_APIC_BASE, cpu::read_msr(MSR_APIC_BASE) | 1 << 11 | 1 << 10);
    // enable, x2APIC
    } else if features.edx & (1 << 9) != 0 {
        XAPIC_PAGE.store(phys::to_virtual(cpu::read_msr(MSR_APIC_BASE) & 0xf_ffff_f000), Ordering::Relaxed);
    } else {
        return None;
    }
    write(SPURIOUS, 0x100 | SPURIOUS_VECTOR as u32); // software enable
    write(TPR, 0);
    if features.ecx & (1 << 24) != 0 {
        write(LVT_TIMER, TICK_VECTOR as u32 | 0b10 << 17); // TSC-deadline mode, disarmed
        HAS_TSC_DEADLINE.store(true, Ordering::Relaxed);
    } else {
        calibrate_one_shot_timer();
    }
    let id = read(ID);
    Some(if XAPIC_PAGE.load(Ordering::Relaxed) == 0 { id } else { id >> 24 })
}

/// Arms this CPU's timer to raise the tick when the TSC reaches `deadline`: TSC-deadline mode
/// when the APIC has it, else a one-shot count converted from TSC ticks.
pub fn arm_timer(deadline: u64) {
    if HAS_TSC_DEADLINE.load(Ordering::Relaxed) {
        cpu::write_msr(MSR_TSC_DEADLINE, deadline.max(1));
    } else {
        let tsc_ticks = deadline.saturating_sub(cpu::read_tsc()) as u128;
        let count = (tsc_ticks * APIC_TICKS_PER_TSC.load(Ordering::Relaxed) as u128) >> 32;
        write(TIMER_INITIAL_COUNT, count.clamp(1, u32::MAX as u128) as u32);
    }
}

pub fn disarm_timer() {
    if HAS_TSC_DEADLINE.load(Ordering::Relaxed) {
        cpu::write_msr(MSR_TSC_DEADLINE, 0);
    } else {
        write(TIMER_INITIAL_COUNT, 0);
    }
}

pub fn end_of_interrupt() {
    write(EOI, 0);
}

/// Sends the tick to the CPU with local APIC id `apic_id`.
pub fn send_tick(apic_id: u32) {
    send_ipi(apic_id, TICK_VECTOR as u32);
}

/// Sends the wake-up IPI to the CPU with local APIC id `apic_id`.
pub fn send_wake(apic_id: u32) {
    send_ipi(apic_id, WAKE_VECTOR as u32);
}

/// Starts every other CPU at the real-mode page `start_page` (INIT, then two STARTUPs, as
/// the MP specification asks), with `wait_us` sleeping between the steps.
pub fn start_other_cpus(start_page: u64, wait_us: impl Fn(u64)) {
    const ALL_BUT_SELF: u32 = 0b11 << 18;
    const ASSERT: u32 = 1 << 14;
    send_ipi(0, ALL_BUT_SELF | ASSERT | 0x500); // INIT
    wait_us(10_000);
    for _ in 0..2 {
        send_ipi(0, ALL_BUT_SELF | ASSERT | 0x600 | start_page as u32); // STARTUP
        wait_us(200);
    }
}

/// Sleeps until an interrupt arrives. Interrupts are off in the kernel, and STI takes effect
/// only after the next instruction, so a wake-up sent after the caller last looked at its
/// queue is still pending at the HLT and ends it at once.
pub fn sleep_until_interrupt() {
    // SAFETY: interrupts are enabled only across HLT; the only sources are the wake-up and
    // spurious vectors, whose handlers preserve every register.
    unsafe { asm!("sti", "hlt", "cli", options(nomem, nostack)) }
}
