//! [`Reflector`]: the list/watch loop of one kind, with client-go's reflector semantics.
//!
//! kube-rs's `watcher` could not be used as it is: with `ListSemantic::Any` every relist
//! reads `resourceVersion=0` (it may go back in time, and it is what must not be used after a
//! "Too large resource version"), kube drops `resourceVersion=0` from a list that has a
//! `limit` (so the first list was a quorum read from etcd, paged by 500), it re-watches
//! forever from a resourceVersion the server answers "Too large resource version", and its
//! backoff is reset only by an event. This loop does what client-go's reflector does (see
//! `k8s.io/client-go/tools/cache/reflector.go`):
//!
//! # The state machine
//!
//! ```text
//!            +------------------------------------------------------------+
//!            v                                                            |
//!   List(rv = relist_rv) --pages--> InitApply.. InitDone --> Watch(last_rv) --> Watching
//!     |  ^      |                                              |   ^             |
//!     |  |      | 410 / too large on the first page,           |   | ended,      | 410 / too
//!     |  |      | rv != "": rv_unavailable, at once            |   | broken:     | large:
//!     |  +------+                                              |   | at once     | List
//!     | other failure: backoff, List again          failure:   |   +-------------+
//!     +-------------------------------------------- backoff, Watch again
//! ```
//!
//! - **The resourceVersion of a list** (`relist_rv`): `""` (a quorum read) after a list or
//!   watch found the last one unavailable (`410 Expired`, or "Too large resource version":
//!   an etcd restored from a backup, an API server whose cache is behind); `"0"` (any version:
//!   served from the API server's watch cache) for the first list, so a restart of every node
//!   costs etcd nothing; otherwise the last resourceVersion seen (not older than it: served
//!   from the watch cache, never going back in time).
//! - **Pages**: `limit` (500) is sent with `resourceVersion` `""` and `"0"` (the watch cache
//!   ignores it for `"0"`, etcd pages) and not with `N`, as client-go, since a paged list
//!   with `N` is not served from the watch cache; unless a `"0"` list came back paged (no
//!   watch cache), then every list is paged.
//! - **A list that fails** with `410` or "Too large resource version" on its first page,
//!   when it asked for a resourceVersion, is retried at once as a quorum read. Any other
//!   failure is retried with the backoff.
//! - **A watch** starts from the last resourceVersion seen (list, event or bookmark), with
//!   bookmarks and a `timeoutSeconds` drawn from `[5 min, 10 min)` as client-go (or
//!   [`super::ApiOptions::watch_timeout`]). A watch that cannot be started is retried with
//!   the backoff from the same resourceVersion; one answered `410` or "Too large resource
//!   version" (at start or as an `ERROR` event) lists again at once (from the last
//!   resourceVersion: the list then says whether that one is still available).
//! - **A watch stream that ends** (the server's timeout, a proxy closing it, a connection
//!   cut mid-stream) is watched again at once: nothing is lost, and a quiet cluster is not
//!   left unwatched for a backoff delay. Only a watch that ended within a second without
//!   any event waits for the backoff (a server closing every watch at once would otherwise
//!   be hammered), as does one silent for its timeout plus 5 s (a dead connection).
//! - **Relists forced by the protocol** (`410`, too large) happen at once, but when the
//!   watch after such a relist is again answered `410` or too large before any event, the
//!   next relist waits for the backoff.
//!
//! Every failure is logged (`WARN`) naming the API server and the delay before the next
//! attempt: `cannot reach the API server https://10.0.0.1:6443: watching Services: HTTP 503
//! ServiceUnavailable: ...; retrying in 4s`, and reported to the health [`Probe`]; every
//! success is reported too and starts the backoff's healthy period.

use std::collections::VecDeque;
use std::fmt::{self, Debug};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kp_model::ObjectKind;
use kube::api::{ListParams, ObjectList, WatchEvent, WatchParams};
use kube::core::Status;
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::backoff::ExponentialBackoff;
use super::health::{Probe, is_optional};

/// What the reflector tells the store.
#[derive(Debug)]
pub(crate) enum Event<K> {
    /// A (re)list starts: whatever was collected of an earlier list is dropped.
    Init,
    /// One object of the list.
    InitApply(K),
    /// The list is complete.
    InitDone,
    /// A watch `ADDED` or `MODIFIED`.
    Apply(K),
    /// A watch `DELETED`.
    Delete(K),
}

/// One list request: `resource_version` `""` (quorum), `"0"` (any) or `N` (not older than N).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ListQuery {
    pub(crate) resource_version: String,
    pub(crate) limit: Option<u32>,
    pub(crate) continue_token: Option<String>,
}

/// One watch request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WatchQuery {
    pub(crate) resource_version: String,
    pub(crate) timeout_secs: u32,
}

/// A watch's events.
pub(crate) type WatchStream<K> = BoxStream<'static, Result<WatchEvent<K>, kube::Error>>;

/// The two requests of the protocol (kube's `Api`, or a script in tests).
pub(crate) trait ListerWatcher: Send + Sync + 'static {
    type Object: Resource + Clone + Send + 'static;

    fn list(
        &self,
        query: &ListQuery,
    ) -> impl Future<Output = Result<ObjectList<Self::Object>, kube::Error>> + Send;

    fn watch(
        &self,
        query: &WatchQuery,
    ) -> impl Future<Output = Result<WatchStream<Self::Object>, kube::Error>> + Send;
}

/// [`ListerWatcher`] through kube's client, with the kind's selectors.
pub(crate) struct KubeListerWatcher<K> {
    client: Client,
    api: Api<K>,
    labels: Option<String>,
    fields: Option<String>,
}

impl<K> KubeListerWatcher<K>
where
    K: Resource<DynamicType = ()>,
{
    /// All namespaces' objects of `K` matching the selectors.
    pub(crate) fn new(client: Client, labels: Option<String>, fields: Option<String>) -> Self {
        KubeListerWatcher {
            api: Api::all(client.clone()),
            client,
            labels,
            fields,
        }
    }
}

/// Percent-encodes a query value (a resourceVersion is opaque to clients).
fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl<K> ListerWatcher for KubeListerWatcher<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    type Object = K;

    async fn list(&self, query: &ListQuery) -> Result<ObjectList<K>, kube::Error> {
        let params = ListParams {
            label_selector: self.labels.clone(),
            field_selector: self.fields.clone(),
            limit: query.limit,
            continue_token: query.continue_token.clone(),
            ..ListParams::default()
        };
        let mut request = kube::core::Request::new(self.api.resource_url())
            .list(&params)
            .map_err(kube::Error::BuildRequest)?;
        // Added here rather than through `ListParams`: kube drops `resourceVersion=0` from a
        // list with a `limit`, which turns a read from the watch cache into a quorum read.
        // A continuation page carries no resourceVersion (its token has it).
        if query.continue_token.is_none() && !query.resource_version.is_empty() {
            let uri = format!(
                "{}&resourceVersion={}&resourceVersionMatch=NotOlderThan",
                request.uri(),
                encode(&query.resource_version)
            );
            *request.uri_mut() = uri.parse().map_err(|e: http::uri::InvalidUri| {
                kube::Error::BuildRequest(kube::core::request::Error::Validation(e.to_string()))
            })?;
        }
        request.extensions_mut().insert("list");
        self.client.request::<ObjectList<K>>(request).await
    }

    async fn watch(&self, query: &WatchQuery) -> Result<WatchStream<K>, kube::Error> {
        let params = WatchParams {
            label_selector: self.labels.clone(),
            field_selector: self.fields.clone(),
            timeout: Some(query.timeout_secs),
            bookmarks: true,
            send_initial_events: false,
        };
        let stream = self.api.watch(&params, &query.resource_version).await?;
        Ok(stream.boxed())
    }
}

/// The settings of one reflector (from [`super::ApiOptions`]).
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// The kind, for logs and health.
    pub(crate) kind: ObjectKind,
    /// The API server's URL, for logs (may be empty).
    pub(crate) server: Arc<str>,
    pub(crate) page_size: Option<u32>,
    /// `None`: drawn from `[300, 600)` s for each watch, as client-go.
    pub(crate) watch_timeout: Option<u32>,
    pub(crate) backoff_initial: Duration,
    pub(crate) backoff_max: Duration,
    pub(crate) backoff_reset: Duration,
}

/// A watch that ends sooner than this without an event waits for the backoff.
const SHORT_WATCH: Duration = Duration::from_secs(1);

/// A watch silent for its timeout plus this long is taken for a dead connection.
const IDLE_MARGIN: Duration = Duration::from_secs(5);

/// Where the loop is.
enum Phase<K> {
    /// Start a (re)list.
    List,
    /// Fetch the next page of a list that asked for `resource_version`.
    Page {
        resource_version: String,
        continue_token: String,
    },
    /// Start a watch from the last resourceVersion.
    Watch,
    /// Read the open watch.
    Watching {
        stream: WatchStream<K>,
        timeout_secs: u32,
        started: Instant,
        events: u64,
    },
}

/// Whether a `Status` says the resourceVersion asked for is gone (`410 Expired`/`Gone`).
pub(crate) fn is_expired(status: &Status) -> bool {
    status.code == 410 || status.reason == "Expired" || status.reason == "Gone"
}

/// Whether a `Status` is the API server's "Too large resource version" (a `504` `Timeout`
/// with the cause `ResourceVersionTooLarge`; older servers only said so in the message).
pub(crate) fn is_too_large(status: &Status) -> bool {
    const TEXT: &str = "Too large resource version";
    let causes = status
        .details
        .as_ref()
        .map(|d| d.causes.as_slice())
        .unwrap_or_default();
    if causes.iter().any(|c| c.reason == "ResourceVersionTooLarge") {
        return true;
    }
    (status.code == 504 || status.reason == "Timeout")
        && (causes.iter().any(|c| c.message == TEXT) || status.message.contains(TEXT))
}

/// The API `Status` of an error, if it is one.
fn status_of(error: &kube::Error) -> Option<&Status> {
    match error {
        kube::Error::Api(status) => Some(status),
        _ => None,
    }
}

/// Whether an error is the protocol asking for a list (`410`, too large).
fn wants_relist(error: &kube::Error) -> bool {
    status_of(error).is_some_and(|s| is_expired(s) || is_too_large(s))
}

/// An error as one line: an API `Status` as `HTTP 503 ServiceUnavailable: message`, other
/// errors with their chain of causes (`client error (Connect): tcp connect error: Connection
/// refused (os error 111)`), without the `Debug` dumps of kube's `Display`.
pub(crate) fn describe(error: &kube::Error) -> String {
    if let Some(status) = status_of(error) {
        return describe_status(status);
    }
    let mut text = match error {
        kube::Error::HyperError(e) => e.to_string(),
        kube::Error::Service(e) => e.to_string(),
        kube::Error::ReadEvents(e) => e.to_string(),
        other => other.to_string(),
    };
    let mut source = match error {
        kube::Error::HyperError(e) => std::error::Error::source(e),
        kube::Error::Service(e) => e.source(),
        kube::Error::ReadEvents(e) => std::error::Error::source(e),
        other => std::error::Error::source(other).and_then(std::error::Error::source),
    };
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

/// A `Status` as `HTTP 503 ServiceUnavailable: message`.
pub(crate) fn describe_status(status: &Status) -> String {
    let mut text = format!("HTTP {}", status.code);
    if !status.reason.is_empty() {
        text.push(' ');
        text.push_str(&status.reason);
    }
    if !status.message.is_empty() {
        text.push_str(": ");
        text.push_str(&status.message);
    }
    text
}

/// A delay as Go prints durations, shortened: `800ms`, `1.6s`, `30s`.
pub(crate) fn format_delay(delay: Duration) -> String {
    if delay < Duration::from_secs(1) {
        return format!("{}ms", delay.as_millis());
    }
    let tenths = (delay.as_millis() + 50) / 100;
    if tenths.is_multiple_of(10) {
        format!("{}s", tenths / 10)
    } else {
        format!("{}.{}s", tenths / 10, tenths % 10)
    }
}

/// The plural the logs use for a kind.
fn plural(kind: ObjectKind) -> &'static str {
    match kind {
        ObjectKind::Service => "Services",
        ObjectKind::EndpointSlice => "EndpointSlices",
        ObjectKind::Node => "Nodes",
        ObjectKind::ServiceCidr => "ServiceCIDRs",
    }
}

/// The log line of a failed request: `cannot reach the API server URL: OPERATION KINDS:
/// ERROR; retrying in DELAY` (escaped: the error can quote the server; a trailing `/` of the
/// URL is dropped before the `:`).
pub(crate) fn retry_line(
    server: &str,
    operation: &str,
    kind: ObjectKind,
    error: &str,
    delay: Duration,
) -> String {
    let server = if server.is_empty() {
        String::new()
    } else {
        format!(" {}", kp_model::escape(server.trim_end_matches('/')))
    };
    format!(
        "cannot reach the API server{server}: {operation} {}: {}; retrying in {}",
        plural(kind),
        kp_model::escape(error),
        format_delay(delay)
    )
}

/// The list/watch loop of one kind; see the module documentation.
pub(crate) struct Reflector<L: ListerWatcher> {
    lw: L,
    settings: Settings,
    probe: Probe,
    backoff: ExponentialBackoff,
    phase: Phase<L::Object>,
    pending: VecDeque<Event<L::Object>>,
    /// The resourceVersion of the last list, event or bookmark; `""` before the first list.
    last_rv: String,
    /// The last list or watch found `last_rv` expired or too large: list with `""`.
    rv_unavailable: bool,
    /// A `"0"` list came back paged: the server has no watch cache; always page.
    paginated: bool,
    /// Relists forced by the protocol since the last watch event.
    forced_relists: u32,
}

impl<L: ListerWatcher> Reflector<L> {
    pub(crate) fn new(lw: L, settings: Settings, probe: Probe) -> Self {
        let backoff = ExponentialBackoff::new(
            settings.backoff_initial,
            settings.backoff_max,
            settings.backoff_reset,
        );
        Reflector {
            lw,
            settings,
            probe,
            backoff,
            phase: Phase::List,
            pending: VecDeque::new(),
            last_rv: String::new(),
            rv_unavailable: false,
            paginated: false,
            forced_relists: 0,
        }
    }

    /// The loop as a stream of events (it never ends).
    pub(crate) fn into_stream(self) -> BoxStream<'static, Event<L::Object>> {
        futures::stream::unfold(self, |mut reflector| async move {
            let event = reflector.next().await;
            Some((event, reflector))
        })
        .boxed()
    }

    /// The next event: runs requests, retries and waits until there is one.
    pub(crate) async fn next(&mut self) -> Event<L::Object> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return event;
            }
            self.phase = match std::mem::replace(&mut self.phase, Phase::List) {
                Phase::List => {
                    let rv = self.relist_rv();
                    self.page(rv, None).await
                }
                Phase::Page {
                    resource_version,
                    continue_token,
                } => self.page(resource_version, Some(continue_token)).await,
                Phase::Watch => self.start_watch().await,
                Phase::Watching {
                    stream,
                    timeout_secs,
                    started,
                    events,
                } => self.read_watch(stream, timeout_secs, started, events).await,
            };
        }
    }

    /// The resourceVersion a (re)list asks for (client-go's `relistResourceVersion`).
    fn relist_rv(&self) -> String {
        if self.rv_unavailable {
            String::new()
        } else if self.last_rv.is_empty() {
            "0".to_string()
        } else {
            self.last_rv.clone()
        }
    }

    fn kind(&self) -> ObjectKind {
        self.settings.kind
    }

    /// One page of a list that asked for `rv`; `token` for the pages after the first.
    async fn page(&mut self, rv: String, token: Option<String>) -> Phase<L::Object> {
        let paged = rv.is_empty() || rv == "0" || self.paginated;
        let query = ListQuery {
            resource_version: if token.is_some() {
                String::new()
            } else {
                rv.clone()
            },
            limit: if paged { self.settings.page_size } else { None },
            continue_token: token.clone(),
        };
        let first = token.is_none();
        let list = match self.lw.list(&query).await {
            Ok(list) => list,
            Err(e) if first && !rv.is_empty() && wants_relist(&e) => {
                warn!(
                    kind = ?self.kind(),
                    "listing {} from resourceVersion {rv:?}: {}; listing the current state \
                     (a quorum read)",
                    plural(self.kind()),
                    kp_model::escape(&describe(&e))
                );
                self.rv_unavailable = true;
                return Phase::List;
            }
            Err(e) => {
                self.fail("listing", &describe(&e)).await;
                return Phase::List;
            }
        };
        self.succeeded();
        if first {
            self.pending.push_back(Event::Init);
        }
        let continue_token = list.metadata.continue_.filter(|c| !c.is_empty());
        let list_rv = list.metadata.resource_version.filter(|r| !r.is_empty());
        self.pending
            .extend(list.items.into_iter().map(Event::InitApply));
        if let Some(continue_token) = continue_token {
            if rv == "0" {
                self.paginated = true;
            }
            return Phase::Page {
                resource_version: rv,
                continue_token,
            };
        }
        let Some(list_rv) = list_rv else {
            self.fail("listing", "the list has no resourceVersion")
                .await;
            return Phase::List;
        };
        debug!(kind = ?self.kind(), asked = %rv, resource_version = %list_rv, "listed");
        self.last_rv = list_rv;
        self.rv_unavailable = false;
        self.pending.push_back(Event::InitDone);
        Phase::Watch
    }

    /// Starts a watch from the last resourceVersion.
    async fn start_watch(&mut self) -> Phase<L::Object> {
        let timeout_secs = self.settings.watch_timeout.unwrap_or_else(|| {
            // [300, 600) s, as client-go spreads its watches.
            300 + (self.backoff.fraction() * 300.0) as u32
        });
        let query = WatchQuery {
            resource_version: self.last_rv.clone(),
            timeout_secs,
        };
        match self.lw.watch(&query).await {
            Ok(stream) => {
                self.succeeded();
                Phase::Watching {
                    stream,
                    timeout_secs,
                    started: Instant::now(),
                    events: 0,
                }
            }
            Err(e) if wants_relist(&e) => self.forced_relist(&e).await,
            Err(e) => {
                self.fail("watching", &describe(&e)).await;
                Phase::Watch
            }
        }
    }

    /// Reads one item of the open watch.
    async fn read_watch(
        &mut self,
        mut stream: WatchStream<L::Object>,
        timeout_secs: u32,
        started: Instant,
        events: u64,
    ) -> Phase<L::Object> {
        let idle = Duration::from_secs(u64::from(timeout_secs)) + IDLE_MARGIN;
        let item = match tokio::time::timeout(idle, stream.next()).await {
            Ok(item) => item,
            Err(_) => {
                // A connection that died without a word: counts as a failure.
                let text = format!("the watch was silent for {}", format_delay(idle));
                self.fail("watching", &text).await;
                return Phase::Watch;
            }
        };
        let watching = |stream, events| Phase::Watching {
            stream,
            timeout_secs,
            started,
            events,
        };
        match item {
            Some(Ok(WatchEvent::Added(object) | WatchEvent::Modified(object))) => {
                self.observed(object.meta());
                self.pending.push_back(Event::Apply(object));
                watching(stream, events + 1)
            }
            Some(Ok(WatchEvent::Deleted(object))) => {
                self.observed(object.meta());
                self.pending.push_back(Event::Delete(object));
                watching(stream, events + 1)
            }
            Some(Ok(WatchEvent::Bookmark(bookmark))) => {
                if !bookmark.metadata.resource_version.is_empty() {
                    self.last_rv = bookmark.metadata.resource_version;
                }
                self.forced_relists = 0;
                self.succeeded();
                watching(stream, events + 1)
            }
            Some(Ok(WatchEvent::Error(status))) => {
                let error = kube::Error::Api(status);
                if wants_relist(&error) {
                    return self.forced_relist(&error).await;
                }
                self.fail("watching", &describe(&error)).await;
                Phase::Watch
            }
            Some(Err(error)) if wants_relist(&error) => self.forced_relist(&error).await,
            Some(Err(
                error @ (kube::Error::ReadEvents(_)
                | kube::Error::HyperError(_)
                | kube::Error::Service(_)),
            )) => {
                // The connection broke mid-stream: like an end.
                debug!(kind = ?self.kind(), error = %describe(&error), "watch stream broken");
                self.ended(started, events).await
            }
            Some(Err(error)) => {
                // An event that cannot be read (or an error status): watching again at once
                // could get the same answer, so wait.
                self.fail("watching", &describe(&error)).await;
                Phase::Watch
            }
            None => self.ended(started, events).await,
        }
    }

    /// A watch event's object was seen: its resourceVersion is the resume point.
    fn observed(&mut self, meta: &ObjectMeta) {
        if let Some(rv) = meta.resource_version.as_deref().filter(|r| !r.is_empty()) {
            self.last_rv = rv.to_string();
        }
        self.forced_relists = 0;
        self.succeeded();
    }

    /// The watch stream ended: watch again at once, unless it ended at once.
    async fn ended(&mut self, started: Instant, events: u64) -> Phase<L::Object> {
        let lasted = started.elapsed();
        if events == 0 && lasted < SHORT_WATCH {
            let delay = self.backoff.failed(Instant::now());
            info!(
                kind = ?self.kind(),
                "the {} watch ended after {} without an event; watching again in {}",
                plural(self.kind()),
                format_delay(lasted),
                format_delay(delay)
            );
            tokio::time::sleep(delay).await;
        } else {
            debug!(kind = ?self.kind(), events, "watch ended; watching again");
        }
        Phase::Watch
    }

    /// The server answered `410` or "Too large resource version" to a watch: list again,
    /// at once unless the previous forced relist's watch got the same before any event.
    async fn forced_relist(&mut self, error: &kube::Error) -> Phase<L::Object> {
        let text = kp_model::escape(&describe(error)).into_owned();
        let too_large = status_of(error).is_some_and(is_too_large);
        if self.forced_relists > 0 {
            let delay = self.backoff.failed(Instant::now());
            warn!(
                kind = ?self.kind(),
                "watching {} from resourceVersion {:?}: {text}; listing again in {}",
                plural(self.kind()),
                self.last_rv,
                format_delay(delay)
            );
            tokio::time::sleep(delay).await;
        } else if too_large {
            warn!(
                kind = ?self.kind(),
                "watching {} from resourceVersion {:?}: {text}; listing again",
                plural(self.kind()),
                self.last_rv
            );
        } else {
            info!(
                kind = ?self.kind(),
                "watching {} from resourceVersion {:?}: {text}; listing again",
                plural(self.kind()),
                self.last_rv
            );
        }
        self.forced_relists += 1;
        Phase::List
    }

    fn succeeded(&mut self) {
        self.probe.success();
        self.backoff.succeeded(Instant::now());
    }

    /// A request failed: report, log with the next delay, and wait that long.
    async fn fail(&mut self, operation: &str, error: &str) {
        let delay = self.backoff.failed(Instant::now());
        self.probe
            .failure(format!("{:?} {operation}: {error}", self.kind()));
        let line = retry_line(&self.settings.server, operation, self.kind(), error, delay);
        if is_optional(self.kind()) {
            // Logged by the health when the failures start and when they end.
            debug!(kind = ?self.kind(), retry_in = %format_delay(delay), "{line}");
        } else {
            warn!(kind = ?self.kind(), retry_in = %format_delay(delay), "{line}");
        }
        tokio::time::sleep(delay).await;
    }
}

impl<K> fmt::Debug for Phase<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Phase::List => f.write_str("List"),
            Phase::Page { .. } => f.write_str("Page"),
            Phase::Watch => f.write_str("Watch"),
            Phase::Watching { .. } => f.write_str("Watching"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use k8s_openapi::api::core::v1::Node;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
    use tokio::sync::watch;

    use super::super::health::{Health, SourceHealth};
    use super::*;

    /// One step of a scripted watch stream.
    enum Step {
        Event(Box<Result<WatchEvent<Node>, kube::Error>>),
        /// Nothing for this long.
        Wait(Duration),
    }

    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Call {
        List(ListQuery),
        Watch(WatchQuery),
    }

    /// A scripted API server: each list or watch takes the next answer; when there is none
    /// the request never returns.
    #[derive(Default)]
    struct Script {
        lists: VecDeque<Result<ObjectList<Node>, kube::Error>>,
        /// A watch's steps; the stream ends after them (or stays open when `open`).
        watches: VecDeque<Result<(Vec<Step>, bool), kube::Error>>,
        calls: Vec<(Instant, Call)>,
    }

    #[derive(Clone, Default)]
    struct Fake(Arc<Mutex<Script>>);

    impl Fake {
        fn list(&self, answer: Result<ObjectList<Node>, kube::Error>) -> &Self {
            self.0.lock().unwrap().lists.push_back(answer);
            self
        }
        fn watch(&self, steps: Vec<Step>, open: bool) -> &Self {
            self.0.lock().unwrap().watches.push_back(Ok((steps, open)));
            self
        }
        fn watch_fails(&self, error: kube::Error) -> &Self {
            self.0.lock().unwrap().watches.push_back(Err(error));
            self
        }
        fn calls(&self) -> Vec<(Instant, Call)> {
            self.0.lock().unwrap().calls.clone()
        }
    }

    impl ListerWatcher for Fake {
        type Object = Node;

        async fn list(&self, query: &ListQuery) -> Result<ObjectList<Node>, kube::Error> {
            let answer = {
                let mut script = self.0.lock().unwrap();
                script
                    .calls
                    .push((Instant::now(), Call::List(query.clone())));
                script.lists.pop_front()
            };
            match answer {
                Some(answer) => answer,
                None => std::future::pending().await,
            }
        }

        async fn watch(&self, query: &WatchQuery) -> Result<WatchStream<Node>, kube::Error> {
            let answer = {
                let mut script = self.0.lock().unwrap();
                script
                    .calls
                    .push((Instant::now(), Call::Watch(query.clone())));
                script.watches.pop_front()
            };
            let (steps, open) = match answer {
                Some(answer) => answer?,
                None => std::future::pending().await,
            };
            let steps = futures::stream::iter(steps).filter_map(|step| async move {
                match step {
                    Step::Event(event) => Some(*event),
                    Step::Wait(d) => {
                        tokio::time::sleep(d).await;
                        None
                    }
                }
            });
            if open {
                Ok(steps.chain(futures::stream::pending()).boxed())
            } else {
                Ok(steps.boxed())
            }
        }
    }

    fn node(name: &str, rv: &str) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some(name.into());
        node.metadata.resource_version = Some(rv.into());
        node
    }

    fn listed(rv: &str, items: Vec<Node>, continue_token: Option<&str>) -> ObjectList<Node> {
        ObjectList {
            types: Default::default(),
            metadata: ListMeta {
                resource_version: Some(rv.into()),
                continue_: continue_token.map(str::to_string),
                ..ListMeta::default()
            },
            items,
        }
    }

    fn status(code: u16, reason: &str, message: &str) -> Status {
        Status {
            code,
            reason: reason.into(),
            message: message.into(),
            ..Status::default()
        }
    }

    fn gone() -> Status {
        status(410, "Expired", "too old resource version: 5 (9)")
    }

    /// The real API server's "Too large resource version", as it is sent.
    fn too_large() -> Status {
        serde_json::from_value(serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "Timeout: Too large resource version: 100, current: 50",
            "reason": "Timeout",
            "details": {
                "causes": [{"reason": "ResourceVersionTooLarge",
                            "message": "Too large resource version"}],
                "retryAfterSeconds": 1
            },
            "code": 504
        }))
        .expect("a Status")
    }

    fn unavailable() -> kube::Error {
        kube::Error::Api(status(503, "ServiceUnavailable", "down").boxed())
    }

    fn broken() -> kube::Error {
        kube::Error::ReadEvents(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "connection reset by peer",
        ))
    }

    fn settings(initial: u64, max: u64, reset: u64) -> Settings {
        Settings {
            kind: ObjectKind::Node,
            server: Arc::from("https://10.0.0.1:6443"),
            page_size: Some(500),
            watch_timeout: Some(60),
            backoff_initial: Duration::from_millis(initial),
            backoff_max: Duration::from_millis(max),
            backoff_reset: Duration::from_millis(reset),
        }
    }

    fn reflector(fake: &Fake, settings: Settings) -> Reflector<Fake> {
        let health = Health::new(watch::Sender::new(SourceHealth::Connecting));
        Reflector::new(fake.clone(), settings, health.probe(ObjectKind::Node))
    }

    /// The next `n` events, as short strings.
    async fn events(r: &mut Reflector<Fake>, n: usize) -> Vec<String> {
        let mut out = Vec::new();
        for _ in 0..n {
            let event = tokio::time::timeout(Duration::from_secs(3600), r.next())
                .await
                .expect("an event");
            let name = |n: &Node| n.metadata.name.clone().unwrap_or_default();
            out.push(match event {
                Event::Init => "init".to_string(),
                Event::InitApply(n) => format!("list {}", name(&n)),
                Event::InitDone => "done".to_string(),
                Event::Apply(n) => format!("apply {}", name(&n)),
                Event::Delete(n) => format!("delete {}", name(&n)),
            });
        }
        out
    }

    /// Runs the reflector for 40 s (less than an open watch's idle timeout, 65 s): through
    /// the rest of the script, until it waits for an answer the script does not have.
    async fn drain(r: &mut Reflector<Fake>) {
        let _ = tokio::time::timeout(Duration::from_secs(40), r.next()).await;
    }

    fn list_call(rv: &str, limit: Option<u32>) -> Call {
        Call::List(ListQuery {
            resource_version: rv.into(),
            limit,
            continue_token: None,
        })
    }

    fn watch_call(rv: &str) -> Call {
        Call::Watch(WatchQuery {
            resource_version: rv.into(),
            timeout_secs: 60,
        })
    }

    fn ev(event: WatchEvent<Node>) -> Step {
        Step::Event(Box::new(Ok(event)))
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_list_reads_the_cache_and_relists_never_go_back_in_time() {
        let fake = Fake::default();
        fake.list(Ok(listed("10", vec![node("a", "5")], Some("tok"))))
            .list(Ok(listed("10", vec![node("b", "7")], None)))
            .watch(
                vec![
                    ev(WatchEvent::Modified(node("a", "11"))),
                    ev(WatchEvent::Error(gone().boxed())),
                ],
                false,
            )
            .list(Ok(listed("20", vec![node("a", "11")], None)))
            .watch(vec![], true);
        let mut r = reflector(&fake, settings(800, 30_000, 120_000));
        assert_eq!(
            events(&mut r, 8).await,
            [
                "init", "list a", "list b", "done", "apply a", "init", "list a", "done"
            ]
        );
        drain(&mut r).await;
        let calls: Vec<Call> = fake.calls().into_iter().map(|(_, c)| c).collect();
        assert_eq!(
            calls,
            [
                // The first list: any version (the watch cache), paged.
                list_call("0", Some(500)),
                Call::List(ListQuery {
                    resource_version: String::new(),
                    limit: Some(500),
                    continue_token: Some("tok".into()),
                }),
                watch_call("10"),
                // After 410: not older than the last seen. Paged, since the "0" list came
                // back paged (no watch cache); see the next test for an unpaged one.
                list_call("11", Some(500)),
                watch_call("20"),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn too_large_relists_at_once_with_a_quorum_read() {
        let fake = Fake::default();
        fake.list(Ok(listed("100", vec![node("a", "90")], None)))
            .watch(vec![ev(WatchEvent::Error(too_large().boxed()))], false)
            .list(Err(kube::Error::Api(too_large().boxed())))
            .list(Ok(listed("50", vec![node("b", "40")], None)))
            .watch(vec![], true);
        let t0 = Instant::now();
        let mut r = reflector(&fake, settings(800, 30_000, 120_000));
        assert_eq!(
            events(&mut r, 6).await,
            ["init", "list a", "done", "init", "list b", "done"]
        );
        drain(&mut r).await;
        let calls = fake.calls();
        assert_eq!(
            calls.iter().map(|(_, c)| c.clone()).collect::<Vec<_>>(),
            [
                list_call("0", Some(500)),
                watch_call("100"),
                list_call("100", None),
                // The quorum read, paged: the state after the restore.
                list_call("", Some(500)),
                watch_call("50"),
            ]
        );
        // Nothing waited for a backoff.
        assert!(calls.iter().all(|(t, _)| *t == t0), "{calls:?}");
        // Once listed, the next relist is from the cache again.
        assert!(!r.rv_unavailable);
        assert_eq!(r.relist_rv(), "50");
    }

    #[tokio::test(start_paused = true)]
    async fn ended_and_broken_watches_are_watched_again_at_once() {
        let fake = Fake::default();
        fake.list(Ok(listed("10", vec![], None)))
            // Ends normally after a bookmark.
            .watch(
                vec![
                    Step::Wait(Duration::from_secs(30)),
                    ev(WatchEvent::Bookmark(
                        serde_json::from_value(serde_json::json!({
                            "apiVersion": "v1", "kind": "Node",
                            "metadata": {"resourceVersion": "12"}
                        }))
                        .unwrap(),
                    )),
                ],
                false,
            )
            // Ends normally, quiet, after a while.
            .watch(vec![Step::Wait(Duration::from_secs(30))], false)
            // Cut mid-stream after an event.
            .watch(
                vec![
                    ev(WatchEvent::Added(node("a", "13"))),
                    Step::Event(Box::new(Err(broken()))),
                ],
                false,
            )
            .watch(vec![], true);
        let mut r = reflector(&fake, settings(800, 30_000, 120_000));
        assert_eq!(events(&mut r, 3).await, ["init", "done", "apply a"]);
        drain(&mut r).await;
        let calls = fake.calls();
        let watches: Vec<(Instant, Call)> = calls
            .into_iter()
            .filter(|(_, c)| matches!(c, Call::Watch(_)))
            .collect();
        assert_eq!(
            watches.iter().map(|(_, c)| c.clone()).collect::<Vec<_>>(),
            [
                watch_call("10"),
                watch_call("12"),
                watch_call("12"),
                watch_call("13")
            ]
        );
        let gaps: Vec<Duration> = watches.windows(2).map(|w| w[1].0 - w[0].0).collect();
        assert_eq!(
            gaps,
            [
                Duration::from_secs(30),
                Duration::from_secs(30),
                Duration::ZERO
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_that_ends_at_once_without_events_waits_for_the_backoff() {
        let fake = Fake::default();
        fake.list(Ok(listed("10", vec![], None)))
            .watch(vec![], false)
            .watch(vec![], true);
        let mut r = reflector(&fake, settings(800, 30_000, 120_000));
        assert_eq!(events(&mut r, 2).await, ["init", "done"]);
        drain(&mut r).await;
        let calls = fake.calls();
        let gap = calls[2].0 - calls[1].0;
        assert!(
            gap >= Duration::from_millis(800) && gap < Duration::from_millis(1200),
            "{gap:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_to_the_cap_and_a_healthy_period_resets_it() {
        let ms = Duration::from_millis;
        let fake = Fake::default();
        for _ in 0..6 {
            fake.list(Err(unavailable()));
        }
        fake.list(Ok(listed("10", vec![], None)))
            // Healthy for 2 s (less than the reset duration), then cut; the re-watch fails.
            .watch(
                vec![Step::Wait(ms(2000)), Step::Event(Box::new(Err(broken())))],
                false,
            )
            .watch_fails(unavailable())
            // Healthy for 20 s, then cut; the re-watch fails.
            .watch(
                vec![Step::Wait(ms(20_000)), Step::Event(Box::new(Err(broken())))],
                false,
            )
            .watch_fails(unavailable())
            .watch(vec![], true);
        let mut r = reflector(&fake, settings(100, 1000, 10_000));
        assert_eq!(events(&mut r, 2).await, ["init", "done"]);
        drain(&mut r).await;
        let calls = fake.calls();
        assert_eq!(calls.len(), 12, "{calls:?}");
        let gap = |i: usize| calls[i + 1].0 - calls[i].0;
        // 100 ms doubling to the 1 s cap, jittered up to +50%.
        for (i, base) in [100u64, 200, 400, 800, 1000, 1000].into_iter().enumerate() {
            assert!(
                gap(i) >= ms(base) && gap(i) <= ms(base * 3 / 2).min(ms(1000)),
                "delay {i}: {:?}",
                gap(i)
            );
        }
        // calls[6]: the list; [7]: the watch; cut after 2 s, re-watched at once ([8]), which
        // fails: still at the cap.
        assert_eq!(gap(7), ms(2000));
        assert_eq!(gap(8).min(ms(1000)), ms(1000));
        // [9]: healthy for 20 s, cut, re-watched at once ([10]), which fails: reset.
        assert_eq!(gap(9), ms(20_000));
        assert!(gap(10) >= ms(100) && gap(10) < ms(150), "{:?}", gap(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_forced_relist_in_a_row_waits_for_the_backoff() {
        let fake = Fake::default();
        fake.list(Ok(listed("10", vec![], None)))
            .watch_fails(kube::Error::Api(gone().boxed()))
            .list(Ok(listed("11", vec![], None)))
            .watch_fails(kube::Error::Api(gone().boxed()))
            .list(Ok(listed("12", vec![], None)))
            .watch(vec![], true);
        let mut r = reflector(&fake, settings(800, 30_000, 120_000));
        assert_eq!(
            events(&mut r, 6).await,
            ["init", "done", "init", "done", "init", "done"]
        );
        drain(&mut r).await;
        let calls = fake.calls();
        assert_eq!(calls[2].0 - calls[1].0, Duration::ZERO);
        assert!(calls[4].0 - calls[3].0 >= Duration::from_millis(800));
    }

    #[test]
    fn errors_and_delays_read_as_one_line() {
        assert_eq!(format_delay(Duration::from_millis(800)), "800ms");
        assert_eq!(format_delay(Duration::from_millis(1600)), "1.6s");
        assert_eq!(format_delay(Duration::from_millis(4020)), "4s");
        assert_eq!(format_delay(Duration::from_secs(30)), "30s");
        assert_eq!(
            retry_line(
                "https://10.0.0.1:6443/",
                "watching",
                ObjectKind::Service,
                &describe(&unavailable()),
                Duration::from_secs(4)
            ),
            "cannot reach the API server https://10.0.0.1:6443: watching Services: \
             HTTP 503 ServiceUnavailable: down; retrying in 4s"
        );
        assert_eq!(
            retry_line(
                "",
                "listing",
                ObjectKind::Node,
                "x\ny",
                Duration::from_millis(800)
            ),
            "cannot reach the API server: listing Nodes: x\\ny; retrying in 800ms"
        );
        assert!(is_too_large(&too_large()));
        assert!(is_too_large(&status(
            504,
            "Timeout",
            "Too large resource version: 3, current: 2"
        )));
        assert!(!is_too_large(&status(504, "Timeout", "slow")));
        assert!(is_expired(&gone()));
    }
}
