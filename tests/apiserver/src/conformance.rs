//! Conformance cases: each one runs against the test server (T1) and, when
//! `LITEIO_TEST_KUBECONFIG` is set, against a real kube-apiserver (T2), so the test server
//! cannot drift from real semantics.
//!
//! A case takes an [`Env`] (a client, a namespace of its own, a name prefix and, on the test
//! server, a [`ServerHandle`]) and returns [`Outcome::Passed`], or [`Outcome::Skipped`] with a
//! reason when it needs the test server's hooks and runs against a real one.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::future::Future;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt, TryStreamExt};
use http_body_util::BodyExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
    WatchEvent, WatchParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::Status;
use kube::runtime::watcher;
use liteio_api::AntstorVolume;
use serde_json::{Value, json};

use crate::faults::{Matcher, Verb};
use crate::{ServerHandle, TestApiServer};

/// A failed case, with a message saying what differed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Failure(pub String);

impl From<kube::Error> for Failure {
    fn from(e: kube::Error) -> Self {
        Failure(format!("kube: {e}"))
    }
}

impl From<serde_json::Error> for Failure {
    fn from(e: serde_json::Error) -> Self {
        Failure(format!("json: {e}"))
    }
}

impl From<crate::Error> for Failure {
    fn from(e: crate::Error) -> Self {
        Failure(format!("test server: {e}"))
    }
}

/// How a case ended when it did not fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every check held.
    Passed,
    /// The case cannot run against this target (the reason says why).
    Skipped(String),
}

/// The result of a case.
pub type CaseResult = Result<Outcome, Failure>;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(Failure(format!($($fmt)+)));
        }
    };
}

/// Where a case runs.
#[derive(Clone)]
pub struct Env {
    /// A client for the target.
    pub client: Client,
    /// A namespace created for this case.
    pub namespace: String,
    /// A prefix for object names, unique per case.
    pub prefix: String,
    /// The test server's hooks; `None` on a real kube-apiserver.
    pub server: Option<ServerHandle>,
}

/// Upper bound for any single wait inside a case.
pub const STEP: Duration = Duration::from_secs(15);

/// Runs `f` with a deadline, failing with a message naming `what`.
pub async fn within<T>(
    limit: Duration,
    what: &str,
    f: impl Future<Output = T>,
) -> Result<T, Failure> {
    tokio::time::timeout(limit, f)
        .await
        .map_err(|_| Failure(format!("timed out after {limit:?} waiting for {what}")))
}

fn unique(case: &str) -> String {
    let short: String = case
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(20)
        .collect();
    format!("{}-{}", short.to_lowercase(), crate::meta::name_suffix())
}

async fn create_namespace(client: &Client, name: &str) -> Result<(), Failure> {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    api.create(&PostParams::default(), &ns).await?;
    Ok(())
}

/// An environment on the in-process test server, with a fresh namespace.
pub async fn test_server_env(server: &TestApiServer, case: &str) -> Result<Env, Failure> {
    let client = server.client().await?;
    let namespace = unique(case);
    create_namespace(&client, &namespace).await?;
    Ok(Env {
        client,
        prefix: "c".to_string(),
        namespace,
        server: Some(server.handle()),
    })
}

/// An environment on a real kube-apiserver reached through the kubeconfig at `path`:
/// installs LiteIO's CRDs by server-side apply, waits until they are Established, and
/// creates a fresh namespace.
pub async fn real_env(path: &str, case: &str) -> Result<Env, Failure> {
    let kubeconfig = Kubeconfig::read_from(path)
        .map_err(|e| Failure(format!("reading kubeconfig {path}: {e}")))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| Failure(format!("kubeconfig {path}: {e}")))?;
    let client = Client::try_from(config)?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let pp = PatchParams::apply("liteio-conformance").force();
    for crd in liteio_api::crd::all() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        crds.patch(&name, &pp, &Patch::Apply(&crd)).await?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let c = crds.get(&name).await?;
            let established = c
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "CRD {name} not Established within 30s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let namespace = unique(case);
    create_namespace(&client, &namespace).await?;
    Ok(Env {
        client,
        prefix: "c".to_string(),
        namespace,
        server: None,
    })
}

/// Deletes the case's objects and namespace (best effort). The objects go first: without
/// kube-controller-manager a real server never empties a deleted namespace.
pub async fn cleanup(env: &Env) {
    let dp = DeleteParams::default();
    let lp = ListParams::default();
    let _ = volumes(env).delete_collection(&dp, &lp).await;
    let _ = leases(env).delete_collection(&dp, &lp).await;
    let api: Api<Namespace> = Api::all(env.client.clone());
    let _ = api.delete(&env.namespace, &DeleteParams::default()).await;
}

fn av() -> ApiResource {
    ApiResource::erase::<AntstorVolume>(&())
}

fn volumes(env: &Env) -> Api<DynamicObject> {
    Api::namespaced_with(env.client.clone(), &env.namespace, &av())
}

fn leases(env: &Env) -> Api<Lease> {
    Api::namespaced(env.client.clone(), &env.namespace)
}

fn volume_json(name: &str, uuid: &str, size: i64) -> Value {
    json!({
        "apiVersion": "volume.antstor.alipay.com/v1",
        "kind": "AntstorVolume",
        "metadata": {"name": name},
        "spec": {"uuid": uuid, "sizeByte": size},
    })
}

fn volume(name: &str) -> Result<DynamicObject, Failure> {
    Ok(serde_json::from_value(volume_json(
        name,
        &format!("uuid-{name}"),
        1024,
    ))?)
}

fn name_of(o: &DynamicObject) -> String {
    o.metadata.name.clone().unwrap_or_default()
}

fn rv_of(o: &DynamicObject) -> String {
    o.metadata.resource_version.clone().unwrap_or_default()
}

/// The `Status` of a failed call, or a failure when the call succeeded or failed otherwise.
fn api_error<T: Debug>(
    r: Result<T, kube::Error>,
    want: u16,
    what: &str,
) -> Result<Box<Status>, Failure> {
    match r {
        Err(kube::Error::Api(s)) if s.code == want => Ok(s),
        Err(kube::Error::Api(s)) => Err(Failure(format!(
            "{what}: expected HTTP {want}, got {} {} ({})",
            s.code, s.reason, s.message
        ))),
        Err(e) => Err(Failure(format!(
            "{what}: expected HTTP {want}, got error {e}"
        ))),
        Ok(v) => Err(Failure(format!(
            "{what}: expected HTTP {want}, got success {v:?}"
        ))),
    }
}

async fn raw(
    env: &Env,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> Result<(u16, Value), Failure> {
    let (code, _, bytes) = raw_bytes(env, method, path, content_type, body).await?;
    Ok((code, serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
}

/// A raw request: the HTTP code, the response's content type and its body.
async fn raw_bytes(
    env: &Env,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> Result<(u16, String, Vec<u8>), Failure> {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .header("accept", "application/json")
        .body(kube::client::Body::from(body.to_vec()))
        .map_err(|e| Failure(format!("building request: {e}")))?;
    let resp = env.client.send(req).await?;
    let code = resp.status().as_u16();
    let response_type = resp
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| Failure(format!("reading response: {e}")))?
        .to_bytes();
    Ok((code, response_type, bytes.to_vec()))
}

fn volumes_path(env: &Env) -> String {
    format!(
        "/apis/volume.antstor.alipay.com/v1/namespaces/{}/antstorvolumes",
        env.namespace
    )
}

/// The next non-bookmark watch event.
async fn next_event<S>(stream: &mut S, what: &str) -> Result<WatchEvent<DynamicObject>, Failure>
where
    S: Stream<Item = Result<WatchEvent<DynamicObject>, kube::Error>> + Unpin,
{
    loop {
        let ev = within(STEP, what, stream.try_next()).await??;
        match ev {
            Some(WatchEvent::Bookmark(_)) => continue,
            Some(ev) => return Ok(ev),
            None => return Err(Failure(format!("watch ended while waiting for {what}"))),
        }
    }
}

fn describe(ev: &WatchEvent<DynamicObject>) -> String {
    match ev {
        WatchEvent::Added(o) => format!("ADDED {}", name_of(o)),
        WatchEvent::Modified(o) => format!("MODIFIED {}", name_of(o)),
        WatchEvent::Deleted(o) => format!("DELETED {}", name_of(o)),
        WatchEvent::Bookmark(b) => format!("BOOKMARK {}", b.metadata.resource_version),
        WatchEvent::Error(s) => format!("ERROR {} {}", s.code, s.message),
    }
}

async fn names(api: &Api<DynamicObject>, lp: &ListParams) -> Result<BTreeSet<String>, Failure> {
    Ok(api.list(lp).await?.items.iter().map(name_of).collect())
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// Create, get, list, replace and delete an AntstorVolume; AlreadyExists and NotFound.
pub async fn crud_antstorvolume(env: Env) -> CaseResult {
    let api = volumes(&env);
    let name = format!("{}-vol", env.prefix);
    let created = api.create(&PostParams::default(), &volume(&name)?).await?;
    ensure!(
        created
            .metadata
            .uid
            .as_deref()
            .is_some_and(|u| u.len() == 36),
        "uid not set: {:?}",
        created.metadata.uid
    );
    ensure!(!rv_of(&created).is_empty(), "resourceVersion not set");
    ensure!(
        created.metadata.generation == Some(1),
        "generation {:?}, want 1",
        created.metadata.generation
    );
    ensure!(
        created.metadata.creation_timestamp.is_some(),
        "creationTimestamp not set"
    );
    ensure!(
        created.data["spec"]["type"] == json!("Flexible"),
        "schema default spec.type not applied: {}",
        created.data["spec"]
    );
    let s = api_error(
        api.create(&PostParams::default(), &volume(&name)?).await,
        409,
        "second create",
    )?;
    ensure!(
        s.reason == "AlreadyExists",
        "reason {}, want AlreadyExists",
        s.reason
    );
    let got = api.get(&name).await?;
    ensure!(
        got.metadata.uid == created.metadata.uid,
        "get returned another uid"
    );
    ensure!(
        names(&api, &ListParams::default()).await?.contains(&name),
        "list misses {name}"
    );
    let mut changed = got.clone();
    changed.data["spec"]["sizeByte"] = json!(2048);
    let replaced = api.replace(&name, &PostParams::default(), &changed).await?;
    ensure!(
        replaced.data["spec"]["sizeByte"] == json!(2048),
        "replace did not change spec"
    );
    ensure!(
        replaced.metadata.generation == Some(2),
        "generation {:?} after spec change, want 2",
        replaced.metadata.generation
    );
    ensure!(
        rv_of(&replaced) != rv_of(&got),
        "resourceVersion did not change on update"
    );
    api.delete(&name, &DeleteParams::default()).await?;
    let s = api_error(api.get(&name).await, 404, "get after delete")?;
    ensure!(s.reason == "NotFound", "reason {}, want NotFound", s.reason);
    api_error(
        api.delete(&name, &DeleteParams::default()).await,
        404,
        "second delete",
    )?;
    Ok(Outcome::Passed)
}

/// Create, get, replace (conditional and unconditional) and delete a Lease.
pub async fn crud_lease(env: Env) -> CaseResult {
    let api = leases(&env);
    let name = format!("{}-lease", env.prefix);
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15},
    }))?;
    let created = api.create(&PostParams::default(), &lease).await?;
    let mut l = api.get(&name).await?;
    ensure!(
        l.metadata.uid == created.metadata.uid,
        "get returned another uid"
    );
    if let Some(spec) = l.spec.as_mut() {
        spec.holder_identity = Some("b".into());
    }
    let replaced = api.replace(&name, &PostParams::default(), &l).await?;
    ensure!(
        replaced
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            == Some("b"),
        "replace did not change holderIdentity"
    );
    // Leases do not allow unconditional updates (the Lease strategy's
    // `AllowUnconditionalUpdate()` is false), so leader election cannot lose a race silently.
    let mut unconditional = replaced.clone();
    unconditional.metadata.resource_version = None;
    if let Some(spec) = unconditional.spec.as_mut() {
        spec.holder_identity = Some("c".into());
    }
    let s = api_error(
        api.replace(&name, &PostParams::default(), &unconditional)
            .await,
        422,
        "Lease PUT without resourceVersion",
    )?;
    let want = format!(
        "leases.coordination.k8s.io \"{name}\" is invalid: metadata.resourceVersion: \
         Invalid value: 0x0: must be specified for an update"
    );
    ensure!(
        s.reason == "Invalid" && s.message == want,
        "{} {:?}, want Invalid {want:?}",
        s.reason,
        s.message
    );
    let cause = s
        .details
        .as_ref()
        .and_then(|d| d.causes.first())
        .map(|c| (c.field.clone(), c.message.clone()));
    ensure!(
        cause
            == Some((
                "metadata.resourceVersion".to_string(),
                "Invalid value: 0x0: must be specified for an update".to_string()
            )),
        "cause {cause:?}"
    );
    let kept = api.get(&name).await?;
    ensure!(
        kept.spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            == Some("b"),
        "a rejected unconditional PUT changed the Lease"
    );
    api.delete(&name, &DeleteParams::default()).await?;
    api_error(api.get(&name).await, 404, "get after delete")?;
    Ok(Outcome::Passed)
}

/// `metadata.generateName` yields distinct names with a 5-character suffix.
pub async fn generate_name(env: Env) -> CaseResult {
    let api = volumes(&env);
    let prefix = format!("{}-gen-", env.prefix);
    let mut body = volume_json("", "uuid-gen", 1);
    body["metadata"] = json!({"generateName": prefix});
    let obj: DynamicObject = serde_json::from_value(body)?;
    let a = api.create(&PostParams::default(), &obj).await?;
    let b = api.create(&PostParams::default(), &obj).await?;
    for o in [&a, &b] {
        let n = name_of(o);
        ensure!(
            n.starts_with(&prefix) && n.len() == prefix.len() + 5,
            "generated name {n:?}"
        );
    }
    ensure!(
        name_of(&a) != name_of(&b),
        "generateName produced the same name twice"
    );
    Ok(Outcome::Passed)
}

async fn labelled_volumes(env: &Env) -> Result<Api<DynamicObject>, Failure> {
    let api = volumes(env);
    for (n, labels) in [
        ("a", json!({"tier": "db", "app": "x"})),
        ("b", json!({"tier": "web", "app": "x"})),
        ("c", json!({"app": "y"})),
    ] {
        let mut v = volume_json(n, &format!("uuid-{n}"), 1);
        v["metadata"]["labels"] = labels;
        api.create(&PostParams::default(), &serde_json::from_value(v)?)
            .await?;
    }
    Ok(api)
}

/// Every label selector operator.
pub async fn label_selectors(env: Env) -> CaseResult {
    let api = labelled_volumes(&env).await?;
    for (sel, want) in [
        ("tier=db", set(&["a"])),
        ("tier==db", set(&["a"])),
        ("tier!=db", set(&["b", "c"])),
        ("tier in (db,web)", set(&["a", "b"])),
        ("tier notin (db)", set(&["b", "c"])),
        ("tier", set(&["a", "b"])),
        ("!tier", set(&["c"])),
        ("app=x,tier!=web", set(&["a"])),
    ] {
        let got = names(&api, &ListParams::default().labels(sel)).await?;
        ensure!(
            got == want,
            "labelSelector {sel:?}: got {got:?}, want {want:?}"
        );
    }
    Ok(Outcome::Passed)
}

/// Field selectors on metadata.name and metadata.namespace (= and !=).
pub async fn field_selectors(env: Env) -> CaseResult {
    let api = labelled_volumes(&env).await?;
    for (sel, want) in [
        ("metadata.name=a".to_string(), set(&["a"])),
        ("metadata.name==b".to_string(), set(&["b"])),
        ("metadata.name!=a".to_string(), set(&["b", "c"])),
        (
            format!("metadata.namespace={}", env.namespace),
            set(&["a", "b", "c"]),
        ),
        (format!("metadata.namespace!={}", env.namespace), set(&[])),
    ] {
        let got = names(&api, &ListParams::default().fields(&sel)).await?;
        ensure!(
            got == want,
            "fieldSelector {sel:?}: got {got:?}, want {want:?}"
        );
    }
    let all: Api<DynamicObject> = Api::all_with(env.client.clone(), &av());
    let got = names(
        &all,
        &ListParams::default().fields(&format!("metadata.namespace={}", env.namespace)),
    )
    .await?;
    ensure!(
        got == set(&["a", "b", "c"]),
        "cluster-wide list by namespace: {got:?}"
    );
    Ok(Outcome::Passed)
}

/// Bad selectors are 400 BadRequest.
pub async fn bad_selectors(env: Env) -> CaseResult {
    let api = volumes(&env);
    for sel in ["tier in db", "a b c", "tier=(x"] {
        let s = api_error(api.list(&ListParams::default().labels(sel)).await, 400, sel)?;
        ensure!(s.reason == "BadRequest", "{sel}: reason {}", s.reason);
    }
    api_error(
        api.list(&ListParams::default().fields("spec.uuid=x")).await,
        400,
        "unsupported field label",
    )?;
    Ok(Outcome::Passed)
}

/// ADDED, MODIFIED, DELETED arrive in order on a watch.
pub async fn watch_event_order(env: Env) -> CaseResult {
    let api = volumes(&env);
    let rv = api
        .list(&ListParams::default())
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let mut stream = api
        .watch(&WatchParams::default().timeout(60), &rv)
        .await?
        .boxed();
    let name = format!("{}-w", env.prefix);
    api.create(&PostParams::default(), &volume(&name)?).await?;
    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})),
    )
    .await?;
    api.delete(&name, &DeleteParams::default()).await?;
    let mut seen = Vec::new();
    for what in ["ADDED", "MODIFIED", "DELETED"] {
        seen.push(describe(&next_event(&mut stream, what).await?));
    }
    let want = vec![
        format!("ADDED {name}"),
        format!("MODIFIED {name}"),
        format!("DELETED {name}"),
    ];
    ensure!(seen == want, "events {seen:?}, want {want:?}");
    Ok(Outcome::Passed)
}

/// A watch from a resourceVersion replays exactly the later changes; with a selector an
/// object that starts matching arrives as ADDED.
pub async fn watch_resume(env: Env) -> CaseResult {
    let api = volumes(&env);
    let a = format!("{}-a", env.prefix);
    let b = format!("{}-b", env.prefix);
    let created = api.create(&PostParams::default(), &volume(&a)?).await?;
    let from = rv_of(&created);
    api.patch(
        &a,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"sizeByte": 5}})),
    )
    .await?;
    let mut vb = volume(&b)?;
    vb.metadata.labels = Some([("pick".to_string(), "yes".to_string())].into());
    api.create(&PostParams::default(), &vb).await?;
    let mut stream = api
        .watch(&WatchParams::default().timeout(60), &from)
        .await?
        .boxed();
    let first = describe(&next_event(&mut stream, "MODIFIED a").await?);
    let second = describe(&next_event(&mut stream, "ADDED b").await?);
    ensure!(
        first == format!("MODIFIED {a}") && second == format!("ADDED {b}"),
        "resumed events {first:?}, {second:?}"
    );

    let mut picked = api
        .watch(
            &WatchParams::default().labels("pick=yes").timeout(60),
            &from,
        )
        .await?
        .boxed();
    let ev = describe(&next_event(&mut picked, "ADDED b (selector)").await?);
    ensure!(ev == format!("ADDED {b}"), "selector watch: {ev}");
    api.patch(
        &a,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"pick": "yes"}}})),
    )
    .await?;
    let ev = describe(&next_event(&mut picked, "a starts matching").await?);
    ensure!(
        ev == format!("ADDED {a}"),
        "an object entering the selector: {ev}, want ADDED {a}"
    );
    api.patch(
        &a,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"pick": "no"}}})),
    )
    .await?;
    let ev = describe(&next_event(&mut picked, "a stops matching").await?);
    ensure!(
        ev == format!("DELETED {a}"),
        "an object leaving the selector: {ev}, want DELETED {a}"
    );
    Ok(Outcome::Passed)
}

/// A watch from a resourceVersion older than the retained window gets 410 Gone.
///
/// On the test server the window is shrunk and churned past; on a real server
/// resourceVersion "1" is older than any watch cache window.
pub async fn watch_expired_gone(env: Env) -> CaseResult {
    let api = volumes(&env);
    let from = match &env.server {
        Some(server) => {
            let from = server.resource_version().to_string();
            server.set_event_window(8);
            let name = format!("{}-churn", env.prefix);
            api.create(&PostParams::default(), &volume(&name)?).await?;
            for i in 0..12 {
                api.patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"sizeByte": i}})),
                )
                .await?;
            }
            server.set_event_window(10_000);
            from
        }
        None => "1".to_string(),
    };
    // kube-apiserver (watch cache on, the default) accepts the watch and sends one ERROR
    // event: `410 Expired "too old resource version: <asked> (<oldest>)"`.
    let mut stream = api
        .watch(&WatchParams::default().timeout(60), &from)
        .await
        .map_err(|e| Failure(format!("watch from {from}: {e}, want an ERROR event")))?
        .boxed();
    match next_event(&mut stream, "410 ERROR event").await? {
        WatchEvent::Error(s) => {
            ensure!(s.code == 410, "ERROR event code {}, want 410", s.code);
            ensure!(s.reason == "Expired", "reason {}, want Expired", s.reason);
            ensure!(
                s.message
                    .starts_with(&format!("too old resource version: {from} (")),
                "message {:?}",
                s.message
            );
        }
        other => {
            return Err(Failure(format!(
                "watch from {from}: {}, want ERROR 410",
                describe(&other)
            )));
        }
    }
    Ok(Outcome::Passed)
}

/// kube-rs's `watcher`, driven by its own task so it reconnects while the case waits.
struct Watcher {
    rx: tokio::sync::mpsc::UnboundedReceiver<Result<watcher::Event<DynamicObject>, String>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn spawn_watcher(api: Api<DynamicObject>) -> Watcher {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default()).boxed();
        while let Some(ev) = stream.next().await {
            if tx.send(ev.map_err(|e| e.to_string())).is_err() {
                return;
            }
        }
    });
    Watcher { rx, task }
}

async fn next_applied(w: &mut Watcher, want: &str) -> Result<(), Failure> {
    loop {
        let ev = within(STEP, want, w.rx.recv()).await?;
        match ev {
            Some(Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)))
                if name_of(&o) == want =>
            {
                return Ok(());
            }
            Some(_) => continue,
            None => return Err(Failure(format!("watcher ended before {want}"))),
        }
    }
}

/// kube-rs's `watcher` sees later objects after a dropped watch and after 410 Gone.
pub async fn watcher_recovers(env: Env) -> CaseResult {
    let api = volumes(&env);
    let mut stream = spawn_watcher(api.clone());
    api.create(
        &PostParams::default(),
        &volume(&format!("{}-1", env.prefix))?,
    )
    .await?;
    next_applied(&mut stream, &format!("{}-1", env.prefix)).await?;
    let Some(server) = env.server.clone() else {
        return Ok(Outcome::Passed);
    };
    let faults = server.faults();
    let lists = faults.requests(Verb::List, "antstorvolumes");
    // A dropped watch: the watcher re-watches from its last resourceVersion.
    wait_for_requests(&faults, Verb::Watch, 1, "the watcher's first watch").await?;
    faults.drop_watches("antstorvolumes");
    api.create(
        &PostParams::default(),
        &volume(&format!("{}-2", env.prefix))?,
    )
    .await?;
    next_applied(&mut stream, &format!("{}-2", env.prefix)).await?;
    // Hold the next re-watch back, compact while it waits: it arrives with a resourceVersion
    // older than the compaction, gets 410 Gone, and the watcher relists.
    wait_for_requests(&faults, Verb::Watch, 2, "the watcher's second watch").await?;
    faults.delay(
        Matcher::new(Verb::Watch, "antstorvolumes"),
        Duration::from_secs(1),
    );
    faults.drop_watches("antstorvolumes");
    wait_for_requests(&faults, Verb::Watch, 3, "the held re-watch").await?;
    let lease: Lease =
        serde_json::from_value(json!({"metadata": {"name": format!("{}-bump", env.prefix)}}))?;
    leases(&env).create(&PostParams::default(), &lease).await?;
    server.compact();
    faults.clear();
    api.create(
        &PostParams::default(),
        &volume(&format!("{}-3", env.prefix))?,
    )
    .await?;
    next_applied(&mut stream, &format!("{}-3", env.prefix)).await?;
    let relists = faults.requests(Verb::List, "antstorvolumes") - lists;
    ensure!(relists >= 1, "the watcher did not relist after 410 Gone");
    Ok(Outcome::Passed)
}

/// An update with a stale resourceVersion is 409 Conflict; a CRD update without one is 422.
pub async fn stale_update_conflict(env: Env) -> CaseResult {
    let api = volumes(&env);
    let name = format!("{}-stale", env.prefix);
    api.create(&PostParams::default(), &volume(&name)?).await?;
    let first = api.get(&name).await?;
    let mut a = first.clone();
    a.data["spec"]["sizeByte"] = json!(10);
    api.replace(&name, &PostParams::default(), &a).await?;
    let mut b = first.clone();
    b.data["spec"]["sizeByte"] = json!(20);
    let s = api_error(
        api.replace(&name, &PostParams::default(), &b).await,
        409,
        "stale replace",
    )?;
    ensure!(s.reason == "Conflict", "reason {}", s.reason);
    ensure!(
        s.message.contains("the object has been modified"),
        "message {:?}",
        s.message
    );
    let mut c = api.get(&name).await?;
    c.metadata.resource_version = None;
    let s = api_error(
        api.replace(&name, &PostParams::default(), &c).await,
        422,
        "custom resource PUT without resourceVersion",
    )?;
    let want = format!(
        "antstorvolumes.volume.antstor.alipay.com \"{name}\" is invalid: \
         metadata.resourceVersion: Invalid value: 0x0: must be specified for an update"
    );
    ensure!(s.message == want, "message {:?}, want {want:?}", s.message);
    Ok(Outcome::Passed)
}

/// Two writers race for a Lease: the second write on the same resourceVersion conflicts,
/// a re-read and retry wins.
pub async fn lease_two_writers(env: Env) -> CaseResult {
    let api = leases(&env);
    let name = format!("{}-leader", env.prefix);
    let lease: Lease = serde_json::from_value(
        json!({"metadata": {"name": name}, "spec": {"holderIdentity": "none"}}),
    )?;
    api.create(&PostParams::default(), &lease).await?;
    let seen_a = api.get(&name).await?;
    let seen_b = api.get(&name).await?;
    let take = |mut l: Lease, who: &str| {
        if let Some(s) = l.spec.as_mut() {
            s.holder_identity = Some(who.to_string());
        }
        l
    };
    api.replace(&name, &PostParams::default(), &take(seen_a, "a"))
        .await?;
    api_error(
        api.replace(&name, &PostParams::default(), &take(seen_b, "b"))
            .await,
        409,
        "second writer",
    )?;
    let fresh = api.get(&name).await?;
    ensure!(
        fresh
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            == Some("a"),
        "holder after race"
    );
    api.replace(&name, &PostParams::default(), &take(fresh, "b"))
        .await?;
    let last = api.get(&name).await?;
    ensure!(
        last.spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            == Some("b"),
        "holder after retry"
    );
    Ok(Outcome::Passed)
}

/// Delete with a finalizer only marks; removing the last finalizer deletes (DELETED event).
pub async fn finalizer_deletion(env: Env) -> CaseResult {
    let api = volumes(&env);
    let name = format!("{}-fin", env.prefix);
    let mut v = volume(&name)?;
    v.metadata.finalizers = Some(vec!["liteio.test/protect".into()]);
    let created = api.create(&PostParams::default(), &v).await?;
    let mut stream = api
        .watch(&WatchParams::default().timeout(60), &rv_of(&created))
        .await?
        .boxed();
    let answer = api.delete(&name, &DeleteParams::default()).await?;
    ensure!(
        answer
            .clone()
            .left()
            .is_some_and(|o| o.metadata.deletion_timestamp.is_some()),
        "delete of an object with finalizers answered {:?}, want the marked object",
        answer.right()
    );
    let marked = api.get(&name).await?;
    ensure!(
        marked.metadata.deletion_timestamp.is_some(),
        "deletionTimestamp not set"
    );
    match next_event(&mut stream, "MODIFIED with deletionTimestamp").await? {
        WatchEvent::Modified(o) if o.metadata.deletion_timestamp.is_some() => {}
        other => return Err(Failure(format!("after delete: {}", describe(&other)))),
    }
    let s = api_error(
        api.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"finalizers": ["liteio.test/protect", "liteio.test/new"]}}),
            ),
        )
        .await,
        422,
        "adding a finalizer while deleting",
    )?;
    ensure!(s.message.contains("finalizers"), "message {:?}", s.message);
    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    api_error(
        api.get(&name).await,
        404,
        "get after the last finalizer went",
    )?;
    match next_event(&mut stream, "DELETED").await? {
        WatchEvent::Deleted(o) if name_of(&o) == name => {}
        other => {
            return Err(Failure(format!(
                "after finalizer removal: {}",
                describe(&other)
            )));
        }
    }
    Ok(Outcome::Passed)
}

/// Writes to /status change only status; writes to the object never change status;
/// generation follows spec only.
pub async fn status_subresource(env: Env) -> CaseResult {
    let api = volumes(&env);
    let name = format!("{}-st", env.prefix);
    let mut body = volume_json(&name, "uuid-st", 1);
    body["status"] = json!({"status": "ready", "msg": "from create"});
    let created = api
        .create(&PostParams::default(), &serde_json::from_value(body)?)
        .await?;
    ensure!(
        created.data.get("status").is_none_or(Value::is_null),
        "status kept on create: {}",
        created.data["status"]
    );
    let st = api
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"status": "ready", "msg": "m"}, "spec": {"sizeByte": 99}}),
            ),
        )
        .await?;
    ensure!(
        st.data["status"]["msg"] == json!("m"),
        "status patch not applied: {}",
        st.data["status"]
    );
    ensure!(
        st.data["spec"]["sizeByte"] == json!(1),
        "status patch changed spec: {}",
        st.data["spec"]
    );
    ensure!(
        st.metadata.generation == Some(1),
        "status write bumped generation to {:?}",
        st.metadata.generation
    );
    let main = api
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"sizeByte": 7}, "status": {"msg": "ignored"}})),
        )
        .await?;
    ensure!(
        main.data["spec"]["sizeByte"] == json!(7),
        "spec patch not applied"
    );
    ensure!(
        main.data["status"]["msg"] == json!("m"),
        "main-resource write changed status: {}",
        main.data["status"]
    );
    ensure!(
        main.metadata.generation == Some(2),
        "generation {:?} after spec change, want 2",
        main.metadata.generation
    );
    let mut whole = main.clone();
    whole.data["spec"]["sizeByte"] = json!(1234);
    whole.data["status"]["msg"] = json!("via put");
    let put = api
        .replace_status(&name, &PostParams::default(), &whole)
        .await?;
    ensure!(
        put.data["status"]["msg"] == json!("via put"),
        "PUT /status not applied"
    );
    ensure!(
        put.data["spec"]["sizeByte"] == json!(7),
        "PUT /status changed spec"
    );
    let labelled = api
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"l": "v"}}})),
        )
        .await?;
    ensure!(
        labelled.metadata.generation == Some(2),
        "metadata-only change bumped generation"
    );
    Ok(Outcome::Passed)
}

/// RFC 7386 merge patch: add, replace, and remove with null.
pub async fn merge_patch(env: Env) -> CaseResult {
    let api = volumes(&env);
    let name = format!("{}-mp", env.prefix);
    let mut v = volume(&name)?;
    v.metadata.labels = Some(
        [
            ("keep".to_string(), "1".to_string()),
            ("drop".to_string(), "1".to_string()),
        ]
        .into(),
    );
    api.create(&PostParams::default(), &v).await?;
    let p = json!({"metadata": {"labels": {"drop": null, "new": "2"}}, "spec": {"targetNodeId": "node-1"}});
    let out = api
        .patch(&name, &PatchParams::default(), &Patch::Merge(p))
        .await?;
    let labels = out.metadata.labels.clone().unwrap_or_default();
    ensure!(
        labels.get("keep").map(String::as_str) == Some("1")
            && labels.get("new").map(String::as_str) == Some("2")
            && !labels.contains_key("drop"),
        "labels {labels:?}"
    );
    ensure!(
        out.data["spec"]["targetNodeId"] == json!("node-1"),
        "spec {}",
        out.data["spec"]
    );
    ensure!(
        out.data["spec"]["uuid"] == json!(format!("uuid-{name}")),
        "merge patch lost spec.uuid"
    );
    Ok(Outcome::Passed)
}

/// RFC 6902 JSON patch, and a failing `test` op giving 422 and no change.
pub async fn json_patch(env: Env) -> CaseResult {
    let api = volumes(&env);
    let name = format!("{}-jp", env.prefix);
    api.create(&PostParams::default(), &volume(&name)?).await?;
    let ops: json_patch::Patch = serde_json::from_value(json!([
        {"op": "add", "path": "/metadata/labels", "value": {"x": "1"}},
        {"op": "replace", "path": "/spec/sizeByte", "value": 4096},
        {"op": "test", "path": "/spec/sizeByte", "value": 4096},
    ]))?;
    let out = api
        .patch(&name, &PatchParams::default(), &Patch::<()>::Json(ops))
        .await?;
    ensure!(
        out.data["spec"]["sizeByte"] == json!(4096),
        "json patch: spec {}",
        out.data["spec"]
    );
    ensure!(
        out.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("x"))
            .map(String::as_str)
            == Some("1"),
        "json patch: labels"
    );
    let failing: json_patch::Patch = serde_json::from_value(json!([
        {"op": "replace", "path": "/spec/sizeByte", "value": 1},
        {"op": "test", "path": "/spec/uuid", "value": "something-else"},
    ]))?;
    api_error(
        api.patch(&name, &PatchParams::default(), &Patch::<()>::Json(failing))
            .await,
        422,
        "failing test op",
    )?;
    let after = api.get(&name).await?;
    ensure!(
        rv_of(&after) == rv_of(&out) && after.data["spec"]["sizeByte"] == json!(4096),
        "a failed JSON patch changed the object"
    );
    Ok(Outcome::Passed)
}

/// Server-side apply as kube-rs sends it: creates, updates, records the manager, and drops
/// fields the manager stopped applying.
pub async fn server_side_apply(env: Env) -> CaseResult {
    let api = volumes(&env);
    let name = format!("{}-ssa", env.prefix);
    let pp = PatchParams::apply("conformance-a").force();
    let mut cfg = volume_json(&name, "uuid-ssa", 100);
    cfg["metadata"]["labels"] = json!({"one": "1", "two": "2"});
    let created = api.patch(&name, &pp, &Patch::Apply(&cfg)).await?;
    ensure!(
        created.data["spec"]["sizeByte"] == json!(100),
        "apply did not create: {}",
        created.data
    );
    let managers: Vec<(String, String)> = created
        .metadata
        .managed_fields
        .clone()
        .unwrap_or_default()
        .iter()
        .map(|m| {
            (
                m.manager.clone().unwrap_or_default(),
                m.operation.clone().unwrap_or_default(),
            )
        })
        .collect();
    ensure!(
        managers.contains(&("conformance-a".to_string(), "Apply".to_string())),
        "managedFields {managers:?}"
    );
    cfg["spec"]["sizeByte"] = json!(200);
    cfg["metadata"]["labels"] = json!({"one": "1"});
    let updated = api.patch(&name, &pp, &Patch::Apply(&cfg)).await?;
    ensure!(
        updated.data["spec"]["sizeByte"] == json!(200),
        "apply did not update spec"
    );
    let labels = updated.metadata.labels.clone().unwrap_or_default();
    ensure!(
        labels.contains_key("one") && !labels.contains_key("two"),
        "a label no longer applied was kept: {labels:?}"
    );
    ensure!(
        updated.metadata.generation == Some(2),
        "generation {:?}",
        updated.metadata.generation
    );
    Ok(Outcome::Passed)
}

/// Invalid objects are 422 Invalid naming the field, worded exactly as kube-apiserver 1.26
/// words them (message, and each cause's field and body).
pub async fn invalid_objects(env: Env) -> CaseResult {
    let api = volumes(&env);
    let p = &env.prefix;
    let qualified = |name: &str| format!("AntstorVolume.volume.antstor.alipay.com \"{name}\"");
    let cases = [
        (
            format!("{p}-empty"),
            "",
            1,
            None,
            (
                "spec",
                "Invalid value: \"object\": spec.uuid must not be empty",
            ),
        ),
        (
            format!("{p}-enum"),
            "u",
            1,
            Some("Nowhere"),
            (
                "spec.positionAdvice",
                "Unsupported value: \"Nowhere\": supported values: \"MustLocal\", \
                 \"PreferLocal\", \"PreferRemote\", \"MustRemote\", \"\"",
            ),
        ),
        (
            format!("{p}-neg"),
            "u",
            -1,
            None,
            (
                "spec.sizeByte",
                "Invalid value: -1: spec.sizeByte in body should be greater than or equal to 0",
            ),
        ),
    ];
    for (name, uuid, size, advice, (field, body)) in cases {
        let mut v = volume_json(&name, uuid, size);
        if let Some(a) = advice {
            v["spec"]["positionAdvice"] = json!(a);
        }
        let obj: DynamicObject = serde_json::from_value(v)?;
        let s = api_error(api.create(&PostParams::default(), &obj).await, 422, &name)?;
        ensure!(s.reason == "Invalid", "{name}: reason {}", s.reason);
        let want = format!("{} is invalid: {field}: {body}", qualified(&name));
        ensure!(s.message == want, "message {:?}, want {want:?}", s.message);
        let causes: Vec<(String, String)> = s
            .details
            .as_ref()
            .map(|d| {
                d.causes
                    .iter()
                    .map(|c| (c.field.clone(), c.message.clone()))
                    .collect()
            })
            .unwrap_or_default();
        ensure!(
            causes == vec![(field.to_string(), body.to_string())],
            "{name}: causes {causes:?}"
        );
    }
    let name = format!("{p}-imm");
    api.create(&PostParams::default(), &volume(&name)?).await?;
    let s = api_error(
        api.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"uuid": "other"}})),
        )
        .await,
        422,
        "changing spec.uuid",
    )?;
    let want = format!(
        "{} is invalid: spec: Invalid value: \"object\": spec.uuid is immutable",
        qualified(&name)
    );
    ensure!(s.message == want, "message {:?}, want {want:?}", s.message);
    Ok(Outcome::Passed)
}

/// Request details kube-apiserver 1.26 gets right and components may meet: the
/// `kind`/`apiVersion` checks of a custom resource, validation rules skipped after a
/// blocking schema error, name validation, delete preconditions, what DELETE answers (the
/// object while finalizers hold it, else a success `Status`) and the wording of an
/// unsupported field selector on a built-in without field-label conversion.
pub async fn request_details(env: Env) -> CaseResult {
    let path = volumes_path(&env);
    let av = "volume.antstor.alipay.com/v1";
    let post = |body: Value| {
        let env = env.clone();
        let path = path.clone();
        async move {
            raw(
                &env,
                "POST",
                &path,
                "application/json",
                body.to_string().as_bytes(),
            )
            .await
        }
    };
    let spec = json!({"uuid": "u", "sizeByte": 1});

    let (code, body) =
        post(json!({"apiVersion": av, "metadata": {"name": "nokind"}, "spec": spec})).await?;
    ensure!(
        code == 400
            && body["reason"] == json!("BadRequest")
            && body["message"].as_str().is_some_and(|m| m.starts_with(
                "the object provided is unrecognized (must be of type AntstorVolume): \
                 Object 'Kind' is missing in "
            )),
        "no kind: HTTP {code} {body}"
    );
    let (code, body) =
        post(json!({"kind": "AntstorVolume", "metadata": {"name": "noav"}, "spec": spec})).await?;
    ensure!(
        code == 400
            && body["message"]
                == json!(format!(
                    "the API version in the data () does not match the expected API version ({av})"
                )),
        "no apiVersion: HTTP {code} {body}"
    );
    let (code, body) = post(
        json!({"apiVersion": av, "kind": "StoragePool", "metadata": {"name": "k"}, "spec": spec}),
    )
    .await?;
    ensure!(
        code == 422
            && body["message"]
                == json!(
                    "StoragePool.volume.antstor.alipay.com \"k\" is invalid: kind: Invalid \
                     value: \"StoragePool\": must be AntstorVolume"
                ),
        "other kind: HTTP {code} {body}"
    );
    let (code, body) = post(
        json!({"apiVersion": av, "kind": "AntstorVolume", "metadata": {"name": "t"},
        "spec": {"uuid": "", "sizeByte": "big"}}),
    )
    .await?;
    ensure!(
        code == 422
            && body["message"]
                == json!(
                    "AntstorVolume.volume.antstor.alipay.com \"t\" is invalid: [spec.sizeByte: \
                     Invalid value: \"string\": spec.sizeByte in body must be of type integer: \
                     \"string\", <nil>: Invalid value: \"null\": some validation rules were not \
                     checked because the object was invalid; correct the existing errors to \
                     complete validation]"
                ),
        "type error: HTTP {code} {body}"
    );
    let (code, body) = post(json!({"apiVersion": av, "kind": "AntstorVolume", "metadata": {"name": "Bad_Name"}, "spec": spec})).await?;
    ensure!(
        code == 422
            && body["message"]
                == json!(
                    "AntstorVolume.volume.antstor.alipay.com \"Bad_Name\" is invalid: \
                     metadata.name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain \
                     must consist of lower case alphanumeric characters, '-' or '.', and must \
                     start and end with an alphanumeric character (e.g. 'example.com', regex \
                     used for validation is \
                     '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
                ),
        "bad name: HTTP {code} {body}"
    );

    let api = volumes(&env);
    let name = format!("{}-del", env.prefix);
    let created = api.create(&PostParams::default(), &volume(&name)?).await?;
    let uid = created.metadata.uid.clone().unwrap_or_default();
    let wrong_uid = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some("wrong".into()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let s = api_error(
        api.delete(&name, &wrong_uid).await,
        409,
        "delete with another uid",
    )?;
    let want = format!(
        "Operation cannot be fulfilled on AntstorVolume.volume.antstor.alipay.com \"{name}\": \
         the UID in the precondition (wrong) does not match the UID in record ({uid}). The \
         object might have been deleted and then recreated"
    );
    ensure!(s.message == want, "message {:?}, want {want:?}", s.message);
    let stale_rv = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: None,
            resource_version: Some("1".into()),
        }),
        ..DeleteParams::default()
    };
    let s = api_error(
        api.delete(&name, &stale_rv).await,
        409,
        "delete with an old resourceVersion",
    )?;
    let want = format!(
        "Operation cannot be fulfilled on AntstorVolume.volume.antstor.alipay.com \"{name}\": \
         the ResourceVersion in the precondition (1) does not match the ResourceVersion in \
         record ({}). The object might have been modified",
        rv_of(&created)
    );
    ensure!(s.message == want, "message {:?}, want {want:?}", s.message);
    let answer = api.delete(&name, &DeleteParams::default()).await?;
    ensure!(
        answer.clone().right().is_some_and(|s| s.status
            == Some(kube::core::response::StatusSummary::Success)
            && s.details.as_ref().is_some_and(|d| d.name == name
                && d.group == "volume.antstor.alipay.com"
                && d.kind == "antstorvolumes"
                && d.uid == uid)),
        "deleting a custom resource answered {:?}, want a success Status",
        answer
    );

    let leases = leases(&env);
    let lname = format!("{}-l", env.prefix);
    let lease: Lease = serde_json::from_value(json!({"metadata": {"name": lname}}))?;
    let l = leases.create(&PostParams::default(), &lease).await?;
    let answer = leases.delete(&lname, &DeleteParams::default()).await?;
    let Some(s) = answer.clone().right() else {
        return Err(Failure(format!(
            "deleting a Lease answered the object {:?}, want a success Status",
            answer.left().and_then(|o| o.metadata.name)
        )));
    };
    ensure!(
        s.status == Some(kube::core::response::StatusSummary::Success)
            && s.details.as_ref().is_some_and(|d| d.name == lname
                && d.group == "coordination.k8s.io"
                && d.kind == "leases"
                && l.metadata.uid.as_deref() == Some(d.uid.as_str())),
        "Lease delete answered {s:?}"
    );
    let s = api_error(
        leases
            .list(&ListParams::default().fields("spec.holderIdentity=x"))
            .await,
        400,
        "unsupported field selector on leases",
    )?;
    ensure!(
        s.message
            == "\"spec.holderIdentity\" is not a known field selector: only \"metadata.name\", \
                \"metadata.namespace\"",
        "message {:?}",
        s.message
    );
    Ok(Outcome::Passed)
}

/// Malformed JSON is 400 with a Status body.
pub async fn malformed_json(env: Env) -> CaseResult {
    let (code, body) = raw(
        &env,
        "POST",
        &volumes_path(&env),
        "application/json",
        b"{\"apiVersion\": ",
    )
    .await?;
    ensure!(code == 400, "HTTP {code}, want 400");
    ensure!(
        body["kind"] == json!("Status") && body["reason"] == json!("BadRequest"),
        "body {body}"
    );
    Ok(Outcome::Passed)
}

/// Unknown resources are 404. kube-apiserver answers an unknown path under `/api` or a
/// built-in group with a `Status` (NotFound); an unknown path under a CRD's group or an
/// unknown group falls through to the end of its delegation chain: plain-text
/// `404 page not found`. An unknown subresource of a custom resource is NotFound for the
/// object.
pub async fn unknown_resource(env: Env) -> CaseResult {
    let ns = &env.namespace;
    for path in [
        format!("/api/v1/namespaces/{ns}/nosuchthings"),
        "/apis/coordination.k8s.io/v1/nosuchthings".to_string(),
        "/apis/coordination.k8s.io/v9/leases".to_string(),
    ] {
        let (code, _, body) = raw_bytes(&env, "GET", &path, "application/json", b"").await?;
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        ensure!(code == 404, "HTTP {code} for {path}, want 404");
        ensure!(
            body["kind"] == json!("Status")
                && body["reason"] == json!("NotFound")
                && body["message"] == json!("the server could not find the requested resource"),
            "{path}: body {body}"
        );
    }
    for path in [
        format!("/apis/volume.antstor.alipay.com/v1/namespaces/{ns}/nosuchthings"),
        "/apis/volume.antstor.alipay.com/v9/antstorvolumes".to_string(),
        "/apis/volume.antstor.alipay.com/v1/antstorvolumes/x".to_string(),
        "/apis/no.such.group/v1/things".to_string(),
        "/apis/no.such.group".to_string(),
    ] {
        let (code, content_type, body) =
            raw_bytes(&env, "GET", &path, "application/json", b"").await?;
        ensure!(code == 404, "HTTP {code} for {path}, want 404");
        ensure!(
            content_type.starts_with("text/plain") && body == b"404 page not found\n",
            "{path}: {content_type} {:?}, want text/plain \"404 page not found\"",
            String::from_utf8_lossy(&body)
        );
    }
    let api = volumes(&env);
    let name = format!("{}-sub", env.prefix);
    api.create(&PostParams::default(), &volume(&name)?).await?;
    let path = format!("{}/{name}/scale", volumes_path(&env));
    let (code, body) = raw(&env, "GET", &path, "application/json", b"").await?;
    ensure!(
        code == 404
            && body["reason"] == json!("NotFound")
            && body["message"]
                == json!(format!(
                    "antstorvolumes.volume.antstor.alipay.com \"{name}\" not found"
                )),
        "{path}: HTTP {code} {body}"
    );
    Ok(Outcome::Passed)
}

/// A strategic merge patch of a custom resource is 415; a name mismatch on update is 400.
pub async fn patch_media_and_names(env: Env) -> CaseResult {
    let api = volumes(&env);
    let name = format!("{}-smp", env.prefix);
    api.create(&PostParams::default(), &volume(&name)?).await?;
    let s = api_error(
        api.patch(
            &name,
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"sizeByte": 3}})),
        )
        .await,
        415,
        "strategic merge patch of a CR",
    )?;
    ensure!(s.reason == "UnsupportedMediaType", "reason {}", s.reason);
    let mut other = api.get(&name).await?;
    other.metadata.name = Some(format!("{name}-other"));
    let s = api_error(
        api.replace(&name, &PostParams::default(), &other).await,
        400,
        "name mismatch",
    )?;
    ensure!(s.reason == "BadRequest", "reason {}", s.reason);
    Ok(Outcome::Passed)
}

/// `limit` and `continue` page through a list.
pub async fn list_paging(env: Env) -> CaseResult {
    let api = volumes(&env);
    for i in 0..5 {
        api.create(
            &PostParams::default(),
            &volume(&format!("{}-p{i}", env.prefix))?,
        )
        .await?;
    }
    let mut seen = BTreeSet::new();
    let mut token: Option<String> = None;
    for _ in 0..5 {
        let mut lp = ListParams::default().limit(2);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = api.list(&lp).await?;
        ensure!(page.items.len() <= 2, "page of {}", page.items.len());
        seen.extend(page.items.iter().map(name_of));
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            break;
        }
    }
    ensure!(seen.len() == 5 && token.is_none(), "paging saw {seen:?}");
    Ok(Outcome::Passed)
}

fn test_server_only(env: &Env) -> Option<ServerHandle> {
    env.server.clone()
}

const NEEDS_SERVER: &str = "fault injection exists only on the test server";

/// Two injected 500s on update: the first two updates fail, the third succeeds.
pub async fn fault_fail_next(env: Env) -> CaseResult {
    let Some(server) = test_server_only(&env) else {
        return Ok(Outcome::Skipped(NEEDS_SERVER.into()));
    };
    let api = volumes(&env);
    let name = format!("{}-ff", env.prefix);
    api.create(&PostParams::default(), &volume(&name)?).await?;
    let faults = server.faults();
    let before = faults.requests(Verb::Update, "antstorvolumes");
    faults.fail_next(
        2,
        Matcher::new(Verb::Update, "antstorvolumes"),
        500,
        "InternalError",
    );
    let mut codes = Vec::new();
    for i in 0..3 {
        let mut v = api.get(&name).await?;
        v.data["spec"]["sizeByte"] = json!(i + 10);
        match api.replace(&name, &PostParams::default(), &v).await {
            Ok(_) => codes.push(200),
            Err(kube::Error::Api(s)) => codes.push(s.code),
            Err(e) => return Err(e.into()),
        }
    }
    ensure!(codes == vec![500, 500, 200], "update results {codes:?}");
    let seen = faults.requests(Verb::Update, "antstorvolumes") - before;
    ensure!(seen == 3, "counted {seen} updates, want 3");
    Ok(Outcome::Passed)
}

/// An injected delay holds matching responses back; others are not delayed.
pub async fn fault_delay(env: Env) -> CaseResult {
    let Some(server) = test_server_only(&env) else {
        return Ok(Outcome::Skipped(NEEDS_SERVER.into()));
    };
    let api = volumes(&env);
    let name = format!("{}-slow", env.prefix);
    api.create(&PostParams::default(), &volume(&name)?).await?;
    let faults = server.faults();
    let delay = Duration::from_millis(400);
    faults.delay(
        Matcher::new(Verb::Get, "antstorvolumes").named(&name),
        delay,
    );
    let t = Instant::now();
    api.get(&name).await?;
    let took = t.elapsed();
    faults.clear();
    ensure!(
        took >= delay,
        "delayed get took {took:?}, want at least {delay:?}"
    );
    let t = Instant::now();
    api.get(&name).await?;
    ensure!(t.elapsed() < delay, "the delay outlived clear()");
    Ok(Outcome::Passed)
}

/// A hang holds matching requests without an answer until released (a short observation
/// window shows it is held); a hang aimed at another client does not touch this one.
pub async fn fault_hang(env: Env) -> CaseResult {
    let Some(server) = test_server_only(&env) else {
        return Ok(Outcome::Skipped(NEEDS_SERVER.into()));
    };
    let api = volumes(&env);
    let name = format!("{}-hang", env.prefix);
    api.create(&PostParams::default(), &volume(&name)?).await?;
    let faults = server.faults();
    let get = Matcher::new(Verb::Get, "antstorvolumes").named(&name);
    faults.hang(get.clone().from_client("someone-else"));
    let t = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), api.get(&name))
        .await
        .map_err(|_| Failure("a hang aimed at another client held this one".into()))??;
    ensure!(
        t.elapsed() < Duration::from_secs(1),
        "a hang aimed at another client delayed this one"
    );
    let before = faults.hung();
    faults.hang(get);
    let held = {
        let api = api.clone();
        let name = name.clone();
        tokio::spawn(async move { api.get(&name).await })
    };
    let window = Duration::from_millis(300);
    tokio::time::sleep(window).await;
    ensure!(
        !held.is_finished(),
        "a held get was answered within {window:?}"
    );
    ensure!(
        faults.hung() == before + 1,
        "counted {} held requests, want 1",
        faults.hung() - before
    );
    faults.release_hangs();
    let got = tokio::time::timeout(Duration::from_secs(5), held)
        .await
        .map_err(|_| Failure("a released get was not answered".into()))?
        .map_err(|e| Failure(format!("the get task failed: {e}")))?;
    got?;
    let t = Instant::now();
    api.get(&name).await?;
    ensure!(t.elapsed() < window, "the hang outlived release_hangs()");
    Ok(Outcome::Passed)
}

/// Dropped watches: the next-watch drop ends a raw watch; kube-rs's watcher reconnects
/// after all watches are dropped and sees later events.
pub async fn fault_drop_watch(env: Env) -> CaseResult {
    let Some(server) = test_server_only(&env) else {
        return Ok(Outcome::Skipped(NEEDS_SERVER.into()));
    };
    let api = volumes(&env);
    let faults = server.faults();
    faults.drop_next_watches("antstorvolumes", 1);
    let rv = api
        .list(&ListParams::default())
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let mut stream = api
        .watch(&WatchParams::default().timeout(60), &rv)
        .await?
        .boxed();
    let ended = within(STEP, "the dropped watch to end", stream.try_next()).await??;
    ensure!(
        ended.is_none(),
        "the dropped watch delivered {:?}",
        ended.map(|e| describe(&e))
    );

    let watches = faults.requests(Verb::Watch, "antstorvolumes");
    let mut w = spawn_watcher(api.clone());
    api.create(
        &PostParams::default(),
        &volume(&format!("{}-d1", env.prefix))?,
    )
    .await?;
    next_applied(&mut w, &format!("{}-d1", env.prefix)).await?;
    wait_for_requests(
        &faults,
        Verb::Watch,
        watches + 1,
        "the watcher's first watch",
    )
    .await?;
    faults.drop_watches("antstorvolumes");
    api.create(
        &PostParams::default(),
        &volume(&format!("{}-d2", env.prefix))?,
    )
    .await?;
    next_applied(&mut w, &format!("{}-d2", env.prefix)).await?;
    wait_for_requests(
        &faults,
        Verb::Watch,
        watches + 2,
        "the watcher to re-watch after the drop",
    )
    .await?;
    Ok(Outcome::Passed)
}

/// Polls (with a deadline) until the server has counted `n` requests of `verb` on volumes.
async fn wait_for_requests(
    faults: &crate::Faults,
    verb: Verb,
    n: u64,
    what: &str,
) -> Result<(), Failure> {
    let deadline = Instant::now() + STEP;
    while faults.requests(verb, "antstorvolumes") < n {
        ensure!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// Calls `$m!(case, case, ...)` with every conformance case, in order: the single list the
/// test files (T1 against the test server, T2 against a real one) and [`CASES`] are made from.
#[macro_export]
macro_rules! with_conformance_cases {
    ($m:ident) => {
        $m!(
            crud_antstorvolume,
            crud_lease,
            generate_name,
            label_selectors,
            field_selectors,
            bad_selectors,
            watch_event_order,
            watch_resume,
            watch_expired_gone,
            watcher_recovers,
            stale_update_conflict,
            lease_two_writers,
            finalizer_deletion,
            status_subresource,
            merge_patch,
            json_patch,
            server_side_apply,
            invalid_objects,
            request_details,
            malformed_json,
            unknown_resource,
            patch_media_and_names,
            list_paging,
            fault_fail_next,
            fault_delay,
            fault_hang,
            fault_drop_watch,
        );
    };
}

macro_rules! case_names {
    ($($name:ident),* $(,)?) => {
        /// Every case, in order.
        pub const CASES: &[&str] = &[$(stringify!($name)),*];
    };
}
with_conformance_cases!(case_names);
