//! Which methods may reach the nodes at all. Pure.
//!
//! Methods that act with the node's keys or administer it are denied by default. A public
//! endpoint must never forward them, and a denied call is answered at once, without an
//! upstream call. `allow` entries override `deny` ones (to open `debug_*` to a trusted
//! deployment, say). A pattern is an exact method name or a `prefix*`.

/// The default deny list: node administration, node keys, consensus-client methods.
pub const DEFAULT_DENY: &[&str] =
    &["admin_*", "debug_*", "personal_*", "miner_*", "engine_*", "clique_*", "eth_sign*", "eth_sendTransaction"];

/// Allowed and denied method patterns.
#[derive(Debug, Clone)]
pub struct MethodPolicy {
    deny: Vec<String>,
    allow: Vec<String>,
    /// The decision for each method the metrics know by name, made once: nearly every call
    /// asks for one of them, and deciding by the patterns costs a comparison per pattern
    /// (eight by default) on every call. Other methods are decided by the patterns.
    decided: rustc_hash::FxHashMap<&'static str, bool>,
}

impl Default for MethodPolicy {
    fn default() -> Self {
        Self::new(DEFAULT_DENY.iter().map(|s| (*s).to_owned()).collect(), Vec::new())
    }
}

impl MethodPolicy {
    /// A policy from deny and allow patterns.
    pub fn new(deny: Vec<String>, allow: Vec<String>) -> Self {
        let mut policy = Self { deny, allow, decided: Default::default() };
        policy.decided = sluice_chain::methods::known().map(|m| (m.name, policy.by_patterns(m.name))).collect();
        policy
    }

    /// This policy with a tier's own lists added.
    pub fn with(&self, deny: &[String], allow: &[String]) -> Self {
        let extended = |mine: &[String], theirs: &[String]| mine.iter().chain(theirs).cloned().collect();
        Self::new(extended(&self.deny, deny), extended(&self.allow, allow))
    }

    /// Lets everything through.
    pub fn open() -> Self {
        Self::new(Vec::new(), Vec::new())
    }

    /// Whether `method` may be forwarded.
    pub fn permits(&self, method: &str) -> bool {
        self.decided.get(method).copied().unwrap_or_else(|| self.by_patterns(method))
    }

    /// The decision the patterns make: not denied, or allowed again.
    fn by_patterns(&self, method: &str) -> bool {
        let hit = |patterns: &[String]| patterns.iter().any(|p| matches(p, method));
        !hit(&self.deny) || hit(&self.allow)
    }

    /// Checks that every pattern is well formed: a method name, optionally ending in `*`.
    pub fn validate(patterns: &[String]) -> Result<(), String> {
        sluice_access::scope::validate_patterns(patterns)
    }
}

fn matches(pattern: &str, method: &str) -> bool {
    sluice_access::scope::method_matches(pattern, method)
}

/// The method policies in force: everyone's, and each tier's (everyone's with the tier's own
/// lists added). Replaced whole on reload.
#[derive(Debug, Clone, Default)]
pub struct Policies {
    global: MethodPolicy,
    tiers: std::collections::HashMap<String, MethodPolicy>,
}

impl Policies {
    /// `global` for everyone, with each tier's `(name, deny, allow)` added for its callers.
    pub fn new(global: MethodPolicy, tiers: &[crate::TierLists]) -> Self {
        let tiers = tiers.iter().map(|(name, deny, allow)| (name.clone(), global.with(deny, allow))).collect();
        Self { global, tiers }
    }

    /// The policy for a caller of `tier` (none: no access control, or an unknown tier).
    pub fn for_tier(&self, tier: Option<&str>) -> &MethodPolicy {
        tier.and_then(|t| self.tiers.get(t)).unwrap_or(&self.global)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_key_and_admin_methods_are_denied_by_default() {
        let p = MethodPolicy::default();
        for denied in [
            "admin_peers",
            "debug_traceTransaction",
            "personal_sign",
            "eth_sign",
            "eth_signTypedData_v4",
            "eth_sendTransaction",
            "engine_newPayloadV3",
            "miner_start",
        ] {
            assert!(!p.permits(denied), "{denied}");
        }
        for allowed in
            ["eth_call", "eth_sendRawTransaction", "eth_getLogs", "txpool_status", "net_version", "eth_syncing"]
        {
            assert!(p.permits(allowed), "{allowed}");
        }
    }

    #[test]
    fn allow_overrides_deny_and_patterns_are_checked() {
        let p = MethodPolicy::new(vec!["debug_*".into(), "anvil_*".into()], vec!["debug_traceTransaction".into()]);
        assert!(p.permits("debug_traceTransaction"));
        assert!(!p.permits("debug_traceCall"));
        assert!(!p.permits("anvil_setBalance"));
        assert!(MethodPolicy::open().permits("admin_peers"));
        assert!(MethodPolicy::validate(&["eth_*".into(), "net_version".into(), "*".into()]).is_ok());
        assert!(MethodPolicy::validate(&["eth*call".into()]).is_err());
        assert!(MethodPolicy::validate(&["".into()]).is_err());
    }

    #[test]
    fn decisions_made_up_front_are_the_patterns_decisions() {
        let tier = MethodPolicy::default().with(&["eth_get*".into()], &["debug_traceCall".into(), "eth_sign".into()]);
        let policies = [MethodPolicy::default(), MethodPolicy::open(), tier];
        let unknown = ["debug_unknownThing", "eth_signSomething", "admin_", "eth_sendTransaction2", "", "x"];
        for policy in &policies {
            for method in sluice_chain::methods::known().map(|m| &m.name).chain(&unknown) {
                assert_eq!(policy.permits(method), policy.by_patterns(method), "{method}");
            }
        }
        let tier = &policies[2];
        assert!(tier.permits("debug_traceCall") && tier.permits("eth_sign") && !tier.permits("eth_getBalance"));
        assert!(!tier.permits("debug_traceTransaction") && tier.permits("eth_call"));
    }
}
