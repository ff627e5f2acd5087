//! A map kept as a sorted vector, for the node's small per-enclave tables (pending requests,
//! permits granted, segments owned). A leaf enclave holds a handful of entries, and a tree
//! map allocates and frees a node as it fills and empties: work an enclave kernel pays for
//! by the instruction (it is emulated on some hosts). Lookups are binary searches; inserting
//! and removing shift the entries after the place, which is cheap for the sizes a node has.

use alloc::vec::Vec;

#[derive(Clone, Debug)]
pub struct VecMap<K, V> {
    entries: Vec<(K, V)>,
}

impl<K, V> Default for VecMap<K, V> {
    fn default() -> Self {
        VecMap { entries: Vec::new() }
    }
}

impl<K: Ord, V> VecMap<K, V> {
    fn find(&self, key: &K) -> Result<usize, usize> {
        self.entries.binary_search_by(|(k, _)| k.cmp(key))
    }

    pub fn get(&self, key: &K) -> Option<&V> {
        self.find(key).ok().map(|index| &self.entries[index].1)
    }

    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.find(key).ok().map(|index| &mut self.entries[index].1)
    }

    /// Sets `key`'s value; returns the one it replaced.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self.find(&key) {
            Ok(index) => Some(core::mem::replace(&mut self.entries[index].1, value)),
            Err(index) => {
                self.entries.insert(index, (key, value));
                None
            }
        }
    }

    pub fn remove(&mut self, key: &K) -> Option<V> {
        self.find(key).ok().map(|index| self.entries.remove(index).1)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The entries in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Empties the map, returning its entries in key order.
    pub fn take(&mut self) -> Vec<(K, V)> {
        core::mem::take(&mut self.entries)
    }
}

#[cfg(test)]
mod tests {
    use super::VecMap;
    use alloc::collections::BTreeMap;

    /// Random inserts, removes and lookups on a VecMap and a BTreeMap give the same answers
    /// and leave the same contents.
    #[test]
    fn behaves_as_a_tree_map() {
        let mut rng = fastrand::Rng::with_seed(0x2545_f491_4f6c_dd1d);
        let mut next = move || rng.u64(..);
        let mut ours = VecMap::default();
        let mut tree = BTreeMap::new();
        for _ in 0..20_000 {
            let key = next() % 64;
            match next() % 4 {
                0 | 1 => {
                    let value = next();
                    assert_eq!(ours.insert(key, value), tree.insert(key, value));
                }
                2 => assert_eq!(ours.remove(&key), tree.remove(&key)),
                _ => assert_eq!(ours.get_mut(&key).map(|v| *v), tree.get(&key).copied()),
            }
            assert_eq!(ours.len(), tree.len());
        }
        assert!(ours.iter().map(|(k, v)| (*k, *v)).eq(tree.iter().map(|(k, v)| (*k, *v))));
        assert_eq!(ours.take().len(), tree.len());
        assert_eq!(ours.len(), 0);
    }
}
