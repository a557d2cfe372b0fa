//! Userspace mode end to end, with real traffic in network namespaces: the daemon
//! (`--proxy-mode userspace`) on the seed topology (node 192.168.56.10, external client
//! 192.168.56.100, backends be0 10.0.0.4 and be1 10.0.1.2).
//!
//! What is checked: round robin across backends through the ClusterIP (from a pod and from
//! the node), the NodePort from outside and the portal rules that carry them; the proxy
//! retrying the next endpoint when one refuses or is black-holed (every request succeeds;
//! how long the black-holed case takes is printed); ClientIP affinity; a Service without
//! endpoints; UDP request/response with replies from the Service address and idle expiry;
//! endpoint changes with a connection open; 1,000 concurrent connections with the daemon's
//! file descriptors back to their baseline afterwards; `/metrics` and `/userspace`; and
//! `--cleanup` and a switch to iptables mode removing the portal chains.
//!
//! Each test creates its own namespaces (root required; CI runs them as root); nothing here
//! touches the root namespace.

mod common;

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{
    Daemon, Mode, NODE_ARGS, SEED_EXTRA_SERVICES, answered, counts, run_in, save, seed_topology,
    start_udp_echo, tempdir, write,
};
use kp_testkit::golden::SEED_CLUSTER;
use kp_testkit::{Netns, Topology, UdpClient, http_get, http_get_many, require_root};

const NODE_PORT: &str = "192.168.56.10:30080";
const WEB: &str = "10.96.0.80:80";

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// The seed, its extra Services (`web` NodePort 30080 on 10.96.0.80, `empty`), a sticky
/// Service on be0/be1 and the UDP `dns` Service (10.96.0.53:53 → 5353).
fn cluster() -> String {
    format!(
        "{SEED_CLUSTER}\n---\n{SEED_EXTRA_SERVICES}\n---\n{STICKY}\n---\n{}",
        common::dns_cluster("10.0.0.4", "k8s-master")
    )
}

const STICKY: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: sticky, namespace: default}
spec:
  clusterIP: 10.96.0.90
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}
  ports: [{port: 80, targetPort: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: sticky-1
  namespace: default
  labels: {kubernetes.io/service-name: sticky}
addressType: IPv4
endpoints:
- addresses: [10.0.0.4]
  nodeName: k8s-master
- addresses: [10.0.1.2]
  nodeName: k8s-worker
ports: [{name: "", port: 80, protocol: TCP}]
"#;

/// Starts the daemon in userspace mode on `manifest` with the metrics server on
/// 127.0.0.1:10249 and waits for the portal of `web`.
fn start(topology: &Topology, dir: &std::path::Path, manifest: &str, extra: &[&str]) -> Daemon {
    let mut args = vec![
        "--proxy-mode=userspace",
        "--manifests",
        manifest,
        "--metrics-bind-address=127.0.0.1:10249",
    ];
    args.extend(NODE_ARGS);
    args.extend(extra);
    let node = topology.node();
    let mut proxy = Daemon::start(Mode::Iptables, node, dir, &args, None);
    proxy.wait_until("the userspace portals were never written", || {
        node.run("iptables-save", ["-t", "nat"])
            .is_ok_and(|s| s.contains("-A KUBE-NODEPORT-CONTAINER") && s.contains("default/web"))
    });
    proxy
}

fn curl(ns: &Netns, path: &str) -> String {
    ns.run(
        "curl",
        [
            "-s",
            "--max-time",
            "5",
            &format!("http://127.0.0.1:10249{path}"),
        ],
    )
    .unwrap_or_default()
}

/// A metric's value for the listener of `service_port` (first sample whose line contains
/// the service port label).
fn metric(node: &Netns, name: &str, service_port: &str) -> Option<f64> {
    let text = curl(node, "/metrics");
    text.lines()
        .find(|l| {
            l.starts_with(&format!("{name}{{"))
                && l.contains(&format!("service_port=\"{service_port}\""))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

#[test]
fn round_robin_nodeport_clusterip_portals_metrics_and_no_endpoints() {
    if !require_root() {
        return;
    }
    let (topology, servers) = seed_topology();
    let dir = tempdir();
    let manifest = write(dir.path(), "cluster.yaml", &cluster());
    let proxy = start(&topology, dir.path(), manifest.to_str().unwrap(), &[]);
    let node = topology.node();

    // The portal rules, in upstream's chains, and nothing of iptables mode.
    let nat = save(node, "iptables-save");
    for needle in [
        "-A PREROUTING -m comment --comment \"handle ClusterIPs; NOTE: this must be before the NodePort rules\" -j KUBE-PORTALS-CONTAINER",
        "-A OUTPUT -m comment --comment \"handle ClusterIPs; NOTE: this must be before the NodePort rules\" -j KUBE-PORTALS-HOST",
        "-A KUBE-PORTALS-CONTAINER -d 10.96.0.80/32 -p tcp -m comment --comment \"default/web\" -m tcp --dport 80 -j REDIRECT --to-ports",
        "-A KUBE-PORTALS-HOST -d 10.96.0.80/32 -p tcp -m comment --comment \"default/web\" -m tcp --dport 80 -j DNAT --to-destination 192.168.56.10:",
        "-A KUBE-NODEPORT-CONTAINER -p tcp -m comment --comment \"default/web\" -m tcp --dport 30080 -j REDIRECT --to-ports",
        "-A INPUT -m comment --comment \"Ensure that non-local NodePort traffic can flow\" -j KUBE-NODEPORT-NON-LOCAL",
    ] {
        assert!(nat.contains(needle), "missing {needle} in\n{nat}");
    }
    assert!(!nat.contains("KUBE-SERVICES"), "{nat}");

    // Round robin: strictly alternating over two endpoints, from outside (NodePort), from
    // a pod and from the node itself (ClusterIP).
    let t = Duration::from_secs(3);
    for (from, target) in [
        (topology.client(), addr(NODE_PORT)),
        (topology.backend(0).ns(), addr(WEB)),
        (node, addr(WEB)),
    ] {
        let c = counts(http_get_many(from, target, 20, t));
        assert_eq!(
            answered(&c, "be0"),
            10,
            "{target} from {}: {c:?}",
            from.name()
        );
        assert_eq!(
            answered(&c, "be1"),
            10,
            "{target} from {}: {c:?}",
            from.name()
        );
    }
    // The backend sees the node, never the client (userspace mode's one limitation).
    let peers = servers[1].peer_ips();
    assert!(
        peers.iter().all(|p| p.to_string() != "192.168.56.100"),
        "{peers:?}"
    );

    // A Service without endpoints: the proxy closes the connection at once.
    let started = Instant::now();
    let r = http_get(topology.client(), addr("10.96.0.99:80"), t);
    assert!(r.is_err(), "{r:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    // /metrics and /userspace show the listeners.
    let table = curl(node, "/userspace");
    assert!(
        table.lines().any(|l| l.starts_with("TCP 0.0.0.0:")
            && l.contains(" default/web internal none ")
            && l.contains("10.0.0.4:80")
            && l.contains("10.0.1.2:80")),
        "{table}"
    );
    assert!(table.contains(" default/empty internal none -"), "{table}");
    assert_eq!(
        metric(
            node,
            "kube_proxy_rs_userspace_connections_total",
            "default/web"
        ),
        Some(60.0)
    );
    assert_eq!(
        metric(node, "kube_proxy_rs_userspace_endpoints", "default/web"),
        Some(2.0)
    );
    assert!(
        metric(
            node,
            "kube_proxy_rs_userspace_no_endpoint_connections_total",
            "default/empty"
        )
        .unwrap_or(0.0)
            >= 1.0
    );
    assert_eq!(curl(node, "/proxyMode").trim(), "userspace");
    // The tracer on this live node: the portal, then the proxy's choice of the two endpoints,
    // each behind the node's address.
    let (ok, out, err) = run_in(
        node,
        &[
            "trace",
            "--live",
            "--from",
            "external",
            "--src",
            "192.168.56.100",
            "--dst",
            "192.168.56.10",
            "--dport",
            "30080",
        ],
    );
    assert!(ok, "{err}");
    assert!(
        out.contains("KUBE-NODEPORT-CONTAINER") && out.contains("REDIRECT"),
        "{out}"
    );
    assert!(
        out.contains("10.0.0.4:80") && out.contains("10.0.1.2:80"),
        "{out}"
    );
    drop(proxy);
}

#[test]
fn a_refusing_or_black_holed_endpoint_is_retried_on_the_next() {
    if !require_root() {
        return;
    }
    let (topology, mut servers) = seed_topology();
    let dir = tempdir();
    let manifest = write(dir.path(), "cluster.yaml", &cluster());
    let mut proxy = start(&topology, dir.path(), manifest.to_str().unwrap(), &[]);
    let node = topology.node();
    let t = Duration::from_secs(5);

    // be1 refuses (its server is gone: RST): every request still succeeds, on be0.
    drop(servers.pop());
    // Until its listening socket is gone, the kernel may still complete a handshake for it.
    let gone = kp_testkit::wait_for(
        || {
            node.in_ns(|| {
                TcpStream::connect_timeout(&addr("10.0.1.2:80"), Duration::from_secs(1)).is_err()
            })
            .unwrap_or(false)
        },
        Duration::from_secs(5),
    );
    assert!(gone.is_ok(), "be1 still accepts connections");
    let c = counts(http_get_many(topology.client(), addr(NODE_PORT), 20, t));
    assert_eq!(answered(&c, "be0"), 20, "{c:?}");
    let failures = metric(
        node,
        "kube_proxy_rs_userspace_dial_failures_total",
        "default/web",
    )
    .unwrap_or(0.0);
    assert!(
        failures >= 5.0,
        "about half the connects went to be1 first: {failures}"
    );

    // be1 black-holed (SYNs dropped): every request still succeeds, after the first dial
    // timeout (250 ms) for those that tried be1 first.
    topology
        .backend(1)
        .ns()
        .run(
            "iptables",
            ["-A", "INPUT", "-p", "tcp", "--dport", "80", "-j", "DROP"],
        )
        .unwrap();
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    for _ in 0..10 {
        let one = Instant::now();
        let r = http_get(topology.client(), addr(NODE_PORT), t);
        assert_eq!(
            r.as_ref().map(|r| r.name().to_string()).ok().as_deref(),
            Some("be0"),
            "{r:?}"
        );
        slowest = slowest.max(one.elapsed());
    }
    let total = started.elapsed();
    eprintln!(
        "10 requests with one of two endpoints black-holed: {total:?} in all, slowest {slowest:?}"
    );
    assert!(
        slowest >= Duration::from_millis(240),
        "no request waited for the dial timeout: {slowest:?}"
    );
    assert!(slowest < Duration::from_millis(1500), "{slowest:?}");
    assert!(proxy.is_running());
}

#[test]
fn client_ip_affinity_and_endpoint_changes_with_an_open_connection() {
    if !require_root() {
        return;
    }
    let (topology, _servers) = seed_topology();
    let dir = tempdir();
    let manifest = write(dir.path(), "cluster.yaml", &cluster());
    let mut proxy = start(&topology, dir.path(), manifest.to_str().unwrap(), &[]);
    let node = topology.node();
    let t = Duration::from_secs(3);

    let c = counts(http_get_many(
        topology.client(),
        addr("10.96.0.90:80"),
        10,
        t,
    ));
    assert_eq!(c.len(), 1, "one backend for one client: {c:?}");
    assert_eq!(c.values().sum::<usize>(), 10, "{c:?}");

    // A connection through the NodePort, held open, reaching one of the two backends.
    let mut held: Vec<TcpStream> = topology
        .client()
        .in_ns(|| {
            (0..2)
                .map(|_| TcpStream::connect_timeout(&addr(NODE_PORT), t).unwrap())
                .collect()
        })
        .unwrap();
    // Remove be0 from `web`: new connections go to be1 only, the open ones keep working.
    let without_be0 = cluster().replacen(
        "- addresses: [10.0.0.4]\n  nodeName: k8s-master\n- addresses: [10.0.1.2]\n  nodeName: k8s-worker\nports: [{name: \"\", port: 80, protocol: TCP}]\n---\napiVersion: v1\nkind: Service\nmetadata: {name: empty",
        "- addresses: [10.0.1.2]\n  nodeName: k8s-worker\nports: [{name: \"\", port: 80, protocol: TCP}]\n---\napiVersion: v1\nkind: Service\nmetadata: {name: empty",
        1,
    );
    assert_ne!(
        without_be0,
        cluster(),
        "the manifest edit must change web's endpoints"
    );
    write(dir.path(), "cluster.yaml", &without_be0);
    proxy.wait_until("web never lost be0", || {
        let table = curl(node, "/userspace");
        table
            .lines()
            .any(|l| l.contains(" default/web ") && !l.contains("10.0.0.4"))
    });
    let c = counts(http_get_many(topology.client(), addr(NODE_PORT), 6, t));
    assert_eq!(answered(&c, "be1"), 6, "{c:?}");
    let mut names = Vec::new();
    for s in &mut held {
        s.set_read_timeout(Some(t)).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        names.push(reply.lines().last().unwrap_or_default().to_string());
    }
    names.sort();
    assert_eq!(
        names,
        ["be0", "be1"],
        "the held connections were answered by the backends they reached"
    );
}

#[test]
fn udp_replies_come_from_the_service_and_idle_flows_expire() {
    if !require_root() {
        return;
    }
    let (topology, _servers) = seed_topology();
    let _udp = start_udp_echo(&topology, 5353);
    let dir = tempdir();
    let manifest = write(dir.path(), "cluster.yaml", &cluster());
    let _proxy = start(
        &topology,
        dir.path(),
        manifest.to_str().unwrap(),
        &["--udp-timeout=1s"],
    );
    let node = topology.node();
    let dns = addr("10.96.0.53:53");
    let t = Duration::from_secs(3);
    // A connected socket: a reply from any other address than the Service's would not
    // reach it.
    let client = UdpClient::bind(topology.client(), addr("192.168.56.100:40001")).unwrap();
    let other = UdpClient::bind(topology.client(), addr("192.168.56.100:40002")).unwrap();
    for _ in 0..3 {
        let r = client.request(dns, b"ping", t).unwrap();
        assert_eq!(r.text().trim(), "be0", "{r:?}");
    }
    other.request(dns, b"ping", t).unwrap();
    assert_eq!(
        metric(
            node,
            "kube_proxy_rs_userspace_connections_total",
            "default/dns:dns"
        ),
        Some(2.0),
        "one flow per client address and port"
    );
    assert_eq!(
        metric(
            node,
            "kube_proxy_rs_userspace_open_connections",
            "default/dns:dns"
        ),
        Some(2.0)
    );
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(
        metric(
            node,
            "kube_proxy_rs_userspace_open_connections",
            "default/dns:dns"
        ),
        Some(0.0),
        "idle flows expire after --udp-timeout"
    );
    client.request(dns, b"ping", t).unwrap();
    assert_eq!(
        metric(
            node,
            "kube_proxy_rs_userspace_connections_total",
            "default/dns:dns"
        ),
        Some(3.0),
        "a new flow after expiry"
    );
}

#[test]
fn a_thousand_concurrent_connections_and_file_descriptors_back_to_baseline() {
    if !require_root() {
        return;
    }
    kp_relay::raise_fd_limit().unwrap();
    let (topology, _servers) = seed_topology();
    let dir = tempdir();
    let manifest = write(dir.path(), "cluster.yaml", &cluster());
    let mut proxy = start(&topology, dir.path(), manifest.to_str().unwrap(), &[]);
    let node = topology.node();
    let pid = proxy.guard.id();
    // One request first, so every lazily created runtime resource exists.
    http_get(topology.client(), addr(NODE_PORT), Duration::from_secs(3)).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let baseline = open_fds(pid);
    let t = Duration::from_secs(10);
    let mut conns: Vec<TcpStream> = topology
        .client()
        .in_ns(|| {
            (0..1000)
                .map(|_| {
                    let mut s = TcpStream::connect_timeout(&addr(NODE_PORT), t).unwrap();
                    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n")
                        .unwrap();
                    s
                })
                .collect()
        })
        .unwrap();
    proxy.wait_until("1,000 connections open in the proxy", || {
        metric(
            node,
            "kube_proxy_rs_userspace_open_connections",
            "default/web",
        ) == Some(1000.0)
    });
    // Each relayed connection holds 2 sockets and 4 pipe ends once its backend answered.
    proxy.wait_until(
        "the relayed connections hold their sockets and pipes",
        || open_fds(pid) >= baseline + 5000,
    );
    let during = open_fds(pid);
    let mut answered_by = std::collections::BTreeMap::<String, usize>::new();
    for s in &mut conns {
        s.set_read_timeout(Some(t)).unwrap();
        let mut buf = [0u8; 512];
        let n = s.read(&mut buf).unwrap();
        let text = String::from_utf8_lossy(&buf[..n]).to_string();
        let name = text.lines().last().unwrap_or_default().to_string();
        *answered_by.entry(name).or_default() += 1;
    }
    // Round robin hands out 500 each; a backend whose accept queue overflows under the
    // burst drops SYNs, and the proxy retries those connects on the other one.
    assert_eq!(answered_by.values().sum::<usize>(), 1000, "{answered_by:?}");
    assert!(
        answered_by.get("be0").is_some_and(|n| *n >= 300),
        "{answered_by:?}"
    );
    assert!(
        answered_by.get("be1").is_some_and(|n| *n >= 300),
        "{answered_by:?}"
    );
    drop(conns);
    proxy.wait_until("the proxy's connections closed", || {
        metric(
            node,
            "kube_proxy_rs_userspace_open_connections",
            "default/web",
        ) == Some(0.0)
    });
    proxy.wait_until("file descriptors back to the baseline", || {
        open_fds(pid) <= baseline + 2
    });
    eprintln!(
        "proxy fds: {baseline} before, {during} with 1,000 connections, {} after",
        open_fds(pid)
    );
    assert!(
        during >= baseline + 4000,
        "each relayed connection holds its sockets and pipes: {during} vs {baseline}"
    );
}

#[test]
fn cleanup_and_a_switch_to_iptables_mode_remove_the_portals() {
    if !require_root() {
        return;
    }
    let dir = tempdir();
    let manifest = write(dir.path(), "cluster.yaml", &cluster());
    let manifest = manifest.to_str().unwrap();
    let ns = Netns::new("us-switch").unwrap();
    let mut args = vec!["--proxy-mode=userspace", "--manifests", manifest, "--once"];
    args.extend(NODE_ARGS);
    let (ok, _, err) = run_in(&ns, &args);
    assert!(ok, "{err}");
    assert!(save(&ns, "iptables-save").contains("-A KUBE-PORTALS-CONTAINER"));
    // iptables mode: the portal chains go, iptables mode's come.
    let mut ipt = vec!["--manifests", manifest, "--once"];
    ipt.extend(NODE_ARGS);
    let (ok, _, err) = run_in(&ns, &ipt);
    assert!(ok, "{err}");
    let saved = save(&ns, "iptables-save");
    assert!(
        !saved.contains("KUBE-PORTALS") && !saved.contains("KUBE-NODEPORT-NON-LOCAL"),
        "{saved}"
    );
    assert!(saved.contains("-A KUBE-SERVICES"), "{saved}");
    // Back to userspace mode: iptables mode's chains go in the same restore.
    let (ok, _, err) = run_in(&ns, &args);
    assert!(ok, "{err}");
    let saved = save(&ns, "iptables-save");
    assert!(
        !saved.contains("KUBE-SERVICES") && !saved.contains("KUBE-SEP-"),
        "{saved}"
    );
    // nftables mode: the portal chains go with the rest of the iptables rules.
    let mut nft = vec!["--proxy-mode=nftables", "--manifests", manifest, "--once"];
    nft.extend(NODE_ARGS);
    let (ok, _, err) = run_in(&ns, &nft);
    assert!(ok, "{err}");
    let saved = save(&ns, "iptables-save");
    assert!(
        !saved.contains("KUBE-PORTALS") && !saved.contains("KUBE-NODEPORT-NON-LOCAL"),
        "{saved}"
    );
    let (ok, _, err) = run_in(&ns, &args);
    assert!(ok, "{err}");
    assert!(
        !ns.run("nft", ["list", "tables"])
            .unwrap_or_default()
            .contains("kube-proxy"),
        "userspace mode deletes nftables mode's tables"
    );
    // --cleanup removes everything of ours.
    let (ok, _, err) = run_in(&ns, &["--cleanup"]);
    assert!(ok, "{err}");
    let saved = save(&ns, "iptables-save");
    assert!(
        !saved.contains("KUBE-PORTALS") && !saved.contains("KUBE-NODEPORT"),
        "{saved}"
    );
}

/// An IPv6-only node: the ClusterIP and the NodePort reach both backends through the
/// ip6tables portals and the `::` proxy sockets.
#[test]
fn ipv6_cluster_ip_and_node_port() {
    common::ipv6_cluster_ip_and_node_port(Mode::Userspace);
}

/// `--userspace-max-connections`: past the limit a new connection is reset at once, logged
/// and counted; the daemon keeps serving, and a slot freed is used again.
#[test]
fn the_connection_limit_resets_new_connections_logs_and_counts_them() {
    if !require_root() {
        return;
    }
    let (topology, _servers) = seed_topology();
    let dir = tempdir();
    let manifest = write(dir.path(), "cluster.yaml", &cluster());
    let mut proxy = start(
        &topology,
        dir.path(),
        manifest.to_str().unwrap(),
        &["--userspace-max-connections=3"],
    );
    let node = topology.node();
    let t = Duration::from_secs(3);
    let held: Vec<TcpStream> = topology
        .client()
        .in_ns(|| {
            (0..3)
                .map(|_| TcpStream::connect_timeout(&addr(NODE_PORT), t).unwrap())
                .collect()
        })
        .unwrap();
    proxy.wait_until("three connections open", || {
        metric(
            node,
            "kube_proxy_rs_userspace_open_connections",
            "default/web",
        ) == Some(3.0)
    });
    let r = http_get(topology.client(), addr(NODE_PORT), t);
    assert!(
        matches!(r, Err(kp_testkit::ClientError::Reset)),
        "the fourth connection is reset: {r:?}"
    );
    assert_eq!(
        metric(
            node,
            "kube_proxy_rs_userspace_rejected_connections_total",
            "default/web"
        ),
        Some(1.0)
    );
    proxy.wait_until("the limit is logged", || {
        proxy_log_has(dir.path(), "connection limit reached")
    });
    drop(held);
    proxy.wait_until("the slots are free again", || {
        metric(
            node,
            "kube_proxy_rs_userspace_open_connections",
            "default/web",
        ) == Some(0.0)
    });
    let r = http_get(topology.client(), addr(NODE_PORT), t);
    assert!(r.is_ok(), "{r:?}");
    assert!(proxy.is_running());
}

fn proxy_log_has(dir: &std::path::Path, needle: &str) -> bool {
    std::fs::read_to_string(dir.join("proxy.log")).is_ok_and(|l| l.contains(needle))
}
