//! Render tests: golden rulesets (insta) and targeted assertions.

use std::collections::BTreeSet;

use kp_model::{IpFamily, NamespacedName, Service, Snapshot};
use kp_testkit::builders::{ServiceBuilder, SliceBuilder, ip, snapshot as build};

use super::*;
use crate::local::LocalMatch;

fn service(name: &str, cip: &str, port: u16, node_port: Option<u16>) -> Service {
    let b = ServiceBuilder::new(name, cip).tcp("", port);
    match node_port {
        Some(np) => b.node_port(np).build(),
        None => b.build(),
    }
}

fn slice(svc: &str, port: u16, eps: &[(&str, &str)]) -> kp_model::EndpointSlice {
    let mut b = SliceBuilder::new(svc).port("", port);
    if eps.first().is_some_and(|(a, _)| a.contains(':')) {
        b = b.ipv6();
    }
    for (a, n) in eps {
        b = b.ready(a, n);
    }
    b.build()
}

fn snapshot(
    family: IpFamily,
    services: Vec<Service>,
    slices: Vec<kp_model::EndpointSlice>,
) -> Snapshot {
    build(family, "k8s-master", services, slices)
}

fn seed() -> Snapshot {
    snapshot(
        IpFamily::V4,
        vec![service("nginx-svc", "10.96.138.71", 8080, None)],
        vec![slice(
            "nginx-svc",
            80,
            &[("10.0.0.4", "k8s-master"), ("10.0.1.2", "k8s-worker")],
        )],
    )
}

fn cluster_cidr() -> RenderConfig {
    RenderConfig {
        local: Some(LocalMatch::Source("10.0.0.0/16".parse().unwrap())),
        ..RenderConfig::default()
    }
}

fn text(r: &Rendered) -> String {
    let mut s = String::from("*filter\n");
    for c in r.filter.chains.iter() {
        s.push_str(&format!(":{c} - [0:0]\n"));
    }
    s.push_str(&r.filter.rules);
    s.push_str("COMMIT\n*nat\n");
    for c in r.nat.chains.iter() {
        s.push_str(&format!(":{c} - [0:0]\n"));
    }
    s.push_str(&r.nat.rules);
    s.push_str("COMMIT\n");
    s
}

#[test]
fn seed_ruleset() {
    let r = render(&seed(), &cluster_cidr(), None);
    insta::assert_snapshot!("seed", text(&r));
    // The lines of the seed (printed by upstream kube-proxy) that live in the chains we
    // render; iptables-save prints probabilities with 11 decimals, we write 10.
    for line in [
        "-A KUBE-SERVICES -d 10.96.138.71/32 -p tcp -m comment --comment \"default/nginx-svc cluster IP\" -m tcp --dport 8080 -j KUBE-SVC-HL5LMXD5JFHQZ6LN",
        "-A KUBE-SVC-HL5LMXD5JFHQZ6LN ! -s 10.0.0.0/16 -d 10.96.138.71/32 -p tcp -m comment --comment \"default/nginx-svc cluster IP\" -m tcp --dport 8080 -j KUBE-MARK-MASQ",
        "-A KUBE-SVC-HL5LMXD5JFHQZ6LN -m comment --comment \"default/nginx-svc -> 10.0.0.4:80\" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-GS5MQAG4332XHLUZ",
        "-A KUBE-SVC-HL5LMXD5JFHQZ6LN -m comment --comment \"default/nginx-svc -> 10.0.1.2:80\" -j KUBE-SEP-H5CTQI4CMO4ES5BQ",
        "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000",
        "-A KUBE-SEP-GS5MQAG4332XHLUZ -s 10.0.0.4/32 -m comment --comment \"default/nginx-svc\" -j KUBE-MARK-MASQ",
        "-A KUBE-SEP-GS5MQAG4332XHLUZ -p tcp -m comment --comment \"default/nginx-svc\" -m tcp -j DNAT --to-destination 10.0.0.4:80",
        "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
        "-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0",
        "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully",
        "-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment \"block incoming localnet connections\" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP",
        "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP",
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark 0x4000/0x4000 -j ACCEPT",
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
    ] {
        assert!(text(&r).lines().any(|l| l == line), "missing: {line}");
    }
    assert_eq!(r.service_ports, 1);
    assert_eq!(r.endpoints, 2);
    assert!(!r.large_cluster);
}

#[test]
fn probabilities() {
    assert_eq!(probability(2, 0), "0.5000000000");
    assert_eq!(probability(3, 0), "0.3333333333");
    assert_eq!(probability(3, 1), "0.5000000000");
    assert_eq!(probability(7, 0), "0.1428571429");
}

#[test]
fn no_endpoints_rejects() {
    let snap = snapshot(
        IpFamily::V4,
        vec![service("empty", "10.96.0.10", 80, Some(30080))],
        vec![],
    );
    let r = render(&snap, &cluster_cidr(), None);
    let t = text(&r);
    insta::assert_snapshot!("no_endpoints", t);
    assert!(t.contains("-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment \"default/empty has no endpoints\" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable"));
    assert!(t.contains("-A KUBE-EXTERNAL-SERVICES -p tcp -m comment --comment \"default/empty has no endpoints\" -m addrtype --dst-type LOCAL -m tcp --dport 30080 -j REJECT --reject-with icmp-port-unreachable"));
    assert!(
        !t.contains("KUBE-SVC-"),
        "no nat chains for a Service without endpoints"
    );
}

#[test]
fn nodeport_cluster_policy() {
    let snap = snapshot(
        IpFamily::V4,
        vec![service("web", "10.96.0.20", 80, Some(30080))],
        vec![slice("web", 8080, &[("10.0.0.4", "k8s-master")])],
    );
    let t = text(&render(&snap, &cluster_cidr(), None));
    insta::assert_snapshot!("nodeport", t);
    let ext = ServiceChains::new(&snap.services.keys().next().unwrap().clone()).ext;
    assert!(t.contains(&format!("-A KUBE-NODEPORTS -p tcp -m comment --comment \"default/web\" -m tcp --dport 30080 -j {ext}")));
    assert!(t.contains(&format!("-A {ext} -m comment --comment \"masquerade traffic for default/web external destinations\" -j KUBE-MARK-MASQ")));
    assert!(t.contains("-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"));
    let last_services_rule = t
        .lines()
        .rfind(|l| l.starts_with("-A KUBE-SERVICES "))
        .unwrap();
    assert!(last_services_rule.ends_with("-j KUBE-NODEPORTS"));
}

#[test]
fn masquerade_all_and_mark_bit() {
    let cfg = RenderConfig {
        masquerade_all: true,
        masquerade_mark: 1 << 5,
        local: None,
        ..RenderConfig::default()
    };
    let t = text(&render(&seed(), &cfg, None));
    assert!(t.contains("-A KUBE-SVC-HL5LMXD5JFHQZ6LN -d 10.96.138.71/32 -p tcp -m comment --comment \"default/nginx-svc cluster IP\" -m tcp --dport 8080 -j KUBE-MARK-MASQ"));
    assert!(t.contains("-A KUBE-MARK-MASQ -j MARK --set-xmark 0x20/0x20"));
    assert!(t.contains("-A KUBE-POSTROUTING -m mark ! --mark 0x20/0x20 -j RETURN"));
    // Without a local detector and without masquerade-all there is no masquerade rule.
    let t = text(&render(
        &seed(),
        &RenderConfig {
            local: None,
            ..RenderConfig::default()
        },
        None,
    ));
    assert!(!t.contains("-A KUBE-SVC-HL5LMXD5JFHQZ6LN -d"));
    assert!(!t.contains("! -s 10."));
}

#[test]
fn random_fully_and_localhost_nodeports_off() {
    let cfg = RenderConfig {
        random_fully: false,
        localhost_nodeports: false,
        ..cluster_cidr()
    };
    let t = text(&render(&seed(), &cfg, None));
    assert!(t.contains("-j MASQUERADE\n"));
    assert!(t.contains("-A KUBE-SERVICES ! -d 127.0.0.0/8 -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"));
    // Upstream writes KUBE-FIREWALL (declares and fills it) only with localhost NodePorts;
    // otherwise reconcile ensures the chain and its jumps without flushing it.
    assert!(!t.contains("KUBE-FIREWALL"), "{t}");
}

#[test]
fn nodeport_addresses() {
    let cfg = RenderConfig {
        nodeport_ips: Some(vec![ip("127.0.0.1"), ip("192.168.56.10")]),
        localhost_nodeports: false,
        ..cluster_cidr()
    };
    let t = text(&render(&seed(), &cfg, None));
    assert!(t.contains("-A KUBE-SERVICES -d 192.168.56.10/32 -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -j KUBE-NODEPORTS"));
    assert!(
        !t.contains("-d 127.0.0.1/32"),
        "loopback skipped without localhost NodePorts"
    );
    assert!(!t.contains("addrtype --dst-type LOCAL -j KUBE-NODEPORTS"));
}

#[test]
fn partial_render_skips_unchanged_service_chains() {
    let snap = snapshot(
        IpFamily::V4,
        vec![
            service("a", "10.96.0.1", 80, None),
            service("b", "10.96.0.2", 80, None),
        ],
        vec![
            slice("a", 80, &[("10.0.0.1", "x")]),
            slice("b", 80, &[("10.0.0.2", "x")]),
        ],
    );
    let full = render(&snap, &cluster_cidr(), None);
    let only = BTreeSet::from([NamespacedName::new("default", "b")]);
    let partial = render(&snap, &cluster_cidr(), Some(&only));
    assert_eq!(full.active_nat_chains, partial.active_nat_chains);
    assert_eq!(full.nat_rules_total, partial.nat_rules_total);
    assert_eq!(full.filter, partial.filter);
    let a_svc = ServiceChains::new(snap.services.keys().next().unwrap()).svc;
    assert!(full.nat.chains.contains(&a_svc));
    assert!(!partial.nat.chains.contains(&a_svc));
    assert!(
        partial.nat.rules.contains(&format!("-j {a_svc}")),
        "KUBE-SERVICES still jumps to it"
    );
}

#[test]
fn large_cluster_mode_drops_endpoint_comments() {
    let mut services = Vec::new();
    let mut slices = Vec::new();
    for i in 0..101u32 {
        let name = format!("s{i}");
        services.push(service(
            &name,
            &format!("10.96.{}.{}", i / 250, i % 250 + 1),
            80,
            None,
        ));
        let eps: Vec<(String, &str)> = (0..10u32)
            .map(|j| (format!("10.1.{i}.{}", j + 1), "n"))
            .collect();
        let eps: Vec<(&str, &str)> = eps.iter().map(|(a, n)| (a.as_str(), *n)).collect();
        slices.push(slice(&name, 80, &eps));
    }
    let r = render(
        &snapshot(IpFamily::V4, services, slices),
        &cluster_cidr(),
        None,
    );
    assert!(r.large_cluster);
    assert!(!r.nat.rules.contains(" -> "));
    assert!(
        r.nat.rules.contains("cluster IP"),
        "service-level comments stay"
    );
    // Upstream's rule-count fixture for ClusterIP services: NAT = 5 + S * (2 + 3E).
    assert_eq!(r.nat_rules_total, 5 + 101 * (2 + 3 * 10));
}

#[test]
fn terminating_fallback_and_affinity() {
    let svc = ServiceBuilder::new("sticky", "10.96.0.30")
        .tcp("", 80)
        .affinity(10800)
        .build();
    let sl = SliceBuilder::new("sticky")
        .port("", 8080)
        .ready("10.0.0.1", "k8s-master")
        .endpoint("10.0.0.2", "k8s-worker", false, true, true)
        .build();
    let t = text(&render(
        &snapshot(IpFamily::V4, vec![svc], vec![sl]),
        &cluster_cidr(),
        None,
    ));
    insta::assert_snapshot!("affinity", t);
    assert!(
        !t.contains("10.0.0.2:8080"),
        "a terminating endpoint is not used while a ready one exists"
    );
    assert!(t.contains("-m recent --rcheck --seconds 10800 --reap --name KUBE-SEP-"));
    assert!(t.contains("-m recent --set --name KUBE-SEP-"));
}

#[test]
fn ipv6_family() {
    let snap = snapshot(
        IpFamily::V6,
        vec![service("six", "fd00:96::10", 80, Some(30090))],
        vec![slice("six", 8080, &[("fd00:1::4", "k8s-master")])],
    );
    let cfg = RenderConfig {
        local: Some(LocalMatch::Source("fd00:1::/48".parse().unwrap())),
        kube_firewall: false,
        localhost_nodeports: false,
        ..RenderConfig::default()
    };
    let t = text(&render(&snap, &cfg, None));
    insta::assert_snapshot!("ipv6", t);
    assert!(t.contains("-d fd00:96::10/128 -p tcp"));
    assert!(t.contains("DNAT --to-destination [fd00:1::4]:8080"));
    assert!(t.contains("! -d ::1/128"));
    assert!(!t.contains("KUBE-FIREWALL"));
}

/// A partial render with the cache the previous renders filled (the proxier's path) writes
/// exactly what a cache-less partial render writes, and knows the same chains and counts,
/// across adds, endpoint changes and deletes; the fast large-cluster lines equal the
/// general ones.
#[test]
fn cached_partial_renders_equal_uncached_ones() {
    let mk = |n: u32, eps_per: u32, shift: u32| {
        let mut services = Vec::new();
        let mut slices = Vec::new();
        for i in 0..n {
            let name = format!("s{i}");
            services.push(service(
                &name,
                &format!("10.96.{}.{}", i / 250, i % 250 + 1),
                80,
                (i % 7 == 0).then_some(30000 + i as u16),
            ));
            let eps: Vec<(String, &str)> = (0..eps_per)
                .map(|j| {
                    (
                        format!("10.1.{}.{}", i + shift * (i % 3), j + 1),
                        "k8s-master",
                    )
                })
                .collect();
            let eps: Vec<(&str, &str)> = eps.iter().map(|(a, n)| (a.as_str(), *n)).collect();
            slices.push(slice(&name, 8080, &eps));
        }
        snapshot(IpFamily::V4, services, slices)
    };
    for (n, eps_per) in [(20u32, 3u32), (120, 10)] {
        let mut cache = RenderCache::new();
        let first = mk(n, eps_per, 0);
        let cached = render_cached(&first, &cluster_cidr(), None, &mut cache);
        assert_eq!(cached, render(&first, &cluster_cidr(), None));
        // Endpoint changes in a third of the Services, one Service gone, one added.
        let mut next = mk(n, eps_per, 1);
        let gone = NamespacedName::new("default", "s5");
        next.services.retain(|k, _| k.service != gone);
        next.endpoints.retain(|k, _| k.service != gone);
        let extra = mk(n + 1, eps_per, 1);
        for (k, v) in &extra.services {
            if k.service.name == format!("s{n}") {
                next.services.insert(k.clone(), v.clone());
                if let Some(e) = extra.endpoints.get(k) {
                    next.endpoints.insert(k.clone(), e.clone());
                }
            }
        }
        let mut changed: BTreeSet<NamespacedName> = (0..n)
            .filter(|i| i % 3 != 0)
            .map(|i| NamespacedName::new("default", format!("s{i}")))
            .collect();
        changed.insert(gone);
        changed.insert(NamespacedName::new("default", format!("s{n}")));
        let with_cache = render_cached(&next, &cluster_cidr(), Some(&changed), &mut cache);
        let without = render(&next, &cluster_cidr(), Some(&changed));
        assert_eq!(with_cache, without, "{n} Services");
        // And a full render after that still equals a cold one.
        let full = render_cached(&next, &cluster_cidr(), None, &mut cache);
        assert_eq!(full, render(&next, &cluster_cidr(), None));
        assert_eq!(cache.len(), next.services.len());
    }
}

/// The large-cluster fast path writes the same lines as upstream (spot check of one
/// Service's chains at 101 × 10).
#[test]
fn large_cluster_lines() {
    let mut services = Vec::new();
    let mut slices = Vec::new();
    for i in 0..101u32 {
        let name = format!("s{i}");
        services.push(service(&name, &format!("10.96.0.{}", i + 1), 80, None));
        let eps: Vec<(String, &str)> = (0..10u32)
            .map(|j| (format!("10.1.{i}.{}", j + 1), "n"))
            .collect();
        let eps: Vec<(&str, &str)> = eps.iter().map(|(a, n)| (a.as_str(), *n)).collect();
        slices.push(slice(&name, 8080, &eps));
    }
    let snap = snapshot(IpFamily::V4, services, slices);
    let r = render(&snap, &cluster_cidr(), None);
    let spn = snap.services.keys().next().unwrap();
    let svc = ServiceChains::new(spn).svc;
    let ep = &snap.endpoints_of(spn)[0];
    let sep = crate::iptables::names::endpoint_chain(spn, ep);
    assert!(r.nat.rules.contains(&format!(
        "-A {svc} -m statistic --mode random --probability 0.1000000000 -j {sep}\n"
    )));
    assert!(r.nat.rules.contains(&format!(
        "-A {sep} -s {}/32 -j KUBE-MARK-MASQ\n-A {sep} -p tcp -m tcp -j DNAT --to-destination {ep}\n",
        ep.ip
    )));
}

fn with_nfacct(cfg: RenderConfig) -> RenderConfig {
    RenderConfig {
        nfacct_invalid_drop: true,
        nfacct_localhost_nodeports: true,
        ..cfg
    }
}

/// `iptables-save` of a real node run by upstream kube-proxy (nf_tables backend) for
/// `default/nginx` (port 80, nodePort 30606), with `xt_nfacct`'s doubled space after
/// `--nfacct-name` reduced to one, as `iptables-restore` reads both.
const UPSTREAM_NFACCT_NODEPORTS: [&str; 2] = [
    "-A KUBE-NODEPORTS -d 127.0.0.0/8 -p tcp -m comment --comment \"default/nginx\" -m tcp --dport 30606 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j KUBE-EXT-2CMXP7HKUVJN7L6M",
    "-A KUBE-NODEPORTS -p tcp -m comment --comment \"default/nginx\" -m tcp --dport 30606 -j KUBE-EXT-2CMXP7HKUVJN7L6M",
];
/// The INVALID drop of a node with nfacct, as upstream writes it (its proxier tests' and
/// real nodes' `KUBE-FORWARD`).
const UPSTREAM_NFACCT_INVALID: &str = "-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP";

fn nginx_nodeport(family: IpFamily) -> Snapshot {
    match family {
        IpFamily::V4 => snapshot(
            family,
            vec![service("nginx", "10.109.124.25", 80, Some(30606))],
            vec![slice("nginx", 80, &[("10.0.0.4", "k8s-master")])],
        ),
        IpFamily::V6 => snapshot(
            family,
            vec![service("nginx", "fd00:96::25", 80, Some(30606))],
            vec![slice("nginx", 80, &[("fd00:1::4", "k8s-master")])],
        ),
    }
}

/// With both counters: upstream's lines, the counting localhost rule just before the
/// NodePort's own rule.
#[test]
fn nfacct_counters_are_matched_as_upstream_writes_them() {
    let r = render(
        &nginx_nodeport(IpFamily::V4),
        &with_nfacct(cluster_cidr()),
        None,
    );
    let t = text(&r);
    let lines: Vec<&str> = t.lines().collect();
    let first = lines
        .iter()
        .position(|l| *l == UPSTREAM_NFACCT_NODEPORTS[0])
        .unwrap_or_else(|| panic!("no localhost nfacct rule:\n{t}"));
    assert_eq!(lines[first + 1], UPSTREAM_NFACCT_NODEPORTS[1], "{t}");
    assert!(lines.contains(&UPSTREAM_NFACCT_INVALID), "{t}");
    assert!(
        !lines.contains(&"-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP"),
        "{t}"
    );
    // The extra nat rule is counted.
    let without = render(&nginx_nodeport(IpFamily::V4), &cluster_cidr(), None);
    assert_eq!(r.nat_rules_total, without.nat_rules_total + 1);
    assert_eq!(r.filter.rule_count, without.filter.rule_count);
}

/// Without the counters (a kernel without nfacct, or before they could be created): no
/// `-m nfacct` anywhere and no localhost counting rule, as upstream on such a node.
#[test]
fn without_nfacct_the_rules_have_no_match() {
    let t = text(&render(
        &nginx_nodeport(IpFamily::V4),
        &cluster_cidr(),
        None,
    ));
    assert!(!t.contains("nfacct"), "{t}");
    assert!(!t.contains("-A KUBE-NODEPORTS -d 127.0.0.0/8"), "{t}");
    assert!(t.contains(UPSTREAM_NFACCT_NODEPORTS[1]), "{t}");
    assert!(t.contains("-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n"));
    // Each counter decides its own rule.
    let only_invalid = RenderConfig {
        nfacct_invalid_drop: true,
        ..cluster_cidr()
    };
    let t = text(&render(&nginx_nodeport(IpFamily::V4), &only_invalid, None));
    assert!(t.contains(UPSTREAM_NFACCT_INVALID));
    assert!(!t.contains("localhost_nps_accepted_pkts"), "{t}");
    let only_localhost = RenderConfig {
        nfacct_localhost_nodeports: true,
        ..cluster_cidr()
    };
    let t = text(&render(
        &nginx_nodeport(IpFamily::V4),
        &only_localhost,
        None,
    ));
    assert!(t.contains(UPSTREAM_NFACCT_NODEPORTS[0]));
    assert!(!t.contains("ct_state_invalid_dropped_pkts"), "{t}");
}

/// The localhost rule needs localhost NodePorts (IPv4, the flag, loopback in
/// `--nodeport-addresses`) and endpoints; the INVALID drop's match needs the drop
/// (`--conntrack-tcp-be-liberal` removes it) and is written in both families.
#[test]
fn nfacct_localhost_rule_follows_upstreams_conditions() {
    let no_localhost = with_nfacct(RenderConfig {
        localhost_nodeports: false,
        ..cluster_cidr()
    });
    let t = text(&render(&nginx_nodeport(IpFamily::V4), &no_localhost, None));
    assert!(!t.contains("localhost_nps_accepted_pkts"), "{t}");
    assert!(t.contains(UPSTREAM_NFACCT_INVALID));

    let six = with_nfacct(RenderConfig {
        local: Some(LocalMatch::Source("fd00:1::/48".parse().unwrap())),
        kube_firewall: false,
        // What the proxier passes for IPv6 (localhost NodePorts are IPv4 only); the
        // renderer also checks the family itself.
        localhost_nodeports: true,
        ..RenderConfig::default()
    });
    let t = text(&render(&nginx_nodeport(IpFamily::V6), &six, None));
    assert!(!t.contains("localhost_nps_accepted_pkts"), "{t}");
    assert!(t.contains(UPSTREAM_NFACCT_INVALID), "{t}");

    let empty = snapshot(
        IpFamily::V4,
        vec![service("nginx", "10.109.124.25", 80, Some(30606))],
        vec![],
    );
    let t = text(&render(&empty, &with_nfacct(cluster_cidr()), None));
    assert!(
        !t.contains("localhost_nps_accepted_pkts"),
        "no endpoints, no nat rule: {t}"
    );

    let liberal = with_nfacct(RenderConfig {
        drop_invalid: false,
        ..cluster_cidr()
    });
    let t = text(&render(&nginx_nodeport(IpFamily::V4), &liberal, None));
    assert!(!t.contains("INVALID"), "{t}");
    assert!(t.contains(UPSTREAM_NFACCT_NODEPORTS[0]));
}

/// Five Services with every kind of `KUBE-SERVICES` entry: ClusterIPs, two ports on one
/// address, an external IP, a load-balancer IP with source ranges (`KUBE-FW-`), a NodePort.
fn tree_cluster() -> Snapshot {
    snapshot(
        IpFamily::V4,
        vec![
            service("a", "10.96.0.10", 80, None),
            ServiceBuilder::new("b", "10.96.0.11")
                .tcp("http", 80)
                .tcp("https", 443)
                .build(),
            service("c", "10.96.200.1", 53, Some(30053)),
            ServiceBuilder::new("d", "10.96.0.12")
                .tcp("", 80)
                .external_ips(&["192.0.2.10"])
                .build(),
            ServiceBuilder::new("e", "10.96.0.13")
                .tcp("", 80)
                .load_balancer(&["198.51.100.7"])
                .source_ranges(&["203.0.113.0/24"])
                .build(),
        ],
        vec![
            slice("a", 8080, &[("10.0.0.1", "k8s-master")]),
            SliceBuilder::new("b")
                .port("http", 8080)
                .port("https", 8443)
                .ready("10.0.0.2", "k8s-master")
                .build(),
            slice("c", 5353, &[("10.0.0.3", "k8s-master")]),
            slice("d", 8080, &[("10.0.0.4", "k8s-master")]),
            slice("e", 8080, &[("10.0.0.5", "k8s-master")]),
        ],
    )
}

fn tree_cfg(leaf_rules: usize) -> RenderConfig {
    RenderConfig {
        dispatch: Dispatch::Tree { leaf_rules },
        ..cluster_cidr()
    }
}

#[test]
fn tree_layout_ruleset() {
    let snap = tree_cluster();
    let t = text(&render(&snap, &tree_cfg(2), None));
    insta::assert_snapshot!("tree_layout", t);
    // Everything but nat KUBE-SERVICES is upstream's, line for line.
    let up = text(&render(&snap, &cluster_cidr(), None));
    let without_dispatch = |s: &str| -> Vec<String> {
        let mut v: Vec<String> = s
            .lines()
            .filter(|l| !l.contains("KUBE-SVT-") && !l.starts_with("-A KUBE-SERVICES -d"))
            .map(str::to_string)
            .collect();
        v.sort();
        v
    };
    assert_eq!(without_dispatch(&t), without_dispatch(&up));
    // With leaves of 16 the seven entries stay in KUBE-SERVICES: upstream's ruleset (the
    // same lines in every chain, in the same order; only KUBE-NODEPORTS's lines come after
    // KUBE-SERVICES's in the payload instead of between them).
    let by_chain = |s: &str| -> Vec<String> {
        let mut v: Vec<String> = s.lines().map(str::to_string).collect();
        v.sort_by_key(|l| l.split(' ').nth(1).unwrap_or_default().to_string());
        v
    };
    assert_eq!(
        by_chain(&text(&render(&snap, &tree_cfg(16), None))),
        by_chain(&up)
    );
}

#[test]
fn tree_partial_render_writes_only_changed_dispatch_chains() {
    let snap = tree_cluster();
    let mut cache = RenderCache::new();
    let full = render_cached(&snap, &tree_cfg(1), None, &mut cache);
    // Nothing changed: no dispatch chain is written, and the totals are the same.
    let none = BTreeSet::new();
    let same = render_cached(&snap, &tree_cfg(1), Some(&none), &mut cache);
    assert!(!same.nat.rules.contains("KUBE-SVT-"));
    assert!(!same.nat.chains.contains("KUBE-SERVICES"));
    assert!(!same.nat.chains.contains("KUBE-NODEPORTS"));
    assert_eq!(same.nat_rules_total, full.nat_rules_total);
    assert_eq!(same.active_nat_chains, full.active_nat_chains);
    // Service a loses its endpoints: its leaf and nothing else.
    let mut changed = snap.clone();
    let a = changed
        .services
        .keys()
        .find(|k| k.service.name.as_ref() == "a")
        .unwrap()
        .clone();
    changed.endpoints.remove(&a);
    let only = BTreeSet::from([NamespacedName::new("default", "a")]);
    let r = render_cached(&changed, &tree_cfg(1), Some(&only), &mut cache);
    let written: Vec<&str> = r
        .nat
        .chains
        .iter()
        .filter(|c| c.starts_with("KUBE-SVT-"))
        .collect();
    // Its leaf goes, and so does the node above it, which had only b's leaf left: one chain
    // is rewritten (their parent), two are stale.
    assert_eq!(written, vec!["KUBE-SVT-0A600008-29"], "{:?}", r.nat.chains);
    for gone in ["KUBE-SVT-0A60000A-32", "KUBE-SVT-0A60000A-31"] {
        assert!(full.active_nat_chains.contains(gone) && !r.active_nat_chains.contains(gone));
    }
    let fresh = render(&changed, &tree_cfg(1), None);
    assert_eq!(r.nat_rules_total, fresh.nat_rules_total);
    assert_eq!(r.active_nat_chains, fresh.active_nat_chains);
}

#[test]
fn a_streamed_render_hands_over_each_services_chains() {
    let mut services = Vec::new();
    let mut slices = Vec::new();
    for i in 0..1200u32 {
        let name = format!("s{i}");
        let cip = format!("10.96.{}.{}", i / 200, i % 200 + 1);
        services.push(service(
            &name,
            &cip,
            80,
            (i % 4 == 0).then_some(30000 + i as u16),
        ));
        let eps: Vec<(String, &str)> = (0..3)
            .map(|j| {
                (
                    format!("10.2.{}.{}", i / 80, (i % 80) * 3 + j + 1),
                    "k8s-master",
                )
            })
            .collect();
        let eps: Vec<(&str, &str)> = eps.iter().map(|(a, n)| (a.as_str(), *n)).collect();
        slices.push(slice(&name, 8080, &eps));
    }
    let snap = snapshot(IpFamily::V4, services, slices);
    for cfg in [cluster_cidr(), tree_cfg(16)] {
        let whole = render(&snap, &cfg, None);
        let mut cache = RenderCache::new();
        let mut first_services: Vec<(String, String)> = Vec::new();
        let first = render_streamed(
            &snap,
            &cfg,
            &mut cache,
            Stream::Measure(&mut |s| first_services.push((s.chains.into(), s.rules.into()))),
        );
        let mut services = Vec::new();
        let second = render_streamed(
            &snap,
            &cfg,
            &mut cache,
            Stream::Emit(&mut |s| services.push((s.chains.to_string(), s.rules.to_string()))),
        );
        // One hand-over per Service, the same in both passes, each with its own chains only.
        assert_eq!(services.len(), snap.services.len());
        assert_eq!(services, first_services);
        for (chains, rules) in &services {
            let declared: Vec<&str> = chains
                .lines()
                .map(|l| l[1..].split(' ').next().unwrap())
                .collect();
            assert!(
                declared
                    .iter()
                    .all(|c| crate::iptables::names::is_service_chain(c)),
                "{chains}"
            );
            for line in rules.lines() {
                let chain = line[3..].split(' ').next().unwrap();
                assert!(declared.contains(&chain), "{line} outside {declared:?}");
            }
        }
        let rules: String = services.iter().map(|(_, r)| r.as_str()).collect();
        let chains: String = services.iter().map(|(c, _)| c.as_str()).collect();
        assert_eq!(format!("{}{rules}", first.nat.rules), whole.nat.rules);
        let fixed = whole.nat.chains.declarations().len() - chains.len();
        assert_eq!(
            format!("{}{chains}", &whole.nat.chains.declarations()[..fixed]),
            whole.nat.chains.declarations()
        );
        // The first pass has everything else of the whole render; the second keeps no
        // per-Service chain lists.
        let rest = |r: &Rendered| {
            (
                r.filter.clone(),
                r.nat.chains.clone(),
                r.nat.rule_count,
                r.active_nat_chains.clone(),
                r.nat_rules_total,
            )
        };
        assert_eq!(rest(&first), rest(&whole));
        // The second pass keeps no entry rule (the first has them), and no per-Service chain.
        assert!(
            second
                .nat
                .rules
                .lines()
                .all(|l| first.nat.rules.lines().any(|f| f == l))
        );
        assert!(
            !second.nat.rules.contains("-j KUBE-SVC-") && first.nat.rules.contains("-j KUBE-SVC-"),
            "{}",
            second.nat.rules
        );
        assert!(second.active_nat_chains.is_empty());
        assert!(
            second
                .nat
                .chains
                .iter()
                .all(|c| !crate::iptables::names::is_service_chain(c))
        );
    }
}
