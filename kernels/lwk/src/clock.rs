//! Time without timer interrupts: the TSC counts, its frequency and the wall clock are
//! learnt once at boot: from kvmclock under KVM (no exits after boot), else from CPUID or the
//! PIT, and the CMOS RTC.

use crate::arch::{cpu, phys};
use crate::console::log;
use crate::mm::pmem;
use core::sync::atomic::{AtomicU64, Ordering};

static TSC_HZ: AtomicU64 = AtomicU64::new(1_000_000_000);
/// nanoseconds = (ticks * TSC_MULTIPLIER) >> TSC_SHIFT: a multiplication instead of a 128-bit
/// division on every clock read, and the arithmetic the vDSO repeats in user mode (the two
/// must agree to the nanosecond, or a job mixing both would see time go backwards).
static TSC_MULTIPLIER: AtomicU64 = AtomicU64::new(1 << 32);
static TSC_SHIFT: AtomicU64 = AtomicU64::new(32);
static BOOT_TSC: AtomicU64 = AtomicU64::new(0);
static BOOT_REALTIME_NS: AtomicU64 = AtomicU64::new(0);

const PIT_HZ: u64 = 1_193_182;
const NANOS_PER_SECOND: u64 = 1_000_000_000;

/// TSC frequency from CPUID: leaf 0x15 (crystal ratio), then 0x16 (base MHz), then the
/// hypervisor timing leaf 0x40000010 (kHz) that KVM-based VMMs may fill in.
fn tsc_hz_from_cpuid() -> Option<u64> {
    let max_leaf = cpu::cpuid(0, 0).eax;
    if max_leaf >= 0x15 {
        let leaf = cpu::cpuid(0x15, 0);
        if leaf.eax != 0 && leaf.ebx != 0 && leaf.ecx != 0 {
            return Some(leaf.ecx as u64 * leaf.ebx as u64 / leaf.eax as u64);
        }
    }
    if max_leaf >= 0x16 && cpu::cpuid(0x16, 0).eax != 0 {
        return Some(cpu::cpuid(0x16, 0).eax as u64 * 1_000_000);
    }
    if cpu::cpuid(0x4000_0000, 0).eax >= 0x4000_0010 {
        let khz = cpu::cpuid(0x4000_0010, 0).eax as u64;
        if khz != 0 {
            return Some(khz * 1000);
        }
    }
    None
}

/// Counts TSC ticks over 10 ms of PIT channel 2; `None` if there is no PIT.
fn tsc_hz_from_pit() -> Option<u64> {
    let count = PIT_HZ / 100;
    cpu::outb(0x61, (cpu::inb(0x61) & !0x02) | 0x01); // gate on, speaker off
    cpu::outb(0x43, 0xb0); // channel 2, low then high byte, mode 0
    cpu::outb(0x42, count as u8);
    cpu::outb(0x42, (count >> 8) as u8);
    let start = cpu::read_tsc();
    let mut polls = 0u64;
    while cpu::inb(0x61) & 0x20 == 0 {
        polls += 1;
        if polls > 10_000_000 {
            return None;
        }
    }
    let hz = (cpu::read_tsc() - start) * PIT_HZ / count;
    // An absent PIT reads as all ones: the "done" bit is set at once.
    (hz > 100_000_000).then_some(hz)
}

fn from_bcd(value: u8) -> u64 {
    ((value >> 4) * 10 + (value & 0x0f)) as u64
}

/// Days from 1970-01-01 to the given civil date (proleptic Gregorian).
fn days_from_civil(year: u64, month: u64, day: u64) -> u64 {
    let (year, month) = if month <= 2 { (year - 1, month + 9) } else { (year, month - 3) };
    let era = year / 400;
    let year_of_era = year % 400;
    let day_of_year = (153 * month + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// Seconds since the epoch from the CMOS RTC, if one answers with a plausible date.
fn rtc_seconds() -> Option<u64> {
    let read = |register: u8| {
        cpu::outb(0x70, register);
        cpu::inb(0x71)
    };
    let mut polls = 0;
    while read(0x0a) & 0x80 != 0 {
        polls += 1;
        if polls > 100_000 {
            return None;
        }
    }
    let status_b = read(0x0b);
    let binary = status_b & 0x04 != 0;
    let decode = |value: u8| if binary { value as u64 } else { from_bcd(value) };
    let (second, minute, hour_raw) = (decode(read(0x00)), decode(read(0x02)), read(0x04));
    let (day, month, year) = (decode(read(0x07)), decode(read(0x08)), decode(read(0x09)));
    let mut hour = decode(hour_raw & 0x7f);
    if status_b & 0x02 == 0 && hour_raw & 0x80 != 0 {
        hour = (hour % 12) + 12; // 12-hour mode, PM
    }
    if second > 59 || minute > 59 || hour > 23 || !(1..=31).contains(&day) || !(1..=12).contains(&month) || year > 99 {
        return None;
    }
    Some(days_from_civil(2000 + year, month, day) * 86_400 + hour * 3600 + minute * 60 + second)
}

const MSR_KVM_WALL_CLOCK_NEW: u32 = 0x4b56_4d00;
const MSR_KVM_SYSTEM_TIME_NEW: u32 = 0x4b56_4d01;
const KVM_FEATURE_CLOCKSOURCE2: u32 = 1 << 3;

/// What kvmclock tells: the TSC frequency and the wall time at `tsc`.
struct KvmClock {
    tsc_hz: u64,
    tsc: u64,
    realtime_ns: u64,
}

fn is_kvm() -> bool {
    let signature = cpu::cpuid(0x4000_0000, 0);
    [signature.ebx, signature.ecx, signature.edx] == [0x4b4d_564b, 0x564b_4d56, 0x4d]
    // "KVMKVMKVM"
}

/// Registers a kvmclock page and a wall-clock page (one page each, kept for the kernel's
/// life because KVM may update them) and reads both once.
fn kvm_clock() -> Option<KvmClock> {
    if !is_kvm() || cpu::cpuid(0x4000_0001, 0).eax & KVM_FEATURE_CLOCKSOURCE2 == 0 {
        return None;
    }
    let time_page = pmem::allocate_pages(1)?;
    let wall_page = pmem::allocate_pages(1)?;
    cpu::write_msr(MSR_KVM_SYSTEM_TIME_NEW, time_page | 1);
    cpu::write_msr(MSR_KVM_WALL_CLOCK_NEW, wall_page);
    // struct pvclock_vcpu_time_info: version, pad, tsc_timestamp, system_time,
    // tsc_to_system_mul, tsc_shift; struct pvclock_wall_clock: version, sec, nsec.
    loop {
        let version: u32 = phys::read_volatile(time_page);
        let tsc_timestamp: u64 = phys::read_volatile(time_page + 8);
        let system_time: u64 = phys::read_volatile(time_page + 16);
        let multiplier: u32 = phys::read_volatile(time_page + 24);
        let shift: i8 = phys::read_volatile(time_page + 28);
        let wall_seconds: u32 = phys::read_volatile(wall_page + 4);
        let wall_nanoseconds: u32 = phys::read_volatile(wall_page + 8);
        if version % 2 == 1 || version != phys::read_volatile::<u32>(time_page) || multiplier == 0 {
            continue;
        }
        // ns = ((ticks << shift) * multiplier) >> 32, so ticks per second follow by inversion.
        let mut tsc_hz = (NANOS_PER_SECOND << 32) / multiplier as u64;
        tsc_hz = if shift >= 0 { tsc_hz >> shift } else { tsc_hz << -shift };
        let realtime_ns = wall_seconds as u64 * NANOS_PER_SECOND + wall_nanoseconds as u64 + system_time;
        return Some(KvmClock { tsc_hz, tsc: tsc_timestamp, realtime_ns });
    }
}

/// Records the TSC frequency and the scale derived from it: the largest shift (at most 63)
/// whose multiplier still fits 62 bits, for sub-nanosecond error over days.
fn set_tsc_hz(hz: u64) {
    let hz = hz.max(1);
    let mut shift = 32;
    while shift < 63 && ((NANOS_PER_SECOND as u128) << (shift + 1)) / (hz as u128) < 1 << 62 {
        shift += 1;
    }
    TSC_HZ.store(hz, Ordering::Relaxed);
    TSC_MULTIPLIER.store((((NANOS_PER_SECOND as u128) << shift) / (hz as u128)) as u64, Ordering::Relaxed);
    TSC_SHIFT.store(shift, Ordering::Relaxed);
}

/// What the vDSO needs to compute the clocks in user mode.
pub struct TscScale {
    pub boot_tsc: u64,
    pub multiplier: u64,
    pub shift: u32,
    pub boot_realtime_ns: u64,
}

pub fn tsc_scale() -> TscScale {
    TscScale {
        boot_tsc: BOOT_TSC.load(Ordering::Relaxed),
        multiplier: TSC_MULTIPLIER.load(Ordering::Relaxed),
        shift: TSC_SHIFT.load(Ordering::Relaxed) as u32,
        boot_realtime_ns: BOOT_REALTIME_NS.load(Ordering::Relaxed),
    }
}

/// `may_probe_ports`: false under clowder-vmm, where an access to a port no device claims
/// stops the VM (and there is no RTC).
/// `boot_tsc`: the TSC when the kernel started, the zero of the monotonic clocks.
pub fn init(boot_tsc: u64, may_probe_ports: bool) {
    BOOT_TSC.store(boot_tsc, Ordering::Relaxed);
    if let Some(kvm) = kvm_clock() {
        set_tsc_hz(kvm.tsc_hz);
        let since_reading = (boot_tsc.wrapping_sub(kvm.tsc) as i64 as i128 * NANOS_PER_SECOND as i128 / kvm.tsc_hz as i128) as i64;
        BOOT_REALTIME_NS.store(kvm.realtime_ns.wrapping_add_signed(since_reading), Ordering::Relaxed);
        return;
    }
    let pit = || if may_probe_ports { tsc_hz_from_pit() } else { None };
    match tsc_hz_from_cpuid().or_else(pit) {
        Some(hz) => set_tsc_hz(hz),
        None => log!("no TSC frequency source: assuming 1 GHz"),
    }
    match if may_probe_ports { rtc_seconds() } else { None } {
        Some(seconds) => BOOT_REALTIME_NS.store(seconds * NANOS_PER_SECOND, Ordering::Relaxed),
        None => log!("no real-time clock: wall time starts at the epoch"),
    }
}

/// TSC ticks per second (the scheduler sizes time slices with it).
pub fn tsc_hz() -> u64 {
    TSC_HZ.load(Ordering::Relaxed)
}

pub fn monotonic_ns() -> u64 {
    let ticks = cpu::read_tsc().wrapping_sub(BOOT_TSC.load(Ordering::Relaxed));
    ((ticks as u128 * TSC_MULTIPLIER.load(Ordering::Relaxed) as u128) >> TSC_SHIFT.load(Ordering::Relaxed)) as u64
}

/// Spins for `microseconds` (no timer to sleep on).
pub fn delay_us(microseconds: u64) {
    let until = monotonic_ns() + microseconds * 1000;
    while monotonic_ns() < until {
        core::hint::spin_loop();
    }
}

pub fn realtime_ns() -> u64 {
    BOOT_REALTIME_NS.load(Ordering::Relaxed) + monotonic_ns()
}
