//! Helpers shared by the manifest tests: finding and reading every YAML document under
//! deploy/.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod prometheus;

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

/// One YAML document of a file.
#[derive(Debug, Clone)]
pub struct Doc {
    /// File, relative to deploy/.
    pub file: String,
    /// Index of the document in the file.
    pub index: usize,
    /// The document as JSON.
    pub value: Value,
}

impl Doc {
    /// `file#index kind/name` for messages.
    pub fn what(&self) -> String {
        format!(
            "{}#{} {}/{}",
            self.file,
            self.index,
            self.kind(),
            self.value
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("?")
        )
    }

    /// `kind`, empty when absent.
    pub fn kind(&self) -> &str {
        self.value.get("kind").and_then(Value::as_str).unwrap_or("")
    }

    /// `apiVersion`, empty when absent.
    pub fn api_version(&self) -> &str {
        self.value
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    /// `metadata.name`, empty when absent.
    pub fn name(&self) -> &str {
        self.value
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
    }
}

/// The workspace's deploy/ directory.
pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// Every `*.yaml` / `*.yml` file under `dir`, sorted.
pub fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml")
            ) {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Every non-empty document of `path`.
pub fn read_docs(path: &Path) -> Vec<Doc> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let rel = path
        .strip_prefix(deploy_dir())
        .unwrap_or(path)
        .display()
        .to_string();
    let mut docs = Vec::new();
    for (index, de) in serde_yaml::Deserializer::from_str(&text).enumerate() {
        let yaml = serde_yaml::Value::deserialize(de)
            .unwrap_or_else(|e| panic!("{rel}#{index}: not YAML: {e}"));
        if yaml.is_null() {
            continue;
        }
        let value = serde_json::to_value(&yaml)
            .unwrap_or_else(|e| panic!("{rel}#{index}: not JSON-compatible: {e}"));
        docs.push(Doc {
            file: rel.clone(),
            index,
            value,
        });
    }
    docs
}

/// Every document under deploy/ (or a sub-directory of it).
pub fn docs_under(sub: &str) -> Vec<Doc> {
    let dir = deploy_dir().join(sub);
    yaml_files(&dir).iter().flat_map(|p| read_docs(p)).collect()
}
