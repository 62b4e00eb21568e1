//! Hosts whose kernel cannot authenticate: the per-volume policy, what a host's kernel can
//! do, and the one decision both ends of a connection make from the two.
//!
//! - **Policy.** StorageClass parameter [`SC_PARAM_HOST_AUTH`] (`liteio.io/host-auth`), copied
//!   by the CSI controller into the volume's `spec.hostAuth` ([`HostAuthPolicy`]):
//!   `required` (the default: absent means it), `preferred` or `none`.
//! - **Capability.** The CSI node writes what its kernel can do onto its own Node object at
//!   start: [`NODE_ANNOTATION_HOST_AUTH`] (`dhchap,tls`, `dhchap`, `tls` or `none`) and the
//!   kernel release in [`NODE_ANNOTATION_KERNEL`] ([`HostAuthCapability`]).
//! - **Decision.** [`decide`] turns the two into one host's entry: keys, NQN-only, or a
//!   refusal. The disk-agent makes it for each host it adds to a volume's export (a refusal
//!   still gets keys there: nobody is let in without them unless the policy says so); the
//!   CSI node makes the same one in NodeStageVolume and connects without keys, with keys,
//!   or fails at once with [`refusal`]'s message instead of an opaque EIO.
//!
//! Why `required` is the default: it is the only choice that never weakens a volume's
//! protection without the StorageClass's owner asking for it. The host NQN that admits a
//! host without keys is no secret, and the capability a `preferred` volume follows is an
//! annotation that anything allowed to patch Nodes could change. A host that cannot
//! authenticate finds out at NodeStageVolume, with a message naming the parameter to
//! change.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::keys::SC_PARAM_HOST_AUTH;
pub use crate::keys::annotations::{
    HOSTS_WITHOUT_AUTH as ANNOTATION_HOSTS_WITHOUT_AUTH,
    NODE_HOST_AUTH as NODE_ANNOTATION_HOST_AUTH, NODE_KERNEL_RELEASE as NODE_ANNOTATION_KERNEL,
};
/// Reason of the events telling that a volume is served to a host without authentication.
pub const EVENT_SERVED_WITHOUT_AUTH: &str = "ServedWithoutAuthentication";
/// Reason of the Warning event of a NodeStageVolume refused because the host's kernel
/// cannot authenticate.
pub const EVENT_HOST_CANNOT_AUTHENTICATE: &str = "HostCannotAuthenticate";

/// How the hosts of a volume must authenticate (`spec.hostAuth`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum HostAuthPolicy {
    /// Every host authenticates with the volume's DH-HMAC-CHAP keys; a host whose kernel
    /// cannot is refused at NodeStageVolume.
    #[default]
    Required,
    /// Hosts that can authenticate do; a host whose kernel cannot is admitted by its NQN
    /// alone (only that host's entry), which is logged and evented.
    Preferred,
    /// Hosts are admitted by their NQN alone.
    None,
}

impl HostAuthPolicy {
    /// Every policy, in the order messages list them.
    pub const ALL: [HostAuthPolicy; 3] = [Self::Required, Self::Preferred, Self::None];

    /// The name in the StorageClass and the volume's spec.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Required => "required",
            Self::Preferred => "preferred",
            Self::None => "none",
        }
    }

    /// Parses the value of `field`; the error names the field and the allowed values.
    pub fn parse(field: &str, s: &str) -> Result<Self, crate::invalid::ValidationError> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == s.trim())
            .ok_or_else(|| {
                crate::invalid::ValidationError::new(
                    field,
                    format!("{s:?} is not one of required, preferred, none"),
                )
            })
    }

    /// The policy of a volume: `spec.hostAuth`, `required` when absent.
    pub fn of(vol: &crate::AntstorVolume) -> Self {
        vol.spec.host_auth.unwrap_or_default()
    }
}

impl fmt::Display for HostAuthPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a host's kernel can do, as its Node's annotations say.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostAuthCapability {
    /// DH-HMAC-CHAP in-band authentication.
    pub dhchap: bool,
    /// NVMe/TCP TLS.
    pub tls: bool,
    /// Kernel release, when known.
    pub kernel: String,
}

impl HostAuthCapability {
    /// The value of [`NODE_ANNOTATION_HOST_AUTH`].
    pub fn annotation(&self) -> String {
        match (self.dhchap, self.tls) {
            (true, true) => "dhchap,tls".into(),
            (true, false) => "dhchap".into(),
            (false, true) => "tls".into(),
            (false, false) => "none".into(),
        }
    }

    /// Reads a Node's annotations; `None` when [`NODE_ANNOTATION_HOST_AUTH`] is absent (no
    /// CSI node has said anything) or holds no known word (written by something newer):
    /// the capability is then unknown.
    pub fn from_annotations(
        annotations: Option<&std::collections::BTreeMap<String, String>>,
    ) -> Option<Self> {
        let a = annotations?;
        let value = a.get(NODE_ANNOTATION_HOST_AUTH)?;
        let words: Vec<&str> = value.split(',').map(str::trim).collect();
        let known = words
            .iter()
            .any(|w| matches!(*w, "dhchap" | "tls" | "none"));
        known.then(|| HostAuthCapability {
            dhchap: words.contains(&"dhchap"),
            tls: words.contains(&"tls"),
            kernel: a.get(NODE_ANNOTATION_KERNEL).cloned().unwrap_or_default(),
        })
    }
}

/// One host's entry in a volume's export, or the CSI node's refusal to connect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostAuthDecision {
    /// The host authenticates with the volume's keys.
    Keys,
    /// The host is admitted by its NQN alone: no DH-HMAC-CHAP keys in its entry nor in its
    /// connect.
    NqnOnly,
    /// The host cannot authenticate and the policy requires it: the export keeps the keys
    /// (the host cannot connect), and NodeStageVolume fails at once saying why.
    Refuse,
}

/// The decision for one host of a volume with `policy` (`tls`: the volume is exported over
/// TLS), given whether the host's kernel can do DH-HMAC-CHAP (`None`: unknown).
///
/// | policy | host can | host cannot | unknown |
/// |---|---|---|---|
/// | `required` | keys | refuse | keys |
/// | `preferred` | keys | NQN-only (refuse for a TLS volume) | keys |
/// | `none` | NQN-only (keys for a TLS volume) | NQN-only (refuse for a TLS volume) | NQN-only (keys for a TLS volume) |
///
/// An unknown capability never downgrades: the CSI node writes its Node's annotation
/// when it starts, and knows its own kernel. A TLS volume is never downgraded either: its
/// listener takes TLS only, and a host that cannot do it cannot connect whatever the
/// policy (the CSI controller refuses `none` with `nvmfTls` at CreateVolume).
pub fn decide(policy: HostAuthPolicy, tls: bool, host_dhchap: Option<bool>) -> HostAuthDecision {
    use HostAuthDecision::{Keys, NqnOnly, Refuse};
    match (policy, host_dhchap) {
        (_, Some(false)) if tls => Refuse,
        (HostAuthPolicy::None, _) if tls => Keys,
        (HostAuthPolicy::None, _) => NqnOnly,
        (HostAuthPolicy::Required, Some(false)) => Refuse,
        (HostAuthPolicy::Preferred, Some(false)) => NqnOnly,
        (_, Some(true) | None) => Keys,
    }
}

/// The export side of [`decide`]: whether the host's entry goes without DH-HMAC-CHAP keys
/// (a refusal keeps them).
pub fn export_without_keys(policy: HostAuthPolicy, tls: bool, host_dhchap: Option<bool>) -> bool {
    decide(policy, tls, host_dhchap) == HostAuthDecision::NqnOnly
}

/// The message of a refused NodeStageVolume: names the volume, the kernel and what it lacks
/// (`why`, from the CSI node's detection), and the StorageClass parameter that would let
/// the host in.
pub fn refusal(volume: &str, policy: HostAuthPolicy, tls: bool, why: &str) -> String {
    if tls {
        format!(
            "volume {volume} is exported over TLS with DH-HMAC-CHAP, and {why}; a host that cannot authenticate cannot reach a TLS volume: use a StorageClass without nvmfTls: \"true\" and with {SC_PARAM_HOST_AUTH}: preferred (or none) to admit this host by its NQN alone"
        )
    } else {
        format!(
            "volume {volume} requires host authentication ({SC_PARAM_HOST_AUTH}: {policy}), and {why}; use a StorageClass with {SC_PARAM_HOST_AUTH}: preferred (or none) to admit this host by its NQN alone, or run a kernel that can authenticate"
        )
    }
}

/// Parses [`ANNOTATION_HOSTS_WITHOUT_AUTH`]'s value.
pub fn hosts_without_auth(vol: &crate::AntstorVolume) -> Vec<String> {
    crate::meta::annotation(&vol.metadata, ANNOTATION_HOSTS_WITHOUT_AUTH)
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use HostAuthDecision::{Keys, NqnOnly, Refuse};
    use HostAuthPolicy::{None as NoAuth, Preferred, Required};
    use std::collections::BTreeMap;

    #[test]
    fn policy_parses_and_names_the_field_and_values() {
        for p in HostAuthPolicy::ALL {
            assert_eq!(HostAuthPolicy::parse("f", p.as_str()).unwrap(), p);
        }
        assert_eq!(
            HostAuthPolicy::parse("f", " preferred ").unwrap(),
            Preferred
        );
        let e = HostAuthPolicy::parse("parameters.liteio.io/host-auth", "optional").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("parameters.liteio.io/host-auth"), "{msg}");
        assert!(msg.contains("\"optional\""), "{msg}");
        assert!(msg.contains("required, preferred, none"), "{msg}");
        assert!(HostAuthPolicy::parse("f", "Required").is_err());
        assert!(HostAuthPolicy::parse("f", "").is_err());
        assert_eq!(HostAuthPolicy::default(), Required);
    }

    #[test]
    fn spec_field_is_optional_and_absent_means_required() {
        let json = serde_json::json!({"uuid": "u", "sizeByte": 1, "targetNodeId": ""});
        let spec: crate::AntstorVolumeSpec = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(spec.host_auth, Option::None);
        // LiteIO's objects round-trip unchanged: no hostAuth is written for them.
        assert_eq!(serde_json::to_value(&spec).unwrap(), json);
        let vol = crate::AntstorVolume::new("v", spec.clone());
        assert_eq!(HostAuthPolicy::of(&vol), Required);
        let mut spec = spec;
        spec.host_auth = Some(Preferred);
        let v = serde_json::to_value(&spec).unwrap();
        assert_eq!(v["hostAuth"], "preferred");
        let back: crate::AntstorVolumeSpec = serde_json::from_value(v).unwrap();
        assert_eq!(back.host_auth, Some(Preferred));
    }

    #[test]
    fn the_resolution_table() {
        let cases = [
            // (policy, tls, host can, decision)
            (Required, false, Some(true), Keys),
            (Required, false, Some(false), Refuse),
            (Required, false, Option::None, Keys),
            (Preferred, false, Some(true), Keys),
            (Preferred, false, Some(false), NqnOnly),
            (Preferred, false, Option::None, Keys),
            (NoAuth, false, Some(true), NqnOnly),
            (NoAuth, false, Some(false), NqnOnly),
            (NoAuth, false, Option::None, NqnOnly),
            (Required, true, Some(true), Keys),
            (Required, true, Some(false), Refuse),
            (Preferred, true, Some(true), Keys),
            (Preferred, true, Some(false), Refuse),
            (Preferred, true, Option::None, Keys),
            (NoAuth, true, Some(true), Keys),
            (NoAuth, true, Some(false), Refuse),
            (NoAuth, true, Option::None, Keys),
        ];
        for (p, tls, can, want) in cases {
            assert_eq!(decide(p, tls, can), want, "{p} tls={tls} can={can:?}");
            // The export never goes without keys unless the decision is NQN-only.
            assert_eq!(export_without_keys(p, tls, can), want == NqnOnly);
        }
    }

    #[test]
    fn refusal_names_the_kernel_option_and_parameter() {
        let why = "this node's kernel 6.1.0-28-amd64 cannot authenticate NVMe/TCP connections (DH-HMAC-CHAP): built without CONFIG_NVME_AUTH; it needs CONFIG_NVME_HOST_AUTH";
        let m = refusal("pvc-1", Required, false, why);
        for part in [
            "pvc-1",
            "6.1.0-28-amd64",
            "CONFIG_NVME_HOST_AUTH",
            "liteio.io/host-auth: required",
            "liteio.io/host-auth: preferred",
        ] {
            assert!(m.contains(part), "{m} lacks {part}");
        }
        let m = refusal("pvc-1", Preferred, true, why);
        assert!(m.contains("nvmfTls") && m.contains("6.1.0-28-amd64"), "{m}");
    }

    #[test]
    fn capability_annotation_round_trips_and_unknown_is_none() {
        for (dhchap, tls, text) in [
            (true, true, "dhchap,tls"),
            (true, false, "dhchap"),
            (false, true, "tls"),
            (false, false, "none"),
        ] {
            let c = HostAuthCapability {
                dhchap,
                tls,
                kernel: "6.12.9".into(),
            };
            assert_eq!(c.annotation(), text);
            let a = BTreeMap::from([
                (NODE_ANNOTATION_HOST_AUTH.to_string(), text.to_string()),
                (NODE_ANNOTATION_KERNEL.to_string(), "6.12.9".to_string()),
            ]);
            assert_eq!(HostAuthCapability::from_annotations(Some(&a)), Some(c));
        }
        assert_eq!(
            HostAuthCapability::from_annotations(Option::None),
            Option::None
        );
        assert_eq!(
            HostAuthCapability::from_annotations(Some(&BTreeMap::new())),
            Option::None
        );
        let a = BTreeMap::from([(NODE_ANNOTATION_HOST_AUTH.to_string(), "quantum".to_string())]);
        assert_eq!(HostAuthCapability::from_annotations(Some(&a)), Option::None);
    }

    #[test]
    fn hosts_without_auth_are_read_from_the_annotation() {
        let mut vol = crate::AntstorVolume::new("v", Default::default());
        assert!(hosts_without_auth(&vol).is_empty());
        vol.metadata.annotations = Some(BTreeMap::from([(
            ANNOTATION_HOSTS_WITHOUT_AUTH.to_string(),
            "nqn.a, nqn.b,".to_string(),
        )]));
        assert_eq!(hosts_without_auth(&vol), ["nqn.a", "nqn.b"]);
    }
}
