//! What operators and their dashboards read, end to end: the daemon in a network namespace
//! against the test API server (kp-testkit), as a kubeadm node runs it.
//!
//! - `/healthz` follows the Node at once (upstream's `NodeEligibleHandler`): a
//!   `ToBeDeletedByClusterAutoscaler` taint or a deletionTimestamp makes it 503 when the Node
//!   event arrives, before (and without) any sync.
//! - `/metrics` has the process, `rest_client_*` and build-info metrics with live values, the
//!   conntrack reconciler's real time and the rules the last iptables sync wrote; the events
//!   upstream posts reach the Events API; `/configz` serves the effective configuration;
//!   `--logging-format=json` writes klog-shaped JSON lines.
//!
//! docs/observability.md describes all of it.

use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kp_testkit::apiserver::{ApiKind, TestApiServer};
use kp_testkit::golden::SEED_CLUSTER;
use kp_testkit::{ChildGuard, Netns, require_root, wait_for};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_kube-proxy-rs");

/// Starts the test API server on a thread inside `ns` (so the proxy, also in `ns`, reaches
/// it on 127.0.0.1); the returned sender stops it.
fn api_server_in(ns: &Netns) -> (TestApiServer, tokio::sync::oneshot::Sender<()>) {
    let (tx, rx) = mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    ns.spawn_in(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let server = TestApiServer::start().await.unwrap();
            tx.send(server).unwrap();
            let _ = stop_rx.await;
        });
    })
    .unwrap();
    (rx.recv_timeout(Duration::from_secs(10)).unwrap(), stop_tx)
}

fn seed_objects() -> Vec<Value> {
    SEED_CLUSTER
        .split("\n---\n")
        .map(|doc| serde_saphyr::from_str::<Value>(doc).unwrap())
        .collect()
}

/// The Node `k8s-master`, with `extra` merged into it.
fn node(extra: Value) -> Value {
    let mut node = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "k8s-master", "labels": {"kubernetes.io/hostname": "k8s-master"}},
        "spec": {},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.56.10"}]},
    });
    merge(&mut node, extra);
    node
}

fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (slot, v) => *slot = v,
    }
}

/// `GET http://127.0.0.1:<port><path>` from inside `ns`: the status code and the body
/// (code 0 when nothing answered).
fn get(ns: &Netns, port: u16, path: &str) -> (u16, String) {
    let url = format!("http://127.0.0.1:{port}{path}");
    let out = ns
        .run(
            "curl",
            [
                "-s",
                "--max-time",
                "5",
                "-w",
                "\n%{http_code}",
                url.as_str(),
            ],
        )
        .unwrap_or_default();
    let (body, code) = out.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// The value of the sample `series` (name with its labels, as printed) in `metrics`.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// The daemon in `ns`, fed by `api`, logging to `log`; `extra` flags follow the common ones.
fn start_daemon(
    ns: &Netns,
    api: &TestApiServer,
    log: &std::path::Path,
    extra: &[&str],
    path_prefix: Option<&std::path::Path>,
) -> ChildGuard {
    let file = std::fs::File::create(log).unwrap();
    let mut cmd = ns.command(BIN);
    cmd.args([
        "--master",
        &api.url(),
        "--hostname-override=k8s-master",
        "--cluster-cidr=10.0.0.0/16",
        "--healthz-bind-address=127.0.0.1:10256",
        "--metrics-bind-address=127.0.0.1:10249",
        "--iptables-min-sync-period=100ms",
    ])
    .args(extra)
    .stdin(Stdio::null())
    .stdout(file.try_clone().unwrap())
    .stderr(file);
    if let Some(prefix) = path_prefix {
        cmd.env(
            "PATH",
            format!(
                "{}:{}",
                prefix.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        );
    }
    ChildGuard::spawn(&mut cmd, "kube-proxy-rs").unwrap()
}

fn nat(ns: &Netns) -> String {
    ns.run("iptables-save", ["-t", "nat"]).unwrap_or_default()
}

/// `/healthz` turns 503 as soon as the Node is tainted `ToBeDeletedByClusterAutoscaler` or
/// gets a deletionTimestamp, and 200 again when the taint goes, with no sync in between: the
/// cluster is otherwise quiet (no Service or EndpointSlice changes, a sync period of one
/// hour), so today's "at the next sync" would leave it 200 for up to an hour. A deleted Node
/// is not eligible either. `/livez` stays 200 throughout (it ignores the Node).
#[test]
fn healthz_follows_the_node_at_once() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("hznode").unwrap();
    let (api, _stop) = api_server_in(&ns);
    for object in seed_objects() {
        api.upsert_value(object).unwrap();
    }
    api.upsert_value(node(json!({}))).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("proxy.log");
    let mut proxy = start_daemon(&ns, &api, &log, &["--iptables-sync-period=1h"], None);
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    proxy
        .wait_for(
            || nat(&ns).contains("-A KUBE-SEP-H5CTQI4CMO4ES5BQ"),
            Duration::from_secs(30),
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", read_log()));
    let syncs = || {
        sample(
            &get(&ns, 10249, "/metrics").1,
            "kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"}",
        )
        .unwrap_or(0.0)
    };
    // The first sync is recorded a moment after its rules reach the kernel.
    wait_for(|| syncs() >= 1.0, Duration::from_secs(10)).unwrap();
    let (code, body) = get(&ns, 10256, "/healthz");
    assert_eq!(code, 200, "{body}");
    let synced = syncs();

    let cases = [
        (
            "the ToBeDeletedByClusterAutoscaler taint",
            node(json!({"spec": {"taints": [
                {"key": "ToBeDeletedByClusterAutoscaler", "value": "1784628000", "effect": "NoSchedule"}
            ]}})),
            503,
        ),
        ("the taint removed", node(json!({})), 200),
        (
            "a deletionTimestamp",
            node(json!({"metadata": {"deletionTimestamp": "2026-07-21T10:00:00Z"}})),
            503,
        ),
        ("the deletionTimestamp gone", node(json!({})), 200),
    ];
    for (what, object, want) in cases {
        let started = Instant::now();
        api.upsert_value(object).unwrap();
        wait_for(
            || get(&ns, 10256, "/healthz").0 == want,
            Duration::from_secs(10),
        )
        .unwrap_or_else(|_| {
            panic!(
                "/healthz is not {want} after {what}: {:?}\n{}",
                get(&ns, 10256, "/healthz"),
                read_log()
            )
        });
        let took = started.elapsed();
        assert!(took < Duration::from_secs(5), "{what}: {took:?}");
        let (code, body) = get(&ns, 10256, "/healthz");
        assert_eq!(code, want, "{what}: {body}");
        assert!(
            body.contains(&format!("\"nodeEligible\":{}", want == 200)),
            "{what}: {body}"
        );
        assert_eq!(
            get(&ns, 10256, "/livez").0,
            200,
            "{what}: /livez ignores the Node"
        );
        assert_eq!(
            syncs(),
            synced,
            "{what}: no sync ran, the Node alone did it"
        );
    }
    api.delete(ApiKind::Node, "", "k8s-master");
    wait_for(
        || get(&ns, 10256, "/healthz").0 == 503,
        Duration::from_secs(10),
    )
    .unwrap_or_else(|_| panic!("a deleted Node is not eligible\n{}", read_log()));
    assert!(proxy.try_wait().unwrap().is_none(), "{}", read_log());
}

/// A UDP Service `dns` (10.96.0.53:53 → 5353) with one endpoint `ip`.
fn dns_objects(ip: &str) -> Vec<Value> {
    vec![
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "dns", "namespace": "default"},
            "spec": {"clusterIP": "10.96.0.53", "clusterIPs": ["10.96.0.53"],
                     "ports": [{"name": "dns", "port": 53, "targetPort": 5353, "protocol": "UDP"}]},
        }),
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "dns-1", "namespace": "default",
                         "labels": {"kubernetes.io/service-name": "dns"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [ip], "nodeName": "k8s-master", "conditions": {"ready": true}}],
            "ports": [{"name": "dns", "port": 5353, "protocol": "UDP"}],
        }),
    ]
}

/// The path of `program` on this process's `PATH`, if any.
fn which(program: &str) -> Option<std::path::PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// Wrappers of the IPv4 `iptables-restore` programs in `dir` that keep each payload they
/// are given (the last one in `dir/last-payload`) and run the real program with it.
fn restore_recorders(dir: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    for name in [
        "iptables-restore",
        "iptables-nft-restore",
        "iptables-legacy-restore",
    ] {
        let Some(real) = which(name) else { continue };
        let script = dir.join(name);
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\ntmp=$(mktemp)\ncat > \"$tmp\"\ncp \"$tmp\" {dir}/last-payload.new && mv {dir}/last-payload.new {dir}/last-payload\nexec {real} \"$@\" < \"$tmp\"\n",
                dir = dir.display(),
                real = real.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// The `-A` lines of kube-proxy's chains (not the jumps from the built-in chains, which
/// upstream does not count either) in each table of an `iptables-restore` payload:
/// (filter, nat).
fn rules_in(payload: &str) -> (usize, usize) {
    let (mut table, mut filter, mut nat) = ("", 0, 0);
    for line in payload.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = if t == "filter" {
                "filter"
            } else if t == "nat" {
                "nat"
            } else {
                ""
            };
        } else if line.starts_with("-A ")
            && !["INPUT", "FORWARD", "OUTPUT", "PREROUTING", "POSTROUTING"]
                .contains(&line[3..].split(' ').next().unwrap_or(""))
        {
            match table {
                "filter" => filter += 1,
                "nat" => nat += 1,
                _ => {}
            }
        }
    }
    (filter, nat)
}

/// Everything a kube-proxy dashboard, alert or log pipeline reads, from one daemon run in
/// iptables mode against the test API server with `--logging-format=json`:
///
/// - the process metrics with live values, `kubernetes_build_info`;
/// - `rest_client_requests_total` / `rest_client_request_duration_seconds` counting exactly
///   the requests the API server received (lists, watches, the event POST);
/// - `kubeproxy_sync_proxy_rules_iptables_last{table}` equal to the rules of the last
///   (partial) sync's `iptables-restore` payload, below `..._iptables_total`;
/// - `kubeproxy_conntrack_reconciler_sync_duration_seconds` observing a real, nonzero time
///   when a UDP Service changes;
/// - the `Starting` event (events.k8s.io/v1, reporting controller `kube-proxy`, about the
///   Node);
/// - `/configz` with the effective configuration;
/// - every log line a JSON object with klog's keys.
///
/// With `KP_OBSERVABILITY_METRICS=<file>` the final `/metrics` text is written there (the
/// sample list in issue 23's closing note comes from it).
#[test]
fn metrics_events_configz_and_json_logs_as_upstream() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("obs").unwrap();
    let (api, _stop) = api_server_in(&ns);
    for object in seed_objects() {
        api.upsert_value(object).unwrap();
    }
    for object in dns_objects("10.0.0.4") {
        api.upsert_value(object).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    restore_recorders(&bin);
    let log = dir.path().join("proxy.log");
    let mut proxy = start_daemon(
        &ns,
        &api,
        &log,
        &["--logging-format=json", "-v=2"],
        Some(&bin),
    );
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    proxy
        .wait_for(
            || nat(&ns).contains("-A KUBE-SEP-H5CTQI4CMO4ES5BQ"),
            Duration::from_secs(30),
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", read_log()));
    let metrics = || get(&ns, 10249, "/metrics").1;
    let value =
        |m: &str, series: &str| sample(m, series).unwrap_or_else(|| panic!("no {series} in\n{m}"));
    let v4 = |name: &str| format!("{name}{{ip_family=\"IPv4\"}}");
    wait_for(
        || {
            sample(
                &metrics(),
                &v4("kubeproxy_sync_full_proxy_rules_duration_seconds_count"),
            ) >= Some(1.0)
        },
        Duration::from_secs(10),
    )
    .unwrap();

    // A UDP Service changes: the conntrack reconciler runs, and its real time is observed.
    let ct_count = v4("kubeproxy_conntrack_reconciler_sync_duration_seconds_count");
    let ct_sum = v4("kubeproxy_conntrack_reconciler_sync_duration_seconds_sum");
    let before = sample(&metrics(), &ct_count).unwrap_or(0.0);
    for object in dns_objects("10.0.0.5") {
        api.upsert_value(object).unwrap();
    }
    wait_for(
        || sample(&metrics(), &ct_count).unwrap_or(0.0) > before,
        Duration::from_secs(10),
    )
    .unwrap_or_else(|_| {
        panic!(
            "no conntrack reconciliation after a UDP change\n{}\n{}",
            metrics(),
            read_log()
        )
    });
    let m = metrics();
    assert!(
        value(&m, &ct_sum) > 0.0,
        "the reconciler took no time?\n{m}"
    );

    // An endpoint of nginx-svc goes: a partial sync. `..._iptables_last` is what it wrote.
    let partial = v4("kubeproxy_sync_partial_proxy_rules_duration_seconds_count");
    let partials = sample(&metrics(), &partial).unwrap_or(0.0);
    let slice = seed_objects()
        .into_iter()
        .find(|o| o["kind"] == "EndpointSlice")
        .map(|mut o| {
            o["endpoints"]
                .as_array_mut()
                .unwrap()
                .retain(|e| e["addresses"][0] != "10.0.1.2");
            o
        })
        .unwrap();
    api.upsert_value(slice).unwrap();
    wait_for(
        || sample(&metrics(), &partial).unwrap_or(0.0) > partials,
        Duration::from_secs(10),
    )
    .unwrap();
    let last_nat = "kubeproxy_sync_proxy_rules_iptables_last{ip_family=\"IPv4\",table=\"nat\"}";
    let last_filter =
        "kubeproxy_sync_proxy_rules_iptables_last{ip_family=\"IPv4\",table=\"filter\"}";
    let total_nat = "kubeproxy_sync_proxy_rules_iptables_total{ip_family=\"IPv4\",table=\"nat\"}";
    let payload = std::fs::read_to_string(bin.join("last-payload")).unwrap();
    let (filter_rules, nat_rules) = rules_in(&payload);
    let m = metrics();
    assert!(nat_rules > 0, "{payload}");
    assert_eq!(value(&m, last_nat), nat_rules as f64, "{payload}\n{m}");
    assert_eq!(
        value(&m, last_filter),
        filter_rules as f64,
        "{payload}\n{m}"
    );
    assert!(
        value(&m, last_nat) < value(&m, total_nat),
        "a partial sync writes fewer nat rules than the table holds\n{m}"
    );

    // The Starting event, through the Events API.
    wait_for(|| !api.events().is_empty(), Duration::from_secs(10))
        .unwrap_or_else(|_| panic!("no event posted\n{}", read_log()));
    let events = api.events();
    let starting = events
        .iter()
        .find(|e| e["reason"] == "Starting")
        .unwrap_or_else(|| panic!("no Starting event in {events:#?}"));
    assert_eq!(starting["apiVersion"], "events.k8s.io/v1", "{starting}");
    assert_eq!(starting["type"], "Normal", "{starting}");
    assert_eq!(starting["action"], "StartKubeProxy", "{starting}");
    assert_eq!(starting["reportingController"], "kube-proxy", "{starting}");
    assert!(
        starting["reportingInstance"]
            .as_str()
            .is_some_and(|i| i.starts_with("kube-proxy-")),
        "{starting}"
    );
    assert_eq!(starting["regarding"]["kind"], "Node", "{starting}");
    assert_eq!(starting["regarding"]["name"], "k8s-master", "{starting}");
    assert_eq!(starting["metadata"]["namespace"], "default", "{starting}");
    assert!(starting["eventTime"].is_string(), "{starting}");

    // client-go's request metrics count exactly what the server received.
    let host = api.addr().to_string();
    let gets = format!("rest_client_requests_total{{code=\"200\",host=\"{host}\",method=\"GET\"}}");
    let posts =
        format!("rest_client_requests_total{{code=\"201\",host=\"{host}\",method=\"POST\"}}");
    let get_latency =
        format!("rest_client_request_duration_seconds_count{{host=\"{host}\",verb=\"GET\"}}");
    let served = |method: &str| api.requests().iter().filter(|r| r.method == method).count() as f64;
    wait_for(
        || {
            let m = metrics();
            sample(&m, &gets) == Some(served("GET")) && sample(&m, &posts) == Some(served("POST"))
        },
        Duration::from_secs(10),
    )
    .unwrap_or_else(|_| {
        panic!(
            "rest_client_requests_total does not match the {} GET and {} POST requests served\n{}",
            served("GET"),
            served("POST"),
            metrics()
        )
    });
    let m = metrics();
    assert!(
        value(&m, &gets) >= 6.0,
        "3 lists and 3 watches at least\n{m}"
    );
    assert_eq!(value(&m, &get_latency), value(&m, &gets), "{m}");

    // The process metrics, with live values.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(value(&m, "process_cpu_seconds_total") > 0.0, "{m}");
    assert!(value(&m, "process_resident_memory_bytes") > 1e6, "{m}");
    assert!(value(&m, "process_virtual_memory_bytes") > 1e6, "{m}");
    assert!(value(&m, "process_open_fds") > 3.0, "{m}");
    assert!(value(&m, "process_max_fds") > 0.0, "{m}");
    let start = value(&m, "process_start_time_seconds");
    assert!(start <= now && start > now - 600.0, "{start} vs {now}");
    let build = m
        .lines()
        .find(|l| l.starts_with("kubernetes_build_info{"))
        .unwrap_or_else(|| panic!("no kubernetes_build_info\n{m}"));
    assert!(
        build.contains("git_version=\"v1.35.0+kube-proxy-rs.")
            && build.contains("major=\"1\",minor=\"35\"")
            && build.contains("compiler=\"rustc\"")
            && build.ends_with("} 1"),
        "{build}"
    );

    // /configz: the effective configuration, in upstream's shape.
    let (code, body) = get(&ns, 10249, "/configz");
    assert_eq!(code, 200, "{body}");
    let configz: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    let c = &configz["kubeproxy.config.k8s.io"];
    assert_eq!(c["Mode"], "iptables", "{body}");
    assert_eq!(c["HostnameOverride"], "k8s-master", "{body}");
    assert_eq!(c["MetricsBindAddress"], "127.0.0.1:10249", "{body}");
    assert_eq!(c["MinSyncPeriod"], "100ms", "{body}");
    assert_eq!(c["SyncPeriod"], "30s", "{body}");
    assert_eq!(
        c["DetectLocal"]["ClusterCIDRs"],
        json!(["10.0.0.0/16"]),
        "{body}"
    );
    assert_eq!(c["Logging"]["format"], "json", "{body}");
    assert_eq!(c["Logging"]["verbosity"], 2, "{body}");

    if let Some(path) = std::env::var_os("KP_OBSERVABILITY_METRICS") {
        std::fs::write(path, metrics()).unwrap();
    }
    drop(proxy);

    // Every line of the log is a klog-shaped JSON object.
    let text = read_log();
    let mut lines = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(
            v["ts"].as_f64().is_some_and(|t| t > 1e12),
            "ts in ms: {line}"
        );
        assert!(v["msg"].is_string(), "{line}");
        assert!(v["caller"].is_string(), "{line}");
        lines += 1;
    }
    assert!(lines > 5, "{text}");
    assert!(
        text.lines()
            .any(|l| l.contains("\"msg\":\"starting kube-proxy-rs\"")
                && l.contains("\"v\":0")
                && l.contains("\"node\":\"k8s-master\"")),
        "{text}"
    );
}

/// Holds TCP `port` on all addresses of `ns` until the returned sender is dropped.
fn occupy(ns: &Netns, port: u16) -> mpsc::Sender<()> {
    let (tx, rx) = mpsc::channel::<()>();
    let (ready_tx, ready_rx) = mpsc::channel();
    ns.spawn_in(move || {
        let listener = std::net::TcpListener::bind(("0.0.0.0", port)).unwrap();
        ready_tx.send(()).unwrap();
        let _ = rx.recv();
        drop(listener);
    })
    .unwrap();
    ready_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    tx
}

/// The failure events upstream posts: `FailedToStartProxierHealthcheck` about the Node when
/// the healthz port cannot be bound with `--bind-address-hard-fail` (the daemon then
/// exits), and `FailedToStartServiceHealthcheck` about the Service when its
/// `healthCheckNodePort` is taken.
#[test]
fn failure_events_name_the_node_and_the_service() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("obsfail").unwrap();
    let (api, _stop) = api_server_in(&ns);
    for object in seed_objects() {
        api.upsert_value(object).unwrap();
    }
    api.upsert_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "local", "namespace": "default"},
        "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.70", "clusterIPs": ["10.96.0.70"],
                 "externalTrafficPolicy": "Local", "healthCheckNodePort": 32000,
                 "ports": [{"port": 80, "targetPort": 80, "nodePort": 30070, "protocol": "TCP"}]},
    }))
    .unwrap();
    let dir = tempfile::tempdir().unwrap();

    // The healthz port is taken and binding is fatal.
    let healthz = occupy(&ns, 10256);
    let log = dir.path().join("hardfail.log");
    let mut proxy = start_daemon(&ns, &api, &log, &["--bind-address-hard-fail"], None);
    proxy
        .wait_for(|| false, Duration::from_secs(20))
        .expect_err("the daemon exits");
    let status = proxy.try_wait().unwrap();
    assert!(
        status.is_some_and(|s| !s.success()),
        "{status:?}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let events = api.events();
    let failed = events
        .iter()
        .find(|e| e["reason"] == "FailedToStartProxierHealthcheck")
        .unwrap_or_else(|| panic!("no FailedToStartProxierHealthcheck in {events:#?}"));
    assert_eq!(failed["type"], "Warning", "{failed}");
    assert_eq!(failed["action"], "StartKubeProxy", "{failed}");
    assert_eq!(failed["regarding"]["kind"], "Node", "{failed}");
    assert!(
        failed["note"].as_str().is_some_and(|n| n.contains("10256")),
        "{failed}"
    );
    drop(healthz);
    drop(proxy);

    // The Service's health-check port is taken.
    let hc = occupy(&ns, 32000);
    let log = dir.path().join("proxy.log");
    let mut proxy = start_daemon(&ns, &api, &log, &[], None);
    proxy
        .wait_for(
            || {
                api.events()
                    .iter()
                    .any(|e| e["reason"] == "FailedToStartServiceHealthcheck")
            },
            Duration::from_secs(30),
        )
        .unwrap_or_else(|e| {
            panic!(
                "{e}: {:#?}\n{}",
                api.events(),
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        });
    let events = api.events();
    let failed = events
        .iter()
        .find(|e| e["reason"] == "FailedToStartServiceHealthcheck")
        .unwrap();
    assert_eq!(failed["type"], "Warning", "{failed}");
    assert_eq!(failed["action"], "Listen", "{failed}");
    assert_eq!(failed["regarding"]["kind"], "Service", "{failed}");
    assert_eq!(failed["regarding"]["namespace"], "default", "{failed}");
    assert_eq!(failed["regarding"]["name"], "local", "{failed}");
    assert_eq!(failed["metadata"]["namespace"], "default", "{failed}");
    let note = failed["note"].as_str().unwrap_or("");
    assert!(
        note.starts_with(
            "node k8s-master failed to start healthcheck \"default/local\" on port 32000"
        ),
        "{failed}"
    );
    drop(hc);
}
