//! This node's NVMe host NQN, the name targets allow-list.

use std::io;
use std::path::{Path, PathBuf};

use liteio_api::naming;

/// Where nvme-cli and LiteIO keep it.
pub const DEFAULT_PATH: &str = "/etc/nvme/hostnqn";
/// Longest NQN the NVMe specification allows (bytes).
pub const NQN_MAX: usize = 223;

/// Why the host NQN could not be had.
#[derive(Debug, thiserror::Error)]
pub enum HostNqnError {
    /// The file exists but cannot be read (it is not overwritten).
    #[error("cannot read the host NQN from {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The file holds something that is not an NQN (it is not overwritten).
    #[error(
        "{path} holds {found:?}, which is not an NVMe qualified name (nqn.…, at most 223 bytes)"
    )]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Its first line.
        found: String,
    },
    /// A generated NQN could not be written.
    #[error("cannot write the generated host NQN to {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// Whether `s` looks like an NQN: `nqn.` first, printable ASCII, at most [`NQN_MAX`] bytes.
pub fn is_nqn(s: &str) -> bool {
    s.starts_with("nqn.") && s.len() <= NQN_MAX && s.bytes().all(|b| b.is_ascii_graphic())
}

/// This node's host NQN: the first non-empty line of `path`, trimmed. When the file is
/// missing or blank, `nqn.2021-03.com.alipay.host:uuid:<node>` is generated and written
/// there (as LiteIO does). A file that cannot be read or holds no NQN is an error and is left
/// as it is: overwriting it would change the node's identity for every target.
pub fn load(path: &Path, node: &str) -> Result<String, HostNqnError> {
    match std::fs::read_to_string(path) {
        Ok(s) => {
            if let Some(line) = s.lines().map(str::trim).find(|l| !l.is_empty()) {
                return if is_nqn(line) {
                    Ok(line.to_string())
                } else {
                    Err(HostNqnError::Invalid {
                        path: path.into(),
                        found: line.chars().take(80).collect(),
                    })
                };
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(HostNqnError::Read {
                path: path.into(),
                source,
            });
        }
    }
    let nqn = naming::host_nqn(node);
    path.parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(path, format!("{nqn}\n")))
        .map_err(|source| HostNqnError::Write {
            path: path.into(),
            source,
        })?;
    tracing::info!(path = %path.display(), %nqn, "generated this node's host NQN");
    Ok(nqn)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn read_generated_and_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("etc/nvme/hostnqn");
        let generated = load(&p, "node-1").unwrap();
        assert_eq!(generated, naming::host_nqn("node-1"));
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            format!("{generated}\n")
        );
        // Read back, whatever surrounds the first line.
        std::fs::write(
            &p,
            "\n  nqn.2014-08.org.nvmexpress:uuid:abc  \nsecond line\n",
        )
        .unwrap();
        assert_eq!(
            load(&p, "node-1").unwrap(),
            "nqn.2014-08.org.nvmexpress:uuid:abc"
        );
        // A blank file is generated anew.
        std::fs::write(&p, "  \n").unwrap();
        assert_eq!(load(&p, "n2").unwrap(), naming::host_nqn("n2"));
        // Garbage is refused and kept.
        std::fs::write(&p, "not an nqn\n").unwrap();
        let e = load(&p, "n2").unwrap_err();
        assert!(e.to_string().contains("not an NVMe qualified name"), "{e}");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "not an nqn\n");
        // A directory in the way cannot be read: an error, nothing written.
        let dir = d.path().join("isdir");
        std::fs::create_dir(&dir).unwrap();
        assert!(matches!(load(&dir, "n"), Err(HostNqnError::Read { .. })));
    }
}
