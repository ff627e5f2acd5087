//! Arbitrary bytes into the host broker's packet decoders (a library's request, an owner's
//! FETCH answer with 0..=3 descriptors): nothing may panic, and whatever decodes re-encodes
//! to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use xemem_host::wire::{Answer, Request};

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = Request::decode(data) {
        assert_eq!(request.encode(), data);
    }
    let fds = data.first().map(|b| (b & 3) as usize).unwrap_or(0);
    if let Ok(answer) = Answer::decode(data, fds) {
        assert_eq!(answer.encode(), data);
        assert!(answer.runs.iter().all(|r| r.fd_index == xemem_host::wire::HOLE || (r.fd_index as usize) < fds));
    }
});
