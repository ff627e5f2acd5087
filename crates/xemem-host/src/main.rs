//! `xemem-broker [SOCKET]`: the XEMEM segment broker on its own, for tests and for hosts
//! without clowderd. The socket is SOCKET, else $CLOWDER_XEMEM_SOCKET, else
//! /run/clowder/xemem.sock.

use std::path::PathBuf;

fn main() {
    let path = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("CLOWDER_XEMEM_SOCKET").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("/run/clowder/xemem.sock"));
    if let Some(parent) = path.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    // Every owner's converted memfds are held until it goes: allow as many as the system does.
    xemem_host::sys::raise_descriptor_limit();
    let broker = xemem_host::Broker::new();
    if let Err(error) = broker.listen_and_serve(&path) {
        eprintln!("xemem-broker: {}: {error}", path.display());
        std::process::exit(1);
    }
}
