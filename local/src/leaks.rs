//! Looking for secrets where they must not be: after an end-to-end run, every log file of the
//! run, the events and LiteIO objects as the API shows them, and the metrics of the
//! controller and the agent. The tests of issue 16 use it with the keys kubelet handed the
//! consumer; any copy of a key carries its base64 part, which is what is looked for.

use std::net::SocketAddr;
use std::path::Path;

use k8s_openapi::api::core::v1::Event;
use kube::{Api, Client};
use liteio_api::{AntstorSnapshot, AntstorVolume, StoragePool, keys};

use crate::{Local, LocalError};

fn err(e: impl std::fmt::Display) -> LocalError {
    LocalError::Config(e.to_string())
}

/// `GET http://addr/path` (HTTP/1.0, no keep-alive): status line, headers and body.
pub async fn http_get(addr: SocketAddr, path: &str) -> Result<String, LocalError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| err(format!("connect {addr}: {e}")))?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .map_err(err)?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.map_err(err)?;
    Ok(out)
}

/// The part of a `DHHC-1:tt:<base64>:` secret or `NVMeTLSkey-1:hh:<base64>:` PSK that every
/// copy of it carries.
fn body(key: &str) -> Option<&str> {
    key.split(':').nth(2).filter(|b| b.len() >= 40)
}

/// Every `*.log` file under `dir`, with its text.
fn logs(dir: &Path) -> Result<Vec<(String, String)>, LocalError> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).map_err(err)? {
            let p = entry.map_err(err)?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "log") {
                let text = String::from_utf8_lossy(&std::fs::read(&p).map_err(err)?).into_owned();
                out.push((p.display().to_string(), text));
            }
        }
    }
    Ok(out)
}

/// Fails naming the place where one of `keys` shows: a log file under `local.dir`, the
/// events, volumes, snapshots or pools of LiteIO's namespace, or the controller's or the
/// agent's `/metrics` (when it serves them). The API server's state file holds the Secrets
/// themselves (it is the etcd of the run) and is not looked at. Returns how many places were
/// searched.
pub async fn no_key_in_sight(
    local: &Local,
    client: &Client,
    keys: &[String],
) -> Result<usize, LocalError> {
    if keys.is_empty() {
        return Err(err("no key to look for"));
    }
    let needles: Vec<&str> = keys
        .iter()
        .map(|k| body(k).ok_or_else(|| err("a key without a base64 part")))
        .collect::<Result<_, _>>()?;
    let mut places = logs(&local.dir)?;
    if places.len() < 3 {
        return Err(err(format!(
            "only {} log files under {}",
            places.len(),
            local.dir.display()
        )));
    }
    let ns = keys::DEFAULT_NAMESPACE;
    let lp = Default::default();
    let json = |v: serde_json::Result<String>| v.map_err(err);
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    let vols: Api<AntstorVolume> = Api::namespaced(client.clone(), ns);
    let snaps: Api<AntstorSnapshot> = Api::namespaced(client.clone(), ns);
    let pools: Api<StoragePool> = Api::namespaced(client.clone(), ns);
    places.push((
        "events".into(),
        json(serde_json::to_string(
            &events.list(&lp).await.map_err(err)?.items,
        ))?,
    ));
    places.push((
        "volumes".into(),
        json(serde_json::to_string(
            &vols.list(&lp).await.map_err(err)?.items,
        ))?,
    ));
    places.push((
        "snapshots".into(),
        json(serde_json::to_string(
            &snaps.list(&lp).await.map_err(err)?.items,
        ))?,
    ));
    places.push((
        "pools".into(),
        json(serde_json::to_string(
            &pools.list(&lp).await.map_err(err)?.items,
        ))?,
    ));
    let ctl = SocketAddr::from(([127, 0, 0, 1], local.controller_port));
    places.push((
        "controller metrics".into(),
        http_get(ctl, "/metrics").await?,
    ));
    if let Some(agent) = local.agent_metrics {
        let text = http_get(agent, "/metrics").await?;
        if !text.contains("liteio_") {
            return Err(err(format!(
                "the agent's /metrics has no LiteIO series: {text}"
            )));
        }
        places.push(("agent metrics".into(), text));
    }
    for (place, text) in &places {
        if needles.iter().any(|n| text.contains(n)) {
            return Err(err(format!("a volume key shows in {place}")));
        }
    }
    Ok(places.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_base64_part_of_a_key_is_what_is_looked_for() {
        let k = "DHHC-1:00:MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWYwMTIzNDU2Nzg5:";
        assert_eq!(
            body(k),
            Some("MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWYwMTIzNDU2Nzg5")
        );
        assert_eq!(body("DHHC-1:00:short:"), None);
        assert_eq!(body("no colons"), None);
    }
}
