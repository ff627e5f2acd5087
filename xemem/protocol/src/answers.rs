//! The answers given to requests, kept so that a retried request gets the same answers again
//! instead of being served twice; at most `KEPT`, the oldest dropped first. The name server's
//! node keeps its replies in one, clowderd's bridge the answers it serves for the broker.

use crate::ids::EnclaveId;
use alloc::collections::{BTreeMap, VecDeque};

/// Answers by (the requesting enclave, its request id).
pub struct AnswerCache<A, const KEPT: usize> {
    answers: BTreeMap<(EnclaveId, u64), A>,
    /// Keys oldest first, for dropping the oldest once `KEPT` are kept.
    order: VecDeque<(EnclaveId, u64)>,
}

impl<A, const KEPT: usize> Default for AnswerCache<A, KEPT> {
    fn default() -> Self {
        AnswerCache { answers: BTreeMap::new(), order: VecDeque::new() }
    }
}

impl<A, const KEPT: usize> AnswerCache<A, KEPT> {
    /// The answers kept for `origin`'s `request`.
    pub fn get(&self, origin: EnclaveId, request: u64) -> Option<&A> {
        self.answers.get(&(origin, request))
    }

    /// Keeps `answers` for `origin`'s `request`, dropping the oldest if `KEPT` are kept.
    pub fn insert(&mut self, origin: EnclaveId, request: u64, answers: A) {
        if self.order.len() >= KEPT {
            if let Some(old) = self.order.pop_front() {
                self.answers.remove(&old);
            }
        }
        self.order.push_back((origin, request));
        self.answers.insert((origin, request), answers);
    }

    /// Drops the answers kept for `origin`'s `request`.
    pub fn remove(&mut self, origin: EnclaveId, request: u64) {
        self.answers.remove(&(origin, request));
        self.order.retain(|kept| *kept != (origin, request));
    }

    /// Drops every answer kept for `enclave`'s requests.
    pub fn forget(&mut self, enclave: EnclaveId) {
        self.answers.retain(|(origin, _), _| *origin != enclave);
        self.order.retain(|(origin, _)| *origin != enclave);
    }

    /// How many answers are kept for `enclave`'s requests.
    pub fn count_for(&self, enclave: EnclaveId) -> usize {
        self.answers.keys().filter(|(origin, _)| *origin == enclave).count()
    }
}

#[cfg(test)]
mod tests {
    use super::AnswerCache;

    #[test]
    fn the_oldest_answer_goes_first_and_forget_drops_one_enclaves() {
        let mut cache = AnswerCache::<&str, 2>::default();
        cache.insert(5, 1, "a");
        cache.insert(6, 1, "b");
        cache.insert(5, 2, "c");
        assert_eq!((cache.get(5, 1), cache.get(6, 1), cache.get(5, 2)), (None, Some(&"b"), Some(&"c")));
        cache.remove(6, 1);
        cache.insert(6, 2, "d");
        assert_eq!((cache.count_for(5), cache.count_for(6)), (1, 1), "a removed answer frees its place");
        cache.forget(5);
        assert_eq!((cache.get(5, 2), cache.get(6, 2)), (None, Some(&"d")));
    }
}
