//! LiteIO's Grafana dashboard (`deploy/grafana/liteio-dashboard.json`) as the tests read
//! it: every panel's queries, and each query as a Prometheus evaluates it outside Grafana
//! (template variables at their "All" value, `$__rate_interval` at [`RATE_INTERVAL`]).

use std::path::PathBuf;

use serde_json::Value;

/// `$__rate_interval` as Grafana sets it for a data source scraped every 15 s (Prometheus'
/// default): four scrape intervals.
pub const RATE_INTERVAL: &str = "1m";

/// One query of one panel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// The panel's id.
    pub panel_id: u64,
    /// The panel's title.
    pub panel: String,
    /// The title of the row the panel is under (empty above the first row).
    pub row: String,
    /// The target's `refId`.
    pub ref_id: String,
    /// The PromQL as written in the dashboard.
    pub expr: String,
}

impl Query {
    /// `panel [refId]` for messages.
    pub fn name(&self) -> String {
        format!("{} [{}]", self.panel, self.ref_id)
    }
}

/// A template variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Variable {
    /// Its name (`node`).
    pub name: String,
    /// `datasource` or `query`.
    pub kind: String,
    /// What it lists (`label_values(…)`, or the data source type).
    pub query: String,
    /// The value it stands for with "All" selected.
    pub all_value: Option<String>,
}

/// Where the dashboard is.
pub fn path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/liteio-dashboard.json")
}

/// The dashboard's JSON model.
pub fn load() -> Result<Value, String> {
    let p = path();
    let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))
}

/// Every panel that is not a row, with the title of the row above it: top-level panels
/// and those of collapsed rows (`panels` inside a row).
pub fn panels(d: &Value) -> Vec<(String, &Value)> {
    let mut out = Vec::new();
    let mut row = String::new();
    for p in d["panels"].as_array().into_iter().flatten() {
        if p["type"] == "row" {
            row = p["title"].as_str().unwrap_or_default().to_string();
            for inner in p["panels"].as_array().into_iter().flatten() {
                out.push((row.clone(), inner));
            }
        } else {
            out.push((row.clone(), p));
        }
    }
    out
}

/// Every query of every panel, in the dashboard's order; an error names a target without
/// an `expr`.
pub fn queries(d: &Value) -> Result<Vec<Query>, String> {
    let mut out = Vec::new();
    for (row, p) in panels(d) {
        let panel = p["title"].as_str().unwrap_or_default().to_string();
        for t in p["targets"].as_array().into_iter().flatten() {
            let ref_id = t["refId"].as_str().unwrap_or_default().to_string();
            let expr = t["expr"]
                .as_str()
                .filter(|e| !e.trim().is_empty())
                .ok_or_else(|| format!("panel {panel:?} target {ref_id:?} has no expr"))?;
            out.push(Query {
                panel_id: p["id"].as_u64().unwrap_or_default(),
                panel: panel.clone(),
                row: row.clone(),
                ref_id,
                expr: expr.to_string(),
            });
        }
    }
    Ok(out)
}

/// The template variables.
pub fn variables(d: &Value) -> Vec<Variable> {
    d["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| Variable {
            name: v["name"].as_str().unwrap_or_default().to_string(),
            kind: v["type"].as_str().unwrap_or_default().to_string(),
            query: match &v["query"] {
                Value::String(s) => s.clone(),
                q => q["query"].as_str().unwrap_or_default().to_string(),
            },
            all_value: v["allValue"].as_str().map(str::to_string),
        })
        .collect()
}

/// `expr` as Grafana sends it to Prometheus with every variable of `vars` at its "All"
/// value and `$__rate_interval` at [`RATE_INTERVAL`]; an error names a variable the
/// dashboard does not define (or one without an "All" value).
pub fn resolve(expr: &str, vars: &[Variable]) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = expr;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let (name, len) = match after.strip_prefix('{') {
            Some(b) => {
                let end = b
                    .find('}')
                    .ok_or_else(|| format!("unclosed ${{ in {expr}"))?;
                (&b[..end], end + 2)
            }
            None => {
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                (&after[..end], end)
            }
        };
        let value = if name == "__rate_interval" {
            RATE_INTERVAL.to_string()
        } else {
            vars.iter()
                .find(|v| v.name == name)
                .and_then(|v| v.all_value.clone())
                .ok_or_else(|| {
                    format!("${name} in {expr} is no variable of the dashboard with an All value")
                })?
        };
        out.push_str(&value);
        rest = &after[len..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Names of the metrics (`liteio_…`, `up`, `ALERTS`) an expression reads, histogram
/// suffixes kept.
pub fn metrics_in(expr: &str) -> Vec<String> {
    let mut out: Vec<String> = expr
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|t| t.starts_with("liteio_") || *t == "up" || *t == "ALERTS")
        .map(str::to_string)
        .collect();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn vars() -> Vec<Variable> {
        vec![Variable {
            name: "node".into(),
            kind: "query".into(),
            query: "label_values(x, node)".into(),
            all_value: Some(".*".into()),
        }]
    }

    #[test]
    fn variables_resolve_to_their_all_value() {
        assert_eq!(
            resolve(
                r#"rate(x{node=~"$node", n2=~"${node}"}[$__rate_interval])"#,
                &vars()
            )
            .unwrap(),
            r#"rate(x{node=~".*", n2=~".*"}[1m])"#
        );
        let e = resolve(r#"x{volume=~"$volume"}"#, &vars()).unwrap_err();
        assert!(e.contains("$volume"), "{e}");
        assert!(resolve("x{a=\"${node\"}", &vars()).is_err());
    }

    #[test]
    fn metric_names() {
        assert_eq!(
            metrics_in(
                r#"histogram_quantile(0.9, sum by (le) (rate(liteio_x_bucket[1h]))) / up{job="a"} + ALERTS"#
            ),
            ["ALERTS", "liteio_x_bucket", "up"]
        );
    }
}
