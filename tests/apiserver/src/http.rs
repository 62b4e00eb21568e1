//! The HTTP side: routing, request parsing, responses and watch streams.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode, header};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

use crate::discovery;
use crate::error::{ApiError, Reason};
use crate::faults::{Faults, Verb};
use crate::resources::ResourceInfo;
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::{EventType, PatchKind, State, WriteOpts};

/// The response body type.
pub(crate) type Body = BoxBody<Bytes, Infallible>;

/// Everything request handlers share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub state: Mutex<State>,
    pub notify: watch::Sender<u64>,
    pub shutdown: watch::Sender<bool>,
    pub faults: Faults,
    pub addr: SocketAddr,
    pub bookmark_interval: Duration,
    /// Where the state is kept (`--state-file`), if anywhere; every write is appended to
    /// its journal ([`journal_path`]) in between.
    pub state_file: Option<std::path::PathBuf>,
    /// The open journal and its size.
    pub journal: Mutex<Journal>,
}

/// The journal next to the state file: one JSON line per write
/// ([`crate::store::JournalEntry`]), emptied whenever the whole state is saved.
#[derive(Debug, Default)]
pub(crate) struct Journal {
    file: Option<std::fs::File>,
    bytes: u64,
    /// Size of the state file last written: the journal is folded into a new state file
    /// once it is larger, so the cost of a save is paid at most once per as many bytes of
    /// writes (amortised O(1) per write, where saving on every write was O(objects)).
    state_bytes: u64,
}

/// A journal smaller than this is never folded (a small state is cheap to replay).
const FOLD_AT_LEAST: u64 = 4 << 20;

/// The journal of state file `path`: `<path>.journal`.
pub fn journal_path(path: &std::path::Path) -> std::path::PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".journal");
    std::path::PathBuf::from(p)
}

impl Shared {
    fn journal(&self) -> MutexGuard<'_, Journal> {
        self.journal.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes the whole state to the state file (under the state lock, so saves never
    /// reorder): a temporary file renamed over the old one, so a crash leaves the old or the
    /// new; then empties the journal (a crash before that leaves entries the new file
    /// already holds, which a restore skips).
    pub fn save(&self, state: &State) {
        let Some(path) = &self.state_file else {
            return;
        };
        let mut j = self.journal();
        let tmp = path.with_extension("tmp");
        let jpath = journal_path(path);
        let res = serde_json::to_vec(&state.snapshot())
            .map_err(std::io::Error::other)
            .and_then(|body| {
                std::fs::write(&tmp, &body)?;
                std::fs::rename(&tmp, path)?;
                j.state_bytes = body.len() as u64;
                j.file = Some(std::fs::File::create(&jpath)?);
                j.bytes = 0;
                Ok(())
            });
        if let Err(e) = res {
            j.file = None;
            tracing::error!(path = %path.display(), error = %e, "cannot save the state; a restart will lose the last writes");
        }
    }

    /// Records the writes after resourceVersion `before`: appends them to the journal, or
    /// saves the whole state when the journal cannot take them or has grown past the state.
    fn persist(&self, state: &State, before: u64) {
        use std::io::Write as _;
        if self.state_file.is_none() {
            return;
        }
        let appended = {
            let mut j = self.journal();
            let fold_at = j.state_bytes.max(FOLD_AT_LEAST);
            match (state.journal_since(before), j.file.as_mut()) {
                (Some(entry), Some(f)) => serde_json::to_vec(&entry)
                    .map_err(std::io::Error::other)
                    .and_then(|mut line| {
                        line.push(b'\n');
                        f.write_all(&line)?;
                        Ok(line.len() as u64)
                    })
                    .map(|n| {
                        j.bytes += n;
                        j.bytes <= fold_at
                    })
                    .unwrap_or_else(|e| {
                        tracing::warn!(error = %e, "cannot append to the journal; saving the whole state");
                        false
                    }),
                _ => false,
            }
        };
        if !appended {
            self.save(state);
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs a write, records it when it changed something and a state file is set, and
    /// wakes watches.
    fn write<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let (out, rv) = {
            let mut s = self.lock();
            let before = s.rv();
            let out = f(&mut s);
            if s.rv() != before {
                self.persist(&s, before);
            }
            (out, s.rv())
        };
        self.notify.send_replace(rv);
        out
    }
}

fn full(code: StatusCode, content_type: &str, body: Vec<u8>) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from(body)).boxed());
    *resp.status_mut() = code;
    if let Ok(v) = header::HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    resp
}

fn json_response(code: u16, v: &Value) -> Response<Body> {
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    full(code, "application/json", v.to_string().into_bytes())
}

fn error_response(e: &ApiError) -> Response<Body> {
    json_response(e.code, &e.to_status())
}

/// Entry point for one request.
pub(crate) async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let result = route(&shared, req).await;
    match result {
        Ok(r) => {
            tracing::debug!(%method, %path, status = r.status().as_u16(), "request");
            r
        }
        Err(e) => {
            tracing::debug!(%method, %path, status = e.code, message = %e.message, "request failed");
            if e.is_no_route() && !served_by_kube_apiserver(&path) {
                return full(
                    StatusCode::NOT_FOUND,
                    "text/plain; charset=utf-8",
                    b"404 page not found\n".to_vec(),
                );
            }
            error_response(&e)
        }
    }
}

/// Whether kube-apiserver itself (not the CRD handler or the end of its delegation chain)
/// answers unknown paths under `path`: `/api/...` and the built-in groups.
fn served_by_kube_apiserver(path: &str) -> bool {
    let mut segs = path.split('/').filter(|s| !s.is_empty());
    match (segs.next(), segs.next()) {
        (Some("api"), _) => true,
        (Some("apis"), Some(g)) => crate::resources::KUBE_APISERVER_GROUPS.contains(&g),
        _ => false,
    }
}

/// Parses a field selector for `res`, worded as kube-apiserver words an unsupported field:
/// kinds with a field-label conversion (and custom resources) say "field label not
/// supported"; the other built-ins fall back to the default conversion's message.
fn field_selector(res: &ResourceInfo, s: &str) -> Result<FieldSelector, ApiError> {
    FieldSelector::parse(s, &res.selectable_fields).map_err(|mut e| {
        if !res.custom
            && res.selectable_fields.is_empty()
            && let Some(field) = e.message.strip_prefix("field label not supported: ")
        {
            e.message = format!(
                "\"{field}\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
            );
        }
        e
    })
}

struct Query(HashMap<String, String>);

impl Query {
    fn parse(q: Option<&str>) -> Self {
        Query(
            form_urlencoded::parse(q.unwrap_or_default().as_bytes())
                .into_owned()
                .collect(),
        )
    }

    fn get(&self, k: &str) -> Option<&str> {
        self.0.get(k).map(String::as_str)
    }

    fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("true" | "1"))
    }
}

/// A resource request path, decoded.
#[derive(Debug, Clone)]
struct ResPath {
    group: String,
    version: String,
    namespace: Option<String>,
    plural: String,
    name: Option<String>,
    sub: Option<String>,
}

fn parse_res_path(group: &str, version: &str, rest: &[&str]) -> Option<ResPath> {
    let (namespace, rest) = match rest {
        ["namespaces", ns, tail @ ..] if !tail.is_empty() => (Some(ns.to_string()), tail),
        _ => (None, rest),
    };
    let (plural, name, sub) = match rest {
        [p] => (*p, None, None),
        [p, n] => (*p, Some(n.to_string()), None),
        [p, n, s] => (*p, Some(n.to_string()), Some(s.to_string())),
        _ => return None,
    };
    Some(ResPath {
        group: group.to_string(),
        version: version.to_string(),
        namespace,
        plural: plural.to_string(),
        name,
        sub,
    })
}

async fn route(shared: &Arc<Shared>, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let path = req.uri().path().trim_end_matches('/').to_string();
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let get = req.method() == Method::GET;
    match segs.as_slice() {
        ["version"] if get => Ok(json_response(200, &discovery::version())),
        ["healthz" | "livez" | "readyz"] if get => {
            Ok(full(StatusCode::OK, "text/plain", b"ok".to_vec()))
        }
        ["api"] if get => Ok(json_response(
            200,
            &discovery::api_versions(&shared.addr.to_string()),
        )),
        ["apis"] if get => Ok(json_response(
            200,
            &discovery::api_group_list(shared.lock().resources()),
        )),
        ["api", "v1"] if get => discovery::resource_list(shared.lock().resources(), "", "v1")
            .map(|v| json_response(200, &v))
            .ok_or_else(ApiError::no_route),
        ["apis", g] if get => discovery::api_group(shared.lock().resources(), g)
            .map(|v| json_response(200, &v))
            .ok_or_else(ApiError::no_route),
        ["apis", g, v] if get => discovery::resource_list(shared.lock().resources(), g, v)
            .map(|v| json_response(200, &v))
            .ok_or_else(ApiError::no_route),
        ["openapi", "v3"] if get => Ok(json_response(
            200,
            &discovery::openapi_v3_root(shared.lock().resources()),
        )),
        ["openapi", "v3", "api", v] if get => {
            discovery::openapi_v3_gv(shared.lock().resources(), "", v)
                .map(|d| json_response(200, &d))
                .ok_or_else(ApiError::no_route)
        }
        ["openapi", "v3", "apis", g, v] if get => {
            discovery::openapi_v3_gv(shared.lock().resources(), g, v)
                .map(|d| json_response(200, &d))
                .ok_or_else(ApiError::no_route)
        }
        ["api", "v1", rest @ ..] => match parse_res_path("", "v1", rest) {
            Some(p) => resource(shared, req, p).await,
            None => Err(ApiError::no_route()),
        },
        ["apis", g, v, rest @ ..] => match parse_res_path(g, v, rest) {
            Some(p) => resource(shared, req, p).await,
            None => Err(ApiError::no_route()),
        },
        _ => Err(ApiError::no_route()),
    }
}

fn parse_body(content_type: &str, body: &[u8]) -> Result<Value, ApiError> {
    match content_type {
        "" | "application/json" | "*/*" => parse_json(body),
        "application/yaml" => serde_yaml::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}"))),
        _ => Err(ApiError::unsupported_media_type(
            "application/json, application/yaml",
        )),
    }
}

fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
    })
}

fn manager_from(query: &Query, headers: &hyper::HeaderMap) -> String {
    if let Some(m) = query.get("fieldManager").filter(|m| !m.is_empty()) {
        return m.to_string();
    }
    headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .and_then(|ua| ua.split('/').next())
        .filter(|s| !s.is_empty())
        .unwrap_or("unknown")
        .to_string()
}

async fn resource(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
    p: ResPath,
) -> Result<Response<Body>, ApiError> {
    let res = shared
        .lock()
        .find(&p.group, &p.version, &p.plural)
        .ok_or_else(ApiError::no_route)?;
    if p.namespace.is_some() && !res.namespaced {
        return Err(ApiError::no_route());
    }
    if p.name.is_some() && res.namespaced && p.namespace.is_none() {
        return Err(ApiError::no_route());
    }
    let status_only = match p.sub.as_deref() {
        None => false,
        Some("status") if res.has_status => true,
        // The CRD handler answers an unknown subresource with NotFound for the object.
        Some(_) if res.custom => {
            return Err(ApiError::not_found(crate::error::Subject {
                group: &res.group,
                plural: &res.plural,
                name: p.name.as_deref().unwrap_or_default(),
            }));
        }
        Some(_) => return Err(ApiError::no_route()),
    };
    let query = Query::parse(req.uri().query());
    let method = req.method().clone();
    let verb = match (&method, p.name.is_some()) {
        (&Method::GET, true) => Verb::Get,
        (&Method::GET, false) if query.flag("watch") => Verb::Watch,
        (&Method::GET, false) => Verb::List,
        (&Method::POST, false) => Verb::Create,
        (&Method::PUT, true) => Verb::Update,
        (&Method::PATCH, true) => Verb::Patch,
        (&Method::DELETE, true) => Verb::Delete,
        (&Method::DELETE, false) => Verb::DeleteCollection,
        _ => return Err(ApiError::method_not_allowed()),
    };
    if status_only && !matches!(verb, Verb::Get | Verb::Update | Verb::Patch) {
        return Err(ApiError::method_not_allowed());
    }
    let label = if status_only {
        format!("{}/status", res.plural)
    } else {
        res.plural.clone()
    };
    // Subscribed before the request is counted, so a test that sees the count can drop it.
    let drops = shared.faults.subscribe_drops();
    let client = req
        .headers()
        .get(crate::faults::CLIENT_HEADER)
        .and_then(|v| v.to_str().ok());
    let decision = shared
        .faults
        .decide(verb, &label, p.name.as_deref(), client);
    if let Some(mut held) = decision.hang {
        // Released, or the server is gone (then nothing answers anyway).
        let _ = held.changed().await;
    }
    if let Some(d) = decision.delay {
        tokio::time::sleep(d).await;
    }
    if let Some((code, reason)) = decision.fail {
        let reason_kind = Reason::for_code(code);
        let mut e = ApiError::new(code, reason_kind, format!("injected fault: {reason}"));
        e.details = Some(Box::new((
            p.name.clone().unwrap_or_default(),
            res.group.clone(),
            res.plural.clone(),
        )));
        let mut status = e.to_status();
        status["reason"] = json!(reason);
        return Ok(json_response(code, &status));
    }

    let headers = req.headers().clone();
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let table = accept.contains("as=Table");
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_string();
    let body = req
        .into_body()
        .collect()
        .await
        .map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))?
        .to_bytes();
    let ns = p.namespace.clone().unwrap_or_default();
    let name = p.name.clone().unwrap_or_default();
    let opts = WriteOpts {
        manager: manager_from(&query, &headers),
        strict: query.get("fieldValidation") == Some("Strict"),
        dry_run: query.get("dryRun") == Some("All"),
        apply_fields: None,
    };

    match verb {
        Verb::Get => {
            let obj = shared.lock().get(&res, &ns, &name)?;
            if table {
                let rv = obj
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                return Ok(json_response(
                    200,
                    &discovery::table(
                        &res,
                        &[obj],
                        &rv,
                        true,
                        query.get("includeObject") == Some("Object"),
                    ),
                ));
            }
            Ok(json_response(200, &obj))
        }
        Verb::List => list(shared, &res, p.namespace.as_deref(), &query, table),
        Verb::Watch => watch_stream(shared, &res, p.namespace.clone(), &query, table, drops),
        Verb::Create => {
            let obj = parse_body(&content_type, &body)?;
            let out = shared.write(|s| s.create(&res, &ns, obj, &opts))?;
            Ok(json_response(201, &out))
        }
        Verb::Update => {
            let obj = parse_body(&content_type, &body)?;
            let existed = shared.lock().get(&res, &ns, &name).is_ok();
            let out = shared.write(|s| s.update(&res, &ns, &name, obj, status_only, &opts))?;
            Ok(json_response(if existed { 200 } else { 201 }, &out))
        }
        Verb::Patch => {
            let kind = match content_type.as_str() {
                "application/merge-patch+json" => PatchKind::Merge,
                "application/json-patch+json" => PatchKind::Json,
                "application/strategic-merge-patch+json" if !res.custom => {
                    PatchKind::StrategicMerge
                }
                "application/apply-patch+yaml" | "application/apply-patch+json" => PatchKind::Apply,
                _ => {
                    let accepted = if res.custom {
                        "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
                    } else {
                        "application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml"
                    };
                    return Err(ApiError::unsupported_media_type(accepted));
                }
            };
            let patch = if kind == PatchKind::Apply {
                if query.get("fieldManager").is_none_or(str::is_empty) {
                    return Err(ApiError::invalid(
                        "PatchOptions",
                        "meta.k8s.io",
                        "",
                        vec![crate::error::Cause {
                            reason: "FieldValueRequired",
                            field: "fieldManager".into(),
                            message: "fieldManager: Required value: is required for apply patch"
                                .into(),
                        }],
                    ));
                }
                serde_yaml::from_slice::<Value>(&body)
                    .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?
            } else {
                parse_json(&body)?
            };
            let existed = shared.lock().get(&res, &ns, &name).is_ok();
            let out =
                shared.write(|s| s.patch(&res, &ns, &name, status_only, kind, &patch, &opts))?;
            Ok(json_response(if existed { 200 } else { 201 }, &out))
        }
        Verb::Delete => {
            let options = if body.iter().all(u8::is_ascii_whitespace) {
                Value::Null
            } else {
                parse_json(&body)?
            };
            let out = shared.write(|s| s.delete(&res, &ns, &name, &options, opts.dry_run))?;
            let removed = out
                .pointer("/metadata/deletionTimestamp")
                .is_none_or(Value::is_null);
            if removed && !res.delete_returns_object {
                // Registries without `ReturnDeletedObject` answer with a success Status.
                let uid = out.pointer("/metadata/uid").cloned().unwrap_or(Value::Null);
                let mut details = serde_json::Map::new();
                details.insert("name".into(), json!(name));
                if !res.group.is_empty() {
                    details.insert("group".into(), json!(res.group));
                }
                details.insert("kind".into(), json!(res.plural));
                details.insert("uid".into(), uid);
                return Ok(json_response(
                    200,
                    &json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                            "status": "Success", "details": details}),
                ));
            }
            Ok(json_response(200, &out))
        }
        Verb::DeleteCollection => {
            let label = LabelSelector::parse(query.get("labelSelector").unwrap_or_default())?;
            let field = field_selector(&res, query.get("fieldSelector").unwrap_or_default())?;
            let scope = p.namespace.clone();
            let items = shared.write(|s| {
                s.delete_collection(&res, scope.as_deref(), &|o| {
                    label.matches(o) && field.matches(o)
                })
            });
            let rv = shared.lock().rv().to_string();
            Ok(json_response(
                200,
                &json!({"kind": format!("{}List", res.kind), "apiVersion": res.api_version(),
                        "metadata": {"resourceVersion": rv}, "items": items}),
            ))
        }
    }
}

fn list(
    shared: &Arc<Shared>,
    res: &ResourceInfo,
    ns: Option<&str>,
    query: &Query,
    table: bool,
) -> Result<Response<Body>, ApiError> {
    let label = LabelSelector::parse(query.get("labelSelector").unwrap_or_default())?;
    let field = field_selector(res, query.get("fieldSelector").unwrap_or_default())?;
    let limit: Option<usize> = match query.get("limit") {
        None | Some("") | Some("0") => None,
        Some(l) => Some(
            l.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid limit: {l}")))?,
        ),
    };
    let after: Option<(String, String)> = match query.get("continue").filter(|c| !c.is_empty()) {
        None => None,
        Some(c) => {
            let mut parts = c.splitn(3, '/');
            match (parts.next(), parts.next(), parts.next()) {
                (Some(_rv), Some(n), Some(name)) => Some((n.to_string(), name.to_string())),
                _ => return Err(ApiError::bad_request("continue key is not valid")),
            }
        }
    };
    let (all, rv) = {
        let s = shared.lock();
        let keep = |o: &Value| label.matches(o) && field.matches(o);
        // A cluster-scoped resource is stored under the empty namespace.
        let scope = if res.namespaced { ns } else { Some("") };
        let found = match (scope, field.single_name()) {
            (Some(n), Some(name)) => s.list_named(res, n, name, &keep),
            _ => s.list_matching(res, ns, &keep),
        };
        (found, s.rv())
    };
    let key = |o: &Value| {
        (
            o.pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            o.pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
        )
    };
    let mut items: Vec<Value> = all
        .into_iter()
        .filter(|o| after.as_ref().is_none_or(|a| key(o) > *a))
        .collect();
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(l) = limit
        && items.len() > l
    {
        let remaining = items.len() - l;
        items.truncate(l);
        if let Some(last) = items.last() {
            let (n, name) = key(last);
            meta["continue"] = json!(format!("{rv}/{n}/{name}"));
            meta["remainingItemCount"] = json!(remaining);
        }
    }
    if table {
        let mut t = discovery::table(
            res,
            &items,
            &rv.to_string(),
            true,
            query.get("includeObject") == Some("Object"),
        );
        t["metadata"] = meta;
        return Ok(json_response(200, &t));
    }
    Ok(json_response(
        200,
        &json!({
            "kind": format!("{}List", res.kind),
            "apiVersion": res.api_version(),
            "metadata": meta,
            "items": items,
        }),
    ))
}

fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut s = json!({"type": kind, "object": object}).to_string();
    s.push('\n');
    Bytes::from(s)
}

fn watch_stream(
    shared: &Arc<Shared>,
    res: &ResourceInfo,
    ns: Option<String>,
    query: &Query,
    table: bool,
    mut drops: tokio::sync::broadcast::Receiver<Option<String>>,
) -> Result<Response<Body>, ApiError> {
    let label = LabelSelector::parse(query.get("labelSelector").unwrap_or_default())?;
    let field = field_selector(res, query.get("fieldSelector").unwrap_or_default())?;
    let start: Option<u64> = match query.get("resourceVersion") {
        None | Some("") | Some("0") => None,
        Some(rv) => Some(rv.parse().map_err(|_| {
            ApiError::invalid(
                "ListOptions",
                "meta.k8s.io",
                "",
                vec![crate::error::Cause {
                    reason: "FieldValueInvalid",
                    field: "resourceVersion".into(),
                    message: format!("resourceVersion: Invalid value: \"{rv}\": must be a number"),
                }],
            )
        })?),
    };
    let bookmarks = query.flag("allowWatchBookmarks");
    let timeout = match query.get("timeoutSeconds") {
        None | Some("") => None,
        Some(t) => Some(Duration::from_secs(t.parse().map_err(|_| {
            ApiError::bad_request(format!("invalid timeoutSeconds: {t}"))
        })?)),
    };
    let full_object = query.get("includeObject") == Some("Object");

    let mut notify = shared.notify.subscribe();
    let mut shutdown = shared.shutdown.subscribe();
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    let shared = Arc::clone(shared);
    let res = res.clone();
    let matches = move |o: &Value| label.matches(o) && field.matches(o);

    let (initial, mut cursor) = {
        notify.borrow_and_update();
        let s = shared.lock();
        match start {
            None => {
                let items: Vec<Value> = s.list_matching(&res, ns.as_deref(), &matches);
                (items, s.rv())
            }
            Some(rv) => (Vec::new(), rv),
        }
    };

    tokio::spawn(async move {
        let mut headers_sent = false;
        let render = |obj: &Value, headers_sent: &mut bool| -> Value {
            if table {
                let rv = obj
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                let t = discovery::table(
                    &res,
                    std::slice::from_ref(obj),
                    &rv,
                    !*headers_sent,
                    full_object,
                );
                *headers_sent = true;
                t
            } else {
                obj.clone()
            }
        };
        for o in &initial {
            let line = event_line("ADDED", &render(o, &mut headers_sent));
            if tx.send(line).await.is_err() {
                return;
            }
        }
        if shared.faults.take_watch_drop(&res.plural) {
            return;
        }
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let mut ticker = tokio::time::interval(shared.bookmark_interval);
        ticker.tick().await;
        loop {
            notify.borrow_and_update();
            let (events, latest) = {
                let s = shared.lock();
                // Only events this watch may send: in its namespace, and matching its
                // selectors now or before (a change out of them is a DELETED).
                let keep = |e: &crate::store::Event| {
                    ns.as_deref().is_none_or(|n| n == e.namespace)
                        && (matches(&e.object) || e.prev.as_ref().is_some_and(&matches))
                };
                (
                    s.events_matching(cursor, &res.group, &res.plural, &keep),
                    s.rv(),
                )
            };
            let events = match events {
                Ok(e) => e,
                Err(oldest) => {
                    let status = ApiError::new(
                        410,
                        Reason::Expired,
                        format!("too old resource version: {cursor} ({oldest})"),
                    )
                    .to_status();
                    let _ = tx.send(event_line("ERROR", &status)).await;
                    return;
                }
            };
            for e in events {
                if ns.as_deref().is_some_and(|n| n != e.namespace) {
                    continue;
                }
                let now = matches(&e.object);
                let before = e.prev.as_ref().is_some_and(&matches);
                let kind = match e.kind {
                    EventType::Added if now => Some("ADDED"),
                    EventType::Modified if now && before => Some("MODIFIED"),
                    EventType::Modified if now => Some("ADDED"),
                    EventType::Modified if before => Some("DELETED"),
                    EventType::Deleted if now || before => Some("DELETED"),
                    _ => None,
                };
                if let Some(kind) = kind {
                    let obj = State::present(&res, &e.object);
                    if tx
                        .send(event_line(kind, &render(&obj, &mut headers_sent)))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
            cursor = cursor.max(latest);
            tokio::select! {
                changed = notify.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                dropped = drops.recv() => match dropped {
                    Ok(None) => return,
                    Ok(Some(r)) if r == res.plural => return,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    _ => {}
                },
                _ = ticker.tick(), if bookmarks => {
                    let bm = json!({
                        "kind": res.kind,
                        "apiVersion": res.api_version(),
                        "metadata": {"resourceVersion": cursor.to_string()},
                    });
                    if tx.send(event_line("BOOKMARK", &bm)).await.is_err() {
                        return;
                    }
                }
                _ = async {
                    match deadline {
                        Some(d) => tokio::time::sleep_until(d).await,
                        None => std::future::pending().await,
                    }
                } => return,
                _ = tx.closed() => return,
                _ = shutdown.changed() => return,
            }
        }
    });

    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    let mut resp = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}
