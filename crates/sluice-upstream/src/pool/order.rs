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
}

/// The members to try, or why there are none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Order {
    /// Member indices, best first.
    Try(Vec<usize>),
    /// Members could serve it, but every one is over its budget.
    OverBudget,
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
/// * then by tier, coverage, idle before busy, and score.
pub fn order(needs: &BlockNeed, members: &[MemberView], max_lag: u64) -> Order {
    let best = members.iter().filter_map(|m| m.head).max();
    // 0: known to have the block, 1: its head covers it, None: not known to.
    let coverage = |m: &MemberView| -> Option<u8> {
        match needs {
            BlockNeed::Any => Some(0),
            BlockNeed::Head => match (best, m.head) {
                (Some(best), Some(head)) => (best.saturating_sub(head) <= max_lag).then_some(0),
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
    let available = (0..members.len()).filter(|&i| members[i].serves && members[i].circuit_allows);
    let classed: Vec<(usize, Option<u8>)> = available.map(|i| (i, coverage(&members[i]))).collect();
    let fallback = needs.is_specific() && classed.iter().all(|(_, c)| c.is_none());
    let mut over_budget = false;
    let mut ranked: Vec<(u8, u8, bool, u64, f64, usize)> = Vec::with_capacity(classed.len());
    for (i, class) in classed {
        let class = match (class, fallback) {
            (Some(class), _) => class,
            (None, true) => 2,
            (None, false) => continue,
        };
        let m = &members[i];
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
        }
    }

    fn tried(order: Order) -> Vec<usize> {
        match order {
            Order::Try(v) => v,
            Order::OverBudget => panic!("over budget"),
        }
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
