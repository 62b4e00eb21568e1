//! T1: the kubectl plugin against the in-process test API server: list tables, JSON/YAML,
//! describe, lock/unlock, errors, and the built binary with a kubeconfig.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use clap::Parser;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Event, Namespace, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use liteio_api::common::{KernelLvol, NodeInfo, SpdkLvol, SpdkTarget, VolumeStatus};
use liteio_api::keys::{finalizers, labels, managers};
use liteio_api::pool::{KernelLvm, PoolCondition, SpdkLvStore};
use liteio_api::size::{GIB, quantity};
use liteio_api::snapshot::SnapshotVolType;
use liteio_api::{
    AntstorSnapshot, AntstorSnapshotSpec, AntstorVolume, AntstorVolumeSpec, StoragePool,
    StoragePoolSpec,
};
use liteio_cli::{Cli, CliError, ErrorKind, run_at};
use liteio_test_apiserver::TestApiServer;
use serde_json::{Value, json};

const NS: &str = "obnvmf";
const LIMIT: Duration = Duration::from_secs(60);

async fn within<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(LIMIT, f)
        .await
        .expect("test timed out")
}

fn now() -> Timestamp {
    Timestamp::from_second(1_800_000_000).unwrap()
}

fn cli(args: &[&str]) -> Cli {
    Cli::try_parse_from(std::iter::once("kubectl-liteio").chain(args.iter().copied())).unwrap()
}

async fn out(client: &Client, args: &[&str]) -> String {
    run_at(&cli(args), client, now())
        .await
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// `text` with every run of spaces as one space: describe assertions do not depend on the
/// alignment width.
fn squash(text: &str) -> String {
    text.split('\n')
        .map(|l| {
            l.split(' ')
                .filter(|w| !w.is_empty())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(NS.into()),
        ..ObjectMeta::default()
    }
}

async fn status<K>(api: &Api<K>, name: &str, status: Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": status})),
    )
    .await
    .unwrap();
}

/// Two pools (an SPDK one heartbeating, a locked LVM one without a Lease), three volumes,
/// one snapshot and an event.
async fn seed(client: &Client) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut ns = Namespace::default();
    ns.metadata.name = Some(NS.into());
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let pools: Api<StoragePool> = Api::namespaced(client.clone(), NS);
    let mut p1 = StoragePool::new(
        "node-1",
        StoragePoolSpec {
            spdk_lv_store: SpdkLvStore {
                name: "aio-lvs".into(),
                uuid: "lvs-uuid-1".into(),
                base_bdev: "test-aio-bdev".into(),
                bytes: 100 * GIB,
                cluster_size: 4 << 20,
                total_data_clusters: 25_600,
                block_size: 512,
            },
            node_info: NodeInfo {
                id: "node-1".into(),
                ip: "10.0.0.1".into(),
                hostname: "host-1".into(),
                ..NodeInfo::default()
            },
            ..StoragePoolSpec::default()
        },
    );
    p1.metadata.namespace = Some(NS.into());
    p1.metadata.annotations = Some(BTreeMap::from([(
        "obnvmf/hostnqn".to_string(),
        "nqn.2021-03.com.alipay.host:uuid:node-1".to_string(),
    )]));
    pools.create(&PostParams::default(), &p1).await.unwrap();
    status(
        &pools,
        "node-1",
        json!({
            "capacity": {"storage": quantity(100 * GIB)},
            "vgFreeSize": quantity(60 * GIB),
            "status": "ready",
            "conditions": [PoolCondition {
                type_: liteio_api::pool::PoolConditionType::Spdk,
                status: liteio_api::pool::ConditionStatus::Ok,
                message: String::new(),
            }],
        }),
    )
    .await;

    let mut p2 = StoragePool::new(
        "node-2",
        StoragePoolSpec {
            kernel_lvm: KernelLvm {
                name: "test-vg".into(),
                vg_uuid: "vg-uuid-2".into(),
                bytes: 20 * GIB,
                extend_size: 4 << 20,
                extend_count: 5120,
                pv_count: 1,
                ..KernelLvm::default()
            },
            ..StoragePoolSpec::default()
        },
    );
    p2.metadata.namespace = Some(NS.into());
    p2.metadata.labels = Some(BTreeMap::from([(
        labels::POOL_SCHEDULING_STATUS.to_string(),
        labels::POOL_SCHEDULING_LOCKED.to_string(),
    )]));
    pools.create(&PostParams::default(), &p2).await.unwrap();
    status(
        &pools,
        "node-2",
        json!({"vgFreeSize": quantity(15 * GIB), "status": "unknown", "message": "no heartbeat"}),
    )
    .await;

    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    let renewed = now() - SignedDuration::from_secs(5);
    leases
        .create(
            &PostParams::default(),
            &Lease {
                metadata: meta("node-1"),
                spec: Some(LeaseSpec {
                    holder_identity: Some("node-1".into()),
                    lease_duration_seconds: Some(40),
                    renew_time: Some(MicroTime(renewed)),
                    ..LeaseSpec::default()
                }),
            },
        )
        .await
        .unwrap();

    let vols: Api<AntstorVolume> = Api::namespaced(client.clone(), NS);
    let volume = |name: &str, uuid: &str, size: u64, node: &str| {
        let mut v = AntstorVolume::new(
            name,
            AntstorVolumeSpec {
                uuid: uuid.into(),
                size_byte: size,
                target_node_id: node.into(),
                ..AntstorVolumeSpec::default()
            },
        );
        v.metadata.namespace = Some(NS.into());
        v.metadata.labels = Some(BTreeMap::from([(
            labels::TARGET_NODE_ID.to_string(),
            node.to_string(),
        )]));
        v
    };
    let uuid_a = "0b0f2d9e-5b3c-4c9a-9a51-3f2a1c7e8d10";
    let mut a = volume("pvc-a", uuid_a, 10 * GIB, "node-1");
    a.spec.host_node = Some(NodeInfo {
        id: "node-3".into(),
        ip: "10.0.0.3".into(),
        ..NodeInfo::default()
    });
    a.spec.spdk_lvol = Some(SpdkLvol {
        name: "pvc-a".into(),
        lvs_name: "aio-lvs".into(),
        thin: false,
    });
    a.spec.spdk_target = Some(SpdkTarget {
        bdev_name: "aio-lvs/pvc-a".into(),
        subsys_nqn: liteio_api::naming::subsys_nqn(uuid_a),
        svc_id: "4510".into(),
        sn: liteio_api::naming::serial_number(uuid_a),
        trans_type: "TCP".into(),
        ns_uuid: uuid_a.into(),
        address: "10.0.0.1".into(),
        addr_fam: "IPv4".into(),
    });
    a.metadata.finalizers = Some(vec![
        finalizers::IN_STATE.to_string(),
        finalizers::LOGIC_VOLUME.to_string(),
        finalizers::SPDK_TARGET.to_string(),
    ]);
    vols.create(&PostParams::default(), &a).await.unwrap();
    status(&vols, "pvc-a", json!({"status": VolumeStatus::Ready})).await;

    vols.create(
        &PostParams::default(),
        &volume(
            "pvc-b",
            "5d3e1f20-0000-4000-8000-000000000002",
            2 * GIB,
            "node-1",
        ),
    )
    .await
    .unwrap();
    let mut c = volume(
        "pvc-c",
        "7a7a7a7a-0000-4000-8000-000000000003",
        GIB,
        "node-2",
    );
    c.spec.kernel_lvol = Some(KernelLvol {
        name: "pvc-c".into(),
        dev_path: "/dev/test-vg/pvc-c".into(),
    });
    vols.create(&PostParams::default(), &c).await.unwrap();
    status(&vols, "pvc-c", json!({"status": "ready"})).await;

    let snaps: Api<AntstorSnapshot> = Api::namespaced(client.clone(), NS);
    let mut s = AntstorSnapshot::new(
        "snap-a",
        AntstorSnapshotSpec {
            uuid: "9c9c9c9c-0000-4000-8000-000000000009".into(),
            vol_type: SnapshotVolType::SpdkLVol,
            size: i64::try_from(GIB).unwrap(),
            origin_vol_name: "pvc-a".into(),
            origin_vol_namespace: NS.into(),
            origin_vol_target_node_id: "node-1".into(),
            ..AntstorSnapshotSpec::default()
        },
    );
    s.metadata.namespace = Some(NS.into());
    snaps.create(&PostParams::default(), &s).await.unwrap();
    status(&snaps, "snap-a", json!({"status": "ready"})).await;

    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    events
        .create(
            &PostParams::default(),
            &Event {
                metadata: meta("pvc-a.1"),
                involved_object: ObjectReference {
                    kind: Some("AntstorVolume".into()),
                    name: Some("pvc-a".into()),
                    namespace: Some(NS.into()),
                    ..ObjectReference::default()
                },
                reason: Some("Scheduled".into()),
                message: Some("volume scheduled to node-1".into()),
                type_: Some("Normal".into()),
                last_timestamp: Some(Time(now() - SignedDuration::from_secs(90))),
                ..Event::default()
            },
        )
        .await
        .unwrap();
}

async fn seeded() -> (TestApiServer, Client) {
    let server = TestApiServer::start().await.unwrap();
    let client = server.client().await.unwrap();
    seed(&client).await;
    (server, client)
}

#[tokio::test]
async fn pools_table_shows_engine_capacity_volumes_state_and_heartbeat() {
    within(async {
        let (_server, client) = seeded().await;
        let text = out(&client, &["pools"]).await;
        assert_eq!(
            text,
            "\
NODE     ENGINE        TOTAL       FREE       VOLUMES   STATE            HEARTBEAT
node-1   SpdkLVStore   100.0 GiB   60.0 GiB   2         ready            5s ago
node-2   KernelLVM     20.0 GiB    15.0 GiB   1         unknown,locked   -
",
            "{text}"
        );
        let json: Value =
            serde_json::from_str(&out(&client, &["pools", "-o", "json"]).await).unwrap();
        assert_eq!(json[0]["node"], "node-1");
        assert_eq!(json[0]["totalBytes"], 100 * GIB);
        assert_eq!(json[0]["heartbeatAgeSeconds"], 5);
        assert_eq!(json[1]["locked"], true);
        assert_eq!(json[1]["heartbeatAgeSeconds"], Value::Null);
    })
    .await;
}

#[tokio::test]
async fn volumes_and_snapshots_tables_and_structured_output() {
    within(async {
        let (_server, client) = seeded().await;
        let text = out(&client, &["volumes"]).await;
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert_eq!(
            lines[0],
            "NAME    UUID                                   SIZE       POOL     HOST     STATE      EXPORT          QOS"
        );
        assert_eq!(
            lines[1],
            "pvc-a   0b0f2d9e-5b3c-4c9a-9a51-3f2a1c7e8d10   10.0 GiB   node-1   node-3   ready      10.0.0.1:4510   unlimited"
        );
        assert_eq!(
            lines[2],
            "pvc-b   5d3e1f20-0000-4000-8000-000000000002   2.0 GiB    node-1   -        creating   -               unlimited"
        );
        assert!(lines[3].starts_with("pvc-c ") && lines[3].contains("ready"), "{text}");

        let yaml: Value =
            serde_yaml::from_str(&out(&client, &["volumes", "-o", "yaml"]).await).unwrap();
        assert_eq!(yaml[0]["export"], "10.0.0.1:4510");
        assert_eq!(yaml[1]["export"], Value::Null);
        assert_eq!(yaml[2]["sizeBytes"], GIB);

        let text = out(&client, &["snap"]).await;
        assert_eq!(
            text,
            "\
NAME     UUID                                   SIZE      ORIGIN   NODE     TYPE       STATE
snap-a   9c9c9c9c-0000-4000-8000-000000000009   1.0 GiB   pvc-a    node-1   SpdkLVol   ready
"
        );
        let empty = run_at(&cli(&["-n", "elsewhere", "volumes"]), &client, now())
            .await
            .unwrap();
        assert_eq!(empty, "No volumes found in namespace elsewhere.\n");
    })
    .await;
}

#[tokio::test]
async fn describe_volume_names_the_engine_objects_and_events() {
    within(async {
        let (_server, client) = seeded().await;
        let text = out(&client, &["describe", "volume", "pvc-a"]).await;
        println!("{text}");
        for want in [
            "Name:            pvc-a",
            "UUID:            0b0f2d9e-5b3c-4c9a-9a51-3f2a1c7e8d10",
            "Size:            10.0 GiB (10737418240 bytes)",
            "Pool:            node-1",
            "Host:            node-3 (10.0.0.3, remote)",
            "  SPDK lvol: aio-lvs/pvc-a",
            "  Subsystem NQN:  nqn.2021-03.com.alipay.ob:uuid:0b0f2d9e-5b3c-4c9a-9a51-3f2a1c7e8d10",
            "  Serial:         0b0f2d9e5b3c4c9a9a51",
            "  Listener:       10.0.0.1:4510 (TCP IPv4)",
            "  Port:           4510",
            "antstor.alipay.com/spdk-tgt",
            "Scheduled",
            "volume scheduled to node-1",
        ] {
            assert!(
                squash(&text).contains(&squash(want)),
                "missing {want:?} in\n{text}"
            );
        }
        // A volume not exported yet still shows the NQN and serial it will get.
        let text = out(&client, &["describe", "vol", "pvc-b"]).await;
        assert!(
            text.contains("nqn.2021-03.com.alipay.ob:uuid:5d3e1f20-0000-4000-8000-000000000002"),
            "{text}"
        );
        assert!(squash(&text).contains("Listener: <not exported>"), "{text}");
        assert!(text.contains("Events:"), "{text}");
        let text = out(&client, &["describe", "volume", "pvc-c"]).await;
        assert!(
            squash(&text).contains("\nLV: pvc-c\nDevice: /dev/test-vg/pvc-c"),
            "{text}"
        );

        let json: Value = serde_json::from_str(
            &out(&client, &["describe", "volume", "pvc-a", "-o", "json"]).await,
        )
        .unwrap();
        assert_eq!(
            json["volume"]["spec"]["uuid"],
            "0b0f2d9e-5b3c-4c9a-9a51-3f2a1c7e8d10"
        );
        assert_eq!(json["serialNumber"], "0b0f2d9e5b3c4c9a9a51");
        assert_eq!(json["events"][0]["reason"], "Scheduled");
    })
    .await;
}

#[tokio::test]
async fn describe_pool_shows_engine_heartbeat_and_volumes() {
    within(async {
        let (_server, client) = seeded().await;
        let text = out(&client, &["describe", "pool", "node-1"]).await;
        println!("{text}");
        for want in [
            "Node:",
            "node-1 (ip 10.0.0.1, hostname host-1)",
            "Engine:",
            "SpdkLVStore",
            "LVStore:",
            "aio-lvs",
            "lvs-uuid-1",
            "test-aio-bdev",
            "100.0 GiB (107374182400 bytes)",
            "Charged to volumes:",
            "12.0 GiB",
            "Scheduling:",
            "open",
            "Spdk",
            "Holder:",
            "(5s ago)",
            "nqn.2021-03.com.alipay.host:uuid:node-1",
            "Volumes (2):",
            "pvc-a",
            "pvc-b",
        ] {
            assert!(
                squash(&text).contains(&squash(want)),
                "missing {want:?} in\n{text}"
            );
        }
        assert!(!text.contains("pvc-c"), "{text}");
        let text = out(&client, &["describe", "pool", "node-2"]).await;
        for want in [
            "test-vg",
            "vg-uuid-2",
            "Heartbeat:",
            "<no Lease>",
            "no heartbeat",
            "locked (label",
        ] {
            assert!(
                squash(&text).contains(&squash(want)),
                "missing {want:?} in\n{text}"
            );
        }
        let yaml: Value = serde_yaml::from_str(
            &out(&client, &["describe", "pool", "node-1", "-o", "yaml"]).await,
        )
        .unwrap();
        assert_eq!(yaml["pool"]["spec"]["spdkLVStore"]["name"], "aio-lvs");
        assert_eq!(yaml["heartbeatAgeSeconds"], 5);
        assert_eq!(yaml["volumes"].as_array().unwrap().len(), 2);
    })
    .await;
}

#[tokio::test]
async fn lock_and_unlock_change_the_label_under_the_cli_field_manager() {
    within(async {
        let (_server, client) = seeded().await;
        let pools: Api<StoragePool> = Api::namespaced(client.clone(), NS);
        assert_eq!(
            out(&client, &["lock", "pool", "node-1"]).await,
            "pool node-1 locked\n"
        );
        let p = pools.get("node-1").await.unwrap();
        assert_eq!(
            p.labels()
                .get(labels::POOL_SCHEDULING_STATUS)
                .map(String::as_str),
            Some("locked")
        );
        assert!(
            p.managed_fields()
                .iter()
                .any(|m| m.manager.as_deref() == Some(managers::CLI)),
            "{:?}",
            p.managed_fields()
        );
        assert_eq!(
            out(&client, &["lock", "pool", "node-1"]).await,
            "pool node-1 already locked\n"
        );
        assert!(out(&client, &["pools"]).await.contains("ready,locked"));
        assert_eq!(
            out(&client, &["unlock", "pool", "node-1"]).await,
            "pool node-1 unlocked\n"
        );
        let p = pools.get("node-1").await.unwrap();
        assert_eq!(p.labels().get(labels::POOL_SCHEDULING_STATUS), None);
        let json: Value =
            serde_json::from_str(&out(&client, &["unlock", "pool", "node-2", "-o", "json"]).await)
                .unwrap();
        assert_eq!(
            json,
            json!({"pool": "node-2", "locked": false, "changed": true})
        );
    })
    .await;
}

#[tokio::test]
async fn missing_objects_are_one_line_errors() {
    within(async {
        let (_server, client) = seeded().await;
        for (args, msg) in [
            (
                &["describe", "volume", "pvc-x"][..],
                "volume pvc-x not found in namespace obnvmf",
            ),
            (
                &["describe", "pool", "node-9"][..],
                "pool node-9 not found in namespace obnvmf",
            ),
            (
                &["lock", "pool", "node-9"][..],
                "pool node-9 not found in namespace obnvmf",
            ),
        ] {
            let err: CliError = run_at(&cli(args), &client, now()).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::NotFound);
            assert_eq!(err.to_string(), msg);
        }
    })
    .await;
}

#[tokio::test]
async fn the_binary_reads_a_kubeconfig_and_exits_1_on_errors() {
    within(async {
        let (server, _client) = seeded().await;
        let dir = tempfile::tempdir().unwrap();
        let kc = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kc).unwrap();
        let bin = env!("CARGO_BIN_EXE_kubectl-liteio");
        let run = |args: &[&str]| {
            let mut cmd = tokio::process::Command::new(bin);
            cmd.arg("--kubeconfig")
                .arg(&kc)
                .args(args)
                .env_remove("KUBECONFIG");
            cmd.kill_on_drop(true);
            cmd.output()
        };
        let ok = run(&["pools"]).await.unwrap();
        assert!(
            ok.status.success(),
            "{}",
            String::from_utf8_lossy(&ok.stderr)
        );
        let stdout = String::from_utf8(ok.stdout).unwrap();
        assert!(stdout.starts_with("NODE "), "{stdout}");
        assert!(stdout.contains("node-1   SpdkLVStore"), "{stdout}");

        let bad = run(&["describe", "volume", "pvc-x"]).await.unwrap();
        assert_eq!(bad.status.code(), Some(1));
        assert_eq!(
            String::from_utf8(bad.stderr).unwrap(),
            "error: volume pvc-x not found in namespace obnvmf\n"
        );
        assert!(bad.stdout.is_empty());

        let missing = tokio::process::Command::new(bin)
            .args(["--kubeconfig", "/nonexistent/kubeconfig", "pools"])
            .output()
            .await
            .unwrap();
        assert_eq!(missing.status.code(), Some(1));
        let err = String::from_utf8(missing.stderr).unwrap();
        assert!(
            err.starts_with("error: cannot use kubeconfig /nonexistent/kubeconfig"),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    })
    .await;
}

/// Found by the bad-input sweep (issue 16): volume sizes come from the API server; two
/// whose allocated sizes add past u64 made `describe pool` overflow (a panic in debug).
#[tokio::test]
async fn describe_pool_with_huge_volumes_does_not_overflow() {
    within(async {
        let (_server, client) = seeded().await;
        let vols: Api<AntstorVolume> = Api::namespaced(client.clone(), NS);
        for name in ["pvc-a", "pvc-b"] {
            let patch = json!({"metadata": {"annotations": {
                liteio_api::keys::annotations::ALLOCATED_BYTES: u64::MAX.to_string()
            }}});
            vols.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
        }
        let text = out(&client, &["describe", "pool", "node-1"]).await;
        assert!(squash(&text).contains("Charged to volumes:"), "{text}");
    })
    .await;
}

/// The keys each volume's Secret holds (what `rotate-keys` replaces).
async fn volume_keys(client: &Client, csi_name: &str) -> liteio_api::auth::VolumeKeys {
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), NS);
    let s = secrets
        .get(&liteio_api::naming::auth_secret(csi_name))
        .await
        .unwrap();
    liteio_api::auth::VolumeKeys::from_secret_data(&s.data.unwrap()).unwrap()
}

#[tokio::test]
async fn rotate_keys_replaces_a_volumes_keys_and_tells_the_agent() {
    use liteio_api::auth::{self, VolumeKeys};
    within(async {
        let (_server, client) = seeded().await;
        let vols: Api<AntstorVolume> = Api::namespaced(client.clone(), NS);
        // No Secret yet: refused, saying who makes it.
        let err = run_at(&cli(&["rotate-keys", "pvc-a"]), &client, now())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Refused);
        assert!(
            err.to_string()
                .starts_with("volume pvc-a has no keys Secret obnvmf/liteio-auth-pvc-a"),
            "{err}"
        );
        let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), NS);
        let mut before = BTreeMap::new();
        for name in ["pvc-a", "pvc-b", "pvc-c"] {
            let keys = VolumeKeys::generate(name == "pvc-a").unwrap();
            let v = vols.get(name).await.unwrap();
            secrets
                .create(&PostParams::default(), &auth::volume_secret(&v, &keys).unwrap())
                .await
                .unwrap();
            before.insert(name, keys);
        }

        let text = out(&client, &["rotate-keys", "pvc-a"]).await;
        assert_eq!(
            text,
            format!(
                "volume pvc-a: new keys in Secret obnvmf/liteio-auth-pvc-a; the disk-agent applies them to the export and then sets its annotation obnvmf/keys-applied-at={} (connected hosts stay connected, new connections need the new keys)\n",
                now()
            )
        );
        let after = volume_keys(&client, "pvc-a").await;
        let old = &before["pvc-a"];
        assert_ne!(after.host, old.host, "host key not replaced");
        assert_ne!(after.ctrl, old.ctrl, "controller key not replaced");
        assert_ne!(after.host, after.ctrl);
        assert_eq!(after.tls_psk, old.tls_psk, "the TLS PSK is kept");
        assert!(!text.contains(after.host.expose()) && !text.contains(old.host.expose()));
        let v = vols.get("pvc-a").await.unwrap();
        assert_eq!(
            v.annotations()
                .get(liteio_api::keys::annotations::KEYS_ROTATED_AT)
                .map(String::as_str),
            Some(now().to_string().as_str()),
            "the agent is told"
        );

        // By node: node-3 consumes pvc-a only; node-1 stores pvc-a and pvc-b.
        let json: Value = serde_json::from_str(
            &out(&client, &["rotate-keys", "--node", "node-3", "-o", "json"]).await,
        )
        .unwrap();
        assert_eq!(json.as_array().map(Vec::len), Some(1), "{json}");
        assert_eq!(json[0]["volume"], "pvc-a");
        assert!(!json.to_string().contains("DHHC-1"), "{json}");
        let c_before = volume_keys(&client, "pvc-c").await;
        let b_before = volume_keys(&client, "pvc-b").await;
        out(&client, &["rotate-keys", "--node", "node-1"]).await;
        assert_ne!(volume_keys(&client, "pvc-b").await.host, b_before.host);
        assert_eq!(volume_keys(&client, "pvc-c").await, c_before, "pvc-c is on node-2");
        assert_eq!(
            out(&client, &["rotate-keys", "--node", "node-9"]).await,
            "no volume in namespace obnvmf is stored on or consumed by node node-9\n"
        );
        // A volume and --node together, or neither, is a usage error.
        for args in [&["rotate-keys", "pvc-a", "--node", "node-1"][..], &["rotate-keys"][..]] {
            assert!(
                Cli::try_parse_from(std::iter::once("kubectl-liteio").chain(args.iter().copied()))
                    .is_err(),
                "{args:?}"
            );
        }
        let err = run_at(&cli(&["rotate-keys", "pvc-x"]), &client, now())
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), "volume pvc-x not found in namespace obnvmf");
    })
    .await;
}

#[tokio::test]
async fn migrate_creates_one_migration_and_the_table_shows_its_progress() {
    within(async {
        let (_server, client) = seeded().await;
        let name = "pvc-a-mig-1800000000";
        let text = out(&client, &["migrate", "pvc-a", "--to", "node-2"]).await;
        assert_eq!(
            text,
            format!("migration {name} created: volume pvc-a moves to node node-2; follow it with `kubectl liteio migrations`\n")
        );
        let migs: Api<liteio_api::VolumeMigration> = Api::namespaced(client.clone(), NS);
        let m = migs.get(name).await.unwrap();
        assert_eq!(m.spec.source_volume.name, "pvc-a");
        assert_eq!(m.spec.source_volume.namespace, NS);
        assert_eq!(m.spec.dest_volume.target_node_id, "node-2");

        // Idempotent: a second call reports the migration under way.
        let text = out(&client, &["migrate", "pvc-a"]).await;
        assert_eq!(
            text,
            format!("volume pvc-a is already being migrated by migration {name} to node node-2 (phase Pending, status -); nothing created\n")
        );
        let json: Value =
            serde_json::from_str(&out(&client, &["migrate", "pvc-a", "-o", "json"]).await).unwrap();
        assert_eq!(json["created"], false);
        assert_eq!(json["migration"], name);
        assert_eq!(migs.list(&Default::default()).await.unwrap().items.len(), 1);

        // Refused and missing.
        let err = run_at(&cli(&["migrate", "pvc-a", "--to", "node-1"]), &client, now())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Refused);
        assert!(err.to_string().contains("already on node node-1"), "{err}");
        let err = run_at(&cli(&["migrate", "pvc-x"]), &client, now())
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), "volume pvc-x not found in namespace obnvmf");

        // The table: what the controller and the source agent wrote.
        migs.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": {
                "sourceVolume": { "targetNodeId": "node-1" },
                "migrationInfo": { "jobProgress": {
                    "status": "running", "total_write_pages": 655_360, "roundPassed": 1, "ms_elapsed": 10_000,
                }},
            }})),
        )
        .await
        .unwrap();
        status(&migs, name, json!({ "phase": "Syncing", "status": "Working" })).await;
        let text = out(&client, &["migrations"]).await;
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(
            squash(lines[0]),
            "NAME VOLUME FROM TO PHASE STATUS PROGRESS ROUNDS RATE AGE MESSAGE"
        );
        assert!(
            squash(lines[1]).starts_with(&format!("{name} pvc-a node-1 node-2 Syncing Working 25% 1 256.0 MiB/s ")),
            "{text}"
        );
        let yaml: Value = serde_yaml::from_str(&out(&client, &["mig", "-o", "yaml"]).await).unwrap();
        assert_eq!(yaml[0]["copiedBytes"], 655_360u64 * 4096);
        assert_eq!(yaml[0]["sizeBytes"], 10 * GIB);
        let empty = run_at(&cli(&["-n", "elsewhere", "migrations"]), &client, now())
            .await
            .unwrap();
        assert_eq!(empty, "No migrations found in namespace elsewhere.\n");
    })
    .await;
}

/// `qos` shows and changes a volume's limits; the volumes table says whether the agent
/// applied them; bad values name the flag; an LVM or file volume refuses a limit.
#[tokio::test]
async fn qos_shows_changes_and_validates_limits() {
    within(async {
        let (_server, client) = seeded().await;
        assert_eq!(
            out(&client, &["qos", "pvc-a"]).await,
            "volume pvc-a: unlimited (in force)\n"
        );
        let text = out(&client, &["qos", "pvc-a", "--iops", "2000", "--write-mbps", "40"]).await;
        assert_eq!(
            text,
            "volume pvc-a: 2000 IOPS, 40 MiB/s write (not in force yet: the disk-agent applies them to the live export), was unlimited\n"
        );
        let vols: Api<AntstorVolume> = Api::namespaced(client.clone(), NS);
        let q = vols.get("pvc-a").await.unwrap().spec.qos.unwrap();
        assert_eq!((q.iops, q.write_mbps, q.mbps, q.read_mbps), (2000, 40, 0, 0));
        let table = out(&client, &["volumes"]).await;
        assert!(
            table.lines().nth(1).unwrap().ends_with("2000 IOPS, 40 MiB/s write (pending)"),
            "{table}"
        );
        // The agent reports them in force.
        vols.patch(
            "pvc-a",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"annotations": {liteio_api::keys::annotations::QOS_IN_FORCE: q.to_annotation()}}})),
        )
        .await
        .unwrap();
        let table = out(&client, &["volumes"]).await;
        assert!(
            table.lines().nth(1).unwrap().ends_with("2000 IOPS, 40 MiB/s write"),
            "{table}"
        );
        let json: Value =
            serde_json::from_str(&out(&client, &["qos", "pvc-a", "--iops", "2000", "-o", "json"]).await)
                .unwrap();
        assert_eq!(json["changed"], false);
        assert_eq!(json["applied"], true);
        assert_eq!(json["limits"]["iops"], 2000);

        let e = run_at(&cli(&["qos", "pvc-a", "--iops", "1500"]), &client, now())
            .await
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--iops: ") && e.contains("multiple of 1000"), "{e}");
        let e = run_at(&cli(&["qos", "pvc-c", "--iops", "1000"]), &client, now())
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("only the SPDK engine"), "{e}");
        assert_eq!(vols.get("pvc-c").await.unwrap().spec.qos, None);
        let e = run_at(&cli(&["qos", "pvc-zz"]), &client, now())
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("pvc-zz not found"), "{e}");

        // 0 lifts a limit; none left: no spec.qos.
        out(&client, &["qos", "pvc-a", "--iops", "0", "--write-mbps", "0"]).await;
        assert_eq!(vols.get("pvc-a").await.unwrap().spec.qos, None);
    })
    .await;
}

/// A multi-disk volume's row (its layout, where its members are) with its members indented
/// under it; plain volumes after.
#[tokio::test]
async fn volumes_show_multi_disk_volumes_with_their_members() {
    use liteio_api::datacontrol::{AntstorDataControlSpec, Raid, RaidLevel};
    use liteio_api::group::{AntstorVolumeGroupSpec, EntityIdentity, VolumeMeta};
    use liteio_api::{AntstorDataControl, AntstorVolumeGroup};
    within(async {
        let (_server, client) = seeded().await;
        let groups: Api<AntstorVolumeGroup> = Api::namespaced(client.clone(), NS);
        let dcs: Api<AntstorDataControl> = Api::namespaced(client.clone(), NS);
        let vols: Api<AntstorVolume> = Api::namespaced(client.clone(), NS);
        let mut g = AntstorVolumeGroup::new(
            "pvc-md",
            AntstorVolumeGroupSpec {
                uuid: "u-md".into(),
                total_size: 4 * GIB as i64,
                volumes: ["node-1", "node-2"]
                    .iter()
                    .enumerate()
                    .map(|(i, n)| VolumeMeta {
                        vol_id: EntityIdentity {
                            namespace: NS.into(),
                            name: format!("pvc-md-m{i}"),
                            uuid: format!("u-md-m{i}"),
                        },
                        target_node_name: n.to_string(),
                        size: 2 * GIB as i64,
                    })
                    .collect(),
                ..Default::default()
            },
        );
        g.metadata = meta("pvc-md");
        groups.create(&PostParams::default(), &g).await.unwrap();
        let mut dc = AntstorDataControl::new(
            "pvc-md",
            AntstorDataControlSpec {
                uuid: "dc-u-md".into(),
                total_size: 4 * GIB as i64,
                raid: Raid {
                    level: RaidLevel::Raid0,
                },
                volume_groups: vec![EntityIdentity {
                    namespace: NS.into(),
                    name: "pvc-md".into(),
                    uuid: "u-md".into(),
                }],
                host_node: liteio_api::NodeInfo {
                    id: "node-3".into(),
                    ..Default::default()
                },
                ..Default::default()
            },
        );
        dc.metadata = meta("pvc-md");
        dc.spec.engine_type = liteio_api::PoolMode::KernelLVM;
        dcs.create(&PostParams::default(), &dc).await.unwrap();
        for (i, n) in ["node-1", "node-2"].iter().enumerate() {
            let mut v = AntstorVolume::new(
                &format!("pvc-md-m{i}"),
                liteio_api::AntstorVolumeSpec {
                    uuid: format!("u-md-m{i}"),
                    size_byte: 2 * GIB,
                    target_node_id: n.to_string(),
                    ..Default::default()
                },
            );
            v.metadata = meta(&format!("pvc-md-m{i}"));
            v.metadata.labels = Some(
                [(labels::VOL_GROUP_NAME.to_string(), "pvc-md".to_string())]
                    .into_iter()
                    .collect(),
            );
            vols.create(&PostParams::default(), &v).await.unwrap();
        }
        let text = squash(&out(&client, &["volumes"]).await);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[1].starts_with(
                "pvc-md (raid0/KernelLVM) dc-u-md 4.0 GiB node-1,node-2 node-3 creating"
            ),
            "{text}"
        );
        assert!(
            lines[2].starts_with("└ pvc-md-m0 u-md-m0 2.0 GiB node-1"),
            "{text}"
        );
        assert!(
            lines[3].starts_with("└ pvc-md-m1 u-md-m1 2.0 GiB node-2"),
            "{text}"
        );
        assert!(lines[4].starts_with("pvc-a "), "{text}");
        let json: Value =
            serde_json::from_str(&out(&client, &["volumes", "-o", "json"]).await).unwrap();
        assert_eq!(json[0]["layout"], "raid0/KernelLVM");
        assert_eq!(json[1]["memberOf"], "pvc-md");
        assert_eq!(json[3]["memberOf"], Value::Null);
    })
    .await;
}
