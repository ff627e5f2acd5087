//! `xemem-broker [SOCKET]`: the XEMEM segment broker on its own, for tests and for hosts
//! without clowderd. The socket is SOCKET, else $CLOWDER_XEMEM_SOCKET, else xemem.sock beside
//! $CLOWDER_SOCKET, else /run/clowder/xemem.sock (what libxpmem looks for).

use std::path::PathBuf;

fn main() {
    let path = std::env::args_os().nth(1).map(PathBuf::from).unwrap_or_else(xemem_host::default_socket_path);
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
