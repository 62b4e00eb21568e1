//! Writes LiteIO's CRDs to `deploy/crds/` (or checks that the files there are current).
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: crdgen [--check] [DIR]\n\
Writes one YAML file per LiteIO CRD into DIR (default: deploy/crds of the workspace).\n\
--check  write nothing; exit 1 if any file in DIR differs from the generated CRDs.";

fn main() -> ExitCode {
    let mut check = false;
    let mut dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--check" => check = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            a if a.starts_with('-') => {
                eprintln!("crdgen: unknown option {a}\n{USAGE}");
                return ExitCode::from(2);
            }
            a => dir = PathBuf::from(a),
        }
    }
    let files = match liteio_api::crd::files() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("crdgen: cannot render CRDs: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut stale = 0;
    for (name, body) in files {
        let path = dir.join(&name);
        if check {
            if std::fs::read_to_string(&path).ok().as_deref() != Some(body.as_str()) {
                eprintln!(
                    "crdgen: {} is stale; run `cargo run -p liteio-api --bin crdgen`",
                    path.display()
                );
                stale += 1;
            }
            continue;
        }
        if let Err(e) = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, body)) {
            eprintln!("crdgen: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        println!("wrote {}", path.display());
    }
    if stale > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
