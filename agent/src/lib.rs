//! LiteIO disk-agent.
#![cfg_attr(not(feature = "spdk"), forbid(unsafe_code))]
