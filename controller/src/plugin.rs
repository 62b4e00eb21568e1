//! Plug-in steps, LiteIO's PlugableReconciler reshaped: each registered [`Plugin`] runs after
//! the main volume / pool / snapshot handler succeeded (so it sees the scheduled object),
//! `handle_deletion` runs for objects being deleted, `forget` when an object is gone from
//! the cluster, and `sweep` after every full (re)list with the keys that still exist.
//! A plug-in error makes the reconcile fail and retry with back-off; the main handler is
//! idempotent, so the retry repeats nothing.

use futures::future::BoxFuture;
use liteio_api::{AntstorSnapshot, AntstorVolume, StoragePool};

use crate::error::Result;
use crate::state::ObjectKey;

/// Kinds plug-ins see.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// AntstorVolume.
    Volume,
    /// StoragePool.
    Pool,
    /// AntstorSnapshot.
    Snapshot,
}

impl Kind {
    /// Stable lower-case name (a metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Volume => "volume",
            Self::Pool => "pool",
            Self::Snapshot => "snapshot",
        }
    }
}

/// The object a plug-in step is about.
#[derive(Debug, Clone, Copy)]
pub enum PluginObject<'a> {
    /// A volume.
    Volume(&'a AntstorVolume),
    /// A pool.
    Pool(&'a StoragePool),
    /// A snapshot.
    Snapshot(&'a AntstorSnapshot),
}

impl<'a> From<&'a AntstorVolume> for PluginObject<'a> {
    fn from(v: &'a AntstorVolume) -> Self {
        Self::Volume(v)
    }
}

impl<'a> From<&'a StoragePool> for PluginObject<'a> {
    fn from(p: &'a StoragePool) -> Self {
        Self::Pool(p)
    }
}

impl<'a> From<&'a AntstorSnapshot> for PluginObject<'a> {
    fn from(s: &'a AntstorSnapshot) -> Self {
        Self::Snapshot(s)
    }
}

/// A reconcile step contributed by a plug-in.
pub trait Plugin: Send + Sync + std::fmt::Debug {
    /// Name, for logs and metrics.
    fn name(&self) -> &'static str;
    /// Called after the main handler succeeded for a live object.
    fn reconcile<'a>(&'a self, obj: PluginObject<'a>) -> BoxFuture<'a, Result<()>>;
    /// Called after the main handler for an object with a deletion timestamp.
    fn handle_deletion<'a>(&'a self, obj: PluginObject<'a>) -> BoxFuture<'a, Result<()>>;
    /// Called when an object is gone from the cluster.
    fn forget<'a>(&'a self, kind: Kind, key: &'a ObjectKey) -> BoxFuture<'a, Result<()>> {
        let _ = (kind, key);
        Box::pin(async { Ok(()) })
    }
    /// Called after a full (re)list of `kind` with every key that exists.
    fn sweep<'a>(&'a self, kind: Kind, live: Vec<ObjectKey>) -> BoxFuture<'a, Result<()>> {
        let _ = (kind, live);
        Box::pin(async { Ok(()) })
    }
}
