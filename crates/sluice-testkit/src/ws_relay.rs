//! A WebSocket relay in front of a node's socket: counts the `eth_subscribe` calls that reach
//! the node and can cut every connection at once. It never answers anything itself.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;

/// A counting WebSocket relay on a free loopback port.
pub struct WsRelay {
    /// `ws://127.0.0.1:PORT`.
    pub url: String,
    subscribes: Arc<AtomicUsize>,
    methods: Arc<std::sync::Mutex<Vec<String>>>,
    open: Arc<AtomicUsize>,
    cut: watch::Sender<u64>,
    accept: tokio::task::JoinHandle<()>,
}

impl WsRelay {
    /// Relays every connection to `upstream` (a `ws://` URL).
    pub async fn start(upstream: &str) -> WsRelay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a loopback port");
        let url = format!("ws://{}", listener.local_addr().expect("an address"));
        let (subscribes, open) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (cut, cut_rx) = watch::channel(0u64);
        let methods = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (counter, gauge, upstream, log) = (subscribes.clone(), open.clone(), upstream.to_owned(), methods.clone());
        let accept = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (counter, gauge, upstream, mut cut, log) =
                    (counter.clone(), gauge.clone(), upstream.clone(), cut_rx.clone(), log.clone());
                tokio::spawn(async move {
                    let Ok(client) = tokio_tungstenite::accept_async(tcp).await else { return };
                    let Ok((node, _)) = tokio_tungstenite::connect_async(upstream.as_str()).await else { return };
                    gauge.fetch_add(1, Ordering::SeqCst);
                    let (mut client_tx, mut client_rx) = client.split();
                    let (mut node_tx, mut node_rx) = node.split();
                    cut.borrow_and_update();
                    loop {
                        tokio::select! {
                            m = client_rx.next() => match m {
                                Some(Ok(m)) => {
                                    if let Message::Text(text) = &m {
                                        counter.fetch_add(subscribes_in(text), Ordering::SeqCst);
                                        log.lock().expect("not poisoned").extend(crate::methods_in(text));
                                    }
                                    if node_tx.send(m).await.is_err() { break }
                                }
                                _ => break,
                            },
                            m = node_rx.next() => match m {
                                Some(Ok(m)) => if client_tx.send(m).await.is_err() { break },
                                _ => break,
                            },
                            _ = cut.changed() => break,
                        }
                    }
                    gauge.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        WsRelay { url, subscribes, methods, open, cut, accept }
    }

    /// `eth_subscribe` calls relayed to the node so far.
    pub fn subscribes(&self) -> usize {
        self.subscribes.load(Ordering::SeqCst)
    }

    /// The method of every call relayed to the node so far, in order (each call of a batch).
    pub fn methods(&self) -> Vec<String> {
        self.methods.lock().expect("not poisoned").clone()
    }

    /// Connections open through the relay now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// Drops every connection open now (new ones are still accepted).
    pub fn cut(&self) {
        self.cut.send_modify(|n| *n += 1);
    }
}

impl Drop for WsRelay {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

fn subscribes_in(text: &str) -> usize {
    let is = |v: &Value| v["method"] == "eth_subscribe";
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Array(items)) => items.iter().filter(|v| is(v)).count(),
        Ok(v) => usize::from(is(&v)),
        Err(_) => 0,
    }
}
