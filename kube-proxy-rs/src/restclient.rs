//! client-go's request metrics for the API client: every request the process sends to the
//! API server (the watches' lists and watches, the events it posts) is counted in
//! `rest_client_requests_total{code,host,method}` and timed in
//! `rest_client_request_duration_seconds{host,verb}` (see [`kp_admin::Metrics::rest_client_request`]).
//!
//! The client's service is wrapped (`kube::Client::new` over a `tower` service that calls
//! the inner client), so every layer above it, the API source's own health probes included,
//! is measured; the time is taken until the response's headers, as client-go's
//! `RequestLatency` (a watch counts once, when its stream starts).

use std::time::Instant;

use kp_admin::Metrics;
use kube::Client;

/// The `host` label of requests to `url`: `host:port`, as client-go's `url.Host` (the port
/// only when the URL has one).
pub fn host_label(url: &http::Uri) -> String {
    url.authority()
        .map(|a| a.as_str().to_string())
        .unwrap_or_default()
}

/// `client`, counting and timing each request in `metrics` under `host`.
pub fn instrumented(client: Client, host: String, metrics: Metrics) -> Client {
    let namespace = client.default_namespace().to_string();
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let inner = client.clone();
        let metrics = metrics.clone();
        let host = host.clone();
        async move {
            let method = request.method().as_str().to_string();
            let started = Instant::now();
            let result = inner.send(request).await;
            let code = result.as_ref().ok().map(|r| r.status().as_u16());
            metrics.rest_client_request(&method, &host, code, started.elapsed());
            result
        }
    });
    Client::new(service, namespace)
}
