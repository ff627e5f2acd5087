//! `CLOWDER_LOG` for clowder's host programs (clowderd, clowder-vmm, xemem-broker): which
//! diagnostics they print, and where. The value means the same to DEX (`dex/src/log.c`) and
//! libxpmem (`xemem/src/xemem_errmsg.c`): directives separated by commas, each a level
//! (`error`, `warn`, `info`, `debug`, `trace`, in any case) for everything, or `NAME=LEVEL` for
//! one component, which outranks the bare level. Here NAME is the start of a Rust module path,
//! with `-` read as `_` (`clowderd`, `clowder-vmm`, `vmm`, `xemem` for the broker); `dex` and
//! `xemem` also name the C libraries. An unknown level is an error, never a silent default.
//!
//! Records go to stderr as `PROGRAM: text` at info and `PROGRAM: LEVEL: text` at the other
//! levels, or, when stderr is the systemd journal's stream (`JOURNAL_STREAM` names its device
//! and inode, as systemd sets it), as `<N>text`: journald reads the syslog priority N as the
//! record's (`SyslogLevelPrefix=`, on by default) and adds the program's name itself.

use std::fmt;
use std::io::Write;

pub use log::LevelFilter;

/// The environment variable every part of clowder reads its levels from.
pub const VARIABLE: &str = "CLOWDER_LOG";

/// A `CLOWDER_LOG` value that is not understood (the value, as given).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadValue(pub String);

impl fmt::Display for BadValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Worded as DEX's refusal, so both read alike.
        write!(f, "{VARIABLE} takes error, warn, info, debug or trace (or NAME=LEVEL among other directives), not '{}'", self.0)
    }
}

impl std::error::Error for BadValue {}

/// Levels parsed from a `CLOWDER_LOG` value: one for everything, and one per named component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Levels {
    pub default: LevelFilter,
    /// (module path prefix, level); a later directive for the same name replaces an earlier one.
    pub components: Vec<(String, LevelFilter)>,
}

fn level_named(name: &str) -> Option<LevelFilter> {
    let levels = [LevelFilter::Error, LevelFilter::Warn, LevelFilter::Info, LevelFilter::Debug, LevelFilter::Trace];
    levels.into_iter().find(|level| level.as_str().eq_ignore_ascii_case(name))
}

impl Levels {
    /// Parses `value`; `default` is the level where it sets none (empty directives are skipped).
    pub fn parse(value: &str, default: LevelFilter) -> Result<Levels, BadValue> {
        let bad = || BadValue(value.to_string());
        let mut levels = Levels { default, components: Vec::new() };
        for directive in value.split(',').filter(|d| !d.is_empty()) {
            match directive.split_once('=') {
                None => levels.default = level_named(directive).ok_or_else(bad)?,
                Some((name, level)) => {
                    let valid_name = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || "_-:".contains(c));
                    let level = level_named(level).filter(|_| valid_name).ok_or_else(bad)?;
                    let name = name.replace('-', "_");
                    levels.components.retain(|(known, _)| *known != name);
                    levels.components.push((name, level));
                }
            }
        }
        Ok(levels)
    }
}

/// Syslog priorities (sd-daemon(3)): err, warning, info, debug.
fn priority(level: log::Level) -> u8 {
    match level {
        log::Level::Error => 3,
        log::Level::Warn => 4,
        log::Level::Info => 6,
        log::Level::Debug | log::Level::Trace => 7,
    }
}

/// Whether stderr is the journal's stream: `JOURNAL_STREAM` is "DEVICE:INODE" of the socket
/// systemd connected it to (a stderr redirected elsewhere since no longer matches).
fn stderr_is_journal() -> bool {
    let Some(stream) = std::env::var("JOURNAL_STREAM").ok() else { return false };
    let Some((device, inode)) = stream.split_once(':') else { return false };
    match (device.parse::<u64>(), inode.parse::<u64>(), clowder_sys::file_info(std::io::stderr())) {
        (Ok(device), Ok(inode), Ok(info)) => info.device == device && info.inode == inode,
        _ => false,
    }
}

/// Installs the logger of `program` (the `log` macros' one sink) with the levels `CLOWDER_LOG`
/// gives, `default` where it gives none. On a bad value nothing is installed: the caller says so
/// and exits.
pub fn init(program: &'static str, default: LevelFilter) -> Result<(), BadValue> {
    let levels = match std::env::var_os(VARIABLE) {
        None => Levels { default, components: Vec::new() },
        Some(value) => Levels::parse(value.to_str().ok_or_else(|| BadValue(value.to_string_lossy().into_owned()))?, default)?,
    };
    let mut builder = env_logger::Builder::new();
    builder.filter_level(levels.default);
    for (name, level) in &levels.components {
        builder.filter_module(name, *level);
    }
    if stderr_is_journal() {
        builder.format(|out, record| writeln!(out, "<{}>{}", priority(record.level()), record.args()));
    } else {
        builder.format(move |out, record| match record.level() {
            log::Level::Info => writeln!(out, "{program}: {}", record.args()),
            level => writeln!(out, "{program}: {}: {}", level.as_str().to_ascii_lowercase(), record.args()),
        });
    }
    // A second call (a test that embeds a program's main) keeps the first logger.
    let _ = builder.target(env_logger::Target::Stderr).try_init();
    Ok(())
}

#[cfg(feature = "testing")]
pub mod testing;

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(value: &str) -> Result<Levels, BadValue> {
        Levels::parse(value, LevelFilter::Info)
    }

    #[test]
    fn bare_levels_in_any_case_set_the_default() {
        assert_eq!(parse("").unwrap(), Levels { default: LevelFilter::Info, components: vec![] });
        assert_eq!(parse("DEBUG").unwrap().default, LevelFilter::Debug);
        assert_eq!(parse("error,trace").unwrap().default, LevelFilter::Trace);
    }

    #[test]
    fn components_take_their_own_level_with_dashes_as_underscores() {
        let levels = parse("warn,clowder-vmm=debug,xemem=info,,xemem=trace").unwrap();
        assert_eq!(levels.default, LevelFilter::Warn);
        assert_eq!(levels.components, vec![("clowder_vmm".to_string(), LevelFilter::Debug), ("xemem".to_string(), LevelFilter::Trace)]);
    }

    #[test]
    fn anything_else_is_refused_naming_the_value() {
        for bad in ["loud", "info,loud", "xemem=", "=debug", "xemem=loud", "a b=info", "off"] {
            let error = parse(bad).unwrap_err();
            assert_eq!(error, BadValue(bad.to_string()));
            assert!(error.to_string().starts_with("CLOWDER_LOG takes error, warn, info, debug or trace"), "{error}");
            assert!(error.to_string().ends_with(&format!("not '{bad}'")), "{error}");
        }
    }
}
