//! An EIP-1186 proof (`eth_getProof`) checked against a state root: the account's leaf (or its
//! absence) under `keccak(address)` in the state trie, each slot's leaf (or its absence) under
//! `keccak(slot)` in the account's storage trie, and that the proof is of what was asked.
//! The tries are walked by `alloy-trie`; the glue is what an account and a slot encode to.

use alloy_primitives::{keccak256, Address, B256, U256};
use alloy_rpc_types_eth::EIP1186AccountProofResponse;
use alloy_trie::proof::verify_proof;
use alloy_trie::{Nibbles, TrieAccount, EMPTY_ROOT_HASH, KECCAK_EMPTY};

use crate::Unverified;

/// Checks `proof` against `state_root`: it is for `address` and exactly `slots`, in order, and
/// the account and every slot are what the tries hold.
pub fn check_account(
    proof: &EIP1186AccountProofResponse,
    state_root: B256,
    address: Address,
    slots: &[B256],
) -> Result<(), Unverified> {
    if proof.address != address {
        return Err(Unverified::Proof(format!("a proof of {} for {address}", proof.address)));
    }
    let asked: Vec<B256> = proof.storage_proof.iter().map(|s| s.key.as_b256()).collect();
    if asked != slots {
        return Err(Unverified::Proof("the slots proven are not the slots asked".into()));
    }
    // Nodes name an absent account's hashes either as an empty account's or as zero.
    let absent = proof.nonce == 0
        && proof.balance.is_zero()
        && (proof.code_hash == KECCAK_EMPTY || proof.code_hash == B256::ZERO)
        && (proof.storage_hash == EMPTY_ROOT_HASH || proof.storage_hash == B256::ZERO);
    let leaf = (!absent).then(|| {
        let account = TrieAccount {
            nonce: proof.nonce,
            balance: proof.balance,
            storage_root: proof.storage_hash,
            code_hash: proof.code_hash,
        };
        alloy_rlp::encode(account)
    });
    let key = Nibbles::unpack(keccak256(address));
    verify_proof(state_root, key, leaf, &proof.account_proof)
        .map_err(|e| Unverified::Proof(format!("account {address}: {e}")))?;
    let storage_root = if absent { EMPTY_ROOT_HASH } else { proof.storage_hash };
    for slot in &proof.storage_proof {
        let key = Nibbles::unpack(keccak256(slot.key.as_b256()));
        let leaf = (!slot.value.is_zero()).then(|| alloy_rlp::encode(slot.value));
        verify_proof(storage_root, key, leaf, &slot.proof)
            .map_err(|e| Unverified::Proof(format!("slot {} of {address}: {e}", slot.key.as_b256())))?;
    }
    Ok(())
}

/// Checks code against the code hash a checked proof gave.
pub fn check_code(code: &[u8], code_hash: B256) -> Result<(), Unverified> {
    let expected = if code_hash == B256::ZERO { KECCAK_EMPTY } else { code_hash };
    if keccak256(code) == expected {
        Ok(())
    } else {
        Err(Unverified::Proof(format!("code does not hash to {expected}")))
    }
}

/// A slot's value as `eth_getStorageAt` answers it: 32 bytes.
pub fn slot_word(value: U256) -> B256 {
    B256::from(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy_primitives::{b256, Bytes};
    use alloy_rpc_types_eth::EIP1186StorageProof;
    use alloy_trie::proof::ProofRetainer;
    use alloy_trie::HashBuilder;

    /// A state trie of two accounts, one with a storage trie of one slot, and their proofs, built
    /// with alloy-trie's own builder (as a node builds them).
    fn proven(address: Address, slot: B256) -> (B256, EIP1186AccountProofResponse) {
        let value = U256::from(0x2a);
        let mut storage =
            HashBuilder::default().with_proof_retainer(ProofRetainer::new(vec![Nibbles::unpack(keccak256(slot))]));
        storage.add_leaf(Nibbles::unpack(keccak256(slot)), &alloy_rlp::encode(value));
        let storage_root = storage.root();
        let storage_proof: Vec<Bytes> =
            storage.take_proof_nodes().into_nodes_sorted().into_iter().map(|(_, n)| n).collect();
        let account =
            TrieAccount { nonce: 7, balance: U256::from(1_000u64), storage_root, code_hash: keccak256([0x60, 0x00]) };
        let other = Address::repeat_byte(0x99);
        let mut leaves = vec![
            (Nibbles::unpack(keccak256(address)), alloy_rlp::encode(account)),
            (Nibbles::unpack(keccak256(other)), alloy_rlp::encode(TrieAccount { nonce: 1, ..Default::default() })),
        ];
        leaves.sort_by_key(|a| a.0);
        let mut state =
            HashBuilder::default().with_proof_retainer(ProofRetainer::new(vec![Nibbles::unpack(keccak256(address))]));
        for (key, leaf) in &leaves {
            state.add_leaf(*key, leaf);
        }
        let root = state.root();
        let account_proof: Vec<Bytes> =
            state.take_proof_nodes().into_nodes_sorted().into_iter().map(|(_, n)| n).collect();
        let response = EIP1186AccountProofResponse {
            address,
            balance: account.balance,
            code_hash: account.code_hash,
            nonce: account.nonce,
            storage_hash: storage_root,
            account_proof,
            storage_proof: vec![EIP1186StorageProof { key: slot.into(), value, proof: storage_proof }],
        };
        (root, response)
    }

    const SLOT: B256 = b256!("0000000000000000000000000000000000000000000000000000000000000003");

    #[test]
    fn an_honest_proof_holds_and_every_lie_is_caught() {
        let address = Address::repeat_byte(0x11);
        let (root, proof) = proven(address, SLOT);
        check_account(&proof, root, address, &[SLOT]).expect("an honest proof");

        let mut richer = proof.clone();
        richer.balance += U256::from(1);
        assert!(check_account(&richer, root, address, &[SLOT]).is_err(), "a balance changed");
        let mut slot_lie = proof.clone();
        slot_lie.storage_proof[0].value = U256::from(0x2b);
        assert!(check_account(&slot_lie, root, address, &[SLOT]).is_err(), "a slot's value changed");
        let mut emptied = proof.clone();
        emptied.storage_proof[0].value = U256::ZERO;
        assert!(check_account(&emptied, root, address, &[SLOT]).is_err(), "a slot said empty");
        assert!(check_account(&proof, root, Address::repeat_byte(0x12), &[SLOT]).is_err(), "another address");
        assert!(check_account(&proof, root, address, &[B256::ZERO]).is_err(), "another slot");
        assert!(check_account(&proof, B256::repeat_byte(1), address, &[SLOT]).is_err(), "another root");
        let mut absent = proof.clone();
        (absent.nonce, absent.balance, absent.code_hash, absent.storage_hash) =
            (0, U256::ZERO, KECCAK_EMPTY, EMPTY_ROOT_HASH);
        absent.storage_proof.clear();
        assert!(check_account(&absent, root, address, &[]).is_err(), "an account said absent");
    }

    #[test]
    fn code_is_checked_against_its_hash() {
        check_code(&[0x60, 0x00], keccak256([0x60, 0x00])).unwrap();
        assert!(check_code(&[0x60, 0x01], keccak256([0x60, 0x00])).is_err());
        check_code(&[], B256::ZERO).expect("an absent account's code is empty");
        assert!(check_code(&[0x00], KECCAK_EMPTY).is_err());
    }
}
