//! Real-traffic checks of Service features through the `kube-proxy-rs` binary, in both proxy
//! modes: session affinity, externalTrafficPolicy Local keeping the client's address,
//! hairpin traffic, loadBalancerSourceRanges, UDP and the UDP conntrack cleanup after an
//! endpoint change, and an IPv6-only node. They prove with real packets a subset of what
//! the conformance table proves with the tracer.
//!
//! A check that holds in both modes is written once, as a function taking the [`Mode`], with
//! one `#[test]` per mode; nftables-only checks are in `if` branches or in a test named after
//! the mode. Each test creates its own network namespaces (root; CI runs them); nothing here
//! touches the root namespace.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use common::{
    Daemon, Mode, NODE_ARGS, counts, dns_cluster, feature_cluster, feature_topology, names,
    nft_table, start_udp_echo, tempdir, write,
};
use kp_testkit::{
    ClientError, HttpBackend, Topology, UdpClient, UdpEchoBackend, http_get, http_get_many,
    require_root, udp_request,
};

/// The feature cluster with the proxy running: HTTP on port 80 and UDP echo on 5353 in both
/// backends, and a second client (192.168.56.101) outside `fw`'s source range.
struct Cluster {
    topology: Topology,
    http: Vec<HttpBackend>,
    _udp: Vec<UdpEchoBackend>,
    _proxy: Daemon,
    _dir: tempfile::TempDir,
}

fn start(mode: Mode) -> Cluster {
    let mut topology = feature_topology();
    topology.add_client(true).unwrap();
    let http = topology.start_http(80).unwrap();
    let udp = start_udp_echo(&topology, 5353);
    let dir = tempdir();
    let manifest = write(dir.path(), "cluster.yaml", &feature_cluster(mode));
    let mut args = vec!["--manifests", manifest.to_str().unwrap()];
    args.extend(NODE_ARGS);
    let mut proxy = Daemon::start(mode, topology.node(), dir.path(), &args, None);
    proxy.wait_programmed(topology.node());
    Cluster {
        topology,
        http,
        _udp: udp,
        _proxy: proxy,
        _dir: dir,
    }
}

/// Affinity, Local policy, source ranges and UDP balancing, one after the other on one
/// cluster.
fn service_features_with_real_traffic(mode: Mode) {
    if !require_root() {
        return;
    }
    let c = start(mode);
    let client = c.topology.client();
    let client2 = c.topology.clients()[1].ns();
    let node_ip: IpAddr = "192.168.56.10".parse().unwrap();

    // Session affinity: every connection of one client goes to the same backend.
    let sticky = names(
        http_get_many(
            client,
            "10.96.0.90:80".parse().unwrap(),
            30,
            Duration::from_secs(2),
        ),
        "sticky request",
    );
    assert!(
        sticky.iter().all(|n| *n == sticky[0]),
        "affinity broken: {sticky:?}"
    );
    if mode == Mode::Nftables {
        // The client's address is remembered in the chosen endpoint's affinity set.
        let table = nft_table(c.topology.node(), "ip").unwrap();
        let remembered = table
            .split("\tset ")
            .filter(|set| set.starts_with("affinity-"))
            .filter_map(|set| set.split("\n\t}").next())
            .filter(|set| set.contains("192.168.56.100 expires"))
            .count();
        assert_eq!(remembered, 1, "{table}");
    }

    // externalTrafficPolicy Local: only the local endpoint, and it sees the client's address.
    let be0 = &c.http[0];
    be0.clear_peers();
    let local = names(
        http_get_many(
            client,
            SocketAddr::new(node_ip, 30070),
            20,
            Duration::from_secs(2),
        ),
        "Local NodePort",
    );
    for name in &local {
        assert_eq!(name, "be0", "only the local endpoint serves");
    }
    let client_ip: IpAddr = "192.168.56.100".parse().unwrap();
    assert!(
        !be0.peer_ips().is_empty() && be0.peer_ips().iter().all(|ip| *ip == client_ip),
        "source not preserved: {:?}",
        be0.peer_ips()
    );

    {
        // Hairpin: the local endpoint reaches its own Service and is answered by itself too
        // (masqueraded by the KUBE-SEP chain's source match or nftables' hairpin-connections
        // set, or the reply would bypass NAT).
        let pod = c.topology.backend(0).ns();
        let mut answered = BTreeMap::new();
        for name in names(
            http_get_many(
                pod,
                "10.96.0.70:80".parse().unwrap(),
                30,
                Duration::from_secs(2),
            ),
            "hairpin request",
        ) {
            *answered.entry(name).or_insert(0) += 1;
        }
        assert!(
            answered.get("be0").is_some_and(|n| *n > 0)
                && answered.get("be1").is_some_and(|n| *n > 0),
            "{answered:?}"
        );
    }

    // loadBalancerSourceRanges: the allowed client gets through, another one is dropped.
    let lb: SocketAddr = "10.99.0.3:80".parse().unwrap();
    assert!(
        http_get(client, lb, Duration::from_secs(2)).is_ok(),
        "client inside the source range"
    );
    let denied = http_get(client2, lb, Duration::from_millis(1500));
    assert!(
        matches!(denied, Err(ClientError::Timeout)),
        "client outside the range must be dropped: {denied:?}"
    );
    // ...but its NodePort is not filtered.
    assert!(
        http_get(
            client2,
            SocketAddr::new(node_ip, 30060),
            Duration::from_secs(2)
        )
        .is_ok()
    );

    // UDP: requests reach both backends; one socket (one source port) sticks to one backend
    // through conntrack.
    let vip: SocketAddr = "10.96.0.53:53".parse().unwrap();
    let mut seen = BTreeSet::new();
    for _ in 0..40 {
        let reply =
            udp_request(client, vip, b"q", Duration::from_secs(2), None).expect("UDP reply");
        seen.insert(reply.text());
    }
    assert_eq!(seen.len(), 2, "UDP balanced over both backends: {seen:?}");
    let socket = UdpClient::bind(client, "0.0.0.0:40053".parse().unwrap()).unwrap();
    let first = socket
        .request(vip, b"q", Duration::from_secs(2))
        .unwrap()
        .text();
    for _ in 0..10 {
        assert_eq!(
            socket
                .request(vip, b"q", Duration::from_secs(2))
                .unwrap()
                .text(),
            first
        );
    }
}

#[test]
fn service_features_with_real_traffic_iptables() {
    service_features_with_real_traffic(Mode::Iptables);
}

#[test]
fn service_features_with_real_traffic_nftables() {
    service_features_with_real_traffic(Mode::Nftables);
}

/// A resolver-like UDP client keeps its source port while the `dns` endpoint moves from be0
/// to be1; be0 stays up, so only a stale conntrack entry could keep the client on it: the
/// proxy must delete it.
fn udp_conntrack_entries_follow_endpoint_changes(mode: Mode) {
    if !require_root() {
        return;
    }
    let topology = feature_topology();
    let udp = start_udp_echo(&topology, 5353);
    let dir = tempdir();
    let manifest = write(
        dir.path(),
        "dns.yaml",
        &dns_cluster("10.0.1.4", "k8s-master"),
    );
    let mut args = vec![
        "--iptables-min-sync-period=200ms",
        "--manifests",
        manifest.to_str().unwrap(),
    ];
    args.extend(NODE_ARGS);
    let node = topology.node();
    let mut proxy = Daemon::start(mode, node, dir.path(), &args, None);
    proxy.wait_nat_rules_contain(node, &mode.endpoint_in_rules("10.0.1.4:5353"));

    // A resolver-like client: one socket, one source port, a query every 100 ms.
    let vip: SocketAddr = "10.96.0.53:53".parse().unwrap();
    let client = UdpClient::bind(topology.client(), "0.0.0.0:45353".parse().unwrap()).unwrap();
    let ask = |timeout| client.request(vip, b"q", timeout).map(|r| r.text());
    for _ in 0..5 {
        assert_eq!(ask(Duration::from_secs(2)).unwrap(), "be0");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The endpoint moves from be0 to be1; be0 stays up, so only conntrack could keep the
    // client on it.
    write(dir.path(), "dns.yaml", &dns_cluster("10.0.2.5", "node-b"));
    let start = Instant::now();
    let mut moved = false;
    while start.elapsed() < Duration::from_secs(5) {
        if ask(Duration::from_secs(1)).ok().as_deref() == Some("be1") {
            moved = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        moved,
        "the client's conntrack entry still points at be0\n{}",
        proxy.log()
    );
    eprintln!(
        "the same source port reached the new endpoint after {:?}",
        start.elapsed()
    );
    assert!(
        proxy.log().contains("deleted stale UDP conntrack entries"),
        "{}",
        proxy.log()
    );
    for _ in 0..5 {
        assert_eq!(ask(Duration::from_secs(2)).unwrap(), "be1");
    }
    drop(udp);
}

#[test]
fn udp_conntrack_entries_follow_endpoint_changes_iptables() {
    udp_conntrack_entries_follow_endpoint_changes(Mode::Iptables);
}

#[test]
fn udp_conntrack_entries_follow_endpoint_changes_nftables() {
    udp_conntrack_entries_follow_endpoint_changes(Mode::Nftables);
}

#[test]
fn ipv6_cluster_ip_and_node_port_iptables() {
    common::ipv6_cluster_ip_and_node_port(Mode::Iptables);
}

#[test]
fn ipv6_cluster_ip_and_node_port_nftables() {
    common::ipv6_cluster_ip_and_node_port(Mode::Nftables);
}

/// `unnamed` (ClusterIP 10.96.0.71:80) whose EndpointSlice lists be0 (10.0.1.4, a pod on
/// this node) without `nodeName` and be1 (10.0.2.5) on node-b.
const NO_NODE_NAME_CLUSTER: &str = r#"apiVersion: v1
kind: Service
metadata: {name: unnamed, namespace: default}
spec:
  clusterIP: 10.96.0.71
  ports: [{port: 80, targetPort: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: unnamed-1
  namespace: default
  labels: {kubernetes.io/service-name: unnamed}
addressType: IPv4
endpoints:
- addresses: [10.0.1.4]
- addresses: [10.0.2.5]
  nodeName: node-b
ports: [{name: "", port: 80, protocol: TCP}]
"#;

/// Hairpin with an EndpointSlice entry without `nodeName`: be0 reaches its own Service and
/// is answered by itself too, which needs the masquerade (the reply would otherwise go
/// straight back inside be0, from 10.0.1.4 instead of the ClusterIP). iptables mode's KUBE-SEP
/// chains mark every endpoint; nftables mode puts every endpoint in `hairpin-connections`,
/// as upstream v1.36 does (before: only this node's endpoints, so be0 was left out).
fn hairpin_without_node_name(mode: Mode) {
    if !require_root() {
        return;
    }
    let topology = feature_topology();
    let _http = topology.start_http(80).unwrap();
    let dir = tempdir();
    let manifest = write(dir.path(), "cluster.yaml", NO_NODE_NAME_CLUSTER);
    let mut args = vec!["--manifests", manifest.to_str().unwrap()];
    args.extend(NODE_ARGS);
    let node = topology.node();
    let mut proxy = Daemon::start(mode, node, dir.path(), &args, None);
    proxy.wait_programmed(node);
    let pod = topology.backend(0).ns();
    let answered = counts(http_get_many(
        pod,
        "10.96.0.71:80".parse().unwrap(),
        30,
        Duration::from_secs(2),
    ));
    assert!(
        answered.get("be0").is_some_and(|n| *n > 0)
            && answered.get("be1").is_some_and(|n| *n > 0)
            && answered.keys().all(|k| k == "be0" || k == "be1"),
        "{answered:?}\n{}",
        mode.ruleset(node)
    );
}

#[test]
fn hairpin_without_node_name_nftables() {
    hairpin_without_node_name(Mode::Nftables);
}

#[test]
fn hairpin_without_node_name_iptables() {
    hairpin_without_node_name(Mode::Iptables);
}

/// `dns` as a NodePort Service (UDP 10.96.0.53:53, NodePort 30053 → 5353) with one endpoint,
/// be1 (10.0.2.5 on node-b), and no Node object for `k8s-master`.
const DNS_NODE_PORT_CLUSTER: &str = r#"apiVersion: v1
kind: Service
metadata: {name: dns, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.53
  ports: [{name: dns, port: 53, targetPort: 5353, nodePort: 30053, protocol: UDP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: dns-1
  namespace: default
  labels: {kubernetes.io/service-name: dns}
addressType: IPv4
endpoints:
- addresses: [10.0.2.5]
  nodeName: node-b
ports: [{name: dns, port: 5353, protocol: UDP}]
"#;

/// `--nodeport-addresses primary` (nftables mode's default; given explicitly to iptables
/// mode) with no Node object: as upstream, a family the Node gives no address of accepts
/// NodePorts on every local address but loopback, so a UDP datagram to node:30053 is
/// DNATed to the endpoint and answered (before: no rule matched it and the node answered
/// ICMP port unreachable).
fn node_port_without_a_node_address(mode: Mode) {
    if !require_root() {
        return;
    }
    let topology = feature_topology();
    let _udp = start_udp_echo(&topology, 5353);
    let dir = tempdir();
    let manifest = write(dir.path(), "dns.yaml", DNS_NODE_PORT_CLUSTER);
    let mut args = vec!["--manifests", manifest.to_str().unwrap()];
    if mode == Mode::Iptables {
        args.push("--nodeport-addresses=primary");
    }
    args.extend(NODE_ARGS);
    let node = topology.node();
    let mut proxy = Daemon::start(mode, node, dir.path(), &args, None);
    proxy.wait_programmed(node);
    let node_ip = topology.node_ip(kp_model::IpFamily::V4).unwrap();
    let reply = udp_request(
        topology.client(),
        SocketAddr::new(node_ip, 30053),
        b"q",
        Duration::from_secs(2),
        None,
    )
    .unwrap_or_else(|e| {
        panic!(
            "UDP to {node_ip}:30053 was not answered: {e}\n{}\n{}",
            mode.ruleset(node),
            proxy.log()
        )
    });
    assert_eq!(reply.text(), "be1");
}

#[test]
fn node_port_without_a_node_address_nftables() {
    node_port_without_a_node_address(Mode::Nftables);
}

#[test]
fn node_port_without_a_node_address_iptables() {
    node_port_without_a_node_address(Mode::Iptables);
}

/// A LoadBalancer Service with externalTrafficPolicy Local (health-check NodePort 32070,
/// NodePort 30070, its endpoint 10.0.1.4 on this node) and a NodePort Service without
/// endpoints (30030).
const LOCALNET_CLUSTER: &str = r#"apiVersion: v1
kind: Service
metadata: {name: lb-local, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.70
  externalTrafficPolicy: Local
  healthCheckNodePort: 32070
  ports: [{port: 80, targetPort: 80, nodePort: 30070}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: lb-local-1
  namespace: default
  labels: {kubernetes.io/service-name: lb-local}
addressType: IPv4
endpoints:
- addresses: [10.0.1.4]
  nodeName: k8s-master
ports: [{name: "", port: 80, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: empty, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.30
  ports: [{port: 80, targetPort: 80, nodePort: 30030}]
"#;

/// CVE-2020-8558 hardening (iptables mode): with localhost NodePorts the node accepts
/// traffic to 127.0.0.0/8 from its interfaces (`route_localnet=1`), and upstream's
/// `KUBE-FIREWALL` jump, first in filter INPUT, drops what another host sends there unless
/// it was DNATed. A client whose own routes send 127.0.0.1 to the node: a SYN to the
/// health-check NodePort and one to a NodePort without endpoints are dropped (time out)
/// instead of answered by the health-check server or rejected, while a NodePort with an
/// endpoint still answers on 127.0.0.1 (DNATed) and the health-check port on the node's
/// address. With the jump after `KUBE-NODEPORTS` and `KUBE-EXTERNAL-SERVICES` (as before),
/// the first connects and the second is refused. The node starts with the jumps a kubelet
/// before 1.28 created (`-A INPUT/OUTPUT -j KUBE-FIREWALL`, before kube-proxy's first sync),
/// which the proxy moves above its own.
#[test]
fn localnet_guard_drops_outside_traffic_to_127_0_0_1_iptables() {
    if !require_root() {
        return;
    }
    let topology = feature_topology();
    let _http = topology.start_http(80).unwrap();
    let node = topology.node();
    node.run("iptables", ["-N", "KUBE-FIREWALL"]).unwrap();
    for chain in ["INPUT", "OUTPUT"] {
        node.run("iptables", ["-A", chain, "-j", "KUBE-FIREWALL"])
            .unwrap();
    }
    let dir = tempdir();
    let manifest = write(dir.path(), "cluster.yaml", LOCALNET_CLUSTER);
    let mut args = vec!["--manifests", manifest.to_str().unwrap()];
    args.extend(NODE_ARGS);
    let mut proxy = Daemon::start(Mode::Iptables, topology.node(), dir.path(), &args, None);
    proxy.wait_programmed(topology.node());
    let node_ip = topology.node_ip(kp_model::IpFamily::V4).unwrap();
    let client = topology.client();
    // The client sends 127.0.0.0/8 to the node, as a host on the node's network can.
    client.ip(["addr", "flush", "dev", "lo"]).unwrap();
    client
        .sysctl("net.ipv4.conf.all.route_localnet", "1")
        .unwrap();
    let via = node_ip.to_string();
    client
        .ip(["route", "add", "127.0.0.0/8", "via", via.as_str()])
        .unwrap();
    let t = Duration::from_secs(1);
    let lo = |port| SocketAddr::new(IpAddr::from([127, 0, 0, 1]), port);
    let first_line = |ns: &kp_testkit::Netns, chain: &str| {
        ns.run("iptables", ["-S", chain])
            .unwrap()
            .lines()
            .find(|l| l.starts_with("-A "))
            .map(str::to_string)
    };
    let log = || proxy.log();
    // Controls: the client reaches the node on 127.0.0.1 (a DNATed NodePort answers), and
    // the health-check server answers on the node's address.
    let reply = http_get(client, lo(30070), t)
        .unwrap_or_else(|e| panic!("127.0.0.1:30070 (DNATed) failed: {e}\n{}", log()));
    assert_eq!(reply.name(), "be0");
    assert!(
        http_get(client, SocketAddr::new(node_ip, 32070), t).is_ok(),
        "the health-check NodePort answers on the node's address"
    );
    // The guard: both dropped, neither answered.
    for (port, what) in [
        (32070, "the health-check NodePort"),
        (30030, "a NodePort without endpoints"),
    ] {
        match http_get(client, lo(port), t) {
            Err(ClientError::Timeout) => {}
            other => panic!(
                "127.0.0.1:{port} ({what}) from another host must be dropped, got {other:?}\nINPUT: {:?}\n{}",
                first_line(topology.node(), "INPUT"),
                log()
            ),
        }
    }
    for chain in ["INPUT", "OUTPUT"] {
        assert_eq!(
            first_line(node, chain).as_deref(),
            Some(format!("-A {chain} -j KUBE-FIREWALL").as_str())
        );
        let rules = node.run("iptables", ["-S", chain]).unwrap();
        assert_eq!(rules.matches("-j KUBE-FIREWALL").count(), 1, "{rules}");
    }
}
