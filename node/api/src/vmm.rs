//! The requests and replies of a VM's control socket (`clowder-vmm --control SOCK`), on which
//! the daemon (or a test) drives a running VM. Replies that hand over descriptors (`memory`,
//! `channel`, `translate`) carry them with SCM_RIGHTS on the reply line.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::codec::Limits;
use crate::{fields, no_fields, split_op, ApiError};

/// What one control request may hold: lines long enough for `add_pieces` with
/// [`MAX_PIECES`] pieces, and at most 4 descriptors (`add_region` takes one; a `translate`
/// reply carries at most this many).
pub const LIMITS: Limits = Limits { max_line: MAX_PIECES * Piece::MAX_JSON + 4096, max_fds: 4, timeout: None };

/// The most pieces one `add_pieces` may name (4 GiB of 4 KiB pages). The VMM maps each
/// piece on its own, so the host's `vm.max_map_count` (65530 by default) bounds them first.
pub const MAX_PIECES: usize = 1 << 20;

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
    /// Maps pieces of the one descriptor sent with the request, end to end, as one region.
    AddPieces(AddPieces),
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
            "add_pieces" => VmmRequest::AddPieces(fields(&op, rest)?),
            "remove_region" => fields::<Slot>(&op, rest).map(|s| VmmRequest::RemoveRegion { slot: s.slot })?,
            "translate" => fields::<Range>(&op, rest).map(|r| VmmRequest::Translate { gpa: r.gpa, len: r.len })?,
            "profile" => fields::<Steps>(&op, rest).map(|s| VmmRequest::Profile { vcpu: s.vcpu, steps: s.steps })?,
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown op {other:?} (stats, pause, resume, stop, memory, channel, add_region, add_pieces, \
                     remove_region, translate, profile)"
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

/// The fields of `add_pieces`: one region made of `pieces` of the descriptor's file, end to
/// end in the guest (one memory slot for an owner's scattered frames).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddPieces {
    pub pieces: Vec<Piece>,
    /// Where in the guest; the VMM chooses when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpa: Option<u64>,
    #[serde(default)]
    pub read_only: bool,
}

/// `len` bytes of a file from `offset`; on the wire `[offset, len]` (a request names up to
/// [`MAX_PIECES`] of them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "(u64, u64)", into = "(u64, u64)")]
pub struct Piece {
    pub offset: u64,
    pub len: u64,
}

impl Piece {
    /// The longest a piece is in JSON: `[`, two 20-digit numbers, `,`, `]` and a `,` after it.
    const MAX_JSON: usize = 2 * 20 + 4;
}

impl From<(u64, u64)> for Piece {
    fn from((offset, len): (u64, u64)) -> Piece {
        Piece { offset, len }
    }
}

impl From<Piece> for (u64, u64) {
    fn from(piece: Piece) -> (u64, u64) {
        (piece.offset, piece.len)
    }
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
            VmmRequest::AddPieces(AddPieces {
                pieces: vec![Piece { offset: 8192, len: 4096 }, Piece::from((0, 4096))],
                gpa: None,
                read_only: false,
            }),
            VmmRequest::RemoveRegion { slot: 3 },
            VmmRequest::Translate { gpa: 4096, len: 8192 },
            VmmRequest::Profile { vcpu: 0, steps: 100 },
        ] {
            let line = serde_json::to_vec(&request).unwrap();
            assert_eq!(VmmRequest::parse(&line).unwrap(), request, "{}", String::from_utf8_lossy(&line));
        }
    }

    #[test]
    fn pieces_are_pairs_on_the_wire_and_the_most_fit_one_line() {
        let pieces = vec![Piece { offset: u64::MAX, len: u64::MAX }; MAX_PIECES];
        let line = serde_json::to_vec(&VmmRequest::AddPieces(AddPieces { pieces, gpa: Some(u64::MAX), read_only: true })).unwrap();
        assert!(line.len() < LIMITS.max_line, "{} bytes", line.len());
        let one = serde_json::to_string(&Piece { offset: 4096, len: 8192 }).unwrap();
        assert_eq!(one, "[4096,8192]");
    }

    #[test]
    fn bad_requests_name_the_field() {
        let error = |line: &str| VmmRequest::parse(line.as_bytes()).unwrap_err().message;
        assert!(error(r#"{"op":"add_region","offset":0,"len":4096,"read_only":"yes"}"#).contains("`read_only`"));
        assert!(error(r#"{"op":"translate","gpa":-1,"len":1}"#).contains("`gpa`"));
        assert!(error(r#"{"op":"stats","verbose":true}"#).contains("unknown field `verbose`"));
        for pieces in ["[[0,4096,1]]", r#"[{"offset":0}]"#, "[[0,-1]]"] {
            let message = error(&format!(r#"{{"op":"add_pieces","pieces":{pieces}}}"#));
            assert!(message.contains("`pieces[0]"), "{pieces}: {message}");
        }
        assert!(error(r#"{"op":"fly"}"#).contains("unknown op"));
    }
}
