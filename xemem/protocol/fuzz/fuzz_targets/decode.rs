//! Arbitrary bytes into the message decoder and into a name server node: nothing may panic,
//! whatever decodes must re-encode to the same bytes, and the node keeps answering.
#![no_main]

use libfuzzer_sys::fuzz_target;
use xemem::node::{LocalMemory, Node, Timing};
use xemem::wire::{FrameRun, Message, RunAssembler};
use xemem::{AccessId, Error, NameServer, SegmentId};

struct NoMemory;
impl LocalMemory for NoMemory {
    fn resolve(&mut self, _: u64, _: u64, size: u64) -> Result<Vec<FrameRun>, Error> {
        Ok(vec![FrameRun { first: None, frames: size / 4096 }])
    }
    fn notify(&mut self, _: u64, _: SegmentId) {}
    fn revoke(&mut self, _: u64, _: AccessId) {}
}

fuzz_target!(|data: &[u8]| {
    if let Ok(message) = Message::decode(data) {
        assert_eq!(message.to_bytes().expect("a decoded message encodes"), data);
        if let xemem::wire::Body::Attached(part) = &message.body {
            let _ = RunAssembler::default().push(part.clone());
        }
    }
    let mut node = Node::new(2, Some(NameServer::new(0)), Timing::default());
    node.receive((data.first().copied().unwrap_or(0) & 1) as u32, data, &mut NoMemory);
    for (_, answer) in node.outbox() {
        answer.to_bytes().expect("answers encode");
    }
});
