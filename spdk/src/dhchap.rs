//! DH-HMAC-CHAP's Diffie-Hellman groups ([`DhGroup`]): which groups the NVMe-oF target
//! allows (a start-up option of the runtime) and the initiator offers. A value type and its
//! names only, no SPDK call: the runtime's options and the target and initiator all use it,
//! so it stands below them (re-exported as `nvmf::DhGroup`).

/// A Diffie-Hellman group of DH-HMAC-CHAP (NVMe base spec, "DH group identifiers"). The
/// target picks the strongest group it allows that the host offers, and computes the
/// exchange on the reactor of the connecting queue pair: with SPDK's default (every group)
/// that is ffdhe8192, measured here at 0.35 to 0.7 s per queue pair, during which that
/// reactor serves nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DhGroup {
    /// No DH exchange: challenge and response over the shared keys only.
    Null,
    /// 2048-bit finite-field group (RFC 7919).
    Ffdhe2048,
    /// 3072-bit.
    Ffdhe3072,
    /// 4096-bit.
    Ffdhe4096,
    /// 6144-bit.
    Ffdhe6144,
    /// 8192-bit.
    Ffdhe8192,
}

impl DhGroup {
    /// Every group, weakest first.
    pub const ALL: [DhGroup; 6] = [
        DhGroup::Null,
        DhGroup::Ffdhe2048,
        DhGroup::Ffdhe3072,
        DhGroup::Ffdhe4096,
        DhGroup::Ffdhe6144,
        DhGroup::Ffdhe8192,
    ];

    /// This group's bit in SPDK's `dhchap_dhgroups` masks (its identifier in the spec).
    pub fn bit(self) -> u32 {
        1 << (self as u32)
    }

    /// The mask of `groups`.
    pub fn mask(groups: &[DhGroup]) -> u32 {
        groups.iter().fold(0, |m, g| m | g.bit())
    }

    /// The name SPDK's configuration and the Linux host use (`null`, `ffdhe2048`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DhGroup::Null => "null",
            DhGroup::Ffdhe2048 => "ffdhe2048",
            DhGroup::Ffdhe3072 => "ffdhe3072",
            DhGroup::Ffdhe4096 => "ffdhe4096",
            DhGroup::Ffdhe6144 => "ffdhe6144",
            DhGroup::Ffdhe8192 => "ffdhe8192",
        }
    }
}

impl std::fmt::Display for DhGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DhGroup {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|g| g.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Self::ALL.iter().map(|g| g.name()).collect();
                format!(
                    "unknown DH group {s:?}, expected one of {}",
                    names.join(", ")
                )
            })
    }
}
