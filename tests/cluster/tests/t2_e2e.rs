//! T2 end to end against a real kube-apiserver (`LITEIO_TEST_KUBECONFIG`): the scenario of
//! the kit's `e2e`, with LiteIO's CRDs applied to that server and a node name of its own. The
//! controller, the agent and the CSI driver are killed and restarted once; the API server
//! is not ours to restart.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use liteio_local::ApiSource;

#[test]
fn every_component_as_a_process_against_a_real_api_server() {
    let Some(kc) = std::env::var_os("LITEIO_TEST_KUBECONFIG") else {
        println!("SKIP t2 e2e: LITEIO_TEST_KUBECONFIG is not set (no real kube-apiserver)");
        return;
    };
    let tag = format!("t2-{}", std::process::id());
    liteio_cluster_tests::e2e::run_e2e(ApiSource::External(kc.into()), &format!("e2e-{tag}"), &tag);
}
