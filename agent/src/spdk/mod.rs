//! The embedded SPDK engine: the only place in the agent with `unsafe`. Every function runs
//! its SPDK calls on SPDK's application thread; callers are async and never block a reactor.
#![allow(unsafe_code)]

pub mod bdev;
pub mod error;
pub mod exporter;
pub mod initiator;
pub mod io;
pub mod lvol;
pub mod nvmf;
pub mod runtime;
pub mod setup;
pub mod stats;

pub use error::{ErrorKind, Result, SpdkError};
pub use runtime::{Spdk, SpdkOptions};
