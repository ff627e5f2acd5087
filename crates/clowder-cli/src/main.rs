//! `clowder`: the command line for clowder enclaves and jobs. It talks to `clowderd` over its
//! socket (`CLOWDER_SOCKET` or /run/clowder/clowderd.sock).

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::process::ExitCode;

use clowder_api::client::Client;
use clowder_api::daemon::MAX_INPUT_FILES;
use clowder_api::size::readable_size;
use serde_json::{json, Value};

const USAGE: &str = "usage: clowder [--json] COMMAND
  enclave create --name NAME [--kind lwk] [--cores N | --core-list LIST] --mem SIZE [--hugepages]
                 [--share-group GROUP]   (GROUP's members may use and remove it too)
  enclave ls
  enclave rm NAME
  run [--enclave NAME] [--cores N | --core-list LIST] [--heap SIZE] [--mem SIZE]
      [--env NAME=VALUE | --env NAME]... [--file PATH]... [-v]
      PROGRAM [ARGS...]      (without --enclave: a one-shot enclave made for the job;
                             --env NAME passes NAME's value from this environment)
  run NAME PROGRAM [ARGS...] (the same as --enclave NAME; write ./PROGRAM for a program
                             in this directory whose name is also an enclave's)
  logs NAME
  xemem ls
--cores N is a count of cores; --core-list names them (0, 2-3, 1,3): --core-list 0 is core 0.
--json prints the daemon's replies (and job events) as JSON lines.";

/// A mistake in the command line: print it with the usage, exit 2.
struct Usage(String);

enum Failure {
    Usage(String),
    Error(String),
}

impl From<Usage> for Failure {
    fn from(usage: Usage) -> Failure {
        Failure::Usage(usage.0)
    }
}

struct Arguments {
    words: std::vec::IntoIter<String>,
}

impl Arguments {
    fn next(&mut self) -> Option<String> {
        self.words.next()
    }

    fn value(&mut self, flag: &str) -> Result<String, Usage> {
        self.next().ok_or_else(|| Usage(format!("{flag} needs a value")))
    }

    fn rest(&mut self) -> Vec<String> {
        self.words.by_ref().collect()
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

fn reply_or_error(reply: Value) -> Result<Value, Failure> {
    if reply["ok"] == json!(true) {
        Ok(reply)
    } else {
        Err(Failure::Error(reply["error"].as_str().unwrap_or("clowderd gave no reason").to_string()))
    }
}

fn print_json(value: &Value) {
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

fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        Value::Bool(true) => "yes".into(),
        Value::Bool(false) => "no".into(),
        other => other.to_string(),
    }
}

/// `--cores N` (a count; a list such as `2-3` is still taken as one) or `--core-list LIST`
/// (always a list), as the API's `cores`: a number counts, a string names.
fn cores_value(flag: &str, value: String) -> Result<Value, Usage> {
    if flag == "--core-list" {
        return Ok(json!(value));
    }
    match value.parse::<u64>() {
        Ok(0) => Err(Usage(format!("--cores {value} asks for no cores; --cores takes a count, so name core 0 with --core-list 0"))),
        Ok(count) => Ok(json!(count)),
        Err(_) => Ok(json!(value)),
    }
}

fn enclave_row(enclave: &Value) -> Vec<String> {
    ["name", "owner", "share_group", "kind", "mode", "state", "cores", "mem", "hugepages", "pid", "jobs"]
        .iter()
        .map(|key| text(&enclave[key]))
        .collect()
}

const ENCLAVE_HEADER: [&str; 11] =
    ["NAME", "OWNER", "GROUP", "KIND", "MODE", "STATE", "CORES", "MEM", "HUGEPAGES", "PID", "JOBS"];

fn enclave_command(args: &mut Arguments, json_output: bool) -> Result<u8, Failure> {
    let mut client = Client::connect().map_err(Failure::Error)?;
    match args.next().as_deref() {
        Some("create") => {
            let mut request = json!({"op": "create", "kind": "lwk"});
            while let Some(flag) = args.next() {
                match flag.as_str() {
                    "--name" => request["name"] = json!(args.value(&flag)?),
                    "--kind" => request["kind"] = json!(args.value(&flag)?),
                    "--cores" | "--core-list" => request["cores"] = cores_value(&flag, args.value(&flag)?)?,
                    "--mem" => request["mem"] = json!(args.value(&flag)?),
                    "--hugepages" => request["hugepages"] = json!(true),
                    "--share-group" => request["share_group"] = json!(args.value(&flag)?),
                    other => return Err(Usage(format!("enclave create: unknown option {other:?}")).into()),
                }
            }
            if request.get("name").is_none() {
                return Err(Usage("enclave create needs --name NAME".into()).into());
            }
            if request.get("mem").is_none() {
                return Err(Usage("enclave create needs --mem SIZE (for example --mem 1G)".into()).into());
            }
            let reply = reply_or_error(client.call(&request).map_err(Failure::Error)?)?;
            if json_output {
                print_json(&reply);
            } else {
                say!("created enclave {}", text(&reply["enclave"]["name"]));
                print_table(&ENCLAVE_HEADER, &[enclave_row(&reply["enclave"])]);
                for note in reply["notes"].as_array().into_iter().flatten() {
                    say!("note: {}", text(note));
                }
            }
            Ok(0)
        }
        Some("ls") => {
            let reply = reply_or_error(client.call(&json!({"op": "ls"})).map_err(Failure::Error)?)?;
            if json_output {
                print_json(&reply);
                return Ok(0);
            }
            let enclaves = reply["enclaves"].as_array().cloned().unwrap_or_default();
            if enclaves.is_empty() {
                say!("no enclaves (create one with: clowder enclave create --name NAME --cores 1 --mem 1G)");
            } else {
                print_table(&ENCLAVE_HEADER, &enclaves.iter().map(enclave_row).collect::<Vec<_>>());
            }
            say!("free cores: {}", text(&reply["free_cores"]));
            let removed = reply["removed"].as_array().cloned().unwrap_or_default();
            if !removed.is_empty() {
                say!("recently removed:");
                for entry in removed {
                    say!("  {}: {}", text(&entry["name"]), text(&entry["reason"]).lines().next().unwrap_or(""));
                }
            }
            Ok(0)
        }
        Some("rm") => {
            let name = args.next().ok_or_else(|| Usage("enclave rm needs the enclave's NAME".into()))?;
            let reply = reply_or_error(client.call(&json!({"op": "rm", "name": name})).map_err(Failure::Error)?)?;
            if json_output {
                print_json(&reply);
            } else {
                say!("removed enclave {name} ({})", text(&reply["how"]));
            }
            Ok(0)
        }
        Some(other) => Err(Usage(format!("unknown enclave command {other:?} (create, ls, rm)")).into()),
        None => Err(Usage("enclave needs a command: create, ls or rm".into()).into()),
    }
}

/// What the first word after `run` (and its options) is on this machine.
#[derive(Clone, Copy, PartialEq, Debug)]
enum FirstWord {
    /// Written as a path (it has a `/`): always the program.
    Path,
    /// A bare word naming an executable file in the working directory.
    ExecutableHere,
    /// A bare word that is no executable here (absent, a directory, not executable).
    Other,
}

impl FirstWord {
    /// `word` as seen from directory `dir`.
    fn of(word: &str, dir: &std::path::Path) -> FirstWord {
        use std::os::unix::fs::PermissionsExt;
        if word.contains('/') {
            return FirstWord::Path;
        }
        match std::fs::metadata(dir.join(word)) {
            Ok(meta) if meta.is_file() && meta.permissions().mode() & 0o111 != 0 => FirstWord::ExecutableHere,
            _ => FirstWord::Other,
        }
    }
}

/// Whether `clowder run WORD NEXT ...` names an enclave with WORD. `next` says whether a NEXT
/// word follows and whether it is a file. Enclave names have no `/`, so a path is the program;
/// a bare word that is no executable here, followed by a file, is the enclave; followed by
/// something that is no file either, it is the enclave if one has that name (the error is then
/// about NEXT, the program that cannot be opened), else the program. A bare word that is both
/// an executable here and an enclave's name is refused as ambiguous rather than guessed.
fn names_enclave(
    word: &str,
    first: FirstWord,
    next: Option<bool>,
    enclave_exists: impl Fn(&str) -> bool,
) -> Result<bool, Failure> {
    match (first, next) {
        (FirstWord::Path, _) | (_, None) => Ok(false),
        (FirstWord::Other, Some(true)) => Ok(true),
        (FirstWord::Other, Some(false)) => Ok(enclave_exists(word)),
        (FirstWord::ExecutableHere, Some(true)) if enclave_exists(word) => Err(Failure::Error(format!(
            "`{word}` is both an enclave and a program in this directory: write `clowder run --enclave {word} PROGRAM` \
             to run in the enclave, or `clowder run ./{word}` to run the program"
        ))),
        (FirstWord::ExecutableHere, _) => Ok(false),
    }
}

/// The names of the daemon's enclaves.
fn enclave_names() -> Result<Vec<String>, String> {
    let reply = Client::connect()?.call(&json!({"op": "ls"}))?;
    Ok(reply["enclaves"].as_array().into_iter().flatten().filter_map(|e| e["name"].as_str().map(String::from)).collect())
}

/// `--env NAME=VALUE` as given; `--env NAME` takes NAME's value from this environment, so a
/// secret need not be on the command line.
fn env_entry(entry: String) -> Result<String, Failure> {
    if entry.contains('=') {
        return Ok(entry);
    }
    match std::env::var(&entry) {
        Ok(value) => Ok(format!("{entry}={value}")),
        Err(std::env::VarError::NotPresent) => Err(Failure::Error(format!("--env {entry}: {entry} is not set in this environment"))),
        Err(std::env::VarError::NotUnicode(_)) => Err(Failure::Error(format!("--env {entry}: {entry}'s value is not UTF-8"))),
    }
}

fn run_command(args: &mut Arguments, json_output: bool) -> Result<u8, Failure> {
    let mut request = json!({"op": "run"});
    let mut env = Vec::new();
    let mut input_paths = Vec::new();
    let mut verbose = false;
    let mut program = loop {
        let word = args.next().ok_or_else(|| Usage("run needs a PROGRAM".into()))?;
        match word.as_str() {
            "--enclave" => request["enclave"] = json!(args.value(&word)?),
            "--cores" | "--core-list" => request["cores"] = cores_value(&word, args.value(&word)?)?,
            "--heap" => request["heap"] = json!(args.value(&word)?),
            "--mem" => request["mem"] = json!(args.value(&word)?),
            "--env" => env.push(env_entry(args.value(&word)?)?),
            "--file" => input_paths.push(args.value(&word)?),
            "-v" | "--verbose" => verbose = true,
            "--" => break args.next().ok_or_else(|| Usage("run needs a PROGRAM after --".into()))?,
            flag if flag.starts_with('-') => return Err(Usage(format!("run: unknown option {flag:?}")).into()),
            _ => break word,
        }
    };
    let mut rest = args.rest();
    if request.get("enclave").is_none() {
        let first = FirstWord::of(&program, std::path::Path::new("."));
        let next = rest.first().map(|next| std::path::Path::new(next).is_file());
        let enclave_exists = |name: &str| enclave_names().is_ok_and(|names| names.iter().any(|n| n == name));
        if names_enclave(&program, first, next, enclave_exists)? {
            request["enclave"] = json!(program);
            program = rest.remove(0);
        }
    }
    if input_paths.len() > MAX_INPUT_FILES {
        return Err(Failure::Error(format!("a run takes at most {MAX_INPUT_FILES} --file inputs, not {}", input_paths.len())));
    }
    let binary = File::open(&program).map_err(|e| Failure::Error(format!("cannot open {program}: {e}")))?;
    let cwd = std::env::current_dir().map_err(|e| Failure::Error(format!("cannot find the working directory: {e}")))?;
    let cwd_dir = File::open(&cwd).map_err(|e| Failure::Error(format!("cannot open {}: {e}", cwd.display())))?;
    let mut inputs = Vec::new();
    let mut names = Vec::new();
    for path in &input_paths {
        let file = File::open(path).map_err(|e| Failure::Error(format!("cannot open input file {path}: {e}")))?;
        let name = std::path::Path::new(path)
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| Failure::Error(format!("input file {path} has no usable name")))?;
        names.push(name.to_string());
        inputs.push(file);
    }
    let mut argv = vec![program.clone()];
    argv.extend(rest);
    request["argv"] = json!(argv);
    request["env"] = json!(env);
    request["cwd"] = json!(cwd.to_string_lossy());
    request["files"] = json!(names);
    let mut fds = vec![binary.as_raw_fd(), cwd_dir.as_raw_fd()];
    fds.extend(inputs.iter().map(|f| f.as_raw_fd()));

    let mut client = Client::connect().map_err(Failure::Error)?;
    let mut on_event = |event: &Value| {
        if json_output {
            print_json(event);
            return;
        }
        match event["event"].as_str() {
            Some("output") => {
                let bytes = match (&event["text"], &event["bytes"]) {
                    (Value::String(text), _) => text.as_bytes().to_vec(),
                    (_, Value::Array(bytes)) => bytes.iter().filter_map(|b| b.as_u64()).map(|b| b as u8).collect(),
                    _ => Vec::new(),
                };
                if event["stream"] == "stderr" {
                    let _ = std::io::stderr().write_all(&bytes);
                } else {
                    let mut stdout = std::io::stdout();
                    let _ = stdout.write_all(&bytes);
                    let _ = stdout.flush();
                }
            }
            Some("log") if verbose => eprintln!("[lwk] {}", text(&event["text"])),
            Some("started") if verbose => eprintln!("clowder: job started in enclave {}", text(&event["enclave"])),
            _ => {}
        }
    };
    let reply = client.call_streaming(&request, &fds, &mut on_event).map_err(Failure::Error)?;
    if json_output {
        print_json(&reply);
    }
    let reply = reply_or_error(reply)?;
    // The job's status becomes ours, as a shell would report it.
    Ok(reply["status"].as_u64().map_or(1, |status| status.min(255) as u8))
}

/// `xemem ls`: one row per segment the host's XEMEM name server knows, with its owner: the
/// host or an enclave, and the owning process there (an enclave job's pid is its own).
fn print_segments(reply: &Value) {
    let segments = reply["segments"].as_array().cloned().unwrap_or_default();
    if segments.is_empty() {
        say!("no XEMEM segments (broker on {})", text(&reply["socket"]));
        return;
    }
    let rows: Vec<Vec<String>> = segments
        .iter()
        .map(|segment| {
            // Enclave 1 is the host's own name server: its segments belong to host processes.
            let owner = match segment["owner_enclave"].as_u64() {
                Some(1) => "host".to_string(),
                Some(enclave) => format!("enclave {enclave}"),
                None => "-".to_string(),
            };
            let size = segment["size"].as_u64().map_or_else(|| "-".to_string(), readable_size);
            vec![text(&segment["segid_hex"]), owner, text(&segment["owner_process"]), size, text(&segment["name"])]
        })
        .collect();
    print_table(&["SEGID", "OWNER", "PID", "SIZE", "NAME"], &rows);
}

fn simple_command(request: Value, json_output: bool, show: impl Fn(&Value)) -> Result<u8, Failure> {
    let mut client = Client::connect().map_err(Failure::Error)?;
    let reply = reply_or_error(client.call(&request).map_err(Failure::Error)?)?;
    if json_output {
        print_json(&reply);
    } else {
        show(&reply);
    }
    Ok(0)
}

fn run(arguments: Vec<String>) -> Result<u8, Failure> {
    let mut json_output = false;
    let mut words = Vec::new();
    for word in arguments {
        if word == "--json" && words.len() < 2 {
            json_output = true;
        } else {
            words.push(word);
        }
    }
    let mut args = Arguments { words: words.into_iter() };
    match args.next().as_deref() {
        Some("enclave") => enclave_command(&mut args, json_output),
        Some("run") => run_command(&mut args, json_output),
        Some("logs") => {
            let name = args.next().ok_or_else(|| Usage("logs needs the enclave's NAME".into()))?;
            simple_command(json!({"op": "logs", "name": name}), json_output, |reply| {
                if let Some(reason) = reply["removed"].as_str() {
                    say!("(enclave {} was removed: {reason})", text(&reply["name"]));
                }
                for line in reply["lines"].as_array().into_iter().flatten() {
                    say!("{}", text(line));
                }
            })
        }
        Some("xemem") => match args.next().as_deref() {
            Some("ls") => simple_command(json!({"op": "xemem_ls"}), json_output, print_segments),
            _ => Err(Usage("xemem takes: ls".into()).into()),
        },
        Some("help" | "--help" | "-h") => {
            say!("{USAGE}");
            Ok(0)
        }
        Some(other) => Err(Usage(format!("unknown command {other:?}")).into()),
        None => Err(Usage("no command given".into()).into()),
    }
}

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(status) => ExitCode::from(status),
        Err(Failure::Usage(message)) => {
            eprintln!("clowder: {message}\n{USAGE}");
            ExitCode::from(2)
        }
        Err(Failure::Error(message)) => {
            eprintln!("clowder: {message}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decide(first: FirstWord, next: Option<bool>, enclave: bool) -> Result<bool, String> {
        names_enclave("sim", first, next, |_| enclave).map_err(|f| match f {
            Failure::Error(e) | Failure::Usage(e) => e,
        })
    }

    #[test]
    fn the_first_word_of_run_is_an_enclave_only_when_it_cannot_be_the_program() {
        assert_eq!(decide(FirstWord::Other, Some(true), true), Ok(true));
        assert_eq!(decide(FirstWord::Other, Some(true), false), Ok(true), "the daemon then says no such enclave");
        assert_eq!(decide(FirstWord::Other, None, true), Ok(false), "no program follows");
        assert_eq!(decide(FirstWord::Other, Some(false), true), Ok(true), "the error then names the missing program");
        assert_eq!(decide(FirstWord::Other, Some(false), false), Ok(false), "neither an enclave nor a file: the program");
        assert_eq!(decide(FirstWord::Path, Some(true), true), Ok(false));
        assert_eq!(decide(FirstWord::ExecutableHere, Some(true), false), Ok(false));
        assert_eq!(decide(FirstWord::ExecutableHere, None, true), Ok(false));
        let ambiguous = decide(FirstWord::ExecutableHere, Some(true), true).unwrap_err();
        assert!(ambiguous.contains("--enclave sim") && ambiguous.contains("./sim"), "{ambiguous}");
    }

    #[test]
    fn cores_are_counted_or_named_never_both() {
        assert_eq!(cores_value("--cores", "2".into()).ok(), Some(json!(2)));
        assert_eq!(cores_value("--cores", "2-3".into()).ok(), Some(json!("2-3")));
        assert_eq!(cores_value("--core-list", "0".into()).ok(), Some(json!("0")));
        let zero = cores_value("--cores", "0".into()).err().unwrap().0;
        assert!(zero.contains("--core-list 0"), "{zero}");
    }

    #[test]
    fn a_directory_named_like_the_enclave_does_not_hide_it() {
        let dir = std::env::temp_dir().join(format!("clowder-cli-firstword-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sim")).unwrap();
        std::fs::write(dir.join("data"), "x").unwrap();
        assert_eq!(FirstWord::of("sim", &dir), FirstWord::Other);
        assert_eq!(FirstWord::of("data", &dir), FirstWord::Other, "not executable");
        assert_eq!(FirstWord::of("./data", &dir), FirstWord::Path);
        std::fs::set_permissions(dir.join("data"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        assert_eq!(FirstWord::of("data", &dir), FirstWord::ExecutableHere);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
