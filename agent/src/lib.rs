//! LiteIO disk-agent.
#![cfg_attr(not(feature = "spdk"), forbid(unsafe_code))]
#![cfg_attr(feature = "spdk", deny(unsafe_code))]

pub mod config;
pub mod engine;
#[cfg(feature = "spdk")]
pub mod spdk;
