//! `xemem-broker [SOCKET]`: the XEMEM segment broker on its own, for tests and for hosts
//! without clowderd. The socket is SOCKET, else $CLOWDER_XEMEM_SOCKET, else xemem.sock beside
//! $CLOWDER_SOCKET, else /run/clowder/xemem.sock (what libxpmem looks for). Diagnostics as
//! CLOWDER_LOG says (default info; see crates/log).

use std::path::PathBuf;

const USAGE: &str = "usage: xemem-broker [SOCKET]   (default: $CLOWDER_XEMEM_SOCKET, else xemem.sock beside \
                     $CLOWDER_SOCKET, else /run/clowder/xemem.sock); diagnostics as $CLOWDER_LOG says (default info)";

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let path = match args.as_slice() {
        [] => xemem_host::default_socket_path(),
        [flag] if flag == "-h" || flag == "--help" => {
            println!("{USAGE}");
            return;
        }
        // A socket path never starts with '-' here: that is a mistyped option.
        [option] if option.to_string_lossy().starts_with('-') => {
            eprintln!("xemem-broker: unknown option {}\n{USAGE}", option.to_string_lossy());
            std::process::exit(2);
        }
        [socket] => PathBuf::from(socket),
        _ => {
            eprintln!("xemem-broker: one socket path at most\n{USAGE}");
            std::process::exit(2);
        }
    };
    if let Err(error) = clowder_log::init("xemem-broker", clowder_log::LevelFilter::Info) {
        eprintln!("xemem-broker: {error}");
        std::process::exit(2);
    }
    if let Some(parent) = path.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    // Every owner's converted memfds are held until it goes: allow as many as the system does.
    clowder_sys::raise_descriptor_limit();
    let broker = xemem_host::Broker::new();
    if let Err(error) = broker.listen_and_serve(&path) {
        log::error!("{}: {error}", path.display());
        std::process::exit(1);
    }
}
