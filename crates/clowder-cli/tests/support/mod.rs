//! What the CLI's end-to-end tests share beyond clowder-test-support: which VMM they boot
//! with, and whether this machine can boot an enclave at all.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};
use std::process::Command;

/// `CLOWDER_VMM`, else the clowder-vmm built beside the CLI, else the workspace's release build.
pub fn vmm_binary() -> PathBuf {
    let beside_cli = Path::new(env!("CARGO_BIN_EXE_clowder")).with_file_name("clowder-vmm");
    if std::env::var_os("CLOWDER_VMM").is_none() && beside_cli.is_file() {
        return beside_cli;
    }
    clowder_test_support::vmm_binary()
}

/// Why the tests that boot something cannot run here, if they cannot.
pub fn missing_requirement() -> Option<String> {
    if let Some(why) = clowder_test_support::why_enclaves_cannot_boot(&vmm_binary()) {
        return Some(why);
    }
    if Command::new("musl-gcc").arg("--version").output().is_err() {
        return Some("musl-gcc is not installed".into());
    }
    None
}
