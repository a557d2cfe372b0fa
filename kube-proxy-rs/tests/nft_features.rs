//! Real-traffic checks of Service features through `kube-proxy-rs --proxy-mode nftables`, in
//! network namespaces created by each test (root; CI runs them): session affinity,
//! externalTrafficPolicy Local keeping the client's address, loadBalancerSourceRanges, UDP,
//! and the UDP conntrack cleanup after an endpoint change. The same checks as
//! `netns_features.rs` runs for iptables mode.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use kp_testkit::netns::topology::FamilyPlan;
use kp_testkit::{
    ChildGuard, ClientError, HttpBackend, Topology, UdpClient, UdpEchoBackend, http_get,
    http_get_many, require_root, udp_request,
};

const BIN: &str = env!("CARGO_BIN_EXE_kube-proxy-rs");

/// Node `k8s-master` 192.168.56.10; client 192.168.56.100 (and .101); backends be0 10.0.1.4
/// (on this node) and be1 10.0.2.5 (nodeName node-b).
const CLUSTER: &str = r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata: {name: k8s-master}
  status:
    addresses: [{type: InternalIP, address: 192.168.56.10}]
- apiVersion: v1
  kind: Service
  metadata: {name: sticky, namespace: default}
  spec:
    clusterIP: 10.96.0.90
    sessionAffinity: ClientIP
    sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}
    ports: [{port: 80, targetPort: 80}]
- apiVersion: v1
  kind: Service
  metadata: {name: local, namespace: default}
  spec:
    type: NodePort
    clusterIP: 10.96.0.70
    externalTrafficPolicy: Local
    ports: [{port: 80, targetPort: 80, nodePort: 30070}]
- apiVersion: v1
  kind: Service
  metadata: {name: fw, namespace: default}
  spec:
    type: LoadBalancer
    clusterIP: 10.96.0.60
    loadBalancerSourceRanges: [192.168.56.100/32]
    ports: [{port: 80, targetPort: 80, nodePort: 30060}]
  status:
    loadBalancer:
      ingress: [{ip: 10.99.0.3}]
- apiVersion: v1
  kind: Service
  metadata: {name: dns, namespace: default}
  spec:
    clusterIP: 10.96.0.53
    ports: [{name: dns, port: 53, targetPort: 5353, protocol: UDP}]
"#;

fn slices() -> String {
    let mut out = String::new();
    for (svc, port, proto, pname) in [
        ("sticky", 80, "TCP", ""),
        ("local", 80, "TCP", ""),
        ("fw", 80, "TCP", ""),
        ("dns", 5353, "UDP", "dns"),
    ] {
        out.push_str(&format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {svc}-1\n  namespace: default\n  labels: {{kubernetes.io/service-name: {svc}}}\naddressType: IPv4\nendpoints:\n- addresses: [10.0.1.4]\n  nodeName: k8s-master\n- addresses: [10.0.2.5]\n  nodeName: node-b\nports: [{{name: \"{pname}\", port: {port}, protocol: {proto}}}]\n"
        ));
    }
    out
}

struct Cluster {
    topology: Topology,
    _http: Vec<HttpBackend>,
    _udp: Vec<UdpEchoBackend>,
    _proxy: ChildGuard,
    _dir: tempfile::TempDir,
}

fn start() -> Cluster {
    let plan = FamilyPlan {
        pod_cidr: "10.0.0.0/16".parse().unwrap(),
        ..FamilyPlan::ipv4()
    };
    let mut topology = Topology::builder()
        .family(plan)
        .backend(vec!["10.0.1.4".parse().unwrap()])
        .backend(vec!["10.0.2.5".parse().unwrap()])
        .build()
        .unwrap();
    topology.add_client(true).unwrap();
    let http = topology.start_http(80).unwrap();
    let mut udp = Vec::new();
    for b in topology.backends() {
        let ip = b.ips()[0];
        udp.push(UdpEchoBackend::start(b.ns(), SocketAddr::new(ip, 5353), b.name()).unwrap());
    }
    let dir = tempfile::Builder::new()
        .prefix("kp-nft-features-")
        .tempdir()
        .unwrap();
    let manifest = dir.path().join("cluster.yaml");
    std::fs::write(&manifest, format!("{CLUSTER}{}", slices())).unwrap();
    let log = std::fs::File::create(dir.path().join("proxy.log")).unwrap();
    let mut cmd = topology.node().command(BIN);
    cmd.args([
        "--proxy-mode=nftables",
        "--hostname-override=k8s-master",
        "--cluster-cidr=10.0.0.0/16",
        "--manifests",
    ])
    .arg(&manifest)
    .stdin(Stdio::null())
    .stdout(log.try_clone().unwrap())
    .stderr(log);
    let mut proxy = ChildGuard::spawn(&mut cmd, "kube-proxy-rs").unwrap();
    let node = topology.node();
    proxy
        .wait_for(
            || {
                node.run(
                    "nft",
                    ["list", "chain", "ip", "kube-proxy", "nat-postrouting"],
                )
                .is_ok_and(|s| s.contains("jump masquerading"))
            },
            Duration::from_secs(20),
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", read_log(dir.path())));
    Cluster {
        topology,
        _http: http,
        _udp: udp,
        _proxy: proxy,
        _dir: dir,
    }
}

fn read_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("proxy.log")).unwrap_or_default()
}

#[test]
fn nft_service_features_with_real_traffic() {
    if !require_root() {
        return;
    }
    let c = start();
    let client = c.topology.client();
    let client2 = c.topology.clients()[1].ns();
    let node_ip: IpAddr = "192.168.56.10".parse().unwrap();

    // Session affinity: every connection of one client goes to the same backend.
    let names: Vec<String> = http_get_many(
        client,
        "10.96.0.90:80".parse().unwrap(),
        30,
        Duration::from_secs(2),
    )
    .into_iter()
    .map(|r| r.expect("sticky request").name().to_string())
    .collect();
    assert!(
        names.iter().all(|n| *n == names[0]),
        "affinity broken: {names:?}"
    );
    // The client's address is remembered in the chosen endpoint's affinity set.
    let table = c
        .topology
        .node()
        .run("nft", ["list", "table", "ip", "kube-proxy"])
        .unwrap();
    let remembered = table
        .split("\tset ")
        .filter(|set| set.starts_with("affinity-"))
        .filter_map(|set| set.split("\n\t}").next())
        .filter(|set| set.contains("192.168.56.100 expires"))
        .count();
    assert_eq!(remembered, 1, "{table}");

    // externalTrafficPolicy Local: only the local endpoint, and it sees the client's address.
    let be0 = &c._http[0];
    be0.clear_peers();
    let replies = http_get_many(
        client,
        SocketAddr::new(node_ip, 30070),
        20,
        Duration::from_secs(2),
    );
    for r in &replies {
        assert_eq!(
            r.as_ref().expect("Local NodePort").name(),
            "be0",
            "only the local endpoint serves"
        );
    }
    let client_ip: IpAddr = "192.168.56.100".parse().unwrap();
    assert!(
        !be0.peer_ips().is_empty() && be0.peer_ips().iter().all(|ip| *ip == client_ip),
        "source not preserved: {:?}",
        be0.peer_ips()
    );

    // Hairpin: the local endpoint reaches its own Service and is answered by itself too
    // (masqueraded through the hairpin-connections set, or the reply would bypass NAT).
    let pod = c.topology.backend(0).ns();
    let mut answered = std::collections::BTreeMap::new();
    for r in http_get_many(
        pod,
        "10.96.0.70:80".parse().unwrap(),
        30,
        Duration::from_secs(2),
    ) {
        *answered
            .entry(r.expect("hairpin request").name().to_string())
            .or_insert(0) += 1;
    }
    assert!(
        answered.get("be0").is_some_and(|n| *n > 0) && answered.get("be1").is_some_and(|n| *n > 0),
        "{answered:?}"
    );

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
    let mut seen = std::collections::BTreeSet::new();
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
fn nft_udp_conntrack_entries_follow_endpoint_changes() {
    if !require_root() {
        return;
    }
    let plan = FamilyPlan {
        pod_cidr: "10.0.0.0/16".parse().unwrap(),
        ..FamilyPlan::ipv4()
    };
    let topology = Topology::builder()
        .family(plan)
        .backend(vec!["10.0.1.4".parse().unwrap()])
        .backend(vec!["10.0.2.5".parse().unwrap()])
        .build()
        .unwrap();
    let mut udp = Vec::new();
    for b in topology.backends() {
        udp.push(
            UdpEchoBackend::start(b.ns(), SocketAddr::new(b.ips()[0], 5353), b.name()).unwrap(),
        );
    }
    let service = "apiVersion: v1\nkind: Service\nmetadata: {name: dns, namespace: default}\nspec:\n  clusterIP: 10.96.0.53\n  ports: [{name: dns, port: 53, targetPort: 5353, protocol: UDP}]\n";
    let slice = |ip: &str, node: &str| {
        format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: dns-1\n  namespace: default\n  labels: {{kubernetes.io/service-name: dns}}\naddressType: IPv4\nendpoints:\n- addresses: [{ip}]\n  nodeName: {node}\nports: [{{name: dns, port: 5353, protocol: UDP}}]\n"
        )
    };
    let dir = tempfile::Builder::new()
        .prefix("kp-nft-udp-")
        .tempdir()
        .unwrap();
    let manifest = dir.path().join("dns.yaml");
    std::fs::write(
        &manifest,
        format!("{service}{}", slice("10.0.1.4", "k8s-master")),
    )
    .unwrap();
    let log = std::fs::File::create(dir.path().join("proxy.log")).unwrap();
    let mut cmd = topology.node().command(BIN);
    cmd.args([
        "--proxy-mode=nftables",
        "--hostname-override=k8s-master",
        "--cluster-cidr=10.0.0.0/16",
        "--iptables-min-sync-period=200ms",
        "--manifests",
    ])
    .arg(&manifest)
    .stdin(Stdio::null())
    .stdout(log.try_clone().unwrap())
    .stderr(log);
    let mut proxy = ChildGuard::spawn(&mut cmd, "kube-proxy-rs").unwrap();
    let node = topology.node();
    proxy
        .wait_for(
            || {
                node.run("nft", ["list", "table", "ip", "kube-proxy"])
                    .is_ok_and(|s| s.contains("10.0.1.4:5353"))
            },
            Duration::from_secs(20),
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", read_log(dir.path())));

    // A resolver-like client: one socket, one source port, a query every 100 ms.
    let vip: SocketAddr = "10.96.0.53:53".parse().unwrap();
    let client = UdpClient::bind(topology.client(), "0.0.0.0:45353".parse().unwrap()).unwrap();
    for _ in 0..5 {
        assert_eq!(
            client
                .request(vip, b"q", Duration::from_secs(2))
                .unwrap()
                .text(),
            "be0"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The endpoint moves from be0 to be1; be0 stays up, so only conntrack could keep the
    // client on it.
    let tmp = dir.path().join(".dns.yaml.tmp");
    std::fs::write(&tmp, format!("{service}{}", slice("10.0.2.5", "node-b"))).unwrap();
    std::fs::rename(&tmp, &manifest).unwrap();
    let start = std::time::Instant::now();
    let mut moved = false;
    while start.elapsed() < Duration::from_secs(5) {
        if client
            .request(vip, b"q", Duration::from_secs(1))
            .map(|r| r.text())
            .ok()
            .as_deref()
            == Some("be1")
        {
            moved = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        moved,
        "the client's conntrack entry still points at be0\n{}",
        read_log(dir.path())
    );
    eprintln!(
        "the same source port reached the new endpoint after {:?}",
        start.elapsed()
    );
    assert!(
        read_log(dir.path()).contains("deleted stale UDP conntrack entries"),
        "{}",
        read_log(dir.path())
    );
    for _ in 0..5 {
        assert_eq!(
            client
                .request(vip, b"q", Duration::from_secs(2))
                .unwrap()
                .text(),
            "be1"
        );
    }
    drop(udp);
}

#[test]
fn nft_ipv6_cluster_ip_and_node_port() {
    if !require_root() {
        return;
    }
    let topology = Topology::builder().ipv6_only().backends(2).build().unwrap();
    let http = topology.start_http(8080).unwrap();
    let be: Vec<IpAddr> = topology
        .backends()
        .iter()
        .map(|b| b.ip(kp_model::IpFamily::V6).unwrap())
        .collect();
    let manifest = format!(
        r#"apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata: {{name: k8s-master}}
  status:
    addresses: [{{type: InternalIP, address: "fd00:56::10"}}]
- apiVersion: v1
  kind: Service
  metadata: {{name: web6, namespace: default}}
  spec:
    type: NodePort
    clusterIP: "fd00:10:96::a"
    ipFamilies: [IPv6]
    ports: [{{port: 80, targetPort: 8080, nodePort: 30090}}]
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata:
    name: web6-1
    namespace: default
    labels: {{kubernetes.io/service-name: web6}}
  addressType: IPv6
  endpoints:
  - addresses: ["{}"]
    nodeName: k8s-master
  - addresses: ["{}"]
    nodeName: node-b
  ports: [{{name: "", port: 8080, protocol: TCP}}]
"#,
        be[0], be[1]
    );
    let dir = tempfile::Builder::new()
        .prefix("kp-nft-v6-")
        .tempdir()
        .unwrap();
    let path = dir.path().join("cluster.yaml");
    std::fs::write(&path, manifest).unwrap();
    let log = std::fs::File::create(dir.path().join("proxy.log")).unwrap();
    let mut cmd = topology.node().command(BIN);
    cmd.args([
        "--proxy-mode=nftables",
        "--hostname-override=k8s-master",
        "--cluster-cidr=fd00:10:244::/64",
        "--manifests",
    ])
    .arg(&path)
    .stdin(Stdio::null())
    .stdout(log.try_clone().unwrap())
    .stderr(log);
    let mut proxy = ChildGuard::spawn(&mut cmd, "kube-proxy-rs").unwrap();
    let node = topology.node();
    proxy
        .wait_for(
            || {
                node.run("nft", ["list", "table", "ip6", "kube-proxy"])
                    .is_ok_and(|s| s.contains("fd00:10:96::a . tcp . 80"))
            },
            Duration::from_secs(20),
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", read_log(dir.path())));
    for (what, target) in [
        ("ClusterIP", "[fd00:10:96::a]:80"),
        ("NodePort", "[fd00:56::10]:30090"),
    ] {
        let mut seen = std::collections::BTreeSet::new();
        for r in http_get_many(
            topology.client(),
            target.parse().unwrap(),
            40,
            Duration::from_secs(2),
        ) {
            seen.insert(
                r.unwrap_or_else(|e| panic!("{what}: {e:?}\n{}", read_log(dir.path())))
                    .name()
                    .to_string(),
            );
        }
        assert_eq!(seen.len(), 2, "{what}: both backends answer: {seen:?}");
    }
    drop(http);
}
