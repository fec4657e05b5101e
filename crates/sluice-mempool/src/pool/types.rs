//! What the pool takes and gives: a pooled transaction, the pool's limits, why an insert is
//! refused, what an insert did, the pending and queued counts.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use alloy_primitives::{Address, B256, U256};

/// One transaction, as the pool needs it (decoded and with its sender recovered).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolTx {
    /// Transaction hash.
    pub hash: B256,
    /// Recovered sender.
    pub sender: Address,
    /// Nonce.
    pub nonce: u64,
    /// Fee cap per gas (gas price for legacy transactions).
    pub max_fee: u128,
    /// Tip cap per gas (gas price for legacy transactions).
    pub max_priority_fee: u128,
    /// Gas limit.
    pub gas_limit: u64,
    /// Value transferred.
    pub value: U256,
    /// When it arrived (for the queued lifetime).
    pub arrived: Instant,
}

/// What a [`Pool`](super::Pool) holds: a transaction with the fields its rules read.
pub trait AsPoolTx {
    /// The pool's fields of it.
    fn pool_tx(&self) -> &PoolTx;
}

impl AsPoolTx for PoolTx {
    fn pool_tx(&self) -> &PoolTx {
        self
    }
}

impl PoolTx {
    /// The most it can cost its sender: value + gas limit × fee cap.
    pub fn cost(&self) -> U256 {
        // A 64 × 128-bit product in two 64 × 64-bit halves: U256's general product multiplies
        // every limb by every limb, and the pool computes this for each of a sender's lower
        // nonces on every insert (the cumulative balance check).
        let gas = u128::from(self.gas_limit);
        let low = (self.max_fee & u128::from(u64::MAX)) * gas;
        let high = (self.max_fee >> 64) * gas;
        // Saturating: a value near 2^256 costs more than any balance, and must not wrap.
        self.value.saturating_add(U256::from(low)).saturating_add(U256::from(high) << 64)
    }

    /// What a block producer earns per gas at `base_fee` (0 when it cannot be included).
    pub fn effective_tip(&self, base_fee: u128) -> u128 {
        self.max_fee.saturating_sub(base_fee).min(self.max_priority_fee)
    }
}

/// Pool rules; defaults are geth's.
#[derive(Debug, Clone)]
pub struct Config {
    /// Executable transactions guaranteed per sender.
    pub account_slots: usize,
    /// Queued (gapped) transactions allowed per sender.
    pub account_queue: usize,
    /// Executable transactions in all.
    pub global_slots: usize,
    /// Queued transactions in all.
    pub global_queue: usize,
    /// How long a queued transaction may wait for its gap to fill.
    pub lifetime: Duration,
    /// Fee increase a replacement needs, in percent, on both fee fields.
    pub price_bump_percent: u128,
    /// Smallest tip accepted.
    pub min_tip: u128,
    /// Senders whose transactions are never evicted.
    pub priority_senders: HashSet<Address>,
}

impl Config {
    /// How many transactions the pool's map by hash (and the snapshots' hash index) are sized
    /// for when they are made: the pool's limits, up to 65,536.
    pub fn capacity(&self) -> usize {
        self.global_slots.saturating_add(self.global_queue).min(super::PRESIZED)
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            account_slots: 16,
            account_queue: 64,
            global_slots: 5120,
            global_queue: 1024,
            lifetime: Duration::from_secs(3 * 3600),
            price_bump_percent: 10,
            min_tip: 0,
            priority_senders: HashSet::new(),
        }
    }
}

/// Why a transaction was refused; messages use geth's wording, which clients match on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InsertError {
    /// The same hash is pooled.
    #[error("already known")]
    AlreadyKnown,
    /// Nonce below the account's.
    #[error("nonce too low: next nonce {next}, tx nonce {got}")]
    NonceTooLow {
        /// The account's next nonce.
        next: u64,
        /// The transaction's.
        got: u64,
    },
    /// A replacement that does not raise both fees enough.
    #[error("replacement transaction underpriced")]
    ReplacementUnderpriced,
    /// Tip below the minimum, or too cheap to enter a full pool.
    #[error("transaction underpriced")]
    Underpriced,
    /// Tip above fee cap.
    #[error("max priority fee per gas higher than max fee per gas")]
    TipAboveFeeCap,
    /// The sender cannot pay for its pooled transactions plus this one.
    #[error("insufficient funds for gas * price + value: balance {balance}, cost {cost}")]
    InsufficientFunds {
        /// The account's balance.
        balance: U256,
        /// The cumulative cost.
        cost: U256,
    },
    /// The sender already has too many gapped transactions.
    #[error("account queue full: {0} queued transactions")]
    AccountQueueFull(usize),
    /// The journal could not be written, so the transaction was not accepted.
    #[error("transaction not accepted: journal write failed: {0}")]
    Journal(String),
}

impl InsertError {
    /// A short label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            InsertError::AlreadyKnown => "already_known",
            InsertError::NonceTooLow { .. } => "nonce_too_low",
            InsertError::ReplacementUnderpriced => "replacement_underpriced",
            InsertError::Underpriced => "underpriced",
            InsertError::TipAboveFeeCap => "tip_above_fee_cap",
            InsertError::InsufficientFunds { .. } => "insufficient_funds",
            InsertError::AccountQueueFull(_) => "account_queue_full",
            InsertError::Journal(_) => "journal",
        }
    }
}

/// Where an accepted transaction went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inserted {
    /// Executable now (else queued).
    pub pending: bool,
    /// The transaction it replaced.
    pub replaced: Option<B256>,
    /// Transactions evicted to make room.
    pub evicted: Vec<B256>,
    /// The sender's transactions below the account nonce given, dropped as already mined.
    pub mined: Vec<B256>,
}

/// Counts, as `txpool_status` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Status {
    /// Executable transactions.
    pub pending: usize,
    /// Gapped or held transactions.
    pub queued: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        // The product in halves is the product.
        #[test]
        fn cost_is_value_plus_gas_times_fee_cap(gas in any::<u64>(), fee in any::<u128>(), value in any::<u128>()) {
            let tx = PoolTx {
                hash: B256::ZERO,
                sender: Address::ZERO,
                nonce: 0,
                max_fee: fee,
                max_priority_fee: 0,
                gas_limit: gas,
                value: U256::from(value),
                arrived: Instant::now(),
            };
            prop_assert_eq!(tx.cost(), U256::from(value) + U256::from(gas) * U256::from(fee));
        }
    }

    #[test]
    fn a_cost_past_2_256_saturates() {
        let tx = PoolTx {
            hash: B256::ZERO,
            sender: Address::ZERO,
            nonce: 0,
            max_fee: u128::MAX,
            max_priority_fee: 0,
            gas_limit: u64::MAX,
            value: U256::MAX,
            arrived: Instant::now(),
        };
        assert_eq!(tx.cost(), U256::MAX);
    }
}
