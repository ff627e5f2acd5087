//! The daemon's side of the API (docs/api-schema.md): the wire types are `clowder_api`'s; this
//! module checks a request's values against the daemon's rules (names, sizes, core lists) and
//! turns them into what the handlers take. Every mistake becomes one sentence for the client.

use clowder_api::daemon::{Cores, Create, EnclaveKind, Run, Size, MAX_INPUT_FILES};
use clowder_api::{ApiError, ErrorKind};
use serde_json::Value;

use crate::cores::{parse_cpu_list, CoreRequest};
use crate::linux_enclave::LinuxRequest;
use crate::memory::parse_size;

pub use clowder_api::daemon::{socket_path, RUN_FIXED_FDS};

/// A `create` whose values were checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateRequest {
    pub name: String,
    pub cores: CoreRequest,
    pub memory: u64,
    pub hugepages: bool,
    /// A group (name or gid) whose members may use and remove the enclave too.
    pub share_group: Option<String>,
    /// The client asked for progress events while the memory is populated.
    pub progress: bool,
    /// An absolute directory every job of the enclave is confined to.
    pub confine: Option<String>,
    /// A Linux enclave (`kind: linux`) and its guest; `None` for the LWK.
    pub linux: Option<LinuxRequest>,
}

/// A `run` whose values were checked.
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
    /// An absolute directory the job is confined to (persistent enclaves).
    pub confine: Option<String>,
}

/// An error reply of `kind`.
pub fn error_reply(kind: ErrorKind, message: impl Into<String>) -> Value {
    ApiError::new(kind, message).reply()
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

fn size(key: &str, size: Size) -> Result<u64, ApiError> {
    match size {
        Size::Bytes(bytes) => Ok(bytes),
        Size::Text(text) => parse_size(&text).map_err(|e| ApiError::invalid(format!("`{key}`: {e}"))),
    }
}

fn cores(cores: Cores) -> Result<CoreRequest, ApiError> {
    match cores {
        Cores::Count(count) => Ok(CoreRequest::Count(count as usize)),
        Cores::List(list) => parse_cpu_list(&list).map(CoreRequest::Exactly).map_err(|e| ApiError::invalid(format!("`cores`: {e}"))),
    }
}

/// Checks a `create`'s values.
pub fn check_create(request: Create) -> Result<CreateRequest, ApiError> {
    check_name(&request.name).map_err(ApiError::invalid)?;
    if is_one_shot_name(&request.name) {
        return Err(ApiError::invalid(format!(
            "enclave names run-N are kept for one-shot enclaves; choose another name than {}",
            request.name
        )));
    }
    Ok(CreateRequest {
        name: request.name,
        cores: request.cores.map(cores).transpose()?.unwrap_or(CoreRequest::Count(1)),
        memory: size("mem", request.mem)?,
        hugepages: request.hugepages,
        share_group: request.share_group,
        progress: request.progress,
        confine: request.confine.map(|dir| absolute_directory("create", dir)).transpose()?,
        linux: match request.kind {
            EnclaveKind::Linux => Some(LinuxRequest { kernel: request.kernel, initrd: request.initrd, net: request.net }),
            EnclaveKind::Lwk if request.kernel.is_some() || request.initrd.is_some() || request.net.is_some() => {
                return Err(ApiError::invalid("`kernel`, `initrd` and `net` are for `kind: linux` enclaves"))
            }
            EnclaveKind::Lwk => None,
        },
    })
}

/// A `confine` directory: absolute (the daemon has no working directory of the client's).
fn absolute_directory(op: &str, dir: String) -> Result<String, ApiError> {
    if dir.starts_with('/') {
        Ok(dir)
    } else {
        Err(ApiError::invalid(format!("`{op}`'s `confine` must be an absolute path, got {dir:?}")))
    }
}

/// Checks a `run`'s values.
pub fn check_run(request: Run) -> Result<RunRequest, ApiError> {
    if request.argv.is_empty() {
        return Err(ApiError::invalid("`run` needs a non-empty `argv` (argv[0] names the program)"));
    }
    if let Some(bad) = request.env.iter().find(|e| !e.contains('=') || e.starts_with('=')) {
        return Err(ApiError::invalid(format!("environment entry {bad:?} is not NAME=VALUE")));
    }
    if !request.cwd.starts_with('/') {
        return Err(ApiError::invalid(format!("`cwd` must be an absolute path, got {:?}", request.cwd)));
    }
    if request.files.len() > MAX_INPUT_FILES {
        return Err(ApiError::invalid(format!("`run` takes at most {MAX_INPUT_FILES} input files, got {}", request.files.len())));
    }
    if let Some(name) = request.files.iter().find(|name| name.is_empty() || name.contains('/') || *name == "." || *name == "..") {
        return Err(ApiError::invalid(format!("input file name {name:?} must be a plain file name")));
    }
    if request.enclave.is_none() && request.confine.is_some() {
        return Err(ApiError::invalid("`confine` applies to forwarded file calls, which only a persistent enclave (`enclave`) serves"));
    }
    if request.enclave.is_some() && request.mem.is_some() {
        return Err(ApiError::invalid("`mem` sizes a one-shot enclave; a named enclave already has its memory"));
    }
    Ok(RunRequest {
        enclave: request.enclave,
        argv: request.argv,
        env: request.env,
        cores: request.cores.map(cores).transpose()?,
        heap: request.heap.map(|heap| size("heap", heap)).transpose()?,
        memory: request.mem.map(|mem| size("mem", mem)).transpose()?,
        cwd: request.cwd,
        files: request.files,
        confine: request.confine.map(|dir| absolute_directory("run", dir)).transpose()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clowder_api::daemon::Request;

    fn checked(line: &str) -> Result<(), String> {
        let result = match Request::parse(line.as_bytes()).map_err(|e| e.message)? {
            Request::Create(create) => check_create(create).map(drop),
            Request::Run(run) => check_run(run).map(drop),
            _ => Ok(()),
        };
        result.map_err(|e| e.message)
    }

    #[test]
    fn good_requests_check() {
        let Ok(Request::Create(create)) =
            Request::parse(br#"{"op":"create","name":"sim","kind":"lwk","cores":2,"mem":"1G","hugepages":true}"#)
        else {
            panic!()
        };
        let expected = CreateRequest {
            name: "sim".into(),
            cores: CoreRequest::Count(2),
            memory: 1 << 30,
            hugepages: true,
            share_group: None,
            progress: false,
            confine: None,
            linux: None,
        };
        assert_eq!(check_create(create).unwrap(), expected);
        let Ok(Request::Create(vm)) = Request::parse(br#"{"op":"create","name":"vm","kind":"linux","mem":"1G","kernel":"/k"}"#) else {
            panic!()
        };
        assert_eq!(check_create(vm).unwrap().linux, Some(LinuxRequest { kernel: Some("/k".into()), initrd: None, net: None }));
        assert!(checked(r#"{"op":"create","name":"a","mem":"1G","initrd":"/i"}"#).unwrap_err().contains("for `kind: linux`"));
        assert!(checked(r#"{"op":"create","name":"a","mem":"1G","net":"tap"}"#).unwrap_err().contains("for `kind: linux`"));
        let Ok(Request::Create(tap)) = Request::parse(br#"{"op":"create","name":"a","mem":"1G","kind":"linux","net":"tap"}"#) else {
            panic!()
        };
        assert_eq!(check_create(tap).unwrap().linux.unwrap().net, Some(clowder_api::daemon::Network::Tap));
        let Ok(Request::Run(run)) = Request::parse(br#"{"op":"run","argv":["hello","x"],"cwd":"/tmp","cores":"1","mem":268435456}"#) else {
            panic!()
        };
        let run = check_run(run).unwrap();
        assert_eq!(run.cores, Some(CoreRequest::Exactly([1].into())));
        assert_eq!(run.memory, Some(256 << 20));
    }

    #[test]
    fn confinement_is_an_absolute_directory_of_a_persistent_enclave() {
        let run = |line: &[u8]| match Request::parse(line) {
            Ok(Request::Run(run)) => check_run(run).map_err(|e| e.to_string()),
            other => panic!("{other:?}"),
        };
        let confined = run(br#"{"op":"run","enclave":"e","argv":["a"],"cwd":"/w/run","confine":"/w"}"#).unwrap();
        assert_eq!(confined.confine.as_deref(), Some("/w"));
        assert!(run(br#"{"op":"run","enclave":"e","argv":["a"],"cwd":"/w","confine":"w"}"#).unwrap_err().contains("absolute"));
        assert!(run(br#"{"op":"run","argv":["a"],"cwd":"/w","confine":"/w"}"#).unwrap_err().contains("persistent enclave"));
        let Ok(Request::Create(create)) = Request::parse(br#"{"op":"create","name":"e","mem":"1G","confine":"scratch"}"#) else { panic!() };
        assert!(check_create(create).unwrap_err().to_string().contains("absolute"));
    }

    #[test]
    fn bad_requests_say_what_is_wrong() {
        let error = |line: &str| checked(line).unwrap_err();
        assert!(error(r#"{"op":"create","name":"a b","mem":"1G"}"#).contains("enclave name"));
        assert!(error(r#"{"op":"create","name":"run-7","mem":"1G"}"#).contains("kept for one-shot enclaves"));
        assert!(checked(r#"{"op":"create","name":"run-x","mem":"1G"}"#).is_ok());
        assert!(error(r#"{"op":"create","name":"a","mem":"1G","cores":0}"#).contains("core list string such as \"0\""));
        assert!(error(r#"{"op":"create","name":"a","mem":"lots"}"#).contains("not a size"));
        assert!(error(r#"{"op":"create","name":"a","mem":"1G","cores":"x"}"#).contains("`cores`"));
        assert!(error(r#"{"op":"run","argv":[],"cwd":"/"}"#).contains("non-empty `argv`"));
        assert!(error(r#"{"op":"run","argv":["a"],"cwd":"rel"}"#).contains("absolute"));
        assert!(error(r#"{"op":"run","argv":["a"],"cwd":"/","env":["X"]}"#).contains("NAME=VALUE"));
        assert!(error(r#"{"op":"run","argv":["a"],"cwd":"/","files":["../x"]}"#).contains("plain file name"));
        assert!(error(r#"{"op":"run","enclave":"e","argv":["a"],"cwd":"/","mem":"1G"}"#).contains("one-shot"));
    }
}
