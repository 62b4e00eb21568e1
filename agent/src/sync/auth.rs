//! The authentication keys of a volume's export.
//!
//! Each exported volume has its own DH-HMAC-CHAP host and controller keys (and a TLS PSK
//! when the volume asks for TLS), kept in one Kubernetes Secret per volume in the agent's
//! namespace, named after the volume's CSI name (`naming::auth_secret`), so that kubelet can
//! hand the same Secret to the CSI node as its node-stage secret. The agent that exports the
//! volume creates the Secret the first time, with fresh random keys, owned by the
//! AntstorVolume (so that it goes away with it), and reads it on every later export: a
//! restarted agent gets the same keys back, and keys replaced in the Secret (`kubectl liteio
//! rotate-keys`) reach the target on the next pass. The keys are never logged: the types
//! print `<redacted>`, and errors name the Secret and the data key only.
//!
//! The Secret is read, patched and deleted with `ctx.keys_client`: in a deployment, the
//! node's own identity (`system:node:<node>`, `--keys-kubeconfig`), to which the controller
//! grants exactly the Secrets of the volumes stored on this node (Role `liteio-keys-<node>`).
//! Creating one needs no such grant (a create cannot read anything) and uses the agent's
//! ServiceAccount.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use liteio_api::AntstorVolume;
use liteio_api::auth::{self, TlsPsk, VolumeKeys};
use liteio_api::{keys, naming};
use tracing::info;

use crate::context::Ctx;
use crate::error::{AgentError, Result, is_not_found};

/// The volume's namespace: its Secret lives beside it (owner references stay in one
/// namespace).
fn namespace(vol: &AntstorVolume) -> String {
    vol.namespace()
        .unwrap_or_else(|| keys::DEFAULT_NAMESPACE.to_string())
}

/// The volume's Secrets as this node's identity sees them (get, patch, delete).
fn secrets(ctx: &Ctx, vol: &AntstorVolume) -> Api<Secret> {
    Api::namespaced(ctx.keys_client.clone(), &namespace(vol))
}

/// A refusal of the node's identity says where the grant comes from, and is counted in
/// `liteio_auth_refusals_total{reason="keys_forbidden"}` (401: `keys_unauthorized`).
fn explain_forbidden(ctx: &Ctx, e: AgentError) -> AgentError {
    if let AgentError::Kube {
        source: kube::Error::Api(s),
        ..
    } = &e
        && s.code == 401
    {
        ctx.metrics.auth_refused("keys_unauthorized");
    }
    match e {
        AgentError::Kube {
            op,
            what,
            source: kube::Error::Api(s),
        } if s.code == 403 => {
            ctx.metrics.auth_refused("keys_forbidden");
            AgentError::Kube {
                op,
                what: format!(
                    "{what} as this node's identity (the controller grants {} the Secrets of \
                 the volumes on this node through Role {}; a new volume is added there \
                 within moments)",
                    naming::node_user(&ctx.node),
                    naming::node_keys_role(&ctx.node)
                ),
                source: kube::Error::Api(s),
            }
        }
        other => other,
    }
}

fn parse(what: &str, s: &Secret) -> Result<VolumeKeys> {
    let empty = BTreeMap::new();
    VolumeKeys::from_secret_data(s.data.as_ref().unwrap_or(&empty)).map_err(|e| {
        AgentError::InvalidObject {
            what: what.to_string(),
            reason: format!("{e}; fix or delete it (a deleted Secret gets new keys)"),
        }
    })
}

/// The keys of `vol`'s export: read from its Secret, or generated and stored there when the
/// Secret does not exist yet (`tls`: with a TLS PSK).
pub async fn volume_keys(ctx: &Ctx, vol: &AntstorVolume, tls: bool) -> Result<VolumeKeys> {
    let name = vol.auth_secret_name();
    let api = secrets(ctx, vol);
    let what = format!("Secret {}/{name}", namespace(vol));
    let stored = ctx
        .timed("get", what.clone(), api.get_opt(&name))
        .await
        .map_err(|e| explain_forbidden(ctx, e))?;
    if let Some(s) = stored {
        let mut keys = parse(&what, &s)?;
        if tls && keys.tls_psk.is_none() {
            // The volume asks for TLS and its Secret has no PSK yet: add one, guarded by
            // the Secret's resourceVersion (a conflict is retried by the next pass).
            let psk = TlsPsk::generate().map_err(|e| AgentError::InvalidObject {
                what: what.clone(),
                reason: format!("cannot generate a TLS PSK: {e}"),
            })?;
            let body = serde_json::json!({
                "metadata": {"resourceVersion": s.resource_version()},
                "data": {auth::DATA_TLS_PSK: k8s_openapi::ByteString(psk.expose().as_bytes().to_vec())},
            });
            ctx.timed(
                "add a TLS PSK to",
                what.clone(),
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&body)),
            )
            .await
            .map_err(|e| explain_forbidden(ctx, e))?;
            info!(secret = %name, "TLS PSK generated");
            keys.tls_psk = Some(psk);
        }
        return Ok(keys);
    }
    let generated = VolumeKeys::generate(tls).map_err(|e| AgentError::InvalidObject {
        what: what.clone(),
        reason: format!("cannot generate keys: {e}"),
    })?;
    let secret = auth::volume_secret(vol, &generated).map_err(|e| AgentError::InvalidObject {
        what: format!("AntstorVolume {}", vol.name_any()),
        reason: e.to_string(),
    })?;
    let own: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace(vol));
    match own.create(&PostParams::default(), &secret).await {
        Ok(_) => {
            info!(secret = %name, "authentication keys generated");
            Ok(generated)
        }
        // Created meanwhile (an earlier pass whose answer was lost): use what is stored.
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let s = ctx
                .timed("get", what.clone(), api.get(&name))
                .await
                .map_err(|e| explain_forbidden(ctx, e))?;
            parse(&what, &s)
        }
        Err(e) => Err(AgentError::kube("create", what, e)),
    }
}

/// Delete `vol`'s Secret (the volume is gone); missing is success.
pub async fn delete_keys(ctx: &Ctx, vol: &AntstorVolume) -> Result<()> {
    let name = vol.auth_secret_name();
    let what = format!("Secret {}/{name}", namespace(vol));
    match secrets(ctx, vol)
        .delete(&name, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(explain_forbidden(ctx, AgentError::kube("delete", what, e))),
    }
}
