//! Which members to try for a call, best first. Pure: a function of the members' state and the
//! call's need, tested without sockets or clocks.

use sluice_chain::BlockNeed;

/// What ordering needs to know of one member, read from its state at the time of the call.
#[derive(Debug, Clone)]
pub struct MemberView {
    /// 0 = primary; higher tiers only when lower ones cannot serve.
    pub tier: u8,
    /// Its method filter lets the method through.
    pub serves: bool,
    /// Its circuit lets a call through now.
    pub circuit_allows: bool,
    /// Its rate limit and daily quota have room.
    pub within_budget: bool,
    /// All its concurrency slots are taken.
    pub busy: bool,
    /// Lower is better (latency, load, failures, weight).
    pub score: f64,
    /// Its latest height, from probes.
    pub head: Option<u64>,
    /// For a call that needs a block hash: whether the member is known to have it.
    pub has_hash: bool,
    /// Its lowest block with the data the call reads (state or chain data), when known.
    pub lowest: Option<u64>,
}

/// The pool's routing rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// A member further behind the best head is not used for head-bound reads.
    pub max_lag: u64,
    /// Head-bound reads go to the members at the best head first (integrity: `latest` does not
    /// go backwards from one call to the next).
    pub highest_first: bool,
    /// A call that needs a block beyond every known head is not sent to members whose head is
    /// below it (an `eth_getLogs` range end: an empty list from there is not evidence):
    /// [`Order::BeyondHead`].
    pub within_heads: bool,
}

/// The members to try, or why there are none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Order {
    /// Member indices, best first.
    Try(Vec<usize>),
    /// Members could serve it, but every one is over its budget.
    OverBudget,
    /// The call needs a block below every available member's lowest: none has it.
    NotCovered {
        /// The lowest block any available member has (of the data the call reads).
        lowest: u64,
    },
    /// With [`Rules::within_heads`]: the call needs a block beyond every member's known head.
    BeyondHead {
        /// The best head.
        head: u64,
    },
}

/// Orders the members for a call that needs `needs`:
/// * left out: members whose filter refuses the method, open circuits, and members over budget;
/// * a head-bound read skips members more than `max_lag` behind the best head;
/// * a call that needs block `n` (or a range up to `n`) goes only to members whose head is at
///   least `n`, while any member's is. One that needs hash `h` goes to members known to have
///   `h`, then to members whose head covers its height (nodes of one pool follow one chain).
///   When no member's known blocks cover the need, every member may be asked, highest head
///   first: probes lag behind the chain, and a node that lacks the block says so (the pool
///   then asks another);
/// * a member whose lowest block is above the lowest one the call needs is never asked (it has
///   pruned it); when that leaves no member, [`Order::NotCovered`];
/// * then by tier, coverage, idle before busy, and score.
pub fn order(needs: &BlockNeed, members: &[MemberView], rules: Rules) -> Order {
    let best = members.iter().filter_map(|m| m.head).max();
    // 0: known to have the block, 1: its head covers it, None: not known to.
    let coverage = |m: &MemberView| -> Option<u8> {
        match needs {
            BlockNeed::Any => Some(0),
            BlockNeed::Head => match (best, m.head) {
                (Some(best), Some(head)) if best.saturating_sub(head) > rules.max_lag => None,
                (Some(best), Some(head)) if rules.highest_first => Some(u8::from(head < best)),
                (Some(_), None) if rules.highest_first => Some(1),
                _ => Some(0),
            },
            BlockNeed::Hash { .. } if m.has_hash => Some(0),
            _ => match (needs.highest(), m.head) {
                (Some(n), Some(head)) if head >= n => Some(1),
                // Not probed yet: it may well have the block.
                (Some(_), None) => Some(1),
                _ => None,
            },
        }
    };
    let pruned = |m: &MemberView| matches!((needs.lowest(), m.lowest), (Some(n), Some(l)) if n < l);
    // No intermediate lists: this runs once per upstream call, and walking the few members
    // again is cheaper than allocating a list of them.
    let available = |m: &&MemberView| m.serves && m.circuit_allows;
    let keeps = || members.iter().enumerate().filter(|(_, m)| available(m) && !pruned(m));
    if keeps().next().is_none() && members.iter().any(|m| available(&m)) {
        let lowest = members.iter().filter(available).filter_map(|m| m.lowest).min().unwrap_or(0);
        return Order::NotCovered { lowest };
    }
    let fallback = needs.is_specific() && keeps().all(|(_, m)| coverage(m).is_none());
    // Only for a need with a height: a member lacking a block hash says so (it does not answer
    // an empty list for it).
    if fallback && rules.within_heads && needs.highest().is_some() && keeps().next().is_some() {
        if let Some(head) = best {
            return Order::BeyondHead { head };
        }
    }
    let mut over_budget = false;
    let mut ranked: Vec<(u8, u8, bool, u64, f64, usize)> = Vec::with_capacity(members.len());
    for (i, m) in keeps() {
        let class = match (coverage(m), fallback) {
            (Some(class), _) => class,
            (None, true) => 2,
            (None, false) => continue,
        };
        if !m.within_budget {
            over_budget = true;
            continue;
        }
        // Among members that are not known to cover the need, higher heads first.
        let behind = match (fallback, best, m.head) {
            (true, Some(best), Some(head)) => best - head.min(best),
            (true, Some(_), None) => u64::MAX,
            _ => 0,
        };
        ranked.push((m.tier, class, m.busy, behind, m.score, i));
    }
    if ranked.is_empty() && over_budget {
        return Order::OverBudget;
    }
    ranked.sort_by(|a, b| {
        a.0.cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)).then(a.3.cmp(&b.3)).then(a.4.total_cmp(&b.4))
    });
    Order::Try(ranked.into_iter().map(|(.., i)| i).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(head: u64, score: f64) -> MemberView {
        MemberView {
            tier: 0,
            serves: true,
            circuit_allows: true,
            within_budget: true,
            busy: false,
            score,
            head: Some(head),
            has_hash: false,
            lowest: None,
        }
    }

    fn tried(order: Order) -> Vec<usize> {
        match order {
            Order::Try(v) => v,
            other => panic!("{other:?}"),
        }
    }

    fn order(needs: &BlockNeed, members: &[MemberView], max_lag: u64) -> Order {
        super::order(needs, members, Rules { max_lag, highest_first: false, within_heads: false })
    }

    #[test]
    fn pruned_members_are_never_asked_for_what_they_dropped() {
        let mut pruned = member(100, 1.0);
        pruned.lowest = Some(90);
        let members = [pruned.clone(), member(100, 9.0)];
        assert_eq!(tried(order(&BlockNeed::Number(50), &members, 5)), [1]);
        assert_eq!(tried(order(&BlockNeed::Number(95), &members, 5)), [0, 1], "recent: both");
        assert_eq!(tried(order(&BlockNeed::Range { from: 80, to: 95 }, &members, 5)), [1]);
        assert_eq!(tried(order(&BlockNeed::Head, &members, 5)), [0, 1]);
        let mut also = pruned.clone();
        also.lowest = Some(70);
        assert_eq!(order(&BlockNeed::Number(50), &[pruned, also], 5), Order::NotCovered { lowest: 70 });
        // Beyond every head and below nobody's bound: asked, highest first.
        assert_eq!(tried(order(&BlockNeed::Number(101), &members, 5)), [0, 1]);
    }

    #[test]
    fn with_highest_first_head_reads_go_to_the_best_head_first() {
        let members = [member(99, 1.0), member(100, 9.0), member(90, 0.1)];
        let rules = Rules { max_lag: 5, highest_first: true, within_heads: false };
        assert_eq!(tried(super::order(&BlockNeed::Head, &members, rules)), [1, 0]);
        assert_eq!(tried(order(&BlockNeed::Head, &members, 5)), [0, 1], "off: by score within the lag");
    }

    #[test]
    fn within_heads_a_range_beyond_every_head_goes_nowhere() {
        let members = [member(99, 1.0), member(100, 9.0)];
        let rules = Rules { max_lag: 5, highest_first: true, within_heads: true };
        let logs = |to| BlockNeed::Range { from: 90, to };
        assert_eq!(super::order(&logs(101), &members, rules), Order::BeyondHead { head: 100 });
        assert_eq!(tried(super::order(&logs(100), &members, rules)), [1]);
        assert_eq!(tried(super::order(&logs(99), &members, rules)), [0, 1]);
        let by_hash = BlockNeed::Hash { hash: "0xab".into(), number: None };
        assert_eq!(tried(super::order(&by_hash, &members, rules)), [1, 0], "a hash: asked, highest first");
    }

    #[test]
    fn best_score_first_within_a_tier_then_higher_tiers() {
        let mut fallback = member(100, 1.0);
        fallback.tier = 1;
        let members = [member(100, 30.0), fallback, member(100, 10.0)];
        assert_eq!(tried(order(&BlockNeed::Any, &members, 5)), [2, 0, 1]);
    }

    #[test]
    fn open_circuits_filters_and_budgets_leave_members_out() {
        let mut open = member(100, 1.0);
        open.circuit_allows = false;
        let mut filtered = member(100, 1.0);
        filtered.serves = false;
        let mut spent = member(100, 1.0);
        spent.within_budget = false;
        let members = [open, filtered.clone(), spent.clone(), member(100, 9.0)];
        assert_eq!(tried(order(&BlockNeed::Any, &members, 5)), [3]);
        assert_eq!(order(&BlockNeed::Any, &[spent, filtered], 5), Order::OverBudget);
        assert_eq!(order(&BlockNeed::Any, &[], 5), Order::Try(vec![]));
    }

    #[test]
    fn head_reads_skip_laggards_and_busy_members_go_last() {
        let mut busy = member(100, 1.0);
        busy.busy = true;
        let members = [member(90, 1.0), busy, member(99, 5.0)];
        assert_eq!(tried(order(&BlockNeed::Head, &members, 5)), [2, 1]);
        assert_eq!(tried(order(&BlockNeed::Any, &members, 5)), [0, 2, 1], "no head needed");
    }

    #[test]
    fn a_block_goes_only_to_members_whose_head_covers_it() {
        let members = [member(50, 1.0), member(80, 9.0), member(79, 2.0)];
        assert_eq!(tried(order(&BlockNeed::Number(80), &members, 5)), [1]);
        assert_eq!(tried(order(&BlockNeed::Number(60), &members, 5)), [2, 1]);
        assert_eq!(tried(order(&BlockNeed::Range { from: 10, to: 79 }, &members, 5)), [2, 1]);
        // Beyond every known head (the block was just mined): everyone, highest head first.
        assert_eq!(tried(order(&BlockNeed::Number(81), &members, 5)), [1, 2, 0]);
        // A member not probed yet may have it.
        let mut unknown = member(0, 1.0);
        unknown.head = None;
        assert_eq!(tried(order(&BlockNeed::Number(80), &[member(80, 9.0), unknown], 5)), [1, 0]);
    }

    #[test]
    fn a_hash_goes_to_members_known_to_have_it() {
        let mut has = member(50, 9.0);
        has.has_hash = true;
        let members = [member(60, 1.0), has];
        let need = |number| BlockNeed::Hash { hash: "0xab".into(), number };
        assert_eq!(tried(order(&need(None), &members, 5)), [1]);
        assert_eq!(tried(order(&need(Some(55)), &members, 5)), [1, 0], "known first, then by height");
        assert_eq!(tried(order(&need(Some(61)), &members, 5)), [1]);
        let unknown = [member(60, 1.0), member(50, 0.5)];
        assert_eq!(tried(order(&need(Some(55)), &unknown, 5)), [0], "by its height");
        assert_eq!(tried(order(&need(None), &unknown, 5)), [0, 1], "nothing known: highest head first");
    }
}
