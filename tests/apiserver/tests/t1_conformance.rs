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

liteio_test_apiserver::with_conformance_cases!(cases);
