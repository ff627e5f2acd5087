//! Scratch devices: guest-visible registers behind MMIO and MSR exits, for probing a guest's
//! access paths and for tests: what the guest writes, it reads back.

use std::collections::BTreeMap;

use crate::hooks::{Device, DeviceError, ExitContext, HookKey, Outcome, Request};
use crate::VmError;

use super::DeviceEnv;

struct MmioScratch {
    bytes: Vec<u8>,
}

impl Device for MmioScratch {
    fn handle(&mut self, _: &ExitContext, request: Request<'_>) -> Result<Outcome, DeviceError> {
        let span = |offset: u64, len: usize, size: usize| {
            let start = offset as usize;
            (start + len <= size).then_some(start..start + len)
        };
        match request {
            Request::MmioRead { offset, data } => {
                let range = span(offset, data.len(), self.bytes.len())
                    .ok_or_else(|| DeviceError(format!("read at {offset:#x} crosses the window end")))?;
                data.copy_from_slice(&self.bytes[range]);
            }
            Request::MmioWrite { offset, data } => {
                let range = span(offset, data.len(), self.bytes.len())
                    .ok_or_else(|| DeviceError(format!("write at {offset:#x} crosses the window end")))?;
                self.bytes[range].copy_from_slice(data);
            }
            other => return Err(DeviceError(format!("mmio-scratch cannot handle {other:?}"))),
        }
        Ok(Outcome::Continue)
    }
}

struct MsrScratch {
    values: BTreeMap<u32, u64>,
}

impl Device for MsrScratch {
    fn handle(&mut self, _: &ExitContext, request: Request<'_>) -> Result<Outcome, DeviceError> {
        match request {
            Request::MsrRead { index, value } => *value = self.values.get(&index).copied().unwrap_or(0),
            Request::MsrWrite { index, value } => {
                self.values.insert(index, value);
            }
            other => return Err(DeviceError(format!("msr-scratch cannot handle {other:?}"))),
        }
        Ok(Outcome::Continue)
    }
}

pub fn create_mmio(name: &str, base: u64, size: u64, env: &mut DeviceEnv<'_>) -> Result<(), VmError> {
    let device = MmioScratch { bytes: vec![0; size as usize] };
    env.hook_all(name, &[HookKey::Mmio { base, len: size }], device)
}

pub fn create_msr(name: &str, msrs: &[u32], env: &mut DeviceEnv<'_>) -> Result<(), VmError> {
    let keys: Vec<HookKey> = msrs.iter().map(|m| HookKey::Msr(*m)).collect();
    env.hook_all(name, &keys, MsrScratch { values: BTreeMap::new() })
}
