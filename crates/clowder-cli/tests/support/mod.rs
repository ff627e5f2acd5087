//! What the CLI's end-to-end tests share: where the built kernel and VMM are, and whether this
//! machine can boot an enclave at all.
#![allow(dead_code)] // each test binary uses its own subset

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2).unwrap().to_path_buf()
}

pub fn kernel_image() -> PathBuf {
    workspace_root().join("kernels/target/x86_64-unknown-none/release/lwk")
}

pub fn vmm_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("CLOWDER_VMM") {
        return path.into();
    }
    let beside_cli = Path::new(env!("CARGO_BIN_EXE_clowder")).with_file_name("clowder-vmm");
    if beside_cli.is_file() {
        return beside_cli;
    }
    workspace_root().join("target/release/clowder-vmm")
}

/// Why the tests that boot something cannot run here, if they cannot.
pub fn missing_requirement() -> Option<String> {
    if File::options().read(true).write(true).open("/dev/kvm").is_err() {
        return Some("/dev/kvm is not available".into());
    }
    if !kernel_image().is_file() {
        return Some(format!("no LWK image at {} (cd kernels && cargo build --release -p lwk)", kernel_image().display()));
    }
    if !vmm_binary().is_file() {
        return Some(format!("no clowder-vmm at {} (cargo build --release -p clowder-vmm)", vmm_binary().display()));
    }
    if Command::new("musl-gcc").arg("--version").output().is_err() {
        return Some("musl-gcc is not installed".into());
    }
    None
}
