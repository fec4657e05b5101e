//! Which blocks a member can serve: its lowest block with state and its lowest block with
//! chain data (headers, bodies, receipts), declared in config or learned by probing and from
//! its answers. Pure: heights are passed in.
//!
//! A pruned node keeps a window of recent states that moves with its head, so a learned bound
//! is kept as a distance from the head it was learned at: the bound moves up as the head does,
//! instead of going stale. An archive (lowest 0) stays at 0.

/// What a call reads at its block (see [`sluice_chain::reads_state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Data {
    /// Balances, code, storage, calls: what pruned nodes drop first.
    State,
    /// Headers, bodies, receipts, logs.
    Blocks,
}

impl Data {
    /// What `method` reads.
    pub fn of(method: &str) -> Data {
        if sluice_chain::method_info(method).reads_state() {
            Data::State
        } else {
            Data::Blocks
        }
    }

    /// Lower-case name, for `/status`, logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Data::State => "state",
            Data::Blocks => "blocks",
        }
    }
}

/// What the operator declared about a member's history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum History {
    /// Nothing: learned by probing and from answers.
    #[default]
    Unknown,
    /// Every block and every state (`archive = true`).
    Archive,
    /// The last `n` blocks' states (`history = n`); chain data learned.
    Recent(u64),
}

/// One lower bound, as learned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Bound {
    lowest: u64,
    /// The member's head when it was learned: a pruned window moves with the head.
    at_head: u64,
}

impl Bound {
    fn at(self, head: Option<u64>) -> u64 {
        if self.lowest == 0 {
            return 0; // nothing pruned: an archive stays one
        }
        let window = self.at_head.saturating_sub(self.lowest);
        match head {
            Some(head) if head > self.at_head => self.lowest.max(head.saturating_sub(window)),
            _ => self.lowest,
        }
    }
}

/// A member's block availability.
#[derive(Debug, Clone, Default)]
pub struct Availability {
    declared: History,
    state: Option<Bound>,
    blocks: Option<Bound>,
    /// Times its bound was raised by an answer ("pruned", "missing block"), for `/status`.
    pub raised: u64,
}

impl Availability {
    /// Starts from what was declared.
    pub fn new(declared: History) -> Self {
        Self { declared, ..Self::default() }
    }

    /// Whether probing can teach anything: not for an archive.
    pub fn wants_probe(&self) -> bool {
        self.declared != History::Archive
    }

    /// Its lowest block with `data` when its head is `head`; `None`: not known (assume it
    /// has every block up to its head).
    pub fn lowest(&self, data: Data, head: Option<u64>) -> Option<u64> {
        match (self.declared, data) {
            (History::Archive, _) => Some(0),
            (History::Recent(n), Data::State) => head.map(|h| h.saturating_sub(n)),
            (_, Data::State) => self.state.map(|b| b.at(head)),
            (_, Data::Blocks) => self.blocks.map(|b| b.at(head)),
        }
    }

    /// Records a probe's finding: the lowest block with `data` is `lowest` at head `head`.
    pub fn learned(&mut self, data: Data, lowest: u64, head: u64) {
        let bound = Some(Bound { lowest: lowest.min(head), at_head: head });
        match data {
            Data::State => self.state = bound,
            Data::Blocks => self.blocks = bound,
        }
    }

    /// The member said it lacks block `n`'s `data` while its head is `head`: when `n` is
    /// below its head (so not a block it has yet to import), its bound rises above `n`.
    /// Gives whether it rose.
    pub fn lacks(&mut self, data: Data, n: u64, head: Option<u64>) -> bool {
        let Some(head) = head else { return false };
        if n >= head || self.declared == History::Archive {
            return false;
        }
        if self.lowest(data, Some(head)).is_some_and(|l| l > n) {
            return false;
        }
        let bound = Some(Bound { lowest: n + 1, at_head: head });
        match data {
            Data::State => self.state = bound,
            Data::Blocks => self.blocks = bound,
        }
        self.raised += 1;
        true
    }
}

/// A bounded binary search for the lowest block a member has, assuming that it has every block
/// from that one up to its head. Pure: the caller asks the member about [`Search::next`] and
/// reports with [`Search::record`]; at most `2 + log2(head)` questions.
#[derive(Debug, Clone)]
pub struct Search {
    /// Highest height known to be missing (`None`: none yet).
    missing: Option<u64>,
    /// Lowest height known to be present.
    present: u64,
    asked_zero: bool,
}

impl Search {
    /// A search below `head`, which the member is taken to have.
    pub fn new(head: u64) -> Self {
        Self { missing: None, present: head, asked_zero: false }
    }

    /// The next height to ask about, or `None` when the search is done.
    pub fn next(&self) -> Option<u64> {
        if !self.asked_zero {
            // Most nodes are archives or full from genesis: one question settles it.
            return (self.present > 0).then_some(0);
        }
        let missing = self.missing?;
        (self.present - missing > 1).then(|| missing + (self.present - missing) / 2)
    }

    /// Whether the member has height `n`.
    pub fn record(&mut self, n: u64, has: bool) {
        if n == 0 {
            self.asked_zero = true;
        }
        if has {
            self.present = self.present.min(n);
        } else {
            self.missing = Some(self.missing.map_or(n, |m| m.max(n)));
        }
    }

    /// The lowest height found so far.
    pub fn lowest(&self) -> u64 {
        self.present
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn search(head: u64, lowest: u64) -> (u64, usize) {
        let mut s = Search::new(head);
        let mut asked = 0;
        while let Some(n) = s.next() {
            asked += 1;
            s.record(n, n >= lowest);
            assert!(asked < 70, "bounded");
        }
        (s.lowest(), asked)
    }

    #[test]
    fn the_search_finds_the_lowest_block_in_few_questions() {
        assert_eq!(search(40, 0), (0, 1), "an archive: one question");
        assert_eq!(search(40, 30).0, 30);
        assert_eq!(search(40, 40).0, 40);
        assert_eq!(search(0, 0), (0, 0));
        let (found, asked) = search(21_000_000, 20_999_872);
        assert_eq!(found, 20_999_872);
        assert!(asked <= 27, "{asked} questions");
        for lowest in 0..=64 {
            assert_eq!(search(64, lowest).0, lowest);
        }
    }

    #[test]
    fn a_learned_pruned_window_moves_with_the_head() {
        let mut a = Availability::new(History::Unknown);
        assert_eq!(a.lowest(Data::State, Some(40)), None, "unknown until learned");
        a.learned(Data::State, 30, 40);
        a.learned(Data::Blocks, 0, 40);
        assert_eq!(a.lowest(Data::State, Some(40)), Some(30));
        assert_eq!(a.lowest(Data::State, Some(50)), Some(40), "ten states kept");
        assert_eq!(a.lowest(Data::Blocks, Some(50)), Some(0), "an archive of blocks stays one");
        assert_eq!(Availability::new(History::Recent(128)).lowest(Data::State, Some(1000)), Some(872));
        assert_eq!(Availability::new(History::Archive).lowest(Data::State, Some(1000)), Some(0));
    }

    #[test]
    fn an_answer_that_lacks_an_old_block_raises_the_bound_but_a_new_one_does_not() {
        let mut a = Availability::new(History::Unknown);
        assert!(!a.lacks(Data::State, 45, Some(40)), "not imported yet: not evidence of pruning");
        assert!(!a.lacks(Data::State, 40, Some(40)));
        assert!(a.lacks(Data::State, 12, Some(40)));
        assert_eq!(a.lowest(Data::State, Some(40)), Some(13));
        assert!(!a.lacks(Data::State, 5, Some(40)), "already below the bound");
        assert_eq!(a.raised, 1);
        let mut archive = Availability::new(History::Archive);
        assert!(!archive.lacks(Data::State, 5, Some(40)));
    }
}
