//! Shared set-up for the integration tests: a real anvil with a small contract deployed, and the
//! real sluice binary in front of it.
#![allow(dead_code)]

use serde_json::{json, Value};
use sluice_testkit::{rpc_result, Anvil, Sluice};

pub mod verify;

/// The sluice binary built by cargo for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_sluice");

/// anvil's first funded account and its well-known key.
pub const DEV_ACCOUNT: &str = "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266";
/// Private key of [`DEV_ACCOUNT`].
pub const DEV_KEY: &str = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80";

/// Init code of a tiny hand-assembled contract. The constructor stores 42 in slot 0 and emits
/// one log (topic 0xaa…aa). At run time a call with calldata returns slot 0; a call without
/// calldata reverts with 42 as revert data.
pub const CONTRACT_INIT: &str = concat!(
    "602a600055",                                                         // SSTORE(0, 42)
    "7faaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", // PUSH32 topic
    "60006000a1",                                                         // LOG1(0, 0, topic)
    "601b80603660003960 00f3",                                            // CODECOPY + RETURN runtime
    "361560105760005460005260206000f35b602a60005260206000fd",             // runtime (27 bytes)
);

/// A devnet with the contract deployed, and sluice in front of it.
pub struct Net {
    pub anvil: Anvil,
    pub sluice: Sluice,
    pub client: reqwest::Client,
    pub contract: String,
    pub deploy_tx: String,
    pub deploy_block: String,
}

impl Net {
    /// Starts anvil, deploys the contract, starts sluice with `extra` arguments.
    pub async fn start(extra: &[&str]) -> Net {
        let anvil = Anvil::spawn();
        let client = reqwest::Client::new();
        let direct = anvil.http_url();
        let data = format!("0x{}", CONTRACT_INIT.replace(' ', ""));
        let deploy_tx =
            rpc_result(&client, &direct, "eth_sendTransaction", json!([{"from": DEV_ACCOUNT, "data": data}]))
                .await
                .as_str()
                .expect("a tx hash")
                .to_owned();
        let receipt = wait_receipt(&client, &direct, &deploy_tx).await;
        assert_eq!(receipt["status"], "0x1", "contract deployed: {receipt}");
        let contract = receipt["contractAddress"].as_str().expect("contract address").to_owned();
        let deploy_block = receipt["blockHash"].as_str().expect("block hash").to_owned();
        let sluice = Sluice::serve(BIN, &direct, extra);
        Net { anvil, sluice, client, contract, deploy_tx, deploy_block }
    }

    /// Sends the same raw body to sluice and to anvil; returns (through sluice, direct).
    pub async fn both(&self, body: &str) -> (Value, Value) {
        let via = sluice_testkit::post(&self.client, &self.sluice.http_url(), body.to_owned()).await.1;
        let direct = sluice_testkit::post(&self.client, &self.anvil.http_url(), body.to_owned()).await.1;
        (via, direct)
    }

    /// The request corpus: (method, params) covering reads at every tag, by hash, state,
    /// calls (returning and reverting), gas, logs, transactions, receipts, fee history, an
    /// unknown method and invalid params.
    pub fn corpus(&self) -> Vec<(&'static str, Value)> {
        let c = &self.contract;
        let mut corpus = vec![
            ("eth_chainId", json!([])),
            ("eth_blockNumber", json!([])),
            ("eth_getBlockByHash", json!([self.deploy_block, true])),
            ("eth_getBlockByHash", json!([self.deploy_block, false])),
            ("eth_getBalance", json!([DEV_ACCOUNT, "latest"])),
            ("eth_getTransactionCount", json!([DEV_ACCOUNT, "latest"])),
            ("eth_getCode", json!([c, "latest"])),
            ("eth_getStorageAt", json!([c, "0x0", "latest"])),
            ("eth_call", json!([{"to": c, "data": "0x01"}, "latest"])),
            ("eth_call", json!([{"to": c}, "latest"])),
            ("eth_estimateGas", json!([{"from": DEV_ACCOUNT, "to": c, "data": "0x01"}])),
            ("eth_getLogs", json!([{"fromBlock": "0x0", "toBlock": "latest"}])),
            ("eth_getLogs", json!([{"fromBlock": "0x0", "toBlock": "latest", "address": c}])),
            ("eth_getTransactionByHash", json!([self.deploy_tx])),
            ("eth_getTransactionReceipt", json!([self.deploy_tx])),
            ("eth_feeHistory", json!(["0x2", "latest", [25, 75]])),
            ("eth_getBlockByNumber", json!(["0xffff", false])),
            ("eth_doesNotExist", json!([])),
            ("eth_getBalance", json!(["not-an-address", "latest"])),
        ];
        for tag in ["latest", "earliest", "pending", "safe", "finalized", "0x1", "0x0"] {
            corpus.push(("eth_getBlockByNumber", json!([tag, false])));
            corpus.push(("eth_getBlockByNumber", json!([tag, true])));
        }
        corpus
    }
}

/// A request body for one call.
pub fn call(id: Value, method: &str, params: &Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

/// Polls for a transaction's receipt (anvil mines right after the send returns).
pub async fn wait_receipt(client: &reqwest::Client, url: &str, tx: &str) -> Value {
    for _ in 0..200 {
        let receipt = rpc_result(client, url, "eth_getTransactionReceipt", json!([tx])).await;
        if !receipt.is_null() {
            return receipt;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("no receipt for {tx} after 2 s");
}

/// WebSocket clients for the tests.
pub mod ws {
    use std::time::Duration;

    use futures_util::{SinkExt, StreamExt};
    use serde_json::{json, Value};
    use tokio_tungstenite::tungstenite::Message;

    pub type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

    pub async fn connect(url: &str) -> Socket {
        tokio_tungstenite::connect_async(url).await.expect("websocket connects").0
    }

    /// Connects with extra request headers (`Authorization`, say).
    pub async fn connect_with(url: &str, headers: &[(&str, &str)]) -> Socket {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let mut request = url.into_client_request().expect("a WebSocket URL");
        for (name, value) in headers {
            let name = tokio_tungstenite::tungstenite::http::HeaderName::from_bytes(name.as_bytes()).expect("a name");
            request.headers_mut().insert(name, value.parse().expect("a header value"));
        }
        tokio_tungstenite::connect_async(request).await.expect("websocket connects").0
    }

    /// Waits up to `within` for the server to close the socket; its close code and reason.
    pub async fn closed(ws: &mut Socket, within: Duration) -> (u16, String) {
        let wait = async {
            while let Some(message) = ws.next().await {
                match message {
                    Ok(Message::Close(Some(frame))) => return (u16::from(frame.code), frame.reason.to_string()),
                    Ok(Message::Close(None)) | Err(_) => return (0, String::new()),
                    Ok(_) => {}
                }
            }
            (0, String::new())
        };
        tokio::time::timeout(within, wait).await.expect("the socket closed in time")
    }

    pub async fn send(ws: &mut Socket, body: Value) {
        ws.send(Message::text(body.to_string())).await.expect("sent");
    }

    /// The next JSON message, within two seconds.
    pub async fn next(ws: &mut Socket) -> Value {
        next_within(ws, Duration::from_secs(2)).await
    }

    /// The next JSON message, within `within`.
    pub async fn next_within(ws: &mut Socket, within: Duration) -> Value {
        loop {
            let message = tokio::time::timeout(within, ws.next())
                .await
                .unwrap_or_else(|_| panic!("a message within {within:?}"))
                .expect("socket open")
                .expect("message ok");
            if let Message::Text(text) = message {
                return serde_json::from_str(&text).expect("JSON");
            }
        }
    }

    pub async fn subscribe(ws: &mut Socket, id: u64, params: Value) -> String {
        send(ws, json!({"jsonrpc": "2.0", "id": id, "method": "eth_subscribe", "params": params})).await;
        let answer = next(ws).await;
        assert_eq!(answer["id"], id, "{answer}");
        answer["result"].as_str().unwrap_or_else(|| panic!("subscribed: {answer}")).to_owned()
    }
}

/// Gives `address` a balance of `wei` (hex quantity) on anvil, with `anvil_setBalance`.
pub async fn fund(client: &reqwest::Client, anvil: &Anvil, address: impl std::fmt::Display, wei: &str) {
    rpc_result(client, &anvil.http_url(), "anvil_setBalance", json!([address.to_string(), wei])).await;
}

/// Gives each address a large balance on anvil, in one JSON-RPC batch.
pub async fn fund_all<A: std::fmt::Display>(
    client: &reqwest::Client,
    anvil: &Anvil,
    addresses: impl IntoIterator<Item = A>,
) {
    let batch: Vec<Value> = addresses
        .into_iter()
        .enumerate()
        .map(|(i, a)| json!({"jsonrpc":"2.0","id":i,"method":"anvil_setBalance","params":[a.to_string(), "0xffffffffffffffffffff"]}))
        .collect();
    let funded: Value = client.post(anvil.http_url()).json(&batch).send().await.unwrap().json().await.unwrap();
    assert!(funded.as_array().unwrap().iter().all(|r| r.get("error").is_none()), "funded: {funded}");
}

/// The hashes `txpool_content` lists under `parts` (`"pending"`, `"queued"`).
pub async fn txpool_hashes(client: &reqwest::Client, url: &str, parts: &[&str]) -> std::collections::HashSet<String> {
    let content = rpc_result(client, url, "txpool_content", json!([])).await;
    let mut hashes = std::collections::HashSet::new();
    for part in parts {
        for txs in content[*part].as_object().into_iter().flat_map(|m| m.values()) {
            for tx in txs.as_object().into_iter().flat_map(|m| m.values()) {
                hashes.insert(tx["hash"].as_str().unwrap_or_default().to_owned());
            }
        }
    }
    hashes
}

/// Polls `check` every 20 ms until it holds, for at most `within` (waits for a condition, not a time).
pub async fn eventually<F, Fut>(within: std::time::Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + within;
    while !check().await {
        assert!(std::time::Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// sluice's `/status` as JSON.
pub async fn status(client: &reqwest::Client, sluice: &Sluice) -> Value {
    client.get(format!("{}/status", sluice.http_url())).send().await.unwrap().json().await.unwrap()
}

/// `/status` once `ok` holds for it (within 20 s, or the test fails naming `what`).
pub async fn wait_status(client: &reqwest::Client, sluice: &Sluice, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let s = status(client, sluice).await;
        if ok(&s) {
            return s;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: {s}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// sluice started with a configuration file, which lives as long as the process.
pub struct Configured {
    /// The running sluice.
    pub sluice: Sluice,
    _file: tempfile::NamedTempFile,
}

/// Starts `sluice serve` on a free port with `toml` as its configuration file.
pub fn with_config(toml: &str) -> Configured {
    with_config_args(toml, &[])
}

/// As [`with_config`], with more arguments for `serve` (such as `--log warn`).
pub fn with_config_args(toml: &str, extra: &[&str]) -> Configured {
    let file = tempfile::NamedTempFile::new().expect("a temporary file");
    std::fs::write(file.path(), toml).expect("config written");
    let path = file.path().to_str().expect("a UTF-8 path").to_owned();
    let mut args = vec!["serve", "--listen", "127.0.0.1:0", "--config", &path];
    args.extend_from_slice(extra);
    Configured { sluice: Sluice::spawn(BIN, &args), _file: file }
}
