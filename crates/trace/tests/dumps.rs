//! Traces of hand-written dumps: the kube-proxy layouts beyond the seed (REJECT,
//! NodePorts, localhost NodePorts, affinity, source ranges, externalTrafficPolicy
//! Local, IPv6) and the chain semantics (goto, RETURN, policies, unknown matches,
//! ipsets, branching limits).

mod common;

use common::*;
use kp_netfilter::parse_save;
use kp_trace::{
    Delivery, Effect, Entry, Host, Packet, Proto, TraceError, TraceOptions, Verdict, render_text,
    trace, trace_with,
};

const NODE: &str = "192.168.56.10";

const NO_ENDPOINTS_FILTER: &str = r#"-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment "default/empty has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable
-A KUBE-EXTERNAL-SERVICES -p tcp -m comment --comment "default/empty has no endpoints" -m addrtype --dst-type LOCAL -m tcp --dport 30080 -j REJECT --reject-with icmp-port-unreachable"#;

#[test]
fn service_without_endpoints_is_rejected_from_pod_and_node() {
    let rules = kube_dump(NO_ENDPOINTS_FILTER, "");
    let host = node_host();
    let from_pod = Packet::tcp(ip("10.0.1.5"), 40000, ip("10.96.0.10"), 80, pod());
    let from_node = Packet::tcp(ip(NODE), 40000, ip("10.96.0.10"), 80, Entry::Node);
    for (p, hook) in [(from_pod, "FORWARD"), (from_node, "OUTPUT")] {
        let t = trace(&rules, &host, &p).unwrap();
        println!("{}", render_text(&t, &p));
        assert_eq!(t.outcomes.len(), 1);
        let o = &t.outcomes[0];
        assert_eq!(o.verdict, Verdict::Reject("icmp-port-unreachable".into()));
        assert_eq!(o.delivery, Delivery::Dropped);
        assert!(!o.uncertain);
        let last = o.steps.last().unwrap();
        assert_eq!(
            (last.chain.as_str(), last.effect),
            ("KUBE-SERVICES", Effect::Reject)
        );
        assert!(o.steps.iter().any(|s| s.chain == hook));
        let text = render_text(&t, &p);
        assert!(
            text.contains(
                "rejected, not masqueraded, filter REJECT icmp-port-unreachable in KUBE-SERVICES"
            ),
            "{text}"
        );
    }
    // The NodePort of the same Service is rejected in INPUT.
    let p = Packet::tcp(ip("192.168.56.100"), 40000, ip(NODE), 30080, external());
    let t = trace(&rules, &host, &p).unwrap();
    let o = &t.outcomes[0];
    assert_eq!(o.verdict, Verdict::Reject("icmp-port-unreachable".into()));
    assert_eq!(o.steps.last().unwrap().chain, "KUBE-EXTERNAL-SERVICES");
}

const NODEPORT_NAT: &str = r#"-A KUBE-SERVICES -d 10.96.0.20/32 -p tcp -m comment --comment "default/web cluster IP" -m tcp --dport 80 -j KUBE-SVC-LOLE4ISW44XBNF3G
-A KUBE-NODEPORTS -p tcp -m comment --comment "default/web" -m tcp --dport 30080 -j KUBE-EXT-LOLE4ISW44XBNF3G
-A KUBE-SVC-LOLE4ISW44XBNF3G ! -s 10.0.0.0/16 -d 10.96.0.20/32 -p tcp -m comment --comment "default/web cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-EXT-LOLE4ISW44XBNF3G -m comment --comment "masquerade traffic for default/web external destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-LOLE4ISW44XBNF3G -j KUBE-SVC-LOLE4ISW44XBNF3G
-A KUBE-SVC-LOLE4ISW44XBNF3G -m comment --comment "default/web -> 10.0.0.4:8080" -j KUBE-SEP-SSZVYLO3L2GATQK3
-A KUBE-SEP-SSZVYLO3L2GATQK3 -s 10.0.0.4/32 -m comment --comment "default/web" -j KUBE-MARK-MASQ
-A KUBE-SEP-SSZVYLO3L2GATQK3 -p tcp -m comment --comment "default/web" -m tcp -j DNAT --to-destination 10.0.0.4:8080"#;

#[test]
fn nodeport_needs_the_node_address_to_be_local() {
    let rules = kube_dump("", NODEPORT_NAT);
    let p = Packet::tcp(ip("192.168.56.100"), 40000, ip(NODE), 30080, external());
    let t = trace(&rules, &node_host(), &p).unwrap();
    println!("{}", render_text(&t, &p));
    assert_eq!(t.outcomes.len(), 1);
    let o = &t.outcomes[0];
    assert_eq!(o.dnat, Some((ip("10.0.0.4"), Some(8080))));
    assert!(o.masquerade);
    assert_eq!(o.delivery, Delivery::Forwarded);
    assert_eq!(o.verdict, Verdict::Accept);
    assert!(o.steps.iter().any(|s| s.chain == "KUBE-SERVICES"
        && s.effect == Effect::Jump
        && s.rule_text.contains("--dst-type LOCAL -j KUBE-NODEPORTS")));

    // Without the node address in Host.local_addrs, addrtype LOCAL does not match.
    let t = trace(&rules, &Host::new([]), &p).unwrap();
    assert_eq!(t.outcomes[0].dnat, None);
    assert_eq!(t.outcomes[0].delivery, Delivery::Forwarded);
}

#[test]
fn localhost_nodeport_and_the_localnet_firewall() {
    let extra =
        r#"-A PREROUTING -p tcp -m tcp --dport 9999 -j DNAT --to-destination 127.0.0.1:9999"#;
    let rules = kube_dump("", &format!("{NODEPORT_NAT}\n{extra}"));
    let mut host = node_host();
    host.route_localnet = true;

    // To a NodePort on 127.0.0.1: DNATed to the endpoint and allowed.
    let p = Packet::tcp(
        ip("192.168.56.100"),
        40000,
        ip("127.0.0.1"),
        30080,
        external(),
    );
    let t = trace(&rules, &host, &p).unwrap();
    println!("{}", render_text(&t, &p));
    let o = &t.outcomes[0];
    assert_eq!(o.dnat, Some((ip("10.0.0.4"), Some(8080))));
    assert_eq!(
        (o.verdict.clone(), o.delivery),
        (Verdict::Accept, Delivery::Forwarded)
    );

    // To 127.0.0.1 on a port without a NodePort: KUBE-FIREWALL drops it.
    let p = Packet::tcp(
        ip("192.168.56.100"),
        40000,
        ip("127.0.0.1"),
        31000,
        external(),
    );
    let t = trace(&rules, &host, &p).unwrap();
    println!("{}", render_text(&t, &p));
    let o = &t.outcomes[0];
    assert_eq!(o.dnat, None);
    assert_eq!(
        (o.verdict.clone(), o.delivery),
        (Verdict::Drop, Delivery::Dropped)
    );
    let last = o.steps.last().unwrap();
    assert_eq!(
        (last.chain.as_str(), last.effect),
        ("KUBE-FIREWALL", Effect::Drop)
    );

    // A DNAT to 127.0.0.1 sets ctstate DNAT, which KUBE-FIREWALL lets through.
    let p = Packet::tcp(ip("192.168.56.100"), 40000, ip(NODE), 9999, external());
    let t = trace(&rules, &host, &p).unwrap();
    let o = &t.outcomes[0];
    assert_eq!(o.dnat, Some((ip("127.0.0.1"), Some(9999))));
    assert_eq!(
        (o.verdict.clone(), o.delivery),
        (Verdict::Accept, Delivery::Local)
    );
    assert!(
        o.steps
            .iter()
            .any(|s| s.chain == "KUBE-FIREWALL" && s.rule_index.is_none())
    );

    // From the node itself, source 127.0.0.1: DNATed, masqueraded, sent out.
    let p = Packet::tcp(ip("127.0.0.1"), 40000, ip("127.0.0.1"), 30080, Entry::Node);
    let t = trace(&rules, &host, &p).unwrap();
    let o = &t.outcomes[0];
    assert_eq!(o.dnat, Some((ip("10.0.0.4"), Some(8080))));
    assert!(o.masquerade);
    assert_eq!(o.delivery, Delivery::Forwarded);

    // Without route_localnet the kernel drops them before any of that matters.
    host.route_localnet = false;
    let p = Packet::tcp(
        ip("192.168.56.100"),
        40000,
        ip("127.0.0.1"),
        31000,
        external(),
    );
    let t = trace(&rules, &host, &p).unwrap();
    assert_eq!(t.outcomes[0].delivery, Delivery::Dropped);
    assert_eq!(t.outcomes[0].verdict, Verdict::Accept);
    assert!(t.notes.iter().any(|n| n.contains("martian destination")));
    let p = Packet::tcp(ip("127.0.0.1"), 40000, ip("127.0.0.1"), 30080, Entry::Node);
    let t = trace(&rules, &host, &p).unwrap();
    assert_eq!(t.outcomes[0].delivery, Delivery::Dropped);
    assert!(t.notes.iter().any(|n| n.contains("route_localnet")));
}

#[test]
fn three_endpoints_get_a_third_each() {
    let nat = r#"-A KUBE-SERVICES -d 10.96.0.30/32 -p tcp -m comment --comment "default/three cluster IP" -m tcp --dport 80 -j KUBE-SVC-THREE
-A KUBE-SVC-THREE -m comment --comment "default/three -> 10.0.0.1:80" -m statistic --mode random --probability 0.33333333349 -j KUBE-SEP-ONE
-A KUBE-SVC-THREE -m comment --comment "default/three -> 10.0.0.2:80" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-TWO
-A KUBE-SVC-THREE -m comment --comment "default/three -> 10.0.0.3:80" -j KUBE-SEP-THREE
-A KUBE-SEP-ONE -p tcp -m tcp -j DNAT --to-destination 10.0.0.1:80
-A KUBE-SEP-TWO -p tcp -m tcp -j DNAT --to-destination 10.0.0.2:80
-A KUBE-SEP-THREE -p tcp -m tcp -j DNAT --to-destination 10.0.0.3:80"#;
    let rules = kube_dump("", nat);
    let p = Packet::tcp(ip("10.0.1.5"), 40000, ip("10.96.0.30"), 80, pod());
    let t = trace(&rules, &node_host(), &p).unwrap();
    let text = render_text(&t, &p);
    println!("{text}");
    let got: Vec<_> = t.outcomes.iter().map(|o| o.dnat.unwrap().0).collect();
    assert_eq!(got, [ip("10.0.0.1"), ip("10.0.0.2"), ip("10.0.0.3")]);
    for o in &t.outcomes {
        assert!(
            (o.probability - 1.0 / 3.0).abs() < 1e-6,
            "{}",
            o.probability
        );
    }
    let sum: f64 = t.outcomes.iter().map(|o| o.probability).sum();
    assert!((sum - 1.0).abs() < 1e-12);
    assert_eq!(text.matches("   33.3%  -> KUBE-SEP-").count(), 3);
}

#[test]
fn session_affinity_is_traced_as_a_first_connection_with_a_note() {
    let nat = r#"-A KUBE-SERVICES -d 10.96.0.30/32 -p tcp -m comment --comment "default/sticky cluster IP" -m tcp --dport 80 -j KUBE-SVC-STICKY
-A KUBE-SVC-STICKY ! -s 10.0.0.0/16 -d 10.96.0.30/32 -p tcp -m comment --comment "default/sticky cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVC-STICKY -m comment --comment "default/sticky -> 10.0.0.1:8080" -m recent --rcheck --seconds 10800 --reap --name KUBE-SEP-A --mask 255.255.255.255 --rsource -j KUBE-SEP-A
-A KUBE-SVC-STICKY -m comment --comment "default/sticky -> 10.0.0.2:8080" -m recent --rcheck --seconds 10800 --reap --name KUBE-SEP-B --mask 255.255.255.255 --rsource -j KUBE-SEP-B
-A KUBE-SVC-STICKY -m comment --comment "default/sticky -> 10.0.0.1:8080" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-A
-A KUBE-SVC-STICKY -m comment --comment "default/sticky -> 10.0.0.2:8080" -j KUBE-SEP-B
-A KUBE-SEP-A -s 10.0.0.1/32 -m comment --comment "default/sticky" -j KUBE-MARK-MASQ
-A KUBE-SEP-A -p tcp -m comment --comment "default/sticky" -m recent --set --name KUBE-SEP-A --mask 255.255.255.255 --rsource -m tcp -j DNAT --to-destination 10.0.0.1:8080
-A KUBE-SEP-B -s 10.0.0.2/32 -m comment --comment "default/sticky" -j KUBE-MARK-MASQ
-A KUBE-SEP-B -p tcp -m comment --comment "default/sticky" -m recent --set --name KUBE-SEP-B --mask 255.255.255.255 --rsource -m tcp -j DNAT --to-destination 10.0.0.2:8080"#;
    let rules = kube_dump("", nat);
    let p = Packet::tcp(ip("10.0.1.5"), 40000, ip("10.96.0.30"), 80, pod());
    let t = trace(&rules, &node_host(), &p).unwrap();
    println!("{}", render_text(&t, &p));
    assert_eq!(t.outcomes.len(), 2);
    assert!(
        t.outcomes
            .iter()
            .all(|o| !o.uncertain && (o.probability - 0.5).abs() < 1e-9)
    );
    for sep in ["KUBE-SEP-A", "KUBE-SEP-B"] {
        assert!(
            t.notes
                .iter()
                .any(|n| n.contains("within 10800s") && n.ends_with(&format!("goes back to {sep}"))),
            "{:#?}",
            t.notes
        );
        assert!(
            t.notes
                .iter()
                .any(|n| n.contains(&format!("records the client in recent list {sep}")))
        );
    }
}

#[test]
fn load_balancer_source_ranges() {
    let nat = r#"-A KUBE-SERVICES -d 203.0.113.10/32 -p tcp -m comment --comment "default/lb loadbalancer IP" -m tcp --dport 80 -j KUBE-FW-LB
-A KUBE-FW-LB -s 198.51.100.0/24 -m comment --comment "default/lb loadbalancer IP" -j KUBE-EXT-LB
-A KUBE-FW-LB -m comment --comment "other traffic to default/lb will be dropped by KUBE-PROXY-FIREWALL"
-A KUBE-EXT-LB -m comment --comment "masquerade traffic for default/lb external destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-LB -j KUBE-SVC-LB
-A KUBE-SVC-LB -m comment --comment "default/lb -> 10.0.0.4:80" -j KUBE-SEP-LB
-A KUBE-SEP-LB -s 10.0.0.4/32 -m comment --comment "default/lb" -j KUBE-MARK-MASQ
-A KUBE-SEP-LB -p tcp -m comment --comment "default/lb" -m tcp -j DNAT --to-destination 10.0.0.4:80"#;
    let filter = r#"-A KUBE-PROXY-FIREWALL -d 203.0.113.10/32 -p tcp -m comment --comment "default/lb traffic not accepted by KUBE-FW-LB" -m tcp --dport 80 -j DROP"#;
    let rules = kube_dump(filter, nat);
    let host = node_host();

    let inside = Packet::tcp(
        ip("198.51.100.7"),
        40000,
        ip("203.0.113.10"),
        80,
        external(),
    );
    let t = trace(&rules, &host, &inside).unwrap();
    let o = &t.outcomes[0];
    assert_eq!(o.dnat, Some((ip("10.0.0.4"), Some(80))));
    assert_eq!(
        (o.verdict.clone(), o.delivery),
        (Verdict::Accept, Delivery::Forwarded)
    );

    let outside = Packet::tcp(ip("192.0.2.5"), 40000, ip("203.0.113.10"), 80, external());
    let t = trace(&rules, &host, &outside).unwrap();
    println!("{}", render_text(&t, &outside));
    let o = &t.outcomes[0];
    assert_eq!(o.dnat, None);
    assert_eq!(
        (o.verdict.clone(), o.delivery),
        (Verdict::Drop, Delivery::Dropped)
    );
    // The rule without a target only continues.
    assert!(
        o.steps
            .iter()
            .any(|s| s.chain == "KUBE-FW-LB" && s.effect == Effect::Continue)
    );
    let last = o.steps.last().unwrap();
    assert_eq!(
        (last.chain.as_str(), last.effect),
        ("KUBE-PROXY-FIREWALL", Effect::Drop)
    );
}

#[test]
fn external_traffic_policy_local() {
    let nat = r#"-A KUBE-SERVICES -d 10.96.0.40/32 -p tcp -m comment --comment "default/local cluster IP" -m tcp --dport 80 -j KUBE-SVC-LOCAL
-A KUBE-NODEPORTS -p tcp -m comment --comment "default/local" -m tcp --dport 30090 -j KUBE-EXT-LOCAL
-A KUBE-EXT-LOCAL -s 10.0.0.0/16 -m comment --comment "pod traffic for default/local external destinations" -j KUBE-SVC-LOCAL
-A KUBE-EXT-LOCAL -m comment --comment "masquerade LOCAL traffic for default/local external destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ
-A KUBE-EXT-LOCAL -m comment --comment "route LOCAL traffic for default/local external destinations" -m addrtype --src-type LOCAL -j KUBE-SVC-LOCAL
-A KUBE-EXT-LOCAL -j KUBE-SVL-LOCAL
-A KUBE-SVC-LOCAL ! -s 10.0.0.0/16 -d 10.96.0.40/32 -p tcp -m comment --comment "default/local cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVC-LOCAL -m comment --comment "default/local -> 10.0.0.4:80" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-L1
-A KUBE-SVC-LOCAL -m comment --comment "default/local -> 10.0.1.2:80" -j KUBE-SEP-L2
-A KUBE-SVL-LOCAL -m comment --comment "default/local -> 10.0.0.4:80" -j KUBE-SEP-L1
-A KUBE-SEP-L1 -s 10.0.0.4/32 -m comment --comment "default/local" -j KUBE-MARK-MASQ
-A KUBE-SEP-L1 -p tcp -m comment --comment "default/local" -m tcp -j DNAT --to-destination 10.0.0.4:80
-A KUBE-SEP-L2 -s 10.0.1.2/32 -m comment --comment "default/local" -j KUBE-MARK-MASQ
-A KUBE-SEP-L2 -p tcp -m comment --comment "default/local" -m tcp -j DNAT --to-destination 10.0.1.2:80"#;
    let rules = kube_dump("", nat);
    let host = node_host();

    // External client: local endpoint only, client address preserved.
    let p = Packet::tcp(ip("192.168.56.100"), 40000, ip(NODE), 30090, external());
    let t = trace(&rules, &host, &p).unwrap();
    println!("{}", render_text(&t, &p));
    assert_eq!(t.outcomes.len(), 1);
    let o = &t.outcomes[0];
    assert_eq!(o.dnat, Some((ip("10.0.0.4"), Some(80))));
    assert!(!o.masquerade);
    assert!(
        o.steps
            .iter()
            .any(|s| s.chain == "KUBE-EXT-LOCAL" && s.rule_text.ends_with("-j KUBE-SVL-LOCAL"))
    );

    // From the node: the addrtype --src-type LOCAL short-circuit to every endpoint,
    // masqueraded.
    let p = Packet::tcp(ip(NODE), 40000, ip(NODE), 30090, Entry::Node);
    let t = trace(&rules, &host, &p).unwrap();
    println!("{}", render_text(&t, &p));
    let got: Vec<_> = t
        .outcomes
        .iter()
        .map(|o| (o.dnat.unwrap().0, o.masquerade))
        .collect();
    assert_eq!(got, [(ip("10.0.0.4"), true), (ip("10.0.1.2"), true)]);
    assert!(
        t.outcomes[0]
            .steps
            .iter()
            .any(|s| s.rule_text.contains("--src-type LOCAL -j KUBE-SVC-LOCAL"))
    );

    // From a pod: the pod short-circuit to every endpoint, not masqueraded.
    let p = Packet::tcp(ip("10.0.1.5"), 40000, ip(NODE), 30090, pod());
    let t = trace(&rules, &host, &p).unwrap();
    let got: Vec<_> = t
        .outcomes
        .iter()
        .map(|o| (o.dnat.unwrap().0, o.masquerade))
        .collect();
    assert_eq!(got, [(ip("10.0.0.4"), false), (ip("10.0.1.2"), false)]);
}

#[test]
fn unknown_match_is_reported_and_not_guessed() {
    let nat = r#"-A KUBE-SERVICES -d 10.96.0.50/32 -p tcp -m foo --bar -m tcp --dport 80 -j KUBE-SVC-UNK
-A KUBE-SVC-UNK -p tcp -m tcp -j DNAT --to-destination 10.0.0.4:80"#;
    let rules = kube_dump("", nat);
    let p = Packet::tcp(ip("10.0.1.5"), 40000, ip("10.96.0.50"), 80, pod());
    let t = trace(&rules, &node_host(), &p).unwrap();
    println!("{}", render_text(&t, &p));
    let o = &t.outcomes[0];
    assert!(o.uncertain);
    assert_eq!(o.dnat, None);
    assert_eq!(o.unknown.len(), 1);
    assert!(o.unknown[0].contains("-m foo"), "{}", o.unknown[0]);
    assert!(render_text(&t, &p).contains("[uncertain]"));

    // A rule that is certainly false elsewhere does not make the outcome uncertain.
    let p = Packet::tcp(ip("10.0.1.5"), 40000, ip("10.96.0.50"), 81, pod());
    let t = trace(&rules, &node_host(), &p).unwrap();
    assert!(!t.is_uncertain());

    // Missing information is unknown too: an input interface nobody gave.
    let rules = load(
        "*filter\n:FORWARD DROP [0:0]\n-A FORWARD -i cni0 -j ACCEPT\n-A FORWARD -m physdev --physdev-is-bridged -j ACCEPT\n",
    );
    let p = Packet::tcp(
        ip("10.0.1.5"),
        1,
        ip("10.0.0.4"),
        80,
        Entry::Pod { iface: None },
    );
    let t = trace(&rules, &node_host(), &p).unwrap();
    let o = &t.outcomes[0];
    assert_eq!(o.verdict, Verdict::Drop);
    assert_eq!(o.unknown.len(), 2, "{:#?}", o.unknown);
    let p = Packet::tcp(
        ip("10.0.1.5"),
        1,
        ip("10.0.0.4"),
        80,
        Entry::Pod {
            iface: Some("cni0".into()),
        },
    );
    let t = trace(&rules, &node_host(), &p).unwrap();
    assert_eq!(t.outcomes[0].verdict, Verdict::Accept);
    assert!(!t.is_uncertain());
}

#[test]
fn ipv6_dump() {
    let text = r#"*filter
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
*nat
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-SERVICES -d fd00:96::10/128 -p tcp -m comment --comment "default/six cluster IP" -m tcp --dport 80 -j KUBE-SVC-QXFP4M4CBWOSKAFO
-A KUBE-NODEPORTS -p tcp -m comment --comment "default/six" -m tcp --dport 30090 -j KUBE-EXT-QXFP4M4CBWOSKAFO
-A KUBE-SERVICES ! -d ::1/128 -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-SVC-QXFP4M4CBWOSKAFO ! -s fd00:1::/48 -d fd00:96::10/128 -p tcp -m comment --comment "default/six cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-EXT-QXFP4M4CBWOSKAFO -m comment --comment "masquerade traffic for default/six external destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-QXFP4M4CBWOSKAFO -j KUBE-SVC-QXFP4M4CBWOSKAFO
-A KUBE-SVC-QXFP4M4CBWOSKAFO -m comment --comment "default/six -> [fd00:1::4]:8080" -j KUBE-SEP-KLAX24UQJHKBYXLV
-A KUBE-SEP-KLAX24UQJHKBYXLV -s fd00:1::4/128 -m comment --comment "default/six" -j KUBE-MARK-MASQ
-A KUBE-SEP-KLAX24UQJHKBYXLV -p tcp -m comment --comment "default/six" -m tcp -j DNAT --to-destination [fd00:1::4]:8080"#;
    let rules = load(text);
    let host = Host::new([ip("fd00:56::10")]);

    let p = Packet::tcp(ip("fd00:1:0:1::5"), 40000, ip("fd00:96::10"), 80, pod());
    let t = trace(&rules, &host, &p).unwrap();
    let o = &t.outcomes[0];
    assert_eq!(o.dnat, Some((ip("fd00:1::4"), Some(8080))));
    assert!(!o.masquerade);

    let p = Packet::tcp(
        ip("fd00:56::99"),
        40000,
        ip("fd00:56::10"),
        30090,
        external(),
    );
    let t = trace(&rules, &host, &p).unwrap();
    let text = render_text(&t, &p);
    println!("{text}");
    assert!(text.starts_with("packet tcp [fd00:56::99]:40000 -> [fd00:56::10]:30090"));
    assert!(text.contains("DNAT [fd00:1::4]:8080  forwarded, masqueraded, filter ACCEPT"));

    // ::1 NodePorts do not exist, and ::1 never arrives from outside.
    let p = Packet::tcp(ip("::1"), 40000, ip("::1"), 30090, Entry::Node);
    let t = trace(&rules, &host, &p).unwrap();
    assert_eq!(t.outcomes[0].dnat, None);
    assert_eq!(t.outcomes[0].delivery, Delivery::Local);

    let p = Packet::ping(ip("fd00:1:0:1::5"), ip("fd00:96::10"), pod());
    let t = trace(&rules, &host, &p).unwrap();
    assert_eq!(t.outcomes[0].dnat, None);
    assert!(t.notes.iter().any(|n| n.contains("cannot be pinged")));

    let p = Packet::tcp(ip("10.0.1.5"), 1, ip("10.96.0.1"), 80, pod());
    assert!(matches!(
        trace(&rules, &host, &p),
        Err(TraceError::FamilyMismatch { .. })
    ));
}

#[test]
fn goto_returns_to_the_callers_caller() {
    let rules = load(
        r#"*filter
:FORWARD ACCEPT [0:0]
-A FORWARD -j A
-A FORWARD -m mark --mark 0x1 -j ACCEPT
-A FORWARD -j DROP
-A A -g B
-A A -j REJECT --reject-with icmp-port-unreachable
-A B -p udp -j RETURN
-A B -j MARK --set-xmark 0x1/0xffffffff
"#,
    );
    let host = node_host();
    let tcp = Packet::tcp(ip("10.0.1.5"), 1, ip("10.0.0.4"), 80, pod());
    let t = trace(&rules, &host, &tcp).unwrap();
    println!("{}", render_text(&t, &tcp));
    let o = &t.outcomes[0];
    assert_eq!(o.verdict, Verdict::Accept);
    assert_eq!(o.mark, 1);
    let effects: Vec<_> = o
        .steps
        .iter()
        .map(|s| (s.chain.as_str(), s.effect))
        .collect();
    assert_eq!(
        effects,
        [
            ("FORWARD", Effect::Jump),
            ("A", Effect::Goto),
            ("B", Effect::Mark),
            ("FORWARD", Effect::Accept)
        ]
    );

    let udp = Packet::udp(ip("10.0.1.5"), 1, ip("10.0.0.4"), 53, pod());
    let t = trace(&rules, &host, &udp).unwrap();
    let o = &t.outcomes[0];
    assert_eq!(o.verdict, Verdict::Drop);
    let effects: Vec<_> = o
        .steps
        .iter()
        .map(|s| (s.chain.as_str(), s.effect))
        .collect();
    assert_eq!(
        effects,
        [
            ("FORWARD", Effect::Jump),
            ("A", Effect::Goto),
            ("B", Effect::Return),
            ("FORWARD", Effect::Drop)
        ]
    );
}

#[test]
fn builtin_policies() {
    let rules = load(
        "*filter\n:FORWARD DROP [0:0]\n:OUTPUT DROP [0:0]\n-A FORWARD -p udp -j ACCEPT\n-A OUTPUT -j RETURN\n",
    );
    let host = node_host();
    let p = Packet::tcp(ip("10.0.1.5"), 1, ip("10.0.0.4"), 80, pod());
    let t = trace(&rules, &host, &p).unwrap();
    let o = &t.outcomes[0];
    assert_eq!(
        (o.verdict.clone(), o.delivery),
        (Verdict::Drop, Delivery::Dropped)
    );
    let last = o.steps.last().unwrap();
    assert_eq!(
        (last.effect, last.rule_text.as_str()),
        (Effect::Policy, "-P FORWARD DROP")
    );
    assert!(render_text(&t, &p).contains("filter DROP in FORWARD"));
    // No nat table at all: a note says its hooks were not evaluated.
    assert!(t.notes.iter().any(|n| n.contains("no nat table")));

    // RETURN from a builtin chain applies its policy.
    let p = Packet::tcp(ip(NODE), 1, ip("10.0.0.4"), 80, Entry::Node);
    let t = trace(&rules, &host, &p).unwrap();
    let o = &t.outcomes[0];
    assert_eq!(o.verdict, Verdict::Drop);
    let effects: Vec<_> = o.steps.iter().map(|s| s.effect).collect();
    assert_eq!(effects, [Effect::Return, Effect::Policy]);
}

#[test]
fn node_to_local_address_comes_back_over_lo() {
    let rules = load(
        "*filter\n:INPUT DROP [0:0]\n-A INPUT -i lo -m conntrack --ctstatus CONFIRMED -j ACCEPT\n*nat\n-A OUTPUT -j MARK --set-xmark 0x1/0x1\n",
    );
    let p = Packet::tcp(ip(NODE), 1, ip(NODE), 22, Entry::Node);
    let t = trace(&rules, &node_host(), &p).unwrap();
    let o = &t.outcomes[0];
    assert_eq!(
        (o.verdict.clone(), o.delivery),
        (Verdict::Accept, Delivery::Local)
    );
    assert_eq!(o.mark, 1);
    assert!(
        o.steps
            .iter()
            .any(|s| s.chain == "INPUT" && s.effect == Effect::Accept)
    );
    assert!(t.notes.iter().any(|n| n.contains("comes back over lo")));
}

#[test]
fn ipset_matches() {
    let rules = load(
        "*filter\n:INPUT DROP [0:0]\n-A INPUT -m set --match-set KUBE-NODE-PORT-TCP dst -j ACCEPT\n-A INPUT -m set --match-set ALLOWED src -p icmp -j ACCEPT\n",
    );
    let mut host = node_host();
    let p = Packet::tcp(ip("192.168.56.100"), 1, ip(NODE), 30080, external());
    // The set's contents were not given: unknown.
    let t = trace(&rules, &host, &p).unwrap();
    assert!(t.is_uncertain());
    assert_eq!(t.outcomes[0].verdict, Verdict::Drop);
    host.load_ipset_save(
        "create KUBE-NODE-PORT-TCP bitmap:port range 0-65535\nadd KUBE-NODE-PORT-TCP 30080\n\
         create ALLOWED hash:net family inet\nadd ALLOWED 192.168.56.0/24\n",
    )
    .unwrap();
    let t = trace(&rules, &host, &p).unwrap();
    assert!(!t.is_uncertain());
    assert_eq!(t.outcomes[0].verdict, Verdict::Accept);
    let p = Packet::ping(ip("192.168.56.100"), ip(NODE), external());
    let t = trace(&rules, &host, &p).unwrap();
    assert_eq!(t.outcomes[0].verdict, Verdict::Accept);
    assert_eq!(t.outcomes[0].delivery, Delivery::Local);
}

fn many_endpoints(n: usize) -> String {
    let mut nat = String::from(
        "-A KUBE-SERVICES -d 10.96.0.60/32 -p tcp -m comment --comment \"default/big cluster IP\" -m tcp --dport 80 -j KUBE-SVC-BIG\n",
    );
    for i in 0..n {
        let ep = format!("10.1.{}.{}", i / 250, i % 250 + 1);
        let stat = if i + 1 < n {
            format!(
                "-m statistic --mode random --probability {:.10} ",
                1.0 / (n - i) as f64
            )
        } else {
            String::new()
        };
        nat.push_str(&format!(
            "-A KUBE-SVC-BIG {stat}-j KUBE-SEP-E{i}\n-A KUBE-SEP-E{i} -s {ep}/32 -j KUBE-MARK-MASQ\n-A KUBE-SEP-E{i} -p tcp -m tcp -j DNAT --to-destination {ep}:8080\n"
        ));
    }
    nat
}

#[test]
fn a_thousand_endpoints() {
    let rules = kube_dump("", &many_endpoints(1000));
    let p = Packet::tcp(ip("10.0.1.5"), 40000, ip("10.96.0.60"), 80, pod());
    let start = std::time::Instant::now();
    let t = trace(&rules, &node_host(), &p).unwrap();
    println!("1000 endpoints traced in {:?}", start.elapsed());
    assert_eq!(t.outcomes.len(), 1000);
    let sum: f64 = t.outcomes.iter().map(|o| o.probability).sum();
    assert!((sum - 1.0).abs() < 1e-6, "{sum}");
    assert_eq!(t.summary().len(), 1000);
}

#[test]
fn outcome_cap() {
    let rules = kube_dump("", &many_endpoints(50));
    let p = Packet::tcp(ip("10.0.1.5"), 40000, ip("10.96.0.60"), 80, pod());
    let t = trace_with(&rules, &node_host(), &p, &TraceOptions { max_outcomes: 10 }).unwrap();
    assert_eq!(t.outcomes.len(), 10);
    let sum: f64 = t.outcomes.iter().map(|o| o.probability).sum();
    assert!((sum - 1.0).abs() < 1e-9);
    assert!(t.outcomes.last().unwrap().uncertain);
    assert!(t.notes.iter().any(|n| n.contains("more than 10 outcomes")));
}

#[test]
fn input_errors() {
    let rules = kube_dump("", "");
    let host = node_host();
    let mixed = Packet::tcp(ip("10.0.1.5"), 1, ip("fd00::1"), 80, pod());
    assert!(matches!(
        trace(&rules, &host, &mixed),
        Err(TraceError::MixedFamily { .. })
    ));
    let mut ping = Packet::ping(ip("10.0.1.5"), ip("10.0.0.4"), pod());
    ping.dport = Some(1);
    assert!(matches!(
        trace(&rules, &host, &ping),
        Err(TraceError::PortsWithoutPortProtocol { .. })
    ));
    let looped = parse_save(
        "*filter\n:FORWARD ACCEPT [0:0]\n:A - [0:0]\n-A FORWARD -j A\n-A A -j A\nCOMMIT\n",
    )
    .unwrap();
    assert!(matches!(
        trace(
            &looped,
            &host,
            &Packet::tcp(ip("10.0.1.5"), 1, ip("10.0.0.4"), 80, pod())
        ),
        Err(TraceError::ChainDepth { .. })
    ));
    let other = Packet {
        proto: Proto::Other(47),
        ..Packet::ping(ip("10.0.1.5"), ip("10.0.0.4"), pod())
    };
    assert!(trace(&rules, &host, &other).is_ok());
}

#[test]
fn nodeport_without_the_node_addresses_is_uncertain() {
    let rules = kube_dump("", NODEPORT_NAT);
    let p = Packet::tcp(ip("192.168.56.100"), 40000, ip(NODE), 30080, external());
    // The node's addresses are not known (a dump traced without --node-ip): whether
    // `addrtype --dst-type LOCAL` matches is unknown; the outcome says so.
    let mut host = Host::new([]);
    host.local_addrs_incomplete = true;
    let t = trace(&rules, &host, &p).unwrap();
    let text = render_text(&t, &p);
    println!("{text}");
    assert!(t.is_uncertain(), "{text}");
    assert!(text.contains("[uncertain]"), "{text}");
    assert!(
        t.outcomes[0]
            .unknown
            .iter()
            .any(|u| u.contains("--dst-type LOCAL -j KUBE-NODEPORTS")
                && u.contains("whether 192.168.56.10 is an address of this node")),
        "{text}"
    );
    assert!(t.notes.iter().any(|n| n.contains("--node-ip")), "{text}");

    // With the address given, the NodePort is certain and DNATed, as before.
    let mut host = node_host();
    host.local_addrs_incomplete = true;
    let t = trace(&rules, &host, &p).unwrap();
    assert!(!t.is_uncertain());
    assert_eq!(t.outcomes[0].dnat, Some((ip("10.0.0.4"), Some(8080))));

    // A Service's ClusterIP is never a node address: a ping to it stays certain.
    let mut host = Host::new([]);
    host.local_addrs_incomplete = true;
    let p = Packet::ping(ip("192.168.56.100"), ip("10.96.0.20"), external());
    let t = trace(&rules, &host, &p).unwrap();
    assert!(!t.is_uncertain(), "{}", render_text(&t, &p));
}

/// Upstream's nfacct matches, as `iptables-save` prints them (with `xt_nfacct`'s doubled
/// space): the counting localhost NodePort rule and the INVALID drop are traced like any
/// rule (`-m nfacct` always matches: it only counts).
#[test]
fn nfacct_rules_are_traced_and_explained() {
    let invalid = "-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name  ct_state_invalid_dropped_pkts -j DROP";
    let localhost = "-A KUBE-NODEPORTS -d 127.0.0.0/8 -p tcp -m comment --comment \"default/web\" -m tcp --dport 30080 -m nfacct --nfacct-name  localhost_nps_accepted_pkts -j KUBE-EXT-LOLE4ISW44XBNF3G";
    let rules = kube_dump(invalid, &format!("{localhost}\n{NODEPORT_NAT}"));
    let mut host = node_host();
    host.route_localnet = true;

    let p = Packet::tcp(ip("127.0.0.1"), 40000, ip("127.0.0.1"), 30080, Entry::Node);
    let t = trace(&rules, &host, &p).unwrap();
    let text = render_text(&t, &p);
    let o = &t.outcomes[0];
    assert_eq!(o.dnat, Some((ip("10.0.0.4"), Some(8080))), "{text}");
    let counted = o
        .steps
        .iter()
        .find(|s| s.chain == "KUBE-NODEPORTS" && s.effect == Effect::Jump)
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        counted
            .rule_text
            .contains("-m nfacct --nfacct-name localhost_nps_accepted_pkts"),
        "{text}"
    );
    assert!(text.contains("localhost_nps_accepted_pkts"), "{text}");

    // To the node's address the counting rule does not match; the next one does, and the
    // forwarded connection passes the INVALID drop.
    let p = Packet::tcp(ip("192.168.56.100"), 40000, ip(NODE), 30080, external());
    let t = trace(&rules, &host, &p).unwrap();
    let o = &t.outcomes[0];
    assert_eq!(o.dnat, Some((ip("10.0.0.4"), Some(8080))));
    assert_eq!(o.verdict, Verdict::Accept);
    let jump = o
        .steps
        .iter()
        .find(|s| s.chain == "KUBE-NODEPORTS" && s.effect == Effect::Jump)
        .unwrap();
    assert!(!jump.rule_text.contains("nfacct"), "{}", jump.rule_text);
}
