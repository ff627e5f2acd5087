//! `clowder run`: which word names the enclave and which the program, the descriptors the
//! request carries (the binary, the working directory, the input files), the launcher's
//! environment (`launcher`), and the job's output and end streamed back.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;

use clowder_api::client::Client;
use clowder_api::daemon::{JobEvent, LsReply, Request, Run, RunReply, Stream, MAX_INPUT_FILES};

use crate::{launcher, print_json, Failure, RunArgs};

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
fn names_enclave(word: &str, first: FirstWord, next: Option<bool>, enclave_exists: impl Fn(&str) -> bool) -> Result<bool, String> {
    match (first, next) {
        (FirstWord::Path, _) | (_, None) => Ok(false),
        (FirstWord::Other, Some(true)) => Ok(true),
        (FirstWord::Other, Some(false)) => Ok(enclave_exists(word)),
        (FirstWord::ExecutableHere, Some(true)) if enclave_exists(word) => Err(format!(
            "`{word}` is both an enclave and a program in this directory: write `clowder run --enclave {word} PROGRAM` \
             to run in the enclave, or `clowder run ./{word}` to run the program"
        )),
        (FirstWord::ExecutableHere, _) => Ok(false),
    }
}

/// The names of the daemon's enclaves.
fn enclave_names() -> Result<Vec<String>, String> {
    let listing: LsReply = Client::connect()?.request(&Request::Ls).map_err(|e| e.to_string())?;
    Ok(listing.enclaves.into_iter().map(|enclave| enclave.name).collect())
}

/// `--env NAME=VALUE` as given; `--env NAME` takes NAME's value from this environment, so a
/// secret need not be on the command line.
fn env_entry(entry: &str) -> Result<String, String> {
    if entry.contains('=') {
        return Ok(entry.to_string());
    }
    match std::env::var(entry) {
        Ok(value) => Ok(format!("{entry}={value}")),
        Err(std::env::VarError::NotPresent) => Err(format!("--env {entry}: {entry} is not set in this environment")),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!("--env {entry}: {entry}'s value is not UTF-8")),
    }
}

/// Runs the job and returns its exit status, as a shell would report it.
pub fn run_command(args: RunArgs, json_output: bool) -> Result<u8, Failure> {
    let mut words = args.command.into_iter();
    let mut program = words.next().expect("clap requires PROGRAM");
    let mut rest: Vec<String> = words.collect();
    let mut enclave = args.enclave;
    if enclave.is_none() {
        let first = FirstWord::of(&program, std::path::Path::new("."));
        let next = rest.first().map(|next| std::path::Path::new(next).is_file());
        let enclave_exists = |name: &str| enclave_names().is_ok_and(|names| names.iter().any(|n| n == name));
        if names_enclave(&program, first, next, enclave_exists).map_err(Failure)? {
            enclave = Some(std::mem::replace(&mut program, rest.remove(0)));
        }
    }
    if args.files.len() > MAX_INPUT_FILES {
        return Err(Failure(format!("a run takes at most {MAX_INPUT_FILES} --file inputs, not {}", args.files.len())));
    }
    let explicit = args.env.iter().map(|entry| env_entry(entry)).collect::<Result<Vec<_>, _>>().map_err(Failure)?;
    let mut env = launcher::launcher_env(std::env::vars_os(), &explicit);
    env.extend(explicit);
    launcher::relay_pmi(&mut env).map_err(Failure)?;
    let binary = File::open(&program).map_err(|e| Failure(format!("cannot open {program}: {e}")))?;
    let cwd = std::env::current_dir().map_err(|e| Failure(format!("cannot find the working directory: {e}")))?;
    let cwd_dir = File::open(&cwd).map_err(|e| Failure(format!("cannot open {}: {e}", cwd.display())))?;
    let mut inputs = Vec::new();
    let mut names = Vec::new();
    for path in &args.files {
        let file = File::open(path).map_err(|e| Failure(format!("cannot open input file {path}: {e}")))?;
        let name = std::path::Path::new(path)
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| Failure(format!("input file {path} has no usable name")))?;
        names.push(name.to_string());
        inputs.push(file);
    }
    let mut argv = vec![program];
    argv.extend(rest);
    let request = Request::Run(Run {
        enclave,
        argv,
        env,
        cores: args.cores.cores(),
        heap: args.heap.map(crate::size),
        mem: args.mem.map(crate::size),
        cwd: cwd.to_string_lossy().into_owned(),
        files: names,
        confine: args.confine.as_deref().map(crate::absolute_directory).transpose()?,
    });
    let mut fds = vec![binary.as_raw_fd(), cwd_dir.as_raw_fd()];
    fds.extend(inputs.iter().map(|f| f.as_raw_fd()));

    let mut client = Client::connect().map_err(Failure)?;
    let verbose = args.verbose;
    let mut on_event = |event: JobEvent| {
        if json_output {
            return;
        }
        match event {
            JobEvent::Output { stream, text, bytes } => {
                let data = text.map(String::into_bytes).or(bytes).unwrap_or_default();
                if stream == Stream::Stderr {
                    let _ = std::io::stderr().write_all(&data);
                } else {
                    let mut stdout = std::io::stdout();
                    let _ = stdout.write_all(&data);
                    let _ = stdout.flush();
                }
            }
            JobEvent::Log { text } if verbose => eprintln!("[lwk] {text}"),
            JobEvent::Started { enclave, .. } if verbose => eprintln!("clowder: job started in enclave {enclave}"),
            _ => {}
        }
    };
    let mut on_raw = |line: &serde_json::Value| {
        if json_output {
            print_json(line);
        }
    };
    let reply: RunReply = client.request_streaming(&request, &fds, &mut on_event, &mut on_raw).map_err(Failure::from)?;
    if let Some(signal) = launcher::killing_signal(reply.status) {
        launcher::die_of(signal);
    }
    // A signal that ends nothing by default (it was caught, then the job killed otherwise): a
    // shell's 128 + N.
    Ok(enclave_proto::job_status_signal(reply.status).map_or(reply.status.min(255), |signal| 128 + signal.min(127)) as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decide(first: FirstWord, next: Option<bool>, enclave: bool) -> Result<bool, String> {
        names_enclave("sim", first, next, |_| enclave)
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
