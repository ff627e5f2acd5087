// Build-script helper shared by the guest kernels' build.rs files (`include!`d: a build script
// cannot depend on this no_std crate's target code).

/// Links the crate's binaries with its own script, `link.ld` beside its Cargo.toml, at fixed
/// addresses: the x86_64-unknown-none default of PIE output is turned off, pages are 4 KiB.
fn link_with_own_script() -> String {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap();
    println!("cargo:rustc-link-arg-bins=-T{dir}/link.ld");
    println!("cargo:rustc-link-arg-bins=--no-pie");
    println!("cargo:rustc-link-arg-bins=-zmax-page-size=4096");
    println!("cargo:rerun-if-changed=link.ld");
    dir
}
