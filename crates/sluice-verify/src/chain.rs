//! Chain data checked against a trusted header: a block's transactions against its
//! `transactionsRoot` (each one's hash and signer recomputed), its withdrawals against
//! `withdrawalsRoot`, and a block's receipts against `receiptsRoot`, with every field a
//! receipt carries beside its consensus encoding (hashes, indexes, sender, recipient, gas used,
//! created contract, effective gas price, log positions) derived again from the block.

use alloy_consensus::proofs::{calculate_receipt_root, calculate_transaction_root, calculate_withdrawals_root};
use alloy_consensus::transaction::SignerRecoverable;
use alloy_consensus::{ReceiptEnvelope, Transaction as _, TxEnvelope, EMPTY_OMMER_ROOT_HASH};
use alloy_eips::eip2718::Encodable2718;
use alloy_eips::eip4895::Withdrawal;
use alloy_primitives::{keccak256, Address, B256};
use alloy_rpc_types_eth::{Transaction, TransactionReceipt};
use serde_json::Value;

use crate::header::check_header;
use crate::Unverified;

/// One transaction of a checked block, as its receipt must name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedTx {
    /// Its hash.
    pub hash: B256,
    /// Its signer, recovered from the signature.
    pub from: Address,
    /// Its recipient; `None` for a contract creation.
    pub to: Option<Address>,
    /// Its nonce.
    pub nonce: u64,
    /// What it paid per gas in this block.
    pub effective_gas_price: u128,
}

/// A block whose header, transactions and withdrawals were checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedBlock {
    /// Its hash.
    pub hash: B256,
    /// Its height.
    pub number: u64,
    /// The header's receipts root.
    pub receipts_root: B256,
    /// Its transactions, in order.
    pub txs: Vec<CheckedTx>,
}

fn field<T: serde::de::DeserializeOwned>(block: &Value, name: &str) -> Result<T, Unverified> {
    serde_json::from_value(block.get(name).cloned().unwrap_or(Value::Null))
        .map_err(|e| Unverified::Proof(format!("block field {name}: {e}")))
}

/// Checks a block with full transactions against the trusted hash `trusted`.
pub fn check_full_block(block: &Value, trusted: B256) -> Result<CheckedBlock, Unverified> {
    let header = check_header(block)?;
    if header.hash != trusted {
        return Err(Unverified::Header(format!("asked for {trusted}, given {}", header.hash)));
    }
    let txs: Vec<Transaction<TxEnvelope>> = field(block, "transactions")?;
    let envelopes: Vec<TxEnvelope> = txs.iter().map(|t| t.inner.inner().clone()).collect();
    let transactions_root: B256 = field(block, "transactionsRoot")?;
    if calculate_transaction_root(&envelopes) != transactions_root {
        return Err(Unverified::Proof("the transactions do not make the header's transactionsRoot".into()));
    }
    if let Some(root) = block.get("withdrawalsRoot").filter(|r| !r.is_null()) {
        let root: B256 = serde_json::from_value(root.clone()).map_err(|e| Unverified::Proof(e.to_string()))?;
        let withdrawals: Vec<Withdrawal> = field(block, "withdrawals")?;
        if calculate_withdrawals_root(&withdrawals) != root {
            return Err(Unverified::Proof("the withdrawals do not make the header's withdrawalsRoot".into()));
        }
    }
    let uncles: Vec<B256> = field(block, "uncles")?;
    let ommers_root: B256 = field(block, "sha3Uncles")?;
    if !uncles.is_empty() || ommers_root != EMPTY_OMMER_ROOT_HASH {
        return Err(Unverified::NoProof("uncles are not verified".into()));
    }
    let base_fee: Option<u64> = field::<Option<alloy_primitives::U64>>(block, "baseFeePerGas")?.map(|f| f.to());
    let mut checked = Vec::with_capacity(txs.len());
    for (index, tx) in txs.iter().enumerate() {
        let envelope = tx.inner.inner();
        let (hash, from) = check_transaction(tx)?;
        let effective_gas_price = envelope.effective_gas_price(base_fee);
        let placed = tx.block_hash == Some(trusted)
            && tx.block_number == Some(header.number)
            && tx.transaction_index == Some(index as u64);
        let priced = tx.effective_gas_price.is_none_or(|p| p == effective_gas_price);
        if !placed || !priced {
            return Err(Unverified::Proof(format!("transaction {hash}: a field differs from what the block says")));
        }
        checked.push(CheckedTx { hash, from, to: envelope.to(), nonce: envelope.nonce(), effective_gas_price });
    }
    let receipts_root: B256 = field(block, "receiptsRoot")?;
    Ok(CheckedBlock { hash: trusted, number: header.number, receipts_root, txs: checked })
}

/// Checks a transaction object by itself: its hash recomputed from its signed fields (the
/// EIP-2718 encoding; alloy takes the `hash` field as sent) and its sender recovered from its
/// signature must be the ones it names. Gives both.
pub fn check_transaction(tx: &Transaction<TxEnvelope>) -> Result<(B256, Address), Unverified> {
    let envelope = tx.inner.inner();
    // Not `trie_hash()`: the envelope's returns the hash it was given.
    let hash = keccak256(envelope.encoded_2718());
    if hash != *envelope.tx_hash() {
        return Err(Unverified::Proof(format!("transaction {}: its fields hash to {hash}", envelope.tx_hash())));
    }
    let from = envelope.recover_signer().map_err(|e| Unverified::Proof(format!("transaction {hash}: {e}")))?;
    if tx.inner.signer() != from {
        return Err(Unverified::Proof(format!("transaction {hash}: signed by {from}, not its `from`")));
    }
    Ok((hash, from))
}

/// The block as `eth_getBlockBy…(…, false)` answers it: transaction hashes for the objects.
pub fn with_hashes(block: &Value, checked: &CheckedBlock) -> Value {
    let mut block = block.clone();
    block["transactions"] = Value::Array(checked.txs.iter().map(|t| Value::String(format!("{:#x}", t.hash))).collect());
    block
}

/// Checks a block's receipts (`eth_getBlockReceipts`) against the checked block.
pub fn check_receipts(receipts: &Value, block: &CheckedBlock) -> Result<(), Unverified> {
    let receipts: Vec<TransactionReceipt> = serde_json::from_value(receipts.clone())
        .map_err(|e| Unverified::NoProof(format!("unreadable receipts: {e}")))?;
    if receipts.len() != block.txs.len() {
        return Err(Unverified::Proof(format!("{} receipts for {} transactions", receipts.len(), block.txs.len())));
    }
    let envelopes: Vec<ReceiptEnvelope> = receipts.iter().map(|r| r.inner.clone().into_primitives_receipt()).collect();
    if calculate_receipt_root(&envelopes) != block.receipts_root {
        return Err(Unverified::Proof("the receipts do not make the header's receiptsRoot".into()));
    }
    let (mut gas_before, mut log_index) = (0u64, 0u64);
    for (index, (receipt, tx)) in receipts.iter().zip(&block.txs).enumerate() {
        let cumulative = receipt.inner.cumulative_gas_used();
        let created = tx.to.is_none().then(|| tx.from.create(tx.nonce));
        let fields_hold = receipt.transaction_hash == tx.hash
            && receipt.transaction_index == Some(index as u64)
            && receipt.block_hash == Some(block.hash)
            && receipt.block_number == Some(block.number)
            && receipt.from == tx.from
            && receipt.to == tx.to
            && receipt.contract_address == created
            && receipt.gas_used == cumulative.saturating_sub(gas_before)
            && receipt.effective_gas_price == tx.effective_gas_price;
        if !fields_hold {
            return Err(Unverified::Proof(format!("receipt of {}: a field differs from what the block says", tx.hash)));
        }
        for log in receipt.inner.logs() {
            let placed = log.block_hash == Some(block.hash)
                && log.block_number == Some(block.number)
                && log.transaction_hash == Some(tx.hash)
                && log.transaction_index == Some(index as u64)
                && log.log_index == Some(log_index);
            if !placed {
                return Err(Unverified::Proof(format!("a log of {}: its position differs from the block's", tx.hash)));
            }
            log_index += 1;
        }
        gas_before = cumulative;
    }
    Ok(())
}
