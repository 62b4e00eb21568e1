//! CPU time of threads from `/proc`.

use std::path::Path;

/// Parses `/proc/<pid>/task/<tid>/stat` into (utime, stime) clock ticks. The command name
/// (field 2) is in parentheses and may hold spaces or parentheses, so fields are counted
/// after the last `)`.
pub fn parse_task_stat(text: &str) -> Option<(u64, u64)> {
    let (_, rest) = text.rsplit_once(')')?;
    let mut f = rest.split_ascii_whitespace();
    // After `)`: state (field 3) … utime is field 14, stime field 15.
    let utime = f.nth(11)?.parse().ok()?;
    let stime = f.next()?.parse().ok()?;
    Some((utime, stime))
}

/// CPU seconds (user + system) of the threads under `task_dir` (`/proc/self/task`) whose
/// name starts with `prefix`, by name, sorted. Threads that end meanwhile are skipped.
pub fn thread_cpu_seconds(task_dir: &Path, prefix: &str) -> Vec<(String, f64)> {
    let Ok(entries) = std::fs::read_dir(task_dir) else {
        return Vec::new();
    };
    let hz = rustix::param::clock_ticks_per_second().max(1) as f64;
    let mut out: Vec<(String, f64)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            let comm = comm.trim_end_matches('\n');
            if !comm.starts_with(prefix) {
                return None;
            }
            let (u, s) = parse_task_stat(&std::fs::read_to_string(e.path().join("stat")).ok()?)?;
            Some((comm.to_string(), u.saturating_add(s) as f64 / hz))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn task_stat_fields_after_the_command_name() {
        // utime = 14th field, stime = 15th; the name holds a space and a parenthesis.
        let line =
            "4242 (reactor_0 (x)) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 31 0 0 20 0 3 0 100 0 0";
        assert_eq!(parse_task_stat(line), Some((250, 31)));
        assert_eq!(parse_task_stat("4242 (x) S 1"), None);
        assert_eq!(parse_task_stat("no parenthesis"), None);
    }
    #[test]
    fn thread_cpu_of_this_process() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("101");
        std::fs::create_dir(&t).unwrap();
        std::fs::write(t.join("comm"), "reactor_1\n").unwrap();
        std::fs::write(
            t.join("stat"),
            "101 (reactor_1) S 1 1 1 0 -1 0 0 0 0 0 300 100 0 0 20 0 1 0 1 0 0",
        )
        .unwrap();
        let o = dir.path().join("102");
        std::fs::create_dir(&o).unwrap();
        std::fs::write(o.join("comm"), "tokio-runtime-w\n").unwrap();
        let hz = rustix::param::clock_ticks_per_second() as f64;
        assert_eq!(
            thread_cpu_seconds(dir.path(), "reactor_"),
            vec![("reactor_1".to_string(), 400.0 / hz)]
        );
        // The real /proc parses too (this test's threads are not reactors).
        assert!(thread_cpu_seconds(Path::new("/proc/self/task"), "reactor_").is_empty());
        assert!(!thread_cpu_seconds(Path::new("/proc/self/task"), "").is_empty());
    }
}
