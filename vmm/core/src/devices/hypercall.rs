//! The hypercall port and the built-in hypercalls. The vCPU loop decodes a 4-byte write to the
//! port (number in EAX, arguments in RDI, RSI, R8, R9) and dispatches it through the registry;
//! this device owns the port and the numbers below.

use std::sync::Arc;
use std::time::Instant;

use crate::hooks::{Device, DeviceError, ExitContext, HookKey, Outcome, Request};
use crate::vm::VmShared;
use crate::VmError;

use super::DeviceEnv;

pub const HC_NOP: u32 = 0;
pub const HC_READY: u32 = 1;
pub const HC_REPORT: u32 = 2;
pub const HC_HEARTBEAT: u32 = 3;

/// A key/value pair a guest reported, with where it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    pub vcpu: usize,
    pub host_core: Option<usize>,
    pub key: u64,
    pub value: u64,
}

struct BuiltinHypercalls {
    shared: Arc<VmShared>,
}

impl Device for BuiltinHypercalls {
    fn handle(&mut self, ctx: &ExitContext, request: Request<'_>) -> Result<Outcome, DeviceError> {
        match request {
            Request::Hypercall { nr, args, result } => {
                *result = 0;
                let mut events = self.shared.events.lock().unwrap();
                match nr {
                    HC_NOP => {}
                    HC_READY => {
                        events.ready_at.get_or_insert(Instant::now());
                    }
                    HC_REPORT => events.reports.push(Report { vcpu: ctx.vcpu, host_core: ctx.host_core(), key: args[0], value: args[1] }),
                    HC_HEARTBEAT => {}
                    _ => *result = -(libc::ENOSYS as i64),
                }
                Ok(Outcome::Continue)
            }
            // Reads of the port itself: nothing to read.
            Request::PortRead { data, .. } => {
                data.fill(0xff);
                Ok(Outcome::Continue)
            }
            other => Err(DeviceError(format!("hypercall device cannot handle {other:?}"))),
        }
    }
}

pub fn create(name: &str, port: u16, env: &mut DeviceEnv<'_>) -> Result<(), VmError> {
    env.registry.set_hypercall_port(port);
    env.cmdline_extra.push(format!("clowder.hypercall_port={port:#x}"));
    let keys = [
        HookKey::Port { base: port, len: 4 },
        HookKey::Hypercall(HC_NOP),
        HookKey::Hypercall(HC_READY),
        HookKey::Hypercall(HC_REPORT),
        HookKey::Hypercall(HC_HEARTBEAT),
    ];
    env.hook_all(name, &keys, BuiltinHypercalls { shared: env.shared.clone() })
}
