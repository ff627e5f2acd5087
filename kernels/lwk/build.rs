// The kernel is linked by our own script: a low physical boot stub plus a higher-half image
// (the target's "kernel" code model needs the top 2 GiB). It is linked at fixed addresses, so
// the PIE default of x86_64-unknown-none is turned off.
fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap();
    println!("cargo:rustc-link-arg-bins=-T{dir}/link.ld");
    println!("cargo:rustc-link-arg-bins=--no-pie");
    println!("cargo:rustc-link-arg-bins=-zmax-page-size=4096");
    println!("cargo:rerun-if-changed=link.ld");
}
