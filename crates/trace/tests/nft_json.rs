//! The nftables tracer without a kernel: a JSON dump captured from `nft -j list ruleset`
//! (nft 1.0.6) after loading upstream kube-proxy's fixed rules and one ClusterIP Service
//! (`ns1/svc1`, 172.30.0.41:80/TCP, endpoints 10.180.0.1:80 and 10.180.0.2:80, NodePort
//! 3001) — the same rules `tests/nft.rs` loads — so the parser and the engine are checked
//! on real output even where network namespaces are not available.

use kp_trace::nft::{Family, NftVerdict, Stmt, looks_like_json, parse_nft_json, rule_text};
use kp_trace::{
    Delivery, Entry, Host, Packet, TraceOptions, Verdict, render_text, trace_nft, trace_nft_with,
};

/// `nft -j list ruleset`, one object per line.
const DUMP: &str = r#"{"nftables": [
{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}},
{"table": {"family": "ip", "name": "kube-proxy", "handle": 1}},
{"set": {"family": "ip", "name": "cluster-ips", "table": "kube-proxy", "type": "ipv4_addr", "handle": 1, "comment": "Active ClusterIPs", "elem": ["172.30.0.41"]}},
{"set": {"family": "ip", "name": "nodeport-ips", "table": "kube-proxy", "type": "ipv4_addr", "handle": 2, "comment": "IPs that accept NodePort traffic"}},
{"map": {"family": "ip", "name": "firewall-ips", "table": "kube-proxy", "type": ["ipv4_addr", "inet_proto", "inet_service"], "handle": 3, "comment": "destinations that are subject to LoadBalancerSourceRanges", "map": "verdict"}},
{"map": {"family": "ip", "name": "no-endpoint-nodeports", "table": "kube-proxy", "type": ["inet_proto", "inet_service"], "handle": 4, "comment": "vmap to drop or reject packets to service nodeports with no endpoints", "map": "verdict"}},
{"map": {"family": "ip", "name": "no-endpoint-services", "table": "kube-proxy", "type": ["ipv4_addr", "inet_proto", "inet_service"], "handle": 5, "comment": "vmap to drop or reject packets to services with no endpoints", "map": "verdict"}},
{"map": {"family": "ip", "name": "service-ips", "table": "kube-proxy", "type": ["ipv4_addr", "inet_proto", "inet_service"], "handle": 6, "comment": "ClusterIP, ExternalIP and LoadBalancer IP traffic", "map": "verdict", "elem": [[{"concat": ["172.30.0.41", "tcp", 80]}, {"goto": {"target": "service-ULMVA6XW-ns1/svc1/tcp/p80"}}]]}},
{"map": {"family": "ip", "name": "service-nodeports", "table": "kube-proxy", "type": ["inet_proto", "inet_service"], "handle": 7, "comment": "NodePort traffic", "map": "verdict", "elem": [[{"concat": ["tcp", 3001]}, {"goto": {"target": "external-ULMVA6XW-ns1/svc1/tcp/p80"}}]]}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "cluster-ips-check", "handle": 8}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "filter-prerouting-pre-dnat", "handle": 9, "type": "filter", "hook": "prerouting", "prio": -110, "policy": "accept"}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "filter-output-pre-dnat", "handle": 10, "type": "filter", "hook": "output", "prio": -110, "policy": "accept"}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "filter-forward", "handle": 11, "type": "filter", "hook": "forward", "prio": 0, "policy": "accept"}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "filter-input", "handle": 12, "type": "filter", "hook": "input", "prio": 0, "policy": "accept"}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "filter-output", "handle": 13, "type": "filter", "hook": "output", "prio": 0, "policy": "accept"}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "firewall-check", "handle": 14}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "mark-for-masquerade", "handle": 15}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "masquerading", "handle": 16}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "nat-output", "handle": 17, "type": "nat", "hook": "output", "prio": -100, "policy": "accept"}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "nat-postrouting", "handle": 18, "type": "nat", "hook": "postrouting", "prio": 100, "policy": "accept"}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "nat-prerouting", "handle": 19, "type": "nat", "hook": "prerouting", "prio": -100, "policy": "accept"}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "nodeport-endpoints-check", "handle": 20}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "reject-chain", "handle": 21}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "services", "handle": 22}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "service-endpoints-check", "handle": 23}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "service-ULMVA6XW-ns1/svc1/tcp/p80", "handle": 47}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "external-ULMVA6XW-ns1/svc1/tcp/p80", "handle": 48}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80", "handle": 49}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "endpoint-ZCZBVNAZ-ns1/svc1/tcp/p80__10.180.0.2/80", "handle": 50}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "cluster-ips-check", "handle": 24, "comment": "Reject traffic to invalid ports of ClusterIPs", "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": "@cluster-ips"}}, {"reject": {"type": "icmp", "expr": "port-unreachable"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "cluster-ips-check", "handle": 25, "comment": "Drop traffic to unallocated ClusterIPs", "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": {"prefix": {"addr": "172.30.0.0", "len": 16}}}}, {"drop": null}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "filter-prerouting-pre-dnat", "handle": 26, "expr": [{"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": "new"}}, {"jump": {"target": "firewall-check"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "filter-output-pre-dnat", "handle": 32, "expr": [{"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": "new"}}, {"jump": {"target": "firewall-check"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "filter-forward", "handle": 27, "expr": [{"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": "new"}}, {"jump": {"target": "service-endpoints-check"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "filter-forward", "handle": 28, "expr": [{"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": "new"}}, {"jump": {"target": "cluster-ips-check"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "filter-input", "handle": 29, "expr": [{"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": "new"}}, {"jump": {"target": "nodeport-endpoints-check"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "filter-input", "handle": 30, "expr": [{"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": "new"}}, {"jump": {"target": "service-endpoints-check"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "filter-output", "handle": 31, "expr": [{"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": "new"}}, {"jump": {"target": "service-endpoints-check"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "filter-output", "handle": 33, "expr": [{"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": "new"}}, {"jump": {"target": "cluster-ips-check"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "firewall-check", "handle": 34, "expr": [{"vmap": {"key": {"concat": [{"payload": {"protocol": "ip", "field": "daddr"}}, {"meta": {"key": "l4proto"}}, {"payload": {"protocol": "th", "field": "dport"}}]}, "data": "@firewall-ips"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "mark-for-masquerade", "handle": 35, "expr": [{"mangle": {"key": {"meta": {"key": "mark"}}, "value": {"|": [{"meta": {"key": "mark"}}, 16384]}}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "masquerading", "handle": 36, "expr": [{"match": {"op": "==", "left": {"&": [{"meta": {"key": "mark"}}, 16384]}, "right": 0}}, {"return": null}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "masquerading", "handle": 37, "expr": [{"mangle": {"key": {"meta": {"key": "mark"}}, "value": {"^": [{"meta": {"key": "mark"}}, 16384]}}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "masquerading", "handle": 38, "expr": [{"masquerade": {"flags": "fully-random"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "nat-output", "handle": 39, "expr": [{"jump": {"target": "services"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "nat-postrouting", "handle": 40, "expr": [{"jump": {"target": "masquerading"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "nat-prerouting", "handle": 41, "expr": [{"jump": {"target": "services"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "nodeport-endpoints-check", "handle": 42, "expr": [{"match": {"op": "==", "left": {"fib": {"result": "type", "flags": ["daddr"]}}, "right": "local"}}, {"match": {"op": "!=", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": {"prefix": {"addr": "127.0.0.0", "len": 8}}}}, {"vmap": {"key": {"concat": [{"meta": {"key": "l4proto"}}, {"payload": {"protocol": "th", "field": "dport"}}]}, "data": "@no-endpoint-nodeports"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "reject-chain", "handle": 43, "expr": [{"reject": {"type": "icmp", "expr": "port-unreachable"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "services", "handle": 44, "expr": [{"vmap": {"key": {"concat": [{"payload": {"protocol": "ip", "field": "daddr"}}, {"meta": {"key": "l4proto"}}, {"payload": {"protocol": "th", "field": "dport"}}]}, "data": "@service-ips"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "services", "handle": 45, "expr": [{"match": {"op": "==", "left": {"fib": {"result": "type", "flags": ["daddr"]}}, "right": "local"}}, {"match": {"op": "!=", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": {"prefix": {"addr": "127.0.0.0", "len": 8}}}}, {"vmap": {"key": {"concat": [{"meta": {"key": "l4proto"}}, {"payload": {"protocol": "th", "field": "dport"}}]}, "data": "@service-nodeports"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "service-endpoints-check", "handle": 46, "expr": [{"vmap": {"key": {"concat": [{"payload": {"protocol": "ip", "field": "daddr"}}, {"meta": {"key": "l4proto"}}, {"payload": {"protocol": "th", "field": "dport"}}]}, "data": "@no-endpoint-services"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "service-ULMVA6XW-ns1/svc1/tcp/p80", "handle": 51, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": "172.30.0.41"}}, {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 80}}, {"match": {"op": "!=", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": {"prefix": {"addr": "10.0.0.0", "len": 8}}}}, {"jump": {"target": "mark-for-masquerade"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "service-ULMVA6XW-ns1/svc1/tcp/p80", "handle": 53, "expr": [{"vmap": {"key": {"numgen": {"mode": "random", "mod": 2, "offset": 0}}, "data": {"set": [[0, {"goto": {"target": "endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"}}], [1, {"goto": {"target": "endpoint-ZCZBVNAZ-ns1/svc1/tcp/p80__10.180.0.2/80"}}]]}}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "external-ULMVA6XW-ns1/svc1/tcp/p80", "handle": 54, "expr": [{"jump": {"target": "mark-for-masquerade"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "external-ULMVA6XW-ns1/svc1/tcp/p80", "handle": 55, "expr": [{"goto": {"target": "service-ULMVA6XW-ns1/svc1/tcp/p80"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80", "handle": 56, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": "10.180.0.1"}}, {"jump": {"target": "mark-for-masquerade"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80", "handle": 57, "expr": [{"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "tcp"}}, {"dnat": {"addr": "10.180.0.1", "port": 80}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "endpoint-ZCZBVNAZ-ns1/svc1/tcp/p80__10.180.0.2/80", "handle": 58, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": "10.180.0.2"}}, {"jump": {"target": "mark-for-masquerade"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "endpoint-ZCZBVNAZ-ns1/svc1/tcp/p80__10.180.0.2/80", "handle": 59, "expr": [{"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "tcp"}}, {"dnat": {"addr": "10.180.0.2", "port": 80}}]}}
]}
"#;

fn ip(s: &str) -> std::net::IpAddr {
    s.parse().expect("address")
}

#[test]
fn parses_the_kube_proxy_table() {
    assert!(looks_like_json(DUMP));
    assert!(!looks_like_json("*nat\n:PREROUTING ACCEPT [0:0]\n"));
    let rs = parse_nft_json(DUMP).expect("parses");
    assert_eq!(rs.nft_version.as_deref(), Some("1.0.6"));
    assert!(rs.has_kube_proxy());
    let t = rs.table(Family::Ip, "kube-proxy").expect("table");
    let pre = &t.chains["filter-prerouting-pre-dnat"];
    let b = pre.base.as_ref().expect("base chain");
    assert_eq!(
        (b.chain_type.as_str(), b.hook.as_str(), b.priority),
        ("filter", "prerouting", -110)
    );
    assert_eq!(
        t.chains["nat-postrouting"]
            .base
            .as_ref()
            .map(|b| b.priority),
        Some(100)
    );
    assert!(t.chains["services"].base.is_none());
    let m = &t.sets["service-ips"];
    assert!(m.is_map);
    assert_eq!(m.key_type, ["ipv4_addr", "inet_proto", "inet_service"]);
    assert_eq!(m.data_type.as_deref(), Some("verdict"));
    assert_eq!(m.elements.len(), 1);
    assert_eq!(
        m.elements[0].data,
        Some(kp_trace::nft::Lit::Verdict(NftVerdict::Goto(
            "service-ULMVA6XW-ns1/svc1/tcp/p80".into()
        )))
    );
    // Every rule is understood, and prints back as nft would show it.
    for c in t.chains.values() {
        for r in &c.rules {
            assert!(
                !r.stmts.iter().any(|s| matches!(s, Stmt::Unknown { .. })),
                "{}",
                rule_text(r)
            );
        }
    }
    let masq: Vec<String> = t.chains["masquerading"]
        .rules
        .iter()
        .map(rule_text)
        .collect();
    assert_eq!(
        masq,
        [
            "meta mark & 0x4000 == 0x0 return",
            "meta mark set meta mark ^ 0x4000",
            "masquerade fully-random"
        ]
    );
}

#[test]
fn traces_without_a_kernel() {
    let rs = parse_nft_json(DUMP).expect("parses");
    let host = Host::new([ip("192.168.0.2")]);
    let p = Packet::tcp(
        ip("203.0.113.2"),
        40000,
        ip("192.168.0.2"),
        3001,
        Entry::External {
            iface: Some("eth0".into()),
        },
    );
    let t = trace_nft(&rs, &host, &p).expect("trace");
    println!("{}", render_text(&t, &p));
    assert_eq!(t.outcomes.len(), 2);
    for o in &t.outcomes {
        assert!(o.masquerade && !o.uncertain);
        assert_eq!(
            (o.verdict.clone(), o.delivery),
            (Verdict::Accept, Delivery::Forwarded)
        );
    }
    // The outcome cap: no fork past it; the branch is uncertain and a note says why.
    let capped = trace_nft_with(&rs, &host, &p, &TraceOptions { max_outcomes: 1 }).expect("trace");
    assert_eq!(capped.outcomes.len(), 1);
    assert!(capped.outcomes[0].uncertain);
    assert!(
        capped
            .notes
            .iter()
            .any(|n| n.contains("more than 1 outcomes"))
    );
    // The interface is needed only where a rule looks at it: none does here.
    let p = Packet::tcp(
        ip("10.0.0.9"),
        40000,
        ip("172.30.0.41"),
        80,
        Entry::Pod { iface: None },
    );
    let t = trace_nft(&rs, &host, &p).expect("trace");
    assert!(!t.is_uncertain());
    // A UDP packet to the TCP Service's port is rejected by cluster-ips-check.
    let mut p = Packet::udp(
        ip("10.0.0.9"),
        40000,
        ip("172.30.0.41"),
        80,
        Entry::Pod { iface: None },
    );
    let t = trace_nft(&rs, &host, &p).expect("trace");
    assert!(matches!(t.outcomes[0].verdict, Verdict::Reject(_)));
    // Ports on a ping are an error, as for iptables.
    p.proto = kp_trace::Proto::Icmp;
    assert!(trace_nft(&rs, &host, &p).is_err());
}
