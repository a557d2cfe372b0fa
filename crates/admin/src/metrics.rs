//! Upstream kube-proxy's Prometheus metrics (`pkg/proxy/metrics/metrics.go`) and the metrics
//! server (`/metrics`, `/healthz`, `/proxyMode` on `--metrics-bind-address`).
//!
//! Names, types, help texts, labels and buckets follow upstream, including the newer
//! `ip_family` label (values `IPv4` / `IPv6`) listed in the Kubernetes metrics reference.
//! As upstream's `RegisterMetrics(mode)`, only the metrics of the running mode are exposed:
//!
//! | metric | type | labels | modes |
//! |---|---|---|---|
//! | `kubeproxy_sync_proxy_rules_duration_seconds` | histogram, 1 ms × 2ⁿ, 15 buckets | ip_family | all |
//! | `kubeproxy_sync_full_proxy_rules_duration_seconds` | histogram, same buckets | ip_family | iptables, nftables |
//! | `kubeproxy_sync_partial_proxy_rules_duration_seconds` | histogram, same buckets | ip_family | iptables, nftables |
//! | `kubeproxy_network_programming_duration_seconds` | histogram, 0, 0.25, 0.5, 1…59, 60…115 (step 5), 120…300 (step 30) s | ip_family | all |
//! | `kubeproxy_sync_proxy_rules_last_timestamp_seconds` | gauge | ip_family | all |
//! | `kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds` | gauge | ip_family | all |
//! | `kubeproxy_sync_proxy_rules_endpoint_changes_pending` / `_total` | gauge / counter | | all |
//! | `kubeproxy_sync_proxy_rules_service_changes_pending` / `_total` | gauge / counter | | all |
//! | `kubeproxy_sync_proxy_rules_no_local_endpoints_total` | gauge | ip_family, traffic_policy | all |
//! | `kubeproxy_proxy_healthz_total`, `kubeproxy_proxy_livez_total` | counter | code | all |
//! | `kubeproxy_conntrack_reconciler_sync_duration_seconds` | histogram, 1 ms × 2ⁿ, 15 buckets | ip_family | all |
//! | `kubeproxy_conntrack_reconciler_deleted_entries_total` | counter | ip_family | all |
//! | `kubeproxy_sync_proxy_rules_iptables_restore_failures_total` | counter | ip_family | iptables, ipvs |
//! | `kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total` | counter | ip_family | iptables |
//! | `kubeproxy_sync_proxy_rules_iptables_total`, `..._iptables_last` | gauge | ip_family, table | iptables |
//! | `kubeproxy_iptables_ct_state_invalid_dropped_packets_total` | counter, read from nfacct at scrape time ([`crate::nfacct`]) | | iptables |
//! | `kubeproxy_iptables_localhost_nodeports_accepted_packets_total` | counter, likewise | | iptables |
//! | `kubeproxy_sync_proxy_rules_nftables_sync_failures_total`, `..._cleanup_failures_total` | counter | ip_family | nftables |
//!
//! And, in every mode, what component-base gives every Kubernetes component:
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `process_*` (CPU, fds, memory, start time, network bytes) | counter / gauge, read from `/proc` at scrape time ([`crate::process`]) | |
//! | `rest_client_requests_total` | counter ([`Metrics::rest_client_request`]) | code, host, method |
//! | `rest_client_request_duration_seconds` | histogram, 5 ms … 60 s ([`REST_CLIENT_BUCKETS`]) | host, verb |
//! | `kubernetes_build_info` | gauge, 1 ([`Metrics::set_build_info`]) | major, minor, git_version, git_commit, git_tree_state, build_date, go_version, compiler, platform |
//!
//! kube-proxy-rs adds, only when it watches the API server (not with `--manifests`), two
//! metrics of its own, outside upstream's `kubeproxy_` namespace so no dashboard confuses them:
//!
//! | metric | type | meaning |
//! |---|---|---|
//! | `kube_proxy_rs_api_server_connected` | gauge | 1 while every watch of the API server is connected, 0 while it is unreachable (the programmed rules are kept as they are) |
//! | `kube_proxy_rs_api_server_disconnects_total` | counter | times the API server became unreachable |
//!
//! and, in every process, `kube_proxy_rs_proxy_mode_fallback{requested,running}` (gauge, 1): the
//! requested mode could not run on this node and the proxy runs another (IPVS mode without
//! the kernel's IPVS falls back to iptables mode, as kube-proxy did; the log names what is
//! missing).
//!
//! `/healthz` does not fail during an API outage, as upstream's does not: it reports whether
//! queued changes are applied, and a node whose rules are current keeps serving; failing every
//! node's `/healthz` at once would make load balancers drain the whole cluster.
//!
//! `/metrics` is the Prometheus text format 0.0.4 (as Go's `promhttp`); help texts carry
//! upstream's `[ALPHA] ` prefix (the encoder appends a final period, except to the two nfacct
//! counters, which a collector writes exactly as upstream's registry does).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use kp_model::IpFamily;
pub use kp_model::ProxyMode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::AdminError;
use crate::clock::{SharedClock, TokioClock, unix_seconds};
use crate::server::{AdminServer, ServeOptions};

/// Upstream's default `--metrics-bind-address` port.
pub const DEFAULT_METRICS_PORT: u16 = 10249;

/// The `traffic_policy` label of `kubeproxy_sync_proxy_rules_no_local_endpoints_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TrafficPolicy {
    /// `internalTrafficPolicy: Local` without local endpoints (`internal`).
    Internal,
    /// `externalTrafficPolicy: Local` without local endpoints (`external`).
    External,
}

impl TrafficPolicy {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            TrafficPolicy::Internal => "internal",
            TrafficPolicy::External => "external",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FamilyLabels {
    ip_family: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TableLabels {
    ip_family: &'static str,
    table: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabels {
    ip_family: &'static str,
    traffic_policy: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FallbackLabels {
    requested: String,
    running: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabels {
    code: u16,
}

/// `rest_client_requests_total`'s labels, in the order Go's registry prints them (sorted).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RestResultLabels {
    code: String,
    host: String,
    method: String,
}

/// `rest_client_request_duration_seconds`'s labels, sorted likewise.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RestLatencyLabels {
    host: String,
    verb: String,
}

/// What `kubernetes_build_info` says about the binary (component-base's `version.Info`),
/// one label each; the binary fills it ([`Metrics::set_build_info`]).
#[derive(Debug, Clone, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildInfo {
    /// `build_date`, RFC 3339 (`1970-01-01T00:00:00Z` when unknown, upstream's default).
    pub build_date: String,
    /// `compiler` (`gc` for Go; `rustc` here).
    pub compiler: String,
    /// `git_commit`: the commit built, empty when unknown.
    pub git_commit: String,
    /// `git_tree_state`: `clean`, `dirty`, or empty when unknown.
    pub git_tree_state: String,
    /// `git_version`, e.g. `v1.35.0`.
    pub git_version: String,
    /// `go_version`: the compiler's version (`go1.24.4` upstream; the rustc version here).
    pub go_version: String,
    /// `major`, e.g. `1`.
    pub major: String,
    /// `minor`, e.g. `35`.
    pub minor: String,
    /// `platform`, `GOOS/GOARCH` style: `linux/amd64`, `linux/arm64`.
    pub platform: String,
}

fn family(f: IpFamily) -> FamilyLabels {
    FamilyLabels {
        ip_family: f.api_name(),
    }
}

/// 1 ms, 2 ms, … 16.384 s: upstream's `ExponentialBuckets(0.001, 2, 15)`.
fn sync_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// Upstream's `MergeBuckets(LinearBuckets(0.25, 0.25, 2), LinearBuckets(1, 1, 59),
/// LinearBuckets(60, 5, 12), LinearBuckets(120, 30, 7))`; `MergeBuckets` starts with a 0
/// bucket. 81 buckets from 0 to 300 s.
pub fn network_programming_buckets() -> Vec<f64> {
    let mut b = vec![0.0, 0.25, 0.5];
    b.extend((1..=59).map(f64::from));
    b.extend((0..12).map(|i| 60.0 + 5.0 * f64::from(i)));
    b.extend((0..7).map(|i| 120.0 + 30.0 * f64::from(i)));
    b
}

fn network_programming_histogram() -> Histogram {
    Histogram::new(network_programming_buckets())
}

/// client-go's `rest_client_request_duration_seconds` buckets (component-base
/// `restclient` metrics): 5 ms to 60 s.
pub const REST_CLIENT_BUCKETS: [f64; 12] = [
    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
];

fn rest_client_histogram() -> Histogram {
    Histogram::new(REST_CLIENT_BUCKETS)
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;
type F64Gauge = Gauge<f64, AtomicU64>;

#[derive(Debug)]
struct Inner {
    mode: ProxyMode,
    clock: SharedClock,
    registry: Registry,
    sync_duration: HistogramFamily<FamilyLabels>,
    sync_full_duration: HistogramFamily<FamilyLabels>,
    sync_partial_duration: HistogramFamily<FamilyLabels>,
    network_programming: HistogramFamily<FamilyLabels>,
    last_timestamp: Family<FamilyLabels, F64Gauge>,
    last_queued_timestamp: Family<FamilyLabels, F64Gauge>,
    endpoint_changes_pending: Gauge,
    endpoint_changes_total: Counter,
    service_changes_pending: Gauge,
    service_changes_total: Counter,
    iptables_restore_failures: Family<FamilyLabels, Counter>,
    iptables_partial_restore_failures: Family<FamilyLabels, Counter>,
    iptables_rules_total: Family<TableLabels, Gauge>,
    iptables_rules_last: Family<TableLabels, Gauge>,
    nftables_sync_failures: Family<FamilyLabels, Counter>,
    nftables_cleanup_failures: Family<FamilyLabels, Counter>,
    no_local_endpoints: Family<PolicyLabels, Gauge>,
    healthz_total: Family<CodeLabels, Counter>,
    livez_total: Family<CodeLabels, Counter>,
    mode_fallback: Family<FallbackLabels, Gauge>,
    conntrack_duration: HistogramFamily<FamilyLabels>,
    conntrack_deleted: Family<FamilyLabels, Counter>,
    rest_requests: Family<RestResultLabels, Counter>,
    rest_duration: HistogramFamily<RestLatencyLabels>,
    build_info: Family<BuildInfo, Gauge>,
    /// Whether the API-server metrics are registered (the process watches the API server).
    api_source: bool,
    api_connected: Gauge,
    api_disconnects: Counter,
    /// Userspace mode's relays, once the daemon has them.
    userspace: crate::userspace::StatsSlot,
    /// iptables mode's nfacct counters, once the daemon can read them.
    nfacct: crate::nfacct::ReaderSlot,
    /// The `/configz` body, once the daemon has set it.
    configz: std::sync::Mutex<Option<String>>,
}

/// The metrics handle: cheap to clone, shared by the sync loops and the servers.
#[derive(Debug, Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

fn to_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Metrics {
    /// The metrics of `mode`, with timestamps from a [`TokioClock`].
    pub fn new(mode: ProxyMode) -> Self {
        Self::with_clock(mode, Arc::new(TokioClock::new()))
    }

    /// The metrics of `mode` for a process that watches the API server: also
    /// `kube_proxy_rs_api_server_connected` and `kube_proxy_rs_api_server_disconnects_total`
    /// (see [`Metrics::api_server_connected`]), with timestamps from a [`TokioClock`].
    pub fn with_api_source(mode: ProxyMode) -> Self {
        Self::build(mode, Arc::new(TokioClock::new()), true)
    }

    /// The metrics of `mode`, with timestamps from `clock`.
    pub fn with_clock(mode: ProxyMode, clock: SharedClock) -> Self {
        Self::build(mode, clock, false)
    }

    fn build(mode: ProxyMode, clock: SharedClock, api_source: bool) -> Self {
        let hist = || {
            HistogramFamily::<FamilyLabels>::new_with_constructor(
                sync_histogram as fn() -> Histogram,
            )
        };
        let mut inner = Inner {
            mode,
            clock,
            registry: Registry::default(),
            sync_duration: hist(),
            sync_full_duration: hist(),
            sync_partial_duration: hist(),
            network_programming: Family::new_with_constructor(
                network_programming_histogram as fn() -> Histogram,
            ),
            last_timestamp: Family::default(),
            last_queued_timestamp: Family::default(),
            endpoint_changes_pending: Gauge::default(),
            endpoint_changes_total: Counter::default(),
            service_changes_pending: Gauge::default(),
            service_changes_total: Counter::default(),
            iptables_restore_failures: Family::default(),
            iptables_partial_restore_failures: Family::default(),
            iptables_rules_total: Family::default(),
            iptables_rules_last: Family::default(),
            nftables_sync_failures: Family::default(),
            nftables_cleanup_failures: Family::default(),
            no_local_endpoints: Family::default(),
            healthz_total: Family::default(),
            livez_total: Family::default(),
            mode_fallback: Family::default(),
            conntrack_duration: hist(),
            conntrack_deleted: Family::default(),
            rest_requests: Family::default(),
            rest_duration: Family::new_with_constructor(rest_client_histogram as fn() -> Histogram),
            build_info: Family::default(),
            api_source,
            api_connected: Gauge::default(),
            api_disconnects: Counter::default(),
            userspace: Arc::default(),
            nfacct: Arc::default(),
            configz: std::sync::Mutex::new(None),
        };
        register(&mut inner);
        Metrics {
            inner: Arc::new(inner),
        }
    }

    /// The mode the metrics were registered for.
    pub fn mode(&self) -> ProxyMode {
        self.inner.mode
    }

    fn now_seconds(&self) -> f64 {
        unix_seconds(self.inner.clock.now())
    }

    /// A sync of `family` was requested (upstream `Sync()`): sets
    /// `kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds` to now.
    pub fn sync_queued(&self, family_: IpFamily) {
        self.inner
            .last_queued_timestamp
            .get_or_create(&family(family_))
            .set(self.now_seconds());
    }

    /// One sync of `family` took `duration`; `full` tells a full sync from a partial one,
    /// `ok` whether it succeeded. As upstream's `syncProxyRules`:
    ///
    /// - always observes `…sync_proxy_rules_duration_seconds` and the full or partial
    ///   histogram;
    /// - on success sets `…sync_proxy_rules_last_timestamp_seconds` to now;
    /// - on failure counts it: iptables `…iptables_restore_failures_total` (plus
    ///   `…iptables_partial_restore_failures_total` for a partial sync), ipvs
    ///   `…iptables_restore_failures_total`, nftables `…nftables_sync_failures_total`.
    pub fn observe_sync(&self, family_: IpFamily, full: bool, duration: Duration, ok: bool) {
        let labels = family(family_);
        let secs = duration.as_secs_f64();
        let inner = &self.inner;
        inner.sync_duration.get_or_create(&labels).observe(secs);
        let split = if full {
            &inner.sync_full_duration
        } else {
            &inner.sync_partial_duration
        };
        split.get_or_create(&labels).observe(secs);
        if ok {
            inner
                .last_timestamp
                .get_or_create(&labels)
                .set(self.now_seconds());
            return;
        }
        match inner.mode {
            ProxyMode::Iptables => {
                inner.iptables_restore_failures.get_or_create(&labels).inc();
                if !full {
                    inner
                        .iptables_partial_restore_failures
                        .get_or_create(&labels)
                        .inc();
                }
            }
            ProxyMode::Ipvs | ProxyMode::Userspace => {
                inner.iptables_restore_failures.get_or_create(&labels).inc();
            }
            ProxyMode::Nftables => {
                inner.nftables_sync_failures.get_or_create(&labels).inc();
            }
        }
    }

    /// Observes one network-programming latency of `seconds` (from an EndpointSlice's
    /// `endpoints.kubernetes.io/last-change-trigger-time` to the sync that programmed it).
    /// NaN is ignored; negative values (clock skew) are observed, as upstream does.
    pub fn network_programming(&self, family_: IpFamily, seconds: f64) {
        if !seconds.is_nan() {
            self.inner
                .network_programming
                .get_or_create(&family(family_))
                .observe(seconds);
        }
    }

    /// Observes the latency from `trigger` (a last-change-trigger-time) to now.
    pub fn network_programming_since(&self, family_: IpFamily, trigger: SystemTime) {
        self.network_programming(family_, self.now_seconds() - unix_seconds(trigger));
    }

    /// Sets the numbers of Service and EndpointSlice changes not yet synced
    /// (`…service_changes_pending`, `…endpoint_changes_pending`).
    pub fn changes_pending(&self, services: usize, endpoints: usize) {
        self.inner.service_changes_pending.set(to_i64(services));
        self.inner.endpoint_changes_pending.set(to_i64(endpoints));
    }

    /// Counts Service and EndpointSlice changes received (`…service_changes_total`,
    /// `…endpoint_changes_total`).
    pub fn changes_seen(&self, services: u64, endpoints: u64) {
        self.inner.service_changes_total.inc_by(services);
        self.inner.endpoint_changes_total.inc_by(endpoints);
    }

    /// Sets `…iptables_total{table}`: the rules kube-proxy owns in `table` (`filter`, `nat`)
    /// after a sync.
    pub fn rules_total(&self, family_: IpFamily, table: &str, rules: usize) {
        self.inner
            .iptables_rules_total
            .get_or_create(&TableLabels {
                ip_family: family_.api_name(),
                table: table.to_string(),
            })
            .set(to_i64(rules));
    }

    /// Sets `…iptables_last{table}`: the rules written to `table` by the last sync.
    pub fn rules_last(&self, family_: IpFamily, table: &str, rules: usize) {
        self.inner
            .iptables_rules_last
            .get_or_create(&TableLabels {
                ip_family: family_.api_name(),
                table: table.to_string(),
            })
            .set(to_i64(rules));
    }

    /// Sets `…no_local_endpoints_total{traffic_policy}`: Services with a Local policy and no
    /// local endpoint, recounted at each sync.
    pub fn no_local_endpoints(&self, family_: IpFamily, policy: TrafficPolicy, services: usize) {
        self.inner
            .no_local_endpoints
            .get_or_create(&PolicyLabels {
                ip_family: family_.api_name(),
                traffic_policy: policy.as_str(),
            })
            .set(to_i64(services));
    }

    /// Counts a failed deletion of stale nftables chains (`…nftables_cleanup_failures_total`).
    pub fn nftables_cleanup_failed(&self, family_: IpFamily) {
        self.inner
            .nftables_cleanup_failures
            .get_or_create(&family(family_))
            .inc();
    }

    /// One conntrack reconciliation of `family` took `duration` and deleted `deleted`
    /// entries (`kubeproxy_conntrack_reconciler_*`).
    pub fn conntrack_reconciled(&self, family_: IpFamily, duration: Duration, deleted: u64) {
        let labels = family(family_);
        self.inner
            .conntrack_duration
            .get_or_create(&labels)
            .observe(duration.as_secs_f64());
        self.inner
            .conntrack_deleted
            .get_or_create(&labels)
            .inc_by(deleted);
    }

    /// One request to the API server (client-go's request metrics): counts it in
    /// `rest_client_requests_total{code,host,method}` (`code` the HTTP status, `<error>` when
    /// no response came) and observes `duration` (until the response's headers, as
    /// client-go measures) in `rest_client_request_duration_seconds{host,verb}`. `host` is
    /// the server's `host:port`, `method` the HTTP method (`GET`, `POST`, ...).
    pub fn rest_client_request(
        &self,
        method: &str,
        host: &str,
        code: Option<u16>,
        duration: Duration,
    ) {
        self.inner
            .rest_requests
            .get_or_create(&RestResultLabels {
                code: code.map_or_else(|| "<error>".to_string(), |c| c.to_string()),
                host: host.to_string(),
                method: method.to_string(),
            })
            .inc();
        self.inner
            .rest_duration
            .get_or_create(&RestLatencyLabels {
                host: host.to_string(),
                verb: method.to_string(),
            })
            .observe(duration.as_secs_f64());
    }

    /// Sets `kubernetes_build_info{...} 1` (a process has one: a second call replaces the
    /// first).
    pub fn set_build_info(&self, info: &BuildInfo) {
        self.inner.build_info.clear();
        self.inner.build_info.get_or_create(info).set(1);
    }

    /// Counts one `/healthz` answer with HTTP status `code`.
    pub fn healthz_answered(&self, code: u16) {
        self.inner
            .healthz_total
            .get_or_create(&CodeLabels { code })
            .inc();
    }

    /// Records the API server's reachability: sets `kube_proxy_rs_api_server_connected` to 1
    /// or 0 and counts a change from connected to unreachable in
    /// `kube_proxy_rs_api_server_disconnects_total`. Not exposed for metrics built without
    /// [`Metrics::with_api_source`].
    pub fn api_server_connected(&self, connected: bool) {
        let was = self.inner.api_connected.set(i64::from(connected));
        if was == 1 && !connected {
            self.inner.api_disconnects.inc();
        }
    }

    /// Records that `requested` mode could not run and `running` runs instead:
    /// `kube_proxy_rs_proxy_mode_fallback{requested,running} 1`.
    pub fn mode_fallback(&self, requested: &str, running: &str) {
        self.inner
            .mode_fallback
            .get_or_create(&FallbackLabels {
                requested: requested.to_string(),
                running: running.to_string(),
            })
            .set(1);
    }

    /// Counts one `/livez` answer with HTTP status `code`.
    pub fn livez_answered(&self, code: u16) {
        self.inner
            .livez_total
            .get_or_create(&CodeLabels { code })
            .inc();
    }

    /// Userspace mode: where `/metrics` reads the proxy sockets' numbers and `/userspace`
    /// the proxy table.
    pub fn set_userspace(&self, stats: Arc<dyn crate::userspace::UserspaceStats>) {
        if let Ok(mut slot) = self.inner.userspace.lock() {
            *slot = Some(stats);
        }
    }

    /// iptables mode: where `/metrics` reads the nfacct counters of
    /// `kubeproxy_iptables_ct_state_invalid_dropped_packets_total` and
    /// `kubeproxy_iptables_localhost_nodeports_accepted_packets_total` (see [`crate::nfacct`]).
    /// Ignored in other modes.
    pub fn set_nfacct(&self, reader: Arc<dyn crate::nfacct::NfacctReader>) {
        if let Ok(mut slot) = self.inner.nfacct.lock() {
            *slot = Some(reader);
        }
    }

    /// What `/configz` serves (component-base's `configz`): `{"<group>": <config>}`, here
    /// `{"kubeproxy.config.k8s.io": config}` with `config` the effective configuration.
    pub fn set_configz(&self, group: &str, config: serde_json::Value) {
        let mut body = serde_json::Map::new();
        body.insert(group.to_string(), config);
        let text = serde_json::Value::Object(body).to_string();
        if let Ok(mut slot) = self.inner.configz.lock() {
            *slot = Some(text);
        }
    }

    /// The `/configz` body: `{}` until [`Metrics::set_configz`] is called, as upstream's
    /// handler answers with no configuration registered.
    pub fn configz(&self) -> String {
        self.inner
            .configz
            .lock()
            .ok()
            .and_then(|s| s.clone())
            .unwrap_or_else(|| "{}".to_string())
    }

    /// The userspace proxy table; `None` outside userspace mode (or before it is set).
    pub fn userspace_table(&self) -> Option<String> {
        Some(self.userspace_table_pieces()?.collect())
    }

    /// [`userspace_table`](Self::userspace_table) in pieces made as they are read (what
    /// `/userspace` sends).
    fn userspace_table_pieces(&self) -> Option<crate::userspace::TableChunks> {
        let source = self.inner.userspace.lock().ok()?.clone()?;
        Some(crate::userspace::TableChunks::new(source))
    }

    /// The metrics in the Prometheus text format 0.0.4, in one `String` (`/metrics` sends the
    /// same text in pieces, see [`crate::userspace`]).
    ///
    /// # Errors
    /// [`AdminError::Encode`] if the encoder fails (it writes to a `String`, so it does not in
    /// practice).
    pub fn encode(&self) -> Result<String, AdminError> {
        let mut out = self.encode_registry()?;
        if let Some(pieces) = self.userspace_pieces() {
            out.extend(pieces);
        }
        Ok(out)
    }

    /// The registry's metrics (everything but userspace mode's).
    fn encode_registry(&self) -> Result<String, AdminError> {
        let mut out = String::new();
        prometheus_text::encode(&mut out, &self.inner.registry)
            .map_err(|e| AdminError::Encode(e.to_string()))?;
        Ok(out)
    }

    /// Userspace mode's metrics, after the registry's, in pieces made as they are read;
    /// `None` in the other modes.
    fn userspace_pieces(&self) -> Option<crate::userspace::Chunks> {
        (self.inner.mode == ProxyMode::Userspace).then(|| {
            let source = self.inner.userspace.lock().ok().and_then(|s| s.clone());
            crate::userspace::Chunks::new(source)
        })
    }
}

/// Registers the metrics of `inner.mode` (upstream `RegisterMetrics(mode)`). Counters are
/// registered without `_total`, which the encoder appends.
fn register(inner: &mut Inner) {
    let r = &mut inner.registry;
    // Userspace mode's metrics are not in the registry: `Metrics::encode` and `/metrics`
    // append them, written from the relays at scrape time (`crate::userspace`).
    if inner.mode == ProxyMode::Iptables {
        r.register_collector(Box::new(crate::nfacct::NfacctCollector {
            slot: inner.nfacct.clone(),
        }));
    }
    let alpha = |help: &str| format!("[ALPHA] {help}");
    // What every Kubernetes component exposes through component-base: the process
    // metrics, client-go's request metrics, the build info.
    r.register_collector(Box::new(crate::process::ProcessCollector));
    r.register(
        "rest_client_requests",
        alpha("Number of HTTP requests, partitioned by status code, method, and host"),
        inner.rest_requests.clone(),
    );
    r.register(
        "rest_client_request_duration_seconds",
        alpha("Request latency in seconds. Broken down by verb, and host"),
        inner.rest_duration.clone(),
    );
    r.register(
        "kubernetes_build_info",
        alpha(
            "A metric with a constant '1' value labeled by major, minor, git version, git commit, git tree state, build date, Go version, and compiler from which Kubernetes was built, and platform on which it is running",
        ),
        inner.build_info.clone(),
    );
    r.register(
        "kubeproxy_sync_proxy_rules_duration_seconds",
        alpha("SyncProxyRules latency in seconds"),
        inner.sync_duration.clone(),
    );
    r.register(
        "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
        alpha("The last time a sync of proxy rules was queued"),
        inner.last_queued_timestamp.clone(),
    );
    r.register(
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
        alpha("The last time proxy rules were successfully synced"),
        inner.last_timestamp.clone(),
    );
    r.register(
        "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
        alpha("Pending proxy rules Endpoint changes"),
        inner.endpoint_changes_pending.clone(),
    );
    r.register(
        "kubeproxy_sync_proxy_rules_endpoint_changes",
        alpha("Cumulative proxy rules Endpoint changes"),
        inner.endpoint_changes_total.clone(),
    );
    r.register(
        "kubeproxy_sync_proxy_rules_service_changes_pending",
        alpha("Pending proxy rules Service changes"),
        inner.service_changes_pending.clone(),
    );
    r.register(
        "kubeproxy_sync_proxy_rules_service_changes",
        alpha("Cumulative proxy rules Service changes"),
        inner.service_changes_total.clone(),
    );
    r.register(
        "kubeproxy_proxy_healthz",
        alpha("Cumulative proxy healthz HTTP status"),
        inner.healthz_total.clone(),
    );
    r.register(
        "kubeproxy_proxy_livez",
        alpha("Cumulative proxy livez HTTP status"),
        inner.livez_total.clone(),
    );
    r.register(
        "kubeproxy_network_programming_duration_seconds",
        alpha("In Cluster Network Programming Latency in seconds"),
        inner.network_programming.clone(),
    );
    r.register(
        "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
        alpha("Number of services with a Local traffic policy and no endpoints"),
        inner.no_local_endpoints.clone(),
    );
    r.register(
        "kubeproxy_conntrack_reconciler_sync_duration_seconds",
        alpha("ReconcileConntrackFlowsLatency latency in seconds"),
        inner.conntrack_duration.clone(),
    );
    r.register(
        "kubeproxy_conntrack_reconciler_deleted_entries",
        alpha("Cumulative conntrack flows deleted by conntrack reconciler"),
        inner.conntrack_deleted.clone(),
    );
    if matches!(inner.mode, ProxyMode::Iptables | ProxyMode::Nftables) {
        r.register(
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            alpha("SyncProxyRules latency in seconds for full resyncs"),
            inner.sync_full_duration.clone(),
        );
        r.register(
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            alpha("SyncProxyRules latency in seconds for partial resyncs"),
            inner.sync_partial_duration.clone(),
        );
    }
    if matches!(
        inner.mode,
        ProxyMode::Iptables | ProxyMode::Ipvs | ProxyMode::Userspace
    ) {
        r.register(
            "kubeproxy_sync_proxy_rules_iptables_restore_failures",
            alpha("Cumulative proxy iptables restore failures"),
            inner.iptables_restore_failures.clone(),
        );
    }
    if inner.mode == ProxyMode::Iptables {
        r.register(
            "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures",
            alpha("Cumulative proxy iptables partial restore failures"),
            inner.iptables_partial_restore_failures.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_iptables_total",
            alpha("Total number of iptables rules owned by kube-proxy"),
            inner.iptables_rules_total.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_iptables_last",
            alpha("Number of iptables rules written by kube-proxy in last sync"),
            inner.iptables_rules_last.clone(),
        );
    }
    r.register(
        "kube_proxy_rs_proxy_mode_fallback",
        "1 when the requested proxy mode could not run on this node and another runs instead",
        inner.mode_fallback.clone(),
    );
    if inner.api_source {
        r.register(
            "kube_proxy_rs_api_server_connected",
            "1 while kube-proxy-rs's watches of the API server are connected, 0 while it is unreachable and the programmed rules are kept",
            inner.api_connected.clone(),
        );
        r.register(
            "kube_proxy_rs_api_server_disconnects",
            "Times the API server became unreachable",
            inner.api_disconnects.clone(),
        );
    }
    if inner.mode == ProxyMode::Nftables {
        r.register(
            "kubeproxy_sync_proxy_rules_nftables_sync_failures",
            alpha("Cumulative proxy nftables sync failures"),
            inner.nftables_sync_failures.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_nftables_cleanup_failures",
            alpha("Cumulative proxy nftables cleanup failures"),
            inner.nftables_cleanup_failures.clone(),
        );
    }
}

/// The metrics server's routes: `/metrics`, `/healthz` (and `/healthz/ping`, plain `ok`, as
/// the apiserver `healthz` handler upstream installs), `/proxyMode` (the mode as text) and
/// `/configz` (the effective configuration as JSON, [`Metrics::set_configz`]).
pub fn metrics_router(metrics: Metrics) -> Router {
    Router::new()
        .route("/metrics", any(metrics_handler))
        .route("/healthz", any(ok_handler))
        .route("/healthz/ping", any(ok_handler))
        .route("/proxyMode", any(proxy_mode_handler))
        .route("/configz", any(configz_handler))
        .route("/userspace", any(userspace_handler))
        .with_state(metrics)
}

/// The metrics server on `opts.addr` (`--metrics-bind-address`; an empty flag means no
/// server, see [`parse_bind_address`](crate::parse_bind_address)).
pub fn metrics_server(opts: ServeOptions, metrics: Metrics) -> AdminServer {
    AdminServer::new("metrics", opts, metrics_router(metrics))
}

fn text_response(code: StatusCode, content_type: &'static str, body: String) -> Response {
    let mut response = (code, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// A response whose body is `pieces`, each made when the connection can take it.
fn streamed_response(
    content_type: &'static str,
    pieces: impl Iterator<Item = String> + Send + 'static,
) -> Response {
    let stream = futures::stream::iter(
        pieces.map(|p| Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(p))),
    );
    let mut response = (StatusCode::OK, axum::body::Body::from_stream(stream)).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

async fn metrics_handler(State(metrics): State<Metrics>) -> Response {
    match metrics.encode_registry() {
        // Userspace mode: the proxy sockets' series follow in pieces (their text grows with
        // the number of Service ports; see `crate::userspace`).
        Ok(head) => match metrics.userspace_pieces() {
            Some(pieces) => streamed_response(
                prometheus_text::CONTENT_TYPE,
                std::iter::once(head).chain(pieces),
            ),
            None => text_response(StatusCode::OK, prometheus_text::CONTENT_TYPE, head),
        },
        Err(e) => text_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain; charset=utf-8",
            e.to_string(),
        ),
    }
}

async fn configz_handler(State(metrics): State<Metrics>) -> Response {
    text_response(StatusCode::OK, "application/json", metrics.configz())
}

async fn ok_handler() -> Response {
    text_response(StatusCode::OK, "text/plain; charset=utf-8", "ok".into())
}

async fn userspace_handler(State(metrics): State<Metrics>) -> Response {
    match metrics.userspace_table_pieces() {
        Some(pieces) => streamed_response("text/plain; charset=utf-8", pieces),
        None => text_response(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            format!(
                "no userspace proxy table: this kube-proxy-rs runs in {} mode\n",
                metrics.mode()
            ),
        ),
    }
}

async fn proxy_mode_handler(State(metrics): State<Metrics>) -> Response {
    text_response(
        StatusCode::OK,
        "text/plain; charset=utf-8",
        metrics.mode().as_str().into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};
    use std::time::UNIX_EPOCH;

    fn metrics(mode: ProxyMode) -> (Metrics, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new(
            UNIX_EPOCH + Duration::from_secs(1_784_628_000),
        ));
        (Metrics::with_clock(mode, clock.clone()), clock)
    }

    fn type_line(text: &str, name: &str, kind: &str) -> bool {
        text.lines().any(|l| l == format!("# TYPE {name} {kind}"))
    }

    #[test]
    fn network_programming_buckets_are_upstreams() {
        let b = network_programming_buckets();
        assert_eq!(b.len(), 81);
        assert_eq!(&b[..5], &[0.0, 0.25, 0.5, 1.0, 2.0]);
        assert_eq!(b[61], 59.0);
        assert_eq!(&b[62..64], &[60.0, 65.0]);
        assert_eq!(b[73], 115.0);
        assert_eq!(&b[74..], &[120.0, 150.0, 180.0, 210.0, 240.0, 270.0, 300.0]);
    }

    #[test]
    fn iptables_mode_exposes_every_metric_with_type_labels_and_buckets() {
        let (m, _) = metrics(ProxyMode::Iptables);
        m.sync_queued(IpFamily::V4);
        m.observe_sync(IpFamily::V4, true, Duration::from_millis(3), true);
        m.observe_sync(IpFamily::V4, false, Duration::from_millis(3), false);
        m.network_programming(IpFamily::V4, 0.3);
        m.changes_pending(2, 3);
        m.changes_seen(4, 5);
        m.rules_total(IpFamily::V4, "nat", 40);
        m.rules_last(IpFamily::V4, "filter", 7);
        m.no_local_endpoints(IpFamily::V4, TrafficPolicy::External, 1);
        m.conntrack_reconciled(IpFamily::V4, Duration::from_millis(1), 9);
        m.healthz_answered(200);
        m.livez_answered(503);
        let text = m.encode().unwrap();
        for (name, kind) in [
            ("kubeproxy_sync_proxy_rules_duration_seconds", "histogram"),
            (
                "kubeproxy_sync_full_proxy_rules_duration_seconds",
                "histogram",
            ),
            (
                "kubeproxy_sync_partial_proxy_rules_duration_seconds",
                "histogram",
            ),
            (
                "kubeproxy_network_programming_duration_seconds",
                "histogram",
            ),
            ("kubeproxy_sync_proxy_rules_last_timestamp_seconds", "gauge"),
            (
                "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
                "gauge",
            ),
            (
                "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
                "gauge",
            ),
            (
                "kubeproxy_sync_proxy_rules_endpoint_changes_total",
                "counter",
            ),
            (
                "kubeproxy_sync_proxy_rules_service_changes_pending",
                "gauge",
            ),
            (
                "kubeproxy_sync_proxy_rules_service_changes_total",
                "counter",
            ),
            (
                "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
                "counter",
            ),
            (
                "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
                "counter",
            ),
            ("kubeproxy_sync_proxy_rules_iptables_total", "gauge"),
            ("kubeproxy_sync_proxy_rules_iptables_last", "gauge"),
            (
                "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
                "gauge",
            ),
            (
                "kubeproxy_conntrack_reconciler_sync_duration_seconds",
                "histogram",
            ),
            (
                "kubeproxy_conntrack_reconciler_deleted_entries_total",
                "counter",
            ),
            ("kubeproxy_proxy_healthz_total", "counter"),
            ("kubeproxy_proxy_livez_total", "counter"),
        ] {
            assert!(
                type_line(&text, name, kind),
                "{name} {kind} missing in\n{text}"
            );
        }
        for absent in [
            "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
            "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total",
        ] {
            assert!(!text.contains(absent), "{absent} is nftables-only");
        }
        let expected_lines = [
            "# HELP kubeproxy_sync_proxy_rules_duration_seconds [ALPHA] SyncProxyRules latency in seconds.",
            r#"kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.001"} 0"#,
            r#"kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.004"} 2"#,
            r#"kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="16.384"} 2"#,
            r#"kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="+Inf"} 2"#,
            r#"kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"} 2"#,
            r#"kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"} 1"#,
            r#"kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family="IPv4"} 1"#,
            r#"kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="0"} 0"#,
            r#"kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="0.5"} 1"#,
            r#"kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="300"} 1"#,
            r#"kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1784628000.0"#,
            r#"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv4"} 1784628000.0"#,
            "kubeproxy_sync_proxy_rules_service_changes_pending 2",
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending 3",
            "kubeproxy_sync_proxy_rules_service_changes_total 4",
            "kubeproxy_sync_proxy_rules_endpoint_changes_total 5",
            r#"kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family="IPv4"} 1"#,
            r#"kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total{ip_family="IPv4"} 1"#,
            r#"kubeproxy_sync_proxy_rules_iptables_total{ip_family="IPv4",table="nat"} 40"#,
            r#"kubeproxy_sync_proxy_rules_iptables_last{ip_family="IPv4",table="filter"} 7"#,
            r#"kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="external"} 1"#,
            r#"kubeproxy_conntrack_reconciler_sync_duration_seconds_bucket{ip_family="IPv4",le="0.001"} 1"#,
            r#"kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv4"} 9"#,
            r#"kubeproxy_proxy_healthz_total{code="200"} 1"#,
            r#"kubeproxy_proxy_livez_total{code="503"} 1"#,
        ];
        for line in expected_lines {
            assert!(
                text.lines().any(|l| l == line),
                "missing line {line:?} in\n{text}"
            );
        }
        let buckets = text
            .lines()
            .filter(|l| l.starts_with("kubeproxy_sync_proxy_rules_duration_seconds_bucket"))
            .count();
        assert_eq!(buckets, 16, "15 buckets + +Inf");
        let np = text
            .lines()
            .filter(|l| l.starts_with("kubeproxy_network_programming_duration_seconds_bucket"))
            .count();
        assert_eq!(np, 82, "81 buckets + +Inf");
    }

    #[test]
    fn nftables_and_ipvs_register_their_own_failure_counters() {
        let (m, _) = metrics(ProxyMode::Nftables);
        m.observe_sync(IpFamily::V6, false, Duration::from_millis(1), false);
        m.nftables_cleanup_failed(IpFamily::V6);
        let text = m.encode().unwrap();
        assert!(type_line(
            &text,
            "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
            "counter"
        ));
        assert!(type_line(
            &text,
            "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total",
            "counter"
        ));
        assert!(text.contains(
            r#"kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv6"} 1"#
        ));
        assert!(text.contains(
            r#"kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total{ip_family="IPv6"} 1"#
        ));
        assert!(
            !text.contains("iptables"),
            "no iptables metrics in nftables mode"
        );

        let (m, _) = metrics(ProxyMode::Ipvs);
        m.observe_sync(IpFamily::V4, true, Duration::from_millis(1), false);
        let text = m.encode().unwrap();
        assert!(text.contains(
            r#"kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family="IPv4"} 1"#
        ));
        assert!(!text.contains("partial"));
        assert!(!text.contains("iptables_total"));
    }

    #[test]
    fn network_programming_since_uses_the_clock() {
        let (m, clock) = metrics(ProxyMode::Iptables);
        let trigger = clock.now();
        clock.advance(Duration::from_millis(1500));
        m.network_programming_since(IpFamily::V4, trigger);
        m.network_programming(IpFamily::V4, f64::NAN);
        let text = m.encode().unwrap();
        assert!(
            text.contains(
                r#"kubeproxy_network_programming_duration_seconds_sum{ip_family="IPv4"} 1.5"#
            ),
            "{text}"
        );
        assert!(text.contains(
            r#"kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"} 1"#
        ));
    }

    #[test]
    fn api_server_metrics_only_with_an_api_source() {
        let plain = Metrics::new(ProxyMode::Iptables);
        plain.api_server_connected(false);
        assert!(!plain.encode().unwrap().contains("kube_proxy_rs_api_server"));

        let m = Metrics::with_api_source(ProxyMode::Iptables);
        let value = |name: &str| {
            let text = m.encode().unwrap();
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")).map(str::to_owned))
                .unwrap_or_else(|| panic!("no {name} in\n{text}"))
        };
        assert_eq!(value("kube_proxy_rs_api_server_connected"), "0");
        m.api_server_connected(true);
        assert_eq!(value("kube_proxy_rs_api_server_connected"), "1");
        assert_eq!(value("kube_proxy_rs_api_server_disconnects_total"), "0");
        m.api_server_connected(false);
        m.api_server_connected(false);
        assert_eq!(value("kube_proxy_rs_api_server_connected"), "0");
        assert_eq!(value("kube_proxy_rs_api_server_disconnects_total"), "1");
        m.api_server_connected(true);
        m.api_server_connected(false);
        assert_eq!(value("kube_proxy_rs_api_server_disconnects_total"), "2");
    }

    #[test]
    fn component_base_metrics_are_exposed_like_upstreams() {
        let m = Metrics::new(ProxyMode::Nftables);
        m.rest_client_request("GET", "10.96.0.1:443", Some(200), Duration::from_millis(20));
        m.rest_client_request("GET", "10.96.0.1:443", Some(200), Duration::from_millis(3));
        m.rest_client_request("POST", "10.96.0.1:443", None, Duration::from_secs(2));
        m.set_build_info(&BuildInfo {
            major: "1".into(),
            minor: "35".into(),
            git_version: "v1.35.0".into(),
            compiler: "rustc".into(),
            platform: "linux/amd64".into(),
            ..BuildInfo::default()
        });
        let text = m.encode().unwrap();
        for line in [
            "# HELP rest_client_requests_total [ALPHA] Number of HTTP requests, partitioned by status code, method, and host.",
            "# TYPE rest_client_requests_total counter",
            r#"rest_client_requests_total{code="200",host="10.96.0.1:443",method="GET"} 2"#,
            r#"rest_client_requests_total{code="<error>",host="10.96.0.1:443",method="POST"} 1"#,
            "# TYPE rest_client_request_duration_seconds histogram",
            r#"rest_client_request_duration_seconds_bucket{host="10.96.0.1:443",verb="GET",le="0.005"} 1"#,
            r#"rest_client_request_duration_seconds_bucket{host="10.96.0.1:443",verb="GET",le="0.025"} 2"#,
            r#"rest_client_request_duration_seconds_bucket{host="10.96.0.1:443",verb="POST",le="1"} 0"#,
            r#"rest_client_request_duration_seconds_bucket{host="10.96.0.1:443",verb="POST",le="60"} 1"#,
            r#"rest_client_request_duration_seconds_count{host="10.96.0.1:443",verb="POST"} 1"#,
            "# TYPE kubernetes_build_info gauge",
            r#"kubernetes_build_info{build_date="",compiler="rustc",git_commit="",git_tree_state="",git_version="v1.35.0",go_version="",major="1",minor="35",platform="linux/amd64"} 1"#,
            "# TYPE process_cpu_seconds_total counter",
            "# HELP process_resident_memory_bytes Resident memory size in bytes.",
            "# TYPE process_resident_memory_bytes gauge",
            "# TYPE process_open_fds gauge",
            "# TYPE process_start_time_seconds gauge",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        let rest_buckets = text
            .lines()
            .filter(|l| l.starts_with("rest_client_request_duration_seconds_bucket{host=\"10.96.0.1:443\",verb=\"GET\""))
            .count();
        assert_eq!(rest_buckets, 13, "12 buckets + +Inf");
        let rss: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
            .unwrap()
            .parse()
            .unwrap();
        assert!(rss > 1e6, "{rss}");
    }

    #[test]
    fn configz_serves_the_configuration_under_its_group() {
        let m = Metrics::new(ProxyMode::Iptables);
        assert_eq!(m.configz(), "{}");
        m.set_configz(
            "kubeproxy.config.k8s.io",
            serde_json::json!({"Mode": "iptables"}),
        );
        assert_eq!(
            m.configz(),
            r#"{"kubeproxy.config.k8s.io":{"Mode":"iptables"}}"#
        );
    }
}
