//! For the tests of the programs that log through this crate (feature `testing`): a program's
//! stderr to a file, with the environment that chooses its lines.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

/// Sends `command`'s stderr to a new file `log` and sets CLOWDER_LOG to `level` (unset for
/// None). With `journal`, JOURNAL_STREAM names that file, as systemd sets it for a unit whose
/// stderr is the journal; without, another stream, as a child of systemd that redirected its
/// stderr sees.
pub fn stderr_to_log(command: &mut Command, log: &Path, level: Option<&str>, journal: bool) {
    let stderr = std::fs::File::create(log).unwrap_or_else(|e| panic!("creating {}: {e}", log.display()));
    let identity = stderr.metadata().unwrap();
    command.stderr(stderr).env("JOURNAL_STREAM", if journal { format!("{}:{}", identity.dev(), identity.ino()) } else { "1:2".into() });
    match level {
        Some(level) => command.env("CLOWDER_LOG", level),
        None => command.env_remove("CLOWDER_LOG"),
    };
}
