//! Access to physical memory through the physical-memory window (all RAM and the low 4 GiB,
//! mapped at `PHYSMAP_BASE` by the kernel page tables; the first GiB by the boot tables).

pub const PHYSMAP_BASE: u64 = 0xffff_8000_0000_0000;
/// The kernel image runs at this address plus its physical address.
pub const KERNEL_VMA: u64 = 0xffff_ffff_8000_0000;

pub fn to_virtual(physical: u64) -> u64 {
    PHYSMAP_BASE + physical
}

extern "C" {
    static kernel_phys_start: u8;
    static kernel_phys_end: u8;
}

/// The physical range `[start, end)` the kernel image occupies.
pub fn kernel_image() -> (u64, u64) {
    (&raw const kernel_phys_start as u64, &raw const kernel_phys_end as u64)
}

/// Reads a plain-data value (integers only) from physical memory the boot loader filled in.
pub fn read<T: Copy>(physical: u64) -> T {
    // SAFETY: callers read boot structures inside the mapped window; `T` is plain data, so any
    // bit pattern is valid; unaligned reads are allowed.
    unsafe { core::ptr::read_unaligned(to_virtual(physical) as *const T) }
}

/// Reads a value another agent (the hypervisor) may be writing: never cached or merged.
pub fn read_volatile<T: Copy>(physical: u64) -> T {
    // SAFETY: as `read`, and the caller names a naturally aligned field.
    unsafe { core::ptr::read_volatile(to_virtual(physical) as *const T) }
}

/// A byte view of physical memory that the kernel owns for the lifetime `'a` (a boot module,
/// a region it allocated).
pub fn bytes<'a>(physical: u64, len: usize) -> &'a [u8] {
    // SAFETY: the caller names memory inside the window that nothing writes while viewed.
    unsafe { core::slice::from_raw_parts(to_virtual(physical) as *const u8, len) }
}

/// Mutable byte view of physical memory the kernel owns exclusively (a fresh allocation).
pub fn bytes_mut<'a>(physical: u64, len: usize) -> &'a mut [u8] {
    // SAFETY: as `bytes`, and the caller holds the only reference to this memory.
    unsafe { core::slice::from_raw_parts_mut(to_virtual(physical) as *mut u8, len) }
}

/// An atomic word in physical memory the kernel keeps for good for that word alone (a
/// counter it shares with the host), 8-byte aligned.
pub fn atomic_u64(physical: u64) -> &'static core::sync::atomic::AtomicU64 {
    debug_assert!(physical % 8 == 0);
    // SAFETY: the caller names an aligned word inside the window that is never freed and is
    // only ever accessed atomically; any bit pattern is a valid `AtomicU64`.
    unsafe { &*(to_virtual(physical) as *const core::sync::atomic::AtomicU64) }
}

/// Fills physical memory with zeroes.
pub fn zero(physical: u64, len: usize) {
    bytes_mut(physical, len).fill(0);
}
