//! What tests that run SPDK in their own process share (feature `spdk`): a scenario run
//! beside an SPDK runtime, and a consumer's volume keys loaded into that SPDK's keyring as
//! kubelet hands them to a CSI node.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use liteio_api::auth::VolumeKeys;
use liteio_api::{AntstorVolume, keys, naming};
use liteio_spdk::nvmf::HostKeys;
use liteio_spdk::{Spdk, SpdkOptions, keyring};

/// Runs `scenario` within `limit` on a two-thread runtime beside an SPDK runtime named
/// `name` (`poll`: SPDK polls, as its NVMe/TCP initiator needs; else interrupt mode), and
/// stops SPDK afterwards.
pub fn with_spdk<F: Future<Output = ()>>(name: &str, poll: bool, limit: Duration, scenario: F) {
    let mut opts = SpdkOptions {
        name: name.into(),
        ..SpdkOptions::small()
    };
    if poll {
        opts.interrupt_mode = false;
    }
    with_spdk_opts(&opts, limit, scenario);
}

/// [`with_spdk`] with SPDK started from `opts`.
pub fn with_spdk_opts<F: Future<Output = ()>>(opts: &SpdkOptions, limit: Duration, scenario: F) {
    let name = opts.name.clone();
    let spdk = Spdk::start(opts).unwrap_or_else(|e| panic!("SPDK {name} did not start: {e}"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("a tokio runtime: {e}"));
    rt.block_on(async {
        tokio::time::timeout(limit, scenario)
            .await
            .unwrap_or_else(|_| panic!("{name} timed out after {limit:?}"));
    });
    drop(rt);
    spdk.stop();
}

/// Plays kubelet's part for a consumer in this process: reads `vol`'s keys from its Secret
/// and loads them into SPDK's keyring under names of its own (`host-<uuid>`,
/// `ctrl-<uuid>`), for SPDK's initiator (`initiator::attach_tcp_auth`).
pub async fn consumer_keys(client: &Client, vol: &AntstorVolume) -> HostKeys {
    consumer_keys_and_secrets(client, vol).await.0
}

/// [`consumer_keys`], and the keys themselves (to look for them where they must not be).
pub async fn consumer_keys_and_secrets(
    client: &Client,
    vol: &AntstorVolume,
) -> (HostKeys, VolumeKeys) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), keys::DEFAULT_NAMESPACE);
    let name = naming::auth_secret(&vol.csi_name());
    let s = secrets
        .get(&name)
        .await
        .unwrap_or_else(|e| panic!("Secret {name}: {e}"));
    let data = s
        .data
        .as_ref()
        .unwrap_or_else(|| panic!("Secret {name} has no data"));
    let k = VolumeKeys::from_secret_data(data)
        .unwrap_or_else(|e| panic!("Secret {name} holds no volume keys: {e}"));
    let (h, c) = (
        format!("host-{}", vol.spec.uuid),
        format!("ctrl-{}", vol.spec.uuid),
    );
    keyring::add_key(&h, k.host.expose())
        .await
        .unwrap_or_else(|e| panic!("keyring {h}: {e}"));
    keyring::add_key(&c, k.ctrl.expose())
        .await
        .unwrap_or_else(|e| panic!("keyring {c}: {e}"));
    (
        HostKeys {
            dhchap_key: Some(h),
            dhchap_ctrlr_key: Some(c),
            psk: None,
        },
        k,
    )
}
