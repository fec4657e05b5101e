//! Which peers send what no honest node forwards, and for how long they are shut out.
//!
//! An honest node checks a transaction with the same stateless rules as ours (decoding, size,
//! signature, chain id) before it forwards it, so one that fails them comes from a broken or
//! hostile peer, and each costs us a decode and a sender recovery. A peer's score rises by one
//! per such transaction and halves every `half_life`; past `limit` the peer is banned for
//! `ban_for`. Refusals by the pool's state (nonce too low, underpriced, pool full) are not
//! counted: honest peers race into those all the time.
//!
//! Pure: times are nanoseconds from the caller's clock.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

/// When a peer is banned, and for how long.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConductConfig {
    /// Malformed transactions (decaying) past which a peer is banned; 0 never bans.
    pub limit: u32,
    /// The score halves every this long.
    pub half_life: Duration,
    /// How long a ban lasts.
    pub ban_for: Duration,
}

impl Default for ConductConfig {
    fn default() -> Self {
        // A peer can keep sending about 11 malformed transactions a second (limit × ln 2 /
        // half-life) without a ban: a few hundred microseconds of our CPU a second. A burst of
        // a thousand bans it at once.
        ConductConfig { limit: 1_000, half_life: Duration::from_secs(60), ban_for: Duration::from_secs(600) }
    }
}

/// Scores and bans, by peer.
#[derive(Debug)]
pub struct Conduct<P> {
    config: ConductConfig,
    /// Score and when it was last brought up to date.
    scores: HashMap<P, (f64, u64)>,
    /// Banned peers and when their ban ends.
    banned: HashMap<P, u64>,
}

impl<P: Hash + Eq + Clone> Conduct<P> {
    /// No scores, no bans.
    pub fn new(config: ConductConfig) -> Self {
        Conduct { config, scores: HashMap::new(), banned: HashMap::new() }
    }

    /// The settings.
    pub fn config(&self) -> ConductConfig {
        self.config
    }

    /// Counts `n` malformed transactions from `peer`; true when this bans it.
    pub fn malformed(&mut self, now: u64, peer: &P, n: u64) -> bool {
        if n == 0 || self.banned.contains_key(peer) {
            return false;
        }
        let score = self.score(now, peer) + n as f64;
        if self.config.limit > 0 && score > self.config.limit as f64 {
            self.scores.remove(peer);
            self.banned.insert(peer.clone(), now.saturating_add(self.config.ban_for.as_nanos() as u64));
            return true;
        }
        self.scores.insert(peer.clone(), (score, now));
        false
    }

    /// `peer`'s score at `now`.
    pub fn score(&self, now: u64, peer: &P) -> f64 {
        let Some(&(score, at)) = self.scores.get(peer) else { return 0.0 };
        let half_lives = now.saturating_sub(at) as f64 / self.config.half_life.as_nanos().max(1) as f64;
        score * 0.5f64.powf(half_lives)
    }

    /// When `peer`'s ban ends, if it is banned.
    pub fn banned_until(&self, peer: &P) -> Option<u64> {
        self.banned.get(peer).copied()
    }

    /// Peers banned now.
    pub fn banned(&self) -> impl Iterator<Item = &P> {
        self.banned.keys()
    }

    /// Ends the bans that are over at `now` and returns those peers; forgets scores that have
    /// decayed to nothing, so the table holds only peers that misbehaved lately.
    pub fn expire(&mut self, now: u64) -> Vec<P> {
        let ended: Vec<P> = self.banned.iter().filter(|(_, until)| **until <= now).map(|(p, _)| p.clone()).collect();
        for peer in &ended {
            self.banned.remove(peer);
        }
        let faded: Vec<P> = self.scores.keys().filter(|p| self.score(now, p) < 0.5).cloned().collect();
        for peer in faded {
            self.scores.remove(&peer);
        }
        ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn conduct(limit: u32) -> Conduct<&'static str> {
        Conduct::new(ConductConfig { limit, half_life: Duration::from_secs(10), ban_for: Duration::from_secs(60) })
    }

    #[test]
    fn a_burst_past_the_limit_bans_until_the_ban_ends() {
        let mut c = conduct(100);
        assert!(!c.malformed(0, &"a", 100), "at the limit is not past it");
        assert!(c.malformed(0, &"a", 1));
        assert_eq!(c.banned_until(&"a"), Some(60 * S));
        assert!(!c.malformed(S, &"a", 1_000), "a banned peer is not banned again");
        assert!(c.expire(59 * S).is_empty());
        assert_eq!(c.expire(60 * S), vec!["a"]);
        assert_eq!(c.banned_until(&"a"), None);
        assert_eq!(c.score(60 * S, &"a"), 0.0, "the ban wiped the score");
    }

    #[test]
    fn the_score_halves_every_half_life_so_a_slow_trickle_is_never_banned() {
        let mut c = conduct(100);
        c.malformed(0, &"a", 80);
        assert!((c.score(10 * S, &"a") - 40.0).abs() < 1e-9);
        assert!((c.score(20 * S, &"a") - 20.0).abs() < 1e-9);
        // 5 a second for ten minutes: the score settles near 5 × 10 / ln 2 ≈ 72 < 100.
        let mut c = conduct(100);
        for second in 0..600 {
            assert!(!c.malformed(second * S, &"a", 5), "banned at {second} s");
        }
        // 10 a second crosses it.
        let mut c = conduct(100);
        assert!((0..600).any(|second| c.malformed(second * S, &"a", 10)));
    }

    #[test]
    fn peers_are_scored_apart_and_faded_scores_are_forgotten() {
        let mut c = conduct(100);
        c.malformed(0, &"a", 90);
        c.malformed(0, &"b", 90);
        assert!(c.malformed(0, &"a", 20));
        assert_eq!(c.banned_until(&"b"), None);
        assert_eq!(c.banned().collect::<Vec<_>>(), vec![&"a"]);
        c.expire(200 * S);
        assert!(c.scores.is_empty(), "{:?}", c.scores);
    }

    #[test]
    fn a_limit_of_zero_never_bans() {
        let mut c = conduct(0);
        assert!(!c.malformed(0, &"a", u32::MAX as u64));
        assert_eq!(c.banned().count(), 0);
    }
}
