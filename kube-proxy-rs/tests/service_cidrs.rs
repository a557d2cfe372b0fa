//! ServiceCIDRs end to end: the daemon in nftables mode, in the node namespace of the seed
//! topology, fed by the test API server, which serves a `networking.k8s.io/v1` ServiceCIDR.
//! With real traffic from the client namespace: a new connection to an unallocated ClusterIP
//! of the Service CIDR is dropped (upstream's `cluster-ips-check`: the client times out), one
//! to an unused port of an allocated ClusterIP is refused, and the Service answers. Deleting
//! and re-creating the ServiceCIDR in the API server changes the rule with a partial sync.
//!
//! Every namespace is created by the test (root required; CI runs it as root).

mod common;

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{Daemon, Mode, NODE_ARGS, answered, counts, seed_topology, tempdir};
use kp_testkit::apiserver::{ApiKind, TestApiServer};
use kp_testkit::golden::SEED_CLUSTER;
use kp_testkit::{ClientError, Netns, http_get, http_get_many, require_root};

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

/// The cluster's ServiceCIDR, as the API server creates it from
/// `--service-cluster-ip-range=10.96.0.0/12`.
fn kubernetes_service_cidr() -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "ServiceCIDR",
        "metadata": {"name": "kubernetes"},
        "spec": {"cidrs": ["10.96.0.0/12"]},
        "status": {"conditions": [{
            "type": "Ready", "status": "True", "reason": "", "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }]},
    })
}

const DROP_RULE: &str =
    "ip daddr 10.96.0.0/12 drop comment \"Drop traffic to unallocated ClusterIPs\"";

/// How a new connection from `ns` to `target` ends, and after how long.
fn connect(ns: &Netns, target: &str) -> (Result<(), ClientError>, Duration) {
    let start = Instant::now();
    // Longer than the node's neighbour resolution (3 s): without the drop rule, the node
    // routes the packet on and answers host-unreachable once ARP gives up.
    let r = http_get(ns, target.parse().unwrap(), Duration::from_secs(5)).map(|_| ());
    (r, start.elapsed())
}

/// Waits until the proxy's `ip kube-proxy` table holds (or no longer holds) the drop rule.
fn wait_drop_rule(proxy: &mut Daemon, node: &Netns, present: bool) {
    let what = if present {
        "the drop rule for the Service CIDR never appeared"
    } else {
        "the drop rule for the Service CIDR never went away"
    };
    proxy.wait_until(what, || {
        Mode::Nftables.ruleset(node).contains(DROP_RULE) == present
    });
}

/// Every list and watch the daemon sent is granted by `deploy/rbac.yaml`'s ClusterRole, the
/// ServiceCIDR watch included.
fn every_request_is_allowed_by_the_shipped_cluster_role(api: &TestApiServer) {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/rbac.yaml"))
        .unwrap();
    let role = text
        .split("\n---\n")
        .map(|d| serde_saphyr::from_str::<serde_json::Value>(d).unwrap())
        .find(|d| d["kind"] == "ClusterRole")
        .expect("a ClusterRole in deploy/rbac.yaml");
    let rules = role["rules"].as_array().unwrap();
    let has = |list: &serde_json::Value, want: &str| {
        list.as_array()
            .is_some_and(|l| l.iter().any(|x| x.as_str() == Some(want)))
    };
    let mut kinds = std::collections::BTreeSet::new();
    for r in api.requests() {
        let Some(kind) = r.kind else { continue };
        let group = kind.api_version().rsplit_once('/').map_or("", |(g, _)| g);
        let path = r.uri.split('?').next().unwrap_or_default();
        let resource = path.rsplit('/').next().unwrap_or_default();
        let verb = if r.watch { "watch" } else { "list" };
        assert!(
            rules.iter().any(|rule| has(&rule["apiGroups"], group)
                && has(&rule["resources"], resource)
                && has(&rule["verbs"], verb)),
            "deploy/rbac.yaml does not allow {verb} {group}/{resource} ({})",
            r.uri
        );
        kinds.insert(kind);
    }
    assert!(kinds.contains(&ApiKind::ServiceCidr), "{kinds:?}");
}

#[test]
fn an_unallocated_cluster_ip_is_dropped_and_an_unused_port_refused() {
    if !require_root() {
        return;
    }
    let dir = tempdir();
    let (topology, servers) = seed_topology();
    let node = topology.node();
    let client = topology.client();
    let (api, _stop) = api_server_in(node);
    for doc in SEED_CLUSTER.split("\n---\n") {
        api.upsert_value(serde_saphyr::from_str::<serde_json::Value>(doc).unwrap())
            .unwrap();
    }
    api.upsert_value(kubernetes_service_cidr()).unwrap();
    let url = api.url();
    let mut args = vec!["--master", url.as_str(), "--iptables-min-sync-period=100ms"];
    args.extend(NODE_ARGS);
    let mut proxy = Daemon::start(Mode::Nftables, node, dir.path(), &args, None);
    proxy.wait_programmed(node);
    wait_drop_rule(&mut proxy, node, true);

    // The Service answers.
    let vip: SocketAddr = "10.96.138.71:8080".parse().unwrap();
    let c = counts(http_get_many(client, vip, 20, Duration::from_secs(2)));
    assert_eq!(
        answered(&c, "be0") + answered(&c, "be1"),
        20,
        "{c:?}\n{}",
        proxy.log()
    );
    // An unused port of the allocated ClusterIP: refused at once (reject).
    let (r, took) = connect(client, "10.96.138.71:9999");
    assert!(
        matches!(r, Err(ClientError::Refused)) && took < Duration::from_millis(500),
        "unused port: {r:?} after {took:?}\n{}",
        Mode::Nftables.ruleset(node)
    );
    // An address of the Service CIDR that no Service has: dropped, nothing answers.
    let (r, took) = connect(client, "10.96.0.200:80");
    assert!(
        matches!(r, Err(ClientError::Timeout)),
        "unallocated ClusterIP: {r:?} after {took:?}\n{}",
        Mode::Nftables.ruleset(node)
    );

    // The ServiceCIDR is deleted: a partial sync removes the rule, and the packet is routed
    // on as before ServiceCIDRs existed (the node answers host-unreachable once ARP fails).
    api.delete(ApiKind::ServiceCidr, "", "kubernetes").unwrap();
    wait_drop_rule(&mut proxy, node, false);
    let (r, took) = connect(client, "10.96.0.200:80");
    assert!(
        matches!(r, Err(ClientError::Unreachable)),
        "without a ServiceCIDR: {r:?} after {took:?}"
    );
    let (r, _) = connect(client, "10.96.138.71:9999");
    assert!(matches!(r, Err(ClientError::Refused)), "{r:?}");

    // It comes back: dropped again, also applied without a full sync.
    api.upsert_value(kubernetes_service_cidr()).unwrap();
    wait_drop_rule(&mut proxy, node, true);
    let (r, took) = connect(client, "10.96.0.200:80");
    assert!(
        matches!(r, Err(ClientError::Timeout)),
        "ServiceCIDR back: {r:?} after {took:?}"
    );
    // Each change after the first sync was applied by the next sync, a partial one.
    let log = proxy.log();
    let ipv4 = |l: &&str| l.contains("family=IPv4");
    let mut synced_once = false;
    let mut partial_after_change = 0;
    let mut lines = log.lines().filter(ipv4);
    while let Some(line) = lines.next() {
        if line.contains("synced nftables rules") {
            synced_once = true;
        } else if synced_once && line.contains("the Service CIDRs changed") {
            let next = lines
                .find(|l| l.contains("synced nftables rules"))
                .unwrap_or_else(|| panic!("no sync after {line}\n{log}"));
            assert!(next.contains("full=false"), "{next}\n{log}");
            partial_after_change += 1;
        }
    }
    assert_eq!(partial_after_change, 2, "{log}");
    every_request_is_allowed_by_the_shipped_cluster_role(&api);
    assert!(proxy.is_running());
    drop(servers);
}

/// `--manifests` reads `kind: ServiceCIDR`: `--dry-run` prints the drop rule of each family
/// with that family's CIDR; an object the API server would refuse is an error naming it and
/// its field, and the rest is still printed.
#[test]
fn dry_run_from_manifests_shows_the_drop_rule_of_each_family() {
    let dir = tempdir();
    let path = common::write(
        dir.path(),
        "cluster.yaml",
        &format!(
            "{SEED_CLUSTER}\n---\napiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\n\
             metadata:\n  name: kubernetes\nspec:\n  cidrs: [10.96.0.0/12, 'fd00:96::/112']\n\
             ---\napiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata:\n  name: bad\n\
             spec:\n  cidrs: [10.1.0.0/16, 10.2.0.0/16]\n"
        ),
    );
    let (ok, out, err) = common::run(&[
        "--proxy-mode=nftables",
        "--dry-run",
        "--hostname-override=k8s-master",
        "--manifests",
        path.to_str().unwrap(),
    ]);
    assert!(!ok, "a rejected object makes --dry-run fail: {err}");
    assert!(
        err.contains(
            "ServiceCIDR bad: spec.cidrs: 10.1.0.0/16 and 10.2.0.0/16 are of the same IP family"
        ),
        "{err}"
    );
    for rule in [
        "\t\tip daddr { 10.96.0.0/12 } drop comment \"Drop traffic to unallocated ClusterIPs\"\n",
        "\t\tip6 daddr { fd00:96::/112 } drop comment \"Drop traffic to unallocated ClusterIPs\"\n",
    ] {
        assert!(out.contains(rule), "missing {rule:?} in\n{out}");
    }
}
