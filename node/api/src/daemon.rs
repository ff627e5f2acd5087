//! clowderd's requests and replies (docs/api-schema.md). A request is one JSON object whose
//! `op` names the operation; fields an operation does not take are refused. Sizes and core
//! sets travel as the person wrote them and the daemon checks them against the host.

use std::fmt;
use std::path::PathBuf;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

use crate::{fields, no_fields, split_op, ApiError};

/// The socket path when `CLOWDER_SOCKET` is not set.
pub const DEFAULT_SOCKET: &str = "/run/clowder/clowderd.sock";
/// Longest request line.
pub const MAX_REQUEST_LEN: usize = 256 * 1024;
/// Longest line a client takes from the daemon (a `logs` reply of 2000 long lines fits).
pub const MAX_REPLY_LEN: usize = 64 << 20;
/// Most input files one `run` may share into an enclave (each becomes a memory region).
pub const MAX_INPUT_FILES: usize = 128;
/// Descriptors a `run` request carries before its input files: the binary, the working directory.
pub const RUN_FIXED_FDS: usize = 2;
/// Most descriptors one request line may carry.
pub const MAX_REQUEST_FDS: usize = RUN_FIXED_FDS + MAX_INPUT_FILES;

/// Where the daemon listens and clients connect.
pub fn socket_path() -> PathBuf {
    std::env::var_os("CLOWDER_SOCKET").map_or_else(|| DEFAULT_SOCKET.into(), Into::into)
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// The daemon's and the API's versions.
    Version,
    Create(Create),
    Ls,
    Rm(Named),
    Logs(Named),
    Run(Run),
    XememLs,
}

impl Request {
    /// Parses one request line; every mistake is one sentence naming the operation and field.
    pub fn parse(line: &[u8]) -> Result<Request, ApiError> {
        let (op, rest) = split_op(line)?;
        Ok(match op.as_str() {
            "version" => no_fields(&op, rest).map(|()| Request::Version)?,
            "create" => Request::Create(fields(&op, rest)?),
            "ls" => no_fields(&op, rest).map(|()| Request::Ls)?,
            "rm" => Request::Rm(fields(&op, rest)?),
            "logs" => Request::Logs(fields(&op, rest)?),
            "run" => Request::Run(fields(&op, rest)?),
            "xemem_ls" => no_fields(&op, rest).map(|()| Request::XememLs)?,
            other => return Err(ApiError::invalid(format!("unknown op {other:?} (version, create, ls, rm, run, logs, xemem_ls)"))),
        })
    }

    /// Whether the request needs root or the `clowder` group.
    pub fn is_privileged(&self) -> bool {
        matches!(self, Request::Create(_) | Request::Rm(_) | Request::Run(_))
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EnclaveKind {
    #[default]
    Lwk,
    /// A Linux virtual machine whose agent speaks the enclave protocol (docs/linux-guest.md).
    Linux,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Create {
    /// 1-32 of `[A-Za-z0-9_-]`, not `run-N`.
    pub name: String,
    #[serde(default)]
    pub kind: EnclaveKind,
    /// A count (the default is 1) or a core list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores: Option<Cores>,
    pub mem: Size,
    #[serde(default)]
    pub hugepages: bool,
    /// A group (name or gid) whose members may use and remove the enclave too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_group: Option<String>,
    /// Send [`JobEvent::Progress`] lines while the enclave's memory is populated. Off unless
    /// asked for, so that a client which knows no events reads the reply as its first line.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub progress: bool,
    /// An absolute host directory: every job of the enclave may name only files beneath it
    /// (and must start there). Without it a job may open whatever its user may.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confine: Option<String>,
    /// `linux` only: the guest kernel and initramfs, absolute host paths the client may read
    /// (the daemon's defaults otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd: Option<String>,
    /// `linux` only: the guest's network (docs/linux-guest.md); none without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net: Option<Network>,
}

/// A Linux enclave's network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Network {
    /// A virtio-net device over a host tap of the daemon's, with a /30 the daemon picks: the
    /// guest reaches the host's end and nothing the daemon does not route (it routes nothing).
    Tap,
}

/// `rm` and `logs` name an enclave.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Named {
    pub name: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Run {
    /// A persistent enclave; without it the job gets a one-shot enclave of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enclave: Option<String>,
    pub argv: Vec<String>,
    /// `NAME=VALUE` entries.
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores: Option<Cores>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heap: Option<Size>,
    /// A one-shot enclave's memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem: Option<Size>,
    /// The client's working directory (absolute); its descriptor rides with the request.
    pub cwd: String,
    /// Names of the input files whose descriptors follow the binary's and the directory's.
    #[serde(default)]
    pub files: Vec<String>,
    /// An absolute host directory, holding `cwd`: the job may name only files beneath it
    /// (persistent enclaves; within the enclave's own `confine`, if it has one). Without it
    /// the job may open whatever its user may.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confine: Option<String>,
}

/// `cores`: a count (a JSON number, 1..255) or a core list (a string: "0", "2-3", "1,3").
/// Written as the bare number or string; read by hand, for errors that say what is expected.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Cores {
    Count(u32),
    List(String),
}

const CORES_EXPECTED: &str = "a count from 1 to 255, or a core list string such as \"0\" or \"2-3\"";

impl<'de> Deserialize<'de> for Cores {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Cores, D::Error> {
        struct CoresVisitor;
        impl Visitor<'_> for CoresVisitor {
            type Value = Cores;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(CORES_EXPECTED)
            }
            fn visit_u64<E: de::Error>(self, count: u64) -> Result<Cores, E> {
                match count {
                    1..=255 => Ok(Cores::Count(count as u32)),
                    _ => Err(E::custom(format!("expected {CORES_EXPECTED}, got {count}"))),
                }
            }
            fn visit_i64<E: de::Error>(self, count: i64) -> Result<Cores, E> {
                Err(E::custom(format!("expected {CORES_EXPECTED}, got {count}")))
            }
            fn visit_str<E: de::Error>(self, list: &str) -> Result<Cores, E> {
                Ok(Cores::List(list.to_string()))
            }
        }
        deserializer.deserialize_any(CoresVisitor)
    }
}

/// A size: a number of bytes, or a string with a binary suffix ("64K", "512M", "1G"). Written
/// as the bare number or string; read by hand, as `Cores`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Size {
    Bytes(u64),
    Text(String),
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Size, D::Error> {
        struct SizeVisitor;
        impl Visitor<'_> for SizeVisitor {
            type Value = Size;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a size like \"1G\" or a number of bytes")
            }
            fn visit_u64<E: de::Error>(self, bytes: u64) -> Result<Size, E> {
                Ok(Size::Bytes(bytes))
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Size, E> {
                Ok(Size::Text(text.to_string()))
            }
        }
        deserializer.deserialize_any(SizeVisitor)
    }
}

/// The reply to `version`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionReply {
    /// The daemon's own version (its package version).
    pub daemon_version: String,
    /// The API version it speaks ([`crate::API_VERSION`]).
    pub api_version: u32,
}

/// An enclave as `ls` and `create` describe it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnclaveInfo {
    pub name: String,
    pub kind: EnclaveKind,
    pub mode: Mode,
    /// `starting`, `ready`, or for a one-shot enclave `running PROGRAM` (just `running` to
    /// those who may not see its job).
    pub state: String,
    pub cores: String,
    pub mem: String,
    pub hugepages: bool,
    pub pid: Option<u32>,
    pub jobs: usize,
    /// Unix seconds.
    pub created: u64,
    /// The enclave channel's protocol, once the kernel said `Hello` (persistent enclaves).
    pub channel: Option<ChannelInfo>,
    /// The owner's user name (their uid when they have none).
    pub owner: String,
    pub owner_uid: u32,
    pub share_group: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    Persistent,
    OneShot,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelInfo {
    pub version: u16,
    pub vcpus: u16,
}

/// An enclave that failed or was removed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemovedInfo {
    pub name: String,
    /// Why, for those who may use the enclave; `null` for others.
    pub reason: Option<String>,
    /// Unix seconds.
    pub at: u64,
    pub owner: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LsReply {
    pub enclaves: Vec<EnclaveInfo>,
    pub removed: Vec<RemovedInfo>,
    /// The cores no enclave holds, as a core list.
    pub free_cores: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateReply {
    pub enclave: EnclaveInfo,
    /// What was done about host tasks on the enclave's cores.
    pub notes: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RmReply {
    pub removed: String,
    pub how: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogsReply {
    pub name: String,
    pub lines: Vec<String>,
    /// Why the enclave went, when it is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removed: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
}

/// The lines a `run`, or a `create` with `progress`, sends before its reply (they have `event`
/// and no `ok`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum JobEvent {
    /// The job started: in a persistent enclave as job `job`, or in one-shot enclave
    /// `enclave` (its VMM `pid`, on `cores`).
    Started {
        enclave: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        job: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pid: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cores: Option<String>,
    },
    /// Output of the job: `text` when it is UTF-8, else the raw `bytes`, so nothing is lost.
    Output {
        stream: Stream,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bytes: Option<Vec<u8>>,
    },
    /// A line of a one-shot enclave's kernel.
    Log { text: String },
    /// How far populating the enclave's memory got (`create` with `progress: true`): sent about
    /// once a second while it takes more than a second, `done_mib` rising to `total_mib`.
    Progress { done_mib: u64, total_mib: u64, elapsed_ms: u64 },
}

impl JobEvent {
    pub fn output(stream: Stream, data: &[u8]) -> JobEvent {
        match std::str::from_utf8(data) {
            Ok(text) => JobEvent::Output { stream, text: Some(text.to_string()), bytes: None },
            Err(_) => JobEvent::Output { stream, text: None, bytes: Some(data.to_vec()) },
        }
    }
}

/// The reply that ends a `run`: the job's exit status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunReply {
    /// Always `exited`.
    pub event: String,
    /// The exit code (0..=255), or 256 + N when signal N killed the job (enclave-proto's
    /// `JobExited`).
    pub status: u32,
    /// The job's number in a persistent enclave.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<u32>,
    /// The one-shot enclave it ran in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enclave: Option<String>,
}

impl RunReply {
    pub fn exited(status: u32, job: Option<u32>, enclave: Option<String>) -> RunReply {
        RunReply { event: "exited".into(), status, job, enclave }
    }
}

/// The reply to `xemem_ls`: the segments the host's XEMEM name server knows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct XememLsReply {
    /// The broker's socket.
    pub socket: String,
    pub segments: Vec<Segment>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    pub segid: u64,
    pub segid_hex: String,
    /// The enclave that made it (1 is the host's own name server).
    pub owner_enclave: Option<u64>,
    pub owner_process: Option<i64>,
    pub size: Option<u64>,
    pub name: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn error(line: &str) -> String {
        let error = Request::parse(line.as_bytes()).unwrap_err();
        assert_eq!(error.kind, ErrorKind::InvalidArgument);
        error.message
    }

    #[test]
    fn every_request_goes_through_the_wire_unchanged() {
        let create = Create {
            name: "sim".into(),
            kind: EnclaveKind::Lwk,
            cores: Some(Cores::List("2-3".into())),
            mem: Size::Text("1G".into()),
            hugepages: true,
            share_group: Some("sim-users".into()),
            progress: true,
            confine: Some("/scratch/sim".into()),
            kernel: None,
            initrd: None,
            net: None,
        };
        let vm = Create {
            name: "vm".into(),
            kind: EnclaveKind::Linux,
            cores: None,
            mem: Size::Text("512M".into()),
            hugepages: false,
            share_group: None,
            progress: false,
            confine: None,
            kernel: Some("/boot/vmlinux".into()),
            initrd: Some("/boot/agent.cpio".into()),
            net: Some(Network::Tap),
        };
        let run = Run {
            enclave: Some("sim".into()),
            argv: vec!["./hpccg".into(), "64".into()],
            env: vec!["A=1".into()],
            cores: Some(Cores::Count(2)),
            heap: Some(Size::Bytes(1 << 29)),
            mem: None,
            cwd: "/home/me".into(),
            files: vec!["params.txt".into()],
            confine: Some("/home/me".into()),
        };
        let named = Named { name: "sim".into() };
        for request in [
            Request::Version,
            Request::Create(create),
            Request::Create(vm),
            Request::Ls,
            Request::Rm(named.clone()),
            Request::Logs(named),
            Request::Run(run),
            Request::XememLs,
        ] {
            let line = serde_json::to_vec(&request).unwrap();
            assert_eq!(Request::parse(&line).unwrap(), request, "{}", String::from_utf8_lossy(&line));
        }
    }

    #[test]
    fn the_wire_format_is_flat_with_an_op() {
        let line = br#"{"op":"create","name":"sim","cores":0,"mem":"1G"}"#;
        assert!(error(std::str::from_utf8(line).unwrap()).contains("core list string such as \"0\""));
        let parsed = Request::parse(br#"{"op":"create","name":"sim","cores":2,"mem":268435456,"hugepages":true}"#).unwrap();
        let Request::Create(create) = parsed else { panic!("{parsed:?}") };
        assert_eq!((create.cores, create.mem, create.kind), (Some(Cores::Count(2)), Size::Bytes(256 << 20), EnclaveKind::Lwk));
        assert_eq!(serde_json::to_string(&Request::Ls).unwrap(), r#"{"op":"ls"}"#);
        let parsed = Request::parse(br#"{"op":"create","name":"vm","kind":"linux","mem":"1G"}"#).unwrap();
        assert!(matches!(parsed, Request::Create(Create { kind: EnclaveKind::Linux, .. })), "{parsed:?}");
    }

    #[test]
    fn keys_and_values_with_control_characters_are_quoted_on_one_line() {
        // serde quotes an unknown key or variant verbatim; the JSON escapes are real newlines by then.
        for (line, quoted) in [
            (r#"{"op":"create","a\nb":1}"#, r"unknown field `a\nb`"),
            (r#"{"op":"ls","x\u001b[2J":1}"#, r"unknown field `x\u{1b}[2J`"),
            (r#"{"op":"create","name":"a","kind":"l\r\nwk","mem":"1G"}"#, r"unknown variant `l\r\nwk`"),
        ] {
            let message = error(line);
            assert!(!message.contains(char::is_control), "{message:?}");
            assert!(message.contains(quoted), "{message:?}");
        }
    }

    #[test]
    fn bad_requests_say_what_is_wrong_and_name_the_field() {
        assert!(error("{nope").contains("malformed request"));
        assert!(error("[1,2]").contains("JSON object"));
        assert!(error(r#"{"name":"x"}"#).contains("no \"op\""));
        assert!(error(r#"{"op":"fly"}"#).contains("unknown op \"fly\""));
        let unknown = error(r#"{"op":"create","name":"a","mem":"1G","core":1}"#);
        assert!(unknown.contains("unknown field `core`") && unknown.contains("`create`"), "{unknown}");
        assert_eq!(error(r#"{"op":"rm","name":7}"#), "`rm`: `name`: invalid type: integer `7`, expected a string");
        assert_eq!(error(r#"{"op":"ls","all":true}"#), "`ls`: unknown field `all`, there are no fields");
        let mistyped = error(r#"{"op":"create","name":7,"mem":"1G"}"#);
        assert!(mistyped.contains("`name`") && mistyped.contains("invalid type"), "{mistyped}");
        assert!(error(r#"{"op":"create","name":"a"}"#).contains("missing field `mem`"));
        assert!(error(r#"{"op":"create","name":"a","kind":"windows","mem":"1G"}"#).contains("expected `lwk` or `linux`"));
        assert!(error(r#"{"op":"create","name":"a","mem":[1]}"#).contains("a size like"));
        assert!(error(r#"{"op":"run","argv":["a"],"cwd":"/","env":[1]}"#).contains("`env[0]`"));
        assert!(error(r#"{"op":"rm"}"#).contains("missing field `name`"));
        assert!(error(r#"{"op":"ls","all":true}"#).contains("unknown field `all`"));
        assert!(error(r#"{"op":"version","x":1}"#).contains("`version`"));
    }

    #[test]
    fn progress_is_asked_for_and_comes_as_an_event() {
        // An older client's create (no `progress`) is still valid and asks for none.
        let Request::Create(old) = Request::parse(br#"{"op":"create","name":"sim","mem":"1G"}"#).unwrap() else { panic!() };
        assert!(!old.progress);
        assert!(!serde_json::to_string(&Request::Create(old)).unwrap().contains("progress"));
        let event = JobEvent::Progress { done_mib: 512, total_mib: 2048, elapsed_ms: 1200 };
        let line = serde_json::to_value(&event).unwrap();
        assert_eq!(line, serde_json::json!({"event": "progress", "done_mib": 512, "total_mib": 2048, "elapsed_ms": 1200}));
        assert_eq!(serde_json::from_value::<JobEvent>(line).unwrap(), event);
    }

    #[test]
    fn output_keeps_bytes_that_are_not_text() {
        let text = serde_json::to_value(JobEvent::output(Stream::Stdout, b"hi")).unwrap();
        assert_eq!(text, serde_json::json!({"event": "output", "stream": "stdout", "text": "hi"}));
        let bytes = serde_json::to_value(JobEvent::output(Stream::Stderr, &[0xff, 0])).unwrap();
        assert_eq!(bytes, serde_json::json!({"event": "output", "stream": "stderr", "bytes": [255, 0]}));
    }
}
