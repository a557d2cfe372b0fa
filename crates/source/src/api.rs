//! The API-server source: Services, EndpointSlices, this node's Node and ServiceCIDRs, watched
//! like upstream kube-proxy's informers.
//!
//! [`ApiSource::run`] (or [`watch_api`]) runs one list/watch loop per kind
//! (`api/reflector.rs`, with client-go's reflector semantics: the first list from the API
//! server's watch cache with `resourceVersion=0`, relists not older than the last
//! resourceVersion seen, a quorum read only after `410 Gone` or "Too large resource
//! version", watch from the list's resourceVersion with bookmarks, a new watch at once when
//! the stream ends or breaks, a backoff that resets after a healthy period):
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
//! a ClusterRole that does not grant them, is logged once when that starts and once when it
//! ends (not at every retry) and retried with the backoff, without marking the source
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
//! - **Initial sync gating.** When a kind's first list is complete (the reflector's
//!   `InitDone`), its batch ends with [`SourceEvent::Synced`] for that kind,
//!   so the proxy never syncs from a partial list (upstream's `HasSynced` gating of
//!   `OnServiceSynced`/`OnEndpointSlicesSynced`). A kind is synced once; later relists do not
//!   repeat it.
//! - **Relists send the difference.** When the reflector relists (after `410 Gone`, "Too
//!   large resource version", or when the list failed), the listed objects are buffered until the list is complete and then
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
//! Nothing is sent: the proxy keeps its rules. Each kind retries with an exponential backoff
//! ([`ApiOptions::backoff_initial`] to [`ApiOptions::backoff_max`], jittered, reset after
//! [`ApiOptions::backoff_reset`] of health; client-go's reflector: 800 ms to 30 s, 2 min),
//! logging every failure with the server's URL ([`ApiSource::with_server`]) and the delay:
//! `cannot reach the API server https://10.0.0.1:6443: watching Services: HTTP 503
//! ServiceUnavailable: ...; retrying in 4s`. The watch resumes from the last resourceVersion
//! seen, or relists when it is too old. [`ApiSource::health`] tells whether the source is
//! currently connected (see [`SourceHealth`]), for the proxy's health reporting.
//!
//! Give it a client built by [`client`], or one whose `Config::default_retry` is off: with
//! kube's default retry layer a `503` is retried inside the request for minutes, so neither
//! the backoff nor the health signal sees the outage.
//!
//! Objects that cannot be decoded at all (a field of the wrong JSON type) make the whole
//! list or watch event fail inside kube-rs; that is retried with backoff like a connection
//! error. The real API server never sends such objects.
//!
//! [`connect`] (or [`client`]) builds the kube client from `--kubeconfig` and `--master` as
//! kube-proxy does, and names the server and where its address came from ([`ApiClient`],
//! [`ServerOrigin`]) for the caller's messages.

mod backoff;
mod health;
mod reflector;
mod store;

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use std::sync::Arc;

use futures::stream::{BoxStream, StreamExt};
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::api::networking::v1 as networking;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kp_model::{Escaped, NamespacedName, ObjectKind, SourceEvent, validate_dns_subdomain};
use kube::Client;
use tokio::sync::{mpsc, watch};
use tracing::debug;

use crate::SourceError;
use crate::convert::{self, Converted};
use crate::last_good::KEEP_OBJECT;
use crate::manifests::ObjectKey;

pub use health::SourceHealth;

use health::{Health, Probe};
use reflector::{Event, KubeListerWatcher, Reflector, Settings};
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
    /// the source starts a new one at once from the last resourceVersion (no relist). `None`
    /// draws it from `[300, 600)` s for each watch, as client-go's reflector does to spread
    /// the watches of a fleet. A watch that stays silent for this long plus 5 s is taken for
    /// a dead connection.
    pub watch_timeout: Option<u32>,
    /// `limit` of the list requests that page (`resourceVersion` `""` and `"0"`; see the
    /// module documentation); pages are followed with `continue`. `None` lists everything at
    /// once. Default 500, as client-go's pager.
    pub page_size: Option<u32>,
    /// The first retry delay after an error. Default 800 ms (client-go's reflector).
    pub backoff_initial: Duration,
    /// The longest retry delay; delays double up to it. Default 30 s (client-go's reflector).
    pub backoff_max: Duration,
    /// After this long without a failure (every request of the kind succeeded), the next
    /// failure is retried after [`ApiOptions::backoff_initial`] again. Default 2 minutes
    /// (client-go's reflector).
    pub backoff_reset: Duration,
}

impl Default for ApiOptions {
    fn default() -> Self {
        ApiOptions {
            watch_timeout: None,
            page_size: Some(500),
            backoff_initial: Duration::from_millis(800),
            backoff_max: Duration::from_secs(30),
            backoff_reset: Duration::from_secs(120),
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
    server: String,
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
            server: String::new(),
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

    /// Names the API server in the log lines of failed requests (the client's URL, e.g.
    /// `https://10.0.0.1:6443/`, as [`connect`] gives it; a trailing `/` is not printed):
    /// `cannot reach the API server https://10.0.0.1:6443: watching Services: ...; retrying
    /// in 4s`. Without it the lines say `cannot reach the API server: ...`.
    #[must_use]
    pub fn with_server(mut self, server: impl Into<String>) -> Self {
        self.server = server.into();
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
        let server: Arc<str> = Arc::from(self.server.as_str());
        let settings = |kind| settings(kind, &server, &self.options);
        let services = reflect::<core::Service>(
            &self.client,
            health.probe(ObjectKind::Service),
            settings(ObjectKind::Service),
            Some(SERVICE_LABEL_SELECTOR),
            None,
        )
        .map(|e| Item::Service(Box::new(e)))
        .boxed();
        let slices = reflect::<discovery::EndpointSlice>(
            &self.client,
            health.probe(ObjectKind::EndpointSlice),
            settings(ObjectKind::EndpointSlice),
            Some(SLICE_LABEL_SELECTOR),
            None,
        )
        .map(|e| Item::Slice(Box::new(e)))
        .boxed();
        let node_selector = format!("metadata.name={}", self.node_name);
        let nodes = reflect::<core::Node>(
            &self.client,
            health.probe(ObjectKind::Node),
            settings(ObjectKind::Node),
            None,
            Some(&node_selector),
        )
        .map(|e| Item::Node(Box::new(e)))
        .boxed();
        let service_cidrs = reflect::<networking::ServiceCIDR>(
            &self.client,
            health.probe(ObjectKind::ServiceCidr),
            settings(ObjectKind::ServiceCidr),
            None,
            None,
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
            // The reflectors retry forever; their streams never end.
            let Some(item) = item else {
                return Ok(());
            };
            let events = match item {
                Item::Service(event) => {
                    handle(&mut service_store, *event, &report, classify_service)
                }
                Item::Slice(event) => handle(&mut slice_store, *event, &report, classify_slice),
                Item::Node(event) => handle(&mut node_store, *event, &report, |node| {
                    classify_node(node, node_name)
                }),
                Item::ServiceCidr(event) => handle(
                    &mut service_cidr_store,
                    *event,
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

/// Where the API server's address came from, for messages: every connection error names
/// the server and this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerOrigin {
    /// The current context of a kubeconfig file (`--kubeconfig`, or `clientConnection.kubeconfig`
    /// of a `--config` file).
    Kubeconfig(PathBuf),
    /// `--master` (alone, or replacing the server of a kubeconfig).
    Master,
    /// The in-cluster configuration: `KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT`
    /// (in a pod, the `kubernetes` Service's ClusterIP, reachable only through Service rules)
    /// with the pod's service-account token and CA.
    InCluster,
    /// The default kubeconfig (`$KUBECONFIG`, else `~/.kube/config`), used when neither a
    /// kubeconfig nor `--master` is given and the process does not run in a pod.
    DefaultKubeconfig,
}

impl fmt::Display for ServerOrigin {
    /// `from --kubeconfig /var/lib/kube-proxy/kubeconfig.conf`, `from --master`, `from the
    /// in-cluster configuration (KUBERNETES_SERVICE_HOST, KUBERNETES_SERVICE_PORT)`, `from
    /// the default kubeconfig ($KUBECONFIG or ~/.kube/config)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServerOrigin::Kubeconfig(path) => write!(f, "from --kubeconfig {}", path.display()),
            ServerOrigin::Master => f.write_str("from --master"),
            ServerOrigin::InCluster => f.write_str(
                "from the in-cluster configuration (KUBERNETES_SERVICE_HOST, KUBERNETES_SERVICE_PORT)",
            ),
            ServerOrigin::DefaultKubeconfig => {
                f.write_str("from the default kubeconfig ($KUBECONFIG or ~/.kube/config)")
            }
        }
    }
}

/// A client built by [`connect`], with the server it talks to.
#[derive(Clone)]
pub struct ApiClient {
    /// The client (kube's retry of `429`/`503`/`504` off, see [`connect`]).
    pub client: Client,
    /// The server's URL, e.g. `https://10.96.0.1` or `https://192.168.1.10:6443` (no
    /// trailing `/`, as every message gives it).
    pub server: String,
    /// Where that URL came from.
    pub origin: ServerOrigin,
}

impl fmt::Debug for ApiClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiClient")
            .field("server", &self.server)
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

/// Builds the kube client the way kube-proxy builds its clientset; [`connect`] without the
/// server's name.
///
/// # Errors
/// See [`connect`].
pub async fn client(
    kubeconfig: Option<PathBuf>,
    master: Option<String>,
) -> Result<Client, SourceError> {
    connect(kubeconfig, master).await.map(|c| c.client)
}

/// Builds the kube client the way kube-proxy builds its clientset, and says which server it
/// talks to and why:
///
/// - `kubeconfig` given: that file (its current context); `master`, when also given,
///   replaces the cluster's server URL (`--master` overrides the kubeconfig, as in
///   client-go's `BuildConfigFromFlags`). File paths in the kubeconfig (`certificate-authority`,
///   `tokenFile`, client certificates) are read relative to the kubeconfig's directory, and
///   a `tokenFile` is read again as it changes (projected service-account tokens rotate), as
///   client-go does.
/// - only `master`: that URL, without credentials.
/// - neither: the in-cluster configuration (service-account token,
///   `KUBERNETES_SERVICE_HOST`), as upstream; when not running in a cluster, the default
///   kubeconfig (`$KUBECONFIG`, else `~/.kube/config`), which is handy outside a cluster.
///
/// kube's default retry of `429`/`503`/`504` responses (`Config::default_retry`) is turned
/// off: the reflectors retry with their own backoff, and [`ApiSource::health`] must see each
/// failure when it happens.
///
/// Nothing is sent to the server here: an unreachable server is found by the first request.
///
/// # Errors
/// [`SourceError::Client`] naming what could not be read or built, and the server when it
/// is known (a kubeconfig whose CA file is missing names the file and the server).
pub async fn connect(
    kubeconfig: Option<PathBuf>,
    master: Option<String>,
) -> Result<ApiClient, SourceError> {
    let (config, origin) = config(kubeconfig, master).await?;
    let server = server_url(&config);
    let client = Client::try_from(config).map_err(|e| SourceError::Client {
        context: format!("cannot build a client for {server} ({origin})"),
        source: Box::new(e),
    })?;
    Ok(ApiClient {
        client,
        server,
        origin,
    })
}

/// The URL of `config`'s API server without a trailing `/` (`https://10.0.0.1:6443`), as
/// every message names it: the start-up line (`API server https://10.0.0.1:6443 (from
/// --kubeconfig ...)`), the one-shot runs' give-up line and the retry lines of
/// [`ApiSource::with_server`] (`cannot reach the API server https://10.0.0.1:6443: watching
/// ...`).
pub fn server_url(config: &kube::Config) -> String {
    config
        .cluster_url
        .to_string()
        .trim_end_matches('/')
        .to_string()
}

/// The kube configuration [`connect`] builds its client from, and where its server came
/// from; the binary wraps the client built from it to count and time its requests (the API
/// server's URL, `cluster_url`, labels them).
///
/// # Errors
/// As [`connect`].
pub async fn config(
    kubeconfig: Option<PathBuf>,
    master: Option<String>,
) -> Result<(kube::Config, ServerOrigin), SourceError> {
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
    let (mut config, mut origin) = match (kubeconfig, &master_uri) {
        (Some(path), _) => {
            let file = kube::config::Kubeconfig::read_from(&path).map_err(|e| {
                fail(format!("cannot read kubeconfig {}", path.display()))(Box::new(e))
            })?;
            let server = match current_server(&file) {
                Some(server) => format!(" (server {server})"),
                None => String::new(),
            };
            let config = kube::Config::from_custom_kubeconfig(file, &kube_options)
                .await
                .map_err(|e| {
                    fail(format!("invalid kubeconfig {}{server}", path.display()))(Box::new(e))
                })?;
            (config, ServerOrigin::Kubeconfig(path))
        }
        (None, Some(uri)) => (kube::Config::new(uri.clone()), ServerOrigin::Master),
        (None, None) => match kube::Config::incluster() {
            Ok(config) => (config, ServerOrigin::InCluster),
            Err(in_cluster) => {
                debug!(error = %in_cluster, "no in-cluster configuration; trying the default kubeconfig");
                let config = kube::Config::from_kubeconfig(&kube_options)
                    .await
                    .map_err(|e| {
                        fail(format!(
                            "no --kubeconfig or --master, not in a cluster ({in_cluster}), \
                             and no usable default kubeconfig"
                        ))(Box::new(e))
                    })?;
                (config, ServerOrigin::DefaultKubeconfig)
            }
        },
    };
    if let Some(uri) = master_uri {
        config.cluster_url = uri;
        origin = ServerOrigin::Master;
    }
    // kube's own retry layer would retry 429/503/504 up to 15 times (5 ms doubling, for
    // minutes) inside one request, hiding the outage from the reflectors' backoff and from the
    // health signal. Retrying is the reflectors' job.
    config.default_retry = false;
    Ok((config, origin))
}

/// The `server` of the kubeconfig's current context's cluster, if it names one.
fn current_server(file: &kube::config::Kubeconfig) -> Option<String> {
    let context = file.current_context.as_deref()?;
    let cluster = file
        .contexts
        .iter()
        .find(|c| c.name == context)?
        .context
        .as_ref()?
        .cluster
        .as_str();
    file.clusters
        .iter()
        .find(|c| c.name == cluster)?
        .cluster
        .as_ref()?
        .server
        .clone()
}

/// One reflector's event, tagged with its kind (boxed: the objects are large).
enum Item {
    Service(Box<Event<core::Service>>),
    Slice(Box<Event<discovery::EndpointSlice>>),
    Node(Box<Event<core::Node>>),
    ServiceCidr(Box<Event<networking::ServiceCIDR>>),
}

/// The reflector settings of one kind.
fn settings(kind: ObjectKind, server: &Arc<str>, options: &ApiOptions) -> Settings {
    Settings {
        kind,
        server: server.clone(),
        page_size: options.page_size,
        watch_timeout: options.watch_timeout,
        backoff_initial: options.backoff_initial,
        backoff_max: options.backoff_max,
        backoff_reset: options.backoff_reset,
    }
}

/// The list/watch loop of one kind (all namespaces, with the selectors), reporting to
/// `probe`; see [`reflector`]. Adding a kind is one more of these, an [`Item`] variant, a
/// [`Store`] and a classify function.
fn reflect<K>(
    client: &Client,
    probe: Probe,
    settings: Settings,
    labels: Option<&str>,
    fields: Option<&str>,
) -> BoxStream<'static, Event<K>>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let lw = KubeListerWatcher::<K>::new(
        client.clone(),
        labels.map(str::to_string),
        fields.map(str::to_string),
    );
    Reflector::new(lw, settings, probe).into_stream()
}

/// Applies one reflector event to `store`; returns the events to send.
fn handle<K, M>(
    store: &mut Store<M>,
    event: Event<K>,
    errors: &dyn Fn(&ApiObjectError),
    classify: impl Fn(&K) -> (ObjectKey, Outcome<M>),
) -> Vec<SourceEvent>
where
    M: store::Model,
{
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
