//! T1: the VolumeMigration reconciler in the running controller, against the test API server.
//!
//! No agent runs here and no data is copied: the tests play the agents' part by writing
//! exactly what `docs/migration.md` ("Object flow") says the disk-agents and the host's CSI
//! node write (the volumes' finalizers, `spec.spdkTarget` and `status.status` for the
//! volume agents; `migrationInfo`, its finalizers for the source agent and the host). They
//! test the controller's logic: validation, placement, the destination volume, the phases,
//! the retirement of the source, cancellation and error reporting. Waits poll the API server
//! with a deadline; nothing sleeps to synchronise.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use liteio_api::common::{SpdkLvol, SpdkTarget, VolumePosition, VolumeType};
use liteio_api::keys::{self, finalizers, labels};
use liteio_api::migration::{MigrationPhase, STATUS_ERROR, STATUS_FINISHED, STATUS_WORKING};
use liteio_api::size::GIB;
use liteio_api::{AntstorVolume, VolumeMigration, naming};
use liteio_controller::state::ObjectKey;
use liteio_controller::testing::*;
use serde_json::json;
use tokio::time::timeout;

use common::*;

const UUID: &str = "uuid-pvc-1";

fn migrations(h: &Harness) -> Api<VolumeMigration> {
    Api::namespaced(h.client.clone(), NS)
}

async fn add_migration(h: &Harness, m: MigrationFixture) {
    migrations(h)
        .create(&PostParams::default(), &m.build())
        .await
        .unwrap();
}

async fn get_migration(h: &Harness, name: &str) -> VolumeMigration {
    migrations(h).get(name).await.unwrap()
}

/// Waits until migration `name` is in `phase` with `status`; returns it.
async fn wait_phase(
    h: &Harness,
    name: &str,
    phase: MigrationPhase,
    status: &str,
) -> VolumeMigration {
    eventually_ok(&format!("{name} in {phase:?}/{status}"), || async {
        let m = get_migration(h, name).await;
        if m.phase() == phase && m.status_name() == status {
            Ok(())
        } else {
            Err(format!("{:?}", m.status))
        }
    })
    .await;
    get_migration(h, name).await
}

/// Waits until migration `name` has status Error with a message saying `says`.
async fn wait_error(h: &Harness, name: &str, says: &str) -> VolumeMigration {
    eventually_ok(&format!("{name} in Error saying {says:?}"), || async {
        let m = get_migration(h, name).await;
        let msg = m
            .status
            .as_ref()
            .map(|s| s.message.clone())
            .unwrap_or_default();
        if m.status_name() == STATUS_ERROR && msg.contains(says) {
            Ok(())
        } else {
            Err(format!("{:?}", m.status))
        }
    })
    .await;
    get_migration(h, name).await
}

fn pp() -> PatchParams {
    PatchParams::default()
}

/// Plays a volume's disk-agent: finalizers, lvol, export (keeping a preset NQN, serial and
/// namespace UUID, as the agent does) and `status.status=ready`.
async fn agent_provisions(h: &Harness, name: &str, port: &str) {
    let v = h.volume(name).await;
    let mut fins = v.finalizers().to_vec();
    for f in [finalizers::LOGIC_VOLUME, finalizers::SPDK_TARGET] {
        if !fins.iter().any(|x| x == f) {
            fins.push(f.into());
        }
    }
    let preset = v.spec.spdk_target.clone().unwrap_or_default();
    let target = SpdkTarget {
        bdev_name: format!("{}/{name}", keys::DEFAULT_LVS_NAME),
        subsys_nqn: if preset.subsys_nqn.is_empty() {
            naming::subsys_nqn(&v.spec.uuid)
        } else {
            preset.subsys_nqn
        },
        svc_id: port.into(),
        sn: naming::serial_number(&v.spec.uuid),
        trans_type: naming::TRANS_TYPE_TCP.into(),
        ns_uuid: if preset.ns_uuid.is_empty() {
            v.spec.uuid.clone()
        } else {
            preset.ns_uuid
        },
        address: format!("10.0.0.{port}"),
        addr_fam: naming::ADDR_FAM_IPV4.into(),
    };
    h.volumes()
        .patch(
            name,
            &pp(),
            &Patch::Merge(json!({
                "metadata": { "finalizers": fins },
                "spec": {
                    "type": VolumeType::SpdkLVol,
                    "spdkLvol": SpdkLvol { name: name.into(), lvs_name: keys::DEFAULT_LVS_NAME.into(), thin: false },
                    "spdkTarget": target,
                },
            })),
        )
        .await
        .unwrap();
    h.volumes()
        .patch_status(
            name,
            &pp(),
            &Patch::Merge(json!({ "status": { "status": "ready" } })),
        )
        .await
        .unwrap();
}

/// Plays the agent of a volume being deleted: drops its finalizers once the deletion started.
async fn agent_deletes(h: &Harness, name: &str) {
    eventually(&format!("{name} being deleted"), || async {
        h.volumes()
            .get_opt(name)
            .await
            .unwrap()
            .is_none_or(|v| v.metadata.deletion_timestamp.is_some())
    })
    .await;
    remove_finalizers(h, name, &finalizers::AGENT_VOLUME).await;
    eventually(&format!("{name} gone"), || async {
        h.volumes().get_opt(name).await.unwrap().is_none()
    })
    .await;
}

async fn remove_finalizers(h: &Harness, name: &str, which: &[&str]) {
    eventually_ok(&format!("drop {which:?} from {name}"), || async {
        let Some(v) = h.volumes().get_opt(name).await.unwrap() else {
            return Ok(());
        };
        let keep: Vec<String> = v
            .finalizers()
            .iter()
            .filter(|f| !which.contains(&f.as_str()))
            .cloned()
            .collect();
        h.volumes()
            .patch(
                name,
                &pp(),
                &Patch::Merge(json!({ "metadata": {
                    "resourceVersion": v.metadata.resource_version,
                    "finalizers": keep,
                }})),
            )
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await;
}

/// Plays the source agent or the host: merges `info` into `spec.migrationInfo` and sets
/// (`Some(true)`) or drops (`Some(false)`) finalizer `fin`.
async fn agent_reports(h: &Harness, mig: &str, info: serde_json::Value, fin: Option<(&str, bool)>) {
    eventually_ok(&format!("report {info} on {mig}"), || async {
        let m = get_migration(h, mig).await;
        let mut body = json!({ "metadata": { "resourceVersion": m.metadata.resource_version },
                               "spec": { "migrationInfo": info.clone() } });
        if let Some((f, set)) = fin {
            let mut fins: Vec<String> =
                m.finalizers().iter().filter(|x| *x != f).cloned().collect();
            if set {
                fins.push(f.into());
            }
            body["metadata"]["finalizers"] = json!(fins);
        }
        migrations(h)
            .patch(mig, &pp(), &Patch::Merge(body))
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await;
}

/// Pools n1..n3 of 100 GiB and the SPDK volume pvc-1 (10 GiB, consumed on h1) ready on n1.
async fn setup() -> Harness {
    let h = start(test_config()).await;
    for n in ["n1", "n2", "n3"] {
        h.add_pool(pool(n, 100 * GIB)).await;
    }
    h.add_volume(
        volume("pvc-1", 10 * GIB)
            .kind(VolumeType::SpdkLVol)
            .host("h1")
            .label(labels::PV_NAME, "pvc-1")
            .scheduled_to("n1"),
    )
    .await;
    h.wait_bound("pvc-1", "n1").await;
    agent_provisions(&h, "pvc-1", "4420").await;
    h
}

fn free(h: &Harness, node: &str) -> i128 {
    h.ctx.state().free_bytes(node).unwrap()
}

async fn wait_free(h: &Harness, node: &str, bytes: u64) {
    eventually(&format!("{node} has {bytes} free"), || async {
        free(h, node) == i128::from(bytes)
    })
    .await;
}

/// Runs `m1` from creation to `SetupPipe`: returns the destination's name and node.
async fn up_to_setup_pipe(h: &Harness, m: MigrationFixture) -> (String, String) {
    add_migration(h, m).await;
    let mig = wait_phase(h, "m1", MigrationPhase::CreatingVolume, STATUS_WORKING).await;
    let dest = mig.spec.dest_volume.name.clone();
    assert_eq!(dest, format!("mig-{}", mig.uid().unwrap()));
    let d = h.volume(&dest).await;
    let node = d.spec.target_node_id.clone();
    assert!(!node.is_empty() && node != "n1", "destination on {node:?}");
    h.wait_bound(&dest, &node).await;
    agent_provisions(h, &dest, "4421").await;
    let mig = wait_phase(h, "m1", MigrationPhase::SetupPipe, STATUS_WORKING).await;
    assert_eq!(mig.spec.dest_volume.spdk.svc_id, "4421");
    (dest, node)
}

#[tokio::test]
async fn a_migration_runs_to_finished_and_one_volume_is_left() {
    timeout(LIMIT, async {
        let h = setup().await;
        wait_free(&h, "n1", 90 * GIB).await;
        // What the CSI node recorded when it published the source.
        let published = json!({ "stagingTargetPath": "/var/lib/kubelet/staging/pvc-1", "targetPath": "/var/lib/kubelet/pods/p/pvc-1" });
        h.volumes()
            .patch_status("pvc-1", &pp(), &Patch::Merge(json!({ "status": { "csiNodePubParams": published } })))
            .await
            .unwrap();
        let (dest, node) = up_to_setup_pipe(&h, migration("m1", "pvc-1")).await;

        // The migration: the source's place, the routing labels; the destination: the
        // source's identity on another node.
        let mig = get_migration(&h, "m1").await;
        assert_eq!(mig.spec.source_volume.target_node_id, "n1");
        assert_eq!(mig.spec.source_volume.host_node_id, "h1");
        assert_eq!(mig.labels().get(labels::MIGRATE_SOURCE_NODE_ID).unwrap(), "n1");
        assert_eq!(mig.labels().get(labels::MIGRATE_HOST_NODE_ID).unwrap(), "h1");
        assert!(mig.finalizers().iter().any(|f| f == finalizers::IN_STATE));
        assert!(mig.spec.migration_info.start_ts > 0);
        let src = h.volume("pvc-1").await;
        let d = h.volume(&dest).await;
        assert_eq!(d.spec.uuid, UUID);
        assert_eq!(d.labels().get(labels::VOL_UUID).unwrap(), UUID);
        assert_eq!(d.labels().get(labels::MIGRATE_SOURCE_VOLUME_NAME).unwrap(), "pvc-1");
        assert_eq!(d.labels().get(labels::MIGRATE_MIGRATION_NAME).unwrap(), "m1");
        let (st, dt) = (src.spec.spdk_target.unwrap(), d.spec.spdk_target.unwrap());
        assert_eq!((&dt.subsys_nqn, &dt.ns_uuid, &dt.sn), (&st.subsys_nqn, &st.ns_uuid, &st.sn));
        // Both are charged while both exist.
        wait_free(&h, &node, 90 * GIB).await;
        assert_eq!(free(&h, "n1"), i128::from(90 * GIB));

        // Source agent connects the pipe, the host its second path.
        agent_reports(&h, "m1", json!({ "migrationPipe": { "destBdevName": format!("{dest}n1"), "status": "Connected" } }),
            Some((finalizers::MIGRATE_PIPE_CONNECTED, true))).await;
        agent_reports(&h, "m1", json!({ "hostConnectStatus": "Connected" }),
            Some((finalizers::MIGRATE_HOST_CONNECTED, true))).await;
        wait_phase(&h, "m1", MigrationPhase::Syncing, STATUS_WORKING).await;

        // The copy runs, the agent enables the switch, the host reports it done.
        agent_reports(&h, "m1", json!({ "jobProgress": { "status": "running", "total_write_pages": 1024, "roundPassed": 1, "ms_elapsed": 500 },
            "autoSwitch": { "enabled": true, "status": "Unknown" } }), None).await;
        eventually("switch-enabled-at recorded", || async {
            get_migration(&h, "m1").await.annotations().contains_key(keys::annotations::MIGRATE_SWITCH_ENABLED_AT)
        }).await;
        h.clock.advance(std::time::Duration::from_millis(300));
        agent_reports(&h, "m1", json!({ "autoSwitch": { "enabled": true, "status": "Success" } }), None).await;
        let mig = wait_phase(&h, "m1", MigrationPhase::Cleaning, STATUS_WORKING).await;
        assert!(mig.annotations().contains_key(keys::annotations::MIGRATE_SWITCHED_AT));
        // Nothing is retired while the agents still hold the pipe and the path.
        assert!(h.volume("pvc-1").await.metadata.deletion_timestamp.is_none());

        agent_reports(&h, "m1", json!({ "migrationPipe": { "status": "Disconnected" } }),
            Some((finalizers::MIGRATE_PIPE_CONNECTED, false))).await;
        agent_reports(&h, "m1", json!({ "hostConnectStatus": "Disconnected" }),
            Some((finalizers::MIGRATE_HOST_CONNECTED, false))).await;
        // The source goes through the normal deletion path: its agent removes the export
        // and the lvol, then drops its finalizers.
        agent_deletes(&h, "pvc-1").await;
        let mig = wait_phase(&h, "m1", MigrationPhase::Finished, STATUS_FINISHED).await;
        assert!(mig.annotations().contains_key(keys::annotations::MIGRATE_FINISHED_AT));

        // One volume per uuid: the destination, on its node, without migration labels.
        let by_label = h.volumes().list(&ListParams::default().labels(&format!("{}={UUID}", labels::VOL_UUID))).await.unwrap();
        let names: Vec<String> = by_label.items.iter().map(|v| v.name_any()).collect();
        assert_eq!(names, vec![dest.clone()]);
        let all = h.volumes().list(&ListParams::default()).await.unwrap();
        assert_eq!(all.items.iter().filter(|v| v.spec.uuid == UUID).count(), 1);
        let d = h.volume(&dest).await;
        assert_eq!(d.spec.target_node_id, node);
        assert!(!d.labels().contains_key(labels::MIGRATE_MIGRATION_NAME));
        assert!(!d.labels().contains_key(labels::MIGRATE_SOURCE_VOLUME_NAME));
        assert_eq!(
            serde_json::to_value(d.status.as_ref().unwrap().csi_node_pub_params.as_ref().unwrap()).unwrap(),
            published
        );
        // The scheduler's state: the source's space is back, the destination's is taken.
        wait_free(&h, "n1", 100 * GIB).await;
        assert_eq!(free(&h, &node), i128::from(90 * GIB));
        let other = if node == "n2" { "n3" } else { "n2" };
        assert_eq!(free(&h, other), i128::from(100 * GIB));
        // The destination keeps being reconciled as a normal volume (no uuid conflict).
        let d = h.volume(&dest).await;
        assert!(d.status.as_ref().unwrap().message.is_empty(), "{:?}", d.status);

        let metrics = h.ctx.metrics.render();
        assert!(metrics.contains("liteio_controller_migration_switch_duration_seconds_count 1"), "{metrics}");
        assert!(metrics.contains("liteio_controller_migration_duration_seconds_count 1"), "{metrics}");
        assert!(metrics.contains(r#"liteio_controller_migrations{phase="Finished",status="Finished"} 1"#), "{metrics}");

        // Deleting a finished migration leaves the volume alone.
        migrations(&h).delete("m1", &DeleteParams::default()).await.unwrap();
        eventually("m1 gone", || async { migrations(&h).get_opt("m1").await.unwrap().is_none() }).await;
        assert!(h.volume(&dest).await.metadata.deletion_timestamp.is_none());
        h.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn the_user_names_the_destination_node() {
    timeout(LIMIT, async {
        let h = setup().await;
        h.add_pool(pool("small", 2 * GIB)).await;
        // The source's own node, a node too small, a node without a pool: refused.
        add_migration(&h, migration("m-self", "pvc-1").to("n1")).await;
        wait_error(
            &h,
            "m-self",
            "spec.destVolume.targetNodeId: n1 is the source volume's node",
        )
        .await;
        migrations(&h)
            .delete("m-self", &DeleteParams::default())
            .await
            .unwrap();
        eventually("m-self gone", || async {
            migrations(&h).get_opt("m-self").await.unwrap().is_none()
        })
        .await;
        add_migration(&h, migration("m-small", "pvc-1").to("small")).await;
        wait_error(
            &h,
            "m-small",
            "node small cannot take volume pvc-1: PoolFreeSize",
        )
        .await;
        migrations(&h)
            .delete("m-small", &DeleteParams::default())
            .await
            .unwrap();
        eventually("m-small gone", || async {
            migrations(&h).get_opt("m-small").await.unwrap().is_none()
        })
        .await;
        // Nothing was created for them.
        let all = h.volumes().list(&ListParams::default()).await.unwrap();
        assert_eq!(all.items.len(), 1);

        let (_, node) = up_to_setup_pipe(&h, migration("m1", "pvc-1").to("n3")).await;
        assert_eq!(node, "n3");
        assert_eq!(free(&h, "n2"), i128::from(100 * GIB));
        h.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn invalid_sources_end_in_error_naming_the_problem() {
    timeout(LIMIT, async {
        let h = setup().await;
        h.add_volume(
            volume("lvm-1", GIB)
                .kind(VolumeType::KernelLVol)
                .host("h1")
                .scheduled_to("n2"),
        )
        .await;
        h.add_volume(
            volume("local-1", GIB)
                .kind(VolumeType::SpdkLVol)
                .host("n2")
                .position(VolumePosition::MustLocal)
                .scheduled_to("n2"),
        )
        .await;
        h.add_volume(
            volume("new-1", GIB)
                .kind(VolumeType::SpdkLVol)
                .host("h1")
                .scheduled_to("n3"),
        )
        .await;
        for (m, v) in [
            ("m-missing", "nope"),
            ("m-lvm", "lvm-1"),
            ("m-local", "local-1"),
            ("m-new", "new-1"),
        ] {
            add_migration(&h, migration(m, v)).await;
        }
        wait_error(&h, "m-missing", "AntstorVolume obnvmf/nope does not exist").await;
        wait_error(&h, "m-lvm", "spec.type KernelLVol").await;
        wait_error(&h, "m-local", "MustLocal").await;
        let m = wait_error(&h, "m-new", "status.status creating; it must be ready").await;
        assert_eq!(m.phase(), MigrationPhase::Pending);
        // No destination was created for any of them.
        let all = h.volumes().list(&ListParams::default()).await.unwrap();
        assert!(all.items.iter().all(|v| !v.name_any().starts_with("mig-")));
        // Level-triggered: once the source is ready, the migration goes on.
        h.wait_bound("new-1", "n3").await;
        agent_provisions(&h, "new-1", "4430").await;
        wait_phase(&h, "m-new", MigrationPhase::CreatingVolume, STATUS_WORKING).await;
        h.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn deleting_a_migration_before_the_switch_cancels_it() {
    timeout(LIMIT, async {
        let h = setup().await;
        let (dest, node) = up_to_setup_pipe(&h, migration("m1", "pvc-1")).await;
        agent_reports(&h, "m1", json!({ "migrationPipe": { "destBdevName": format!("{dest}n1"), "status": "Connected" } }),
            Some((finalizers::MIGRATE_PIPE_CONNECTED, true))).await;
        wait_free(&h, &node, 90 * GIB).await;
        let before = h.volume("pvc-1").await;

        migrations(&h).delete("m1", &DeleteParams::default()).await.unwrap();
        // The destination goes through the normal deletion path.
        agent_deletes(&h, &dest).await;
        wait_free(&h, &node, 100 * GIB).await;
        // The controller let go of the migration; the source agent still tears its pipe down.
        eventually("in-state dropped", || async {
            get_migration(&h, "m1").await.finalizers() == [finalizers::MIGRATE_PIPE_CONNECTED.to_string()]
        }).await;
        agent_reports(&h, "m1", json!({ "migrationPipe": { "status": "Disconnected" } }),
            Some((finalizers::MIGRATE_PIPE_CONNECTED, false))).await;
        eventually("m1 gone", || async { migrations(&h).get_opt("m1").await.unwrap().is_none() }).await;

        // The source is untouched.
        let after = h.volume("pvc-1").await;
        assert!(after.metadata.deletion_timestamp.is_none());
        assert_eq!(after.spec, before.spec);
        assert_eq!(after.labels(), before.labels());
        assert_eq!(after.finalizers(), before.finalizers());
        assert_eq!(free(&h, "n1"), i128::from(90 * GIB));
        let ns = ObjectKey::new(NS, dest.as_str());
        assert!(h.ctx.state().volume(&ns).is_none());
        h.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn an_agent_error_is_reported_and_the_source_keeps_serving() {
    timeout(LIMIT, async {
        let h = setup().await;
        let (dest, _) = up_to_setup_pipe(&h, migration("m1", "pvc-1")).await;
        agent_reports(&h, "m1", json!({ "migrationPipe": { "destBdevName": format!("{dest}n1"), "status": "Connected" } }),
            Some((finalizers::MIGRATE_PIPE_CONNECTED, true))).await;
        agent_reports(&h, "m1", json!({ "hostConnectStatus": "Connected" }),
            Some((finalizers::MIGRATE_HOST_CONNECTED, true))).await;
        wait_phase(&h, "m1", MigrationPhase::Syncing, STATUS_WORKING).await;

        agent_reports(&h, "m1", json!({ "jobProgress": { "status": "Error" } }), None).await;
        let m = wait_error(&h, "m1", "jobProgress.status: Error").await;
        assert_eq!(m.phase(), MigrationPhase::Syncing);
        let src = h.volume("pvc-1").await;
        assert!(src.metadata.deletion_timestamp.is_none());
        assert_eq!(src.labels().get(labels::VOL_UUID).unwrap(), UUID);
        let metrics = h.ctx.metrics.render();
        assert!(metrics.contains(r#"liteio_controller_migrations{phase="Syncing",status="Error"} 1"#), "{metrics}");

        // The agent restarts the copy: the error clears.
        agent_reports(&h, "m1", json!({ "jobProgress": { "status": "running" } }), None).await;
        wait_phase(&h, "m1", MigrationPhase::Syncing, STATUS_WORKING).await;

        // The destination volume vanishes: an error, the source keeps serving.
        remove_finalizers(&h, &dest, &finalizers::AGENT_VOLUME).await;
        h.volumes().delete(&dest, &DeleteParams::default()).await.unwrap();
        eventually("destination gone", || async { h.volumes().get_opt(&dest).await.unwrap().is_none() }).await;
        wait_error(&h, "m1", "disappeared").await;
        assert!(h.volume("pvc-1").await.metadata.deletion_timestamp.is_none());
        h.stop().await;
    })
    .await
    .unwrap();
}

/// The destination shares the source's uuid on purpose; any other volume that does is still
/// refused by the volume reconciler.
#[tokio::test]
async fn only_a_migration_destination_may_share_the_uuid() {
    timeout(LIMIT, async {
        let h = setup().await;
        let mut dup: AntstorVolume = volume("dup", GIB).kind(VolumeType::SpdkLVol).build();
        dup.spec.uuid = UUID.into();
        dup.metadata
            .labels
            .get_or_insert_default()
            .insert(labels::MIGRATE_SOURCE_VOLUME_NAME.into(), "pvc-1".into());
        h.volumes()
            .create(&PostParams::default(), &dup)
            .await
            .unwrap();
        eventually("dup refused", || async {
            h.volume("dup").await.status.is_some_and(|s| {
                s.message
                    .contains("already used by AntstorVolume obnvmf/pvc-1")
            })
        })
        .await;
        h.stop().await;
    })
    .await
    .unwrap();
}

/// After the switch the host uses the destination: deleting the migration then does not
/// cancel it; the controller finishes the flow, then lets the object go.
#[tokio::test]
async fn deleting_a_migration_after_the_switch_finishes_it_first() {
    timeout(LIMIT, async {
        let h = setup().await;
        let (dest, node) = up_to_setup_pipe(&h, migration("m1", "pvc-1")).await;
        agent_reports(&h, "m1", json!({ "migrationPipe": { "destBdevName": format!("{dest}n1"), "status": "Connected" } }),
            Some((finalizers::MIGRATE_PIPE_CONNECTED, true))).await;
        agent_reports(&h, "m1", json!({ "hostConnectStatus": "Connected" }),
            Some((finalizers::MIGRATE_HOST_CONNECTED, true))).await;
        wait_phase(&h, "m1", MigrationPhase::Syncing, STATUS_WORKING).await;
        agent_reports(&h, "m1", json!({ "autoSwitch": { "enabled": true, "status": "Success" } }), None).await;
        wait_phase(&h, "m1", MigrationPhase::Cleaning, STATUS_WORKING).await;

        migrations(&h).delete("m1", &DeleteParams::default()).await.unwrap();
        // The destination stays; the agents finish their part.
        assert!(h.volume(&dest).await.metadata.deletion_timestamp.is_none());
        agent_reports(&h, "m1", json!({ "migrationPipe": { "status": "Disconnected" } }),
            Some((finalizers::MIGRATE_PIPE_CONNECTED, false))).await;
        agent_reports(&h, "m1", json!({ "hostConnectStatus": "Disconnected" }),
            Some((finalizers::MIGRATE_HOST_CONNECTED, false))).await;
        agent_deletes(&h, "pvc-1").await;
        eventually("m1 gone", || async { migrations(&h).get_opt("m1").await.unwrap().is_none() }).await;
        let d = h.volume(&dest).await;
        assert!(d.metadata.deletion_timestamp.is_none());
        assert!(!d.labels().contains_key(labels::MIGRATE_MIGRATION_NAME));
        assert_eq!(d.spec.target_node_id, node);
        wait_free(&h, "n1", 100 * GIB).await;
        h.stop().await;
    })
    .await
    .unwrap();
}
