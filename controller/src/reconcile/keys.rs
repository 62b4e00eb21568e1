//! Which node may read which volume's keys.
//!
//! A volume's DH-HMAC-CHAP keys (and TLS PSK) live in its Secret `liteio-auth-<pv name>`.
//! The storage node that exports the volume must read them; no other node should. RBAC
//! cannot tell one pod of the disk-agent DaemonSet from another (they share one
//! ServiceAccount), but it can tell nodes apart: each kubelet authenticates as
//! `system:node:<node>`. So for every storage node this reconciler keeps
//!
//! - the Role `liteio-keys-<node>` in LiteIO's namespace: `get`, `patch` and `delete` on the
//!   Secrets of exactly the volumes bound to that node (`resourceNames`), and
//! - the RoleBinding of the same name to the user `system:node:<node>`;
//!
//! and the disk-agent reads its volumes' keys with its node's credentials
//! (`nvmf.keysKubeconfig`). A node without volumes has neither object: an empty
//! `resourceNames` would mean every Secret. A volume keeps its name in the Role until the
//! object is gone, so the agent can still delete the Secret while it tears the volume down.
//! RBAC only lets the controller grant what it holds itself, so its own Role carries the same
//! verbs on Secrets (it never reads a key).
//!
//! At start-up, once the caches are synced, `stale_key_access` queues every node that holds
//! key access now, so a node whose last volume went while no controller ran loses it.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::core::ObjectMeta;
use liteio_api::keys::{labels, managers};
use liteio_api::naming;
use tokio::sync::watch;
use tracing::{debug, instrument, warn};

use super::queue::backoff;
use super::{Action, Context};
use crate::error::{Error, Result};
use crate::state::ObjectKey;

/// The verbs a node holds on the Secrets of its volumes: read the keys, add a TLS PSK, delete
/// the Secret with the volume. Never `list` or `watch`.
pub const VERBS: [&str; 3] = ["get", "patch", "delete"];

/// The Secret names node `node` may touch: those of the volumes whose object names it
/// (`spec.targetNodeId`, also before its pool exists) or that the scheduler bound to it, sorted.
pub fn secret_names(ctx: &Context, node: &str) -> Vec<String> {
    let s = ctx.state();
    let names: BTreeSet<String> = s
        .volume_keys()
        .iter()
        .filter_map(|k| Some((s.binding(k), s.volume(k)?)))
        .filter(|(bound, v)| *bound == Some(node) || v.target_node() == Some(node))
        .map(|(_, v)| v.auth_secret_name())
        .collect();
    names.into_iter().collect()
}

/// The Role that lets `node` touch the Secrets `names` (which must not be empty).
pub fn role(ns: &str, node: &str, names: Vec<String>) -> Role {
    Role {
        metadata: meta(ns, node),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["secrets".into()]),
            resource_names: Some(names),
            verbs: VERBS.iter().map(|v| v.to_string()).collect(),
            ..PolicyRule::default()
        }]),
    }
}

/// The RoleBinding of [`role`] to the node's own user.
pub fn role_binding(ns: &str, node: &str) -> RoleBinding {
    let name = naming::node_keys_role(node);
    RoleBinding {
        metadata: meta(ns, node),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name,
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "User".into(),
            name: naming::node_user(node),
            namespace: None,
        }]),
    }
}

fn meta(ns: &str, node: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(naming::node_keys_role(node)),
        namespace: Some(ns.to_string()),
        labels: Some(
            [(labels::NODE_KEYS.to_string(), "true".to_string())]
                .into_iter()
                .collect(),
        ),
        ..ObjectMeta::default()
    }
}

/// Brings the Role and RoleBinding of the node `key.name` in line with the volumes bound to
/// it: applied (server-side, forced) when it has volumes, deleted when it has none.
#[instrument(skip(ctx), fields(node = %key.name))]
pub async fn reconcile(ctx: &Context, key: &ObjectKey) -> Result<Action> {
    let ns = &key.namespace;
    let node = &key.name;
    let name = naming::node_keys_role(node);
    let roles: Api<Role> = Api::namespaced(ctx.client.clone(), ns);
    let bindings: Api<RoleBinding> = Api::namespaced(ctx.client.clone(), ns);
    let names = secret_names(ctx, node);
    if names.is_empty() {
        // The binding first: a binding to a missing Role grants nothing, a Role without a
        // binding is harmless too, but never leave the binding to a Role about to change.
        for r in [
            bindings
                .delete(&name, &DeleteParams::default())
                .await
                .map(|_| ()),
            roles
                .delete(&name, &DeleteParams::default())
                .await
                .map(|_| ()),
        ] {
            match r {
                Ok(()) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    return Err(Error::kube(
                        format!("delete Role/RoleBinding {ns}/{name}"),
                        e,
                    ));
                }
            }
        }
        debug!("node stores no volume: no key access");
        return Ok(Action::Done);
    }
    let count = names.len();
    let pp = PatchParams::apply(managers::CONTROLLER).force();
    roles
        .patch(&name, &pp, &Patch::Apply(&role(ns, node, names)))
        .await
        .map_err(|e| Error::kube(format!("apply Role {ns}/{name}"), e))?;
    bindings
        .patch(&name, &pp, &Patch::Apply(&role_binding(ns, node)))
        .await
        .map_err(|e| Error::kube(format!("apply RoleBinding {ns}/{name}"), e))?;
    debug!(secrets = count, "key access applied");
    Ok(Action::Done)
}

/// The nodes that hold key access now (from their Roles' names), so that a node whose last
/// volume went while no controller ran loses it.
pub async fn nodes_with_access(ctx: &Context) -> Result<Vec<String>> {
    let roles: Api<Role> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let list = roles
        .list_metadata(&ListParams::default().labels(&format!("{}=true", labels::NODE_KEYS)))
        .await
        .map_err(|e| Error::kube(format!("list Roles in {}", ctx.namespace), e))?;
    Ok(list
        .items
        .iter()
        .filter_map(|r| r.metadata.name.as_deref())
        .filter_map(|n| n.strip_prefix(naming::NODE_KEYS_ROLE_PREFIX))
        .map(str::to_string)
        .collect())
}

/// Once the caches are synced, queues every node that holds key access now, so that a node
/// whose last volume went while no controller ran loses it (the volume watch queues the
/// nodes that have volumes). Retried with back-off until the list succeeds.
pub(super) async fn stale_key_access(ctx: Arc<Context>, mut shutdown: watch::Receiver<bool>) {
    if !ctx.wait_synced(&mut shutdown).await {
        return;
    }
    let mut failures = 0;
    loop {
        match nodes_with_access(&ctx).await {
            Ok(nodes) => {
                for n in nodes {
                    ctx.enqueue_key_access(&n);
                }
                return;
            }
            Err(e) => {
                failures += 1;
                let delay = backoff(failures, e.kind());
                warn!(error = %e.chain(), ?delay, "cannot list the nodes' key access; retrying");
                tokio::select! {
                    _ = shutdown.changed() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_role_names_exactly_the_secrets_and_never_lists() {
        let r = role("obnvmf", "n1", vec!["liteio-auth-a".into()]);
        assert_eq!(r.metadata.name.as_deref(), Some("liteio-keys-n1"));
        let rules = r.rules.unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(
            rules[0].resource_names,
            Some(vec!["liteio-auth-a".to_string()])
        );
        assert_eq!(rules[0].resources, Some(vec!["secrets".to_string()]));
        assert!(!rules[0].verbs.iter().any(|v| v == "list" || v == "watch"));
        let b = role_binding("obnvmf", "n1");
        let subjects = b.subjects.unwrap();
        assert_eq!(subjects[0].kind, "User");
        assert_eq!(subjects[0].name, "system:node:n1");
        assert_eq!(b.role_ref.name, "liteio-keys-n1");
    }
}
