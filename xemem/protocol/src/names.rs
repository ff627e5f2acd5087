//! Segment names: one name space, whoever keeps the segments.
//!
//! A name belongs to the first segment made with it until that segment goes, wherever the
//! make came from. A name server keeps its names in a [`NameTable`]; alone it has a table of
//! its own ([`Names`]), and name servers that must share one name space (the host's broker and
//! the daemon's node, which keep separate segments) are given one table. A make claims its
//! name in the table before the segment exists, so the second make of a held name fails
//! (`NameTaken`) whichever name server it reaches, and a lookup through any of them finds only
//! the segment the name was first given to.

use crate::ids::SegmentId;
use crate::wire::Name;
use crate::Error;
use alloc::collections::BTreeMap;

/// Where a name server keeps segment names. Each call is one step: a table shared between
/// name servers must make [`NameTable::claim`] atomic (one lock around it), so two makes of
/// one name can never both succeed.
pub trait NameTable: Send {
    /// Gives `name` to `segment`, unless a segment holds it (`NameTaken`).
    fn claim(&mut self, name: &Name, segment: SegmentId) -> Result<(), Error>;
    /// Takes `name` back from `segment`; a name another segment holds stays with it.
    fn release(&mut self, name: &Name, segment: SegmentId);
    /// The segment holding `name`.
    fn lookup(&self, name: &Name) -> Option<SegmentId>;
}

/// A name table of its own: a map from name to the segment holding it.
#[derive(Default, Debug)]
pub struct Names(BTreeMap<Name, SegmentId>);

impl NameTable for Names {
    fn claim(&mut self, name: &Name, segment: SegmentId) -> Result<(), Error> {
        // Strict even for the same id: name servers sharing a table hand out ids apart, but
        // a name must never be held twice whatever they hand out.
        if self.0.contains_key(name) {
            return Err(Error::NameTaken);
        }
        self.0.insert(name.clone(), segment);
        Ok(())
    }

    fn release(&mut self, name: &Name, segment: SegmentId) {
        if self.0.get(name) == Some(&segment) {
            self.0.remove(name);
        }
    }

    fn lookup(&self, name: &Name) -> Option<SegmentId> {
        self.0.get(name).copied()
    }
}
