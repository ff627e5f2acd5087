// The guest is linked at fixed physical addresses (1 MiB up) by its own script, so the target's
// default PIE output is turned off.
include!("../guest-arch/link.rs");

fn main() {
    link_with_own_script();
}
