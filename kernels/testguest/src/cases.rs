//! The tests, one function each; `README.md` documents their parameters and reports.

use core::sync::atomic::{AtomicU64, Ordering};

use clowder_channel::{Channel, Endpoint, SendError};

use crate::hypercall::{self, exit, report};
use crate::{arch, boot, paging, println, start_info, zero_page, Boot};
use crate::{EXIT_BAD_CMDLINE, EXIT_FAIL, EXIT_NO_CHANNEL, EXIT_PASS};

mod user_echo;
mod xsave;

pub fn run(boot: &Boot) -> ! {
    let Some(test) = boot.cmdline.get("test") else {
        println!("testguest: no test= on the command line '{}'", boot.cmdline.0);
        exit(EXIT_BAD_CMDLINE)
    };
    // Benchmarks skip the banner (serial bytes are exits) and secondary vCPUs stay quiet.
    if boot.cpu == 0 && test != "ready" && test != "nop-loop" {
        println!("testguest: test={} vcpu={} boot={}", test, boot.cpu, boot.path.name());
    }
    if boot.cpu != 0 && test != "smp" {
        // Only `smp` uses the other vCPUs of a direct start.
        arch::halt_forever()
    }
    arch::load_idt(channel_vector(boot));
    match test {
        "pvh" => pvh(boot),
        "zeropage" => zero_page(boot),
        "smp" => smp(boot),
        "sipi" => sipi(boot),
        "hooks" => hooks(boot),
        "channel" | "region" => channel_server(boot),
        "serial" => serial(boot),
        "exit" => exit(boot.cmdline.number("status").unwrap_or(0) as u8),
        "triplefault" => {
            println!("triplefault: now");
            arch::triple_fault()
        }
        "hang" => {
            println!("hang: halting with interrupts off");
            arch::halt_forever()
        }
        "badport" => bad_port(boot),
        "int3" => int3(),
        "xsave" => xsave::xsave(boot),
        "nop-loop" => nop_loop(boot),
        "ready" => {
            hypercall::hypercall(hypercall::READY, [0; 4]);
            exit(EXIT_PASS)
        }
        other => {
            println!("testguest: unknown test '{}'", other);
            exit(EXIT_BAD_CMDLINE)
        }
    }
}

// The site's address is reported, then its INT3 runs in ring 0; the exception stub prints the
// vector and the return RIP (one past the INT3) and exits 0xee.
core::arch::global_asm!(".pushsection .text", ".global int3_site", "int3_site:", "int3", "ud2", ".popsection");
extern "C" {
    fn int3_site();
}

fn int3() -> ! {
    report(b"int3at", int3_site as *const () as u64);
    // SAFETY: the site traps and never returns.
    unsafe { int3_site() };
    exit(EXIT_FAIL)
}

fn channel_vector(boot: &Boot) -> u8 {
    boot.cmdline.hex("clowder.channel_vector").unwrap_or(0x40) as u8
}

// ---------------------------------------------------------------------------------------------

fn pvh(boot: &Boot) -> ! {
    report(b"bootpath", boot.path as u64);
    let Some(info) = boot.start_info else {
        let raw_magic = if boot.start_info_address == 0 {
            0
        } else {
            // SAFETY: the address is in low, identity-mapped RAM.
            unsafe { core::ptr::read_volatile(boot.start_info_address as *const u32) }
        };
        println!("pvh: no hvm_start_info at {:#x} (magic {:#x})", boot.start_info_address, raw_magic);
        report(b"magic", u64::from(raw_magic));
        exit(EXIT_FAIL)
    };
    report(b"magic", u64::from(info.magic));
    report(b"version", u64::from(info.version));
    report(b"flags", u64::from(info.flags));
    report(b"nr_mods", u64::from(info.nr_modules));
    report(b"memmap", u64::from(info.memmap_entries));
    let cmdline = info.cmdline();
    report(b"cmdlen", cmdline.len() as u64);
    println!("pvh: magic {:#x} version {} flags {:#x} at {:#x}", info.magic, info.version, info.flags, boot.start_info_address);
    println!("pvh: cmdline '{}'", cmdline);
    for (index, entry) in info.memory_map().enumerate() {
        report(b"mm_addr", entry.addr);
        report(b"mm_size", entry.size);
        report(b"mm_type", u64::from(entry.kind));
        println!("pvh: memmap[{}] addr={:#x} size={:#x} type={}", index, entry.addr, entry.size, entry.kind);
    }
    for (index, module) in info.modules().enumerate() {
        let head = module_head(&module);
        report(b"mod_addr", module.paddr);
        report(b"mod_size", module.size);
        report(b"mod_head", head);
        println!("pvh: module[{}] addr={:#x} size={:#x} head={:#018x}", index, module.paddr, module.size, head);
    }
    println!("pvh: {} memmap entries, {} modules", info.memory_map().count(), info.modules().count());
    exit(EXIT_PASS)
}

/// The module's first 8 bytes as a little-endian u64 (zero-padded if it is shorter).
fn module_head(module: &start_info::Module) -> u64 {
    first_bytes(module.paddr, module.size)
}

/// The first 8 bytes at `address` (of `size` bytes) as a little-endian u64, zero-padded.
fn first_bytes(address: u64, size: u64) -> u64 {
    let mut bytes = [0u8; 8];
    let length = size.min(8) as usize;
    for (offset, byte) in bytes.iter_mut().take(length).enumerate() {
        // SAFETY: modules and the initrd are in low RAM, identity mapped.
        *byte = unsafe { core::ptr::read_volatile((address as *const u8).add(offset)) };
    }
    u64::from_le_bytes(bytes)
}

/// The Linux boot protocol: what the loader put in the zero page.
fn zero_page(boot: &Boot) -> ! {
    report(b"bootpath", boot.path as u64);
    let Some(page) = boot.zero_page else {
        println!("zeropage: not entered through the Linux boot protocol (boot={})", boot.path.name());
        exit(EXIT_FAIL)
    };
    report(b"hdrmagic", u64::from(page.header_magic()));
    if page.header_magic() != zero_page::HDRS_MAGIC {
        println!("zeropage: no HdrS in the zero page at {:#x} (found {:#x})", page.address, page.header_magic());
        exit(EXIT_FAIL)
    }
    let cmdline = start_info::cmdline_at(page.cmdline_address());
    let (initrd_address, initrd_size) = page.initrd();
    let initrd_head = first_bytes(initrd_address, initrd_size);
    report(b"version", u64::from(page.version()));
    report(b"loader", u64::from(page.type_of_loader()));
    report(b"loadflg", u64::from(page.loadflags()));
    report(b"xloadflg", u64::from(page.xloadflags()));
    report(b"cmdptr", page.cmdline_address());
    report(b"cmdlen", cmdline.len() as u64);
    report(b"rd_addr", initrd_address);
    report(b"rd_size", initrd_size);
    report(b"rd_head", initrd_head);
    println!(
        "zeropage: at {:#x} header {:#x} version {:#x} loader {:#x} loadflags {:#x} xloadflags {:#x}",
        page.address,
        page.header_magic(),
        page.version(),
        page.type_of_loader(),
        page.loadflags(),
        page.xloadflags()
    );
    println!("zeropage: cmdline at {:#x} '{}'", page.cmdline_address(), cmdline);
    println!("zeropage: initrd addr={:#x} size={:#x} head={:#018x}", initrd_address, initrd_size, initrd_head);
    let mut entries = 0;
    for (index, entry) in page.e820().enumerate() {
        report(b"e8_addr", entry.addr);
        report(b"e8_size", entry.size);
        report(b"e8_type", u64::from(entry.kind));
        println!("zeropage: e820[{}] addr={:#x} size={:#x} type={}", index, entry.addr, entry.size, entry.kind);
        entries += 1;
    }
    report(b"e820", entries);
    println!("zeropage: {} e820 entries", entries);
    exit(EXIT_PASS)
}

// ---------------------------------------------------------------------------------------------
// SMP: `smp` with every vCPU started by the VMM, `sipi` with the guest starting them.

/// vCPUs that have reported so far (vCPU 0 included).
static ARRIVED: AtomicU64 = AtomicU64::new(0);
/// Upper bound on vCPU 0's wait for the others, in polls (each a few emulated instructions).
const ARRIVAL_POLLS: u64 = 20_000_000;

fn report_processor(cpu: u64, how: &str) {
    let apic_id = arch::lapic_id();
    let cpuid_apic_id = arch::cpuid_apic_id();
    report(b"cpu", cpu);
    report(b"apicid", u64::from(apic_id));
    report(b"cpuidapc", u64::from(cpuid_apic_id));
    println!("{}: cpu {} apic id {} (cpuid {})", how, cpu, apic_id, cpuid_apic_id);
    ARRIVED.fetch_add(1, Ordering::AcqRel);
}

/// vCPU 0 waits for `expected` arrivals, reports the count and exits.
fn wait_for_arrivals(how: &str, expected: u64) -> ! {
    let mut polls = 0;
    while ARRIVED.load(Ordering::Acquire) < expected && polls < ARRIVAL_POLLS {
        arch::pause();
        polls += 1;
    }
    let arrived = ARRIVED.load(Ordering::Acquire);
    report(b"arrived", arrived);
    println!("{}: {} of {} cpus arrived", how, arrived, expected);
    exit(if arrived == expected { EXIT_PASS } else { EXIT_FAIL })
}

fn smp(boot: &Boot) -> ! {
    report_processor(boot.cpu, "smp");
    if boot.cpu != 0 {
        arch::halt_forever()
    }
    wait_for_arrivals("smp", boot.cpus())
}

/// Where the real-mode trampoline goes: page 0x10 (free in the ABI's low-memory layout).
const TRAMPOLINE_VECTOR: u8 = 0x10;

fn sipi(boot: &Boot) -> ! {
    let expected = boot.cpus();
    arch::lapic_enable();
    report_processor(0, "sipi");
    if expected > 1 {
        let trampoline = boot::ap_trampoline();
        let destination = (u64::from(TRAMPOLINE_VECTOR) << 12) as *mut u8;
        // SAFETY: page 0x10000 is unused RAM in the ABI's layout and the trampoline is < 4 KiB.
        unsafe { core::ptr::copy_nonoverlapping(trampoline.as_ptr(), destination, trampoline.len()) };
        arch::start_other_processors(TRAMPOLINE_VECTOR);
    }
    wait_for_arrivals("sipi", expected)
}

pub fn sipi_application_processor(cpu: u64) -> ! {
    report_processor(cpu, "sipi");
    arch::halt_forever()
}

// ---------------------------------------------------------------------------------------------

/// Values the `hooks` test writes; the host's scratch hooks hand them back.
pub const PIO8_VALUE: u8 = 0xa5;
pub const PIO16_VALUE: u16 = 0xbeef;
pub const PIO32_VALUE: u32 = 0x1234_5678;
pub const MMIO8_VALUE: u8 = 0x5a;
pub const MMIO32_VALUE: u32 = 0xdead_beef;
pub const MMIO64_VALUE: u64 = 0x0123_4567_89ab_cdef;
pub const MSR_VALUE: u64 = 0xfeed_face_cafe_f00d;
pub const UNKNOWN_HYPERCALL: u32 = 0x7fff;

fn hooks(boot: &Boot) -> ! {
    if let Some(port) = boot.cmdline.number("port") {
        let port = port as u16;
        arch::outb(port, PIO8_VALUE);
        report(b"pio8", u64::from(arch::inb(port)));
        arch::outw(port, PIO16_VALUE);
        report(b"pio16", u64::from(arch::inw(port)));
        arch::outl(port, PIO32_VALUE);
        report(b"pio32", u64::from(arch::inl(port)));
        println!("hooks: port {:#x} done", port);
    }
    if let Some(base) = boot.cmdline.number("mmio") {
        if base >= 1 << 32 {
            println!("hooks: mmio window {:#x} is above the 4 GiB identity map", base);
            exit(EXIT_BAD_CMDLINE)
        }
        // SAFETY: the window is identity mapped (uncached in the 4th GiB) and belongs to the
        // VMM's MmioScratch device; accesses become MMIO exits.
        unsafe {
            core::ptr::write_volatile(base as *mut u32, MMIO32_VALUE);
            report(b"mmio32", u64::from(core::ptr::read_volatile(base as *const u32)));
            core::ptr::write_volatile((base + 8) as *mut u64, MMIO64_VALUE);
            report(b"mmio64", core::ptr::read_volatile((base + 8) as *const u64));
            core::ptr::write_volatile((base + 16) as *mut u8, MMIO8_VALUE);
            report(b"mmio8", u64::from(core::ptr::read_volatile((base + 16) as *const u8)));
        }
        println!("hooks: mmio {:#x} done", base);
    }
    if let Some(msr) = boot.cmdline.number("msr") {
        arch::write_msr(msr as u32, MSR_VALUE);
        report(b"msr", arch::read_msr(msr as u32));
        println!("hooks: msr {:#x} done", msr);
    }
    report(b"hcnop", hypercall::hypercall(hypercall::NOP, [0; 4]) as u64);
    report(b"hcbeat", hypercall::hypercall(hypercall::HEARTBEAT, [0; 4]) as u64);
    report(b"hcunk", hypercall::hypercall(UNKNOWN_HYPERCALL, [0; 4]) as u64);
    if let Some(number) = boot.cmdline.number("hc") {
        let result = hypercall::hypercall(number as u32, [1, 2, 3, 4]);
        report(b"hcres", result as u64);
    }
    println!("hooks: done");
    exit(EXIT_PASS)
}

// ---------------------------------------------------------------------------------------------
// The channel: an echo server that also maps regions on request.

/// Host pattern word `i` of a region, and the guest's reply pattern.
pub const HOST_PATTERN: u64 = 0x1111_1111_0000_0000;
pub const GUEST_PATTERN: u64 = 0x2222_2222_0000_0000;
const PAGE_SIZE: u64 = 4096;
const WORDS_PER_PAGE: u64 = PAGE_SIZE / 8;

struct ChannelServer {
    endpoint: Endpoint,
    doorbell_port: u16,
    echoed: u64,
}

impl ChannelServer {
    /// Sends, waiting for room if the host is slow, then rings the doorbell if the host sleeps.
    fn send(&mut self, message: &[u8]) {
        loop {
            match self.endpoint.send(message) {
                Ok(()) => break,
                Err(SendError::Full) => arch::pause(),
                Err(error) => {
                    println!("channel: send failed: {}", error);
                    exit(EXIT_FAIL)
                }
            }
        }
        if self.endpoint.peer_waiting() {
            arch::outl(self.doorbell_port, 1);
        }
    }
}

fn channel_server(boot: &Boot) -> ! {
    let Some((gpa, size)) = boot.cmdline.get("clowder.channel").and_then(|value| {
        let (gpa, size) = value.split_once(',')?;
        Some((crate::cmdline::parse_hex(gpa)?, crate::cmdline::parse_hex(size)?))
    }) else {
        println!("channel: no clowder.channel=<gpa>,<size> on the command line");
        exit(EXIT_NO_CHANNEL)
    };
    let mode = boot.cmdline.get("mode");
    let doorbell = mode == Some("doorbell");
    let poll_in_ring3 = mode == Some("poll-user");
    // SAFETY: the VMM reserved [gpa, gpa + size) for the channel; it is in low RAM, identity
    // mapped, and only accessed through the channel crate.
    let channel = match unsafe { Channel::attach(gpa as *mut u8, size as usize) } {
        Ok(channel) => channel,
        Err(error) => {
            println!("channel: attach at {:#x} failed: {}", gpa, error);
            exit(EXIT_NO_CHANNEL)
        }
    };
    let endpoint = match channel.guest_end() {
        Ok(endpoint) => endpoint,
        Err(error) => {
            println!("channel: {}", error);
            exit(EXIT_NO_CHANNEL)
        }
    };
    let doorbell_port = boot.cmdline.hex("clowder.channel_port").unwrap_or(0x520) as u16;
    if doorbell {
        arch::lapic_enable();
    }
    let mode_name = match (doorbell, poll_in_ring3) {
        (true, _) => "doorbell",
        (false, true) => "ring-3 polling",
        (false, false) => "polling",
    };
    println!("channel: attached at {:#x} size {:#x}, {} mode", gpa, size, mode_name);
    report(b"chready", gpa);
    if poll_in_ring3 {
        match user_echo::serve(endpoint, gpa, size, doorbell_port) {
            Ok(echoed) => report_quit(echoed),
            Err(failure) => {
                println!("channel: {}", failure);
                exit(EXIT_FAIL)
            }
        }
    }
    let mut server = ChannelServer { endpoint, doorbell_port, echoed: 0 };
    let mut buffer = [0u8; 256];
    loop {
        let length = match server.endpoint.recv(&mut buffer) {
            Ok(Some(length)) => length,
            Ok(None) => {
                if doorbell {
                    sleep_until_message(&mut server.endpoint);
                } else {
                    arch::pause();
                }
                continue;
            }
            Err(error) => {
                println!("channel: receive failed: {}", error);
                exit(EXIT_FAIL)
            }
        };
        let message = &buffer[..length];
        if message == b"quit" {
            server.send(b"bye");
            report_quit(server.echoed)
        } else if let Some(arguments) = message.strip_prefix(b"map ") {
            let reply = map_and_check_region(arguments);
            server.send(reply.as_bytes());
        } else {
            server.send(message);
            server.echoed += 1;
        }
    }
}

/// After `bye`: the reports every channel mode ends with.
fn report_quit(echoed: u64) -> ! {
    let wakeups = u64::from(arch::DEVICE_INTERRUPTS.load(Ordering::Relaxed));
    report(b"echoed", echoed);
    report(b"wakeups", wakeups);
    println!("channel: quit after {} echoes, {} wakeups", echoed, wakeups);
    exit(EXIT_PASS)
}

/// Poll-then-sleep: announce we wait, look once more, and only then halt until the channel's
/// interrupt (or any other) arrives.
fn sleep_until_message(endpoint: &mut Endpoint) {
    endpoint.set_waiting(true);
    if !endpoint.has_message().unwrap_or(true) {
        arch::wait_for_interrupt();
    }
    endpoint.set_waiting(false);
}

/// A reply short enough for one channel message.
struct Reply {
    bytes: [u8; 128],
    length: usize,
}

impl Reply {
    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.length]
    }
}

impl core::fmt::Write for Reply {
    fn write_str(&mut self, text: &str) -> core::fmt::Result {
        let end = self.length + text.len();
        if end > self.bytes.len() {
            return Err(core::fmt::Error);
        }
        self.bytes[self.length..end].copy_from_slice(text.as_bytes());
        self.length = end;
        Ok(())
    }
}

/// Handles `map <gpa hex> <size hex>`: maps the region in the window, checks the host's pattern,
/// writes ours, and says how it went.
fn map_and_check_region(arguments: &[u8]) -> Reply {
    use core::fmt::Write;
    let mut reply = Reply { bytes: [0; 128], length: 0 };
    let parsed = core::str::from_utf8(arguments).ok().and_then(|text| {
        let mut words = text.split_ascii_whitespace();
        let gpa = crate::cmdline::parse_hex(words.next()?)?;
        let size = crate::cmdline::parse_hex(words.next()?)?;
        Some((gpa, size))
    });
    let Some((gpa, size)) = parsed else {
        let _ = write!(reply, "error bad map request");
        return reply;
    };
    let window = match paging::map_region(gpa, size) {
        Ok(window) => window,
        Err(error) => {
            let _ = write!(reply, "error {:?}", error);
            println!("region: cannot map {:#x}+{:#x}: {:?}", gpa, size, error);
            return reply;
        }
    };
    // The first and last word of every page: enough to show each page maps the right frame,
    // and a constant cost per page (each kernel-mode access is emulated on PVM).
    let pages = size / PAGE_SIZE;
    let mut mismatches = 0u64;
    for page in 0..pages {
        for index in [page * WORDS_PER_PAGE, (page + 1) * WORDS_PER_PAGE - 1] {
            // SAFETY: the window maps exactly `size` bytes of the region.
            unsafe {
                let word = window.add(index as usize);
                if core::ptr::read_volatile(word) != HOST_PATTERN | index {
                    mismatches += 1;
                }
                core::ptr::write_volatile(word, GUEST_PATTERN | index);
            }
        }
    }
    let words = pages * 2;
    report(b"rgn_gpa", gpa);
    report(b"rgn_size", size);
    report(b"rgn_bad", mismatches);
    println!("region: {:#x}+{:#x} mapped at {:#x}, {} of {} checked words differ", gpa, size, paging::REGION_WINDOW, mismatches, words);
    let _ = write!(reply, "mapped {:x} {:x} bad {}", gpa, size, mismatches);
    reply
}

// ---------------------------------------------------------------------------------------------

fn serial(boot: &Boot) -> ! {
    let lines = boot.cmdline.number("lines").unwrap_or(3);
    for line in 1..=lines {
        println!("serial: line {} of {}", line, lines);
    }
    println!("serial: done");
    exit(EXIT_PASS)
}

/// A port no device claims (by default); what the VMM does with it is the VMM's business, so
/// report what a read returns and exit normally if we get that far.
fn bad_port(boot: &Boot) -> ! {
    let port = boot.cmdline.number("port").unwrap_or(0x999) as u16;
    arch::outb(port, 0x42);
    let value = arch::inb(port);
    report(b"badin", u64::from(value));
    println!("badport: wrote {:#x}, read back {:#x}", port, value);
    exit(EXIT_PASS)
}

fn nop_loop(boot: &Boot) -> ! {
    let count = boot.cmdline.number("count").unwrap_or(1000);
    for _ in 0..count {
        hypercall::hypercall(hypercall::NOP, [0; 4]);
    }
    report(b"nops", count);
    exit(EXIT_PASS)
}
