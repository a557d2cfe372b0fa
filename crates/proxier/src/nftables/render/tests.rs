//! Render tests: golden payloads (insta) of a fresh node, and targeted assertions.

use std::collections::BTreeSet;

use kp_model::{EndpointSlice, IpFamily, NamespacedName, Protocol, Service, Snapshot};
use kp_netfilter::TableObjects;
use kp_testkit::builders::{ServiceBuilder, SliceBuilder, snapshot_with_node};

use super::*;
use crate::nftables::reconcile::full_payload;

const NODE: &str = "k8s-master";

fn node(ips: &[&str]) -> kp_model::Node {
    kp_model::Node {
        name: NODE.to_string(),
        addresses: ips.iter().map(|i| i.parse().unwrap()).collect(),
        ..kp_model::Node::default()
    }
}

fn snap(family: IpFamily, services: Vec<Service>, slices: Vec<EndpointSlice>) -> Snapshot {
    snapshot_with_node(
        family,
        NODE,
        Some(node(&["192.168.56.10", "fd00:56::10"])),
        services,
        slices,
    )
}

fn seed() -> Snapshot {
    snap(
        IpFamily::V4,
        vec![
            ServiceBuilder::new("nginx-svc", "10.96.138.71")
                .tcp("", 8080)
                .build(),
        ],
        vec![
            SliceBuilder::new("nginx-svc")
                .port("", 80)
                .ready("10.0.0.4", "k8s-master")
                .ready("10.0.1.2", "k8s-worker")
                .build(),
        ],
    )
}

fn cluster_cidr() -> RenderConfig {
    RenderConfig {
        local: Some(LocalMatch::Source("10.0.0.0/16".parse().unwrap())),
        ..RenderConfig::default()
    }
}

fn fresh(family: IpFamily, snap: &Snapshot, cfg: &RenderConfig) -> String {
    let r = render(snap, cfg, None);
    full_payload(family, cfg, &r, &TableObjects::default()).0
}

#[test]
fn seed_payload() {
    let payload = fresh(IpFamily::V4, &seed(), &cluster_cidr());
    insta::assert_snapshot!("seed", payload);
    assert!(payload.contains(
        "\tchain service-O4TPQO6D-default/nginx-svc/tcp/ {\n\t\tmeta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.0.0.4 . 80 , 1 : 10.0.1.2 . 80 }\n\t}\n"
    ));
    assert!(payload.contains(
        "add element ip kube-proxy service-ips {\n\t10.96.138.71 . tcp . 8080 : goto service-O4TPQO6D-default/nginx-svc/tcp/\n}\n"
    ));
}

/// One Service with every feature: two ports (TCP with NodePort, UDP), an external IP, a
/// load-balancer IP with source ranges that include the node, externalTrafficPolicy Local,
/// session affinity; a terminating endpoint that is not used; a Service without endpoints,
/// one whose internalTrafficPolicy is Local without local endpoints, and a plain ClusterIP
/// Service with two endpoints (the `numgen … map` DNAT).
fn every_feature() -> Snapshot {
    let (services, slices) = every_feature_objects();
    snap(IpFamily::V4, services, slices)
}

/// The objects of [`every_feature`].
fn every_feature_objects() -> (Vec<Service>, Vec<EndpointSlice>) {
    (
        vec![
            ServiceBuilder::new("shop/web", "10.96.0.10")
                .tcp("http", 80)
                .node_port(30080)
                .udp("metrics", 9125)
                .external_ips(&["203.0.113.10"])
                .load_balancer(&["198.51.100.7"])
                .source_ranges(&["192.168.56.0/24", "203.0.113.0/24"])
                .external_local(Some(32000))
                .affinity(600)
                .build(),
            ServiceBuilder::new("shop/empty", "10.96.0.11")
                .tcp("", 80)
                .node_port(30081)
                .build(),
            ServiceBuilder::new("shop/itp", "10.96.0.12")
                .tcp("", 80)
                .internal_local()
                .build(),
            ServiceBuilder::new("shop/plain", "10.96.0.13")
                .tcp("", 80)
                .build(),
        ],
        vec![
            SliceBuilder::new("shop/web")
                .port("http", 8080)
                .port_proto("metrics", Protocol::Udp, 9125)
                .ready("10.0.1.4", NODE)
                .ready("10.0.2.5", "node-b")
                .endpoint("10.0.1.9", NODE, false, false, true)
                .build(),
            SliceBuilder::new("shop/itp")
                .port("", 80)
                .ready("10.0.2.6", "node-b")
                .build(),
            SliceBuilder::new("shop/plain")
                .port("", 8080)
                .ready("10.0.1.7", NODE)
                .ready("10.0.2.7", "node-b")
                .build(),
        ],
    )
}

#[test]
fn every_feature_payload() {
    let cfg = RenderConfig {
        local: Some(LocalMatch::Interface("veth+".to_string())),
        nodeport_ips: Some(vec![
            "127.0.0.1".parse().unwrap(),
            "192.168.56.10".parse().unwrap(),
        ]),
        service_cidrs: vec![
            "10.96.0.0/12".parse().unwrap(),
            "172.30.0.0/16".parse().unwrap(),
        ],
        ..RenderConfig::default()
    };
    let payload = fresh(IpFamily::V4, &every_feature(), &cfg);
    insta::assert_snapshot!("every_feature", payload);
    // Upstream's drop of unallocated ClusterIPs, after the reject of unused ports.
    assert!(payload.contains(
        "	chain cluster-ips-check {
		ip daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\"
		ip daddr { 10.96.0.0/12, 172.30.0.0/16 } drop comment \"Drop traffic to unallocated ClusterIPs\"
	}
"
    ));
    // Loopback is never a NodePort address in nftables mode.
    assert!(payload.contains("add element ip kube-proxy nodeport-ips {\n\t192.168.56.10\n}\n"));
    assert!(payload.contains("iifname \"veth*\" goto service-"));
    // The terminating, not serving endpoint is not used.
    assert!(!payload.contains("10.0.1.9"));
}

#[test]
fn ipv6_payload_with_masquerade_all() {
    let s = snap(
        IpFamily::V6,
        vec![
            ServiceBuilder::new("dns", "fd00:96::a")
                .udp("dns", 53)
                .node_port(30053)
                .build(),
        ],
        vec![
            SliceBuilder::new("dns")
                .ipv6()
                .port_proto("dns", Protocol::Udp, 5353)
                .ready("fd00:10:1::4", NODE)
                .ready("fd00:10:2::5", "node-b")
                .build(),
        ],
    );
    let cfg = RenderConfig {
        masquerade_all: true,
        service_cidrs: vec!["fd00:96::/112".parse().unwrap()],
        ..RenderConfig::default()
    };
    let payload = fresh(IpFamily::V6, &s, &cfg);
    insta::assert_snapshot!("ipv6", payload);
    assert!(payload.contains(
        "ip6 daddr { fd00:96::/112 } drop comment \"Drop traffic to unallocated ClusterIPs\""
    ));
    assert!(payload.contains(
        "meta l4proto udp dnat ip6 addr . port to numgen random mod 2 map { 0 : fd00:10:1::4 . 5353 , 1 : fd00:10:2::5 . 5353 }"
    ));
    assert!(payload.contains(
        "fib daddr type local ip6 daddr != ::1 meta l4proto . th dport vmap @service-nodeports"
    ));
}

/// Upstream v1.36's endpoint selection: one `numgen random mod N` lookup per new connection,
/// whatever N (not a cascade of N rules): a DNAT through an anonymous map without affinity,
/// a verdict map of `goto endpoint-…` after the affinity rules with it.
#[test]
fn selection_is_one_numgen_lookup() {
    let mut slice = SliceBuilder::new("big").port("", 80);
    for i in 1..=5 {
        slice = slice.ready(&format!("10.0.3.{i}"), "node-b");
    }
    let slice = slice.build();
    let s = snap(
        IpFamily::V4,
        vec![
            ServiceBuilder::new("big", "10.96.0.20").tcp("", 80).build(),
            ServiceBuilder::new("sticky", "10.96.0.21")
                .tcp("", 80)
                .affinity(60)
                .build(),
        ],
        vec![
            slice.clone(),
            EndpointSlice {
                name: NamespacedName::new("default", "sticky-abcde"),
                service: NamespacedName::new("default", "sticky"),
                ..slice
            },
        ],
    );
    let r = render(&s, &RenderConfig::default(), None);
    let objs = &r.services[&NamespacedName::new("default", "big")];
    assert_eq!(objs.chains.len(), 1);
    assert_eq!(
        objs.chains[0].rules,
        [
            "meta l4proto tcp dnat ip addr . port to numgen random mod 5 map { 0 : 10.0.3.1 . 80 , 1 : 10.0.3.2 . 80 , 2 : 10.0.3.3 . 80 , 3 : 10.0.3.4 . 80 , 4 : 10.0.3.5 . 80 }"
        ]
    );
    let sticky = &r.services[&NamespacedName::new("default", "sticky")];
    let service = &sticky.chains[0];
    assert!(service.name.starts_with("service-"), "{}", service.name);
    assert_eq!(service.rules.len(), 6, "{:?}", service.rules);
    let endpoint_chains: Vec<&str> = sticky.chains[1..].iter().map(|c| c.name.as_str()).collect();
    for (i, (rule, chain)) in service.rules.iter().zip(&endpoint_chains).enumerate() {
        assert!(
            rule.starts_with("ip saddr @affinity-") && rule.ends_with(&format!("goto {chain}")),
            "{i}: {rule}"
        );
    }
    let vmap = format!(
        "numgen random mod 5 vmap {{ {} }}",
        endpoint_chains
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{i} : goto {c}"))
            .collect::<Vec<_>>()
            .join(" , ")
    );
    assert_eq!(service.rules[5], vmap);
    // Endpoint chains: affinity update, then the DNAT; no hairpin rule (the
    // hairpin-connections set does that).
    assert_eq!(
        sticky.chains[1].rules[1],
        "meta l4proto tcp dnat to 10.0.3.1:80"
    );
    assert_eq!(sticky.chains[1].rules.len(), 2);
}

/// Upstream v1.36 puts every endpoint in use into `hairpin-connections`: one whose
/// EndpointSlice entry has no `nodeName` (not local, yet possibly on this node) too.
#[test]
fn the_hairpin_set_holds_every_endpoint_in_use() {
    let s = snap(
        IpFamily::V4,
        vec![ServiceBuilder::new("hp", "10.96.0.30").tcp("", 80).build()],
        vec![
            SliceBuilder::new("hp")
                .port("", 8080)
                .ready_without_node("10.0.1.6")
                .ready("10.0.2.5", "node-b")
                .endpoint("10.0.1.9", NODE, false, false, true)
                .build(),
        ],
    );
    let r = render(&s, &RenderConfig::default(), None);
    let hairpin: Vec<String> = r.services[&NamespacedName::new("default", "hp")]
        .hairpin
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        hairpin,
        [
            "10.0.1.6 . 10.0.1.6 . tcp . 8080",
            "10.0.2.5 . 10.0.2.5 . tcp . 8080"
        ]
    );
}

#[test]
fn partial_render_covers_only_the_named_services() {
    let s = every_feature();
    let only: BTreeSet<NamespacedName> = [NamespacedName::new("shop", "itp")].into();
    let r = render(&s, &RenderConfig::default(), Some(&only));
    assert_eq!(r.services.len(), 1);
    let full = render(&s, &RenderConfig::default(), None);
    assert_eq!(
        r.services[&NamespacedName::new("shop", "itp")],
        full.services[&NamespacedName::new("shop", "itp")]
    );
    assert_eq!(r.service_ports, 5);
    // ITP Local without local endpoints: the ClusterIP is dropped, not rejected.
    let itp = &r.services[&NamespacedName::new("shop", "itp")];
    assert!(itp.chains.is_empty());
    assert!(
        itp.elements
            .iter()
            .any(|e| e.container == Container::NoEndpointServices
                && e.value == Verdict::Drop
                && e.key == "10.96.0.12 . tcp . 80")
    );
}

/// Records what a full sync writes: every write's bytes, how many writes, and optionally an
/// error once `fail_after` bytes were taken (a reader that went away).
#[derive(Default)]
struct Pieces {
    bytes: Vec<u8>,
    writes: usize,
    fail_after: Option<usize>,
}

impl std::io::Write for Pieces {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.fail_after.is_some_and(|n| self.bytes.len() >= n) {
            return Err(std::io::ErrorKind::BrokenPipe.into());
        }
        self.writes += 1;
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `every_feature()` plus 1,200 plain Services (more elements than one `add element` command
/// holds), and a table holding stale and foreign objects.
fn many() -> (Snapshot, TableObjects) {
    let (mut services, mut slices) = every_feature_objects();
    for i in 0..1200u32 {
        let name = format!("ns-{}/svc-{i}", i % 7);
        let ip = std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(10, 97, 0, 1)) + i);
        let mut svc = ServiceBuilder::new(&name, &ip.to_string()).tcp("http", 80);
        if i % 10 == 0 {
            svc = svc.node_port(30100 + i as u16 / 10).udp("dns", 53);
        }
        services.push(svc.build());
        let mut slice =
            SliceBuilder::new(&name)
                .port("http", 8080)
                .port_proto("dns", Protocol::Udp, 5353);
        for j in 0..(i % 4) {
            let ep = std::net::Ipv4Addr::from(
                u32::from(std::net::Ipv4Addr::new(10, 1, 0, 1)) + i * 4 + j,
            );
            slice = slice.ready(&ep.to_string(), if j == 0 { NODE } else { "node-b" });
        }
        slices.push(slice.build());
    }
    let s = snap(IpFamily::V4, services, slices);
    let mut kernel = TableObjects {
        exists: true,
        ..TableObjects::default()
    };
    kernel
        .chains
        .insert("service-OLD-default/gone/tcp/".into(), None);
    kernel.chains.insert("foreign".into(), None);
    kernel.sets.insert(
        "affinity-OLD-default/gone/tcp/__10.0.0.1/80".into(),
        kp_netfilter::SetInfo::default(),
    );
    (s, kernel)
}

#[test]
fn a_streamed_full_sync_writes_the_bytes_of_the_one_buffer_payload() {
    use crate::nftables::reconcile::{plan_full, write_full};
    let (s, kernel) = many();
    let cfg = RenderConfig {
        local: Some(LocalMatch::Interface("veth+".to_string())),
        nodeport_ips: Some(vec!["192.168.56.10".parse().unwrap()]),
        ..RenderConfig::default()
    };
    // The one buffer: every Service rendered and held, then the payload built whole.
    let (whole, whole_state, whole_stats) =
        full_payload(IpFamily::V4, &cfg, &render(&s, &cfg, None), &kernel);
    // Streamed: one Service rendered at a time, twice, written piece by piece.
    let services = Rendering {
        snap: &s,
        cfg: &cfg,
    };
    let state = plan_full(IpFamily::V4, &cfg, &services);
    let mut out = Pieces::default();
    let stats = write_full(IpFamily::V4, &cfg, &services, &kernel, &state, &mut out).unwrap();
    assert!(whole.len() > 200_000, "{}", whole.len());
    assert_eq!(String::from_utf8(out.bytes).unwrap(), whole);
    assert!(out.writes > 10_000, "written in {} pieces", out.writes);
    assert_eq!(state, whole_state);
    assert_eq!(stats, whole_stats);
    assert_eq!(stats.bytes, whole.len());
    assert!(whole.contains("delete chain ip kube-proxy service-OLD-default/gone/tcp/\n"));
    assert!(stats.elements_added > 1000, "{stats:?}");
}

#[test]
fn a_streamed_full_sync_stops_at_the_first_write_error() {
    use crate::nftables::reconcile::{plan_full, write_full};
    let (s, kernel) = many();
    let cfg = RenderConfig::default();
    let services = Rendering {
        snap: &s,
        cfg: &cfg,
    };
    let state = plan_full(IpFamily::V4, &cfg, &services);
    let mut out = Pieces {
        fail_after: Some(4096),
        ..Pieces::default()
    };
    let e = write_full(IpFamily::V4, &cfg, &services, &kernel, &state, &mut out).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe);
    // Nothing after the error: the writer was not called again.
    let writes = out.writes;
    assert!(out.bytes.len() < 4096 + 1024, "{}", out.bytes.len());
    assert!(writes > 0);
}

#[test]
fn rendering_one_service_at_a_time_gives_the_render_of_all() {
    let (s, _) = many();
    let cfg = RenderConfig::default();
    let whole = render(&s, &cfg, None);
    let mut seen = Vec::new();
    Rendering {
        snap: &s,
        cfg: &cfg,
    }
    .each(&mut |name, objs| {
        assert_eq!(&whole.services[name], objs, "{name}");
        seen.push(name.clone());
    });
    let names: Vec<NamespacedName> = whole.services.keys().cloned().collect();
    assert_eq!(seen, names);
    // Services with two ports are one visit with both ports' objects.
    assert!(
        whole.services[&NamespacedName::new("ns-3", "svc-10")]
            .chains
            .iter()
            .any(|c| c.name.contains("/udp/dns"))
    );
}

/// Before any ServiceCIDR is known, `cluster-ips-check` only rejects unused ports of active
/// ClusterIPs (upstream adds the drop rule only once it has Service CIDRs).
#[test]
fn without_service_cidrs_cluster_ips_check_only_rejects() {
    let rules = cluster_ips_check(IpFamily::V4, &RenderConfig::default());
    assert_eq!(
        rules,
        ["ip daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\""]
    );
    let payload = fresh(IpFamily::V4, &seed(), &cluster_cidr());
    assert!(
        !payload.contains("drop comment \"Drop traffic"),
        "{payload}"
    );
}
