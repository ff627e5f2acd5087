//! `clowder`: the command line for clowder enclaves and jobs. It talks to `clowderd` over its
//! socket (`CLOWDER_SOCKET` or /run/clowder/clowderd.sock) through `clowder-api` alone.

mod launcher;
mod progress;
mod run;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use clowder_api::client::{CallError, Client};
use clowder_api::daemon::{
    Cores, Create, CreateReply, EnclaveInfo, EnclaveKind, JobEvent, LogsReply, LsReply, Named, Network, Request, RmReply, Size,
    VersionReply, XememLsReply,
};
use clowder_api::size::readable_size;
use clowder_api::API_VERSION;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

#[derive(Parser)]
#[command(
    name = "clowder",
    version,
    about = "Enclaves and jobs on a clowder node (through clowderd)",
    after_help = "--cores N is a count of cores; --core-list names them (0, 2-3, 1,3): --core-list 0 is core 0.\n\
                  The daemon's socket is $CLOWDER_SOCKET, else /run/clowder/clowderd.sock."
)]
struct Cli {
    /// Print the daemon's replies (and job events) as JSON lines
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create, list and remove persistent enclaves
    Enclave {
        #[command(subcommand)]
        command: EnclaveCommand,
    },
    /// Run PROGRAM in an enclave: a persistent one (--enclave NAME, or `run NAME PROGRAM`), else
    /// a one-shot enclave made for the job
    Run(RunArgs),
    /// Show an enclave's log (also of a recently removed one)
    Logs {
        /// The enclave
        name: String,
    },
    /// XEMEM segments known to the host's name server
    Xemem {
        #[command(subcommand)]
        command: XememCommand,
    },
    /// The versions of clowder, of clowderd and of the API each speaks
    Version,
}

#[derive(Subcommand)]
enum EnclaveCommand {
    /// Create a persistent enclave
    Create(CreateArgs),
    /// List the enclaves, the free cores and recently removed enclaves
    Ls,
    /// Remove an enclave (its jobs end)
    Rm {
        /// The enclave
        name: String,
    },
}

#[derive(Subcommand)]
enum XememCommand {
    /// List the segments
    Ls,
}

/// `--cores N` (a count; a list such as `2-3` is still taken as one) or `--core-list LIST`.
#[derive(Args)]
#[group(multiple = false)]
struct CoreArgs {
    /// How many cores (a count: the highest free ones)
    #[arg(long, value_name = "N", value_parser = parse_count)]
    cores: Option<Cores>,
    /// Which cores, e.g. 0, 2-3, 1,3
    #[arg(long, value_name = "LIST")]
    core_list: Option<String>,
}

impl CoreArgs {
    fn cores(self) -> Option<Cores> {
        self.cores.or(self.core_list.map(Cores::List))
    }
}

/// `--cores`: a count; 0 is refused with the way to name core 0.
fn parse_count(value: &str) -> Result<Cores, String> {
    match value.parse::<u32>() {
        Ok(0) => Err(format!("--cores {value} asks for no cores; --cores takes a count, so name core 0 with --core-list 0")),
        Ok(count) => Ok(Cores::Count(count)),
        Err(_) => Ok(Cores::List(value.to_string())),
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum Kind {
    /// The lightweight kernel
    Lwk,
    /// A Linux virtual machine (docs/linux-guest.md)
    Linux,
}

#[derive(Args)]
struct CreateArgs {
    /// The enclave's name: 1-32 letters, digits, '-' or '_'
    #[arg(long)]
    name: String,
    /// The kind of enclave
    #[arg(long, value_enum, default_value_t = Kind::Lwk)]
    kind: Kind,
    #[command(flatten)]
    cores: CoreArgs,
    /// Its memory, e.g. 512M, 1G, 1GiB
    #[arg(long, value_name = "SIZE")]
    mem: String,
    /// Back its memory with 2 MiB hugepages
    #[arg(long)]
    hugepages: bool,
    /// A group whose members may use and remove it too
    #[arg(long, value_name = "GROUP")]
    share_group: Option<String>,
    /// Confine its jobs' host files to this directory (they start there or below); without
    /// it a job opens whatever its user may
    #[arg(long, value_name = "DIR")]
    confine: Option<String>,
    /// --kind linux: the guest kernel (default: the daemon's)
    #[arg(long, value_name = "FILE")]
    kernel: Option<String>,
    /// --kind linux: the initramfs, whose /init speaks the enclave protocol (default: the daemon's)
    #[arg(long, value_name = "FILE")]
    initrd: Option<String>,
    /// --kind linux: a network, `tap`: a host tap the daemon makes, the guest at one end of a
    /// /30 the daemon picks, nothing routed beyond the host (default: no network)
    #[arg(long, value_enum, value_name = "KIND")]
    net: Option<NetKind>,
}

#[derive(Clone, Copy, ValueEnum)]
enum NetKind {
    /// virtio-net over a host tap
    Tap,
}

/// A file the daemon is to read, as an absolute path (it has no working directory of ours).
fn absolute_file(path: &str) -> Result<String, Failure> {
    let real = std::fs::canonicalize(path).map_err(|e| Failure(format!("cannot use {path}: {e}")))?;
    real.to_str().map(str::to_string).ok_or_else(|| Failure(format!("{path} is not a UTF-8 path")))
}

#[derive(Args)]
pub struct RunArgs {
    /// Run in this persistent enclave
    #[arg(long, value_name = "NAME")]
    enclave: Option<String>,
    #[command(flatten)]
    cores: CoreArgs,
    /// The job's heap, e.g. 512M
    #[arg(long, value_name = "SIZE")]
    heap: Option<String>,
    /// A one-shot enclave's memory
    #[arg(long, value_name = "SIZE")]
    mem: Option<String>,
    /// NAME=VALUE, or NAME to pass NAME's value from this environment (repeatable)
    #[arg(long, value_name = "NAME[=VALUE]")]
    env: Vec<String>,
    /// An input file shared into the enclave (repeatable; needs --enclave)
    #[arg(long = "file", value_name = "PATH")]
    files: Vec<String>,
    /// Let the job name only host files beneath DIR, which holds the working directory
    /// (needs --enclave); without it the job opens whatever you may
    #[arg(long, value_name = "DIR")]
    confine: Option<String>,
    /// Show the kernel's lines and when the job starts
    #[arg(short, long)]
    verbose: bool,
    /// PROGRAM [ARGS...] (or NAME PROGRAM [ARGS...]); words after PROGRAM are its own
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "PROGRAM")]
    command: Vec<String>,
}

/// A `--confine` directory as the daemon needs it: absolute, with its symbolic links resolved
/// here, as the user sees them.
pub fn absolute_directory(dir: &str) -> Result<String, Failure> {
    let real = std::fs::canonicalize(dir).map_err(|e| Failure(format!("cannot use {dir} as the confinement directory: {e}")))?;
    real.to_str().map(str::to_string).ok_or_else(|| Failure(format!("the confinement directory {dir} is not a UTF-8 path")))
}

/// Why the command failed: its message goes to stderr and it exits 1.
pub struct Failure(pub String);

impl From<CallError> for Failure {
    fn from(error: CallError) -> Failure {
        Failure(error.to_string())
    }
}

/// `println!` that ends the program quietly when whoever reads stdout has gone (`clowder logs
/// NAME | head`), as Unix tools do (status 141, a shell's for SIGPIPE), instead of panicking.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(error) = writeln!(std::io::stdout(), $($arg)*) {
            if error.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(141);
            }
        }
    }};
}

pub fn print_json(value: &Value) {
    say!("{value}");
}

/// Prints rows as aligned columns.
fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells.iter().zip(&widths).map(|(cell, width)| format!("{cell:<width$}")).collect();
        say!("{}", padded.join("  ").trim_end());
    };
    line(header.iter().map(|h| h.to_string()).collect());
    for row in rows {
        line(row.clone());
    }
}

/// An enum's name on the wire (`lwk`, `one-shot`).
fn word(value: &impl Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(word)) => word,
        _ => "-".into(),
    }
}

fn or_dash<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".into(), |v| v.to_string())
}

const ENCLAVE_HEADER: [&str; 11] = ["NAME", "OWNER", "GROUP", "KIND", "MODE", "STATE", "CORES", "MEM", "HUGEPAGES", "PID", "JOBS"];

fn enclave_row(e: &EnclaveInfo) -> Vec<String> {
    vec![
        e.name.clone(),
        e.owner.clone(),
        or_dash(e.share_group.as_ref()),
        word(&e.kind),
        word(&e.mode),
        e.state.clone(),
        e.cores.clone(),
        e.mem.clone(),
        if e.hugepages { "yes" } else { "no" }.into(),
        or_dash(e.pid),
        e.jobs.to_string(),
    ]
}

/// A size as written: a plain number is bytes, anything else the daemon parses.
pub fn size(text: String) -> Size {
    text.parse().map_or(Size::Text(text), Size::Bytes)
}

/// Sends `request` and returns its typed reply; with `--json` every line is printed as it came.
fn call<R: DeserializeOwned>(request: &Request, json_output: bool) -> Result<R, Failure> {
    call_with_events(request, json_output, &mut |_| {})
}

/// [`call`], handing the events before the reply to `on_event`.
fn call_with_events<R: DeserializeOwned>(request: &Request, json_output: bool, on_event: &mut dyn FnMut(JobEvent)) -> Result<R, Failure> {
    let mut client = Client::connect().map_err(Failure)?;
    let mut on_raw = |line: &Value| {
        if json_output {
            print_json(line);
        }
    };
    Ok(client.request_streaming(request, &[], on_event, &mut on_raw)?)
}

fn enclave_command(command: EnclaveCommand, json: bool) -> Result<(), Failure> {
    match command {
        EnclaveCommand::Create(args) => {
            let request = Request::Create(Create {
                name: args.name,
                kind: match args.kind {
                    Kind::Lwk => EnclaveKind::Lwk,
                    Kind::Linux => EnclaveKind::Linux,
                },
                cores: args.cores.cores(),
                mem: size(args.mem),
                hugepages: args.hugepages,
                share_group: args.share_group,
                confine: args.confine.as_deref().map(absolute_directory).transpose()?,
                kernel: args.kernel.as_deref().map(absolute_file).transpose()?,
                initrd: args.initrd.as_deref().map(absolute_file).transpose()?,
                net: args.net.map(|NetKind::Tap| Network::Tap),
                // JSON output is the daemon's lines alone: it asks for none.
                progress: !json,
            });
            let stderr = std::io::stderr();
            let terminal = stderr.is_terminal();
            let mut line = progress::ProgressLine::new(stderr, terminal);
            let reply = call_with_events(&request, json, &mut |event| {
                if let JobEvent::Progress { done_mib, total_mib, elapsed_ms } = event {
                    line.show(done_mib, total_mib, elapsed_ms);
                }
            });
            line.finish();
            let reply: CreateReply = reply?;
            if !json {
                say!("created enclave {}", reply.enclave.name);
                print_table(&ENCLAVE_HEADER, &[enclave_row(&reply.enclave)]);
                for note in &reply.notes {
                    say!("note: {note}");
                }
            }
        }
        EnclaveCommand::Ls => {
            let reply: LsReply = call(&Request::Ls, json)?;
            if json {
                return Ok(());
            }
            if reply.enclaves.is_empty() {
                say!("no enclaves (create one with: clowder enclave create --name NAME --cores 1 --mem 1G)");
            } else {
                print_table(&ENCLAVE_HEADER, &reply.enclaves.iter().map(enclave_row).collect::<Vec<_>>());
            }
            say!("free cores: {}", reply.free_cores);
            if !reply.removed.is_empty() {
                say!("recently removed:");
                for entry in &reply.removed {
                    let reason = entry.reason.as_deref().unwrap_or("-");
                    say!("  {}: {}", entry.name, reason.lines().next().unwrap_or(""));
                }
            }
        }
        EnclaveCommand::Rm { name } => {
            let reply: RmReply = call(&Request::Rm(Named { name: name.clone() }), json)?;
            if !json {
                say!("removed enclave {name} ({})", reply.how);
            }
        }
    }
    Ok(())
}

/// `xemem ls`: one row per segment the host's XEMEM name server knows, with its owner: the
/// host or an enclave, and the owning process there (an enclave job's pid is its own).
fn print_segments(reply: &XememLsReply) {
    if reply.segments.is_empty() {
        say!("no XEMEM segments (broker on {})", reply.socket);
        return;
    }
    let rows: Vec<Vec<String>> = reply
        .segments
        .iter()
        .map(|segment| {
            // Enclave 1 is the host's own name server: its segments belong to host processes.
            let owner = match segment.owner_enclave {
                Some(1) => "host".to_string(),
                Some(enclave) => format!("enclave {enclave}"),
                None => "-".to_string(),
            };
            let name = segment.name.clone().unwrap_or_else(|| "-".into());
            vec![segment.segid_hex.clone(), owner, or_dash(segment.owner_process), or_dash(segment.size.map(readable_size)), name]
        })
        .collect();
    print_table(&["SEGID", "OWNER", "PID", "SIZE", "NAME"], &rows);
}

fn command(cli: Cli) -> Result<u8, Failure> {
    let json = cli.json;
    match cli.command {
        Command::Enclave { command } => enclave_command(command, json)?,
        Command::Run(args) => return run::run_command(args, json),
        Command::Logs { name } => {
            let reply: LogsReply = call(&Request::Logs(Named { name }), json)?;
            if !json {
                if let Some(reason) = &reply.removed {
                    say!("(enclave {} was removed: {reason})", reply.name);
                }
                for line in &reply.lines {
                    say!("{line}");
                }
            }
        }
        Command::Xemem { command: XememCommand::Ls } => {
            let reply: XememLsReply = call(&Request::XememLs, json)?;
            if !json {
                print_segments(&reply);
            }
        }
        Command::Version => {
            let reply: VersionReply = call(&Request::Version, json)?;
            if !json {
                say!("clowder {} (API {API_VERSION})", env!("CARGO_PKG_VERSION"));
                say!("clowderd {} (API {})", reply.daemon_version, reply.api_version);
            }
            if reply.api_version != API_VERSION {
                return Err(Failure(format!(
                    "clowderd speaks API {} and this clowder API {API_VERSION}: use the clowder that came with the daemon",
                    reply.api_version
                )));
            }
        }
    }
    Ok(0)
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) if !error.use_stderr() => {
            // --help and --version: printed like any output, so a closed pipe ends quietly.
            say!("{}", error.render().to_string().trim_end());
            return ExitCode::SUCCESS;
        }
        Err(error) => {
            let _ = error.print();
            return ExitCode::from(2);
        }
    };
    match command(cli) {
        Ok(status) => ExitCode::from(status),
        Err(Failure(message)) => {
            eprintln!("clowder: {message}");
            ExitCode::from(1)
        }
    }
}
