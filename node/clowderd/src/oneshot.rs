//! One-shot enclaves: boot `clowder-vmm` with the LWK and the job's binary as PVH module 0
//! (argv and environment on the kernel command line, which the VMM reads from a private memfd,
//! never from its own command line, which every user can read), stream the console, and take
//! the job's status from the kernel's `[lwk] job exited with status N` line. This works with a
//! kernel that does not speak the enclave protocol yet.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use crate::console::{ConsoleSplitter, LogBook, Piece};
use crate::machine::{describe_vmm_exit, vmm_command, MachineSpec};
use crate::memory::format_size;
use crate::sys;

/// Console output is gathered for at most this long, or this many bytes, per event.
const BATCH_WAIT: Duration = Duration::from_millis(5);
const OUTPUT_BATCH: usize = 16 * 1024;
/// The longest command line clowder-vmm takes from us (it keeps the rest for `clowder.*` keys)
/// less the daemon's `lwk.id_block=N ` word.
const MAX_COMMAND_LINE: usize = 3839 - ID_BLOCK_WORD_MAX;
const ID_BLOCK_WORD_MAX: usize = "lwk.id_block=NNNN ".len();

/// Builds the LWK command line: `[lwk.heap=H] [lwk.env=N=V]... -- "argv0" "argv1" ...`.
/// The kernel splits at spaces with `"` grouping and cannot escape, so what it cannot carry
/// is refused here with the reason.
pub fn kernel_command_line(argv: &[String], env: &[String], heap: Option<u64>) -> Result<String, String> {
    let mut words = Vec::new();
    if let Some(heap) = heap {
        words.push(format!("lwk.heap={}", format_size(heap)));
    }
    for entry in env {
        if entry.contains(|c: char| c.is_ascii_whitespace() || c == '"') {
            return Err(format!(
                "environment entry {entry:?} holds a space or a quote, which a one-shot enclave's command line cannot carry"
            ));
        }
        words.push(format!("lwk.env={entry}"));
    }
    words.push("--".into());
    for (index, arg) in argv.iter().enumerate() {
        if arg.contains(['"', '\n', '\r']) {
            return Err(format!(
                "argument {index} ({arg:?}) holds a quote or a newline, which a one-shot enclave's command line cannot carry"
            ));
        }
        words.push(format!("\"{arg}\""));
    }
    let line = words.join(" ");
    if line.len() > MAX_COMMAND_LINE {
        return Err(format!("argv and environment take {} bytes on the kernel command line, at most {MAX_COMMAND_LINE} fit", line.len()));
    }
    Ok(line)
}

/// What the console says about the end of the job.
#[derive(Default)]
struct Ending {
    status: Option<u32>,
    /// Why the job could not start (the kernel's `cannot start the job: ...` line).
    not_started: Option<String>,
    panic: Option<String>,
}

impl Ending {
    fn note(&mut self, kernel_line: &str) {
        if let Some(status) = kernel_line.strip_prefix("job exited with status ") {
            self.status = status.trim().parse().ok();
        } else if let Some(reason) = kernel_line.strip_prefix("cannot start the job: ") {
            self.not_started = Some(reason.to_string());
        } else if let Some(panic) = kernel_line.strip_prefix("panic: ") {
            self.panic = Some(panic.to_string());
        }
    }
}

/// Something the one-shot run reports as it goes.
pub enum RunEvent {
    Output(Vec<u8>),
    KernelLine(String),
}

/// A one-shot enclave whose machine is running.
pub struct OneShot {
    child: Child,
    console: mpsc::Receiver<RunEvent>,
    ending_rx: mpsc::Receiver<Ending>,
    diagnostics: std::thread::JoinHandle<Vec<String>>,
    /// Keep the binary and the command line open while the VMM reads them through /proc.
    _binary: File,
    _command_line: File,
}

impl OneShot {
    /// Starts clowder-vmm for the job. `log` receives the VMM's own diagnostics.
    pub fn start(
        vmm: &Path,
        kernel: &Path,
        spec: &MachineSpec,
        binary: File,
        command_line: &str,
        log: Arc<LogBook>,
    ) -> Result<OneShot, String> {
        // The VMM opens the module by path; /proc names our descriptor, so the client's file
        // is used as it was opened, without the daemon resolving the client's path itself.
        let module = format!("/proc/{}/fd/{}", std::process::id(), binary.as_raw_fd());
        // The job's arguments and environment, the same way: /proc/PID/fd of the daemon is
        // open to root alone.
        let mut line_file = sys::memfd("clowder-cmdline").map_err(|e| format!("making the kernel command line's memfd: {e}"))?;
        let command_line = format!("lwk.id_block={} {command_line}", spec.id_block);
        line_file.write_all(command_line.as_bytes()).map_err(|e| format!("writing the kernel command line: {e}"))?;
        let line_path = format!("/proc/{}/fd/{}", std::process::id(), line_file.as_raw_fd());
        let mut command = vmm_command(vmm, kernel, spec);
        command
            .arg("--module")
            .arg(&module)
            .arg("--cmdline-file")
            .arg(&line_path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().map_err(|e| format!("cannot start {}: {e}", vmm.display()))?;
        let mut stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let (console_tx, console) = mpsc::channel();
        let (ending_tx, ending_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut splitter = ConsoleSplitter::default();
            let mut ending = Ending::default();
            let mut buffer = [0u8; 4096];
            let deliver = |pieces: Vec<Piece>, ending: &mut Ending| {
                for piece in pieces {
                    let event = match piece {
                        Piece::Output(bytes) => RunEvent::Output(bytes),
                        Piece::KernelLine(line) => {
                            ending.note(&line);
                            RunEvent::KernelLine(line)
                        }
                    };
                    let _ = console_tx.send(event);
                }
            };
            let mut batch = Vec::new();
            while let Ok(count) = stdout.read(&mut buffer) {
                if count == 0 {
                    break;
                }
                // The serial device writes a byte at a time: gather what follows within a few
                // milliseconds so a line becomes one event, without holding output back longer.
                batch.extend_from_slice(&buffer[..count]);
                while batch.len() < OUTPUT_BATCH && sys::wait_readable(&stdout, BATCH_WAIT).unwrap_or(false) {
                    match stdout.read(&mut buffer) {
                        Ok(0) | Err(_) => break,
                        Ok(count) => batch.extend_from_slice(&buffer[..count]),
                    }
                }
                deliver(splitter.push(&batch), &mut ending);
                batch.clear();
            }
            deliver(splitter.finish(), &mut ending);
            let _ = ending_tx.send(ending);
        });
        // The VMM's own diagnostics: into the enclave's log, and back to `finish` for errors.
        let diagnostics = std::thread::spawn(move || {
            let mut text = String::new();
            let mut stderr = stderr;
            let _ = stderr.read_to_string(&mut text);
            let lines: Vec<String> = text.lines().map(String::from).collect();
            for line in &lines {
                log.push(format!("vmm: {line}"));
            }
            lines
        });
        Ok(OneShot { child, console, ending_rx, diagnostics, _binary: binary, _command_line: line_file })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next console event within `wait`; `Disconnected` once the console has closed (the
    /// machine ended).
    pub fn next_event(&self, wait: Duration) -> Result<RunEvent, mpsc::RecvTimeoutError> {
        self.console.recv_timeout(wait)
    }

    /// Stops the machine early (the client went away).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
    }

    /// Waits for the machine and says how the job ended: its status, or why there is none.
    pub fn finish(mut self) -> Result<u32, String> {
        let status = self.child.wait().map_err(|e| format!("waiting for clowder-vmm: {e}"))?;
        let ending = self.ending_rx.recv().unwrap_or_default();
        // Both readers end when the process is gone and its pipes close.
        let diagnostics = self.diagnostics.join().unwrap_or_default();
        let diagnostics =
            if diagnostics.is_empty() { String::new() } else { format!("\nclowder-vmm said:\n  {}", diagnostics.join("\n  ")) };
        match (ending.status, ending.not_started, ending.panic) {
            (Some(job_status), _, _) => Ok(job_status),
            (None, Some(reason), _) => Err(format!("the job could not start: {reason}")),
            (None, None, Some(panic)) => Err(format!("the LWK panicked: {panic}")),
            (None, None, None) => Err(format!(
                "the enclave ended before the job finished: {} (pid {}){diagnostics}",
                describe_vmm_exit(status),
                self.child.id()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_id_block_word_fits_in_the_room_kept_for_it() {
        assert!(format!("lwk.id_block={} ", lwk_core::ids::BLOCKS - 1).len() <= ID_BLOCK_WORD_MAX);
    }

    #[test]
    fn command_lines_quote_argv_and_refuse_what_cannot_be_carried() {
        let argv = vec!["hello".to_string(), "two words".to_string(), String::new()];
        let env = vec!["GREETING=hi".to_string()];
        assert_eq!(
            kernel_command_line(&argv, &env, Some(64 << 20)).unwrap(),
            "lwk.heap=64M lwk.env=GREETING=hi -- \"hello\" \"two words\" \"\""
        );
        assert!(kernel_command_line(&["a\"b".into()], &[], None).unwrap_err().contains("quote"));
        assert!(kernel_command_line(&["a".into()], &["X=a b".into()], None).unwrap_err().contains("space"));
        assert!(kernel_command_line(&["x".repeat(5000)], &[], None).unwrap_err().contains("at most"));
    }
}
