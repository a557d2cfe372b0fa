//! kp-admin: kube-proxy's administrative HTTP surface.
//!
//! Three servers, each mirroring upstream kube-proxy (`pkg/proxy/healthcheck`,
//! `pkg/proxy/metrics`, `cmd/kube-proxy/app/server.go`):
//!
//! - **Proxy health** ([`ProxyHealth`], [`proxy_health_server`]): `/healthz` and `/livez` on
//!   `--healthz-bind-address` (default `0.0.0.0:10256`). The sync loops report
//!   [`ProxyHealth::queued_update`] / [`ProxyHealth::updated`] per IP family; a family whose
//!   queued update waited at least the health timeout (2 × `--iptables-sync-period`) is
//!   unhealthy.
//! - **Readiness** ([`Readiness`], [`readiness_router`]): `/readyz` on the same server, 200
//!   once every family has completed its first sync (ours: upstream has no readiness
//!   endpoint, and its `/healthz` is 200 before the first sync). The DaemonSet's readiness
//!   probe, so a rolling update waits for each node's rules.
//! - **Service health checks** ([`ServiceHealthServer`]): one listener per
//!   `healthCheckNodePort` (Services with `externalTrafficPolicy: Local`), answering 200 while
//!   the node has ready local endpoints and the proxy is healthy, else 503.
//! - **Metrics** ([`Metrics`], [`metrics_server`]): upstream's `kubeproxy_*` metrics and
//!   component-base's (process, `rest_client_*`, `kubernetes_build_info`) on `/metrics`, plus
//!   `/healthz`, `/proxyMode` and `/configz`, on `--metrics-bind-address`
//!   (default `127.0.0.1:10249`); in userspace mode also the proxy sockets' numbers
//!   ([`userspace`]) and the proxy table on `/userspace`; in iptables mode also upstream's two
//!   nfacct counters ([`nfacct`]).
//!
//! This crate knows nothing of the proxier or the sync loop: the binary connects them through
//! the handles here. Time comes from an injected [`Clock`] ([`TokioClock`] by default), so
//! tests run with paused Tokio time.

pub mod clock;
pub mod listen;
pub mod metrics;
pub mod nfacct;
pub mod process;
pub mod proxy_health;
pub mod readiness;
pub mod server;
pub mod service_health;
pub mod userspace;

pub use clock::{Clock, ManualClock, SharedClock, TokioClock, go_time_string};
pub use listen::parse_bind_address;
pub use metrics::{
    BuildInfo, DEFAULT_METRICS_PORT, Metrics, ProxyMode, TrafficPolicy, metrics_router,
    metrics_server,
};
pub use nfacct::{NfacctPackets, NfacctReader};
pub use proxy_health::{
    DEFAULT_HEALTHZ_PORT, FamilyHealth, HealthReply, HealthStatus, ProxyHealth,
    TO_BE_DELETED_TAINT, health_timeout, proxy_health_router, proxy_health_server,
};
pub use readiness::{Readiness, readiness_router};
pub use server::{AdminServer, BoundServer, ServeOptions};
pub use service_health::{HealthCheckAddresses, ListenFailure, ServiceHealthServer};
pub use userspace::{UserspaceListenerStats, UserspaceStats};

use std::net::SocketAddr;

/// Errors of this crate.
///
/// Only [`AdminError::Bind`] (with `--bind-address-hard-fail`) and the construction errors
/// are meant to be fatal; the servers otherwise log and retry, as upstream does.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// A listening socket could not be created or bound (address in use, permission, no such
    /// local address).
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A server stopped with an I/O error after it was listening.
    #[error("the {server} server on {addr} failed: {source}")]
    Serve {
        /// Which server (`healthz`, `metrics`).
        server: &'static str,
        /// Its address.
        addr: SocketAddr,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A `--*-bind-address` value that is neither empty, an IP, nor `IP:port`.
    #[error("invalid bind address {value:?}: {reason}")]
    InvalidAddress {
        /// The flag value.
        value: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A server or listener was created outside a Tokio runtime.
    #[error("no Tokio runtime to run the servers on: {0}")]
    NoRuntime(String),
    /// The metrics could not be encoded in the text format.
    #[error("cannot encode the metrics: {0}")]
    Encode(String),
}
