use super::*;

const MS: u64 = 1_000_000;

impl Weight for u32 {
    fn weight(&self) -> usize {
        100
    }
}

fn none(_: &&'static str, _: &u32) -> bool {
    false
}

fn outbox() -> Outbox<&'static str, u32> {
    let mut o =
        Outbox::new(OutboxConfig { max_in_flight: 2, max_batch: 1, queue_per_peer: 4, ..OutboxConfig::default() });
    o.add_peer("a");
    o
}

/// (send, message ids) of each send.
fn sends(actions: &[Action<&'static str, u32>]) -> Vec<(u64, Vec<u64>)> {
    actions
        .iter()
        .filter_map(|a| if let Action::Send { send, ids, .. } = a { Some((*send, ids.clone())) } else { None })
        .collect()
}

fn ids(actions: &[Action<&'static str, u32>]) -> Vec<u64> {
    sends(actions).into_iter().flat_map(|(_, ids)| ids).collect()
}

#[test]
fn a_disconnected_peer_is_dialed_with_backoff_and_then_served_in_order() {
    let mut o = outbox();
    let queued: Vec<u64> = (0..3).map(|m| o.enqueue(0, &"a", m).unwrap()).collect();
    let (actions, _) = o.poll(0, &mut none);
    assert_eq!(actions, vec![Action::Dial("a")]);
    assert!(o.poll(MS, &mut none).0.is_empty(), "no second dial before the backoff");
    o.set_connected(&"a", true);
    let (actions, _) = o.poll(2 * MS, &mut none);
    assert_eq!(ids(&actions), queued[..2], "in order, at most max_in_flight");
    let first = sends(&actions)[0].0;
    assert_eq!(o.on_answer(2 * MS, &"a", first, &[Ok(())])[0].outcome, Outcome::Acked);
    assert_eq!(ids(&o.poll(3 * MS, &mut none).0), vec![queued[2]]);
}

#[test]
fn a_backlog_goes_in_batches_within_the_caps_and_each_message_gets_its_verdict() {
    let mut o =
        Outbox::new(OutboxConfig { max_in_flight: 1, max_batch: 3, max_batch_bytes: 250, ..OutboxConfig::default() });
    o.add_peer("a");
    o.set_connected(&"a", true);
    let first = o.enqueue(0, &"a", 1).unwrap();
    let (actions, _) = o.pump(0, &"a", &mut none);
    assert_eq!(ids(&actions), vec![first], "a message leaves alone when a slot is free");
    let send = sends(&actions)[0].0;
    let queued: Vec<u64> = (0..5).map(|m| o.enqueue(0, &"a", m).unwrap()).collect();
    assert!(o.pump(0, &"a", &mut none).0.is_empty(), "no slot free");
    o.on_answer(MS, &"a", send, &[Ok(())]);
    let (actions, _) = o.pump(MS, &"a", &mut none);
    assert_eq!(ids(&actions), queued[..2], "two of 100 bytes fit in 250");
    let send = sends(&actions)[0].0;
    let done = o.on_answer(MS, &"a", send, &[Ok(()), Err("busy".into())]);
    assert_eq!(done.len(), 1, "the refused one is retried");
    assert_eq!(o.counts(&"a").retried, 1);
    let (actions, _) = o.poll(500 * MS, &mut none);
    assert_eq!(ids(&actions), vec![queued[1], queued[2]], "the retry goes first");
}

#[test]
fn an_answer_with_the_wrong_number_of_verdicts_fails_the_send() {
    let mut o = Outbox::new(OutboxConfig { max_batch: 4, ..OutboxConfig::default() });
    o.add_peer("a");
    o.enqueue(0, &"a", 1).unwrap();
    o.enqueue(0, &"a", 2).unwrap();
    o.set_connected(&"a", true);
    let (actions, _) = o.pump(0, &"a", &mut none);
    let send = sends(&actions)[0].0;
    assert!(o.on_answer(0, &"a", send, &[Ok(())]).is_empty(), "both retried");
    assert_eq!((o.counts(&"a").retried, o.counts(&"a").acked), (2, 0));
}

#[test]
fn messages_the_peer_already_has_are_skipped_not_sent() {
    let mut o = outbox();
    o.set_connected(&"a", true);
    o.enqueue(0, &"a", 7).unwrap();
    let kept = o.enqueue(0, &"a", 8).unwrap();
    let (actions, done) = o.pump(0, &"a", &mut |_, m| *m == 7);
    assert_eq!(ids(&actions), vec![kept]);
    assert_eq!(done[0].outcome, Outcome::Skipped);
    assert_eq!(o.counts(&"a").skipped, 1);
}

#[test]
fn a_full_queue_refuses_with_a_reason() {
    let mut o = outbox();
    for m in 0..4 {
        o.enqueue(0, &"a", m).unwrap();
    }
    let refused = o.enqueue(0, &"a", 9).unwrap_err();
    assert_eq!(refused.outcome, Outcome::Failed("queue full".into()));
    assert_eq!(o.counts(&"a").failed, 1);
}

#[test]
fn failures_are_retried_with_growing_backoff_until_acked() {
    let mut o = outbox();
    o.set_connected(&"a", true);
    let id = o.enqueue(0, &"a", 1).unwrap();
    let (send, _) = sends(&o.poll(0, &mut none).0)[0].clone();
    assert!(o.on_failure(0, &"a", send, "stream reset").is_empty(), "retried, not ended");
    assert!(sends(&o.poll(10 * MS, &mut none).0).is_empty(), "waits at least half the base backoff");
    let (actions, _) = o.poll(60 * MS, &mut none);
    assert_eq!(ids(&actions), vec![id]);
    let done = o.on_answer(60 * MS, &"a", sends(&actions)[0].0, &[Ok(())]);
    assert_eq!((done[0].outcome.clone(), done[0].attempts), (Outcome::Acked, 2));
    assert_eq!(o.counts(&"a").retried, 1);
}

#[test]
fn a_message_ends_at_its_deadline_with_the_last_error() {
    let mut o = outbox();
    o.set_connected(&"a", true);
    o.enqueue(0, &"a", 1).unwrap();
    let (send, _) = sends(&o.poll(0, &mut none).0)[0].clone();
    o.on_failure(MS, &"a", send, "connection closed");
    let (_, done) = o.poll(5_001 * MS, &mut none);
    assert_eq!(done.len(), 1);
    match &done[0].outcome {
        Outcome::Failed(why) => assert!(why.contains("deadline") && why.contains("connection closed"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(o.pending(), 0);
}

#[test]
fn a_message_that_never_leaves_the_queue_ends_after_the_queue_wait() {
    let mut o = outbox();
    o.enqueue(0, &"a", 1).unwrap();
    assert!(o.poll(29_000 * MS, &mut none).1.is_empty(), "a peer down for a while keeps its messages");
    let (_, done) = o.poll(30_000 * MS, &mut none);
    assert_eq!(done[0].outcome, Outcome::Failed("never sent: waited too long in the queue".into()));
}

#[test]
fn in_flight_messages_without_an_answer_end_at_the_deadline_and_a_late_answer_is_ignored() {
    let mut o = outbox();
    o.set_connected(&"a", true);
    o.enqueue(0, &"a", 1).unwrap();
    let (send, _) = sends(&o.poll(0, &mut none).0)[0].clone();
    let (_, done) = o.poll(5_001 * MS, &mut none);
    assert_eq!(done.len(), 1);
    assert_eq!(o.counts(&"a").failed, 1);
    assert_eq!(o.streams(&"a"), 0, "its stream slot is free again");
    assert!(o.on_answer(5_002 * MS, &"a", send, &[Ok(())]).is_empty(), "a late answer does not end it twice");
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Step {
        Enqueue(u32),
        Connect(bool),
        Answer(usize, bool),
        Fail(usize),
        Advance(u64),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0u32..20).prop_map(Step::Enqueue),
            1 => any::<bool>().prop_map(Step::Connect),
            3 => (any::<usize>(), any::<bool>()).prop_map(|(i, all)| Step::Answer(i, all)),
            2 => any::<usize>().prop_map(Step::Fail),
            2 => (0u64..2_000).prop_map(|ms| Step::Advance(ms * MS)),
        ]
    }

    proptest! {
        /// Every message enqueued ends exactly once (acked, skipped or failed with a
        /// reason), the caps on sends in flight and on batch size hold, and after the
        /// deadline nothing is left.
        #[test]
        fn every_message_ends_exactly_once(steps in proptest::collection::vec(step(), 1..200)) {
            let mut o: Outbox<u8, u32> = Outbox::new(OutboxConfig {
                max_in_flight: 3, max_batch: 4, max_batch_bytes: 350, queue_per_peer: 12,
                ..OutboxConfig::default()
            });
            o.add_peer(1);
            // The peer "already has" multiples of 7.
            let mut has = |_: &u8, m: &u32| m.is_multiple_of(7);
            let mut now = 0u64;
            let mut open: Vec<u64> = Vec::new();
            let mut in_flight: Vec<(u64, usize)> = Vec::new();
            let mut ended: std::collections::HashSet<u64> = Default::default();
            let end = |d: Done<u8>, ended: &mut std::collections::HashSet<u64>| {
                assert!(ended.insert(d.id), "message {} ended twice", d.id);
            };
            for s in steps {
                let done = match s {
                    Step::Enqueue(m) => match o.enqueue(now, &1, m) {
                        Ok(id) => { open.push(id); Vec::new() }
                        Err(d) => vec![d],
                    },
                    Step::Connect(c) => { o.set_connected(&1, c); Vec::new() }
                    Step::Answer(i, all) if !in_flight.is_empty() => {
                        let (send, n) = in_flight.remove(i % in_flight.len());
                        let verdicts: Vec<Result<(), String>> =
                            (0..n).map(|k| if all || k.is_multiple_of(2) { Ok(()) } else { Err("busy".into()) }).collect();
                        o.on_answer(now, &1, send, &verdicts)
                    }
                    Step::Fail(i) if !in_flight.is_empty() => {
                        let (send, _) = in_flight.remove(i % in_flight.len());
                        o.on_failure(now, &1, send, "reset")
                    }
                    Step::Advance(d) => { now += d; Vec::new() }
                    _ => Vec::new(),
                };
                for d in done { end(d, &mut ended); }
                let (actions, done) = o.poll(now, &mut has);
                for d in done { end(d, &mut ended); }
                for a in actions {
                    if let Action::Send { send, ids, messages, .. } = a {
                        prop_assert!(!ids.is_empty() && ids.len() <= 3, "batch of {}", ids.len());
                        prop_assert!(messages.iter().all(|m| !m.is_multiple_of(7)), "a message the peer has was sent");
                        in_flight.push((send, ids.len()));
                    }
                }
                prop_assert!(o.streams(&1) <= 3);
            }
            // Past every deadline, everything has ended.
            let (_, done) = o.poll(now + 31_000 * MS, &mut has);
            for d in done { end(d, &mut ended); }
            prop_assert_eq!(o.pending(), 0);
            for id in open { prop_assert!(ended.contains(&id), "message {} never ended", id); }
            let c = o.counts(&1);
            prop_assert_eq!(c.acked + c.skipped + c.failed, c.enqueued);
        }
    }
}
