//! The `clowder` CLI against a daemon this test starts (in-process, on a socket in a temp
//! directory named by CLOWDER_SOCKET): bad input to the CLI and to the raw API, and, where
//! /dev/kvm, the LWK image, clowder-vmm and musl-gcc exist, one-shot runs of a static musl
//! program and containment of a clowder-vmm killed from outside.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use clowder_test_support::build_musl_program;
use clowder_test_support::{kernel_image, lwk_daemon, serve, TempDir};
use clowderd::client::Client;
use clowderd::console::LogBook;
use clowderd::enclave::Liveness;
use clowderd::link::{self, Received};
use clowderd::machine::{start_vmm, vmm_command, MachineSpec};
use clowderd::sys;
use enclave_proto::HostMessage;
use serde_json::{json, Value};
use support::{missing_requirement, vmm_binary};

mod support;

macro_rules! require_kvm {
    () => {
        if let Some(why) = missing_requirement() {
            eprintln!("skipped: {why}");
            return;
        }
    };
}

struct TestDaemon {
    dir: TempDir,
}

impl TestDaemon {
    fn start(label: &str) -> TestDaemon {
        let dir = TempDir::new(&format!("clowder-cli-{label}"));
        let liveness = Liveness { hello_timeout: Duration::from_secs(5), ..Liveness::default() };
        serve(lwk_daemon(&dir.0, vmm_binary(), liveness), &dir.0);
        TestDaemon { dir }
    }

    fn socket(&self) -> PathBuf {
        self.dir.0.join("clowderd.sock")
    }

    fn clowder(&self, args: &[&str], cwd: &Path) -> Output {
        Command::new(support::clowder()).args(args).current_dir(cwd).env("CLOWDER_SOCKET", self.socket()).output().unwrap()
    }

    fn call(&self, request: Value) -> Value {
        Client::connect_to(&self.socket()).unwrap().call(&request).unwrap()
    }
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

const HELLO: &str = r#"#include <stdio.h>
int main(int argc, char **argv) {
    printf("hello %s from %s\n", argc > 1 ? argv[1] : "nobody", argv[0]);
    return 7;
}
"#;

const SPIN: &str = r#"#include <stdio.h>
int main(void) {
    printf("spinning\n");
    fflush(stdout);
    for (volatile unsigned long i = 0;; i++) {}
}
"#;

#[test]
fn a_missing_daemon_says_how_to_start_it() {
    let dir = TempDir::new("clowder-cli-no-daemon");
    let output =
        Command::new(support::clowder()).args(["enclave", "ls"]).env("CLOWDER_SOCKET", dir.0.join("nobody.sock")).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    let message = stderr(&output);
    assert!(message.contains("clowderd is not running") && message.contains("Start it as root with: clowderd &"), "{message}");
    assert!(message.contains("CLOWDER_SOCKET"), "{message}");
}

/// Output into a pipe whose reader has gone (`clowder logs NAME | head`) ends the command
/// quietly with a shell's SIGPIPE status, not a panic.
#[test]
fn output_to_a_closed_pipe_ends_quietly() {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let output = Command::new(support::clowder()).arg("help").stdout(writer).output().unwrap();
    let message = stderr(&output);
    assert!(!message.contains("panicked"), "{message}");
    assert_eq!(output.status.code(), Some(141), "{message}");
}

#[test]
fn cli_mistakes_and_bad_requests_get_errors_that_say_what_to_do() {
    let daemon = TestDaemon::start("bad-input");
    let here = daemon.dir.0.clone();
    let usage = daemon.clowder(&["enclave", "create", "--mem", "1G"], &here);
    assert_eq!(usage.status.code(), Some(2));
    assert!(stderr(&usage).contains("--name <NAME>"), "{}", stderr(&usage));

    let unknown = daemon.clowder(&["enclave", "rm", "nope"], &here);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(stderr(&unknown).contains("no enclave named nope; there are no enclaves; create one with"), "{}", stderr(&unknown));

    let too_many = daemon.clowder(&["enclave", "create", "--name", "big", "--cores", "200", "--mem", "64M"], &here);
    assert_eq!(too_many.status.code(), Some(1));
    let message = stderr(&too_many);
    assert!(message.contains("asked for 200 cores, only") && message.contains("free:"), "{message}");

    let not_a_count = daemon.clowder(&["enclave", "create", "--name", "x", "--cores", "4000", "--mem", "64M"], &here);
    assert!(stderr(&not_a_count).contains("count from 1 to 255"), "{}", stderr(&not_a_count));
    let offline = daemon.clowder(&["enclave", "create", "--name", "x", "--cores", "4000-4001", "--mem", "64M"], &here);
    assert!(stderr(&offline).contains("core 4000 is not online"), "{}", stderr(&offline));

    let hugepages = daemon.clowder(&["enclave", "create", "--name", "h", "--mem", "1T", "--hugepages"], &here);
    assert!(stderr(&hugepages).contains("hugepages"), "{}", stderr(&hugepages));

    let run_unknown = daemon.clowder(&["run", "--enclave", "ghost", support::clowder()], &here);
    assert!(stderr(&run_unknown).contains("no enclave named ghost"), "{}", stderr(&run_unknown));
    let positional = daemon.clowder(&["run", "ghost", support::clowder(), "arg"], &here);
    assert!(stderr(&positional).contains("no enclave named ghost"), "{}", stderr(&positional));
    let no_program = daemon.clowder(&["run", "./does-not-exist"], &here);
    assert!(stderr(&no_program).contains("cannot open ./does-not-exist"), "{}", stderr(&no_program));
    // Programs an enclave cannot run are refused before an enclave boots, saying why: a shell
    // script. (Dynamically linked programs run: dynamic_exec.rs.)
    std::fs::write(here.join("script.sh"), "#!/bin/sh\necho hi\n").unwrap();
    let script = daemon.clowder(&["run", "./script.sh"], &here);
    assert!(stderr(&script).contains("./script.sh is not an ELF executable"), "{}", stderr(&script));
    assert_eq!(daemon.call(json!({"op": "ls"}))["enclaves"], json!([]), "no enclave was made for them");

    let xemem = daemon.clowder(&["xemem", "ls"], &here);
    assert_eq!(xemem.status.code(), Some(1));
    // This in-process daemon was given no XEMEM broker (the binary always has one; see xemem.rs).
    assert!(stderr(&xemem).contains("without an XEMEM broker"), "{}", stderr(&xemem));

    // --json anywhere on the command line.
    for words in [["--json", "enclave", "ls"], ["enclave", "--json", "ls"], ["enclave", "ls", "--json"]] {
        let listing = daemon.clowder(&words, &here);
        let listing: Value = serde_json::from_str(&stdout(&listing)).unwrap_or_else(|e| panic!("{words:?}: {e}"));
        assert_eq!(listing["ok"], true);
        assert_eq!(listing["enclaves"], json!([]));
    }
    // An error is a JSON line too, with its kind, besides the sentence on stderr.
    let missing = daemon.clowder(&["enclave", "rm", "nope", "--json"], &here);
    assert_eq!(missing.status.code(), Some(1));
    let missing: Value = serde_json::from_str(&stdout(&missing)).unwrap();
    assert_eq!((&missing["ok"], &missing["kind"]), (&json!(false), &json!("not_found")), "{missing}");
    let version = daemon.clowder(&["version"], &here);
    assert!(version.status.success(), "{}", stderr(&version));
    let expected = format!("clowderd {} (API {})", env!("CARGO_PKG_VERSION"), clowder_api::API_VERSION);
    assert!(stdout(&version).contains(&expected), "{}", stdout(&version));
}

#[test]
fn only_root_or_the_clowder_group_may_create_enclaves() {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 || Command::new("setpriv").arg("--version").output().is_err() {
        eprintln!("skipped: needs root and setpriv to act as an unprivileged user");
        return;
    }
    let daemon = TestDaemon::start("permissions");
    let as_nobody = |args: &[&str]| {
        Command::new("setpriv")
            .args(["--reuid", "65534", "--regid", "65534", "--clear-groups", support::clowder()])
            .args(args)
            .env("CLOWDER_SOCKET", daemon.socket())
            .current_dir("/")
            .output()
            .unwrap()
    };
    let create = as_nobody(&["enclave", "create", "--name", "x", "--mem", "64M"]);
    assert_eq!(create.status.code(), Some(1));
    let message = stderr(&create);
    assert!(message.contains("permission denied") && message.contains("`clowder` group") && message.contains("uid 65534"), "{message}");
    let listing = as_nobody(&["enclave", "ls"]);
    assert!(listing.status.success(), "anyone may list: {}", stderr(&listing));
}

#[test]
fn malformed_api_requests_get_errors_and_the_connection_survives_all_but_an_oversized_one() {
    let daemon = TestDaemon::start("raw-api");
    let stream = UnixStream::connect(daemon.socket()).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    let mut ask = |line: &[u8]| -> Value {
        writer.write_all(line).unwrap();
        writer.write_all(b"\n").unwrap();
        let mut reply = String::new();
        reader.read_line(&mut reply).unwrap();
        serde_json::from_str(&reply).unwrap()
    };
    let error = |reply: Value| reply["error"].as_str().unwrap().to_string();
    assert!(error(ask(b"this is not json")).contains("malformed request"));
    assert!(error(ask(b"[]")).contains("JSON object"));
    assert!(error(ask(br#"{"op":"fly"}"#)).contains("unknown op"));
    assert!(error(ask(br#"{"op":"create","name":"../etc","mem":"1G"}"#)).contains("enclave name"));
    assert!(error(ask(br#"{"op":"create","name":"a","mem":"1G","cores":"x"}"#)).contains("`cores`"));
    assert!(error(ask(br#"{"op":"run","argv":["a"],"cwd":"/"}"#)).contains("file descriptors"));
    assert_eq!(ask(br#"{"op":"ls"}"#)["ok"], true);

    // A line over the cap is answered, and the connection closed: the daemon reads no more.
    let mut oversized = UnixStream::connect(daemon.socket()).unwrap();
    let _ = oversized.write_all(&vec![b'x'; 300 * 1024]);
    let mut said = String::new();
    let _ = BufReader::new(&oversized).read_line(&mut said);
    assert!(said.contains("longer than 262144 bytes; closing the connection"), "{said:?}");
}

#[test]
fn a_one_shot_run_streams_output_and_returns_the_status() {
    require_kvm!();
    let daemon = TestDaemon::start("one-shot");
    let hello = build_musl_program(&daemon.dir.0, "hello", HELLO);
    let output = daemon.clowder(&["run", "./hello", "world"], &daemon.dir.0);
    assert_eq!(stdout(&output), "hello world from ./hello\n", "stderr: {}", stderr(&output));
    assert_eq!(output.status.code(), Some(7), "the job's status is the CLI's");

    let json_run = daemon.clowder(&["--json", "run", hello.to_str().unwrap()], &daemon.dir.0);
    let lines: Vec<Value> = stdout(&json_run).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.first().unwrap()["event"], "started");
    let output: String = lines.iter().filter(|l| l["event"] == "output").filter_map(|l| l["text"].as_str()).collect();
    assert_eq!(output, format!("hello nobody from {}\n", hello.display()));
    assert!(lines.iter().any(|l| l["event"] == "log" && l["text"] == "job exited with status 7"));
    assert_eq!(lines.last().unwrap()["status"], 7);

    // A job that cannot start (a heap larger than the enclave) is told as such, not as a
    // kernel failure.
    let too_big = daemon.clowder(&["run", "--mem", "16M", "--heap", "64M", "./hello"], &daemon.dir.0);
    assert_eq!(too_big.status.code(), Some(1));
    let message = stderr(&too_big);
    assert!(message.contains("the job could not start: the enclave has no memory left for the job's heap"), "{message}");
    assert!(!message.contains("panic"), "{message}");

    // One-shot enclaves disappear with their job, and their cores with them.
    assert_eq!(daemon.call(json!({"op": "ls"}))["enclaves"], json!([]));
}

/// Waits until a one-shot enclave runs and returns its clowder-vmm pid.
fn one_shot_pid(daemon: &TestDaemon) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let list = daemon.call(json!({"op": "ls"}));
        if let Some(pid) = list["enclaves"].as_array().unwrap().iter().find_map(|e| e["pid"].as_u64()) {
            return pid as u32;
        }
        assert!(Instant::now() < deadline, "the one-shot enclave never showed up: {list}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_vmm_killed_from_outside_is_reported_and_the_daemon_keeps_serving() {
    require_kvm!();
    let daemon = TestDaemon::start("containment");
    build_musl_program(&daemon.dir.0, "spin", SPIN);
    build_musl_program(&daemon.dir.0, "hello", HELLO);
    let socket = daemon.socket();
    let work = daemon.dir.0.clone();
    let (spinning_tx, spinning) = std::sync::mpsc::channel();
    let spinner = std::thread::spawn(move || {
        let binary = File::open(work.join("spin")).unwrap();
        let dir = File::open(&work).unwrap();
        let request = json!({"op": "run", "argv": ["spin"], "cwd": work.to_str().unwrap()});
        let mut output = String::new();
        let reply = Client::connect_to(&socket)
            .unwrap()
            .call_streaming(&request, &[binary.as_raw_fd(), dir.as_raw_fd()], &mut |event| {
                if let (Some("output"), Some(text)) = (event["event"].as_str(), event["text"].as_str()) {
                    output.push_str(text);
                    if output.contains("spinning") {
                        let _ = spinning_tx.send(());
                    }
                }
            })
            .unwrap();
        (reply, output)
    });
    let pid = one_shot_pid(&daemon);
    spinning.recv_timeout(Duration::from_secs(30)).expect("the spinning job printed");

    // While one enclave spins, another job runs beside it (the host has at least two cores).
    if clowderd::cores::usable_cores().unwrap().len() >= 2 {
        let beside = daemon.clowder(&["run", "./hello", "beside"], &daemon.dir.0);
        assert_eq!(stdout(&beside), "hello beside from ./hello\n", "{}", stderr(&beside));
    }

    clowderd::sys::send_signal(pid, libc::SIGKILL).unwrap();
    let (reply, output) = spinner.join().unwrap();
    assert_eq!(reply["ok"], false);
    let error = reply["error"].as_str().unwrap();
    assert!(error.contains("clowder-vmm was killed by signal 9 (SIGKILL)") && error.contains(&pid.to_string()), "{error}");
    assert_eq!(output, "spinning\n");

    let list = daemon.call(json!({"op": "ls"}));
    assert_eq!(list["enclaves"], json!([]), "the dead enclave is gone: {list}");
    let removed = &list["removed"][0];
    assert!(removed["reason"].as_str().unwrap().contains("killed by signal 9"), "{list}");
    let name = removed["name"].as_str().unwrap();
    let logs = daemon.clowder(&["logs", name], &daemon.dir.0);
    assert!(stdout(&logs).contains("killed by signal 9"), "{}", stdout(&logs));

    let after = daemon.clowder(&["run", "./hello", "after"], &daemon.dir.0);
    assert_eq!(stdout(&after), "hello after from ./hello\n", "{}", stderr(&after));
    assert_eq!(after.status.code(), Some(7));
}

#[test]
fn a_kernel_without_the_channel_protocol_cannot_back_a_persistent_enclave_yet() {
    require_kvm!();
    let daemon = TestDaemon::start("persistent-lwk");
    let output = daemon.clowder(&["enclave", "create", "--name", "sim", "--cores", "1", "--mem", "64M"], &daemon.dir.0);
    if output.status.success() {
        // The LWK speaks the protocol now: the enclave must be listed and removable.
        let listing = daemon.clowder(&["enclave", "ls"], &daemon.dir.0);
        assert!(stdout(&listing).contains("sim"), "{}", stdout(&listing));
        assert!(daemon.clowder(&["enclave", "rm", "sim"], &daemon.dir.0).status.success());
        return;
    }
    let message = stderr(&output);
    assert!(message.contains("enclave sim did not start") && message.contains("clowder run without --enclave"), "{message}");
    let logs = daemon.clowder(&["logs", "sim"], &daemon.dir.0);
    assert!(stdout(&logs).contains("did not start"), "{}", stdout(&logs));
}

#[test]
fn the_host_end_attaches_to_a_running_vmm() {
    require_kvm!();
    let dir = TempDir::new("clowder-cli-vmm-channel");
    let spin = build_musl_program(&dir.0, "spin", SPIN);
    let core = *clowderd::cores::usable_cores().unwrap().iter().last().unwrap();
    let spec = MachineSpec { name: "probe".into(), cores: vec![core], memory: 64 << 20, hugepages: false, id_block: 0 };
    let mut command = vmm_command(&vmm_binary(), &kernel_image(), &spec);
    // One argument: the kernel's whole command line.
    let kernel_command_line = "-- spin";
    command.arg("--module").arg(&spin).arg("--cmdline").arg(kernel_command_line);
    let log = std::sync::Arc::new(LogBook::new(100));
    let mut machine = start_vmm(command, dir.0.join("probe.vmm.sock"), log.clone()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !log.lines().iter().any(|line| line == "console: spinning") {
        assert!(Instant::now() < deadline, "the job never ran: {:?}", log.lines());
        std::thread::sleep(Duration::from_millis(10));
    }

    let parts = machine.channel().unwrap();
    assert!(parts.channel_gpa + parts.channel_size <= 64 << 20, "the channel sits in low RAM");
    let (mut sender, mut receiver, ram) = link::attach(parts).unwrap();
    sender.send(&HostMessage::Ping { nonce: 1 }).unwrap();
    // The job spins and the kernel does not read its ring yet: nothing comes back, and
    // nothing breaks.
    assert!(matches!(receiver.receive(Duration::from_millis(50)).unwrap(), Received::Nothing));
    assert!(ram.check(0x100000, 4096).is_ok());
    assert!(ram.check(64 << 20, 1).is_err(), "beyond RAM");

    let shared = sys::memfd("probe-file").unwrap();
    shared.set_len(8192).unwrap();
    let region = machine.add_region(&shared, 8192).unwrap();
    assert!(region.gpa >= 64 << 20, "shared files go above RAM: {region:?}");
    machine.remove_region(region.slot).unwrap();

    assert_eq!(machine.ended(), None);
    let ended = machine.shut_down(Duration::from_secs(5));
    assert_eq!(ended, "clowder-vmm stopped on signal 15 (SIGTERM)");
}
