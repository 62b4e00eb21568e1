//! T1: the agent registers its StoragePool (spec, status, labels, annotations) within 2 s
//! and serves metrics and health.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use kube::{Api, ResourceExt};
use liteio_api::keys::{self, annotations, labels};
use liteio_api::pool::{ConditionStatus, PoolConditionType, PoolStatus};
use liteio_api::{StoragePool, naming, size};

/// Label `key` of `pool` (which has labels).
fn label<'a>(pool: &'a StoragePool, key: &str) -> Option<&'a str> {
    pool.metadata
        .labels
        .as_ref()
        .unwrap()
        .get(key)
        .map(String::as_str)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_object_is_registered_within_two_seconds() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let env = Env::new().await;
        let agent = env.start_agent().await;
        let pools: Api<StoragePool> = ns_api(&env.client);
        let pool = eventually(
            "a StoragePool with status",
            Duration::from_secs(2),
            || async {
                pools
                    .get_opt(NODE)
                    .await
                    .unwrap()
                    .filter(|p| p.status.as_ref().is_some_and(|s| !s.conditions.is_empty()))
            },
        )
        .await;
        // Spec: the file engine is a kernelLvm pool.
        let lvm = &pool.spec.kernel_lvm;
        assert_eq!(lvm.name, "dev-pool");
        assert!(!lvm.vg_uuid.is_empty());
        assert_eq!(lvm.bytes, agent.pool().total_bytes);
        assert_eq!(lvm.extend_size, 4 * MIB);
        assert!(pool.spec.spdk_lv_store.name.is_empty());
        assert_eq!(pool.spec.addresses.len(), 1);
        assert_eq!(pool.spec.addresses[0].type_, "InternalIP");
        assert_eq!(pool.spec.addresses[0].address, NODE_IP);
        assert_eq!(pool.spec.node_info.id, NODE);
        assert_eq!(
            pool.spec.node_info.ip, NODE_IP,
            "ipLabelKey label wins over InternalIP"
        );
        assert_eq!(pool.spec.node_info.hostname, "host-1");
        assert_eq!(
            pool.spec
                .node_info
                .labels
                .get(labels::NODE_RACK)
                .map(String::as_str),
            Some("rack-7")
        );
        // Metadata.
        assert_eq!(label(&pool, labels::NODE_SN), Some(NODE));
        let nqn = naming::host_nqn(NODE);
        assert_eq!(pool.host_nqn(), Some(nqn.as_str()));
        assert_eq!(
            std::fs::read_to_string(env.dir.path().join("hostnqn"))
                .unwrap()
                .trim(),
            nqn
        );
        assert!(
            !pool
                .metadata
                .annotations
                .as_ref()
                .unwrap()
                .contains_key(annotations::TGT_VERSION),
            "no target, no tgt-version"
        );
        assert_eq!(
            pool.annotations()
                .get(annotations::POOLING_MODE)
                .map(String::as_str),
            Some("File"),
            "the pool says what it is, although its spec reads like KernelLVM"
        );
        // Status.
        let st = pool.status.as_ref().unwrap();
        assert_eq!(st.status, Some(PoolStatus::Ready));
        assert_eq!(
            st.capacity.get(keys::RESOURCE_STORAGE),
            Some(&size::quantity(agent.pool().total_bytes))
        );
        assert!(st.vg_free_size.is_some());
        let cond = |t| st.conditions.iter().find(|c| c.type_ == t).unwrap().status;
        assert_eq!(cond(PoolConditionType::Spdk), ConditionStatus::Error);
        assert_eq!(cond(PoolConditionType::Lvm), ConditionStatus::Ok);
        assert_eq!(cond(PoolConditionType::KubeNode), ConditionStatus::Ok);
        // Metrics and health.
        let addr = agent.metrics_addr().unwrap();
        let (status, body) = http_get(addr, "/metrics").await;
        assert!(status.contains("200"), "{status}");
        assert!(
            body.contains("liteio_pool_capacity_bytes{node=\"node-1\"}"),
            "{body}"
        );
        assert!(http_get(addr, "/healthz").await.0.contains("200"));
        // Ready once the agent has handled the answer to its pool write, which may come just
        // after the pool shows in the API.
        eventually("/readyz 200", Duration::from_secs(2), || async {
            http_get(addr, "/readyz")
                .await
                .0
                .contains("200")
                .then_some(())
        })
        .await;
        assert!(http_get(addr, "/nope").await.0.contains("404"));
        agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn existing_host_nqn_and_foreign_labels_are_kept() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let env = Env::new().await;
        std::fs::write(
            env.dir.path().join("hostnqn"),
            "nqn.2014-08.org.nvmexpress:uuid:abc\n",
        )
        .unwrap();
        let agent = env.start_agent().await;
        let pools: Api<StoragePool> = ns_api(&env.client);
        eventually("pool", Duration::from_secs(2), || async {
            pools.get_opt(NODE).await.unwrap()
        })
        .await;
        // A user locks the pool by label; a restart must keep it.
        let patch =
            serde_json::json!({"metadata": {"labels": {labels::POOL_SCHEDULING_STATUS: "locked"}}});
        pools
            .patch(
                NODE,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .unwrap();
        agent.shutdown(Duration::from_secs(5)).await;
        let agent = env.start_agent().await;
        let p = eventually("re-registered pool", Duration::from_secs(2), || async {
            let p = pools.get_opt(NODE).await.unwrap()?;
            (p.host_nqn() == Some("nqn.2014-08.org.nvmexpress:uuid:abc")).then_some(p)
        })
        .await;
        assert_eq!(label(&p, labels::POOL_SCHEDULING_STATUS), Some("locked"));
        agent.shutdown(Duration::from_secs(5)).await;
    })
    .await
    .unwrap();
}
