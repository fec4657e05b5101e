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
