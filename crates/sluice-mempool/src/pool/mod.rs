//! The pool itself.
//!
//! Per sender, transactions are kept by nonce. Which are *pending* (executable now) is derived:
//! the run of consecutive nonces from the account's nonce, stopping at the first gap or at a
//! transaction whose fee cap is below the current base fee (held until the base fee allows).
//! The rest are *queued*. Rules follow geth's defaults:
//! * a transaction replacing one of the same sender and nonce must raise both fee fields by
//!   `price_bump_percent`;
//! * the sender's balance must cover every pooled transaction up to and including this one;
//! * per-sender and global limits; when full, the lowest-paying transactions leave first,
//!   queued before pending, a sender's highest nonce first (never its lower ones), priority
//!   senders never. A newcomer that pays less than everything it could displace is refused.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use alloy_primitives::map::{AddressMap, B256Map};
use alloy_primitives::{Address, B256, U256};

mod departed;
mod types;
use departed::Departed;
pub use types::{AsPoolTx, Config, InsertError, Inserted, PoolTx, Status};

#[derive(Debug)]
struct Sender<T> {
    txs: BTreeMap<u64, Arc<T>>,
    nonce: u64,
    balance: U256,
    /// `pending_len` at the pool's base fee, as of the last [`Pool::touch`].
    pending: usize,
}

// By hand: derived, it would ask `T` itself for `Default`.
impl<T> Default for Sender<T> {
    fn default() -> Self {
        Self { txs: BTreeMap::new(), nonce: 0, balance: U256::ZERO, pending: 0 }
    }
}

impl<T: AsPoolTx> Sender<T> {
    /// How many of its transactions are executable at `base_fee`: the run of consecutive
    /// nonces from the account's, up to the first one whose fee cap is below the base fee.
    fn pending_len(&self, base_fee: u128) -> usize {
        (self.nonce..)
            .zip(self.txs.range(self.nonce..))
            .take_while(|(expected, (nonce, tx))| *nonce == expected && tx.pool_tx().max_fee >= base_fee)
            .count()
    }
}

/// The pool, of `T`s: [`PoolTx`] alone, or anything that carries one (the mempool's writer pools
/// its transactions with their bytes, so that what it publishes comes from the pool directly).
#[derive(Debug)]
pub struct Pool<T = PoolTx> {
    config: Config,
    senders: AddressMap<Sender<T>>,
    by_hash: B256Map<Arc<T>>,
    base_fee: u128,
    /// Sum of the senders' cached `pending`: keeps [`Pool::status`] O(1).
    pending_total: usize,
    /// What [`Pool::rollback`] puts back, while a checkpoint is open. Kept between batches,
    /// so that its lists are not grown again for every batch.
    undo: Undo<T>,
    /// Nonces of senders that left with their last transaction: a state read before they
    /// left does not take them back below it.
    departed: Departed,
}

/// What changed since a checkpoint, to undo. Each change is logged as what it overwrote, so that
/// replaying the log backwards restores every slot: a batch costs its own changes, not a copy
/// of every sender it touched.
#[derive(Debug)]
struct Undo<T> {
    /// Whether a checkpoint is open (changes are logged).
    open: bool,
    /// Each changed sender's account nonce and balance before its first change (`None`: it was
    /// not in the pool).
    accounts: AddressMap<Option<(u64, U256)>>,
    /// Every write to a sender's transactions, in order: the slot and what it held before.
    slots: Vec<(Address, u64, Option<Arc<T>>)>,
}

impl<T> Undo<T> {
    fn new() -> Self {
        Self { open: false, accounts: AddressMap::default(), slots: Vec::new() }
    }

    /// Opens or closes the log, empty.
    fn reset(&mut self, open: bool) {
        self.open = open;
        self.accounts.clear();
        self.slots.clear();
    }
}

/// Logs a write to `sender`'s slot `nonce` that replaced `before`, when a checkpoint is open.
fn log_slot<T>(undo: &mut Undo<T>, sender: Address, nonce: u64, before: Option<Arc<T>>) {
    if undo.open {
        undo.slots.push((sender, nonce, before));
    }
}

/// Transactions a pool's hash map is sized for up front, at most: a pool filling up under load
/// then does not rehash it on the way (each rehash moves every entry at once).
const PRESIZED: usize = 1 << 16;

impl<T: AsPoolTx> Pool<T> {
    /// An empty pool, its map by hash sized for its limits (up to 65,536 transactions).
    pub fn new(config: Config) -> Self {
        Self {
            senders: AddressMap::default(),
            by_hash: B256Map::with_capacity_and_hasher(config.capacity(), Default::default()),
            config,
            base_fee: 0,
            pending_total: 0,
            undo: Undo::new(),
            departed: Departed::default(),
        }
    }

    /// Sets the base fee of the next block: held transactions may become pending, and pending
    /// ones may become held. When that leaves more queued than the limit allows, the cheapest
    /// leave; returns their hashes.
    pub fn set_base_fee(&mut self, base_fee: u128) -> Vec<B256> {
        self.base_fee = base_fee;
        let senders: Vec<Address> = self.senders.keys().copied().collect();
        for sender in senders {
            self.touch(&sender);
        }
        self.make_room(None).unwrap_or_default()
    }

    /// The base fee the pool judges executability by.
    pub fn base_fee(&self) -> u128 {
        self.base_fee
    }

    /// Every sender with pooled transactions.
    pub fn senders(&self) -> impl Iterator<Item = &Address> {
        self.senders.keys()
    }

    /// Number of pooled transactions.
    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    /// Every pooled transaction, in no order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<T>> {
        self.by_hash.values()
    }

    /// Whether the pool is empty.
    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }

    /// Recomputes one sender's pending count after a change, keeping the totals right, and
    /// forgets senders left without transactions.
    fn touch(&mut self, sender: &Address) {
        let base_fee = self.base_fee;
        let Some(s) = self.senders.get_mut(sender) else { return };
        let now = s.pending_len(base_fee);
        self.pending_total = self.pending_total - s.pending + now;
        s.pending = now;
        if s.txs.is_empty() {
            self.departed.record(*sender, s.nonce);
            self.senders.remove(sender);
        }
    }

    /// A pooled transaction by hash.
    pub fn get(&self, hash: &B256) -> Option<Arc<T>> {
        self.by_hash.get(hash).cloned()
    }

    /// The next nonce for `sender` counting its pending transactions (`eth_getTransactionCount(pending)`).
    pub fn pending_nonce(&self, sender: &Address) -> Option<u64> {
        let s = self.senders.get(sender)?;
        Some(s.nonce + s.pending as u64)
    }

    /// Pending and queued counts.
    pub fn status(&self) -> Status {
        Status { pending: self.pending_total, queued: self.by_hash.len() - self.pending_total }
    }

    /// A sender's transactions split into (pending, queued), by nonce.
    pub fn content_of(&self, sender: &Address) -> (Vec<Arc<T>>, Vec<Arc<T>>) {
        let Some((pending, txs)) = self.txs_of(sender) else { return (Vec::new(), Vec::new()) };
        let all: Vec<Arc<T>> = txs.cloned().collect();
        let (p, q) = all.split_at(pending);
        (p.to_vec(), q.to_vec())
    }

    /// A sender's transactions by nonce, with how many of the first ones are pending; `None`
    /// when it has none. Borrowed: the writer rebuilds a sender's view from it on every
    /// change, without copying the lists first.
    pub fn txs_of(&self, sender: &Address) -> Option<(usize, impl Iterator<Item = &Arc<T>> + '_)> {
        let s = self.senders.get(sender)?;
        Some((s.pending, s.txs.values()))
    }

    /// Starts recording changes, so that [`Pool::rollback`] can undo them (the writer
    /// inserts a batch, and undoes it when the journal cannot take it).
    pub fn checkpoint(&mut self) {
        self.undo.reset(true);
    }

    /// Keeps the changes since [`Pool::checkpoint`].
    pub fn commit(&mut self) {
        self.undo.reset(false);
    }

    /// Puts every sender changed since [`Pool::checkpoint`] back as it was: transactions
    /// replaced or evicted by the undone inserts come back.
    pub fn rollback(&mut self) {
        if !self.undo.open {
            return;
        }
        let mut undo = std::mem::replace(&mut self.undo, Undo::new());
        for (address, nonce, before) in undo.slots.drain(..).rev() {
            let s = self.senders.entry(address).or_default();
            let now = match &before {
                Some(tx) => s.txs.insert(nonce, tx.clone()),
                None => s.txs.remove(&nonce),
            };
            if let Some(now) = now {
                self.by_hash.remove(&now.pool_tx().hash);
            }
            if let Some(before) = before {
                self.by_hash.insert(before.pool_tx().hash, before);
            }
        }
        for (address, account) in undo.accounts.drain() {
            let s = self.senders.entry(address).or_default();
            if let Some((nonce, balance)) = account {
                s.nonce = nonce;
                s.balance = balance;
            }
            // Recounts its pending transactions, and drops it again when it has none.
            self.touch(&address);
        }
        undo.reset(false);
        self.undo = undo;
    }

    /// Records a sender's account state before its first change under a checkpoint.
    fn save(&mut self, sender: &Address) {
        if self.undo.open && !self.undo.accounts.contains_key(sender) {
            self.undo.accounts.insert(*sender, self.senders.get(sender).map(|s| (s.nonce, s.balance)));
        }
    }

    /// Inserts a transaction, given its sender's account nonce and balance at the head.
    pub fn insert(&mut self, tx: impl Into<Arc<T>>, nonce: u64, balance: U256) -> Result<Inserted, InsertError> {
        let entry = tx.into();
        let sender = entry.pool_tx().sender;
        self.save(&sender);
        let result = self.try_insert(entry, nonce, balance);
        if result.is_err() {
            // A refusal may have left a new sender without transactions behind.
            self.touch(&sender);
        }
        result
    }

    fn try_insert(&mut self, entry: Arc<T>, nonce: u64, balance: U256) -> Result<Inserted, InsertError> {
        let tx = entry.pool_tx();
        // State read at an older head may be behind what the pool has seen since, also of a
        // sender whose last transaction a block mined meanwhile.
        let known = self.senders.get(&tx.sender).map(|s| s.nonce).or_else(|| self.departed.get(&tx.sender));
        let nonce = nonce.max(known.unwrap_or(0));
        if self.by_hash.contains_key(&tx.hash) {
            return Err(InsertError::AlreadyKnown);
        }
        if tx.max_priority_fee > tx.max_fee {
            return Err(InsertError::TipAboveFeeCap);
        }
        if tx.max_priority_fee < self.config.min_tip {
            return Err(InsertError::Underpriced);
        }
        if tx.nonce < nonce {
            return Err(InsertError::NonceTooLow { next: nonce, got: tx.nonce });
        }
        // The head says these nonces are used: whatever the pool still holds below is mined.
        let mined = self.drop_below(&tx.sender, nonce);
        let base_fee = self.base_fee;
        let bump = self.config.price_bump_percent;
        let sender = self.senders.entry(tx.sender).or_default();
        sender.nonce = sender.nonce.max(nonce);
        sender.balance = balance;
        let replaced = match sender.txs.get(&tx.nonce) {
            Some(old) => {
                let enough = |new: u128, old: u128| new.saturating_mul(100) >= old.saturating_mul(100 + bump);
                let old = old.pool_tx();
                if !enough(tx.max_fee, old.max_fee) || !enough(tx.max_priority_fee, old.max_priority_fee) {
                    return Err(InsertError::ReplacementUnderpriced);
                }
                Some(old.hash)
            }
            None => None,
        };
        // Cumulative balance: every pooled tx of this sender up to this nonce, plus this one.
        let cost: U256 =
            sender.txs.range(..tx.nonce).map(|(_, t)| t.pool_tx().cost()).fold(tx.cost(), U256::saturating_add);
        if cost > balance {
            return Err(InsertError::InsufficientFunds { balance, cost });
        }
        // `pending` is current: `drop_below` above counted it (or the sender is new and empty).
        let queued_before = sender.txs.len() - sender.pending;
        let previous = sender.txs.insert(tx.nonce, entry.clone());
        log_slot(&mut self.undo, tx.sender, tx.nonce, previous.clone());
        let pending_now = sender.pending_len(base_fee);
        let is_pending = tx.nonce < sender.nonce + pending_now as u64;
        let queued_now = sender.txs.len() - pending_now;
        if !is_pending && queued_now > self.config.account_queue && queued_now > queued_before {
            // Undo: this sender has too many gapped transactions.
            let now = match previous {
                Some(prev) => sender.txs.insert(tx.nonce, prev),
                None => sender.txs.remove(&tx.nonce),
            };
            log_slot(&mut self.undo, tx.sender, tx.nonce, now);
            self.touch(&tx.sender);
            return Err(InsertError::AccountQueueFull(queued_before));
        }
        // What `touch` does, with the count just made.
        self.pending_total = self.pending_total - sender.pending + pending_now;
        sender.pending = pending_now;
        if let Some(old) = replaced {
            self.by_hash.remove(&old);
        }
        self.by_hash.insert(tx.hash, entry.clone());
        let evicted = match self.make_room(Some(&tx.hash)) {
            Ok(evicted) => evicted,
            Err(e) => {
                self.remove(&tx.hash);
                if let Some(prev) = previous {
                    let (hash, sender, prev_nonce) = (prev.pool_tx().hash, prev.pool_tx().sender, prev.pool_tx().nonce);
                    self.by_hash.insert(hash, prev.clone());
                    let s = self.senders.entry(sender).or_default();
                    s.nonce = s.nonce.max(nonce);
                    s.balance = balance;
                    let now = s.txs.insert(prev_nonce, prev);
                    log_slot(&mut self.undo, sender, prev_nonce, now);
                    self.touch(&sender);
                }
                return Err(e);
            }
        };
        Ok(Inserted { pending: is_pending, replaced, evicted, mined })
    }

    /// Evicts the cheapest transactions while the pool is over its limits. Queued go before
    /// pending, a sender's highest nonce first, priority senders never. Refuses the newcomer
    /// if it would be the one to go, or if it is queued and only pending ones could make room.
    fn make_room(&mut self, newcomer: Option<&B256>) -> Result<Vec<B256>, InsertError> {
        let mut evicted = Vec::new();
        loop {
            let status = self.status();
            let over_queue = status.queued > self.config.global_queue;
            let over_slots = status.pending > self.config.global_slots;
            if !over_queue && !over_slots {
                return Ok(evicted);
            }
            // Candidates: per sender, its highest pending nonce when pending slots are over the
            // limit, else its highest queued one; never a lower nonce before a higher one.
            // Senders holding more than their guaranteed `account_slots` go first (as geth
            // trims them first), then the lowest tip.
            let mut best: Option<((bool, u128), B256)> = None;
            for (address, s) in &self.senders {
                if self.config.priority_senders.contains(address) {
                    continue;
                }
                let pending = s.pending;
                let candidate = if over_slots && pending > 0 {
                    s.txs.values().nth(pending - 1)
                } else if !over_slots && s.txs.len() > pending {
                    s.txs.values().last()
                } else {
                    None
                };
                let Some(candidate) = candidate.map(|c| c.pool_tx()) else { continue };
                let within_guarantee = !over_slots || pending <= self.config.account_slots;
                let rank = (within_guarantee, candidate.effective_tip(self.base_fee));
                if best.as_ref().is_none_or(|(r, _)| rank < *r) {
                    best = Some((rank, candidate.hash));
                }
            }
            let Some((_, victim)) = best else {
                // Only priority senders' transactions are left to evict.
                return if newcomer.is_some() { Err(InsertError::Underpriced) } else { Ok(evicted) };
            };
            if newcomer == Some(&victim) {
                return Err(InsertError::Underpriced);
            }
            self.remove(&victim);
            evicted.push(victim);
        }
    }

    /// Evicts while the pool is over its limits (after removals or nonce resets, which can turn
    /// pending transactions into queued ones); returns what left.
    pub fn trim(&mut self) -> Vec<B256> {
        self.make_room(None).unwrap_or_default()
    }

    /// Removes one transaction (dropped, evicted or rejected later by the node). A gap it
    /// leaves can push the queued count over its limit: call [`Pool::trim`] after removals.
    pub fn remove(&mut self, hash: &B256) -> Option<Arc<T>> {
        let sender = self.by_hash.get(hash)?.pool_tx().sender;
        self.save(&sender);
        let entry = self.by_hash.remove(hash)?;
        let tx = entry.pool_tx();
        if let Some(s) = self.senders.get_mut(&tx.sender) {
            if s.txs.get(&tx.nonce).is_some_and(|t| t.pool_tx().hash == *hash) {
                let before = s.txs.remove(&tx.nonce);
                log_slot(&mut self.undo, tx.sender, tx.nonce, before);
            }
        }
        self.touch(&tx.sender);
        Some(entry)
    }

    /// A new head moved `sender`'s nonce to `nonce`: its transactions below it were mined (or
    /// replaced on chain) and leave. Returns their hashes.
    pub fn advance(&mut self, sender: &Address, nonce: u64) -> Vec<B256> {
        self.save(sender);
        self.drop_below(sender, nonce)
    }

    /// [`Pool::advance`] for a sender already saved under the checkpoint (every insert comes
    /// here, and saving looks the sender up again).
    fn drop_below(&mut self, sender: &Address, nonce: u64) -> Vec<B256> {
        let Some(s) = self.senders.get_mut(sender) else { return Vec::new() };
        let moved = nonce > s.nonce;
        s.nonce = s.nonce.max(nonce);
        // Every insert comes here with its sender's nonce: most often nothing is below it, and
        // splitting would still rebuild the sender's tree (and recounting, walk it).
        if s.txs.first_key_value().is_none_or(|(&first, _)| first >= nonce) {
            if moved {
                self.touch(sender);
            }
            return Vec::new();
        }
        let keep = s.txs.split_off(&nonce);
        let mut gone = Vec::new();
        for (below, tx) in std::mem::replace(&mut s.txs, keep) {
            let hash = tx.pool_tx().hash;
            self.by_hash.remove(&hash);
            log_slot(&mut self.undo, *sender, below, Some(tx));
            gone.push(hash);
        }
        self.touch(sender);
        gone
    }

    /// Forgets the nonces of departed senders: after a reorg the chain may have forgotten
    /// nonces it had used, and the next state read is the truth again.
    pub fn forget_departed(&mut self) {
        self.departed.clear();
    }

    /// Sets a sender's account nonce as the head now says, lower or higher (after a reorg the
    /// chain may have forgotten nonces it had used). Transactions below it leave.
    pub fn reset_nonce(&mut self, sender: &Address, nonce: u64) -> Vec<B256> {
        self.save(sender);
        if let Some(s) = self.senders.get_mut(sender) {
            s.nonce = nonce;
        }
        let gone = self.drop_below(sender, nonce);
        // `drop_below` recounts only when it moves the nonce up; this may have moved it down.
        self.touch(sender);
        gone
    }

    /// Drops queued transactions older than the lifetime. Returns their hashes.
    pub fn expire(&mut self, now: Instant) -> Vec<B256> {
        let base_fee = self.base_fee;
        let lifetime = self.config.lifetime;
        let mut gone = Vec::new();
        for s in self.senders.values() {
            let pending = s.pending_len(base_fee);
            gone.extend(
                s.txs
                    .values()
                    .skip(pending)
                    .map(|t| t.pool_tx())
                    .filter(|t| now.saturating_duration_since(t.arrived) > lifetime)
                    .map(|t| t.hash),
            );
        }
        for hash in &gone {
            self.remove(hash);
        }
        gone
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod properties;
