//! [`SourceHealth`]: whether the API source is connected, from what each kind's requests and
//! watch streams do.
//!
//! Each kind's reflector ([`super::reflector`]) reports every request: a list page or a
//! watch that the server answered, and every watch event, is a success; a request that
//! failed (a transport error, an error status, an `ERROR` event other than the protocol's
//! `410 Expired` and "Too large resource version", which ask for a relist) is a failure. A
//! watch stream that ends or breaks is neither: the re-watch that follows says.
//!
//! ServiceCIDRs are watched but not part of the summary ([`is_optional`]): an API server
//! older than 1.33 does not serve `networking.k8s.io/v1` ServiceCIDRs (and a ClusterRole from
//! before then does not grant them), which only means that nftables mode does not drop
//! traffic to unallocated ClusterIPs. Their failures are logged here on their own, once when
//! they start and once when they end (the reflector does not log each retry), as upstream's
//! informer logs its list errors without failing its health check.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use kp_model::ObjectKind;
use tokio::sync::watch;
use tracing::{debug, info, warn};

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

/// The shared health of the four kinds, published on a watch channel.
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

/// Whether a kind is not needed to proxy (ServiceCIDRs): its failures neither disconnect the
/// source nor are logged by the reflector at each retry; [`Health`] logs when they start and
/// when they end.
pub(crate) fn is_optional(kind: ObjectKind) -> bool {
    kind == ObjectKind::ServiceCidr
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
        if is_optional(kind) {
            service_cidr_transition(slot, outcome);
            return;
        }
        match (outcome, &*slot) {
            (Ok(()), KindHealth::Ok) => return,
            (Ok(()), KindHealth::Failed { .. }) => {
                debug!(kind = ?kind, "API server reachable again");
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
                // The reflector's own line names the server and the next retry; the
                // binary logs the change of state once for all kinds.
                debug!(kind = ?kind, %error, "API server unreachable; keeping the current rules and retrying");
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
