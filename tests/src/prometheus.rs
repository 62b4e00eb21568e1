//! A real Prometheus server for live tests (Debian's `prometheus`): started on 127.0.0.1
//! with a configuration the test writes, queried over its HTTP API (`/api/v1/query`,
//! `/api/v1/targets`), killed when dropped. Blocking I/O: call it from a blocking task.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The binary: `$PROMETHEUS`, else `prometheus` on `PATH`.
fn binary() -> String {
    std::env::var("PROMETHEUS").unwrap_or_else(|_| "prometheus".to_string())
}

/// `prometheus --version`'s first line, or why there is no Prometheus to run (the caller
/// prints it as its skip line).
pub fn version() -> Result<String, String> {
    match Command::new(binary()).arg("--version").output() {
        Ok(o) if o.status.success() => {
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            Ok(text.lines().next().unwrap_or_default().to_string())
        }
        Ok(o) => Err(format!("prometheus --version exited with {}", o.status)),
        Err(e) => Err(format!(
            "prometheus not found ({e}); install Debian's prometheus package"
        )),
    }
}

/// A running Prometheus.
#[derive(Debug)]
pub struct Prometheus {
    /// Where its HTTP API listens (127.0.0.1).
    pub addr: SocketAddr,
    /// Its directory: `prometheus.yml`, `data/`, `prometheus.log`.
    pub dir: PathBuf,
    child: Child,
}

/// One sample of an instant vector (or a scalar, without labels).
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

impl Sample {
    /// The value of label `name`, empty when it has none.
    pub fn label(&self, name: &str) -> &str {
        self.labels.get(name).map(String::as_str).unwrap_or("")
    }
}

/// A scrape target as Prometheus sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Its job.
    pub job: String,
    /// Its `instance` (`host:port`).
    pub instance: String,
    /// `up`, `down` or `unknown`.
    pub health: String,
    /// The last scrape's error.
    pub last_error: String,
}

/// `s` percent-encoded for a query string.
pub fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `GET path` on `addr`: the status code and the body.
fn get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connect to {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)
        .map_err(|e| format!("read from {addr}: {e}"))?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("not HTTP from {addr}: {text}"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status from {addr}: {head}"))?;
    Ok((code, body.to_string()))
}

fn number(v: &Value) -> Result<f64, String> {
    match v.as_str() {
        Some("+Inf") => Ok(f64::INFINITY),
        Some("-Inf") => Ok(f64::NEG_INFINITY),
        Some("NaN") => Ok(f64::NAN),
        Some(s) => s.parse().map_err(|_| format!("value {s:?}")),
        None => Err(format!("value {v}")),
    }
}

impl Prometheus {
    /// Starts Prometheus in `dir` with `config` (the text of its `prometheus.yml`),
    /// listening on 127.0.0.1, and waits up to 30 s until it is ready.
    pub fn start(dir: &Path, config: &str) -> Result<Self, String> {
        std::fs::create_dir_all(dir.join("data")).map_err(|e| format!("{}: {e}", dir.display()))?;
        let conf = dir.join("prometheus.yml");
        std::fs::write(&conf, config).map_err(|e| format!("{}: {e}", conf.display()))?;
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("a free port: {e}"))?
            .port();
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let log = std::fs::File::create(dir.join("prometheus.log"))
            .map_err(|e| format!("prometheus.log: {e}"))?;
        let err = log.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(binary())
            .arg(format!("--config.file={}", conf.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--storage.tsdb.retention.time=1d")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .spawn()
            .map_err(|e| format!("start prometheus: {e}"))?;
        let mut me = Self {
            addr,
            dir: dir.to_path_buf(),
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = me.child.try_wait() {
                return Err(format!("prometheus exited with {status}:\n{}", me.log()));
            }
            if matches!(get(addr, "/-/ready"), Ok((200, _))) {
                return Ok(me);
            }
            if Instant::now() > deadline {
                return Err(format!("prometheus not ready within 30 s:\n{}", me.log()));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A handle on its API (cheap to copy into a blocking task).
    pub fn api(&self) -> Api {
        Api { addr: self.addr }
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The HTTP API of a [`Prometheus`].
#[derive(Debug, Clone, Copy)]
pub struct Api {
    /// Where it listens.
    pub addr: SocketAddr,
}

impl Api {
    /// The `data` of a successful answer to `GET /api/v1/<path>`, or Prometheus' error.
    fn call(&self, path: &str) -> Result<Value, String> {
        let (code, body) = get(self.addr, &format!("/api/v1/{path}"))?;
        let v: Value =
            serde_json::from_str(&body).map_err(|e| format!("HTTP {code}: {e}: {body}"))?;
        if v["status"] != "success" {
            return Err(format!(
                "HTTP {code}: {}: {}",
                v["errorType"].as_str().unwrap_or_default(),
                v["error"].as_str().unwrap_or(&body)
            ));
        }
        Ok(v["data"].clone())
    }

    /// The instant query `expr` evaluated now: its samples (a scalar is one sample without
    /// labels), or Prometheus' error (a bad expression, for one).
    pub fn query(&self, expr: &str) -> Result<Vec<Sample>, String> {
        let data = self.call(&format!("query?query={}", encode(expr)))?;
        match data["resultType"].as_str() {
            Some("vector") => data["result"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| {
                    let labels = s["metric"]
                        .as_object()
                        .into_iter()
                        .flatten()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                        .collect();
                    Ok(Sample {
                        labels,
                        value: number(&s["value"][1])?,
                    })
                })
                .collect(),
            Some("scalar") => Ok(vec![Sample {
                labels: BTreeMap::new(),
                value: number(&data["result"][1])?,
            }]),
            other => Err(format!("{expr}: result type {other:?}")),
        }
    }

    /// The active scrape targets.
    pub fn targets(&self) -> Result<Vec<Target>, String> {
        let data = self.call("targets?state=active")?;
        Ok(data["activeTargets"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| Target {
                job: t["labels"]["job"].as_str().unwrap_or_default().to_string(),
                instance: t["labels"]["instance"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                health: t["health"].as_str().unwrap_or_default().to_string(),
                last_error: t["lastError"].as_str().unwrap_or_default().to_string(),
            })
            .collect())
    }

    /// The names of the rules loaded, by group.
    pub fn rules(&self) -> Result<Vec<String>, String> {
        let data = self.call("rules")?;
        Ok(data["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().into_iter().flatten())
            .filter_map(|r| r["name"].as_str().map(str::to_string))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn encoding() {
        assert_eq!(
            encode(r#"up{job=~"a.*"} > 0"#),
            "up%7Bjob%3D~%22a.%2A%22%7D%20%3E%200"
        );
    }

    /// A Prometheus scraping itself answers queries, rejects a bad one, and is gone once
    /// dropped.
    #[test]
    fn a_prometheus_scraping_itself() {
        if let Err(why) = version() {
            println!("SKIP a_prometheus_scraping_itself: {why}");
            return;
        }
        let dir = std::env::temp_dir().join(format!("liteio-prom-self-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // A target where nothing listens: Prometheus records it down.
        let config = "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
            scrape_configs:\n- job_name: nobody\n  static_configs:\n  - targets: ['127.0.0.1:9']\n";
        let p = Prometheus::start(&dir, config).unwrap();
        let api = p.api();
        let deadline = Instant::now() + Duration::from_secs(30);
        let up = loop {
            let up = api.query(r#"up{job="nobody"}"#).unwrap();
            if !up.is_empty() || Instant::now() > deadline {
                break up;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        assert_eq!(up.len(), 1, "{up:?}");
        assert_eq!(up[0].value, 0.0);
        assert_eq!(up[0].label("instance"), "127.0.0.1:9");
        assert_eq!(api.query("1 + 1").unwrap()[0].value, 2.0);
        let t = api.targets().unwrap();
        assert_eq!(
            (t[0].job.as_str(), t[0].health.as_str()),
            ("nobody", "down")
        );
        let e = api.query("sum(").unwrap_err();
        assert!(e.contains("bad_data"), "{e}");
        let addr = p.addr;
        drop(p);
        assert!(TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
