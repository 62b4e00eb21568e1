//! T1: errors that retrying cannot heal are written to the object's status with
//! `permanent: true` and told once by a Warning event, are never retried on a timer, and are
//! tried again when the pool changes. The agent runs the file engine on a tmpfs pool, which
//! has no reflinks: every snapshot there fails for good. Needs root (the tmpfs mount).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;
use k8s_openapi::api::events::v1::Event;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, ResourceExt};
use liteio_api::keys::{self, labels};
use liteio_api::snapshot::AntstorSnapshotSpec;
use liteio_api::{AntstorSnapshot, AntstorVolume, VolumeType};

/// A tmpfs mounted at a temporary directory; unmounted on drop.
struct Tmpfs {
    _dir: tempfile::TempDir,
    mount: PathBuf,
}

impl Tmpfs {
    fn mount() -> Option<Self> {
        let dir = tempfile::tempdir().ok()?;
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount).ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=256m", "tmpfs"])
            .arg(&mount)
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Self { _dir: dir, mount })
    }

    fn path(&self) -> &Path {
        &self.mount
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).status();
    }
}

fn snapshot(name: &str, origin: &str) -> AntstorSnapshot {
    let mut s = AntstorSnapshot::new(
        name,
        AntstorSnapshotSpec {
            uuid: format!("5a1e0000-0000-4000-8000-{:0>12}", name.len()),
            size: (16 * MIB) as i64,
            origin_vol_name: origin.into(),
            origin_vol_namespace: keys::DEFAULT_NAMESPACE.into(),
            origin_vol_target_node_id: NODE.into(),
            ..AntstorSnapshotSpec::default()
        },
    );
    s.metadata = ObjectMeta {
        name: Some(name.into()),
        namespace: Some(keys::DEFAULT_NAMESPACE.into()),
        labels: Some([(labels::TARGET_NODE_ID.to_string(), NODE.to_string())].into()),
        ..ObjectMeta::default()
    };
    s
}

/// Warning events about object `name` with `reason`.
async fn warnings(client: &kube::Client, name: &str, reason: &str) -> Vec<Event> {
    events_about(client, name, reason)
        .await
        .into_iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .collect()
}

/// The agent's count of failed reconciles of `resource` with error `kind`.
async fn failures(agent: &liteio_agent::agent::Agent, resource: &str, kind: &str) -> f64 {
    metric_value(
        &scrape(agent).await,
        "liteio_reconcile_errors_total",
        &[("resource", resource), ("kind", kind), ("node", NODE)],
    )
    .unwrap_or(0.0)
}

/// Waits until the agent has counted the first failed reconcile of `resource` with error
/// `kind` (the Warning event is emitted inside the reconcile, before the error handler counts
/// the failure: seeing the event does not mean the count is there yet); returns the count.
async fn first_failure_counted(
    agent: &liteio_agent::agent::Agent,
    resource: &str,
    kind: &str,
    what: &str,
) -> f64 {
    eventually(what, Duration::from_secs(5), || async {
        let n = failures(agent, resource, kind).await;
        (n >= 1.0).then_some(n)
    })
    .await
}

/// Waits until exactly one Warning event with `reason` is about object `name`.
async fn one_warning(client: &kube::Client, name: &str, reason: &str, what: &str) {
    eventually(what, Duration::from_secs(5), || async {
        (warnings(client, name, reason).await.len() == 1).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_errors_are_reported_once_and_wait_for_a_change() {
    if common::host::not_root().is_some() {
        println!("SKIP permanent errors: needs root for a tmpfs pool");
        return;
    }
    let Some(fs) = Tmpfs::mount() else {
        println!("SKIP permanent errors: cannot mount a tmpfs");
        return;
    };
    tokio::time::timeout(Duration::from_secs(90), async {
        let env = Env::with_pool_dir(Some(fs.path())).await;
        // Retries start at 100 ms: a failure retried on a timer would run again ~5 times in
        // the 3 s watched below.
        let agent = env.start_agent().await;
        let vols: Api<AntstorVolume> = ns_api(&env.client);
        let snaps: Api<AntstorSnapshot> = ns_api(&env.client);
        vols.create(
            &PostParams::default(),
            &scheduled_volume("pvc-a", "0b9d1f3c-6a2e-4c1d-9f0a-00000000000a", 16 * MIB),
        )
        .await
        .unwrap();
        volume_ready(&vols, "pvc-a", "pvc-a ready", Duration::from_secs(10)).await;

        // A snapshot on a pool without reflinks: the status says why, for good, at once.
        create(&snaps, &snapshot("snap-a", "pvc-a")).await;
        let s = eventually(
            "snap-a failed for good",
            Duration::from_secs(10),
            || async {
                let s = snaps.get("snap-a").await.unwrap();
                s.permanent_failure().is_some().then_some(s)
            },
        )
        .await;
        let msg = s.permanent_failure().unwrap();
        assert!(msg.contains("reflink"), "{msg}");
        assert!(msg.contains("use XFS with reflink=1 or btrfs"), "{msg}");
        assert!(s.finalizers().is_empty(), "nothing was made: no finalizer");
        one_warning(
            &env.client,
            "snap-a",
            "AntstorSnapshotFailed",
            "one Warning event",
        )
        .await;

        // Not retried on a timer. The status write above brings one more pass (the watch
        // delivers the agent's own write); after it, 3 s of the 100 ms back-off would have
        // retried several times.
        let kind = "engine_unsupported";
        let settled =
            first_failure_counted(&agent, "antstorsnapshot", kind, "the status write's pass").await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let after = failures(&agent, "antstorsnapshot", kind).await;
        assert!(after <= 2.0, "retried on a timer: {after} failures");
        assert!(
            after - settled <= 1.0,
            "retried on a timer: {settled} → {after}"
        );
        assert_eq!(
            warnings(&env.client, "snap-a", "AntstorSnapshotFailed")
                .await
                .len(),
            1,
            "told once"
        );

        // A change of the pool (another volume) is what it may have waited for: tried again.
        vols.create(
            &PostParams::default(),
            &scheduled_volume("pvc-b", "0b9d1f3c-6a2e-4c1d-9f0a-00000000000b", 16 * MIB),
        )
        .await
        .unwrap();
        eventually(
            "a retry after the pool changed",
            Duration::from_secs(10),
            || async { (failures(&agent, "antstorsnapshot", kind).await > after).then_some(()) },
        )
        .await;
        assert_eq!(
            warnings(&env.client, "snap-a", "AntstorSnapshotFailed")
                .await
                .len(),
            1,
            "same message: no new event"
        );

        // Deleting it leaves nothing behind (it never got the agent's finalizer).
        snaps.delete("snap-a", &Default::default()).await.unwrap();
        gone(&snaps, "snap-a", "snap-a gone", Duration::from_secs(5)).await;

        // A volume of a type this pool cannot serve: permanent, evented, not retried.
        let mut lvol =
            scheduled_volume("pvc-spdk", "0b9d1f3c-6a2e-4c1d-9f0a-00000000000c", 16 * MIB);
        lvol.spec.type_ = Some(VolumeType::SpdkLVol);
        create(&vols, &lvol).await;
        let v = eventually(
            "pvc-spdk failed for good",
            Duration::from_secs(10),
            || async {
                let v = vols.get("pvc-spdk").await.unwrap();
                v.permanent_failure().is_some().then_some(v)
            },
        )
        .await;
        assert!(
            v.permanent_failure()
                .unwrap()
                .contains("cannot be served by the File pool"),
            "{:?}",
            v.status
        );
        one_warning(
            &env.client,
            "pvc-spdk",
            "AntstorVolumeFailed",
            "the volume's Warning event",
        )
        .await;
        let before = first_failure_counted(
            &agent,
            "antstorvolume",
            "invalid_object",
            "the volume's failure counted",
        )
        .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let after = failures(&agent, "antstorvolume", "invalid_object").await;
        assert!(
            after - before <= 1.0,
            "retried on a timer: {before} → {after}"
        );

        // Mended by the user: the next pass serves it and clears the failure.
        vols.patch(
            "pvc-spdk",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"type": "KernelLVol"}})),
        )
        .await
        .unwrap();
        let v = volume_ready(
            &vols,
            "pvc-spdk",
            "pvc-spdk ready after the fix",
            Duration::from_secs(10),
        )
        .await;
        assert!(v.permanent_failure().is_none(), "{:?}", v.status);
        assert!(
            v.status
                .as_ref()
                .is_some_and(|s| s.message.is_empty() && !s.permanent)
        );
        for name in ["pvc-a", "pvc-b", "pvc-spdk"] {
            delete_and_release(&vols, name, Duration::from_secs(10)).await;
        }
        agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .expect("test timed out");
    drop(fs);
}
