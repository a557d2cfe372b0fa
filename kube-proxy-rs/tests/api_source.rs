//! The daemon fed by an API server (a test server speaking the real list/watch protocol),
//! in a network namespace: it programs the rules, keeps them while the API server is
//! unreachable, relists after the watches expire, and answers /healthz and /metrics like
//! upstream kube-proxy.

use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use kp_testkit::apiserver::{ApiKind, TestApiServer};
use kp_testkit::golden::SEED_CLUSTER;
use kp_testkit::{ChildGuard, Netns, require_root, wait_for};

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

fn seed_objects() -> Vec<serde_json::Value> {
    SEED_CLUSTER
        .split("\n---\n")
        .map(|doc| serde_saphyr::from_str::<serde_json::Value>(doc).unwrap())
        .collect()
}

fn nat(ns: &Netns) -> String {
    let text = ns.run("iptables-save", ["-t", "nat"]).unwrap_or_default();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn api_source_programs_survives_outages_and_relists() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("api").unwrap();
    let (api, _stop) = api_server_in(&ns);
    for object in seed_objects() {
        api.upsert_value(object).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("proxy.log");
    let log = std::fs::File::create(&log_path).unwrap();
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
    .stdin(Stdio::null())
    .stdout(log.try_clone().unwrap())
    .stderr(log);
    let mut proxy = ChildGuard::spawn(&mut cmd, "kube-proxy-rs").unwrap();
    let read_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    proxy
        .wait_for(
            || nat(&ns).contains("-A KUBE-SEP-H5CTQI4CMO4ES5BQ"),
            Duration::from_secs(30),
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", read_log()));

    // healthz and metrics, like upstream's.
    let get = |port: u16, path: &str| -> String {
        let out = ns
            .command("bash")
            .arg("-c")
            .arg(format!("exec 3<>/dev/tcp/127.0.0.1/{port}; printf 'GET {path} HTTP/1.0\\r\\n\\r\\n' >&3; cat <&3"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let healthz = get(10256, "/healthz");
    assert!(
        healthz.starts_with("HTTP/1.0 200") || healthz.starts_with("HTTP/1.1 200"),
        "{healthz}"
    );
    assert!(
        healthz.contains("\"healthy\":true") && healthz.contains("\"nodeEligible\":true"),
        "{healthz}"
    );
    // The rules reach the kernel a moment before the sync loop records the sync in the
    // metrics (which clears the pending changes): read them once that has happened.
    let started = std::time::Instant::now();
    let metrics = loop {
        let m = get(10249, "/metrics");
        if m.lines()
            .any(|l| l == "kubeproxy_sync_proxy_rules_endpoint_changes_pending 0")
            || started.elapsed() > Duration::from_secs(10)
        {
            break m;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        metrics.contains("kubeproxy_sync_proxy_rules_duration_seconds_bucket"),
        "{metrics}"
    );
    assert!(
        metrics.contains("kubeproxy_sync_full_proxy_rules_duration_seconds"),
        "{metrics}"
    );
    assert_eq!(get(10249, "/proxyMode").lines().last(), Some("iptables"));
    assert!(
        metrics
            .lines()
            .any(|l| l == "kube_proxy_rs_api_server_connected 1"),
        "{metrics}"
    );
    // The initial list counts as changes of both kinds, and nothing waits after the sync.
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} in\n{metrics}"))
            .parse()
            .unwrap()
    };
    assert!(value("kubeproxy_sync_proxy_rules_service_changes_total") >= 1.0);
    assert!(value("kubeproxy_sync_proxy_rules_endpoint_changes_total") >= 1.0);
    assert_eq!(
        value("kubeproxy_sync_proxy_rules_endpoint_changes_pending"),
        0.0
    );

    // The API server goes away: the rules stay exactly as they are.
    let before = nat(&ns);
    api.set_unavailable(true);
    api.drop_connections();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        nat(&ns),
        before,
        "an API outage must not touch the dataplane"
    );
    assert!(
        proxy.try_wait().unwrap().is_none(),
        "the daemon survives the outage"
    );
    let healthz = get(10256, "/healthz");
    assert!(
        healthz.contains(" 200 "),
        "no pending change, so still healthy like upstream: {healthz}"
    );
    // The outage shows in kube-proxy-rs's own connectivity metrics.
    wait_for(
        || {
            let m = get(10249, "/metrics");
            m.lines()
                .any(|l| l == "kube_proxy_rs_api_server_connected 0")
                && m.lines()
                    .any(|l| l == "kube_proxy_rs_api_server_disconnects_total 1")
        },
        Duration::from_secs(20),
    )
    .unwrap_or_else(|_| panic!("no disconnect in /metrics:\n{}", get(10249, "/metrics")));

    // While it is away an endpoint is removed; when it comes back the watches have expired,
    // the source relists, and exactly that change is applied.
    let slice = seed_objects()
        .into_iter()
        .find(|o| o["kind"] == "EndpointSlice")
        .map(|mut o| {
            let eps = o["endpoints"].as_array_mut().unwrap();
            eps.retain(|e| e["addresses"][0] != "10.0.1.2");
            o
        })
        .unwrap();
    api.upsert_value(slice).unwrap();
    api.expire_watches();
    api.set_unavailable(false);
    wait_for(
        || !nat(&ns).contains("KUBE-SEP-H5CTQI4CMO4ES5BQ"),
        Duration::from_secs(40),
    )
    .unwrap_or_else(|_| {
        panic!(
            "the change made during the outage was not applied\n{}",
            read_log()
        )
    });
    assert!(
        nat(&ns).contains("KUBE-SEP-GS5MQAG4332XHLUZ"),
        "the other endpoint stays"
    );
    assert!(
        read_log().contains("API server unreachable"),
        "{}",
        read_log()
    );

    // A Service deleted through the API disappears.
    api.delete(ApiKind::Service, "default", "nginx-svc");
    wait_for(
        || !nat(&ns).contains("KUBE-SVC-HL5LMXD5JFHQZ6LN"),
        Duration::from_secs(10),
    )
    .unwrap_or_else(|_| panic!("the deleted Service's chains remain\n{}", read_log()));
}

/// An EndpointSlice carrying `endpoints.kubernetes.io/last-change-trigger-time` `when`
/// (RFC 3339), a second slice of the seed's `nginx-svc`.
fn triggered_slice(name: &str, when: &str, ip: &str) -> String {
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}\n  namespace: default\n  labels: {{kubernetes.io/service-name: nginx-svc}}\n  annotations: {{endpoints.kubernetes.io/last-change-trigger-time: \"{when}\"}}\naddressType: IPv4\nendpoints:\n- addresses: [{ip}]\n  nodeName: k8s-worker\nports: [{{name: \"\", port: 80, protocol: TCP}}]\n"
    )
}

/// `kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"}` in `metrics`.
fn programming_samples(metrics: &str) -> Option<u64> {
    metrics
        .lines()
        .find(|l| {
            l.starts_with(
                "kubeproxy_network_programming_duration_seconds_count{ip_family=\"IPv4\"}",
            )
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn rfc3339(t: std::time::SystemTime) -> String {
    humantime::format_rfc3339_nanos(t).to_string()
}

/// Upstream's network-programming SLI: a slice changed after the proxy started with a
/// trigger time gives one sample of `kubeproxy_network_programming_duration_seconds`; one
/// from before the start (here: in the initial list) gives none. Both sources: the API
/// server and a manifest directory.
#[test]
fn network_programming_latency_is_observed_for_slices_changed_after_start() {
    if !require_root() {
        return;
    }
    let old = rfc3339(std::time::SystemTime::now() - Duration::from_secs(3600));
    let get = |ns: &Netns| -> String {
        ns.run(
            "curl",
            ["-s", "--max-time", "5", "http://127.0.0.1:10249/metrics"],
        )
        .unwrap_or_default()
    };
    // The API server.
    let ns = Netns::new("nplapi").unwrap();
    let (api, _stop) = api_server_in(&ns);
    for object in seed_objects() {
        api.upsert_value(object).unwrap();
    }
    api.upsert_value(serde_saphyr::from_str(&triggered_slice("early", &old, "10.0.1.7")).unwrap())
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let log = std::fs::File::create(dir.path().join("proxy.log")).unwrap();
    let mut cmd = ns.command(BIN);
    cmd.args([
        "--master",
        &api.url(),
        "--hostname-override=k8s-master",
        "--cluster-cidr=10.0.0.0/16",
        "-v=2",
        "--healthz-bind-address=",
        "--metrics-bind-address=127.0.0.1:10249",
        "--iptables-min-sync-period=100ms",
    ])
    .stdin(Stdio::null())
    .stdout(log.try_clone().unwrap())
    .stderr(log);
    let mut proxy = ChildGuard::spawn(&mut cmd, "kube-proxy-rs").unwrap();
    proxy
        .wait_for(|| nat(&ns).contains("10.0.1.7"), Duration::from_secs(30))
        .unwrap();
    assert_eq!(
        programming_samples(&get(&ns)).unwrap_or(0),
        0,
        "{}",
        get(&ns)
    );
    let now = rfc3339(std::time::SystemTime::now());
    api.upsert_value(serde_saphyr::from_str(&triggered_slice("late", &now, "10.0.1.8")).unwrap())
        .unwrap();
    proxy
        .wait_for(
            || programming_samples(&get(&ns)) == Some(1),
            Duration::from_secs(30),
        )
        .unwrap_or_else(|e| {
            panic!(
                "{e}\n{}",
                std::fs::read_to_string(dir.path().join("proxy.log")).unwrap_or_default()
            )
        });
    drop(proxy);

    // A manifest directory.
    let ns = Netns::new("nplman").unwrap();
    let m = dir.path().join("m");
    std::fs::create_dir(&m).unwrap();
    std::fs::write(m.join("seed.yaml"), SEED_CLUSTER).unwrap();
    std::fs::write(
        m.join("early.yaml"),
        triggered_slice("early", &old, "10.0.1.7"),
    )
    .unwrap();
    let log = std::fs::File::create(dir.path().join("proxy2.log")).unwrap();
    let mut cmd = ns.command(BIN);
    cmd.args([
        "--manifests",
        m.to_str().unwrap(),
        "--state-dir=",
        "--hostname-override=k8s-master",
        "--cluster-cidr=10.0.0.0/16",
        "--healthz-bind-address=",
        "--metrics-bind-address=127.0.0.1:10249",
        "--iptables-min-sync-period=100ms",
    ])
    .stdin(Stdio::null())
    .stdout(log.try_clone().unwrap())
    .stderr(log);
    let mut proxy = ChildGuard::spawn(&mut cmd, "kube-proxy-rs").unwrap();
    proxy
        .wait_for(|| nat(&ns).contains("10.0.1.7"), Duration::from_secs(30))
        .unwrap();
    assert_eq!(programming_samples(&get(&ns)).unwrap_or(0), 0);
    let now = rfc3339(std::time::SystemTime::now());
    std::fs::write(
        m.join("late.yaml"),
        triggered_slice("late", &now, "10.0.1.8"),
    )
    .unwrap();
    proxy
        .wait_for(
            || programming_samples(&get(&ns)) == Some(1),
            Duration::from_secs(30),
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", get(&ns)));
}

/// Starts the daemon in `ns` against `api` (iptables mode, this node `k8s-master`), logging
/// to `log_path`, with /healthz on 10256 and /metrics on 10249.
fn start_proxy(ns: &Netns, api: &TestApiServer, log_path: &std::path::Path) -> ChildGuard {
    let log = std::fs::File::create(log_path).unwrap();
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
    .stdin(Stdio::null())
    .stdout(log.try_clone().unwrap())
    .stderr(log);
    ChildGuard::spawn(&mut cmd, "kube-proxy-rs").unwrap()
}

/// The seed's EndpointSlice without the endpoint 10.0.1.2 (whose chain is
/// KUBE-SEP-H5CTQI4CMO4ES5BQ).
fn slice_without_worker_endpoint() -> serde_json::Value {
    seed_objects()
        .into_iter()
        .find(|o| o["kind"] == "EndpointSlice")
        .map(|mut o| {
            let eps = o["endpoints"].as_array_mut().unwrap();
            eps.retain(|e| e["addresses"][0] != "10.0.1.2");
            o
        })
        .unwrap()
}

/// A Service `name` at ClusterIP `ip`, port 80.
fn plain_service(name: &str, ip: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
                 "ports": [{"port": 80, "protocol": "TCP", "targetPort": 80}]},
    })
}

/// Issue 23 item 9: a restarted daemon lists every kind from the API server's watch cache
/// (`resourceVersion=0`), as client-go's informers do: the request log shows no quorum list
/// (a list without a resourceVersion, which the API server reads from etcd).
#[test]
fn a_restart_makes_no_quorum_list() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("apirestart").unwrap();
    let (api, _stop) = api_server_in(&ns);
    for object in seed_objects() {
        api.upsert_value(object).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let lists = |api: &TestApiServer| {
        api.requests()
            .into_iter()
            .filter(|r| r.kind.is_some() && !r.watch && r.param("continue").is_none())
            .collect::<Vec<_>>()
    };
    for start in 1..=2 {
        let log_path = dir.path().join(format!("proxy{start}.log"));
        let mut proxy = start_proxy(&ns, &api, &log_path);
        proxy
            .wait_for(
                || {
                    lists(&api).len() == ApiKind::ALL.len() * start
                        && ApiKind::ALL.iter().all(|k| api.open_watches(*k) >= 1)
                        && nat(&ns).contains("-A KUBE-SEP-H5CTQI4CMO4ES5BQ")
                },
                Duration::from_secs(30),
            )
            .unwrap_or_else(|e| {
                panic!(
                    "{e}\n{:#?}\n{}",
                    api.requests(),
                    std::fs::read_to_string(&log_path).unwrap_or_default()
                )
            });
        drop(proxy);
        wait_for(
            || ApiKind::ALL.iter().all(|k| api.open_watches(*k) == 0),
            Duration::from_secs(10),
        )
        .unwrap();
    }
    let quorum: Vec<String> = api
        .requests()
        .into_iter()
        .filter(|r| r.is_quorum_list())
        .map(|r| r.uri)
        .collect();
    assert!(quorum.is_empty(), "quorum lists: {quorum:#?}");
    for list in lists(&api) {
        assert_eq!(list.param("resourceVersion"), Some("0"), "{}", list.uri);
        assert_eq!(
            list.param("resourceVersionMatch"),
            Some("NotOlderThan"),
            "{}",
            list.uri
        );
    }
}

/// Issue 24 item 2: the API server's resourceVersion goes backwards (etcd restored from a
/// backup; every watch is answered "Too large resource version"). The daemon relists with
/// a quorum read and programs the restored state and a change made after the restore
/// within seconds, and the later changes too.
#[test]
fn a_server_restored_from_a_backup_is_relisted_and_its_changes_applied() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("apirestore").unwrap();
    let (api, _stop) = api_server_in(&ns);
    for object in seed_objects() {
        api.upsert_value(object).unwrap();
    }
    let backup = api.backup();
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("proxy.log");
    let mut proxy = start_proxy(&ns, &api, &log_path);
    let read_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    // Created after the backup: the daemon programs it...
    api.upsert_value(plain_service("extra", "10.96.0.99"))
        .unwrap();
    // A Service without endpoints: its REJECT rule is in the filter table.
    let rules = || ns.run("iptables-save", [] as [&str; 0]).unwrap_or_default();
    proxy
        .wait_for(|| rules().contains("10.96.0.99"), Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}\n{}", read_log()));
    // ... and sees resourceVersions beyond what the restored server will have.
    for port in 81..85 {
        let mut svc = plain_service("extra", "10.96.0.99");
        svc["spec"]["ports"][0]["port"] = port.into();
        api.upsert_value(svc).unwrap();
    }
    api.bookmark();
    proxy
        .wait_for(|| rules().contains("--dport 84"), Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}\n{}", read_log()));
    let seen = api.resource_version();

    api.restore(&backup);
    api.upsert_value(slice_without_worker_endpoint()).unwrap();
    assert!(api.resource_version() < seen);
    let restored = std::time::Instant::now();
    proxy
        .wait_for(
            || {
                let rules = rules();
                rules.contains("KUBE-SEP-GS5MQAG4332XHLUZ")
                    && !rules.contains("10.96.0.99")
                    && !rules.contains("KUBE-SEP-H5CTQI4CMO4ES5BQ")
            },
            Duration::from_secs(10),
        )
        .unwrap_or_else(|e| panic!("the restored state was not applied: {e}\n{}", read_log()));
    eprintln!("restored state programmed after {:?}", restored.elapsed());
    assert!(
        nat(&ns).contains("KUBE-SEP-GS5MQAG4332XHLUZ"),
        "the other endpoint stays"
    );
    let quorum = api
        .requests()
        .into_iter()
        .filter(|r| r.is_quorum_list())
        .count();
    assert!(quorum >= 2, "{:#?}", api.requests());
    // And it keeps watching.
    api.delete(ApiKind::Service, "default", "nginx-svc");
    proxy
        .wait_for(
            || !nat(&ns).contains("KUBE-SVC-HL5LMXD5JFHQZ6LN"),
            Duration::from_secs(10),
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", read_log()));
}

/// The delays of the daemon's `cannot reach the API server URL: watching Services: ...;
/// retrying in D` lines, in seconds.
fn retry_delays(log: &str, url: &str) -> Vec<f64> {
    let prefix = format!("cannot reach the API server {url}: watching Services: ");
    log.lines()
        .filter(|l| l.contains(&prefix))
        .filter_map(|l| {
            let rest = &l[l.find("; retrying in ")? + "; retrying in ".len()..];
            let end = rest.find(|c: char| !c.is_ascii_digit() && c != '.')?;
            let value: f64 = rest[..end].parse().ok()?;
            Some(if rest[end..].starts_with("ms") {
                value / 1000.0
            } else {
                value
            })
        })
        .collect()
}

/// Issue 24 items 2 and 4: during an outage every retry is logged naming the API server
/// and the delay before the next one, growing; after it, a watch whose connection is reset on
/// a quiet cluster is watched again at once (the change made right after is programmed within 3 s, not after
/// the backoff the outage reached).
#[test]
fn retries_name_the_server_and_a_cut_watch_after_an_outage_resumes_at_once() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("apiretry").unwrap();
    let (api, _stop) = api_server_in(&ns);
    for object in seed_objects() {
        api.upsert_value(object).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("proxy.log");
    let mut proxy = start_proxy(&ns, &api, &log_path);
    let read_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    proxy
        .wait_for(
            || nat(&ns).contains("-A KUBE-SEP-H5CTQI4CMO4ES5BQ"),
            Duration::from_secs(30),
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", read_log()));

    // 800 ms doubling: after 14 s of outage the delay is 6.4 s or more.
    api.set_unavailable(true);
    std::thread::sleep(Duration::from_secs(14));
    let delays = retry_delays(&read_log(), &api.url());
    assert!(delays.len() >= 3, "{delays:?}\n{}", read_log());
    assert!(
        delays.windows(2).all(|w| w[1] >= w[0]) && delays[delays.len() - 1] >= 3.0,
        "{delays:?}"
    );
    assert!(
        read_log().contains("HTTP 503 ServiceUnavailable"),
        "{}",
        read_log()
    );
    api.set_unavailable(false);
    let get = |port: u16, path: &str| -> String {
        ns.run(
            "curl",
            [
                "-s",
                "--max-time",
                "5",
                &format!("http://127.0.0.1:{port}{path}"),
            ],
        )
        .unwrap_or_default()
    };
    proxy
        .wait_for(
            || {
                get(10249, "/metrics")
                    .lines()
                    .any(|l| l == "kube_proxy_rs_api_server_connected 1")
                    && ApiKind::ALL.iter().all(|k| api.open_watches(*k) >= 1)
            },
            Duration::from_secs(40),
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", read_log()));

    // A quiet cluster; the watches' connections are reset.
    std::thread::sleep(Duration::from_millis(1500));
    api.reset_connections();
    api.upsert_value(slice_without_worker_endpoint()).unwrap();
    proxy
        .wait_for(
            || !nat(&ns).contains("KUBE-SEP-H5CTQI4CMO4ES5BQ"),
            Duration::from_secs(3),
        )
        .unwrap_or_else(|e| panic!("not watched again at once: {e}\n{}", read_log()));
}

/// An API server that does not serve ServiceCIDRs (older than 1.33, or a ClusterRole without
/// them; here `404`): the daemon programs the rules and counts as connected (/healthz 200,
/// `kube_proxy_rs_api_server_connected 1`, no disconnect). The failing ServiceCIDR list is
/// retried with the backoff but logged once, not at every retry, and its end once.
#[test]
fn an_api_server_without_service_cidrs_is_logged_once_and_stays_connected() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("apinocidr").unwrap();
    let (api, _stop) = api_server_in(&ns);
    api.set_served(ApiKind::ServiceCidr, false);
    for object in seed_objects() {
        api.upsert_value(object).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("proxy.log");
    let mut proxy = start_proxy(&ns, &api, &log_path);
    let read_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let get = |port: u16, path: &str| -> String {
        ns.run(
            "curl",
            [
                "-s",
                "-i",
                "--max-time",
                "5",
                &format!("http://127.0.0.1:{port}{path}"),
            ],
        )
        .unwrap_or_default()
    };
    let cidr_lists = |api: &TestApiServer| {
        api.requests()
            .iter()
            .filter(|r| r.kind == Some(ApiKind::ServiceCidr) && !r.watch)
            .count()
    };
    // Three ServiceCIDR lists answered 404 (800 ms doubling: within about 4 s).
    proxy
        .wait_for(
            || {
                nat(&ns).contains("-A KUBE-SEP-H5CTQI4CMO4ES5BQ")
                    && cidr_lists(&api) >= 3
                    && get(10249, "/metrics")
                        .lines()
                        .any(|l| l == "kube_proxy_rs_api_server_connected 1")
            },
            Duration::from_secs(30),
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", read_log()));
    let metrics = get(10249, "/metrics");
    assert!(
        metrics
            .lines()
            .any(|l| l == "kube_proxy_rs_api_server_disconnects_total 0"),
        "{metrics}"
    );
    let healthz = get(10256, "/healthz");
    assert!(healthz.contains(" 200 "), "{healthz}");
    let log = read_log();
    let starts = "cannot list or watch ServiceCIDRs (networking.k8s.io/v1";
    assert_eq!(log.matches(starts).count(), 1, "{log}");
    assert!(log.contains("HTTP 404 NotFound"), "{log}");
    assert!(
        !log.contains("cannot reach the API server") && !log.contains("API server unreachable"),
        "a missing ServiceCIDR API is not an unreachable API server:\n{log}"
    );

    // Served again: the watch opens, and that is logged once.
    api.set_served(ApiKind::ServiceCidr, true);
    let again = "ServiceCIDRs (networking.k8s.io/v1) are readable again";
    proxy
        .wait_for(
            || api.open_watches(ApiKind::ServiceCidr) >= 1 && read_log().contains(again),
            Duration::from_secs(40),
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", read_log()));
    std::thread::sleep(Duration::from_secs(1));
    let log = read_log();
    assert_eq!(log.matches(again).count(), 1, "{log}");
    assert_eq!(log.matches(starts).count(), 1, "{log}");
    assert!(
        get(10249, "/metrics")
            .lines()
            .any(|l| l == "kube_proxy_rs_api_server_disconnects_total 0"),
        "{}",
        get(10249, "/metrics")
    );
}
