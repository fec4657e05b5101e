//! Signed transactions for tests and load: deterministic keys, EIP-1559 transfers signed
//! with alloy's local signer, raw EIP-2718 bytes out.

use alloy_consensus::{SignableTransaction, TxEip1559, TxEnvelope};
use alloy_eips::eip2718::Encodable2718;
use alloy_primitives::{keccak256, Address, TxKind, B256, U256};
use alloy_signer::SignerSync;
use alloy_signer_local::PrivateKeySigner;

/// anvil's first dev key (funded on every anvil).
pub const ANVIL_KEY_0: &str = "ac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80";

/// One signing account.
#[derive(Clone)]
pub struct Wallet {
    signer: PrivateKeySigner,
    /// The chain the transactions are for.
    pub chain_id: u64,
}

/// A signed transaction.
#[derive(Debug, Clone)]
pub struct SignedTx {
    /// Its hash.
    pub hash: B256,
    /// The raw EIP-2718 bytes.
    pub raw: Vec<u8>,
}

impl SignedTx {
    /// `0x…` hex of the raw bytes, as `eth_sendRawTransaction` takes it.
    pub fn hex(&self) -> String {
        format!("0x{}", alloy_primitives::hex::encode(&self.raw))
    }
}

/// Fees of one transaction.
#[derive(Debug, Clone, Copy)]
pub struct Fees {
    /// Fee cap per gas, in wei.
    pub max_fee: u128,
    /// Tip cap per gas, in wei.
    pub tip: u128,
}

impl Default for Fees {
    fn default() -> Self {
        Self { max_fee: 20_000_000_000, tip: 1_000_000_000 }
    }
}

impl Wallet {
    /// A wallet from a hex private key.
    pub fn from_hex(key: &str, chain_id: u64) -> anyhow::Result<Self> {
        Ok(Self { signer: key.trim_start_matches("0x").parse()?, chain_id })
    }

    /// The `n`th deterministic wallet (key = keccak("sluice" ‖ n)): many distinct senders.
    pub fn numbered(n: u64, chain_id: u64) -> Self {
        let mut seed = b"sluice".to_vec();
        seed.extend_from_slice(&n.to_be_bytes());
        let signer = PrivateKeySigner::from_bytes(&keccak256(seed)).expect("a keccak output is a valid key");
        Self { signer, chain_id }
    }

    /// Its address.
    pub fn address(&self) -> Address {
        self.signer.address()
    }

    /// A signed EIP-1559 transfer of `value` wei to `to`.
    pub fn transfer(&self, nonce: u64, to: Address, value: u64, fees: Fees) -> SignedTx {
        self.sign(TxEip1559 {
            chain_id: self.chain_id,
            nonce,
            gas_limit: 21_000,
            max_fee_per_gas: fees.max_fee,
            max_priority_fee_per_gas: fees.tip,
            to: TxKind::Call(to),
            value: U256::from(value),
            ..TxEip1559::default()
        })
    }

    /// Signs any EIP-1559 transaction.
    pub fn sign(&self, tx: TxEip1559) -> SignedTx {
        let signature = self.signer.sign_hash_sync(&tx.signature_hash()).expect("local signing does not fail");
        let envelope = TxEnvelope::from(tx.into_signed(signature));
        SignedTx { hash: *envelope.tx_hash(), raw: envelope.encoded_2718() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anvil_key_0_is_the_dev_account_and_hashes_are_keccak_of_the_envelope() {
        let w = Wallet::from_hex(ANVIL_KEY_0, 31337).unwrap();
        assert_eq!(format!("{:?}", w.address()).to_lowercase(), "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266");
        let tx = w.transfer(0, Address::ZERO, 1, Fees::default());
        assert_eq!(tx.hash, keccak256(&tx.raw));
        assert_ne!(Wallet::numbered(1, 1).address(), Wallet::numbered(2, 1).address());
    }
}
