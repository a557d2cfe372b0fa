//! Service health checks: one HTTP listener per `healthCheckNodePort` (upstream
//! `pkg/proxy/healthcheck/service_health.go`, `ServiceHealthServer`).
//!
//! A Service with `externalTrafficPolicy: Local` and type LoadBalancer gets a
//! `healthCheckNodePort`; the cloud load balancer probes it on every node and sends traffic
//! only to nodes that answer 200. Each listener answers any path and method:
//!
//! - 200 when the Service has at least one ready local endpoint **and** the proxy is healthy
//!   ([`ProxyHealth::is_healthy`]), else 503;
//! - headers `Content-Type: application/json`, `X-Content-Type-Options: nosniff` and
//!   `X-Load-Balancing-Endpoint-Weight: <localEndpoints>`;
//! - body, byte for byte as upstream: indented with tabs (shown as spaces here), no trailing
//!   newline:
//!
//! ```text
//! {
//!     "service": {
//!         "namespace": "default",
//!         "name": "web"
//!     },
//!     "localEndpoints": 2,
//!     "serviceProxyHealthy": true
//! }
//! ```
//!
//! [`ServiceHealthServer::sync_services`] opens and closes listeners; a port that cannot be
//! bound is logged (upstream also emits the event `FailedToStartServiceHealthcheck`), returned
//! to the caller as a [`ListenFailure`], and tried again on the next call. It is never fatal.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use kp_model::NamespacedName;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tracing::{debug, error, info, warn};

use crate::AdminError;
use crate::listen::listen;
use crate::proxy_health::ProxyHealth;

/// The header telling the load balancer how many local endpoints this node has.
pub const ENDPOINT_WEIGHT_HEADER: &str = "x-load-balancing-endpoint-weight";

/// Where the health-check ports listen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthCheckAddresses {
    /// Every address of the node (`--nodeport-addresses` unset): one wildcard socket,
    /// dual-stack where the host has IPv6 (upstream listens on `0.0.0.0`, which Go opens as
    /// `[::]`).
    All,
    /// Exactly these node IPs (those matching `--nodeport-addresses`). An empty list opens no
    /// socket at all, as upstream.
    Ips(Vec<IpAddr>),
}

/// A health-check port that could not be opened in [`ServiceHealthServer::sync_services`].
#[derive(Debug)]
pub struct ListenFailure {
    /// The Service.
    pub service: NamespacedName,
    /// Its `healthCheckNodePort`.
    pub port: u16,
    /// Why (usually [`AdminError::Bind`] with `EADDRINUSE`).
    pub error: AdminError,
}

/// The set of per-Service health-check listeners.
#[derive(Debug)]
pub struct ServiceHealthServer {
    node_name: String,
    ips: Vec<IpAddr>,
    runtime: Handle,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    health: ProxyHealth,
    services: Mutex<HashMap<NamespacedName, Instance>>,
}

impl Shared {
    fn services(&self) -> MutexGuard<'_, HashMap<NamespacedName, Instance>> {
        self.services.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Debug)]
struct Instance {
    port: u16,
    endpoints: usize,
    listeners: Vec<Listener>,
}

/// One serving socket; dropping it stops the server (like Go's `server.Close()`).
#[derive(Debug)]
struct Listener {
    local: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ServiceHealthServer {
    /// A server for node `node_name` (used in log messages) listening on `addresses`,
    /// reporting `health`'s proxy health. Listeners run on the current Tokio runtime, so
    /// [`sync_services`](Self::sync_services) may then be called from any thread.
    ///
    /// # Errors
    /// [`AdminError::NoRuntime`] when called outside a Tokio runtime.
    pub fn new(
        node_name: impl Into<String>,
        addresses: HealthCheckAddresses,
        health: ProxyHealth,
    ) -> Result<Self, AdminError> {
        let runtime = Handle::try_current().map_err(|e| AdminError::NoRuntime(e.to_string()))?;
        let ips = match addresses {
            HealthCheckAddresses::All => vec![IpAddr::V4(Ipv4Addr::UNSPECIFIED)],
            HealthCheckAddresses::Ips(ips) => ips,
        };
        Ok(ServiceHealthServer {
            node_name: node_name.into(),
            ips,
            runtime,
            shared: Arc::new(Shared {
                health,
                services: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// Makes `services` (Service → `healthCheckNodePort`) the active set: listeners of
    /// Services no longer present, or whose port changed, are closed; new ones are opened;
    /// unchanged ones are left alone (keeping their endpoint count). Returns the ports that
    /// could not be opened (already logged); they are retried on the next call.
    pub fn sync_services(&self, services: &BTreeMap<NamespacedName, u16>) -> Vec<ListenFailure> {
        let _runtime = self.runtime.enter();
        let mut active = self.shared.services();
        active.retain(|name, instance| {
            let keep = services.get(name) == Some(&instance.port);
            if !keep {
                info!(service = %name, port = instance.port, "closing healthcheck");
            }
            keep
        });
        let mut failures = Vec::new();
        for (name, &port) in services {
            if active.contains_key(name) {
                debug!(service = %name, port, "existing healthcheck");
                continue;
            }
            info!(service = %name, port, "opening healthcheck");
            match self.open(name, port) {
                Ok(listeners) => {
                    active.insert(
                        name.clone(),
                        Instance {
                            port,
                            endpoints: 0,
                            listeners,
                        },
                    );
                }
                Err(error) => {
                    error!(
                        reason = "FailedToStartServiceHealthcheck",
                        node = %self.node_name,
                        service = %name,
                        port,
                        error = %error,
                        "failed to start healthcheck; retrying on the next sync"
                    );
                    failures.push(ListenFailure {
                        service: name.clone(),
                        port,
                        error,
                    });
                }
            }
        }
        failures
    }

    /// Sets the number of ready local endpoint IPs per Service. Services not listed get 0;
    /// entries for Services without a listener are ignored (upstream `SyncEndpoints`).
    pub fn sync_endpoints(&self, endpoints: &BTreeMap<NamespacedName, usize>) {
        let mut active = self.shared.services();
        for (name, instance) in active.iter_mut() {
            instance.endpoints = endpoints.get(name).copied().unwrap_or(0);
            debug!(service = %name, endpoints = instance.endpoints, "reporting endpoints for healthcheck");
        }
    }

    /// The Services with an open listener and their ports.
    pub fn services(&self) -> BTreeMap<NamespacedName, u16> {
        self.shared
            .services()
            .iter()
            .map(|(name, instance)| (name.clone(), instance.port))
            .collect()
    }

    /// The bound addresses of `service`'s listeners (empty when it has none); with port 0
    /// they carry the ephemeral port actually bound.
    pub fn local_addrs(&self, service: &NamespacedName) -> Vec<SocketAddr> {
        self.shared
            .services()
            .get(service)
            .map(|i| i.listeners.iter().map(|l| l.local).collect())
            .unwrap_or_default()
    }

    /// Opens `port` on every address; on any failure closes what was opened (so the port
    /// can be retried cleanly) and returns the error.
    fn open(&self, name: &NamespacedName, port: u16) -> Result<Vec<Listener>, AdminError> {
        let mut listeners = Vec::with_capacity(self.ips.len());
        for &ip in &self.ips {
            let listener = listen(SocketAddr::new(ip, port))?; // drops (closes) `listeners`
            let local = listener.local_addr().unwrap_or(SocketAddr::new(ip, port));
            let router = Router::new()
                .fallback(service_handler)
                .with_state(ServiceState {
                    shared: Arc::downgrade(&self.shared),
                    name: name.clone(),
                });
            let service = name.clone();
            let task = self.runtime.spawn(async move {
                debug!(service = %service, address = %local, "healthcheck serving");
                if let Err(e) = axum::serve(listener, router).await {
                    error!(service = %service, address = %local, error = %e, "healthcheck closed");
                }
            });
            listeners.push(Listener { local, task });
        }
        Ok(listeners)
    }
}

#[derive(Clone)]
struct ServiceState {
    shared: Weak<Shared>,
    name: NamespacedName,
}

async fn service_handler(State(s): State<ServiceState>) -> Response {
    let Some(shared) = s.shared.upgrade() else {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    let count = shared.services().get(&s.name).map(|i| i.endpoints);
    let Some(count) = count else {
        // A request racing with the listener's close. Upstream writes nothing (an empty 200);
        // 503 is the safer answer for a load balancer.
        warn!(service = %s.name, "received request for closed healthcheck");
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    let proxy_healthy = shared.health.is_healthy();
    let code = if count != 0 && proxy_healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut response = (code, service_body(&s.name, count, proxy_healthy)).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        HeaderName::from_static(ENDPOINT_WEIGHT_HEADER),
        HeaderValue::from(count),
    );
    response
}

/// Upstream's body: tab-indented JSON without a trailing newline.
fn service_body(name: &NamespacedName, count: usize, proxy_healthy: bool) -> String {
    let quote = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\""));
    format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {},\n\t\t\"name\": {}\n\t}},\n\t\"localEndpoints\": {count},\n\t\"serviceProxyHealthy\": {proxy_healthy}\n}}",
        quote(&name.namespace),
        quote(&name.name),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_is_upstreams_dedented_template() {
        assert_eq!(
            service_body(&NamespacedName::new("default", "web"), 2, true),
            "{\n\t\"service\": {\n\t\t\"namespace\": \"default\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
        );
    }

    #[test]
    fn needs_a_runtime() {
        let health = ProxyHealth::new(std::time::Duration::from_secs(60));
        assert!(matches!(
            ServiceHealthServer::new("n", HealthCheckAddresses::All, health),
            Err(AdminError::NoRuntime(_))
        ));
    }
}
