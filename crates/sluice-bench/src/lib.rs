//! `sluice bench`: a JSON-RPC-aware load generator and the benchmark report.
//!
//! * [`schedule`]: load models and when each request is due (pure);
//! * [`mix`]: the method mix file (pure);
//! * [`stats`]: HDR percentiles, errors by reason, per-second series (pure);
//! * [`run`]: the driver (fixed concurrency, constant rate, ramp; HTTP or WebSocket);
//! * [`cli`]: the `sluice bench rpc` arguments;
//! * [`ws`]: `sluice bench ws`, subscription fan-out to many WebSocket clients.

pub mod cli;
pub mod ingest;
pub mod mesh;
pub mod mix;
pub mod quic;
pub mod report;
pub mod run;
pub mod schedule;
pub mod stats;
pub mod txgen;
pub mod ws;

/// Whether this build has the named stand-ins (the counting intake, the memory pool) that
/// `sluice bench quic rtt`, `sluice bench quic load` without `--target` and `sluice bench mesh`
/// need. A release build of sluice does not: they are for isolating the ingress's and the mesh's
/// own speed, never part of what sluice serves.
pub const STAND_INS: bool = cfg!(feature = "stand-ins");

/// The error of a benchmark that needs the stand-ins in a build without them.
#[cfg(not(feature = "stand-ins"))]
pub(crate) fn without_stand_ins() -> anyhow::Error {
    anyhow::anyhow!(
        "this sluice was built without the benchmark stand-ins (the counting intake, the memory pool): \
         cargo build --release -p sluice --features sluice-bench/stand-ins"
    )
}
