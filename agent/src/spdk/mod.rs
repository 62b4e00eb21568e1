//! The embedded SPDK engine: the safe layer of the [`liteio_spdk`] crate, re-exported under
//! its old paths, and the agent's adapters to it (the NVMe-oF [`exporter`] and the map of its
//! listen ports, the [`setup`] from the agent's config and the metrics source in [`stats`]).
//! No `unsafe` here.

pub use liteio_spdk::{ErrorKind, Result, Spdk, SpdkError, SpdkOptions};
pub use liteio_spdk::{
    bdev, deprecation, error, gate, initiator, io, keyring, lvol, nvmf, raid, runtime,
};

pub mod exporter;
mod ports;
pub mod setup;
pub mod stats;
