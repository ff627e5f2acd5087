//! The broker against a scripted owner: every malformed or dishonest FETCH answer fails the
//! attach (never reaches the attacher) and the broker keeps serving; an honest answer reaches
//! the attacher with its descriptor; converted memfds are truncated when their owner goes,
//! the application's own are not.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use clowder_sys as sys;
use xemem_host::wire::{self, Answer, Request, Run};
use xemem_host::Broker;

fn memfd(len: u64) -> OwnedFd {
    let file = sys::memfd("test").unwrap();
    file.set_len(len).unwrap();
    file.into()
}

fn borrow(fds: &[OwnedFd]) -> Vec<BorrowedFd<'_>> {
    fds.iter().map(|fd| fd.as_fd()).collect()
}

fn call(connection: &OwnedFd, request: &Request) -> (Answer, Vec<OwnedFd>) {
    sys::send(connection, &request.encode(), &[]).unwrap();
    let mut buffer = vec![0u8; wire::MAX_PACKET];
    let (length, fds) = sys::receive(connection, &mut buffer).unwrap();
    (Answer::decode(&buffer[..length], fds.len()).unwrap(), fds)
}

/// What the scripted owner answers to the next FETCH.
enum Script {
    Answer(Answer, Vec<OwnedFd>),
    Silence,
    /// Answers after the broker has given up on the request.
    Late(Answer, Vec<OwnedFd>),
}

struct Harness {
    socket: PathBuf,
    owner: OwnedFd,
    attacher: OwnedFd,
    script: mpsc::Sender<Script>,
    apid: u64,
}

fn harness(name: &str) -> Harness {
    let socket = std::env::temp_dir().join(format!("xemem-broker-test-{name}-{}.sock", std::process::id()));
    let broker = Broker::new().with_owner_timeout(Duration::from_millis(1000));
    let path = socket.clone();
    std::thread::spawn(move || broker.listen_and_serve(&path));
    for _ in 0..200 {
        if socket.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let owner = sys::connect(&socket).unwrap();
    let serving = sys::connect(&socket).unwrap();
    let (answer, _) = call(&serving, &Request::new(wire::OP_SERVE, &[]));
    assert_eq!(answer.errno, 0);
    let (script, scripts) = mpsc::channel::<Script>();
    std::thread::spawn(move || {
        let mut buffer = vec![0u8; 256];
        while let Ok((length, _)) = sys::receive(&serving, &mut buffer) {
            if length == 0 {
                break;
            }
            let request = Request::decode(&buffer[..length]).unwrap();
            assert_eq!(request.op, wire::OP_FETCH);
            let echo = |mut answer: Answer| {
                answer.results[wire::SEQUENCE_RESULT] = request.args[wire::SEQUENCE_ARG];
                answer.encode()
            };
            match scripts.recv() {
                Ok(Script::Answer(answer, fds)) => sys::send(&serving, &echo(answer), &borrow(&fds)).unwrap(),
                Ok(Script::Silence) => {}
                Ok(Script::Late(answer, fds)) => {
                    std::thread::sleep(Duration::from_millis(1500));
                    sys::send(&serving, &echo(answer), &borrow(&fds)).unwrap();
                }
                Err(_) => break,
            }
        }
    });
    let (made, _) = call(&owner, &Request::new(wire::OP_MAKE, &[0x10000, 4 * 4096, 0o600]));
    assert_eq!(made.errno, 0);
    let attacher = sys::connect(&socket).unwrap();
    let (granted, _) = call(&attacher, &Request::new(wire::OP_GET, &[made.results[0], 2]));
    assert_eq!(granted.errno, 0);
    Harness { socket, owner, attacher, script, apid: granted.results[0] }
}

fn fetch_answer(runs: Vec<Run>) -> Answer {
    let mut answer = Answer::ok(wire::OP_FETCH, &[]);
    answer.runs = runs;
    answer
}

fn run(fd_index: u32, flags: u32, offset: u64, length: u64) -> Run {
    Run { fd_index, flags, offset, length }
}

#[test]
fn dishonest_owner_answers_fail_the_attach_and_the_broker_survives() {
    let h = harness("dishonest");
    let good = memfd(4 * 4096);
    let other_socket = sys::connect(&h.socket).unwrap();
    let attach = Request::new(wire::OP_ATTACH, &[h.apid, 0, 4 * 4096]);
    let bad_answers: Vec<(&str, Script)> = vec![
        ("runs short of the size", Script::Answer(fetch_answer(vec![run(0, 0, 0, 3 * 4096)]), vec![good.try_clone().unwrap()])),
        ("runs beyond the size", Script::Answer(fetch_answer(vec![run(0, 0, 0, 5 * 4096)]), vec![good.try_clone().unwrap()])),
        ("run beyond its file", Script::Answer(fetch_answer(vec![run(0, 0, 4096, 4 * 4096)]), vec![good.try_clone().unwrap()])),
        ("descriptor index beyond those sent", Script::Answer(fetch_answer(vec![run(1, 0, 0, 4 * 4096)]), vec![good.try_clone().unwrap()])),
        ("a socket instead of a file", Script::Answer(fetch_answer(vec![run(0, 0, 0, 4 * 4096)]), vec![other_socket.try_clone().unwrap()])),
        (
            "an unaligned run",
            Script::Answer(fetch_answer(vec![run(0, 0, 0, 100), run(wire::HOLE, 0, 0, 4 * 4096 - 100)]), vec![good.try_clone().unwrap()]),
        ),
        ("an answer to another op", Script::Answer(Answer::ok(wire::OP_NOTIFY, &[]), vec![])),
        ("no answer at all", Script::Silence),
    ];
    for (what, script) in bad_answers {
        h.script.send(script).unwrap();
        let (answer, fds) = call(&h.attacher, &attach);
        assert_ne!(answer.errno, 0, "{what}: the attach must fail");
        assert!(answer.runs.is_empty() && fds.is_empty(), "{what}: nothing reaches the attacher");
    }
    // A late answer (a plausible one, for another memfd) must not answer the next attach.
    let decoy = memfd(4 * 4096);
    h.script.send(Script::Late(fetch_answer(vec![run(0, 0, 0, 4 * 4096)]), vec![decoy.try_clone().unwrap()])).unwrap();
    let (answer, _) = call(&h.attacher, &attach);
    assert_ne!(answer.errno, 0, "timed out");
    std::thread::sleep(Duration::from_millis(800)); // the late answer is now waiting in the socket
                                                    // An honest answer after all that: one memfd run and a hole.
    h.script
        .send(Script::Answer(
            fetch_answer(vec![run(0, wire::RUN_REVOCABLE, 0, 3 * 4096), run(wire::HOLE, 0, 0, 4096)]),
            vec![good.try_clone().unwrap()],
        ))
        .unwrap();
    let (answer, fds) = call(&h.attacher, &attach);
    assert_eq!(answer.errno, 0);
    assert_eq!(answer.runs.len(), 2);
    assert_eq!(fds.len(), 1);
    let a = sys::file_info(&fds[0]).unwrap();
    let b = sys::file_info(&good).unwrap();
    assert_eq!((a.device, a.inode), (b.device, b.inode), "the attacher got the owner's memfd");
    drop(h.owner);
}

#[test]
fn converted_memfds_are_truncated_when_the_owner_goes_and_application_memfds_are_not() {
    let h = harness("revoke");
    let converted = memfd(2 * 4096);
    let application = memfd(2 * 4096);
    h.script
        .send(Script::Answer(
            fetch_answer(vec![run(0, wire::RUN_REVOCABLE, 0, 2 * 4096), run(1, 0, 0, 2 * 4096)]),
            vec![converted.try_clone().unwrap(), application.try_clone().unwrap()],
        ))
        .unwrap();
    let (answer, _) = call(&h.attacher, &Request::new(wire::OP_ATTACH, &[h.apid, 0, 4 * 4096]));
    assert_eq!(answer.errno, 0);
    // The "owner" is this test process: all its connections closing means it is gone.
    drop(h.owner);
    drop(h.attacher);
    drop(h.script); // the scripted owner stops, closing the serving connection
    let mut truncated = false;
    for _ in 0..200 {
        if sys::file_info(&converted).unwrap().size == 0 {
            truncated = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(truncated, "a converted memfd is revoked when its owner is gone");
    assert_eq!(sys::file_info(&application).unwrap().size, 2 * 4096, "the application's memfd is left alone");
}
