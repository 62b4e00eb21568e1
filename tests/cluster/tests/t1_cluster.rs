//! T1 multi-node: storage nodes in network namespaces on the file engine, and what happens
//! when a node drops off the network (docs/failures.md). The scenarios are in
//! `tests/cluster/src/scenarios.rs` (T3 runs them on SPDK). Each test makes its own run (its own
//! bridge, subnet and namespaces), so they run in parallel. They need root and network
//! namespaces; elsewhere each prints one `SKIP` line.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use liteio_cluster_tests::scenarios;
use liteio_local::Engine;

#[test]
fn three_nodes_each_with_its_own_namespace_pool_and_nqn() {
    scenarios::three_nodes_each_with_its_own_namespace_pool_and_nqn(Engine::File);
}

#[test]
fn a_cut_node_goes_offline_keeps_its_volumes_and_comes_back() {
    scenarios::a_cut_node_goes_offline_keeps_its_volumes_and_comes_back(Engine::File);
}

#[test]
fn a_controller_on_a_lost_node_is_replaced_by_one_on_another_node() {
    scenarios::a_controller_on_a_lost_node_is_replaced_by_one_on_another_node(Engine::File);
}

#[test]
fn an_agent_cut_from_the_api_server_retries_and_catches_up() {
    scenarios::an_agent_cut_from_the_api_server_retries_and_catches_up(Engine::File);
}

#[test]
fn cleanup_after_a_killed_run_removes_everything() {
    scenarios::cleanup_after_a_killed_run_removes_everything(Engine::File);
}
