//! Four-level x86-64 page tables with 4 KiB and 2 MiB leaves. Tables are reached through the
//! physical-memory window; new tables come from the caller (`TableSource`), already zeroed.

use super::phys;
use super::trap::USER_END;
use core::arch::asm;

pub const PAGE_SIZE: u64 = 4096;
pub const HUGE_PAGE_SIZE: u64 = 2 << 20;

const PRESENT: u64 = 1;
const WRITABLE: u64 = 1 << 1;
const USER: u64 = 1 << 2;
const HUGE: u64 = 1 << 7;
const GLOBAL: u64 = 1 << 8;
const NO_EXECUTE: u64 = 1 << 63;
const ADDRESS_MASK: u64 = 0x000f_ffff_ffff_f000;

/// Access rights of a leaf mapping (reading is always allowed).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Protection {
    pub write: bool,
    pub execute: bool,
}

/// Hands out zeroed 4 KiB pages for page tables.
pub trait TableSource {
    fn allocate_table(&mut self) -> Option<u64>;
}

#[derive(Debug, PartialEq, Eq)]
pub struct OutOfMemory;

pub struct PageTables {
    root: u64,
}

fn entries<'a>(table: u64) -> &'a mut [u64; 512] {
    // SAFETY: `table` is a page-table page owned by one `PageTables` (or the shared kernel
    // half, written only at boot); the window maps it, and the caller holds `&mut PageTables`.
    unsafe { &mut *(phys::to_virtual(table) as *mut [u64; 512]) }
}

fn index(address: u64, level: u32) -> usize {
    ((address >> (12 + 9 * level)) & 511) as usize
}

fn leaf_bits(address: u64, protection: Protection) -> u64 {
    let mut bits = PRESENT;
    if protection.write {
        bits |= WRITABLE;
    }
    if !protection.execute {
        bits |= NO_EXECUTE;
    }
    if address < USER_END {
        bits |= USER;
    } else {
        bits |= GLOBAL;
    }
    bits
}

fn table_bits(address: u64) -> u64 {
    if address < USER_END {
        PRESENT | WRITABLE | USER
    } else {
        PRESENT | WRITABLE
    }
}

extern "C" {
    static boot_pml4: u8;
}

fn has_1g_pages() -> bool {
    super::cpu::cpuid(0x8000_0001, 0).edx & (1 << 26) != 0
}

impl PageTables {
    /// The boot page tables (`boot.rs`), which become the kernel's.
    pub fn boot() -> PageTables {
        // The boot tables sit at low addresses linked at their physical address.
        PageTables { root: &raw const boot_pml4 as u64 }
    }

    /// Maps a kernel window (`[virtual_address, +len)` to `physical`) with 1 GiB pages where
    /// the CPU has them and alignment allows, else 2 MiB pages. Kernel-half only: 1 GiB leaves
    /// are never split or unmapped.
    pub fn map_kernel_window(&mut self, mut virtual_address: u64, mut physical: u64, len: u64, tables: &mut dyn TableSource) -> Result<(), OutOfMemory> {
        const GIB: u64 = 1 << 30;
        let end = virtual_address + len;
        let data = Protection { write: true, execute: false };
        while virtual_address < end {
            let gigabyte_fits = has_1g_pages() && virtual_address % GIB == 0 && physical % GIB == 0 && end - virtual_address >= GIB;
            let step = if gigabyte_fits { GIB } else { (end - virtual_address).min(GIB - virtual_address % GIB) };
            if gigabyte_fits {
                let pointer = &mut entries(self.root)[index(virtual_address, 3)];
                if *pointer & PRESENT == 0 {
                    *pointer = tables.allocate_table().ok_or(OutOfMemory)? | table_bits(virtual_address);
                }
                entries(*pointer & ADDRESS_MASK)[index(virtual_address, 2)] = physical | leaf_bits(virtual_address, data) | HUGE;
            } else {
                self.map(virtual_address, physical, step, data, tables)?;
            }
            virtual_address += step;
            physical += step;
        }
        Ok(())
    }

    /// A user address space sharing `kernel`'s upper half (whose top-level entries are fixed
    /// after boot, so sharing them is enough).
    pub fn new_user(kernel: &PageTables, tables: &mut dyn TableSource) -> Result<PageTables, OutOfMemory> {
        let user = PageTables { root: tables.allocate_table().ok_or(OutOfMemory)? };
        entries(user.root)[256..].copy_from_slice(&entries(kernel.root)[256..]);
        Ok(user)
    }

    pub fn activate(&self) {
        // SAFETY: the tables map the kernel half identically in every address space.
        unsafe { asm!("mov cr3, {}", in(reg) self.root, options(nostack)) }
    }

    /// The page directory covering `address`, created on the way if `tables` is given.
    fn directory(&mut self, address: u64, mut tables: Option<&mut dyn TableSource>) -> Result<Option<u64>, OutOfMemory> {
        let mut table = self.root;
        for level in [3, 2] {
            let entry = &mut entries(table)[index(address, level)];
            if *entry & PRESENT == 0 {
                match tables.as_deref_mut() {
                    Some(source) => *entry = source.allocate_table().ok_or(OutOfMemory)? | table_bits(address),
                    None => return Ok(None),
                }
            }
            table = *entry & ADDRESS_MASK;
        }
        Ok(Some(table))
    }

    /// Replaces a 2 MiB leaf by a table of 512 4 KiB leaves with the same rights.
    fn split(directory_entry: &mut u64, address: u64, tables: &mut dyn TableSource) -> Result<(), OutOfMemory> {
        let table = tables.allocate_table().ok_or(OutOfMemory)?;
        let base = *directory_entry & ADDRESS_MASK & !(HUGE_PAGE_SIZE - 1);
        let rights = *directory_entry & !(ADDRESS_MASK | HUGE);
        for (i, entry) in entries(table).iter_mut().enumerate() {
            *entry = (base + i as u64 * PAGE_SIZE) | rights;
        }
        *directory_entry = table | table_bits(address);
        Ok(())
    }

    /// Maps `[virtual, virtual + len)` to `[physical, ...)`, with 2 MiB pages wherever both
    /// sides are aligned. Both addresses and `len` are page multiples.
    pub fn map(&mut self, mut virtual_address: u64, mut physical: u64, len: u64, protection: Protection, tables: &mut dyn TableSource) -> Result<(), OutOfMemory> {
        let (start, end) = (virtual_address, virtual_address + len);
        // Only replaced translations can be stale in the TLB; fresh ones need no flush.
        let mut replaced = false;
        while virtual_address < end {
            let directory = self.directory(virtual_address, Some(&mut *tables))?.ok_or(OutOfMemory)?;
            let entry = &mut entries(directory)[index(virtual_address, 1)];
            let huge_fits = virtual_address % HUGE_PAGE_SIZE == 0
                && physical % HUGE_PAGE_SIZE == 0
                && end - virtual_address >= HUGE_PAGE_SIZE
                && (*entry & PRESENT == 0 || *entry & HUGE != 0);
            let step = if huge_fits {
                replaced |= *entry & PRESENT != 0;
                *entry = physical | leaf_bits(virtual_address, protection) | HUGE;
                HUGE_PAGE_SIZE
            } else if *entry & PRESENT == 0 {
                // A new table is filled before it is linked: on a shadow-paging host (PVM)
                // writes to a table in use trap, writes to one not yet reachable do not.
                let table = tables.allocate_table().ok_or(OutOfMemory)?;
                let block_end = end.min((virtual_address | (HUGE_PAGE_SIZE - 1)) + 1);
                let leaves = entries(table);
                let mut address = virtual_address;
                while address < block_end {
                    leaves[index(address, 0)] = (physical + (address - virtual_address)) | leaf_bits(address, protection);
                    address += PAGE_SIZE;
                }
                *entry = table | table_bits(virtual_address);
                block_end - virtual_address
            } else {
                if *entry & HUGE != 0 {
                    Self::split(entry, virtual_address, tables)?;
                }
                let leaf = &mut entries(*entry & ADDRESS_MASK)[index(virtual_address, 0)];
                replaced |= *leaf & PRESENT != 0;
                *leaf = physical | leaf_bits(virtual_address, protection);
                PAGE_SIZE
            };
            virtual_address += step;
            physical += step;
        }
        if replaced {
            flush_tlb(start, end - start);
        }
        Ok(())
    }

    /// Removes the mappings of the range (2 MiB pages partly covered are split first).
    pub fn unmap(&mut self, mut virtual_address: u64, len: u64, tables: &mut dyn TableSource) -> Result<(), OutOfMemory> {
        let start = virtual_address;
        let end = virtual_address + len;
        while virtual_address < end {
            let next_huge = (virtual_address | (HUGE_PAGE_SIZE - 1)) + 1;
            let Some(directory) = self.directory(virtual_address, None)? else {
                virtual_address = next_huge;
                continue;
            };
            let entry = &mut entries(directory)[index(virtual_address, 1)];
            if *entry & PRESENT == 0 {
                virtual_address = next_huge;
                continue;
            }
            if *entry & HUGE != 0 {
                if virtual_address % HUGE_PAGE_SIZE == 0 && end >= next_huge {
                    *entry = 0;
                    virtual_address = next_huge;
                    continue;
                }
                Self::split(entry, virtual_address, tables)?;
            }
            entries(*entry & ADDRESS_MASK)[index(virtual_address, 0)] = 0;
            virtual_address += PAGE_SIZE;
        }
        flush_tlb(start, end - start);
        Ok(())
    }
}

/// Drops stale translations of a range of the current address space: page by page for small
/// ranges, the whole (non-global) TLB for large ones.
fn flush_tlb(start: u64, len: u64) {
    if len / PAGE_SIZE > 32 {
        // SAFETY: reloading CR3 with its own value only flushes the TLB.
        unsafe { asm!("mov {tmp}, cr3", "mov cr3, {tmp}", tmp = out(reg) _, options(nostack)) }
    } else {
        let mut address = start;
        while address < start + len {
            // SAFETY: INVLPG only drops a translation.
            unsafe { asm!("invlpg [{}]", in(reg) address, options(nostack)) }
            address += PAGE_SIZE;
        }
    }
}

/// Turns on global pages, so kernel translations survive address-space switches.
pub fn enable_global_pages() {
    // SAFETY: setting CR4.PGE only changes TLB retention.
    unsafe { asm!("mov {tmp}, cr4", "or {tmp}, 0x80", "mov cr4, {tmp}", tmp = out(reg) _, options(nostack)) }
}
