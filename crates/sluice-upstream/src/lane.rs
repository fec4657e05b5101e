//! Which serving lane the current thread is.
//!
//! The gateway serves client connections on lanes: threads that each drive their own
//! connections from the first byte to the last (`sluice_gateway::lanes`). A lane also keeps its
//! own keep-alive connections to the nodes ([`Connections`](crate::Connections) holds an idle
//! stack per lane), so that a call and the node connection it goes out on are driven by the
//! same thread: no wake-up crosses to another thread on the way out or back. Threads that are
//! not lanes (the shared runtime's workers: probes, head tracking, the mempool) are lane 0.

use std::cell::Cell;

/// How many lanes keep connections apart; lane numbers past it share stacks (modulo), which
/// stays correct and only costs locality.
pub const LANE_SLOTS: usize = 64;

thread_local! {
    static LANE: Cell<usize> = const { Cell::new(0) };
}

/// The lane this thread serves: 0 on threads that are not lanes, else `1..LANE_SLOTS`.
pub fn current() -> usize {
    LANE.with(Cell::get)
}

/// Marks this thread as lane `n` (counted from 1; 0 marks it as no lane), for the rest of its
/// life.
pub fn enter(n: usize) {
    let slot = if n == 0 { 0 } else { 1 + (n - 1) % (LANE_SLOTS - 1) };
    LANE.with(|lane| lane.set(slot));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_map_to_slots_and_other_threads_are_lane_zero() {
        assert_eq!(current(), 0);
        enter(3);
        assert_eq!(current(), 3);
        // Another thread has its own mark.
        assert_eq!(std::thread::spawn(current).join().ok(), Some(0));
        enter(LANE_SLOTS - 1);
        assert_eq!(current(), LANE_SLOTS - 1);
        enter(LANE_SLOTS);
        assert_eq!(current(), 1, "lane numbers wrap onto 1..LANE_SLOTS, never onto lane 0");
        enter(0);
        assert_eq!(current(), 0);
    }
}
