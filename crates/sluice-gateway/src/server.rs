//! The accept loop: bounded connections, client timeouts, graceful drain. Accepted
//! connections are served on [`lanes`](crate::lanes).

use std::future::Future;
use std::sync::Arc;

use http_body_util::Either;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::header_timer::HeaderTimer;
use crate::lanes::Lanes;
use crate::network::PathTarget;
use crate::stop::{Stop, Stopping};
use crate::{http, Gateway};

/// Serves `gateway` on `listener` until `shutdown` resolves; then `/ready` answers 503 and,
/// after `limits.drain_delay`, sluice stops accepting, closes WebSocket sessions and gives
/// in-flight requests `limits.shutdown_grace` to finish.
pub async fn serve(listener: TcpListener, gateway: Arc<Gateway>, shutdown: impl Future<Output = ()>) {
    let limits = gateway.limits.clone();
    let upkeep = crate::telemetry::spawn_upkeep(gateway.metrics.clone());
    let stop = Stop::new();
    let stopping = stop.stopping();
    let app = http::router(gateway.clone(), stopping.clone());
    let mut builder = http1::Builder::new();
    // Slow or silent clients: headers must arrive within the client timeout (each connection
    // gets its own `HeaderTimer` below).
    builder.header_read_timeout(limits.client_timeout).keep_alive(true);
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    // Shutdown starts with `/ready` at 503; the listener stays open for `drain_delay` so that
    // load balancers see it and stop sending before connections are refused.
    let shutdown = async {
        shutdown.await;
        gateway.start_draining();
        tracing::info!(delay = ?limits.drain_delay, "shutting down: not ready; draining");
        tokio::time::sleep(limits.drain_delay).await;
    };
    tokio::pin!(shutdown);
    let lanes = Lanes::start(limits.lanes).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "cannot start the serving lanes; serving on the shared runtime");
        Lanes::none()
    });
    loop {
        let permit = tokio::select! {
            permit = connections.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            _ = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Usually out of file descriptors: wait rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        // Off the shared runtime's driver, onto the lane's (at once: nothing has been read).
        let stream = match stream.into_std() {
            Ok(stream) => stream,
            Err(e) => {
                tracing::debug!(error = %e, "accepted connection unusable");
                continue;
            }
        };
        let (router, gateway, builder) = (app.clone(), gateway.clone(), builder.clone());
        let stopping = stopping.clone();
        lanes.spawn(move || serve_connection(stream, peer, router, gateway, builder, stopping, permit));
    }
    drop(listener);
    stop.stop();
    // Every open connection holds a permit, and so does every WebSocket session (its
    // connection's permit went with the upgrade): having them all back means everything
    // drained, and sessions have sent their close frames before their lanes stop.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let drained = async {
        let _connections = connections.acquire_many(all).await;
        let _sessions = gateway.sessions.acquire_many(all).await;
    };
    if tokio::time::timeout(limits.shutdown_grace, drained).await.is_err() {
        tracing::warn!("shutdown grace period over; dropping remaining connections");
    }
    drop(lanes);
    upkeep.abort();
}

/// One client connection, start to end, on the lane it was handed to: JSON-RPC POSTs go straight
/// to their handler, everything else through the router.
async fn serve_connection(
    stream: std::net::TcpStream,
    peer: std::net::SocketAddr,
    router: axum::Router,
    gateway: Arc<Gateway>,
    mut builder: http1::Builder,
    stopping: Stopping,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    let stream = match tokio::net::TcpStream::from_std(stream) {
        Ok(stream) => stream,
        Err(e) => {
            tracing::debug!(error = %e, "accepted connection unusable");
            return;
        }
    };
    // This connection's own handle on what every request needs: cloned for each request, its
    // count is touched by this lane alone, where cloning the router and the gateway themselves
    // would bounce their shared counts between the cores serving requests.
    let shared = Arc::new((router, gateway));
    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let shared = shared.clone();
        async move {
            let (router, gateway) = &*shared;
            if req.method() == hyper::Method::POST {
                if let PathTarget::Rpc { network, key } = gateway.resolve(req.uri().path()) {
                    let key = key.map(str::to_owned);
                    let (parts, body) = req.into_parts();
                    let response = http::serve_rpc(gateway, network, key, &parts.headers, Some(peer), body).await;
                    return Ok::<_, std::convert::Infallible>(response.map(Either::Left));
                }
            }
            let mut req = req;
            req.extensions_mut().insert(http::ClientAddr(peer));
            let response = tower::ServiceExt::oneshot(router.clone(), req).await?;
            Ok(response.map(Either::Right))
        }
    });
    let connection = builder.timer(HeaderTimer::new()).serve_connection(TokioIo::new(stream), service).with_upgrades();
    let mut connection = std::pin::pin!(connection);
    let result = tokio::select! {
        // Polled in this order: the connection's work first; the signal costs one load.
        biased;
        result = connection.as_mut() => result,
        _ = stopping.stopped() => {
            // Finish the request in flight, then close instead of keeping alive.
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "connection ended with an error");
    }
    drop(permit);
}
