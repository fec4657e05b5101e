//! Networks: one sluice serves several chains, each with a pipeline of its own, found by the
//! request path. [`resolve`] is the pure part: path in, network and API key out.
//!
//! Paths, with `[[networks]]` configured (named networks):
//! * `/{id}` and `/{id}/{key}`: the network whose id is `{id}` (`/eth`, `/base/KEY`);
//! * `/evm/{chainId}` and `/evm/{chainId}/{key}`: the network of that decimal chain id;
//! * `/`: the default network (the only one, or the one marked `default = true`).
//!
//! A single implicit network (no `[[networks]]`) keeps the paths it always had: `/` and `/{key}`
//! (and `/evm/{chainId}` when its entry has a chain id; `sluice serve` gives it none).

use std::sync::Arc;

use sluice_upstream::Upstreams;

use crate::pipeline::Pipeline;
use crate::{LocalFeeds, StatusBoard};

/// Paths the gateway answers itself; never a network id nor an API key.
pub const OPERATOR_PATHS: &[&str] = &["health", "ready", "metrics", "status"];

/// Ids a network may not take: the operator paths and `evm` (the chain-id paths).
pub const RESERVED_IDS: &[&str] = &["health", "ready", "metrics", "status", "evm"];

/// One network as the gateway serves it.
pub struct Network {
    /// Its id, the path alias (`eth`); `default` for the implicit single network.
    pub id: Arc<str>,
    /// Its chain id, when known.
    pub chain_id: Option<u64>,
    /// Its request pipeline (HTTP and WebSocket alike).
    pub pipeline: Pipeline,
    /// Where its relayed `eth_subscribe` go: one shared socket to an upstream, if it has one.
    pub relay: Option<Arc<sluice_subscriptions::SharedRelay>>,
    /// Subscriptions answered locally (its mempool's pending transactions).
    pub local_feeds: Option<Arc<dyn LocalFeeds>>,
    /// What `/ready` asks for this network (its upstream pool, below every cache).
    pub readiness: Arc<dyn Upstreams>,
    /// Its part of `/status`.
    pub status: StatusBoard,
}

/// What the gateway needs to know of a network to find it by path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its id.
    pub id: String,
    /// Its chain id, when known.
    pub chain_id: Option<u64>,
}

/// The networks by path: their entries, which one `/` serves, and whether they were named.
#[derive(Debug, Clone, Default)]
pub struct Directory {
    /// The networks, in configuration order.
    pub entries: Vec<Entry>,
    /// The one `/` serves.
    pub default: Option<usize>,
    /// True with `[[networks]]`; false for the implicit single network (`/{key}` paths).
    pub named: bool,
}

/// Where a JSON-RPC path goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathTarget<'a> {
    /// Network `network` (an index into the directory), with the API key the path carries.
    Rpc {
        /// The network's index.
        network: usize,
        /// The key in the path.
        key: Option<&'a str>,
    },
    /// Not a JSON-RPC path (the operator endpoints).
    Operator,
    /// No such network: HTTP 404 with this message.
    Unknown(String),
}

/// Finds the network a path names. Pure.
pub fn resolve<'a>(path: &'a str, directory: &Directory) -> PathTarget<'a> {
    // The root (most requests, with a single network): no splitting.
    if let ("/", Some(network)) = (path, directory.default) {
        return PathTarget::Rpc { network, key: None };
    }
    let Some(rest) = path.strip_prefix('/') else { return PathTarget::Unknown("no such path".into()) };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let mut parts = rest.splitn(3, '/');
    let first = parts.next().unwrap_or("");
    let second = parts.next().filter(|s| !s.is_empty());
    let third = parts.next();
    match (first, second, third) {
        ("", None, None) => match directory.default {
            Some(network) => PathTarget::Rpc { network, key: None },
            None => PathTarget::Unknown(format!(
                "several networks are served here and none is the default: use {}",
                paths_of(directory).join(", ")
            )),
        },
        ("evm", Some(chain), key) => {
            let key = key.filter(|k| !k.is_empty() && !k.contains('/'));
            let found = chain
                .parse::<u64>()
                .ok()
                .and_then(|chain| directory.entries.iter().position(|e| e.chain_id == Some(chain)));
            match found {
                Some(network) if key.is_some() || third.is_none() => PathTarget::Rpc { network, key },
                _ => PathTarget::Unknown(unknown(path)),
            }
        }
        (name, _, _) if OPERATOR_PATHS.contains(&name) && second.is_none() => PathTarget::Operator,
        (name, key, None) => match directory.entries.iter().position(|e| e.id == name) {
            Some(network) if directory.named => PathTarget::Rpc { network, key },
            _ if !directory.named && key.is_none() => match directory.default {
                Some(network) => PathTarget::Rpc { network, key: Some(name) },
                None => PathTarget::Unknown(unknown(path)),
            },
            _ => PathTarget::Unknown(unknown(path)),
        },
        _ => PathTarget::Unknown(unknown(path)),
    }
}

fn unknown(path: &str) -> String {
    // The path itself is the caller's own; nothing of the configuration is listed.
    let shown: String = path.chars().take(80).collect();
    format!("no network is served at {shown}")
}

fn paths_of(directory: &Directory) -> Vec<String> {
    directory
        .entries
        .iter()
        .map(|e| match e.chain_id {
            Some(chain) => format!("/{} or /evm/{chain}", e.id),
            None => format!("/{}", e.id),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named() -> Directory {
        Directory {
            entries: vec![
                Entry { id: "eth".into(), chain_id: Some(1) },
                Entry { id: "base".into(), chain_id: Some(8453) },
            ],
            default: None,
            named: true,
        }
    }

    fn single() -> Directory {
        Directory {
            entries: vec![Entry { id: "default".into(), chain_id: Some(31337) }],
            default: Some(0),
            named: false,
        }
    }

    #[test]
    fn named_networks_by_id_and_by_chain_id() {
        let d = named();
        assert_eq!(resolve("/eth", &d), PathTarget::Rpc { network: 0, key: None });
        assert_eq!(resolve("/base/", &d), PathTarget::Rpc { network: 1, key: None });
        assert_eq!(resolve("/base/KEY", &d), PathTarget::Rpc { network: 1, key: Some("KEY") });
        assert_eq!(resolve("/evm/8453", &d), PathTarget::Rpc { network: 1, key: None });
        assert_eq!(resolve("/evm/1/KEY", &d), PathTarget::Rpc { network: 0, key: Some("KEY") });
    }

    #[test]
    fn unknown_networks_and_paths_name_nothing_configured() {
        let d = named();
        for path in ["/op", "/evm/10", "/evm/x", "/evm", "/eth/KEY/more", "/KEY", "/evm/1/KEY/x"] {
            let PathTarget::Unknown(message) = resolve(path, &d) else { panic!("{path} resolved") };
            assert!(!message.contains("base"), "{path}: {message}");
        }
    }

    #[test]
    fn the_root_is_the_default_network_or_a_list_of_paths() {
        let mut d = named();
        let PathTarget::Unknown(message) = resolve("/", &d) else { panic!("no default") };
        assert!(message.contains("/eth or /evm/1") && message.contains("/base or /evm/8453"), "{message}");
        d.default = Some(1);
        assert_eq!(resolve("/", &d), PathTarget::Rpc { network: 1, key: None });
    }

    #[test]
    fn operator_paths_are_not_networks() {
        for path in ["/health", "/ready", "/metrics", "/status"] {
            assert_eq!(resolve(path, &named()), PathTarget::Operator);
            assert_eq!(resolve(path, &single()), PathTarget::Operator);
        }
    }

    #[test]
    fn a_single_implicit_network_keeps_keys_in_the_path() {
        let d = single();
        assert_eq!(resolve("/", &d), PathTarget::Rpc { network: 0, key: None });
        assert_eq!(resolve("/KEY", &d), PathTarget::Rpc { network: 0, key: Some("KEY") });
        assert_eq!(resolve("/evm/31337", &d), PathTarget::Rpc { network: 0, key: None });
        assert!(matches!(resolve("/KEY/x", &d), PathTarget::Unknown(_)));
        assert!(matches!(resolve("/evm/1", &d), PathTarget::Unknown(_)));
    }
}
