//! T0: LiteIO's Grafana dashboard (deploy/grafana/liteio-dashboard.json). A plain JSON model
//! whose data source is the template variable `${datasource}`, with `node` and `volume`
//! variables; every panel queries Prometheus with PromQL kept in the JSON; the sections the
//! operators asked for are there; every metric a query reads is one docs/metrics.md lists,
//! `rate()`/`increase()` only over counters and `deriv()` only over gauges; and, when
//! promtool is installed, every query (variables at their "All" value) parses as PromQL
//! (`promtool check rules` on them as recording rules), which a broken query fails.
//!
//! The live test that evaluates every query against a running cluster and a real
//! Prometheus: tests/cluster/tests/t3_prometheus.rs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::process::Command;

use liteio_tests::dashboard::{self, Query};
use serde_json::Value;

fn dash() -> Value {
    dashboard::load().unwrap()
}

#[test]
fn a_plain_json_model_on_a_datasource_variable_with_node_and_volume_variables() {
    let d = dash();
    assert_eq!(d["title"], "LiteIO");
    assert_eq!(d["uid"], "liteio-overview");
    assert!(d["schemaVersion"].as_u64().unwrap() >= 36);
    // Importable anywhere: no fixed id, no data source of one installation.
    assert!(d["id"].is_null());
    assert!(d.get("__inputs").is_none());
    let vars = dashboard::variables(&d);
    let names: Vec<&str> = vars.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["datasource", "node", "volume"]);
    assert_eq!(
        (vars[0].kind.as_str(), vars[0].query.as_str()),
        ("datasource", "prometheus")
    );
    for v in &vars[1..] {
        assert_eq!(v.kind, "query", "{v:?}");
        assert_eq!(v.all_value.as_deref(), Some(".*"), "{v:?}");
        assert!(v.query.starts_with("label_values("), "{v:?}");
    }
    assert_eq!(
        vars[1].query,
        "label_values(liteio_pool_capacity_bytes, node)"
    );
    assert!(vars[2].query.contains(r#"node=~"$node""#), "{:?}", vars[2]);
    for v in d["templating"]["list"].as_array().unwrap().iter().skip(1) {
        assert_eq!(v["datasource"]["uid"], "${datasource}", "{v}");
    }

    let mut ids = BTreeSet::new();
    let mut cells: Vec<(u64, u64, u64, u64, String)> = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        let title = p["title"].as_str().unwrap().to_string();
        assert!(ids.insert(p["id"].as_u64().unwrap()), "{title}: id twice");
        let g = &p["gridPos"];
        let (x, y, w, h) = (
            g["x"].as_u64().unwrap(),
            g["y"].as_u64().unwrap(),
            g["w"].as_u64().unwrap(),
            g["h"].as_u64().unwrap(),
        );
        assert!(x + w <= 24 && w > 0 && h > 0, "{title}: {g}");
        for (ox, oy, ow, oh, other) in &cells {
            let apart = x + w <= *ox || *ox + ow <= x || y + h <= *oy || *oy + oh <= y;
            assert!(apart, "{title} overlaps {other}");
        }
        cells.push((x, y, w, h, title.clone()));
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["type"], "prometheus", "{title}");
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        assert!(
            !p["description"].as_str().unwrap_or_default().is_empty(),
            "{title}: no description"
        );
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}: no query");
        let refs: BTreeSet<&str> = targets
            .iter()
            .map(|t| t["refId"].as_str().unwrap())
            .collect();
        assert_eq!(refs.len(), targets.len(), "{title}: refIds repeat");
        for t in targets {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{title}");
        }
    }
}

#[test]
fn the_sections_and_what_they_show() {
    let d = dash();
    let rows: Vec<&str> = d["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] == "row")
        .map(|p| p["title"].as_str().unwrap())
        .collect();
    assert_eq!(
        rows,
        [
            "Pools",
            "Volumes",
            "SPDK reactors",
            "Migrations",
            "Authentication",
            "Control plane"
        ]
    );
    let qs = dashboard::queries(&d).unwrap();
    println!(
        "{} panels, {} queries",
        dashboard::panels(&d).len(),
        qs.len()
    );
    let in_row =
        |row: &str, needle: &str| qs.iter().any(|q| q.row == row && q.expr.contains(needle));
    for (row, needle) in [
        ("Pools", "liteio_pool_capacity_bytes"),
        ("Pools", "liteio_pool_free_bytes"),
        ("Pools", "liteio_pool_volumes"),
        ("Volumes", "rate(liteio_volume_reads_completed_total"),
        ("Volumes", "rate(liteio_volume_writes_completed_total"),
        ("Volumes", "rate(liteio_volume_read_bytes_total"),
        ("Volumes", "rate(liteio_volume_written_bytes_total"),
        ("Volumes", "rate(liteio_volume_read_time_seconds_total"),
        ("Volumes", "rate(liteio_volume_write_time_seconds_total"),
        ("SPDK reactors", "liteio_spdk_thread_busy_seconds_total"),
        ("SPDK reactors", "liteio_spdk_thread_idle_seconds_total"),
        ("SPDK reactors", "liteio_spdk_reactor_cpu_seconds_total"),
        ("Migrations", "liteio_controller_migration_copied_bytes"),
        (
            "Migrations",
            "deriv(liteio_controller_migration_copied_bytes",
        ),
        (
            "Migrations",
            "histogram_quantile(0.9, sum by (le) (rate(liteio_controller_migration_duration_seconds_bucket",
        ),
        ("Authentication", "liteio_auth_refusals_total"),
        ("Control plane", "ALERTS{"),
    ] {
        assert!(in_row(row, needle), "no query of row {row} reads {needle}");
    }
    // Per-volume and per-node queries follow the variables.
    for q in &qs {
        if q.expr.contains("liteio_volume_") {
            assert!(q.expr.contains(r#"volume=~"$volume""#), "{}", q.name());
        }
        if q.expr.contains("liteio_pool_") || q.expr.contains("liteio_spdk_") {
            assert!(q.expr.contains(r#"node=~"$node""#), "{}", q.name());
        }
    }
}

/// The metric inside each `fun(` … `[` of `expr`: `rate(x{…}[1m])` gives `x`.
fn ranged(expr: &str, fun: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    let pat = format!("{fun}(");
    while let Some(i) = rest.find(&pat) {
        // Not the tail of a longer name (`irate(`).
        let ok = rest[..i]
            .chars()
            .last()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
        rest = &rest[i + pat.len()..];
        if ok {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            out.push(name);
        }
    }
    out
}

#[test]
fn every_metric_is_documented_and_ranged_the_way_its_type_allows() {
    let doc_path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/metrics.md");
    let doc = std::fs::read_to_string(&doc_path).unwrap();
    let qs = dashboard::queries(&dash()).unwrap();
    let mut used = BTreeSet::new();
    for q in &qs {
        for m in dashboard::metrics_in(&q.expr) {
            if m == "up" || m == "ALERTS" {
                continue;
            }
            let family = m
                .strip_suffix("_bucket")
                .or_else(|| m.strip_suffix("_count"))
                .or_else(|| m.strip_suffix("_sum"))
                .unwrap_or(&m);
            assert!(
                doc.contains(&format!("`{family}`")),
                "{}: {family} is not in docs/metrics.md",
                q.name()
            );
            used.insert(family.to_string());
        }
        for fun in ["rate", "increase"] {
            for m in ranged(&q.expr, fun) {
                assert!(
                    m.ends_with("_total") || m.ends_with("_bucket"),
                    "{}: {fun}() over {m}, not a counter",
                    q.name()
                );
            }
        }
        for m in ranged(&q.expr, "deriv") {
            assert!(
                !m.ends_with("_total"),
                "{}: deriv() over counter {m}",
                q.name()
            );
        }
    }
    println!("{} metric families: {used:?}", used.len());
    assert!(used.len() >= 25, "{used:?}");
    // The check itself sees a wrong use.
    assert_eq!(
        ranged("rate(liteio_pool_free_bytes[1m])", "rate"),
        ["liteio_pool_free_bytes"]
    );
    assert!(ranged("irate(x_total[1m])", "rate").is_empty());
}

/// A rules file with each query as a recording rule (`dashboard:panel_<id>_<refId>`).
fn as_recording_rules(qs: &[Query], vars: &[dashboard::Variable]) -> String {
    let mut out = String::from("groups:\n- name: dashboard\n  rules:\n");
    for q in qs {
        let expr = dashboard::resolve(&q.expr, vars).unwrap();
        out.push_str(&format!(
            "  - record: dashboard:panel_{}_{}\n    expr: {}\n",
            q.panel_id,
            q.ref_id,
            serde_json::to_string(&expr).unwrap()
        ));
    }
    out
}

fn promtool_check_rules(text: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("dashboard-rules.yaml");
    std::fs::write(&f, text).unwrap();
    let o = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&f)
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
fn every_query_parses_as_promql() {
    if Command::new("promtool").arg("--version").output().is_err() {
        println!(
            "SKIP every_query_parses_as_promql: promtool not found; install Debian's prometheus package"
        );
        return;
    }
    let d = dash();
    let vars = dashboard::variables(&d);
    let qs = dashboard::queries(&d).unwrap();
    let (ok, out) = promtool_check_rules(&as_recording_rules(&qs, &vars));
    println!("{out}");
    assert!(ok, "{out}");
    assert!(
        out.contains(&format!("SUCCESS: {} rules found", qs.len())),
        "{out}"
    );
    // A query with a syntax error is caught.
    let mut broken = qs.clone();
    broken[0].expr = broken[0].expr.replacen(')', "", 1);
    let (ok, out) = promtool_check_rules(&as_recording_rules(&broken, &vars));
    assert!(!ok, "a broken query passed: {out}");
}
