//! The writer: journal failures, held snapshots.

use super::*;
use crate::journal::Sync;
use crate::{decode, Rules};
use sluice_bench::txgen::{Fees, SignedTx, Wallet};

fn writer(journal: Journal) -> Writer {
    Writer {
        network: "test".into(),
        accepted: metrics::Counter::noop(),
        pool: Pool::new(crate::Config::default()),
        journal: Some(journal),
        snapshot: Arc::new(ArcSwap::from_pointee(Snapshot::default())),
        statuses: Statuses::new(1024),
        relay: mpsc::channel(16).0,
        pending_events: broadcast::channel(16).0,
        answers: None,
        journal_records: 0,
        dirty: AddressSet::default(),
        index: Vec::new(),
        retired: Retired::default(),
        replaying: false,
        unsettled: Vec::new(),
    }
}

/// Inserts through the writer as a submitter would; its answer.
fn submit(writer: &mut Writer, signed: &SignedTx) -> Result<B256, SubmitError> {
    let rules = Rules::default();
    let raw = alloy_primitives::Bytes::from(signed.raw.clone());
    let (tx, _) = decode(&raw, &rules, Instant::now()).expect("a valid transaction");
    let (reply, mut answer) = oneshot::channel();
    let pooled = Arc::new(Pooled { tx, raw });
    let submission = Submission { pooled, nonce: 0, balance: U256::MAX, journal: true, reply: Some(reply) };
    writer.apply(&mut vec![Command::Insert(submission)]);
    answer.try_recv().expect("answered within the batch")
}

/// A writer on a journal in a new directory (kept alive by the first value).
fn journaled_writer() -> (tempfile::TempDir, Writer) {
    let dir = tempfile::tempdir().unwrap();
    let (journal, _) = Journal::open(&dir.path().join("pool.journal"), Sync::Os).unwrap();
    (dir, writer(journal))
}

/// Account `n`'s transfer with `nonce`.
fn transfer(n: u64, nonce: u64) -> SignedTx {
    Wallet::numbered(n, 1).transfer(nonce, alloy_primitives::Address::repeat_byte(7), 1, Fees::default())
}

// A snapshot answers by hash as of its batch, also after the transaction left; the index
// entry goes once no snapshot lists it.
#[test]
fn a_held_snapshot_still_finds_what_left_and_the_entry_goes_with_it() {
    let (_dir, mut writer) = journaled_writer();
    let (first, second) = (transfer(1, 0), transfer(1, 1));
    assert_eq!(submit(&mut writer, &first), Ok(first.hash));
    assert_eq!(submit(&mut writer, &second), Ok(second.hash));
    let held = writer.snapshot.load_full();
    writer.apply(&mut vec![Command::Reject { hash: second.hash, reason: "test".into() }]);
    let now = writer.snapshot.load_full();
    assert!(now.get(&second.hash).is_none() && now.get(&first.hash).is_some());
    assert!(held.get(&second.hash).is_some_and(|p| p.tx.nonce == 1), "the held snapshot still lists it");
    assert!(now.index.pin().contains_key(&second.hash), "kept while a snapshot lists it");
    drop((held, now));
    writer.apply(&mut vec![Command::Expire]);
    assert!(!writer.snapshot.load().index.pin().contains_key(&second.hash), "gone with the last one");
    assert_eq!(writer.snapshot.load().index.len(), 1);
}

// Readers mostly hold a snapshot through `ArcSwap::load`'s guard, which counts no reference
// while the snapshot is current; replacing it must still keep the index entries it lists.
#[test]
fn a_snapshot_held_through_a_load_guard_keeps_its_entries() {
    let (_dir, mut writer) = journaled_writer();
    let tx = transfer(2, 0);
    assert_eq!(submit(&mut writer, &tx), Ok(tx.hash));
    let swap = writer.snapshot.clone();
    let guard = swap.load();
    writer.apply(&mut vec![Command::Reject { hash: tx.hash, reason: "test".into() }]);
    writer.apply(&mut vec![Command::Expire]);
    assert!(guard.get(&tx.hash).is_some(), "the guarded snapshot still finds it after two publications");
    drop(guard);
    writer.apply(&mut vec![Command::Expire]);
    assert!(!writer.snapshot.load().index.pin().contains_key(&tx.hash));
}

// The replacement is refused (its journal write failed), so the transaction it was to
// replace, already acknowledged, must still be pooled, visible, and in the journal.
#[test]
fn a_replacement_whose_journal_write_fails_keeps_the_transaction_it_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool.journal");
    let (journal, _) = Journal::open(&path, Sync::Os).unwrap();
    let mut writer = writer(journal);
    let wallet = Wallet::numbered(1, 1);
    let to = alloy_primitives::Address::repeat_byte(7);
    let first = wallet.transfer(0, to, 1, Fees::default());
    let bumped = Fees { max_fee: 40_000_000_000, tip: 2_000_000_000 };
    let replacement = wallet.transfer(0, to, 1, bumped);
    assert_eq!(submit(&mut writer, &first), Ok(first.hash));
    writer.journal.as_mut().unwrap().fail_after = Some(0);
    assert!(matches!(submit(&mut writer, &replacement), Err(SubmitError::Refused(InsertError::Journal(_)))));
    let snapshot = writer.snapshot.load_full();
    assert!(snapshot.get(&first.hash).is_some(), "the acknowledged transaction is still readable");
    assert!(!snapshot.contains(&replacement.hash));
    assert_eq!(writer.pool.get(&first.hash).map(|t| t.tx.hash), Some(first.hash), "and still pooled");
    assert_eq!(writer.statuses.get(&first.hash), None, "and not recorded as replaced");
    // A later replacement that is journaled replaces it as usual.
    assert_eq!(submit(&mut writer, &replacement), Ok(replacement.hash));
    assert!(writer.pool.get(&first.hash).is_none());
    drop(writer);
    let (_, replayed) = Journal::open(&path, Sync::Os).unwrap();
    assert_eq!(replayed, [first.raw.clone(), replacement.raw.clone()]);
}

// Each transaction is announced (relayed, and sent to `newPendingTransactions`) once, when it
// becomes pending: a queued one when its gap fills, a replacement as it replaces, and none of
// a sender's earlier ones again when a later one joins.
#[test]
fn each_transaction_is_announced_once_when_it_becomes_pending() {
    let (_dir, mut writer) = journaled_writer();
    let mut events = writer.pending_events.subscribe();
    let mut announced = || std::iter::from_fn(|| events.try_recv().ok()).map(|p| p.tx.hash).collect::<Vec<_>>();
    let wallet = Wallet::numbered(3, 1);
    let to = alloy_primitives::Address::repeat_byte(7);
    let tx = |nonce, fees| wallet.transfer(nonce, to, 1, fees);
    let (gapped, first, third) = (tx(1, Fees::default()), tx(0, Fees::default()), tx(2, Fees::default()));
    assert_eq!(submit(&mut writer, &gapped), Ok(gapped.hash));
    assert_eq!(announced(), Vec::<B256>::new(), "queued behind a gap: not yet");
    assert_eq!(submit(&mut writer, &first), Ok(first.hash));
    assert_eq!(announced(), [first.hash, gapped.hash], "the gap filled: both, in nonce order");
    assert_eq!(submit(&mut writer, &third), Ok(third.hash));
    assert_eq!(announced(), [third.hash], "only the newcomer");
    let replacement = tx(1, Fees { max_fee: 40_000_000_000, tip: 2_000_000_000 });
    assert_eq!(submit(&mut writer, &replacement), Ok(replacement.hash));
    assert_eq!(announced(), [replacement.hash], "the replacement, not the ones around it");
    // Another sender's batch announces nothing of this one's.
    let other = transfer(4, 0);
    assert_eq!(submit(&mut writer, &other), Ok(other.hash));
    assert_eq!(announced(), [other.hash]);
}
