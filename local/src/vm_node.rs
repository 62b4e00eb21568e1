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

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::PostParams;

use crate::LocalError;
use crate::cluster::Cluster;
use crate::vm::{Kernel, Vm, VmNet, VmOptions};

/// The guest port the CSI node plugin is reached at.
pub const CSI_PORT: u16 = 10_000;
/// Where the plugin keeps its socket, host NQN and log inside the guest.
pub const GUEST_DIR: &str = "/tmp/liteio";

/// A compute node in a microVM.
#[derive(Debug)]
pub struct VmNode {
    /// Its Node name (`vm-<n>`).
    pub name: String,
    /// Its address on the cluster bridge.
    pub address: Ipv4Addr,
    /// The guest.
    pub vm: Vm,
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
        let mut node = VmNode { name, address, vm };
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

    /// The Node object of a VM node, as kubelet would register it.
    async fn register_node(&self, name: &str, address: Ipv4Addr) -> Result<(), LocalError> {
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
