//! Node plumbing shared by the disk-agent, the CSI driver and `liteio-local`: commands with
//! timeouts, loop devices, the host NQN, hugepages; and the process-wide panic count every
//! component reports. See the README.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod cmd;
pub mod hostnqn;
pub mod hugepages;
pub mod losetup;
pub mod panics;
