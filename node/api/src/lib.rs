//! clowder's typed, versioned API (docs/api-schema.md): the requests and replies of clowderd's
//! socket ([`daemon`]) and of a VM's control socket ([`vmm`]), the framed-JSON + SCM_RIGHTS
//! [`codec`] both sockets speak, and a [`client`] of the daemon. Clients such as the `clowder`
//! CLI depend on this crate alone, never on the daemon, the VMM or KVM.

pub mod client;
pub mod codec;
pub mod daemon;
pub mod size;
pub mod vmm;

use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The API's version: raised whenever a request or reply changes incompatibly. A client
/// learns the daemon's with the `version` request.
pub const API_VERSION: u32 = 1;

/// What kind of failure an error reply reports, beside its sentence for a person.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The request is malformed or a value in it is out of range.
    InvalidArgument,
    /// What it names (an enclave, a region) does not exist.
    NotFound,
    /// What it would create exists already.
    AlreadyExists,
    /// The caller may not do this.
    PermissionDenied,
    /// Not now: the resources are taken or the thing is still starting.
    Busy,
    /// The host lacks what the request needs (cores, memory, hugepages).
    ResourceExhausted,
    /// The work was tried and failed (an enclave did not boot, a job failed).
    Failed,
    /// This server runs without the service the request needs (an XEMEM broker).
    Unavailable,
    /// Something went wrong inside the server.
    Internal,
}

/// An error reply: `{"ok": false, "kind": "...", "error": "..."}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    pub kind: ErrorKind,
    #[serde(rename = "error")]
    pub message: String,
}

impl ApiError {
    /// Control characters in the message (a key or value quoted verbatim from a request, as
    /// serde does for an unknown field) are escaped, so every message is one line.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> ApiError {
        let message = message.into();
        let message = if message.contains(char::is_control) { one_line(&message) } else { message };
        ApiError { kind, message }
    }

    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::InvalidArgument, message)
    }

    /// The reply line for this error.
    pub fn reply(&self) -> Value {
        let mut reply = Map::new();
        reply.insert("ok".into(), Value::Bool(false));
        reply.insert("kind".into(), serde_json::to_value(self.kind).expect("a plain enum"));
        reply.insert("error".into(), Value::String(self.message.clone()));
        Value::Object(reply)
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ApiError {}

/// The reply line for a success: `{"ok": true, ...body's fields}`.
pub fn ok_reply(body: &impl Serialize) -> Value {
    let mut reply = Map::new();
    reply.insert("ok".into(), Value::Bool(true));
    match serde_json::to_value(body) {
        Ok(Value::Object(fields)) => reply.extend(fields),
        Ok(Value::Null) => {}
        Ok(other) => return ApiError::new(ErrorKind::Internal, format!("a reply body is an object, not {other}")).reply(),
        Err(e) => return ApiError::new(ErrorKind::Internal, format!("encoding the reply: {e}")).reply(),
    }
    Value::Object(reply)
}

/// A reply line as a client reads it: the body of type `T` on success, the error otherwise.
pub fn parse_reply<T: DeserializeOwned>(reply: Value) -> Result<T, ApiError> {
    match reply.get("ok") {
        Some(Value::Bool(true)) => serde_json::from_value(reply)
            .map_err(|e| ApiError::new(ErrorKind::Internal, format!("the server's reply does not match the API: {e}"))),
        Some(Value::Bool(false)) => Err(serde_json::from_value::<ApiError>(reply.clone()).unwrap_or_else(|_| {
            // An error without a known kind (a newer or an older server) is still an error.
            let message = reply.get("error").and_then(Value::as_str).unwrap_or("the server gave no reason");
            ApiError::new(ErrorKind::Failed, message)
        })),
        _ => Err(ApiError::new(ErrorKind::Internal, format!("the server's reply has no `ok`: {reply}"))),
    }
}

/// `text` with each control character escaped as Rust would write it (`\n`, `\u{1b}`).
fn one_line(text: &str) -> String {
    text.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
}

/// A request line split into its `op` and the rest of its fields; what is not a JSON object
/// with a string `op` is refused with the reason.
fn split_op(line: &[u8]) -> Result<(String, Value), ApiError> {
    let value: Value = serde_json::from_slice(line).map_err(|e| ApiError::invalid(format!("malformed request (not JSON: {e})")))?;
    let Value::Object(mut fields) = value else {
        return Err(ApiError::invalid("malformed request: a request is a JSON object with an \"op\""));
    };
    match fields.remove("op") {
        Some(Value::String(op)) => Ok((op, Value::Object(fields))),
        Some(other) => Err(ApiError::invalid(format!("`op` must be a string, got {other}"))),
        None => Err(ApiError::invalid("malformed request: it has no \"op\"")),
    }
}

/// An operation's fields as `T`; a mistake names the operation and the field.
fn fields<T: DeserializeOwned>(op: &str, fields: Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(fields).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        // serde names an unknown field itself; the path would only repeat it.
        if path == "." || inner.starts_with("unknown field") {
            ApiError::invalid(format!("`{op}`: {inner}"))
        } else {
            ApiError::invalid(format!("`{op}`: `{path}`: {inner}"))
        }
    })
}

/// The fields of an operation that takes none.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoFields {}

/// Parses an operation that takes no fields, refusing any.
fn no_fields(op: &str, rest: Value) -> Result<(), ApiError> {
    fields::<NoFields>(op, rest).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn replies_read_back_as_bodies_or_errors_with_their_kind() {
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        struct Body {
            removed: String,
        }
        let ok = ok_reply(&Body { removed: "sim".into() });
        assert_eq!(ok, json!({"ok": true, "removed": "sim"}));
        assert_eq!(parse_reply::<Body>(ok), Ok(Body { removed: "sim".into() }));
        let error = ApiError::new(ErrorKind::NotFound, "no enclave named sim");
        assert_eq!(error.reply(), json!({"ok": false, "kind": "not_found", "error": "no enclave named sim"}));
        assert_eq!(parse_reply::<Body>(error.reply()), Err(error));
        // A kind this client does not know (a newer server's) is still an error, with its words.
        let newer = parse_reply::<Body>(json!({"ok": false, "kind": "quota_exceeded", "error": "over quota"})).unwrap_err();
        assert_eq!((newer.kind, newer.message.as_str()), (ErrorKind::Failed, "over quota"));
        let garbled = parse_reply::<Body>(json!({"removed": "sim"})).unwrap_err();
        assert_eq!(garbled.kind, ErrorKind::Internal);
        let mismatched = parse_reply::<Body>(json!({"ok": true, "gone": 1})).unwrap_err();
        assert!(mismatched.message.contains("does not match the API"), "{mismatched}");
    }
}
