//! Tests of the API-server source ([`kp_source::api`]) against the test API server
//! ([`kp_testkit::apiserver::TestApiServer`]): real HTTP on loopback, kube-rs's watcher, no
//! root.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use kp_model::{NamespacedName, ObjectKind, SourceEvent};
use kp_source::api::{ApiOptions, ApiSource, SourceHealth};
use kp_source::convert::{self, Converted};
use kp_testkit::apiserver::{ApiKind, TestApiServer};
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

const NODE: &str = "node-a";
/// How long a test waits for something that should happen.
const WAIT: Duration = Duration::from_secs(5);
/// How long a test waits to be sure that nothing happens.
const QUIET: Duration = Duration::from_millis(400);

fn service(name: &str, port: i32, labels: serde_json::Value) -> core::Service {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": "10.96.0.10",
            "clusterIPs": ["10.96.0.10"],
            "ports": [{"name": "http", "port": port, "protocol": "TCP", "targetPort": 8080}],
        },
    }))
    .expect("service JSON")
}

fn slice(name: &str, ip: &str, labels: serde_json::Value) -> discovery::EndpointSlice {
    let mut all = json!({"kubernetes.io/service-name": "web"});
    if let (Some(all), Some(extra)) = (all.as_object_mut(), labels.as_object()) {
        all.extend(extra.clone());
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "labels": all},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip], "conditions": {"ready": true}, "nodeName": NODE}],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }))
    .expect("slice JSON")
}

fn node(name: &str, zone: &str) -> core::Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone}},
        "spec": {"podCIDR": "10.244.0.0/24"},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.56.10"}]},
    }))
    .expect("node JSON")
}

fn svc_up(svc: &core::Service) -> SourceEvent {
    match convert::service(svc) {
        Ok(Converted::Object(s)) => SourceEvent::ServiceUpsert(s),
        other => panic!("not a valid service: {other:?}"),
    }
}

fn slice_up(s: &discovery::EndpointSlice) -> SourceEvent {
    match convert::endpoint_slice(s) {
        Ok(Converted::Object(s)) => SourceEvent::SliceUpsert(s),
        other => panic!("not a valid slice: {other:?}"),
    }
}

fn node_up(n: &core::Node) -> SourceEvent {
    SourceEvent::NodeUpsert(convert::node(n).expect("valid node"))
}

fn nn(name: &str) -> NamespacedName {
    NamespacedName::new("default", name)
}

fn fast() -> ApiOptions {
    ApiOptions {
        watch_timeout: Some(60),
        page_size: Some(500),
        backoff_initial: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        backoff_reset: Duration::from_secs(120),
    }
}

/// A running source and what it produces.
struct Harness {
    rx: mpsc::Receiver<Vec<SourceEvent>>,
    health: watch::Receiver<SourceHealth>,
    errors: Arc<Mutex<Vec<String>>>,
    task: JoinHandle<Result<(), kp_source::SourceError>>,
}

impl Harness {
    fn start(server: &TestApiServer, options: ApiOptions) -> Harness {
        let client = server.client().expect("client");
        let source = ApiSource::new(client, NODE).with_options(options);
        let health = source.health();
        let errors = Arc::new(Mutex::new(Vec::new()));
        let sink = errors.clone();
        let (tx, rx) = mpsc::channel(16);
        let task = tokio::spawn(source.run(tx, move |e| {
            sink.lock().expect("errors lock").push(e.to_string());
        }));
        Harness {
            rx,
            health,
            errors,
            task,
        }
    }

    /// The next batch.
    async fn next(&mut self) -> Vec<SourceEvent> {
        match tokio::time::timeout(WAIT, self.rx.recv()).await {
            Ok(Some(batch)) => batch,
            Ok(None) => panic!("the source stopped"),
            Err(_) => panic!("no batch within {WAIT:?}"),
        }
    }

    /// Asserts that no batch comes for a while.
    async fn quiet(&mut self) {
        if let Ok(batch) = tokio::time::timeout(QUIET, self.rx.recv()).await {
            panic!("expected nothing, got {batch:?}");
        }
    }

    /// The batches up to and including the one that completes the initial sync of every
    /// kind; each batch must end with its kind's `Synced`.
    async fn initial(&mut self) -> Vec<SourceEvent> {
        let mut all = Vec::new();
        let mut synced = 0;
        while synced < 3 {
            let batch = self.next().await;
            assert!(
                matches!(batch.last(), Some(SourceEvent::Synced(_))),
                "an initial batch ends with Synced: {batch:?}"
            );
            synced += batch
                .iter()
                .filter(|e| matches!(e, SourceEvent::Synced(_)))
                .count();
            all.extend(batch);
        }
        all
    }

    async fn wait_health(&mut self, want: impl Fn(&SourceHealth) -> bool) -> SourceHealth {
        let got = tokio::time::timeout(WAIT, self.health.wait_for(|h| want(h)))
            .await
            .map(|r| r.map(|h| h.clone()));
        match got {
            Ok(Ok(h)) => h,
            _ => panic!(
                "health did not change as expected: {:?}",
                *self.health.borrow()
            ),
        }
    }

    fn errors(&self) -> Vec<String> {
        self.errors.lock().expect("errors lock").clone()
    }
}

/// Sorts events so batches can be compared regardless of kind order.
fn sorted(mut events: Vec<SourceEvent>) -> Vec<String> {
    let mut v: Vec<String> = events.drain(..).map(|e| format!("{e:?}")).collect();
    v.sort();
    v
}

/// Stores `object` on the test server.
fn put<K: k8s_openapi::Resource + serde::Serialize>(server: &TestApiServer, object: &K) {
    server.upsert(object).expect("upsert");
}

async fn open_all(server: &TestApiServer) {
    assert!(
        server.wait_for_watches(&ApiKind::ALL, 1, WAIT).await,
        "the watches did not open"
    );
}

#[tokio::test]
async fn initial_lists_send_upserts_then_synced_for_each_kind() {
    let web = service("web", 80, json!({}));
    let other_proxy = service(
        "other",
        80,
        json!({"service.kubernetes.io/service-proxy-name": "cilium"}),
    );
    let headless_service = service(
        "headless",
        80,
        json!({"service.kubernetes.io/headless": ""}),
    );
    let mut external: core::Service = service("ext", 80, json!({}));
    if let Some(spec) = external.spec.as_mut() {
        spec.type_ = Some("ExternalName".into());
        spec.external_name = Some("example.com".into());
        spec.cluster_ip = None;
        spec.cluster_ips = None;
    }
    let web_slice = slice("web-abc", "10.0.0.4", json!({}));
    let headless = slice(
        "web-headless",
        "10.0.0.5",
        json!({"service.kubernetes.io/headless": ""}),
    );
    let mut fqdn = slice("web-fqdn", "10.0.0.6", json!({}));
    fqdn.address_type = "FQDN".into();
    fqdn.endpoints[0].addresses = vec!["pod.example.com".into()];
    let me = node(NODE, "z1");
    let server = TestApiServer::start().await.expect("server");
    for s in [&web, &other_proxy, &headless_service, &external] {
        server.upsert(s).expect("upsert");
    }
    for s in [&web_slice, &headless, &fqdn] {
        server.upsert(s).expect("upsert");
    }
    server.upsert(&me).expect("upsert");
    server.upsert(&node("node-b", "z2")).expect("upsert");

    let mut h = Harness::start(&server, fast());
    let events = h.initial().await;
    let mut expected = vec![
        svc_up(&external),
        svc_up(&web),
        slice_up(&web_slice),
        node_up(&me),
    ];
    expected.extend(
        [
            ObjectKind::Service,
            ObjectKind::EndpointSlice,
            ObjectKind::Node,
        ]
        .map(SourceEvent::Synced),
    );
    assert_eq!(sorted(events), sorted(expected));
    h.quiet().await;
    h.wait_health(SourceHealth::is_connected).await;

    // The selectors are upstream's.
    let requests = server.requests();
    let uri_of = |kind| {
        requests
            .iter()
            .find(|r| r.kind == Some(kind) && !r.watch)
            .map(|r| r.uri.clone())
            .unwrap_or_default()
    };
    assert!(
        uri_of(ApiKind::Service).contains(
            "labelSelector=%21service.kubernetes.io%2Fheadless%2C%21service.kubernetes.io%2Fservice-proxy-name"
        ),
        "{}",
        uri_of(ApiKind::Service)
    );
    assert!(
        uri_of(ApiKind::EndpointSlice).contains(
            "labelSelector=%21service.kubernetes.io%2Fheadless%2C%21service.kubernetes.io%2Fservice-proxy-name"
        ),
        "{}",
        uri_of(ApiKind::EndpointSlice)
    );
    assert!(
        uri_of(ApiKind::Node).contains("fieldSelector=metadata.name%3Dnode-a"),
        "{}",
        uri_of(ApiKind::Node)
    );
    assert!(h.errors().is_empty(), "{:?}", h.errors());
}

#[tokio::test]
async fn changes_and_deletes_arrive_as_one_batch_each() {
    let web = service("web", 80, json!({}));
    let web_slice = slice("web-abc", "10.0.0.4", json!({}));
    let server = TestApiServer::start().await.expect("server");
    put(&server, &web);
    put(&server, &web_slice);
    put(&server, &node(NODE, "z1"));
    let mut h = Harness::start(&server, fast());
    h.initial().await;
    open_all(&server).await;

    let web2 = service("web", 81, json!({}));
    server.upsert(&web2).expect("upsert");
    assert_eq!(h.next().await, vec![svc_up(&web2)]);

    // The same object again (a new resourceVersion only): nothing for the proxy.
    server.upsert(&web2).expect("upsert");
    h.quiet().await;

    server.delete(ApiKind::EndpointSlice, "default", "web-abc");
    assert_eq!(
        h.next().await,
        vec![SourceEvent::SliceDelete(nn("web-abc"))]
    );

    // A new Service of another proxy, and a headless-labelled slice: never delivered.
    server
        .upsert(&service(
            "other",
            80,
            json!({"service.kubernetes.io/service-proxy-name": "x"}),
        ))
        .expect("upsert");
    server
        .upsert(&slice(
            "web-h",
            "10.0.0.9",
            json!({"service.kubernetes.io/headless": ""}),
        ))
        .expect("upsert");
    h.quiet().await;

    // A delivered Service handed to another proxy: the server sends DELETED (it left the
    // selector), the proxy deletes it.
    server
        .upsert(&service(
            "web",
            81,
            json!({"service.kubernetes.io/service-proxy-name": "x"}),
        ))
        .expect("upsert");
    assert_eq!(h.next().await, vec![SourceEvent::ServiceDelete(nn("web"))]);
    h.quiet().await;
}

#[tokio::test]
async fn a_dropped_connection_resumes_without_duplicates_or_gaps() {
    let web = service("web", 80, json!({}));
    let server = TestApiServer::start().await.expect("server");
    put(&server, &web);
    let mut h = Harness::start(&server, fast());
    h.initial().await;
    open_all(&server).await;

    server.drop_connections();
    // Changed while the client reconnects: seen once, from the replay or live.
    let web2 = service("web", 81, json!({}));
    server.upsert(&web2).expect("upsert");
    let db = service("db", 5432, json!({}));
    server.upsert(&db).expect("upsert");
    let mut got = h.next().await;
    if got.len() < 2 {
        got.extend(h.next().await);
    }
    assert_eq!(got, vec![svc_up(&web2), svc_up(&db)]);
    h.quiet().await;

    // Resumed from the resourceVersion: no relist.
    assert_eq!(server.list_count(ApiKind::Service), 1);
    open_all(&server).await;
    server.delete(ApiKind::Service, "default", "db");
    assert_eq!(h.next().await, vec![SourceEvent::ServiceDelete(nn("db"))]);
    h.quiet().await;
}

#[tokio::test]
async fn a_relist_after_410_sends_exactly_the_difference() {
    let web = service("web", 80, json!({}));
    let db = service("db", 5432, json!({}));
    let cache = service("cache", 6379, json!({}));
    let web_slice = slice("web-abc", "10.0.0.4", json!({}));
    let server = TestApiServer::start().await.expect("server");
    put(&server, &web);
    put(&server, &db);
    put(&server, &cache);
    put(&server, &web_slice);
    put(&server, &node(NODE, "z1"));
    let mut h = Harness::start(&server, fast());
    h.initial().await;
    open_all(&server).await;

    // Disconnected: one Service changes, one is deleted, one is added; then the history is
    // compacted, so the watch cannot resume.
    server.set_unavailable(true);
    let web2 = service("web", 81, json!({}));
    server.upsert(&web2).expect("upsert");
    server.delete(ApiKind::Service, "default", "db");
    let api = service("api", 443, json!({}));
    server.upsert(&api).expect("upsert");
    server.expire_watches();
    h.quiet().await;
    server.set_unavailable(false);

    let batch = h.next().await;
    assert_eq!(
        batch,
        vec![
            svc_up(&api),
            svc_up(&web2),
            SourceEvent::ServiceDelete(nn("db")),
        ]
    );
    // The other kinds relisted too, and found nothing changed.
    h.quiet().await;
    assert_eq!(server.list_count(ApiKind::Service), 2);
    assert_eq!(server.list_count(ApiKind::EndpointSlice), 2);
    assert_eq!(server.list_count(ApiKind::Node), 2);

    // And it keeps watching.
    open_all(&server).await;
    server.delete(ApiKind::Service, "default", "cache");
    assert_eq!(
        h.next().await,
        vec![SourceEvent::ServiceDelete(nn("cache"))]
    );
}

#[tokio::test]
async fn expired_open_watches_relist_and_send_nothing_when_nothing_changed() {
    let web = service("web", 80, json!({}));
    let server = TestApiServer::start().await.expect("server");
    put(&server, &web);
    let mut h = Harness::start(&server, fast());
    h.initial().await;
    open_all(&server).await;
    server.expire_watches();
    h.quiet().await;
    assert_eq!(server.list_count(ApiKind::Service), 2);
    h.wait_health(SourceHealth::is_connected).await;
}

#[tokio::test]
async fn an_unavailable_api_server_sends_nothing_and_shows_disconnected() {
    let web = service("web", 80, json!({}));
    let server = TestApiServer::start().await.expect("server");
    put(&server, &web);
    let mut h = Harness::start(&server, fast());
    h.initial().await;
    open_all(&server).await;
    h.wait_health(SourceHealth::is_connected).await;

    server.set_unavailable(true);
    let health = h
        .wait_health(|h| matches!(h, SourceHealth::Disconnected { .. }))
        .await;
    let SourceHealth::Disconnected { error, .. } = health else {
        unreachable!()
    };
    assert!(error.contains("503"), "{error}");
    h.quiet().await;

    // Back: the watches resume from where they were, nothing to send.
    server.set_unavailable(false);
    h.wait_health(SourceHealth::is_connected).await;
    h.quiet().await;
    assert_eq!(server.list_count(ApiKind::Service), 1);
    open_all(&server).await;
    let web2 = service("web", 81, json!({}));
    server.upsert(&web2).expect("upsert");
    assert_eq!(h.next().await, vec![svc_up(&web2)]);
}

#[tokio::test]
async fn an_api_server_unavailable_at_start_delays_the_initial_sync() {
    let web = service("web", 80, json!({}));
    let server = TestApiServer::start().await.expect("server");
    put(&server, &web);
    server.set_unavailable(true);
    let mut h = Harness::start(&server, fast());
    h.wait_health(|h| matches!(h, SourceHealth::Disconnected { .. }))
        .await;
    h.quiet().await;
    // Retried with backoff, not in a tight loop (20 ms doubling to 200 ms: well under 40
    // lists per kind in the quiet period plus the wait).
    assert!(server.list_count(ApiKind::Service) < 40);
    server.set_unavailable(false);
    let events = h.initial().await;
    assert!(events.contains(&svc_up(&web)));
    h.wait_health(SourceHealth::is_connected).await;
}

#[tokio::test]
async fn bookmarks_are_ignored_but_move_the_resume_point() {
    let web = service("web", 80, json!({}));
    let server = TestApiServer::start().await.expect("server");
    put(&server, &web);
    let mut h = Harness::start(&server, fast());
    h.initial().await;
    open_all(&server).await;
    let watch = server
        .requests()
        .into_iter()
        .find(|r| r.kind == Some(ApiKind::Service) && r.watch)
        .expect("a Service watch");
    assert!(
        watch.uri.contains("allowWatchBookmarks=true"),
        "{}",
        watch.uri
    );

    // A change nobody watches moves the resourceVersion; the bookmark carries it.
    server.upsert(&node("node-b", "z2")).expect("upsert");
    server.bookmark();
    let bookmark_rv = server.resource_version().to_string();
    h.quiet().await;

    let before = server.requests().len();
    server.drop_connections();
    // Wait for the Service watch to come back.
    let deadline = tokio::time::Instant::now() + WAIT;
    let resumed = loop {
        let found = server.requests()[before..]
            .iter()
            .find(|r| r.kind == Some(ApiKind::Service) && r.watch)
            .cloned();
        if let Some(found) = found {
            break found;
        }
        assert!(tokio::time::Instant::now() < deadline, "no new watch");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(
        resumed.resource_version.as_deref(),
        Some(bookmark_rv.as_str())
    );
    h.quiet().await;
}

#[tokio::test]
async fn an_invalid_update_keeps_the_last_good_object_and_is_reported() {
    let web = service("web", 80, json!({}));
    let server = TestApiServer::start().await.expect("server");
    put(&server, &web);
    let mut h = Harness::start(&server, fast());
    h.initial().await;
    open_all(&server).await;

    server
        .upsert(&service("web", 70000, json!({})))
        .expect("upsert");
    server
        .upsert(&service("bad", 0, json!({})))
        .expect("upsert");
    h.quiet().await;
    assert_eq!(
        h.errors(),
        vec![
            "Service default/web: spec.ports[0].port: 70000 is out of range 1-65535; \
             keeping the last valid version"
                .to_string(),
            "Service default/bad: spec.ports[0].port: 0 is out of range 1-65535".to_string(),
        ]
    );

    // A relist sees the same invalid objects: nothing sent, nothing reported again.
    server.expire_watches();
    h.quiet().await;
    assert_eq!(server.list_count(ApiKind::Service), 2);
    assert_eq!(h.errors().len(), 2);

    // Fixed: delivered.
    open_all(&server).await;
    let web2 = service("web", 81, json!({}));
    server.upsert(&web2).expect("upsert");
    assert_eq!(h.next().await, vec![svc_up(&web2)]);
}

#[tokio::test]
async fn only_this_nodes_node_is_delivered() {
    let me = node(NODE, "z1");
    let server = TestApiServer::start().await.expect("server");
    put(&server, &me);
    put(&server, &node("node-b", "z2"));
    let mut h = Harness::start(&server, fast());
    let events = h.initial().await;
    let nodes: Vec<&SourceEvent> = events
        .iter()
        .filter(|e| matches!(e, SourceEvent::NodeUpsert(_)))
        .collect();
    assert_eq!(nodes, vec![&node_up(&me)]);
    open_all(&server).await;

    server.upsert(&node("node-b", "z3")).expect("upsert");
    h.quiet().await;
    let me2 = node(NODE, "z9");
    server.upsert(&me2).expect("upsert");
    assert_eq!(h.next().await, vec![node_up(&me2)]);
    server.delete(ApiKind::Node, "", NODE);
    assert_eq!(h.next().await, vec![SourceEvent::NodeDelete(NODE.into())]);
}

#[tokio::test]
async fn the_initial_list_is_paginated_and_sent_as_one_batch() {
    let server = TestApiServer::start().await.expect("server");
    let services: Vec<core::Service> = (0..7)
        .map(|i| service(&format!("svc-{i}"), 80, json!({})))
        .collect();
    for s in &services {
        server.upsert(s).expect("upsert");
    }
    let mut h = Harness::start(
        &server,
        ApiOptions {
            page_size: Some(3),
            ..fast()
        },
    );
    let events = h.initial().await;
    let upserts = events
        .iter()
        .filter(|e| matches!(e, SourceEvent::ServiceUpsert(_)))
        .count();
    assert_eq!(upserts, 7);
    assert_eq!(server.list_count(ApiKind::Service), 3);
}

#[tokio::test]
async fn the_source_stops_when_the_receiver_is_dropped() {
    let server = TestApiServer::start().await.expect("server");
    let mut h = Harness::start(&server, fast());
    h.initial().await;
    let Harness { rx, task, .. } = h;
    drop(rx);
    let result = tokio::time::timeout(WAIT, task).await;
    assert!(matches!(result, Ok(Ok(Ok(())))), "{result:?}");
}

#[tokio::test]
async fn an_invalid_node_name_is_refused() {
    let server = TestApiServer::start().await.expect("server");
    let client = server.client().expect("client");
    let (tx, _rx) = mpsc::channel(1);
    let result = ApiSource::new(client, "Not_A_Node").run(tx, |_| {}).await;
    let err = result.expect_err("invalid node name");
    assert!(err.to_string().starts_with("node name: "), "{err}");
}

/// A kubeconfig for `server` (any URL), with TLS verification off for `https` URLs.
fn kubeconfig(server: &str) -> tempfile::NamedTempFile {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    \
         insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: abc\ncontexts:\n\
         - name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
    );
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), text).expect("write kubeconfig");
    file
}

#[tokio::test]
async fn client_follows_kubeconfig_and_master_like_kube_proxy() {
    let server = TestApiServer::start().await.expect("server");

    // --master alone.
    let client = kp_source::api::client(None, Some(server.url()))
        .await
        .expect("client from --master");
    let version = client.apiserver_version().await.expect("version");
    assert_eq!(version.minor, "35");

    // --kubeconfig alone, and with --master overriding its server (an https URL with
    // nothing behind it, so the TLS setup is built but never used).
    let file = kubeconfig(&server.url());
    let client = kp_source::api::client(Some(file.path().to_path_buf()), None)
        .await
        .expect("client from --kubeconfig");
    client.apiserver_version().await.expect("version");
    let file = kubeconfig("https://127.0.0.1:1");
    kp_source::api::client(Some(file.path().to_path_buf()), None)
        .await
        .expect("an https client");
    let client = kp_source::api::client(Some(file.path().to_path_buf()), Some(server.url()))
        .await
        .expect("client from --kubeconfig and --master");
    client.apiserver_version().await.expect("version");

    // Errors name what is wrong.
    let Err(err) = kp_source::api::client(Some("/nonexistent/kubeconfig".into()), None).await
    else {
        panic!("a missing kubeconfig must fail");
    };
    assert!(
        err.to_string()
            .starts_with("cannot read kubeconfig /nonexistent/kubeconfig: "),
        "{err}"
    );
    let Err(err) = kp_source::api::client(None, Some("http://[::1".into())).await else {
        panic!("a bad --master must fail");
    };
    assert!(err.to_string().starts_with("invalid --master URL"), "{err}");
}

/// The lists of `kind` (first pages) in the server's request log.
fn lists(server: &TestApiServer, kind: ApiKind) -> Vec<kp_testkit::apiserver::ApiRequest> {
    server
        .requests()
        .into_iter()
        .filter(|r| r.kind == Some(kind) && !r.watch && r.param("continue").is_none())
        .collect()
}

/// Issue 23 item 9: a (re)start lists from the API server's watch cache
/// (`resourceVersion=0`), as client-go's informers do, never with a quorum read from etcd.
#[tokio::test]
async fn a_start_lists_from_the_watch_cache_not_with_a_quorum_read() {
    let server = TestApiServer::start().await.expect("server");
    put(&server, &service("web", 80, json!({})));
    put(&server, &slice("web-abc", "10.0.0.4", json!({})));
    put(&server, &node(NODE, "z1"));
    for _ in 0..2 {
        // Started, then stopped, then started again: a restart.
        let mut h = Harness::start(&server, fast());
        h.initial().await;
        open_all(&server).await;
        let Harness { rx, task, .. } = h;
        drop(rx);
        let _ = tokio::time::timeout(WAIT, task).await;
    }
    let requests = server.requests();
    let quorum: Vec<_> = requests.iter().filter(|r| r.is_quorum_list()).collect();
    assert!(quorum.is_empty(), "quorum lists: {quorum:#?}");
    for kind in ApiKind::ALL {
        let lists = lists(&server, kind);
        assert_eq!(lists.len(), 2, "{lists:#?}");
        for list in lists {
            assert_eq!(list.param("resourceVersion"), Some("0"), "{}", list.uri);
            assert_eq!(
                list.param("resourceVersionMatch"),
                Some("NotOlderThan"),
                "{}",
                list.uri
            );
        }
    }
}

/// Issue 24 item 2: the API server's resourceVersion goes backwards (etcd restored from a
/// backup): the watches are answered "Too large resource version", the source lists again
/// with a quorum read (not from the cache: resourceVersion `""`) and applies what changed
/// at once, then keeps watching.
#[tokio::test]
async fn a_server_gone_back_in_time_is_relisted_with_a_quorum_read() {
    let web = service("web", 80, json!({}));
    let server = TestApiServer::start().await.expect("server");
    put(&server, &web);
    put(&server, &node(NODE, "z1"));
    let backup = server.backup();
    let mut h = Harness::start(&server, fast());
    h.initial().await;
    open_all(&server).await;
    // Seen by the source after the backup was taken.
    let db = service("db", 5432, json!({}));
    put(&server, &db);
    assert_eq!(h.next().await, vec![svc_up(&db)]);
    let cache = service("cache", 6379, json!({}));
    put(&server, &cache);
    assert_eq!(h.next().await, vec![svc_up(&cache)]);
    let seen = server.resource_version();

    // The restore, then a change made while the source could not see it.
    server.restore(&backup);
    let web2 = service("web", 81, json!({}));
    put(&server, &web2);
    assert!(server.resource_version() < seen);
    let batch = tokio::time::timeout(Duration::from_secs(3), h.rx.recv())
        .await
        .expect("the restored state within 3 s")
        .expect("a batch");
    assert_eq!(
        batch,
        vec![
            svc_up(&web2),
            SourceEvent::ServiceDelete(nn("cache")),
            SourceEvent::ServiceDelete(nn("db")),
        ]
    );
    h.quiet().await;
    h.wait_health(SourceHealth::is_connected).await;

    // The Service lists: from the cache at start, then not older than what was seen
    // (answered too large), then the quorum read.
    let rvs: Vec<Option<String>> = lists(&server, ApiKind::Service)
        .iter()
        .map(|r| r.resource_version.clone())
        .collect();
    assert_eq!(
        rvs,
        vec![Some("0".to_string()), Some(seen.to_string()), None],
        "{:#?}",
        server.requests()
    );

    // And it keeps watching from the restored server's resourceVersions.
    open_all(&server).await;
    let api = service("api", 443, json!({}));
    put(&server, &api);
    assert_eq!(h.next().await, vec![svc_up(&api)]);
}

/// Options whose backoff is long enough to be seen: a re-watch that waited for it would
/// miss the deadlines below.
fn slow_backoff() -> ApiOptions {
    ApiOptions {
        backoff_initial: Duration::from_secs(4),
        backoff_max: Duration::from_secs(4),
        ..fast()
    }
}

/// Issue 24 item 2: a watch the server ends (its timeout), that is cut mid-stream or whose
/// connection is reset is watched again at once, not after a backoff delay.
#[tokio::test]
async fn ended_and_cut_watches_are_watched_again_at_once() {
    let server = TestApiServer::start().await.expect("server");
    put(&server, &service("web", 80, json!({})));
    let mut h = Harness::start(&server, slow_backoff());
    h.initial().await;
    open_all(&server).await;
    for round in 0..4 {
        // A watch that lasted a while (one ended within a second without events would
        // wait for the backoff).
        tokio::time::sleep(Duration::from_millis(1100)).await;
        match round {
            0 | 3 => server.end_watches(),
            1 => server.drop_connections(),
            _ => server.reset_connections(),
        }
        let svc = service(&format!("svc-{round}"), 80, json!({}));
        put(&server, &svc);
        let batch = tokio::time::timeout(Duration::from_secs(2), h.rx.recv())
            .await
            .unwrap_or_else(|_| panic!("round {round}: not watched again at once"))
            .expect("a batch");
        assert_eq!(batch, vec![svc_up(&svc)]);
        open_all(&server).await;
    }
    assert_eq!(server.list_count(ApiKind::Service), 1);
    h.wait_health(SourceHealth::is_connected).await;
}

/// Issue 24 item 2: after an outage that drove the backoff to its cap, the delay starts
/// over once the source has been healthy for `backoff_reset`: a later short outage is
/// over for the source within a few initial delays, not after the cap.
#[tokio::test]
async fn the_backoff_starts_over_after_a_healthy_period() {
    let server = TestApiServer::start().await.expect("server");
    put(&server, &service("web", 80, json!({})));
    let options = ApiOptions {
        backoff_initial: Duration::from_millis(200),
        backoff_max: Duration::from_secs(4),
        backoff_reset: Duration::from_secs(1),
        ..fast()
    };
    let mut h = Harness::start(&server, options);
    h.initial().await;
    open_all(&server).await;
    // 200 ms doubling to 4 s: the cap is reached within 6.2-9.3 s of failures.
    server.set_unavailable(true);
    tokio::time::sleep(Duration::from_secs(10)).await;
    server.set_unavailable(false);
    h.wait_health(SourceHealth::is_connected).await; // within the 4 s cap (WAIT is 5 s)
    open_all(&server).await;
    // Healthy for longer than backoff_reset.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    server.set_unavailable(true);
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.set_unavailable(false);
    let back = tokio::time::Instant::now();
    let web2 = service("web", 81, json!({}));
    put(&server, &web2);
    let batch = tokio::time::timeout(Duration::from_millis(2500), h.rx.recv())
        .await
        .expect("the short outage was retried from the initial delay, not the 4 s cap")
        .expect("a batch");
    assert_eq!(batch, vec![svc_up(&web2)]);
    assert!(back.elapsed() < Duration::from_millis(2500));
}

fn service_cidr(name: &str, cidrs: &[&str]) -> k8s_openapi::api::networking::v1::ServiceCIDR {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"cidrs": cidrs},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "", "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
    }))
    .expect("ServiceCIDR JSON")
}

fn service_cidr_up(name: &str, cidrs: &[&str]) -> SourceEvent {
    SourceEvent::ServiceCidrUpsert(kp_model::ServiceCidr {
        name: name.into(),
        cidrs: cidrs.iter().map(|c| c.parse().expect("CIDR")).collect(),
    })
}

/// ServiceCIDRs (`/apis/networking.k8s.io/v1/servicecidrs`) are listed and watched like the
/// other kinds, but no `Synced` is sent for them: upstream's proxier does not wait for them.
/// An invalid one is reported by name and field and not delivered.
#[tokio::test]
async fn service_cidrs_are_watched_without_holding_back_the_first_sync() {
    let server = TestApiServer::start().await.expect("server");
    put(&server, &service("web", 80, json!({})));
    put(&server, &slice("web-abc", "10.0.0.4", json!({})));
    put(&server, &node(NODE, "z1"));
    put(
        &server,
        &service_cidr("kubernetes", &["10.96.0.0/12", "fd00:96::/112"]),
    );
    let mut h = Harness::start(&server, fast());
    let mut seen = Vec::new();
    while seen
        .iter()
        .filter(|e| matches!(e, SourceEvent::Synced(_)))
        .count()
        < 3
        || !seen
            .iter()
            .any(|e| matches!(e, SourceEvent::ServiceCidrUpsert(_)))
    {
        seen.extend(h.next().await);
    }
    assert!(seen.contains(&service_cidr_up(
        "kubernetes",
        &["10.96.0.0/12", "fd00:96::/112"]
    )));
    assert!(
        !seen.contains(&SourceEvent::Synced(ObjectKind::ServiceCidr)),
        "{seen:?}"
    );
    h.quiet().await;
    open_all(&server).await;
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.kind == Some(ApiKind::ServiceCidr)
                && r.uri
                    .starts_with("/apis/networking.k8s.io/v1/servicecidrs?")),
        "{:?}",
        server.requests()
    );

    put(&server, &service_cidr("extra", &["10.0.200.0/24"]));
    assert_eq!(
        h.next().await,
        vec![service_cidr_up("extra", &["10.0.200.0/24"])]
    );
    // Three CIDRs: the API server would refuse it; the source reports and skips it.
    put(
        &server,
        &service_cidr("bad", &["10.1.0.0/16", "10.2.0.0/16", "fd00::/64"]),
    );
    h.quiet().await;
    assert!(
        h.errors()
            .iter()
            .any(|e| e.starts_with("ServiceCIDR bad: spec.cidrs: 3 CIDRs listed")),
        "{:?}",
        h.errors()
    );
    server.delete(ApiKind::ServiceCidr, "", "kubernetes");
    assert_eq!(
        h.next().await,
        vec![SourceEvent::ServiceCidrDelete("kubernetes".into())]
    );
    h.wait_health(SourceHealth::is_connected).await;
}

/// An API server that does not serve ServiceCIDRs (older than 1.33, or a ClusterRole that
/// does not grant them): the other kinds sync and the source counts as connected; once they
/// are served, they arrive.
#[tokio::test]
async fn an_api_server_without_service_cidrs_still_syncs_and_is_connected() {
    let server = TestApiServer::start().await.expect("server");
    server.set_served(ApiKind::ServiceCidr, false);
    put(&server, &service("web", 80, json!({})));
    put(&server, &slice("web-abc", "10.0.0.4", json!({})));
    put(&server, &node(NODE, "z1"));
    put(&server, &service_cidr("kubernetes", &["10.96.0.0/12"]));
    let mut h = Harness::start(&server, fast());
    let events = h.initial().await;
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, SourceEvent::ServiceCidrUpsert(_))),
        "{events:?}"
    );
    h.wait_health(SourceHealth::is_connected).await;
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.kind == Some(ApiKind::ServiceCidr)),
        "the source asked for ServiceCIDRs"
    );
    server.set_served(ApiKind::ServiceCidr, true);
    assert_eq!(
        h.next().await,
        vec![service_cidr_up("kubernetes", &["10.96.0.0/12"])]
    );
    assert!(h.health.borrow().is_connected());
}
