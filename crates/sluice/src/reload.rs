//! Reload on SIGHUP: the configuration is read again from the same layers (file, `SLUICE_*`,
//! flags) and validated; API keys and tiers (with the rest of `[access]`), the method policy,
//! and each network's upstream list and pool settings change while connections stay open.
//! A file that does not load, validate or build is refused as a whole and the old
//! configuration stays, logged; parts that need a restart (listen address, cache, mempool,
//! mesh, …) are named in a warning and take effect at the next start.

use std::sync::Arc;

use serde_json::Value;
use sluice_gateway::policy::{MethodPolicy, Policies};
use sluice_gateway::Gateway;
use sluice_upstream::pool::LivePool;
use sluice_upstream::HttpUpstream;

use crate::config::Config;
use crate::stack::build_pool;

/// Reads the configuration again, from the layers `sluice serve` was started with.
pub type LoadConfig = Box<dyn Fn() -> anyhow::Result<Config> + Send + Sync>;

/// What differs between the configuration in force and a new one. Pure.
#[derive(Debug, Default, PartialEq)]
pub struct Changes {
    /// `[access]` (keys, tiers, rules, tokens).
    pub access: bool,
    /// `[methods]` or a tier's method lists.
    pub methods: bool,
    /// Networks whose upstream list or pool settings changed.
    pub pools: Vec<String>,
    /// Top-level keys that changed and need a restart.
    pub restart: Vec<String>,
}

impl Changes {
    /// Nothing that a reload applies.
    pub fn is_empty(&self) -> bool {
        !self.access && !self.methods && self.pools.is_empty()
    }
}

/// Compares `old` and `new` (both valid) part by part.
pub fn changes(old: &Config, new: &Config) -> anyhow::Result<Changes> {
    let (a, b) = (serde_json::to_value(old)?, serde_json::to_value(new)?);
    let mut out = Changes { access: a["access"] != b["access"], ..Changes::default() };
    let tier_lists = |v: &Value| -> Value {
        let tiers = v["access"]["tiers"].as_object().cloned().unwrap_or_default();
        tiers.into_iter().map(|(name, t)| (name, serde_json::json!([t["deny"], t["allow"]]))).collect()
    };
    out.methods = a["methods"] != b["methods"] || tier_lists(&a) != tier_lists(&b);
    let (old_nets, new_nets) = (old.networks()?, new.networks()?);
    let ids = |nets: &[crate::config::NetworkConfig]| nets.iter().map(|n| n.id.clone()).collect::<Vec<_>>();
    let same_networks = ids(&old_nets) == ids(&new_nets);
    if same_networks {
        for (o, n) in old_nets.iter().zip(&new_nets) {
            let pool = |c: &crate::config::NetworkConfig| serde_json::json!([c.upstreams, c.pool]);
            if pool(o) != pool(n) {
                out.pools.push(n.id.clone());
            }
        }
    }
    // Everything else needs a restart: compare what is left once the reloadable parts are out.
    let rest = |v: &Value| -> serde_json::Map<String, Value> {
        let mut map = v.as_object().cloned().unwrap_or_default();
        for key in ["access", "methods", "upstreams", "pool"] {
            map.remove(key);
        }
        if let Some(Value::Array(networks)) = map.get_mut("networks") {
            for n in networks.iter_mut().filter_map(Value::as_object_mut) {
                n.remove("upstreams");
                n.remove("pool");
            }
        }
        map
    };
    let (ra, rb) = (rest(&a), rest(&b));
    let mut keys: Vec<&String> = ra.keys().chain(rb.keys()).collect();
    keys.sort_unstable();
    keys.dedup();
    out.restart = keys.into_iter().filter(|k| ra.get(*k) != rb.get(*k)).cloned().collect();
    if !same_networks && !out.restart.iter().any(|k| k == "networks") {
        out.restart.push("networks".into());
    }
    Ok(out)
}

/// Applies new configurations to a running gateway.
pub struct Reloader {
    load: LoadConfig,
    current: Config,
    gateway: Arc<Gateway>,
    pools: Vec<(String, Arc<LivePool<HttpUpstream>>)>,
}

impl Reloader {
    /// Reloads `gateway` (started from `current`, with each network's pool) from `load`.
    pub fn new(
        load: LoadConfig,
        current: Config,
        gateway: Arc<Gateway>,
        pools: Vec<(String, Arc<LivePool<HttpUpstream>>)>,
    ) -> Self {
        Self { load, current, gateway, pools }
    }

    /// Reads, checks and applies the configuration; logs and counts the outcome. On any error
    /// nothing changes.
    pub async fn reload(&mut self) -> Result<Changes, String> {
        let result = self.try_reload().await;
        match &result {
            Ok(changes) => {
                metrics::counter!("sluice_config_reloads_total", "outcome" => "applied").increment(1);
                if !changes.restart.is_empty() {
                    tracing::warn!(keys = ?changes.restart, "reload: these parts change only at the next start");
                }
                tracing::info!(
                    access = changes.access,
                    methods = changes.methods,
                    pools = ?changes.pools,
                    "configuration reloaded"
                );
            }
            Err(e) => {
                metrics::counter!("sluice_config_reloads_total", "outcome" => "refused").increment(1);
                tracing::error!(error = %e, "reload refused; the configuration in force stays");
            }
        }
        result
    }

    async fn try_reload(&mut self) -> Result<Changes, String> {
        let new = (self.load)().map_err(|e| format!("{e:#}"))?;
        let changes = changes(&self.current, &new).map_err(|e| format!("{e:#}"))?;
        // Build every new pool before anything changes: a node on the wrong chain refuses the whole file.
        let mut pools = Vec::new();
        let networks = new.networks().map_err(|e| format!("{e:#}"))?;
        for id in &changes.pools {
            let Some(net) = networks.iter().find(|n| &n.id == id) else { continue };
            let (pool, _) = build_pool(net).await.map_err(|e| format!("{e:#}"))?;
            pools.push((id.clone(), pool));
        }
        if changes.access {
            match (self.gateway.access(), &new.access) {
                (Some(control), Some(access)) => control.access.reload(access.clone())?,
                _ => return Err("access: turning access control on or off needs a restart".into()),
            }
        }
        if changes.methods {
            let tiers: Vec<(String, Vec<String>, Vec<String>)> = new
                .access
                .iter()
                .flat_map(|a| a.tiers.iter())
                .map(|(name, t)| (name.clone(), t.deny.clone(), t.allow.clone()))
                .collect();
            let global = MethodPolicy::new(new.methods.deny.clone(), new.methods.allow.clone());
            self.gateway.set_policies(Policies::new(global, &tiers));
        }
        for (id, pool) in pools {
            if let Some((_, live)) = self.pools.iter().find(|(n, _)| *n == id) {
                live.replace(pool);
            }
        }
        self.current = new;
        Ok(changes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml: &str) -> Config {
        crate::config::parse_toml(toml).expect("a configuration")
    }

    const BASE: &str = r#"
        [[upstreams]]
        url = "http://127.0.0.1:1"
        [methods]
        deny = ["admin_*"]
    "#;

    #[test]
    fn the_same_file_changes_nothing() {
        assert_eq!(changes(&parse(BASE), &parse(BASE)).unwrap(), Changes::default());
    }

    #[test]
    fn upstreams_and_methods_are_reloaded_the_rest_needs_a_restart() {
        let new = parse(
            r#"
            listen = "127.0.0.1:9999"
            [[upstreams]]
            url = "http://127.0.0.1:1"
            [[upstreams]]
            url = "http://127.0.0.1:2"
            [methods]
            deny = ["admin_*", "debug_*"]
            [cache]
            enabled = false
        "#,
        );
        let c = changes(&parse(BASE), &new).unwrap();
        assert_eq!(c.pools, vec!["default".to_owned()]);
        assert!(c.methods && !c.access);
        assert_eq!(c.restart, vec!["cache".to_owned(), "listen".to_owned()]);
    }

    #[test]
    fn a_tier_s_method_lists_change_the_policy_as_well_as_access() {
        let with_tier = |deny: &str| {
            parse(&format!("{BASE}\n[access]\nanonymous = \"free\"\n[access.tiers.free]\ndeny = [{deny}]\n"))
        };
        let c = changes(&with_tier(""), &with_tier("\"eth_getLogs\"")).unwrap();
        assert!(c.access && c.methods && c.pools.is_empty() && c.restart.is_empty(), "{c:?}");
    }
}
