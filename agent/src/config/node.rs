//! `nodeInfoKeys`: which labels of the Node carry the node's IP, hostname, rack and room;
//! LiteIO's keys by default, and none may be empty.

use liteio_api::keys::labels;
use serde::{Deserialize, Serialize};

use super::error::{ConfigError, missing};

/// `nodeInfoKeys`: which Node labels carry the node's facts.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct NodeInfoKeys {
    /// Label with the node IP.
    #[serde(rename = "ipLabelKey")]
    pub ip_label_key: String,
    /// Label with the hostname.
    #[serde(rename = "hostnameLabelKey")]
    pub hostname_label_key: String,
    /// Label with the rack.
    #[serde(rename = "rackLabelKey")]
    pub rack_label_key: String,
    /// Label with the room.
    #[serde(rename = "roomLabelKey")]
    pub room_label_key: String,
}

impl Default for NodeInfoKeys {
    fn default() -> Self {
        Self {
            ip_label_key: labels::NODE_IP.to_string(),
            hostname_label_key: labels::NODE_HOSTNAME.to_string(),
            rack_label_key: labels::NODE_RACK.to_string(),
            room_label_key: labels::NODE_ROOM.to_string(),
        }
    }
}

impl NodeInfoKeys {
    /// No key is empty.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        for (field, value) in [
            ("nodeInfoKeys.ipLabelKey", &self.ip_label_key),
            ("nodeInfoKeys.hostnameLabelKey", &self.hostname_label_key),
            ("nodeInfoKeys.rackLabelKey", &self.rack_label_key),
            ("nodeInfoKeys.roomLabelKey", &self.room_label_key),
        ] {
            if value.trim().is_empty() {
                return Err(missing(field, "(a Node label key)"));
            }
        }
        Ok(())
    }
}
