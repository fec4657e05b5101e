//! Decoding and stateless validation of raw transactions (EIP-2718 envelopes), with sender
//! recovery. Pure: no state, no I/O; safe to run in parallel before any pool lock.
//!
//! Type 3 (blob) transactions are refused as "not supported": sluice does not carry blob
//! sidecars or check KZG proofs.

use std::time::Instant;

use alloy_consensus::transaction::SignerRecoverable;
use alloy_consensus::{Transaction, TxEnvelope};
use alloy_eips::eip2718::Decodable2718;
use alloy_primitives::{B256, U256};

use crate::PoolTx;

/// Limits for stateless checks.
#[derive(Debug, Clone)]
pub struct Rules {
    /// The chain's id; other chains' transactions are refused.
    pub chain_id: u64,
    /// Largest encoded transaction.
    pub max_size: usize,
    /// The current block gas limit.
    pub block_gas_limit: u64,
    /// Prague is active: the EIP-7623 calldata floor applies. (Read from the chain: Prague
    /// headers carry `requestsHash`.)
    pub prague: bool,
}

impl Default for Rules {
    fn default() -> Self {
        Self { chain_id: 1, max_size: 128 * 1024, block_gas_limit: 30_000_000, prague: true }
    }
}

/// Largest initcode of a contract creation (EIP-3860).
pub const MAX_INITCODE_SIZE: usize = 2 * 24_576;

/// Why a raw transaction was refused, in the wordings clients match on (geth's).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Over `max_size`.
    #[error("oversized data")]
    Oversized,
    /// Not a valid EIP-2718 envelope.
    #[error("invalid transaction: {0}")]
    Malformed(String),
    /// A blob transaction.
    #[error("transaction type not supported: blob transactions are not accepted here")]
    BlobsNotSupported,
    /// A legacy transaction without EIP-155 replay protection.
    #[error("only replay-protected (EIP-155) transactions allowed over RPC")]
    Unprotected,
    /// Signed for another chain.
    #[error("invalid chain id: {got}, expected {expected}")]
    WrongChain {
        /// The transaction's.
        got: u64,
        /// This chain's.
        expected: u64,
    },
    /// High-s or unrecoverable signature.
    #[error("invalid transaction signature")]
    InvalidSignature,
    /// Gas limit below the intrinsic gas.
    #[error("intrinsic gas too low: have {have}, want {want}")]
    IntrinsicGasTooLow {
        /// The gas limit.
        have: u64,
        /// The intrinsic gas.
        want: u64,
    },
    /// Gas limit below the EIP-7623 calldata floor (Prague).
    #[error("insufficient gas for floor data gas cost: have {have}, want {want}")]
    FloorDataGas {
        /// The gas limit.
        have: u64,
        /// The floor.
        want: u64,
    },
    /// A creation whose initcode is over [`MAX_INITCODE_SIZE`] (EIP-3860).
    #[error("max initcode size exceeded: code size {0}, limit {MAX_INITCODE_SIZE}")]
    MaxInitCodeSize(usize),
    /// Gas limit above the block's.
    #[error("exceeds block gas limit")]
    ExceedsBlockGasLimit,
    /// Tip cap above fee cap.
    #[error("max priority fee per gas higher than max fee per gas")]
    TipAboveFeeCap,
}

impl DecodeError {
    /// A short label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            DecodeError::Oversized => "oversized",
            DecodeError::Malformed(_) => "malformed",
            DecodeError::BlobsNotSupported => "blob",
            DecodeError::Unprotected => "unprotected",
            DecodeError::WrongChain { .. } => "wrong_chain",
            DecodeError::InvalidSignature => "invalid_signature",
            DecodeError::IntrinsicGasTooLow { .. } => "intrinsic_gas_too_low",
            DecodeError::FloorDataGas { .. } => "floor_data_gas",
            DecodeError::MaxInitCodeSize(_) => "max_initcode_size",
            DecodeError::ExceedsBlockGasLimit => "exceeds_block_gas_limit",
            DecodeError::TipAboveFeeCap => "tip_above_fee_cap",
        }
    }
}

/// secp256k1's group order n, halved: signatures with s above it are malleable (EIP-2).
const HALF_N: U256 = U256::from_limbs([0xdfe92f46681b20a0, 0x5d576e7357a4501d, 0xffffffffffffffff, 0x7fffffffffffffff]);

/// Decodes, checks and recovers one raw transaction.
pub fn decode(raw: &[u8], rules: &Rules, arrived: Instant) -> Result<(PoolTx, TxEnvelope), DecodeError> {
    check_and_recover(parse(raw, rules)?, rules, arrived)
}

/// What [`decode_new`] found.
#[derive(Debug)]
pub enum Decoded {
    /// A transaction not known yet: checked, its sender recovered. (Its decoded envelope is
    /// not kept: the pool keeps the raw bytes, which the renderings decode again.)
    New(PoolTx),
    /// A transaction `known` already has (by this hash): neither checked nor recovered.
    Known(B256),
}

/// [`decode`], unless `known` already has the transaction: its hash (keccak of the bytes,
/// which decoding computes anyway) is looked up before the checks and the sender recovery, so a
/// transaction sent again (peers forward each one several times, clients retry) costs a decode
/// and a lookup, not a recovery.
pub fn decode_new(
    raw: &[u8],
    rules: &Rules,
    arrived: Instant,
    known: impl Fn(&B256) -> bool,
) -> Result<Decoded, DecodeError> {
    let envelope = parse(raw, rules)?;
    let hash = *envelope.tx_hash();
    if known(&hash) {
        return Ok(Decoded::Known(hash));
    }
    let (tx, _) = check_and_recover(envelope, rules, arrived)?;
    Ok(Decoded::New(tx))
}

/// The canonical EIP-2718 envelope of `raw`, within the size limit.
fn parse(raw: &[u8], rules: &Rules) -> Result<TxEnvelope, DecodeError> {
    if raw.len() > rules.max_size {
        return Err(DecodeError::Oversized);
    }
    // What eth_sendRawTransaction takes is canonical EIP-2718: a type byte (≤ 0x7f) or a legacy RLP
    // list (≥ 0xc0). alloy's decoder also takes typed transactions wrapped in an RLP string (the
    // devp2p form), whose bytes then differ from the transaction's own: refuse that, or the hash we
    // answer would not be keccak of what the caller sent, and relays would forward foreign bytes.
    if matches!(raw.first(), Some(0x80..=0xbf)) {
        return Err(DecodeError::Malformed("not canonical EIP-2718 (an RLP string header)".into()));
    }
    let mut rest = raw;
    let envelope = TxEnvelope::decode_2718(&mut rest).map_err(|e| DecodeError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(DecodeError::Malformed(format!("{} bytes after the transaction", rest.len())));
    }
    if alloy_eips::eip2718::Encodable2718::encode_2718_len(&envelope) != raw.len() {
        return Err(DecodeError::Malformed("not canonical EIP-2718".into()));
    }
    Ok(envelope)
}

/// The stateless checks and the sender recovery of a parsed envelope.
fn check_and_recover(
    envelope: TxEnvelope,
    rules: &Rules,
    arrived: Instant,
) -> Result<(PoolTx, TxEnvelope), DecodeError> {
    if envelope.is_eip4844() {
        return Err(DecodeError::BlobsNotSupported);
    }
    match envelope.chain_id() {
        None => return Err(DecodeError::Unprotected),
        Some(id) if id != rules.chain_id => return Err(DecodeError::WrongChain { got: id, expected: rules.chain_id }),
        Some(_) => {}
    }
    if envelope.signature().s() > HALF_N {
        return Err(DecodeError::InvalidSignature);
    }
    let max_fee = envelope.max_fee_per_gas();
    let tip = envelope.max_priority_fee_per_gas().unwrap_or(max_fee);
    if tip > max_fee {
        return Err(DecodeError::TipAboveFeeCap);
    }
    if envelope.is_create() && envelope.input().len() > MAX_INITCODE_SIZE {
        return Err(DecodeError::MaxInitCodeSize(envelope.input().len()));
    }
    let want = intrinsic_gas(&envelope);
    if envelope.gas_limit() < want {
        return Err(DecodeError::IntrinsicGasTooLow { have: envelope.gas_limit(), want });
    }
    if rules.prague {
        let floor = floor_data_gas(envelope.input());
        if envelope.gas_limit() < floor {
            return Err(DecodeError::FloorDataGas { have: envelope.gas_limit(), want: floor });
        }
    }
    if envelope.gas_limit() > rules.block_gas_limit {
        return Err(DecodeError::ExceedsBlockGasLimit);
    }
    let sender = envelope.recover_signer().map_err(|_| DecodeError::InvalidSignature)?;
    let tx = PoolTx {
        hash: *envelope.tx_hash(),
        sender,
        nonce: envelope.nonce(),
        max_fee,
        max_priority_fee: tip,
        gas_limit: envelope.gas_limit(),
        value: envelope.value(),
        arrived,
    };
    Ok((tx, envelope))
}

/// Intrinsic gas (Shanghai rules): base, calldata, contract creation with its initcode words
/// (EIP-3860), access list (EIP-2930) and authorizations (EIP-7702).
pub fn intrinsic_gas(tx: &TxEnvelope) -> u64 {
    let input = tx.input();
    let zeros = input.iter().filter(|b| **b == 0).count() as u64;
    let data = zeros * 4 + (input.len() as u64 - zeros) * 16;
    let create = if tx.is_create() { 32_000 + 2 * (input.len() as u64).div_ceil(32) } else { 0 };
    let access =
        tx.access_list().map_or(0, |list| list.iter().map(|item| 2_400 + 1_900 * item.storage_keys.len() as u64).sum());
    let authorizations = tx.authorization_list().map_or(0, |list| 25_000 * list.len() as u64);
    21_000 + data + create + access + authorizations
}

/// The least gas a transaction with this calldata pays from Prague on (EIP-7623): 21,000
/// plus 10 per token, a zero byte being one token and any other byte four.
pub fn floor_data_gas(input: &[u8]) -> u64 {
    let zeros = input.iter().filter(|b| **b == 0).count() as u64;
    let tokens = zeros + (input.len() as u64 - zeros) * 4;
    21_000 + 10 * tokens
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real transactions signed by `cast mktx` with anvil's first dev key, nonce 3, to anvil's
    /// second account, value 1 wei.
    pub(super) const EIP1559: &str = "02f86c827a6903843b9aca0084773594008252089470997970c51812dc3a010c7d01b50e0d17dc79c80180c001a030f7c74d4c3f9a951af8f0db0736ac020ab0c01797cd7ed5bb4c3a388fa80e92a029b3fa57d71b5fe196251aee6601efc9a06be0a4207fedf6f4ca19a220e98aa9";
    pub(super) const LEGACY_155: &str = "f8650384773594008252089470997970c51812dc3a010c7d01b50e0d17dc79c8018082f4f5a077816ac847d5b149b3fa9b39f5af20f0a2ae0870660d4f8dc88eb2f0e5d8ee96a04086dc9c9f466eccfaf044281a25391744706421773f56b4fb24afe109d94f81";
    pub(super) const EIP2930: &str = "01f87e827a690384773594008275309470997970c51812dc3a010c7d01b50e0d17dc79c80180d7d69470997970c51812dc3a010c7d01b50e0d17dc79c8c001a0477ef52595444b24bc6f28a67e2ec5e31a47a5ac9bdf07d146e9f84baea3d701a07c5efa00b6239b1fe53138c67771e29ce4ccb688ed5c962668b28648ff350505";
    const CHAIN_1: &str = "02f86a0103843b9aca0084773594008252089470997970c51812dc3a010c7d01b50e0d17dc79c80180c080a09a4ba260b0c37f34a8293664c864ef8479a691e4c52d46cdf5ff788407b3b5f2a04540a5a54305f110b15cec360641e1d50ab792eec64c8e464371727eedef80d4";
    const GAS_20000: &str = "02f86c827a6903843b9aca008477359400824e209470997970c51812dc3a010c7d01b50e0d17dc79c80180c080a062cfd5cae7a1dfe1ae672aacc925df90c943427a5a116c9e10702a1ae6f6c682a02f49634d61acdebb691267e01155f12141638835900ad95f98508f776d79b622";
    const GAS_40M: &str = "02f86e827a6903843b9aca0084773594008402625a009470997970c51812dc3a010c7d01b50e0d17dc79c80180c080a0046f5dd413a8d96afb17d4e822ab462e04f095683e009d52d1a2e6006a59f0dba013bf74a146fff6f948fcf458b78659c5244b0aaea4a3983224a6794666494f2f";
    /// The well-known deterministic-deployment transaction: legacy, v = 27, no chain id.
    const UNPROTECTED: &str = "f8a58085174876e800830186a08080b853604580600e600039806000f350fe7fffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffe03601600081602082378035828234f58015156039578182fd5b8082525050506014600cf31ba02222222222222222222222222222222222222222222222222222222222222222a02222222222222222222222222222222222222222222222222222222222222222";

    pub(super) fn bytes(hex: &str) -> Vec<u8> {
        (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
    }

    fn rules() -> Rules {
        Rules { chain_id: 31337, ..Rules::default() }
    }

    const DEV: &str = "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266";

    #[test]
    fn every_supported_type_decodes_and_recovers_its_sender() {
        for (name, hex) in [("1559", EIP1559), ("legacy", LEGACY_155), ("2930", EIP2930)] {
            let (tx, _) = decode(&bytes(hex), &rules(), Instant::now()).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(tx.sender.to_string().to_lowercase(), DEV, "{name}");
            assert_eq!((tx.nonce, tx.value), (3, U256::from(1)), "{name}");
            assert_eq!(tx.hash, alloy_primitives::keccak256(bytes(hex)), "{name}: the hash is keccak of the envelope");
        }
        let (tx, _) = decode(&bytes(EIP1559), &rules(), Instant::now()).unwrap();
        assert_eq!((tx.max_fee, tx.max_priority_fee, tx.gas_limit), (2_000_000_000, 1_000_000_000, 21_000));
    }

    #[test]
    fn each_stateless_rule_refuses_with_its_wording() {
        let check = |hex: &str, rules: &Rules| decode(&bytes(hex), rules, Instant::now()).unwrap_err().to_string();
        assert!(check(CHAIN_1, &rules()).starts_with("invalid chain id: 1"));
        assert!(check(GAS_20000, &rules()).starts_with("intrinsic gas too low"));
        assert_eq!(check(GAS_40M, &rules()), "exceeds block gas limit");
        assert_eq!(
            check(UNPROTECTED, &Rules { chain_id: 31337, ..Rules::default() }),
            "only replay-protected (EIP-155) transactions allowed over RPC"
        );
        assert_eq!(check(EIP1559, &Rules { max_size: 50, ..rules() }), "oversized data");
        assert!(check("02c0", &rules()).starts_with("invalid transaction"));
    }

    #[test]
    fn a_high_s_signature_is_refused() {
        // Same transaction with s replaced by n - s and the parity flipped: a valid but
        // malleable signature (EIP-2).
        let mut raw = bytes(EIP1559);
        let n = U256::from_be_bytes(hex32("fffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141"));
        let s_at = raw.len() - 32;
        let s = U256::from_be_slice(&raw[s_at..]);
        raw[s_at..].copy_from_slice(&(n - s).to_be_bytes::<32>());
        let parity_at = raw.len() - 32 - 1 - 32 - 1 - 1;
        raw[parity_at] = if raw[parity_at] == 0x01 { 0x80 } else { 0x01 };
        assert_eq!(decode(&raw, &rules(), Instant::now()).unwrap_err(), DecodeError::InvalidSignature);
    }

    fn hex32(hex: &str) -> [u8; 32] {
        bytes(hex).try_into().unwrap()
    }

    #[test]
    fn typed_transactions_wrapped_in_an_rlp_string_are_refused() {
        // Found by the `mutated_transactions_never_panic` property: 0x80 in front of a type-1
        // transaction's list decoded, with a hash that was not keccak of the bytes sent.
        let mut raw = bytes(EIP2930);
        raw[0] = 0x80;
        assert!(matches!(decode(&raw, &rules(), Instant::now()), Err(DecodeError::Malformed(_))));
        let mut trailing = bytes(EIP1559);
        trailing.push(0);
        assert!(matches!(decode(&trailing, &rules(), Instant::now()), Err(DecodeError::Malformed(_))));
    }

    #[test]
    fn the_calldata_floor_counts_four_tokens_per_non_zero_byte() {
        assert_eq!(floor_data_gas(&[]), 21_000);
        assert_eq!(floor_data_gas(&[0xab; 100]), 25_000);
        assert_eq!(floor_data_gas(&[0; 100]), 22_000);
        assert_eq!(floor_data_gas(&[1, 0]), 21_050);
    }

    // A transaction the pool holds is answered by its hash (keccak of its bytes) before the
    // checks and the recovery; any other decodes as `decode` does.
    #[test]
    fn decode_new_answers_a_known_transaction_by_its_hash() {
        let raw = bytes(EIP1559);
        let hash = alloy_primitives::keccak256(&raw);
        assert!(
            matches!(decode_new(&raw, &rules(), Instant::now(), |h| *h == hash), Ok(Decoded::Known(h)) if h == hash)
        );
        let (tx, _) = decode(&raw, &rules(), Instant::now()).unwrap();
        let Ok(Decoded::New(new)) = decode_new(&raw, &rules(), tx.arrived, |_| false) else { panic!("decoded") };
        assert_eq!(new, tx);
        // Refusals come before the lookup only for what cannot be a pooled transaction.
        assert_eq!(decode_new(&[0xff; 3], &rules(), Instant::now(), |_| true).unwrap_err().label(), "malformed");
    }

    #[test]
    fn intrinsic_gas_counts_data_and_access_lists() {
        let (_, envelope) = decode(&bytes(EIP2930), &rules(), Instant::now()).unwrap();
        assert_eq!(intrinsic_gas(&envelope), 21_000 + 2_400);
    }
}

#[cfg(test)]
mod properties {
    //! The `tx_decode` fuzz target's property, run briefly on every test run: mutated real
    //! transactions and arbitrary bytes are refused or decoded, never a panic, and a decoded
    //! transaction's hash is keccak of its bytes.

    use proptest::prelude::*;

    use super::*;

    const SEEDS: [&str; 3] = [tests::EIP1559, tests::LEGACY_155, tests::EIP2930];

    fn check(raw: &[u8]) {
        let rules = Rules { chain_id: 31337, ..Rules::default() };
        if let Ok((tx, _)) = decode(raw, &rules, Instant::now()) {
            assert_eq!(tx.hash, alloy_primitives::keccak256(raw));
        }
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..300)) {
            check(&raw);
        }

        #[test]
        fn mutated_transactions_never_panic(
            seed in 0usize..3,
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
            cut in any::<usize>(),
        ) {
            let mut raw = tests::bytes(SEEDS[seed]);
            for (at, value) in flips {
                let i = at % raw.len();
                raw[i] = value;
            }
            check(&raw);
            check(&raw[..cut % (raw.len() + 1)]);
        }
    }
}
