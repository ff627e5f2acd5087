//! Every kind of exit a device can hook, driven by the test guest's `hooks` test: port I/O of
//! each width (a device added by the test), MMIO (`mmio-scratch`), MSRs (`msr-scratch`), built-in
//! and test-provided hypercalls.

#[macro_use]
mod guest_support;

use std::sync::{Arc, Mutex};

use guest_support::{Guest, GuestSpec};
use vmm::{Device, DeviceError, ExitContext, ExtraDevice, HookKey, Outcome, Request};

const SCRATCH_PORT: u16 = 0x600;
const MMIO_BASE: u64 = 0xd000_0000;
const SCRATCH_MSR: u32 = 0x4c00_0100;
const TEST_HYPERCALL: u32 = 0x100;

/// Four bytes of port space that read back what was written; counts accesses by width.
#[derive(Default)]
struct PortScratch {
    bytes: [u8; 4],
    writes_by_width: [u32; 5],
}

impl Device for PortScratch {
    fn handle(&mut self, _: &ExitContext, request: Request<'_>) -> Result<Outcome, DeviceError> {
        match request {
            Request::PortWrite { offset, data } => {
                let start = offset as usize;
                self.bytes
                    .get_mut(start..start + data.len())
                    .ok_or_else(|| DeviceError(format!("write past the scratch port at +{offset}")))?
                    .copy_from_slice(data);
                self.writes_by_width[data.len()] += 1;
            }
            Request::PortRead { offset, data } => {
                let start = offset as usize;
                data.copy_from_slice(
                    self.bytes
                        .get(start..start + data.len())
                        .ok_or_else(|| DeviceError(format!("read past the scratch port at +{offset}")))?,
                );
            }
            other => return Err(DeviceError(format!("port scratch cannot handle {other:?}"))),
        }
        Ok(Outcome::Continue)
    }
}

/// A hypercall whose result encodes its four arguments by position, so a test can tell that
/// RDI, RSI, R8 and R9 arrived in that order.
struct PositionalHypercall;

impl Device for PositionalHypercall {
    fn handle(&mut self, _: &ExitContext, request: Request<'_>) -> Result<Outcome, DeviceError> {
        match request {
            Request::Hypercall { args, result, .. } => {
                *result = (args[0] + 10 * args[1] + 100 * args[2] + 1000 * args[3]) as i64;
                Ok(Outcome::Continue)
            }
            other => Err(DeviceError(format!("test hypercall cannot handle {other:?}"))),
        }
    }
}

#[test]
fn port_mmio_msr_and_hypercall_hooks_round_trip() {
    require_kvm!();
    let port_scratch = Arc::new(Mutex::new(PortScratch::default()));
    let extra = vec![
        ExtraDevice { name: "port-scratch".into(), keys: vec![HookKey::Port { base: SCRATCH_PORT, len: 4 }], device: port_scratch.clone() },
        ExtraDevice {
            name: "positional".into(),
            keys: vec![HookKey::Hypercall(TEST_HYPERCALL)],
            device: Arc::new(Mutex::new(PositionalHypercall)),
        },
    ];
    let spec =
        GuestSpec::new(&format!("test=hooks port={SCRATCH_PORT:#x} mmio={MMIO_BASE:#x} msr={SCRATCH_MSR:#x} hc={TEST_HYPERCALL:#x}"))
            .devices(&format!(
                r#"
[[device]]
kind = "mmio-scratch"
base = {MMIO_BASE}
size = 4096
[[device]]
kind = "msr-scratch"
msrs = [{SCRATCH_MSR}]
"#
            ));
    let done = Guest::start_with(spec, extra).finish();
    done.assert_exit(0);

    assert_eq!(done.value("pio8"), 0xa5, "{done}");
    assert_eq!(done.value("pio16"), 0xbeef, "{done}");
    assert_eq!(done.value("pio32"), 0x1234_5678, "{done}");
    assert_eq!(port_scratch.lock().unwrap().writes_by_width, [0, 1, 1, 0, 1], "one write of each width");

    assert_eq!(done.value("mmio32"), 0xdead_beef, "{done}");
    assert_eq!(done.value("mmio64"), 0x0123_4567_89ab_cdef, "{done}");
    assert_eq!(done.value("mmio8"), 0x5a, "{done}");
    assert!(done.exit_count("mmio_write") >= 3 && done.exit_count("mmio_read") >= 3, "{:?}", done.exit_counters);

    assert_eq!(done.value("msr"), 0xfeed_face_cafe_f00d, "{done}");
    assert_eq!(done.exit_count("msr_write"), 1, "{:?}", done.exit_counters);
    assert_eq!(done.exit_count("msr_read"), 1, "{:?}", done.exit_counters);

    assert_eq!(done.value("hcnop"), 0);
    assert_eq!(done.value("hcbeat"), 0);
    assert_eq!(done.value("hcunk") as i64, -38, "unknown hypercalls return -ENOSYS");
    assert_eq!(done.value("hcres"), 4321, "arguments arrive in RDI, RSI, R8, R9");
    assert!(done.serial.contains("hooks: done"), "{done}");
}

#[test]
fn hooks_test_without_devices_only_makes_hypercalls() {
    require_kvm!();
    let done = guest_support::run(GuestSpec::new("test=hooks"));
    done.assert_exit(0);
    assert!(done.values("pio8").is_empty() && done.values("mmio32").is_empty() && done.values("msr").is_empty());
    assert_eq!(done.value("hcunk") as i64, -38);
    // An unhooked hypercall number given with hc= is unknown too.
    let done = guest_support::run(GuestSpec::new("test=hooks hc=0x1234"));
    assert_eq!(done.value("hcres") as i64, -38);
}

#[test]
fn msr_nobody_handles_raises_general_protection_in_the_guest() {
    require_kvm!();
    // Neither KVM nor a device knows this MSR: the guest gets #GP (vector 13), which its IDT
    // reports before exiting with 0xee.
    let done = guest_support::run(GuestSpec::new("test=hooks msr=0xdeadbeef"));
    done.assert_exit(0xee);
    assert!(done.serial.contains("testguest: exception 13 "), "{done}");
    assert!(done.values("msr").is_empty());
}
