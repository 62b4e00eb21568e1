//! T1: kubectl against the test API server (`get`, `apply`, `get -w`, `patch`, `delete`),
//! only when `kubectl` is on PATH.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use liteio_test_apiserver::TestApiServer;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const STEP: Duration = Duration::from_secs(30);

fn kubectl_on_path() -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("kubectl").is_file()))
}

async fn kubectl(kubeconfig: &Path, args: &[&str]) -> (bool, String) {
    let out = tokio::time::timeout(
        STEP,
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("kubectl {args:?} timed out"))
    .expect("run kubectl");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("liteio-kubectl-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const VOLUME: &str = r#"apiVersion: volume.antstor.alipay.com/v1
kind: AntstorVolume
metadata:
  name: vol-kubectl
  namespace: default
spec:
  uuid: 0b6f7a8e-0000-4000-8000-000000000001
  sizeByte: 1073741824
  positionAdvice: PreferLocal
"#;

#[tokio::test]
async fn kubectl_get_apply_watch_delete() {
    if !kubectl_on_path() {
        println!("T1 kubectl skipped: kubectl not on PATH");
        return;
    }
    let server = TestApiServer::start().await.unwrap();
    let dir = scratch("basic");
    let kc = dir.join("kubeconfig");
    server.write_kubeconfig(&kc).unwrap();
    let manifest = dir.join("volume.yaml");
    std::fs::write(&manifest, VOLUME).unwrap();

    let (ok, out) = kubectl(&kc, &["get", "storagepools"]).await;
    assert!(ok, "get storagepools: {out}");
    assert!(out.contains("No resources found"), "{out}");

    // The watch runs while the volume is applied, patched and deleted.
    let mut watch = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kc)
        .args(["get", "antstorvolumes", "-w", "--output-watch-events"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();

    let (ok, out) = kubectl(&kc, &["apply", "-f", manifest.to_str().unwrap()]).await;
    assert!(ok && out.contains("created"), "apply: {out}");
    let (ok, out) = kubectl(&kc, &["apply", "-f", manifest.to_str().unwrap()]).await;
    assert!(ok && out.contains("unchanged"), "second apply: {out}");
    let (ok, out) = kubectl(&kc, &["get", "av", "vol-kubectl", "-o", "wide"]).await;
    assert!(ok && out.contains("PreferLocal"), "get -o wide: {out}");
    let (ok, out) = kubectl(
        &kc,
        &[
            "patch",
            "av",
            "vol-kubectl",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"targetNodeId":"node-1"}}"#,
        ],
    )
    .await;
    assert!(ok && out.contains("patched"), "patch: {out}");
    let (ok, out) = kubectl(
        &kc,
        &[
            "patch",
            "av",
            "vol-kubectl",
            "--subresource",
            "status",
            "--type",
            "merge",
            "-p",
            r#"{"status":{"status":"ready"}}"#,
        ],
    )
    .await;
    assert!(ok && out.contains("patched"), "status patch: {out}");
    let (ok, out) = kubectl(&kc, &["delete", "-f", manifest.to_str().unwrap()]).await;
    assert!(ok && out.contains("deleted"), "delete: {out}");

    let mut seen = Vec::new();
    let got_delete = tokio::time::timeout(STEP, async {
        while let Ok(Some(line)) = lines.next_line().await {
            let done = line.starts_with("DELETED");
            seen.push(line);
            if done {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    assert!(got_delete, "kubectl get -w output: {seen:#?}");
    assert!(
        seen.iter()
            .any(|l| l.starts_with("ADDED") && l.contains("vol-kubectl")),
        "{seen:#?}"
    );
    assert!(
        seen.iter()
            .any(|l| l.starts_with("MODIFIED") && l.contains("ready")),
        "{seen:#?}"
    );
    let _ = watch.kill().await;

    let (ok, out) = kubectl(&kc, &["get", "av", "vol-kubectl"]).await;
    assert!(!ok && out.contains("NotFound"), "get after delete: {out}");
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn kubectl_apply_invalid_volume_names_the_field() {
    if !kubectl_on_path() {
        println!("T1 kubectl skipped: kubectl not on PATH");
        return;
    }
    let server = TestApiServer::start().await.unwrap();
    let dir = scratch("invalid");
    let kc = dir.join("kubeconfig");
    server.write_kubeconfig(&kc).unwrap();
    let manifest = dir.join("bad.yaml");
    std::fs::write(&manifest, VOLUME.replace("PreferLocal", "Nowhere")).unwrap();
    let (ok, out) = kubectl(&kc, &["apply", "-f", manifest.to_str().unwrap()]).await;
    assert!(!ok, "apply of an invalid volume succeeded: {out}");
    assert!(
        out.contains("spec.positionAdvice: Unsupported value: \"Nowhere\""),
        "{out}"
    );
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
