//! T1: `--state-file` keeps the cluster across restarts of the test API server, including a
//! kill -9 of the binary, like kube-apiserver over etcd: objects, resourceVersions, CRDs and
//! the counter survive; watches from before the restart are told to list again.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ObjectMeta, PostParams, WatchParams};
use kube::{Api, Client, ResourceExt};
use liteio_api::{AntstorVolume, AntstorVolumeSpec};
use liteio_test_apiserver::{Options, TestApiServer};

const LIMIT: Duration = Duration::from_secs(60);

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("liteio-state-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

async fn start(file: &Path) -> TestApiServer {
    TestApiServer::start_with(Options {
        state_file: Some(file.to_path_buf()),
        ..Options::default()
    })
    .await
    .unwrap()
}

fn config_map(name: &str, v: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        data: Some([("k".to_string(), v.to_string())].into()),
        ..ConfigMap::default()
    }
}

fn volume(name: &str) -> AntstorVolume {
    AntstorVolume::new(
        name,
        AntstorVolumeSpec {
            uuid: format!("11111111-2222-4333-8444-{:012}", name.len()),
            size_byte: 1 << 30,
            ..AntstorVolumeSpec::default()
        },
    )
}

#[tokio::test]
async fn objects_and_resource_versions_survive_a_restart() {
    tokio::time::timeout(LIMIT, async {
        let dir = scratch("lib");
        let file = dir.join("state.json");
        let (cm_rv, vol_rv, vol_uid) = {
            let server = start(&file).await;
            let c = server.client().await.unwrap();
            let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
            let vols: Api<AntstorVolume> = Api::namespaced(c, "default");
            let cm = cms
                .create(&PostParams::default(), &config_map("a", "1"))
                .await
                .unwrap();
            let v = vols
                .create(&PostParams::default(), &volume("pvc-1"))
                .await
                .unwrap();
            (
                cm.resource_version().unwrap(),
                v.resource_version().unwrap(),
                v.uid().unwrap(),
            )
        };
        // The first server is gone (dropped); a new one on another port reads the file.
        let server = start(&file).await;
        let c = server.client().await.unwrap();
        let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
        let vols: Api<AntstorVolume> = Api::namespaced(c.clone(), "default");
        let cm = cms.get("a").await.unwrap();
        assert_eq!(cm.resource_version().unwrap(), cm_rv);
        assert_eq!(cm.data.unwrap()["k"], "1");
        let v = vols.get("pvc-1").await.unwrap();
        assert_eq!(
            (v.resource_version().unwrap(), v.uid().unwrap()),
            (vol_rv.clone(), vol_uid)
        );
        // Still unique, and the counter goes on from where it was.
        let err = vols
            .create(&PostParams::default(), &volume("pvc-1"))
            .await
            .unwrap_err();
        assert!(
            matches!(err, kube::Error::Api(ref s) if s.code == 409),
            "{err}"
        );
        let b = cms
            .create(&PostParams::default(), &config_map("b", "2"))
            .await
            .unwrap();
        let (old, new): (u64, u64) = (
            vol_rv.parse().unwrap(),
            b.resource_version().unwrap().parse().unwrap(),
        );
        assert!(new > old, "resourceVersion went back: {new} after {old}");
        // A watch from before the restart must list again.
        let mut w = vols
            .watch(&WatchParams::default(), &(old - 1).to_string())
            .await
            .unwrap()
            .boxed();
        let first = w.next().await.unwrap();
        assert!(
            matches!(first, Ok(kube::core::WatchEvent::Error(ref e)) if e.code == 410)
                || matches!(first, Err(kube::Error::Api(ref e)) if e.code == 410),
            "{first:?}"
        );
        drop(server);
        let _ = std::fs::remove_dir_all(dir);
    })
    .await
    .expect("timed out");
}

/// A write appends its change to `<state file>.journal` instead of rewriting the whole
/// state (which made every write cost O(objects)); updates and deletions made that way
/// survive a restart.
#[tokio::test]
async fn writes_go_to_the_journal_and_survive_a_restart() {
    tokio::time::timeout(LIMIT, async {
        let dir = scratch("journal");
        let file = dir.join("state.json");
        let journal = dir.join("state.json.journal");
        {
            let server = start(&file).await;
            let cms: Api<ConfigMap> = Api::namespaced(server.client().await.unwrap(), "default");
            let state_before = std::fs::read(&file).unwrap();
            for i in 0..20 {
                cms.create(&PostParams::default(), &config_map(&format!("c{i}"), "1"))
                    .await
                    .unwrap();
            }
            let mut c = cms.get("c1").await.unwrap();
            c.data = Some([("k".to_string(), "changed".to_string())].into());
            cms.replace("c1", &PostParams::default(), &c).await.unwrap();
            cms.delete("c2", &Default::default()).await.unwrap();
            assert_eq!(
                std::fs::read(&file).unwrap(),
                state_before,
                "the state file was rewritten for small writes"
            );
            let lines = std::fs::read_to_string(&journal).unwrap().lines().count();
            assert_eq!(lines, 22, "one journal line per write");
        }
        let server = start(&file).await;
        let cms: Api<ConfigMap> = Api::namespaced(server.client().await.unwrap(), "default");
        assert_eq!(cms.get("c1").await.unwrap().data.unwrap()["k"], "changed");
        assert!(cms.get_opt("c2").await.unwrap().is_none(), "c2 came back");
        assert!(cms.get_opt("c19").await.unwrap().is_some(), "c19 is lost");
        // Starting folds the journal into the state file.
        assert_eq!(std::fs::read(&journal).unwrap().len(), 0);
        drop(server);
        let _ = std::fs::remove_dir_all(dir);
    })
    .await
    .expect("timed out");
}

#[tokio::test]
async fn a_broken_state_file_is_refused_with_its_path() {
    tokio::time::timeout(LIMIT, async {
        let dir = scratch("bad");
        let file = dir.join("state.json");
        std::fs::write(&file, b"{\"not\": \"a state\"}").unwrap();
        let err = TestApiServer::start_with(Options {
            state_file: Some(file.clone()),
            ..Options::default()
        })
        .await
        .unwrap_err()
        .to_string();
        assert!(
            err.contains(&file.display().to_string()) && err.contains("not a state file"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(dir);
    })
    .await
    .expect("timed out");
}

fn kubeconfig_client(path: &Path) -> impl std::future::Future<Output = Client> + use<> {
    let kc = kube::config::Kubeconfig::read_from(path).unwrap();
    async move {
        let cfg =
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .unwrap();
        Client::try_from(cfg).unwrap()
    }
}

/// Start the binary with a state file and wait for its kubeconfig.
async fn spawn_binary(dir: &Path) -> tokio::process::Child {
    let kc = dir.join("kubeconfig");
    let _ = std::fs::remove_file(&kc);
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_test-apiserver"))
        .arg("--kubeconfig")
        .arg(&kc)
        .arg("--state-file")
        .arg(dir.join("state.json"))
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    while !kc.exists() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child
}

#[tokio::test]
async fn the_binary_survives_kill_9() {
    tokio::time::timeout(LIMIT, async {
        let dir = scratch("bin");
        let mut child = spawn_binary(&dir).await;
        let c = kubeconfig_client(&dir.join("kubeconfig")).await;
        let cms: Api<ConfigMap> = Api::namespaced(c, "default");
        // Wait for the server to answer, then write and kill it right after the reply.
        loop {
            match cms
                .create(&PostParams::default(), &config_map("survivor", "x"))
                .await
            {
                Ok(_) => break,
                Err(kube::Error::Api(e)) => panic!("{e:?}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        child.kill().await.unwrap();
        let mut child = spawn_binary(&dir).await;
        let c = kubeconfig_client(&dir.join("kubeconfig")).await;
        let cms: Api<ConfigMap> = Api::namespaced(c, "default");
        let got = loop {
            match cms.get("survivor").await {
                Ok(cm) => break cm,
                Err(kube::Error::Api(e)) => panic!("lost after kill -9: {e:?}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        assert_eq!(got.data.unwrap()["k"], "x");
        child.kill().await.unwrap();
        let _ = std::fs::remove_dir_all(dir);
    })
    .await
    .expect("timed out");
}
