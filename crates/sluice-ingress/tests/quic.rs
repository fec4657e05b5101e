//! The ingress over real QUIC on loopback. The pool behind it is the named stand-in
//! `CountingIntake`, which isolates the ingress's own behaviour; the end-to-end test with the real
//! mempool and anvil is in `crates/sluice/tests/ingress.rs`.

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use sluice_ingress::netem::{delayed_socket, Netem};
use sluice_ingress::null::CountingIntake;
use sluice_ingress::qos::Class;
use sluice_ingress::{codes, Client, ClientError, ClientOptions, Identity, Ingress, IngressConfig, KeyPair};
use tokio::time::Instant;

fn config() -> IngressConfig {
    IngressConfig { listen: "127.0.0.1:0".parse().expect("addr"), ..IngressConfig::default() }
}

fn start(config: IngressConfig) -> (Ingress, Arc<CountingIntake>) {
    let intake = Arc::new(CountingIntake::default());
    let ingress = Ingress::start(config, &KeyPair::generate(), intake.clone()).expect("start");
    (ingress, intake)
}

async fn connect(ingress: &Ingress, key: &KeyPair, rtt: Duration) -> Client {
    let socket = delayed_socket("127.0.0.1:0".parse().expect("addr"), Netem { rtt, ..Netem::default() }).expect("bind");
    let options = ClientOptions { server_identity: Some(ingress.identity()), socket: Some(socket) };
    Client::connect(ingress.local_addr(), key, options).await.expect("connect")
}

/// Offers `rate` transactions per second for `for_`, each on its own stream, never waiting for
/// earlier ones (an open-loop client; opening a stream waits for credit, as it should).
fn offer(client: Arc<Client>, rate: f64, for_: Duration) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let start = Instant::now();
        let mut sent = 0u64;
        let mut tasks = tokio::task::JoinSet::new();
        while start.elapsed() < for_ {
            tokio::time::sleep_until(start + Duration::from_secs_f64(sent as f64 / rate)).await;
            let client = client.clone();
            let tx = format!("tx-{sent}-{:p}", Arc::as_ptr(&client)).into_bytes();
            tasks.spawn(async move { client.send(&tx).await.is_ok() });
            sent += 1;
            while tasks.try_join_next().is_some() {}
        }
        tasks.abort_all();
        sent
    })
}

/// Waits (up to 5 s) until the counting intake has taken `n`: a stream acknowledged by QUIC is
/// received, not necessarily pooled yet.
async fn taken(intake: &CountingIntake, n: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(5);
    while intake.taken.load(Relaxed) < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    intake.taken.load(Relaxed)
}

fn accepted(ingress: &Ingress, class: Class) -> u64 {
    ingress.snapshot().class(class).accepted
}

/// Runs `clients` (class, RTT, offered rate) together for 3.5 s and answers each class's
/// accepted rate over the last 2.5 s (the first second is warm-up: credit follows the RTT
/// within a tick, and a quiet ingress throttles nobody at first).
async fn run_mix(ingress: &Ingress, clients: &[(&KeyPair, Option<Identity>, Duration, f64)]) -> Vec<f64> {
    let mut handles = Vec::new();
    let mut classes = Vec::new();
    let mut connected = Vec::new();
    for (key, weighted, rtt, _) in clients {
        connected.push(Arc::new(connect(ingress, key, *rtt).await));
        classes.push(match weighted {
            Some(id) => Class::Known(*id),
            None => Class::Unknown,
        });
    }
    for (client, (_, _, _, rate)) in connected.iter().zip(clients) {
        handles.push(offer(client.clone(), *rate, Duration::from_millis(3_500)));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before: Vec<u64> = classes.iter().map(|c| accepted(ingress, *c)).collect();
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let after: Vec<u64> = classes.iter().map(|c| accepted(ingress, *c)).collect();
    let secs = t0.elapsed().as_secs_f64();
    for h in handles {
        let _ = h.await;
    }
    before.iter().zip(after).map(|(b, a)| (a - b) as f64 / secs).collect()
}

fn weighted(ids: &[(&KeyPair, f64)], capacity: f64) -> IngressConfig {
    IngressConfig { capacity, weights: ids.iter().map(|(k, w)| (k.identity().to_string(), *w)).collect(), ..config() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_arrive_one_per_stream_and_bidirectional_streams_answer() {
    let (ingress, intake) = start(config());
    let client = connect(&ingress, &KeyPair::generate(), Duration::ZERO).await;
    for i in 0..50u32 {
        client.send_acknowledged(format!("tx {i}").as_bytes()).await.expect("send");
    }
    let hash = client.submit(b"one more").await.expect("submit");
    assert_eq!(hash.len(), 66, "{hash}");
    match client.submit(b"reject").await {
        Err(ClientError::Rejected { code, message }) => {
            assert_eq!(code, -32002);
            assert!(message.contains("reject"), "{message}");
        }
        other => panic!("expected the pool's refusal, got {other:?}"),
    }
    assert_eq!(taken(&intake, 51).await, 51);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let unknown = ingress.snapshot().class(Class::Unknown);
    assert_eq!((unknown.accepted, unknown.rejected), (51, 1));
    client.close().await;
    ingress.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_streams_get_their_codes_and_the_server_stays_up() {
    let config = IngressConfig { max_tx_bytes: 1_024, stream_timeout: Duration::from_millis(300), ..config() };
    let (ingress, intake) = start(config);
    let client = connect(&ingress, &KeyPair::generate(), Duration::ZERO).await;

    // Oversized: stopped with TOO_LARGE, never reaches the pool.
    match client.send_acknowledged(&vec![7u8; 64 * 1024]).await {
        Err(ClientError::Stopped(code)) => assert_eq!(code, codes::TOO_LARGE as u64),
        other => panic!("expected TOO_LARGE, got {other:?}"),
    }
    // Oversized on a bidirectional stream, just over the cap (it fits in the send buffer, so the
    // stop can arrive after the client finished): still the stop code, never a garbled answer.
    for extra in 1..=20 {
        match client.submit(&vec![7u8; 1_024 + extra]).await {
            Err(ClientError::Stopped(code)) => assert_eq!(code, codes::TOO_LARGE as u64),
            other => panic!("expected TOO_LARGE for {} bytes, got {other:?}", 1_024 + extra),
        }
    }
    // Never finished: stopped with TIMED_OUT.
    let mut stalled = client.connection().open_uni().await.expect("open");
    stalled.write_all(b"half a transaction").await.expect("write");
    match tokio::time::timeout(Duration::from_secs(5), stalled.stopped()).await {
        Ok(Ok(Some(code))) => assert_eq!(code.into_inner(), codes::TIMED_OUT as u64),
        other => panic!("expected TIMED_OUT, got {other:?}"),
    }
    // Cut short by the client: counted as truncated.
    let mut cut = client.connection().open_uni().await.expect("open");
    cut.write_all(b"partial").await.expect("write");
    cut.reset(quinn::VarInt::from_u32(9)).expect("reset");
    // Empty: counted, nothing pooled.
    client.send_acknowledged(b"").await.expect("empty stream is delivered");
    // Datagrams are not offered by the server at all.
    assert!(client.connection().send_datagram(bytes::Bytes::from_static(b"x")).is_err());

    tokio::time::sleep(Duration::from_millis(300)).await;
    let stats = ingress.snapshot().class(Class::Unknown);
    assert_eq!((stats.oversized, stats.timed_out, stats.truncated, stats.empty), (21, 1, 1, 1), "{stats:?}");
    assert_eq!(intake.taken.load(Relaxed), 0);

    // Still serving, on the same connection and on a new one.
    client.send_acknowledged(b"fine").await.expect("send after abuse");
    let other = connect(&ingress, &KeyPair::generate(), Duration::ZERO).await;
    other.send_acknowledged(b"fine too").await.expect("send");
    assert_eq!(taken(&intake, 2).await, 2);
    ingress.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bidirectional_streams_are_refused_when_turned_off() {
    let (ingress, intake) = start(IngressConfig { bidirectional: false, ..config() });
    let client = connect(&ingress, &KeyPair::generate(), Duration::ZERO).await;
    let refused = tokio::time::timeout(Duration::from_secs(5), client.submit(b"tx")).await;
    assert!(matches!(refused, Ok(Err(_)) | Err(_)), "{refused:?}");
    let again = connect(&ingress, &KeyPair::generate(), Duration::ZERO).await;
    again.send_acknowledged(b"tx").await.expect("uni streams still work");
    assert_eq!(taken(&intake, 1).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_three_to_one_hold_under_twice_the_capacity_whatever_the_rtts() {
    let (heavy, light) = (KeyPair::generate(), KeyPair::generate());
    let capacity = 1_200.0;
    let (ingress, _) = start(weighted(&[(&heavy, 3.0), (&light, 1.0)], capacity));
    // Each offers the whole capacity (2× overload in total); the heavy one is far away.
    let got = run_mix(
        &ingress,
        &[
            (&heavy, Some(heavy.identity()), Duration::from_millis(80), capacity),
            (&light, Some(light.identity()), Duration::from_millis(5), capacity),
        ],
    )
    .await;
    let ratio = got[0] / got[1];
    assert!((2.55..3.45).contains(&ratio), "rates {got:?}, ratio {ratio:.2}");
    assert!(got[0] + got[1] <= capacity * 1.15, "the capacity holds: {got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inflating_the_rtt_gains_nothing() {
    let (honest, spoofer) = (KeyPair::generate(), KeyPair::generate());
    let capacity = 1_000.0;
    let (ingress, _) = start(weighted(&[(&honest, 1.0), (&spoofer, 1.0)], capacity));
    let got = run_mix(
        &ingress,
        &[
            (&honest, Some(honest.identity()), Duration::from_millis(2), capacity),
            (&spoofer, Some(spoofer.identity()), Duration::from_millis(300), capacity),
        ],
    )
    .await;
    let snapshot = ingress.snapshot();
    let (honest_credit, spoofer_credit) = (
        snapshot.class(Class::Known(honest.identity())).credit,
        snapshot.class(Class::Known(spoofer.identity())).credit,
    );
    assert!(
        spoofer_credit > honest_credit,
        "the spoofer's credit grows with its RTT: {spoofer_credit} vs {honest_credit}"
    );
    assert!(got[1] <= capacity / 2.0 * 1.15, "the spoofer stays within its share: {got:?}");
    assert!((0.85..1.15).contains(&(got[1] / got[0])), "{got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_clients_share_only_their_class() {
    let known = KeyPair::generate();
    let capacity = 1_000.0;
    let config = IngressConfig { unknown_share: 0.1, ..weighted(&[(&known, 1.0)], capacity) };
    let (ingress, _) = start(config);
    let got = run_mix(
        &ingress,
        &[
            (&known, Some(known.identity()), Duration::ZERO, capacity),
            (&KeyPair::generate(), None, Duration::ZERO, capacity),
            (&KeyPair::generate(), None, Duration::ZERO, capacity),
        ],
    )
    .await;
    // The two unknown clients are one class: together they get its 10 %.
    let unknown = ingress.snapshot().class(Class::Unknown);
    assert!(unknown.throttled > 0);
    let share = capacity * 0.1;
    assert!(got[1] <= share * 1.15 && got[1] >= share * 0.7, "unknown class {:.0}/s: {got:?}", got[1]);
    assert!(got[0] >= capacity * 0.9 * 0.85, "the known client keeps its share: {got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_connections_from_one_ip_is_capped() {
    let config = IngressConfig {
        max_connections_per_ip: 4,
        max_connections_per_identity: 2,
        handshakes_per_ip_per_second: 1_000.0,
        handshake_burst: 1_000,
        ..config()
    };
    let (ingress, _) = start(config);
    let server = ingress.local_addr();
    let mut open = Vec::new();
    let mut refused = 0;
    for _ in 0..12 {
        match Client::connect(server, &KeyPair::generate(), ClientOptions::default()).await {
            Ok(c) if c.send_acknowledged(b"tx").await.is_ok() => open.push(c),
            _ => refused += 1,
        }
    }
    assert_eq!((open.len(), refused), (4, 8));
    assert_eq!(ingress.snapshot().refused.get("per_ip"), Some(&8));
    assert_eq!(ingress.open_connections(), 4);
    drop(open);

    // One identity, many connections: capped per identity.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let key = KeyPair::generate();
    let mut same = Vec::new();
    for _ in 0..3 {
        // An answer from the pool, not only a transport ACK: quinn acknowledges stream data
        // before the server has checked the identity and closed the connection.
        match Client::connect(server, &key, ClientOptions::default()).await {
            Ok(c) if c.submit(b"tx").await.is_ok() => same.push(c),
            _ => {}
        }
    }
    assert_eq!(same.len(), 2);
    assert_eq!(ingress.snapshot().refused.get("per_identity"), Some(&1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshakes_from_one_ip_are_rate_limited() {
    let config = IngressConfig { handshakes_per_ip_per_second: 2.0, handshake_burst: 3, ..config() };
    let (ingress, _) = start(config);
    let server: SocketAddr = ingress.local_addr();
    let mut ok = 0;
    for _ in 0..10 {
        if let Ok(c) = Client::connect(server, &KeyPair::generate(), ClientOptions::default()).await {
            if c.send_acknowledged(b"tx").await.is_ok() {
                ok += 1;
            }
        }
    }
    assert_eq!(ok, 3);
    assert_eq!(ingress.snapshot().refused.get("handshake_rate"), Some(&7));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credit_follows_the_measured_rtt() {
    let key = KeyPair::generate();
    let capacity = 2_000.0;
    let (ingress, _) = start(weighted(&[(&key, 1.0)], capacity));
    let client = connect(&ingress, &key, Duration::from_millis(100)).await;
    client.send_acknowledged(b"tx").await.expect("send");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let rtt = client.rtt();
    assert!(rtt >= Duration::from_millis(100) && rtt < Duration::from_millis(150), "emulated RTT {rtt:?}");
    let stats = ingress.snapshot().class(Class::Known(key.identity()));
    // capacity × RTT × headroom = 2000 × ~0.1 × 1.25 ≈ 250.
    assert!((230..=340).contains(&stats.credit), "{stats:?}");
    assert!(stats.rtt_us >= 100_000, "{stats:?}");
}
