//! The daemon's API: JSON lines on a Unix socket (docs/clowderd-api.md). This module turns a
//! request line into a checked [`Request`]; every mistake becomes one sentence for the client.

use serde_json::{json, Map, Value};

use crate::cores::{parse_cpu_list, CoreRequest};
use crate::memory::parse_size;

/// The socket path when `CLOWDER_SOCKET` is not set.
pub const DEFAULT_SOCKET: &str = "/run/clowder/clowderd.sock";
/// Longest request line.
pub const MAX_REQUEST_LEN: usize = 256 * 1024;
/// Most input files one `run` may share into an enclave (each becomes a memory region).
pub const MAX_INPUT_FILES: usize = 128;
/// Most descriptors one request line may carry.
pub const MAX_REQUEST_FDS: usize = RUN_FIXED_FDS + MAX_INPUT_FILES;

/// Where the daemon listens and clients connect.
pub fn socket_path() -> std::path::PathBuf {
    std::env::var_os("CLOWDER_SOCKET").map_or_else(|| DEFAULT_SOCKET.into(), Into::into)
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateRequest {
    pub name: String,
    pub cores: CoreRequest,
    pub memory: u64,
    pub hugepages: bool,
    /// A group (name or gid) whose members may use and remove the enclave too.
    pub share_group: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunRequest {
    /// A persistent enclave's name; `None` runs in a one-shot enclave.
    pub enclave: Option<String>,
    pub argv: Vec<String>,
    pub env: Vec<String>,
    pub cores: Option<CoreRequest>,
    pub heap: Option<u64>,
    /// One-shot enclaves only.
    pub memory: Option<u64>,
    /// The client's working directory (absolute), where forwarded file calls land.
    pub cwd: String,
    /// Names of the input files whose descriptors follow the binary's and the directory's.
    pub files: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Create(CreateRequest),
    List,
    Remove { name: String },
    Run(RunRequest),
    Logs { name: String },
    XememList,
}

/// Descriptors a `run` request carries before its input files: the binary, the working directory.
pub const RUN_FIXED_FDS: usize = 2;

pub fn error_reply(message: impl Into<String>) -> Value {
    json!({"ok": false, "error": message.into()})
}

pub fn ok_reply(fields: Value) -> Value {
    let mut reply = Map::new();
    reply.insert("ok".into(), Value::Bool(true));
    if let Value::Object(fields) = fields {
        reply.extend(fields);
    }
    Value::Object(reply)
}

/// Enclave names: what a person types and a path component can hold.
pub fn check_name(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= 32
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        && !name.starts_with('-');
    if valid {
        Ok(())
    } else {
        Err(format!("enclave name {name:?} must be 1-32 letters, digits, '-' or '_', not starting with '-'"))
    }
}

/// The name of the `number`th one-shot enclave. Names of this form are kept for one-shot
/// enclaves, so a persistent enclave can never stand in the way of one.
pub fn one_shot_name(number: u64) -> String {
    format!("run-{number}")
}

fn is_one_shot_name(name: &str) -> bool {
    name.strip_prefix("run-").is_some_and(|number| !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit()))
}

fn string_field(request: &Map<String, Value>, key: &str) -> Result<Option<String>, String> {
    match request.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(format!("`{key}` must be a string, got {other}")),
    }
}

fn required_string(request: &Map<String, Value>, key: &str) -> Result<String, String> {
    string_field(request, key)?.ok_or_else(|| format!("request needs a string `{key}`"))
}

fn string_list(request: &Map<String, Value>, key: &str) -> Result<Vec<String>, String> {
    match request.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| item.as_str().map(String::from).ok_or_else(|| format!("`{key}` must hold only strings")))
            .collect(),
        Some(other) => Err(format!("`{key}` must be a list of strings, got {other}")),
    }
}

fn size_field(request: &Map<String, Value>, key: &str) -> Result<Option<u64>, String> {
    match request.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n.as_u64().map(Some).ok_or_else(|| format!("`{key}` must be a positive size")),
        Some(Value::String(s)) => parse_size(s).map(Some).map_err(|e| format!("`{key}`: {e}")),
        Some(other) => Err(format!("`{key}` must be a size like \"1G\" or a number of bytes, got {other}")),
    }
}

fn cores_field(request: &Map<String, Value>) -> Result<Option<CoreRequest>, String> {
    match request.get("cores") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(count) if count > 0 && count <= 255 => Ok(Some(CoreRequest::Count(count as usize))),
            _ => Err(format!(
                "`cores` must be a count from 1 to 255, or a core list string such as \"0\" or \"2-3\", got {n}"
            )),
        },
        Some(Value::String(list)) => {
            parse_cpu_list(list).map(|cores| Some(CoreRequest::Exactly(cores))).map_err(|e| format!("`cores`: {e}"))
        }
        Some(other) => Err(format!("`cores` must be a count or a core list like \"2-3\", got {other}")),
    }
}

fn bool_field(request: &Map<String, Value>, key: &str) -> Result<bool, String> {
    match request.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(format!("`{key}` must be true or false, got {other}")),
    }
}

/// Refuses keys the operation does not take, so a typo is not silently ignored.
fn only_keys(request: &Map<String, Value>, op: &str, allowed: &[&str]) -> Result<(), String> {
    match request.keys().find(|key| *key != "op" && !allowed.contains(&key.as_str())) {
        Some(key) => Err(format!("`{op}` does not take `{key}` (it takes: {})", allowed.join(", "))),
        None => Ok(()),
    }
}

/// Parses one request line.
pub fn parse_request(line: &[u8]) -> Result<Request, String> {
    let value: Value = serde_json::from_slice(line).map_err(|e| format!("malformed request (not JSON: {e})"))?;
    let Value::Object(request) = value else {
        return Err("malformed request: a request is a JSON object with an \"op\"".into());
    };
    let op = required_string(&request, "op")?;
    match op.as_str() {
        "create" => {
            only_keys(&request, &op, &["name", "kind", "cores", "mem", "hugepages", "share_group"])?;
            let name = required_string(&request, "name")?;
            check_name(&name)?;
            if is_one_shot_name(&name) {
                return Err(format!("enclave names run-N are kept for one-shot enclaves; choose another name than {name}"));
            }
            let kind = string_field(&request, "kind")?.unwrap_or_else(|| "lwk".into());
            if kind != "lwk" {
                return Err(format!("unknown enclave kind {kind:?} (known kinds: lwk)"));
            }
            Ok(Request::Create(CreateRequest {
                name,
                cores: cores_field(&request)?.unwrap_or(CoreRequest::Count(1)),
                memory: size_field(&request, "mem")?.ok_or("`create` needs `mem`, e.g. \"1G\"")?,
                hugepages: bool_field(&request, "hugepages")?,
                share_group: string_field(&request, "share_group")?,
            }))
        }
        "ls" => {
            only_keys(&request, &op, &[])?;
            Ok(Request::List)
        }
        "rm" | "logs" => {
            only_keys(&request, &op, &["name"])?;
            let name = required_string(&request, "name")?;
            Ok(if op == "rm" { Request::Remove { name } } else { Request::Logs { name } })
        }
        "run" => {
            only_keys(&request, &op, &["enclave", "argv", "env", "cores", "heap", "mem", "cwd", "files"])?;
            let argv = string_list(&request, "argv")?;
            if argv.is_empty() {
                return Err("`run` needs a non-empty `argv` (argv[0] names the program)".into());
            }
            let env = string_list(&request, "env")?;
            if let Some(bad) = env.iter().find(|e| !e.contains('=') || e.starts_with('=')) {
                return Err(format!("environment entry {bad:?} is not NAME=VALUE"));
            }
            let cwd = required_string(&request, "cwd")?;
            if !cwd.starts_with('/') {
                return Err(format!("`cwd` must be an absolute path, got {cwd:?}"));
            }
            let files = string_list(&request, "files")?;
            if files.len() > MAX_INPUT_FILES {
                return Err(format!("`run` takes at most {MAX_INPUT_FILES} input files, got {}", files.len()));
            }
            for name in &files {
                if name.is_empty() || name.contains('/') || name == "." || name == ".." {
                    return Err(format!("input file name {name:?} must be a plain file name"));
                }
            }
            let enclave = string_field(&request, "enclave")?;
            let memory = size_field(&request, "mem")?;
            if enclave.is_some() && memory.is_some() {
                return Err("`mem` sizes a one-shot enclave; a named enclave already has its memory".into());
            }
            Ok(Request::Run(RunRequest {
                enclave,
                argv,
                env,
                cores: cores_field(&request)?,
                heap: size_field(&request, "heap")?,
                memory,
                cwd,
                files,
            }))
        }
        "xemem_ls" => {
            only_keys(&request, &op, &[])?;
            Ok(Request::XememList)
        }
        other => Err(format!("unknown op {other:?} (create, ls, rm, run, logs, xemem_ls)")),
    }
}

/// Job output as JSON: text when it is UTF-8, else the raw bytes, so nothing is lost.
pub fn output_event(stream: &str, data: &[u8]) -> Value {
    match std::str::from_utf8(data) {
        Ok(text) => json!({"event": "output", "stream": stream, "text": text}),
        Err(_) => json!({"event": "output", "stream": stream, "bytes": data}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_requests_parse() {
        let create = parse_request(br#"{"op":"create","name":"sim","kind":"lwk","cores":2,"mem":"1G","hugepages":true}"#);
        assert_eq!(
            create.unwrap(),
            Request::Create(CreateRequest {
                name: "sim".into(),
                cores: CoreRequest::Count(2),
                memory: 1 << 30,
                hugepages: true,
                share_group: None
            })
        );
        let run = parse_request(br#"{"op":"run","argv":["hello","x"],"cwd":"/tmp","cores":"1","mem":268435456}"#).unwrap();
        let Request::Run(run) = run else { panic!() };
        assert_eq!(run.cores, Some(CoreRequest::Exactly([1].into())));
        assert_eq!(run.memory, Some(256 << 20));
        assert_eq!(parse_request(br#"{"op":"ls"}"#).unwrap(), Request::List);
    }

    #[test]
    fn bad_requests_say_what_is_wrong() {
        let error = |line: &[u8]| parse_request(line).unwrap_err();
        assert!(error(b"{nope").contains("malformed request"));
        assert!(error(b"[1,2]").contains("JSON object"));
        assert!(error(br#"{"op":"fly"}"#).contains("unknown op \"fly\""));
        assert!(error(br#"{"op":"create","name":"a b","mem":"1G"}"#).contains("enclave name"));
        assert!(error(br#"{"op":"create","name":"run-7","mem":"1G"}"#).contains("kept for one-shot enclaves"));
        assert!(parse_request(br#"{"op":"create","name":"run-x","mem":"1G"}"#).is_ok());
        assert!(error(br#"{"op":"create","name":"a","kind":"linux","mem":"1G"}"#).contains("known kinds: lwk"));
        assert!(error(br#"{"op":"create","name":"a"}"#).contains("needs `mem`"));
        assert!(error(br#"{"op":"create","name":"a","mem":"1G","cores":0}"#).contains("core list string such as \"0\""));
        assert!(error(br#"{"op":"create","name":"a","mem":"lots"}"#).contains("not a size"));
        assert!(error(br#"{"op":"create","name":"a","mem":"1G","core":1}"#).contains("does not take `core`"));
        assert!(error(br#"{"op":"run","argv":[],"cwd":"/"}"#).contains("non-empty `argv`"));
        assert!(error(br#"{"op":"run","argv":["a"],"cwd":"rel"}"#).contains("absolute"));
        assert!(error(br#"{"op":"run","argv":["a"],"cwd":"/","env":["X"]}"#).contains("NAME=VALUE"));
        assert!(error(br#"{"op":"run","argv":["a"],"cwd":"/","files":["../x"]}"#).contains("plain file name"));
        assert!(error(br#"{"op":"rm"}"#).contains("needs a string `name`"));
    }

    #[test]
    fn output_keeps_bytes_that_are_not_text() {
        assert_eq!(output_event("stdout", b"hi")["text"], "hi");
        assert_eq!(output_event("stderr", &[0xff, 0])["bytes"], json!([255, 0]));
    }
}
