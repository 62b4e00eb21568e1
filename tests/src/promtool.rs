//! `promtool check metrics` (Debian's `prometheus` package) on a component's `/metrics`
//! text: Prometheus' own linter for names, units, types and help.

use std::io::Write;
use std::process::{Command, Stdio};

/// What `promtool check metrics` says about `text` (empty: nothing), or why it could not run
/// (`Err`: promtool is not installed; the caller prints it as its skip line).
pub fn check_metrics(text: &str) -> Result<String, String> {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("promtool not found ({e}); install Debian's prometheus package"))?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| "promtool has no stdin".to_string())?;
    let input = text.to_string();
    // Written from another thread: promtool may answer before it read everything.
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child
        .wait_with_output()
        .map_err(|e| format!("promtool check metrics: {e}"))?;
    writer
        .join()
        .map_err(|_| "writing to promtool panicked".to_string())?
        .map_err(|e| format!("writing to promtool: {e}"))?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // It exits 3 when it found problems (and says them), 1 when the text does not parse.
    match out.status.code() {
        Some(0 | 3) => Ok(said.trim().to_string()),
        _ => Ok(format!("promtool exited with {}: {said}", out.status)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn promtool_flags_a_counter_without_total_and_passes_a_good_one() {
        let bad = "# HELP blk_read_req Reads\n# TYPE blk_read_req counter\nblk_read_req 1\n";
        let good = "# HELP x_reads_total Reads\n# TYPE x_reads_total counter\nx_reads_total 1\n";
        match check_metrics(bad) {
            Err(why) => println!("SKIP promtool_flags_a_counter_without_total: {why}"),
            Ok(said) => {
                assert!(said.starts_with("blk_read_req "), "{said}");
                assert_eq!(check_metrics(good).unwrap(), "");
                let garbage = check_metrics("garbage {{{\n").unwrap();
                assert!(garbage.starts_with("promtool exited with"), "{garbage}");
            }
        }
    }
}
