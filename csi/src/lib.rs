//! LiteIO's CSI driver `antstor.csi.alipay.com`: the Identity, Controller and Node services
//! of CSI v1.10.0 over a unix socket, a client for the `csictl` tool and per-volume metrics.
//!
//! The driver does not schedule or provision: the Controller service writes AntstorVolume
//! and AntstorSnapshot objects and waits (bounded) for the node-disk-controller and the
//! disk-agents; the Node service attaches (NVMe/TCP or a local device), formats and mounts.
#![forbid(unsafe_code)]

/// Generated CSI v1.10.0 messages, clients and servers (`proto/csi.proto`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod csi {
    tonic::include_proto!("csi.v1");
}

pub mod client;
pub mod cmd;
pub mod config;
pub mod controller;
pub mod error;
pub mod group;
pub mod identity;
pub mod k8s;
pub mod lvm;
pub mod metrics;
pub mod migration;
pub mod mount;
pub mod multipath;
pub mod node;
pub mod nvme;
pub mod params;
pub mod publish;
pub mod server;
pub mod uuid_index;

pub use config::DriverConfig;
pub use error::{CsiError, ErrorKind};
