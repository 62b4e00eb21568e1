//! T3: the whole agent on the embedded SPDK engine, against the test API server: the
//! StoragePool reports the lvstore, a volume scheduled here becomes an lvol exported over
//! NVMe/TCP to its consuming host only, and deleting it removes export and lvol.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{
    HOST_B, MIB, NODE, consumer_pool, create_exported, delete_and_release, eventually,
    remote_volume, start_spdk_agent, with_spdk,
};
use kube::{Api, ResourceExt};
use liteio_agent::spdk::lvol;
use liteio_agent::spdk::nvmf;
use liteio_api::keys::{annotations, finalizers};
use liteio_api::{AntstorVolume, StoragePool, keys, naming};

#[test]
fn agent_on_spdk_provisions_and_exports_remote_volumes() {
    with_spdk("t3-agent", false, Duration::from_secs(60), scenario());
}

async fn scenario() {
    let (_server, client, dir) = common::test_cluster("info").await;
    let agent = start_spdk_agent(&client, dir.path()).await;

    let pools: Api<StoragePool> = Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
    let pool = eventually("the SPDK pool object", Duration::from_secs(10), || async {
        let p = pools.get_opt(NODE).await.unwrap()?;
        (p.spec.spdk_lv_store.name == "lvs0" && p.reported_free_bytes() > 0).then_some(p)
    })
    .await;
    assert!(pool.spec.spdk_lv_store.total_data_clusters > 0);
    assert!(
        pool.annotations()
            .get(annotations::TGT_VERSION)
            .is_some_and(|v| v.starts_with("v26.05"))
    );

    // The consuming host publishes its NQN on its own pool object.
    consumer_pool(&client).await;

    let uuid = "5c2d3e4f-6a7b-4c8d-9e0f-1a2b3c4d5e6f";
    let v = remote_volume("pvc-s", uuid, 10 * MIB);
    let vols: Api<AntstorVolume> = Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
    let v = create_exported(&client, &v, Duration::from_secs(10)).await;
    let l = v.spec.spdk_lvol.clone().expect("spdkLvol recorded");
    assert_eq!((l.lvs_name.as_str(), l.name.as_str()), ("lvs0", "pvc-s"));
    let t = v.spec.spdk_target.clone().unwrap();
    assert_eq!(t.subsys_nqn, naming::subsys_nqn(uuid));
    assert_eq!(t.sn, naming::serial_number(uuid));
    assert!(
        v.finalizers()
            .contains(&finalizers::LOGIC_VOLUME.to_string())
    );
    assert!(
        v.finalizers()
            .contains(&finalizers::SPDK_TARGET.to_string())
    );
    let ss = nvmf::subsystems().await.unwrap();
    let ss = ss
        .iter()
        .find(|s| s.nqn == t.subsys_nqn)
        .expect("subsystem exists");
    assert_eq!(
        ss.hosts,
        vec![HOST_B.to_string()],
        "only the consuming host"
    );
    assert_eq!(
        ss.listeners,
        vec![("127.0.0.1".to_string(), t.svc_id.parse::<u16>().unwrap())]
    );
    assert!(
        lvol::lvol("lvs0", "pvc-s")
            .await
            .unwrap()
            .is_some_and(|l| l.size_bytes >= 10 * MIB)
    );

    delete_and_release(&vols, "pvc-s", Duration::from_secs(10)).await;
    assert!(
        nvmf::subsystems()
            .await
            .unwrap()
            .iter()
            .all(|s| s.nqn != t.subsys_nqn),
        "export removed"
    );
    assert!(
        lvol::lvol("lvs0", "pvc-s").await.unwrap().is_none(),
        "lvol removed"
    );
    agent.shutdown(Duration::from_secs(5)).await;
}
