//! Arbitrary bytes down the daemon's request path, as a client's connection delivers them: the
//! line framing of `clowder_api::codec::LineSocket` over a real Unix socket with the daemon's
//! limits, then `Request::parse` on every line, as `clowderd::server::serve_client` does.
//! Nothing may panic or hang; the framing hands back exactly the newline-terminated lines that
//! were sent; every line becomes a request or one non-empty, one-line error sentence that goes
//! back to the client as one JSON line.
#![no_main]

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use clowder_api::codec::{Limits, LineSocket};
use clowder_api::daemon::{Request, MAX_REQUEST_FDS, MAX_REQUEST_LEN};
use libfuzzer_sys::fuzz_target;

/// What one write fills of a Unix socket's buffer without a reader (the default is ~208 KiB).
const MAX_INPUT: usize = 64 * 1024;

fuzz_target!(|data: &[u8]| {
    if data.len() > MAX_INPUT {
        return;
    }
    let (mut client, server) = UnixStream::pair().expect("a socket pair");
    client.write_all(data).expect("the input fits the socket buffer");
    drop(client);
    // The daemon's limits; its timeout never fires here, every byte is already there.
    let limits = Limits { max_line: MAX_REQUEST_LEN, max_fds: MAX_REQUEST_FDS, timeout: Some(Duration::from_secs(10)) };
    let mut socket = LineSocket::new(server, limits);
    // A last line without its newline is never a request (the client hung up mid-line).
    let mut expected = data.split(|&byte| byte == b'\n');
    expected.next_back();
    let mut lines = 0;
    while let Some((line, files)) = socket.receive().expect("lines shorter than the limit are read") {
        assert!(files.is_empty());
        assert!(line.len() <= MAX_REQUEST_LEN);
        assert_eq!(Some(&line[..]), expected.next(), "line {lines} differs from what was sent");
        lines += 1;
        if let Err(error) = Request::parse(&line) {
            assert!(!error.message.is_empty() && !error.message.contains('\n'), "not one sentence: {:?}", error.message);
            assert!(!error.reply().to_string().contains('\n'), "a reply is one JSON line");
        }
    }
    assert_eq!(expected.next(), None, "a line was lost");
});
