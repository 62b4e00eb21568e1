//! `csictl`: manual CSI calls against a driver's unix socket, for operators doing repairs.

use std::collections::HashMap;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use liteio_csi::client;
use liteio_csi::csi::volume_capability::access_mode::Mode;
use liteio_csi::csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use liteio_csi::csi::*;
use serde_json::{Value, json};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OutputFormat {
    Text,
    Json,
}

/// Manual CSI calls against LiteIO's driver (antstor.csi.alipay.com).
#[derive(Debug, Parser)]
#[command(
    version,
    about,
    after_help = "Examples:
  csictl --endpoint unix:///var/lib/kubelet/plugins/antstor.csi.alipay.com/csi.sock identity
  csictl create-volume pvc-test --size 1Gi --param fsType=ext4
  csictl stage 0b9d1f3c-... --staging-target-path /mnt/staging/pvc-test
  csictl publish 0b9d1f3c-... --staging-target-path /mnt/staging/pvc-test --target-path /mnt/pod/pvc-test
  csictl stats 0b9d1f3c-... --path /mnt/pod/pvc-test -o json
  csictl unpublish 0b9d1f3c-... --target-path /mnt/pod/pvc-test
  csictl unstage 0b9d1f3c-... --staging-target-path /mnt/staging/pvc-test"
)]
struct Args {
    /// The driver's socket.
    #[arg(
        long,
        short = 's',
        env = "CSI_ENDPOINT",
        default_value = "unix:///csi/csi.sock"
    )]
    endpoint: String,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value = "text", global = true)]
    output: OutputFormat,
    /// Seconds to wait for each call.
    #[arg(long, default_value_t = 60, global = true)]
    timeout: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Args)]
struct CapArgs {
    /// Raw block access instead of a filesystem.
    #[arg(long)]
    block: bool,
    /// Filesystem type for filesystem access (default: the volume's).
    #[arg(long, default_value = "")]
    fs_type: String,
    /// Mount flags, comma separated.
    #[arg(long, value_delimiter = ',')]
    mount_flags: Vec<String>,
}

impl CapArgs {
    fn capability(&self) -> VolumeCapability {
        VolumeCapability {
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
            access_type: Some(if self.block {
                AccessType::Block(BlockVolume {})
            } else {
                AccessType::Mount(MountVolume {
                    fs_type: self.fs_type.clone(),
                    mount_flags: self.mount_flags.clone(),
                    volume_mount_group: String::new(),
                })
            }),
        }
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Plug-in name, version, capabilities and readiness.
    Identity,
    /// Create a volume (an AntstorVolume) and wait for it to be scheduled.
    CreateVolume {
        /// Volume (PV) name.
        name: String,
        /// Size (`1Gi`, `500M`, bytes).
        #[arg(long, default_value = "1Gi")]
        size: String,
        /// StorageClass-style parameter `key=value` (repeatable).
        #[arg(long = "param", value_parser = parse_kv)]
        params: Vec<(String, String)>,
        /// Clone from this snapshot id.
        #[arg(long)]
        from_snapshot: Option<String>,
        #[command(flatten)]
        cap: CapArgs,
    },
    /// Delete a volume by id.
    DeleteVolume {
        /// Volume id (uuid).
        volume_id: String,
    },
    /// List volumes (paged).
    ListVolumes {
        /// Entries per page (0 = all).
        #[arg(long, default_value_t = 0)]
        max_entries: i32,
        /// Token from a previous page.
        #[arg(long, default_value = "")]
        starting_token: String,
    },
    /// Grow a volume (controller, then the filesystem when --path is given).
    Expand {
        /// Volume id.
        volume_id: String,
        /// New size.
        #[arg(long)]
        size: String,
        /// Published or staged path whose filesystem to grow (node call).
        #[arg(long)]
        path: Option<String>,
        /// Skip the controller call (node only).
        #[arg(long)]
        node_only: bool,
    },
    /// Attach, format and mount a volume at its staging path.
    Stage {
        /// Volume id.
        volume_id: String,
        /// Staging path.
        #[arg(long)]
        staging_target_path: String,
        /// Volume context `key=value` (repeatable).
        #[arg(long = "vol-context", value_parser = parse_kv)]
        context: Vec<(String, String)>,
        #[command(flatten)]
        cap: CapArgs,
    },
    /// Unmount and detach a staged volume.
    Unstage {
        /// Volume id.
        volume_id: String,
        /// Staging path.
        #[arg(long)]
        staging_target_path: String,
    },
    /// Bind-mount a staged volume at a target path.
    #[command(visible_aliases = ["mount", "mnt"])]
    Publish {
        /// Volume id.
        volume_id: String,
        /// Staging path.
        #[arg(long)]
        staging_target_path: String,
        /// Target path.
        #[arg(long)]
        target_path: String,
        /// Read-only.
        #[arg(long)]
        readonly: bool,
        /// Volume context `key=value` (repeatable).
        #[arg(long = "vol-context", value_parser = parse_kv)]
        context: Vec<(String, String)>,
        #[command(flatten)]
        cap: CapArgs,
    },
    /// Unmount a published target path.
    Unpublish {
        /// Volume id.
        volume_id: String,
        /// Target path.
        #[arg(long)]
        target_path: String,
    },
    /// Capacity and inode usage of a published volume.
    Stats {
        /// Volume id.
        volume_id: String,
        /// Published path.
        #[arg(long)]
        path: String,
    },
    /// Snapshot a volume.
    CreateSnapshot {
        /// Snapshot name.
        name: String,
        /// Source volume id.
        #[arg(long)]
        volume_id: String,
    },
    /// Delete a snapshot by id.
    DeleteSnapshot {
        /// Snapshot id.
        snapshot_id: String,
    },
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?} is not key=value"))
}

fn bytes(s: &str) -> Result<i64> {
    let b = liteio_api::size::parse_quantity_str(s).with_context(|| format!("size {s:?}"))?;
    i64::try_from(b).context("size too large")
}

fn volume_json(v: &Volume) -> Value {
    json!({
        "volume_id": v.volume_id,
        "capacity_bytes": v.capacity_bytes,
        "volume_context": v.volume_context,
        "accessible_topology": v.accessible_topology.iter().map(|t| &t.segments).collect::<Vec<_>>(),
    })
}

fn snapshot_json(s: &Snapshot) -> Value {
    json!({
        "snapshot_id": s.snapshot_id,
        "source_volume_id": s.source_volume_id,
        "size_bytes": s.size_bytes,
        "ready_to_use": s.ready_to_use,
        "creation_time": s.creation_time.as_ref().map(|t| t.seconds),
    })
}

fn print(format: OutputFormat, v: &Value) {
    match format {
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(v).unwrap_or_default()),
        OutputFormat::Text => print_text(v, 0),
    }
}

fn print_text(v: &Value, indent: usize) {
    let pad = " ".repeat(indent);
    match v {
        Value::Object(m) => {
            for (k, val) in m {
                match val {
                    Value::Object(_) | Value::Array(_) => {
                        println!("{pad}{k}:");
                        print_text(val, indent + 2);
                    }
                    Value::String(s) => println!("{pad}{k}: {s}"),
                    other => println!("{pad}{k}: {other}"),
                }
            }
        }
        Value::Array(a) => {
            for item in a {
                println!("{pad}-");
                print_text(item, indent + 2);
            }
        }
        Value::String(s) => println!("{pad}{s}"),
        other => println!("{pad}{other}"),
    }
}

async fn run(args: Args) -> Result<Value> {
    let mut c = client::connect(&args.endpoint).await?;
    let v = match args.command {
        Command::Identity => {
            let info = c
                .identity
                .get_plugin_info(GetPluginInfoRequest {})
                .await?
                .into_inner();
            let caps = c
                .identity
                .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
                .await?
                .into_inner();
            let probe = c.identity.probe(ProbeRequest {}).await?.into_inner();
            let caps: Vec<String> = caps
                .capabilities
                .iter()
                .filter_map(|c| match &c.r#type {
                    Some(plugin_capability::Type::Service(s)) => {
                        Some(s.r#type().as_str_name().to_string())
                    }
                    Some(plugin_capability::Type::VolumeExpansion(e)) => {
                        Some(format!("VOLUME_EXPANSION_{}", e.r#type().as_str_name()))
                    }
                    None => None,
                })
                .collect();
            json!({"name": info.name, "version": info.vendor_version, "capabilities": caps, "ready": probe.ready.unwrap_or(true)})
        }
        Command::CreateVolume {
            name,
            size,
            params,
            from_snapshot,
            cap,
        } => {
            let req = CreateVolumeRequest {
                name,
                capacity_range: Some(CapacityRange {
                    required_bytes: bytes(&size)?,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![cap.capability()],
                parameters: params.into_iter().collect(),
                volume_content_source: from_snapshot.map(|id| VolumeContentSource {
                    r#type: Some(volume_content_source::Type::Snapshot(
                        volume_content_source::SnapshotSource { snapshot_id: id },
                    )),
                }),
                ..Default::default()
            };
            let r = c.controller.create_volume(req).await?.into_inner();
            r.volume.as_ref().map(volume_json).unwrap_or(Value::Null)
        }
        Command::DeleteVolume { volume_id } => {
            c.controller
                .delete_volume(DeleteVolumeRequest {
                    volume_id: volume_id.clone(),
                    secrets: HashMap::new(),
                })
                .await?;
            json!({"deleted": volume_id})
        }
        Command::ListVolumes {
            max_entries,
            starting_token,
        } => {
            let r = c
                .controller
                .list_volumes(ListVolumesRequest {
                    max_entries,
                    starting_token,
                })
                .await?
                .into_inner();
            json!({
                "volumes": r.entries.iter().filter_map(|e| e.volume.as_ref()).map(volume_json).collect::<Vec<_>>(),
                "next_token": r.next_token,
            })
        }
        Command::Expand {
            volume_id,
            size,
            path,
            node_only,
        } => {
            let range = CapacityRange {
                required_bytes: bytes(&size)?,
                limit_bytes: 0,
            };
            let mut out = serde_json::Map::new();
            if !node_only {
                let r = c
                    .controller
                    .controller_expand_volume(ControllerExpandVolumeRequest {
                        volume_id: volume_id.clone(),
                        capacity_range: Some(range),
                        ..Default::default()
                    })
                    .await?
                    .into_inner();
                out.insert("controller_capacity_bytes".into(), json!(r.capacity_bytes));
                out.insert(
                    "node_expansion_required".into(),
                    json!(r.node_expansion_required),
                );
            }
            if let Some(p) = path {
                let r = c
                    .node
                    .node_expand_volume(NodeExpandVolumeRequest {
                        volume_id,
                        volume_path: p,
                        capacity_range: Some(range),
                        ..Default::default()
                    })
                    .await?
                    .into_inner();
                out.insert("node_capacity_bytes".into(), json!(r.capacity_bytes));
            }
            Value::Object(out)
        }
        Command::Stage {
            volume_id,
            staging_target_path,
            context,
            cap,
        } => {
            c.node
                .node_stage_volume(NodeStageVolumeRequest {
                    volume_id: volume_id.clone(),
                    staging_target_path: staging_target_path.clone(),
                    volume_capability: Some(cap.capability()),
                    volume_context: context.into_iter().collect(),
                    ..Default::default()
                })
                .await?;
            json!({"staged": volume_id, "staging_target_path": staging_target_path})
        }
        Command::Unstage {
            volume_id,
            staging_target_path,
        } => {
            c.node
                .node_unstage_volume(NodeUnstageVolumeRequest {
                    volume_id: volume_id.clone(),
                    staging_target_path,
                })
                .await?;
            json!({"unstaged": volume_id})
        }
        Command::Publish {
            volume_id,
            staging_target_path,
            target_path,
            readonly,
            context,
            cap,
        } => {
            c.node
                .node_publish_volume(NodePublishVolumeRequest {
                    volume_id: volume_id.clone(),
                    staging_target_path,
                    target_path: target_path.clone(),
                    volume_capability: Some(cap.capability()),
                    readonly,
                    volume_context: context.into_iter().collect(),
                    ..Default::default()
                })
                .await?;
            json!({"published": volume_id, "target_path": target_path})
        }
        Command::Unpublish {
            volume_id,
            target_path,
        } => {
            c.node
                .node_unpublish_volume(NodeUnpublishVolumeRequest {
                    volume_id: volume_id.clone(),
                    target_path,
                })
                .await?;
            json!({"unpublished": volume_id})
        }
        Command::Stats { volume_id, path } => {
            let r = c
                .node
                .node_get_volume_stats(NodeGetVolumeStatsRequest {
                    volume_id,
                    volume_path: path,
                    staging_target_path: String::new(),
                })
                .await?
                .into_inner();
            json!({
                "usage": r.usage.iter().map(|u| json!({
                    "unit": u.unit().as_str_name(),
                    "total": u.total, "used": u.used, "available": u.available,
                })).collect::<Vec<_>>(),
                "abnormal": r.volume_condition.as_ref().is_some_and(|c| c.abnormal),
                "message": r.volume_condition.as_ref().map(|c| c.message.clone()).unwrap_or_default(),
            })
        }
        Command::CreateSnapshot { name, volume_id } => {
            let r = c
                .controller
                .create_snapshot(CreateSnapshotRequest {
                    source_volume_id: volume_id,
                    name,
                    ..Default::default()
                })
                .await?
                .into_inner();
            r.snapshot
                .as_ref()
                .map(snapshot_json)
                .unwrap_or(Value::Null)
        }
        Command::DeleteSnapshot { snapshot_id } => {
            c.controller
                .delete_snapshot(DeleteSnapshotRequest {
                    snapshot_id: snapshot_id.clone(),
                    secrets: HashMap::new(),
                })
                .await?;
            json!({"deleted": snapshot_id})
        }
    };
    Ok(v)
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let format = args.output;
    let timeout = std::time::Duration::from_secs(args.timeout);
    let result: Result<Value> = match tokio::time::timeout(timeout, run(args)).await {
        Err(_) => Err(anyhow::anyhow!("no answer within {}s", timeout.as_secs())),
        Ok(r) => r,
    };
    match result {
        Ok(v) => print(format, &v),
        Err(e) => {
            match e.downcast_ref::<tonic::Status>() {
                Some(s) => eprintln!("csictl: {:?}: {}", s.code(), s.message()),
                None => eprintln!("csictl: {e:#}"),
            }
            std::process::exit(1);
        }
    }
}
