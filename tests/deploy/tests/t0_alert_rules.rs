//! T0: LiteIO's alerting rules (deploy/prometheus/). The PrometheusRule is generated from the
//! plain rules file (and must be what the generation gives); every alert has a `for:`, a
//! severity and annotations that name what it groups by; every metric an expression reads is
//! one the agent or the controller really exports, and docs/metrics.md lists every family
//! they export; the unit tests (liteio-rules.test.yaml) cover each alert firing and silent;
//! and, when promtool (Debian `prometheus`) is installed, `promtool check rules` and
//! `promtool test rules` pass, and fail once any alert's expression is made to always fire
//! or never fire.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use common::deploy_dir;
use common::prometheus::{PrometheusRule, RulesFile, RulesTestFile};
use serde::de::DeserializeOwned;

const RULES: &str = "liteio-rules.yaml";
const RULES_TEST: &str = "liteio-rules.test.yaml";
const PROMETHEUS_RULE: &str = "prometheusrule.yaml";
/// Set to rewrite prometheusrule.yaml from liteio-rules.yaml.
const REGENERATE: &str = "LITEIO_REGENERATE_PROMETHEUSRULE";

fn prom_dir() -> PathBuf {
    deploy_dir().join("prometheus")
}

fn text(file: &str) -> String {
    let p = prom_dir().join(file);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `file` parsed into `T` (unknown fields refused by `T`); the error names the field.
fn parse<T: DeserializeOwned>(file: &str) -> T {
    serde_path_to_error::deserialize(serde_yaml::Deserializer::from_str(&text(file)))
        .unwrap_or_else(|e| panic!("{file}: {} at {}", e.inner(), e.path()))
}

/// The PrometheusRule for the rules of `plain` (the text of liteio-rules.yaml): a header
/// and its `groups:` block under `spec:`, comments and layout kept.
fn prometheus_rule_from(plain: &str) -> String {
    let at = plain
        .find("\ngroups:")
        .map(|i| i + 1)
        .expect("liteio-rules.yaml has a top-level groups:");
    let mut out = String::from(
        "# LiteIO's alerting rules as a PrometheusRule for the Prometheus operator (its CRDs must be\n\
         # installed; deploy/overlays/monitoring applies it). Generated from liteio-rules.yaml:\n\
         # edit that file, then run\n\
         #   LITEIO_REGENERATE_PROMETHEUSRULE=1 cargo test -p liteio-cli --test t0_alert_rules\n\
         apiVersion: monitoring.coreos.com/v1\n\
         kind: PrometheusRule\n\
         metadata:\n  \
           name: liteio\n  \
           namespace: obnvmf\n  \
           labels:\n    \
             app.kubernetes.io/name: liteio\n    \
             app.kubernetes.io/part-of: liteio\n\
         spec:\n",
    );
    for line in plain[at..].lines() {
        if !line.is_empty() {
            out.push_str("  ");
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[test]
fn the_prometheusrule_is_generated_from_the_rules_file() {
    let want = prometheus_rule_from(&text(RULES));
    if std::env::var_os(REGENERATE).is_some() {
        std::fs::write(prom_dir().join(PROMETHEUS_RULE), &want).unwrap();
        println!("wrote deploy/prometheus/{PROMETHEUS_RULE}");
    }
    assert!(
        text(PROMETHEUS_RULE) == want,
        "deploy/prometheus/{PROMETHEUS_RULE} is not generated from {RULES}: run \
         {REGENERATE}=1 cargo test -p liteio-cli --test t0_alert_rules"
    );
    // And it says the same once parsed, with nothing a PrometheusRule does not have.
    let plain: RulesFile = parse(RULES);
    let pr: PrometheusRule = parse(PROMETHEUS_RULE);
    assert_eq!(pr.api_version, "monitoring.coreos.com/v1");
    assert_eq!(pr.kind, "PrometheusRule");
    assert_eq!(pr.metadata.namespace.as_deref(), Some("obnvmf"));
    assert_eq!(pr.spec, plain);
}

#[test]
fn the_generation_catches_a_drift() {
    let plain = text(RULES);
    let drifted = plain.replacen("for: 15m", "for: 14m", 1);
    assert_ne!(drifted, plain, "the rules file has a `for: 15m`");
    assert_ne!(prometheus_rule_from(&drifted), text(PROMETHEUS_RULE));
}

/// Label names of every `by (…)` in `expr`.
fn grouped_by(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = expr;
    while let Some(i) = rest.find("by (") {
        rest = &rest[i + 4..];
        let end = rest.find(')').expect("by (…) closed");
        out.extend(
            rest[..end]
                .split(',')
                .map(|l| l.trim().to_string())
                .filter(|l| !l.is_empty()),
        );
    }
    out
}

#[test]
fn every_alert_says_how_bad_after_how_long_and_about_what() {
    let rules: RulesFile = parse(RULES);
    let mut names = BTreeSet::new();
    for r in rules.groups.iter().flat_map(|g| &g.rules) {
        let a = &r.alert;
        assert!(a.starts_with("LiteIO"), "{a}");
        assert!(names.insert(a.clone()), "{a} twice");
        assert!(
            r.for_
                .strip_suffix(['s', 'm', 'h'])
                .is_some_and(|n| n.parse::<u32>().is_ok()),
            "{a}: for: {:?}",
            r.for_
        );
        let severity = r.labels.get("severity").map(String::as_str);
        assert!(
            matches!(severity, Some("warning" | "critical")),
            "{a}: severity {severity:?}"
        );
        assert_eq!(
            r.annotations.keys().map(String::as_str).collect::<Vec<_>>(),
            ["description", "summary"],
            "{a}"
        );
        // Whatever the alert is about (what it groups by) is named in its annotations.
        let said = format!(
            "{} {}",
            r.annotations["summary"], r.annotations["description"]
        );
        for label in grouped_by(&r.expr) {
            assert!(
                said.contains(&format!("$labels.{label}")),
                "{a}: the annotations do not name {label}"
            );
        }
    }
    let want: BTreeSet<String> = [
        "LiteIOPoolNearlyFull",
        "LiteIOPoolOffline",
        "LiteIOPoolLeaseStale",
        "LiteIOVolumeNotReady",
        "LiteIOSpdkRequestStuck",
        "LiteIOCaughtPanic",
        "LiteIOAuthRefusalsRising",
        "LiteIOMigrationStalled",
        "LiteIOControllerNoLeader",
        "LiteIOReplicatedVolumeDegraded",
        "LiteIOReplicaRebuildStalled",
    ]
    .map(String::from)
    .into();
    assert_eq!(names, want);
}

/// The metric names (`liteio_…`) an expression reads.
fn metrics_in(expr: &str) -> BTreeSet<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|t| t.starts_with("liteio_"))
        .map(str::to_string)
        .collect()
}

/// Family names of a text exposition (its `# TYPE` lines).
fn families(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next())
        .map(str::to_string)
        .collect()
}

/// What an agent exports with a volume of each engine kind and SPDK running, and a
/// controller that leads with a pool, a volume not ready, a migration under way and a
/// replicated volume rebuilding.
fn exported() -> (BTreeSet<String>, BTreeSet<String>) {
    use liteio_agent::engine::{BdevIo, VolumeIo, blkstat::BlockStat};
    use liteio_agent::metrics::{Metrics, Scrape, SpdkFaults, SpdkThreadTime};
    let agent = Metrics::new("n1").unwrap();
    for name in ["pvc-a", "pvc-s"] {
        let v = liteio_api::AntstorVolume::new(
            name,
            liteio_api::AntstorVolumeSpec {
                uuid: format!("u-{name}"),
                ..Default::default()
            },
        );
        agent.set_volume(&v, name, 1 << 30);
    }
    agent.set_pool(10 << 30, 5 << 30);
    agent.auth_refused("keys_forbidden");
    let scrape = Scrape {
        volumes: vec![
            (
                "pvc-a".into(),
                VolumeIo::Block {
                    dev: "loop0".into(),
                    stat: BlockStat::default(),
                },
            ),
            (
                "pvc-s".into(),
                VolumeIo::Lvol {
                    lvol: "lvs/pvc-s".into(),
                    stat: BdevIo::default(),
                },
            ),
        ],
        spdk_threads: vec![SpdkThreadTime::default()],
        reactor_cpu: vec![("reactor_0".into(), 0.0)],
        spdk_faults: Some(SpdkFaults::default()),
    };
    let agent = families(&agent.render_with(&scrape, SystemTime::now()));

    use liteio_controller::metrics::{Metrics as Ctl, MigrationSample, PoolSample, VolumeSample};
    let ctl = Ctl::new().unwrap();
    ctl.leader.set(1);
    ctl.observe_pools(&[PoolSample {
        pool: "n1".into(),
        status: "ready",
        lease_age_seconds: Some(1.0),
    }]);
    ctl.observe_volumes(&[VolumeSample {
        volume: "pvc-b".into(),
        node: "n1".into(),
        pvc_namespace: "app".into(),
        pvc: "data".into(),
        created: 0.0,
    }]);
    ctl.observe_migrations(
        &[MigrationSample {
            migration: "m1".into(),
            volume: "pvc-a".into(),
            source_node: "n1".into(),
            dest_node: "n2".into(),
            phase: "Syncing",
            copied_bytes: 0,
            size_bytes: Some(1),
        }],
        0.0,
    );
    ctl.replicated_health
        .with_label_values(&["pvc-r", "rebuilding"])
        .set(1);
    ctl.replica_rebuilt_bytes
        .with_label_values(&["pvc-r", "pvc-r-m1"])
        .set(1);
    let controller = families(&ctl.render());
    (agent, controller)
}

#[test]
fn every_metric_in_the_rules_is_exported_and_documented() {
    let (agent, controller) = exported();
    let all: BTreeSet<String> = agent.union(&controller).cloned().collect();
    let rules: RulesFile = parse(RULES);
    let mut used = BTreeSet::new();
    for r in rules.groups.iter().flat_map(|g| &g.rules) {
        for m in metrics_in(&r.expr) {
            assert!(
                all.contains(&m),
                "{}: {m} is exported by no component",
                r.alert
            );
            used.insert(m);
        }
    }
    assert!(used.len() >= 10, "{used:?}");
    let doc_path = deploy_dir().join("../docs/metrics.md");
    let doc = std::fs::read_to_string(&doc_path)
        .unwrap_or_else(|e| panic!("{}: {e}", doc_path.display()));
    for f in &all {
        assert!(
            doc.contains(&format!("`{f}`")),
            "docs/metrics.md does not list {f}"
        );
    }
}

#[test]
fn the_unit_tests_cover_each_alert_firing_and_silent() {
    let rules: RulesFile = parse(RULES);
    let tests: RulesTestFile = parse(RULES_TEST);
    assert_eq!(tests.rule_files, [RULES]);
    // alert → (cases where it fires, cases where it is silent)
    let mut seen: BTreeMap<&str, (usize, usize)> = rules
        .groups
        .iter()
        .flat_map(|g| &g.rules)
        .map(|r| (r.alert.as_str(), (0, 0)))
        .collect();
    for case in tests.tests.iter().flat_map(|t| &t.alert_rule_test) {
        let e = seen
            .get_mut(case.alertname.as_str())
            .unwrap_or_else(|| panic!("{RULES_TEST}: no alert {}", case.alertname));
        if case.exp_alerts.is_empty() {
            e.1 += 1;
        } else {
            e.0 += 1;
            for a in &case.exp_alerts {
                assert!(a.exp_labels.contains_key("severity"), "{}", case.alertname);
                assert!(
                    a.exp_annotations.contains_key("summary")
                        && a.exp_annotations.contains_key("description"),
                    "{}",
                    case.alertname
                );
            }
        }
    }
    for (alert, (fires, silent)) in seen {
        assert!(fires > 0, "{alert}: no case where it fires");
        assert!(silent > 0, "{alert}: no case where it stays silent");
    }
}

/// `promtool`'s version line, or why it cannot run.
fn promtool() -> Result<String, String> {
    match Command::new("promtool").arg("--version").output() {
        Ok(o) if o.status.success() => Ok(String::from_utf8_lossy(&o.stdout)
            .lines()
            .next()
            .unwrap_or_default()
            .to_string()),
        Ok(o) => Err(format!("promtool --version exited with {}", o.status)),
        Err(e) => Err(format!(
            "promtool not found ({e}); install Debian's prometheus package"
        )),
    }
}

/// Runs `promtool args…` in `dir`: (success, stdout and stderr).
fn run_promtool(dir: &Path, args: &[&str]) -> (bool, String) {
    let o = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

#[test]
fn promtool_checks_the_rules_and_runs_their_unit_tests() {
    let version = match promtool() {
        Ok(v) => v,
        Err(why) => {
            println!("SKIP promtool_checks_the_rules_and_runs_their_unit_tests: {why}");
            return;
        }
    };
    println!("{version}");
    let dir = prom_dir();
    let (ok, out) = run_promtool(&dir, &["check", "rules", RULES]);
    println!("{out}");
    assert!(ok && out.contains("SUCCESS: 11 rules found"), "{out}");
    let (ok, out) = run_promtool(&dir, &["test", "rules", RULES_TEST]);
    println!("{out}");
    assert!(ok && out.contains("SUCCESS"), "{out}");

    // The unit tests notice an alert that fires on everything or on nothing.
    let rules: RulesFile = parse(RULES);
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join(RULES_TEST), text(RULES_TEST)).unwrap();
    let alerts: Vec<String> = rules
        .groups
        .iter()
        .flat_map(|g| &g.rules)
        .map(|r| r.alert.clone())
        .collect();
    for alert in &alerts {
        for (what, expr) in [("always", "vector(1)"), ("never", "vector(0) > 1")] {
            let mut broken = rules.clone();
            for r in broken.groups.iter_mut().flat_map(|g| &mut g.rules) {
                if r.alert == *alert {
                    r.expr = expr.to_string();
                }
            }
            std::fs::write(
                tmp.path().join(RULES),
                serde_yaml::to_string(&broken).unwrap(),
            )
            .unwrap();
            let (ok, out) = run_promtool(tmp.path(), &["test", "rules", RULES_TEST]);
            assert!(
                !ok && out.contains(alert.as_str()),
                "{alert} firing {what}: the unit tests still pass\n{out}"
            );
        }
    }
    println!(
        "promtool: {} alerts, each caught by the unit tests when it fires always or never",
        alerts.len()
    );
}
