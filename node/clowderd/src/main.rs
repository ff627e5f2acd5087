//! `clowderd`: the clowder node daemon (run as root). See `docs/clowderd-api.md`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clowder_api::daemon::DEFAULT_SOCKET;
use clowderd::config_file::{self, ConfigFile};
use clowderd::daemon::{Daemon, DaemonConfig};
use clowderd::enclave::Liveness;
use clowderd::machine::VmmLauncher;
use clowderd::memory::parse_size;
use clowderd::server::Limits;
use clowderd::sys::{self, TerminationSignals};
use clowderd::xemem::{peer as xemem_peer, service as xemem_service, XememLinks};
use clowderd::{peer, server};

const USAGE: &str = "usage: clowderd [options]   (--version: its version and the API's)
  --config PATH        configuration file (default: /etc/clowder/clowderd.toml, if present): one key
                       per option below, named as the option without its dashes; options override it
  --socket PATH        API socket (default: $CLOWDER_SOCKET or /run/clowder/clowderd.sock)
  --vmm PATH           clowder-vmm binary (default: $CLOWDER_VMM, else next to clowderd, else $PATH)
  --kernel PATH        LWK image (default: $CLOWDER_KERNEL, else ../lib/clowder/lwk from clowderd's
                       directory as installed, else kernels/target/x86_64-unknown-none/release/lwk
                       found above clowderd's directory in a source tree)
  --isolate-cores      move host tasks off enclave cores with cpusets
  --oneshot-mem SIZE   memory of a one-shot enclave (default 256M)
  --hello-timeout MS   how long a new enclave's kernel may take to answer (default 10000)
  --ping-interval MS   liveness ping period (default 1000)
  --ping-timeout MS    an enclave silent this long is removed (default 30000)
  --max-connections N  open connections of all users but root together (default 256)
  --max-connections-per-user N  open connections of one user but root (default 32)
  --idle-timeout MS    a connection that sends no complete request this long is closed
                       (default 60000)
  --xemem-socket PATH  the XEMEM broker's socket for libxpmem (default: $CLOWDER_XEMEM_SOCKET,
                       else xemem.sock beside the API socket)
  --xemem-peers PATH   where other daemons link to this one's XEMEM node (default:
                       xemem-peer.sock beside the API socket; mode 0600)
  --xemem-upstream PATH  act as a sub-manager: link to the daemon whose --xemem-peers socket is
                       PATH; that daemon's name server gives this one its enclave id

Environment:
  CLOWDER_LOG          which diagnostics are printed: error, warn, info (the default), debug or
                       trace, and NAME=LEVEL for one part (clowderd=debug,xemem=trace); DEX and
                       libxpmem read it too. On stderr, or with syslog priorities when stderr is
                       the journal (JOURNAL_STREAM)
";

/// The LWK image where `make install` puts it ($prefix/lib/clowder/lwk beside $prefix/bin), else
/// in the source tree clowderd was built in: walk up from its directory.
fn find_kernel(exe: &Path) -> Option<PathBuf> {
    let installed = exe.parent().and_then(Path::parent).map(|prefix| prefix.join("lib/clowder/lwk"));
    let source_tree = exe.ancestors().map(|dir| dir.join("kernels/target/x86_64-unknown-none/release/lwk"));
    installed.into_iter().chain(source_tree).find(|p| p.is_file())
}

/// `--config PATH` wherever it is on the command line, since the file's values come first.
fn config_path(args: &[String]) -> Result<(PathBuf, bool), String> {
    match args.iter().position(|arg| arg == "--config") {
        Some(at) => args.get(at + 1).map(|path| (PathBuf::from(path), true)).ok_or_else(|| "--config needs a value".to_string()),
        None => Ok((PathBuf::from(config_file::DEFAULT_PATH), false)),
    }
}

struct Options {
    socket: PathBuf,
    /// None: beside the API socket, decided once `--socket` is known.
    xemem_socket: Option<PathBuf>,
    /// None: beside the API socket.
    xemem_peers: Option<PathBuf>,
    xemem_upstream: Option<PathBuf>,
    vmm: PathBuf,
    kernel: PathBuf,
    isolate_cores: bool,
    oneshot_memory: u64,
    liveness: Liveness,
    limits: Limits,
}

fn parse_options(args: &[String]) -> Result<Options, String> {
    let exe = std::env::current_exe().map_err(|e| format!("finding clowderd's own path: {e}"))?;
    let sibling_vmm = exe.with_file_name("clowder-vmm");
    let (config_path, explicit) = config_path(args)?;
    let file = ConfigFile::load(&config_path, explicit).map_err(|e| e.to_string())?;
    // Precedence: flags, then the environment, then the file, then the built-in defaults.
    let env_path = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    let mut liveness = Liveness::default();
    let mut limits = Limits::default();
    let file_error = |key: &str, reason: String| format!("{}: {key}: {reason}", config_path.display());
    for (value, field) in [
        (file.hello_timeout, &mut liveness.hello_timeout),
        (file.ping_interval, &mut liveness.ping_interval),
        (file.ping_timeout, &mut liveness.ping_timeout),
        (file.idle_timeout, &mut limits.request_timeout),
    ] {
        if let Some(millis) = value {
            *field = Duration::from_millis(millis);
        }
    }
    for (value, field, key) in [
        (file.max_connections, &mut limits.total, "max-connections"),
        (file.max_connections_per_user, &mut limits.per_user, "max-connections-per-user"),
    ] {
        match value {
            Some(0) => return Err(file_error(key, "0 is not a count of at least 1".into())),
            Some(count) => *field = count,
            None => {}
        }
    }
    let oneshot_memory = match &file.oneshot_mem {
        Some(text) => parse_size(text).map_err(|e| file_error("oneshot-mem", e.to_string()))?,
        None => 256 << 20,
    };
    let mut options = Options {
        socket: env_path("CLOWDER_SOCKET").or(file.socket).unwrap_or_else(|| DEFAULT_SOCKET.into()),
        // The broker's own default (socket_beside) reads $CLOWDER_XEMEM_SOCKET, which outranks the file.
        xemem_socket: if env_path("CLOWDER_XEMEM_SOCKET").is_some() { None } else { file.xemem_socket },
        xemem_peers: file.xemem_peers,
        xemem_upstream: file.xemem_upstream,
        vmm: env_path("CLOWDER_VMM").or(file.vmm).unwrap_or_else(|| {
            if sibling_vmm.is_file() {
                sibling_vmm
            } else {
                PathBuf::from("clowder-vmm")
            }
        }),
        kernel: env_path("CLOWDER_KERNEL").or(file.kernel).or_else(|| find_kernel(&exe)).unwrap_or_default(),
        isolate_cores: file.isolate_cores.unwrap_or(false),
        oneshot_memory,
        liveness,
        limits,
    };
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let mut value = || args.next().cloned().ok_or_else(|| format!("{flag} needs a value"));
        let millis = |text: String| {
            text.parse::<u64>().map(Duration::from_millis).map_err(|_| format!("{flag}: {text:?} is not a number of milliseconds"))
        };
        let count = |text: String| match text.parse::<usize>() {
            Ok(count) if count > 0 => Ok(count),
            _ => Err(format!("{flag}: {text:?} is not a count of at least 1")),
        };
        match flag.as_str() {
            "--config" => {
                value()?; // read first, by config_path
            }
            "--socket" => options.socket = value()?.into(),
            "--xemem-socket" => options.xemem_socket = Some(value()?.into()),
            "--xemem-peers" => options.xemem_peers = Some(value()?.into()),
            "--xemem-upstream" => options.xemem_upstream = Some(value()?.into()),
            "--vmm" => options.vmm = value()?.into(),
            "--kernel" => options.kernel = value()?.into(),
            "--isolate-cores" => options.isolate_cores = true,
            "--oneshot-mem" => options.oneshot_memory = parse_size(&value()?).map_err(|e| format!("--oneshot-mem: {e}"))?,
            "--hello-timeout" => options.liveness.hello_timeout = millis(value()?)?,
            "--ping-interval" => options.liveness.ping_interval = millis(value()?)?,
            "--ping-timeout" => options.liveness.ping_timeout = millis(value()?)?,
            "--max-connections" => options.limits.total = count(value()?)?,
            "--max-connections-per-user" => options.limits.per_user = count(value()?)?,
            "--idle-timeout" => options.limits.request_timeout = millis(value()?)?,
            "--help" | "-h" => return Err(String::new()),
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    if options.kernel.as_os_str().is_empty() {
        return Err(format!(
            "no LWK image: none in $CLOWDER_KERNEL or {}, at {} (installed) or in a source tree above clowderd; pass --kernel PATH",
            config_path.display(),
            exe.parent().and_then(Path::parent).unwrap_or(Path::new("/")).join("lib/clowder/lwk").display()
        ));
    }
    if !options.kernel.is_file() {
        return Err(format!(
            "no LWK image at {:?}: build it with `cd kernels && cargo build --release -p lwk`, or pass --kernel PATH",
            options.kernel
        ));
    }
    Ok(options)
}

/// On SIGTERM or SIGINT: tear the enclaves down (their VMMs would otherwise outlive the daemon),
/// remove the socket, exit.
fn on_termination(signals: TerminationSignals, daemon: std::sync::Arc<Daemon>, sockets: Vec<PathBuf>) {
    std::thread::spawn(move || {
        if let Some(signal) = signals.wait() {
            // The logger ignores a closed stderr (eprintln! would panic, ending this thread, so
            // the signal would be lost).
            log::info!("signal {signal}: removing all enclaves");
            daemon.shut_down_all();
            for socket in &sockets {
                let _ = std::fs::remove_file(socket);
            }
            std::process::exit(0);
        }
    });
}

fn main() -> ExitCode {
    // A job's socket helper, which the daemon starts as this program (`clowderd::sockets`).
    if std::env::args().nth(1).as_deref() == Some(clowderd::sockets::HELPER_ARGUMENT) {
        let _ = clowder_log::init("clowderd", clowder_log::LevelFilter::Info);
        return clowderd::sockets_helper::main(&std::env::args().skip(2).collect::<Vec<_>>());
    }
    let signals = TerminationSignals::block();
    // Every client connection, and every file a job shares, is a descriptor. Running short is
    // survivable (accepting backs off), not fatal.
    sys::raise_descriptor_limit();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|arg| arg == "--version" || arg == "-V") {
        println!("clowderd {} (API {})", env!("CARGO_PKG_VERSION"), clowder_api::API_VERSION);
        return ExitCode::SUCCESS;
    }
    if let Err(e) = clowder_log::init("clowderd", clowder_log::LevelFilter::Info) {
        eprintln!("clowderd: {e}");
        return ExitCode::from(2);
    }
    let options = match parse_options(&args) {
        Ok(options) => options,
        Err(e) if e.is_empty() => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("clowderd: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let runtime_dir = options.socket.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    log::debug!(
        "LWK image {}, clowder-vmm {}, runtime directory {}",
        options.kernel.display(),
        options.vmm.display(),
        runtime_dir.display()
    );
    let launcher = VmmLauncher { vmm: options.vmm.clone(), kernel: options.kernel.clone(), runtime_dir: runtime_dir.clone() };
    let config = DaemonConfig {
        vmm: options.vmm,
        kernel: options.kernel,
        oneshot_memory: options.oneshot_memory,
        isolate_cores: options.isolate_cores,
        liveness: options.liveness,
        admin_group: peer::admin_group_id(),
    };
    let listener = match server::bind(&options.socket) {
        Ok(listener) => listener,
        Err(e) => {
            log::error!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let xemem_socket = options.xemem_socket.clone().unwrap_or_else(|| xemem_service::socket_beside(&options.socket));
    let xemem = match xemem_service::start(&xemem_socket) {
        Ok(xemem) => xemem,
        Err(e) => {
            log::error!("{e}");
            let _ = std::fs::remove_file(&options.socket);
            return ExitCode::FAILURE;
        }
    };
    log::info!("listening on {} (XEMEM on {})", options.socket.display(), xemem_socket.display());
    let links = if options.xemem_upstream.is_some() { XememLinks::sub_manager() } else { XememLinks::new() };
    let broker = xemem.broker.clone();
    let daemon = Daemon::with_xemem_links(config, Box::new(launcher), links.clone());
    if daemon.host_xemem(xemem).is_err() {
        unreachable!("a new daemon has no XEMEM broker yet");
    }
    let peers_socket = options.xemem_peers.clone().unwrap_or_else(|| runtime_dir.join("xemem-peer.sock"));
    let sub_manager_broker = options.xemem_upstream.is_some().then(|| broker.clone());
    if let Err(e) = xemem_peer::listen(&peers_socket, links.clone(), sub_manager_broker.clone()) {
        log::error!("{e}");
        return ExitCode::FAILURE;
    }
    if let Some(upstream) = options.xemem_upstream.clone() {
        if let Err(e) = xemem_peer::connect_upstream(upstream, links, sub_manager_broker, Duration::from_secs(10)) {
            log::error!("{e}");
            return ExitCode::FAILURE;
        }
    }
    on_termination(signals, daemon.clone(), vec![options.socket.clone(), xemem_socket, peers_socket]);
    server::serve_with_limits(daemon, listener, options.limits)
}
