//! Which headers verified reads trust, end to end: blocks older than the head tracker's window
//! linked down to it, `agree` members naming a header, a checkpoint pinned, a block a reorg
//! left behind, and a colluding majority. Real anvils; the relays in front of them are named
//! fault injectors that alter answers.

mod common;

use common::verify::{craft, synced, verifying, ACCOUNT};
use serde_json::{json, Value};
use sluice_testkit::{rpc, rpc_result, Anvil, FakeUpstream, Fault};

/// What `/status` shows of verification.
async fn trust_status(client: &reqwest::Client, url: &str) -> Value {
    let status: Value = client.get(format!("{url}/status")).send().await.unwrap().json().await.unwrap();
    status["verify"].clone()
}

/// `-32002` for want of a trusted header, with a message that contains `why`.
fn refused_untrusted(answer: &Value, why: &str) {
    assert_eq!(answer["error"]["code"], -32002, "{answer}");
    assert_eq!(answer["error"]["data"]["why"], "no_trusted_header", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(why), "{why:?} not in {answer}");
}

/// A block older than the head tracker's window is linked down from the window's oldest block
/// by `parentHash` and answered from a proof at it, by height, by hash and at `earliest`;
/// past `link_limit` headers it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_older_than_the_window_is_linked_down_to_it_within_link_limit() {
    let client = reqwest::Client::new();
    let anvil = Anvil::spawn();
    let node = anvil.http_url();
    craft(&client, &node).await;
    rpc_result(&client, &node, "anvil_mine", json!(["0x40"])).await;
    let served = verifying(&node, "[cache]\nwindow = 16");
    let url = served.sluice.http_url();
    synced(&client, &url, &node).await;
    let block4 = rpc_result(&client, &node, "eth_getBlockByNumber", json!(["0x4", false])).await;
    // Block 1, not 0: anvil answers reads at its genesis from a later state (and the proof of
    // it does not hold against the genesis header), so verification refuses those.
    for at in [json!("0x4"), json!({ "blockHash": block4["hash"] }), json!("0x1")] {
        for method in ["eth_getBalance", "eth_getTransactionCount"] {
            let truth = rpc_result(&client, &node, method, json!([ACCOUNT, at])).await;
            let answer = rpc(&client, &url, method, json!([ACCOUNT, at])).await;
            assert_eq!(answer["result"], truth, "{method} at {at}: {answer}");
        }
    }
    let verify = trust_status(&client, &url).await;
    let linked = verify["trusted_so_far"]["linked"].as_u64().unwrap_or(0);
    assert!(linked >= 50, "the window's oldest block is about 52, linked down to 1: {verify}");
    // With a link limit shorter than the way down, the same read is refused.
    let short = verifying(&node, "link_limit = 8\n[cache]\nwindow = 16");
    let short_url = short.sluice.http_url();
    synced(&client, &short_url, &node).await;
    let refused = rpc(&client, &short_url, "eth_getBalance", json!([ACCOUNT, "0x4"])).await;
    refused_untrusted(&refused, "link_limit = 8");
    let recent = rpc(&client, &short_url, "eth_getBalance", json!([ACCOUNT, "latest"])).await;
    assert!(recent["result"].is_string(), "{recent}");
}

/// With `agree = 2`, a header is trusted only when two members name its hash at its height:
/// two unrelated chains never agree, so reads are refused; two members of one chain agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_agree_2_a_header_one_member_alone_names_is_not_trusted() {
    let client = reqwest::Client::new();
    let (honest, other) = (Anvil::spawn(), Anvil::spawn());
    // Another state, so another chain: two anvils started in the same second that mine the
    // same blocks in the same second have the same hashes.
    rpc_result(&client, &other.http_url(), "anvil_setBalance", json!([common::DEV_ACCOUNT, "0x1"])).await;
    craft(&client, &honest.http_url()).await;
    craft(&client, &other.http_url()).await;
    let config = |a: &str, b: &str| {
        format!(
            "[mempool]\nenabled = false\n[cache]\nenabled = false\n[verify]\nenabled = true\nagree = 2\n\
             [[upstreams]]\nurl = \"{a}\"\n[[upstreams]]\nurl = \"{b}\"\n"
        )
    };
    let split = common::with_config(&config(&honest.http_url(), &other.http_url()));
    let split_url = split.sluice.http_url();
    synced(&client, &split_url, &honest.http_url()).await;
    let refused = rpc(&client, &split_url, "eth_getBalance", json!([ACCOUNT, "latest"])).await;
    refused_untrusted(&refused, "agree = 2");
    // The same node twice (once through a relay): both name every header.
    let relay = FakeUpstream::spawn(Fault::Relay {
        to: honest.http_url(),
        delay: std::time::Duration::ZERO,
        fail_method: None,
    })
    .await;
    let agreed = common::with_config(&config(&honest.http_url(), &relay.url));
    let url = agreed.sluice.http_url();
    synced(&client, &url, &honest.http_url()).await;
    let truth = rpc_result(&client, &honest.http_url(), "eth_getBalance", json!([ACCOUNT, "latest"])).await;
    let answer = rpc(&client, &url, "eth_getBalance", json!([ACCOUNT, "latest"])).await;
    assert_eq!(answer["result"], truth, "{answer}");
    let verify = trust_status(&client, &url).await;
    assert_eq!(verify["trust"], "named by 2 members", "{verify}");
    assert_eq!(verify["trusted_so_far"]["agreed"], 1, "{verify}");
}

/// With a checkpoint pinned, headers are trusted only when they descend from it: reads above
/// and below it are answered; a checkpoint of another chain refuses every read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_checkpoint_only_its_descendants_and_ancestors_are_trusted() {
    let client = reqwest::Client::new();
    let anvil = Anvil::spawn();
    let node = anvil.http_url();
    craft(&client, &node).await;
    rpc_result(&client, &node, "anvil_mine", json!(["0x10"])).await;
    let pinned = rpc_result(&client, &node, "eth_getBlockByNumber", json!(["0x5", false])).await;
    let checkpoint = |hash: &Value| format!("checkpoint = {{ number = 5, hash = {hash} }}\n[cache]\nenabled = false");
    let served = verifying(&node, &checkpoint(&pinned["hash"]));
    let url = served.sluice.http_url();
    synced(&client, &url, &node).await;
    for at in ["latest", "0x3", "0x5", "0x9"] {
        let truth = rpc_result(&client, &node, "eth_getBalance", json!([ACCOUNT, at])).await;
        let answer = rpc(&client, &url, "eth_getBalance", json!([ACCOUNT, at])).await;
        assert_eq!(answer["result"], truth, "at {at}: {answer}");
    }
    let verify = trust_status(&client, &url).await;
    assert_eq!(verify["checkpoint"]["number"], 5, "{verify}");
    assert_eq!(verify["trusted_so_far"]["checkpoint"], 1, "{verify}");
    // Block 5 of another chain: nothing this node serves descends from it.
    let other = Anvil::spawn();
    rpc_result(&client, &other.http_url(), "anvil_mine", json!(["0x6"])).await;
    let foreign = rpc_result(&client, &other.http_url(), "eth_getBlockByNumber", json!(["0x5", false])).await;
    let misled = verifying(&node, &checkpoint(&foreign["hash"]));
    let misled_url = misled.sluice.http_url();
    synced(&client, &misled_url, &node).await;
    for at in ["latest", "0x3"] {
        let refused = rpc(&client, &misled_url, "eth_getBalance", json!([ACCOUNT, at])).await;
        refused_untrusted(&refused, "checkpoint");
    }
}

/// A block read by hash, then replaced by a reorg: its header is no longer trusted, and a
/// read at its hash is refused rather than answered from the abandoned chain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_a_reorg_left_behind_is_no_longer_trusted() {
    let client = reqwest::Client::new();
    let anvil = Anvil::spawn();
    let node = anvil.http_url();
    craft(&client, &node).await;
    let served = verifying(&node, "[cache]\nenabled = false");
    let url = served.sluice.http_url();
    synced(&client, &url, &node).await;
    let head = rpc_result(&client, &node, "eth_getBlockByNumber", json!(["latest", false])).await;
    let at = json!({ "blockHash": head["hash"] });
    let before = rpc(&client, &url, "eth_getBalance", json!([ACCOUNT, at])).await;
    assert!(before["result"].is_string(), "{before}");
    rpc_result(&client, &node, "anvil_reorg", json!([2, []])).await;
    let replaced = rpc_result(&client, &node, "eth_getBlockByNumber", json!(["latest", false])).await;
    assert_ne!(replaced["hash"], head["hash"], "the reorg replaced the head");
    common::eventually(std::time::Duration::from_secs(10), "sluice follows the reorg", || async {
        // A verified block read may be refused in the moment the tracker still names the
        // abandoned head: never answered from it.
        let seen = rpc(&client, &url, "eth_getBlockByNumber", json!(["latest", false])).await;
        seen["result"]["hash"] == replaced["hash"]
    })
    .await;
    let after = rpc(&client, &url, "eth_getBalance", json!([ACCOUNT, at])).await;
    refused_untrusted(&after, "not on the chain sluice follows");
}

/// Alters every balance, in direct answers and in proofs alike: what colluding members say.
fn colluding(req: &Value, answer: &mut Value) {
    match req["method"].as_str() {
        Some("eth_getBalance") if answer["result"].is_string() => answer["result"] = json!("0xde0b6b3a7640000000"),
        Some("eth_getProof") if answer["result"].is_object() => {
            answer["result"]["balance"] = json!("0xde0b6b3a7640000000");
        }
        _ => {}
    }
}

/// Two of three members collude on a balance. A consensus vote picks their answer; a
/// verified read never does: each member's proof holds or fails on its own, so the honest
/// member's is the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_colluding_members_of_three_cannot_pass_the_lie_a_vote_passes() {
    let client = reqwest::Client::new();
    let anvil = Anvil::spawn();
    let node = anvil.http_url();
    craft(&client, &node).await;
    let first = FakeUpstream::spawn(Fault::Alter { to: node.clone(), alter: colluding }).await;
    let second = FakeUpstream::spawn(Fault::Alter { to: node.clone(), alter: colluding }).await;
    let config = |verify: bool| {
        format!(
            "[mempool]\nenabled = false\n[cache]\nenabled = false\n[verify]\nenabled = {verify}\n\
             [[pool.consensus]]\nmethods = [\"eth_getBalance\", \"eth_getProof\"]\nask = 3\nagree = 2\n\
             [[upstreams]]\nurl = \"{}\"\n[[upstreams]]\nurl = \"{}\"\n[[upstreams]]\nurl = \"{node}\"\n",
            first.url, second.url
        )
    };
    let truth = rpc_result(&client, &node, "eth_getBalance", json!([ACCOUNT, "latest"])).await;
    let voted = common::with_config(&config(false));
    let voted_url = voted.sluice.http_url();
    synced(&client, &voted_url, &node).await;
    let lie = rpc(&client, &voted_url, "eth_getBalance", json!([ACCOUNT, "latest"])).await;
    assert_eq!(lie["result"], "0xde0b6b3a7640000000", "the vote passes the majority's lie: {lie}");
    let verified = common::with_config(&config(true));
    let url = verified.sluice.http_url();
    synced(&client, &url, &node).await;
    for i in 0..4 {
        let answer = rpc(&client, &url, "eth_getBalance", json!([ACCOUNT, "latest"])).await;
        assert_eq!(answer["result"], truth, "read {i}: {answer}");
    }
}
