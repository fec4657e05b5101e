//! Whatever sequence of operations the pool sees, its invariants hold.

use proptest::prelude::*;

use super::tests::{addr, contents, tip_tx, GWEI};
use super::*;
use std::time::Duration;

#[derive(Debug, Clone)]
enum Op {
    Insert { sender: u8, nonce: u64, fee: u128, tip: u128, account_nonce: u64 },
    Advance { sender: u8, nonce: u64 },
    Reset { sender: u8, nonce: u64 },
    Remove { pick: usize },
    BaseFee(u128),
    Expire,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..5, 0u64..10, 1u128..60, 0u128..60, 0u64..3).prop_map(|(sender, nonce, fee, tip, account_nonce)| {
            Op::Insert { sender, nonce, fee, tip: tip.min(fee), account_nonce }
        }),
        1 => (0u8..5, 0u64..6).prop_map(|(sender, nonce)| Op::Advance { sender, nonce }),
        1 => (0u8..5, 0u64..6).prop_map(|(sender, nonce)| Op::Reset { sender, nonce }),
        1 => any::<usize>().prop_map(|pick| Op::Remove { pick }),
        1 => (0u128..40).prop_map(Op::BaseFee),
        1 => Just(Op::Expire),
    ]
}

fn check(p: &Pool, config: &Config) {
    let mut pending = 0;
    let mut all = 0;
    for sender in p.senders().copied().collect::<Vec<_>>() {
        let (pend, queued) = p.content_of(&sender);
        let account = p.pending_nonce(&sender).unwrap() - pend.len() as u64;
        for (i, t) in pend.iter().enumerate() {
            assert_eq!(t.nonce, account + i as u64, "pending nonces run from the account nonce");
            assert!(t.max_fee >= p.base_fee(), "pending ones can pay the base fee");
        }
        assert!(queued.iter().all(|t| t.nonce >= account), "nothing below the account nonce stays");
        assert!(!(pend.is_empty() && queued.is_empty()), "no empty senders");
        pending += pend.len();
        all += pend.len() + queued.len();
        for t in pend.iter().chain(&queued) {
            assert_eq!(p.get(&t.hash).as_deref(), Some(t.as_ref()), "indexed by hash");
        }
    }
    assert_eq!(p.len(), all, "the hash index holds exactly the listed transactions");
    assert_eq!(p.status(), Status { pending, queued: all - pending }, "the cached counts are right");
    assert!(p.status().pending <= config.global_slots, "pending within its limit");
    assert!(p.status().queued <= config.global_queue, "queued within its limit");
}

/// Applies one operation; `i` makes each inserted hash distinct.
fn apply(p: &mut Pool, hashes: &mut Vec<B256>, i: usize, op: Op) {
    match op {
        Op::Insert { sender, nonce, fee, tip, account_nonce } => {
            let mut t = tip_tx(sender, nonce, fee, tip);
            t.hash.0[30..].copy_from_slice(&(i as u16).to_be_bytes()); // distinct hashes for repeats
            hashes.push(t.hash);
            let _ = p.insert(t, account_nonce, U256::from(10u128.pow(24)));
        }
        Op::Advance { sender, nonce } => {
            p.advance(&addr(sender), nonce);
        }
        Op::Reset { sender, nonce } => {
            p.reset_nonce(&addr(sender), nonce);
            p.trim();
        }
        Op::Remove { pick } => {
            if !hashes.is_empty() {
                p.remove(&hashes[pick % hashes.len()]);
                p.trim();
            }
        }
        Op::BaseFee(gwei) => {
            p.set_base_fee(gwei * GWEI);
        }
        Op::Expire => {
            p.expire(Instant::now() + Duration::from_secs(1));
        }
    }
}

fn config() -> Config {
    Config { global_slots: 12, global_queue: 6, account_queue: 4, lifetime: Duration::ZERO, ..Config::default() }
}

proptest! {
    #[test]
    fn invariants_hold_for_any_sequence(ops in proptest::collection::vec(op(), 1..120)) {
        let config = config();
        let mut p = Pool::new(config.clone());
        let mut hashes = Vec::new();
        for (i, op) in ops.into_iter().enumerate() {
            apply(&mut p, &mut hashes, i, op);
            check(&p, &config);
        }
    }

    // The writer checkpoints before a batch and rolls back when the journal refuses it: whatever
    // the batch did (replacements, evictions, nonces advanced, senders emptied or new), the pool
    // is as it was, account nonces included.
    #[test]
    fn a_rollback_undoes_any_sequence(
        before in proptest::collection::vec(op(), 0..60),
        batch in proptest::collection::vec(op(), 1..60),
    ) {
        let config = config();
        let mut p = Pool::new(config.clone());
        let mut hashes = Vec::new();
        for (i, op) in before.into_iter().enumerate() {
            apply(&mut p, &mut hashes, i, op);
        }
        let nonces = |p: &Pool| (0..5).map(|s| p.pending_nonce(&addr(s))).collect::<Vec<_>>();
        let was = (contents(&p), p.status(), nonces(&p));
        p.checkpoint();
        for (i, op) in batch.into_iter().enumerate() {
            // The base fee is the pool's, not a sender's: a batch does not move it.
            if !matches!(op, Op::BaseFee(_)) {
                apply(&mut p, &mut hashes, 1000 + i, op);
            }
        }
        p.rollback();
        prop_assert_eq!((contents(&p), p.status(), nonces(&p)), was);
        check(&p, &config);
    }
}
