//! Render tests: the desired IPVS state for the seed-like cluster and for each Service
//! feature, checked against upstream's IPVS behaviour.

use std::fmt::Write as _;

use kp_model::{IpFamily, Protocol};
use kp_testkit::builders::{ServiceBuilder, SliceBuilder, ip, snapshot};

use super::*;

fn cfg() -> RenderConfig {
    RenderConfig {
        nodeport_ips: vec![ip("192.168.56.10")],
        node_ip: Some(ip("192.168.56.10")),
        ..RenderConfig::default()
    }
}

/// A readable dump of everything rendered (virtual servers like `ipvsadm -Sn`, addresses,
/// non-empty sets, rules), for golden comparison.
fn dump(r: &Rendered) -> String {
    let mut out = String::new();
    for (k, vs) in &r.virtual_servers {
        let _ = write!(out, "VS {k} {:?}", vs.kind);
        if let Some(t) = vs.persistent_timeout {
            let _ = write!(out, " persistent {t}");
        }
        let _ = writeln!(out, " ({})", vs.service);
        for rs in &vs.real_servers {
            let _ = writeln!(out, "  -> {rs}");
        }
    }
    for a in &r.bind_addrs {
        let _ = writeln!(out, "kube-ipvs0 {a}");
    }
    for (set, entries) in &r.sets {
        for e in entries {
            let _ = writeln!(out, "set {} {e}", set.base_name());
        }
    }
    out.push_str("*filter\n");
    out.push_str(&r.filter_rules);
    out.push_str("*nat\n");
    out.push_str(&r.nat_rules);
    out
}

#[test]
fn seed_cluster() {
    let svc = ServiceBuilder::new("default/nginx-svc", "10.96.138.71")
        .tcp("", 8080)
        .build();
    let slice = SliceBuilder::new("default/nginx-svc")
        .port("", 80)
        .ready("10.0.0.4", "k8s-master")
        .ready("10.0.1.2", "k8s-worker")
        .build();
    let snap = snapshot(IpFamily::V4, "k8s-master", vec![svc], vec![slice]);
    let r = render(
        &snap,
        &RenderConfig {
            local: Some(LocalMatch::Source("10.0.0.0/16".parse().unwrap())),
            ..cfg()
        },
    );
    insta::assert_snapshot!(dump(&r));
}

#[test]
fn every_feature() {
    let web = ServiceBuilder::new("ns/web", "10.96.0.10")
        .tcp("http", 80)
        .node_port(30080)
        .external_ips(&["203.0.113.7"])
        .load_balancer(&["198.51.100.5"])
        .source_ranges(&["192.168.56.0/24"])
        .affinity(600)
        .build();
    let local = ServiceBuilder::new("ns/local", "10.96.0.11")
        .udp("dns", 53)
        .node_port(30053)
        .load_balancer(&["198.51.100.6"])
        .source_ranges(&["10.9.0.0/16"])
        .external_local(Some(31000))
        .build();
    let sctp = ServiceBuilder::new("ns/sctp", "10.96.0.12")
        .port("s", Protocol::Sctp, 9999)
        .node_port(30099)
        .build();
    let internal = ServiceBuilder::new("ns/internal", "10.96.0.13")
        .tcp("", 81)
        .internal_local()
        .build();
    let slices = vec![
        SliceBuilder::new("ns/web")
            .port("http", 8080)
            .ready("10.0.0.4", "node-a")
            .ready("10.0.1.2", "node-b")
            .build(),
        SliceBuilder::new("ns/local")
            .port_proto("dns", Protocol::Udp, 5353)
            .ready("10.0.1.3", "node-b")
            .build(),
        SliceBuilder::new("ns/sctp")
            .port_proto("s", Protocol::Sctp, 9999)
            .ready("10.0.0.5", "node-a")
            .build(),
        SliceBuilder::new("ns/internal")
            .port("", 81)
            .ready("10.0.1.9", "node-b")
            .build(),
    ];
    let snap = snapshot(
        IpFamily::V4,
        "node-a",
        vec![web, local, sctp, internal],
        slices,
    );
    let r = render(&snap, &cfg());
    insta::assert_snapshot!(dump(&r));
    // Upstream's IPVS fallback: Local policy with no local endpoint uses the cluster's.
    let lb = &r.virtual_servers[&VsKey {
        addr: ip("198.51.100.6"),
        protocol: Protocol::Udp,
        port: 53,
    }];
    assert_eq!(lb.real_servers, vec!["10.0.1.3:5353".parse().unwrap()]);
    // internalTrafficPolicy Local, no local endpoint: no real servers.
    let int = &r.virtual_servers[&VsKey {
        addr: ip("10.96.0.13"),
        protocol: Protocol::Tcp,
        port: 81,
    }];
    assert!(int.real_servers.is_empty());
    assert!(
        r.no_local_internal
            .iter()
            .any(|n| n.to_string() == "ns/internal")
    );
    assert!(
        r.no_local_external
            .iter()
            .any(|n| n.to_string() == "ns/local")
    );
}

#[test]
fn addresses_on_other_interfaces_are_not_bound() {
    let svc = ServiceBuilder::new("ns/web", "10.96.0.10")
        .tcp("", 80)
        .external_ips(&["192.168.56.10", "203.0.113.7"])
        .build();
    let snap = snapshot(IpFamily::V4, "n", vec![svc], vec![]);
    let r = render(
        &snap,
        &RenderConfig {
            other_addresses: [ip("192.168.56.10")].into_iter().collect(),
            ..cfg()
        },
    );
    let bound: Vec<String> = r.bind_addrs.iter().map(|a| a.to_string()).collect();
    assert_eq!(bound, ["10.96.0.10", "203.0.113.7"]);
    assert_eq!(r.virtual_servers.len(), 3);
    assert_eq!(r.sets[&KubeSet::IpvsIps].len(), 2);
}

#[test]
fn ipv6_uses_kube_6_sets_and_host_prefixes() {
    let svc = ServiceBuilder::new("ns/web", "fd00::10")
        .tcp("", 80)
        .node_port(30080)
        .load_balancer(&["2001:db8::5"])
        .source_ranges(&["2001:db8:1::/48"])
        .build();
    let slice = SliceBuilder::new("ns/web")
        .ipv6()
        .port("", 8080)
        .ready("fd01::4", "n")
        .build();
    let snap = snapshot(IpFamily::V6, "n", vec![svc], vec![slice]);
    let r = render(
        &snap,
        &RenderConfig {
            nodeport_ips: vec![ip("2001:db8::1")],
            node_ip: Some(ip("2001:db8::1")),
            ..RenderConfig::default()
        },
    );
    insta::assert_snapshot!(dump(&r));
}

#[test]
fn masquerade_choices_for_cluster_ips() {
    let svc = ServiceBuilder::new("ns/web", "10.96.0.10")
        .tcp("", 80)
        .build();
    let snap = snapshot(IpFamily::V4, "n", vec![svc], vec![]);
    let line = |c: RenderConfig| {
        render(&snap, &c)
            .nat_rules
            .lines()
            .find(|l| l.contains("KUBE-CLUSTER-IP") && l.ends_with("KUBE-MARK-MASQ"))
            .unwrap()
            .to_string()
    };
    assert!(
        line(cfg()).contains("src,dst"),
        "no detector: VIP-sourced node traffic"
    );
    assert!(
        line(RenderConfig {
            masquerade_all: true,
            ..cfg()
        })
        .contains("KUBE-CLUSTER-IP dst,dst -j")
    );
    let l = line(RenderConfig {
        local: Some(LocalMatch::Interface("cbr0".into())),
        ..cfg()
    });
    assert!(
        l.starts_with("-A KUBE-SERVICES ! -i cbr0 -m comment"),
        "{l}"
    );
}

#[test]
fn conflicting_virtual_servers_keep_the_first() {
    let a = ServiceBuilder::new("ns/a", "10.96.0.10")
        .tcp("", 80)
        .external_ips(&["10.96.0.11"])
        .build();
    let b = ServiceBuilder::new("ns/b", "10.96.0.11")
        .tcp("", 80)
        .build();
    let snap = snapshot(IpFamily::V4, "n", vec![a, b], vec![]);
    let r = render(&snap, &cfg());
    assert_eq!(r.virtual_servers.len(), 2);
    assert_eq!(r.conflicts.len(), 1);
}
