//! x86-64 primitives: port I/O, MSRs, the local APIC, the IDT and its entry stubs.

use core::arch::{asm, global_asm};
use core::sync::atomic::{AtomicU32, AtomicU8, Ordering};

pub mod user_mode;

pub use guest_arch::{inb, inl, inw, outb, outl, outw, read_msr, write_msr};

pub fn cpuid(leaf: u32) -> [u32; 4] {
    cpuid_count(leaf, 0)
}

/// CPUID leaf `leaf`, sub-leaf `subleaf`: EAX, EBX, ECX, EDX.
pub fn cpuid_count(leaf: u32, subleaf: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: cpuid has no side effects; rbx is reserved by LLVM, so save it around the call.
    unsafe {
        asm!("mov {save:r}, rbx", "cpuid", "xchg {save:r}, rbx", save = out(reg) b,
             inout("eax") leaf => a, inout("ecx") subleaf => c, out("edx") d, options(nomem, nostack, preserves_flags))
    }
    [a, b, c, d]
}

pub fn halt_forever() -> ! {
    loop {
        // SAFETY: stops this vCPU; nothing wakes it with interrupts off.
        unsafe { asm!("cli", "hlt", options(nomem, nostack)) }
    }
}

/// Enables interrupts and halts until one arrives, as one step (`sti` takes effect after `hlt`
/// has started, so an interrupt pending at this point still wakes us); returns with interrupts
/// off again.
pub fn wait_for_interrupt() {
    // SAFETY: the IDT is loaded before any caller enables interrupts.
    unsafe { asm!("sti", "hlt", "cli", options(nomem, nostack)) }
}

pub fn pause() {
    core::hint::spin_loop();
}

pub fn read_cr3() -> u64 {
    let value: u64;
    // SAFETY: reading a control register.
    unsafe { asm!("mov {}, cr3", out(reg) value, options(nomem, nostack, preserves_flags)) }
    value
}

/// Reloads CR3, flushing every non-global TLB entry.
pub fn flush_tlb() {
    // SAFETY: writes back the same page-table root.
    unsafe { asm!("mov cr3, {}", in(reg) read_cr3(), options(nostack, preserves_flags)) }
}

/// Loads an IDT with limit 0: the next exception cannot be delivered, becomes a double fault
/// that cannot be delivered either, and the processor shuts down (a triple fault).
pub fn triple_fault() -> ! {
    let empty_idt = [0u16; 5];
    // SAFETY: deliberately fatal.
    unsafe { asm!("lidt [{}]", "ud2", in(reg) empty_idt.as_ptr(), options(noreturn)) }
}

// ---------------------------------------------------------------------------------------------
// Local APIC, in xAPIC (MMIO) or x2APIC (MSR) mode, whichever the firmware/VMM left enabled.

const IA32_APIC_BASE: u32 = 0x1b;
const APIC_BASE_X2APIC_ENABLE: u64 = 1 << 10;
const XAPIC_MMIO_BASE: u64 = 0xfee0_0000;
const REGISTER_ID: u32 = 0x20;
const REGISTER_TPR: u32 = 0x80;
const REGISTER_EOI: u32 = 0xb0;
const REGISTER_SPURIOUS: u32 = 0xf0;
const REGISTER_ICR_LOW: u32 = 0x300;
const REGISTER_ICR_HIGH: u32 = 0x310;
const ICR_DELIVERY_PENDING: u32 = 1 << 12;
pub const SPURIOUS_VECTOR: u8 = 0xff;

fn x2apic_enabled() -> bool {
    read_msr(IA32_APIC_BASE) & APIC_BASE_X2APIC_ENABLE != 0
}

fn lapic_read(register: u32) -> u32 {
    if x2apic_enabled() {
        read_msr(0x800 + (register >> 4)) as u32
    } else {
        // SAFETY: the LAPIC page is identity mapped (uncached) by the boot page tables.
        unsafe { core::ptr::read_volatile((XAPIC_MMIO_BASE + u64::from(register)) as *const u32) }
    }
}

fn lapic_write(register: u32, value: u32) {
    if x2apic_enabled() {
        write_msr(0x800 + (register >> 4), u64::from(value));
    } else {
        // SAFETY: as for `lapic_read`.
        unsafe { core::ptr::write_volatile((XAPIC_MMIO_BASE + u64::from(register)) as *mut u32, value) }
    }
}

/// This processor's local APIC id.
pub fn lapic_id() -> u32 {
    let raw = lapic_read(REGISTER_ID);
    if x2apic_enabled() {
        raw
    } else {
        raw >> 24
    }
}

/// The APIC id CPUID reports (leaf 1, EBX[31:24]).
pub fn cpuid_apic_id() -> u32 {
    cpuid(1)[1] >> 24
}

/// Software-enables the LAPIC so it accepts fixed interrupts (the channel's MSI).
pub fn lapic_enable() {
    lapic_write(REGISTER_TPR, 0);
    lapic_write(REGISTER_SPURIOUS, 0x100 | u32::from(SPURIOUS_VECTOR));
}

pub fn lapic_end_of_interrupt() {
    lapic_write(REGISTER_EOI, 0);
}

/// Sends INIT, then two startup IPIs with `vector` (the trampoline's page number), to every
/// processor but this one. In xAPIC mode only (the ABI's `sipi` mode).
pub fn start_other_processors(vector: u8) {
    const ALL_EXCLUDING_SELF: u32 = 0b11 << 18;
    const LEVEL_ASSERT: u32 = 1 << 14;
    const DELIVERY_INIT: u32 = 0b101 << 8;
    const DELIVERY_STARTUP: u32 = 0b110 << 8;
    let send = |command: u32| {
        lapic_write(REGISTER_ICR_HIGH, 0);
        lapic_write(REGISTER_ICR_LOW, command);
        while lapic_read(REGISTER_ICR_LOW) & ICR_DELIVERY_PENDING != 0 {
            pause();
        }
    };
    // Real hardware wants 10 ms after INIT and 200 us between the SIPIs; virtual LAPICs (KVM's,
    // QEMU's) do not, and every delay-loop instruction costs ~0.26 us here, so there are none.
    send(ALL_EXCLUDING_SELF | LEVEL_ASSERT | DELIVERY_INIT);
    send(ALL_EXCLUDING_SELF | LEVEL_ASSERT | DELIVERY_STARTUP | u32::from(vector));
    send(ALL_EXCLUDING_SELF | LEVEL_ASSERT | DELIVERY_STARTUP | u32::from(vector));
}

// ---------------------------------------------------------------------------------------------
// Interrupt descriptor table: the 32 exception vectors report and exit; one device vector (the
// channel's) counts and acknowledges; the spurious vector returns.

#[repr(C, align(16))]
struct Idt([u64; 512]);

static mut IDT: Idt = Idt([0; 512]);
const IDT_UNBUILT: u8 = 0;
const IDT_BUILDING: u8 = 1;
const IDT_READY: u8 = 2;
static IDT_STATE: AtomicU8 = AtomicU8::new(IDT_UNBUILT);
static DEVICE_VECTOR: AtomicU8 = AtomicU8::new(0x40);
/// Interrupts taken on the device vector.
pub static DEVICE_INTERRUPTS: AtomicU32 = AtomicU32::new(0);

extern "C" {
    static exception_stubs: [u8; 32 * EXCEPTION_STUB_SIZE];
    fn device_interrupt_stub();
    fn spurious_interrupt_stub();
}
const EXCEPTION_STUB_SIZE: usize = 16;

fn set_gate(vector: u8, handler: u64) {
    let low = (handler & 0xffff)
        | (0x08 << 16) // kernel code selector
        | (0x8e00 << 32) // present, DPL 0, 64-bit interrupt gate
        | ((handler >> 16) & 0xffff) << 48;
    let high = handler >> 32;
    // SAFETY: only the CPU that won the IDT_BUILDING race writes, before IDT_READY is published;
    // afterwards only `user_mode` replaces two exception gates, on vCPU 0 while the others are
    // halted, with handlers that fall back to the same stubs.
    unsafe {
        let idt = &raw mut IDT;
        (*idt).0[vector as usize * 2] = low;
        (*idt).0[vector as usize * 2 + 1] = high;
    }
}

/// Builds the IDT once (whichever CPU comes first) and loads it on this CPU. `device_vector`
/// gets the counting handler; it must be the same on every call.
pub fn load_idt(device_vector: u8) {
    if IDT_STATE.compare_exchange(IDT_UNBUILT, IDT_BUILDING, Ordering::Acquire, Ordering::Acquire).is_ok() {
        let stubs = (&raw const exception_stubs) as u64;
        for vector in 0..32u8 {
            set_gate(vector, stubs + u64::from(vector) * EXCEPTION_STUB_SIZE as u64);
        }
        DEVICE_VECTOR.store(device_vector, Ordering::Relaxed);
        set_gate(device_vector, device_interrupt_stub as *const () as u64);
        set_gate(SPURIOUS_VECTOR, spurious_interrupt_stub as *const () as u64);
        IDT_STATE.store(IDT_READY, Ordering::Release);
    }
    while IDT_STATE.load(Ordering::Acquire) != IDT_READY {
        pause();
    }
    #[repr(C, packed)]
    struct Descriptor {
        limit: u16,
        base: u64,
    }
    let descriptor = Descriptor { limit: (16 * 256 - 1) as u16, base: (&raw const IDT) as u64 };
    // SAFETY: the table is complete and static.
    unsafe { asm!("lidt [{}]", in(reg) &descriptor, options(readonly, nostack, preserves_flags)) }
}

guest_arch::interrupt_stub!(device_interrupt_stub, device_interrupt);

#[no_mangle]
extern "C" fn device_interrupt() {
    DEVICE_INTERRUPTS.fetch_add(1, Ordering::Relaxed);
    lapic_end_of_interrupt();
}

/// The saved state an exception stub hands over.
#[repr(C)]
struct ExceptionFrame {
    vector: u64,
    error_code: u64,
    rip: u64,
    cs: u64,
    rflags: u64,
    rsp: u64,
    ss: u64,
}

#[no_mangle]
extern "C" fn unexpected_exception(frame: &ExceptionFrame) -> ! {
    crate::println!("testguest: exception {} error {:#x} at rip {:#x} (rsp {:#x})", frame.vector, frame.error_code, frame.rip, frame.rsp);
    crate::hypercall::exit(crate::EXIT_EXCEPTION)
}

global_asm!(
    r#"
    .section .text
    /* One 16-byte stub per exception vector; vectors without a CPU error code push a zero so
       every frame looks alike. */
    .balign 16
    .global exception_stubs
exception_stubs:
    .set vector, 0
    .rept 32
    .balign 16
    .if (vector == 8) || (vector >= 10 && vector <= 14) || (vector == 17) || (vector == 21) || (vector == 29) || (vector == 30)
    .else
    push $0
    .endif
    push $vector
    jmp exception_common
    .set vector, vector + 1
    .endr

exception_common:
    mov %rsp, %rdi
    and $-16, %rsp
    call unexpected_exception
    ud2

    .global spurious_interrupt_stub
spurious_interrupt_stub:
    iretq
"#,
    options(att_syntax)
);
