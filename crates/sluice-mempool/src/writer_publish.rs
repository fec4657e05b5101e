//! Publishing a batch: the writer's new [`Snapshot`] (only the changed senders' views built
//! again), the hash index's additions and retirements, and the announcements of what became
//! executable (relay, `newPendingTransactions`).

use std::sync::Arc;

use tokio::sync::mpsc;

use super::{Changes, IndexChange, Writer};
use crate::view::{Pooled, SenderView, Snapshot};

impl Writer {
    /// Publishes the new snapshot (copying only the changed senders), then announces the
    /// transactions that became executable.
    pub(super) fn publish(&mut self, mut changes: Changes) {
        changes.touched.extend(self.dirty.drain());
        let old = self.snapshot.load_full();
        let mut next = Snapshot::clone(&old);
        // Every sender whose view may differ: those touched, and on a base fee move all of
        // them, including those that just left (their entries must go too).
        let mut senders = changes.touched;
        if changes.all {
            senders.extend(self.pool.senders().copied());
            senders.extend(old.senders.keys().copied());
        }
        // Entries are added before the snapshot that lists them is published, and deleted only
        // once no live snapshot lists them (below).
        let mut left = Vec::new();
        {
            let index = next.index.pin();
            for change in self.index.drain(..) {
                match change {
                    IndexChange::Add(hash, place) => {
                        index.insert(hash, place);
                    }
                    IndexChange::Remove(hash) => left.push(hash),
                }
            }
        }
        let mut newly_pending = Vec::new();
        for sender in senders {
            let Some(pending_nonce) = self.pool.pending_nonce(&sender) else {
                next.senders.remove(&sender);
                continue;
            };
            let mut view = SenderView { pending_nonce, ..SenderView::default() };
            if let Some((pending, txs)) = self.pool.txs_of(&sender) {
                view.pending.reserve_exact(pending);
                for (i, p) in txs.enumerate() {
                    if i < pending { &mut view.pending } else { &mut view.queued }.push(p.clone());
                }
            }
            // The sender's place in the new snapshot's map, found once: it still holds the old
            // view, which the new one then replaces (a lookup in the old map and an insert in the
            // new one walked the trie twice).
            let slot = next.senders.get_mut(&sender);
            // A pending list runs without gaps from the account nonce (its pending nonce less its
            // length), so a transaction pending before sits in the old list at a known place:
            // compared there as the same allocation, neither transaction is read (reading the
            // older ones, each a cache miss, was a fifth of this function's time).
            let first = pending_nonce - view.pending.len() as u64;
            let before = slot.as_deref().map(Arc::as_ref);
            let was_pending = |i: usize, p: &Arc<Pooled>| {
                before.is_some_and(|v| {
                    let old_first = v.pending_nonce - v.pending.len() as u64;
                    (first + i as u64)
                        .checked_sub(old_first)
                        .and_then(|at| v.pending.get(usize::try_from(at).ok()?))
                        .is_some_and(|q| Arc::ptr_eq(p, q))
                })
            };
            for (i, p) in view.pending.iter().enumerate() {
                if !was_pending(i, p) {
                    newly_pending.push(p.clone());
                }
            }
            match slot {
                Some(slot) => *slot = Arc::new(view),
                None => next.senders.insert(sender, Arc::new(view)),
            }
        }
        next.status = self.pool.status();
        next.base_fee = self.pool.base_fee();
        metrics::gauge!("sluice_mempool_pending", "network" => self.network.clone()).set(next.status.pending as f64);
        metrics::gauge!("sluice_mempool_queued", "network" => self.network.clone()).set(next.status.queued as f64);
        let index = next.index.clone();
        self.snapshot.store(Arc::new(next));
        self.retired.push(&old, left);
        drop(old);
        let index = index.pin();
        for hash in self.retired.due() {
            // A transaction that left and came back is listed again: its entry stays.
            if self.pool.get(&hash).is_none() {
                index.remove(&hash);
            }
        }
        for p in newly_pending {
            if let Err(mpsc::error::TrySendError::Full(_)) = self.relay.try_send(p.clone()) {
                metrics::counter!("sluice_mempool_relay_deferred_total", "network" => self.network.clone())
                    .increment(1);
            }
            let _ = self.pending_events.send(p);
        }
    }
}
