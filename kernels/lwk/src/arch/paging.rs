//! Four-level x86-64 page tables with 4 KiB and 2 MiB leaves. Tables are reached through the
//! physical-memory window; new tables come from the caller (`TableSource`), already zeroed.

use super::phys;
use super::trap::USER_END;
use core::arch::asm;

pub const PAGE_SIZE: u64 = 4096;
pub const HUGE_PAGE_SIZE: u64 = 2 << 20;
/// Where a page directory is put together before it is copied into its table in one go:
/// under PVM every kernel load and store is emulated (microseconds each), a string copy of a
/// whole table costs about as much as a handful of single accesses, and a table page may be
/// one the host tracks (each single store to it trapping).
static STAGING: super::sync::SpinLock<[u64; 512]> = super::sync::SpinLock::new([0; 512]);

/// Whether every word is zero, with one string instruction (`repe scasq`) rather than a load
/// per word (see [`STAGING`]).
fn all_zero(words: &[u64]) -> bool {
    let Some(last) = words.last() else { return true };
    let left: usize;
    // SAFETY: scans `words.len()` words from `words`, reading only; the direction flag is
    // clear (the ABI's state); RDI and RCX are declared clobbered.
    unsafe {
        asm!("repe scasq", inout("rcx") words.len() => left, inout("rdi") words.as_ptr() => _, in("rax") 0u64, options(nostack, readonly));
    }
    // The scan stops after the first non-zero word, or after the last word either way.
    left == 0 && *last == 0
}

/// Fills `words` with `first`, `first + step`, `first + 2 * step` ...: a store and an add a
/// word, eight words a round. Under PVM each kernel instruction is emulated (about 1 us), so
/// the loop's length is its cost: the compiler's loop took seven instructions a word, 3.5 ms
/// for the 512 entries of a directory of 2 MiB leaves.
fn fill_progression(words: &mut [u64], first: u64, step: u64) {
    let rounds = words.len() / 8;
    let mut value = first;
    let mut at = words.as_mut_ptr();
    if rounds > 0 {
        // SAFETY: writes `rounds * 8` words from `at`, all inside `words`; `at` and `value`
        // come back advanced past them.
        unsafe {
            asm!(
                "2:",
                "mov [{at}], {value}", "add {value}, {step}",
                "mov [{at} + 8], {value}", "add {value}, {step}",
                "mov [{at} + 16], {value}", "add {value}, {step}",
                "mov [{at} + 24], {value}", "add {value}, {step}",
                "mov [{at} + 32], {value}", "add {value}, {step}",
                "mov [{at} + 40], {value}", "add {value}, {step}",
                "mov [{at} + 48], {value}", "add {value}, {step}",
                "mov [{at} + 56], {value}", "add {value}, {step}",
                "add {at}, 64",
                "dec {rounds}",
                "jnz 2b",
                at = inout(reg) at,
                value = inout(reg) value,
                step = in(reg) step,
                rounds = inout(reg) rounds => _,
                options(nostack),
            );
        }
    }
    for slot in 0..words.len() % 8 {
        // SAFETY: the last `len % 8` words of `words`, after the rounds above.
        unsafe { at.add(slot).write(value.wrapping_add(step.wrapping_mul(slot as u64))) };
    }
}

/// What one page directory (a page-directory-pointer entry) covers.
const DIRECTORY_SPAN: u64 = 1 << 30;

const PRESENT: u64 = 1;
const WRITABLE: u64 = 1 << 1;
const USER: u64 = 1 << 2;
const ACCESSED: u64 = 1 << 5;
const DIRTY: u64 = 1 << 6;
const HUGE: u64 = 1 << 7;
const GLOBAL: u64 = 1 << 8;
const NO_EXECUTE: u64 = 1 << 63;
const ADDRESS_MASK: u64 = 0x000f_ffff_ffff_f000;
/// A software bit of a page-directory-pointer entry (the MMU ignores it there): the directory
/// under it is a shared directory of 2 MiB leaves (`TableSource::leaf_directory`), linked
/// into any number of address spaces and never edited nor freed. A change inside its GiB
/// first gives the address space its own copy ([`PageTables::unshare`]).
const SHARED_DIRECTORY: u64 = 1 << 9;

/// What a shared directory holds: 2 MiB leaves `first`, `first + 2 MiB`, ... in entries
/// `from..to`, nothing in the others (a whole GiB's mapping, or the only one in its GiB).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeafBlocks {
    pub first: u64,
    pub from: usize,
    pub to: usize,
}

/// Access rights of a leaf mapping (reading is always allowed).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Protection {
    pub write: bool,
    pub execute: bool,
}

/// Hands out zeroed 4 KiB pages for page tables, and takes back tables no longer linked.
pub trait TableSource {
    fn allocate_table(&mut self) -> Option<u64>;
    /// `table` is unlinked, but may still be walked by another CPU until its next TLB flush.
    fn retire_table(&mut self, table: u64);
    /// A directory holding `blocks` (see [`fill_leaf_directory`]) that is never edited nor
    /// freed, for every address space that maps them that way: linking it is one table write
    /// where building one is up to 512 (each emulated on PVM). `None` when the source keeps none.
    fn leaf_directory(&mut self, _blocks: LeafBlocks) -> Option<u64> {
        None
    }
    /// What the shared directory `directory` (one `leaf_directory` gave) holds.
    fn leaf_blocks(&mut self, _directory: u64) -> Option<LeafBlocks> {
        None
    }
}

/// Fills the zeroed table `directory` with `blocks` (a directory for
/// `TableSource::leaf_directory`; `directory` must not be linked yet).
pub fn fill_leaf_directory(directory: u64, blocks: LeafBlocks) {
    fill_progression(&mut entries(directory)[blocks.from..blocks.to], blocks.first, HUGE_PAGE_SIZE);
}

#[derive(Debug, PartialEq, Eq)]
pub struct OutOfMemory;

/// One user address looked up in the page tables (`PageTables::translate`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Translation {
    pub physical: u64,
    pub writable: bool,
    pub bytes_left_in_leaf: u64,
}

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

/// Whether the CPU maps 1 GiB pages (asked once: CPUID exits to the VMM).
fn has_1g_pages() -> bool {
    use core::sync::atomic::{AtomicU8, Ordering};
    static KNOWN: AtomicU8 = AtomicU8::new(0); // 0: not asked yet, 1: no, 2: yes
    match KNOWN.load(Ordering::Relaxed) {
        0 => {
            let has = super::cpu::cpuid(0x8000_0001, 0).edx & (1 << 26) != 0;
            KNOWN.store(if has { 2 } else { 1 }, Ordering::Relaxed);
            has
        }
        known => known == 2,
    }
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
    pub fn map_kernel_window(
        &mut self,
        mut virtual_address: u64,
        mut physical: u64,
        len: u64,
        tables: &mut dyn TableSource,
    ) -> Result<(), OutOfMemory> {
        const GIB: u64 = 1 << 30;
        let end = virtual_address + len;
        let data = Protection { write: true, execute: false };
        while virtual_address < end {
            let gigabyte_fits =
                has_1g_pages() && virtual_address.is_multiple_of(GIB) && physical.is_multiple_of(GIB) && end - virtual_address >= GIB;
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
        activate_root(self.root);
    }

    /// The page directory covering `address`, created on the way if `tables` is given (a
    /// 1 GiB leaf there is then split into 2 MiB leaves; without `tables` it has none).
    fn directory(&mut self, address: u64, mut tables: Option<&mut dyn TableSource>) -> Result<Option<u64>, OutOfMemory> {
        let mut table = self.root;
        for level in [3, 2] {
            let entry = &mut entries(table)[index(address, level)];
            if *entry & PRESENT == 0 {
                match tables.as_deref_mut() {
                    Some(source) => *entry = source.allocate_table().ok_or(OutOfMemory)? | table_bits(address),
                    None => return Ok(None),
                }
            } else if level == 2 && *entry & HUGE != 0 {
                match tables.as_deref_mut() {
                    Some(source) => Self::split_gigabyte(entry, source)?,
                    None => return Ok(None),
                }
            } else if level == 2 && *entry & SHARED_DIRECTORY != 0 {
                // Without `tables` the caller only reads through it.
                if let Some(source) = tables.as_deref_mut() {
                    Self::unshare(entry, source)?;
                }
            }
            table = *entry & ADDRESS_MASK;
        }
        Ok(Some(table))
    }

    /// The page-directory-pointer entry covering `address`, if its table exists (reads only).
    fn existing_pointer(&self, address: u64) -> Option<&'static mut u64> {
        let top = entries(self.root)[index(address, 3)];
        (top & PRESENT != 0).then(|| &mut entries(top & ADDRESS_MASK)[index(address, 2)])
    }

    /// Replaces the 1 GiB leaf `entry` with a directory of 512 2 MiB leaves with the same
    /// rights (to change part of it).
    fn split_gigabyte(entry: &mut u64, tables: &mut dyn TableSource) -> Result<(), OutOfMemory> {
        let directory = tables.allocate_table().ok_or(OutOfMemory)?;
        let base = *entry & ADDRESS_MASK & !(DIRECTORY_SPAN - 1);
        let rights = *entry & !ADDRESS_MASK;
        for (i, leaf) in entries(directory).iter_mut().enumerate() {
            *leaf = (base + i as u64 * HUGE_PAGE_SIZE) | rights;
        }
        *entry = directory | table_bits(base);
        Ok(())
    }

    /// Gives the shared directory under `pointer` (see [`SHARED_DIRECTORY`]) a private copy
    /// of the same leaves, to be edited: no translation changes, so no TLB flush.
    fn unshare(pointer: &mut u64, tables: &mut dyn TableSource) -> Result<(), OutOfMemory> {
        let copy = tables.allocate_table().ok_or(OutOfMemory)?;
        entries(copy).copy_from_slice(entries(*pointer & ADDRESS_MASK));
        *pointer = copy | (*pointer & !(ADDRESS_MASK | SHARED_DIRECTORY));
        Ok(())
    }

    /// Retires the unlinked directory `directory` and the 4 KiB tables it holds.
    fn retire_directory(directory: u64, tables: &mut dyn TableSource) {
        Self::retire_tables_of(entries(directory), tables);
        tables.retire_table(directory);
    }

    /// Retires the 4 KiB tables that the directory entries `blocks` link (none are looked at
    /// one by one when all are zero); returns whether any entry was present.
    #[inline(always)]
    fn retire_tables_of(blocks: &[u64], tables: &mut dyn TableSource) -> bool {
        if all_zero(blocks) {
            return false;
        }
        let mut present = false;
        for entry in blocks {
            present |= *entry & PRESENT != 0;
            if *entry & (PRESENT | HUGE) == PRESENT {
                tables.retire_table(*entry & ADDRESS_MASK);
            }
        }
        present
    }

    /// A new 4 KiB table holding what `directory_entry` maps (the old table's leaves, the 2 MiB
    /// leaf it splits, or nothing), to be changed off-line and then linked with one write. On
    /// a shadow-paging host (PVM) every write to a live page table traps, so changing more
    /// than a few leaves this way is much cheaper. The old table is retired: another CPU may
    /// still walk it until its next TLB flush.
    fn rebuilt_table(directory_entry: u64, tables: &mut dyn TableSource) -> Result<u64, OutOfMemory> {
        let table = tables.allocate_table().ok_or(OutOfMemory)?;
        let fresh = entries(table);
        if directory_entry & PRESENT != 0 {
            if directory_entry & HUGE != 0 {
                let base = directory_entry & ADDRESS_MASK & !(HUGE_PAGE_SIZE - 1);
                let rights = directory_entry & !(ADDRESS_MASK | HUGE);
                for (i, entry) in fresh.iter_mut().enumerate() {
                    *entry = (base + i as u64 * PAGE_SIZE) | rights;
                }
            } else {
                let old = directory_entry & ADDRESS_MASK;
                fresh.copy_from_slice(entries(old));
                tables.retire_table(old);
            }
        }
        Ok(table)
    }

    /// Sets the leaves of `[from, to)`, inside one 2 MiB block, in place when they are few,
    /// else in a rebuilt table (`rebuilt_table`).
    fn set_leaves(
        directory_entry: &mut u64,
        from: u64,
        to: u64,
        leaf: impl Fn(u64) -> u64,
        tables: &mut dyn TableSource,
    ) -> Result<(), OutOfMemory> {
        let in_place = *directory_entry & PRESENT != 0 && *directory_entry & HUGE == 0 && (to - from) / PAGE_SIZE < REBUILD_THRESHOLD;
        let table = if in_place { *directory_entry & ADDRESS_MASK } else { Self::rebuilt_table(*directory_entry, tables)? };
        let leaves = entries(table);
        let mut address = from;
        while address < to {
            leaves[index(address, 0)] = leaf(address);
            address += PAGE_SIZE;
        }
        if !in_place {
            *directory_entry = table | table_bits(from);
        }
        Ok(())
    }

    /// The page-directory-pointer entry covering `address`, its table created if missing.
    fn pointer_entry(&mut self, address: u64, tables: &mut dyn TableSource) -> Result<&'static mut u64, OutOfMemory> {
        let top = &mut entries(self.root)[index(address, 3)];
        if *top & PRESENT == 0 {
            *top = tables.allocate_table().ok_or(OutOfMemory)? | table_bits(address);
        }
        Ok(&mut entries(*top & ADDRESS_MASK)[index(address, 2)])
    }

    /// How many whole, aligned 2 MiB blocks of `[from, to)` would become (or stop being) 2 MiB
    /// leaves; a directory with this many changes is rebuilt off-line rather than edited.
    fn whole_blocks(from: u64, to: u64, offset: u64, for_mapping: bool) -> u64 {
        let first = from.next_multiple_of(HUGE_PAGE_SIZE);
        let last = to & !(HUGE_PAGE_SIZE - 1);
        if last <= first || (for_mapping && !first.wrapping_add(offset).is_multiple_of(HUGE_PAGE_SIZE)) {
            return 0;
        }
        (last - first) / HUGE_PAGE_SIZE
    }

    /// Rebuilds the page directory over `[from, to)` (inside one directory span) off-line:
    /// a copy of the old one (or nothing) in [`STAGING`], its partial blocks set through
    /// `block` (4 KiB tables) and the whole ones in between to `whole(address)` in a tight
    /// loop (`whole` must be affine in the block's address, as a mapping's offset plus bits or
    /// a constant are), then copied into a fresh table and linked with one write, as
    /// [`PageTables::rebuild`] does one level down: one trapped write on a shadow-paging host
    /// instead of one per 2 MiB entry. `pointer` must not be a 1 GiB leaf. Returns whether a present entry was
    /// replaced. The old directory is retired, with the 4 KiB tables whole blocks drop.
    fn rebuild_directory(
        pointer: &mut u64,
        from: u64,
        to: u64,
        mut block: impl FnMut(&mut u64, u64, u64, &mut dyn TableSource) -> Result<(), OutOfMemory>,
        whole: impl Fn(u64) -> u64,
        tables: &mut dyn TableSource,
    ) -> Result<bool, OutOfMemory> {
        let directory = tables.allocate_table().ok_or(OutOfMemory)?;
        let mut staging = STAGING.lock();
        let fresh = &mut *staging;
        let old = (*pointer & PRESENT != 0).then_some(*pointer & ADDRESS_MASK);
        // A shared directory has no 4 KiB tables, and it stays (its leaves count as replaced).
        let old_shared = *pointer & SHARED_DIRECTORY != 0;
        match old {
            Some(old) => fresh.copy_from_slice(entries(old)),
            None => fresh.fill(0),
        }
        let first = from.next_multiple_of(HUGE_PAGE_SIZE).min(to);
        let last = (to & !(HUGE_PAGE_SIZE - 1)).max(first);
        let mut replaced = false;
        for (edge_from, edge_to) in [(from, first), (last, to)] {
            if edge_from < edge_to {
                let entry = &mut fresh[index(edge_from, 1)];
                replaced |= *entry & PRESENT != 0;
                block(entry, edge_from, edge_to, tables)?;
            }
        }
        if last > first {
            let (lo, hi) = (index(first, 1), index(last - 1, 1) + 1);
            if old_shared {
                replaced = true;
            } else if old.is_some() {
                replaced |= Self::retire_tables_of(&fresh[lo..hi], tables);
            }
            let at_first = whole(first);
            let step = whole(first + HUGE_PAGE_SIZE).wrapping_sub(at_first);
            assert!(
                whole(last - HUGE_PAGE_SIZE) == at_first.wrapping_add(step.wrapping_mul((hi - lo - 1) as u64)),
                "whole blocks' entries must be affine"
            );
            fill_progression(&mut fresh[lo..hi], at_first, step);
        }
        entries(directory).copy_from_slice(fresh);
        *pointer = directory | table_bits(from);
        if let Some(old) = old.filter(|_| !old_shared) {
            tables.retire_table(old);
        }
        Ok(replaced)
    }

    /// Sets one 2 MiB block's directory entry for `[address, block_end)` mapped at `offset`
    /// from the virtual address: a 2 MiB leaf when the block is whole and aligned on both
    /// sides, else 4 KiB leaves.
    fn map_block(
        entry: &mut u64,
        address: u64,
        block_end: u64,
        offset: u64,
        protection: Protection,
        tables: &mut dyn TableSource,
    ) -> Result<(), OutOfMemory> {
        let target = address.wrapping_add(offset);
        let whole_block = address.is_multiple_of(HUGE_PAGE_SIZE) && block_end - address == HUGE_PAGE_SIZE;
        if whole_block && target.is_multiple_of(HUGE_PAGE_SIZE) {
            if *entry & PRESENT != 0 && *entry & HUGE == 0 {
                tables.retire_table(*entry & ADDRESS_MASK);
            }
            *entry = target | leaf_bits(address, protection) | HUGE;
            Ok(())
        } else {
            Self::set_leaves(entry, address, block_end, |page| page.wrapping_add(offset) | leaf_bits(page, protection), tables)
        }
    }

    /// Clears one 2 MiB block's leaves of `[address, block_end)`.
    fn unmap_block(entry: &mut u64, address: u64, block_end: u64, tables: &mut dyn TableSource) -> Result<(), OutOfMemory> {
        if *entry & PRESENT == 0 {
            return Ok(());
        }
        if address.is_multiple_of(HUGE_PAGE_SIZE) && block_end - address == HUGE_PAGE_SIZE {
            if *entry & HUGE == 0 {
                tables.retire_table(*entry & ADDRESS_MASK);
            }
            *entry = 0;
            Ok(())
        } else {
            Self::set_leaves(entry, address, block_end, |_| 0, tables)
        }
    }

    /// Maps `[virtual, virtual + len)` to `[physical, ...)`, with 2 MiB pages wherever both
    /// sides are aligned. Both addresses and `len` are page multiples.
    pub fn map(
        &mut self,
        virtual_address: u64,
        physical: u64,
        len: u64,
        protection: Protection,
        tables: &mut dyn TableSource,
    ) -> Result<(), OutOfMemory> {
        let end = virtual_address + len;
        let offset = physical.wrapping_sub(virtual_address);
        // Only replaced translations can be stale in the TLB; fresh ones need no flush.
        let mut replaced = false;
        let mut address = virtual_address;
        while address < end {
            let span_end = end.min((address | (DIRECTORY_SPAN - 1)) + 1);
            // A whole span on an aligned target: one 1 GiB leaf, one write (every kernel
            // access to a table is emulated on PVM; 512 entries cost milliseconds).
            let whole_span = address.is_multiple_of(DIRECTORY_SPAN) && span_end - address == DIRECTORY_SPAN;
            let gigabyte = whole_span && address.wrapping_add(offset).is_multiple_of(DIRECTORY_SPAN) && has_1g_pages();
            let rebuild = Self::whole_blocks(address, span_end, offset, true) >= REBUILD_THRESHOLD;
            if gigabyte || rebuild {
                let pointer = self.pointer_entry(address, tables)?;
                let is_gigabyte_leaf = *pointer & (PRESENT | HUGE) == PRESENT | HUGE;
                if gigabyte && (*pointer & PRESENT == 0 || is_gigabyte_leaf) {
                    replaced |= is_gigabyte_leaf;
                    *pointer = address.wrapping_add(offset) | leaf_bits(address, protection) | HUGE;
                    address = span_end;
                    continue;
                }
                // One span lies wholly in the user or the kernel half: the same bits throughout.
                let bits = leaf_bits(address, protection) | HUGE;
                let whole = |block: u64| block.wrapping_add(offset) | bits;
                // 2 MiB blocks to the end of the span (a whole GiB, or the only mapping in it)
                // where nothing was, or a shared directory of the same blocks: linked to a
                // shared directory with one write.
                let from = index(address, 1);
                let wanted = LeafBlocks { first: whole(address), from, to: from + ((span_end - address) / HUGE_PAGE_SIZE) as usize };
                let blocks_only = address.is_multiple_of(HUGE_PAGE_SIZE) && span_end.is_multiple_of(HUGE_PAGE_SIZE);
                let relinkable = *pointer & PRESENT == 0
                    || (*pointer & SHARED_DIRECTORY != 0
                        && (whole_span
                            || tables
                                .leaf_blocks(*pointer & ADDRESS_MASK)
                                .is_some_and(|had| (had.from, had.to) == (wanted.from, wanted.to))));
                let shared = if rebuild && blocks_only && relinkable { tables.leaf_directory(wanted) } else { None };
                if let Some(shared) = shared {
                    replaced |= *pointer & PRESENT != 0;
                    *pointer = shared | table_bits(address) | SHARED_DIRECTORY;
                    address = span_end;
                    continue;
                }
                if rebuild && !is_gigabyte_leaf {
                    let block = |entry: &mut u64, from: u64, to: u64, tables: &mut dyn TableSource| {
                        Self::map_block(entry, from, to, offset, protection, tables)
                    };
                    replaced |= Self::rebuild_directory(pointer, address, span_end, block, whole, tables)?;
                    address = span_end;
                    continue;
                }
            }
            let block_end = end.min((address | (HUGE_PAGE_SIZE - 1)) + 1);
            let directory = self.directory(address, Some(&mut *tables))?.ok_or(OutOfMemory)?;
            let entry = &mut entries(directory)[index(address, 1)];
            replaced |= *entry & PRESENT != 0;
            Self::map_block(entry, address, block_end, offset, protection, tables)?;
            address = block_end;
        }
        if replaced {
            flush_tlb(virtual_address, len);
        }
        Ok(())
    }

    /// Points the 4 KiB leaf at `address` at `physical`, writable, in place and without a TLB
    /// flush: for the page of a write fault, whose translation the fault itself dropped from
    /// this CPU's TLB (Intel SDM 4.10.4.1; a stale read-only one elsewhere only faults again).
    /// On a shadow-paging host an INVLPG is one more trip to the host. False, with nothing
    /// changed, where no 4 KiB leaf maps `address` (the caller then uses `map`).
    pub fn make_page_writable(&mut self, address: u64, physical: u64) -> bool {
        let Ok(Some(directory)) = self.directory(address, None) else { return false };
        let entry = entries(directory)[index(address, 1)];
        if entry & PRESENT == 0 || entry & HUGE != 0 {
            return false;
        }
        let leaf = &mut entries(entry & ADDRESS_MASK)[index(address, 0)];
        if *leaf & PRESENT == 0 {
            return false;
        }
        *leaf = physical | leaf_bits(address, Protection { write: true, execute: false });
        true
    }

    /// What `address` maps to: the physical address, whether the page is writable, and how
    /// many bytes of the same leaf (4 KiB or 2 MiB) follow from `address`. When nothing is
    /// mapped there: how many bytes from `address` are certainly unmapped (the rest of a
    /// missing 4 KiB page, or of a 2 MiB block with no table at all). Only reads the tables
    /// (XPMEM resolves segments with it).
    pub fn translate(&mut self, address: u64) -> Result<Translation, u64> {
        let to_block_end = (address | (HUGE_PAGE_SIZE - 1)) + 1 - address;
        let to_page_end = PAGE_SIZE - (address & (PAGE_SIZE - 1));
        if let Some(leaf) =
            self.existing_pointer(address).map(|pointer| *pointer).filter(|entry| *entry & (PRESENT | HUGE) == PRESENT | HUGE)
        {
            let offset = address & (DIRECTORY_SPAN - 1);
            let frame = leaf & ADDRESS_MASK & !(DIRECTORY_SPAN - 1);
            return Ok(Translation {
                physical: frame + offset,
                writable: leaf & WRITABLE != 0,
                bytes_left_in_leaf: DIRECTORY_SPAN - offset,
            });
        }
        let Ok(Some(directory)) = self.directory(address, None) else { return Err(to_block_end) };
        let entry = entries(directory)[index(address, 1)];
        if entry & PRESENT == 0 {
            return Err(to_block_end);
        }
        let (leaf, leaf_size) =
            if entry & HUGE != 0 { (entry, HUGE_PAGE_SIZE) } else { (entries(entry & ADDRESS_MASK)[index(address, 0)], PAGE_SIZE) };
        if leaf & PRESENT == 0 {
            return Err(to_page_end);
        }
        let offset = address & (leaf_size - 1);
        let frame = leaf & ADDRESS_MASK & !(leaf_size - 1);
        Ok(Translation { physical: frame + offset, writable: leaf & WRITABLE != 0, bytes_left_in_leaf: leaf_size - offset })
    }

    /// Calls `leaf` with each mapping of `[start, end)` in the user half, in address order:
    /// virtual address (of the leaf: a 2 MiB leaf may start below `start`), physical address,
    /// size (4 KiB, 2 MiB or 1 GiB), rights, and whether user code wrote through it (the dirty bit:
    /// the kernel's own writes go through its physical-memory window). Only reads the tables,
    /// and only the entries of the range: on PVM each read of a table costs microseconds.
    pub fn for_each_user_leaf_in(&self, start: u64, end: u64, mut leaf: impl FnMut(u64, u64, u64, Protection, bool)) {
        let rights = |entry: u64| Protection { write: entry & WRITABLE != 0, execute: entry & NO_EXECUTE == 0 };
        self.for_each_pointer_in(start / PAGE_SIZE * PAGE_SIZE, end, |mut address, span_end, pointer| {
            if pointer & HUGE != 0 {
                let span = address & !(DIRECTORY_SPAN - 1);
                leaf(span, pointer & ADDRESS_MASK & !(DIRECTORY_SPAN - 1), DIRECTORY_SPAN, rights(pointer), pointer & DIRTY != 0);
                return;
            }
            let directory = entries(pointer & ADDRESS_MASK);
            while address < span_end {
                let block = address & !(HUGE_PAGE_SIZE - 1);
                let block_end = block + HUGE_PAGE_SIZE;
                let entry = directory[index(address, 1)];
                if entry & PRESENT != 0 && entry & HUGE != 0 {
                    leaf(block, entry & ADDRESS_MASK & !(HUGE_PAGE_SIZE - 1), HUGE_PAGE_SIZE, rights(entry), entry & DIRTY != 0);
                } else if entry & PRESENT != 0 {
                    let table = entries(entry & ADDRESS_MASK);
                    while address < span_end.min(block_end) {
                        let pte = table[index(address, 0)];
                        if pte & PRESENT != 0 {
                            leaf(address, pte & ADDRESS_MASK, PAGE_SIZE, rights(pte), pte & DIRTY != 0);
                        }
                        address += PAGE_SIZE;
                    }
                }
                address = block_end;
            }
        });
    }

    /// The walk under the leaf walks: for each present page-directory-pointer entry over
    /// `[start, end)`, `visit(address, span_end, entry)` with the part of the range it covers.
    /// Missing upper levels are skipped whole, and each entry is read once per span, not once
    /// per 2 MiB block (on PVM each read of a table costs microseconds).
    fn for_each_pointer_in(&self, start: u64, end: u64, mut visit: impl FnMut(u64, u64, u64)) {
        const TOP_SPAN: u64 = DIRECTORY_SPAN * 512;
        let mut address = start;
        while address < end {
            let top = entries(self.root)[index(address, 3)];
            if top & PRESENT == 0 {
                address = (address | (TOP_SPAN - 1)) + 1;
                continue;
            }
            let pointer = entries(top & ADDRESS_MASK)[index(address, 2)];
            let span_end = end.min((address | (DIRECTORY_SPAN - 1)) + 1);
            if pointer & PRESENT != 0 {
                visit(address, span_end, pointer);
            }
            address = span_end;
        }
    }

    /// Calls `run` with each run of `[start, end)`'s mappings that is contiguous on both
    /// sides with the same rights, in address order: virtual address (of the run's first
    /// leaf, which may start below `start`), physical address, length, rights. Leaves are
    /// merged in the walk itself (every kernel load and store is emulated on PVM, so
    /// the per-leaf work is one load and a compare), for XPMEM's resolve.
    pub fn for_each_user_run_in(&self, start: u64, end: u64, mut run: impl FnMut(u64, u64, u64, Protection)) {
        // Entry bits that must agree for two leaves to join one run: all but the address and
        // the accessed and dirty bits.
        const RIGHTS: u64 = !(ADDRESS_MASK | ACCESSED | DIRTY);
        let rights = |bits: u64| Protection { write: bits & WRITABLE != 0, execute: bits & NO_EXECUTE == 0 };
        // The open run: (virtual start, physical start, length, rights bits).
        let mut open: Option<(u64, u64, u64, u64)> = None;
        let mut add = |virtual_address: u64, physical: u64, length: u64, bits: u64| match &mut open {
            Some((v, p, l, b)) if *v + *l == virtual_address && *p + *l == physical && *b == bits => *l += length,
            _ => {
                if let Some((v, p, l, b)) = open.replace((virtual_address, physical, length, bits)) {
                    run(v, p, l, rights(b));
                }
            }
        };
        self.for_each_pointer_in(start & !(HUGE_PAGE_SIZE - 1), end, |address, span_end, pointer| {
            let span = address & !(DIRECTORY_SPAN - 1);
            if pointer & HUGE != 0 {
                add(span, pointer & ADDRESS_MASK & !(DIRECTORY_SPAN - 1), DIRECTORY_SPAN, pointer & RIGHTS);
                return;
            }
            // A tight loop over the directory's 2 MiB leaves, joining them while they continue
            // each other; 4 KiB tables go through `add` one leaf at a time.
            let directory = entries(pointer & ADDRESS_MASK);
            let (mut i, to) = (index(address, 1), index(span_end - 1, 1) + 1);
            let at = |i: usize| span + i as u64 * HUGE_PAGE_SIZE;
            while i < to {
                let entry = directory[i];
                if entry & (PRESENT | HUGE) == PRESENT | HUGE {
                    let first = entry & (RIGHTS | ADDRESS_MASK);
                    let mut last = i;
                    while last + 1 < to && directory[last + 1] & (RIGHTS | ADDRESS_MASK) == first + (last + 1 - i) as u64 * HUGE_PAGE_SIZE {
                        last += 1;
                    }
                    add(at(i), entry & ADDRESS_MASK & !(HUGE_PAGE_SIZE - 1), (last - i + 1) as u64 * HUGE_PAGE_SIZE, entry & RIGHTS);
                    i = last + 1;
                } else {
                    if entry & PRESENT != 0 {
                        for (j, pte) in entries(entry & ADDRESS_MASK).iter().enumerate() {
                            if pte & PRESENT != 0 {
                                add(at(i) + j as u64 * PAGE_SIZE, pte & ADDRESS_MASK, PAGE_SIZE, pte & RIGHTS);
                            }
                        }
                    }
                    i += 1;
                }
            }
        });
        if let Some((v, p, l, b)) = open {
            run(v, p, l, rights(b));
        }
    }

    /// The root table's physical address (what CR3 holds while this address space runs).
    pub fn root(&self) -> u64 {
        self.root
    }

    /// Removes the mappings of the range (2 MiB pages partly covered are split first).
    pub fn unmap(&mut self, virtual_address: u64, len: u64, tables: &mut dyn TableSource) -> Result<(), OutOfMemory> {
        let end = virtual_address + len;
        let mut address = virtual_address;
        while address < end {
            let span_end = end.min((address | (DIRECTORY_SPAN - 1)) + 1);
            if let Some(pointer) = self.existing_pointer(address).filter(|pointer| **pointer & PRESENT != 0) {
                let whole_span = address.is_multiple_of(DIRECTORY_SPAN) && span_end - address == DIRECTORY_SPAN;
                let span_start = address & !(DIRECTORY_SPAN - 1);
                let all_of_shared = *pointer & SHARED_DIRECTORY != 0
                    && tables.leaf_blocks(*pointer & ADDRESS_MASK).is_some_and(|had| {
                        address <= span_start + had.from as u64 * HUGE_PAGE_SIZE && span_start + had.to as u64 * HUGE_PAGE_SIZE <= span_end
                    });
                if whole_span || all_of_shared {
                    // The whole GiB, or all a shared directory holds, goes with one write; a
                    // private directory is retired with its 4 KiB tables, a 1 GiB leaf or a
                    // shared directory has none.
                    let old = core::mem::replace(pointer, 0);
                    if old & (HUGE | SHARED_DIRECTORY) == 0 {
                        Self::retire_directory(old & ADDRESS_MASK, tables);
                    }
                    address = span_end;
                    continue;
                }
                if *pointer & HUGE != 0 {
                    Self::split_gigabyte(pointer, tables)?;
                }
                if Self::whole_blocks(address, span_end, 0, false) >= REBUILD_THRESHOLD {
                    Self::rebuild_directory(pointer, address, span_end, Self::unmap_block, |_| 0, tables)?;
                    address = span_end;
                    continue;
                }
                if *pointer & SHARED_DIRECTORY != 0 {
                    Self::unshare(pointer, tables)?;
                }
            }
            let block_end = end.min((address | (HUGE_PAGE_SIZE - 1)) + 1);
            let Some(directory) = self.directory(address, None)? else {
                address = block_end;
                continue;
            };
            Self::unmap_block(&mut entries(directory)[index(address, 1)], address, block_end, tables)?;
            address = block_end;
        }
        flush_tlb(virtual_address, len);
        Ok(())
    }
}

impl PageTables {
    /// Takes the mappings of `[start, end)` out of use until [`PageTables::resume`]: the
    /// page-directory-pointer entries of its GiBs lose their present bit and keep everything
    /// else, so the tables under them stay as they are (on PVM the host's shadows of them too)
    /// and giving them back is one write per GiB. Nothing else may be mapped in those GiBs,
    /// nor be until [`PageTables::resume`] or [`PageTables::drop_suspended`].
    pub fn suspend(&mut self, start: u64, end: u64) {
        self.for_each_pointer_of(start, end, |pointer| *pointer &= !PRESENT);
        flush_tlb(start, end - start);
    }

    /// Gives back what [`PageTables::suspend`] took out of use (fresh translations: no flush).
    pub fn resume(&mut self, start: u64, end: u64) {
        self.for_each_pointer_of(start, end, |pointer| {
            if *pointer != 0 {
                *pointer |= PRESENT;
            }
        });
    }

    /// Unlinks the suspended `[start, end)` for good, its tables retired.
    pub fn drop_suspended(&mut self, start: u64, end: u64, tables: &mut dyn TableSource) {
        self.for_each_pointer_of(start, end, |pointer| {
            let old = core::mem::replace(pointer, 0);
            if old & (PRESENT | HUGE | SHARED_DIRECTORY) == 0 && old & ADDRESS_MASK != 0 {
                Self::retire_directory(old & ADDRESS_MASK, tables);
            }
        });
    }

    /// Runs `f` on the existing page-directory-pointer entries of the GiBs `[start, end)` touches.
    fn for_each_pointer_of(&mut self, start: u64, end: u64, mut f: impl FnMut(&mut u64)) {
        let mut address = start & !(DIRECTORY_SPAN - 1);
        while address < end {
            if let Some(pointer) = self.existing_pointer(address) {
                f(pointer);
            }
            address += DIRECTORY_SPAN;
        }
    }
}

/// Loads the address space whose root table is `root` (from `PageTables::root`, of tables
/// still alive).
pub fn activate_root(root: u64) {
    // The host must no longer reach the old address space through this CPU's ring-3 calls.
    crate::enclave::slots::ring3_forget();
    // SAFETY: every address space's root maps the kernel half identically.
    unsafe { asm!("mov cr3, {}", in(reg) root, options(nostack)) }
}

/// Below this many leaves a live table is edited in place rather than rebuilt.
const REBUILD_THRESHOLD: u64 = 16;

/// Drops stale translations of a range of the current address space: page by page for small
/// ranges, the whole (non-global) TLB for large ones.
fn flush_tlb(start: u64, len: u64) {
    if len / PAGE_SIZE > 32 {
        flush_user_tlb();
    } else {
        let mut address = start;
        while address < start + len {
            // SAFETY: INVLPG only drops a translation.
            unsafe { asm!("invlpg [{}]", in(reg) address, options(nostack)) }
            address += PAGE_SIZE;
        }
    }
}

/// Drops every non-global translation of this CPU: all user mappings (kernel ones are global).
pub fn flush_user_tlb() {
    // SAFETY: reloading CR3 with its own value only flushes the TLB.
    unsafe { asm!("mov {tmp}, cr3", "mov cr3, {tmp}", tmp = out(reg) _, options(nostack)) }
}

/// Turns on global pages, so kernel translations survive address-space switches.
pub fn enable_global_pages() {
    // SAFETY: setting CR4.PGE only changes TLB retention.
    unsafe { asm!("mov {tmp}, cr4", "or {tmp}, 0x80", "mov cr4, {tmp}", tmp = out(reg) _, options(nostack)) }
}
