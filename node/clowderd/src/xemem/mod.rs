//! XEMEM between the host and its enclaves: the daemon runs the name server's
//! `xemem::node::Node` (enclave 1) with one link per persistent enclave, carried on the
//! enclave channel as `enclave_proto` `Xemem` messages (an encoded `xemem::wire::Message`
//! each way, docs/xemem.md).
//!
//! Each enclave's pump thread owns an [`XememPort`]: it hands what the enclave sent to
//! [`XememPort::from_enclave`], sends what [`XememPort::to_enclave`] returns, and calls
//! [`XememPort::tick`] on every round. Dropping the port (the enclave failed or was removed)
//! takes the link down, and the name server forgets that enclave's segments and permits.
//!
//! Validation is the `xemem` crate's: a message that does not decode is answered with
//! `Failed` (EPROTO) by the node, never acted on.
//!
//! Enclave memory for host processes ([`XememLinks::attach_enclave_segment`]): the owner
//! enclave answers an attach with guest-physical frame runs; every run is checked against
//! that enclave's RAM (outside its channel) and becomes a range of the enclave's RAM memfd,
//! which a host process can map: no copy.
//!
//! Host memory for enclaves ([`XememPort`]'s bridge): host processes' segments live in the
//! broker's name server (`xemem-host`), not this node's (their names are one table with the
//! node's: [`XememLinks::set_broker`]), so an enclave's get, attach, detach and release about
//! them are served here from the broker; an attach adds the owner's
//! memfd runs to the enclave as guest-physical regions (its VMM's `add_region`) and answers
//! with their frames. When the owner removes the segment or exits, the broker asks
//! ([`xemem_host::Enclaves::revoke`]) before the memory goes: the daemon sends the holder's
//! enclave a `Revoke`, the enclave unmaps the attachment and answers `Revoked`, and only then
//! (or when the enclave is gone, or after [`REVOKE_TIMEOUT`]) are the regions removed and
//! the broker may let the owner's memory be truncated.
//!
//! The files, one concern each: `links` (the node, its shared state and the host-side API),
//! `owner_runs` (owners' answers kept, and enclave memory named as RAM memfd ranges),
//! `host` (the broker's requests about enclaves' segments), `bridge` (enclaves' requests
//! about memory behind other links), `revocation`, `port` (a link's end, run by its
//! pump), `peer` (links between daemons) and `service` (the broker inside the daemon).

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use xemem::answers::AnswerCache;
use xemem::ids::{AccessId, EnclaveId, SegmentId, NAME_SERVER_ENCLAVE};
use xemem::node::{Completion, LinkId, LocalMemory, Node, Reply, Request, Timing};
use xemem::wire::{Body, FrameRun, MappingWord, Message, Name};
use xemem::{Credentials, Error, NameServer, Principal};

use crate::guest_ram::GuestRam;
use crate::machine::{RegionAccess, SharedRegion};
use peer::FrameSource;

mod bridge;
mod host;
mod links;
mod owner_runs;
pub mod peer;
mod port;
mod revocation;
pub mod service;
#[cfg(test)]
mod tests;
pub mod vm;

use bridge::*;
use links::*;
use owner_runs::*;
use port::*;
use revocation::*;

pub use links::{FileRun, XememLinks};
pub use owner_runs::file_runs;
pub use port::{EnclaveUser, GuestRegions, XememPort};
pub use revocation::REVOKE_TIMEOUT;
