//! Feeds arbitrary bytes to both decoders and, cut into frames, to the reassembler: nothing may
//! panic, and whatever decodes must re-encode to the same bytes.
#![no_main]

use enclave_proto::{EnclaveMessage, HostMessage, Reassembler, MAX_MESSAGE_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut out = vec![0u8; MAX_MESSAGE_LEN];
    if let Ok(message) = HostMessage::decode(data) {
        let length = message.encode(&mut out).expect("a decoded message encodes");
        assert_eq!(&out[..length], data);
    }
    if let Ok(message) = EnclaveMessage::decode(data) {
        let length = message.encode(&mut out).expect("a decoded message encodes");
        assert_eq!(&out[..length], data);
    }
    // The first byte chooses the frame size; the rest is a stream of frames.
    if let Some((&frame_len, frames)) = data.split_first() {
        let mut storage = vec![0u8; 1024];
        let mut reassembler = Reassembler::new(&mut storage);
        for frame in frames.chunks(frame_len.max(1) as usize) {
            if let Ok(Some(message)) = reassembler.push(frame) {
                let _ = EnclaveMessage::decode(message);
            }
        }
    }
});
