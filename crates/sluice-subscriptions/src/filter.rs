//! Log filters of `eth_subscribe("logs", filter)`, matched as geth matches them.
//!
//! sluice serves a filter itself only when it can match it exactly: an object with at most
//! `address` (one address or a list) and `topics` (at most four positions, each `null`, one
//! topic, or a list of topics; a list holding `null` or an empty list matches anything). Any
//! other key (`fromBlock`, `toBlock`, `blockHash`), a malformed value or too many topics is not
//! parsed, and the subscription is relayed so the node answers it by its own rules.
//!
//! Nodes disagree on one shape, which is relayed too: a filter whose last topic position is a
//! wildcard (`[null, null]`, `[[a, null]]`). geth requires a log to have at least as many
//! topics as the filter has positions; nodes built on alloy's filter (reth, anvil) keep four
//! positions and match a trailing wildcard against a log without that topic.

use serde_json::Value;

/// Positions a filter may name (geth's `maxTopics`).
pub const MAX_TOPICS: usize = 4;
/// Addresses a filter may list before it is left to the node.
pub const MAX_ADDRESSES: usize = 1000;

/// A 20-byte address.
pub type Address = [u8; 20];
/// A 32-byte topic.
pub type Topic = [u8; 32];

/// A parsed logs filter.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LogFilter {
    /// Empty matches every address.
    addresses: Vec<Address>,
    /// One entry per position; an empty entry matches anything there.
    topics: Vec<Vec<Topic>>,
}

/// What a filter looks at in a log.
pub trait LogFields {
    /// The emitting contract.
    fn address(&self) -> &Address;
    /// The log's topics, in order.
    fn topics(&self) -> &[Topic];
}

impl LogFilter {
    /// Parses the filter of `["logs", filter]`; `None` when sluice should not serve it.
    /// A missing filter (`["logs"]`) matches every log.
    pub fn parse(filter: Option<&Value>) -> Option<LogFilter> {
        let Some(filter) = filter else { return Some(LogFilter { addresses: Vec::new(), topics: Vec::new() }) };
        let object = filter.as_object()?;
        if object.keys().any(|k| k != "address" && k != "topics") {
            return None;
        }
        let addresses = match object.get("address") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::String(s)) => vec![parse_hex::<20>(s)?],
            Some(Value::Array(list)) if list.len() <= MAX_ADDRESSES => {
                list.iter().map(|a| a.as_str().and_then(parse_hex::<20>)).collect::<Option<Vec<_>>>()?
            }
            Some(_) => return None,
        };
        let topics = match object.get("topics") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(positions)) if positions.len() <= MAX_TOPICS => {
                let topics = positions.iter().map(parse_position).collect::<Option<Vec<Vec<Topic>>>>()?;
                if topics.last().is_some_and(Vec::is_empty) {
                    return None; // a trailing wildcard: geth and alloy-based nodes differ
                }
                topics
            }
            Some(_) => return None,
        };
        Some(LogFilter { addresses, topics })
    }

    /// geth's `filterLogs` test, without the block range (never part of a served filter).
    pub fn matches(&self, log: &impl LogFields) -> bool {
        if !self.addresses.is_empty() && !self.addresses.contains(log.address()) {
            return false;
        }
        let topics = log.topics();
        if self.topics.len() > topics.len() {
            return false;
        }
        self.topics.iter().zip(topics).all(|(wanted, topic)| wanted.is_empty() || wanted.contains(topic))
    }
}

/// One topic position: `null`, a topic, or a list (a `null` inside makes it a wildcard, as in
/// geth's filter decoding).
fn parse_position(position: &Value) -> Option<Vec<Topic>> {
    match position {
        Value::Null => Some(Vec::new()),
        Value::String(s) => Some(vec![parse_hex::<32>(s)?]),
        Value::Array(list) => {
            let mut topics = Vec::with_capacity(list.len());
            for item in list {
                match item {
                    Value::Null => return Some(Vec::new()),
                    Value::String(s) => topics.push(parse_hex::<32>(s)?),
                    _ => return None,
                }
            }
            Some(topics)
        }
        _ => None,
    }
}

/// `0x` and exactly `2 * N` hex digits, either case.
pub fn parse_hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    let digits = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X"))?.as_bytes();
    if digits.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        let hi = (pair[0] as char).to_digit(16)?;
        let lo = (pair[1] as char).to_digit(16)?;
        out[i] = (hi * 16 + lo) as u8;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct Log(Address, Vec<Topic>);
    impl LogFields for Log {
        fn address(&self) -> &Address {
            &self.0
        }
        fn topics(&self) -> &[Topic] {
            &self.1
        }
    }

    fn hex(byte: u8, n: usize) -> String {
        format!("0x{}", format!("{byte:02x}").repeat(n))
    }

    fn log(address: u8, topics: &[u8]) -> Log {
        Log([address; 20], topics.iter().map(|t| [*t; 32]).collect())
    }

    fn filter(value: Value) -> LogFilter {
        LogFilter::parse(Some(&value)).expect("a served filter")
    }

    #[test]
    fn addresses_and_topic_positions_match_as_geth_does() {
        let any = LogFilter::parse(None).unwrap();
        assert!(any.matches(&log(1, &[])));
        assert!(filter(json!({})).matches(&log(1, &[2])));
        let one = filter(json!({"address": hex(1, 20)}));
        assert!(one.matches(&log(1, &[])) && !one.matches(&log(2, &[])));
        let list = filter(json!({"address": [hex(1, 20), hex(3, 20).to_uppercase().replace("0X", "0x")]}));
        assert!(list.matches(&log(3, &[])) && !list.matches(&log(2, &[])));
        // Positions: null is a wildcard, a list is an OR, more positions than topics never match.
        let second = filter(json!({"topics": [null, hex(0xbb, 32)]}));
        assert!(second.matches(&log(1, &[0xaa, 0xbb])) && second.matches(&log(1, &[0xcc, 0xbb, 0xdd])));
        assert!(!second.matches(&log(1, &[0xbb])) && !second.matches(&log(1, &[0xbb, 0xaa])));
        let or = filter(json!({"topics": [[hex(0xaa, 32), hex(0xcc, 32)]]}));
        assert!(or.matches(&log(1, &[0xcc])) && !or.matches(&log(1, &[0xbb])) && !or.matches(&log(1, &[])));
        let wild = filter(json!({"topics": [[hex(0xaa, 32), null], [], [hex(0xcc, 32)]]}));
        assert!(wild.matches(&log(1, &[0xbb, 0xdd, 0xcc])) && !wild.matches(&log(1, &[0xbb, 0xdd])));
        let fourth = filter(json!({"topics": [null, null, null, hex(4, 32)]}));
        assert!(fourth.matches(&log(1, &[1, 2, 3, 4])) && !fourth.matches(&log(1, &[1, 2, 3])));
    }

    #[test]
    fn what_sluice_cannot_match_exactly_is_left_to_the_node() {
        for refused in [
            json!({"fromBlock": "0x1"}),
            json!({"blockHash": hex(1, 32)}),
            json!({"address": "0xzz"}),
            json!({"address": hex(1, 19)}),
            json!({"address": 5}),
            json!({"topics": [null, null, null, null, null]}),
            json!({"topics": [null]}),
            json!({"topics": [hex(1, 32), []]}),
            json!({"topics": [hex(1, 32), [hex(2, 32), null]]}),
            json!({"topics": [hex(1, 31)]}),
            json!({"topics": [[1]]}),
            json!({"topics": "x"}),
            json!("x"),
            json!([]),
        ] {
            assert_eq!(LogFilter::parse(Some(&refused)), None, "{refused}");
        }
    }
}
