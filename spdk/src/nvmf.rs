//! The NVMe-oF TCP target: transport, one subsystem per volume, listeners, host allow-lists.
//!
//! A face only: the target's calls live in rooms of their own below it, each importing only
//! the rooms under it, and their public names are re-exported here (`nvmf::…` paths stay as
//! they were):
//! - `spec`: what an export is ([`SubsystemSpec`], [`SubsystemInfo`], [`HostKeys`],
//!   [`AnaState`], [`TcpTransportOptions`]); [`DhGroup`] lives in [`crate::dhchap`];
//! - `target`: finding the target and a subsystem, reading it, listings, the TCP transport;
//! - `state`: pause and resume, [`settle`], [`delete_subsystem`];
//! - `hosts`: the allow-list ([`set_hosts`]) and disconnecting hosts;
//! - `create`: [`create_subsystem`];
//! - `multipath`: ANA states, listeners added and removed, the I/O fence of a hot migration.

mod create;
mod hosts;
mod multipath;
mod spec;
mod state;
mod target;

pub use super::dhchap::DhGroup;
pub use create::create_subsystem;
pub use hosts::{connected_hosts, disconnect_host, set_hosts, set_hosts_with};
pub use multipath::{
    add_listener, ana_state, fence_io, remove_listener, set_ana_state, unfence_io,
};
pub(crate) use spec::ptr_or_null;
pub use spec::{
    AnaState, HostKeys, MAX_CNTLID, Multipath, SubsystemInfo, SubsystemSpec, TcpTransportOptions,
};
pub use state::{delete_subsystem, settle};
pub use target::{
    ensure_tcp_transport, find_subsystem, listener_ports, subsystems, target_running,
};
