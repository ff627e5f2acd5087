// The kernel is linked by our own script: a low physical boot stub plus a higher-half image
// (the target's "kernel" code model needs the top 2 GiB). It is linked at fixed addresses, so
// the PIE default of x86_64-unknown-none is turned off.
include!("../guest-arch/link.rs");

fn main() {
    let dir = link_with_own_script();
    build_vdso(&dir);
}

/// The vDSO is a user-mode shared object (C, built with the host's C compiler; `CC` may name
/// another), embedded in the kernel with `include_bytes!` (`src/vdso/mod.rs`).
fn build_vdso(dir: &str) {
    let source = format!("{dir}/src/vdso");
    let output = format!("{}/vdso.so", std::env::var("OUT_DIR").unwrap());
    for file in ["vdso.c", "vdso.lds", "vdso.map"] {
        println!("cargo:rerun-if-changed={source}/{file}");
    }
    println!("cargo:rerun-if-env-changed=CC");
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = std::process::Command::new(&compiler)
        .args(["-O2", "-fPIC", "-ffreestanding", "-fno-stack-protector", "-fno-builtin", "-fcf-protection=none"])
        .args(["-nostdlib", "-shared", "-Wall", "-Wextra", "-Werror"])
        .arg(format!("-Wl,-T,{source}/vdso.lds"))
        .arg(format!("-Wl,--version-script={source}/vdso.map"))
        // musl finds symbols through DT_HASH only, glibc prefers DT_GNU_HASH: give both.
        .args(["-Wl,--hash-style=both", "-Wl,-soname=linux-vdso.so.1", "-Wl,--no-undefined"])
        .args(["-Wl,-z,noexecstack", "-Wl,--build-id=none", "-o", &output])
        .arg(format!("{source}/vdso.c"))
        .status()
        .unwrap_or_else(|error| panic!("cannot run {compiler} to build the vDSO: {error}"));
    assert!(status.success(), "building the vDSO with {compiler} failed");
}
