//! Health, metrics and health-check servers, fed by the sync loops.
//!
//! [`Admin`] holds upstream's three HTTP surfaces: `/healthz` and `/livez`
//! (`--healthz-bind-address`, with our `/readyz` beside them: 200 once every family's first
//! sync is done), `/metrics` (`--metrics-bind-address`), and one server per
//! `healthCheckNodePort` for Services with `externalTrafficPolicy: Local`. [`Observer`]
//! implements the sync loop's [`SyncObserver`] and reports to them, the way upstream's
//! proxiers call `QueuedUpdate`/`Updated`, observe the sync histograms and call
//! `SyncServices`/`SyncEndpoints` after every successful sync.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use kp_admin::{
    AdminServer, HealthCheckAddresses, Metrics, ProxyHealth, Readiness, ServeOptions,
    ServiceHealthServer, TrafficPolicy, health_timeout, metrics_server, parse_bind_address,
    proxy_health_router, readiness_router,
};
use kp_model::{Changes, IpFamily, NamespacedName, Node, Snapshot};
use kp_proxier::{ProxierError, SyncReport};
use kp_runtime::{PendingChanges, SyncObserver};
use tracing::warn;

/// The Kubernetes release whose kube-proxy this one mirrors (flags, configuration, rules,
/// metrics; the `v1_35` API of k8s-openapi): `kubernetes_build_info`'s `major`/`minor`.
pub const KUBERNETES_RELEASE: (&str, &str) = ("1", "35");

/// `kubernetes_build_info`'s labels for this binary: `git_version`
/// `v1.35.0+kube-proxy-rs.<version>` (the mirrored release, so that alerts comparing the
/// components' major.minor, as kubernetes-mixin's `KubeVersionMismatch`, see one release,
/// and this program's own version as semver build metadata), `compiler` `rustc`, `go_version`
/// the rustc version, `platform` `linux/<GOARCH>`; the commit, tree state and build date
/// as the build set them (see `build.rs`).
pub fn build_info() -> kp_admin::BuildInfo {
    let (major, minor) = KUBERNETES_RELEASE;
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    };
    kp_admin::BuildInfo {
        major: major.into(),
        minor: minor.into(),
        git_version: format!(
            "v{major}.{minor}.0+kube-proxy-rs.{}",
            env!("CARGO_PKG_VERSION")
        ),
        git_commit: env!("KP_GIT_COMMIT").into(),
        git_tree_state: env!("KP_GIT_TREE_STATE").into(),
        build_date: env!("KP_BUILD_DATE").into(),
        go_version: format!("rustc{}", env!("KP_RUSTC_VERSION")),
        compiler: "rustc".into(),
        platform: format!("{}/{arch}", std::env::consts::OS),
    }
}

/// The shared health and metrics state of the process.
#[derive(Clone)]
pub struct Admin {
    /// Proxy health (`/healthz`, `/livez`).
    pub health: ProxyHealth,
    /// The `kubeproxy_*` metrics.
    pub metrics: Metrics,
    /// Per-Service health-check servers; `None` in one-shot runs.
    pub service_health: Option<Arc<ServiceHealthServer>>,
    /// Where events are posted; `None` without an API server (`--manifests`) and in
    /// one-shot runs.
    pub events: Option<crate::events::Events>,
    /// The node name (in the events' notes).
    pub node: String,
    /// `/readyz`: every family's first sync done.
    pub readiness: Readiness,
}

impl Admin {
    /// State for `mode` with health timeout 2 × `sync_period`, as upstream; `api_source`
    /// when the objects come from the API server (adds its connectivity metrics); ready once
    /// each of `families` has synced.
    pub fn new(
        mode: kp_admin::ProxyMode,
        sync_period: Duration,
        api_source: bool,
        families: &[IpFamily],
    ) -> Self {
        Admin {
            health: ProxyHealth::new(health_timeout(sync_period)),
            metrics: if api_source {
                Metrics::with_api_source(mode)
            } else {
                Metrics::new(mode)
            },
            service_health: None,
            events: None,
            node: String::new(),
            readiness: Readiness::new(families.iter().copied()),
        }
    }

    /// Starts the healthz and metrics servers (each unless its address is empty) and the
    /// health-check-server manager; must run inside the Tokio runtime. The servers stop when
    /// `shutdown` resolves.
    ///
    /// # Errors
    /// An invalid bind address.
    pub fn start(
        &mut self,
        args: &crate::cli::ProxyArgs,
        node: &str,
        hc_addresses: HealthCheckAddresses,
        tasks: &mut tokio::task::JoinSet<anyhow::Result<()>>,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> anyhow::Result<()> {
        let (healthz, metrics, hard_fail) = (
            args.healthz_bind_address.as_str(),
            args.metrics_bind_address.as_str(),
            args.bind_address_hard_fail,
        );
        let wait = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        if let Some(addr) = parse_bind_address(healthz, kp_admin::DEFAULT_HEALTHZ_PORT)
            .context("--healthz-bind-address")?
        {
            // Upstream's /healthz and /livez, and our /readyz.
            let server = AdminServer::new(
                "healthz",
                ServeOptions {
                    hard_fail,
                    ..ServeOptions::new(addr)
                },
                proxy_health_router(self.health.clone(), self.metrics.clone())
                    .merge(readiness_router(self.readiness.clone())),
            );
            let stop = wait(shutdown.clone());
            tasks.spawn(async move { server.run(stop).await.context("healthz server") });
        }
        if let Some(addr) = parse_bind_address(metrics, kp_admin::DEFAULT_METRICS_PORT)
            .context("--metrics-bind-address")?
        {
            let server = metrics_server(
                ServeOptions {
                    hard_fail,
                    ..ServeOptions::new(addr)
                },
                self.metrics.clone(),
            );
            let stop = wait(shutdown);
            tasks.spawn(async move { server.run(stop).await.context("metrics server") });
        }
        self.service_health = Some(Arc::new(
            ServiceHealthServer::new(node, hc_addresses, self.health.clone())
                .context("health-check servers")?,
        ));
        Ok(())
    }
}

/// The sync loop's observer for one family. Only the primary family drives the
/// health-check servers (both families see the same Services).
pub struct Observer {
    admin: Admin,
    primary: bool,
    /// When the proxy started: trigger times before it are not observed (upstream ignores
    /// changes from before its tracker started, e.g. the initial list).
    started: SystemTime,
}

impl Observer {
    /// An observer reporting to `admin`; `primary` for the family that drives the
    /// health-check servers.
    pub fn new(admin: Admin, primary: bool) -> Self {
        Observer {
            admin,
            primary,
            started: SystemTime::now(),
        }
    }
}

/// Health-check ports and the number of distinct ready local endpoint IPs of the Services
/// with `externalTrafficPolicy: Local` (upstream counts ready, not terminating, endpoints).
fn health_checks(
    snap: &Snapshot,
) -> (
    BTreeMap<NamespacedName, u16>,
    BTreeMap<NamespacedName, usize>,
) {
    let mut ports = BTreeMap::new();
    let mut local: BTreeMap<NamespacedName, BTreeSet<std::net::IpAddr>> = BTreeMap::new();
    for (spn, svc) in &snap.services {
        let Some(port) = svc.health_check_node_port else {
            continue;
        };
        ports.insert(spn.service.clone(), port);
        let ips = local.entry(spn.service.clone()).or_default();
        ips.extend(
            snap.endpoints_of(spn)
                .iter()
                .filter(|e| e.is_local && e.ready)
                .map(|e| e.ip),
        );
    }
    (
        ports,
        local.into_iter().map(|(k, v)| (k, v.len())).collect(),
    )
}

/// Services whose Local policy has no local endpoint, per policy (the
/// `sync_proxy_rules_no_local_endpoints_total` gauge).
fn no_local_endpoints(snap: &Snapshot) -> (usize, usize) {
    let (mut internal, mut external) = (0, 0);
    for (spn, svc) in &snap.services {
        let eps = kp_track::categorize(
            svc,
            snap.endpoints_of(spn),
            &snap.node_name,
            &snap.node_labels,
        );
        if eps.has_any && eps.local.is_empty() {
            internal += usize::from(svc.internal_policy_local);
            external += usize::from(svc.external_policy_local);
        }
    }
    (internal, external)
}

impl SyncObserver for Observer {
    fn started(&self, family: IpFamily) {
        self.admin.health.updated(family);
    }

    fn queued(&self, family: IpFamily, pending: PendingChanges) {
        self.admin.health.queued_update(family);
        self.admin.metrics.sync_queued(family);
        // The change metrics have no family label: every family's loop sees the same
        // objects, so the primary one reports them.
        if self.primary {
            self.admin
                .metrics
                .changes_pending(pending.services, pending.endpoints);
        }
    }

    fn node_changed(&self, _family: IpFamily, node: Option<&Node>) {
        // Upstream's NodeEligibleHandler: every Node event updates /healthz at once. A deleted
        // Node is not eligible (upstream's NodeEligible: the Node exists, is not being
        // deleted, has no ToBeDeletedByClusterAutoscaler taint).
        match node {
            Some(node) => self.admin.health.sync_node(node),
            None => self.admin.health.node_eligible(false),
        }
    }

    fn received(&self, _family: IpFamily, services: u64, endpoint_slices: u64) {
        if self.primary {
            self.admin.metrics.changes_seen(services, endpoint_slices);
        }
    }

    fn synced(
        &self,
        family: IpFamily,
        result: &Result<SyncReport, ProxierError>,
        duration: Duration,
        snapshot: &Snapshot,
        changes: &Changes,
        node: Option<&Node>,
    ) {
        let m = &self.admin.metrics;
        let full = result.as_ref().map(|r| r.full).unwrap_or(true);
        m.observe_sync(family, full, duration, result.is_ok());
        if self.primary {
            m.changes_pending(0, 0);
        }
        if let Some(node) = node {
            self.admin.health.sync_node(node);
        }
        let Ok(report) = result else { return };
        self.admin.health.updated(family);
        self.admin.readiness.synced(family);
        m.rules_total(family, "filter", report.filter_rules);
        m.rules_total(family, "nat", report.nat_rules);
        // Upstream: `..._iptables_total` the rules in the table, `..._iptables_last` the rules
        // this sync wrote (fewer than the total after a partial sync).
        m.rules_last(family, "filter", report.filter_rules_written);
        m.rules_last(family, "nat", report.nat_rules_written);
        if let Some(took) = report.conntrack_time {
            m.conntrack_reconciled(family, took, report.conntrack_deleted as u64);
        }
        let (internal, external) = no_local_endpoints(snapshot);
        m.no_local_endpoints(family, TrafficPolicy::Internal, internal);
        m.no_local_endpoints(family, TrafficPolicy::External, external);
        for t in &changes.trigger_times {
            match humantime::parse_rfc3339_weak(t) {
                Ok(when) if when >= self.started => m.network_programming_since(family, when),
                Ok(_) => {}
                Err(e) => {
                    warn!("ignoring endpoints.kubernetes.io/last-change-trigger-time {t:?}: {e}")
                }
            }
        }
        if self.primary
            && let Some(server) = &self.admin.service_health
        {
            let (ports, local) = health_checks(snapshot);
            for failure in server.sync_services(&ports) {
                warn!(service = %failure.service, port = failure.port, error = %failure.error, "cannot serve a health check node port; retrying at the next sync");
                if let Some(events) = &self.admin.events {
                    events.post(
                        true,
                        "FailedToStartServiceHealthcheck",
                        "Listen",
                        Some(format!(
                            "node {} failed to start healthcheck \"{}\" on port {}: {}",
                            self.admin.node, failure.service, failure.port, failure.error
                        )),
                        crate::events::Events::service_ref(&failure.service),
                    );
                }
            }
            server.sync_endpoints(&local);
        }
    }
}
