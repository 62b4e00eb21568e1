//! Prometheus' text exposition format (version 0.0.4), as the disk-agent serves it at
//! `/metrics`: the samples, without the `# HELP` / `# TYPE` comments.

use std::collections::BTreeMap;

/// One sample: a series (name and labels) and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name.
    pub name: String,
    /// Labels by name.
    pub labels: BTreeMap<String, String>,
    /// The value (`NaN`, `+Inf` and `-Inf` included).
    pub value: f64,
}

impl Sample {
    /// The value of label `name`, empty when the sample has none.
    pub fn label(&self, name: &str) -> &str {
        self.labels.get(name).map(String::as_str).unwrap_or("")
    }
}

/// Why a text did not parse: the line (1-based) and what was wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ParseError {
    /// Line number, from 1.
    pub line: usize,
    /// What was wrong.
    pub message: String,
}

fn is_name_char(c: char, first: bool) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':' || (!first && c.is_ascii_digit())
}

/// The name at the start of `s` and the rest.
fn name(s: &str) -> (&str, &str) {
    let end = s
        .char_indices()
        .find(|&(i, c)| !is_name_char(c, i == 0))
        .map_or(s.len(), |(i, _)| i);
    s.split_at(end)
}

/// `{k="v",…}` at the start of `s`: the labels and the rest after `}`.
fn labels(s: &str) -> Result<(BTreeMap<String, String>, &str), String> {
    let mut out = BTreeMap::new();
    let mut rest = s
        .strip_prefix('{')
        .ok_or_else(|| "expected {".to_string())?;
    loop {
        rest = rest.trim_start();
        if let Some(r) = rest.strip_prefix('}') {
            return Ok((out, r));
        }
        let (key, r) = name(rest);
        if key.is_empty() {
            return Err(format!("expected a label name at {rest:?}"));
        }
        let r = r
            .trim_start()
            .strip_prefix('=')
            .ok_or_else(|| format!("expected = after label {key}"))?;
        let r = r
            .trim_start()
            .strip_prefix('"')
            .ok_or_else(|| format!("expected a quoted value for label {key}"))?;
        let mut value = String::new();
        let mut chars = r.char_indices();
        let end = loop {
            match chars.next() {
                None => return Err(format!("the value of label {key} is not closed")),
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c @ ('\\' | '"'))) => value.push(c),
                    Some((_, c)) => {
                        value.push('\\');
                        value.push(c);
                    }
                    None => return Err(format!("the value of label {key} is not closed")),
                },
                Some((_, c)) => value.push(c),
            }
        };
        out.insert(key.to_string(), value);
        rest = r[end + 1..].trim_start();
        if let Some(r) = rest.strip_prefix(',') {
            rest = r;
        } else if !rest.starts_with('}') {
            return Err(format!("expected , or }} after label {key}"));
        }
    }
}

fn value(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" | "Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => s.parse().map_err(|_| format!("{s:?} is not a number")),
    }
}

/// Every sample of `text`; comments and blank lines are skipped, a timestamp after the value
/// is ignored.
pub fn parse(text: &str) -> Result<Vec<Sample>, ParseError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let err = |message: String| ParseError {
            line: i + 1,
            message,
        };
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (metric, rest) = name(line);
        if metric.is_empty() {
            return Err(err(format!("expected a metric name at {line:?}")));
        }
        let (labels, rest) = if rest.starts_with('{') {
            labels(rest).map_err(err)?
        } else {
            (BTreeMap::new(), rest)
        };
        let v = rest
            .split_whitespace()
            .next()
            .ok_or_else(|| err(format!("{metric} has no value")))?;
        out.push(Sample {
            name: metric.to_string(),
            labels,
            value: value(v).map_err(err)?,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn samples_with_labels_escapes_and_special_values() {
        let text = "# HELP x_total X\n# TYPE x_total counter\n\
            x_total{node=\"n1\",volume=\"pvc-a\"} 42\n\
            y 1.5e3 1700000000000\n\
            z{a=\"q\\\"uote\\\\ and\\nline\", b = \"\" ,} +Inf\n\
            w NaN\n";
        let s = parse(text).unwrap();
        assert_eq!(s.len(), 4);
        assert_eq!(s[0].name, "x_total");
        assert_eq!(s[0].label("volume"), "pvc-a");
        assert_eq!(s[0].value, 42.0);
        assert_eq!(s[1].value, 1500.0);
        assert!(s[1].labels.is_empty());
        assert_eq!(s[2].label("a"), "q\"uote\\ and\nline");
        assert_eq!(s[2].label("b"), "");
        assert!(s[2].value.is_infinite());
        assert!(s[3].value.is_nan());
    }

    #[test]
    fn bad_lines_are_named() {
        for (text, line, says) in [
            ("ok 1\nbad{a=\"x\" 1\n", 2, "expected , or }"),
            ("x{a=\"open} 1\n", 1, "not closed"),
            ("x{a=b} 1\n", 1, "quoted value"),
            ("x\n", 1, "no value"),
            ("x one\n", 1, "not a number"),
            ("{a=\"b\"} 1\n", 1, "metric name"),
        ] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.message.contains(says), "{text:?}: {e}");
        }
    }
}
