//! The requests and replies of a VM's control socket (`clowder-vmm --control SOCK`), on which
//! the daemon (or a test) drives a running VM. Replies that hand over descriptors (`memory`,
//! `channel`, `translate`) carry them with SCM_RIGHTS on the reply line.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::codec::Limits;
use crate::{fields, no_fields, split_op, ApiError};

/// What one control request may hold: small lines, and at most 4 descriptors (`add_region`
/// takes one; a `translate` reply carries at most this many).
pub const LIMITS: Limits = Limits { max_line: 64 * 1024, max_fds: 4, timeout: None };

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum VmmRequest {
    Stats,
    Pause,
    Resume,
    Stop,
    /// The guest RAM's memfd and its layout.
    Memory,
    /// The channel's RAM memfd, doorbell eventfd and interrupt eventfd.
    Channel,
    /// Maps the one descriptor sent with the request into the guest.
    AddRegion(AddRegion),
    RemoveRegion {
        slot: u32,
    },
    /// Which backing files hold guest-physical `gpa..gpa+len`.
    Translate {
        gpa: u64,
        len: u64,
    },
    /// Single-steps `steps` instructions of vCPU `vcpu` and counts them.
    Profile {
        vcpu: usize,
        steps: u64,
    },
}

/// The fields of `remove_region`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Slot {
    slot: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Range {
    gpa: u64,
    len: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Steps {
    vcpu: usize,
    steps: u64,
}

impl VmmRequest {
    /// Parses one request line; a mistake is one sentence naming the operation and field.
    pub fn parse(line: &[u8]) -> Result<VmmRequest, ApiError> {
        let (op, rest) = split_op(line)?;
        Ok(match op.as_str() {
            "stats" => no_fields(&op, rest).map(|()| VmmRequest::Stats)?,
            "pause" => no_fields(&op, rest).map(|()| VmmRequest::Pause)?,
            "resume" => no_fields(&op, rest).map(|()| VmmRequest::Resume)?,
            "stop" => no_fields(&op, rest).map(|()| VmmRequest::Stop)?,
            "memory" => no_fields(&op, rest).map(|()| VmmRequest::Memory)?,
            "channel" => no_fields(&op, rest).map(|()| VmmRequest::Channel)?,
            "add_region" => VmmRequest::AddRegion(fields(&op, rest)?),
            "remove_region" => fields::<Slot>(&op, rest).map(|s| VmmRequest::RemoveRegion { slot: s.slot })?,
            "translate" => fields::<Range>(&op, rest).map(|r| VmmRequest::Translate { gpa: r.gpa, len: r.len })?,
            "profile" => fields::<Steps>(&op, rest).map(|s| VmmRequest::Profile { vcpu: s.vcpu, steps: s.steps })?,
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown op {other:?} (stats, pause, resume, stop, memory, channel, add_region, remove_region, \
                     translate, profile)"
                )))
            }
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddRegion {
    /// Where in the descriptor's file the region starts, and its length.
    pub offset: u64,
    pub len: u64,
    /// Where in the guest; the VMM chooses when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpa: Option<u64>,
    #[serde(default)]
    pub read_only: bool,
}

/// A memory region added to the guest (`add_region`, `remove_region`, and in `stats`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Region {
    pub slot: u32,
    pub gpa: u64,
    pub len: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsReply {
    /// The VM's state (`Created`, `Running`, `Paused`, ...).
    pub state: String,
    /// VM exits by reason.
    pub exits: BTreeMap<String, u64>,
    pub regions: Vec<Region>,
}

/// A stretch of guest RAM and where it lies in the memfd.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RamRange {
    pub gpa: u64,
    pub size: u64,
    pub file_offset: u64,
}

/// The reply to `memory`, with the RAM's memfd.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryReply {
    pub size: u64,
    pub ranges: Vec<RamRange>,
}

/// The reply to `channel`, with the descriptors `fds` names, in that order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelReply {
    pub gpa: u64,
    pub size: u64,
    pub memfd_offset: u64,
    pub vector: u8,
    pub doorbell_port: u16,
    pub fds: Vec<String>,
}

/// A run of guest-physical memory in the `fd_index`th descriptor sent with the reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Run {
    pub fd_index: usize,
    pub offset: u64,
    pub len: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TranslateReply {
    pub runs: Vec<Run>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProfileReply {
    pub steps: u64,
    pub kernel: u64,
    pub user: u64,
    pub kernel_entries: u64,
    pub kernel_per_entry: Option<f64>,
    /// The most stepped kernel addresses (hex) and how often each was stepped.
    pub hot_kernel_addresses: Vec<(String, u64)>,
}

/// The reply of `pause`, `resume` and `stop`: nothing but `ok`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Done {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_request_goes_through_the_wire_unchanged() {
        let add = AddRegion { offset: 0, len: 4096, gpa: Some(1 << 32), read_only: true };
        for request in [
            VmmRequest::Stats,
            VmmRequest::Pause,
            VmmRequest::Resume,
            VmmRequest::Stop,
            VmmRequest::Memory,
            VmmRequest::Channel,
            VmmRequest::AddRegion(add),
            VmmRequest::RemoveRegion { slot: 3 },
            VmmRequest::Translate { gpa: 4096, len: 8192 },
            VmmRequest::Profile { vcpu: 0, steps: 100 },
        ] {
            let line = serde_json::to_vec(&request).unwrap();
            assert_eq!(VmmRequest::parse(&line).unwrap(), request, "{}", String::from_utf8_lossy(&line));
        }
    }

    #[test]
    fn bad_requests_name_the_field() {
        let error = |line: &str| VmmRequest::parse(line.as_bytes()).unwrap_err().message;
        assert!(error(r#"{"op":"add_region","offset":0,"len":4096,"read_only":"yes"}"#).contains("`read_only`"));
        assert!(error(r#"{"op":"translate","gpa":-1,"len":1}"#).contains("`gpa`"));
        assert!(error(r#"{"op":"stats","verbose":true}"#).contains("unknown field `verbose`"));
        assert!(error(r#"{"op":"fly"}"#).contains("unknown op"));
    }
}
