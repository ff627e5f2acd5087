//! CLOWDER_LOG as `clowder-vmm` reads it: the VMM library's warning about an unclaimed port
//! (`--unclaimed-ports log`) shows at the default level and at debug (with the VM's shape), not
//! at error; a bad value is a setup error naming it.

#[macro_use]
mod support;

use std::process::{Command, Output};

use support::{testguest, CLOWDER_VMM, GUEST_MEMORY};

fn vmm_with_log(level: Option<&str>) -> Output {
    let mut command = Command::new(CLOWDER_VMM);
    command.args(["--kernel", testguest().to_str().unwrap(), "--mem", GUEST_MEMORY, "--cmdline", "test=badport port=0x999"]);
    command.args(["--unclaimed-ports", "log", "--serial", "null"]).env_remove("CLOWDER_LOG").env_remove("JOURNAL_STREAM");
    if let Some(level) = level {
        command.env("CLOWDER_LOG", level);
    }
    command.output().unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn levels_choose_the_vmms_lines() {
    require_kvm!();
    let warning = "clowder-vmm: warn: vCPU 0: ignoring accesses to unclaimed port 0x999\n";
    let default = vmm_with_log(None);
    assert_eq!(default.status.code(), Some(0), "{}", stderr(&default));
    assert_eq!(stderr(&default), warning);
    assert_eq!(stderr(&vmm_with_log(Some("error"))), "");
    let debug = stderr(&vmm_with_log(Some("error,clowder-vmm=debug,vmm=warn")));
    assert_eq!(debug, format!("clowder-vmm: debug: 1 vCPU(s) (host core of each: unpinned), 16 MiB of guest RAM on Page4K\n{warning}"));
}

#[test]
fn a_bad_value_is_a_setup_error_naming_it() {
    let refused = vmm_with_log(Some("vmm=chatty"));
    assert_eq!(refused.status.code(), Some(2));
    assert_eq!(
        stderr(&refused),
        "clowder-vmm: CLOWDER_LOG takes error, warn, info, debug or trace (or NAME=LEVEL among other directives), not 'vmm=chatty'\n"
    );
}
