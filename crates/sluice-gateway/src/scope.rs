//! Reads what a call acts on, for key and token scopes ([`sluice_access::scope`]): the `to` of
//! `eth_call`-like calls and of signed raw transactions. Pure. Read only when the caller's
//! scope has a contract list, so unscoped callers pay nothing.

use alloy_consensus::{Transaction, TxEnvelope};
use alloy_eips::eip2718::Decodable2718;
use serde::Deserialize;
use sluice_access::scope::{Scope, Target};
use sluice_chain::methods::ActsOn;
use sluice_jsonrpc::Request;

#[derive(Deserialize)]
struct CallObject {
    to: Option<String>,
}

/// The contract `req` acts on, as an owned address or what stands for it.
enum Read {
    None,
    Contract(String),
    Unknown,
}

fn read(req: &Request) -> Read {
    let first = || -> Option<&serde_json::value::RawValue> {
        let params: Vec<&serde_json::value::RawValue> = serde_json::from_str(req.params.as_ref()?.get()).ok()?;
        params.into_iter().next()
    };
    match sluice_chain::method_info(&req.method).acts_on {
        ActsOn::CallObject => {
            let to = first().and_then(|p| serde_json::from_str::<CallObject>(p.get()).ok()).and_then(|c| c.to);
            to.map_or(Read::Unknown, Read::Contract)
        }
        ActsOn::RawTransaction => {
            let raw = first().and_then(|p| serde_json::from_str::<String>(p.get()).ok());
            let bytes = raw.and_then(|r| alloy_primitives::hex::decode(r).ok());
            let tx = bytes.and_then(|b| TxEnvelope::decode_2718(&mut b.as_slice()).ok());
            tx.and_then(|tx| tx.to()).map_or(Read::Unknown, |to| Read::Contract(format!("{to:#x}")))
        }
        ActsOn::Nothing => Read::None,
    }
}

/// Refuses `req` outside `scope`, with the message to send.
pub fn admit(scope: &Scope, req: &Request) -> Result<(), String> {
    if scope.is_open() {
        return Ok(());
    }
    if !scope.needs_target(&req.method) {
        return scope.admit_call(&req.method, Target::None);
    }
    match read(req) {
        Read::None => scope.admit_call(&req.method, Target::None),
        Read::Contract(to) => scope.admit_call(&req.method, Target::Contract(&to)),
        Read::Unknown => scope.admit_call(&req.method, Target::Unknown),
    }
}

#[cfg(test)]
mod tests {
    use sluice_jsonrpc::RawValue;

    use super::*;

    const A: &str = "0x5fbdb2315678afecb367f032d93f642f64180aa3";

    fn req(method: &str, params: &str) -> Request {
        Request::new(None, method, Some(RawValue::from_string(params.to_owned()).unwrap()))
    }

    #[test]
    fn calls_are_checked_by_their_to() {
        let scope = Scope { contracts: vec![A.into()], ..Scope::default() };
        assert!(admit(
            &scope,
            &req("eth_call", &format!(r#"[{{"to":"{}","data":"0x"}},"latest"]"#, A.to_uppercase().replace("0X", "0x")))
        )
        .is_ok());
        let other = r#"[{"to":"0x0000000000000000000000000000000000000001"},"latest"]"#;
        assert!(admit(&scope, &req("eth_estimateGas", other))
            .unwrap_err()
            .contains("0x0000000000000000000000000000000000000001"));
        assert!(admit(&scope, &req("eth_call", r#"[{"data":"0x00"}]"#)).is_err(), "no to: a creation");
        assert!(admit(&scope, &req("eth_call", r#"{"x":1}"#)).is_err());
        assert!(admit(&scope, &req("eth_sendRawTransaction", r#"["0x1234"]"#)).is_err(), "undecodable");
        // Every way of submitting a transaction is scoped alike (a conditional submission went
        // to any contract before the method table).
        for method in ["eth_sendRawTransactionSync", "eth_sendRawTransactionConditional"] {
            assert!(admit(&scope, &req(method, r#"["0x1234",{}]"#)).is_err(), "{method}: undecodable");
        }
        assert!(admit(&scope, &req("eth_getBalance", r#"["0x01","latest"]"#)).is_ok());
        assert!(admit(&Scope::default(), &req("eth_call", other)).is_ok());
    }
}
