//! The power-off port: the guest writes its exit status and the VM ends.

use crate::hooks::{Device, DeviceError, ExitContext, HookKey, Outcome, Request};
use crate::stop::StopReason;
use crate::VmError;

use super::DeviceEnv;

struct ExitPort;

impl Device for ExitPort {
    fn handle(&mut self, _: &ExitContext, request: Request<'_>) -> Result<Outcome, DeviceError> {
        match request {
            Request::PortWrite { data, .. } => Ok(Outcome::Stop(StopReason::GuestExit(data[0]))),
            Request::PortRead { data, .. } => {
                data.fill(0);
                Ok(Outcome::Continue)
            }
            other => Err(DeviceError(format!("exit port cannot handle {other:?}"))),
        }
    }
}

pub fn create(name: &str, port: u16, env: &mut DeviceEnv<'_>) -> Result<(), VmError> {
    env.cmdline_extra.push(format!("clowder.exit_port={port:#x}"));
    env.hook_all(name, &[HookKey::Port { base: port, len: 4 }], ExitPort)
}
