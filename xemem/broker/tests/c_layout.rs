//! libxpmem's C view of the broker protocol (`xemem/src/xpmem_internal.h`) is written by hand
//! beside the Rust one (`src/wire.rs`). This test compiles `xemem/tests/wire_layout.c`, which
//! prints the C constants, sizes and two packets its structs make, and fails on any drift:
//! a constant with another value, a field at another offset, a packet the Rust side reads
//! differently.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use xemem_host::wire::{self, Answer, Request, Run};

/// The C program's output: NAME VALUE lines, and the hex packets by label.
struct CView {
    values: HashMap<String, u64>,
    packets: HashMap<String, Vec<u8>>,
}

/// Built and run once for all the tests: they run in parallel threads, and a test running the
/// binary while another rewrote it failed with ETXTBSY.
fn c_view() -> &'static CView {
    static VIEW: OnceLock<CView> = OnceLock::new();
    VIEW.get_or_init(compile_and_run_wire_layout)
}

fn compile_and_run_wire_layout() -> CView {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let xemem = repo.join("xemem");
    let binary = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("wire_layout");
    let compiled = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-std=gnu11", "-Wall", "-Werror", "-pthread", "-o"])
        .arg(&binary)
        .arg("-I")
        .arg(xemem.join("include"))
        .arg("-I")
        .arg(xemem.join("src"))
        .arg(xemem.join("tests/wire_layout.c"))
        .status()
        .expect("run the C compiler (cc)");
    assert!(compiled.success(), "xemem/tests/wire_layout.c does not compile");
    let output = Command::new(&binary).output().expect("run wire_layout");
    assert!(output.status.success(), "wire_layout failed");
    let mut view = CView { values: HashMap::new(), packets: HashMap::new() };
    for line in String::from_utf8(output.stdout).expect("wire_layout prints text").lines() {
        let (name, value) = line.rsplit_once(' ').expect("NAME VALUE");
        match name {
            "request" | "answer" => {
                let bytes = (0..value.len()).step_by(2).map(|i| u8::from_str_radix(&value[i..i + 2], 16).expect("hex")).collect();
                view.packets.insert(name.to_string(), bytes);
            }
            _ => {
                view.values.insert(name.to_string(), value.parse().expect("a number"));
            }
        }
    }
    view
}

/// `("OP_X", wire::OP_X)` for each operation named: C names its operations as the wire module
/// does.
macro_rules! operations {
    ($($op:ident),*) => {
        [$((stringify!($op), u64::from(wire::$op))),*]
    };
}

#[test]
fn constants_match() {
    let c = c_view();
    let operations = operations!(
        OP_HELLO, OP_SERVE, OP_MAKE, OP_REMOVE, OP_GET, OP_RELEASE, OP_ATTACH, OP_DETACH, OP_LOOKUP, OP_SIGNAL, OP_FETCH, OP_NOTIFY,
        OP_REVOKE
    );
    let constants = [
        ("WIRE_MAGIC", wire::MAGIC.into()),
        ("WIRE_VERSION", wire::VERSION.into()),
        ("WIRE_HOLE", wire::HOLE.into()),
        ("WIRE_REVOCABLE", wire::RUN_REVOCABLE.into()),
        ("WIRE_MAX_RUNS", wire::MAX_RUNS as u64),
        ("WIRE_MAX_FDS", clowder_sys::MAX_FDS as u64),
        ("WIRE_GET_REVOKED_BY_MESSAGE", wire::GET_REVOKED_BY_MESSAGE),
        ("WIRE_REASON_WHOLE_PAGES_ONLY", xemem::Error::WholePagesOnly.code().into()),
        ("XEMEM_NAME_MAX", xemem::wire::MAX_NAME_LEN as u64),
        ("offsetof(struct wire_request, name)", wire::HEADER_LEN as u64),
        ("sizeof(struct wire_answer)", wire::HEADER_LEN as u64),
        ("sizeof(struct wire_run)", wire::RUN_LEN as u64),
    ];
    let expected: Vec<(&str, u64)> = constants.into_iter().chain(operations).collect();
    for (name, value) in &expected {
        assert_eq!(c.values.get(*name), Some(value), "C's {name} differs from the Rust definition");
    }
    assert_eq!(c.values.len(), expected.len(), "wire_layout.c prints a value this test does not check");
}

#[test]
fn request_layout_matches() {
    let c = c_view();
    let args: Vec<u64> = (1..=7).map(|i| 0x1111_1111_1111_1111 * i).collect();
    let rust = Request::new(wire::OP_ATTACH, &args);
    assert_eq!(c.packets["request"], rust.encode(), "C and Rust lay out a request differently");
    assert_eq!(Request::decode(&c.packets["request"]), Ok(rust));
}

#[test]
fn answer_layout_matches() {
    let c = c_view();
    let answer = Answer::decode(&c.packets["answer"], 1).expect("the C answer decodes");
    let runs = vec![
        Run { fd_index: 0, flags: wire::RUN_REVOCABLE, offset: 0x3000, length: 0x2000 },
        Run { fd_index: wire::HOLE, flags: 0, offset: 0, length: 0x1000 },
    ];
    let expected = Answer { runs, ..Answer::ok(wire::OP_FETCH, &[11, 12, 13, 14, 15, 16]) };
    assert_eq!(answer, expected);
    assert_eq!(c.packets["answer"], expected.encode(), "C and Rust lay out an answer differently");
}
