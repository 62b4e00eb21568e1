//! Compute nodes that are microVMs ([`crate::vm`]): a node of the one-machine cluster with a
//! kernel of its own (Debian's 6.12 or 6.1), so that the CSI node plugin stages volumes with
//! the kernel's NVMe/TCP host, device-mapper and multipath instead of this machine's.
//!
//! The guest joins the cluster's bridge through a tap with its own address
//! (127.10.<run>.<200 + n>), has a Node object like the namespace nodes, and runs the CSI
//! node plugin (`csi-driver --mode node`) from this checkout, with the cluster's kubeconfig.
//! The plugin serves its unix socket inside the guest; `socat` (Debian package) forwards a
//! TCP port on the guest's address to it, which the test drives as kubelet would. A TCP
//! forwarder in the guest rather than TCP in the driver: the driver stays unix-only, as
//! kubelet wants it, and nothing of it is test-only.

use std::net::Ipv4Addr;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::PostParams;

use liteio_agent::config::{Config as AgentConfig, LvmPv, PoolingMode};
use liteio_api::{StoragePool, keys};

use crate::LocalError;
use crate::cluster::Cluster;
use crate::vm::{Kernel, Vm, VmNet, VmOptions};

/// The guest port the CSI node plugin is reached at.
pub const CSI_PORT: u16 = 10_000;
/// Where the plugin keeps its socket, host NQN and log inside the guest (and a storage
/// VM's agent its config, log and PV files).
pub const GUEST_DIR: &str = "/tmp/liteio";
/// The volume group of a storage VM's KernelLVM pool (the pool's name).
pub const LVM_VG: &str = "liteio-vg";

/// A compute node in a microVM.
#[derive(Debug)]
pub struct VmNode {
    /// Its Node name (`vm-<n>`).
    pub name: String,
    /// Its address on the cluster bridge.
    pub address: Ipv4Addr,
    /// The guest.
    pub vm: Vm,
    /// Whether a disk-agent runs in the guest ([`Cluster::add_vm_storage_node`]).
    pub storage: bool,
}

impl VmNode {
    /// The CSI endpoint for [`liteio_csi::client::connect`]: `tcp://<address>:<CSI_PORT>`.
    pub fn csi_endpoint(&self) -> String {
        format!("tcp://{}:{CSI_PORT}", self.address)
    }

    /// The guest's NVMe host NQN (made by the plugin at its start).
    pub async fn host_nqn(&mut self) -> Result<String, LocalError> {
        let out = self
            .vm
            .sh_ok(&format!("cat {GUEST_DIR}/hostnqn"), Duration::from_secs(30))
            .await
            .map_err(|e| LocalError::Network(e.to_string()))?;
        Ok(out.trim().to_string())
    }

    /// The disk-agent's log in a storage VM (its last `lines`).
    pub async fn agent_log(&mut self, lines: usize) -> String {
        self.vm
            .sh(
                &format!("tail -n {lines} {GUEST_DIR}/disk-agent.log"),
                Duration::from_secs(30),
            )
            .await
            .map(|o| o.output)
            .unwrap_or_else(|e| e.to_string())
    }

    /// SIGKILLs a storage VM's disk-agent and starts it again with the same config (a crash
    /// and its restart); returns once it has re-registered its pool.
    pub async fn restart_agent(&mut self, c: &Cluster) -> Result<(), LocalError> {
        let launched = k8s_openapi::jiff::Timestamp::now();
        let script = format!(
            "pkill -KILL -x disk-agent; while pgrep -x disk-agent >/dev/null; do sleep 0.1; done\n\
             setsid {bin} --kubeconfig {kc} --config {GUEST_DIR}/agent.yaml --node-id {name} --host-nqn-file {GUEST_DIR}/hostnqn --log-format json >>{GUEST_DIR}/disk-agent.log 2>&1 </dev/null 3>&- &\n\
             exit 0",
            bin = c.bin_dir.join("disk-agent").display(),
            kc = c.kubeconfig().display(),
            name = self.name,
        );
        self.vm
            .sh_ok(&script, Duration::from_secs(60))
            .await
            .map_err(|e| LocalError::Network(e.to_string()))?;
        c.wait_for_vm_pool(self, Some(launched)).await
    }

    /// The CSI node plugin's log in the guest (its last `lines`).
    pub async fn csi_log(&mut self, lines: usize) -> String {
        self.vm
            .sh(
                &format!("tail -n {lines} {GUEST_DIR}/csi-node.log"),
                Duration::from_secs(30),
            )
            .await
            .map(|o| o.output)
            .unwrap_or_else(|e| e.to_string())
    }
}

impl Cluster {
    /// Boots compute node `n` (1 to 50) as a microVM with `kernel`, joins it to the bridge,
    /// registers its Node and starts its CSI node plugin; ready when the plugin answers
    /// NodeGetInfo.
    pub async fn add_vm_node(&mut self, n: u8, kernel: Kernel) -> Result<VmNode, LocalError> {
        if !(1..=50).contains(&n) {
            return Err(LocalError::Network(format!("VM node {n}: use 1 to 50")));
        }
        let name = format!("vm-{n}");
        let index = self.net.bridge_address().octets()[2];
        let address = Ipv4Addr::new(127, 10, index, 200 + n);
        let tap = format!("lio{index}v{n}");
        let mut opts = VmOptions::new(&name, &self.dir.join("vms"));
        opts.kernel = kernel;
        opts.net = Some(VmNet {
            bridge: self.net.bridge.clone(),
            tap: tap.clone(),
            address,
            prefix: 24,
        });
        let net_err = |e: crate::vm::VmError| LocalError::Network(e.to_string());
        let mut vm = Vm::boot(&opts).await.map_err(net_err)?;
        // A crashed run's VM and tap go with the run's cleanup.
        if let Some(pid) = vm.pid() {
            self.ledger_mut().add_process(pid, &format!("VM {name}"))?;
        }
        self.ledger_mut().add_link(&tap)?;
        self.register_node(&name, address).await?;
        let bin = self.bin_dir.join("csi-driver");
        let start = format!(
            "modprobe nvme-tcp && modprobe loop && modprobe dm-mod || exit 1\n\
             mkdir -p {GUEST_DIR}\n\
             setsid {bin} --kubeconfig {kc} --endpoint unix://{GUEST_DIR}/csi.sock --node-id {name} --mode node --hostnqn-file {GUEST_DIR}/hostnqn >{GUEST_DIR}/csi-node.log 2>&1 </dev/null 3>&- &\n\
             setsid socat TCP-LISTEN:{CSI_PORT},bind={address},reuseaddr,fork UNIX-CONNECT:{GUEST_DIR}/csi.sock >/dev/null 2>&1 </dev/null 3>&- &\n\
             exit 0",
            bin = bin.display(),
            kc = self.kubeconfig().display(),
        );
        vm.sh_ok(&start, Duration::from_secs(60))
            .await
            .map_err(net_err)?;
        let mut node = VmNode {
            name,
            address,
            vm,
            storage: false,
        };
        let endpoint = node.csi_endpoint();
        let ready = tokio::time::timeout(Duration::from_secs(120), async {
            loop {
                if let Ok(mut c) = liteio_csi::client::connect(&endpoint).await
                    && c.node
                        .node_get_info(liteio_csi::csi::NodeGetInfoRequest {})
                        .await
                        .is_ok()
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
        .await;
        if ready.is_err() {
            let log = node.csi_log(40).await;
            return Err(LocalError::Network(format!(
                "the CSI node plugin of {} did not answer at {endpoint} within 120 s:\n{log}",
                node.name
            )));
        }
        Ok(node)
    }

    /// Boots storage node `n` as a microVM ([`Self::add_vm_node`]) whose disk-agent runs
    /// inside with LiteIO's KernelLVM pool: volume group `liteio-vg` on two loop-backed PVs
    /// of `pv_bytes` each, backing files in the guest's own /tmp (LiteIO's agent config:
    /// `filePath`, `size`, `createIfNotExist`). No SPDK: its volumes are local to the VM,
    /// staged by the VM's CSI node plugin from the logical volume's device. Ready when the
    /// agent has registered its StoragePool with the VG's size.
    pub async fn add_vm_storage_node(
        &mut self,
        n: u8,
        kernel: Kernel,
        pv_bytes: u64,
    ) -> Result<VmNode, LocalError> {
        let mut node = self.add_vm_node(n, kernel).await?;
        let mut cfg = AgentConfig::file_pool(LVM_VG, GUEST_DIR);
        cfg.storage.pooling.mode = PoolingMode::KernelLvm;
        cfg.storage.file = None;
        cfg.storage.pvs = (0..2)
            .map(|i| LvmPv {
                device_path: String::new(),
                size: pv_bytes,
                file_path: format!("{GUEST_DIR}/pv{i}.img"),
                create_if_not_exist: true,
            })
            .collect();
        cfg.nvmf.listen_address = Some(node.address.into());
        let yaml = serde_yaml::to_string(&cfg)
            .map_err(|e| LocalError::Config(format!("agent config: {e}")))?;
        let start = format!(
            "modprobe dm-snapshot; cat > {GUEST_DIR}/agent.yaml <<'LITEIO_EOF'\n{yaml}LITEIO_EOF\n\
             setsid {bin} --kubeconfig {kc} --config {GUEST_DIR}/agent.yaml --node-id {name} --host-nqn-file {GUEST_DIR}/hostnqn --log-format json >>{GUEST_DIR}/disk-agent.log 2>&1 </dev/null 3>&- &\n\
             exit 0",
            bin = self.bin_dir.join("disk-agent").display(),
            kc = self.kubeconfig().display(),
            name = node.name,
        );
        node.vm
            .sh_ok(&start, Duration::from_secs(60))
            .await
            .map_err(|e| LocalError::Network(e.to_string()))?;
        node.storage = true;
        self.wait_for_vm_pool(&mut node, None).await?;
        Ok(node)
    }

    /// Waits up to 120 s for the StoragePool of `node`'s agent to have a size (and, with
    /// `since`, for its Lease to be renewed after it: an agent started then is up).
    async fn wait_for_vm_pool(
        &self,
        node: &mut VmNode,
        since: Option<k8s_openapi::jiff::Timestamp>,
    ) -> Result<(), LocalError> {
        let client = self.kube().await?;
        let pools: Api<StoragePool> = Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
        let leases: Api<Lease> = Api::namespaced(client, keys::DEFAULT_NAMESPACE);
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            let sized = pools
                .get_opt(&node.name)
                .await
                .ok()
                .flatten()
                .is_some_and(|p| p.total_bytes() > 0);
            let renewed = match since {
                None => true,
                Some(t) => crate::cluster::lease_renewed(&leases, &node.name)
                    .await
                    .is_some_and(|r| r >= t),
            };
            if sized && renewed {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                let log = node.agent_log(40).await;
                return Err(LocalError::Network(format!(
                    "the disk-agent of {} registered no pool within 120 s:\n{log}",
                    node.name
                )));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Registers Node `name` at `address` as kubelet would (nothing when it exists); a test
    /// can name a consumer node that never runs.
    pub async fn register_node(&self, name: &str, address: Ipv4Addr) -> Result<(), LocalError> {
        let client = self.kube().await?;
        let nodes: Api<Node> = Api::all(client);
        if nodes.get_opt(name).await?.is_some() {
            return Ok(());
        }
        let obj = crate::cluster::node_object(name, address);
        nodes.create(&PostParams::default(), &obj).await?;
        Ok(())
    }
}
