//! Readiness: `/readyz` on the healthz server, 200 once every IP family has completed its
//! first successful sync since the process started, 503 before.
//!
//! Upstream kube-proxy has no readiness endpoint and its `/healthz` is 200 from the moment
//! its sync loops start (they call `Updated` before any rule is written), so a pod probed on
//! `/healthz` is Ready before it has programmed anything. A DaemonSet's rolling update
//! (`maxUnavailable: 1`) moves to the next node only once the new pod is Ready: with
//! `/readyz` as the readiness probe it waits for the rules, so a proxy that cannot reach the
//! API server or cannot write its rules stops the rollout at the first node instead of
//! spreading to every node. `/healthz` and `/livez` keep upstream's meaning
//! ([`crate::proxy_health`]).
//!
//! Readiness only ever goes from "not ready" to "ready": once the first sync of every family
//! is done the pod stays Ready (a sync that stalls later shows in `/healthz` and `/livez`,
//! as upstream; a readiness that flapped would only hide the pod from whatever selects
//! ready pods, e.g. a metrics Service).
//!
//! The answer is a line of text, as the API server's `/readyz`: `ok`, or `first sync not
//! done: IPv4, IPv6` naming the families still waiting. Every answer counts nowhere: the
//! probe's own counters are the kubelet's.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use kp_model::IpFamily;

/// Which families still wait for their first successful sync; cheaply cloned and shared
/// between the sync loops' observers and the healthz server.
#[derive(Debug, Clone)]
pub struct Readiness {
    waiting: Arc<Mutex<BTreeSet<IpFamily>>>,
}

impl Readiness {
    /// Not ready until each of `families` (the families the proxy programs) reports
    /// [`Readiness::synced`]. With no families it is ready at once.
    pub fn new(families: impl IntoIterator<Item = IpFamily>) -> Self {
        Readiness {
            waiting: Arc::new(Mutex::new(families.into_iter().collect())),
        }
    }

    /// `family` completed a sync successfully (the first one counts; later calls change
    /// nothing).
    pub fn synced(&self, family: IpFamily) {
        self.waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&family);
    }

    /// Whether every family has synced once.
    pub fn is_ready(&self) -> bool {
        self.waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }

    /// The `/readyz` answer: `(200, "ok")`, or `(503, "first sync not done: IPv4")`.
    pub fn answer(&self) -> (u16, String) {
        let waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        if waiting.is_empty() {
            return (200, "ok".to_string());
        }
        let names: Vec<String> = waiting.iter().map(ToString::to_string).collect();
        (503, format!("first sync not done: {}", names.join(", ")))
    }
}

/// The `/readyz` route (any method, as the health routes), to merge into the healthz
/// server's router.
pub fn readiness_router(readiness: Readiness) -> Router {
    Router::new()
        .route("/readyz", any(readyz_handler))
        .with_state(readiness)
}

async fn readyz_handler(State(readiness): State<Readiness>) -> Response {
    let (code, body) = readiness.answer();
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{body}\n"),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_once_every_family_synced_and_stays_ready() {
        let r = Readiness::new([IpFamily::V4, IpFamily::V6]);
        assert_eq!(
            r.answer(),
            (503, "first sync not done: IPv4, IPv6".to_string())
        );
        r.synced(IpFamily::V6);
        assert_eq!(r.answer(), (503, "first sync not done: IPv4".to_string()));
        assert!(!r.is_ready());
        r.synced(IpFamily::V4);
        assert!(r.is_ready());
        r.synced(IpFamily::V4);
        assert_eq!(r.answer(), (200, "ok".to_string()));
        assert!(Readiness::new([]).is_ready());
    }
}
