//! Assembles the tiny benchmark guests (guests/*.S) into ELF64 images linked at 1 MiB.
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    for name in ["ready", "exitloop", "idle"] {
        let src = format!("guests/{name}.S");
        println!("cargo:rerun-if-changed={src}");
        let obj = out.join(format!("{name}.o"));
        let elf = out.join(format!("{name}.elf"));
        let ok = Command::new("cc").args(["-c", &src, "-o"]).arg(&obj).status().expect("cc runs").success()
            && Command::new("ld")
                .args(["-static", "-nostdlib", "-Ttext=0x100000", "-e", "_start", "-o"])
                .arg(&elf)
                .arg(&obj)
                .status()
                .expect("ld runs")
                .success();
        assert!(ok, "assembling {src} failed");
    }
}
