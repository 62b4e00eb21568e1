//! T3: a real Prometheus (Debian's `prometheus`, on 127.0.0.1) scrapes every component of a
//! three-node cluster on the SPDK engine (the disk-agents and CSI node plugins in their
//! nodes' namespaces, the controller and the CSI controller in the root one) every second,
//! with LiteIO's alerting rules (deploy/prometheus/liteio-rules.yaml) loaded as shipped,
//! and the test asserts over its HTTP API what operators rely on:
//!
//! - a volume's I/O counters grow while `nvmf-check` (SPDK's initiator, in the consumer's
//!   namespace) runs random reads and writes on it, and `kubectl liteio top --once` shows it
//!   with non-zero IOPS and each pool with the free space of its StoragePool;
//! - each pool's free bytes and capacity equal its StoragePool's status;
//! - every query of the Grafana dashboard (deploy/grafana/liteio-dashboard.json, variables
//!   at "All") returns data: a finite value. The test makes what they show happen: random
//!   I/O, a second provision on a node (the histograms count growth, not a first value), two
//!   NodeStageVolume calls the CSI node refuses for want of authentication (keys of another
//!   volume; this kernel cannot do DH-HMAC-CHAP, so the refusal is host_cannot_authenticate,
//!   keys_rejected on one that can), a migration (its gauges while under way, its durations
//!   once finished) and a pool going offline (the alerts panel);
//! - LiteIOPoolOffline fires once node 2's link is cut, not before its `for:` has passed and
//!   within the controller's offline detection plus `for:`, and clears once the link is back.
//!
//! Why T3 and not T1 on the file engine: the reactor panels read SPDK's thread and reactor
//! times and migrations move SPDK lvols; only the SPDK engine makes every panel real.
//! Needs root and network namespaces; elsewhere, or without Prometheus, one SKIP line.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use kube::ResourceExt;
use liteio_api::migration::{MigrationPhase, ResultStatus};
use liteio_api::{StoragePool, VolumeMigration};
use liteio_cluster_tests::*;
use liteio_csi::csi::NodeStageVolumeRequest;
use liteio_local::Engine;
use liteio_local::cluster::{AGENT_METRICS_PORT, Cluster, ClusterOptions, Liveness, Role};
use liteio_local::datapath::{self, HostNqn};
use liteio_local::demo::mount_capability;
use liteio_tests::dashboard::{self, Query, Variable};
use liteio_tests::prometheus::{Api as PromApi, Prometheus, Sample};
use serde_json::Value;

const CONSUMER: usize = 2;
/// The node whose link is cut (it stores nothing: the volumes are on 1 and 3).
const CUT: usize = 2;
const ALERT: &str = "LiteIOPoolOffline";
/// The storage node whose reactors poll: the migration's source.
const POLLING: usize = 1;
/// The other storage node: the migration's destination.
const OTHER: usize = 3;

fn liveness() -> Liveness {
    Liveness {
        unknown_after: Duration::from_secs(5),
        offline_after: Duration::from_secs(10),
        tick: Duration::from_millis(500),
    }
}

/// Three nodes; 1 and 3 store, 2 consumes. Node 1's reactors poll, as production nodes do:
/// the migration's source needs SPDK's initiator, which polls, and SPDK's own busy/idle
/// accounting moves only when polling; the others run in interrupt mode (a polling reactor
/// takes a whole core). Pool liveness in seconds, so that an offline pool is seen within
/// the test.
fn cluster_options() -> ClusterOptions {
    let mut o = ClusterOptions::new(3, Engine::Spdk);
    o.pool_bytes = 3 << 30;
    o.spdk_polling = vec![POLLING];
    o.liveness = Some(liveness());
    o.heartbeat = Some((Duration::from_secs(1), Duration::from_secs(5)));
    o
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A `for:` value (`90s`, `1m`, `2h`).
fn duration(s: &str) -> Result<Duration, String> {
    let (n, unit) = s.split_at(s.len().saturating_sub(1));
    let n: u64 = n.parse().map_err(|_| format!("for: {s:?}"))?;
    match unit {
        "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        "h" => Ok(Duration::from_secs(n * 3600)),
        _ => Err(format!("for: {s:?}")),
    }
}

/// The rules file Prometheus loads, `for:` of [`ALERT`] in it and the names of its alerts:
/// the shipped file when that `for:` is at most a minute; otherwise a copy in `dir` whose
/// [`ALERT`] waits one minute (derived from the shipped rule, said on stdout), so the test
/// ends in time.
fn rules_file(dir: &Path) -> Result<(PathBuf, Duration, Vec<String>), String> {
    let shipped = repo().join("deploy/prometheus/liteio-rules.yaml");
    let text = std::fs::read_to_string(&shipped).map_err(err("read the rules"))?;
    let mut rules: serde_yaml::Value = serde_yaml::from_str(&text).map_err(err("rules"))?;
    let mut names: Vec<String> = rules["groups"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_sequence().into_iter().flatten())
        .filter_map(|r| r["alert"].as_str().map(str::to_string))
        .collect();
    names.sort();
    let rule = rules["groups"]
        .as_sequence_mut()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_sequence_mut().into_iter().flatten())
        .find(|r| r["alert"].as_str() == Some(ALERT))
        .ok_or_else(|| format!("no {ALERT} in {}", shipped.display()))?;
    let shipped_for = duration(rule["for"].as_str().ok_or("no for:")?)?;
    let limit = Duration::from_secs(60);
    if shipped_for <= limit {
        println!("{ALERT} as shipped: for {shipped_for:?}");
        return Ok((shipped, shipped_for, names));
    }
    rule["for"] = serde_yaml::Value::from("1m");
    let copy = dir.join("liteio-rules.yaml");
    std::fs::create_dir_all(dir).map_err(err("mkdir"))?;
    std::fs::write(&copy, serde_yaml::to_string(&rules).map_err(err("yaml"))?)
        .map_err(err("write the rules"))?;
    println!("{ALERT} ships with for {shipped_for:?}; this test loads a copy with for 1m");
    Ok((copy, limit, names))
}

/// Prometheus' configuration: every component of `c` every second, under the job names
/// the monitors of deploy/overlays/monitoring give them, with `rules` loaded.
fn prometheus_config(c: &Cluster, rules: &Path) -> Result<String, String> {
    let list = |addrs: Vec<String>| {
        addrs
            .iter()
            .map(|a| format!("'{a}'"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut agents = Vec::new();
    let mut csi_nodes = Vec::new();
    for k in 1..=c.opts.nodes {
        agents.push(c.agent_metrics_addr(k).map_err(err("addr"))?.to_string());
        csi_nodes.push(c.csi_node_metrics_addr(k).map_err(err("addr"))?.to_string());
    }
    let controller = c.controller_addr(0).map_err(err("addr"))?.to_string();
    Ok(format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n- '{}'\n\
         scrape_configs:\n\
         - job_name: liteio-disk-agent\n  static_configs:\n  - targets: [{}]\n\
         - job_name: node-disk-controller\n  static_configs:\n  - targets: ['{controller}']\n\
         - job_name: liteio-csi-node\n  static_configs:\n  - targets: [{}]\n\
         - job_name: liteio-csi-controller\n  static_configs:\n  - targets: ['{}']\n",
        rules.display(),
        list(agents),
        list(csi_nodes),
        c.csi_controller_metrics_addr()
    ))
}

async fn query(api: PromApi, expr: &str) -> Result<Vec<Sample>, String> {
    let e = expr.to_string();
    tokio::task::spawn_blocking(move || api.query(&e))
        .await
        .map_err(err("query task"))?
        .map_err(|m| format!("{expr}: {m}"))
}

/// The one value of `expr` (a vector of one sample or a scalar), `None` without data.
async fn value(api: PromApi, expr: &str) -> Result<Option<f64>, String> {
    let r = query(api, expr).await?;
    match r.as_slice() {
        [] => Ok(None),
        [s] => Ok(Some(s.value)),
        many => Err(format!("{expr}: {} samples: {many:?}", many.len())),
    }
}

/// Polls `check` until it returns `Some` (within `secs`); the error names `what` and the
/// last thing seen.
async fn poll<T, F, Fut>(what: &str, secs: u64, mut check: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>, String>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut last = String::new();
    loop {
        match check().await {
            Ok(Some(t)) => return Ok(t),
            Ok(None) => {}
            Err(e) => last = e,
        }
        if Instant::now() > deadline {
            return Err(format!("{what}: not within {secs} s {last}"));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The dashboard's queries and what each returned once it had data.
struct Panels {
    api: PromApi,
    queries: Vec<(Query, String)>,
    /// Index into `queries` → (stage, samples).
    seen: BTreeMap<usize, (String, Vec<Sample>)>,
}

impl Panels {
    fn load(api: PromApi) -> Result<Self, String> {
        let d = dashboard::load()?;
        let vars: Vec<Variable> = dashboard::variables(&d);
        let queries = dashboard::queries(&d)?
            .into_iter()
            .map(|q| {
                let e = dashboard::resolve(&q.expr, &vars)?;
                Ok((q, e))
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Self {
            api,
            queries,
            seen: BTreeMap::new(),
        })
    }

    /// Evaluates every query without data yet; keeps those that return a finite value.
    /// A query Prometheus rejects is an error.
    async fn evaluate(&mut self, stage: &str) -> Result<(), String> {
        for (i, (q, e)) in self.queries.iter().enumerate() {
            if self.seen.contains_key(&i) {
                continue;
            }
            let r = query(self.api, e)
                .await
                .map_err(|m| format!("{}: {m}", q.name()))?;
            if r.iter().any(|s| s.value.is_finite()) {
                self.seen.insert(i, (stage.to_string(), r));
            }
        }
        Ok(())
    }

    /// Polls until every query `want` picks has returned data, within `secs`.
    async fn wait(
        &mut self,
        stage: &str,
        secs: u64,
        want: impl Fn(&Query) -> bool,
    ) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            self.evaluate(stage).await?;
            let missing: Vec<String> = self
                .queries
                .iter()
                .enumerate()
                .filter(|(i, (q, _))| want(q) && !self.seen.contains_key(i))
                .map(|(_, (q, e))| format!("{}: {e}", q.name()))
                .collect();
            if missing.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                // What they and the series they read return now.
                let mut seen = Vec::new();
                for (q, e) in self.queries.iter().filter(|(q, _)| want(q)) {
                    if !missing.iter().any(|m| m.starts_with(&q.name())) {
                        continue;
                    }
                    seen.push(format!("{}: {:?}", q.name(), query(self.api, e).await));
                    for m in dashboard::metrics_in(&q.expr) {
                        let r = query(self.api, &m).await.map(|r| {
                            r.into_iter()
                                .take(6)
                                .map(|s| format!("{:?} {}", s.labels, s.value))
                                .collect::<Vec<_>>()
                        });
                        seen.push(format!("  {m}: {r:?}"));
                    }
                }
                return Err(format!(
                    "{stage}: no data within {secs} s from\n  {}\nnow:\n{}",
                    missing.join("\n  "),
                    seen.join("\n")
                ));
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// One line per query: the panel, the stage it first had data at and a sample.
    fn report(&self) -> String {
        let mut out = String::new();
        for (i, (q, e)) in self.queries.iter().enumerate() {
            let what = match self.seen.get(&i) {
                Some((stage, r)) => {
                    let s = r.iter().find(|s| s.value.is_finite()).unwrap_or(&r[0]);
                    let labels: Vec<String> = s
                        .labels
                        .iter()
                        .filter(|(k, _)| *k != "__name__")
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect();
                    format!(
                        "data at {stage}: {} series, e.g. {{{}}} = {:.4}",
                        r.len(),
                        labels.join(","),
                        s.value
                    )
                }
                None => "NO DATA".to_string(),
            };
            out.push_str(&format!("  {} | {e} | {what}\n", q.name()));
        }
        out
    }
}

fn migrating(q: &Query) -> bool {
    [
        "liteio_controller_migration_copied_bytes",
        "liteio_controller_migration_volume_size_bytes",
        "liteio_controller_migration_last_progress",
        "liteio_controller_migrations",
    ]
    .iter()
    .any(|m| q.expr.contains(m))
}

fn migrated(q: &Query) -> bool {
    q.expr
        .contains("liteio_controller_migration_duration_seconds")
        || q.expr
            .contains("liteio_controller_migration_switch_duration_seconds")
}

fn refusals(q: &Query) -> bool {
    q.expr.contains("liteio_auth_refusals_total")
}

fn alerts(q: &Query) -> bool {
    q.expr.contains("ALERTS")
}

fn at_io(q: &Query) -> bool {
    !(migrating(q) || migrated(q) || refusals(q) || alerts(q))
}

/// `kill <sig> <pid>`.
async fn signal(pid: u32, sig: &str) -> Result<(), String> {
    let st = tokio::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .await
        .map_err(err("kill"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("kill {sig} {pid}: {st}"))
    }
}

async fn ready(c: &Cluster, name: &str) -> Result<(), String> {
    eventually(c, &format!("{name} ready"), 180, Role::Agent(1), || async {
        volume(c, name).await.is_some_and(|v| is_ready(&v))
    })
    .await
}

#[test]
fn prometheus_scrapes_the_cluster_every_dashboard_query_has_data_and_the_offline_alert_fires() {
    if skip("prometheus") {
        return;
    }
    match liteio_tests::prometheus::version() {
        Ok(v) => println!("{v}"),
        Err(why) => {
            println!("SKIP prometheus: {why}");
            return;
        }
    }
    let dir = scratch("t3-prom");
    with_cluster(&dir, cluster_options(), Duration::from_secs(900), |c| {
        Box::pin(async move { scenario(c).await })
    });
}

async fn scenario(c: &Cluster) -> Result<(), String> {
    // --- Prometheus -------------------------------------------------------------------
    let prom_dir = c.dir.join("prometheus");
    let (rules, alert_for, rule_names) = rules_file(&prom_dir)?;
    let config = prometheus_config(c, &rules)?;
    println!("prometheus.yml:\n{config}");
    let pd = prom_dir.clone();
    let prom = tokio::task::spawn_blocking(move || Prometheus::start(&pd, &config))
        .await
        .map_err(err("start task"))??;
    let api = prom.api();
    println!("Prometheus on {}", prom.addr);
    // On failure the cluster's log tails include prometheus/prometheus.log.
    let result = run(c, api, alert_for, &rule_names).await;
    drop(prom);
    result
}

async fn run(
    c: &Cluster,
    api: PromApi,
    alert_for: Duration,
    rule_names: &[String],
) -> Result<(), String> {
    let t0 = Instant::now();
    // Every component scraped, every rule loaded.
    let want_targets = 2 * c.opts.nodes + 2;
    let targets = poll("every target up", 60, || async move {
        let t = tokio::task::spawn_blocking(move || api.targets())
            .await
            .map_err(err("targets task"))??;
        let up = t.iter().filter(|t| t.health == "up").count();
        if up == want_targets && t.len() == want_targets {
            Ok(Some(t))
        } else {
            Err(format!("{t:?}"))
        }
    })
    .await?;
    for t in &targets {
        println!("target {} {} {}", t.job, t.instance, t.health);
    }
    let mut loaded = tokio::task::spawn_blocking(move || api.rules())
        .await
        .map_err(err("rules task"))??;
    loaded.sort();
    println!("rules loaded: {loaded:?}");
    if loaded != rule_names || !loaded.iter().any(|r| r == ALERT) {
        return Err(format!(
            "Prometheus loaded {loaded:?}, the file has {rule_names:?}"
        ));
    }
    let mut panels = Panels::load(api)?;

    // --- I/O on a volume ----------------------------------------------------------------
    let params = HashMap::from([("positionAdvice".to_string(), "MustRemote".to_string())]);
    let io_id = create_volume_with(c, "pvc-io", Some(c.node_name(CONSUMER)), params.clone())
        .await
        .map_err(err("join"))??;
    ready(c, "pvc-io").await?;
    let a = node_of(c, "pvc-io").await?;
    // A second volume on the same node once Prometheus saw the first's provisioning and
    // scheduling: their histograms then grow in Prometheus' eyes (a series' first value is
    // no growth, and both could land between two scrapes).
    let first = [
        format!(
            r#"sum(liteio_provision_seconds_count{{node="{}",step="total"}})"#,
            c.node_name(a)
        ),
        "sum(liteio_controller_schedule_duration_seconds_count)".to_string(),
    ];
    for q in &first {
        poll(&format!("{q} in Prometheus"), 30, || async move {
            Ok(value(api, q).await?.filter(|v| *v >= 1.0))
        })
        .await?;
    }
    create_volume(c, "pvc-second", Some(c.node_name(a)))
        .await
        .map_err(err("join"))??;
    ready(c, "pvc-second").await?;
    let io_sel = format!(r#"{{volume="pvc-io",node="{}"}}"#, c.node_name(a));
    let counters = |api: PromApi, sel: String| async move {
        let r = value(
            api,
            &format!("sum(liteio_volume_reads_completed_total{sel})"),
        )
        .await?;
        let w = value(
            api,
            &format!("sum(liteio_volume_writes_completed_total{sel})"),
        )
        .await?;
        Ok::<_, String>(r.zip(w))
    };
    let (r0, w0) = poll("pvc-io's I/O counters in Prometheus", 60, || {
        counters(api, io_sel.clone())
    })
    .await?;
    let client = c.kube().await.map_err(err("kube"))?;
    let v = volume(c, "pvc-io").await.ok_or("pvc-io gone")?;
    let t = v.spec.spdk_target.clone().ok_or("no spdkTarget")?;
    let keys = datapath::keys_file(&client, "pvc-io", &c.node_dir(CONSUMER))
        .await
        .map_err(err("keys"))?
        .ok_or("the agent made no Secret for pvc-io")?;
    let hostnqn = c.node_dir(CONSUMER).join("hostnqn");
    let io = datapath::check_command(
        &c.bin_dir,
        &c.net.exec_prefix(CONSUMER).map_err(err("prefix"))?,
        &t,
        HostNqn::File(&hostnqn),
        Some(&keys),
        &[
            "--check-bytes",
            "0",
            "--random-seconds",
            "60",
            "--queue-depth",
            "8",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .map_err(err("spawn nvmf-check"))?;
    println!(
        "pvc-io on {}: reads {r0}, writes {w0} before; nvmf-check in {} runs 60 s of 4 KiB random I/O",
        c.node_name(a),
        c.node_name(CONSUMER)
    );
    let (r1, w1) = poll("pvc-io's counters growing", 90, || {
        let sel = io_sel.clone();
        async move {
            Ok(counters(api, sel)
                .await?
                .filter(|(r, w)| *r >= r0 + 1000.0 && *w >= w0 + 1000.0))
        }
    })
    .await?;
    println!("pvc-io's counters grew: reads {r0} → {r1}, writes {w0} → {w1}");

    // `kubectl liteio top --once` finds the agents through the StoragePools.
    let port = AGENT_METRICS_PORT.to_string();
    let out = kubectl_liteio(
        c,
        &[
            "top",
            "--once",
            "--interval",
            "2",
            "--metrics-port",
            port.as_str(),
            "-o",
            "json",
        ],
    )
    .await?;
    let frame: Value = serde_json::from_str(&out).map_err(|e| format!("{e}: {out}"))?;
    let row = frame["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["volume"] == "pvc-io")
        .ok_or_else(|| format!("top shows no pvc-io: {out}"))?;
    let iops = row["readIops"].as_f64().unwrap_or(0.0) + row["writeIops"].as_f64().unwrap_or(0.0);
    if iops <= 0.0 || row["node"] != c.node_name(a).as_str() || frame["volumes"][0] != *row {
        return Err(format!(
            "top shows pvc-io without IOPS, elsewhere, or not first: {out}"
        ));
    }
    if frame["unreachable"]
        .as_array()
        .is_none_or(|u| !u.is_empty())
    {
        return Err(format!("top could not reach every agent: {out}"));
    }
    for k in 1..=c.opts.nodes {
        let node = c.node_name(k);
        let p = get::<StoragePool>(c, &node).await?;
        let shown = frame["pools"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["node"] == node.as_str())
            .ok_or_else(|| format!("top shows no pool {node}: {out}"))?;
        if shown["freeBytes"].as_u64() != Some(p.reported_free_bytes()) {
            return Err(format!(
                "top shows {node} with {} free, its StoragePool {}",
                shown["freeBytes"],
                p.reported_free_bytes()
            ));
        }
    }
    println!(
        "top --once: pvc-io on {} at {iops:.0} IOPS ({:.1} MiB/s, latency {:.0} µs); pools {}",
        c.node_name(a),
        (row["readBytesPerSecond"].as_f64().unwrap_or(0.0)
            + row["writeBytesPerSecond"].as_f64().unwrap_or(0.0))
            / 1048576.0,
        row["latencySeconds"].as_f64().unwrap_or(0.0) * 1e6,
        frame["pools"]
    );

    // Pool free bytes and capacity as the StoragePools say.
    for k in 1..=c.opts.nodes {
        let node = c.node_name(k);
        let (prom_free, prom_cap, want_free, want_cap) = poll(
            &format!("{node}'s free bytes as its StoragePool"),
            30,
            || {
                let node = node.clone();
                async move {
                    let p = get::<StoragePool>(c, &node).await?;
                    let free =
                        value(api, &format!(r#"liteio_pool_free_bytes{{node="{node}"}}"#)).await?;
                    let cap = value(
                        api,
                        &format!(r#"liteio_pool_capacity_bytes{{node="{node}"}}"#),
                    )
                    .await?;
                    let want = (p.reported_free_bytes() as f64, p.total_bytes() as f64);
                    match free.zip(cap) {
                        Some((f, c)) if (f, c) == want => Ok(Some((f, c, want.0, want.1))),
                        got => Err(format!("Prometheus {got:?}, StoragePool {want:?}")),
                    }
                }
            },
        )
        .await?;
        println!(
            "{node}: Prometheus free {prom_free} of {prom_cap}; StoragePool vgFreeSize {want_free} of {want_cap}"
        );
    }

    // Every panel about pools, volumes, reactors and the control plane, during the I/O.
    panels.wait("random I/O", 90, at_io).await?;
    println!("{} s: the I/O panels have data", t0.elapsed().as_secs());
    let out = tokio::time::timeout(Duration::from_secs(180), io.wait_with_output())
        .await
        .map_err(|_| "nvmf-check did not end".to_string())?
        .map_err(err("nvmf-check"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("nvmf-check: {stdout}");
    let result: Value = stdout
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| format!("no result from nvmf-check: {stdout}"))?;
    if !out.status.success() || result["random_ios"].as_u64().unwrap_or(0) == 0 {
        return Err(format!(
            "nvmf-check failed ({}): {stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }

    // --- Authentication refusals ------------------------------------------------------------
    // NodeStageVolume of pvc-io on its consumer's node with keys that are not the volume's.
    let mut csi = liteio_csi::client::connect(&c.csi_node_endpoint(CONSUMER))
        .await
        .map_err(err("connect to the CSI node"))?;
    let wrong: HashMap<String, String> = liteio_api::auth::VolumeKeys::generate(false)
        .map_err(err("keys"))?
        .to_secret_data()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
        .collect();
    let refusals_total = "sum(liteio_auth_refusals_total)";
    for n in 1..=2u32 {
        let staging = c.node_dir(CONSUMER).join(format!("staging-refused-{n}"));
        std::fs::create_dir_all(&staging).map_err(err("mkdir"))?;
        let e = csi
            .node
            .node_stage_volume(NodeStageVolumeRequest {
                volume_id: io_id.clone(),
                staging_target_path: staging.display().to_string(),
                volume_capability: Some(mount_capability("xfs")),
                secrets: wrong.clone(),
                ..Default::default()
            })
            .await
            .err()
            .ok_or("NodeStageVolume with wrong keys was not refused")?;
        if !matches!(
            e.code(),
            tonic::Code::FailedPrecondition | tonic::Code::Unauthenticated
        ) {
            return Err(format!("NodeStageVolume failed otherwise: {e:?}"));
        }
        println!("refusal {n}: {:?}: {}", e.code(), e.message());
        // Prometheus sees each before the next (the rate needs growth, not a first value).
        let seen = poll(&format!("refusal {n} in Prometheus"), 30, || async move {
            Ok(value(api, refusals_total)
                .await?
                .filter(|v| *v >= f64::from(n)))
        })
        .await?;
        println!("{refusals_total} = {seen}");
    }
    let by_reason = query(
        api,
        "sum by (job, node, reason) (liteio_auth_refusals_total)",
    )
    .await?;
    println!("refusals: {by_reason:?}");
    panels.wait("refusals", 60, refusals).await?;

    // --- A migration ----------------------------------------------------------------------
    // From the polling node: the other storage node's pool is locked while the volume is
    // placed, so that the scheduler has no other choice.
    let other = c.node_name(OTHER);
    kubectl_liteio(c, &["lock", "pool", other.as_str()]).await?;
    let placed = create_volume_sized(c, "pvc-mig", Some(c.node_name(CONSUMER)), params, 1 << 30)
        .await
        .map_err(err("join"));
    kubectl_liteio(c, &["unlock", "pool", other.as_str()]).await?;
    placed??;
    ready(c, "pvc-mig").await?;
    let from = node_of(c, "pvc-mig").await?;
    let to = OTHER;
    if from != POLLING {
        return Err(format!(
            "pvc-mig went to {}, not to the polling {}",
            c.node_name(from),
            c.node_name(POLLING)
        ));
    }
    // The test plays the migration's host: the consumer's CSI node plugin (which has no
    // path to drop and would report at once, ending Cleaning before a scrape saw the copy)
    // is paused until the test has reported.
    let csi_node = c
        .pid(Role::CsiNode(CONSUMER))
        .ok_or("no CSI node plugin on the consumer node")?;
    signal(csi_node, "-STOP").await?;
    println!(
        "{}",
        kubectl_liteio(c, &["migrate", "pvc-mig", "--to", &c.node_name(to)]).await?
    );
    let name = migration_of(c, "pvc-mig")
        .await
        .ok_or("kubectl liteio migrate made no VolumeMigration")?
        .name_any();
    eventually(
        c,
        "the destination exported",
        180,
        Role::Controller(0),
        || async {
            get_opt::<VolumeMigration>(c, &name).await.is_some_and(|m| {
                m.phase() == MigrationPhase::SetupPipe && !m.spec.dest_volume.spdk.svc_id.is_empty()
            })
        },
    )
    .await?;
    host_reports(c, &name, true).await?;
    eventually(c, "the switch-over", 300, Role::Agent(from), || async {
        get_opt::<VolumeMigration>(c, &name).await.is_some_and(|m| {
            m.spec.migration_info.auto_switch.status == Some(ResultStatus::Success)
        })
    })
    .await?;
    // Cleaning waits for the host's report: the migration is under way until then.
    panels.wait("migration under way", 60, migrating).await?;
    // The gauge follows the VolumeMigration's count: its last scraped value is some of it
    // and never more (the controller drops a finished migration's series, which may happen
    // before a scrape saw the final count: a 1 GiB copy takes about a second here, the
    // scrape interval is 1 s; an instant selector may then find nothing at all).
    let copied_q = format!(
        r#"max(max_over_time(liteio_controller_migration_copied_bytes{{migration="{name}"}}[5m]))"#
    );
    let copied = poll(
        "the copied bytes in Prometheus, at most the migration's",
        60,
        || {
            let (q, name) = (copied_q.clone(), name.clone());
            async move {
                let want = get_opt::<VolumeMigration>(c, &name)
                    .await
                    .ok_or("migration gone")?
                    .bytes_copied() as f64;
                match value(api, &q).await? {
                    Some(v) if v > 0.0 && v <= want => Ok(Some(v)),
                    got => Err(format!("Prometheus {got:?}, the migration {want}")),
                }
            }
        },
    )
    .await?;
    let rate_q = panels
        .queries
        .iter()
        .find(|(q, _)| q.expr.contains("deriv("))
        .map(|(_, e)| e.clone())
        .ok_or("no copy rate panel")?;
    let copy_rate = value(api, &rate_q).await?.unwrap_or(0.0);
    println!(
        "migration {name} {} → {}: {:.0} MiB copied, copy rate panel {:.1} MiB/s",
        c.node_name(from),
        c.node_name(to),
        copied / 1048576.0,
        copy_rate / 1048576.0
    );
    // A copy that began and ended between two scrapes (1 GiB takes about a second here,
    // the scrape interval is 1 s) leaves one value: no rate to show. Otherwise the panel
    // must show one.
    let changes_q = format!(
        r#"max(changes(liteio_controller_migration_copied_bytes{{migration="{name}"}}[5m]))"#
    );
    let changes = value(api, &changes_q).await?.unwrap_or(0.0);
    if copy_rate <= 0.0 && changes > 0.0 {
        return Err(format!(
            "the copy rate panel shows {copy_rate} although Prometheus saw the count change {changes} time(s)"
        ));
    }
    if copy_rate <= 0.0 {
        println!("the copy ran between two scrapes (one value seen): no rate to show");
    }
    host_reports(c, &name, false).await?;
    signal(csi_node, "-CONT").await?;
    eventually(
        c,
        "the migration finished",
        300,
        Role::Controller(0),
        || async {
            get_opt::<VolumeMigration>(c, &name)
                .await
                .is_some_and(|m| m.phase() == MigrationPhase::Finished)
        },
    )
    .await?;
    panels.wait("migration finished", 60, migrated).await?;

    // --- A pool offline -----------------------------------------------------------------------
    let cut = c.node_name(CUT);
    let firing = format!(r#"ALERTS{{alertname="{ALERT}",alertstate="firing",pool="{cut}"}}"#);
    if !query(api, &firing).await?.is_empty() {
        return Err(format!("{ALERT} fires for {cut} before its link is cut"));
    }
    let detect = liveness().offline_after + liveness().tick;
    let cut_at = Instant::now();
    c.set_link(CUT, false).await.map_err(err("link down"))?;
    let offline_at = std::sync::Mutex::new(None::<Duration>);
    let limit = detect + alert_for + Duration::from_secs(30);
    let fired = poll(
        &format!("{ALERT} firing for {cut}"),
        limit.as_secs(),
        || {
            let (firing, cut, offline_at) = (firing.clone(), cut.clone(), &offline_at);
            async move {
                if offline_at.lock().map_err(err("lock"))?.is_none()
                    && pool_status(c, &cut).await == Some(liteio_api::pool::PoolStatus::Offline)
                {
                    *offline_at.lock().map_err(err("lock"))? = Some(cut_at.elapsed());
                }
                Ok((!query(api, &firing).await?.is_empty()).then(|| cut_at.elapsed()))
            }
        },
    )
    .await?;
    println!(
        "{cut} cut: StoragePool offline after {:.1} s (offlineAfter {:?}), {ALERT} firing after {:.1} s (for {alert_for:?}, limit {limit:?})",
        offline_at
            .lock()
            .map_err(err("lock"))?
            .map_or(f64::NAN, |d| d.as_secs_f64()),
        liveness().offline_after,
        fired.as_secs_f64()
    );
    if fired < alert_for {
        return Err(format!(
            "{ALERT} fired {fired:?} after the cut, before its for: {alert_for:?}"
        ));
    }
    panels.wait("pool offline", 30, alerts).await?;
    c.set_link(CUT, true).await.map_err(err("link up"))?;
    let back = Instant::now();
    poll(&format!("{ALERT} cleared"), 90, || {
        let firing = firing.clone();
        async move { Ok(query(api, &firing).await?.is_empty().then_some(())) }
    })
    .await?;
    println!(
        "{cut}'s link back: {ALERT} cleared after {:.1} s",
        back.elapsed().as_secs_f64()
    );

    // --- Every query had data -------------------------------------------------------------------
    let report = panels.report();
    println!(
        "dashboard queries ({} of {} with data):\n{report}",
        panels.seen.len(),
        panels.queries.len()
    );
    if panels.seen.len() != panels.queries.len() {
        return Err("some dashboard queries never returned data".into());
    }
    println!("scenario took {} s", t0.elapsed().as_secs());
    Ok(())
}
