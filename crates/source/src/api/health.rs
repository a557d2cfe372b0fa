//! [`SourceHealth`]: whether the API source is connected, from what each kind's requests and
//! watch streams do.
//!
//! ServiceCIDRs are watched but not part of the summary: an API server older than 1.33 does
//! not serve `networking.k8s.io/v1` ServiceCIDRs (and a ClusterRole from before then does not
//! grant them), which only means that nftables mode does not drop traffic to unallocated
//! ClusterIPs. Their failures are logged on their own (once when they start, once when they
//! end), as upstream's informer logs its list errors without failing its health check.
//!
//! kube's watcher says when something failed but not when a retried watch has succeeded (a
//! re-established watch emits nothing until an object changes), so each kind's client is
//! wrapped ([`instrumented`]) to see every HTTP response: a `2xx` (or `410 Gone`, which is
//! part of the protocol) means the server is reachable for that kind; another status or a
//! transport error means it is not. The watcher's own errors (a broken stream, an `ERROR`
//! event) count as failures too, and every event it delivers as a success.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use kp_model::ObjectKind;
use kube::Client;
use tokio::sync::watch;
use tracing::{info, warn};

/// The API source's connection state, for health reporting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceHealth {
    /// Not every kind has had a successful request yet, and none has failed.
    Connecting,
    /// The last request (or watch event) of every kind succeeded.
    Connected,
    /// The last request of at least one kind failed: the proxy is not receiving changes of
    /// that kind and keeps programming what it has.
    Disconnected {
        /// When the oldest ongoing failure started.
        since: Instant,
        /// The latest error of that kind, e.g. `Service watch: failed to perform initial
        /// object list: ...` or `EndpointSlice: HTTP 503 Service Unavailable`.
        error: String,
    },
}

impl SourceHealth {
    /// Whether the source is [`SourceHealth::Connected`].
    pub fn is_connected(&self) -> bool {
        matches!(self, SourceHealth::Connected)
    }
}

/// One kind's last outcome.
#[derive(Debug, Clone)]
enum KindHealth {
    Unknown,
    Ok,
    Failed { since: Instant, error: String },
}

struct State {
    /// Services, EndpointSlices, Nodes (the summary), ServiceCIDRs (logged only).
    kinds: [KindHealth; 4],
}

/// The shared health of the three kinds, published on a watch channel.
#[derive(Clone)]
pub(crate) struct Health {
    state: Arc<Mutex<State>>,
    tx: watch::Sender<SourceHealth>,
}

fn index(kind: ObjectKind) -> usize {
    match kind {
        ObjectKind::Service => 0,
        ObjectKind::EndpointSlice => 1,
        ObjectKind::Node => 2,
        ObjectKind::ServiceCidr => 3,
    }
}

impl Health {
    pub(crate) fn new(tx: watch::Sender<SourceHealth>) -> Self {
        Health {
            state: Arc::new(Mutex::new(State {
                kinds: [
                    KindHealth::Unknown,
                    KindHealth::Unknown,
                    KindHealth::Unknown,
                    KindHealth::Unknown,
                ],
            })),
            tx,
        }
    }

    /// The recorder of one kind.
    pub(crate) fn probe(&self, kind: ObjectKind) -> Probe {
        Probe {
            health: self.clone(),
            kind,
        }
    }

    fn set(&self, kind: ObjectKind, outcome: Result<(), String>) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = &mut state.kinds[index(kind)];
        if kind == ObjectKind::ServiceCidr {
            service_cidr_transition(slot, outcome);
            return;
        }
        match (outcome, &*slot) {
            (Ok(()), KindHealth::Ok) => return,
            (Ok(()), KindHealth::Failed { .. }) => {
                info!(kind = ?kind, "API server reachable again");
                *slot = KindHealth::Ok;
            }
            (Ok(()), KindHealth::Unknown) => *slot = KindHealth::Ok,
            (Err(error), KindHealth::Failed { since, .. }) => {
                *slot = KindHealth::Failed {
                    since: *since,
                    error,
                };
            }
            (Err(error), _) => {
                warn!(kind = ?kind, %error, "API server unreachable; keeping the current rules and retrying");
                *slot = KindHealth::Failed {
                    since: Instant::now(),
                    error,
                };
            }
        }
        let summary = summarize(&state.kinds[..3]);
        self.tx.send_if_modified(|current| {
            if *current == summary {
                false
            } else {
                *current = summary;
                true
            }
        });
    }
}

/// Records a ServiceCIDR request's outcome in `slot`, logging when failures start and end.
fn service_cidr_transition(slot: &mut KindHealth, outcome: Result<(), String>) {
    match (outcome, &*slot) {
        (Ok(()), KindHealth::Failed { .. }) => {
            info!("ServiceCIDRs (networking.k8s.io/v1) are readable again");
            *slot = KindHealth::Ok;
        }
        (Ok(()), _) => *slot = KindHealth::Ok,
        (Err(error), KindHealth::Failed { since, .. }) => {
            *slot = KindHealth::Failed {
                since: *since,
                error,
            };
        }
        (Err(error), _) => {
            warn!(
                %error,
                "cannot list or watch ServiceCIDRs (networking.k8s.io/v1; served from Kubernetes 1.33, and the ClusterRole must grant list and watch on servicecidrs): retrying; until then nftables mode does not drop traffic to unallocated ClusterIPs, and nothing else is affected"
            );
            *slot = KindHealth::Failed {
                since: Instant::now(),
                error,
            };
        }
    }
}

fn summarize(kinds: &[KindHealth]) -> SourceHealth {
    let failed = kinds
        .iter()
        .filter_map(|k| match k {
            KindHealth::Failed { since, error } => Some((*since, error)),
            _ => None,
        })
        .min_by_key(|(since, _)| *since);
    if let Some((since, error)) = failed {
        return SourceHealth::Disconnected {
            since,
            error: error.clone(),
        };
    }
    if kinds.iter().all(|k| matches!(k, KindHealth::Ok)) {
        SourceHealth::Connected
    } else {
        SourceHealth::Connecting
    }
}

/// Records the outcomes of one kind's requests.
#[derive(Clone)]
pub(crate) struct Probe {
    health: Health,
    kind: ObjectKind,
}

impl Probe {
    /// A request or event of this kind succeeded.
    pub(crate) fn success(&self) {
        self.health.set(self.kind, Ok(()));
    }

    /// A request of this kind failed.
    pub(crate) fn failure(&self, error: String) {
        // The text can quote the server's answer: keep control characters out of the logs.
        let error = kp_model::escape(&error).into_owned();
        self.health.set(self.kind, Err(error));
    }
}

/// A client that sends through `client` and tells `probe` how each request went.
pub(crate) fn instrumented(client: &Client, probe: Probe) -> Client {
    let inner = client.clone();
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let inner = inner.clone();
        let probe = probe.clone();
        async move {
            let result = inner.send(request).await;
            match &result {
                Ok(response) => {
                    let status = response.status();
                    if status.is_success() || status == http::StatusCode::GONE {
                        probe.success();
                    } else {
                        probe.failure(format!("{:?}: HTTP {status}", probe.kind));
                    }
                }
                Err(e) => probe.failure(format!("{:?}: {e}", probe.kind)),
            }
            result
        }
    });
    Client::new(service, client.default_namespace())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_summarizes_the_kinds() {
        let (tx, rx) = watch::channel(SourceHealth::Connecting);
        let health = Health::new(tx);
        health.probe(ObjectKind::Service).success();
        health.probe(ObjectKind::EndpointSlice).success();
        assert_eq!(*rx.borrow(), SourceHealth::Connecting);
        health.probe(ObjectKind::Node).success();
        assert!(rx.borrow().is_connected());
        health.probe(ObjectKind::Node).failure("down".into());
        let first = rx.borrow().clone();
        let SourceHealth::Disconnected { since, error } = first else {
            panic!("expected disconnected, got {first:?}");
        };
        assert_eq!(error, "down");
        health.probe(ObjectKind::Node).failure("still down".into());
        assert_eq!(
            *rx.borrow(),
            SourceHealth::Disconnected {
                since,
                error: "still down".into()
            }
        );
        health.probe(ObjectKind::Node).success();
        assert!(rx.borrow().is_connected());
    }

    /// ServiceCIDRs that cannot be read (an API server older than 1.33) leave the source
    /// connected: they are not needed to proxy.
    #[test]
    fn service_cidr_failures_do_not_disconnect() {
        let (tx, rx) = watch::channel(SourceHealth::Connecting);
        let health = Health::new(tx);
        health
            .probe(ObjectKind::ServiceCidr)
            .failure("ServiceCidr: HTTP 404 Not Found".into());
        assert_eq!(*rx.borrow(), SourceHealth::Connecting);
        for kind in [
            ObjectKind::Service,
            ObjectKind::EndpointSlice,
            ObjectKind::Node,
        ] {
            health.probe(kind).success();
        }
        assert!(rx.borrow().is_connected());
        health
            .probe(ObjectKind::ServiceCidr)
            .failure("still 404".into());
        assert!(rx.borrow().is_connected());
        health.probe(ObjectKind::ServiceCidr).success();
        assert!(rx.borrow().is_connected());
    }
}
