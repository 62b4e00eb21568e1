//! Safe SPDK: the embedded SPDK runtime and typed calls into it (bdevs, raid bdevs, lvstores
//! and lvols, the NVMe-oF target and initiator, block I/O, thread statistics).
//!
//! Raid bdevs ([`raid`]) come in three levels: concat and raid0 join the members of a
//! multi-disk volume (chained or striped), raid1 with a superblock mirrors the replicas of a
//! replicated volume (`docs/replicas-spdk.md`).
//!
//! With `spdk-sys` this is the only crate of the workspace with `unsafe` code. Every call
//! runs its SPDK work on SPDK's application thread and answers through a oneshot channel;
//! callers are async and never block a reactor. The crate knows nothing of its users (no
//! agent config, metrics or exporter trait): adapters live in the agent.
//!
//! Everything is behind the `link` feature (the bindings exist only when SPDK is found);
//! without it the crate is empty, so that the workspace builds on machines without SPDK.
#![deny(missing_docs)]
#![cfg(feature = "link")]

pub mod bdev;
pub mod deprecation;
pub mod dhchap;
pub mod error;
pub mod gate;
pub mod initiator;
pub mod io;
pub mod keyring;
pub mod lvol;
pub mod nvmf;
pub mod raid;
pub mod runtime;
pub mod stats;

pub use deprecation::{Deprecation, deprecation_hits, deprecations};
pub use error::{ErrorKind, Result, SpdkError};
pub use runtime::{Spdk, SpdkOptions};
