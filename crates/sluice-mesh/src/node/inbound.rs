//! Inbound transactions and answers: requests go through each chain's intake on tasks of
//! their own (their verdicts are the acknowledgement), answers and failures back to the outbox,
//! and the conduct of peers that send what no honest node forwards.

use alloy_primitives::keccak256;
use libp2p::request_response;
use libp2p::PeerId;
use sluice_mempool::{SubmitError, TxSource};

use super::{Answer, Node};
use crate::wire::{Ack, TxBatch, MAX_BATCH_IN};

impl Node {
    pub(super) fn on_tx(&mut self, event: request_response::Event<TxBatch, Vec<Ack>>) {
        use request_response::{Event, Message};
        match event {
            Event::Message { peer, message: Message::Request { request, channel, .. }, .. } => {
                let (txs, named) = (request.txs, request.chains);
                self.inbound.received += txs.len() as u64;
                self.inbound.requests += 1;
                if txs.len() > MAX_BATCH_IN {
                    let why = format!("{} transactions in one request; at most {MAX_BATCH_IN}", txs.len());
                    let _ = self.swarm.behaviour_mut().tx.send_response(channel, vec![Ack::Invalid(why); txs.len()]);
                    self.judge(peer, txs.len() as u64);
                    return;
                }
                // Before the pool sees them: its pending feed may ask us to broadcast them at
                // once, and they must not go back to where they came from.
                for raw in &txs {
                    self.known.insert(keccak256(raw), peer);
                }
                let chains = self.chains.clone();
                let answers = self.answers_tx.clone();
                tokio::spawn(async move {
                    // All at once, in order: the pool takes a sender's nonces as they come.
                    let (mut malformed, mut unserved) = (0, 0);
                    let verdicts = futures_util::future::join_all(txs.into_iter().enumerate().map(|(i, raw)| {
                        let chain = (!named.is_empty()).then(|| named.get(i).copied().unwrap_or(u64::MAX));
                        let intake = crate::chains::pool_for(&chains, chain).map(|p| p.intake.clone());
                        async move {
                            match intake {
                                Some(intake) => Some(intake.submit(raw.into_vec().into(), TxSource::Peer).await),
                                None => None,
                            }
                        }
                    }))
                    .await
                    .into_iter()
                    .enumerate()
                    .map(|(i, result)| match result {
                        None => {
                            // Not held against the sender: it does not know which chains we serve.
                            unserved += 1;
                            Ack::Invalid(format!("chain {} is not served by this node", named[i]))
                        }
                        Some(Ok(_)) => Ack::Accepted,
                        Some(Err(e @ (SubmitError::Busy | SubmitError::Unavailable(_)))) => {
                            Ack::Unavailable(e.to_string())
                        }
                        Some(Err(e)) => {
                            // Failing the stateless rules: the sender did not check it.
                            malformed += matches!(e, SubmitError::Invalid(_)) as u64;
                            Ack::Invalid(e.to_string())
                        }
                    })
                    .collect();
                    let _ = answers.send(Answer { peer, channel, verdicts, malformed, unserved }).await;
                });
            }
            Event::Message { peer, message: Message::Response { request_id, response }, .. } => {
                let Some((send, sent)) = self.requests.remove(&request_id) else { return };
                let elapsed = sent.elapsed();
                let rtt = elapsed.as_secs_f64() * 1e3;
                let info = self.peers.entry(peer).or_default();
                info.rtt_ms = Some(info.rtt_ms.map_or(rtt, |r| 0.8 * r + 0.2 * rtt));
                let verdicts: Vec<Result<(), String>> = response
                    .into_iter()
                    .map(|verdict| match verdict {
                        Ack::Accepted => Ok(()),
                        Ack::Unavailable(why) => Err(why),
                        Ack::Invalid(why) => {
                            // Delivered and judged: acknowledged, not retried, counted.
                            metrics::counter!("sluice_mesh_peer_refused_total").increment(1);
                            tracing::debug!(%peer, %why, "peer refused a transaction");
                            Ok(())
                        }
                    })
                    .collect();
                let acked = verdicts.iter().filter(|v| v.is_ok()).count() as u64;
                let _ = self.ack_times.record_n((elapsed.as_micros() as u64).max(1), acked);
                for done in self.outbox.on_answer(self.now(), &peer, send, &verdicts) {
                    self.finished(done);
                }
                self.pump(&peer);
            }
            Event::OutboundFailure { peer, connection_id, request_id, error } => {
                let newer = self.peers.get(&peer).is_some_and(|p| p.connections.iter().any(|c| *c != connection_id));
                if matches!(error, request_response::OutboundFailure::Timeout) && newer {
                    // The peer has another connection (it restarted and dialed us anew while the
                    // old one lingers until QUIC's idle timeout): close the silent one, so
                    // retries use the live one. A peer's only connection is never closed for
                    // slowness, which under load would turn delay into a cascade of failures.
                    self.swarm.close_connection(connection_id);
                }
                let Some((send, _)) = self.requests.remove(&request_id) else { return };
                metrics::counter!("sluice_mesh_send_failures_total").increment(1);
                for done in self.outbox.on_failure(self.now(), &peer, send, &error.to_string()) {
                    self.finished(done);
                }
            }
            Event::InboundFailure { peer, error, .. } => {
                self.inbound.failed += 1;
                metrics::counter!("sluice_mesh_inbound_failures_total").increment(1);
                if self.inbound.failed <= 20 || self.inbound.failed.is_power_of_two() {
                    tracing::warn!(%peer, %error, failures = self.inbound.failed, "mesh inbound stream failed");
                }
            }
            Event::ResponseSent { .. } => {}
        }
    }

    /// Counts `malformed` transactions against `peer`, and bans it when that is too many.
    pub(super) fn judge(&mut self, peer: PeerId, malformed: u64) {
        if malformed == 0 {
            return;
        }
        self.inbound.malformed += malformed;
        metrics::counter!("sluice_mesh_malformed_total").increment(malformed);
        if self.conduct.malformed(self.now(), &peer, malformed) {
            self.inbound.bans += 1;
            metrics::counter!("sluice_mesh_bans_total").increment(1);
            let ban_for = self.conduct.config().ban_for;
            tracing::warn!(%peer, ?ban_for, "mesh peer banned: it sent transactions no honest node forwards");
            // Closes its connections and refuses new ones, both ways. What we had queued for it
            // fails in the outbox as for any unreachable peer (counted).
            self.swarm.behaviour_mut().blocked.block_peer(peer);
        }
    }

    /// Lets back the peers whose ban is over.
    pub(super) fn end_bans(&mut self) {
        for peer in self.conduct.expire(self.now()) {
            tracing::info!(%peer, "mesh peer ban over");
            self.swarm.behaviour_mut().blocked.unblock_peer(peer);
        }
    }
}
