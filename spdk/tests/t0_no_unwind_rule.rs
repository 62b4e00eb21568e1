//! T0 rule: no panic unwinds out of an `extern "C"` function that SPDK calls.
//!
//! A panic unwinding into C aborts the agent and every export on the node with it, so every
//! `extern "C" fn` defined under `spdk/src/` (the callbacks and trampolines handed to SPDK)
//! must start its body with a `no_unwind(` call (`liteio_spdk::runtime::no_unwind`), which
//! catches the panic and fails only the one request. A function whose body cannot panic may
//! instead be listed, with the reason, in [`ALLOWED`].
//!
//! The check reads the source text, so it runs without SPDK (the crate itself is empty
//! without the `link` feature). Comments, string and character literals are blanked out
//! before scanning; declarations in `extern "C" { … }` blocks and function-pointer types
//! (`extern "C" fn(…)`) are not definitions and are skipped.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

/// `(file under spdk/src, function name, why it needs no no_unwind)`.
const ALLOWED: &[(&str, &str, &str)] = &[(
    "io.rs",
    "ignore_event",
    "empty body: bdev events are ignored for descriptors that live for one I/O",
)];

/// One `extern "C" fn` definition.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Definition {
    name: String,
    line: usize,
    /// The body's text from just after `{`, with comments and literals blanked, trimmed.
    body: String,
}

/// `src` with comments replaced by spaces and the contents of string and character
/// literals replaced by `x` (newlines kept), so that byte offsets and line numbers stay the
/// same and no brace or keyword inside them is seen.
fn mask(src: &str) -> Vec<u8> {
    let b = src.as_bytes();
    let mut out = b.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize, with: u8| {
        for c in out.iter_mut().take(to).skip(from) {
            if *c != b'\n' {
                *c = with;
            }
        }
    };
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                let end = b[i..]
                    .iter()
                    .position(|c| *c == b'\n')
                    .map_or(b.len(), |p| i + p);
                blank(&mut out, i, end, b' ');
                i = end;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                // Block comments nest in Rust.
                let (mut depth, mut j) = (1, i + 2);
                while j < b.len() && depth > 0 {
                    if b[j] == b'/' && b.get(j + 1) == Some(&b'*') {
                        depth += 1;
                        j += 2;
                    } else if b[j] == b'*' && b.get(j + 1) == Some(&b'/') {
                        depth -= 1;
                        j += 2;
                    } else {
                        j += 1;
                    }
                }
                blank(&mut out, i, j, b' ');
                i = j;
            }
            b'r' if (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#'))
                && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')) =>
            {
                // Raw string r"…" / r#"…"#.
                let hashes = b[i + 1..].iter().take_while(|c| **c == b'#').count();
                let open = i + 1 + hashes;
                if b.get(open) != Some(&b'"') {
                    i += 1;
                    continue;
                }
                let mut close = vec![b'"'];
                close.extend(std::iter::repeat_n(b'#', hashes));
                let end = b[open + 1..]
                    .windows(close.len())
                    .position(|w| w == close.as_slice())
                    .map_or(b.len(), |p| open + 1 + p);
                blank(&mut out, open + 1, end, b'x');
                i = end + close.len();
            }
            b'"' => {
                let mut j = i + 1;
                while j < b.len() && b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                blank(&mut out, i + 1, j.min(b.len()), b'x');
                i = j + 1;
            }
            b'\'' => {
                // A character literal ('{', '\n', '\u{7b}') or a lifetime ('a).
                if b.get(i + 1) == Some(&b'\\') {
                    let end = b[i + 2..]
                        .iter()
                        .position(|c| *c == b'\'')
                        .map_or(b.len(), |p| i + 2 + p);
                    blank(&mut out, i + 1, end, b'x');
                    i = end + 1;
                } else if b.get(i + 2) == Some(&b'\'') {
                    blank(&mut out, i + 1, i + 2, b'x');
                    i += 3;
                } else {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    out
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Every `extern "C" fn <name>` definition with a body in `src`.
fn definitions(src: &str) -> Vec<Definition> {
    let m = mask(src);
    let orig = src.as_bytes();
    let needle = b"extern \"";
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(p) = m[i..].windows(needle.len()).position(|w| w == needle) {
        let at = i + p;
        i = at + needle.len();
        // The ABI string is masked; read it from the original text.
        if !orig[at..].starts_with(b"extern \"C\"") || (at > 0 && is_ident(m[at - 1])) {
            continue;
        }
        let mut j = at + b"extern \"C\"".len();
        while j < m.len() && m[j].is_ascii_whitespace() {
            j += 1;
        }
        if !m[j..].starts_with(b"fn") || m.get(j + 2).is_some_and(|c| is_ident(*c)) {
            continue; // `extern "C" { … }` block or `extern "C" crate`.
        }
        j += 2;
        while j < m.len() && m[j].is_ascii_whitespace() {
            j += 1;
        }
        let name_len = m[j..].iter().take_while(|c| is_ident(**c)).count();
        if name_len == 0 {
            continue; // A function-pointer type: `extern "C" fn(…)`.
        }
        let name = String::from_utf8_lossy(&m[j..j + name_len]).into_owned();
        let Some(q) = m[j..].iter().position(|c| *c == b'{' || *c == b';') else {
            continue;
        };
        let open = j + q;
        if m[open] == b';' {
            continue; // No body.
        }
        let mut depth = 0usize;
        let mut close = m.len();
        for (k, c) in m.iter().enumerate().skip(open) {
            match c {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = k;
                        break;
                    }
                }
                _ => {}
            }
        }
        let line = 1 + orig[..at].iter().filter(|c| **c == b'\n').count();
        let body = String::from_utf8_lossy(&m[open + 1..close])
            .trim()
            .to_string();
        out.push(Definition { name, line, body });
    }
    out
}

/// True when the body's first statement is a `no_unwind(` call (optionally by path).
fn starts_with_no_unwind(body: &str) -> bool {
    let call = body.split('(').next().unwrap_or_default().trim();
    let path_ok = call
        .strip_suffix("no_unwind")
        .is_some_and(|prefix| prefix.is_empty() || prefix.ends_with("::"));
    path_ok && body.contains('(')
}

/// The `.rs` files under `dir`, sorted.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Violations of the rule in the crate's sources, and the allow-list entries that matched.
fn check_sources(root: &Path) -> (Vec<String>, Vec<(String, String)>, usize) {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    let mut violations = Vec::new();
    let mut allowed_seen = Vec::new();
    let mut count = 0;
    for f in &files {
        let rel = f.strip_prefix(root).unwrap().to_string_lossy().into_owned();
        let src = std::fs::read_to_string(f).unwrap();
        for d in definitions(&src) {
            count += 1;
            if starts_with_no_unwind(&d.body) {
                continue;
            }
            if ALLOWED
                .iter()
                .any(|(file, name, _)| *file == rel && *name == d.name)
            {
                allowed_seen.push((rel.clone(), d.name.clone()));
                continue;
            }
            violations.push(format!(
                "spdk/src/{rel}:{}: extern \"C\" fn {} does not start with no_unwind(…)",
                d.line, d.name
            ));
        }
    }
    (violations, allowed_seen, count)
}

#[test]
fn every_extern_c_fn_in_spdk_src_starts_with_no_unwind() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (violations, allowed_seen, count) = check_sources(&root);
    println!("checked {count} extern \"C\" fn definitions under spdk/src");
    // The crate has well over a dozen trampolines; finding none means the scan is broken.
    assert!(
        count >= 10,
        "only {count} extern \"C\" fn definitions found"
    );
    assert!(
        violations.is_empty(),
        "a panic could unwind into SPDK (wrap the body in no_unwind, or list the function \
         in ALLOWED with the reason it cannot panic):\n{}",
        violations.join("\n")
    );
    // A stale allow-list entry would silently allow a future function of that name.
    for (file, name, _) in ALLOWED {
        assert!(
            allowed_seen.iter().any(|(f, n)| f == file && n == name),
            "ALLOWED lists {file}: {name}, which no longer exists or now uses no_unwind; remove it"
        );
    }
}

#[test]
fn the_scanner_finds_definitions_only() {
    let src = r####"
extern "C" {
    fn spdk_declared(x: i32) -> i32;
}
type Cb = Option<unsafe extern "C" fn(*mut c_void, i32)>;
// extern "C" fn commented_out() { panic!() }
/* extern "C" fn block_commented() { /* nested */ } */
const S: &str = "extern \"C\" fn in_a_string() {";
const R: &str = r#"extern "C" fn in_a_raw_string() { "#;
pub(crate) unsafe extern "C" fn good<H: 'static>(arg: *mut c_void) -> c_int {
    // A comment first is fine.
    no_unwind("good", || { let c = '{'; let _ = "}"; });
    0
}
extern "C" fn by_path(arg: *mut c_void) {
    crate::runtime::no_unwind("by_path", || {});
}
extern "C" fn bad(arg: *mut c_void) {
    let x = unsafe { Box::from_raw(arg) };
    no_unwind("bad", || drop(x));
}
extern "C" fn empty() {}
extern "C" fn not_a_call() { no_unwind_helper(); }
"####;
    let defs = definitions(src);
    let names: Vec<&str> = defs.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["good", "by_path", "bad", "empty", "not_a_call"]);
    let ok: Vec<bool> = defs
        .iter()
        .map(|d| starts_with_no_unwind(&d.body))
        .collect();
    assert_eq!(ok, [true, true, false, false, false]);
    assert_eq!(defs[2].line, 18);
}
