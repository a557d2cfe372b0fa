//! Golden tests of the portal rules: every destination kind of a Service port, the node
//! address choice, `--nodeport-addresses`, and Service ports without a listener.

use kp_model::{IpFamily, Protocol};
use kp_testkit::builders::{ServiceBuilder, SliceBuilder, ip, snapshot};

use super::*;
use crate::LocalMatch;
use crate::userspace::{Scope, listeners};

fn portals(snap: &Snapshot) -> Vec<Portal> {
    listeners(snap)
        .0
        .into_iter()
        .zip(36000..)
        .map(|(listener, port)| Portal { listener, port })
        .collect()
}

fn dump(r: &Rendered) -> String {
    format!("*filter\n{}*nat\n{}", r.filter, r.nat)
}

#[test]
fn every_destination_kind() {
    let web = ServiceBuilder::new("ns/web", "10.96.0.10")
        .tcp("http", 80)
        .node_port(30080)
        .external_ips(&["203.0.113.7"])
        .load_balancer(&["198.51.100.5"])
        .source_ranges(&["192.168.56.0/24", "10.0.0.0/8"])
        .build();
    let dns = ServiceBuilder::new("kube-system/dns", "10.96.0.53")
        .udp("dns", 53)
        .build();
    let slices = vec![
        SliceBuilder::new("ns/web")
            .port("http", 8080)
            .ready("10.0.1.4", "node-a")
            .build(),
        SliceBuilder::new("kube-system/dns")
            .port_proto("dns", Protocol::Udp, 53)
            .ready("10.0.2.5", "node-b")
            .build(),
    ];
    let snap = snapshot(IpFamily::V4, "node-a", vec![web, dns], slices);
    let npa = NodePortAddresses::all();
    let node = NodeView {
        node_ip: Some(ip("192.168.56.10")),
        nodeport_addresses: &npa,
        local_addrs: &[],
        local: None,
    };
    insta::assert_snapshot!(dump(&render(&snap, &portals(&snap), &node)));
}

#[test]
fn external_policy_local_gets_its_own_listener() {
    let web = ServiceBuilder::new("ns/web", "10.96.0.10")
        .tcp("http", 80)
        .node_port(30080)
        .external_local(Some(31000))
        .build();
    let slice = SliceBuilder::new("ns/web")
        .port("http", 8080)
        .ready("10.0.1.4", "node-a")
        .ready("10.0.2.5", "node-b")
        .build();
    let snap = snapshot(IpFamily::V4, "node-a", vec![web], vec![slice]);
    let (ls, _) = listeners(&snap);
    assert_eq!(ls.len(), 2, "{ls:?}");
    assert!(ls[0].scope == Scope::Internal && ls[0].endpoints.len() == 2);
    assert!(ls[1].scope == Scope::External && *ls[1].endpoints == [ip_port("10.0.1.4:8080")]);
    let npa = NodePortAddresses::parse(&["192.168.56.0/24"]).unwrap();
    let local = [ip("127.0.0.1"), ip("192.168.56.10"), ip("10.0.1.1")];
    let node = NodeView {
        node_ip: None,
        nodeport_addresses: &npa,
        local_addrs: &local,
        local: Some(LocalMatch::Source("10.0.0.0/16".parse().unwrap())),
    };
    let r = render(&snap, &portals(&snap), &node);
    // ClusterIP to the internal listener, the NodePort (on the selected address only) to
    // the external one, except pod traffic (-s the cluster CIDR) and the node's own, which
    // go to the internal one (the kernel modes' short-circuit); no node address: REDIRECT
    // for the node's own traffic too.
    assert_eq!(
        dump(&r),
        "*filter\n\
         -A KUBE-NODEPORT-NON-LOCAL -p tcp -m comment --comment \"ns/web:http\" -m tcp --dport 36001 -j ACCEPT\n\
         *nat\n\
         -A KUBE-PORTALS-CONTAINER -d 10.96.0.10/32 -p tcp -m comment --comment \"ns/web:http\" -m tcp --dport 80 -j REDIRECT --to-ports 36000\n\
         -A KUBE-PORTALS-HOST -d 10.96.0.10/32 -p tcp -m comment --comment \"ns/web:http\" -m tcp --dport 80 -j REDIRECT --to-ports 36000\n\
         -A KUBE-NODEPORT-CONTAINER -s 10.0.0.0/16 -d 192.168.56.10/32 -p tcp -m comment --comment \"ns/web:http\" -m tcp --dport 30080 -j REDIRECT --to-ports 36000\n\
         -A KUBE-NODEPORT-CONTAINER -d 192.168.56.10/32 -p tcp -m comment --comment \"ns/web:http\" -m tcp --dport 30080 -j REDIRECT --to-ports 36001\n\
         -A KUBE-NODEPORT-HOST -d 192.168.56.10/32 -p tcp -m comment --comment \"ns/web:http\" -m tcp --dport 30080 -j REDIRECT --to-ports 36000\n"
    );
}

fn ip_port(s: &str) -> std::net::SocketAddr {
    s.parse().unwrap()
}

#[test]
fn ipv6_and_missing_listeners() {
    let web = ServiceBuilder::new("ns/web", "fd00:96::10")
        .tcp("http", 80)
        .build();
    let other = ServiceBuilder::new("ns/other", "fd00:96::11")
        .tcp("http", 80)
        .build();
    let snap = snapshot(IpFamily::V6, "node-a", vec![web, other], vec![]);
    let mut ps = portals(&snap);
    ps.retain(|p| p.listener.service.service.name == "web");
    let npa = NodePortAddresses::all();
    let node = NodeView {
        node_ip: Some(ip("fd00:56::10")),
        nodeport_addresses: &npa,
        local_addrs: &[],
        local: None,
    };
    let r = render(&snap, &ps, &node);
    assert_eq!(
        r.nat,
        "-A KUBE-PORTALS-CONTAINER -d fd00:96::10/128 -p tcp -m comment --comment \"ns/web:http\" -m tcp --dport 80 -j REDIRECT --to-ports 36001\n\
         -A KUBE-PORTALS-HOST -d fd00:96::10/128 -p tcp -m comment --comment \"ns/web:http\" -m tcp --dport 80 -j DNAT --to-destination [fd00:56::10]:36001\n",
        "a Service port without a listener gets no rules"
    );
    assert!(r.filter.is_empty());
}

#[test]
fn both_policies_local_short_circuit_pod_and_node_traffic_to_every_endpoint() {
    let web = ServiceBuilder::new("ns/web", "10.96.0.10")
        .tcp("http", 80)
        .node_port(30080)
        .external_local(Some(31000))
        .internal_local()
        .build();
    let slice = SliceBuilder::new("ns/web")
        .port("http", 8080)
        .ready("10.0.1.4", "node-a")
        .ready("10.0.2.5", "node-b")
        .build();
    let snap = snapshot(IpFamily::V4, "node-a", vec![web], vec![slice]);
    let (ls, _) = listeners(&snap);
    let scopes: Vec<(Scope, usize)> = ls.iter().map(|l| (l.scope, l.endpoints.len())).collect();
    // ClusterIP and external traffic: the local endpoint; the short-circuit: both.
    assert_eq!(scopes, [(Scope::Internal, 1), (Scope::Cluster, 2)]);
    let npa = NodePortAddresses::all();
    let node = NodeView {
        node_ip: Some(ip("192.168.56.10")),
        nodeport_addresses: &npa,
        local_addrs: &[],
        local: Some(LocalMatch::Source("10.0.0.0/16".parse().unwrap())),
    };
    let r = render(&snap, &portals(&snap), &node);
    assert!(r.nat.contains("-A KUBE-NODEPORT-CONTAINER -s 10.0.0.0/16 -p tcp -m comment --comment \"ns/web:http\" -m tcp --dport 30080 -j REDIRECT --to-ports 36001\n-A KUBE-NODEPORT-CONTAINER -p tcp -m comment --comment \"ns/web:http\" -m tcp --dport 30080 -j REDIRECT --to-ports 36000\n"), "{}", r.nat);
    assert!(r.nat.contains("-A KUBE-NODEPORT-HOST -p tcp -m comment --comment \"ns/web:http\" -m tcp --dport 30080 -j DNAT --to-destination 192.168.56.10:36001\n"), "{}", r.nat);
}
