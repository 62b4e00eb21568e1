//! The object store: every object as JSON, a global resourceVersion counter, a bounded
//! event log for watches, and the write semantics of kube-apiserver (optimistic
//! concurrency, status subresource, finalizers, generation, CRD registration).

use std::collections::{BTreeMap, HashMap, VecDeque};

use serde_json::{Value, json};

use crate::error::{ApiError, Cause, Subject};
use crate::meta;
use crate::resources::{self, ResourceInfo};
use crate::schema;

/// The type of a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// An object appeared.
    Added,
    /// An object changed.
    Modified,
    /// An object is gone.
    Deleted,
}

impl EventType {
    /// `ADDED`, `MODIFIED`, `DELETED`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One entry of the event log.
#[derive(Debug, Clone)]
pub struct Event {
    /// The resourceVersion this event produced.
    pub rv: u64,
    /// API group of the resource.
    pub group: String,
    /// Plural of the resource.
    pub plural: String,
    /// Namespace ("" for cluster-scoped).
    pub namespace: String,
    /// What happened.
    pub kind: EventType,
    /// The object after the change (before it for DELETED, with the new resourceVersion).
    pub object: Value,
    /// The object before the change, for selector transitions.
    pub prev: Option<Value>,
}

type ResKey = (String, String);
type ObjKey = (String, String);

/// Options of a write request.
#[derive(Debug, Clone, Default)]
pub struct WriteOpts {
    /// `fieldManager`, or a name derived from the user agent.
    pub manager: String,
    /// `fieldValidation=Strict`: unknown fields are an error instead of being pruned.
    pub strict: bool,
    /// `dryRun=All`: validate but do not persist.
    pub dry_run: bool,
    /// Set by server-side apply: the applied configuration's field set.
    pub apply_fields: Option<Value>,
}

impl WriteOpts {
    fn record(&self, obj: &mut Value, res: &ResourceInfo, sub: Option<&str>, fields: Value) {
        match &self.apply_fields {
            Some(applied) => meta::record_manager(
                obj,
                &self.manager,
                "Apply",
                &res.api_version(),
                sub,
                applied.clone(),
            ),
            None => meta::record_manager(
                obj,
                &self.manager,
                "Update",
                &res.api_version(),
                sub,
                fields,
            ),
        }
    }
}

/// The mutable state behind the server's lock.
#[derive(Debug)]
pub struct State {
    rv: u64,
    resources: Vec<ResourceInfo>,
    objects: HashMap<ResKey, BTreeMap<ObjKey, Value>>,
    log: VecDeque<Event>,
    compacted: u64,
    window: usize,
}

fn key(res: &ResourceInfo) -> ResKey {
    (res.group.clone(), res.plural.clone())
}

fn subject<'a>(res: &'a ResourceInfo, name: &'a str) -> Subject<'a> {
    Subject {
        group: &res.group,
        plural: &res.plural,
        name,
    }
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn set_meta(obj: &mut Value, field: &str, v: Value) {
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        m.insert(field.to_string(), v);
    }
}

fn remove_meta(obj: &mut Value, field: &str) {
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove(field);
    }
}

/// Everything but metadata and status: what `generation` tracks.
fn spec_part(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
        m.remove("apiVersion");
        m.remove("kind");
    }
    v
}

/// The object without fields that change on every write.
fn comparable(obj: &Value) -> Value {
    let mut v = obj.clone();
    remove_meta(&mut v, "resourceVersion");
    remove_meta(&mut v, "managedFields");
    v
}

fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn initial_status(plural: &str) -> Option<Value> {
    match plural {
        "namespaces" => Some(json!({"phase": "Active"})),
        "persistentvolumeclaims" | "persistentvolumes" | "pods" => {
            Some(json!({"phase": "Pending"}))
        }
        _ => None,
    }
}

/// What a restart keeps (`--state-file`): every object and the resourceVersion counter, like
/// etcd's data. The watch history is not kept: a watch resuming from before the restart gets
/// `410 Gone` and lists again.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    rv: u64,
    objects: Vec<StoredObject>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct StoredObject {
    group: String,
    plural: String,
    object: Value,
}

/// One line of the journal kept next to the state file: what one write changed. Appending
/// it costs the size of the change, where rewriting the state file costs the size of
/// everything (which made each write O(objects) and a burst of creates quadratic).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct JournalEntry {
    /// The resourceVersion counter after the write.
    rv: u64,
    changes: Vec<Change>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Change {
    group: String,
    plural: String,
    namespace: String,
    name: String,
    /// The object as stored after the write; `None`: removed.
    object: Option<Value>,
}

impl Snapshot {
    /// Applies the journal written after this snapshot (JSON lines of [`JournalEntry`]).
    /// Entries the snapshot already holds (a crash between writing a new snapshot and
    /// emptying the journal) are skipped; an incomplete last line (a crash in the middle of
    /// appending it, so never acknowledged) is ignored; any other bad line is an error
    /// naming its line number.
    pub fn replay(&mut self, journal: &[u8]) -> Result<(), String> {
        let text = String::from_utf8_lossy(journal);
        let complete = text.ends_with('\n');
        let lines: Vec<&str> = text.lines().collect();
        let mut objects: BTreeMap<(String, String, String, String), Value> =
            std::mem::take(&mut self.objects)
                .into_iter()
                .map(|o| {
                    let k = (
                        o.group,
                        o.plural,
                        meta_str(&o.object, "namespace").to_string(),
                        meta_str(&o.object, "name").to_string(),
                    );
                    (k, o.object)
                })
                .collect();
        for (i, line) in lines.iter().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let entry: JournalEntry = match serde_json::from_str(line) {
                Ok(e) => e,
                Err(_) if i + 1 == lines.len() && !complete => break,
                Err(e) => return Err(format!("journal line {}: {e}", i + 1)),
            };
            if entry.rv <= self.rv {
                continue;
            }
            for c in entry.changes {
                let k = (c.group, c.plural, c.namespace, c.name);
                match c.object {
                    Some(o) => objects.insert(k, o),
                    None => objects.remove(&k),
                };
            }
            self.rv = entry.rv;
        }
        self.objects = objects
            .into_iter()
            .map(|((group, plural, _, _), object)| StoredObject {
                group,
                plural,
                object,
            })
            .collect();
        crds_first(&mut self.objects);
        Ok(())
    }
}

/// Deterministic order; CRDs first so that a restore serves their kinds before it meets
/// their objects.
fn crds_first(objects: &mut [StoredObject]) {
    objects.sort_by(|a, b| {
        let crd = |o: &StoredObject| o.plural != "customresourcedefinitions";
        (crd(a), &a.group, &a.plural).cmp(&(crd(b), &b.group, &b.plural))
    });
}

/// Namespaces every cluster has.
pub const SYSTEM_NAMESPACES: &[&str] =
    &["default", "kube-system", "kube-public", "kube-node-lease"];

impl State {
    /// An empty store retaining `window` events for watches.
    pub fn new(window: usize) -> Self {
        let mut s = State {
            rv: 1,
            resources: resources::builtins(),
            objects: HashMap::new(),
            log: VecDeque::new(),
            compacted: 0,
            window: window.max(1),
        };
        for ns in SYSTEM_NAMESPACES {
            let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
            if let Some(res) = s.find("", "v1", "namespaces") {
                let _ = s.create(&res, "", body, &WriteOpts::default());
            }
        }
        s
    }

    /// Every object and the resourceVersion counter.
    pub fn snapshot(&self) -> Snapshot {
        let mut objects: Vec<StoredObject> = self
            .objects
            .iter()
            .flat_map(|((group, plural), objs)| {
                objs.values().map(move |o| StoredObject {
                    group: group.clone(),
                    plural: plural.clone(),
                    object: o.clone(),
                })
            })
            .collect();
        crds_first(&mut objects);
        Snapshot {
            rv: self.rv,
            objects,
        }
    }

    /// A store holding what `snap` recorded, retaining `window` events from now on. Objects
    /// of a kind no CRD serves any more are an error naming them.
    pub fn restore(window: usize, snap: Snapshot) -> Result<Self, String> {
        let mut s = State {
            rv: snap.rv,
            resources: resources::builtins(),
            objects: HashMap::new(),
            log: VecDeque::new(),
            compacted: snap.rv,
            window: window.max(1),
        };
        for o in snap.objects {
            if o.plural == "customresourcedefinitions" {
                s.register_crd(&o.object);
            }
            if !s
                .resources
                .iter()
                .any(|r| r.group == o.group && r.plural == o.plural)
            {
                return Err(format!(
                    "stored object {} of {}/{} has no resource to serve it",
                    meta_str(&o.object, "name"),
                    o.group,
                    o.plural
                ));
            }
            let k = (
                meta_str(&o.object, "namespace").to_string(),
                meta_str(&o.object, "name").to_string(),
            );
            s.objects
                .entry((o.group, o.plural))
                .or_default()
                .insert(k, o.object);
        }
        Ok(s)
    }

    /// The current (latest) resourceVersion.
    pub fn rv(&self) -> u64 {
        self.rv
    }

    /// All served resources.
    pub fn resources(&self) -> &[ResourceInfo] {
        &self.resources
    }

    /// Looks a resource up by group, version and plural.
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<ResourceInfo> {
        self.resources
            .iter()
            .find(|r| r.group == group && r.version == version && r.plural == plural)
            .cloned()
    }

    /// Changes how many events are retained; older ones become "too old" for watches.
    pub fn set_window(&mut self, window: usize) {
        self.window = window.max(1);
        self.trim();
    }

    /// Forgets every retained event, like an etcd compaction at the current revision.
    pub fn compact(&mut self) {
        self.log.clear();
        self.compacted = self.rv;
    }

    fn trim(&mut self) {
        while self.log.len() > self.window {
            if let Some(e) = self.log.pop_front() {
                self.compacted = e.rv;
            }
        }
    }

    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn push(&mut self, res: &ResourceInfo, kind: EventType, object: &Value, prev: Option<Value>) {
        let rv = meta_str(object, "resourceVersion")
            .parse()
            .unwrap_or(self.rv);
        self.log.push_back(Event {
            rv,
            group: res.group.clone(),
            plural: res.plural.clone(),
            namespace: meta_str(object, "namespace").to_string(),
            kind,
            object: object.clone(),
            prev,
        });
        self.trim();
    }

    /// Events after `cursor` for one resource (all namespaces); `Err(oldest)` when `cursor`
    /// is older than the retained window.
    pub fn events_since(&self, cursor: u64, group: &str, plural: &str) -> Result<Vec<Event>, u64> {
        self.events_matching(cursor, group, plural, &|_| true)
    }

    /// Like [`State::events_since`], only the events `keep` accepts. Every write wakes every
    /// watch; one that follows a single object (a name field selector) copies only that
    /// object's events instead of every event of the resource.
    pub fn events_matching(
        &self,
        cursor: u64,
        group: &str,
        plural: &str,
        keep: &dyn Fn(&Event) -> bool,
    ) -> Result<Vec<Event>, u64> {
        if cursor < self.compacted {
            return Err(self.compacted + 1);
        }
        // The log is in resourceVersion order: skip what the watch has seen without
        // looking at it.
        let first = self.log.partition_point(|e| e.rv <= cursor);
        Ok(self
            .log
            .range(first..)
            .filter(|e| e.group == group && e.plural == plural && keep(e))
            .cloned()
            .collect())
    }

    /// What the writes after resourceVersion `since` changed, for the journal; `None` when
    /// the event log no longer holds all of it (then the whole state must be saved).
    pub fn journal_since(&self, since: u64) -> Option<JournalEntry> {
        if since < self.compacted {
            return None;
        }
        let first = self.log.partition_point(|e| e.rv <= since);
        let changes = self
            .log
            .range(first..)
            .map(|e| Change {
                group: e.group.clone(),
                plural: e.plural.clone(),
                namespace: e.namespace.clone(),
                name: meta_str(&e.object, "name").to_string(),
                object: (e.kind != EventType::Deleted).then(|| e.object.clone()),
            })
            .collect();
        Some(JournalEntry {
            rv: self.rv,
            changes,
        })
    }

    /// The object presented as `res` (its version) sees it.
    pub fn present(res: &ResourceInfo, obj: &Value) -> Value {
        let mut o = obj.clone();
        o["apiVersion"] = json!(res.api_version());
        o["kind"] = json!(res.kind);
        o
    }

    /// One object.
    pub fn get(&self, res: &ResourceInfo, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.objects
            .get(&key(res))
            .and_then(|m| m.get(&(ns.to_string(), name.to_string())))
            .map(|o| Self::present(res, o))
            .ok_or_else(|| ApiError::not_found(subject(res, name)))
    }

    /// Every object of a resource, in key order; `ns` None means all namespaces.
    pub fn list(&self, res: &ResourceInfo, ns: Option<&str>) -> Vec<Value> {
        self.list_matching(res, ns, &|_| true)
    }

    /// The objects of a resource that `keep` accepts, in key order; `ns` None means all
    /// namespaces. Only those are copied: a selector that picks one object out of
    /// thousands costs a scan, not a copy of every object.
    pub fn list_matching(
        &self,
        res: &ResourceInfo,
        ns: Option<&str>,
        keep: &dyn Fn(&Value) -> bool,
    ) -> Vec<Value> {
        self.objects
            .get(&key(res))
            .map(|m| {
                m.iter()
                    .filter(|((n, _), o)| ns.is_none_or(|want| want == n) && keep(o))
                    .map(|(_, o)| Self::present(res, o))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The object `ns`/`name` of a resource if `keep` accepts it (a list whose field
    /// selector names one object: a lookup, not a scan).
    pub fn list_named(
        &self,
        res: &ResourceInfo,
        ns: &str,
        name: &str,
        keep: &dyn Fn(&Value) -> bool,
    ) -> Vec<Value> {
        self.get(res, ns, name)
            .into_iter()
            .filter(|o| keep(o))
            .collect()
    }

    fn namespace_exists(&self, ns: &str) -> bool {
        self.objects
            .get(&(String::new(), "namespaces".to_string()))
            .is_some_and(|m| m.contains_key(&(String::new(), ns.to_string())))
    }

    fn validate_custom(
        &self,
        res: &ResourceInfo,
        obj: &mut Value,
        old: Option<&Value>,
        opts: &WriteOpts,
    ) -> Result<(), ApiError> {
        let name = meta_str(obj, "name").to_string();
        let mut causes: Vec<Cause> = Vec::new();
        if let Some(schema) = &res.schema {
            let checked = schema::check(schema, obj, old);
            if opts.strict && !checked.pruned.is_empty() {
                let fields = checked
                    .pruned
                    .iter()
                    .map(|p| format!("unknown field \"{p}\""))
                    .collect::<Vec<_>>()
                    .join(", ");
                return Err(ApiError::bad_request(format!(
                    "{kind} in version \"{version}\" cannot be handled as a {kind}: strict decoding error: {fields}",
                    kind = res.kind,
                    version = res.version,
                )));
            }
            causes.extend(checked.causes);
        }
        if res.plural == "customresourcedefinitions" {
            causes.extend(crd_causes(obj));
        }
        if causes.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid(&res.kind, &res.group, &name, causes))
        }
    }

    /// Create (POST).
    pub fn create(
        &mut self,
        res: &ResourceInfo,
        ns: &str,
        mut obj: Value,
        opts: &WriteOpts,
    ) -> Result<Value, ApiError> {
        if !obj.is_object() {
            return Err(ApiError::bad_request("the request body must be an object"));
        }
        check_type(res, &obj)?;
        obj["apiVersion"] = json!(res.api_version());
        obj["kind"] = json!(res.kind);
        if !obj.get("metadata").is_some_and(Value::is_object) {
            obj["metadata"] = json!({});
        }
        let body_ns = meta_str(&obj, "namespace").to_string();
        if res.namespaced {
            if !body_ns.is_empty() && body_ns != ns {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            set_meta(&mut obj, "namespace", json!(ns));
        } else {
            remove_meta(&mut obj, "namespace");
        }
        let mut name = meta_str(&obj, "name").to_string();
        if name.is_empty() {
            let prefix = meta_str(&obj, "generateName").to_string();
            if prefix.is_empty() {
                let mut causes = vec![Cause {
                    reason: "FieldValueRequired",
                    field: "metadata.name".into(),
                    message: "metadata.name: Required value: name or generateName is required"
                        .into(),
                }];
                // A Required error blocks the CRD's validation rules, which says so.
                if res.schema.as_ref().is_some_and(schema::has_rules) {
                    causes.push(schema::rules_not_checked());
                }
                return Err(ApiError::invalid(&res.kind, &res.group, "", causes));
            }
            name = format!("{prefix}{}", meta::name_suffix());
            set_meta(&mut obj, "name", json!(name));
        }
        if let Some(c) = meta::check_name(&name, res.plural == "namespaces") {
            return Err(ApiError::invalid(&res.kind, &res.group, &name, vec![c]));
        }
        if res.namespaced && !self.namespace_exists(ns) {
            return Err(ApiError::not_found(Subject {
                group: "",
                plural: "namespaces",
                name: ns,
            }));
        }
        let k = (ns.to_string(), name.clone());
        if self
            .objects
            .get(&key(res))
            .is_some_and(|m| m.contains_key(&k))
        {
            return Err(ApiError::already_exists(subject(res, &name)));
        }
        if res.has_status
            && !res.keep_status_on_create
            && let Some(m) = obj.as_object_mut()
        {
            m.remove("status");
        }
        if let Some(s) = initial_status(&res.plural)
            && obj.get("status").is_none_or(Value::is_null)
        {
            obj["status"] = s;
        }
        if res.plural == "customresourcedefinitions" {
            crd_status(&mut obj);
        }
        self.validate_custom(res, &mut obj, None, opts)?;
        for f in [
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
        ] {
            remove_meta(&mut obj, f);
        }
        set_meta(&mut obj, "uid", json!(meta::uid()));
        set_meta(&mut obj, "creationTimestamp", json!(meta::now()));
        if res.tracks_generation {
            set_meta(&mut obj, "generation", json!(1));
        } else {
            remove_meta(&mut obj, "generation");
        }
        remove_meta(&mut obj, "managedFields");
        let fields = meta::fields_v1(&obj);
        opts.record(&mut obj, res, None, fields);
        if opts.dry_run {
            return Ok(obj);
        }
        let rv = self.next_rv();
        set_meta(&mut obj, "resourceVersion", json!(rv.to_string()));
        self.objects
            .entry(key(res))
            .or_default()
            .insert(k, obj.clone());
        self.push(res, EventType::Added, &obj, None);
        if res.plural == "customresourcedefinitions" {
            self.register_crd(&obj);
        }
        Ok(obj)
    }

    /// Update (PUT) of the object or of its status subresource.
    pub fn update(
        &mut self,
        res: &ResourceInfo,
        ns: &str,
        name: &str,
        body: Value,
        status_only: bool,
        opts: &WriteOpts,
    ) -> Result<Value, ApiError> {
        if !body.is_object() {
            return Err(ApiError::bad_request("the request body must be an object"));
        }
        check_type(res, &body)?;
        let body_name = meta_str(&body, "name");
        if body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let body_ns = meta_str(&body, "namespace");
        if res.namespaced && !body_ns.is_empty() && body_ns != ns {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let old = match self.get(res, ns, name) {
            Ok(o) => o,
            Err(e) if res.create_on_update && !status_only => {
                let _ = e;
                return self.create(res, ns, body, opts);
            }
            Err(e) => return Err(e),
        };
        let body_rv = meta_str(&body, "resourceVersion");
        if body_rv.is_empty() {
            if !res.unconditional_update {
                // kube-apiserver's generic store names the resource here, not the kind:
                // `leases.coordination.k8s.io "x" is invalid: ...`.
                return Err(ApiError::invalid(
                    &res.plural,
                    &res.group,
                    name,
                    vec![Cause {
                        reason: "FieldValueInvalid",
                        field: "metadata.resourceVersion".into(),
                        message: "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update".into(),
                    }],
                ));
            }
        } else if body_rv != meta_str(&old, "resourceVersion") {
            return Err(ApiError::conflict(subject(res, name)));
        }
        self.write(res, ns, name, old, body, status_only, opts)
    }

    /// The shared tail of update and patch: `new` is the full desired object.
    #[allow(clippy::too_many_arguments)]
    fn write(
        &mut self,
        res: &ResourceInfo,
        ns: &str,
        name: &str,
        old: Value,
        body: Value,
        status_only: bool,
        opts: &WriteOpts,
    ) -> Result<Value, ApiError> {
        let mut new = if status_only {
            let mut n = old.clone();
            match body.get("status") {
                Some(s) => n["status"] = s.clone(),
                None => {
                    if let Some(m) = n.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
            n
        } else {
            let mut n = body;
            if !n.get("metadata").is_some_and(Value::is_object) {
                n["metadata"] = json!({});
            }
            if res.has_status
                && let Some(m) = n.as_object_mut()
            {
                match old.get("status") {
                    Some(st) => {
                        m.insert("status".into(), st.clone());
                    }
                    None => {
                        m.remove("status");
                    }
                }
            }
            for f in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "managedFields",
                "namespace",
                "name",
            ] {
                match old.get("metadata").and_then(|m| m.get(f)) {
                    Some(v) => set_meta(&mut n, f, v.clone()),
                    None => remove_meta(&mut n, f),
                }
            }
            n
        };
        new["apiVersion"] = json!(res.api_version());
        new["kind"] = json!(res.kind);
        if !meta_str(&old, "deletionTimestamp").is_empty() {
            let before = finalizers(&old);
            if let Some(added) = finalizers(&new).into_iter().find(|f| !before.contains(f)) {
                return Err(ApiError::invalid(
                    &res.kind,
                    &res.group,
                    name,
                    vec![Cause {
                        reason: "FieldValueForbidden",
                        field: "metadata.finalizers".into(),
                        message: format!(
                            "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{{\"{added}\"}}"
                        ),
                    }],
                ));
            }
        }
        if res.plural == "customresourcedefinitions" {
            crd_status(&mut new);
        }
        self.validate_custom(res, &mut new, Some(&old), opts)?;
        if res.tracks_generation && spec_part(&new) != spec_part(&old) {
            let g = old
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            set_meta(&mut new, "generation", json!(g + 1));
        }
        set_meta(
            &mut new,
            "resourceVersion",
            json!(meta_str(&old, "resourceVersion")),
        );
        let deleting = !meta_str(&new, "deletionTimestamp").is_empty();
        let changed = comparable(&new) != comparable(&old);
        if !(changed || deleting && finalizers(&new).is_empty()) {
            return Ok(old);
        }
        let fields = if status_only {
            json!({"f:status": meta::fields_v1(&json!({"x": new.get("status")}))["f:x"]})
        } else {
            meta::fields_v1(&new)
        };
        opts.record(&mut new, res, status_only.then_some("status"), fields);
        if opts.dry_run {
            return Ok(new);
        }
        let rv = self.next_rv();
        set_meta(&mut new, "resourceVersion", json!(rv.to_string()));
        let k = (ns.to_string(), name.to_string());
        if deleting && finalizers(&new).is_empty() {
            if let Some(m) = self.objects.get_mut(&key(res)) {
                m.remove(&k);
            }
            self.push(res, EventType::Deleted, &new, Some(old));
            self.after_delete(res, &new);
            return Ok(new);
        }
        self.objects
            .entry(key(res))
            .or_default()
            .insert(k, new.clone());
        self.push(res, EventType::Modified, &new, Some(old));
        if res.plural == "customresourcedefinitions" {
            self.register_crd(&new);
        }
        Ok(new)
    }

    /// Patch: `apply` computes the desired object from the stored one (or from nothing, for
    /// server-side apply of a missing object).
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &mut self,
        res: &ResourceInfo,
        ns: &str,
        name: &str,
        status_only: bool,
        kind: PatchKind,
        patch: &Value,
        opts: &WriteOpts,
    ) -> Result<Value, ApiError> {
        let old = match self.get(res, ns, name) {
            Ok(o) => o,
            Err(e) => {
                if kind == PatchKind::Apply && !status_only {
                    let mut obj = patch.clone();
                    if meta_str(&obj, "name").is_empty() {
                        set_meta(&mut obj, "name", json!(name));
                    }
                    if meta_str(&obj, "name") != name {
                        return Err(ApiError::bad_request(format!(
                            "the name of the object ({}) does not match the name on the URL ({name})",
                            meta_str(&obj, "name")
                        )));
                    }
                    let opts = WriteOpts {
                        apply_fields: Some(meta::fields_v1(patch)),
                        ..opts.clone()
                    };
                    return self.create(res, ns, obj, &opts);
                }
                return Err(e);
            }
        };
        let mut doc = old.clone();
        match kind {
            PatchKind::Merge | PatchKind::StrategicMerge => json_patch::merge(&mut doc, patch),
            PatchKind::Json => {
                let ops: json_patch::Patch = serde_json::from_value(patch.clone())
                    .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
                json_patch::patch(&mut doc, &ops).map_err(|e| {
                    ApiError::new(422, crate::error::Reason::Invalid, e.to_string())
                })?;
            }
            PatchKind::Apply => {
                let body_name = meta_str(patch, "name");
                if !body_name.is_empty() && body_name != name {
                    return Err(ApiError::bad_request(format!(
                        "the name of the object ({body_name}) does not match the name on the URL ({name})"
                    )));
                }
                let sub = status_only.then_some("status");
                let new_set = meta::fields_v1(patch);
                if let Some(old_set) = meta::applied_fields(&old, &opts.manager, sub) {
                    meta::remove_disowned(&mut doc, &old_set, &new_set);
                }
                let mut p = patch.clone();
                remove_meta(&mut p, "resourceVersion");
                meta::apply_merge(&mut doc, &p);
                if let Some(rv) = patch.pointer("/metadata/resourceVersion") {
                    set_meta(&mut doc, "resourceVersion", rv.clone());
                }
            }
        }
        if !doc.is_object() {
            return Err(ApiError::bad_request("the patched object is not an object"));
        }
        if meta_str(&doc, "resourceVersion").is_empty() {
            set_meta(
                &mut doc,
                "resourceVersion",
                json!(meta_str(&old, "resourceVersion")),
            );
        }
        if meta_str(&doc, "resourceVersion") != meta_str(&old, "resourceVersion") {
            return Err(ApiError::conflict(subject(res, name)));
        }
        if meta_str(&doc, "name") != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                meta_str(&doc, "name")
            )));
        }
        let mut opts = opts.clone();
        if kind == PatchKind::Apply {
            opts.apply_fields = Some(meta::fields_v1(patch));
        }
        self.write(res, ns, name, old, doc, status_only, &opts)
    }

    /// Delete: marks the object while finalizers remain, removes it otherwise.
    pub fn delete(
        &mut self,
        res: &ResourceInfo,
        ns: &str,
        name: &str,
        options: &Value,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let old = self.get(res, ns, name)?;
        if let Some(uid) = options
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
        {
            let have = meta_str(&old, "uid");
            if uid != have {
                return Err(ApiError::precondition_failed(
                    &res.kind,
                    &res.group,
                    name,
                    &format!(
                        "the UID in the precondition ({uid}) does not match the UID in record \
                         ({have}). The object might have been deleted and then recreated"
                    ),
                ));
            }
        }
        if let Some(rv) = options
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
        {
            let have = meta_str(&old, "resourceVersion");
            if rv != have {
                return Err(ApiError::precondition_failed(
                    &res.kind,
                    &res.group,
                    name,
                    &format!(
                        "the ResourceVersion in the precondition ({rv}) does not match the \
                         ResourceVersion in record ({have}). The object might have been modified"
                    ),
                ));
            }
        }
        if dry_run {
            return Ok(old);
        }
        let k = (ns.to_string(), name.to_string());
        if !finalizers(&old).is_empty() {
            if !meta_str(&old, "deletionTimestamp").is_empty() {
                return Ok(old);
            }
            let mut new = old.clone();
            set_meta(&mut new, "deletionTimestamp", json!(meta::now()));
            set_meta(&mut new, "deletionGracePeriodSeconds", json!(0));
            if res.tracks_generation {
                let g = old
                    .pointer("/metadata/generation")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                set_meta(&mut new, "generation", json!(g + 1));
            }
            let rv = self.next_rv();
            set_meta(&mut new, "resourceVersion", json!(rv.to_string()));
            self.objects
                .entry(key(res))
                .or_default()
                .insert(k, new.clone());
            self.push(res, EventType::Modified, &new, Some(old));
            return Ok(new);
        }
        let mut gone = old.clone();
        let rv = self.next_rv();
        set_meta(&mut gone, "resourceVersion", json!(rv.to_string()));
        if let Some(m) = self.objects.get_mut(&key(res)) {
            m.remove(&k);
        }
        self.push(res, EventType::Deleted, &gone, Some(old));
        self.after_delete(res, &gone);
        Ok(gone)
    }

    /// Cascades of a removal: a namespace takes its objects, a CRD its resources.
    fn after_delete(&mut self, res: &ResourceInfo, obj: &Value) {
        if res.plural == "namespaces" && res.group.is_empty() {
            let ns = meta_str(obj, "name").to_string();
            let namespaced: Vec<ResourceInfo> = self
                .resources
                .iter()
                .filter(|r| r.namespaced)
                .cloned()
                .collect();
            let mut seen = Vec::new();
            for r in namespaced {
                if seen.contains(&key(&r)) {
                    continue;
                }
                seen.push(key(&r));
                let names: Vec<String> = self
                    .list(&r, Some(&ns))
                    .iter()
                    .map(|o| meta_str(o, "name").to_string())
                    .collect();
                for n in names {
                    let _ = self.delete(&r, &ns, &n, &Value::Null, false);
                }
            }
        }
        if res.plural == "customresourcedefinitions" {
            let group = obj.pointer("/spec/group").and_then(Value::as_str);
            let plural = obj.pointer("/spec/names/plural").and_then(Value::as_str);
            if let (Some(group), Some(plural)) = (group, plural) {
                let k = (group.to_string(), plural.to_string());
                let gone: Vec<ResourceInfo> = self
                    .resources
                    .iter()
                    .filter(|r| key(r) == k)
                    .cloned()
                    .collect();
                if let Some(r) = gone.first() {
                    let all: Vec<Value> = self.list(r, None);
                    for o in all {
                        let mut g = o.clone();
                        let rv = self.next_rv();
                        set_meta(&mut g, "resourceVersion", json!(rv.to_string()));
                        self.push(r, EventType::Deleted, &g, Some(o));
                    }
                }
                self.objects.remove(&k);
                self.resources.retain(|r| key(r) != k || !r.custom);
            }
        }
    }

    /// Serves (or re-serves) the resources a stored CRD defines.
    fn register_crd(&mut self, crd: &Value) {
        let new = resources::from_crd(crd);
        if let Some(first) = new.first() {
            let k = key(first);
            self.resources.retain(|r| key(r) != k || !r.custom);
            self.resources.extend(new);
        }
    }

    /// Delete every object of a resource in scope matching `keep` (deletecollection).
    pub fn delete_collection(
        &mut self,
        res: &ResourceInfo,
        ns: Option<&str>,
        matches: &dyn Fn(&Value) -> bool,
    ) -> Vec<Value> {
        let targets: Vec<(String, String)> = self
            .list(res, ns)
            .iter()
            .filter(|o| matches(o))
            .map(|o| {
                (
                    meta_str(o, "namespace").to_string(),
                    meta_str(o, "name").to_string(),
                )
            })
            .collect();
        targets
            .iter()
            .filter_map(|(n, name)| self.delete(res, n, name, &Value::Null, false).ok())
            .collect()
    }
}

/// The media type of a PATCH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    /// `application/merge-patch+json` (RFC 7386).
    Merge,
    /// `application/json-patch+json` (RFC 6902).
    Json,
    /// `application/strategic-merge-patch+json`, treated as a merge patch (built-ins only).
    StrategicMerge,
    /// `application/apply-patch+yaml`: server-side apply.
    Apply,
}

/// The `apiVersion`/`kind` checks of a body. Built-ins default missing ones (typed
/// decoding); custom resources need both: a missing kind fails decoding (400), a missing or
/// other apiVersion is 400, another kind is 422 on `kind`.
fn check_type(res: &ResourceInfo, obj: &Value) -> Result<(), ApiError> {
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
    let av = obj
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if res.custom && kind.is_empty() {
        return Err(ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type {}): Object 'Kind' is missing in '{obj}'",
            res.kind
        )));
    }
    if (res.custom || !av.is_empty()) && av != res.api_version() {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({av}) does not match the expected API version ({})",
            res.api_version()
        )));
    }
    if !kind.is_empty() && kind != res.kind {
        if res.custom {
            let name = meta_str(obj, "name");
            return Err(ApiError::invalid(
                kind,
                &res.group,
                name,
                vec![Cause {
                    reason: "FieldValueInvalid",
                    field: "kind".into(),
                    message: format!("kind: Invalid value: \"{kind}\": must be {}", res.kind),
                }],
            ));
        }
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({kind}) does not match the expected kind ({})",
            res.kind
        )));
    }
    Ok(())
}

/// What the apiextensions controllers would write into a CRD's status.
fn crd_status(crd: &mut Value) {
    let names = crd.pointer("/spec/names").cloned().unwrap_or(json!({}));
    let storage: Vec<Value> = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .map(|vs| {
            vs.iter()
                .filter(|v| v["storage"].as_bool() == Some(true))
                .filter_map(|v| v.get("name").cloned())
                .collect()
        })
        .unwrap_or_default();
    let now = meta::now();
    crd["status"] = json!({
        "acceptedNames": names,
        "storedVersions": storage,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
             "message": "no conflicts found", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
             "message": "the initial names have been accepted", "lastTransitionTime": now},
        ],
    });
}

/// Minimal CRD validation: the fields the server needs to serve it.
fn crd_causes(crd: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let mut required = |ptr: &str, field: &str| {
        if crd
            .pointer(ptr)
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            causes.push(Cause {
                reason: "FieldValueRequired",
                field: field.into(),
                message: format!("{field}: Required value"),
            });
        }
    };
    required("/spec/group", "spec.group");
    required("/spec/names/plural", "spec.names.plural");
    required("/spec/names/kind", "spec.names.kind");
    let group = crd
        .pointer("/spec/group")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let plural = crd
        .pointer("/spec/names/plural")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let name = meta_str(crd, "name");
    if causes.is_empty() && name != format!("{plural}.{group}") {
        causes.push(Cause {
            reason: "FieldValueInvalid",
            field: "metadata.name".into(),
            message: format!(
                "metadata.name: Invalid value: \"{name}\": must be spec.names.plural+\".\"+spec.group"
            ),
        });
    }
    if crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .is_none_or(Vec::is_empty)
    {
        causes.push(Cause {
            reason: "FieldValueRequired",
            field: "spec.versions".into(),
            message: "spec.versions: Invalid value: []: must have exactly one version marked as storage version".into(),
        });
    }
    causes
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn cm(name: &str, v: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": "default"}, "data": {"k": v}})
    }

    /// Journal lines for the writes `f` makes, one line per write as the server appends them.
    fn journaled(s: &mut State, f: impl FnOnce(&mut State)) -> String {
        let before = s.rv();
        f(s);
        // One entry for everything `f` did: a line may hold several changes.
        let e = s.journal_since(before).unwrap();
        format!("{}\n", serde_json::to_string(&e).unwrap())
    }

    fn data(s: &State, name: &str) -> Option<String> {
        let res = s.find("", "v1", "configmaps").unwrap();
        s.get(&res, "default", name)
            .ok()
            .map(|o| o["data"]["k"].as_str().unwrap().to_string())
    }

    #[test]
    fn a_snapshot_and_its_journal_restore_every_write() {
        let mut s = State::new(100);
        let res = s.find("", "v1", "configmaps").unwrap();
        let o = WriteOpts::default();
        s.create(&res, "default", cm("kept", "1"), &o).unwrap();
        s.create(&res, "default", cm("gone", "1"), &o).unwrap();
        let snap = s.snapshot();
        let mut journal = journaled(&mut s, |s| {
            s.create(&res, "default", cm("new", "2"), &o).unwrap();
        });
        journal += &journaled(&mut s, |s| {
            let mut v = s.get(&res, "default", "kept").unwrap();
            v["data"]["k"] = json!("3");
            s.update(&res, "default", "kept", v, false, &o).unwrap();
            s.delete(&res, "default", "gone", &Value::Null, false)
                .unwrap();
        });
        let mut snap2 = State::restore(100, snap).unwrap().snapshot();
        snap2.replay(journal.as_bytes()).unwrap();
        let r = State::restore(100, snap2).unwrap();
        assert_eq!(r.rv(), s.rv());
        assert_eq!(data(&r, "kept").as_deref(), Some("3"));
        assert_eq!(data(&r, "new").as_deref(), Some("2"));
        assert_eq!(data(&r, "gone"), None);
    }

    #[test]
    fn replay_skips_what_the_snapshot_holds_and_ignores_a_torn_last_line() {
        let mut s = State::new(100);
        let res = s.find("", "v1", "configmaps").unwrap();
        let o = WriteOpts::default();
        let journal = journaled(&mut s, |s| {
            s.create(&res, "default", cm("a", "1"), &o).unwrap();
        });
        // The snapshot was written after the entry (a crash before the journal was emptied),
        // and "a" changed since: the stale entry must not bring the old value back.
        let mut v = s.get(&res, "default", "a").unwrap();
        v["data"]["k"] = json!("2");
        s.update(&res, "default", "a", v, false, &o).unwrap();
        let mut snap = s.snapshot();
        let torn = format!("{journal}{{\"rv\": 99999, \"chan");
        snap.replay(torn.as_bytes()).unwrap();
        let r = State::restore(100, snap).unwrap();
        assert_eq!(data(&r, "a").as_deref(), Some("2"));
        assert_eq!(r.rv(), s.rv());

        // A bad line that is not the last one is an error naming it.
        let mut snap = s.snapshot();
        let bad = format!("not json\n{journal}");
        let err = snap.replay(bad.as_bytes()).unwrap_err();
        assert!(err.contains("line 1"), "{err}");
    }

    #[test]
    fn an_entry_is_refused_once_the_log_lost_part_of_it() {
        let mut s = State::new(2);
        let res = s.find("", "v1", "configmaps").unwrap();
        let before = s.rv();
        for i in 0..3 {
            s.create(
                &res,
                "default",
                cm(&format!("c{i}"), "1"),
                &WriteOpts::default(),
            )
            .unwrap();
        }
        assert!(s.journal_since(before).is_none());
        assert_eq!(s.journal_since(s.rv()).unwrap().changes.len(), 0);
    }
}
