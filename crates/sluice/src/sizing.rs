//! The memory to size a container for, from the configuration: the sum of terms each measured
//! by a command (`bash bench/memory.sh`; the cache's factor by `cargo test -p sluice-cache
//! --test memory_bound`), printed by `sluice config validate`. Pure: configuration in, bytes
//! out. The figures are this project's measurements on its benchmark machine
//! (docs/operations.md#memory); the formula is the part that carries to other machines.

use crate::config::LimitsConfig;
use crate::networks::NetworkConfig;

/// Resident memory of sluice serving one network with the default configuration, idle
/// (38.7 MiB measured).
pub const IDLE: u64 = 40 << 20;
/// Each network beyond the first, idle (7.3 MiB measured).
pub const PER_NETWORK: u64 = 8 << 20;
/// The memory tier's resident cost over `memory_bytes`, at most (1.12 measured with the
/// smallest answers, 1.00 with 600-byte ones), in percent.
pub const CACHE_PERCENT: u64 = 115;
/// One WebSocket client holding a `newHeads` and a logs subscription (16.6 KiB measured with
/// 1,000 clients; 7.5 KiB with 2,000 in `sluice bench report`: the larger figure is kept).
pub const PER_WS_CLIENT: u64 = 17 << 10;
/// One transaction held in the mempool (2,082 bytes measured with transfers; larger calldata
/// adds its own size).
pub const PER_POOLED_TX: u64 = 2_100;

/// One term of the estimate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    /// What it counts, with the configuration it comes from.
    pub what: String,
    /// Bytes.
    pub bytes: u64,
}

/// The estimate for a configuration: its terms, largest first.
pub fn estimate(networks: &[NetworkConfig], limits: &LimitsConfig) -> Vec<Term> {
    let mut terms = vec![Term { what: "idle, first network".into(), bytes: IDLE }];
    if networks.len() > 1 {
        let more = networks.len() as u64 - 1;
        terms.push(Term { what: format!("{more} more network(s), idle"), bytes: more * PER_NETWORK });
    }
    for net in networks {
        if net.cache.enabled {
            terms.push(Term {
                what: format!("{}: cache, memory_bytes {} × {CACHE_PERCENT} %", net.id, net.cache.memory_bytes),
                bytes: net.cache.memory_bytes * CACHE_PERCENT / 100,
            });
        }
        if net.mempool.enabled {
            let slots = net.mempool.global_slots as u64;
            terms.push(Term {
                what: format!("{}: mempool, global_slots {slots} transfers", net.id),
                bytes: slots * PER_POOLED_TX,
            });
        }
    }
    let clients = limits.max_connections as u64;
    terms.push(Term {
        what: format!("WebSocket clients, max_connections {clients}, each with two subscriptions"),
        bytes: clients * PER_WS_CLIENT,
    });
    terms.sort_by_key(|t| std::cmp::Reverse(t.bytes));
    terms
}

/// The estimate as lines for people: each term, then the total, in MiB.
pub fn render(terms: &[Term]) -> String {
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let mut out = String::from("memory estimate (docs/operations.md#memory):\n");
    for t in terms {
        out.push_str(&format!("  {:>8.1} MiB  {}\n", mib(t.bytes), t.what));
    }
    let total: u64 = terms.iter().map(|t| t.bytes).sum();
    out.push_str(&format!(
        "  {:>8.1} MiB  in all: a container limit at least this, plus headroom for bursts\n",
        mib(total)
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_grows_with_what_the_configuration_bounds() {
        let config = crate::config::parse_toml("[[upstreams]]\nurl = \"http://127.0.0.1:8545\"\n").expect("a config");
        let networks = config.networks().expect("the implicit network");
        let base: u64 = estimate(&networks, &config.limits).iter().map(|t| t.bytes).sum();
        let mut bigger = config.clone();
        bigger.cache.memory_bytes *= 2;
        let more: u64 =
            estimate(&bigger.networks().expect("the implicit network"), &bigger.limits).iter().map(|t| t.bytes).sum();
        assert_eq!(more - base, config.cache.memory_bytes * CACHE_PERCENT / 100);
        let text = render(&estimate(&networks, &config.limits));
        assert!(text.contains("cache, memory_bytes 268435456"), "{text}");
        assert!(text.contains("in all"), "{text}");
    }
}
