//! The pool's rules, one test each.

use super::*;
use std::time::Duration;

pub(super) const GWEI: u128 = 1_000_000_000;

pub(super) fn addr(n: u8) -> Address {
    Address::repeat_byte(n)
}

fn tx(sender: u8, nonce: u64, fee_gwei: u128) -> PoolTx {
    tip_tx(sender, nonce, fee_gwei, fee_gwei)
}

pub(super) fn tip_tx(sender: u8, nonce: u64, fee_gwei: u128, tip_gwei: u128) -> PoolTx {
    let mut hash = [0u8; 32];
    hash[0] = sender;
    hash[1..9].copy_from_slice(&nonce.to_be_bytes());
    hash[9..25].copy_from_slice(&(fee_gwei * 1000 + tip_gwei).to_be_bytes());
    PoolTx {
        hash: B256::from(hash),
        sender: addr(sender),
        nonce,
        max_fee: fee_gwei * GWEI,
        max_priority_fee: tip_gwei * GWEI,
        gas_limit: 21_000,
        value: U256::ZERO,
        arrived: Instant::now(),
    }
}

fn rich() -> U256 {
    U256::from(10u128.pow(24))
}

fn pool() -> Pool {
    Pool::new(Config::default())
}

/// Every sender's transactions, hashes in nonce order, for comparing pools.
pub(super) fn contents(p: &Pool) -> Vec<(Address, Vec<B256>, Vec<B256>)> {
    let mut senders: Vec<Address> = p.senders().copied().collect();
    senders.sort();
    senders
        .into_iter()
        .map(|a| {
            let (pending, queued) = p.content_of(&a);
            (a, pending.iter().map(|t| t.hash).collect(), queued.iter().map(|t| t.hash).collect())
        })
        .collect()
}

// The writer's undo when the journal refuses a batch: replacements, evictions (a sender
// evicted to nothing included), gap fills and new senders all come back as they were.
#[test]
fn a_rollback_puts_the_pool_back_as_it_was_at_the_checkpoint() {
    let mut p = Pool::new(Config { global_slots: 4, account_slots: 1, ..Config::default() });
    p.insert(tx(1, 0, 10), 0, rich()).unwrap();
    p.insert(tx(1, 1, 10), 0, rich()).unwrap();
    p.insert(tx(2, 0, 5), 0, rich()).unwrap();
    p.insert(tx(3, 1, 10), 0, rich()).unwrap();
    let (before, status) = (contents(&p), p.status());
    p.checkpoint();
    let replaced = p.insert(tx(1, 1, 20), 0, rich()).unwrap();
    assert!(replaced.replaced.is_some());
    p.insert(tx(4, 0, 30), 0, rich()).unwrap();
    let evicting = p.insert(tx(5, 0, 30), 0, rich()).unwrap();
    assert!(!evicting.evicted.is_empty(), "the batch evicted");
    assert!(p.insert(tx(3, 0, 40), 0, rich()).unwrap().pending, "a gap fill");
    p.rollback();
    assert_eq!((contents(&p), p.status()), (before.clone(), status));
    assert_eq!(p.len(), 4);
    for (_, pending, queued) in &before {
        assert!(pending.iter().chain(queued).all(|h| p.get(h).is_some()), "indexed by hash again");
    }
    // Without a checkpoint, nothing is recorded and a rollback changes nothing.
    p.insert(tx(6, 0, 10), 0, rich()).unwrap();
    p.rollback();
    assert!(p.get(&tx(6, 0, 10).hash).is_some());
}

#[test]
fn a_gap_fill_promotes_the_queued_nonces() {
    let mut p = pool();
    assert!(!p.insert(tx(1, 1, 10), 0, rich()).unwrap().pending);
    assert_eq!(p.status(), Status { pending: 0, queued: 1 });
    assert!(p.insert(tx(1, 0, 10), 0, rich()).unwrap().pending);
    assert_eq!(p.status(), Status { pending: 2, queued: 0 });
    assert_eq!(p.pending_nonce(&addr(1)), Some(2));
}

/// The race of `consistency.rs`'s pending-nonce test: a transaction's state is read, a block
/// mines the sender's last pooled one before the writer inserts it.
#[test]
fn a_state_read_before_a_block_mined_the_senders_last_transaction_does_not_open_a_gap() {
    let mut p = pool();
    p.insert(tx(1, 5, 10), 5, rich()).unwrap();
    assert_eq!(p.advance(&addr(1), 6), [tx(1, 5, 10).hash]);
    assert_eq!(p.pending_nonce(&addr(1)), None, "the sender left with its last transaction");
    // Read at the head before that block: nonce 5.
    assert!(p.insert(tx(1, 6, 10), 5, rich()).unwrap().pending, "nonce 6 follows the mined 5");
    assert_eq!(p.pending_nonce(&addr(1)), Some(7));
    // After a reorg the chain's word is the truth again, lower or not.
    p.advance(&addr(2), 0);
    p.insert(tx(2, 3, 10), 3, rich()).unwrap();
    p.advance(&addr(2), 4);
    p.forget_departed();
    assert!(!p.insert(tx(2, 4, 10), 2, rich()).unwrap().pending, "a gap at 2 and 3 again");
}

#[test]
fn reverse_order_fill_ends_all_pending() {
    let mut p = pool();
    for nonce in (0..5).rev() {
        p.insert(tx(1, nonce, 10), 0, rich()).unwrap();
    }
    assert_eq!(p.status(), Status { pending: 5, queued: 0 });
    let (pending, queued) = p.content_of(&addr(1));
    assert_eq!(pending.iter().map(|t| t.nonce).collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
    assert!(queued.is_empty());
}

#[test]
fn replacement_needs_the_bump_on_both_fees() {
    let mut p = pool();
    p.insert(tip_tx(1, 0, 100, 10), 0, rich()).unwrap();
    assert_eq!(p.insert(tip_tx(1, 0, 109, 11), 0, rich()), Err(InsertError::ReplacementUnderpriced));
    assert_eq!(p.insert(tip_tx(1, 0, 110, 10), 0, rich()), Err(InsertError::ReplacementUnderpriced), "tip not bumped");
    let old = tip_tx(1, 0, 100, 10).hash;
    let done = p.insert(tip_tx(1, 0, 110, 11), 0, rich()).unwrap();
    assert_eq!(done.replaced, Some(old));
    assert!(p.get(&old).is_none());
    assert_eq!(p.status().pending, 1);
}

#[test]
fn refusals_use_geth_wordings() {
    let mut p = pool();
    p.insert(tx(1, 5, 10), 5, rich()).unwrap();
    assert_eq!(p.insert(tx(1, 5, 10), 5, rich()).unwrap_err().to_string(), "already known");
    assert!(p.insert(tx(1, 4, 10), 5, rich()).unwrap_err().to_string().starts_with("nonce too low"));
    assert_eq!(p.insert(tip_tx(2, 0, 1, 2), 0, rich()), Err(InsertError::TipAboveFeeCap));
    let mut strict = Pool::new(Config { min_tip: 2 * GWEI, ..Config::default() });
    assert_eq!(strict.insert(tip_tx(1, 0, 10, 1), 0, rich()).unwrap_err().to_string(), "transaction underpriced");
}

#[test]
fn the_balance_must_cover_every_pooled_transaction() {
    let mut p = pool();
    let one = tx(1, 0, 10).cost();
    p.insert(tx(1, 0, 10), 0, one + one / U256::from(2)).unwrap();
    let err = p.insert(tx(1, 1, 10), 0, one + one / U256::from(2)).unwrap_err();
    assert!(err.to_string().starts_with("insufficient funds for gas * price + value"), "{err}");
    p.insert(tx(1, 1, 10), 0, one * U256::from(2)).unwrap();
}

#[test]
fn a_sender_may_queue_only_so_many_gapped_transactions() {
    let mut p = Pool::new(Config { account_queue: 2, ..Config::default() });
    p.insert(tx(1, 10, 10), 0, rich()).unwrap();
    p.insert(tx(1, 11, 10), 0, rich()).unwrap();
    assert_eq!(p.insert(tx(1, 12, 10), 0, rich()), Err(InsertError::AccountQueueFull(2)));
    assert_eq!(p.status(), Status { pending: 0, queued: 2 });
}

#[test]
fn a_fee_cap_below_the_base_fee_is_held_until_it_allows() {
    let mut p = pool();
    p.set_base_fee(20 * GWEI);
    assert!(!p.insert(tx(1, 0, 10), 0, rich()).unwrap().pending);
    p.insert(tx(1, 1, 30), 0, rich()).unwrap();
    assert_eq!(p.status(), Status { pending: 0, queued: 2 }, "nonce 1 waits behind the held nonce 0");
    p.set_base_fee(5 * GWEI);
    assert_eq!(p.status(), Status { pending: 2, queued: 0 });
}

#[test]
fn when_full_the_cheapest_leave_queued_first_highest_nonce_first() {
    let mut p = Pool::new(Config { global_slots: 3, global_queue: 1, ..Config::default() });
    p.insert(tx(1, 0, 50), 0, rich()).unwrap();
    p.insert(tx(1, 1, 5), 0, rich()).unwrap(); // cheap, but sender 1's nonce 0 must not be evicted before it
    p.insert(tx(2, 0, 20), 0, rich()).unwrap();
    p.insert(tx(3, 7, 100), 0, rich()).unwrap(); // queued (gap)
                                                 // A queued newcomer cannot push out executable transactions: the queue is full of a
                                                 // pricier one, so the cheaper newcomer is refused.
    assert_eq!(p.insert(tx(4, 9, 50), 0, rich()), Err(InsertError::Underpriced));
    // A pending newcomer paying more than the cheapest pending evicts sender 1's *highest* nonce.
    let done = p.insert(tx(5, 0, 30), 0, rich()).unwrap();
    assert_eq!(done.evicted, vec![tx(1, 1, 5).hash]);
    assert!(p.get(&tx(1, 0, 50).hash).is_some());
    // A pending newcomer cheaper than everything is refused.
    assert_eq!(p.insert(tx(6, 0, 1), 0, rich()), Err(InsertError::Underpriced));
}

#[test]
fn when_pending_is_full_senders_beyond_their_guaranteed_slots_are_trimmed_first() {
    let mut p = Pool::new(Config { global_slots: 4, account_slots: 2, ..Config::default() });
    for nonce in 0..3 {
        p.insert(tx(1, nonce, 100), 0, rich()).unwrap(); // pays well, but holds 3 > 2 slots
    }
    p.insert(tx(2, 0, 10), 0, rich()).unwrap();
    let done = p.insert(tx(3, 0, 20), 0, rich()).unwrap();
    assert_eq!(done.evicted, vec![tx(1, 2, 100).hash], "sender 1's third slot goes, not the cheaper sender 2");
    assert_eq!(p.status(), Status { pending: 4, queued: 0 });
}

#[test]
fn priority_senders_are_never_evicted() {
    let config = Config { global_slots: 1, priority_senders: [addr(1)].into_iter().collect(), ..Config::default() };
    let mut p = Pool::new(config);
    p.insert(tx(1, 0, 1), 0, rich()).unwrap();
    assert_eq!(p.insert(tx(2, 0, 100), 0, rich()), Err(InsertError::Underpriced));
    assert!(p.get(&tx(1, 0, 1).hash).is_some());
}

#[test]
fn mined_transactions_leave_and_the_next_nonce_is_promoted() {
    let mut p = pool();
    p.insert(tx(1, 0, 10), 0, rich()).unwrap();
    p.insert(tx(1, 2, 10), 0, rich()).unwrap();
    assert_eq!(p.status(), Status { pending: 1, queued: 1 });
    // Nonces 0 and 1 were mined (1 came from elsewhere): 2 becomes pending.
    assert_eq!(p.advance(&addr(1), 2), vec![tx(1, 0, 10).hash]);
    assert_eq!(p.status(), Status { pending: 1, queued: 0 });
    assert_eq!(p.pending_nonce(&addr(1)), Some(3));
}

#[test]
fn counts_stay_right_through_refusals_removals_and_base_fee_moves() {
    let mut p = Pool::new(Config { account_queue: 1, ..Config::default() });
    p.insert(tx(1, 0, 10), 0, rich()).unwrap();
    p.insert(tx(1, 2, 10), 0, rich()).unwrap();
    assert!(p.insert(tx(1, 3, 10), 0, rich()).is_err());
    assert!(p.insert(tx(2, 0, 10), 0, U256::ZERO).is_err());
    assert_eq!(p.pending_nonce(&addr(2)), None, "a refused sender leaves nothing behind");
    p.set_base_fee(20 * GWEI);
    assert_eq!(p.status(), Status { pending: 0, queued: 2 });
    p.set_base_fee(0);
    p.insert(tx(1, 1, 10), 0, rich()).unwrap();
    assert_eq!(p.status(), Status { pending: 3, queued: 0 });
    p.remove(&tx(1, 1, 10).hash);
    assert_eq!(p.status(), Status { pending: 1, queued: 1 });
    assert_eq!(p.reset_nonce(&addr(1), 3), vec![tx(1, 0, 10).hash, tx(1, 2, 10).hash]);
    assert_eq!((p.status(), p.len()), (Status::default(), 0));
}

#[test]
fn queued_transactions_expire_after_their_lifetime() {
    let mut p = Pool::new(Config { lifetime: Duration::from_secs(60), ..Config::default() });
    p.insert(tx(1, 0, 10), 0, rich()).unwrap();
    p.insert(tx(1, 5, 10), 0, rich()).unwrap();
    assert!(p.expire(Instant::now() + Duration::from_secs(30)).is_empty());
    assert_eq!(p.expire(Instant::now() + Duration::from_secs(61)), vec![tx(1, 5, 10).hash]);
    assert_eq!(p.status(), Status { pending: 1, queued: 0 }, "pending transactions do not expire");
}

// A value near 2^256 (any value RLP can carry) plus gas × fee cap used to wrap around to a
// small cost, which a modest balance covered: the transaction was pooled and relayed.
#[test]
fn a_value_near_2_256_does_not_wrap_past_the_balance_check() {
    let mut p = pool();
    let mut huge = tx(1, 0, 10);
    huge.value = U256::MAX - U256::from(1_000u64);
    let result = p.insert(huge, 0, rich());
    assert!(matches!(result, Err(InsertError::InsufficientFunds { .. })), "{result:?}");
    // The same for a later nonce, whose check sums the cost of those below it.
    let mut p = pool();
    p.insert(tx(2, 0, 10), 0, rich()).unwrap();
    let mut second = tx(2, 1, 10);
    second.value = U256::MAX - U256::from(21_000u128 * 10 * GWEI);
    let result = p.insert(second, 0, rich());
    assert!(matches!(result, Err(InsertError::InsufficientFunds { .. })), "{result:?}");
    assert_eq!(p.len(), 1);
}
