//! Kubernetes label selectors: the string form of the `obnvmf/node-label-selector` and
//! `obnvmf/pool-label-selector` annotations (`a=b,c!=d,e in (x,y),f notin (z),g,!h`) and
//! the `NodeSelectorRequirement` form of node affinity and `lockSchedConfig`.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm};

/// Why a selector could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("selector {input:?} at byte {pos}: {reason}")]
pub struct SelectorError {
    /// The whole input.
    pub input: String,
    /// Byte offset of the problem.
    pub pos: usize,
    /// What was expected.
    pub reason: String,
}

/// The test one requirement applies to a label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `key=value` / `key==value`.
    Eq(String),
    /// `key!=value` (also true when the key is absent).
    NotEq(String),
    /// `key in (a,b)`.
    In(BTreeSet<String>),
    /// `key notin (a,b)` (also true when the key is absent).
    NotIn(BTreeSet<String>),
    /// `key`.
    Exists,
    /// `!key`.
    DoesNotExist,
    /// Node selector `Gt`: the value is an integer greater than this.
    Gt(i64),
    /// Node selector `Lt`: the value is an integer less than this.
    Lt(i64),
}

/// One requirement over one label key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// Label key.
    pub key: String,
    /// Test.
    pub op: Op,
}

impl Requirement {
    /// True when `labels` satisfy the requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let v = labels.get(&self.key);
        match &self.op {
            Op::Eq(x) => v == Some(x),
            Op::NotEq(x) => v != Some(x),
            Op::In(set) => v.is_some_and(|v| set.contains(v)),
            Op::NotIn(set) => v.is_none_or(|v| !set.contains(v)),
            Op::Exists => v.is_some(),
            Op::DoesNotExist => v.is_none(),
            Op::Gt(n) => v
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v > *n),
            Op::Lt(n) => v
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v < *n),
        }
    }

    /// Converts a `NodeSelectorRequirement` (operators In, NotIn, Exists, DoesNotExist, Gt,
    /// Lt).
    pub fn from_node_selector(r: &NodeSelectorRequirement) -> Result<Self, SelectorError> {
        let err = |reason: String| SelectorError {
            input: format!("{} {} {:?}", r.key, r.operator, r.values),
            pos: 0,
            reason,
        };
        if r.key.is_empty() || !r.key.chars().all(is_key_char) {
            return Err(err(format!("{:?} is not a label key", r.key)));
        }
        let values: Vec<String> = r.values.clone().unwrap_or_default();
        let single_int = || -> Result<i64, SelectorError> {
            match values.as_slice() {
                [v] => v
                    .parse::<i64>()
                    .map_err(|_| err(format!("{v:?} is not an integer"))),
                _ => Err(err(format!(
                    "{} needs exactly one integer value",
                    r.operator
                ))),
            }
        };
        let op = match r.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => {
                return Err(err(format!("{} needs at least one value", r.operator)));
            }
            "In" => Op::In(values.iter().cloned().collect()),
            "NotIn" => Op::NotIn(values.iter().cloned().collect()),
            "Exists" | "DoesNotExist" if !values.is_empty() => {
                return Err(err(format!("{} takes no values", r.operator)));
            }
            "Exists" => Op::Exists,
            "DoesNotExist" => Op::DoesNotExist,
            "Gt" => Op::Gt(single_int()?),
            "Lt" => Op::Lt(single_int()?),
            other => {
                return Err(err(format!(
                    "operator {other:?} is not one of In, NotIn, Exists, DoesNotExist, Gt, Lt"
                )));
            }
        };
        Ok(Self {
            key: r.key.clone(),
            op,
        })
    }
}

/// A conjunction of requirements; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector(pub Vec<Requirement>);

impl Selector {
    /// True when `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| r.matches(labels))
    }

    /// Parses the string form.
    pub fn parse(input: &str) -> Result<Self, SelectorError> {
        Parser {
            input,
            bytes: input.as_bytes(),
            pos: 0,
        }
        .parse()
    }
}

fn is_key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/')
}

fn is_value_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

struct Parser<'a> {
    input: &'a str,
    bytes: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn err(&self, reason: impl Into<String>) -> SelectorError {
        SelectorError {
            input: self.input.to_string(),
            pos: self.pos,
            reason: reason.into(),
        }
    }

    fn skip_ws(&mut self) {
        while self.pos < self.bytes.len() && self.bytes[self.pos].is_ascii_whitespace() {
            self.pos += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn eat(&mut self, s: &str) -> bool {
        if self.input[self.pos..].starts_with(s) {
            self.pos += s.len();
            true
        } else {
            false
        }
    }

    fn word(&mut self, pred: fn(char) -> bool) -> &str {
        let start = self.pos;
        while let Some(b) = self.peek() {
            if pred(b as char) {
                self.pos += 1;
            } else {
                break;
            }
        }
        &self.input[start..self.pos]
    }

    fn parse(mut self) -> Result<Selector, SelectorError> {
        let mut reqs = Vec::new();
        self.skip_ws();
        if self.peek().is_none() {
            return Ok(Selector(reqs));
        }
        loop {
            reqs.push(self.requirement()?);
            self.skip_ws();
            match self.peek() {
                None => break,
                Some(b',') => {
                    self.pos += 1;
                }
                Some(_) => return Err(self.err("expected ',' or the end")),
            }
        }
        Ok(Selector(reqs))
    }

    fn key(&mut self) -> Result<String, SelectorError> {
        self.skip_ws();
        let k = self.word(is_key_char).to_string();
        if k.is_empty() {
            return Err(self.err("expected a label key"));
        }
        Ok(k)
    }

    fn value(&mut self) -> String {
        self.skip_ws();
        self.word(is_value_char).to_string()
    }

    fn set(&mut self) -> Result<BTreeSet<String>, SelectorError> {
        self.skip_ws();
        if !self.eat("(") {
            return Err(self.err("expected '('"));
        }
        let mut set = BTreeSet::new();
        loop {
            let v = self.value();
            set.insert(v);
            self.skip_ws();
            if self.eat(",") {
                continue;
            }
            if self.eat(")") {
                break;
            }
            return Err(self.err("expected ',' or ')' in a value set"));
        }
        Ok(set)
    }

    fn requirement(&mut self) -> Result<Requirement, SelectorError> {
        self.skip_ws();
        if self.eat("!") {
            let key = self.key()?;
            return Ok(Requirement {
                key,
                op: Op::DoesNotExist,
            });
        }
        let key = self.key()?;
        self.skip_ws();
        let op = if self.eat("!=") {
            Op::NotEq(self.value())
        } else if self.eat("==") || self.eat("=") {
            Op::Eq(self.value())
        } else if matches!(self.peek(), None | Some(b',')) {
            Op::Exists
        } else {
            let save = self.pos;
            let w = self.word(|c| c.is_ascii_alphabetic()).to_string();
            match w.as_str() {
                "in" => Op::In(self.set()?),
                "notin" => Op::NotIn(self.set()?),
                _ => {
                    self.pos = save;
                    return Err(self.err("expected =, ==, !=, in, notin, ',' or the end"));
                }
            }
        };
        Ok(Requirement { key, op })
    }
}

/// True when `labels` (and the object `name`, for `matchFields` on `metadata.name`) satisfy
/// any of the terms; an empty list of terms matches nothing, as in Kubernetes.
pub fn match_terms(
    terms: &[NodeSelectorTerm],
    name: &str,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    let mut fields = BTreeMap::new();
    fields.insert("metadata.name".to_string(), name.to_string());
    for term in terms {
        let exprs = term.match_expressions.as_deref().unwrap_or_default();
        let flds = term.match_fields.as_deref().unwrap_or_default();
        if exprs.is_empty() && flds.is_empty() {
            continue;
        }
        let mut ok = true;
        for e in exprs {
            if !Requirement::from_node_selector(e)?.matches(labels) {
                ok = false;
            }
        }
        for f in flds {
            if !Requirement::from_node_selector(f)?.matches(&fields) {
                ok = false;
            }
        }
        if ok {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_every_form() {
        let s = Selector::parse("a=b,c!=d,e in (x,y),f notin (z),g,!h").unwrap();
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(
            s.0,
            vec![
                Requirement {
                    key: "a".into(),
                    op: Op::Eq("b".into())
                },
                Requirement {
                    key: "c".into(),
                    op: Op::NotEq("d".into())
                },
                Requirement {
                    key: "e".into(),
                    op: Op::In(set(&["x", "y"]))
                },
                Requirement {
                    key: "f".into(),
                    op: Op::NotIn(set(&["z"]))
                },
                Requirement {
                    key: "g".into(),
                    op: Op::Exists
                },
                Requirement {
                    key: "h".into(),
                    op: Op::DoesNotExist
                },
            ]
        );
    }

    #[test]
    fn matching_table() {
        let l = labels(&[("obnvmf/node-sn", "node-1"), ("rack", "r1"), ("zone", "z")]);
        let cases: &[(&str, bool)] = &[
            ("", true),
            ("obnvmf/node-sn=node-1", true),
            ("obnvmf/node-sn==node-1", true),
            ("obnvmf/node-sn=node-2", false),
            ("obnvmf/node-sn!=node-2", true),
            ("obnvmf/node-sn!=node-1", false),
            ("missing!=x", true),
            ("rack in (r1, r2)", true),
            ("rack in (r2)", false),
            ("rack notin (r2)", true),
            ("missing notin (r2)", true),
            ("rack notin (r1)", false),
            ("zone", true),
            ("missing", false),
            ("!missing", true),
            ("!zone", false),
            (" rack = r1 , zone ", true),
            ("rack=r1,zone=y", false),
            ("empty=", false),
        ];
        for (sel, want) in cases {
            let s = Selector::parse(sel).unwrap();
            assert_eq!(s.matches(&l), *want, "{sel:?}");
        }
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            "a=b,",
            ",a",
            "a in x",
            "a in (x",
            "a near (x)",
            "a=b c=d",
            "=b",
            "!",
            "a notin (x,",
            "a$=b",
        ] {
            let e = Selector::parse(bad);
            assert!(e.is_err(), "{bad:?} must be rejected, got {e:?}");
        }
    }

    #[test]
    fn node_selector_requirements() {
        let l = labels(&[("cpu", "8"), ("rack", "r1")]);
        let req = |k: &str, op: &str, v: &[&str]| NodeSelectorRequirement {
            key: k.into(),
            operator: op.into(),
            values: if v.is_empty() {
                None
            } else {
                Some(v.iter().map(|s| s.to_string()).collect())
            },
        };
        let cases = [
            (req("rack", "In", &["r1"]), true),
            (req("rack", "NotIn", &["r1"]), false),
            (req("rack", "Exists", &[]), true),
            (req("rack", "DoesNotExist", &[]), false),
            (req("cpu", "Gt", &["4"]), true),
            (req("cpu", "Lt", &["4"]), false),
            (req("rack", "Gt", &["4"]), false),
        ];
        for (r, want) in cases {
            assert_eq!(
                Requirement::from_node_selector(&r).unwrap().matches(&l),
                want,
                "{r:?}"
            );
        }
        for bad in [
            req("rack", "In", &[]),
            req("rack", "Exists", &["x"]),
            req("cpu", "Gt", &["x"]),
            req("cpu", "Gt", &["1", "2"]),
            req("rack", "Like", &["r"]),
            req("", "Exists", &[]),
        ] {
            assert!(Requirement::from_node_selector(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn terms_are_ored_and_fields_see_the_name() {
        let term = |k: &str, v: &str| NodeSelectorTerm {
            match_expressions: Some(vec![NodeSelectorRequirement {
                key: k.into(),
                operator: "In".into(),
                values: Some(vec![v.into()]),
            }]),
            match_fields: None,
        };
        let l = labels(&[("rack", "r1")]);
        assert!(match_terms(&[term("rack", "r2"), term("rack", "r1")], "n", &l).unwrap());
        assert!(!match_terms(&[term("rack", "r2")], "n", &l).unwrap());
        assert!(!match_terms(&[], "n", &l).unwrap());
        let by_name = NodeSelectorTerm {
            match_expressions: None,
            match_fields: Some(vec![NodeSelectorRequirement {
                key: "metadata.name".into(),
                operator: "In".into(),
                values: Some(vec!["node-1".into()]),
            }]),
        };
        assert!(match_terms(std::slice::from_ref(&by_name), "node-1", &l).unwrap());
        assert!(!match_terms(&[by_name], "node-2", &l).unwrap());
    }
}
