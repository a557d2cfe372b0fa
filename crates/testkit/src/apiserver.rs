//! [`TestApiServer`]: a small in-process Kubernetes API server for testing API clients.
//!
//! It serves Services, EndpointSlices, Nodes and ServiceCIDRs over plain HTTP on
//! `127.0.0.1:<random port>`
//! and speaks enough of the real list/watch wire protocol for kube-rs's `watcher` (and so
//! for anything built like client-go's reflector):
//!
//! - **Paths**: `GET /api/v1/services`, `GET /apis/discovery.k8s.io/v1/endpointslices`,
//!   `GET /api/v1/nodes` and `GET /apis/networking.k8s.io/v1/servicecidrs` (all namespaces;
//!   the per-namespace paths of the namespaced kinds are served too), plus the discovery
//!   documents `/version`, `/api`, `/apis` and `/healthz`; and
//!   `events.k8s.io/v1` Events (`POST`, merge-`PATCH` and `GET` under
//!   `/apis/events.k8s.io/v1/namespaces/NS/events`), kept for [`TestApiServer::events`].
//!   Anything else is a 404 `Status`, and so is a kind the test stopped serving
//!   ([`TestApiServer::set_served`], an API server older than the kind).
//! - **List**: a `ServiceList` (etc.) with `metadata.resourceVersion`, items sorted by
//!   namespace/name and without `apiVersion`/`kind` (as the real server prints them).
//!   `labelSelector` and `fieldSelector` filter; `limit` and `continue` paginate, every page
//!   coming from the same snapshot (the continue token names the snapshot's resourceVersion;
//!   a token older than the last [`TestApiServer::expire_watches`] is answered `410 Gone`).
//!   `resourceVersion` on a list is read as the real server reads it: absent or empty is a
//!   quorum read (in the real server: from etcd), `0` is "any version" (from the watch cache),
//!   and `N` (`resourceVersionMatch=NotOlderThan`, the default) is "not older than N": when N
//!   is beyond the server's current resourceVersion the answer is the real server's
//!   `504` "Too large resource version" `Status` (reason `Timeout`, cause
//!   `ResourceVersionTooLarge`). Otherwise every list is served from the current state (the
//!   test server has one store; which reads would be quorum reads is in the request log, see
//!   [`ApiRequest::is_quorum_list`]).
//! - **Watch** (`watch=true` or `watch=1`): `200 OK` with a chunked body of JSON lines
//!   `{"type":"ADDED"|"MODIFIED"|"DELETED"|"BOOKMARK"|"ERROR","object":{...}}`.
//!   With `resourceVersion=N` it first replays every change after N, then streams live
//!   changes; with no `resourceVersion` or `0` it starts with an `ADDED` for every current
//!   object. As on the real server, the selectors apply to each change: an object that stops
//!   matching is sent as `DELETED` (its previous version, at the new resourceVersion), one
//!   that starts matching as `ADDED`. `allowWatchBookmarks=true` enables `BOOKMARK` events
//!   (sent by [`TestApiServer::bookmark`]); `timeoutSeconds` ends the stream cleanly after
//!   that long. A watch from a resourceVersion older than the last
//!   [`TestApiServer::expire_watches`] gets `200 OK` and one `ERROR` event with a `Status`
//!   of code 410 (`reason: Expired`), exactly like the real server's watch cache, and then
//!   the stream ends. A watch from a resourceVersion beyond the current one (after
//!   [`TestApiServer::restore`] took the server back in time, as an etcd restored from a
//!   backup does) gets `200 OK` and one `ERROR` event with the `504` "Too large resource
//!   version" `Status`, as the real server's watch cache answers, and then the stream ends.
//! - **resourceVersion**: one counter for all kinds, incremented by every change; each
//!   stored object carries it in `metadata.resourceVersion` (and gets a `metadata.uid`).
//! - **Selectors**: label requirements `key`, `!key`, `key=value`, `key==value`,
//!   `key!=value`, `key in (a,b)`, `key notin (a,b)`, comma-separated; field requirements
//!   `metadata.name` and `metadata.namespace` with `=`, `==` or `!=`. Anything else is a
//!   `400 Bad Request` `Status`, as the real server answers.
//!
//! Beyond list/watch (module `objects`): discovery of every served group, and `GET`, `POST`
//! (with `dryRun=All`), merge-patch `PATCH` and `DELETE` of single objects of those four
//! kinds and of ConfigMaps, ServiceAccounts, Namespaces, DaemonSets, Jobs, ClusterRoles and
//! ClusterRoleBindings, decoded strictly as the real server does with
//! `fieldValidation=Strict` (an unknown field is a `400` naming it): enough for
//! `kubectl apply --validate=false`, `get`, `label` and `patch --type merge`
//! ([`objects::RESOURCES`]).
//!
//! [`TestApiServer::start_on`] serves the same objects on listeners the caller bound, each in
//! the network namespace it was bound in (the root namespace's loopback for `kubectl`, a node
//! network for the nodes); [`TestApiServer::apply_value`] loads objects of any served kind, as
//! a `kubectl create` would store them.
//!
//! [`TestApiServer::start_with`] adds what a real cluster's clients meet
//! ([`ApiServerOptions`]): HTTPS with a certificate signed by a test CA ([`TestCerts`]), and
//! a bearer token every request but `/version`, `/healthz`, `/readyz` and `/livez` must
//! carry (`401 Unauthorized` otherwise, as the real server answers a missing or wrong
//! service-account token).
//!
//! The test controls what happens: [`TestApiServer::upsert`] / [`TestApiServer::delete`]
//! change objects, [`TestApiServer::drop_connections`] breaks every open watch mid-stream
//! (the chunked body is cut without its terminating chunk),
//! [`TestApiServer::reset_connections`] breaks them with a TCP reset,
//! [`TestApiServer::expire_watches`] makes every watch older than now relist,
//! [`TestApiServer::end_watches`] ends every open watch cleanly (as the real server does
//! after `timeoutSeconds`), [`TestApiServer::backup`] and [`TestApiServer::restore`] take the
//! whole store (objects and resourceVersion) back to an earlier state, as restoring etcd from
//! a backup does, [`TestApiServer::set_unavailable`] answers everything `503` (and breaks
//! open watches), and [`TestApiServer::requests`] is the request log: what the client asked
//! for, with every query parameter.
//! [`TestApiServer::hold_lists`] keeps list requests waiting (a slow first list).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use k8s_openapi::api::core::v1::Service;
//! use kp_testkit::apiserver::{ApiKind, TestApiServer};
//!
//! let server = TestApiServer::start().await?;
//! let client = server.client()?;
//! let mut svc = Service::default();
//! svc.metadata.name = Some("web".into());
//! svc.metadata.namespace = Some("default".into());
//! server.upsert(&svc)?;
//! let api: kube::Api<Service> = kube::Api::all(client);
//! # let _ = api;
//! server.delete(ApiKind::Service, "default", "web");
//! # Ok(())
//! # }
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

mod objects;
mod tls;

pub use objects::{RESOURCES, Resource};
pub use tls::TestCerts;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinHandle;

/// What can go wrong while starting the server or storing an object.
#[derive(Debug, thiserror::Error)]
pub enum ApiServerError {
    /// The listener could not be bound or read.
    #[error("test API server: {0}")]
    Io(#[from] std::io::Error),
    /// The object could not be serialized to JSON.
    #[error("test API server: cannot serialize object: {0}")]
    Json(#[from] serde_json::Error),
    /// The object is not a JSON object, or lacks `metadata.name`.
    #[error("test API server: {0}")]
    BadObject(String),
    /// The object's `kind` is not one the server stores.
    #[error(
        "test API server: unsupported kind {0:?} (Service, EndpointSlice, Node or ServiceCIDR)"
    )]
    UnknownKind(String),
    /// The server URL is not a valid URI (cannot happen for a bound loopback address).
    #[error("test API server: bad URL: {0}")]
    Url(String),
    /// The kube client could not be built.
    #[error("test API server: cannot build client: {0}")]
    Client(#[from] kube::Error),
    /// The TLS certificates could not be made or loaded.
    #[error("test API server: TLS: {0}")]
    Tls(String),
}

/// How [`TestApiServer::start_with`] serves.
#[derive(Debug, Clone, Default)]
pub struct ApiServerOptions {
    /// Serve HTTPS with these certificates ([`TestCerts::generate`]); plain HTTP when `None`.
    pub tls: Option<TestCerts>,
    /// Require `Authorization: Bearer <token>` on every request but `/version`, `/healthz`,
    /// `/readyz` and `/livez` (`401 Unauthorized` otherwise).
    pub bearer_token: Option<String>,
}

/// A kind of object the server stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ApiKind {
    /// `v1` `Service` (namespaced), at `/api/v1/services`.
    Service,
    /// `discovery.k8s.io/v1` `EndpointSlice` (namespaced), at
    /// `/apis/discovery.k8s.io/v1/endpointslices`.
    EndpointSlice,
    /// `v1` `Node` (cluster-scoped), at `/api/v1/nodes`.
    Node,
    /// `networking.k8s.io/v1` `ServiceCIDR` (cluster-scoped), at
    /// `/apis/networking.k8s.io/v1/servicecidrs`.
    ServiceCidr,
}

impl ApiKind {
    /// Every kind.
    pub const ALL: [ApiKind; 4] = [
        ApiKind::Service,
        ApiKind::EndpointSlice,
        ApiKind::Node,
        ApiKind::ServiceCidr,
    ];

    /// The `kind` field.
    pub fn kind(self) -> &'static str {
        match self {
            ApiKind::Service => "Service",
            ApiKind::EndpointSlice => "EndpointSlice",
            ApiKind::Node => "Node",
            ApiKind::ServiceCidr => "ServiceCIDR",
        }
    }

    /// The `apiVersion` field.
    pub fn api_version(self) -> &'static str {
        match self {
            ApiKind::Service | ApiKind::Node => "v1",
            ApiKind::EndpointSlice => "discovery.k8s.io/v1",
            ApiKind::ServiceCidr => "networking.k8s.io/v1",
        }
    }

    /// Whether objects of this kind live in a namespace.
    pub fn namespaced(self) -> bool {
        !matches!(self, ApiKind::Node | ApiKind::ServiceCidr)
    }

    fn from_kind(kind: &str) -> Option<ApiKind> {
        ApiKind::ALL.into_iter().find(|k| k.kind() == kind)
    }

    /// The kind a request path lists, and the namespace it is limited to.
    fn from_path(path: &str) -> Option<(ApiKind, Option<String>)> {
        let path = path.trim_end_matches('/');
        let (prefix, rest) = if let Some(rest) = path.strip_prefix("/api/v1/") {
            ("core", rest)
        } else if let Some(rest) = path.strip_prefix("/apis/discovery.k8s.io/v1/") {
            ("discovery", rest)
        } else if let Some(rest) = path.strip_prefix("/apis/networking.k8s.io/v1/") {
            ("networking", rest)
        } else {
            return None;
        };
        let (namespace, resource) = match rest.strip_prefix("namespaces/") {
            Some(rest) => match rest.split_once('/') {
                Some((ns, resource)) => (Some(ns.to_string()), resource),
                None => return None,
            },
            None => (None, rest),
        };
        let kind = match (prefix, resource) {
            ("core", "services") => ApiKind::Service,
            ("core", "nodes") if namespace.is_none() => ApiKind::Node,
            ("discovery", "endpointslices") => ApiKind::EndpointSlice,
            ("networking", "servicecidrs") if namespace.is_none() => ApiKind::ServiceCidr,
            _ => return None,
        };
        Some((kind, namespace))
    }
}

impl fmt::Display for ApiKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind())
    }
}

/// One request the server received (for assertions: how many lists, from which
/// resourceVersion a watch resumed, whether a list was a quorum read, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiRequest {
    /// The HTTP method (`GET`, `POST`, `PATCH`, ...).
    pub method: String,
    /// The kind listed or watched; `None` for other paths.
    pub kind: Option<ApiKind>,
    /// Whether it was a watch (`watch=true`).
    pub watch: bool,
    /// The `resourceVersion` parameter, when given.
    pub resource_version: Option<String>,
    /// Every query parameter, decoded (`resourceVersion`, `resourceVersionMatch`, `limit`,
    /// `continue`, `sendInitialEvents`, `timeoutSeconds`, the selectors, ...).
    pub query: BTreeMap<String, String>,
    /// The path and query as received.
    pub uri: String,
}

impl ApiRequest {
    /// A query parameter, when given.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query.get(name).map(String::as_str)
    }

    /// Whether this is the first page of a list that a real API server answers with a
    /// quorum read from etcd: a list (not a watch) of a stored kind with no
    /// `resourceVersion` (or an empty one) and no `continue` token. Lists with
    /// `resourceVersion=0` (any version) or `resourceVersion=N` (not older than N) are served
    /// from the watch cache; `resourceVersionMatch=Exact` lists are not counted either. The
    /// continuation pages of a list are not counted (they belong to the list that started
    /// them).
    pub fn is_quorum_list(&self) -> bool {
        self.kind.is_some()
            && !self.watch
            && self.param("continue").is_none_or(str::is_empty)
            && self.resource_version.as_deref().is_none_or(str::is_empty)
    }
}

/// A copy of the server's whole state (objects, history and resourceVersion), taken by
/// [`TestApiServer::backup`] and put back by [`TestApiServer::restore`].
#[derive(Debug, Clone)]
pub struct Backup {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    history: Vec<Arc<Change>>,
    compacted: u64,
}

impl Backup {
    /// The resourceVersion the backup was taken at.
    pub fn resource_version(&self) -> u64 {
        self.rv
    }
}

/// The test API server; see the module documentation. Dropping it stops accepting
/// connections and breaks every open watch.
pub struct TestApiServer {
    addrs: Vec<SocketAddr>,
    https: bool,
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
}

/// Identity of a stored object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    kind: ApiKind,
    namespace: String,
    name: String,
}

/// One change, as kept in the history: the object before and after (`None` when absent).
#[derive(Debug)]
struct Change {
    rv: u64,
    kind: ApiKind,
    old: Option<Value>,
    new: Option<Value>,
}

/// What open watches are told.
#[derive(Debug, Clone)]
enum Msg {
    Change(Arc<Change>),
    /// Cut every open watch mid-stream.
    Drop,
    /// Send `ERROR` 410 and end every open watch.
    Expire,
    /// End every open watch cleanly (the terminating chunk is sent).
    End,
    /// Send a `BOOKMARK` at this resourceVersion.
    Bookmark(u64),
}

#[derive(Default)]
struct Store {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    /// `events.k8s.io/v1` Events posted, by namespace/name, in the order created.
    events: Vec<((String, String), Value)>,
    history: Vec<Arc<Change>>,
    /// Watches (and continue tokens) from a resourceVersion below this are expired.
    compacted: u64,
    unavailable: bool,
    /// Kinds answered `404` (see [`TestApiServer::set_served`]).
    unserved: BTreeSet<ApiKind>,
    requests: Vec<ApiRequest>,
    /// The objects of the kinds nobody watches (ConfigMaps, DaemonSets, ...).
    others: objects::Objects,
}

struct Shared {
    store: Mutex<Store>,
    events: broadcast::Sender<Msg>,
    open_watches: [AtomicUsize; 4],
    /// Bumped by [`TestApiServer::reset_connections`]: a connection accepted before closes
    /// with a reset.
    reset_generation: Arc<AtomicU64>,
    /// The bearer token requests must carry, if any.
    token: Option<String>,
    /// While `true`, list requests wait ([`TestApiServer::hold_lists`]).
    lists_held: tokio::sync::watch::Sender<bool>,
}

/// The server's listener: its connections close with a TCP reset after
/// [`TestApiServer::reset_connections`].
struct ResettingListener {
    inner: tokio::net::TcpListener,
    generation: Arc<AtomicU64>,
}

impl axum::serve::Listener for ResettingListener {
    type Io = ResettingStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (ResettingStream, SocketAddr) {
        loop {
            match self.inner.accept().await {
                Ok((stream, addr)) => {
                    let stream = ResettingStream {
                        inner: stream,
                        born: self.generation.load(Ordering::SeqCst),
                        generation: self.generation.clone(),
                    };
                    return (stream, addr);
                }
                // Out of file descriptors and the like: try again shortly, as axum does.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// A connection that, when closed after a reset was asked for, sends a TCP reset (`SO_LINGER`
/// 0) instead of an orderly close: the client reads `ECONNRESET`.
struct ResettingStream {
    inner: tokio::net::TcpStream,
    born: u64,
    generation: Arc<AtomicU64>,
}

impl Drop for ResettingStream {
    fn drop(&mut self) {
        if self.generation.load(Ordering::SeqCst) != self.born {
            // Linger 0: the close sends a reset at once (tokio deprecates set_linger for
            // the blocking close of a non-zero linger, which this is not).
            #[allow(deprecated)]
            let _ = self.inner.set_linger(Some(Duration::ZERO));
        }
    }
}

impl tokio::io::AsyncRead for ResettingStream {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for ResettingStream {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn open(&self, kind: ApiKind) -> &AtomicUsize {
        &self.open_watches[kind as usize]
    }

    /// [`TestApiServer::upsert_value`].
    fn upsert(&self, mut object: Value) -> Result<u64, ApiServerError> {
        let map = object
            .as_object_mut()
            .ok_or_else(|| ApiServerError::BadObject("the object is not a JSON object".into()))?;
        let kind_text = map.get("kind").and_then(Value::as_str).unwrap_or("");
        let kind = ApiKind::from_kind(kind_text)
            .ok_or_else(|| ApiServerError::UnknownKind(kind_text.to_string()))?;
        map.insert("apiVersion".into(), kind.api_version().into());
        let meta = map
            .entry("metadata")
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .ok_or_else(|| ApiServerError::BadObject("metadata is not an object".into()))?;
        let name = meta
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| ApiServerError::BadObject("metadata.name is missing".into()))?
            .to_string();
        let namespace = if kind.namespaced() {
            let ns = meta
                .get("namespace")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .unwrap_or("default")
                .to_string();
            meta.insert("namespace".into(), ns.clone().into());
            ns
        } else {
            meta.remove("namespace");
            String::new()
        };
        let key = Key {
            kind,
            namespace,
            name,
        };

        let mut store = self.lock();
        store.rv += 1;
        let rv = store.rv;
        let old = store.objects.get(&key).cloned();
        let uid = old
            .as_ref()
            .and_then(|o| o.pointer("/metadata/uid"))
            .and_then(Value::as_str)
            .map_or_else(|| format!("uid-{rv}"), str::to_string);
        meta.insert("resourceVersion".into(), rv.to_string().into());
        meta.insert("uid".into(), uid.into());
        store.objects.insert(key, object.clone());
        self.record(&mut store, kind, old, Some(object));
        Ok(rv)
    }

    /// [`TestApiServer::delete`].
    fn delete(&self, kind: ApiKind, namespace: &str, name: &str) -> Option<u64> {
        let key = Key {
            kind,
            namespace: if kind.namespaced() {
                namespace.to_string()
            } else {
                String::new()
            },
            name: name.to_string(),
        };
        let mut store = self.lock();
        let old = store.objects.remove(&key)?;
        store.rv += 1;
        let rv = store.rv;
        self.record(&mut store, kind, Some(old), None);
        Some(rv)
    }

    /// Appends a change to the history and tells open watches (under the lock, so the
    /// order of messages is the order of changes).
    fn record(&self, store: &mut Store, kind: ApiKind, old: Option<Value>, new: Option<Value>) {
        let change = Arc::new(Change {
            rv: store.rv,
            kind,
            old,
            new,
        });
        store.history.push(change.clone());
        let _ = self.events.send(Msg::Change(change));
    }
}

impl TestApiServer {
    /// Starts the server on `127.0.0.1:0`, empty, at resourceVersion 1, plain HTTP without
    /// authentication.
    ///
    /// # Errors
    /// [`ApiServerError::Io`] when the listener cannot be bound.
    pub async fn start() -> Result<TestApiServer, ApiServerError> {
        TestApiServer::start_with(ApiServerOptions::default()).await
    }

    /// Starts the server on `127.0.0.1:0` as `options` say (HTTPS, a bearer token).
    ///
    /// # Errors
    /// [`ApiServerError::Io`] when the listener cannot be bound, [`ApiServerError::Tls`]
    /// when the certificates cannot be loaded.
    pub async fn start_with(options: ApiServerOptions) -> Result<TestApiServer, ApiServerError> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        TestApiServer::start_on(vec![listener], options).await
    }

    /// Starts the server on bound `listeners` (at least one), serving the same objects on
    /// each, as `options` say. A listener serves in the network namespace it was bound in
    /// (bind it from a thread inside a [`crate::Netns`]), so one server can answer in the
    /// root namespace's loopback and on a node network. [`TestApiServer::url`] names the
    /// first.
    ///
    /// # Errors
    /// [`ApiServerError::Io`] when a listener cannot be used (or none is given),
    /// [`ApiServerError::Tls`] when the certificates cannot be loaded.
    pub async fn start_on(
        listeners: Vec<std::net::TcpListener>,
        options: ApiServerOptions,
    ) -> Result<TestApiServer, ApiServerError> {
        if listeners.is_empty() {
            return Err(ApiServerError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "no listener to serve on",
            )));
        }
        let acceptor = options.tls.as_ref().map(TestCerts::acceptor).transpose()?;
        let (events, _) = broadcast::channel(4096);
        let shared = Arc::new(Shared {
            store: Mutex::new(Store {
                rv: 1,
                ..Store::default()
            }),
            events,
            open_watches: Default::default(),
            reset_generation: Arc::default(),
            token: options.bearer_token,
            lists_held: tokio::sync::watch::Sender::new(false),
        });
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let https = acceptor.is_some();
        let mut addrs = Vec::new();
        let mut tasks = Vec::new();
        for listener in listeners {
            listener.set_nonblocking(true)?;
            let listener = tokio::net::TcpListener::from_std(listener)?;
            addrs.push(listener.local_addr()?);
            let app = app.clone();
            tasks.push(match &acceptor {
                // TLS connections close as tokio-rustls closes them (no reset_connections).
                Some(acceptor) => tokio::spawn(tls::serve(listener, acceptor.clone(), app)),
                None => {
                    let listener = ResettingListener {
                        inner: listener,
                        generation: shared.reset_generation.clone(),
                    };
                    tokio::spawn(async move {
                        if let Err(e) = axum::serve(listener, app).await {
                            tracing::warn!(error = %e, "test API server stopped");
                        }
                    })
                }
            });
        }
        Ok(TestApiServer {
            addrs,
            https,
            shared,
            tasks,
        })
    }

    /// The base URL, `http://127.0.0.1:PORT` (`https://` when serving TLS), of the first
    /// listener.
    pub fn url(&self) -> String {
        self.url_of(self.addrs[0])
    }

    /// The base URL of the server at `addr` (one of [`TestApiServer::addrs`]).
    pub fn url_of(&self, addr: SocketAddr) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{addr}")
    }

    /// The address the server listens on (the first listener's).
    pub fn addr(&self) -> SocketAddr {
        self.addrs[0]
    }

    /// Every address the server listens on, in the order of the listeners given.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// A kube client for this server (`kube::Config::new(url)`: plain HTTP, no auth), with
    /// kube's retry of `503` responses turned off as `kp_source::api::client` does (with it,
    /// [`TestApiServer::set_unavailable`] would hold each request for minutes).
    ///
    /// # Errors
    /// [`ApiServerError::Client`] when kube cannot build the client.
    pub fn client(&self) -> Result<kube::Client, ApiServerError> {
        let uri = self
            .url()
            .parse()
            .map_err(|e: axum::http::uri::InvalidUri| ApiServerError::Url(e.to_string()))?;
        let mut config = kube::Config::new(uri);
        config.default_retry = false;
        Ok(kube::Client::try_from(config)?)
    }

    /// Adds or replaces an object (a k8s-openapi `Service`, `EndpointSlice`, `Node` or
    /// `ServiceCIDR`). Returns its new resourceVersion. See [`TestApiServer::upsert_value`].
    ///
    /// # Errors
    /// See [`TestApiServer::upsert_value`].
    pub fn upsert<K>(&self, object: &K) -> Result<u64, ApiServerError>
    where
        K: k8s_openapi::Resource + Serialize,
    {
        let mut value = serde_json::to_value(object)?;
        if let Some(map) = value.as_object_mut() {
            map.insert("apiVersion".into(), K::API_VERSION.into());
            map.insert("kind".into(), K::KIND.into());
        }
        self.upsert_value(value)
    }

    /// Adds or replaces an object given as JSON (which lets a test store what k8s-openapi
    /// could not build). `kind` chooses the collection; `apiVersion` is set from it; a
    /// namespaced object without `metadata.namespace` goes to `default`. The server sets
    /// `metadata.resourceVersion` (a new one), and `metadata.uid` (kept across updates).
    /// Open watches see `ADDED` or `MODIFIED`. Returns the new resourceVersion.
    ///
    /// # Errors
    /// [`ApiServerError::BadObject`] when `object` is not a JSON object or has no
    /// `metadata.name`; [`ApiServerError::UnknownKind`] for another kind.
    pub fn upsert_value(&self, object: Value) -> Result<u64, ApiServerError> {
        self.shared.upsert(object)
    }

    /// Stores an object of any kind the server serves ([`RESOURCES`]: ConfigMaps,
    /// DaemonSets, ServiceAccounts, ... as well as the watched kinds), found by its
    /// `apiVersion` and `kind`, after the strict validation a `kubectl create` meets; a
    /// namespaced object without `metadata.namespace` goes to `default`. An existing object
    /// of that name is replaced. This is how a test (or the `test-cluster` tool) loads what a
    /// cluster already holds before the commands under test run.
    ///
    /// # Errors
    /// [`ApiServerError::BadObject`] with the server's message: an unknown kind, no name, a
    /// field the kind does not have (naming it).
    pub fn apply_value(&self, object: Value) -> Result<(), ApiServerError> {
        objects::apply(&self.shared, object).map_err(ApiServerError::BadObject)
    }

    /// Deletes an object (`namespace` is ignored for the cluster-scoped Nodes and
    /// ServiceCIDRs). Open watches see `DELETED` with the last version of the object at the
    /// new resourceVersion. Returns the new resourceVersion, or `None` when there was no such
    /// object.
    pub fn delete(&self, kind: ApiKind, namespace: &str, name: &str) -> Option<u64> {
        self.shared.delete(kind, namespace, name)
    }

    /// Cuts every open watch mid-stream: the connection is closed without the chunked
    /// body's terminating chunk, as when a load balancer or the network drops it. The
    /// client is expected to watch again from the last resourceVersion it saw.
    pub fn drop_connections(&self) {
        let _store = self.shared.lock();
        let _ = self.shared.events.send(Msg::Drop);
    }

    /// Expires every resourceVersion up to now (as an etcd compaction would): the
    /// resourceVersion is bumped, every open watch gets an `ERROR` event with code 410 and
    /// ends, and any later watch from an older resourceVersion gets the same. The client is
    /// expected to list again.
    pub fn expire_watches(&self) {
        let mut store = self.shared.lock();
        store.rv += 1;
        store.compacted = store.rv;
        let _ = self.shared.events.send(Msg::Expire);
    }

    /// Sends a `BOOKMARK` at the current resourceVersion on every open watch that asked
    /// for bookmarks.
    pub fn bookmark(&self) {
        let store = self.shared.lock();
        let _ = self.shared.events.send(Msg::Bookmark(store.rv));
    }

    /// Resets every open watch's connection: the server closes it with a TCP reset, as a
    /// load balancer or a restarting node does, and the client reads `ECONNRESET` (an error,
    /// where [`TestApiServer::drop_connections`] gives an early end of stream). The client is
    /// expected to watch again from the last resourceVersion it saw.
    pub fn reset_connections(&self) {
        let _store = self.shared.lock();
        self.shared.reset_generation.fetch_add(1, Ordering::SeqCst);
        let _ = self.shared.events.send(Msg::Drop);
    }

    /// Ends every open watch cleanly, as the real server does when a watch's
    /// `timeoutSeconds` is up: the chunked body is terminated, nothing is cut. The client is
    /// expected to watch again from the last resourceVersion it saw, at once.
    pub fn end_watches(&self) {
        let _store = self.shared.lock();
        let _ = self.shared.events.send(Msg::End);
    }

    /// A copy of the whole store now, for [`TestApiServer::restore`].
    pub fn backup(&self) -> Backup {
        let store = self.shared.lock();
        Backup {
            rv: store.rv,
            objects: store.objects.clone(),
            history: store.history.clone(),
            compacted: store.compacted,
        }
    }

    /// Takes the server back to `backup`, as restoring etcd from a backup does: the objects,
    /// the history and the resourceVersion are the backup's, so the resourceVersion goes
    /// backwards, and every open watch is cut (the API servers are restarted after a
    /// restore). A client resuming from a resourceVersion it saw after the backup then gets
    /// the real server's "Too large resource version" answers (see the module
    /// documentation) until it lists again without a resourceVersion (a quorum read).
    pub fn restore(&self, backup: &Backup) {
        let mut store = self.shared.lock();
        store.rv = backup.rv;
        store.objects = backup.objects.clone();
        store.history = backup.history.clone();
        store.compacted = backup.compacted;
        let _ = self.shared.events.send(Msg::Drop);
    }

    /// While `true`, every request is answered `503 Service Unavailable` (a `Status`), and
    /// turning it on cuts every open watch.
    pub fn set_unavailable(&self, unavailable: bool) {
        let mut store = self.shared.lock();
        store.unavailable = unavailable;
        if unavailable {
            let _ = self.shared.events.send(Msg::Drop);
        }
    }

    /// While `true`, every list request (of the four watched kinds) is received, counted in
    /// [`TestApiServer::requests`], and left waiting for its answer until this is set back to
    /// `false`: a first list that takes as long as the test wants.
    pub fn hold_lists(&self, held: bool) {
        self.shared.lists_held.send_replace(held);
    }

    /// Whether `kind` is served (the default). An unserved kind's paths are answered `404
    /// Not Found`, as an API server older than the kind answers (ServiceCIDRs are served
    /// from Kubernetes 1.33); turning it off cuts every open watch.
    pub fn set_served(&self, kind: ApiKind, served: bool) {
        let mut store = self.shared.lock();
        if served {
            store.unserved.remove(&kind);
        } else {
            store.unserved.insert(kind);
            let _ = self.shared.events.send(Msg::Drop);
        }
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().rv
    }

    /// Every request received so far, oldest first.
    pub fn requests(&self) -> Vec<ApiRequest> {
        self.shared.lock().requests.clone()
    }

    /// The `events.k8s.io/v1` Events posted so far (as stored: `metadata.namespace`,
    /// `resourceVersion` and `uid` set by the server, merge patches applied), oldest first.
    pub fn events(&self) -> Vec<Value> {
        self.shared
            .lock()
            .events
            .iter()
            .map(|(_, e)| e.clone())
            .collect()
    }

    /// How many list (not watch) requests of `kind` were received so far.
    pub fn list_count(&self, kind: ApiKind) -> usize {
        self.shared
            .lock()
            .requests
            .iter()
            .filter(|r| r.kind == Some(kind) && !r.watch)
            .count()
    }

    /// How many watches of `kind` are open now.
    pub fn open_watches(&self, kind: ApiKind) -> usize {
        self.shared.open(kind).load(Ordering::SeqCst)
    }

    /// Waits (up to `timeout`) until at least `n` watches of every kind in `kinds` are
    /// open; returns whether they are.
    pub async fn wait_for_watches(&self, kinds: &[ApiKind], n: usize, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if kinds.iter().all(|k| self.open_watches(*k) >= n) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        let _ = self.shared.events.send(Msg::Drop);
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// `t` as RFC 3339 in UTC, to the second (`2026-12-06T05:41:36Z`), as the API server
/// writes timestamps (`metadata.creationTimestamp` of what it stores).
pub fn rfc3339(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's days-to-civil, for days since 1970-01-01.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// A `Status` response.
fn status(code: StatusCode, reason: &str, message: &str) -> Response {
    let body = status_json(code.as_u16(), reason, message);
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn status_json(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

/// The real API server's answer to a request for a resourceVersion beyond its current one
/// (`k8s.io/apiserver`'s `NewTooLargeResourceVersionError`: a `504` `Timeout` with the cause
/// `ResourceVersionTooLarge`, retry after 1 s).
fn too_large_json(requested: u64, current: u64) -> Value {
    let mut status = status_json(
        504,
        "Timeout",
        &format!("Timeout: Too large resource version: {requested}, current: {current}"),
    );
    status["details"] = json!({
        "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
        "retryAfterSeconds": 1,
    });
    status
}

fn json_response(value: &Value) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    let params: BTreeMap<String, String> =
        query.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let target = ApiKind::from_path(&path);
    let watch = matches!(
        query.get("watch").map(String::as_str),
        Some("true" | "1" | "True")
    );
    let resource_version = query.get("resourceVersion").cloned();
    {
        let mut store = shared.lock();
        store.requests.push(ApiRequest {
            method: method.to_string(),
            kind: target.as_ref().map(|(k, _)| *k),
            watch,
            resource_version: resource_version.clone(),
            query: params,
            uri: uri.to_string(),
        });
        if store.unavailable {
            return status(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                "the test API server is unavailable",
            );
        }
        if let Some((kind, _)) = &target
            && store.unserved.contains(kind)
        {
            return status(
                StatusCode::NOT_FOUND,
                "NotFound",
                &format!("the server could not find the requested resource ({path})"),
            );
        }
    }
    if let Some(token) = &shared.token {
        let public = matches!(
            path.trim_end_matches('/'),
            "/version" | "/healthz" | "/readyz" | "/livez"
        );
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !public && bearer != Some(token.as_str()) {
            return status(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized");
        }
    }
    if let Some((namespace, name)) = events_path(&path) {
        return events(&shared, &method, namespace, name, &body);
    }
    // Lists and watches of the watched kinds here; everything else (discovery, single
    // objects, the other kinds, writes) in `objects`.
    let (kind, namespace) = match target {
        Some(t) if method == Method::GET => t,
        _ => return objects::handle(&shared, &method, &path, &query, &headers, &body),
    };
    if !watch {
        let mut held = shared.lists_held.subscribe();
        let _ = held.wait_for(|held| !held).await;
    }
    let selector = match Selector::parse(&query, namespace) {
        Ok(s) => s,
        Err(message) => return status(StatusCode::BAD_REQUEST, "BadRequest", &message),
    };
    if watch {
        start_watch(&shared, kind, selector, &query, resource_version)
    } else {
        list(&shared, kind, &selector, &query)
    }
}

/// The namespace and (for one event) the name of an `events.k8s.io/v1` events path.
fn events_path(path: &str) -> Option<(String, Option<String>)> {
    let rest = path
        .trim_end_matches('/')
        .strip_prefix("/apis/events.k8s.io/v1/namespaces/")?;
    let (namespace, rest) = rest.split_once('/')?;
    let name = match rest.strip_prefix("events")? {
        "" => None,
        n => Some(n.strip_prefix('/')?.to_string()),
    };
    Some((namespace.to_string(), name))
}

/// `POST .../namespaces/NS/events` creates an Event (201, the object with `metadata.namespace`,
/// `resourceVersion` and `uid` set; 409 when the name exists); `PATCH .../events/NAME` merges
/// a JSON merge patch into it (200; 404 when absent); `GET` lists them. Events are kept
/// apart from the watched kinds: [`TestApiServer::events`] returns them.
fn events(
    shared: &Shared,
    method: &Method,
    namespace: String,
    name: Option<String>,
    body: &[u8],
) -> Response {
    let mut store = shared.lock();
    let parsed = || {
        serde_json::from_slice::<Value>(body)
            .ok()
            .filter(Value::is_object)
    };
    match (method.as_str(), name) {
        ("POST", None) => {
            let Some(mut event) = parsed() else {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    "the body is not a JSON object",
                );
            };
            let Some(name) = event
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .map(str::to_string)
            else {
                return status(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid",
                    "metadata.name: Required value",
                );
            };
            let key = (namespace.clone(), name.clone());
            if store.events.iter().any(|(k, _)| *k == key) {
                return status(
                    StatusCode::CONFLICT,
                    "AlreadyExists",
                    &format!("events.events.k8s.io \"{name}\" already exists"),
                );
            }
            store.rv += 1;
            let rv = store.rv;
            if let Some(meta) = event.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.insert("namespace".into(), namespace.into());
                meta.insert("resourceVersion".into(), rv.to_string().into());
                meta.insert("uid".into(), format!("uid-{rv}").into());
            }
            store.events.push((key, event.clone()));
            (
                StatusCode::CREATED,
                [(header::CONTENT_TYPE, "application/json")],
                event.to_string(),
            )
                .into_response()
        }
        ("PATCH", Some(name)) => {
            let Some(patch) = parsed() else {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    "the body is not a JSON object",
                );
            };
            let key = (namespace, name.clone());
            store.rv += 1;
            let rv = store.rv;
            let Some((_, event)) = store.events.iter_mut().find(|(k, _)| *k == key) else {
                return status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    &format!("events.events.k8s.io \"{name}\" not found"),
                );
            };
            merge_patch(event, patch);
            if let Some(meta) = event.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.insert("resourceVersion".into(), rv.to_string().into());
            }
            json_response(event)
        }
        ("GET", None) => {
            let items: Vec<Value> = store
                .events
                .iter()
                .filter(|((ns, _), _)| *ns == namespace)
                .map(|(_, e)| e.clone())
                .collect();
            json_response(&json!({
                "kind": "EventList",
                "apiVersion": "events.k8s.io/v1",
                "metadata": {"resourceVersion": store.rv.to_string()},
                "items": items,
            }))
        }
        _ => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "events: POST to the collection, PATCH one, or GET the list",
        ),
    }
}

/// RFC 7386 JSON merge patch.
fn merge_patch(target: &mut Value, patch: Value) {
    match patch {
        Value::Object(fields) => {
            if !target.is_object() {
                *target = json!({});
            }
            if let Some(map) = target.as_object_mut() {
                for (k, v) in fields {
                    if v.is_null() {
                        map.remove(&k);
                    } else {
                        merge_patch(map.entry(k).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other,
    }
}

/// The discovery documents kube-rs and kubectl may ask for.
fn discovery(path: &str) -> Response {
    match path.trim_end_matches('/') {
        "/version" => json_response(&json!({
            "major": "1",
            "minor": "35",
            "gitVersion": "v1.35.0-kp-testkit",
            "gitCommit": "",
            "gitTreeState": "clean",
            "buildDate": "2026-01-01T00:00:00Z",
            "goVersion": "go1.25",
            "compiler": "gc",
            "platform": "linux/amd64",
        })),
        "/api" => json_response(&json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [],
        })),
        "/apis" => json_response(&json!({
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [{
                "name": "discovery.k8s.io",
                "versions": [{"groupVersion": "discovery.k8s.io/v1", "version": "v1"}],
                "preferredVersion": {"groupVersion": "discovery.k8s.io/v1", "version": "v1"},
            }, {
                "name": "networking.k8s.io",
                "versions": [{"groupVersion": "networking.k8s.io/v1", "version": "v1"}],
                "preferredVersion": {"groupVersion": "networking.k8s.io/v1", "version": "v1"},
            }],
        })),
        "/healthz" | "/readyz" | "/livez" => (StatusCode::OK, "ok").into_response(),
        _ => status(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("the server could not find the requested resource ({path})"),
        ),
    }
}

/// Answers a list, one page of it when `limit` is given.
fn list(
    shared: &Shared,
    kind: ApiKind,
    selector: &Selector,
    query: &HashMap<String, String>,
) -> Response {
    let store = shared.lock();
    let (snapshot_rv, offset) = match query.get("continue").filter(|c| !c.is_empty()) {
        None => {
            // resourceVersion N (not older than N): the real server waits a little for its
            // cache to reach N, then answers "Too large resource version".
            let min = query
                .get("resourceVersion")
                .filter(|r| !r.is_empty() && r.as_str() != "0");
            if let Some(text) = min {
                let Ok(min) = text.parse::<u64>() else {
                    return status(
                        StatusCode::BAD_REQUEST,
                        "BadRequest",
                        &format!("invalid resourceVersion {text:?}"),
                    );
                };
                if min > store.rv {
                    let body = too_large_json(min, store.rv);
                    return (
                        StatusCode::GATEWAY_TIMEOUT,
                        [(header::CONTENT_TYPE, "application/json")],
                        body.to_string(),
                    )
                        .into_response();
                }
            }
            (store.rv, 0)
        }
        Some(token) => {
            let parsed = token
                .split_once(':')
                .and_then(|(rv, off)| Some((rv.parse::<u64>().ok()?, off.parse::<usize>().ok()?)));
            match parsed {
                Some((rv, _)) if rv < store.compacted => {
                    return status(
                        StatusCode::GONE,
                        "Expired",
                        "The provided continue parameter is too old to display a consistent \
                         list result. You can start a new list without the continue parameter.",
                    );
                }
                Some(p) => p,
                None => {
                    return status(
                        StatusCode::BAD_REQUEST,
                        "BadRequest",
                        &format!("invalid continue token {token:?}"),
                    );
                }
            }
        }
    };
    let objects: Vec<Value> = if snapshot_rv == store.rv {
        store
            .objects
            .iter()
            .filter(|(k, v)| k.kind == kind && selector.matches(v))
            .map(|(_, v)| v.clone())
            .collect()
    } else {
        // Rebuild the snapshot the first page was cut from.
        let mut at: BTreeMap<Key, Value> = BTreeMap::new();
        for change in store.history.iter().take_while(|c| c.rv <= snapshot_rv) {
            if change.kind != kind {
                continue;
            }
            let Some(key) = change
                .new
                .as_ref()
                .or(change.old.as_ref())
                .map(|v| key_of(kind, v))
            else {
                continue;
            };
            match &change.new {
                Some(v) => at.insert(key, v.clone()),
                None => at.remove(&key),
            };
        }
        at.into_values().filter(|v| selector.matches(v)).collect()
    };
    let limit = query
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let end = limit.map_or(objects.len(), |l| {
        offset.saturating_add(l).min(objects.len())
    });
    let items: Vec<Value> = objects
        .get(offset.min(objects.len())..end)
        .unwrap_or_default()
        .iter()
        .map(|o| {
            let mut item = o.clone();
            if let Some(map) = item.as_object_mut() {
                map.remove("apiVersion");
                map.remove("kind");
            }
            item
        })
        .collect();
    let mut metadata = json!({"resourceVersion": snapshot_rv.to_string()});
    if end < objects.len() {
        metadata["continue"] = format!("{snapshot_rv}:{end}").into();
        metadata["remainingItemCount"] = (objects.len() - end).into();
    }
    json_response(&json!({
        "kind": format!("{}List", kind.kind()),
        "apiVersion": kind.api_version(),
        "metadata": metadata,
        "items": items,
    }))
}

fn key_of(kind: ApiKind, object: &Value) -> Key {
    let text = |p: &str| {
        object
            .pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    Key {
        kind,
        namespace: text("/metadata/namespace"),
        name: text("/metadata/name"),
    }
}

/// One line of a watch stream.
fn event_line(kind: &str, object: &Value) -> String {
    let mut line = json!({"type": kind, "object": object}).to_string();
    line.push('\n');
    line
}

/// `object` with `metadata.resourceVersion` set to `rv`.
fn at_rv(object: &Value, rv: u64) -> Value {
    let mut o = object.clone();
    if let Some(meta) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), rv.to_string().into());
    }
    o
}

/// The watch event a change makes for a watcher with `selector`, if any.
fn change_line(change: &Change, selector: &Selector) -> Option<String> {
    let old = change.old.as_ref().filter(|o| selector.matches(o));
    let new = change.new.as_ref().filter(|o| selector.matches(o));
    match (old, new) {
        (Some(_), Some(new)) => Some(event_line("MODIFIED", new)),
        (None, Some(new)) => Some(event_line("ADDED", new)),
        (Some(old), None) => Some(event_line("DELETED", &at_rv(old, change.rv))),
        (None, None) => None,
    }
}

type Chunk = Result<String, std::io::Error>;

/// Starts a watch: subscribes under the lock, collects what is due before now, and streams
/// the rest from a task.
fn start_watch(
    shared: &Arc<Shared>,
    kind: ApiKind,
    selector: Selector,
    query: &HashMap<String, String>,
    resource_version: Option<String>,
) -> Response {
    let bookmarks = matches!(
        query.get("allowWatchBookmarks").map(String::as_str),
        Some("true" | "1" | "True")
    );
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|t| *t > 0)
        .map(Duration::from_secs);
    let mut first: Vec<String> = Vec::new();
    let mut expired = false;
    let (rx, from) = {
        let store = shared.lock();
        let rx = shared.events.subscribe();
        let from = match resource_version
            .as_deref()
            .filter(|r| !r.is_empty() && *r != "0")
        {
            None => {
                for (key, object) in &store.objects {
                    if key.kind == kind && selector.matches(object) {
                        first.push(event_line("ADDED", object));
                    }
                }
                store.rv
            }
            Some(text) => {
                let Ok(from) = text.parse::<u64>() else {
                    return status(
                        StatusCode::BAD_REQUEST,
                        "BadRequest",
                        &format!("invalid resourceVersion {text:?}"),
                    );
                };
                if from < store.compacted {
                    expired = true;
                    first.push(expired_line(from, store.compacted));
                } else if from > store.rv {
                    // As the real server's watch cache: a 200 stream with one ERROR event.
                    expired = true;
                    first.push(event_line("ERROR", &too_large_json(from, store.rv)));
                } else {
                    for change in store.history.iter().filter(|c| c.rv > from) {
                        if change.kind == kind
                            && let Some(line) = change_line(change, &selector)
                        {
                            first.push(line);
                        }
                    }
                }
                from.max(store.rv)
            }
        };
        (rx, from)
    };

    let (tx, out) = mpsc::channel::<Chunk>(64);
    let watch = Watch {
        shared: shared.clone(),
        kind,
        selector,
        bookmarks,
        tx,
    };
    tokio::spawn(watch.run(rx, first, expired, from, timeout));
    let stream = futures::stream::unfold(out, |mut out| async move {
        out.recv().await.map(|chunk| (chunk, out))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| {
            status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                "cannot build response",
            )
        })
}

fn expired_line(from: u64, compacted: u64) -> String {
    let status = status_json(
        410,
        "Expired",
        &format!("too old resource version: {from} ({compacted})"),
    );
    event_line("ERROR", &status)
}

/// An open watch: feeds its response body.
struct Watch {
    shared: Arc<Shared>,
    kind: ApiKind,
    selector: Selector,
    bookmarks: bool,
    tx: mpsc::Sender<Chunk>,
}

/// Counts an open watch for as long as it lives.
struct OpenGuard<'a>(&'a AtomicUsize);

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Watch {
    async fn run(
        self,
        mut rx: broadcast::Receiver<Msg>,
        first: Vec<String>,
        expired: bool,
        from: u64,
        timeout: Option<Duration>,
    ) {
        let counter = self.shared.open(self.kind);
        counter.fetch_add(1, Ordering::SeqCst);
        let _guard = OpenGuard(counter);
        for line in first {
            if self.tx.send(Ok(line)).await.is_err() {
                return;
            }
        }
        if expired {
            return;
        }
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let sleep_until = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending::<()>().await,
            }
        };
        tokio::pin!(sleep_until);
        loop {
            let msg = tokio::select! {
                () = &mut sleep_until => return,
                () = self.tx.closed() => return,
                msg = rx.recv() => msg,
            };
            let line = match msg {
                Ok(Msg::Change(change)) => {
                    if change.rv <= from || change.kind != self.kind {
                        continue;
                    }
                    match change_line(&change, &self.selector) {
                        Some(line) => line,
                        None => continue,
                    }
                }
                Ok(Msg::Bookmark(rv)) => {
                    if !self.bookmarks {
                        continue;
                    }
                    event_line(
                        "BOOKMARK",
                        &json!({
                            "kind": self.kind.kind(),
                            "apiVersion": self.kind.api_version(),
                            "metadata": {"resourceVersion": rv.to_string()},
                        }),
                    )
                }
                Ok(Msg::End) => return,
                Ok(Msg::Expire) => {
                    let compacted = self.shared.lock().compacted;
                    let _ = self.tx.send(Ok(expired_line(from, compacted))).await;
                    return;
                }
                // Cut the body: an error makes hyper close the connection mid-chunk.
                Ok(Msg::Drop) | Err(broadcast::error::RecvError::Lagged(_)) => {
                    let _ = self
                        .tx
                        .send(Err(std::io::Error::other("connection dropped")))
                        .await;
                    return;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            };
            if self.tx.send(Ok(line)).await.is_err() {
                return;
            }
        }
    }
}

/// A parsed `labelSelector` and `fieldSelector` (plus the namespace of a namespaced path).
#[derive(Debug, Clone, Default)]
struct Selector {
    labels: Vec<LabelRequirement>,
    fields: Vec<FieldRequirement>,
}

#[derive(Debug, Clone)]
enum LabelRequirement {
    Exists(String),
    NotExists(String),
    Equals(String, String),
    NotEquals(String, String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
}

#[derive(Debug, Clone)]
struct FieldRequirement {
    /// JSON pointer of the field.
    pointer: &'static str,
    value: String,
    equal: bool,
}

impl Selector {
    fn parse(query: &HashMap<String, String>, namespace: Option<String>) -> Result<Self, String> {
        let mut selector = Selector::default();
        if let Some(text) = query.get("labelSelector") {
            for part in split_requirements(text) {
                selector.labels.push(parse_label(&part)?);
            }
        }
        if let Some(text) = query.get("fieldSelector") {
            for part in split_requirements(text) {
                selector.fields.push(parse_field(&part)?);
            }
        }
        if let Some(ns) = namespace {
            selector.fields.push(FieldRequirement {
                pointer: "/metadata/namespace",
                value: ns,
                equal: true,
            });
        }
        Ok(selector)
    }

    fn matches(&self, object: &Value) -> bool {
        let labels = object
            .pointer("/metadata/labels")
            .and_then(Value::as_object);
        let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        let labels_ok = self.labels.iter().all(|r| match r {
            LabelRequirement::Exists(k) => label(k).is_some(),
            LabelRequirement::NotExists(k) => label(k).is_none(),
            LabelRequirement::Equals(k, v) => label(k) == Some(v.as_str()),
            LabelRequirement::NotEquals(k, v) => label(k) != Some(v.as_str()),
            LabelRequirement::In(k, set) => label(k).is_some_and(|v| set.contains(v)),
            LabelRequirement::NotIn(k, set) => label(k).is_none_or(|v| !set.contains(v)),
        });
        labels_ok
            && self.fields.iter().all(|f| {
                let value = object
                    .pointer(f.pointer)
                    .and_then(Value::as_str)
                    .unwrap_or("");
                (value == f.value) == f.equal
            })
    }
}

/// Splits a selector on the commas that are not inside parentheses; drops empty parts.
fn split_requirements(text: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut current = String::new();
    for c in text.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    parts.push(current);
    parts
        .into_iter()
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

fn valid_label_key(key: &str) -> Result<String, String> {
    let ok = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if ok {
        Ok(key.to_string())
    } else {
        Err(format!(
            "unable to parse requirement: invalid label key {key:?}"
        ))
    }
}

fn parse_label(part: &str) -> Result<LabelRequirement, String> {
    if let Some(key) = part.strip_prefix('!') {
        return Ok(LabelRequirement::NotExists(valid_label_key(key.trim())?));
    }
    if let Some((key, value)) = part.split_once("!=") {
        return Ok(LabelRequirement::NotEquals(
            valid_label_key(key.trim())?,
            value.trim().to_string(),
        ));
    }
    if let Some((key, value)) = part.split_once("==").or_else(|| part.split_once('=')) {
        return Ok(LabelRequirement::Equals(
            valid_label_key(key.trim())?,
            value.trim().to_string(),
        ));
    }
    for (op, notin) in [(" notin ", true), (" in ", false)] {
        if let Some((key, set)) = part.split_once(op) {
            let set = set
                .trim()
                .strip_prefix('(')
                .and_then(|s| s.strip_suffix(')'))
                .ok_or_else(|| format!("unable to parse requirement: {part:?}"))?;
            let values: BTreeSet<String> = set.split(',').map(|v| v.trim().to_string()).collect();
            let key = valid_label_key(key.trim())?;
            return Ok(if notin {
                LabelRequirement::NotIn(key, values)
            } else {
                LabelRequirement::In(key, values)
            });
        }
    }
    Ok(LabelRequirement::Exists(valid_label_key(part)?))
}

fn parse_field(part: &str) -> Result<FieldRequirement, String> {
    let (field, value, equal) = if let Some((f, v)) = part.split_once("!=") {
        (f, v, false)
    } else if let Some((f, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
        (f, v, true)
    } else {
        return Err(format!("invalid field selector: {part:?}"));
    };
    let pointer = match field.trim() {
        "metadata.name" => "/metadata/name",
        "metadata.namespace" => "/metadata/namespace",
        other => {
            return Err(format!("field label not supported: {other}"));
        }
    };
    Ok(FieldRequirement {
        pointer,
        value: value.trim().to_string(),
        equal,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339() {
        let at = |s: u64| rfc3339(std::time::UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(1_796_535_696), "2026-12-06T05:41:36Z");
    }

    fn q(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn label_selectors_match_like_the_api_server() {
        let obj = json!({"metadata": {"name": "a", "namespace": "ns",
            "labels": {"app": "web", "tier": "front"}}});
        let sel = |s: &str| Selector::parse(&q(&[("labelSelector", s)]), None).unwrap();
        assert!(sel("app").matches(&obj));
        assert!(!sel("!app").matches(&obj));
        assert!(
            sel("!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name")
                .matches(&obj)
        );
        assert!(sel("app=web,tier==front").matches(&obj));
        assert!(!sel("app!=web").matches(&obj));
        assert!(sel("app in (web, db),tier notin (back)").matches(&obj));
        assert!(!sel("app in (db)").matches(&obj));
        assert!(Selector::parse(&q(&[("labelSelector", "a b")]), None).is_err());
    }

    #[test]
    fn field_selectors_match_name_and_namespace() {
        let obj = json!({"metadata": {"name": "node-a"}});
        let sel = |s: &str| Selector::parse(&q(&[("fieldSelector", s)]), None).unwrap();
        assert!(sel("metadata.name=node-a").matches(&obj));
        assert!(!sel("metadata.name=node-b").matches(&obj));
        assert!(sel("metadata.name!=node-b").matches(&obj));
        assert!(Selector::parse(&q(&[("fieldSelector", "spec.x=1")]), None).is_err());
    }

    #[test]
    fn events_paths_and_merge_patches() {
        assert_eq!(
            events_path("/apis/events.k8s.io/v1/namespaces/default/events"),
            Some(("default".into(), None))
        );
        assert_eq!(
            events_path("/apis/events.k8s.io/v1/namespaces/default/events/n.1"),
            Some(("default".into(), Some("n.1".into())))
        );
        assert_eq!(events_path("/api/v1/namespaces/default/events"), None);
        let mut e = json!({"a": 1, "series": null, "m": {"x": 1, "y": 2}});
        merge_patch(
            &mut e,
            json!({"a": 2, "series": {"count": 2}, "m": {"y": null}}),
        );
        assert_eq!(e, json!({"a": 2, "series": {"count": 2}, "m": {"x": 1}}));
    }

    #[test]
    fn paths_name_kinds() {
        assert_eq!(
            ApiKind::from_path("/api/v1/services"),
            Some((ApiKind::Service, None))
        );
        assert_eq!(
            ApiKind::from_path("/apis/discovery.k8s.io/v1/namespaces/x/endpointslices"),
            Some((ApiKind::EndpointSlice, Some("x".into())))
        );
        assert_eq!(ApiKind::from_path("/api/v1/pods"), None);
        assert_eq!(
            ApiKind::from_path("/apis/networking.k8s.io/v1/servicecidrs"),
            Some((ApiKind::ServiceCidr, None))
        );
        assert_eq!(
            ApiKind::from_path("/apis/networking.k8s.io/v1/namespaces/x/servicecidrs"),
            None
        );
    }
}
