//! `liteio-local --nodes N` (N > 1): the storage nodes in network namespaces, a demo volume
//! for each, staged and mounted by that node's CSI plugin; or, on the SPDK engine where the
//! kernel cannot mount NVMe/TCP, a remote volume for each node, reached from that node's
//! namespace with SPDK's userspace initiator.

use std::path::Path;

use anyhow::Context as _;
use liteio_local::cluster::{Cluster, ClusterOptions, Role};
use liteio_local::{Engine, datapath, demo};

use crate::{Args, say, wait_for_signal};

pub(crate) async fn run(args: &Args, bin_dir: &Path, engine: Engine) -> anyhow::Result<()> {
    let nodes = usize::try_from(args.nodes).context("--nodes")?;
    if let Some(why) = liteio_local::netns::unsupported() {
        anyhow::bail!("--nodes {nodes} cannot run here: {why}");
    }
    say(&format!(
        "starting LiteIO in {} ({engine} engine, {nodes} nodes, each in its own network namespace)",
        args.dir.display()
    ));
    let mut opts = ClusterOptions::new(nodes, engine);
    opts.pool_bytes = args.pool_size_gib << 30;
    let mut cluster = Cluster::start(&args.dir, bin_dir, opts).await?;
    say(&format!(
        "bridge {} at {}; test API server on {}:{}; controller and CSI controller ready",
        cluster.net.bridge,
        cluster.net.bridge_address(),
        cluster.net.bridge_address(),
        cluster.api_port
    ));
    for note in &cluster.pool_notes {
        say(note);
    }
    for k in 1..=nodes {
        let n = cluster.net.node(k)?;
        let nqn = std::fs::read_to_string(cluster.node_dir(k).join("hostnqn")).unwrap_or_default();
        say(&format!(
            "{}: namespace {}, address {}, host NQN {}; disk-agent and CSI node ready",
            cluster.node_name(k),
            n.netns,
            n.address,
            nqn.trim()
        ));
    }
    let result = if engine == Engine::Spdk && !datapath::kernel_has_nvme_tcp() {
        remote_demo_and_wait(&cluster, args, nodes).await
    } else {
        demo_and_wait(&mut cluster, args, nodes).await
    };
    say("stopping components and removing the namespaces");
    for undone in cluster.shutdown().await {
        say(&format!("cleanup: {undone}"));
    }
    if !args.keep {
        let _ = std::fs::remove_dir_all(&args.dir);
    }
    result
}

async fn demo_and_wait(cluster: &mut Cluster, args: &Args, nodes: usize) -> anyhow::Result<()> {
    let controller = liteio_csi::client::connect(&cluster.csi_controller_endpoint()).await?;
    let mut volumes = Vec::new();
    for k in 1..=nodes {
        // The CSI controller of the cluster, the node service of node k.
        let node = liteio_csi::client::connect(&cluster.csi_node_endpoint(k)).await?;
        let mut csi = liteio_csi::client::CsiClient {
            node: node.node,
            ..controller.clone()
        };
        let name = format!("pvc-demo-{}", cluster.node_name(k));
        let v = demo::provision(
            &mut csi,
            &cluster.node_dir(k),
            &cluster.node_name(k),
            &name,
            512 << 20,
        )
        .await
        .with_context(|| format!("{name} (log: {})", cluster.log(Role::CsiNode(k)).display()))?;
        let file = v.target.join("hello.txt");
        std::fs::write(&file, format!("hello from {}\n", cluster.node_name(k)))
            .with_context(|| format!("cannot write {}", file.display()))?;
        say(&format!(
            "{name} is on {}, mounted at {}",
            cluster.node_name(k),
            v.target.display()
        ));
        volumes.push((csi, v));
    }
    println!(
        "\nLiteIO is running on {nodes} nodes. Try:\n  kubectl --kubeconfig {kc} -n obnvmf get storagepools,antstorvolumes\n  \
         ip netns exec {ns} ip -br addr\nLogs: {dir}/*.log and {dir}/nodes/*/*.log. Press Ctrl-C to clean up and stop.\n",
        kc = cluster.kubeconfig().display(),
        ns = cluster
            .net
            .nodes
            .first()
            .map(|n| n.netns.as_str())
            .unwrap_or_default(),
        dir = cluster.dir.display(),
    );
    if !args.once {
        wait_for_signal().await?;
    }
    say("unpublishing, unstaging and deleting the demo volumes");
    for (csi, v) in &mut volumes {
        demo::remove(csi, v).await?;
    }
    say("demo volumes removed");
    Ok(())
}

/// For each node k, a volume it consumes placed on another node (`positionAdvice:
/// MustRemote`), reached from k's namespace as k's host NQN with `nvmf-check`.
async fn remote_demo_and_wait(cluster: &Cluster, args: &Args, nodes: usize) -> anyhow::Result<()> {
    let mut csi = liteio_csi::client::connect(&cluster.csi_controller_endpoint()).await?;
    let client = cluster.kube().await?;
    let mut created = Vec::new();
    let mut result = Ok(());
    for k in 1..=nodes {
        let consumer = cluster.node_name(k);
        let name = format!("pvc-demo-for-{consumer}");
        let v = match demo::create(
            &mut csi,
            &consumer,
            &name,
            256 << 20,
            &[("positionAdvice", "MustRemote")],
        )
        .await
        {
            Ok(v) => v,
            Err(e) => {
                result = Err(anyhow::Error::new(e).context(name));
                break;
            }
        };
        created.push(v.id.clone());
        if let Err(e) = show_remote(cluster, &client, k, &name).await {
            result = Err(e);
            break;
        }
    }
    if result.is_ok() {
        println!(
            "\nLiteIO is running on {nodes} nodes with its SPDK engine. Try:\n  kubectl --kubeconfig {kc} -n obnvmf get storagepools,antstorvolumes -o wide\n\
             Logs: {dir}/*.log and {dir}/nodes/*/*.log. Press Ctrl-C to clean up and stop.\n",
            kc = cluster.kubeconfig().display(),
            dir = cluster.dir.display(),
        );
        if !args.once {
            wait_for_signal().await?;
        }
    }
    say("deleting the demo volumes");
    for id in created {
        demo::delete(&mut csi, &id).await?;
    }
    say("demo volumes removed");
    result
}

async fn show_remote(
    cluster: &Cluster,
    client: &kube::Client,
    k: usize,
    name: &str,
) -> anyhow::Result<()> {
    let t = datapath::wait_exported(client, name, 120, &cluster.dir).await?;
    let on = (1..=cluster.opts.nodes)
        .find(|&n| {
            cluster
                .node_address(n)
                .is_ok_and(|a| a.to_string() == t.address)
        })
        .map_or_else(|| t.address.clone(), |n| cluster.node_name(n));
    say(&format!(
        "{name}: stored on {on}, exported at {}:{} for {} only; connecting from {}'s namespace",
        t.address,
        t.svc_id,
        cluster.node_name(k),
        cluster.node_name(k)
    ));
    let hostnqn = cluster.node_dir(k).join("hostnqn");
    // The keys kubelet would hand node k's CSI node (the node-stage secret).
    let keys = datapath::keys_file(client, name, &cluster.node_dir(k)).await?;
    let cmd = datapath::check_command(
        &cluster.bin_dir,
        &cluster.net.exec_prefix(k)?,
        &t,
        datapath::HostNqn::File(&hostnqn),
        keys.as_ref(),
        &["--check-bytes", "4194304", "--random-seconds", "2"],
    );
    let out = datapath::run_check(cmd, std::time::Duration::from_secs(120)).await?;
    for l in &out.lines {
        println!("    {l}");
    }
    if out.code != 0 {
        anyhow::bail!(
            "nvmf-check from {} failed (exit {}): {}\n{}",
            cluster.node_name(k),
            out.code,
            out.result,
            out.stderr
        );
    }
    Ok(())
}
