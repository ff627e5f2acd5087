//! The daemon's configuration file, `/etc/clowder/clowderd.toml` unless `--config PATH` names
//! another: one key per command-line flag, spelled as the flag without its dashes. Flags override
//! the file; a missing default file means no settings, a missing explicit one is an error.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Where the daemon looks when no `--config` is given.
pub const DEFAULT_PATH: &str = "/etc/clowder/clowderd.toml";

/// The file's settings; `None` where the file says nothing. Milliseconds are integers, the size a
/// string as `--oneshot-mem` takes it ("256M").
#[derive(Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ConfigFile {
    pub socket: Option<PathBuf>,
    pub vmm: Option<PathBuf>,
    pub kernel: Option<PathBuf>,
    pub isolate_cores: Option<bool>,
    pub oneshot_mem: Option<String>,
    pub hello_timeout: Option<u64>,
    pub ping_interval: Option<u64>,
    pub ping_timeout: Option<u64>,
    pub max_connections: Option<usize>,
    pub max_connections_per_user: Option<usize>,
    pub idle_timeout: Option<u64>,
    pub xemem_socket: Option<PathBuf>,
    pub xemem_peers: Option<PathBuf>,
    pub xemem_upstream: Option<PathBuf>,
}

/// Why the file could not be used; every message is one line naming the file, and the key where
/// one is at fault.
#[derive(Debug)]
pub enum ConfigFileError {
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    /// `key` is empty for a syntax error, which belongs to no key.
    Invalid {
        path: PathBuf,
        key: String,
        reason: String,
    },
}

impl fmt::Display for ConfigFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Read { path, error } => write!(f, "{}: cannot read the configuration: {error}", path.display()),
            Self::Invalid { path, key, reason } if key.is_empty() => write!(f, "{}: {reason}", path.display()),
            Self::Invalid { path, key, reason } => write!(f, "{}: {key}: {reason}", path.display()),
        }
    }
}

impl std::error::Error for ConfigFileError {}

impl ConfigFile {
    /// Reads `path`; when `explicit` is false (the default path) a missing file is no settings.
    pub fn load(path: &Path, explicit: bool) -> Result<Self, ConfigFileError> {
        match std::fs::read_to_string(path) {
            Ok(text) => Self::parse(&text, path),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound && !explicit => Ok(Self::default()),
            Err(error) => Err(ConfigFileError::Read { path: path.to_path_buf(), error }),
        }
    }

    /// Parses a document; `path` names it in errors. The key at fault comes from the
    /// deserializer's path (serde_path_to_error), the reason from toml's message, whose source
    /// excerpt and caret lines are dropped so the error stays on one line.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigFileError> {
        let invalid = |key: String, reason: &str| ConfigFileError::Invalid {
            path: path.to_path_buf(),
            key,
            reason: reason.lines().next().unwrap_or("invalid").to_string(),
        };
        let document = toml::Deserializer::new(text);
        serde_path_to_error::deserialize(document).map_err(|error| {
            let key = error.path().to_string();
            let inner = error.into_inner();
            let line = inner.span().map(|span| 1 + text[..span.start].matches('\n').count());
            let reason = match line {
                Some(line) => format!("line {line}: {}", inner.message()),
                None => inner.message().to_string(),
            };
            // serde_path_to_error names the document root "."; a syntax error has no key.
            invalid(if key == "." { String::new() } else { key }, &reason)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ConfigFile, String> {
        ConfigFile::parse(text, Path::new("/etc/clowder/clowderd.toml")).map_err(|e| e.to_string())
    }

    #[test]
    fn every_key_is_read() {
        let file = parse(
            r#"
            socket = "/run/c/d.sock"
            vmm = "/opt/c/bin/clowder-vmm"
            kernel = "/opt/c/lib/clowder/lwk"
            isolate-cores = true
            oneshot-mem = "512M"
            hello-timeout = 20000
            ping-interval = 500
            ping-timeout = 3000
            max-connections = 64
            max-connections-per-user = 8
            idle-timeout = 1000
            xemem-socket = "/run/c/x.sock"
            xemem-peers = "/run/c/p.sock"
            xemem-upstream = "/run/u/p.sock"
            "#,
        )
        .unwrap();
        assert_eq!(file.kernel.as_deref(), Some(Path::new("/opt/c/lib/clowder/lwk")));
        assert_eq!(file.isolate_cores, Some(true));
        assert_eq!(file.oneshot_mem.as_deref(), Some("512M"));
        assert_eq!((file.hello_timeout, file.ping_interval, file.ping_timeout), (Some(20000), Some(500), Some(3000)));
        assert_eq!((file.max_connections, file.max_connections_per_user, file.idle_timeout), (Some(64), Some(8), Some(1000)));
        assert_eq!(file.xemem_upstream.as_deref(), Some(Path::new("/run/u/p.sock")));
    }

    #[test]
    fn an_empty_or_all_comment_file_sets_nothing() {
        assert_eq!(parse("").unwrap(), ConfigFile::default());
        assert_eq!(parse("# socket = \"/x\"\n").unwrap(), ConfigFile::default());
    }

    #[test]
    fn an_unknown_key_is_named_on_one_line() {
        let error = parse("socket = \"/x\"\nsockett = \"/y\"\n").unwrap_err();
        assert!(error.contains("sockett") && error.contains("line 2"), "{error}");
        assert!(!error.contains('\n'), "{error}");
    }

    #[test]
    fn a_wrong_type_names_its_key() {
        let error = parse("ping-timeout = \"soon\"\n").unwrap_err();
        assert!(error.starts_with("/etc/clowder/clowderd.toml: ping-timeout: line 1:"), "{error}");
        assert!(!error.contains('\n'), "{error}");
    }

    #[test]
    fn a_syntax_error_is_one_line() {
        let error = parse("socket = \n").unwrap_err();
        assert!(error.starts_with("/etc/clowder/clowderd.toml: line 1:"), "{error}");
        assert!(!error.contains('\n'), "{error}");
    }

    #[test]
    fn a_missing_default_file_is_no_settings_but_a_missing_explicit_one_is_an_error() {
        let missing = Path::new("/nonexistent/clowderd.toml");
        assert_eq!(ConfigFile::load(missing, false).unwrap(), ConfigFile::default());
        let error = ConfigFile::load(missing, true).unwrap_err().to_string();
        assert!(error.starts_with("/nonexistent/clowderd.toml: cannot read"), "{error}");
    }
}
