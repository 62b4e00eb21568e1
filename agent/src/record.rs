//! The node's own record of the exports it serves, so that a restarted agent serves them
//! again as soon as its pool is ready, without waiting for the API server.
//!
//! Without it, an agent restart serves nothing until the volume reconcilers have listed the
//! node's volumes and read, for each one, its node, pool and key Secret: with 200 volumes
//! the last export came back 1.4 s after the lvstore was loaded (docs/failures.md), and an
//! agent that restarts while the API server is unreachable serves nothing at all until it
//! answers again.
//!
//! [`RecordingExporter`] wraps the node's [`Exporter`]: every export it creates or
//! re-asserts is written to `nvmf.exportRecordDir` (one JSON file per volume, written to a
//! temporary file and renamed into place, mode 0600 in a 0700 directory: it holds the
//! volume's keys), every export removed is forgotten. [`restore`] exports everything the
//! record holds again, many at once, before the reconcilers start; they then re-assert each
//! export from the volume as usual (a host or key changed meanwhile is applied then), and
//! [`crate::restore`] removes the exports of volumes that are gone.
//!
//! What is left to the reconcilers, never restored from the record:
//! - members of multi-disk and replicated volumes: their allow-list is what fences a
//!   replica off a node that lost the assembly, so a stale one must not be served;
//! - exports a migration is working on (a destination before its promotion, a source the
//!   migration fenced or demoted): their ANA state and fence are the migration's, set
//!   outside [`Exporter::ensure_export`];
//! - assemblies (they need their remote members).
//!
//! A record that cannot be written is logged and the export kept: the record only speeds up
//! a restart.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use liteio_api::auth::VolumeKeys;
use liteio_api::qos::VolumeQos;
use liteio_api::replica::ReplicaStatus;
use liteio_api::{SpdkLvol, SpdkTarget};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::exporter::{
    AssemblyRequest, CopyStatus, ExportError, ExportFuture, ExportRequest, Exporter,
    ExporterHealth, Migrator, PathState, PipeRequest, ServedAssembly, UnassembleRequest,
    UnexportRequest,
};

/// Version of the record's format.
const VERSION: u32 = 1;
/// How many exports [`restore`] creates at once.
const RESTORE_CONCURRENCY: usize = 32;
/// How long the reconcilers wait for [`restore`] before they start anyway (it goes on
/// beside them: an export call is never abandoned halfway, which would leave the port it
/// reserved taken).
pub const RESTORE_WAIT: Duration = Duration::from_secs(30);

/// One export, as written to `<dir>/<volume>.json`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Entry {
    version: u32,
    volume: String,
    uuid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    device: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lvol: Option<SpdkLvol>,
    size_bytes: u64,
    allowed_hosts: Vec<String>,
    #[serde(default)]
    keyless_hosts: Vec<String>,
    /// What the export was created as: restored with the same NQN, port and namespace.
    target: SpdkTarget,
    /// The volume's keys, as in its Secret's data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    keys: Option<BTreeMap<String, String>>,
    #[serde(default)]
    qos: VolumeQos,
}

impl Entry {
    fn of(req: &ExportRequest, target: &SpdkTarget) -> Self {
        Self {
            version: VERSION,
            volume: req.volume.clone(),
            uuid: req.uuid.clone(),
            device: req.device.clone(),
            lvol: req.lvol.clone(),
            size_bytes: req.size_bytes,
            allowed_hosts: req.allowed_hosts.clone(),
            keyless_hosts: req.keyless_hosts.clone(),
            target: target.clone(),
            keys: req.keys.as_ref().map(|k| {
                k.to_secret_data()
                    .into_iter()
                    .map(|(n, v)| (n, String::from_utf8_lossy(&v.0).into_owned()))
                    .collect()
            }),
            qos: req.qos,
        }
    }

    fn request(&self) -> Result<ExportRequest, String> {
        let keys = match &self.keys {
            Some(k) => {
                let map: HashMap<String, String> =
                    k.iter().map(|(n, v)| (n.clone(), v.clone())).collect();
                Some(VolumeKeys::from_string_map(&map).map_err(|e| format!("keys: {e}"))?)
            }
            None => None,
        };
        Ok(ExportRequest {
            volume: self.volume.clone(),
            uuid: self.uuid.clone(),
            device: self.device.clone(),
            lvol: self.lvol.clone(),
            size_bytes: self.size_bytes,
            allowed_hosts: self.allowed_hosts.clone(),
            keyless_hosts: self.keyless_hosts.clone(),
            preset: Some(self.target.clone()),
            keys,
            path_state: PathState::Optimized,
            qos: self.qos,
            group_member: false,
        })
    }
}

/// A recorded export: the volume, its UUID and what it was exported as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// AntstorVolume name.
    pub volume: String,
    /// Its `spec.uuid`.
    pub uuid: String,
    /// Its export.
    pub target: SpdkTarget,
}

/// A record file that could not be used (left in place, reported).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadEntry {
    /// The file.
    pub path: PathBuf,
    /// Why.
    pub reason: String,
}

/// The record directory.
#[derive(Debug)]
pub struct ExportRecord {
    dir: PathBuf,
    /// What was last written per volume, so that a re-assertion that changes nothing does
    /// not write the file again.
    written: Mutex<HashMap<String, Entry>>,
    /// Subsystem NQNs a migration touched in this process: never recorded again here.
    migrating: Mutex<HashSet<String>>,
}

/// A volume name usable as a file name (Kubernetes names are; anything else is refused).
fn file_name(volume: &str) -> Option<String> {
    let ok = !volume.is_empty()
        && volume.len() <= 253
        && !volume.starts_with('.')
        && volume
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    ok.then(|| format!("{volume}.json"))
}

impl ExportRecord {
    /// Opens (creates) the directory, readable by its owner alone.
    pub fn open(dir: impl Into<PathBuf>) -> std::io::Result<Self> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let dir = dir.into();
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        Ok(Self {
            dir,
            written: Mutex::default(),
            migrating: Mutex::default(),
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn read_entries(&self) -> (Vec<Entry>, Vec<BadEntry>) {
        let mut good = Vec::new();
        let mut bad = Vec::new();
        let rd = match std::fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) => {
                bad.push(BadEntry {
                    path: self.dir.clone(),
                    reason: format!("cannot list: {e}"),
                });
                return (good, bad);
            }
        };
        let mut paths: Vec<PathBuf> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        paths.sort();
        for path in paths {
            let parsed = std::fs::read(&path)
                .map_err(|e| format!("cannot read: {e}"))
                .and_then(|b| {
                    serde_json::from_slice::<Entry>(&b).map_err(|e| format!("not a record: {e}"))
                })
                .and_then(|e| {
                    if e.version != VERSION {
                        return Err(format!(
                            "version {} (this agent reads {VERSION})",
                            e.version
                        ));
                    }
                    if file_name(&e.volume).as_deref() != path.file_name().and_then(|n| n.to_str())
                    {
                        return Err(format!("names volume {:?}, not its file's", e.volume));
                    }
                    Ok(e)
                });
            match parsed {
                Ok(e) => good.push(e),
                Err(reason) => bad.push(BadEntry { path, reason }),
            }
        }
        (good, bad)
    }

    /// The exports recorded, and the files that could not be read.
    pub fn list(&self) -> (Vec<Recorded>, Vec<BadEntry>) {
        let (good, bad) = self.read_entries();
        (
            good.into_iter()
                .map(|e| Recorded {
                    volume: e.volume,
                    uuid: e.uuid,
                    target: e.target,
                })
                .collect(),
            bad,
        )
    }

    /// Whether `req` may be served from the record after a restart (see the module doc).
    fn restorable(&self, req: &ExportRequest, target: &SpdkTarget) -> bool {
        req.path_state == PathState::Optimized
            && !req.group_member
            && !self.migrating_nqn(&target.subsys_nqn)
    }

    fn migrating_nqn(&self, nqn: &str) -> bool {
        self.migrating
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(nqn)
    }

    fn lock_written(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records the export `req` made as `target` (or forgets it when it must not be
    /// restored from the record). Blocks on file I/O: call it off the async threads.
    pub fn write(&self, req: &ExportRequest, target: &SpdkTarget) -> std::io::Result<()> {
        // Held throughout, so that a migration's mark and a write never interleave.
        let mut written = self.lock_written();
        if !self.restorable(req, target) {
            return self.forget_locked(&mut written, &req.volume);
        }
        let Some(name) = file_name(&req.volume) else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("volume name {:?} cannot name a record file", req.volume),
            ));
        };
        let entry = Entry::of(req, target);
        if written.get(&req.volume) == Some(&entry) {
            return Ok(());
        }
        let bytes = serde_json::to_vec_pretty(&entry).map_err(std::io::Error::other)?;
        write_file(&self.dir, &name, &bytes)?;
        written.insert(req.volume.clone(), entry);
        Ok(())
    }

    /// Forgets the export of `volume`; none recorded is success. Blocks on file I/O.
    pub fn forget(&self, volume: &str) -> std::io::Result<()> {
        let mut written = self.lock_written();
        self.forget_locked(&mut written, volume)
    }

    fn forget_locked(
        &self,
        written: &mut HashMap<String, Entry>,
        volume: &str,
    ) -> std::io::Result<()> {
        written.remove(volume);
        let Some(name) = file_name(volume) else {
            return Ok(());
        };
        match std::fs::remove_file(self.dir.join(name)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// A migration works on the export `nqn`: forget it and never record it again in this
    /// process (its ANA state and fence are set outside `ensure_export`). Blocks on file I/O.
    fn migration_touched(&self, nqn: &str) {
        let mut written = self.lock_written();
        let newly = self
            .migrating
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(nqn.to_string());
        if !newly {
            return;
        }
        // Every record on disk is in `written`: the restore put what it read there before
        // any reconciler (and so any migration) ran, and every write since went through it.
        let volumes: Vec<String> = written
            .iter()
            .filter(|(_, e)| e.target.subsys_nqn == nqn)
            .map(|(v, _)| v.clone())
            .collect();
        for volume in volumes {
            if let Err(err) = self.forget_locked(&mut written, &volume) {
                warn!(volume = %volume, dir = %self.dir.display(), error = %err, "cannot forget the record of an export a migration works on");
            }
        }
    }
}

/// Writes `bytes` to `dir/name` through a temporary file (mode 0600), synced and renamed
/// into place, so that a crash leaves the old record or the new one, never half of one.
fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = dir.join(format!(".{name}.tmp"));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, dir.join(name))?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// What [`restore`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Restored {
    /// Exports served again.
    pub served: Vec<String>,
    /// Exports that failed (left to the reconcilers), with why.
    pub failed: Vec<(String, String)>,
    /// Record files that could not be used.
    pub bad: Vec<BadEntry>,
}

/// Serves every recorded export again, [`RESTORE_CONCURRENCY`] at a time. Failures are
/// reported, not fatal: the reconcilers export those volumes once the API server answers.
/// Not cancellation-safe by design: run it to its end (see [`RESTORE_WAIT`]).
pub async fn restore(exporter: &dyn Exporter, record: Arc<ExportRecord>) -> Restored {
    let started = Instant::now();
    let r = Arc::clone(&record);
    let (entries, bad) = tokio::task::spawn_blocking(move || r.read_entries())
        .await
        .unwrap_or_else(|e| {
            (
                Vec::new(),
                vec![BadEntry {
                    path: record.dir.clone(),
                    reason: format!("the reading task failed: {e}"),
                }],
            )
        });
    // What is on disk is what each export is served as again: no need to write it back.
    record
        .lock_written()
        .extend(entries.iter().map(|e| (e.volume.clone(), e.clone())));
    for b in &bad {
        warn!(file = %b.path.display(), reason = %b.reason, "export record unusable; the volume's reconciler exports it");
    }
    let results: Vec<(String, Result<(), String>)> = futures::stream::iter(entries)
        .map(|e| async move {
            let name = e.volume.clone();
            let req = match e.request() {
                Ok(r) => r,
                Err(why) => return (name, Err(why)),
            };
            let r = match exporter.ensure_export(&req).await {
                Ok(t) if same_export(&t, &e.target) => Ok(()),
                // Served, but not as recorded (its port was taken, say): hosts find it
                // once the reconciler records the new target on the volume.
                Ok(t) => Err(format!(
                    "served as {}:{} instead of the recorded {}:{}",
                    t.address, t.svc_id, e.target.address, e.target.svc_id
                )),
                Err(err) => Err(err.to_string()),
            };
            (name, r)
        })
        .buffer_unordered(RESTORE_CONCURRENCY)
        .collect()
        .await;
    let mut out = Restored {
        bad,
        ..Restored::default()
    };
    for (name, r) in results {
        match r {
            Ok(()) => out.served.push(name),
            Err(why) => {
                warn!(volume = %name, error = %why, "cannot serve an export from the node's record; its reconciler will");
                out.failed.push((name, why));
            }
        }
    }
    out.served.sort();
    info!(
        served = out.served.len(),
        failed = out.failed.len(),
        unusable = out.bad.len(),
        took_ms = started.elapsed().as_secs_f64() * 1e3,
        "exports served again from the node's record"
    );
    out
}

/// Whether hosts find `a` where they found `b`.
fn same_export(a: &SpdkTarget, b: &SpdkTarget) -> bool {
    (&a.subsys_nqn, &a.address, &a.svc_id, &a.ns_uuid)
        == (&b.subsys_nqn, &b.address, &b.svc_id, &b.ns_uuid)
}

/// An [`Exporter`] that keeps the node's [`ExportRecord`] up to date.
#[derive(Debug)]
pub struct RecordingExporter {
    inner: Arc<dyn Exporter>,
    record: Arc<ExportRecord>,
}

impl RecordingExporter {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Exporter>, record: Arc<ExportRecord>) -> Self {
        Self { inner, record }
    }

    /// The record.
    pub fn record(&self) -> &Arc<ExportRecord> {
        &self.record
    }
}

impl Exporter for RecordingExporter {
    fn health(&self) -> ExportFuture<'_, ExporterHealth> {
        self.inner.health()
    }

    fn ensure_export<'a>(&'a self, req: &'a ExportRequest) -> ExportFuture<'a, SpdkTarget> {
        Box::pin(async move {
            let target = self.inner.ensure_export(req).await?;
            let (record, r, t) = (Arc::clone(&self.record), req.clone(), target.clone());
            let written = tokio::task::spawn_blocking(move || record.write(&r, &t))
                .await
                .unwrap_or_else(|e| Err(std::io::Error::other(e)));
            if let Err(e) = written {
                warn!(volume = %req.volume, dir = %self.record.dir.display(), error = %e, "cannot record the export; a restart serves it again only once the API server answers");
            }
            Ok(target)
        })
    }

    fn authenticates(&self) -> bool {
        self.inner.authenticates()
    }

    fn remove_export<'a>(&'a self, req: &'a UnexportRequest) -> ExportFuture<'a, ()> {
        Box::pin(async move {
            // Forgotten first: a crash between the two leaves an export the reconciler
            // removes, never a record of an export that is gone.
            let (record, volume) = (Arc::clone(&self.record), req.volume.clone());
            let forgotten = tokio::task::spawn_blocking(move || record.forget(&volume))
                .await
                .unwrap_or_else(|e| Err(std::io::Error::other(e)));
            if let Err(e) = forgotten {
                warn!(volume = %req.volume, dir = %self.record.dir.display(), error = %e, "cannot forget the record of a removed export");
            }
            self.inner.remove_export(req).await
        })
    }

    fn ensure_pipe<'a>(
        &'a self,
        req: &'a ExportRequest,
        want: bool,
    ) -> ExportFuture<'a, Option<u16>> {
        self.inner.ensure_pipe(req, want)
    }

    fn migrator(&self) -> Option<&dyn Migrator> {
        self.inner.migrator().map(|_| self as &dyn Migrator)
    }

    fn enforces_qos(&self) -> bool {
        self.inner.enforces_qos()
    }

    fn is_listening<'a>(&'a self, target: &'a SpdkTarget) -> ExportFuture<'a, bool> {
        self.inner.is_listening(target)
    }

    fn resize_export<'a>(&'a self, req: &'a ExportRequest) -> ExportFuture<'a, ()> {
        self.inner.resize_export(req)
    }

    fn assembles(&self) -> bool {
        self.inner.assembles()
    }

    fn serves(&self, nqn: &str) -> bool {
        self.inner.serves(nqn)
    }

    fn assemblies(&self) -> Vec<ServedAssembly> {
        self.inner.assemblies()
    }

    fn fence_assembly<'a>(&'a self, uuid: &'a str) -> ExportFuture<'a, ()> {
        self.inner.fence_assembly(uuid)
    }

    fn unfence_assembly<'a>(&'a self, uuid: &'a str) -> ExportFuture<'a, ()> {
        self.inner.unfence_assembly(uuid)
    }

    fn ensure_assembly<'a>(&'a self, req: &'a AssemblyRequest) -> ExportFuture<'a, SpdkTarget> {
        self.inner.ensure_assembly(req)
    }

    fn replicas<'a>(&'a self, req: &'a AssemblyRequest) -> ExportFuture<'a, Vec<ReplicaStatus>> {
        self.inner.replicas(req)
    }

    fn remove_assembly<'a>(&'a self, req: &'a UnassembleRequest) -> ExportFuture<'a, ()> {
        self.inner.remove_assembly(req)
    }
}

impl RecordingExporter {
    /// [`ExportRecord::migration_touched`], off the async threads.
    async fn touched(&self, nqn: &str) {
        let (record, nqn) = (Arc::clone(&self.record), nqn.to_string());
        let _ = tokio::task::spawn_blocking(move || record.migration_touched(&nqn)).await;
    }

    fn mig(&self) -> Result<&dyn Migrator, ExportError> {
        self.inner
            .migrator()
            .ok_or_else(|| ExportError::Unsupported("this target cannot migrate".into()))
    }
}

/// The source's migration calls, passed through; the ones that change an export outside
/// `ensure_export` take it out of the record first.
impl Migrator for RecordingExporter {
    fn connect_pipe<'a>(&'a self, req: &'a PipeRequest) -> ExportFuture<'a, String> {
        Box::pin(async move {
            self.touched(&req.subnqn).await;
            self.mig()?.connect_pipe(req).await
        })
    }

    fn disconnect_pipe<'a>(&'a self, controller: &'a str) -> ExportFuture<'a, ()> {
        Box::pin(async move { self.mig()?.disconnect_pipe(controller).await })
    }

    fn start_copy<'a>(&'a self, lvol: &'a str, mirror: &'a str) -> ExportFuture<'a, CopyStatus> {
        Box::pin(async move { self.mig()?.start_copy(lvol, mirror).await })
    }

    fn copy_status<'a>(&'a self, lvol: &'a str) -> ExportFuture<'a, CopyStatus> {
        Box::pin(async move { self.mig()?.copy_status(lvol).await })
    }

    fn cancel_copy<'a>(&'a self, lvol: &'a str) -> ExportFuture<'a, ()> {
        Box::pin(async move { self.mig()?.cancel_copy(lvol).await })
    }

    fn finish_copy<'a>(&'a self, lvol: &'a str) -> ExportFuture<'a, ()> {
        Box::pin(async move { self.mig()?.finish_copy(lvol).await })
    }

    fn fence<'a>(&'a self, nqn: &'a str) -> ExportFuture<'a, ()> {
        Box::pin(async move {
            self.touched(nqn).await;
            self.mig()?.fence(nqn).await
        })
    }

    fn unfence<'a>(&'a self, nqn: &'a str) -> ExportFuture<'a, ()> {
        Box::pin(async move {
            self.touched(nqn).await;
            self.mig()?.unfence(nqn).await
        })
    }

    fn set_path_state<'a>(
        &'a self,
        nqn: &'a str,
        address: &'a str,
        port: u16,
        state: PathState,
    ) -> ExportFuture<'a, ()> {
        Box::pin(async move {
            self.touched(nqn).await;
            self.mig()?.set_path_state(nqn, address, port, state).await
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn file_names_are_plain_volume_names() {
        assert_eq!(file_name("pvc-1").as_deref(), Some("pvc-1.json"));
        assert_eq!(file_name("a.b_c").as_deref(), Some("a.b_c.json"));
        for bad in ["", ".hidden", "a/b", "../x", "a b", &"x".repeat(254)] {
            assert_eq!(file_name(bad), None, "{bad:?}");
        }
    }
}
