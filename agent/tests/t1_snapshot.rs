//! T1: snapshots on the file engine over a reflink-capable XFS (loop-mounted): create,
//! clone a volume from it, merge-restore, delete. Needs root, mkfs.xfs and loop devices;
//! otherwise prints one SKIP line.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::host::run;
use common::*;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use liteio_api::keys::{self, finalizers, labels};
use liteio_api::snapshot::{SnapshotStatusName, SnapshotVolType};
use liteio_api::{AntstorSnapshot, AntstorSnapshotSpec, AntstorVolume};
use serde_json::json;

/// A loop-mounted XFS with reflink; unmounted on drop.
struct Xfs {
    dir: tempfile::TempDir,
    dev: String,
}

impl Xfs {
    fn new() -> Result<Self, String> {
        if run("id", &["-u"])? != "0" {
            return Err("not root".into());
        }
        run("mkfs.xfs", &["-V"]).map_err(|_| "mkfs.xfs not installed".to_string())?;
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let img = dir.path().join("xfs.img");
        std::fs::File::create(&img)
            .unwrap()
            .set_len(400 * MIB)
            .unwrap();
        let img = img.to_string_lossy().into_owned();
        run("mkfs.xfs", &["-q", "-m", "reflink=1", &img])?;
        let dev = run("losetup", &["--find", "--show", &img])?;
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        if let Err(e) = run("mount", &[&dev, &mnt.to_string_lossy()]) {
            let _ = run("losetup", &["-d", &dev]);
            return Err(e);
        }
        Ok(Self { dir, dev })
    }
    fn mount(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }
}

impl Drop for Xfs {
    fn drop(&mut self) {
        let m = self.mount().to_string_lossy().into_owned();
        if run("umount", &[&m]).is_err() {
            let _ = run("umount", &["-l", &m]);
        }
        let _ = run("losetup", &["-d", &self.dev]);
    }
}

fn volume(name: &str, size: u64) -> AntstorVolume {
    scheduled_volume(name, &format!("uuid-{name}"), size)
}

fn snapshot(name: &str, origin: &str, size: i64) -> AntstorSnapshot {
    let mut s = AntstorSnapshot::new(
        name,
        AntstorSnapshotSpec {
            uuid: format!("snap-{name}"),
            vol_type: SnapshotVolType::KernelLVol,
            size,
            origin_vol_name: origin.into(),
            origin_vol_namespace: keys::DEFAULT_NAMESPACE.into(),
            origin_vol_target_node_id: NODE.into(),
            ..Default::default()
        },
    );
    s.metadata.namespace = Some(keys::DEFAULT_NAMESPACE.into());
    s.metadata.labels = Some(BTreeMap::from([(
        labels::TARGET_NODE_ID.to_string(),
        NODE.to_string(),
    )]));
    s
}

/// Waits (up to 5 s) until snapshot `name` is in `state`; returns it.
async fn snapshot_in(
    snaps: &Api<AntstorSnapshot>,
    name: &str,
    state: SnapshotStatusName,
    what: &str,
) -> AntstorSnapshot {
    eventually(what, Duration::from_secs(5), || async {
        let s = snaps.get(name).await.unwrap();
        (s.status.as_ref().map(|x| x.status) == Some(state)).then_some(s)
    })
    .await
}

fn content(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap()[..5].to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_create_clone_merge_delete() {
    let xfs = match Xfs::new() {
        Ok(x) => x,
        Err(why) => {
            println!("SKIP snapshot_create_clone_merge_delete: {why}");
            return;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), async {
        let env = Env::with_pool_dir(Some(&xfs.mount())).await;
        let agent = env.start_agent().await;
        let vols: Api<AntstorVolume> = ns_api(&env.client);
        let snaps: Api<AntstorSnapshot> = ns_api(&env.client);
        create(&vols, &volume("pvc-o", 8 * MIB)).await;
        let v = volume_ready(&vols, "pvc-o", "origin ready", Duration::from_secs(5)).await;
        let origin = PathBuf::from(&v.spec.kernel_lvol.as_ref().unwrap().dev_path);
        std::fs::write(&origin, b"first").unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&origin)
            .unwrap()
            .set_len(8 * MIB)
            .unwrap();

        snaps
            .create(
                &PostParams::default(),
                &snapshot("snap-1", "pvc-o", 8 * MIB as i64),
            )
            .await
            .unwrap();
        let s = snapshot_in(
            &snaps,
            "snap-1",
            SnapshotStatusName::Ready,
            "snapshot ready",
        )
        .await;
        assert!(s.finalizers().contains(&finalizers::SNAPSHOT.to_string()));
        assert_eq!(s.spec.kernel_lvol.name, "pvc-o_snap");
        assert_eq!(content(Path::new(&s.spec.kernel_lvol.dev_path)), b"first");

        // Clone a new volume from it.
        let mut c = volume("pvc-c", 8 * MIB);
        c.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(labels::VOLUME_SOURCE_SNAP_NAME.into(), "snap-1".into());
        c.metadata.labels.as_mut().unwrap().insert(
            labels::VOLUME_SOURCE_SNAP_NS.into(),
            keys::DEFAULT_NAMESPACE.into(),
        );
        create(&vols, &c).await;
        let c = volume_ready(&vols, "pvc-c", "clone ready", Duration::from_secs(5)).await;
        assert_eq!(
            content(Path::new(&c.spec.kernel_lvol.as_ref().unwrap().dev_path)),
            b"first"
        );

        // Restore: the origin gets the snapshot's content back.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&origin)
            .map(|f| {
                use std::os::unix::fs::FileExt;
                f.write_all_at(b"later", 0).unwrap();
            })
            .unwrap();
        let patch = json!({"metadata": {"labels": {labels::MERGE_START_TIMESTAMP: "1700000000"}}});
        snaps
            .patch("snap-1", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        let s = snapshot_in(&snaps, "snap-1", SnapshotStatusName::Merged, "merged").await;
        assert!(s.labels().contains_key(labels::MERGE_FINISH_TIMESTAMP));
        assert_eq!(content(&origin), b"first");

        // Delete.
        snaps
            .delete("snap-1", &DeleteParams::default())
            .await
            .unwrap();
        gone(&snaps, "snap-1", "snapshot gone", Duration::from_secs(5)).await;
        assert!(!Path::new(&s.spec.kernel_lvol.dev_path).exists());
        agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .unwrap();
}
