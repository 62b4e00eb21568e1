//! The documents hold together: every relative link in the top-level README, in the docs
//! index and in every page under `docs/` points at a file that exists (so every document the
//! README names exists), and every `docs/*.md` is reachable from the index
//! (`docs/README.md`), which the README links to.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// The relative targets a Markdown text names: `[text](target)` links (without their
/// `#anchor`) and `` `docs/….md` `` paths in code spans, which the README uses as references
/// too. Absolute URLs and pure anchors are left out.
fn targets(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        let Some(end) = rest.find(')') else { break };
        let t = rest[..end].split('#').next().unwrap_or_default().trim();
        if !t.is_empty() && !t.contains("://") && !t.starts_with("mailto:") {
            out.push(t.to_string());
        }
        rest = &rest[end..];
    }
    for span in text.split('`').skip(1).step_by(2) {
        if span.starts_with("docs/") && span.ends_with(".md") && !span.contains(char::is_whitespace)
        {
            out.push(span.to_string());
        }
    }
    out
}

/// Each relative link of `file` that does not resolve, as `file: target`.
fn broken(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap();
    let dir = file.parent().unwrap();
    targets(&text)
        .into_iter()
        // A link is relative to its file; a code span names a path from the repository's root.
        .filter(|t| !dir.join(t).exists() && !repo_root().join(t).exists())
        .map(|t| format!("{}: {t}", file.display()))
        .collect()
}

fn docs() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(repo_root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    out.sort();
    out
}

#[test]
fn every_relative_link_of_the_readme_and_the_docs_resolves() {
    let mut files = vec![repo_root().join("README.md")];
    files.extend(docs());
    assert!(files.len() > 2, "no docs found under {:?}", repo_root());
    let bad: Vec<String> = files.iter().flat_map(|f| broken(f)).collect();
    assert!(
        bad.is_empty(),
        "links to files that do not exist:\n{}",
        bad.join("\n")
    );
}

#[test]
fn every_doc_is_reachable_from_the_index_and_the_index_from_the_readme() {
    let root = repo_root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    assert!(
        targets(&readme).iter().any(|t| t == "docs/README.md"),
        "the README does not link to the docs index docs/README.md"
    );
    // Pages reachable from the index through links between docs (not through the README or
    // a crate's, which link to many docs themselves).
    let docs_dir = root.join("docs").canonicalize().unwrap();
    let mut seen = BTreeSet::new();
    let mut todo = vec![root.join("docs/README.md")];
    while let Some(f) = todo.pop() {
        let Ok(f) = f.canonicalize() else { continue };
        if f.parent() != Some(docs_dir.as_path()) || !seen.insert(f.clone()) {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        for t in targets(&text) {
            let p = f.parent().unwrap().join(&t);
            if p.extension().is_some_and(|e| e == "md") && p.exists() {
                todo.push(p);
            }
        }
    }
    let unreachable: Vec<String> = docs()
        .into_iter()
        .filter(|d| !seen.contains(&d.canonicalize().unwrap()))
        .map(|d| d.display().to_string())
        .collect();
    assert!(
        unreachable.is_empty(),
        "docs not reachable from docs/README.md: {unreachable:?}"
    );
}

#[test]
fn link_targets_are_read_as_written() {
    let t = targets("see [a](a.md#x), [web](https://x.y/z.md), `docs/b.md` and [c](../c/)");
    assert_eq!(t, ["a.md", "../c/", "docs/b.md"]);
}
