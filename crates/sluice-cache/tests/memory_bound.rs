//! The memory tier's bound is the memory it holds: filled well past `memory_bytes` with
//! distinct small answers (the common miss: a balance at a block), the process grows by about
//! `memory_bytes`, not a multiple of it. Measured as the process's resident memory, under the
//! allocator the `sluice` binary uses.

use std::sync::Arc;

use sluice_cache::{Entry, MemoryTier};
use sluice_jsonrpc::RawValue;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Resident bytes of this process.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).expect("resident pages");
    pages * 4096
}

/// A cache key and an answer of `size` bytes, as `eth_getBalance` at a block makes them
/// (`size` 0: a balance, about 12 bytes; larger: a transaction or a receipt).
fn answer(i: u64, size: usize) -> (String, Entry) {
    let key = format!(r#"eth_getBalance["0x{i:040x}","0x{:064x}"]"#, i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let text = match size {
        0 => format!("\"{:#x}\"", i * 1_000_000_007),
        n => format!("\"{i:x}{}\"", "a".repeat(n)),
    };
    let result: Arc<RawValue> = RawValue::from_string(text).expect("json").into();
    (key, Entry { result, max_block: None })
}

/// Fills a tier of `bound` bytes with four times what it holds; the tier and the process's
/// growth over the bound.
fn fill(bound: u64, size: usize) -> (MemoryTier, f64) {
    let tier = MemoryTier::new(bound);
    let before = rss();
    let weight = u64::from(MemoryTier::weight(&answer(1, size).1));
    let count = 4 * bound / weight;
    for i in 0..count {
        let (key, entry) = answer(i, size);
        tier.insert(key, entry);
        if i % 4096 == 0 {
            tier.weighted_size(); // moka's maintenance, as the live cache's traffic runs it
        }
    }
    let held = tier.weighted_size();
    let grown = rss().saturating_sub(before) as f64 / bound as f64;
    eprintln!(
        "answers of {size} bytes: {count} offered; the tier counts {held} bytes ({:.0} % of its bound); the \
         process grew by {grown:.2} × the bound",
        held as f64 * 100.0 / bound as f64,
    );
    assert!(held <= bound, "the tier's own count is over its bound: {held}");
    assert!(held >= bound / 2, "the tier was not filled: {held} of {bound}");
    (tier, grown)
}

#[test]
fn a_tier_filled_past_its_bound_holds_about_its_bound() {
    const BOUND: u64 = 16 << 20;
    // The smallest answers first: their overhead is the largest share. Each tier is kept while
    // the next is filled, so that none is measured in memory another freed.
    let mut tiers = Vec::new();
    for size in [0, 600] {
        let (tier, grown) = fill(BOUND, size);
        tiers.push(tier);
        assert!(grown <= 1.2, "answers of {size} bytes: the process grew by {grown:.2} × the bound");
        assert!(grown >= 0.7, "answers of {size} bytes: the tier held only {grown:.2} × its bound (overweighed)");
    }
}
