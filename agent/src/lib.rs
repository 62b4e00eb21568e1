//! LiteIO disk-agent.
//!
//! The control loop: [`pool`] (the StoragePool object), [`heartbeat`] (the Lease),
//! [`sync`] (volumes and snapshots), [`state`] (what the loops remember between passes),
//! [`recovery`] (orphans after a restart), [`metrics`],
//! wired together by [`agent::Agent`]. The data side is a [`engine::PoolEngine`]; remote
//! access goes through an [`exporter::Exporter`].
#![forbid(unsafe_code)]

pub mod agent;
pub mod config;
pub mod context;
pub mod crash;
pub mod engine;
pub mod error;
pub mod exporter;
pub mod heartbeat;
pub mod metrics;
pub mod pool;
pub mod record;
pub mod recovery;
pub mod restore;
#[cfg(feature = "spdk")]
pub mod spdk;
pub mod state;
pub mod sync;
