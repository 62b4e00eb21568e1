//! `disk-agent`: the LiteIO storage-node agent.
#![forbid(unsafe_code)]

use clap::Parser;

/// LiteIO disk-agent: pools this node's disks and serves volumes over NVMe/TCP.
#[derive(Parser, Debug)]
#[command(name = "disk-agent", version)]
struct Args {
    /// Name of this node (the StoragePool name).
    #[arg(long, env = "NODE_ID")]
    node_id: Option<String>,
}

fn main() {
    let args = Args::parse();
    eprintln!(
        "disk-agent: node {:?}: the agent's control loop is not built yet",
        args.node_id
    );
    std::process::exit(1);
}
