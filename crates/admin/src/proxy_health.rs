//! The proxy's own health: state shared with the sync loops, and the `/healthz` + `/livez`
//! server (upstream `pkg/proxy/healthcheck/proxy_health.go`, `ProxyHealthServer`).
//!
//! Per IP family the state keeps the time of the last successful sync (`updated`) and the
//! time of the oldest update queued since then (`queued_update`). A family is **unhealthy**
//! when a queued update has waited at least the health timeout (2 × `--iptables-sync-period`,
//! 60 s by default) without an `updated`. Only families that called `updated` at least once
//! are judged, exactly as upstream, whose sync loop calls `Updated(family)` when it starts:
//! the binary must do the same, so that a family is healthy during start-up.
//!
//! `/livez` is 200 when every family is healthy, else 503. `/healthz` additionally requires
//! the node to be eligible (not being deleted, no `ToBeDeletedByClusterAutoscaler` taint).
//! Both answer JSON as upstream's `json.Marshal(ProxyHealth)`:
//!
//! ```json
//! {"lastUpdated":"2026-07-21T10:00:30Z","currentTime":"2026-07-21T10:00:30Z","nodeEligible":true,"healthy":true,"status":{"IPv4":{"lastUpdated":"2026-07-21T10:00:00Z","healthy":true}}}
//! ```
//!
//! (`nodeEligible` only on `/healthz`; `status` left out while no family has synced;
//! top-level `lastUpdated` is the current time when healthy, for backward compatibility, else
//! the latest family's `lastUpdated`.) Every answer counts in
//! `kubeproxy_proxy_healthz_total{code}` / `kubeproxy_proxy_livez_total{code}`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use kp_model::{IpFamily, Node};
use serde::Serialize;

use crate::clock::{SharedClock, TokioClock, go_time_string};
use crate::metrics::Metrics;
use crate::server::{AdminServer, ServeOptions};

/// The taint the Cluster Autoscaler puts on a node it is about to delete.
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// Upstream's default `--healthz-bind-address` port.
pub const DEFAULT_HEALTHZ_PORT: u16 = 10256;

/// The health timeout for a sync period: 2 × `sync_period` (upstream
/// `NewProxyHealthServer(addr, 2*config.SyncPeriod.Duration)`; 60 s for the default 30 s).
pub fn health_timeout(sync_period: Duration) -> Duration {
    sync_period.saturating_mul(2)
}

#[derive(Debug)]
struct Inner {
    clock: SharedClock,
    timeout: Duration,
    state: Mutex<Tracked>,
}

#[derive(Debug)]
struct Tracked {
    last_updated: BTreeMap<IpFamily, SystemTime>,
    oldest_queued: BTreeMap<IpFamily, SystemTime>,
    node_eligible: bool,
}

/// The proxy health state, shared (cheaply cloned) between the sync loops and the servers.
#[derive(Debug, Clone)]
pub struct ProxyHealth {
    inner: Arc<Inner>,
}

/// One family's health, as in upstream's `ProxierHealth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FamilyHealth {
    /// The last successful sync of this family.
    pub last_updated: SystemTime,
    /// Whether no queued update has waited for the health timeout or longer.
    pub healthy: bool,
}

/// A snapshot of the proxy's health (upstream `ProxyHealth`, without the node).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthStatus {
    /// The latest `last_updated` of any family; `None` (Go's zero time) before the first.
    pub last_updated: Option<SystemTime>,
    /// The clock's time when the snapshot was taken.
    pub current_time: SystemTime,
    /// All families healthy.
    pub healthy: bool,
    /// Per family, for families that have synced at least once.
    pub families: BTreeMap<IpFamily, FamilyHealth>,
}

/// An answer of `/healthz` or `/livez`: status code and JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthReply {
    /// 200 or 503.
    pub code: u16,
    /// The JSON body (compact, fields in upstream's order).
    pub body: String,
}

impl ProxyHealth {
    /// A state with health timeout `timeout` on a [`TokioClock`]; the node starts eligible.
    pub fn new(timeout: Duration) -> Self {
        Self::with_clock(timeout, Arc::new(TokioClock::new()))
    }

    /// A state reading time from `clock`.
    pub fn with_clock(timeout: Duration, clock: SharedClock) -> Self {
        ProxyHealth {
            inner: Arc::new(Inner {
                clock,
                timeout,
                state: Mutex::new(Tracked {
                    last_updated: BTreeMap::new(),
                    oldest_queued: BTreeMap::new(),
                    // Eligible while starting up, until a Node event says otherwise (as
                    // upstream's `nodeEligible: true` default).
                    node_eligible: true,
                }),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, Tracked> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The health timeout.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// The clock this state reads.
    pub fn clock(&self) -> SharedClock {
        Arc::clone(&self.inner.clock)
    }

    /// A change for `family` was received and awaits a sync. Records the time only if no
    /// queued update is pending already, so the oldest one counts (upstream `QueuedUpdate`).
    pub fn queued_update(&self, family: IpFamily) {
        let now = self.inner.clock.now();
        self.state().oldest_queued.entry(family).or_insert(now);
    }

    /// `family` synced successfully: clears its pending update and records the time
    /// (upstream `Updated`). Call it also when the family's sync loop starts.
    pub fn updated(&self, family: IpFamily) {
        let now = self.inner.clock.now();
        let mut state = self.state();
        state.oldest_queued.remove(&family);
        state.last_updated.insert(family, now);
    }

    /// Sets whether this node is eligible for traffic: `false` while the Node is being
    /// deleted or carries the [`TO_BE_DELETED_TAINT`] taint. Only `/healthz` looks at it.
    pub fn node_eligible(&self, eligible: bool) {
        self.state().node_eligible = eligible;
    }

    /// Derives eligibility from the Node object (upstream `SyncNode` / `NodeEligible`).
    pub fn sync_node(&self, node: &Node) {
        self.node_eligible(!node.deleting && !node.to_be_deleted_taint);
    }

    /// Whether the node is eligible.
    pub fn is_node_eligible(&self) -> bool {
        self.state().node_eligible
    }

    /// The health of every family (upstream `Health()`).
    pub fn health(&self) -> HealthStatus {
        let current_time = self.inner.clock.now();
        let state = self.state();
        let mut status = HealthStatus {
            last_updated: state.last_updated.values().max().copied(),
            current_time,
            healthy: true,
            families: BTreeMap::new(),
        };
        for (&family, &last_updated) in &state.last_updated {
            let late = state.oldest_queued.get(&family).is_some_and(|&queued| {
                current_time
                    .duration_since(queued)
                    .unwrap_or(Duration::ZERO)
                    >= self.inner.timeout
            });
            status.healthy &= !late;
            status.families.insert(
                family,
                FamilyHealth {
                    last_updated,
                    healthy: !late,
                },
            );
        }
        status
    }

    /// Whether every family is healthy, ignoring the node (upstream `IsHealthy`; what the
    /// service health checks report as `serviceProxyHealthy`).
    pub fn is_healthy(&self) -> bool {
        self.health().healthy
    }

    /// The `/healthz` answer: 200 when healthy and the node is eligible, else 503.
    pub fn healthz(&self) -> HealthReply {
        let health = self.health();
        let eligible = self.is_node_eligible();
        let healthy = health.healthy && eligible;
        self.reply(health, healthy, Some(eligible))
    }

    /// The `/livez` answer: 200 when healthy, else 503; no `nodeEligible` field.
    pub fn livez(&self) -> HealthReply {
        let health = self.health();
        let healthy = health.healthy;
        self.reply(health, healthy, None)
    }

    fn reply(
        &self,
        health: HealthStatus,
        healthy: bool,
        node_eligible: Option<bool>,
    ) -> HealthReply {
        // Backward compatibility: a healthy proxy reports "now" as lastUpdated.
        let last_updated = if healthy {
            Some(self.inner.clock.now())
        } else {
            health.last_updated
        };
        let body = HealthJson {
            last_updated: go_time_string(last_updated),
            current_time: go_time_string(Some(health.current_time)),
            node_eligible,
            healthy: health.healthy,
            status: health
                .families
                .iter()
                .map(|(family, h)| {
                    (
                        family.api_name(),
                        FamilyJson {
                            last_updated: go_time_string(Some(h.last_updated)),
                            healthy: h.healthy,
                        },
                    )
                })
                .collect(),
        };
        HealthReply {
            code: if healthy { 200 } else { 503 },
            body: serde_json::to_string(&body).unwrap_or_default(),
        }
    }
}

/// Upstream's `ProxyHealth` JSON, field order included.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct HealthJson {
    last_updated: String,
    current_time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    node_eligible: Option<bool>,
    healthy: bool,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    status: BTreeMap<&'static str, FamilyJson>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct FamilyJson {
    last_updated: String,
    healthy: bool,
}

#[derive(Clone)]
struct HealthState {
    health: ProxyHealth,
    metrics: Metrics,
}

/// The `/healthz` and `/livez` routes (any method, as Go's handlers), counting answers in
/// `metrics`. Other paths answer 404.
pub fn proxy_health_router(health: ProxyHealth, metrics: Metrics) -> Router {
    Router::new()
        .route("/healthz", any(healthz_handler))
        .route("/livez", any(livez_handler))
        .with_state(HealthState { health, metrics })
}

/// The proxy health server on `opts.addr` (`--healthz-bind-address`).
pub fn proxy_health_server(
    opts: ServeOptions,
    health: ProxyHealth,
    metrics: Metrics,
) -> AdminServer {
    AdminServer::new("healthz", opts, proxy_health_router(health, metrics))
}

async fn healthz_handler(State(s): State<HealthState>) -> Response {
    let reply = s.health.healthz();
    s.metrics.healthz_answered(reply.code);
    json_response(reply)
}

async fn livez_handler(State(s): State<HealthState>) -> Response {
    let reply = s.health.livez();
    s.metrics.livez_answered(reply.code);
    json_response(reply)
}

/// A JSON answer with upstream's headers.
pub(crate) fn json_response(reply: HealthReply) -> Response {
    let code = StatusCode::from_u16(reply.code).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let mut response = (code, reply.body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use std::time::UNIX_EPOCH;

    const T0: u64 = 1_784_628_000; // 2026-07-21T10:00:00Z

    #[tokio::test(start_paused = true)]
    async fn healthy_at_start_then_unhealthy_after_timeout_then_healthy_after_updated() {
        let health = ProxyHealth::new(health_timeout(Duration::from_secs(30)));
        assert_eq!(health.timeout(), Duration::from_secs(60));
        // Nothing synced yet: healthy, no families.
        assert!(health.is_healthy());
        assert!(health.health().families.is_empty());

        // The sync loop starts (Updated), then a change is queued.
        health.updated(IpFamily::V4);
        health.queued_update(IpFamily::V4);
        tokio::time::advance(Duration::from_secs(59)).await;
        assert!(health.is_healthy(), "not late yet");
        // A newer queued update does not reset the oldest one.
        health.queued_update(IpFamily::V4);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(!health.is_healthy(), "waited exactly the timeout");
        assert_eq!(health.livez().code, 503);
        assert_eq!(health.healthz().code, 503);

        health.updated(IpFamily::V4);
        assert!(health.is_healthy());
        assert_eq!(health.livez().code, 200);
        // Healthy with no pending update, however long it stays idle.
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert!(health.is_healthy());
    }

    #[tokio::test(start_paused = true)]
    async fn families_are_judged_separately() {
        let health = ProxyHealth::new(Duration::from_secs(60));
        health.updated(IpFamily::V4);
        health.updated(IpFamily::V6);
        health.queued_update(IpFamily::V6);
        tokio::time::advance(Duration::from_secs(30)).await;
        health.queued_update(IpFamily::V4);
        tokio::time::advance(Duration::from_secs(30)).await;
        let status = health.health();
        assert!(!status.healthy);
        assert!(status.families[&IpFamily::V4].healthy);
        assert!(!status.families[&IpFamily::V6].healthy);
        health.updated(IpFamily::V6);
        assert!(health.is_healthy());
        tokio::time::advance(Duration::from_secs(30)).await;
        let status = health.health();
        assert!(status.families[&IpFamily::V6].healthy);
        assert!(!status.families[&IpFamily::V4].healthy);
    }

    #[test]
    fn a_family_that_never_synced_is_not_judged() {
        // As upstream: only families present in lastUpdatedMap count.
        let clock = Arc::new(ManualClock::new(UNIX_EPOCH + Duration::from_secs(T0)));
        let health = ProxyHealth::with_clock(Duration::from_secs(60), clock.clone());
        health.queued_update(IpFamily::V4);
        clock.advance(Duration::from_secs(600));
        assert!(health.is_healthy());
    }

    #[test]
    fn healthz_requires_node_eligibility_livez_does_not() {
        let clock = Arc::new(ManualClock::new(UNIX_EPOCH + Duration::from_secs(T0)));
        let health = ProxyHealth::with_clock(Duration::from_secs(60), clock.clone());
        health.updated(IpFamily::V4);
        assert!(health.is_node_eligible());
        health.node_eligible(false);
        assert_eq!(health.healthz().code, 503);
        assert_eq!(health.livez().code, 200);
        assert!(health.is_healthy());
        health.sync_node(&Node {
            name: "n".into(),
            ..Node::default()
        });
        assert_eq!(health.healthz().code, 200);
        health.sync_node(&Node {
            to_be_deleted_taint: true,
            ..Node::default()
        });
        assert_eq!(health.healthz().code, 503);
        health.sync_node(&Node {
            deleting: true,
            ..Node::default()
        });
        assert!(!health.is_node_eligible());
    }

    #[test]
    fn json_bodies_match_upstream_byte_for_byte() {
        let clock = Arc::new(ManualClock::new(UNIX_EPOCH + Duration::from_secs(T0)));
        let health = ProxyHealth::with_clock(Duration::from_secs(60), clock.clone());
        // Before any sync: no status, lastUpdated = now because healthy.
        assert_eq!(
            health.livez().body,
            r#"{"lastUpdated":"2026-07-21T10:00:00Z","currentTime":"2026-07-21T10:00:00Z","healthy":true}"#
        );
        health.updated(IpFamily::V4);
        health.updated(IpFamily::V6);
        clock.advance(Duration::from_millis(30_250));
        assert_eq!(
            health.healthz().body,
            concat!(
                r#"{"lastUpdated":"2026-07-21T10:00:30.25Z","currentTime":"2026-07-21T10:00:30.25Z","#,
                r#""nodeEligible":true,"healthy":true,"status":{"#,
                r#""IPv4":{"lastUpdated":"2026-07-21T10:00:00Z","healthy":true},"#,
                r#""IPv6":{"lastUpdated":"2026-07-21T10:00:00Z","healthy":true}}}"#
            )
        );
        health.queued_update(IpFamily::V6);
        clock.advance(Duration::from_secs(60));
        let reply = health.healthz();
        assert_eq!(reply.code, 503);
        assert_eq!(
            reply.body,
            concat!(
                r#"{"lastUpdated":"2026-07-21T10:00:00Z","currentTime":"2026-07-21T10:01:30.25Z","#,
                r#""nodeEligible":true,"healthy":false,"status":{"#,
                r#""IPv4":{"lastUpdated":"2026-07-21T10:00:00Z","healthy":true},"#,
                r#""IPv6":{"lastUpdated":"2026-07-21T10:00:00Z","healthy":false}}}"#
            )
        );
        // Node ineligible and nothing synced: Go's zero time for lastUpdated.
        let fresh = ProxyHealth::with_clock(Duration::from_secs(60), clock);
        fresh.node_eligible(false);
        assert_eq!(
            fresh.healthz().body,
            r#"{"lastUpdated":"0001-01-01T00:00:00Z","currentTime":"2026-07-21T10:01:30.25Z","nodeEligible":false,"healthy":true}"#
        );
    }
}
