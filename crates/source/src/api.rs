//! The API-server source: Services, EndpointSlices, this node's Node and ServiceCIDRs, watched
//! like upstream kube-proxy's informers.
//!
//! [`ApiSource::run`] (or [`watch_api`]) runs four kube-rs
//! [`watcher`](kube::runtime::watcher())s, which do the list/watch protocol (initial list with
//! pagination, watch from the list's resourceVersion, bookmarks, a new watch when the stream
//! ends or breaks, a relist when the server answers `410 Gone`):
//!
//! | kind | request | selector (as upstream's informers) |
//! |---|---|---|
//! | Service | `GET /api/v1/services` | labels [`SERVICE_LABEL_SELECTOR`] |
//! | EndpointSlice | `GET /apis/discovery.k8s.io/v1/endpointslices` | labels [`SLICE_LABEL_SELECTOR`] |
//! | Node | `GET /api/v1/nodes` | fields `metadata.name=<node>` |
//! | ServiceCIDR | `GET /apis/networking.k8s.io/v1/servicecidrs` | none |
//!
//! ServiceCIDRs are watched in every mode, as upstream does since they went GA in 1.33 (the
//! `MultiCIDRServiceAllocator` gate, on by default); only nftables mode uses them (the other
//! modes' proxiers ignore them, as upstream's do). They hold no sync back (no
//! [`SourceEvent::Synced`] is sent for them), and an API server that does not serve them, or
//! a ClusterRole that does not grant them, is logged and retried without marking the source
//! disconnected (see [`SourceHealth`]).
//!
//! # What is sent
//!
//! Every object goes through [`crate::convert`], the validation the manifest source uses, and
//! the source keeps, per kind, what it has delivered (the last good version of each object):
//!
//! - **Batches.** Each watch event gives at most one `Vec<SourceEvent>`; a whole (re)list
//!   gives one, at its end. Nothing is sent when nothing changed for the proxy (an update
//!   that converts to the object already delivered, a bookmark).
//! - **Initial sync gating.** When a kind's first list is complete (kube's
//!   `watcher::Event::InitDone`), its batch ends with [`SourceEvent::Synced`] for that kind,
//!   so the proxy never syncs from a partial list (upstream's `HasSynced` gating of
//!   `OnServiceSynced`/`OnEndpointSlicesSynced`). A kind is synced once; later relists do not
//!   repeat it.
//! - **Relists send the difference.** When the watcher relists (after `410 Gone`, or when
//!   the list failed), the listed objects are buffered until the list is complete and then
//!   compared with what was delivered: upserts for new and changed objects, deletes for the
//!   objects that vanished (deleted while the watch was down). Unchanged objects are not
//!   sent again.
//! - **Invalid objects keep their last valid version**, as the manifest source does (see
//!   [`crate::last_good`]): an update that fails validation keeps the version delivered
//!   before and is reported through the `errors` callback as an [`ApiObjectError`] ending
//!   in `; keeping the last valid version`; a new object that fails validation is skipped
//!   and reported. The same error for the same object is reported once. The API server
//!   validates what it stores, so this only matters for what it lets through and we do
//!   not (or for a newer server's fields).
//! - **Warnings** ([`crate::convert::ConvertWarning`]: an address with leading zeros, read
//!   as upstream reads it) are logged (`WARN`, naming the object) when the object is
//!   delivered, not again while it stays the same.
//! - **Every text from the server that is logged is escaped**: [`ApiObjectError`]'s
//!   `Display`, the object names and the warnings go through [`kp_model::escape`], so an
//!   object's name or field cannot forge a log line.
//! - **Ignored objects** ([`crate::convert::Converted::Ignored`]: FQDN slices, and objects
//!   with the labels the selectors exclude, checked again after conversion) are never
//!   delivered; one that was delivered and becomes ignored is deleted. ExternalName and headless Services are delivered (the
//!   tracker skips them), so a change of type is a change. A Node other than this node's is
//!   ignored too (the field selector already keeps it away).
//!
//! # When the API server cannot be reached
//!
//! Nothing is sent: the proxy keeps its rules. kube's watcher retries with an exponential
//! backoff ([`ApiOptions::backoff_initial`] to [`ApiOptions::backoff_max`], jittered, like
//! client-go's reflector: 800 ms to 30 s), reset by every successful event. The watch resumes
//! from the last resourceVersion seen, or relists when it is too old. [`ApiSource::health`]
//! tells whether the source is currently connected (see [`SourceHealth`]), for the proxy's
//! health reporting.
//!
//! Give it a client built by [`client`], or one whose `Config::default_retry` is off: with
//! kube's default retry layer a `503` is retried inside the request for minutes, so neither
//! the backoff nor the health signal sees the outage.
//!
//! Objects that cannot be decoded at all (a field of the wrong JSON type) make the whole
//! list or watch event fail inside kube-rs; that is retried with backoff like a connection
//! error. The real API server never sends such objects.
//!
//! [`client`] builds the kube client from `--kubeconfig` and `--master` as kube-proxy does.

mod backoff;
mod health;
mod store;

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use futures::stream::{BoxStream, StreamExt};
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::api::networking::v1 as networking;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kp_model::{Escaped, NamespacedName, ObjectKind, SourceEvent, validate_dns_subdomain};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::{mpsc, watch};
use tracing::debug;

use crate::SourceError;
use crate::convert::{self, Converted};
use crate::last_good::KEEP_OBJECT;
use crate::manifests::ObjectKey;

pub use health::SourceHealth;

use backoff::ExponentialBackoff;
use health::{Health, Probe};
use store::{Outcome, Store};

/// The label selector of the Service watch: Services labelled
/// `service.kubernetes.io/headless` or handed to another proxy
/// (`service.kubernetes.io/service-proxy-name`), whatever the value, are not listed. Upstream
/// kube-proxy (`cmd/kube-proxy/app/server.go`) puts this one selector on both its Service and
/// its EndpointSlice informers; this is its text (requirements sorted by key, as
/// `labels.Selector` prints them).
pub const SERVICE_LABEL_SELECTOR: &str =
    "!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name";

/// The label selector of the EndpointSlice watch: slices of headless Services and of
/// Services handed to another proxy are not listed; the same selector as
/// [`SERVICE_LABEL_SELECTOR`], as in upstream kube-proxy.
pub const SLICE_LABEL_SELECTOR: &str = SERVICE_LABEL_SELECTOR;

/// Tuning of the watches. [`ApiOptions::default`] is what the proxy uses; tests shorten the
/// backoff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiOptions {
    /// `timeoutSeconds` of each watch request: the server ends the watch after this long and
    /// the watcher starts a new one from the last resourceVersion (no relist). `None` is
    /// kube-rs's default, 290 s. kube-rs also treats a watch that stays silent for this long
    /// plus 5 s as dead.
    pub watch_timeout: Option<u32>,
    /// `limit` of each list request (pages are followed with `continue`); `None` lists
    /// everything at once. Default 500, as client-go's pager.
    pub page_size: Option<u32>,
    /// The first retry delay after an error. Default 800 ms (client-go's reflector).
    pub backoff_initial: Duration,
    /// The longest retry delay; delays double up to it. Default 30 s (client-go's reflector).
    pub backoff_max: Duration,
}

impl Default for ApiOptions {
    fn default() -> Self {
        ApiOptions {
            watch_timeout: None,
            page_size: Some(500),
            backoff_initial: Duration::from_millis(800),
            backoff_max: Duration::from_secs(30),
        }
    }
}

/// An object from the API server that failed validation.
///
/// `Display` is one line, `OBJECT: FIELD: MESSAGE`, with `; keeping the last valid version`
/// appended when an earlier version stays in effect, e.g.
/// `Service default/web: spec.ports[0].port: 70000 is out of range 1-65535; keeping the last valid version`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ApiObjectError {
    /// The object (kind and namespace/name, or name for a Node), as found in its metadata.
    pub object: ObjectKey,
    /// The field path inside the object (`spec.ports[0].port`); empty when the problem is
    /// not about one field.
    pub field: String,
    /// What is wrong, quoting the offending value.
    pub message: String,
    /// Whether the last valid version of the object stays in effect (`false`: the object was
    /// never valid and is skipped).
    pub kept: bool,
}

impl fmt::Display for ApiObjectError {
    /// The object's name, the field and the message are printed through
    /// [`kp_model::escape`]: they can hold text from the object.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.object)?;
        if !self.field.is_empty() {
            write!(f, "{}: ", Escaped(&self.field))?;
        }
        write!(f, "{}", Escaped(&self.message))?;
        if self.kept {
            write!(f, "; {KEEP_OBJECT}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ApiObjectError {}

/// The API-server source of one node: configure it, take its [`ApiSource::health`]
/// receiver, then [`ApiSource::run`] it.
pub struct ApiSource {
    client: Client,
    node_name: String,
    options: ApiOptions,
    health: watch::Sender<SourceHealth>,
}

impl ApiSource {
    /// A source watching through `client` for node `node_name` (the Node object whose
    /// labels and pod CIDRs the proxy uses), with [`ApiOptions::default`].
    pub fn new(client: Client, node_name: impl Into<String>) -> Self {
        ApiSource {
            client,
            node_name: node_name.into(),
            options: ApiOptions::default(),
            health: watch::Sender::new(SourceHealth::Connecting),
        }
    }

    /// Replaces the options.
    #[must_use]
    pub fn with_options(mut self, options: ApiOptions) -> Self {
        self.options = options;
        self
    }

    /// A receiver of the source's connection state; it starts as
    /// [`SourceHealth::Connecting`] and changes as requests succeed or fail.
    pub fn health(&self) -> watch::Receiver<SourceHealth> {
        self.health.subscribe()
    }

    /// Runs the source until `tx` is closed (see the module documentation for what is
    /// sent). `errors` receives every invalid object, once per distinct error.
    ///
    /// Connection problems are not errors: they are retried forever (with backoff), logged,
    /// and shown by [`ApiSource::health`].
    ///
    /// # Errors
    /// [`SourceError::Invalid`] (field `node name`) when the node name is not a valid
    /// DNS-1123 subdomain; nothing is watched then.
    pub async fn run(
        self,
        tx: mpsc::Sender<Vec<SourceEvent>>,
        errors: impl Fn(&ApiObjectError) + Send + Sync + 'static,
    ) -> Result<(), SourceError> {
        validate_dns_subdomain(&self.node_name)
            .map_err(|e| SourceError::invalid("node name", format!("{:?}: {e}", self.node_name)))?;
        let health = Health::new(self.health);
        let options = &self.options;
        let services = watch_kind::<core::Service>(
            &self.client,
            health.probe(ObjectKind::Service),
            watcher_config(options).labels(SERVICE_LABEL_SELECTOR),
            options,
        )
        .map(|e| Item::Service(Box::new(e)))
        .boxed();
        let slices = watch_kind::<discovery::EndpointSlice>(
            &self.client,
            health.probe(ObjectKind::EndpointSlice),
            watcher_config(options).labels(SLICE_LABEL_SELECTOR),
            options,
        )
        .map(|e| Item::Slice(Box::new(e)))
        .boxed();
        let nodes = watch_kind::<core::Node>(
            &self.client,
            health.probe(ObjectKind::Node),
            watcher_config(options).fields(&format!("metadata.name={}", self.node_name)),
            options,
        )
        .map(|e| Item::Node(Box::new(e)))
        .boxed();
        let service_cidrs = watch_kind::<networking::ServiceCIDR>(
            &self.client,
            health.probe(ObjectKind::ServiceCidr),
            watcher_config(options),
            options,
        )
        .map(|e| Item::ServiceCidr(Box::new(e)))
        .boxed();
        let mut items = futures::stream::select_all([services, slices, nodes, service_cidrs]);

        let mut service_store = Store::new(ObjectKind::Service);
        let mut slice_store = Store::new(ObjectKind::EndpointSlice);
        let mut node_store = Store::new(ObjectKind::Node);
        let mut service_cidr_store = Store::new(ObjectKind::ServiceCidr);
        let report = |e: &ApiObjectError| errors(e);
        let node_name = self.node_name.as_str();
        loop {
            let item = tokio::select! {
                () = tx.closed() => return Ok(()),
                item = items.next() => item,
            };
            // The watchers retry forever; they end only if the backoff gives up, which ours
            // never does.
            let Some(item) = item else {
                return Ok(());
            };
            let events = match item {
                Item::Service(event) => handle(
                    &mut service_store,
                    *event,
                    &health.probe(ObjectKind::Service),
                    &report,
                    classify_service,
                ),
                Item::Slice(event) => handle(
                    &mut slice_store,
                    *event,
                    &health.probe(ObjectKind::EndpointSlice),
                    &report,
                    classify_slice,
                ),
                Item::Node(event) => handle(
                    &mut node_store,
                    *event,
                    &health.probe(ObjectKind::Node),
                    &report,
                    |node| classify_node(node, node_name),
                ),
                Item::ServiceCidr(event) => handle(
                    &mut service_cidr_store,
                    *event,
                    &health.probe(ObjectKind::ServiceCidr),
                    &report,
                    classify_service_cidr,
                ),
            };
            if events.is_empty() {
                continue;
            }
            debug!(events = events.len(), "API source changes");
            if tx.send(events).await.is_err() {
                return Ok(());
            }
        }
    }
}

/// Runs the API-server source for `node_name` with the default options until `tx` is
/// closed; `ApiSource::new(client, node_name).run(tx, errors)`. Use [`ApiSource`] to get
/// its health or change its options.
///
/// # Errors
/// See [`ApiSource::run`].
pub async fn watch_api(
    client: Client,
    node_name: String,
    tx: mpsc::Sender<Vec<SourceEvent>>,
    errors: impl Fn(&ApiObjectError) + Send + Sync + 'static,
) -> Result<(), SourceError> {
    ApiSource::new(client, node_name).run(tx, errors).await
}

/// Builds the kube client the way kube-proxy builds its clientset:
///
/// - `kubeconfig` given: that file (its current context); `master`, when also given,
///   replaces the cluster's server URL (`--master` overrides the kubeconfig, as in
///   client-go's `BuildConfigFromFlags`).
/// - only `master`: that URL, without credentials.
/// - neither: the in-cluster configuration (service-account token,
///   `KUBERNETES_SERVICE_HOST`), as upstream; when not running in a cluster, the default
///   kubeconfig (`$KUBECONFIG`, else `~/.kube/config`), which is handy outside a cluster.
///
/// kube's default retry of `429`/`503`/`504` responses (`Config::default_retry`) is turned
/// off: the watchers retry with their own backoff, and [`ApiSource::health`] must see each
/// failure when it happens.
///
/// # Errors
/// [`SourceError::Client`] naming what could not be read or built.
pub async fn client(
    kubeconfig: Option<PathBuf>,
    master: Option<String>,
) -> Result<Client, SourceError> {
    let fail = |context: String| {
        move |e: Box<dyn std::error::Error + Send + Sync>| SourceError::Client {
            context,
            source: e,
        }
    };
    let master_uri = match master.as_deref().filter(|m| !m.is_empty()) {
        Some(m) => Some(
            m.parse::<http::Uri>()
                .map_err(|e| fail(format!("invalid --master URL {m:?}"))(Box::new(e)))?,
        ),
        None => None,
    };
    let kube_options = kube::config::KubeConfigOptions::default();
    let mut config = match (kubeconfig, &master_uri) {
        (Some(path), _) => {
            let file = kube::config::Kubeconfig::read_from(&path).map_err(|e| {
                fail(format!("cannot read kubeconfig {}", path.display()))(Box::new(e))
            })?;
            kube::Config::from_custom_kubeconfig(file, &kube_options)
                .await
                .map_err(|e| fail(format!("invalid kubeconfig {}", path.display()))(Box::new(e)))?
        }
        (None, Some(uri)) => kube::Config::new(uri.clone()),
        (None, None) => match kube::Config::incluster() {
            Ok(config) => config,
            Err(in_cluster) => {
                debug!(error = %in_cluster, "no in-cluster configuration; trying the default kubeconfig");
                kube::Config::from_kubeconfig(&kube_options)
                    .await
                    .map_err(|e| {
                        fail(format!(
                            "no --kubeconfig or --master, not in a cluster ({in_cluster}), \
                             and no usable default kubeconfig"
                        ))(Box::new(e))
                    })?
            }
        },
    };
    if let Some(uri) = master_uri {
        config.cluster_url = uri;
    }
    // kube's own retry layer would retry 429/503/504 up to 15 times (5 ms doubling, for
    // minutes) inside one request, hiding the outage from the watcher's backoff and from the
    // health signal. Retrying is the watcher's job.
    config.default_retry = false;
    let url = config.cluster_url.to_string();
    Client::try_from(config)
        .map_err(|e| fail(format!("cannot build a client for {url}"))(Box::new(e)))
}

/// One watcher's output, tagged with its kind (boxed: the objects are large).
enum Item {
    Service(Box<Result<Event<core::Service>, watcher::Error>>),
    Slice(Box<Result<Event<discovery::EndpointSlice>, watcher::Error>>),
    Node(Box<Result<Event<core::Node>, watcher::Error>>),
    ServiceCidr(Box<Result<Event<networking::ServiceCIDR>, watcher::Error>>),
}

fn watcher_config(options: &ApiOptions) -> watcher::Config {
    watcher::Config {
        timeout: options.watch_timeout,
        page_size: options.page_size,
        ..watcher::Config::default()
    }
}

/// The watcher of one kind, through a client that reports to `probe`, with backoff.
///
/// `Event::Init` is dropped before the backoff: kube's `StreamBackoff` resets its delay on
/// every `Ok`, and the watcher emits `Init` before each list attempt, so with it the delay
/// would never grow while lists fail. The store needs no `Init`: a list starts with its
/// first `InitApply` (or ends with `InitDone` when empty), and an error drops a partial list
/// (after a failed list page the watcher always starts over).
fn watch_kind<K>(
    client: &Client,
    probe: Probe,
    config: watcher::Config,
    options: &ApiOptions,
) -> BoxStream<'static, Result<Event<K>, watcher::Error>>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let api: Api<K> = Api::all(health::instrumented(client, probe));
    watcher::watcher(api, config)
        .filter(|event| futures::future::ready(!matches!(event, Ok(Event::Init))))
        .backoff(ExponentialBackoff::new(
            options.backoff_initial,
            options.backoff_max,
        ))
        .boxed()
}

/// Applies one watcher output to `store`; returns the events to send.
fn handle<K, M>(
    store: &mut Store<M>,
    event: Result<Event<K>, watcher::Error>,
    probe: &Probe,
    errors: &dyn Fn(&ApiObjectError),
    classify: impl Fn(&K) -> (ObjectKey, Outcome<M>),
) -> Vec<SourceEvent>
where
    M: store::Model,
{
    let event = match event {
        Ok(event) => event,
        Err(e) => {
            // 410 Gone is the protocol asking for a relist, not a connection problem.
            let gone = matches!(&e, watcher::Error::WatchError(status) if status.code == 410);
            if gone {
                debug!(kind = ?store.kind(), "watch expired (410 Gone); relisting");
            } else {
                probe.failure(format!("{:?} watch: {e}", store.kind()));
            }
            store.abort_list();
            return Vec::new();
        }
    };
    probe.success();
    match event {
        Event::Apply(object) => {
            let (key, outcome) = classify(&object);
            store.apply(key, outcome, errors)
        }
        Event::Delete(object) => {
            let (key, _) = classify(&object);
            store.delete(&key)
        }
        Event::Init => {
            store.abort_list();
            Vec::new()
        }
        Event::InitApply(object) => {
            let (key, outcome) = classify(&object);
            store.list_apply(key, outcome, errors);
            Vec::new()
        }
        Event::InitDone => store.list_done(),
    }
}

/// Namespace/name from metadata, as [`crate::convert`] names the object (`default` when the
/// namespace is empty).
fn namespaced(meta: &ObjectMeta) -> NamespacedName {
    let namespace = meta
        .namespace
        .as_deref()
        .filter(|n| !n.is_empty())
        .unwrap_or("default");
    NamespacedName::new(namespace, meta.name.as_deref().unwrap_or(""))
}

fn outcome<T>(
    result: Result<Converted<T>, SourceError>,
    warnings: Vec<convert::ConvertWarning>,
) -> Outcome<T> {
    match result {
        Ok(Converted::Object(object)) => Outcome::Valid(object, warnings),
        Ok(Converted::Ignored(why)) => Outcome::Ignored(why),
        Err(e) => Outcome::Invalid(e),
    }
}

fn classify_service(svc: &core::Service) -> (ObjectKey, Outcome<kp_model::Service>) {
    let key = ObjectKey::Service(namespaced(&svc.metadata));
    let mut warnings = Vec::new();
    let result = convert::service_with_warnings(svc, &mut warnings);
    (key, outcome(result, warnings))
}

fn classify_slice(
    slice: &discovery::EndpointSlice,
) -> (ObjectKey, Outcome<kp_model::EndpointSlice>) {
    let key = ObjectKey::EndpointSlice(namespaced(&slice.metadata));
    let mut warnings = Vec::new();
    let result = convert::endpoint_slice_with_warnings(slice, &mut warnings);
    (key, outcome(result, warnings))
}

fn classify_service_cidr(
    object: &networking::ServiceCIDR,
) -> (ObjectKey, Outcome<kp_model::ServiceCidr>) {
    let key = ObjectKey::ServiceCidr(object.metadata.name.clone().unwrap_or_default());
    let mut warnings = Vec::new();
    let result = convert::service_cidr_with_warnings(object, &mut warnings).map(Converted::Object);
    (key, outcome(result, warnings))
}

fn classify_node(node: &core::Node, node_name: &str) -> (ObjectKey, Outcome<kp_model::Node>) {
    let name = node.metadata.name.clone().unwrap_or_default();
    if name != node_name {
        let why = format!("it is not this node ({node_name})");
        return (ObjectKey::Node(name), Outcome::Ignored(why));
    }
    let mut warnings = Vec::new();
    let result = convert::node_with_warnings(node, &mut warnings).map(Converted::Object);
    (ObjectKey::Node(name), outcome(result, warnings))
}
