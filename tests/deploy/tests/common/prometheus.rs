//! The Prometheus objects under deploy/ as typed as the manifests tests need them, every
//! struct refusing unknown fields: rules files, their unit tests, and the Prometheus
//! operator's PrometheusRule, ServiceMonitor and PodMonitor (the part of their schema LiteIO
//! uses; a field outside it is refused, so a misspelt one cannot pass as unknown-but-fine).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde::{Deserialize, Serialize};

/// `apiVersion` of the operator's objects.
pub const MONITORING_API: &str = "monitoring.coreos.com/v1";

/// A plain rules file (`rule_files:`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RulesFile {
    pub groups: Vec<RuleGroup>,
}

/// One rule group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleGroup {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
    pub rules: Vec<Rule>,
}

/// An alerting rule (recording rules are not used).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub alert: String,
    pub expr: String,
    #[serde(rename = "for")]
    pub for_: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// `promtool test rules` input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RulesTestFile {
    pub rule_files: Vec<String>,
    pub evaluation_interval: String,
    pub tests: Vec<RulesTest>,
}

/// One test group: series and the alerts expected from them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RulesTest {
    pub interval: String,
    pub input_series: Vec<InputSeries>,
    pub alert_rule_test: Vec<AlertRuleTest>,
}

/// A series and its values in promtool's notation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputSeries {
    pub series: String,
    pub values: String,
}

/// The alerts `alertname` has at `eval_time`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertRuleTest {
    pub eval_time: String,
    pub alertname: String,
    pub exp_alerts: Vec<ExpAlert>,
}

/// One expected alert.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpAlert {
    pub exp_labels: BTreeMap<String, String>,
    pub exp_annotations: BTreeMap<String, String>,
}

/// The operator's PrometheusRule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PrometheusRule {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: RulesFile,
}

/// Namespaces a monitor looks in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NamespaceSelector {
    pub match_names: Vec<String>,
}

/// Where and how often to scrape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Endpoint {
    pub port: String,
    pub path: String,
    pub interval: String,
}

/// The operator's ServiceMonitor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceMonitor {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: ServiceMonitorSpec,
}

/// See [`ServiceMonitor`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceMonitorSpec {
    pub job_label: String,
    pub selector: LabelSelector,
    pub namespace_selector: NamespaceSelector,
    pub endpoints: Vec<Endpoint>,
}

/// The operator's PodMonitor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PodMonitor {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: PodMonitorSpec,
}

/// See [`PodMonitor`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PodMonitorSpec {
    pub job_label: String,
    pub selector: LabelSelector,
    pub namespace_selector: NamespaceSelector,
    pub pod_metrics_endpoints: Vec<Endpoint>,
}

/// Whether `selector` selects an object with `labels` (matchLabels and the `In`, `NotIn`,
/// `Exists` and `DoesNotExist` expressions).
pub fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_label = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let by_expr = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.clone().unwrap_or_default();
        let got = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => got.is_some_and(|v| values.contains(v)),
            "NotIn" => got.is_none_or(|v| !values.contains(v)),
            "Exists" => got.is_some(),
            "DoesNotExist" => got.is_none(),
            other => panic!("selector operator {other}"),
        }
    });
    by_label && by_expr
}
