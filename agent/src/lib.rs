//! LiteIO disk-agent.
#![cfg_attr(not(feature = "spdk"), forbid(unsafe_code))]
#![cfg_attr(feature = "spdk", deny(unsafe_code))]

#[cfg(feature = "spdk")]
pub mod spdk;
