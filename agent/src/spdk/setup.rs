//! Building the SPDK side of an agent from its config file: the runtime options, the lvstore
//! engine of an `SpdkLVStore` pool and the NVMe-oF exporter.

use std::sync::Arc;

use super::exporter::SpdkExporter;
use super::nvmf::{DhGroup, TcpTransportOptions};
use super::{Spdk, SpdkError, SpdkOptions};
use crate::config::{BdevType, Config, PoolingMode};
use crate::engine::PoolEngine;
use crate::engine::spdk::{BaseBdev, SpdkLvsEngine};

/// Runtime options from `spdk:` (PCI probing only when NVMe devices are configured).
pub fn runtime_options(cfg: &Config) -> SpdkOptions {
    let sp = &cfg.spdk;
    SpdkOptions {
        name: "liteio-agent".into(),
        core_mask: sp.core_mask.clone(),
        interrupt_mode: sp.interrupt_mode,
        no_huge: sp.no_huge,
        mem_size_mb: sp.mem_size_mib().unwrap_or(0),
        huge_dir: sp.huge_dir.clone(),
        no_pci: sp.nvme_pci_addresses.is_empty(),
        rpc_socket: sp.rpc_socket.clone(),
        trace_entries: sp.trace_entries,
        lock_cores: sp.lock_cores,
        request_timeout: cfg.timeouts.spdk_request,
        max_subsystems: sp.max_subsystems,
        reactor_nice: sp.reactor_nice,
        // SPDK's default. A node with replicated volumes wants it off, so that SPDK never
        // assembles a stale replica by itself (docs/replicas-spdk.md); pools then load with
        // liteio_spdk::bdev::examine.
        auto_examine: true,
        // Names checked by Config::validate; one that is not a group is left out here.
        dhchap_dhgroups: cfg
            .nvmf
            .dhchap_dhgroups
            .iter()
            .filter_map(|g| g.parse::<DhGroup>().ok())
            .collect(),
    }
}

/// Strip size of a raidBdev pool's RAID0, in KiB.
pub const RAID0_STRIP_KB: u32 = 128;

/// The lvstore engine of an `SpdkLVStore` pool, or `None` for other modes.
pub fn engine(cfg: &Config) -> Result<Option<Arc<dyn PoolEngine>>, SpdkError> {
    let Some(base) = base_bdev(cfg)? else {
        return Ok(None);
    };
    Ok(Some(Arc::new(SpdkLvsEngine::new(
        &cfg.storage.pooling.name,
        base,
        0,
    ))))
}

/// What the lvstore of an `SpdkLVStore` pool sits on (`storage.bdev`; for `raidBdev` the
/// NVMe devices of `spdk.nvmePciAddresses`), or `None` for other modes.
pub fn base_bdev(cfg: &Config) -> Result<Option<BaseBdev>, SpdkError> {
    let st = &cfg.storage;
    if st.pooling.mode != PoolingMode::SpdkLvStore {
        return Ok(None);
    }
    let Some(b) = &st.bdev else {
        return Err(SpdkError::InvalidArgument {
            field: "storage.bdev",
            reason: "is required in SpdkLVStore mode".into(),
        });
    };
    let base = match b.kind {
        BdevType::Aio => BaseBdev::Aio {
            name: b.name.clone(),
            path: b.file_path.clone().into(),
            size: b.size,
            create: b.create_if_not_exist || b.size > 0,
        },
        BdevType::Mem => BaseBdev::Malloc {
            name: b.name.clone(),
            size: b.size,
        },
        BdevType::Raid => {
            let addrs = &cfg.spdk.nvme_pci_addresses;
            let mut members: Vec<BaseBdev> = addrs
                .iter()
                .enumerate()
                .map(|(i, a)| BaseBdev::nvme(&format!("nvme{i}"), a))
                .collect();
            match members.len() {
                0 => {
                    return Err(SpdkError::InvalidArgument {
                        field: "spdk.nvmePciAddresses",
                        reason: "a raidBdev pool needs at least one NVMe PCI address".into(),
                    });
                }
                // One device: the lvstore sits on its namespace directly.
                1 => members.remove(0),
                _ => BaseBdev::Raid0 {
                    name: if b.name.is_empty() {
                        crate::config::DEFAULT_RAID0_NAME.into()
                    } else {
                        b.name.clone()
                    },
                    members,
                    strip_kb: RAID0_STRIP_KB,
                },
            }
        }
    };
    Ok(Some(base))
}

/// The NVMe-oF exporter listening on `address` with the configured port range.
pub fn exporter(cfg: &Config, address: std::net::IpAddr) -> Result<SpdkExporter, SpdkError> {
    let pr = cfg.nvmf.port_range;
    let (Ok(start), Ok(end)) = (u16::try_from(pr.start), u16::try_from(pr.end)) else {
        return Err(SpdkError::InvalidArgument {
            field: "nvmf.portRange",
            reason: format!("{}-{} is outside 1-65535", pr.start, pr.end),
        });
    };
    Ok(SpdkExporter::new(
        address.to_string(),
        start..=end,
        TcpTransportOptions::default(),
    )
    .with_auth(cfg.nvmf.auth == crate::config::NvmfAuth::Dhchap)
    .with_interrupt_mode(cfg.spdk.interrupt_mode))
}

/// Start the runtime from the config (blocking; call from `spawn_blocking`), with the NVMe
/// initiator's deadlines (`timeouts.nvmeIo`, `nvmeAdmin`, `nvmeTransport`) set before any
/// controller is attached (SPDK takes them only then).
pub fn start(cfg: &Config) -> Result<Spdk, SpdkError> {
    let spdk = Spdk::start(&runtime_options(cfg))?;
    let t = super::initiator::IoTimeouts {
        io: Some(cfg.timeouts.nvme_io),
        admin: Some(cfg.timeouts.nvme_admin),
        transport: Some(cfg.timeouts.nvme_transport),
    };
    if let Err(e) = futures::executor::block_on(super::initiator::set_io_timeouts(&t)) {
        spdk.stop();
        return Err(e);
    }
    Ok(spdk)
}
