//! Cross-component test support.
#![forbid(unsafe_code)]

pub mod dashboard;
pub mod prometheus;
pub mod promtool;
pub mod prop;
#[cfg(feature = "spdk")]
pub mod spdk;
pub mod spdk_rpc;
