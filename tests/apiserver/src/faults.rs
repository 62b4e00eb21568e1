//! Fault injection for tests: failing requests, delaying responses, holding requests until
//! released, dropping watches, and counting requests.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{broadcast, watch};

/// The verb of a request, as kube-apiserver's audit log names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Verb {
    /// GET of one object.
    Get,
    /// GET of a collection.
    List,
    /// GET of a collection with `watch=true`.
    Watch,
    /// POST.
    Create,
    /// PUT.
    Update,
    /// PATCH.
    Patch,
    /// DELETE of one object.
    Delete,
    /// DELETE of a collection.
    DeleteCollection,
}

/// Which requests a fault applies to; `None` fields match anything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Matcher {
    /// The verb.
    pub verb: Option<Verb>,
    /// The plural, with `/status` for the status subresource (`antstorvolumes/status`).
    pub resource: Option<String>,
    /// The object name.
    pub name: Option<String>,
    /// The client, as named by its [`CLIENT_HEADER`] (see `TestApiServer::named_client`).
    pub client: Option<String>,
}

/// The request header that names a test client, so a fault can hit one client of several.
pub const CLIENT_HEADER: &str = "x-liteio-test-client";

impl Matcher {
    /// Requests with this verb on this resource (`plural` or `plural/status`).
    pub fn new(verb: Verb, resource: &str) -> Self {
        Matcher {
            verb: Some(verb),
            resource: Some(resource.to_string()),
            name: None,
            client: None,
        }
    }

    /// Only requests for this object name.
    pub fn named(mut self, name: &str) -> Self {
        self.name = Some(name.to_string());
        self
    }

    /// Only requests of the client named `client` (see `TestApiServer::named_client`).
    pub fn from_client(mut self, client: &str) -> Self {
        self.client = Some(client.to_string());
        self
    }

    fn matches(
        &self,
        verb: Verb,
        resource: &str,
        name: Option<&str>,
        client: Option<&str>,
    ) -> bool {
        self.verb.is_none_or(|v| v == verb)
            && self.resource.as_deref().is_none_or(|r| r == resource)
            && self.name.as_deref().is_none_or(|n| Some(n) == name)
            && self.client.as_deref().is_none_or(|c| Some(c) == client)
    }
}

#[derive(Debug)]
struct Failure {
    matcher: Matcher,
    remaining: usize,
    code: u16,
    reason: String,
}

#[derive(Debug, Default)]
struct Inner {
    failures: Vec<Failure>,
    delays: Vec<(Matcher, Duration)>,
    hangs: Vec<Matcher>,
    hanging: u64,
    drop_next_watch: HashMap<String, usize>,
    counts: HashMap<(Verb, String), u64>,
    named_counts: HashMap<(Verb, String, String), u64>,
}

/// What the server must do with one request.
#[derive(Debug, Default)]
pub(crate) struct Decision {
    pub fail: Option<(u16, String)>,
    pub delay: Option<Duration>,
    /// Hold the request (before it is processed) until this receiver changes.
    pub hang: Option<watch::Receiver<u64>>,
}

/// A handle to the server's fault injection; cheap to clone.
#[derive(Debug, Clone)]
pub struct Faults {
    inner: Arc<Mutex<Inner>>,
    drops: broadcast::Sender<Option<String>>,
    releases: Arc<watch::Sender<u64>>,
}

impl Default for Faults {
    fn default() -> Self {
        let (drops, _) = broadcast::channel(64);
        Faults {
            inner: Arc::default(),
            drops,
            releases: Arc::new(watch::channel(0).0),
        }
    }
}

impl Faults {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Fails the next `n` requests matching `m` with `code` and `reason` (a Status reason
    /// such as `InternalError`).
    pub fn fail_next(&self, n: usize, m: Matcher, code: u16, reason: &str) {
        self.lock().failures.push(Failure {
            matcher: m,
            remaining: n,
            code,
            reason: reason.to_string(),
        });
    }

    /// Delays every response matching `m` by `by` until [`Faults::clear`].
    pub fn delay(&self, m: Matcher, by: Duration) {
        self.lock().delays.push((m, by));
    }

    /// Holds every request matching `m`, before it is processed, until
    /// [`Faults::release_hangs`] or [`Faults::clear`]: a request that never gets an answer
    /// (a partitioned or overloaded API server). A client that gives up leaves nothing
    /// behind; a released request is processed as if it had just arrived.
    pub fn hang(&self, m: Matcher) {
        self.lock().hangs.push(m);
    }

    /// Stops holding requests and lets every held request go on.
    pub fn release_hangs(&self) {
        self.lock().hangs.clear();
        self.releases.send_modify(|g| *g = g.wrapping_add(1));
    }

    /// Requests held by [`Faults::hang`] so far (including released ones).
    pub fn hung(&self) -> u64 {
        self.lock().hanging
    }

    /// Ends every open watch of `resource` (the plural); returns at once.
    pub fn drop_watches(&self, resource: &str) {
        let _ = self.drops.send(Some(resource.to_string()));
    }

    /// Ends every open watch.
    pub fn drop_all_watches(&self) {
        let _ = self.drops.send(None);
    }

    /// Ends the next `n` watches of `resource` right after they start.
    pub fn drop_next_watches(&self, resource: &str, n: usize) {
        *self
            .lock()
            .drop_next_watch
            .entry(resource.to_string())
            .or_default() += n;
    }

    /// Requests seen with this verb on this resource (`plural` or `plural/status`).
    pub fn requests(&self, verb: Verb, resource: &str) -> u64 {
        self.lock()
            .counts
            .get(&(verb, resource.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// Requests seen with this verb on this resource (`plural` or `plural/status`) for the
    /// object `name` (a controller's retries of one object, for example).
    pub fn requests_for(&self, verb: Verb, resource: &str, name: &str) -> u64 {
        self.lock()
            .named_counts
            .get(&(verb, resource.to_string(), name.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// Removes every pending failure, delay, hang and watch drop, and releases held requests
    /// (counters stay).
    pub fn clear(&self) {
        {
            let mut g = self.lock();
            g.failures.clear();
            g.delays.clear();
            g.drop_next_watch.clear();
        }
        self.release_hangs();
    }

    pub(crate) fn subscribe_drops(&self) -> broadcast::Receiver<Option<String>> {
        self.drops.subscribe()
    }

    pub(crate) fn take_watch_drop(&self, resource: &str) -> bool {
        let mut g = self.lock();
        match g.drop_next_watch.get_mut(resource) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        }
    }

    pub(crate) fn decide(
        &self,
        verb: Verb,
        resource: &str,
        name: Option<&str>,
        client: Option<&str>,
    ) -> Decision {
        let mut g = self.lock();
        *g.counts.entry((verb, resource.to_string())).or_default() += 1;
        if let Some(n) = name {
            *g.named_counts
                .entry((verb, resource.to_string(), n.to_string()))
                .or_default() += 1;
        }
        let mut d = Decision::default();
        if let Some(f) = g
            .failures
            .iter_mut()
            .find(|f| f.remaining > 0 && f.matcher.matches(verb, resource, name, client))
        {
            f.remaining -= 1;
            d.fail = Some((f.code, f.reason.clone()));
        }
        g.failures.retain(|f| f.remaining > 0);
        d.delay = g
            .delays
            .iter()
            .filter(|(m, _)| m.matches(verb, resource, name, client))
            .map(|(_, by)| *by)
            .max();
        if g.hangs
            .iter()
            .any(|m| m.matches(verb, resource, name, client))
        {
            g.hanging += 1;
            let mut rx = self.releases.subscribe();
            rx.mark_unchanged();
            d.hang = Some(rx);
        }
        d
    }
}
