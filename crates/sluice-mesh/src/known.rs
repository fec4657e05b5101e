//! Which peers already have which transaction (they sent it to us), so it is not sent back to
//! them: devp2p keeps a known-transactions set per peer for the same reason. Bounded: the
//! oldest transactions are forgotten first, and forgetting only costs a redundant send, which
//! the peer's pool answers as a duplicate.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

/// Transaction → the peers known to have it, for at most `capacity` transactions.
#[derive(Debug)]
pub struct Known<H, P> {
    peers_of: HashMap<H, Vec<P>>,
    order: VecDeque<H>,
    capacity: usize,
}

impl<H: Clone + Eq + Hash, P: Clone + Eq> Known<H, P> {
    /// Remembers at most `capacity` transactions.
    pub fn new(capacity: usize) -> Self {
        Known { peers_of: HashMap::new(), order: VecDeque::new(), capacity: capacity.max(1) }
    }

    /// `peer` has `hash`.
    pub fn insert(&mut self, hash: H, peer: P) {
        if let Some(peers) = self.peers_of.get_mut(&hash) {
            if !peers.contains(&peer) {
                peers.push(peer);
            }
            return;
        }
        if self.order.len() >= self.capacity {
            if let Some(oldest) = self.order.pop_front() {
                self.peers_of.remove(&oldest);
            }
        }
        self.order.push_back(hash.clone());
        self.peers_of.insert(hash, vec![peer]);
    }

    /// Whether `peer` is known to have `hash`.
    pub fn has(&self, hash: &H, peer: &P) -> bool {
        self.peers_of.get(hash).is_some_and(|peers| peers.contains(peer))
    }

    /// Transactions remembered.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether none are.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_every_sender_of_a_transaction() {
        let mut k = Known::new(10);
        k.insert(1, 'a');
        k.insert(1, 'b');
        k.insert(1, 'a');
        assert!(k.has(&1, &'a') && k.has(&1, &'b') && !k.has(&1, &'c') && !k.has(&2, &'a'));
        assert_eq!(k.len(), 1);
    }

    #[test]
    fn forgets_the_oldest_beyond_its_capacity() {
        let mut k = Known::new(2);
        k.insert(1, 'a');
        k.insert(2, 'a');
        k.insert(3, 'a');
        assert!(!k.has(&1, &'a') && k.has(&2, &'a') && k.has(&3, &'a'));
        assert_eq!(k.len(), 2);
    }
}
