//! Kubernetes Events, posted as upstream kube-proxy posts them: through the Events API
//! (`events.k8s.io/v1`, `POST /apis/events.k8s.io/v1/namespaces/<ns>/events`), reporting
//! controller `kube-proxy`, reporting instance `kube-proxy-<host name>` (client-go's
//! `events.NewRecorder`), about this node's Node (`{kind: Node, name: <node>, uid: <node>}`;
//! a cluster-scoped object's events go to the `default` namespace) or a Service:
//!
//! | type | reason | action | regarding | when |
//! |---|---|---|---|---|
//! | Normal | `Starting` | `StartKubeProxy` | the Node | the daemon started (upstream's "birth cry") |
//! | Warning | `FailedToStartProxierHealthcheck` | `StartKubeProxy` | the Node | the healthz server failed with `--bind-address-hard-fail` (the process then exits) |
//! | Warning | `FailedToStartMetricServer` | `StartKubeProxy` | the Node | the same for the metrics server |
//! | Warning | `FailedToStartServiceHealthcheck` | `Listen` | the Service | a `healthCheckNodePort` could not be opened (retried at every sync) |
//! | Warning | `IPVSDeprecation` | `StartKubeProxy` | the Node | IPVS mode started (deprecated upstream since 1.35) |
//!
//! kube-rs's [`Recorder`] does the posting; a repeated event (same reason, object and note
//! within 6 minutes) becomes a series (a `PATCH` of the first one), as client-go's. Posting
//! never blocks the proxy: it runs in its own task, and a failure is logged at debug level
//! (an API server that refuses events must not fill the log). With `--manifests` there is no
//! API server and nothing is posted. The RBAC that deploy/ grants (`create`, `patch` on
//! `events.k8s.io` `events`) covers it.

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kp_model::NamespacedName;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tracing::debug;

/// upstream's reporting controller.
pub const CONTROLLER: &str = "kube-proxy";

/// The event poster of the process (cheap to clone).
#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
    node: String,
}

impl Events {
    /// Posts through `client` about node `node`.
    pub fn new(client: Client, node: &str) -> Self {
        let host = nix::unistd::gethostname()
            .ok()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_else(|| node.to_string());
        let reporter = Reporter {
            controller: CONTROLLER.into(),
            instance: Some(format!("{CONTROLLER}-{host}")),
        };
        Events {
            recorder: Recorder::new(client, reporter),
            node: node.to_string(),
        }
    }

    /// The Node reference upstream's events carry (`NodeRef`: the UID is the node name).
    pub fn node_ref(&self) -> ObjectReference {
        ObjectReference {
            kind: Some("Node".into()),
            name: Some(self.node.clone()),
            uid: Some(self.node.clone()),
            ..ObjectReference::default()
        }
    }

    /// A Service reference, as upstream's service health server makes it.
    pub fn service_ref(service: &NamespacedName) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Service".into()),
            namespace: Some(service.namespace.to_string()),
            name: Some(service.name.to_string()),
            ..ObjectReference::default()
        }
    }

    fn event(warning: bool, reason: &str, action: &str, note: Option<String>) -> Event {
        Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.into(),
            // The Events API limits a note to 1 kB.
            note: note.map(|n| truncate(n, 1024)),
            action: action.into(),
            secondary: None,
        }
    }

    /// Posts an event about `regarding` in the background.
    pub fn post(
        &self,
        warning: bool,
        reason: &str,
        action: &str,
        note: Option<String>,
        regarding: ObjectReference,
    ) {
        let recorder = self.recorder.clone();
        let event = Self::event(warning, reason, action, note);
        let reason = reason.to_string();
        tokio::spawn(async move {
            if let Err(e) = recorder.publish(&event, &regarding).await {
                debug!(%reason, error = %kp_model::escape(&e.to_string()), "cannot post the event");
            }
        });
    }

    /// Posts an event about `regarding` and waits (at most `timeout`) until it is posted: for
    /// the failures after which the process exits.
    pub async fn post_and_wait(
        &self,
        warning: bool,
        reason: &str,
        action: &str,
        note: Option<String>,
        regarding: ObjectReference,
        timeout: Duration,
    ) {
        let event = Self::event(warning, reason, action, note);
        match tokio::time::timeout(timeout, self.recorder.publish(&event, &regarding)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                debug!(%reason, error = %kp_model::escape(&e.to_string()), "cannot post the event")
            }
            Err(_) => debug!(%reason, "posting the event timed out"),
        }
    }
}

/// `text` cut to at most `max` bytes, on a character boundary.
fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}
