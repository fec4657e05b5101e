//! Mesh nodes in one process, over real libp2p (QUIC) on loopback. Behind each node is the
//! named stand-in `MemoryPool`, which forwards what it takes as the real mempool's pending feed
//! does; the end-to-end test with sluice processes and anvil is in `crates/sluice/tests/mesh.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use alloy_primitives::keccak256;
use libp2p::{identity, Multiaddr};
use sluice_mempool::{TxIntake, TxSource};
use sluice_mesh::memory::MemoryPool;
use sluice_mesh::{Mesh, MeshSettings};

struct TestNode {
    mesh: Mesh,
    pool: Arc<MemoryPool>,
    key: identity::Keypair,
}

fn settings(peers: Vec<Multiaddr>, listen: Option<Multiaddr>) -> MeshSettings {
    MeshSettings {
        listen: vec![listen.map_or("/ip4/127.0.0.1/udp/0/quic-v1".to_string(), |a| a.to_string())],
        peers: peers.iter().map(|a| a.to_string()).collect(),
        // Tests run unoptimised, many nodes in one process, on two shared cores: give each
        // attempt and message more time than the defaults (2 s, 5 s), which are for release
        // builds. Any failure still fails the tests.
        request_timeout: Duration::from_secs(5),
        deadline: Duration::from_secs(15),
        ..MeshSettings::default()
    }
}

/// Starts a node dialing `peers`; what its pool takes for the first time, it broadcasts.
async fn node(settings: MeshSettings, key: identity::Keypair) -> TestNode {
    let (pool, mut fresh) = MemoryPool::new();
    let pool = Arc::new(pool);
    let mesh = Mesh::start(settings.parse().expect("settings"), key.clone(), pool.clone(), Some(pool.clone()))
        .await
        .expect("start");
    let forward = mesh.clone();
    tokio::spawn(async move {
        while let Some(raw) = fresh.recv().await {
            forward.broadcast(raw).expect("the broadcast queue has room");
        }
    });
    TestNode { mesh, pool, key }
}

/// Nodes where node i dials the nodes `dials(i)` (all earlier than i).
async fn network(n: usize, dials: impl Fn(usize) -> Vec<usize>) -> Vec<TestNode> {
    network_with(n, dials, |_| {}).await
}

/// The same, with settings changed by `tweak`.
async fn network_with(
    n: usize,
    dials: impl Fn(usize) -> Vec<usize>,
    tweak: impl Fn(&mut MeshSettings),
) -> Vec<TestNode> {
    let mut nodes: Vec<TestNode> = Vec::new();
    for i in 0..n {
        let peers = dials(i).into_iter().flat_map(|j| nodes[j].mesh.addresses()).collect();
        let mut settings = settings(peers, None);
        tweak(&mut settings);
        nodes.push(node(settings, identity::Keypair::generate_ed25519()).await);
    }
    nodes
}

/// Waits until every node is connected to every peer it knows and to those it dials.
async fn connected(nodes: &[TestNode], dials: impl Fn(usize) -> Vec<usize>) {
    let deadline = Instant::now() + Duration::from_secs(20);
    for (i, n) in nodes.iter().enumerate() {
        let want = dials(i).len() + (0..nodes.len()).filter(|j| dials(*j).contains(&i)).count();
        loop {
            let status = n.mesh.status().await.expect("status");
            let up = status.peers.iter().filter(|p| p.connected).count();
            if up >= want {
                break;
            }
            assert!(Instant::now() < deadline, "node {i}: {up} of {want} peers connected");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The heavy tests take turns: on two cores, two of them at once would measure the machine.
static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn tx(tag: u64, i: u64) -> Vec<u8> {
    let mut raw = vec![0x02];
    raw.extend_from_slice(&tag.to_be_bytes());
    raw.extend_from_slice(&i.to_be_bytes());
    raw
}

async fn submit(node: &TestNode, raw: Vec<u8>) {
    node.pool.submit(raw.into(), TxSource::Rpc).await.expect("taken");
}

/// Waits until every pool holds `n` transactions, up to `within`.
async fn converge(nodes: &[TestNode], n: usize, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let counts: Vec<usize> = nodes.iter().map(|x| x.pool.len()).collect();
        if counts.iter().all(|c| *c == n) {
            return;
        }
        if Instant::now() >= deadline {
            panic!("pools hold {counts:?}, want {n} each; first node: {:?}", nodes[0].mesh.status().await);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until no node has messages queued or in flight.
async fn drained(nodes: &[TestNode], within: Duration) {
    let deadline = Instant::now() + within;
    for n in nodes {
        loop {
            let status = n.mesh.status().await.expect("status");
            if status.pending() == 0 {
                break;
            }
            assert!(Instant::now() < deadline, "still pending: {status:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn failures(nodes: &[TestNode]) -> (u64, u64) {
    let mut failed = 0;
    let mut inbound_failed = 0;
    for n in nodes {
        let status = n.mesh.status().await.expect("status");
        failed += status.failed() + status.broadcasts_refused;
        inbound_failed += status.inbound.failed;
    }
    (failed, inbound_failed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_reaches_every_node_and_an_invalid_one_goes_no_further() {
    // A line: 0 - 1 - 2. What 0 takes must cross 1 to reach 2.
    let line = |i: usize| if i == 0 { vec![] } else { vec![i - 1] };
    let nodes = network(3, line).await;
    connected(&nodes, line).await;
    submit(&nodes[0], tx(1, 1)).await;
    converge(&nodes, 1, Duration::from_secs(10)).await;
    assert!(nodes[2].pool.arrived(&keccak256(tx(1, 1))).is_some());

    // Node 0 sends something invalid straight to its peer: 1 refuses it and does not forward it.
    let invalid = vec![0xff, 1, 2, 3];
    nodes[0].mesh.broadcast(invalid).expect("queued");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let middle = nodes[1].mesh.status().await.unwrap();
    let last = nodes[2].mesh.status().await.unwrap();
    assert_eq!(middle.inbound.received, 2, "{middle:?}");
    assert_eq!(last.inbound.received, 1, "only the valid one reached the end: {last:?}");
    assert_eq!(nodes.iter().map(|n| n.pool.len()).collect::<Vec<_>>(), vec![1, 1, 1]);
    // The refusal was an acknowledgement (delivered and judged), not a failure.
    let first = nodes[0].mesh.status().await.unwrap();
    assert_eq!((first.acked(), first.failed()), (2, 0), "{first:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_sends_malformed_transactions_is_banned_then_let_back() {
    // 1 is hostile and 2 honest, both dialing 0, which bans after 50 malformed for 3 s.
    let star = |i: usize| if i == 0 { vec![] } else { vec![0] };
    let nodes = network_with(3, star, |s| {
        s.ban_after_malformed = 50;
        s.ban_for = Duration::from_secs(3);
    })
    .await;
    connected(&nodes, star).await;
    let hostile = nodes[1].mesh.peer_id().to_string();
    // Sent as a hostile node would: straight to the mesh, never through its own pool's checks.
    for i in 0..60u64 {
        nodes[1].mesh.broadcast(vec![0xff, i as u8]).expect("queued");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let banned = loop {
        let status = nodes[0].mesh.status().await.expect("status");
        if status.inbound.bans == 1 {
            break status;
        }
        assert!(Instant::now() < deadline, "not banned: {status:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(banned.inbound.malformed > 50, "{banned:?}");
    let peer = banned.peers.iter().find(|p| p.peer == hostile).expect("the banned peer is listed");
    let left = peer.banned_for_s.expect("banned");
    assert!(left > 0.0 && left <= 3.0, "{peer:?}");
    let ban_ends = Instant::now() + Duration::from_secs_f64(left);
    // While banned, its connections are refused, and the honest peer is served as before.
    submit(&nodes[1], tx(7, 1)).await;
    submit(&nodes[2], tx(7, 2)).await;
    let from_hostile = |node: &TestNode| node.pool.arrived(&keccak256(tx(7, 1)));
    let deadline = Instant::now() + Duration::from_secs(20);
    while from_hostile(&nodes[0]).is_none() || nodes[0].pool.arrived(&keccak256(tx(7, 2))).is_none() {
        assert!(Instant::now() < deadline, "not let back: {:?}", nodes[0].mesh.status().await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Nothing from it got in before the ban was over (the status was read after the ban began,
    // so `ban_ends` is, if anything, late); once over, it dialed back in and handed its pool over.
    let arrived = from_hostile(&nodes[0]).expect("arrived");
    assert!(arrived + Duration::from_millis(100) >= ban_ends, "arrived {:?} before the ban ended", ban_ends - arrived);
    assert!(nodes[0].pool.arrived(&keccak256(tx(7, 2))).expect("arrived") < ban_ends, "the honest peer was served");
    let after = nodes[0].mesh.status().await.expect("status");
    let peer = after.peers.iter().find(|p| p.peer == hostile).expect("listed");
    assert!(peer.connected && peer.banned_for_s.is_none(), "{peer:?}");
    assert_eq!(after.inbound.bans, 1, "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_ten_thousand_each_nothing_lost_nothing_twice() {
    let _turn = HEAVY.lock().await;
    let full = |i: usize| (0..i).collect::<Vec<_>>();
    // Strictly one transaction per stream and 256 streams in flight per peer: the stream-limit
    // edge where rust-libp2p drops inbound streams over its cap with only a log line.
    let nodes = network_with(3, full, |s| {
        s.max_batch = 1;
        s.max_in_flight = 256;
    })
    .await;
    connected(&nodes, full).await;
    let per_node = 10_000u64;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (k, n) in nodes.iter().enumerate() {
        let pool = n.pool.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..per_node {
                pool.submit(tx(k as u64, i).into(), TxSource::Rpc).await.expect("taken");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    converge(&nodes, 3 * per_node as usize, Duration::from_secs(60)).await;
    eprintln!("30,000 transactions on 3 nodes everywhere in {:?}", started.elapsed());
    // Forwarded copies (to peers that already had them) finish too; then nothing failed, no
    // inbound stream was cut, and each pool holds each transaction once.
    drained(&nodes, Duration::from_secs(60)).await;
    assert_eq!(failures(&nodes).await, (0, 0));
    for n in &nodes {
        let status = n.mesh.status().await.expect("status");
        for p in &status.peers {
            assert_eq!(p.counts.streams, p.counts.sent, "one stream per transaction: {p:?}");
        }
        assert_eq!(status.inbound.requests, status.inbound.received);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_backlog_sends_carry_many_transactions_each_with_its_verdict() {
    let _turn = HEAVY.lock().await;
    let pair = |i: usize| (0..i).collect::<Vec<_>>();
    // Two streams in flight at most: 5,000 transactions at once must pile up and leave in
    // batches of up to 100.
    let nodes = network_with(2, pair, |s| {
        s.max_in_flight = 2;
        s.max_batch = 100;
    })
    .await;
    connected(&nodes, pair).await;
    let mut raws: Vec<Vec<u8>> = (0..5_000).map(|i| tx(9, i)).collect();
    // Invalid ones among them are judged one by one: refused, acknowledged, never retried.
    for i in (0..raws.len()).step_by(50) {
        raws[i][0] = 0xff;
    }
    for raw in &raws {
        nodes[0].mesh.broadcast(raw.clone()).expect("queued");
    }
    converge(&nodes[1..], 4_900, Duration::from_secs(60)).await;
    drained(&nodes, Duration::from_secs(30)).await;
    let status = nodes[0].mesh.status().await.expect("status");
    let c = status.peers[0].counts;
    assert_eq!((c.acked, c.failed, c.sent), (5_000, 0, 5_000), "{c:?}");
    assert!(c.streams * 10 <= c.sent, "sends were batched: {c:?}");
    let b = nodes[1].mesh.status().await.expect("status");
    assert_eq!((b.inbound.received, b.inbound.requests), (5_000, c.streams));
    assert_eq!(status.ack_ms.count, 5_000, "{:?}", status.ack_ms);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_restarts_receives_what_it_missed() {
    let pair = |i: usize| (0..i).collect::<Vec<_>>();
    let nodes = network(2, pair).await;
    connected(&nodes, pair).await;
    let a = &nodes[0];
    let b_addr = nodes[1].mesh.addresses()[0].clone();
    let b_key = nodes[1].key.clone();
    submit(a, tx(7, 0)).await;
    converge(&nodes, 1, Duration::from_secs(10)).await;

    // B goes away; A takes 100 more meanwhile.
    nodes[1].mesh.shutdown().await;
    for i in 1..=100 {
        submit(a, tx(7, i)).await;
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    // B comes back on the same address with the same key (and an empty pool): A re-dials it
    // and delivers everything still pending for it, within the 5 s deadline.
    let listen: Multiaddr = b_addr.iter().filter(|p| !matches!(p, libp2p::multiaddr::Protocol::P2p(_))).collect();
    let b = node(settings(vec![], Some(listen)), b_key).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while b.pool.len() < 101 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // What it missed (pending in A's outbox) and what it lost with its pool (A hands its pool
    // to a peer that connects).
    assert_eq!(b.pool.len(), 101, "B got what it missed");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        let status = a.mesh.status().await.unwrap();
        if status.pending() == 0 || Instant::now() > deadline {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.failed(), 0, "{status:?}");
    assert!(status.peers[0].counts.acked >= 101, "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_joins_late_gets_the_whole_pool() {
    let pair = |i: usize| (0..i).collect::<Vec<_>>();
    let nodes = network(2, pair).await;
    connected(&nodes, pair).await;
    for i in 0..300 {
        submit(&nodes[(i % 2) as usize], tx(11, i)).await;
    }
    converge(&nodes, 300, Duration::from_secs(20)).await;
    // A node that dials node 1 now gets all 300, though nothing is broadcast any more.
    let late = node(settings(nodes[1].mesh.addresses(), None), identity::Keypair::generate_ed25519()).await;
    converge(std::slice::from_ref(&late), 300, Duration::from_secs(20)).await;
    let status = nodes[1].mesh.status().await.expect("status");
    assert_eq!(status.failed(), 0, "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_nodes_everyone_gets_everything() {
    let _turn = HEAVY.lock().await;
    // Each node dials its predecessor and the node at half its index: a connected graph with
    // paths of a few hops, so most transactions are forwarded, not sent directly.
    let n = 50;
    let dials = |i: usize| -> Vec<usize> {
        if i == 0 {
            vec![]
        } else {
            [i - 1, i / 2].into_iter().collect::<std::collections::BTreeSet<_>>().into_iter().collect()
        }
    };
    let nodes = network(n, dials).await;
    connected(&nodes, dials).await;
    let count = 200u64;
    for i in 0..count {
        submit(&nodes[(i as usize * 7) % n], tx(50, i)).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    converge(&nodes, count as usize, Duration::from_secs(60)).await;
    drained(&nodes, Duration::from_secs(60)).await;
    assert_eq!(failures(&nodes).await, (0, 0));
    let duplicates: u64 = nodes.iter().map(|x| x.pool.duplicates()).sum();
    let mut skipped = 0;
    for n in &nodes {
        skipped += n.mesh.status().await.expect("status").peers.iter().map(|p| p.counts.skipped).sum::<u64>();
    }
    eprintln!(
        "50 nodes: {count} transactions everywhere; {duplicates} redundant deliveries (judged and dropped), \
         {skipped} copies not sent (the peer had sent them to us)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_discovery_nodes_find_each_other_through_one_bootstrap_node() {
    // Node 0 is the only address the others know; with Kademlia each finds the other two.
    let star = |i: usize| if i == 0 { vec![] } else { vec![0] };
    let nodes = network_with(4, star, |s| s.discovery = true).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    for (i, n) in nodes.iter().enumerate().skip(1) {
        loop {
            let status = n.mesh.status().await.expect("status");
            let up = status.peers.iter().filter(|p| p.connected).count();
            if up >= 3 {
                break;
            }
            assert!(Instant::now() < deadline, "node {i} connected to {up} of 3: {status:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // The bootstrap node goes away; what node 1 takes still reaches nodes 2 and 3.
    nodes[0].mesh.shutdown().await;
    submit(&nodes[1], tx(12, 1)).await;
    converge(&nodes[1..], 1, Duration::from_secs(20)).await;
}
