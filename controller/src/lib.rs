//! LiteIO's node-disk-controller: cluster state built from watches, volume scheduling (pure
//! functions over that state), reconcilers for volumes, pools and snapshots, pool liveness
//! from Leases, plug-in steps (SQL metadata sync), leader election, probes and metrics.
//!
//! Layout: [`config`] (the config file), [`selector`] (label selectors), [`state`] (pure
//! accounting), [`scheduler`] (pure placement), [`reconcile`] (the reconcilers and the
//! watch/queue runtime), [`plugin`] and [`metasync`], [`leader`], [`http`], [`metrics`],
//! [`redact`] (passwords out of logged text) and [`run`] (the process minus argument
//! parsing).
#![forbid(unsafe_code)]

pub mod clock;
pub mod config;
pub mod error;
pub mod group_scheduler;
pub mod http;
pub mod leader;
pub mod metasync;
pub mod metrics;
pub mod plugin;
pub mod reconcile;
pub mod redact;
pub mod replicas;
pub mod run;
pub mod scheduler;
pub mod selector;
pub mod state;
pub mod testing;

pub use config::Config;
pub use error::{Error, ErrorKind, Result};
