//! The iptables backend the daemon follows (`--iptables-backend auto`, the default), end to
//! end in network namespaces: kubelet's `KUBE-IPTABLES-HINT` in either backend, the rules an
//! earlier kube-proxy left in the other one (removed, while other programs' rules stay),
//! the rule count when there is no hint, an explicit backend, and real traffic to the
//! Services afterwards; the tracer's `--live` reading the same backend; and no legacy table
//! created on a node that has none (so `iptables-nft-save` prints no "legacy tables present"
//! warning), in every mode that runs here and in `--cleanup`.
//!
//! Each test creates its own namespaces (root required; CI runs them as root); nothing here
//! touches the root namespace.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc;
use std::time::Duration;

use common::{Daemon, Mode, NODE_ARGS, names, run_in, tempdir, write};
use kp_model::IpFamily;
use kp_testkit::apiserver::TestApiServer;
use kp_testkit::golden::SEED_CLUSTER;
use kp_testkit::{Netns, Topology, http_get_many, require_root};

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

/// The two iptables backends, by the suffix of their binaries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Nft,
    Legacy,
}

impl Backend {
    fn suffix(self) -> &'static str {
        match self {
            Backend::Nft => "nft",
            Backend::Legacy => "legacy",
        }
    }

    fn other(self) -> Backend {
        match self {
            Backend::Nft => Backend::Legacy,
            Backend::Legacy => Backend::Nft,
        }
    }

    /// `iptables-nft`, `ip6tables-legacy-save`, ...: `tool` is "" or "-save".
    fn binary(self, v6: bool, tool: &str) -> String {
        let family = if v6 { "ip6tables" } else { "iptables" };
        format!("{family}-{}{tool}", self.suffix())
    }

    /// Runs `iptables-<backend> args` (or ip6tables) in `ns`, panicking on failure.
    fn run(self, ns: &Netns, v6: bool, args: &[&str]) {
        ns.run(&self.binary(v6, ""), args)
            .unwrap_or_else(|e| panic!("{}: {e}", self.binary(v6, "")));
    }

    /// `iptables-<backend>-save` (or ip6tables) of `ns`, without comment lines.
    fn save(self, ns: &Netns, v6: bool) -> String {
        common::save(ns, &self.binary(v6, "-save"))
    }
}

/// The `KUBE-` lines of both families' saves of `backend`, except kubelet's `KUBE-FIREWALL`
/// (left in the backend a node does not use, see docs/iptables.md) and its jumps.
fn kube_lines(ns: &Netns, backend: Backend) -> Vec<String> {
    [false, true]
        .iter()
        .flat_map(|v6| {
            backend
                .save(ns, *v6)
                .lines()
                .filter(|l| l.contains("KUBE-") && !l.contains("KUBE-FIREWALL"))
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Two Services, `web4` (10.96.0.80:80) and `web6` ([fd00:10:96::80]:80), whose endpoint is
/// the backend at `v4` / `v6`; with `gone`, also `gone4` (10.96.0.81:80) served by it.
fn web_cluster(v4: IpAddr, v6: IpAddr, gone: Option<IpAddr>) -> String {
    let gone = gone.map_or(String::new(), |ip| {
        format!(
            r#"---
apiVersion: v1
kind: Service
metadata: {{name: gone4, namespace: default}}
spec:
  clusterIP: 10.96.0.81
  ports: [{{port: 80, targetPort: 80, protocol: TCP}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: gone4-1, namespace: default, labels: {{kubernetes.io/service-name: gone4}}}}
addressType: IPv4
endpoints: [{{addresses: ["{ip}"], nodeName: k8s-master}}]
ports: [{{name: "", port: 80, protocol: TCP}}]
"#
        )
    });
    format!(
        r#"apiVersion: v1
kind: Service
metadata: {{name: web4, namespace: default}}
spec:
  clusterIP: 10.96.0.80
  ports: [{{port: 80, targetPort: 80, protocol: TCP}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: web4-1, namespace: default, labels: {{kubernetes.io/service-name: web4}}}}
addressType: IPv4
endpoints: [{{addresses: ["{v4}"], nodeName: k8s-master}}]
ports: [{{name: "", port: 80, protocol: TCP}}]
---
apiVersion: v1
kind: Service
metadata: {{name: web6, namespace: default}}
spec:
  clusterIP: "fd00:10:96::80"
  ipFamilies: [IPv6]
  ports: [{{port: 80, targetPort: 80, protocol: TCP}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: web6-1, namespace: default, labels: {{kubernetes.io/service-name: web6}}}}
addressType: IPv6
endpoints: [{{addresses: ["{v6}"], nodeName: k8s-master}}]
ports: [{{name: "", port: 80, protocol: TCP}}]
{gone}"#
    )
}

/// A node whose kubelet uses `hint` (its `KUBE-IPTABLES-HINT` in both families' mangle
/// tables there), where the kube-proxy being replaced wrote its rules with the other backend
/// (Services web4 and web6 to backend be0, and gone4, since deleted), next to another
/// program's rules there. The daemon, fed by the API server with web4 and web6 now served by
/// be1:
///
/// - logs the backend it chose and why;
/// - writes its rules (both families) with `hint`'s backend;
/// - removes the old kube-proxy's chains from the other backend, both families, leaving the
///   other program's rules, kubelet's hint and `KUBE-FIREWALL`;
/// - so that every request to both ClusterIPs reaches be1, and none to the deleted Service's
///   ClusterIP reaches its old endpoint be0.
fn follows_kubelets_hint(hint: Backend) {
    if !require_root() {
        return;
    }
    let topology = Topology::builder()
        .dual_stack()
        .backends(2)
        .build()
        .unwrap();
    let _http = topology.start_http(80).unwrap();
    let ip = |i: usize, f: IpFamily| topology.backend(i).ip(f).unwrap();
    let node = topology.node();
    let old = hint.other();
    let dir = tempdir();

    // kubelet's hint, where kubelet runs.
    for v6 in [false, true] {
        hint.run(node, v6, &["-t", "mangle", "-N", "KUBE-IPTABLES-HINT"]);
    }
    // The replaced kube-proxy's rules (the same chains as upstream's), and another program's,
    // in the other backend.
    let old_cluster = write(
        dir.path(),
        "old.yaml",
        &web_cluster(
            ip(0, IpFamily::V4),
            ip(0, IpFamily::V6),
            Some(ip(0, IpFamily::V4)),
        ),
    );
    let old_backend = format!("--iptables-backend={}", old.suffix());
    let mut args = vec![
        "--once",
        "--hostname-override=k8s-master",
        "--cluster-cidr=10.244.0.0/16,fd00:10:244::/64",
        "--manifests",
        old_cluster.to_str().unwrap(),
        &old_backend,
    ];
    let (ok, _, err) = run_in(node, &args);
    assert!(ok, "{err}");
    for v6 in [false, true] {
        assert!(old.save(node, v6).contains("-A KUBE-SERVICES"));
        old.run(node, v6, &["-N", "FOREIGN"]);
        old.run(node, v6, &["-A", "INPUT", "-j", "FOREIGN"]);
        old.run(
            node,
            v6,
            &[
                "-t",
                "nat",
                "-A",
                "POSTROUTING",
                "-o",
                "eth9",
                "-j",
                "MASQUERADE",
            ],
        );
    }

    // The daemon, from the API server, where the Services moved to be1.
    let (api, _stop) = api_server_in(node);
    let new_cluster = web_cluster(ip(1, IpFamily::V4), ip(1, IpFamily::V6), None);
    for doc in new_cluster.split("\n---\n") {
        api.upsert_value(serde_saphyr::from_str::<serde_json::Value>(doc).unwrap())
            .unwrap();
    }
    let url = api.url();
    args = vec![
        "--master",
        &url,
        "--hostname-override=k8s-master",
        "--cluster-cidr=10.244.0.0/16,fd00:10:244::/64",
        "-v=2",
    ];
    let mut proxy = Daemon::start(Mode::Iptables, node, dir.path(), &args, None);
    let v4_dnat = format!("--to-destination {}:80", ip(1, IpFamily::V4));
    let v6_dnat = format!("--to-destination [{}]:80", ip(1, IpFamily::V6));
    proxy.wait_until(
        &format!("the Services never reached {}", hint.binary(false, "")),
        || hint.save(node, false).contains(&v4_dnat) && hint.save(node, true).contains(&v6_dnat),
    );
    // Every request reaches the Services' endpoint now, be1; none the old one.
    for target in ["10.96.0.80:80", "[fd00:10:96::80]:80"] {
        let seen = names(
            http_get_many(
                topology.client(),
                target.parse::<SocketAddr>().unwrap(),
                20,
                Duration::from_secs(2),
            ),
            &format!("{target}\n{}", proxy.log()),
        );
        assert!(seen.iter().all(|n| n == "be1"), "{target}: {seen:?}");
    }
    let gone = http_get_many(
        topology.client(),
        "10.96.0.81:80".parse().unwrap(),
        3,
        Duration::from_millis(500),
    );
    assert!(
        gone.iter().all(Result::is_err),
        "the deleted Service still reaches its old endpoint: {gone:?}"
    );
    // Nothing of kube-proxy's is left in the other backend; the other program's rules are.
    assert_eq!(
        kube_lines(node, old),
        Vec::<String>::new(),
        "{}",
        proxy.log()
    );
    for v6 in [false, true] {
        let rest = old.save(node, v6);
        assert!(
            rest.contains("-A INPUT -j FOREIGN")
                && rest.contains("-A POSTROUTING -o eth9 -j MASQUERADE"),
            "{rest}"
        );
        let ours = hint.save(node, v6);
        assert!(ours.contains(":KUBE-IPTABLES-HINT - [0:0]"), "{ours}");
        assert!(ours.contains("-A KUBE-SERVICES"), "{ours}");
    }

    let log = proxy.log();
    let hint_binary = hint.binary(false, "");
    assert!(
        log.contains(&format!(
            "iptables backend: {hint_binary} (kubelet's KUBE-IPTABLES-HINT chain is in the \
             mangle table of {hint_binary})"
        )),
        "{log}"
    );
    assert!(
        log.contains(&format!(
            "removed the chains an earlier kube-proxy left in {}, the backend this node does not use",
            old.binary(false, "")
        )) && log.contains(&format!("left in {}", old.binary(true, ""))),
        "{log}"
    );

    drop(proxy);
    // kubelet's chain is kubelet's: still there after the daemon stops.
    assert!(hint.save(node, false).contains(":KUBE-IPTABLES-HINT"));
}

#[test]
fn auto_follows_kubelets_hint_in_legacy_and_clears_the_nf_tables_rules_left_there() {
    follows_kubelets_hint(Backend::Legacy);
}

#[test]
fn auto_follows_kubelets_hint_in_nf_tables_and_clears_the_legacy_rules_left_there() {
    follows_kubelets_hint(Backend::Nft);
}

/// Runs `--once` with the seed cluster and `extra` flags in `ns`; returns its log.
fn seed_once(ns: &Netns, dir: &std::path::Path, extra: &[&str]) -> String {
    let manifest = write(dir, "seed.yaml", SEED_CLUSTER);
    let mut args = vec!["--manifests", manifest.to_str().unwrap(), "--once"];
    args.extend(NODE_ARGS);
    args.extend(extra);
    let (ok, _, err) = run_in(ns, &args);
    assert!(ok, "{err}");
    err
}

/// Without kubelet's chains, the backend holding more rules wins (legacy only when it holds
/// strictly more); with no rules anywhere, nf_tables; an explicit `--iptables-backend` is
/// obeyed whatever the node holds, and clears the other backend too.
#[test]
fn without_a_hint_the_backend_with_more_rules_wins_and_an_explicit_backend_is_obeyed() {
    if !require_root() {
        return;
    }
    let dir = tempdir();
    let seed_rule = "-A KUBE-SERVICES -d 10.96.138.71/32";

    // Three rules of other software in legacy, one in nf_tables: legacy.
    let ns = Netns::new("be-count").unwrap();
    for (backend, chains) in [(Backend::Legacy, 3), (Backend::Nft, 1)] {
        for i in 0..chains {
            let chain = format!("OTHER{i}");
            backend.run(&ns, false, &["-N", &chain]);
            backend.run(&ns, false, &["-A", "INPUT", "-j", &chain]);
        }
    }
    let log = seed_once(&ns, dir.path(), &[]);
    assert!(
        log.contains(
            "iptables backend: iptables-legacy (no kubelet chain (KUBE-IPTABLES-HINT or \
             KUBE-KUBELET-CANARY) in either backend, and iptables-legacy holds more rules (3, \
             against 1 in iptables-nft))"
        ),
        "{log}"
    );
    assert!(Backend::Legacy.save(&ns, false).contains(seed_rule));
    assert_eq!(kube_lines(&ns, Backend::Nft), Vec::<String>::new());

    // The operator says nft: nft it is, and the legacy rules of the run before go (the other
    // programs' stay).
    let log = seed_once(&ns, dir.path(), &["--iptables-backend=nft"]);
    assert!(
        log.contains("iptables backend: iptables-nft (--iptables-backend)"),
        "{log}"
    );
    assert!(Backend::Nft.save(&ns, false).contains(seed_rule));
    assert_eq!(kube_lines(&ns, Backend::Legacy), Vec::<String>::new());
    let legacy = Backend::Legacy.save(&ns, false);
    assert!(legacy.contains("-A INPUT -j OTHER2"), "{legacy}");

    // Nothing anywhere: nf_tables, iptables-wrapper's default.
    let empty = Netns::new("be-empty").unwrap();
    let log = seed_once(&empty, dir.path(), &[]);
    assert!(
        log.contains(
            "iptables backend: iptables-nft (no kubelet chain (KUBE-IPTABLES-HINT or \
             KUBE-KUBELET-CANARY) in either backend, and neither holds more rules (0 each): \
             nf_tables, the default)"
        ),
        "{log}"
    );
    assert!(Backend::Nft.save(&empty, false).contains(seed_rule));
}

/// `trace --live` reads the rules of the backend the node uses: here the legacy one, where
/// kubelet's hint is and where the daemon wrote its rules, and says so.
#[test]
fn trace_live_reads_the_nodes_backend() {
    if !require_root() {
        return;
    }
    let dir = tempdir();
    let ns = Netns::new("be-trace").unwrap();
    Backend::Legacy.run(&ns, false, &["-t", "mangle", "-N", "KUBE-IPTABLES-HINT"]);
    seed_once(&ns, dir.path(), &[]);
    assert!(
        Backend::Legacy
            .save(&ns, false)
            .contains("-A KUBE-SERVICES")
    );
    let (ok, out, err) = run_in(
        &ns,
        &[
            "trace",
            "--live",
            "--mode",
            "iptables",
            "--dst",
            "10.96.138.71",
            "--dport",
            "8080",
        ],
    );
    assert!(ok, "{err}");
    assert!(
        out.contains("DNAT 10.0.0.4:80") && out.contains("DNAT 10.0.1.2:80"),
        "{out}\n{err}"
    );
    assert!(
        err.contains("note: reading this node's rules with iptables-legacy-save: kubelet's KUBE-IPTABLES-HINT"),
        "{err}"
    );
}

/// Whether `ns` has any legacy (xtables) table, IPv4 or IPv6, and what `iptables-nft-save`
/// warns about it.
fn legacy_tables(ns: &Netns) -> String {
    let mut out = String::new();
    for file in ["/proc/net/ip_tables_names", "/proc/net/ip6_tables_names"] {
        let names = ns.run("cat", [file]).unwrap_or_default();
        if !names.trim().is_empty() {
            out.push_str(&format!("{file}: {}\n", names.trim().replace('\n', " ")));
        }
    }
    for save in ["iptables-nft-save", "ip6tables-nft-save"] {
        let text = ns.run(save, Vec::<&str>::new()).unwrap_or_default();
        out.extend(
            text.lines()
                .filter(|l| l.contains("legacy tables present"))
                .map(|l| format!("{save}: {l}\n")),
        );
    }
    out
}

/// On an nf_tables node (no legacy table at all), nothing the proxy runs creates one: the
/// iptables mode daemon through its checks, `--once` in iptables, nftables and userspace
/// mode, and `--cleanup`. Each would otherwise leave empty legacy tables behind, and every
/// `iptables-save` on the node would print "# Warning: iptables-legacy tables present".
#[test]
fn no_legacy_table_appears_on_an_nf_tables_node() {
    if !require_root() {
        return;
    }
    let dir = tempdir();
    let ns = Netns::new("be-nolegacy").unwrap();
    assert_eq!(legacy_tables(&ns), "");

    // The daemon, through a few canary checks (every second).
    let manifest = write(dir.path(), "seed.yaml", SEED_CLUSTER);
    let mut args = vec![
        "--manifests",
        manifest.to_str().unwrap(),
        "--iptables-sync-period=1s",
    ];
    args.extend(NODE_ARGS);
    let mut proxy = Daemon::start(Mode::Iptables, &ns, dir.path(), &args, None);
    proxy.wait_programmed(&ns);
    std::thread::sleep(Duration::from_millis(2500));
    assert!(proxy.is_running(), "{}", proxy.log());
    assert_eq!(legacy_tables(&ns), "", "iptables mode\n{}", proxy.log());
    drop(proxy);

    for (what, flags) in [
        ("iptables --once", &["--proxy-mode=iptables"][..]),
        ("nftables --once", &["--proxy-mode=nftables"][..]),
        ("userspace --once", &["--proxy-mode=userspace"][..]),
        ("iptables --once again", &["--proxy-mode=iptables"][..]),
    ] {
        let log = seed_once(&ns, dir.path(), flags);
        assert_eq!(legacy_tables(&ns), "", "{what}\n{log}");
    }
    let (ok, _, err) = run_in(&ns, &["--cleanup"]);
    assert!(ok, "{err}");
    assert!(!common::save(&ns, "iptables-save").contains("KUBE-"));
    assert_eq!(legacy_tables(&ns), "", "--cleanup\n{err}");
}
