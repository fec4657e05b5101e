//! The account nonces of senders the pool let go of, for a while.
//!
//! A submission's state (nonce, balance) is read at the head before the writer inserts it. A
//! block applied in between can mine the sender's last pooled transaction: the pool forgets
//! the sender, and the stale state would then put the next transaction behind a nonce gap that
//! only the pool sees (queued, not relayed, `eth_getTransactionCount(…, "pending")` falling
//! back below a nonce already sent). The pool's last word on a departed sender's nonce is kept
//! here and wins over an older read; a reorg forgets it all (the chain may have forgotten the
//! nonces with it).

use alloy_primitives::map::AddressMap;
use alloy_primitives::Address;

/// Senders remembered per generation: with two generations, between this many and twice this
/// many of the latest departures (about 40 bytes each, under 3 MiB at the most).
const GENERATION: usize = 32_768;

/// The latest departed senders' nonces, in two generations: when the newer one is full, the
/// older one is dropped and the newer takes its place (no per-entry order to keep).
#[derive(Debug, Default)]
pub(super) struct Departed {
    newer: AddressMap<u64>,
    older: AddressMap<u64>,
}

impl Departed {
    /// `sender` left the pool with `nonce` as its account nonce.
    pub(super) fn record(&mut self, sender: Address, nonce: u64) {
        if self.newer.len() >= GENERATION {
            self.older = std::mem::take(&mut self.newer);
        }
        self.newer.insert(sender, nonce);
    }

    /// The nonce `sender` last left with, if remembered.
    pub(super) fn get(&self, sender: &Address) -> Option<u64> {
        self.newer.get(sender).or_else(|| self.older.get(sender)).copied()
    }

    /// Forgets every departed nonce (after a reorg).
    pub(super) fn clear(&mut self) {
        self.newer.clear();
        self.older.clear();
    }

    /// How many senders are remembered.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.newer.len() + self.older.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_departures_are_kept_within_two_generations() {
        let mut departed = Departed::default();
        let address = |i: usize| Address::left_padding_from(&(i as u64).to_be_bytes());
        for i in 0..3 * GENERATION {
            departed.record(address(i), i as u64);
        }
        assert!(departed.len() <= 2 * GENERATION);
        assert_eq!(departed.get(&address(3 * GENERATION - 1)), Some(3 * GENERATION as u64 - 1));
        assert_eq!(departed.get(&address(GENERATION)), Some(GENERATION as u64), "the older generation");
        assert_eq!(departed.get(&address(0)), None, "dropped with its generation");
        departed.record(address(GENERATION), 7);
        assert_eq!(departed.get(&address(GENERATION)), Some(7), "the latest departure wins");
        departed.clear();
        assert_eq!(departed.get(&address(GENERATION)), None);
    }
}
