//! What the control loops remember between passes, held by [`crate::context::Ctx`]: each
//! map keyed by object, with the rule of when an entry is kept and when it goes.
//!
//! - [`provision`]: where the volumes being provisioned spend their time;
//! - [`own_writes`]: the versions of objects the agent's own passes superseded;
//! - [`warnings`]: the Warning events told about objects that failed for good;
//! - [`copy_failures`]: when each migration's copy last failed;
//! - [`capabilities`]: the hosts' kernels' capabilities, as the Node watch last listed them.
//!
//! Below both the context and the sync controllers, which fill and read these: nothing here
//! imports either, so the trip goes one way (sync → context → state).

pub mod capabilities;
pub mod copy_failures;
pub mod own_writes;
pub mod provision;
pub mod warnings;

use kube::{Resource, ResourceExt};

/// `Kind ns/name` for messages.
pub fn describe<K: Resource<DynamicType = ()>>(obj: &K) -> String {
    format!(
        "{} {}/{}",
        K::kind(&()),
        obj.namespace().unwrap_or_default(),
        obj.name_any()
    )
}

/// The key of an object in the per-object failure counts.
pub fn object_key<K: Resource<DynamicType = ()>>(obj: &K) -> String {
    format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())
}
