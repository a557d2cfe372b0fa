//! Traces of the seed cluster's rules (`examples/seed-nginx/expected-iptables-save.txt`):
//! `default/nginx-svc`, ClusterIP 10.96.138.71:8080/TCP, endpoints 10.0.0.4:80 and
//! 10.0.1.2:80, cluster CIDR 10.0.0.0/16, node k8s-master 192.168.56.10.

mod common;

use common::*;
use kp_trace::{Delivery, Effect, Entry, Packet, Verdict, render_text, trace};

const VIP: &str = "10.96.138.71";

fn endpoints(t: &kp_trace::Trace) -> Vec<(String, bool)> {
    t.outcomes
        .iter()
        .map(|o| {
            let (ip, port) = o.dnat.expect("DNAT");
            (format!("{ip}:{}", port.expect("port")), o.masquerade)
        })
        .collect()
}

#[test]
fn clusterip_from_external_client_balances_and_masquerades() {
    let p = Packet::tcp(ip("192.168.56.100"), 40000, ip(VIP), 8080, external());
    let t = trace(&seed(), &node_host(), &p).unwrap();
    println!("{}", render_text(&t, &p));
    assert_eq!(
        endpoints(&t),
        [("10.0.0.4:80".into(), true), ("10.0.1.2:80".into(), true)]
    );
    for o in &t.outcomes {
        assert!((o.probability - 0.5).abs() < 1e-9);
        assert_eq!(o.verdict, Verdict::Accept);
        assert_eq!(o.delivery, Delivery::Forwarded);
        assert_eq!(o.mark, 0, "KUBE-POSTROUTING clears the masquerade bit");
        assert!(!o.uncertain, "{:?}", o.unknown);
        // KUBE-FORWARD accepts the marked packet.
        assert!(o.steps.iter().any(|s| s.chain == "KUBE-FORWARD"
            && s.effect == Effect::Accept
            && s.rule_text.contains("--mark 0x4000/0x4000")));
        assert!(o.steps.iter().any(|s| s.effect == Effect::Masquerade));
    }
    let summary = t.summary();
    assert_eq!(summary.len(), 2);
    assert!(summary.iter().all(|(d, p, masq, v)| d.dnat
        && (*p - 0.5).abs() < 1e-9
        && *masq
        && *v == Verdict::Accept));

    let text = render_text(&t, &p);
    assert!(text.starts_with(
        "packet tcp 192.168.56.100:40000 -> 10.96.138.71:8080 from external via eth0 (PREROUTING)\n"
    ));
    assert!(text.contains(
        "nat KUBE-SERVICES  -A KUBE-SERVICES -d 10.96.138.71/32 -p tcp -m comment --comment \
         \"default/nginx-svc cluster IP\" -m tcp --dport 8080 -j KUBE-SVC-HL5LMXD5JFHQZ6LN\n"
    ));
    assert!(text.contains(
        "   50.0%  -> KUBE-SEP-GS5MQAG4332XHLUZ  DNAT 10.0.0.4:80  forwarded, masqueraded, filter ACCEPT\n"
    ));
    assert!(text.contains(
        "   50.0%  -> KUBE-SEP-H5CTQI4CMO4ES5BQ  DNAT 10.0.1.2:80  forwarded, masqueraded, filter ACCEPT\n"
    ));
    let json = t.to_json().unwrap();
    assert!(json.contains("\"table\": \"nat\""));
    assert!(json.contains("\"effect\": \"Dnat\""));
}

#[test]
fn clusterip_from_pod_is_not_masqueraded() {
    let p = Packet::tcp(ip("10.0.1.5"), 40000, ip(VIP), 8080, pod());
    let t = trace(&seed(), &node_host(), &p).unwrap();
    assert_eq!(
        endpoints(&t),
        [("10.0.0.4:80".into(), false), ("10.0.1.2:80".into(), false)]
    );
    for o in &t.outcomes {
        assert_eq!(o.verdict, Verdict::Accept);
        assert_eq!(o.delivery, Delivery::Forwarded);
        assert!(!o.uncertain);
        assert!(
            o.steps
                .iter()
                .any(|s| s.chain == "FORWARD" && s.effect == Effect::Policy)
        );
    }
}

#[test]
fn hairpin_pod_reaching_itself_is_masqueraded() {
    let p = Packet::tcp(ip("10.0.0.4"), 40000, ip(VIP), 8080, pod());
    let t = trace(&seed(), &node_host(), &p).unwrap();
    assert_eq!(
        endpoints(&t),
        [("10.0.0.4:80".into(), true), ("10.0.1.2:80".into(), false)]
    );
}

#[test]
fn clusterip_from_node_reaches_both_endpoints() {
    let p = Packet::tcp(ip("192.168.56.10"), 40000, ip(VIP), 8080, Entry::Node);
    let t = trace(&seed(), &node_host(), &p).unwrap();
    println!("{}", render_text(&t, &p));
    assert_eq!(
        endpoints(&t),
        [("10.0.0.4:80".into(), true), ("10.0.1.2:80".into(), true)]
    );
    for o in &t.outcomes {
        assert_eq!(o.delivery, Delivery::Forwarded);
        assert_eq!(o.verdict, Verdict::Accept);
        assert_eq!(o.steps[0].chain, "OUTPUT");
        assert!(o.steps.iter().any(|s| s.chain == "KUBE-FIREWALL"));
        assert!(!o.uncertain);
    }
}

#[test]
fn ping_to_clusterip_is_routed_unchanged() {
    for entry in [external(), pod(), Entry::Node] {
        let src = if entry == Entry::Node {
            "192.168.56.10"
        } else {
            "192.168.56.100"
        };
        let p = Packet::ping(ip(src), ip(VIP), entry);
        let t = trace(&seed(), &node_host(), &p).unwrap();
        println!("{}", render_text(&t, &p));
        assert_eq!(t.outcomes.len(), 1);
        let o = &t.outcomes[0];
        assert_eq!(o.dnat, None);
        assert!(!o.masquerade);
        assert_eq!(o.verdict, Verdict::Accept);
        assert_eq!(o.delivery, Delivery::Forwarded);
        assert!(!o.uncertain);
        // KUBE-SERVICES was entered and nothing in it matched.
        assert!(o.steps.iter().any(|s| s.chain == "KUBE-SERVICES"
            && s.effect == Effect::Return
            && s.rule_index.is_none()));
        let note = t.notes.iter().find(|n| n.starts_with("no DNAT")).unwrap();
        assert!(note.contains("tcp dport 8080"), "{note}");
        assert!(note.contains("cannot be pinged"), "{note}");
        let text = render_text(&t, &p);
        // A ping from the node is sent out, not forwarded.
        let how = if p.entry == Entry::Node {
            "sent out"
        } else {
            "forwarded"
        };
        assert!(
            text.contains(&format!(
                "  100.0%  no DNAT (10.96.138.71 unchanged)  {how}"
            )),
            "{text}"
        );
    }
}

#[test]
fn port_not_served_is_not_translated() {
    let p = Packet::tcp(ip("192.168.56.100"), 40000, ip(VIP), 80, external());
    let t = trace(&seed(), &node_host(), &p).unwrap();
    assert_eq!(t.outcomes.len(), 1);
    assert_eq!(t.outcomes[0].dnat, None);
    assert_eq!(t.outcomes[0].delivery, Delivery::Forwarded);
    let note = t.notes.iter().find(|n| n.starts_with("no DNAT")).unwrap();
    assert!(note.contains("tcp dport 8080"), "{note}");
    assert!(note.contains("no answer"), "{note}");
}

#[test]
fn partial_seed_dump_is_completed() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/seed-nginx/expected-iptables-save.txt"
    ))
    .unwrap();
    assert!(
        kp_netfilter::parse_save(&text).is_err(),
        "the seed is partial"
    );
    let rs = seed();
    let rules = text.lines().filter(|l| l.starts_with("-A ")).count();
    assert_eq!(rs.rule_count(), rules);
    assert!(
        rs.chain(kp_netfilter::Table::Filter, "KUBE-PROXY-FIREWALL")
            .is_some()
    );
}

/// The seed's lines without the jumps from the built-in chains (what
/// `iptables-save | grep KUBE-` style pastes look like).
fn seed_without_builtin_jumps() -> kp_netfilter::Ruleset {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/seed-nginx/expected-iptables-save.txt"
    ))
    .expect("seed file");
    let stripped: String = text
        .lines()
        .filter(|l| {
            !["PREROUTING", "OUTPUT", "POSTROUTING", "INPUT", "FORWARD"]
                .iter()
                .any(|c| l.starts_with(&format!("-A {c} ")))
        })
        .map(|l| format!("{l}\n"))
        .collect();
    load(&stripped)
}

#[test]
fn without_builtin_jumps_nothing_is_reached_and_the_note_says_so() {
    let rules = seed_without_builtin_jumps();
    let p = Packet::tcp(ip("192.168.56.100"), 40000, ip(VIP), 8080, external());
    let t = trace(&rules, &node_host(), &p).unwrap();
    println!("{}", render_text(&t, &p));
    assert_eq!(t.outcomes[0].dnat, None);
    let note = t.notes.iter().find(|n| n.starts_with("no DNAT")).unwrap();
    // Never "only match tcp dport 8080 ..., which this tcp packet does not".
    assert!(
        !t.notes
            .iter()
            .any(|n| n.contains("which this tcp packet does not"))
    );
    assert!(note.contains("in KUBE-SERVICES"), "{note}");
    assert!(note.contains("never reaches from nat PREROUTING"), "{note}");
}

#[test]
fn completing_kube_proxys_jumps_gives_the_full_dumps_outcomes() {
    let mut rules = seed_without_builtin_jumps();
    let added = kp_netfilter::complete_kube_proxy_jumps(&mut rules);
    assert!(
        added
            .iter()
            .any(|a| a.starts_with("nat PREROUTING: ") && a.ends_with("-j KUBE-SERVICES")),
        "{added:?}"
    );
    for (src, entry, dport) in [
        ("192.168.56.100", external(), 8080),
        ("10.0.0.9", pod(), 8080),
        ("192.168.56.10", Entry::Node, 8080),
        ("192.168.56.100", external(), 80),
    ] {
        let p = Packet::tcp(ip(src), 40000, ip(VIP), dport, entry);
        let full = trace(&seed(), &node_host(), &p).unwrap();
        let partial = trace(&rules, &node_host(), &p).unwrap();
        let ends = |t: &kp_trace::Trace| {
            t.outcomes
                .iter()
                .map(|o| {
                    (
                        o.dnat,
                        o.masquerade,
                        o.delivery,
                        o.verdict.clone(),
                        o.uncertain,
                    )
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(ends(&full), ends(&partial), "{}", render_text(&partial, &p));
    }
}
