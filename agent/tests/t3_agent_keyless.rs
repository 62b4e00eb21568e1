//! T3: a host admitted without keys, beside one that must authenticate, in real SPDK. The
//! agent (in this process, SPDK engine, `nvmf.auth: dhchap`) exports a `preferred` volume
//! that is a hot migration's destination: its consumer (`node-b`, whose Node says its kernel
//! cannot authenticate) gets an entry without DH-HMAC-CHAP keys, the migration's pipe host
//! (the source node) one with the volume's keys. What SPDK holds is read back over its
//! JSON-RPC socket (`nvmf_get_subsystems`, key names only); SPDK's NVMe/TCP initiator in this
//! process plays both hosts. Then the consumer's Node says `dhchap`, and with only the Node
//! changing the consumer's entry gets the keys live and its keyless connect is refused.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{
    HOST_B, MIB, consumer_keys, consumer_pool, create_exported, delete_and_release, eventually,
    remote_volume, rpc, scheduled_volume, start_spdk_agent_with,
};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use liteio_agent::spdk::nvmf::HostKeys;
use liteio_agent::spdk::{SpdkOptions, bdev, initiator, io};
use liteio_api::host_auth::HostAuthPolicy;
use liteio_api::keys::{self, annotations, labels};
use liteio_api::{AntstorVolume, naming};
use serde_json::Value;

const UUID: &str = "5c3a1e9f-7b2d-4e6a-8c0f-1d3b5a7e9c2f";

#[test]
fn a_keyless_host_and_a_keyed_host_on_one_subsystem() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("spdk.sock");
    let opts = SpdkOptions {
        name: "t3-agent-keyless".into(),
        rpc_socket: Some(sock.clone()),
        // SPDK's NVMe/TCP initiator refuses interrupt mode.
        interrupt_mode: false,
        ..SpdkOptions::small()
    };
    common::with_spdk_opts(&opts, Duration::from_secs(150), scenario(sock));
}

/// The host entries SPDK holds for subsystem `nqn`, by host NQN (`nvmf_get_subsystems`).
async fn host_entries(sock: &Path, nqn: &str) -> BTreeMap<String, Value> {
    let sock = sock.to_path_buf();
    let all = tokio::task::spawn_blocking(move || rpc(&sock, "nvmf_get_subsystems", Value::Null))
        .await
        .unwrap()
        .unwrap();
    let ss = all
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["nqn"] == nqn)
        .unwrap_or_else(|| panic!("no subsystem {nqn} in {all}"));
    ss["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| (h["nqn"].as_str().unwrap().to_string(), h.clone()))
        .collect()
}

/// Writes the consumer Node's capability as its CSI node does.
async fn set_capability(client: &Client, node: &str, can: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    let body = serde_json::json!({"metadata": {"annotations": {
        annotations::NODE_HOST_AUTH: can,
        annotations::NODE_KERNEL_RELEASE: "6.1.0-57-amd64",
    }}});
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .unwrap();
}

/// Attaches as `host` with `keys` and expects the target to refuse.
async fn refused(ctrlr: &str, port: u16, nqn: &str, host: &str, keys: &HostKeys, case: &str) {
    common::spdk::refused_attach(ctrlr, port, nqn, host, keys, case).await;
    assert!(
        bdev::get(&format!("{ctrlr}n1")).await.unwrap().is_none(),
        "{case}: a refused attach left a bdev"
    );
}

async fn scenario(sock: PathBuf) {
    let (_server, client, dir) = common::test_cluster("warn").await;
    let _agent = start_spdk_agent_with(&client, dir.path(), true).await;
    consumer_pool(&client).await;
    let nodes: Api<Node> = Api::all(client.clone());
    let mut n = Node::default();
    n.metadata.name = Some("node-b".into());
    nodes.create(&PostParams::default(), &n).await.unwrap();
    set_capability(&client, "node-b", "none").await;

    // The migration's source, on another node (this agent leaves it alone); its node's host
    // NQN is the pipe host of the destination's export.
    let vols: Api<AntstorVolume> = Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
    let mut src = scheduled_volume("pvc-src", UUID, 16 * MIB);
    src.spec.target_node_id = "node-src".into();
    src.metadata.labels = Some(BTreeMap::from([(
        labels::TARGET_NODE_ID.to_string(),
        "node-src".to_string(),
    )]));
    vols.create(&PostParams::default(), &src).await.unwrap();
    let host_src = naming::host_nqn("node-src");

    // The destination, here, consumed by node-b; its listener optimized as after a
    // switch-over, so that the consumer's connection is a working path.
    let mut dst = remote_volume("pvc-dst", UUID, 16 * MIB);
    dst.spec.host_auth = Some(HostAuthPolicy::Preferred);
    dst.metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .extend([
            (
                labels::MIGRATE_MIGRATION_NAME.to_string(),
                "mig-1".to_string(),
            ),
            (
                labels::MIGRATE_SOURCE_VOLUME_NAME.to_string(),
                "pvc-src".to_string(),
            ),
        ]);
    dst.metadata.annotations = Some(BTreeMap::from([(
        annotations::MIGRATE_ANA_STATE.to_string(),
        "optimized".to_string(),
    )]));
    let v = create_exported(&client, &dst, Duration::from_secs(30)).await;
    let t = v.spec.spdk_target.clone().unwrap();
    let port: u16 = t.svc_id.parse().unwrap();
    let v = eventually(
        "the pipe listener and the keyless host recorded",
        Duration::from_secs(20),
        || async {
            let v = vols.get("pvc-dst").await.unwrap();
            let a = v.annotations();
            (a.contains_key(annotations::MIGRATE_PIPE_SVC_ID)
                && a.get(annotations::HOSTS_WITHOUT_AUTH).map(String::as_str) == Some(HOST_B))
            .then_some(v)
        },
    )
    .await;
    let pipe_port: u16 = v.annotations()[annotations::MIGRATE_PIPE_SVC_ID]
        .parse()
        .unwrap();

    // What SPDK holds: the consumer's entry without DH-HMAC-CHAP keys, the pipe host's with.
    let hosts = host_entries(&sock, &t.subsys_nqn).await;
    println!("host entries: {hosts:?}");
    assert_eq!(
        hosts.keys().cloned().collect::<Vec<_>>(),
        {
            let mut want = vec![HOST_B.to_string(), host_src.clone()];
            want.sort();
            want
        },
        "{hosts:?}"
    );
    let b = &hosts[HOST_B];
    assert!(
        b.get("dhchap_key").is_none() && b.get("dhchap_ctrlr_key").is_none(),
        "the keyless host has keys: {b}"
    );
    let s = &hosts[&host_src];
    assert!(
        s.get("dhchap_key").and_then(Value::as_str).is_some()
            && s.get("dhchap_ctrlr_key").and_then(Value::as_str).is_some(),
        "the pipe host has no keys: {s}"
    );
    for h in hosts.values() {
        assert!(
            !h.to_string().contains("DHHC-1"),
            "SPDK shows a secret: {h}"
        );
    }

    // SPDK's initiator: the consumer connects without keys and moves data.
    let names = initiator::attach_tcp_auth(
        "kl0",
        "127.0.0.1",
        port,
        &t.subsys_nqn,
        HOST_B,
        None,
        &HostKeys::default(),
    )
    .await
    .unwrap();
    let data: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
    io::write_at(&names[0], MIB, data.clone()).await.unwrap();
    assert_eq!(io::read_at(&names[0], MIB, data.len()).await.unwrap(), data);
    initiator::detach("kl0").await.unwrap();
    // The pipe host without keys is refused, on either listener; with the volume's keys it
    // gets in.
    refused(
        "r0",
        pipe_port,
        &t.subsys_nqn,
        &host_src,
        &HostKeys::default(),
        "the pipe host without keys, pipe listener",
    )
    .await;
    refused(
        "r1",
        port,
        &t.subsys_nqn,
        &host_src,
        &HostKeys::default(),
        "the pipe host without keys, host listener",
    )
    .await;
    let keys = consumer_keys(&client, &v).await;
    common::spdk::reads_back("kp0", pipe_port, &t.subsys_nqn, &host_src, &keys, &data).await;

    // node-b rebooted into a kernel that can authenticate: only its Node changes, and its
    // entry gets the keys live.
    set_capability(&client, "node-b", "dhchap").await;
    eventually(
        "the consumer no longer listed without keys",
        Duration::from_secs(20),
        || async {
            let v = vols.get("pvc-dst").await.unwrap();
            (!v.annotations()
                .contains_key(annotations::HOSTS_WITHOUT_AUTH))
            .then_some(())
        },
    )
    .await;
    let hosts = host_entries(&sock, &t.subsys_nqn).await;
    let b = &hosts[HOST_B];
    assert!(
        b.get("dhchap_key").and_then(Value::as_str).is_some()
            && b.get("dhchap_ctrlr_key").and_then(Value::as_str).is_some(),
        "the consumer's entry did not get the keys: {b}"
    );
    refused(
        "r2",
        port,
        &t.subsys_nqn,
        HOST_B,
        &HostKeys::default(),
        "the consumer without keys once its kernel can authenticate",
    )
    .await;
    let names =
        initiator::attach_tcp_auth("kb1", "127.0.0.1", port, &t.subsys_nqn, HOST_B, None, &keys)
            .await
            .unwrap();
    assert_eq!(io::read_at(&names[0], MIB, data.len()).await.unwrap(), data);
    initiator::detach("kb1").await.unwrap();

    delete_and_release(&vols, "pvc-dst", Duration::from_secs(20)).await;
}
