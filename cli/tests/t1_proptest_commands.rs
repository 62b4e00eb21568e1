//! T1 property tests: `kubectl-liteio` commands with arbitrary names, namespaces and output
//! formats against the test API server (issue 16, item 5). Names and namespaces are
//! unicode, empty, very long, or hold `/`, `?`, `%` and `..`: every command returns output
//! or a `CliError` with a message, never a panic, and "not found" names the object asked
//! for. `lock`/`unlock` of a pool that does not exist makes nothing.
//!
//! Cases per property: 128, or `PROPTEST_CASES`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use clap::Parser;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, PostParams};
use liteio_api::StoragePool;
use liteio_cli::{Cli, ErrorKind, run_at};
use liteio_test_apiserver::TestApiServer;
use liteio_tests::prop::{cases, runner};
use proptest::prelude::*;

const CASES: u32 = 128;

fn nasty() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("obnvmf".to_string()),
        Just("node-1".to_string()),
        Just(String::new()),
        Just("a/b".to_string()),
        Just("..".to_string()),
        Just("x?y=z&w".to_string()),
        Just("%2F%00".to_string()),
        Just("ünïcödé-🦀".to_string()),
        Just("n".repeat(300)),
        "\\PC{0,20}",
        "[a-z0-9-]{1,12}",
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_with_arbitrary_names_answer_or_refuse() {
    tokio::time::timeout(Duration::from_secs(120), async {
        let server = TestApiServer::start().await.unwrap();
        let client = server.client().await.unwrap();
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some("obnvmf".into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        let handle = tokio::runtime::Handle::current();
        let verb = prop::sample::select(vec![
            "pools",
            "volumes",
            "snapshots",
            "describe volume",
            "describe pool",
            "lock pool",
            "unlock pool",
        ]);
        let output = prop::sample::select(vec!["table", "json", "yaml"]);
        let strategy = (verb, nasty(), nasty(), output);
        let ran = std::sync::atomic::AtomicU32::new(0);
        let result = tokio::task::block_in_place(|| {
            runner(cases(CASES)).run(&strategy, |(verb, name, namespace, output)| {
                ran.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let mut argv: Vec<String> = vec!["kubectl-liteio".into()];
                argv.extend(verb.split(' ').map(str::to_string));
                let takes_name = verb.contains(' ');
                if takes_name {
                    argv.push("--".into());
                    argv.push(name.clone());
                }
                let cli = Cli::try_parse_from(
                    argv.into_iter()
                        .chain(["--namespace".to_string(), namespace.clone()])
                        .chain(["-o".to_string(), output.to_string()]),
                );
                let Ok(cli) = cli else {
                    return Ok(());
                };
                let now = Timestamp::from_second(1_800_000_000).unwrap();
                let r = handle.block_on(run_at(&cli, &client, now));
                if let Err(e) = r {
                    let msg = e.to_string();
                    prop_assert!(!msg.is_empty());
                    if e.kind() == ErrorKind::NotFound {
                        prop_assert!(msg.contains(&name), "{msg:?} does not name {name:?}");
                    }
                }
                Ok(())
            })
        });
        println!(
            "property kubectl-liteio commands(arbitrary names): {} cases",
            ran.load(std::sync::atomic::Ordering::Relaxed)
        );
        if let Err(e) = result {
            panic!("property failed: {e}");
        }
        // lock/unlock of pools that do not exist made none.
        let pools: Api<StoragePool> = Api::namespaced(client.clone(), "obnvmf");
        assert!(
            pools
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .is_empty()
        );
    })
    .await
    .unwrap();
}
