//! Tests of the deployment in `deploy/`; the tests are this crate's `tests/`:
//! - `t0_manifests`: every document parsed strictly, the components' configs through their
//!   own parsers, images, workload shape, scrape annotations and monitors, RBAC coverage;
//! - `t0_alert_rules`: the alert rules against the metrics the components register, with
//!   promtool's rule tests;
//! - `t2_manifests_apply`, `t2_rbac`: dry-run applies and access reviews against a real
//!   kube-apiserver (`LITEIO_TEST_KUBECONFIG`).
#![forbid(unsafe_code)]
