//! T2: the conformance cases against a real kube-apiserver, reached through the kubeconfig
//! named by `LITEIO_TEST_KUBECONFIG`. Without it every test prints one skip line and returns.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::time::Duration;

use liteio_test_apiserver::conformance::{self, CaseResult, Env, Outcome};

const VAR: &str = "LITEIO_TEST_KUBECONFIG";

async fn run<F, Fut>(case: &str, f: F)
where
    F: FnOnce(Env) -> Fut,
    Fut: Future<Output = CaseResult>,
{
    let Ok(path) = std::env::var(VAR) else {
        println!("T2 skipped: {VAR} not set");
        return;
    };
    let outcome = tokio::time::timeout(Duration::from_secs(120), async {
        let env = conformance::real_env(&path, case)
            .await
            .unwrap_or_else(|e| panic!("{case}: cannot prepare {path}: {e}"));
        let r = f(env.clone()).await;
        conformance::cleanup(&env).await;
        r
    })
    .await
    .unwrap_or_else(|_| panic!("{case}: timed out after 120s"));
    match outcome {
        Ok(Outcome::Passed) => {}
        Ok(Outcome::Skipped(why)) => println!("T2 {case} skipped: {why}"),
        Err(e) => panic!("{case} failed against the real kube-apiserver: {e}"),
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
    };
}

liteio_test_apiserver::with_conformance_cases!(cases);
