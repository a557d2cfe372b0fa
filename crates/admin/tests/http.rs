//! Real HTTP requests against the servers, bound to 127.0.0.1 on ephemeral ports.

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use kp_admin::{
    AdminError, HealthCheckAddresses, ManualClock, Metrics, ProxyHealth, ProxyMode, ServeOptions,
    ServiceHealthServer, TokioClock, metrics_server, proxy_health_server,
};
use kp_model::{IpFamily, NamespacedName};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const T0: u64 = 1_784_628_000; // 2026-07-21T10:00:00Z

#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {:?}", self.body))
    }
}

/// A minimal HTTP/1.1 GET (no timers, so it also works with paused Tokio time).
async fn get(addr: SocketAddr, path: &str) -> io::Result<Reply> {
    get_version(addr, path, "1.1").await
}

/// A minimal GET in HTTP/`version` (`1.0`: the body of a streamed answer ends with the
/// connection, as our own clients read it; `1.1`: chunked, left undecoded).
async fn get_version(addr: SocketAddr, path: &str, version: &str) -> io::Result<Reply> {
    let mut stream = TcpStream::connect(addr).await?;
    stream
        .write_all(
            format!("GET {path} HTTP/{version}\r\nHost: test\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| io::Error::other(format!("no header end in {text:?}")))?;
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| io::Error::other(format!("bad status line in {head:?}")))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Ok(Reply {
        status,
        headers,
        body: body.to_string(),
    })
}

fn ephemeral() -> ServeOptions {
    ServeOptions::new(SocketAddr::new(LOCALHOST, 0))
}

fn manual_clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(UNIX_EPOCH + Duration::from_secs(T0)))
}

/// Starts `server` on an ephemeral port; returns its address and the shutdown trigger.
async fn start(server: kp_admin::AdminServer) -> (SocketAddr, oneshot::Sender<()>) {
    let bound = server.bind().unwrap();
    let addr = bound.local_addr();
    let (tx, rx) = oneshot::channel::<()>();
    tokio::spawn(bound.serve(async move {
        let _ = rx.await;
    }));
    (addr, tx)
}

/// Waits (real time) until nothing listens on `addr` any more.
async fn wait_closed(addr: SocketAddr) {
    for _ in 0..200 {
        if TcpStream::connect(addr).await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{addr} still accepts connections");
}

#[tokio::test]
async fn healthz_and_livez_answer_upstreams_json() {
    let clock = manual_clock();
    let health = ProxyHealth::with_clock(Duration::from_secs(60), clock.clone());
    let metrics = Metrics::with_clock(ProxyMode::Iptables, clock.clone());
    let (addr, _stop) = start(proxy_health_server(
        ephemeral(),
        health.clone(),
        metrics.clone(),
    ))
    .await;

    health.updated(IpFamily::V4);
    clock.advance(Duration::from_millis(1500));

    let livez = get(addr, "/livez").await.unwrap();
    assert_eq!(livez.status, 200);
    assert_eq!(livez.header("content-type"), Some("application/json"));
    assert_eq!(livez.header("x-content-type-options"), Some("nosniff"));
    let v = livez.json();
    assert_eq!(
        v["lastUpdated"], "2026-07-21T10:00:01.5Z",
        "now, because healthy"
    );
    assert_eq!(v["currentTime"], "2026-07-21T10:00:01.5Z");
    assert_eq!(v["healthy"], true);
    assert!(v.get("nodeEligible").is_none(), "livez has no nodeEligible");
    assert_eq!(v["status"]["IPv4"]["lastUpdated"], "2026-07-21T10:00:00Z");
    assert_eq!(v["status"]["IPv4"]["healthy"], true);
    assert_eq!(v.as_object().map(|o| o.len()), Some(4));

    let healthz = get(addr, "/healthz").await.unwrap();
    assert_eq!(healthz.status, 200);
    assert_eq!(healthz.json()["nodeEligible"], true);

    // The node is being drained: healthz fails, livez does not.
    health.node_eligible(false);
    let healthz = get(addr, "/healthz").await.unwrap();
    assert_eq!(healthz.status, 503);
    let v = healthz.json();
    assert_eq!(v["nodeEligible"], false);
    assert_eq!(v["healthy"], true, "the proxy itself is healthy");
    assert_eq!(
        v["lastUpdated"], "2026-07-21T10:00:00Z",
        "not replaced when unhealthy"
    );
    assert_eq!(get(addr, "/livez").await.unwrap().status, 200);

    assert_eq!(get(addr, "/nothing").await.unwrap().status, 404);

    let text = metrics.encode().unwrap();
    assert!(
        text.contains(r#"kubeproxy_proxy_healthz_total{code="200"} 1"#),
        "{text}"
    );
    assert!(text.contains(r#"kubeproxy_proxy_healthz_total{code="503"} 1"#));
    assert!(text.contains(r#"kubeproxy_proxy_livez_total{code="200"} 2"#));
}

#[tokio::test(start_paused = true)]
async fn livez_turns_503_after_two_sync_periods_with_a_queued_update() {
    let clock = Arc::new(TokioClock::starting_at(
        UNIX_EPOCH + Duration::from_secs(T0),
    ));
    let health = ProxyHealth::with_clock(
        kp_admin::health_timeout(Duration::from_secs(30)),
        clock.clone(),
    );
    let metrics = Metrics::with_clock(ProxyMode::Nftables, clock);
    let (addr, _stop) = start(proxy_health_server(ephemeral(), health.clone(), metrics)).await;

    health.updated(IpFamily::V4);
    health.updated(IpFamily::V6);
    health.queued_update(IpFamily::V6);
    tokio::time::advance(Duration::from_secs(59)).await;
    assert_eq!(get(addr, "/livez").await.unwrap().status, 200);
    tokio::time::advance(Duration::from_secs(1)).await;
    let reply = get(addr, "/livez").await.unwrap();
    assert_eq!(reply.status, 503);
    let v = reply.json();
    assert_eq!(v["healthy"], false);
    assert_eq!(v["status"]["IPv4"]["healthy"], true);
    assert_eq!(v["status"]["IPv6"]["healthy"], false);
    assert_eq!(v["currentTime"], "2026-07-21T10:01:00Z");
    assert_eq!(get(addr, "/healthz").await.unwrap().status, 503);

    health.updated(IpFamily::V6);
    assert_eq!(get(addr, "/livez").await.unwrap().status, 200);
}

#[tokio::test]
async fn metrics_server_serves_metrics_healthz_and_proxy_mode() {
    let metrics = Metrics::new(ProxyMode::Iptables);
    metrics.observe_sync(IpFamily::V4, true, Duration::from_millis(12), true);
    let (addr, stop) = start(metrics_server(ephemeral(), metrics)).await;

    let reply = get(addr, "/metrics").await.unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    assert!(
        reply
            .body
            .contains("# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram")
    );
    assert!(
        reply.body.contains(
            r#"kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"} 1"#
        )
    );

    let reply = get(addr, "/healthz").await.unwrap();
    assert_eq!((reply.status, reply.body.as_str()), (200, "ok"));
    let reply = get(addr, "/proxyMode").await.unwrap();
    assert_eq!((reply.status, reply.body.as_str()), (200, "iptables"));
    assert_eq!(
        reply.header("content-type"),
        Some("text/plain; charset=utf-8")
    );

    stop.send(()).unwrap();
    wait_closed(addr).await;
}

/// `n` userspace listeners `ns/svc-I:http` on ports 40000 + I.
#[derive(Debug)]
struct Listeners(usize);

impl Listeners {
    fn range(&self, after: Option<&str>, limit: usize) -> (std::ops::Range<usize>, Option<String>) {
        let start = after.map_or(0, |a| a.parse::<usize>().unwrap() + 1);
        let end = (start + limit).min(self.0);
        (
            (start..end),
            (end - start == limit).then(|| (end - 1).to_string()),
        )
    }
}

impl kp_admin::UserspaceStats for Listeners {
    fn visit(
        &self,
        after: Option<&str>,
        limit: usize,
        f: &mut dyn FnMut(&kp_admin::UserspaceListenerStats<'_>),
    ) -> Option<String> {
        let (range, more) = self.range(after, limit);
        for i in range {
            let name = format!("ns/svc-{i}:http");
            f(&kp_admin::UserspaceListenerStats {
                ip_family: "IPv4",
                service_port: &name,
                protocol: "TCP",
                scope: "internal",
                port: 40000 + i as u16,
                endpoints: 3,
                accepted_total: i as u64,
                ..Default::default()
            });
        }
        more
    }
    fn table_rows(&self, after: Option<&str>, limit: usize, out: &mut String) -> Option<String> {
        if after.is_none() {
            out.push_str("# table\n");
        }
        let (range, more) = self.range(after, limit);
        for i in range {
            out.push_str(&format!(
                "TCP 0.0.0.0:{} ns/svc-{i}:http internal none -\n",
                40000 + i
            ));
        }
        more
    }
}

/// Userspace mode's `/metrics` and `/userspace` grow with the listeners and are sent as they
/// are written: no Content-Length, the body the text [`Metrics::encode`] gives (HTTP/1.0:
/// until the connection closes; HTTP/1.1: chunked).
#[tokio::test]
async fn userspace_metrics_and_table_are_streamed() {
    let metrics = Metrics::with_clock(ProxyMode::Userspace, manual_clock());
    metrics.observe_sync(IpFamily::V4, true, Duration::from_millis(12), true);
    metrics.set_userspace(Arc::new(Listeners(3000)));
    let (addr, stop) = start(metrics_server(ephemeral(), metrics.clone())).await;

    let reply = get_version(addr, "/metrics", "1.0").await.unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    assert_eq!(reply.header("content-length"), None);
    // The process metrics are read at each scrape (CPU time, bytes): the rest is the same.
    let steady = |text: &str| {
        text.lines()
            .filter(|l| !l.contains("process_"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(steady(&reply.body), steady(&metrics.encode().unwrap()));
    assert!(reply.body.contains("\nprocess_resident_memory_bytes "));
    assert!(reply.body.contains(
        r#"kube_proxy_rs_userspace_connections_total{ip_family="IPv4",service_port="ns/svc-2999:http",protocol="TCP",scope="internal"} 2999"#
    ));
    assert!(
        reply
            .body
            .contains(r#"kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}"#)
    );
    let chunked = get_version(addr, "/metrics", "1.1").await.unwrap();
    assert_eq!(chunked.header("transfer-encoding"), Some("chunked"));

    let table = get_version(addr, "/userspace", "1.0").await.unwrap();
    assert_eq!(table.status, 200);
    assert_eq!(table.body, metrics.userspace_table().unwrap());
    assert_eq!(table.body.lines().count(), 3001);
    assert!(
        table
            .body
            .starts_with("# table\nTCP 0.0.0.0:40000 ns/svc-0:http")
    );

    stop.send(()).unwrap();
    wait_closed(addr).await;
}

fn svc(name: &str) -> NamespacedName {
    NamespacedName::new("default", name)
}

#[tokio::test]
async fn service_health_answers_200_503_with_weight_and_body() {
    let clock = manual_clock();
    let health = ProxyHealth::with_clock(Duration::from_secs(60), clock.clone());
    let server = ServiceHealthServer::new(
        "node-a",
        HealthCheckAddresses::Ips(vec![LOCALHOST]),
        health.clone(),
    )
    .unwrap();
    let failures = server.sync_services(&BTreeMap::from([(svc("web"), 0)]));
    assert!(failures.is_empty(), "{failures:?}");
    let addrs = server.local_addrs(&svc("web"));
    assert_eq!(addrs.len(), 1);
    let addr = addrs[0];

    // No local endpoints yet.
    let reply = get(addr, "/").await.unwrap();
    assert_eq!(reply.status, 503);
    assert_eq!(reply.header("x-load-balancing-endpoint-weight"), Some("0"));
    assert_eq!(reply.header("content-type"), Some("application/json"));

    server.sync_endpoints(&BTreeMap::from([(svc("web"), 2), (svc("other"), 5)]));
    let reply = get(addr, "/any/path").await.unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("x-load-balancing-endpoint-weight"), Some("2"));
    assert_eq!(
        reply.body,
        "{\n\t\"service\": {\n\t\t\"namespace\": \"default\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
    );
    let v = reply.json();
    assert_eq!(v["service"]["namespace"], "default");
    assert_eq!(v["service"]["name"], "web");
    assert_eq!(v["localEndpoints"], 2);
    assert_eq!(v["serviceProxyHealthy"], true);

    // The proxy is unhealthy: 503 even with endpoints.
    health.updated(IpFamily::V4);
    health.queued_update(IpFamily::V4);
    clock.advance(Duration::from_secs(60));
    let reply = get(addr, "/").await.unwrap();
    assert_eq!(reply.status, 503);
    assert_eq!(reply.header("x-load-balancing-endpoint-weight"), Some("2"));
    assert_eq!(reply.json()["serviceProxyHealthy"], false);
    assert_eq!(reply.json()["localEndpoints"], 2);
    health.updated(IpFamily::V4);
    assert_eq!(get(addr, "/").await.unwrap().status, 200);

    // Services missing from the endpoint map drop to 0.
    server.sync_endpoints(&BTreeMap::new());
    let reply = get(addr, "/").await.unwrap();
    assert_eq!(reply.status, 503);
    assert_eq!(reply.json()["localEndpoints"], 0);
}

#[tokio::test]
async fn service_listeners_follow_sync_services() {
    let health = ProxyHealth::new(Duration::from_secs(60));
    let server =
        ServiceHealthServer::new("node-a", HealthCheckAddresses::Ips(vec![LOCALHOST]), health)
            .unwrap();
    assert!(
        server
            .sync_services(&BTreeMap::from([(svc("a"), 0), (svc("b"), 0)]))
            .is_empty()
    );
    let a = server.local_addrs(&svc("a"))[0];
    let b = server.local_addrs(&svc("b"))[0];
    server.sync_endpoints(&BTreeMap::from([(svc("a"), 1)]));
    assert_eq!(get(a, "/").await.unwrap().status, 200);
    assert_eq!(get(b, "/").await.unwrap().status, 503);

    // Unchanged services keep their listener and endpoint count; removed ones close.
    assert!(
        server
            .sync_services(&BTreeMap::from([(svc("a"), 0)]))
            .is_empty()
    );
    assert_eq!(server.local_addrs(&svc("a")), vec![a]);
    assert_eq!(get(a, "/").await.unwrap().status, 200);
    wait_closed(b).await;
    assert_eq!(server.services(), BTreeMap::from([(svc("a"), 0)]));

    // A port change closes the old listener and opens the new one.
    let probe = std::net::TcpListener::bind((LOCALHOST, 0)).unwrap();
    let new_port = probe.local_addr().unwrap().port();
    drop(probe);
    assert!(
        server
            .sync_services(&BTreeMap::from([(svc("a"), new_port)]))
            .is_empty()
    );
    assert_eq!(
        server.local_addrs(&svc("a")),
        vec![SocketAddr::new(LOCALHOST, new_port)]
    );
    wait_closed(a).await;
    let reply = get(SocketAddr::new(LOCALHOST, new_port), "/")
        .await
        .unwrap();
    assert_eq!(
        reply.status, 503,
        "a reopened listener starts with 0 endpoints"
    );

    assert!(server.sync_services(&BTreeMap::new()).is_empty());
    wait_closed(SocketAddr::new(LOCALHOST, new_port)).await;
    assert!(server.services().is_empty());
}

#[tokio::test]
async fn a_taken_port_is_reported_and_retried_on_the_next_sync() {
    let health = ProxyHealth::new(Duration::from_secs(60));
    let server =
        ServiceHealthServer::new("node-a", HealthCheckAddresses::Ips(vec![LOCALHOST]), health)
            .unwrap();
    let blocker = std::net::TcpListener::bind((LOCALHOST, 0)).unwrap();
    let port = blocker.local_addr().unwrap().port();
    let wanted = BTreeMap::from([(svc("web"), port), (svc("free"), 0)]);

    let failures = server.sync_services(&wanted);
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].service, svc("web"));
    assert_eq!(failures[0].port, port);
    assert!(
        matches!(&failures[0].error, AdminError::Bind { source, .. } if source.kind() == io::ErrorKind::AddrInUse)
    );
    assert_eq!(
        server.services().keys().cloned().collect::<Vec<_>>(),
        vec![svc("free")]
    );

    drop(blocker);
    assert!(server.sync_services(&wanted).is_empty());
    let reply = get(SocketAddr::new(LOCALHOST, port), "/").await.unwrap();
    assert_eq!(reply.json()["service"]["name"], "web");
}

#[tokio::test]
async fn a_failure_on_one_address_closes_the_others() {
    let second = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    let Ok(blocker) = std::net::TcpListener::bind((second, 0)) else {
        eprintln!("127.0.0.2 is not usable here; skipping");
        return;
    };
    let port = blocker.local_addr().unwrap().port();
    let health = ProxyHealth::new(Duration::from_secs(60));
    let server = ServiceHealthServer::new(
        "node-a",
        HealthCheckAddresses::Ips(vec![LOCALHOST, second]),
        health,
    )
    .unwrap();
    let wanted = BTreeMap::from([(svc("web"), port)]);
    assert_eq!(server.sync_services(&wanted).len(), 1);
    wait_closed(SocketAddr::new(LOCALHOST, port)).await;

    drop(blocker);
    assert!(server.sync_services(&wanted).is_empty());
    assert_eq!(server.local_addrs(&svc("web")).len(), 2);
    for ip in [LOCALHOST, second] {
        assert_eq!(
            get(SocketAddr::new(ip, port), "/").await.unwrap().status,
            503
        );
    }
}

#[tokio::test]
async fn all_addresses_listen_on_the_wildcard() {
    let health = ProxyHealth::new(Duration::from_secs(60));
    let server = ServiceHealthServer::new("node-a", HealthCheckAddresses::All, health).unwrap();
    assert!(
        server
            .sync_services(&BTreeMap::from([(svc("web"), 0)]))
            .is_empty()
    );
    let addrs = server.local_addrs(&svc("web"));
    assert_eq!(addrs.len(), 1);
    assert!(addrs[0].ip().is_unspecified());
    let reply = get(SocketAddr::new(LOCALHOST, addrs[0].port()), "/")
        .await
        .unwrap();
    assert_eq!(reply.status, 503);
}

#[tokio::test(start_paused = true)]
async fn run_retries_every_5s_until_the_port_is_free() {
    let blocker = std::net::TcpListener::bind((LOCALHOST, 0)).unwrap();
    let addr = blocker.local_addr().unwrap();
    let metrics = Metrics::new(ProxyMode::Iptables);
    let server = metrics_server(ServeOptions::new(addr), metrics);
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async move {
        let _ = rx.await;
    }));

    tokio::time::sleep(Duration::from_secs(12)).await;
    assert!(
        !task.is_finished(),
        "a bind failure is not fatal without hard fail"
    );
    drop(blocker);
    // The next attempt (at most 5 s later) binds.
    let mut served = None;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if let Ok(reply) = get(addr, "/proxyMode").await {
            served = Some(reply.body);
            break;
        }
    }
    assert_eq!(served.as_deref(), Some("iptables"));
    tx.send(()).unwrap();
    assert!(task.await.unwrap().is_ok());
}

#[tokio::test(start_paused = true)]
async fn hard_fail_returns_the_bind_error() {
    let blocker = std::net::TcpListener::bind((LOCALHOST, 0)).unwrap();
    let opts = ServeOptions {
        hard_fail: true,
        ..ServeOptions::new(blocker.local_addr().unwrap())
    };
    let health = ProxyHealth::new(Duration::from_secs(60));
    let server = proxy_health_server(opts, health, Metrics::new(ProxyMode::Iptables));
    let result = server.run(std::future::pending()).await;
    assert!(matches!(result, Err(AdminError::Bind { .. })), "{result:?}");
}
