//! The nftables tracer on kube-proxy's nftables layout (upstream's rule shapes, from
//! `pkg/proxy/nftables/proxier.go`): each ruleset is written as `nft -f` input, loaded
//! into a scratch network namespace, read back with `nft -j list ruleset` — the JSON the
//! real `nft` prints — and traced. Needs root (CI runs as root); see
//! `kp_testkit::require_root`.
//!
//! Conventions (upstream's tests'): pods 10.0.0.0/8, ClusterIPs 172.30.0.0/16, node
//! 192.168.0.2, external clients 203.0.113.0/24 (203.0.113.0/25 allowed by source ranges).

use std::io::Write as _;
use std::net::IpAddr;
use std::process::Stdio;

#[path = "common/nft_compare.rs"]
mod nft_compare;

use kp_testkit::{Netns, require_root};
use kp_trace::nft::{NftRuleset, parse_nft_json, parse_nft_text};
use kp_trace::{
    Delivery, Effect, Entry, Host, Mode, Packet, Proto, Trace, TraceError, Verdict, render_text,
    trace_nft,
};

const NODE: &str = "192.168.0.2";

/// Loads `rules` (`nft -f` syntax) into a fresh namespace and returns the parsed
/// `nft -j list ruleset`.
fn load(rules: &str) -> NftRuleset {
    let ns = Netns::new("nfttrace").expect("namespace");
    let mut child = ns
        .command("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("nft runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(rules.as_bytes())
        .expect("write rules");
    let out = child.wait_with_output().expect("nft finishes");
    assert!(
        out.status.success(),
        "nft -f failed: {}\n{rules}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = ns
        .run("nft", ["-j", "list", "ruleset"])
        .expect("nft -j list ruleset");
    let from_json = parse_nft_json(&json).expect("the JSON nft prints parses");
    // The text reader agrees with the JSON reader on every ruleset these tests load
    // (`-a`: with the handles, so that the traces name the rules alike).
    let text = ns
        .run("nft", ["-a", "list", "ruleset"])
        .expect("nft -a list ruleset");
    let from_text = parse_nft_text(&text).expect("the text nft prints parses");
    if let Some(d) = nft_compare::first_difference(&from_text, &from_json, true) {
        panic!("nft list ruleset and nft -j list ruleset read differently: {d}\n{text}");
    }
    TEXT_READINGS.with(|t| t.borrow_mut().push((from_text, from_json.clone())));
    from_json
}

thread_local! {
    /// Every ruleset [`load`] read, as text and as JSON, for [`run`] to trace both.
    static TEXT_READINGS: std::cell::RefCell<Vec<(NftRuleset, NftRuleset)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Upstream's fixed rules (`baseRules` of proxier_test.go) for family `ip` or `ip6`, with
/// the NodePort rules of `--nodeport-addresses` unset (`fib daddr type local`).
fn base(ipx: &str) -> String {
    let (addr, cidr, no_localhost) = if ipx == "ip" {
        ("ipv4_addr", "172.30.0.0/16", "ip daddr != 127.0.0.0/8")
    } else {
        ("ipv6_addr", "fd00:10:96::/112", "ip6 daddr != ::1")
    };
    format!(
        r#"add table {ipx} kube-proxy {{ comment "rules for kube-proxy" ; }}
add set {ipx} kube-proxy cluster-ips {{ type {addr} ; comment "Active ClusterIPs" ; }}
add set {ipx} kube-proxy nodeport-ips {{ type {addr} ; comment "IPs that accept NodePort traffic" ; }}
add map {ipx} kube-proxy firewall-ips {{ type {addr} . inet_proto . inet_service : verdict ; comment "destinations that are subject to LoadBalancerSourceRanges" ; }}
add map {ipx} kube-proxy no-endpoint-nodeports {{ type inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to service nodeports with no endpoints" ; }}
add map {ipx} kube-proxy no-endpoint-services {{ type {addr} . inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to services with no endpoints" ; }}
add map {ipx} kube-proxy service-ips {{ type {addr} . inet_proto . inet_service : verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }}
add map {ipx} kube-proxy service-nodeports {{ type inet_proto . inet_service : verdict ; comment "NodePort traffic" ; }}
add chain {ipx} kube-proxy cluster-ips-check
add chain {ipx} kube-proxy filter-prerouting-pre-dnat {{ type filter hook prerouting priority -110 ; }}
add chain {ipx} kube-proxy filter-output-pre-dnat {{ type filter hook output priority -110 ; }}
add chain {ipx} kube-proxy filter-forward {{ type filter hook forward priority 0 ; }}
add chain {ipx} kube-proxy filter-input {{ type filter hook input priority 0 ; }}
add chain {ipx} kube-proxy filter-output {{ type filter hook output priority 0 ; }}
add chain {ipx} kube-proxy firewall-check
add chain {ipx} kube-proxy mark-for-masquerade
add chain {ipx} kube-proxy masquerading
add chain {ipx} kube-proxy nat-output {{ type nat hook output priority -100 ; }}
add chain {ipx} kube-proxy nat-postrouting {{ type nat hook postrouting priority 100 ; }}
add chain {ipx} kube-proxy nat-prerouting {{ type nat hook prerouting priority -100 ; }}
add chain {ipx} kube-proxy nodeport-endpoints-check
add chain {ipx} kube-proxy reject-chain {{ comment "helper for @no-endpoint-services / @no-endpoint-nodeports" ; }}
add chain {ipx} kube-proxy services
add chain {ipx} kube-proxy service-endpoints-check
add rule {ipx} kube-proxy cluster-ips-check {ipx} daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"
add rule {ipx} kube-proxy cluster-ips-check {ipx} daddr {{ {cidr} }} drop comment "Drop traffic to unallocated ClusterIPs"
add rule {ipx} kube-proxy filter-prerouting-pre-dnat ct state new jump firewall-check
add rule {ipx} kube-proxy filter-forward ct state new jump service-endpoints-check
add rule {ipx} kube-proxy filter-forward ct state new jump cluster-ips-check
add rule {ipx} kube-proxy filter-input ct state new jump nodeport-endpoints-check
add rule {ipx} kube-proxy filter-input ct state new jump service-endpoints-check
add rule {ipx} kube-proxy filter-output ct state new jump service-endpoints-check
add rule {ipx} kube-proxy filter-output-pre-dnat ct state new jump firewall-check
add rule {ipx} kube-proxy filter-output ct state new jump cluster-ips-check
add rule {ipx} kube-proxy firewall-check {ipx} daddr . meta l4proto . th dport vmap @firewall-ips
add rule {ipx} kube-proxy mark-for-masquerade mark set mark or 0x4000
add rule {ipx} kube-proxy masquerading mark and 0x4000 == 0 return
add rule {ipx} kube-proxy masquerading mark set mark xor 0x4000
add rule {ipx} kube-proxy masquerading masquerade fully-random
add rule {ipx} kube-proxy nat-output jump services
add rule {ipx} kube-proxy nat-postrouting jump masquerading
add rule {ipx} kube-proxy nat-prerouting jump services
add rule {ipx} kube-proxy nodeport-endpoints-check fib daddr type local {no_localhost} meta l4proto . th dport vmap @no-endpoint-nodeports
add rule {ipx} kube-proxy reject-chain reject
add rule {ipx} kube-proxy services {ipx} daddr . meta l4proto . th dport vmap @service-ips
add rule {ipx} kube-proxy services fib daddr type local {no_localhost} meta l4proto . th dport vmap @service-nodeports
add rule {ipx} kube-proxy service-endpoints-check {ipx} daddr . meta l4proto . th dport vmap @no-endpoint-services
"#
    )
}

/// `ns1/svc1`: ClusterIP 172.30.0.41:80/TCP, endpoints 10.180.0.1:80 and 10.180.0.2:80
/// (upstream's chain names), NodePort 3001.
const SVC1: &str = r#"
add chain ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80
add chain ip kube-proxy external-ULMVA6XW-ns1/svc1/tcp/p80
add chain ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80
add chain ip kube-proxy endpoint-ZCZBVNAZ-ns1/svc1/tcp/p80__10.180.0.2/80
add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 ip daddr 172.30.0.41 tcp dport 80 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 numgen random mod 2 vmap { 0 : goto endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 , 1 : goto endpoint-ZCZBVNAZ-ns1/svc1/tcp/p80__10.180.0.2/80 }
add rule ip kube-proxy external-ULMVA6XW-ns1/svc1/tcp/p80 jump mark-for-masquerade
add rule ip kube-proxy external-ULMVA6XW-ns1/svc1/tcp/p80 goto service-ULMVA6XW-ns1/svc1/tcp/p80
add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 ip saddr 10.180.0.1 jump mark-for-masquerade
add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 meta l4proto tcp dnat to 10.180.0.1:80
add rule ip kube-proxy endpoint-ZCZBVNAZ-ns1/svc1/tcp/p80__10.180.0.2/80 ip saddr 10.180.0.2 jump mark-for-masquerade
add rule ip kube-proxy endpoint-ZCZBVNAZ-ns1/svc1/tcp/p80__10.180.0.2/80 meta l4proto tcp dnat to 10.180.0.2:80
add element ip kube-proxy cluster-ips { 172.30.0.41 }
add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3001 : goto external-ULMVA6XW-ns1/svc1/tcp/p80 }
"#;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("address")
}

fn node() -> Host {
    Host::new([ip(NODE)])
}

fn pod() -> Entry {
    Entry::Pod {
        iface: Some("veth1234".into()),
    }
}

fn external() -> Entry {
    Entry::External {
        iface: Some("eth0".into()),
    }
}

fn run(rules: &NftRuleset, host: &Host, p: &Packet) -> Trace {
    let t = trace_nft(rules, host, p).expect("trace");
    println!("{}", render_text(&t, p));
    assert_eq!(t.mode, Mode::Nftables);
    let total: f64 = t.outcomes.iter().map(|o| o.probability).sum();
    assert!((total - 1.0).abs() < 1e-9, "probabilities sum to {total}");
    // The same rules read from `nft list ruleset` trace the same way.
    let text = TEXT_READINGS.with(|r| {
        r.borrow()
            .iter()
            .find(|(_, json)| json == rules)
            .map(|(text, _)| text.clone())
    });
    if let Some(text) = text {
        let tt = trace_nft(&text, host, p).expect("trace of the text reading");
        let unknown = t.outcomes.iter().any(|o| !o.unknown.is_empty());
        if unknown {
            // Unknown statements are shown as the reader kept them (JSON or text).
            let shape = |t: &Trace| {
                t.outcomes
                    .iter()
                    .map(|o| {
                        (
                            format!("{:?}", o.verdict),
                            o.probability,
                            o.uncertain,
                            o.unknown.len(),
                        )
                    })
                    .collect::<Vec<_>>()
            };
            assert_eq!(shape(&tt), shape(&t), "text vs JSON reading");
        } else {
            assert_eq!(
                render_text(&tt, p),
                render_text(&t, p),
                "text vs JSON reading"
            );
        }
    }
    t
}

/// (endpoint, masqueraded, probability) per outcome.
fn endpoints(t: &Trace) -> Vec<(String, bool, f64)> {
    t.outcomes
        .iter()
        .map(|o| {
            let (ip, port) = o.dnat.expect("DNAT");
            (
                format!("{ip}:{}", port.expect("port")),
                o.masquerade,
                o.probability,
            )
        })
        .collect()
}

fn half(t: &Trace, a: (&str, bool), b: (&str, bool)) {
    let got = endpoints(t);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!((got[0].0.as_str(), got[0].1), a, "{got:?}");
    assert_eq!((got[1].0.as_str(), got[1].1), b, "{got:?}");
    assert!(
        got.iter().all(|(_, _, p)| (p - 0.5).abs() < 1e-9),
        "{got:?}"
    );
}

#[test]
fn clusterip_with_two_endpoints() {
    if !require_root() {
        return;
    }
    let rules = load(&format!("{}{SVC1}", base("ip")));
    let vip = ip("172.30.0.41");

    // From outside the pod CIDR: masqueraded (mark-for-masquerade, then masquerading).
    let p = Packet::tcp(ip("203.0.113.2"), 40000, vip, 80, external());
    let t = run(&rules, &node(), &p);
    half(&t, ("10.180.0.1:80", true), ("10.180.0.2:80", true));
    for o in &t.outcomes {
        assert!(!o.uncertain, "{:?}", o.unknown);
        assert_eq!(
            (o.verdict.clone(), o.delivery),
            (Verdict::Accept, Delivery::Forwarded)
        );
        assert_eq!(o.mark, 0, "masquerading clears the mark bit");
        assert!(o.steps.iter().any(|s| s.chain == "mark-for-masquerade"
            && s.effect == Effect::Mark
            && s.detail == "mark 0x0 -> 0x4000"));
        assert!(o.steps.iter().any(|s| s.chain == "masquerading"
            && s.effect == Effect::Masquerade
            && s.rule_text == "masquerade fully-random"));
        let pick = o
            .steps
            .iter()
            .find(|s| s.rule_text.starts_with("numgen random mod 2 vmap"))
            .expect("the numgen step");
        assert_eq!(pick.effect, Effect::Goto);
        assert!(
            pick.detail.contains("(probability 50.0%)"),
            "{}",
            pick.detail
        );
        assert!(pick.handle.is_some());
    }
    let text = render_text(&t, &p);
    assert!(text.starts_with(
        "packet tcp 203.0.113.2:40000 -> 172.30.0.41:80 from external via eth0 (prerouting)\n"
    ));
    assert!(text.contains(
        "ip kube-proxy services  ip daddr . meta l4proto . th dport vmap @service-ips  \
         (@service-ips: 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80)\n"
    ));
    assert!(text.contains(
        "   50.0%  -> endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80  DNAT 10.180.0.1:80  \
         forwarded, masqueraded, accepted\n"
    ));
    // The pre-DNAT filter chain runs before the nat chain.
    let s = &t.outcomes[0].steps;
    let pos = |c: &str| s.iter().position(|x| x.chain == c).expect(c);
    assert!(pos("filter-prerouting-pre-dnat") < pos("nat-prerouting"));
    assert!(pos("nat-prerouting") < pos("filter-forward"));
    assert!(pos("filter-forward") < pos("nat-postrouting"));

    // From a pod: not masqueraded.
    let p = Packet::tcp(ip("10.0.0.9"), 40000, vip, 80, pod());
    let t = run(&rules, &node(), &p);
    half(&t, ("10.180.0.1:80", false), ("10.180.0.2:80", false));

    // Hairpin: an endpoint reaching itself through the Service is masqueraded.
    let p = Packet::tcp(ip("10.180.0.1"), 40000, vip, 80, pod());
    let t = run(&rules, &node(), &p);
    half(&t, ("10.180.0.1:80", true), ("10.180.0.2:80", false));

    // From the node: nat-output, masqueraded (the node is outside the pod CIDR).
    let p = Packet::tcp(ip(NODE), 40000, vip, 80, Entry::Node);
    let t = run(&rules, &node(), &p);
    half(&t, ("10.180.0.1:80", true), ("10.180.0.2:80", true));
    assert!(t.outcomes[0].steps.iter().any(|s| s.chain == "nat-output"));
    assert!(render_text(&t, &p).contains("from the node (output)"));

    // JSON for tools.
    let json = t.to_json().expect("json");
    assert!(json.contains("\"mode\": \"Nftables\""));
    assert!(json.contains("\"table\": \"ip kube-proxy\""));
}

#[test]
fn service_without_endpoints_is_rejected() {
    if !require_root() {
        return;
    }
    let svc6 = r#"
add element ip kube-proxy cluster-ips { 172.30.0.46 }
add element ip kube-proxy no-endpoint-services { 172.30.0.46 . tcp . 80 comment "ns6/svc6:p80" : goto reject-chain }
add element ip kube-proxy no-endpoint-nodeports { tcp . 3006 comment "ns6/svc6:p80" : goto reject-chain }
"#;
    let rules = load(&format!("{}{svc6}", base("ip")));
    let vip = ip("172.30.0.46");
    let cases = [
        (
            Packet::tcp(ip("10.0.0.9"), 40000, vip, 80, pod()),
            "filter-forward",
        ),
        (
            Packet::tcp(ip(NODE), 40000, vip, 80, Entry::Node),
            "filter-output",
        ),
        (
            Packet::tcp(ip("203.0.113.2"), 40000, ip(NODE), 3006, external()),
            "filter-input",
        ),
    ];
    for (p, hook) in cases {
        let t = run(&rules, &node(), &p);
        assert_eq!(t.outcomes.len(), 1);
        let o = &t.outcomes[0];
        assert_eq!(o.verdict, Verdict::Reject("icmp port-unreachable".into()));
        assert_eq!((o.delivery, o.dnat), (Delivery::Dropped, None));
        assert!(!o.uncertain, "{:?}", o.unknown);
        assert!(o.steps.iter().any(|s| s.chain == hook));
        let last = o.steps.last().expect("steps");
        assert_eq!(
            (last.chain.as_str(), last.effect),
            ("reject-chain", Effect::Reject)
        );
        assert!(
            o.steps.iter().any(|s| s
                .detail
                .contains("comment \"ns6/svc6:p80\" : goto reject-chain")),
            "{:?}",
            o.steps
        );
        assert!(
            render_text(&t, &p)
                .contains("ip kube-proxy REJECT icmp port-unreachable in reject-chain")
        );
    }
}

#[test]
fn nodeport_via_fib_daddr_type_local() {
    if !require_root() {
        return;
    }
    let rules = load(&format!("{}{SVC1}", base("ip")));
    let p = Packet::tcp(ip("203.0.113.2"), 40000, ip(NODE), 3001, external());
    let t = run(&rules, &node(), &p);
    half(&t, ("10.180.0.1:80", true), ("10.180.0.2:80", true));
    assert!(t.outcomes[0].steps.iter().any(|s| {
        s.chain == "services"
            && s.rule_text
                .starts_with("fib daddr type local ip daddr != 127.0.0.0/8")
            && s.detail
                .contains("tcp . 3001 : goto external-ULMVA6XW-ns1/svc1/tcp/p80")
    }));

    // Without the node's address, `fib daddr type local` does not match: the packet is
    // routed on unchanged.
    let t = run(&rules, &Host::new([]), &p);
    assert_eq!(t.outcomes.len(), 1);
    assert_eq!(
        (t.outcomes[0].dnat, t.outcomes[0].delivery),
        (None, Delivery::Forwarded)
    );

    // From the node to its own NodePort: nat-output DNATs, then the packet is rerouted.
    let p = Packet::tcp(ip(NODE), 40000, ip(NODE), 3001, Entry::Node);
    let t = run(&rules, &node(), &p);
    half(&t, ("10.180.0.1:80", true), ("10.180.0.2:80", true));
    assert!(t.outcomes.iter().all(|o| o.delivery == Delivery::Forwarded));

    // A port no NodePort uses on the node's own address: delivered locally, and from
    // the node the packet loops back over lo.
    let p = Packet::tcp(ip(NODE), 40000, ip(NODE), 22, Entry::Node);
    let t = run(&rules, &node(), &p);
    assert_eq!(t.outcomes[0].delivery, Delivery::Local);
    assert!(t.notes.iter().any(|n| n.contains("comes back over lo")));
}

/// `ns2/svc2`: externalTrafficPolicy Local, LoadBalancer IP 1.2.3.4, NodePort 3002, one
/// local endpoint (10.180.0.3) and one remote (10.180.2.1).
const SVC2_LOCAL: &str = r#"
add chain ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80
add chain ip kube-proxy local-42NFTM6N-ns2/svc2/tcp/p80
add chain ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80
add chain ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.3/80
add chain ip kube-proxy endpoint-EPDDNXHL-ns2/svc2/tcp/p80__10.180.2.1/80
add rule ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80 ip daddr 172.30.0.42 tcp dport 80 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80 numgen random mod 2 vmap { 0 : goto endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.3/80 , 1 : goto endpoint-EPDDNXHL-ns2/svc2/tcp/p80__10.180.2.1/80 }
add rule ip kube-proxy local-42NFTM6N-ns2/svc2/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.3/80 }
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 ip saddr 10.0.0.0/8 goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit pod traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local jump mark-for-masquerade comment "masquerade local traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit local traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 goto local-42NFTM6N-ns2/svc2/tcp/p80
add rule ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.3/80 ip saddr 10.180.0.3 jump mark-for-masquerade
add rule ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.3/80 meta l4proto tcp dnat to 10.180.0.3:80
add rule ip kube-proxy endpoint-EPDDNXHL-ns2/svc2/tcp/p80__10.180.2.1/80 ip saddr 10.180.2.1 jump mark-for-masquerade
add rule ip kube-proxy endpoint-EPDDNXHL-ns2/svc2/tcp/p80__10.180.2.1/80 meta l4proto tcp dnat to 10.180.2.1:80
add element ip kube-proxy cluster-ips { 172.30.0.42 }
add element ip kube-proxy service-ips { 172.30.0.42 . tcp . 80 : goto service-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-ips { 1.2.3.4 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3002 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
"#;

#[test]
fn external_traffic_policy_local() {
    if !require_root() {
        return;
    }
    let rules = load(&format!("{}{SVC2_LOCAL}", base("ip")));
    // From outside to the NodePort and to the load balancer IP: only the local endpoint,
    // and the client's address is kept.
    for dst in [ip(NODE), ip("1.2.3.4")] {
        let port = if dst == ip(NODE) { 3002 } else { 80 };
        let p = Packet::tcp(ip("203.0.113.2"), 40000, dst, port, external());
        let t = run(&rules, &node(), &p);
        assert_eq!(endpoints(&t), [("10.180.0.3:80".to_string(), false, 1.0)]);
        assert!(
            t.outcomes[0]
                .steps
                .iter()
                .any(|s| s.chain == "local-42NFTM6N-ns2/svc2/tcp/p80")
        );
    }
    // From a pod to the load balancer IP: short-circuited to the cluster-wide chain.
    let p = Packet::tcp(ip("10.0.0.9"), 40000, ip("1.2.3.4"), 80, pod());
    let t = run(&rules, &node(), &p);
    half(&t, ("10.180.0.3:80", false), ("10.180.2.1:80", false));
    assert!(t.outcomes[0].steps.iter().any(|s| {
        s.effect == Effect::Goto
            && s.rule_text
                .ends_with("comment \"short-circuit pod traffic\"")
    }));
    // From the node to its NodePort: `fib saddr type local`: masqueraded, all endpoints.
    let p = Packet::tcp(ip(NODE), 40000, ip(NODE), 3002, Entry::Node);
    let t = run(&rules, &node(), &p);
    half(&t, ("10.180.0.3:80", true), ("10.180.2.1:80", true));
}

#[test]
fn load_balancer_source_ranges() {
    if !require_root() {
        return;
    }
    let svc5 = r#"
add chain ip kube-proxy firewall-HVFWP5L3-ns5/svc5/tcp/p80
add rule ip kube-proxy firewall-HVFWP5L3-ns5/svc5/tcp/p80 ip saddr != { 203.0.113.0/25 } drop
add element ip kube-proxy service-ips { 5.6.7.8 . tcp . 80 : goto external-ULMVA6XW-ns1/svc1/tcp/p80 }
add element ip kube-proxy firewall-ips { 5.6.7.8 . tcp . 80 : goto firewall-HVFWP5L3-ns5/svc5/tcp/p80 }
"#;
    let rules = load(&format!("{}{SVC1}{svc5}", base("ip")));
    let lb = ip("5.6.7.8");
    // Allowed source: load balanced.
    let p = Packet::tcp(ip("203.0.113.2"), 40000, lb, 80, external());
    let t = run(&rules, &node(), &p);
    half(&t, ("10.180.0.1:80", true), ("10.180.0.2:80", true));
    assert!(
        t.outcomes[0]
            .steps
            .iter()
            .any(|s| s.chain == "firewall-HVFWP5L3-ns5/svc5/tcp/p80"
                && s.effect == Effect::Return
                && s.rule_index.is_none())
    );
    // Blocked source: dropped before DNAT, in filter-prerouting-pre-dnat's firewall-check.
    let p = Packet::tcp(ip("203.0.113.130"), 40000, lb, 80, external());
    let t = run(&rules, &node(), &p);
    assert_eq!(t.outcomes.len(), 1);
    let o = &t.outcomes[0];
    assert_eq!((o.verdict.clone(), o.dnat), (Verdict::Drop, None));
    let last = o.steps.last().expect("steps");
    assert_eq!(last.chain, "firewall-HVFWP5L3-ns5/svc5/tcp/p80");
    // nft prints a one-element anonymous set as a plain prefix.
    assert_eq!(last.rule_text, "ip saddr != 203.0.113.0/25 drop");
    assert!(o.steps.iter().all(|s| s.chain != "nat-prerouting"));
    assert!(
        render_text(&t, &p).contains("ip kube-proxy DROP in firewall-HVFWP5L3-ns5/svc5/tcp/p80")
    );
    // The same Service's NodePort bypasses the source ranges.
    let p = Packet::tcp(ip("203.0.113.130"), 40000, ip(NODE), 3001, external());
    let t = run(&rules, &node(), &p);
    assert_eq!(t.outcomes.len(), 2);
}

#[test]
fn session_affinity_is_traced_as_a_first_connection() {
    if !require_root() {
        return;
    }
    let svc5 = r#"
add set ip kube-proxy affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 { type ipv4_addr ; flags dynamic,timeout ; timeout 10800s ; }
add set ip kube-proxy affinity-LJNX4JVV-ns5/svc5/tcp/p80__10.180.0.4/80 { type ipv4_addr ; flags dynamic,timeout ; timeout 10800s ; }
add chain ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80
add chain ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80
add chain ip kube-proxy endpoint-LJNX4JVV-ns5/svc5/tcp/p80__10.180.0.4/80
add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 ip daddr 172.30.0.45 tcp dport 80 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 ip saddr @affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 goto endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80
add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 ip saddr @affinity-LJNX4JVV-ns5/svc5/tcp/p80__10.180.0.4/80 goto endpoint-LJNX4JVV-ns5/svc5/tcp/p80__10.180.0.4/80
add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 numgen random mod 2 vmap { 0 : goto endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 , 1 : goto endpoint-LJNX4JVV-ns5/svc5/tcp/p80__10.180.0.4/80 }
add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 ip saddr 10.180.0.3 jump mark-for-masquerade
add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 update @affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 { ip saddr }
add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 meta l4proto tcp dnat to 10.180.0.3:80
add rule ip kube-proxy endpoint-LJNX4JVV-ns5/svc5/tcp/p80__10.180.0.4/80 ip saddr 10.180.0.4 jump mark-for-masquerade
add rule ip kube-proxy endpoint-LJNX4JVV-ns5/svc5/tcp/p80__10.180.0.4/80 update @affinity-LJNX4JVV-ns5/svc5/tcp/p80__10.180.0.4/80 { ip saddr }
add rule ip kube-proxy endpoint-LJNX4JVV-ns5/svc5/tcp/p80__10.180.0.4/80 meta l4proto tcp dnat to 10.180.0.4:80
add element ip kube-proxy cluster-ips { 172.30.0.45 }
add element ip kube-proxy service-ips { 172.30.0.45 . tcp . 80 : goto service-HVFWP5L3-ns5/svc5/tcp/p80 }
add element ip kube-proxy affinity-LJNX4JVV-ns5/svc5/tcp/p80__10.180.0.4/80 { 10.0.0.7 timeout 1h }
"#;
    let rules = load(&format!("{}{svc5}", base("ip")));
    let set = rules
        .table(kp_trace::nft::Family::Ip, "kube-proxy")
        .and_then(|t| {
            t.sets
                .get("affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80")
        })
        .expect("affinity set");
    assert_eq!(set.timeout, Some(10800));
    assert!(set.flags.iter().any(|f| f == "timeout"), "{:?}", set.flags);

    let p = Packet::tcp(ip("10.0.0.9"), 40000, ip("172.30.0.45"), 80, pod());
    let t = run(&rules, &node(), &p);
    half(&t, ("10.180.0.3:80", false), ("10.180.0.4:80", false));
    assert!(!t.is_uncertain());
    assert!(
        t.notes
            .iter()
            .any(|n| n.contains("traced as a first connection")
                && n.contains("a returning client within 10800s takes goto endpoint-GTK6MW7G"))
    );
    assert!(
        t.notes
            .iter()
            .any(|n| n.contains("records 10.0.0.9 in @affinity-GTK6MW7G"))
    );
    assert!(t.outcomes.iter().all(|o| {
        o.steps
            .iter()
            .any(|s| s.detail.contains("records 10.0.0.9 in @affinity-"))
    }));

    // A client the dump lists in an affinity set: still traced as a first connection,
    // and the note says where it goes right now.
    let p = Packet::tcp(ip("10.0.0.7"), 40000, ip("172.30.0.45"), 80, pod());
    let t = run(&rules, &node(), &p);
    assert_eq!(t.outcomes.len(), 2);
    assert!(t.notes.iter().any(|n| n.contains(
        "the dump lists 10.0.0.7 in @affinity-LJNX4JVV-ns5/svc5/tcp/p80__10.180.0.4/80 (expires in"
    ) && n.contains("right now takes goto endpoint-LJNX4JVV")));
}

#[test]
fn ipv6_clusterip_and_family_checks() {
    if !require_root() {
        return;
    }
    let svc = r#"
add chain ip6 kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80
add chain ip6 kube-proxy endpoint-XBHZTN5W-ns1/svc1/tcp/p80__fd00.10.180..1/80
add chain ip6 kube-proxy endpoint-UWMLNNQA-ns1/svc1/tcp/p80__fd00.10.180..2.1/80
add rule ip6 kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 ip6 daddr fd00:10:96::41 tcp dport 80 ip6 saddr != fd00:10::/64 jump mark-for-masquerade
add rule ip6 kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 numgen random mod 2 vmap { 0 : goto endpoint-XBHZTN5W-ns1/svc1/tcp/p80__fd00.10.180..1/80 , 1 : goto endpoint-UWMLNNQA-ns1/svc1/tcp/p80__fd00.10.180..2.1/80 }
add rule ip6 kube-proxy endpoint-XBHZTN5W-ns1/svc1/tcp/p80__fd00.10.180..1/80 ip6 saddr fd00:10:180::1 jump mark-for-masquerade
add rule ip6 kube-proxy endpoint-XBHZTN5W-ns1/svc1/tcp/p80__fd00.10.180..1/80 meta l4proto tcp dnat to [fd00:10:180::1]:80
add rule ip6 kube-proxy endpoint-UWMLNNQA-ns1/svc1/tcp/p80__fd00.10.180..2.1/80 ip6 saddr fd00:10:180::2:1 jump mark-for-masquerade
add rule ip6 kube-proxy endpoint-UWMLNNQA-ns1/svc1/tcp/p80__fd00.10.180..2.1/80 meta l4proto tcp dnat to [fd00:10:180::2:1]:80
add element ip6 kube-proxy cluster-ips { fd00:10:96::41 }
add element ip6 kube-proxy service-ips { fd00:10:96::41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }
"#;
    let rules = load(&format!("{}{svc}", base("ip6")));
    let host = Host::new([ip("2001:db8::1")]);
    let vip = ip("fd00:10:96::41");
    let p = Packet::tcp(ip("fd00:10::2"), 40000, vip, 80, pod());
    let t = run(&rules, &host, &p);
    half(
        &t,
        ("fd00:10:180::1:80", false),
        ("fd00:10:180::2:1:80", false),
    );
    assert!(render_text(&t, &p).contains("DNAT [fd00:10:180::1]:80"));
    let p = Packet::tcp(ip("2600:5200::1"), 40000, vip, 80, external());
    let t = run(&rules, &host, &p);
    assert!(t.outcomes.iter().all(|o| o.masquerade));
    // A ping to the IPv6 ClusterIP is rejected with ICMPv6.
    let p = Packet::ping(ip("fd00:10::2"), vip, pod());
    let t = run(&rules, &host, &p);
    assert_eq!(
        t.outcomes[0].verdict,
        Verdict::Reject("icmpv6 port-unreachable".into())
    );
    // An IPv4 packet against IPv6-only rules is an error, as for iptables dumps.
    let p = Packet::tcp(ip("10.0.0.9"), 40000, ip("172.30.0.41"), 80, pod());
    assert!(matches!(
        trace_nft(&rules, &Host::new([]), &p),
        Err(TraceError::FamilyMismatch { .. })
    ));
}

#[test]
fn unknown_expressions_are_reported_not_guessed() {
    if !require_root() {
        return;
    }
    let extra = r#"
add table inet other
add chain inet other fw { type filter hook forward priority filter - 5 ; }
add rule inet other fw jhash ip saddr mod 2 0 drop
add rule inet other fw ip daddr 9.9.9.9 limit rate 10/second drop
add rule inet other fw tcp dport 443 limit rate 10/second drop
add rule inet other fw meta l4proto udp ip saddr . th dport { 10.0.0.9 . 53 } drop
"#;
    let rules = load(&format!("{}{SVC1}{extra}", base("ip")));
    let p = Packet::tcp(ip("10.0.0.9"), 40000, ip("172.30.0.41"), 80, pod());
    let t = run(&rules, &node(), &p);
    assert_eq!(t.outcomes.len(), 2);
    for o in &t.outcomes {
        assert!(o.uncertain);
        // The jhash rule, not the others: the limit rules' other matches fail.
        assert_eq!(o.unknown.len(), 1, "{:?}", o.unknown);
        assert!(o.unknown[0].starts_with("inet other fw rule handle"));
        assert!(
            o.unknown[0].contains(
                ": expression `jhash` not evaluated; the rule was treated as \
                 not matching: `<unknown expression {\"jhash\":"
            ),
            "{}",
            o.unknown[0]
        );
        assert!(o.unknown[0].ends_with("}> 0 drop`"), "{}", o.unknown[0]);
        // Treated as not matching: the packet goes on.
        assert_eq!(o.verdict, Verdict::Accept);
    }
    let text = render_text(&t, &p);
    assert!(text.contains("[uncertain]") && text.contains("unknown: inet other fw"));
    // The inet table's forward chain (filter - 5) runs before kube-proxy's (filter).
    let s = &t.outcomes[0].steps;
    let fwd = s
        .iter()
        .position(|x| x.chain == "filter-forward")
        .expect("filter-forward");
    assert!(s[..fwd].iter().all(|x| x.table != "inet other"));
}

#[test]
fn pinging_a_clusterip_in_nftables_mode() {
    if !require_root() {
        return;
    }
    let rules = load(&format!("{}{SVC1}", base("ip")));
    // From a pod, and from the node.
    for p in [
        Packet::ping(ip("10.0.0.9"), ip("172.30.0.41"), pod()),
        Packet::ping(ip(NODE), ip("172.30.0.41"), Entry::Node),
    ] {
        let t = run(&rules, &node(), &p);
        assert_eq!(t.outcomes.len(), 1);
        let o = &t.outcomes[0];
        assert!(!o.uncertain, "{:?}", o.unknown);
        assert_eq!(o.dnat, None);
        assert_eq!(o.verdict, Verdict::Reject("icmp port-unreachable".into()));
        let last = o.steps.last().expect("steps");
        assert_eq!(last.chain, "cluster-ips-check");
        assert_eq!(
            last.rule_text,
            "ip daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\""
        );
        assert!(
            t.notes
                .iter()
                .any(|n| n.contains("Destination Port Unreachable") && n.contains("@cluster-ips")),
            "{:?}",
            t.notes
        );
    }
    // A port the Service does not have: refused at once.
    let p = Packet::tcp(ip("10.0.0.9"), 40000, ip("172.30.0.41"), 443, pod());
    let t = run(&rules, &node(), &p);
    assert!(matches!(t.outcomes[0].verdict, Verdict::Reject(_)));
    assert!(t.notes.iter().any(|n| n.contains("connection refused")));
    // An unallocated address of the service CIDR: dropped.
    let p = Packet::ping(ip("10.0.0.9"), ip("172.30.0.99"), pod());
    let t = run(&rules, &node(), &p);
    assert_eq!(t.outcomes[0].verdict, Verdict::Drop);
    assert!(t.notes.iter().any(|n| n.contains("unallocated ClusterIPs")));
    // Without upstream's cluster-ips-check (older kube-proxy): no DNAT, routed away.
    let old = base("ip").replace(
        "add rule ip kube-proxy filter-forward ct state new jump cluster-ips-check\n",
        "",
    );
    let rules = load(&format!("{old}{SVC1}"));
    let p = Packet::ping(ip("10.0.0.9"), ip("172.30.0.41"), pod());
    let t = run(&rules, &node(), &p);
    assert_eq!(
        (t.outcomes[0].dnat, t.outcomes[0].delivery),
        (None, Delivery::Forwarded)
    );
    assert!(
        t.notes.iter().any(|n| n.contains("no DNAT")
            && n.contains("tcp . 80 in @service-ips")
            && n.contains("a ping to it goes unanswered")),
        "{:?}",
        t.notes
    );
    assert_eq!(p.proto, Proto::Icmp);
}

#[test]
fn nat_maps_numgen_and_chain_semantics() {
    if !require_root() {
        return;
    }
    let rules = load(
        r#"
add table ip t
add map ip t m { type ipv4_addr . inet_service : ipv4_addr . inet_service ; elements = { 1.2.3.4 . 80 : 10.0.0.1 . 8080 } ; }
add chain ip t pre { type nat hook prerouting priority dstnat ; }
add chain ip t in { type filter hook input priority filter ; policy drop ; }
add chain ip t helper
add rule ip t pre meta l4proto tcp dnat ip addr . port to ip daddr . tcp dport map @m
add rule ip t pre ip daddr 5.5.5.5 dnat to numgen random mod 3 map { 0 : 10.0.0.1, 1-2 : 10.0.0.2 }
add rule ip t in meta mark & 0x4000 != 0 accept
add rule ip t in ct state established,related accept
add rule ip t in jump helper
add rule ip t in tcp dport 22 accept
add rule ip t helper tcp dport 22 mark set mark or 0x4000 return
"#,
    );
    let host = Host::new([ip("192.168.1.1")]);
    // `dnat ip addr . port to ... map @m`.
    let p = Packet::tcp(ip("203.0.113.2"), 40000, ip("1.2.3.4"), 80, external());
    let t = run(&rules, &host, &p);
    assert_eq!(endpoints(&t), [("10.0.0.1:8080".to_string(), false, 1.0)]);
    // `dnat to numgen random mod 3 map {...}`: 1/3 and 2/3.
    let p = Packet::tcp(ip("203.0.113.2"), 40000, ip("5.5.5.5"), 80, external());
    let t = run(&rules, &host, &p);
    let got = endpoints(&t);
    assert_eq!(got.len(), 2);
    assert!((got[0].2 - 1.0 / 3.0).abs() < 1e-9 && got[0].0 == "10.0.0.1:80");
    assert!((got[1].2 - 2.0 / 3.0).abs() < 1e-9 && got[1].0 == "10.0.0.2:80");
    // Input with policy drop: a rule in a jumped chain sets the mark and returns; the
    // mark rule does not match (it ran before), port 22 is accepted.
    let p = Packet::tcp(ip("203.0.113.2"), 40000, ip("192.168.1.1"), 22, external());
    let t = run(&rules, &host, &p);
    let o = &t.outcomes[0];
    assert_eq!(
        (o.verdict.clone(), o.delivery),
        (Verdict::Accept, Delivery::Local)
    );
    assert_eq!(o.mark, 0x4000);
    // Another port: the policy drops it.
    let p = Packet::tcp(ip("203.0.113.2"), 40000, ip("192.168.1.1"), 23, external());
    let t = run(&rules, &host, &p);
    let o = &t.outcomes[0];
    assert_eq!(o.verdict, Verdict::Drop);
    let last = o.steps.last().expect("steps");
    assert_eq!(
        (last.effect, last.rule_text.as_str()),
        (Effect::Policy, "policy drop")
    );
    assert!(render_text(&t, &p).contains("ip t in  policy drop\n"));
}

#[test]
fn numgen_matches_interval_sets_and_other_statements() {
    if !require_root() {
        return;
    }
    // `numgen random mod 2 0 ... dnat` followed by a fallback rule (the iptables-like cascade
    // kube-proxy-rs' nftables mode wrote before it took upstream's one `numgen … map`
    // lookup), a hairpin set tested after DNAT, interval sets (prefix,
    // range, concatenation with a port range), `fib daddr type != local`, SNAT to a range.
    let rules = load(
        r#"
add table ip p
add set ip p cidrs { type ipv4_addr ; flags interval ; elements = { 10.0.0.0/8, 192.168.1.1-192.168.1.5 } ; }
add set ip p hp { type ipv4_addr . ipv4_addr . inet_proto . inet_service ; elements = { 10.0.0.4 . 10.0.0.4 . tcp . 80 } ; }
add chain ip p pre { type nat hook prerouting priority dstnat ; }
add chain ip p post { type nat hook postrouting priority srcnat ; }
add chain ip p svc
add rule ip p pre ip daddr 10.96.0.1 tcp dport 80 goto svc
add rule ip p svc numgen random mod 2 0 meta l4proto tcp dnat to 10.0.0.4:80
add rule ip p svc meta l4proto tcp dnat to 10.0.1.2:80
add rule ip p post ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hp masquerade fully-random
add rule ip p post ip saddr != @cidrs meta l4proto tcp snat to 192.168.1.1:1000-2000
add table inet f
add set inet f allowed { type ipv4_addr . inet_proto . inet_service ; flags interval ; elements = { 10.0.0.0/8 . tcp . 80-90 } ; }
add chain inet f fw { type filter hook forward priority filter ; policy drop ; }
add rule inet f fw counter log prefix "fw: "
add rule inet f fw ip saddr . meta l4proto . th dport @allowed accept
add rule inet f fw ip6 saddr ::/0 accept
add rule inet f fw fib daddr type != local tcp dport 8080 reject with tcp reset
"#,
    );
    let host = node();
    let vip = ip("10.96.0.1");
    // A pod reaching itself through the "Service": the hairpin branch is masqueraded.
    let p = Packet::tcp(ip("10.0.0.4"), 40000, vip, 80, pod());
    let t = run(&rules, &host, &p);
    half(&t, ("10.0.0.4:80", true), ("10.0.1.2:80", false));
    for o in &t.outcomes {
        assert_eq!(o.verdict, Verdict::Accept);
        assert!(!o.uncertain, "{:?}", o.unknown);
        assert!(
            o.steps
                .iter()
                .any(|s| s.rule_text == "counter log prefix \"fw: \"")
        );
    }
    let pick = &t.outcomes[0].steps;
    assert!(pick.iter().any(|s| s.effect == Effect::Dnat
        && s.rule_text == "numgen random mod 2 0 meta l4proto tcp dnat to 10.0.0.4:80"
        && s.detail.contains("probability 50.0%")));
    // From outside the allowed set: the forward policy drops both branches.
    let p = Packet::tcp(ip("203.0.113.7"), 40000, vip, 80, external());
    let t = run(&rules, &host, &p);
    assert!(
        t.outcomes
            .iter()
            .all(|o| o.verdict == Verdict::Drop && o.dnat.is_some())
    );
    // Not a node address, port 8080: rejected with a TCP reset.
    let p = Packet::tcp(ip("203.0.113.7"), 40000, ip("10.0.9.9"), 8080, external());
    let t = run(&rules, &host, &p);
    assert_eq!(t.outcomes[0].verdict, Verdict::Reject("tcp reset".into()));
    // From the node to the outside: SNAT to a range, traced with its first address and
    // port, and reported.
    let p = Packet::tcp(ip(NODE), 40000, ip("8.8.8.8"), 443, Entry::Node);
    let t = run(&rules, &host, &p);
    let o = &t.outcomes[0];
    assert!(o.masquerade && o.uncertain);
    let last = o.steps.last().expect("steps");
    assert_eq!(
        (last.effect, last.detail.as_str()),
        (Effect::Snat, "source now 192.168.1.1:1000")
    );
    assert!(
        o.unknown[0].contains("NAT to the range 192.168.1.1:1000-2000"),
        "{:?}",
        o.unknown
    );
}

#[test]
fn nodeport_without_the_node_addresses_is_uncertain() {
    if !require_root() {
        return;
    }
    let rules = load(&format!("{}{SVC1}", base("ip")));
    let p = Packet::tcp(ip("203.0.113.2"), 40000, ip(NODE), 3001, external());
    // The node's addresses are not known (a dump traced without --node-ip): whether
    // `fib daddr type local` matches is unknown, and the trace says so.
    let mut host = Host::new([]);
    host.local_addrs_incomplete = true;
    let t = run(&rules, &host, &p);
    println!("{}", render_text(&t, &p));
    assert!(t.is_uncertain());
    assert!(
        t.outcomes[0]
            .unknown
            .iter()
            .any(|u| u.contains("whether 192.168.0.2 is an address of this node")),
        "{:?}",
        t.outcomes[0].unknown
    );
    assert!(
        t.notes.iter().any(|n| n.contains("--node-ip")),
        "{:?}",
        t.notes
    );

    // A ClusterIP (in @cluster-ips) is never a node address: still certain.
    let p = Packet::tcp(ip("10.0.0.9"), 40000, ip("172.30.0.41"), 80, pod());
    let t = run(&rules, &host, &p);
    assert!(!t.is_uncertain(), "{}", render_text(&t, &p));
}

#[test]
fn a_kube_proxy_table_without_base_chains_is_not_explained_as_a_mismatch() {
    if !require_root() {
        return;
    }
    // Only the non-base chains of kube-proxy's table, with the Service's map element.
    let full = format!("{}{SVC1}", base("ip"));
    let partial: String = full
        .lines()
        .filter(|l| !l.contains("hook "))
        .filter(|l| {
            !["filter-", "nat-"]
                .iter()
                .any(|c| l.starts_with(&format!("add rule ip kube-proxy {c}")))
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let rules = load(&partial);
    let p = Packet::tcp(ip("10.0.0.9"), 40000, ip("172.30.0.41"), 80, pod());
    let t = run(&rules, &node(), &p);
    println!("{}", render_text(&t, &p));
    assert_eq!(t.outcomes[0].dnat, None);
    assert!(
        t.notes.iter().any(|n| n.contains("no base chain")),
        "{:?}",
        t.notes
    );
    let note = t.notes.iter().find(|n| n.starts_with("no DNAT")).unwrap();
    assert!(!note.contains("which this tcp packet is not"), "{note}");
    assert!(note.contains("no rule looked them up"), "{note}");
}
