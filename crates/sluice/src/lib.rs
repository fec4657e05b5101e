//! The `sluice` binary's library half: configuration and the commands, so they can be tested.

pub mod budgets;
pub mod config;
pub mod dev;
pub mod dump;
pub mod networks;
pub mod quic;
pub mod reload;
pub mod report;
pub mod serve;
pub mod sizing;
pub mod stack;
mod upstream_config;
