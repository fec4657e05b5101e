//! When to look at the chain: the pace of its blocks, learned from the heads seen, and the
//! schedule of reads that follows from it. Pure: instants and heights are passed in.
//!
//! A follower that polls on a fixed second spends a call per second per replica whatever the
//! chain does; one that knows the chain makes a block every `T` asks once per block, at the
//! time the next one is due. [`Cadence`] learns `T` (the median of recent gaps, so a missed
//! slot or a burst does not swing it) and answers three questions: how long a subscription may
//! stay silent before the head is polled, and when to poll next when there is no subscription. [`FinalityClock`] says when `safe` and `finalized`
//! can have moved.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Gaps remembered for the median.
const SAMPLES: usize = 9;
/// The shortest block interval believed (bursts of a devnet's automine are not a pace).
const MIN_INTERVAL: Duration = Duration::from_millis(200);
/// The longest: a chain slower than this is polled as if it made a block this often.
const MAX_INTERVAL: Duration = Duration::from_secs(60);
/// How long a subscription may be silent while the pace is not known yet.
const UNKNOWN_SILENCE: Duration = Duration::from_secs(10);

/// The chain's pace, learned from new heads.
#[derive(Debug, Clone)]
pub struct Cadence {
    /// The newest head seen and when it was first seen.
    last: Option<(u64, Instant)>,
    /// Recent gaps per block.
    gaps: VecDeque<Duration>,
    /// The configured poll interval: the cadence while the pace is unknown, and the longest
    /// retry gap while a due block is late.
    poll: Duration,
}

impl Cadence {
    /// A cadence that polls every `poll` until it has learned the chain's pace.
    pub fn new(poll: Duration) -> Self {
        Self { last: None, gaps: VecDeque::with_capacity(SAMPLES), poll: poll.max(Duration::from_millis(50)) }
    }

    /// Records that head `number` was first seen at `at` (lower or equal heads teach nothing).
    pub fn saw(&mut self, number: u64, at: Instant) {
        match self.last {
            Some((last, since)) if number > last => {
                let per_block = at.saturating_duration_since(since) / (number - last).min(u32::MAX as u64) as u32;
                if self.gaps.len() == SAMPLES {
                    self.gaps.pop_front();
                }
                self.gaps.push_back(per_block);
                self.last = Some((number, at));
            }
            Some(_) => {}
            None => self.last = Some((number, at)),
        }
    }

    /// Learns the pace from the chain's own timestamps (seconds): `(number, timestamp)` of
    /// consecutive recent blocks, in any order, e.g. the window backfilled at start. The gaps
    /// between neighbours stand in until gaps seen live replace them.
    pub fn seed(&mut self, blocks: &[(u64, u64)]) {
        let mut blocks = blocks.to_vec();
        blocks.sort_unstable();
        let gaps = blocks.windows(2).filter(|w| w[1].0 == w[0].0 + 1).map(|w| w[1].1.saturating_sub(w[0].1));
        let gaps: Vec<Duration> = gaps.map(Duration::from_secs).collect();
        for gap in gaps.into_iter().rev().take(SAMPLES).rev() {
            if self.gaps.len() == SAMPLES {
                self.gaps.pop_front();
            }
            self.gaps.push_back(gap);
        }
    }

    /// The chain's block interval, once two gaps were seen.
    pub fn interval(&self) -> Option<Duration> {
        if self.gaps.len() < 2 {
            return None;
        }
        let mut sorted: Vec<Duration> = self.gaps.iter().copied().collect();
        sorted.sort();
        Some(sorted[sorted.len() / 2].clamp(MIN_INTERVAL, MAX_INTERVAL))
    }

    /// How long a `newHeads` subscription may stay silent before the head is polled (a node
    /// that skipped a notification, a socket that stalled without closing): about two blocks.
    pub fn silence_limit(&self) -> Duration {
        self.interval().map_or(UNKNOWN_SILENCE, |t| (2 * t).max(self.poll))
    }

    /// When to poll next without a subscription, having last polled at `polled`: one interval
    /// after the newest head was seen (when the next block is due), then, while it is late,
    /// every quarter interval (at most the configured poll interval) — about one call per
    /// block, and a block is seen within that gap of its arrival. A chain without a beat
    /// ([`Self::regular`]) is polled every configured interval.
    pub fn next_poll(&self, polled: Instant) -> Instant {
        let (Some(t), Some((_, seen))) = (self.interval(), self.last) else { return polled + self.poll };
        if !self.regular() {
            return polled + self.poll;
        }
        let due = seen + t;
        if polled < due {
            due
        } else {
            polled + (t / 4).min(self.poll)
        }
    }

    /// Whether blocks come on a beat: a quarter of the recent gaps are at least half the
    /// median. A post-merge chain (a missed slot now and then) is regular; a devnet that
    /// mines when a transaction comes is not, and a block due "one interval after the last"
    /// can come at any time.
    fn regular(&self) -> bool {
        let mut sorted: Vec<Duration> = self.gaps.iter().copied().collect();
        sorted.sort();
        sorted.len() >= 2 && sorted[sorted.len() / 4] * 2 >= sorted[sorted.len() / 2]
    }
}

/// Blocks between reads of `safe` and `finalized` when they keep moving: an epoch of 32 slots,
/// which is how often a post-merge chain moves them.
pub const FINALITY_EVERY: u64 = 32;

/// When to read `safe` and `finalized` again: at the first head, then every
/// [`FINALITY_EVERY`] blocks while a read finds them moved, up to eight times as far apart
/// while they stay put (a devnet that never finalizes, a chain that finalizes rarely).
#[derive(Debug, Clone)]
pub struct FinalityClock {
    read_at: Option<u64>,
    every: u64,
    seen: Option<(Option<u64>, Option<u64>)>,
}

impl Default for FinalityClock {
    fn default() -> Self {
        Self { read_at: None, every: FINALITY_EVERY, seen: None }
    }
}

impl FinalityClock {
    /// Whether to read them at head `head`.
    pub fn due(&self, head: u64) -> bool {
        self.read_at.is_none_or(|at| head >= at.saturating_add(self.every) || head < at)
    }

    /// Records a read at `head` that found `safe` and `finalized`.
    pub fn read(&mut self, head: u64, safe: Option<u64>, finalized: Option<u64>) {
        let moved = self.seen.is_none_or(|seen| seen != (safe, finalized));
        self.every = if moved { FINALITY_EVERY } else { (self.every * 2).min(FINALITY_EVERY * 8) };
        self.seen = Some((safe, finalized));
        self.read_at = Some(head);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn learns_the_median_gap_per_block() {
        let start = Instant::now();
        let mut c = Cadence::new(ms(1000));
        assert_eq!(c.interval(), None);
        assert_eq!(c.silence_limit(), UNKNOWN_SILENCE);
        // 2 s blocks, one missed slot (4 s for two blocks counts as 2 s each), one late block.
        for (number, at) in [(1, 0), (2, 2000), (4, 6000), (5, 8000), (6, 11_000), (7, 13_000)] {
            c.saw(number, start + ms(at));
        }
        assert_eq!(c.interval(), Some(ms(2000)));
        assert_eq!(c.silence_limit(), ms(4000));
        c.saw(7, start + ms(20_000)); // the same head again teaches nothing
        assert_eq!(c.interval(), Some(ms(2000)));
    }

    #[test]
    fn polls_when_the_next_block_is_due_then_a_quarter_block_apart() {
        let start = Instant::now();
        let mut c = Cadence::new(ms(1000));
        assert_eq!(c.next_poll(start), start + ms(1000), "the configured interval while the pace is unknown");
        for n in 0..4 {
            c.saw(n, start + ms(n * 2000));
        }
        let seen = start + ms(6000);
        assert_eq!(c.next_poll(seen), seen + ms(2000), "one block after the last was seen");
        let late = seen + ms(2000);
        assert_eq!(c.next_poll(late), late + ms(500), "a quarter block while it is late");
        let mut slow = Cadence::new(ms(1000));
        for n in 0..4 {
            slow.saw(n, start + ms(n * 12_000));
        }
        let late = start + ms(48_000);
        assert_eq!(slow.next_poll(late), late + ms(1000), "never a longer gap than configured");
    }

    #[test]
    fn the_pace_is_bounded_both_ways() {
        let start = Instant::now();
        let mut burst = Cadence::new(ms(1000));
        for n in 0..5 {
            burst.saw(n, start + ms(n));
        }
        assert_eq!(burst.interval(), Some(MIN_INTERVAL));
        let mut idle = Cadence::new(ms(1000));
        for n in 0..5 {
            idle.saw(n, start + Duration::from_secs(n * 600));
        }
        assert_eq!(idle.interval(), Some(MAX_INTERVAL));
    }

    #[test]
    fn the_pace_is_known_at_once_from_the_timestamps_of_the_window() {
        let mut c = Cadence::new(ms(1000));
        // Twelve-second blocks, one missed slot, newest first as a backfill reads them.
        let blocks: Vec<(u64, u64)> =
            vec![(105, 1_000_072), (104, 1_000_048), (103, 1_000_036), (102, 1_000_024), (101, 1_000_012)];
        c.seed(&blocks);
        assert_eq!(c.interval(), Some(Duration::from_secs(12)));
        // Blocks that are not neighbours say nothing of the gap between them.
        let mut sparse = Cadence::new(ms(1000));
        sparse.seed(&[(1, 0), (5, 100), (9, 200)]);
        assert_eq!(sparse.interval(), None);
    }

    #[test]
    fn a_chain_without_a_beat_is_polled_at_the_configured_interval() {
        let start = Instant::now();
        // A devnet mining on demand: gaps of 1, 30, 2, 45, 3 and 60 seconds.
        let mut c = Cadence::new(ms(1000));
        let mut at = start;
        for (n, gap) in [0, 1, 30, 2, 45, 3, 60].into_iter().enumerate() {
            at += Duration::from_secs(gap);
            c.saw(n as u64, at);
        }
        assert_eq!(c.next_poll(at), at + ms(1000), "a block can come at any time");
        // A post-merge chain with a missed slot: still on its beat.
        let mut beat = Cadence::new(ms(1000));
        for (n, slot) in [0, 1, 2, 4, 5, 6].into_iter().enumerate() {
            beat.saw(n as u64, start + Duration::from_secs(slot * 12));
        }
        let seen = start + Duration::from_secs(72);
        assert_eq!(beat.next_poll(seen), seen + Duration::from_secs(12));
    }

    #[test]
    fn finality_is_read_once_an_epoch_and_less_while_it_stays_put() {
        let mut f = FinalityClock::default();
        assert!(f.due(100), "the first head");
        f.read(100, Some(90), Some(60));
        assert!(!f.due(131));
        assert!(f.due(132));
        f.read(132, Some(120), Some(96));
        assert!(!f.due(163) && f.due(164), "moved: again in an epoch");
        f.read(164, Some(120), Some(96));
        assert!(!f.due(164 + 63) && f.due(164 + 64), "stayed: twice as far");
        for _ in 0..10 {
            let at = 1000;
            f.read(at, Some(120), Some(96));
        }
        assert!(!f.due(1000 + 255) && f.due(1000 + 256), "at most eight epochs apart");
        assert!(f.due(999), "a head below the last read (a reorg) reads again");
        f.read(2000, Some(1900), Some(1800));
        assert!(f.due(2032), "moved again: back to an epoch");
    }
}
