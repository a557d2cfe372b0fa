//! Userspace mode: the REDIRECT target in the iptables engine, and [`trace_userspace`]
//! over the portal rules kube-proxy's userspace mode writes and the proxy's table.

mod common;

use common::{external, ip, node_host, pod};
use kp_netfilter::{Ruleset, parse_save};
use kp_trace::{
    Delivery, Effect, Entry, Host, Mode, Packet, Trace, UserspaceTable, Verdict,
    portal_node_addresses, render_text, trace, trace_userspace,
};

/// The rules userspace mode writes for `default/web:http` (ClusterIP 10.96.0.10:80,
/// NodePort 30080), plus a UDP Service and a TCP Service without endpoints, and a portal
/// whose port the table does not have (a stale rule).
const RULES: &str = r#"*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-NODEPORT-CONTAINER - [0:0]
:KUBE-NODEPORT-HOST - [0:0]
:KUBE-PORTALS-CONTAINER - [0:0]
:KUBE-PORTALS-HOST - [0:0]
-A PREROUTING -m comment --comment "handle ClusterIPs; NOTE: this must be before the NodePort rules" -j KUBE-PORTALS-CONTAINER
-A PREROUTING -m addrtype --dst-type LOCAL -m comment --comment "handle service NodePorts; NOTE: this must be the last rule in the chain" -j KUBE-NODEPORT-CONTAINER
-A OUTPUT -m comment --comment "handle ClusterIPs; NOTE: this must be before the NodePort rules" -j KUBE-PORTALS-HOST
-A OUTPUT -m addrtype --dst-type LOCAL -m comment --comment "handle service NodePorts; NOTE: this must be the last rule in the chain" -j KUBE-NODEPORT-HOST
-A KUBE-PORTALS-CONTAINER -d 10.96.0.10/32 -p tcp -m comment --comment "default/web:http" -m tcp --dport 80 -j REDIRECT --to-ports 36001
-A KUBE-PORTALS-CONTAINER -d 10.96.0.53/32 -p udp -m comment --comment "kube-system/dns:dns" -m udp --dport 53 -j REDIRECT --to-ports 36003
-A KUBE-PORTALS-CONTAINER -d 10.96.0.20/32 -p tcp -m comment --comment "default/empty:http" -m tcp --dport 80 -j REDIRECT --to-ports 36004
-A KUBE-PORTALS-CONTAINER -d 10.96.0.30/32 -p tcp -m comment --comment "default/stale:http" -m tcp --dport 80 -j REDIRECT --to-ports 36009
-A KUBE-PORTALS-HOST -d 10.96.0.10/32 -p tcp -m comment --comment "default/web:http" -m tcp --dport 80 -j DNAT --to-destination 192.168.56.10:36001
-A KUBE-PORTALS-HOST -d 10.96.0.53/32 -p udp -m comment --comment "kube-system/dns:dns" -m udp --dport 53 -j DNAT --to-destination 192.168.56.10:36003
-A KUBE-NODEPORT-CONTAINER -p tcp -m comment --comment "default/web:http" -m tcp --dport 30080 -j REDIRECT --to-ports 36002
-A KUBE-NODEPORT-HOST -p tcp -m comment --comment "default/web:http" -m tcp --dport 30080 -j DNAT --to-destination 192.168.56.10:36002
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-NODEPORT-NON-LOCAL - [0:0]
-A INPUT -m comment --comment "Ensure that non-local NodePort traffic can flow" -j KUBE-NODEPORT-NON-LOCAL
-A KUBE-NODEPORT-NON-LOCAL -p tcp -m comment --comment "default/web:http" -m tcp --dport 36002 -j ACCEPT
COMMIT
"#;

const TABLE: &str = "# kube-proxy-rs userspace proxy table: protocol listen-address service-port scope affinity endpoints
TCP 0.0.0.0:36001 default/web:http internal none 10.0.1.4:80,10.0.2.5:80
TCP 0.0.0.0:36002 default/web:http external clientip:10800 10.0.1.4:80
UDP 0.0.0.0:36003 kube-system/dns:dns internal none -
TCP 0.0.0.0:36004 default/empty:http internal none -
";

fn rules() -> Ruleset {
    parse_save(RULES).expect("userspace rules parse")
}

fn table() -> UserspaceTable {
    UserspaceTable::parse(TABLE).expect("table parses")
}

fn tcp(src: &str, dst: &str, dport: u16, entry: Entry) -> Packet {
    Packet::tcp(ip(src), 40000, ip(dst), dport, entry)
}

fn us(host: &Host, p: &Packet) -> Trace {
    trace_userspace(&rules(), &table(), host, p).expect("traces")
}

/// (endpoint, probability, masquerade, verdict, delivery) of each outcome.
fn ends(t: &Trace) -> Vec<(String, f64, bool, Verdict, Delivery)> {
    t.outcomes
        .iter()
        .map(|o| {
            let to = o.dnat.map_or_else(
                || "-".to_string(),
                |(a, p)| std::net::SocketAddr::new(a, p.unwrap_or(0)).to_string(),
            );
            (
                to,
                o.probability,
                o.masquerade,
                o.verdict.clone(),
                o.delivery,
            )
        })
        .collect()
}

fn relayed(to: &str, p: f64) -> (String, f64, bool, Verdict, Delivery) {
    (
        to.to_string(),
        p,
        true,
        Verdict::Accept,
        Delivery::Forwarded,
    )
}

#[test]
fn cluster_ip_from_a_pod_is_redirected_to_the_proxy_which_picks_an_endpoint() {
    let p = tcp("10.0.0.9", "10.96.0.10", 80, pod());
    let t = us(&node_host(), &p);
    assert_eq!(t.mode, Mode::Userspace);
    assert_eq!(
        ends(&t),
        vec![relayed("10.0.1.4:80", 0.5), relayed("10.0.2.5:80", 0.5)]
    );
    assert!(!t.is_uncertain());
    for o in &t.outcomes {
        // The REDIRECT, in KUBE-PORTALS-CONTAINER, to the incoming interface's address.
        let redirect = o
            .steps
            .iter()
            .find(|s| s.chain == "KUBE-PORTALS-CONTAINER")
            .unwrap();
        assert_eq!(redirect.effect, Effect::Dnat);
        assert!(
            redirect
                .detail
                .contains("REDIRECT: destination now 192.168.56.10:36001"),
            "{}",
            redirect.detail
        );
        // Then the proxy.
        let proxy = o.steps.last().unwrap();
        assert_eq!(
            (proxy.table.as_str(), proxy.chain.as_str(), proxy.effect),
            ("userspace", "TCP 0.0.0.0:36001", Effect::Proxy)
        );
        assert!(
            proxy.detail.contains(
                "userspace proxy listener 0.0.0.0:36001 (default/web:http, ClusterIP traffic) \
                 connects to one of 2 endpoints round robin, retrying the next one if a connect \
                 fails"
            ),
            "{}",
            proxy.detail
        );
        assert_eq!(
            proxy.rule_text,
            "TCP 0.0.0.0:36001 default/web:http internal none 10.0.1.4:80,10.0.2.5:80"
        );
    }
    assert!(
        t.notes.iter().any(|n| n.contains("never the client's")),
        "{:?}",
        t.notes
    );
}

#[test]
fn the_rendered_path_shows_the_redirect_and_the_proxy() {
    let p = tcp("10.0.0.9", "10.96.0.10", 80, pod());
    let text = render_text(&us(&node_host(), &p), &p);
    let lines: Vec<&str> = text.lines().take(5).collect();
    assert_eq!(
        lines,
        [
            "packet tcp 10.0.0.9:40000 -> 10.96.0.10:80 from a pod via veth1234 (PREROUTING)",
            "nat PREROUTING  -A PREROUTING -m comment --comment \"handle ClusterIPs; NOTE: this must be before the NodePort rules\" -j KUBE-PORTALS-CONTAINER",
            "nat KUBE-PORTALS-CONTAINER  -A KUBE-PORTALS-CONTAINER -d 10.96.0.10/32 -p tcp -m comment --comment \"default/web:http\" -m tcp --dport 80 -j REDIRECT --to-ports 36001  (REDIRECT: destination now 192.168.56.10:36001 (an address of the incoming interface))",
            "filter INPUT  -A INPUT -m comment --comment \"Ensure that non-local NodePort traffic can flow\" -j KUBE-NODEPORT-NON-LOCAL",
            "filter KUBE-NODEPORT-NON-LOCAL  (no rule matched: return)",
        ],
        "{text}"
    );
    assert!(
        text.contains(
            "   50.0%  -> userspace proxy TCP 0.0.0.0:36001  connects to 10.0.1.4:80  proxied, masqueraded, filter ACCEPT\n   50.0%  -> userspace proxy TCP 0.0.0.0:36001  connects to 10.0.2.5:80  proxied, masqueraded, filter ACCEPT\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("note: userspace proxy listener 0.0.0.0:36001 (default/web:http, ClusterIP traffic) connects to one of 2 endpoints round robin, retrying the next one if a connect fails: 10.0.1.4:80 (1/2), 10.0.2.5:80 (1/2)"),
        "{text}"
    );
    let json = us(&node_host(), &p).to_json().unwrap();
    assert!(json.contains("\"mode\": \"Userspace\"") && json.contains("\"Proxy\""));
}

#[test]
fn cluster_ip_from_the_node_is_dnated_to_the_node_address_and_proxied() {
    let p = tcp("192.168.56.10", "10.96.0.10", 80, Entry::Node);
    let t = us(&node_host(), &p);
    assert_eq!(
        ends(&t),
        vec![relayed("10.0.1.4:80", 0.5), relayed("10.0.2.5:80", 0.5)]
    );
    let o = &t.outcomes[0];
    let dnat = o
        .steps
        .iter()
        .find(|s| s.chain == "KUBE-PORTALS-HOST")
        .unwrap();
    assert_eq!(dnat.effect, Effect::Dnat);
    assert!(
        dnat.detail.contains("192.168.56.10:36001"),
        "{}",
        dnat.detail
    );
    let text = render_text(&t, &p);
    assert!(
        text.contains("-> userspace proxy TCP 0.0.0.0:36001  connects to 10.0.2.5:80  proxied"),
        "{text}"
    );

    // Without the node's address the DNAT target looks like another host: the packet
    // leaves the node, with a note asking for the address; the rules name it.
    let t = us(&Host::default(), &p);
    assert_eq!(t.outcomes.len(), 1);
    assert_eq!(t.outcomes[0].delivery, Delivery::Forwarded);
    assert!(
        t.notes
            .iter()
            .any(|n| n.contains("192.168.56.10 is not one of the node's addresses")),
        "{:?}",
        t.notes
    );
    assert_eq!(
        portal_node_addresses(&rules())
            .into_iter()
            .collect::<Vec<_>>(),
        [ip("192.168.56.10")]
    );
}

#[test]
fn node_port_from_outside_goes_to_the_external_listener_with_affinity() {
    let p = tcp("203.0.113.1", "192.168.56.10", 30080, external());
    let t = us(&node_host(), &p);
    assert_eq!(ends(&t), vec![relayed("10.0.1.4:80", 1.0)]);
    let steps: Vec<(&str, Effect)> = t.outcomes[0]
        .steps
        .iter()
        .map(|s| (s.chain.as_str(), s.effect))
        .collect();
    assert_eq!(
        steps,
        [
            ("PREROUTING", Effect::Jump),
            ("KUBE-PORTALS-CONTAINER", Effect::Return),
            ("PREROUTING", Effect::Jump),
            ("KUBE-NODEPORT-CONTAINER", Effect::Dnat),
            ("INPUT", Effect::Jump),
            ("KUBE-NODEPORT-NON-LOCAL", Effect::Accept),
            ("TCP 0.0.0.0:36002", Effect::Proxy),
        ]
    );
    let proxy = t.outcomes[0].steps.last().unwrap();
    assert!(
        proxy.detail.contains("external traffic")
            && proxy
                .detail
                .contains("session affinity by client IP (10800 s)"),
        "{}",
        proxy.detail
    );
    // From the node, to its own NodePort: KUBE-NODEPORT-HOST.
    let p = tcp("192.168.56.10", "192.168.56.10", 30080, Entry::Node);
    let t = us(&node_host(), &p);
    assert_eq!(ends(&t), vec![relayed("10.0.1.4:80", 1.0)]);
    assert!(
        t.outcomes[0]
            .steps
            .iter()
            .any(|s| s.chain == "KUBE-NODEPORT-HOST" && s.effect == Effect::Dnat)
    );
}

#[test]
fn a_listener_without_endpoints_resets_tcp_and_drops_udp() {
    let p = tcp("10.0.0.9", "10.96.0.20", 80, pod());
    let t = us(&node_host(), &p);
    assert_eq!(t.outcomes.len(), 1);
    let o = &t.outcomes[0];
    assert_eq!(o.verdict, Verdict::Reject("tcp-reset".into()));
    assert_eq!(o.delivery, Delivery::Dropped);
    assert_eq!(o.steps.last().unwrap().effect, Effect::Reject);
    let text = render_text(&t, &p);
    assert!(
        text.contains(
            "rejected, not masqueraded, REJECT tcp-reset by userspace proxy TCP 0.0.0.0:36004 (no endpoints)"
        ),
        "{text}"
    );

    let p = Packet::udp(ip("10.0.0.9"), 40000, ip("10.96.0.53"), 53, pod());
    let t = us(&node_host(), &p);
    assert_eq!(t.outcomes.len(), 1);
    assert_eq!(t.outcomes[0].verdict, Verdict::Drop);
    assert_eq!(t.outcomes[0].delivery, Delivery::Dropped);
    assert!(
        t.notes.iter().any(|n| n.contains("client gets no reply")),
        "{:?}",
        t.notes
    );
    let text = render_text(&t, &p);
    assert!(
        text.contains("DROP by userspace proxy UDP 0.0.0.0:36003 (no endpoints)"),
        "{text}"
    );
}

#[test]
fn packets_that_reach_no_listener_are_kept_as_the_rules_say() {
    // A port of the ClusterIP no rule names: routed unchanged, nothing answers.
    let p = tcp("10.0.0.9", "10.96.0.10", 8080, pod());
    let t = us(&node_host(), &p);
    assert_eq!(t.outcomes.len(), 1);
    assert_eq!(t.outcomes[0].dnat, None);
    assert_eq!(t.outcomes[0].delivery, Delivery::Forwarded);
    assert!(
        t.notes
            .iter()
            .any(|n| n.contains("userspace mode exists only as REDIRECT and DNAT rules")),
        "{:?}",
        t.notes
    );

    // A portal whose port the table does not list: delivered to the node, not relayed.
    let p = tcp("10.0.0.9", "10.96.0.30", 80, pod());
    let t = us(&node_host(), &p);
    assert_eq!(t.outcomes.len(), 1);
    let o = &t.outcomes[0];
    assert_eq!(o.dnat, Some((ip("192.168.56.10"), Some(36009))));
    assert_eq!((o.delivery, o.masquerade), (Delivery::Local, false));
    assert!(o.steps.iter().all(|s| s.table != "userspace"));
    assert!(
        t.notes.iter().any(|n| n.contains(
            "the rules send the packet to 192.168.56.10:36009, but the userspace proxy table has no TCP listener there"
        )),
        "{:?}",
        t.notes
    );

    // A listener of the other protocol on the port does not take the packet.
    let p = Packet::udp(ip("10.0.0.9"), 40000, ip("192.168.56.10"), 36001, pod());
    let t = us(&node_host(), &p);
    assert_eq!(ends(&t)[0].4, Delivery::Local);
    assert!(t.outcomes[0].steps.iter().all(|s| s.table != "userspace"));

    // A client talking to the proxy's port directly is relayed too.
    let p = tcp("10.0.0.9", "192.168.56.10", 36001, pod());
    let t = us(&node_host(), &p);
    assert_eq!(t.outcomes.len(), 2);
    assert!(t.outcomes.iter().all(|o| o.masquerade));
}

#[test]
fn a_node_without_known_addresses_still_reaches_a_wildcard_listener() {
    let p = tcp("10.0.0.9", "10.96.0.10", 80, pod());
    let t = us(&Host::default(), &p);
    assert_eq!(
        ends(&t),
        vec![relayed("10.0.1.4:80", 0.5), relayed("10.0.2.5:80", 0.5)]
    );
    assert!(!t.is_uncertain(), "{:?}", t.outcomes[0].unknown);

    // A listener bound to one address: reached, but uncertain.
    let table = UserspaceTable::parse(
        "TCP 192.168.56.10:36001 default/web:http internal none 10.0.1.4:80\n",
    )
    .unwrap();
    let t = trace_userspace(&rules(), &table, &Host::default(), &p).unwrap();
    assert_eq!(ends(&t), vec![relayed("10.0.1.4:80", 1.0)]);
    assert!(t.is_uncertain());
    // With the address known it is certain, and a listener on another address is not
    // reached.
    let t = trace_userspace(&rules(), &table, &node_host(), &p).unwrap();
    assert!(!t.is_uncertain());
    assert_eq!(ends(&t), vec![relayed("10.0.1.4:80", 1.0)]);
    let other = Host::new([ip("192.168.56.11")]);
    let t = trace_userspace(&rules(), &table, &other, &p).unwrap();
    assert_eq!(ends(&t)[0].4, Delivery::Local);
    assert!(!t.outcomes[0].masquerade);
}

#[test]
fn ipv6_portals_and_listeners() {
    let rules = parse_save(
        r#"*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-PORTALS-CONTAINER - [0:0]
:KUBE-PORTALS-HOST - [0:0]
-A PREROUTING -j KUBE-PORTALS-CONTAINER
-A OUTPUT -j KUBE-PORTALS-HOST
-A KUBE-PORTALS-CONTAINER -d fd00:96::10/128 -p tcp -m comment --comment "default/web:http" -m tcp --dport 80 -j REDIRECT --to-ports 36001
-A KUBE-PORTALS-HOST -d fd00:96::10/128 -p tcp -m comment --comment "default/web:http" -m tcp --dport 80 -j REDIRECT --to-ports 36001
COMMIT
"#,
    )
    .unwrap();
    let table =
        UserspaceTable::parse("TCP [::]:36001 default/web:http internal none [fd00:10::4]:80\n")
            .unwrap();
    let host = Host::new([ip("fe80::1"), ip("fd00:56::10")]);
    let p = Packet::tcp(ip("fd00:10::9"), 40000, ip("fd00:96::10"), 80, pod());
    let t = trace_userspace(&rules, &table, &host, &p).unwrap();
    assert_eq!(ends(&t), vec![relayed("[fd00:10::4]:80", 1.0)]);
    let redirect = &t.outcomes[0].steps[1];
    assert!(
        redirect.detail.contains("[fd00:56::10]:36001"),
        "not the link-local address: {}",
        redirect.detail
    );
    // From the node (no IPv6 address in the rules: REDIRECT to ::1).
    let p = Packet::tcp(ip("fd00:56::10"), 40000, ip("fd00:96::10"), 80, Entry::Node);
    let t = trace_userspace(&rules, &table, &host, &p).unwrap();
    assert_eq!(ends(&t), vec![relayed("[fd00:10::4]:80", 1.0)]);
    assert!(
        t.outcomes[0].steps[1].detail.contains("[::1]:36001"),
        "{}",
        t.outcomes[0].steps[1].detail
    );
}

// -------------------------------------------------------------------------------------
// REDIRECT in the plain iptables engine.
// -------------------------------------------------------------------------------------

fn nat(lines: &str) -> Ruleset {
    parse_save(&format!(
        "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
         :POSTROUTING ACCEPT [0:0]\n{lines}COMMIT\n"
    ))
    .unwrap()
}

#[test]
fn redirect_in_prerouting_delivers_to_the_incoming_interface_address() {
    let r =
        nat("-A PREROUTING -d 10.96.0.1/32 -p tcp -m tcp --dport 80 -j REDIRECT --to-ports 8080\n");
    let p = tcp("10.0.0.9", "10.96.0.1", 80, pod());
    let t = trace(&r, &node_host(), &p).unwrap();
    assert_eq!(t.mode, Mode::Iptables);
    let o = &t.outcomes[0];
    assert_eq!(o.dnat, Some((ip("192.168.56.10"), Some(8080))));
    assert_eq!(o.delivery, Delivery::Local);
    assert!(!o.masquerade && !o.uncertain);
    assert!(
        t.notes
            .iter()
            .any(|n| n.contains("primary address of the interface it arrived on")),
        "{:?}",
        t.notes
    );
    let text = render_text(&t, &p);
    assert!(
        text.contains("  100.0%  -> PREROUTING  DNAT 192.168.56.10:8080  delivered locally, not masqueraded, filter ACCEPT"),
        "{text}"
    );

    // Without --to-ports the port stays.
    let r = nat("-A PREROUTING -d 10.96.0.1/32 -p tcp -j REDIRECT\n");
    let t = trace(&r, &node_host(), &p).unwrap();
    assert_eq!(t.outcomes[0].dnat, Some((ip("192.168.56.10"), Some(80))));

    // Loopback and other-family addresses are skipped.
    let host = Host::new([ip("127.0.0.1"), ip("fd00::1"), ip("192.168.56.11")]);
    let t = trace(&r, &host, &p).unwrap();
    assert_eq!(t.outcomes[0].dnat, Some((ip("192.168.56.11"), Some(80))));
}

#[test]
fn redirect_in_output_goes_to_the_loopback_address() {
    let r = nat(
        "-A OUTPUT -d 10.96.0.1/32 -p tcp -j REDIRECT --to-ports 8080\n\
         -A OUTPUT -d 10.96.0.2/32 -p tcp -j REDIRECT --to-ports 8080-8090 --random\n",
    );
    let p = tcp("192.168.56.10", "10.96.0.1", 80, Entry::Node);
    let t = trace(&r, &node_host(), &p).unwrap();
    let o = &t.outcomes[0];
    assert_eq!(o.dnat, Some((ip("127.0.0.1"), Some(8080))));
    assert_eq!(o.delivery, Delivery::Local);
    assert!(!o.uncertain);
    assert!(o.steps[0].detail.contains("the loopback address"));

    // A port range: the first port, reported unknown.
    let p = tcp("192.168.56.10", "10.96.0.2", 80, Entry::Node);
    let t = trace(&r, &node_host(), &p).unwrap();
    assert_eq!(t.outcomes[0].dnat, Some((ip("127.0.0.1"), Some(8080))));
    assert!(t.outcomes[0].uncertain);
    assert!(t.outcomes[0].unknown[0].contains("port range 8080-8090"));
}

#[test]
fn redirect_without_known_node_addresses_is_local_with_an_unknown_address() {
    let r = parse_save(
        "*nat\n:PREROUTING ACCEPT [0:0]\n\
         -A PREROUTING -d 10.96.0.1/32 -p tcp -j REDIRECT --to-ports 8080\nCOMMIT\n\
         *filter\n:INPUT ACCEPT [0:0]\n\
         -A INPUT -d 192.168.56.10/32 -p tcp -j ACCEPT\n\
         -A INPUT -m addrtype --dst-type LOCAL -j ACCEPT\nCOMMIT\n",
    )
    .unwrap();
    let p = tcp("10.0.0.9", "10.96.0.1", 80, pod());
    let t = trace(&r, &Host::default(), &p).unwrap();
    let o = &t.outcomes[0];
    assert_eq!(o.dnat, Some((ip("0.0.0.0"), Some(8080))));
    assert_eq!(o.delivery, Delivery::Local);
    // `-d 192.168.56.10` cannot be told; `--dst-type LOCAL` can.
    assert!(o.uncertain);
    assert!(
        o.unknown[0].contains("destination after REDIRECT"),
        "{:?}",
        o.unknown
    );
    assert!(
        o.steps
            .iter()
            .any(|s| s.chain == "INPUT" && s.rule_index == Some(1) && s.effect == Effect::Accept)
    );
    let text = render_text(&t, &p);
    assert!(
        text.contains("-> PREROUTING  DNAT (incoming interface's address):8080  delivered locally"),
        "{text}"
    );
}

#[test]
fn redirect_outside_nat_prerouting_and_output_is_not_evaluated() {
    let r = parse_save(
        "*nat\n:POSTROUTING ACCEPT [0:0]\n-A POSTROUTING -j REDIRECT --to-ports 1\nCOMMIT\n\
         *mangle\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -j REDIRECT --to-ports 1\nCOMMIT\n",
    )
    .unwrap();
    let p = tcp("10.0.0.9", "10.0.1.4", 80, pod());
    let t = trace(&r, &node_host(), &p).unwrap();
    assert_eq!(t.outcomes[0].dnat, None);
    assert!(t.outcomes[0].uncertain);
    assert!(
        t.outcomes[0]
            .unknown
            .iter()
            .all(|u| u.contains("target REDIRECT not evaluated")),
        "{:?}",
        t.outcomes[0].unknown
    );
}

#[test]
fn redirect_in_a_chain_called_from_prerouting_and_with_an_unknown_option() {
    let r = nat(":SVC - [0:0]\n-A PREROUTING -j SVC\n\
         -A SVC -d 10.96.0.1/32 -p tcp -j REDIRECT --to-ports 9000\n\
         -A SVC -d 10.96.0.2/32 -p tcp -j REDIRECT --bogus\n");
    let p = tcp("10.0.0.9", "10.96.0.1", 80, pod());
    let t = trace(&r, &node_host(), &p).unwrap();
    assert_eq!(t.outcomes[0].dnat, Some((ip("192.168.56.10"), Some(9000))));
    let p = tcp("10.0.0.9", "10.96.0.2", 80, pod());
    let t = trace(&r, &node_host(), &p).unwrap();
    assert!(t.outcomes[0].uncertain && t.outcomes[0].dnat.is_none());
}
