//! T1: every conformance case against the in-process test API server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::time::Duration;

use liteio_test_apiserver::TestApiServer;
use liteio_test_apiserver::conformance::{self, CaseResult, Env, Outcome};

async fn run<F, Fut>(case: &str, f: F)
where
    F: FnOnce(Env) -> Fut,
    Fut: Future<Output = CaseResult>,
{
    let outcome = tokio::time::timeout(Duration::from_secs(60), async {
        let server = TestApiServer::start().await.expect("start test server");
        let env = conformance::test_server_env(&server, case)
            .await
            .expect("test environment");
        let r = f(env.clone()).await;
        conformance::cleanup(&env).await;
        server.shutdown().await;
        r
    })
    .await
    .unwrap_or_else(|_| panic!("{case}: timed out after 60s"));
    match outcome {
        Ok(Outcome::Passed) => {}
        Ok(Outcome::Skipped(why)) => panic!("{case} skipped on the test server: {why}"),
        Err(e) => panic!("{case} failed: {e}"),
    }
}

macro_rules! cases {
    ($($name:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $name() {
                run(stringify!($name), conformance::$name).await;
            }
        )*

        #[test]
        fn every_case_is_listed() {
            let here = [$(stringify!($name)),*];
            assert_eq!(here.as_slice(), conformance::CASES);
        }
    };
}

cases!(
    crud_antstorvolume,
    crud_lease,
    generate_name,
    label_selectors,
    field_selectors,
    bad_selectors,
    watch_event_order,
    watch_resume,
    watch_expired_gone,
    watcher_recovers,
    stale_update_conflict,
    lease_two_writers,
    finalizer_deletion,
    status_subresource,
    merge_patch,
    json_patch,
    server_side_apply,
    invalid_objects,
    request_details,
    malformed_json,
    unknown_resource,
    patch_media_and_names,
    list_paging,
    fault_fail_next,
    fault_delay,
    fault_drop_watch,
);
