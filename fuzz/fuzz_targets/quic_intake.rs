//! QUIC stream intake: any sequence of streams (finished, cut short, bidirectional; any bytes,
//! any length around the size cap) is taken, refused with a code, or answered, never a panic;
//! and afterwards the ingress still serves on the same connection.
//!
//! One ingress (in front of the counting intake, a stand-in pool) and one client live for the
//! whole run, on loopback.
#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use sluice_ingress::null::CountingIntake;
use sluice_ingress::{Client, ClientError, ClientOptions, Ingress, IngressConfig, KeyPair};

struct Env {
    runtime: tokio::runtime::Runtime,
    client: Client,
    _ingress: Ingress,
}

fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let (ingress, client) = runtime.block_on(async {
            let config = IngressConfig {
                listen: "127.0.0.1:0".parse().unwrap(),
                max_tx_bytes: 4_096,
                stream_timeout: Duration::from_millis(500),
                ..IngressConfig::default()
            };
            let ingress =
                Ingress::start(config, &KeyPair::generate(), std::sync::Arc::new(CountingIntake::default())).unwrap();
            let client = Client::connect(ingress.local_addr(), &KeyPair::generate(), ClientOptions::default())
                .await
                .unwrap();
            (ingress, client)
        });
        Env { runtime, client, _ingress: ingress }
    })
}

fuzz_target!(|streams: Vec<(u8, Vec<u8>, u16)>| {
    let env = env();
    env.runtime.block_on(async {
        for (kind, mut payload, cut) in streams.into_iter().take(16) {
            // Lengths around the cap are the interesting ones: stretch some payloads past it.
            if kind & 0x80 != 0 {
                payload.resize(4_000 + (cut as usize % 200), kind);
            }
            let conn = env.client.connection();
            let step = async {
                match kind % 3 {
                    0 => match env.client.send_acknowledged(&payload).await {
                        Ok(()) | Err(ClientError::Stopped(_)) => {}
                        Err(e) => panic!("uni stream: {e}"),
                    },
                    1 => {
                        let mut s = conn.open_uni().await.unwrap();
                        let upto = (cut as usize).min(payload.len());
                        let _ = s.write_all(&payload[..upto]).await;
                        let _ = s.reset(quinn::VarInt::from_u32(cut as u32));
                    }
                    _ => match env.client.submit(&payload).await {
                        Ok(hash) => assert_eq!(hash.len(), 66, "{hash}"),
                        Err(ClientError::Rejected { code, .. }) => assert!(code < 0),
                        Err(ClientError::Stopped(_)) => {}
                        Err(e) => panic!("bidirectional stream: {e}"),
                    },
                }
            };
            tokio::time::timeout(Duration::from_secs(5), step).await.expect("the ingress answers within 5 s");
        }
        env.client.send_acknowledged(b"still serving").await.expect("the ingress still serves");
    });
});
