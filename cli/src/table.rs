//! Plain-text layout: aligned columns for lists and indented `Key: value` blocks for
//! `describe`.

/// Separator between columns.
const GAP: &str = "   ";

/// A table with a header row; every column is as wide as its widest cell.
#[derive(Debug, Clone, Default)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers.
    pub fn new(headers: &[&str]) -> Self {
        Self {
            headers: headers.iter().map(|h| (*h).to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row; missing cells are blank, extra cells are dropped.
    pub fn row(&mut self, cells: Vec<String>) {
        let mut cells = cells;
        cells.resize(self.headers.len(), String::new());
        self.rows.push(cells);
    }

    /// Number of data rows.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// True without data rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table as lines, each ending in a newline, without trailing blanks.
    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in std::iter::once(&self.headers).chain(&self.rows) {
            let mut line = String::new();
            for (i, (cell, w)) in row.iter().zip(&widths).enumerate() {
                if i > 0 {
                    line.push_str(GAP);
                }
                line.push_str(cell);
                let pad = w.saturating_sub(cell.chars().count());
                line.extend(std::iter::repeat_n(' ', pad));
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// One line of a [`Fields`] block.
#[derive(Debug, Clone)]
enum Line {
    /// `key: value`, values of one indent level aligned.
    Field {
        indent: usize,
        key: String,
        value: String,
    },
    /// A section heading (`Export:`).
    Heading { indent: usize, key: String },
    /// Pre-rendered text (a nested table), indented.
    Text { indent: usize, text: String },
}

/// An indented `Key: value` document like `kubectl describe` prints.
#[derive(Debug, Clone, Default)]
pub struct Fields {
    lines: Vec<Line>,
}

impl Fields {
    /// An empty document.
    pub fn new() -> Self {
        Self::default()
    }

    /// `key: value` at `indent` (levels of two spaces).
    pub fn field(&mut self, indent: usize, key: &str, value: impl Into<String>) -> &mut Self {
        self.lines.push(Line::Field {
            indent,
            key: key.to_string(),
            value: value.into(),
        });
        self
    }

    /// A heading line `key:` at `indent`.
    pub fn heading(&mut self, indent: usize, key: &str) -> &mut Self {
        self.lines.push(Line::Heading {
            indent,
            key: key.to_string(),
        });
        self
    }

    /// Every line of `text` at `indent`.
    pub fn text(&mut self, indent: usize, text: impl Into<String>) -> &mut Self {
        self.lines.push(Line::Text {
            indent,
            text: text.into(),
        });
        self
    }

    /// Key/value pairs of a map under a heading; `<none>` when empty.
    pub fn map<'a>(
        &mut self,
        indent: usize,
        key: &str,
        pairs: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> &mut Self {
        let items: Vec<String> = pairs.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
        self.list(indent, key, items)
    }

    /// A list of values: inline when it has at most one item, else one per line.
    pub fn list(&mut self, indent: usize, key: &str, items: Vec<String>) -> &mut Self {
        match items.len() {
            0 => self.field(indent, key, "<none>"),
            1 => self.field(indent, key, items.into_iter().next().unwrap_or_default()),
            _ => {
                self.heading(indent, key);
                for item in items {
                    self.text(indent + 1, item);
                }
                self
            }
        }
    }

    /// The document as text.
    pub fn render(&self) -> String {
        // The values of every field of one indent level line up, like `kubectl describe`.
        let mut by_level: Vec<usize> = Vec::new();
        for line in &self.lines {
            if let Line::Field { indent, key, .. } = line {
                if by_level.len() <= *indent {
                    by_level.resize(indent + 1, 0);
                }
                by_level[*indent] = by_level[*indent].max(key.chars().count() + 1);
            }
        }
        let width: Vec<usize> = self
            .lines
            .iter()
            .map(|l| match l {
                Line::Field { indent, .. } => by_level.get(*indent).copied().unwrap_or(0),
                _ => 0,
            })
            .collect();
        let mut out = String::new();
        for (line, w) in self.lines.iter().zip(width) {
            match line {
                Line::Field { indent, key, value } => {
                    let label = format!("{key}:");
                    let text = format!("{}{label:<w$} {value}", "  ".repeat(*indent), w = w);
                    out.push_str(text.trim_end());
                }
                Line::Heading { indent, key } => {
                    out.push_str(&format!("{}{key}:", "  ".repeat(*indent)));
                }
                Line::Text { indent, text } => {
                    let pad = "  ".repeat(*indent);
                    let body: Vec<String> = text
                        .lines()
                        .map(|l| format!("{pad}{l}").trim_end().to_string())
                        .collect();
                    out.push_str(&body.join("\n"));
                }
            }
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_and_trailing_blanks_go() {
        let mut t = Table::new(&["NAME", "SIZE"]);
        t.row(vec!["a-long-name".into(), "1.0 GiB".into()]);
        t.row(vec!["b".into(), String::new()]);
        assert_eq!(t.render(), "NAME          SIZE\na-long-name   1.0 GiB\nb\n");
    }

    #[test]
    fn fields_align_per_run() {
        let mut f = Fields::new();
        f.field(0, "Name", "v1").field(0, "Namespace", "obnvmf");
        f.heading(0, "Export");
        f.field(1, "NQN", "nqn.x").field(1, "Serial", "abc");
        f.list(0, "Finalizers", vec![]);
        assert_eq!(
            f.render(),
            "Name:       v1\nNamespace:  obnvmf\nExport:\n  NQN:    nqn.x\n  Serial: abc\nFinalizers: <none>\n"
        );
    }
}
