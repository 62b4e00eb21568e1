//! T1 end to end against the test API server: the scenario of `common`, with every
//! component, the API server included, killed and restarted once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use liteio_local::ApiSource;

#[test]
fn every_component_as_a_process_from_create_to_clean() {
    liteio_cluster_tests::e2e::run_e2e(ApiSource::Test, "e2e-node", "t1");
}
