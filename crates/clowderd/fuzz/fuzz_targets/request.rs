//! Arbitrary bytes down the daemon's request path, as a client's connection delivers them: the
//! line framing of `jsonl::LineSocket` over a real Unix socket, then `api::parse_request` on
//! every line, as `server::serve_client` does. Nothing may panic or hang; the framing hands back
//! exactly the newline-terminated lines that were sent; every line becomes a request or an
//! error that goes back to the client as one JSON line. (Not checked: that the error text itself
//! is one line. A key with an escaped newline, `{"op":"ls","a\nb":1}`, is echoed verbatim.)
#![no_main]

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use clowderd::api::{error_reply, parse_request, MAX_REQUEST_LEN};
use clowderd::jsonl::LineSocket;
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
    // The daemon's socket has a request timeout; here every byte is already there.
    let mut socket = LineSocket::for_requests(server, Duration::from_secs(10));
    // A last line without its newline is never a request (the client hung up mid-line).
    let mut expected = data.split(|&byte| byte == b'\n');
    expected.next_back();
    let mut lines = 0;
    while let Some((line, files)) = socket.receive().expect("lines shorter than the limit are read") {
        assert!(files.is_empty());
        assert!(line.len() <= MAX_REQUEST_LEN);
        assert_eq!(Some(&line[..]), expected.next(), "line {lines} differs from what was sent");
        lines += 1;
        if let Err(message) = parse_request(&line) {
            assert!(!message.is_empty());
            let reply = error_reply(message).to_string();
            assert!(!reply.contains('\n'), "a reply is one JSON line");
        }
    }
    assert_eq!(expected.next(), None, "a line was lost");
});
