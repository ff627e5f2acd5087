//! One name table for the name servers of one daemon: the broker's (host processes' segments)
//! and the daemon node's (enclaves' and sub-managers' segments). See [`xemem::names`].

use std::sync::{Arc, Mutex};

use xemem::names::{NameTable, Names};
use xemem::wire::Name;
use xemem::{Error, SegmentId};

/// A name table several name servers share: each step under one lock, so two makes of one
/// name, at the broker and at the node at once, cannot both succeed. Clones are the same table.
#[derive(Clone, Default)]
pub struct SharedNames(Arc<Mutex<Names>>);

impl SharedNames {
    fn table(&self) -> std::sync::MutexGuard<'_, Names> {
        // Each step leaves the map whole: a panic elsewhere while it was held changes nothing.
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl NameTable for SharedNames {
    fn claim(&mut self, name: &Name, segment: SegmentId) -> Result<(), Error> {
        self.table().claim(name, segment)
    }
    fn release(&mut self, name: &Name, segment: SegmentId) {
        self.table().release(name, segment)
    }
    fn lookup(&self, name: &Name) -> Option<SegmentId> {
        self.table().lookup(name)
    }
}
