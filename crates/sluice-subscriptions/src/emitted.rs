//! What the subscriptions have been told of the chain, and what to tell them next.
//!
//! Pure: [`Emitted`] remembers the blocks sent to `newHeads` (height, hash and whatever the hub
//! keeps with each, its logs), and [`Emitted::plan`] compares them with the head tracker's
//! canonical chain. The plan removes the blocks that left the chain (their logs go out again
//! with `removed: true`) and adds the new ones in height order, from the fork point up, as geth
//! does on a reorg. A block is recorded only once it has been sent, so a failed fetch is planned
//! again: no gap and no duplicate.

use std::collections::BTreeMap;

/// The canonical chain as the head tracker sees it.
pub trait Canonical {
    /// The head.
    fn head(&self) -> Option<(u64, &str)>;
    /// The hash at a recent height, when the window holds it.
    fn hash_at(&self, number: u64) -> Option<&str>;
    /// The lowest height the window holds.
    fn lowest(&self) -> Option<u64>;
}

impl Canonical for sluice_chain::ChainView {
    fn head(&self) -> Option<(u64, &str)> {
        self.latest()
    }
    fn hash_at(&self, number: u64) -> Option<&str> {
        self.hash_of(number)
    }
    fn lowest(&self) -> Option<u64> {
        self.oldest().map(|(n, _)| n)
    }
}

/// The next step for the subscriptions.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Heights sent before that are no longer canonical, lowest first.
    pub removed: Vec<u64>,
    /// New canonical blocks to send, lowest first.
    pub added: Vec<(u64, String)>,
}

impl Plan {
    /// Nothing to do.
    pub fn is_empty(&self) -> bool {
        self.removed.is_empty() && self.added.is_empty()
    }
}

/// The blocks sent, newest last, within a window.
#[derive(Debug)]
pub struct Emitted<T> {
    blocks: BTreeMap<u64, (String, T)>,
    window: usize,
    /// Most blocks one plan adds; the rest follow in the next.
    max_step: usize,
}

impl<T> Emitted<T> {
    /// Remembers the last `window` blocks sent; a plan adds at most `max_step`.
    pub fn new(window: usize, max_step: usize) -> Self {
        Self { blocks: BTreeMap::new(), window: window.max(1), max_step: max_step.max(1) }
    }

    /// The newest block sent.
    pub fn head(&self) -> Option<(u64, &str)> {
        self.blocks.last_key_value().map(|(n, (h, _))| (*n, h.as_str()))
    }

    /// What to remove and add so that the sent chain becomes `chain`'s.
    pub fn plan(&self, chain: &impl Canonical) -> Plan {
        let Some((head, head_hash)) = chain.head() else { return Plan::default() };
        let Some((&top, _)) = self.blocks.last_key_value() else {
            // Nothing sent yet: subscribers start at the head, not at history.
            return Plan { removed: Vec::new(), added: vec![(head, head_hash.to_owned())] };
        };
        // The highest sent block still on the chain.
        let fork = self.blocks.range(..=top.min(head)).rev().find(|(n, (h, _))| chain.hash_at(**n) == Some(h.as_str()));
        let (removed, from) = match fork {
            Some((&n, _)) => (self.blocks.range(n + 1..).map(|(n, _)| *n).collect(), n + 1),
            None => {
                let lowest = chain.lowest().unwrap_or(head);
                if lowest > top {
                    // The chain moved on past the window since the last block sent (a long
                    // outage): nothing sent is contradicted; continue from what is known.
                    (Vec::new(), lowest)
                } else {
                    // Every block sent that the chain's window covers was replaced: a reorg
                    // deeper than what was sent. The new branch starts where they did.
                    let removed: Vec<u64> = self.blocks.range(lowest..).map(|(n, _)| *n).collect();
                    let from = removed.first().copied().unwrap_or(lowest);
                    (removed, from)
                }
            }
        };
        let mut added = Vec::new();
        for n in from..=head {
            if added.len() >= self.max_step {
                break;
            }
            match chain.hash_at(n) {
                Some(hash) => added.push((n, hash.to_owned())),
                None => break, // a hole in the tracker's window: wait for it to fill
            }
        }
        Plan { removed, added }
    }

    /// Forgets a block that left the chain, handing back what was kept with it.
    pub fn remove(&mut self, number: u64) -> Option<T> {
        self.blocks.remove(&number).map(|(_, kept)| kept)
    }

    /// Records a block as sent (replacing any other block at its height).
    pub fn record(&mut self, number: u64, hash: String, kept: T) {
        self.blocks.insert(number, (hash, kept));
        while self.blocks.len() > self.window {
            self.blocks.pop_first();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Chain(BTreeMap<u64, String>);
    impl Canonical for Chain {
        fn head(&self) -> Option<(u64, &str)> {
            self.0.last_key_value().map(|(n, h)| (*n, h.as_str()))
        }
        fn hash_at(&self, number: u64) -> Option<&str> {
            self.0.get(&number).map(String::as_str)
        }
        fn lowest(&self) -> Option<u64> {
            self.0.keys().next().copied()
        }
    }

    fn chain(range: std::ops::RangeInclusive<u64>, branch: &str) -> Chain {
        Chain(range.map(|n| (n, format!("{branch}{n}"))).collect())
    }

    /// Applies plans until there is nothing left, as the hub does; returns what was sent.
    fn follow(sent: &mut Emitted<()>, chain: &Chain) -> (Vec<u64>, Vec<(u64, String)>) {
        let (mut removed, mut added) = (Vec::new(), Vec::new());
        loop {
            let plan = sent.plan(chain);
            if plan.is_empty() {
                return (removed, added);
            }
            for n in &plan.removed {
                sent.remove(*n);
            }
            for (n, h) in &plan.added {
                sent.record(*n, h.clone(), ());
            }
            removed.extend(plan.removed);
            added.extend(plan.added);
        }
    }

    #[test]
    fn starts_at_the_head_then_sends_every_height_once_in_order() {
        let mut sent = Emitted::new(64, 8);
        assert_eq!(follow(&mut sent, &chain(1..=10, "a")).1, vec![(10, "a10".to_owned())]);
        // A jump of 25 (a failover, a slow poll) is filled in, eight at a time.
        let (removed, added) = follow(&mut sent, &chain(1..=35, "a"));
        assert!(removed.is_empty());
        assert_eq!(added.iter().map(|(n, _)| *n).collect::<Vec<_>>(), (11..=35).collect::<Vec<_>>());
        assert!(follow(&mut sent, &chain(1..=35, "a")).1.is_empty(), "nothing twice");
    }

    #[test]
    fn a_reorg_removes_the_dropped_blocks_then_adds_the_new_branch() {
        let mut sent = Emitted::new(64, 100);
        follow(&mut sent, &chain(1..=5, "a"));
        follow(&mut sent, &chain(1..=10, "a"));
        let mut reorged = chain(1..=7, "a");
        reorged.0.extend((8..=11).map(|n| (n, format!("b{n}"))));
        let (removed, added) = follow(&mut sent, &reorged);
        assert_eq!(removed, vec![8, 9, 10]);
        assert_eq!(added, (8..=11).map(|n| (n, format!("b{n}"))).collect::<Vec<_>>());
        // A reorg to a shorter chain removes without adding.
        let mut shorter = chain(1..=7, "a");
        shorter.0.insert(8, "b8".into());
        let (removed, added) = follow(&mut sent, &shorter);
        assert_eq!((removed, added), (vec![9, 10, 11], vec![]));
    }

    #[test]
    fn a_hole_in_the_window_waits_and_a_long_outage_continues_from_the_window() {
        let mut sent = Emitted::new(64, 100);
        follow(&mut sent, &chain(1..=3, "a"));
        let mut holed = chain(1..=9, "a");
        holed.0.remove(&6);
        assert_eq!(follow(&mut sent, &holed).1.iter().map(|(n, _)| *n).collect::<Vec<_>>(), vec![4, 5]);
        assert_eq!(follow(&mut sent, &chain(100..=140, "a")).1.len(), 41);
        // A reorg deeper than everything sent replaces all of it.
        let (removed, added) = follow(&mut sent, &chain(90..=141, "z"));
        assert_eq!(removed.len(), 41);
        assert_eq!(added.first().map(|(n, _)| *n), Some(100));
        assert_eq!(added.last().map(|(n, _)| *n), Some(141));
    }

    #[test]
    fn the_window_bounds_what_is_kept() {
        let mut sent = Emitted::new(4, 100);
        follow(&mut sent, &chain(1..=1, "a"));
        follow(&mut sent, &chain(1..=20, "a"));
        assert_eq!(sent.blocks.len(), 4);
        assert_eq!(sent.head(), Some((20, "a20")));
    }
}
