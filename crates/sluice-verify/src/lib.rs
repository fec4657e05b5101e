//! Verified reads: the answers of providers sluice cannot audit, checked against the chain's
//! own commitments, or refused.
//!
//! A state read (`eth_getBalance`, `eth_getTransactionCount`, `eth_getCode`,
//! `eth_getStorageAt`, `eth_getProof`; the method table's `proof` column) is answered from an
//! EIP-1186 proof at a header sluice trusts: the header's hash recomputed from its fields
//! ([`header`]) must be the hash sluice's head tracker holds for that height, the account and
//! its slots must be in (or provably absent from) the tries under its `stateRoot`
//! ([`proof`]), and the answer is made from what was proven in the node's own format
//! ([`read`]). A proof that fails is asked again; a second failure refuses the call with
//! `-32002` and `data.reason = "unverified"`. Never an unchecked value.
//!
//! Pure checks in `header`, `proof` and `read`; the I/O is [`VerifyLayer`], one step of the
//! pipeline just above the upstream pool (so verified answers are cached and joined as any).

use serde::{Deserialize, Serialize};

pub mod chain;
mod chain_reads;
pub mod header;
mod layer;
mod linking;
mod logs;
pub mod proof;
pub mod read;
pub mod trust;

pub use layer::VerifyLayer;
pub use trust::{Checkpoint, SharedTrust};

/// Why an answer could not be verified.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unverified {
    /// The header is not one sluice can trust (its hash, its fields, or unknown to sluice).
    #[error("header: {0}")]
    Header(String),
    /// The proof does not hold against the trusted header.
    #[error("proof: {0}")]
    Proof(String),
    /// The block is not one sluice holds a trusted header of (beyond its window, `pending`).
    #[error("no trusted header: {0}")]
    NoTrustedHeader(String),
    /// The members did not answer with a proof at all.
    #[error("no proof: {0}")]
    NoProof(String),
}

impl Unverified {
    /// Its label in `sluice_verify_failures_total{reason}`.
    pub fn reason(&self) -> &'static str {
        match self {
            Unverified::Header(_) => "header",
            Unverified::Proof(_) => "proof",
            Unverified::NoTrustedHeader(_) => "no_trusted_header",
            Unverified::NoProof(_) => "no_proof",
        }
    }
}

/// The `[verify]` section.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct VerifyConfig {
    /// Answer state reads only from proofs checked against trusted headers (default off).
    pub enabled: bool,
    /// Proofs asked for one call before it is refused (at least 1).
    pub attempts: u32,
    /// Members that must each name a header's hash at its height before it is trusted
    /// (1: the head tracker's hash, recomputed from the header one member sends).
    pub agree: u8,
    /// A block pinned as trusted: every trusted header must then descend from it.
    pub checkpoint: Option<Checkpoint>,
    /// The most headers one read fetches to link a block to a trusted one (a block older
    /// than the head tracker's window; the chain down to the checkpoint).
    pub link_limit: u64,
}

impl Default for VerifyConfig {
    fn default() -> Self {
        Self { enabled: false, attempts: 2, agree: 1, checkpoint: None, link_limit: 1024 }
    }
}

impl VerifyConfig {
    /// Checks the numbers against the network's `members`.
    pub fn validate(&self, members: usize) -> Result<(), String> {
        if !self.enabled {
            return Ok(());
        }
        if self.agree == 0 || usize::from(self.agree) > members {
            return Err(format!("verify.agree must be 1 to the network's {members} upstream(s), got {}", self.agree));
        }
        if self.link_limit == 0 {
            return Err("verify.link_limit must be at least 1".into());
        }
        Ok(())
    }

    /// Its part of `/status`: how headers are trusted, and the trusted headers held.
    pub fn status(&self, trust: &SharedTrust) -> serde_json::Value {
        let store = trust.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let [agreed, linked, checkpoint] = store.counts();
        let source = match (self.agree, self.checkpoint) {
            (1, None) => "the head tracker's hash, recomputed".to_owned(),
            (k, None) => format!("named by {k} members"),
            (k, Some(pinned)) => {
                format!("named by {k} member(s), descending from the checkpoint at block {}", pinned.number)
            }
        };
        serde_json::json!({
            "trust": source,
            "agree": self.agree,
            "checkpoint": self.checkpoint,
            "trusted_headers": store.len(),
            "trusted_span": store.span().map(|(low, high)| [low, high]),
            "trusted_so_far": { "agreed": agreed, "linked": linked, "checkpoint": checkpoint },
        })
    }
}
