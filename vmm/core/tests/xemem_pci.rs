//! The XEMEM PCI device in a real KVM VM (not started: the host side alone): its hooks sit
//! beside the built-in devices, an ATTACH through the mailbox becomes exactly one memory slot at
//! the window's address backed by the segment's memfd, and DETACH removes it. The guest side is
//! xemem/tests/pci_fake.c (libxpmem against a fake device).

#[macro_use]
mod guest_support;

use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex, OnceLock};

use guest_support::{GuestSpec, Scratch};
use vmm::pci::mailbox::{MailboxHost, MailboxRequest, WindowHoles, XememPci};
use vmm::pci::{PciBus, CONFIG_PORTS, MAILBOX_SIZE, WINDOW_SIZE};
use vmm::{ExtraDevice, HookKey, RegionAccess, Vm, VmHandle};

const MAILBOX_BASE: u64 = 0xe000_0000;
/// Far above anything `add_region` picks by itself for other regions.
const WINDOW_BASE: u64 = 1 << 45;
const APID: u64 = 3;

/// The host: permit APID is a memfd of 4 MiB whose pages say their index.
struct Host {
    vm: Arc<OnceLock<Arc<VmHandle>>>,
    segment: OwnedFd,
}

impl MailboxHost for Host {
    fn call(&mut self, _: &MailboxRequest) -> Result<[u64; 4], i32> {
        Err(libc::ENOSYS)
    }

    fn place(&mut self, apid: u64, offset: u64, len: u64, gpa: u64) -> Result<u32, i32> {
        if apid != APID {
            return Err(libc::ENOENT);
        }
        let vm = self.vm.get().expect("VM made");
        let region = vm.add_region(self.segment.as_raw_fd(), offset, len, Some(gpa), RegionAccess::ReadWrite).map_err(|_| libc::EIO)?;
        Ok(region.slot)
    }

    fn unplace(&mut self, slot: u32) -> bool {
        self.vm.get().expect("VM made").remove_region(slot).expect("slot removed");
        false
    }
}

fn segment() -> OwnedFd {
    // SAFETY: a NUL-terminated name; the descriptor is owned from here on.
    let raw = unsafe { libc::memfd_create(c"segment".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(raw >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut bytes = vec![0u8; 4 << 20];
    for (page, chunk) in bytes.chunks_mut(4096).enumerate() {
        chunk[..8].copy_from_slice(&(page as u64).to_le_bytes());
    }
    std::fs::File::from(fd.try_clone().unwrap()).write_all(&bytes).unwrap();
    fd
}

fn ask(device: &Mutex<XememPci>, op: u32, args: &[u64], seq: u32) -> (i32, u64) {
    let mut device = device.lock().unwrap();
    device.mmio_write(MAILBOX_BASE + 0x10, &op.to_le_bytes());
    for (i, arg) in args.iter().enumerate() {
        device.mmio_write(MAILBOX_BASE + 0x20 + 8 * i as u64, &arg.to_le_bytes());
    }
    device.mmio_write(MAILBOX_BASE + 0x08, &seq.to_le_bytes());
    let (mut error, mut result) = ([0u8; 4], [0u8; 8]);
    device.mmio_read(MAILBOX_BASE + 0x14, &mut error);
    device.mmio_read(MAILBOX_BASE + 0x50, &mut result);
    (i32::from_le_bytes(error), u64::from_le_bytes(result))
}

#[test]
fn an_attach_is_one_memory_slot_in_the_window() {
    require_kvm!();
    let vm_handle = Arc::new(OnceLock::new());
    let host = Host { vm: vm_handle.clone(), segment: segment() };
    let bus = PciBus::new(MAILBOX_BASE as u32, WINDOW_BASE, WINDOW_SIZE);
    let device = Arc::new(Mutex::new(XememPci::new(bus, MAILBOX_BASE, Box::new(host))));
    let extra = vec![
        ExtraDevice {
            name: "xemem-pci".into(),
            keys: vec![CONFIG_PORTS, HookKey::Mmio { base: MAILBOX_BASE, len: MAILBOX_SIZE }],
            device: device.clone(),
        },
        ExtraDevice {
            name: "xemem-window".into(),
            keys: vec![HookKey::Mmio { base: WINDOW_BASE, len: WINDOW_SIZE }],
            device: Arc::new(Mutex::new(WindowHoles::default())),
        },
    ];
    let scratch = Scratch::new("xemem-pci");
    let vm = Vm::with_devices(GuestSpec::new("test=pvh").config(&scratch), extra).unwrap_or_else(|e| panic!("{e}"));
    let handle = vm.handle();
    vm_handle.set(handle.clone()).ok().unwrap();
    let before = handle.regions().len();

    let (error, window_offset) = ask(&device, 7, &[APID, 0x1000, 3 << 20], 1);
    assert_eq!((error, window_offset), (0, 0));
    let regions = handle.regions();
    assert_eq!(regions.len(), before + 1, "one slot for the whole attachment");
    let region = regions.iter().find(|r| r.gpa == WINDOW_BASE).expect("a region at the window's base");
    assert_eq!(region.len, 3 << 20);
    let runs = handle.translate(WINDOW_BASE + 0x1000, 8).unwrap();
    assert_eq!(runs.len(), 1);
    // The slot maps the segment from the attach's offset: its second page is page 2.
    let host_address = handle.region_host_address(region.slot).unwrap();
    // SAFETY: the region is mapped for 3 MiB while its slot exists.
    let word = unsafe { std::ptr::read_volatile(host_address.add(0x1000) as *const u64) };
    assert_eq!(word, 2);

    // A second attachment gets its own slot, 2 MiB-aligned after the first.
    let (error, second) = ask(&device, 7, &[APID, 0, 0x1000], 2);
    assert_eq!((error, second), (0, 4 << 20));
    assert_eq!(handle.regions().len(), before + 2);
    // Unknown permits place nothing.
    assert_eq!(ask(&device, 7, &[APID + 1, 0, 0x1000], 3).0, libc::ENOENT);
    assert_eq!(handle.regions().len(), before + 2);

    assert_eq!(ask(&device, 8, &[0], 4).0, 0);
    assert_eq!(ask(&device, 8, &[second], 5).0, 0);
    assert_eq!(handle.regions().len(), before, "both slots removed");
    drop(vm);
}
