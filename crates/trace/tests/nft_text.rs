//! The nftables text reader without a kernel, on checked-in fixtures captured with nft
//! 1.0.6: for each ruleset, the `nft -f` script that was loaded, `nft list ruleset` and
//! `nft -j list ruleset` of it (`tests/data/nft/`):
//!
//! * `upstream-svc1`: upstream kube-proxy's fixed rules and one ClusterIP Service (the
//!   rules of `tests/nft.rs` and `tests/nft_json.rs`), listed with `nft -a` (handles);
//! * `every-feature`: our nftables proxier's `every_feature` render (affinity with its
//!   `numgen … vmap`, upstream's `dnat ip addr . port to numgen … map`, source ranges as
//!   `ip saddr != { … } drop`, NodePorts, services without endpoints, hairpin), as
//!   `--dry-run` prints it.
//!
//! The property: the text and the JSON of one ruleset give the same IR and the same
//! traces; the script gives the same traces. `tests/nft.rs` checks the same against the
//! kernel for every ruleset it loads.

#[path = "common/nft_compare.rs"]
mod nft_compare;

use kp_trace::nft::{
    Expr, Lit, MatchOp, NftRuleset, NftVerdict, Stmt, looks_like_json, looks_like_nft_text,
    parse_nft_json, parse_nft_text,
};
use kp_trace::{Entry, Host, Packet, TraceError, render_text, trace_nft};

fn fixture(name: &str) -> String {
    let path = format!("{}/tests/data/nft/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn ip(s: &str) -> std::net::IpAddr {
    s.parse().expect("address")
}

/// Packets that cross every part of the two fixtures: ClusterIPs with endpoints, without
/// (rejected, dropped), NodePorts, load-balancer IPs with source ranges, unallocated
/// ClusterIPs, pings, the node's own packets.
fn packets() -> Vec<Packet> {
    let pod = || Entry::Pod { iface: None };
    let ext = || Entry::External {
        iface: Some("eth0".into()),
    };
    let mut out = Vec::new();
    for (dst, port) in [
        ("172.30.0.41", 80),
        ("172.30.0.41", 81),
        ("172.30.0.99", 80),
        ("10.96.0.10", 80),
        ("10.96.0.11", 80),
        ("10.96.0.12", 80),
        ("10.96.0.13", 80),
        ("198.51.100.7", 80),
        ("203.0.113.10", 80),
        ("192.168.0.2", 3001),
        ("192.168.56.10", 30080),
        ("192.168.56.10", 30081),
    ] {
        out.push(Packet::tcp(ip("10.0.0.9"), 40000, ip(dst), port, pod()));
        out.push(Packet::tcp(ip("203.0.113.1"), 40000, ip(dst), port, ext()));
        out.push(Packet::tcp(
            ip("192.168.56.10"),
            40000,
            ip(dst),
            port,
            Entry::Node,
        ));
    }
    let mut udp = Packet::tcp(ip("10.0.0.9"), 40000, ip("10.96.0.10"), 9125, pod());
    udp.proto = kp_trace::Proto::Udp;
    out.push(udp);
    out.push(Packet::ping(ip("10.0.0.9"), ip("172.30.0.41"), pod()));
    out
}

fn host() -> Host {
    Host::new([ip("192.168.0.2"), ip("192.168.56.10")])
}

/// Every packet's trace, rendered.
fn traces(rules: &NftRuleset) -> Vec<String> {
    packets()
        .iter()
        .map(|p| {
            let t = trace_nft(rules, &host(), p).expect("traces");
            render_text(&t, p)
        })
        .collect()
}

/// Panics at the first line where two lists of traces differ.
fn same_traces(a: &[String], b: &[String], name: &str) {
    for (ta, tb) in a.iter().zip(b) {
        for (la, lb) in ta.lines().zip(tb.lines()) {
            assert_eq!(la, lb, "{name}: first differing line of\n{ta}\n---\n{tb}");
        }
        assert_eq!(
            ta.lines().count(),
            tb.lines().count(),
            "{name}:\n{ta}\n---\n{tb}"
        );
    }
    assert_eq!(a.len(), b.len());
}

#[test]
fn list_ruleset_text_and_json_give_the_same_ir_and_traces() {
    for name in ["upstream-svc1", "every-feature"] {
        let text = fixture(&format!("{name}.nft"));
        assert!(
            looks_like_nft_text(&text) && !looks_like_json(&text),
            "{name}"
        );
        let from_text = parse_nft_text(&text).expect("the text parses");
        let from_json = parse_nft_json(&fixture(&format!("{name}.json"))).expect("JSON parses");
        assert!(from_text.has_kube_proxy(), "{name}");
        if let Some(d) = nft_compare::first_difference(&from_text, &from_json, false) {
            panic!("{name}: the text and the JSON differ: {d}");
        }
        if text.contains("# handle ") {
            // `nft -a list ruleset`: the same handles, so the very same traces.
            let handles = |rs: &NftRuleset| {
                rs.tables
                    .iter()
                    .flat_map(|t| t.chains.values())
                    .map(|c| {
                        (
                            c.handle,
                            c.rules.iter().map(|r| r.handle).collect::<Vec<_>>(),
                        )
                    })
                    .collect::<Vec<_>>()
            };
            assert_eq!(handles(&from_text), handles(&from_json), "{name}");
            assert!(
                handles(&from_text).iter().all(|(c, _)| c.is_some()),
                "{name}"
            );
            same_traces(&traces(&from_text), &traces(&from_json), name);
        } else {
            same_traces(&named(traces(&from_text)), &named(traces(&from_json)), name);
        }
    }
}

/// The traces with their rules' names made equal ([`nft_compare::without_rule_names`]).
fn named(traces: Vec<String>) -> Vec<String> {
    traces
        .iter()
        .map(|t| nft_compare::without_rule_names(t))
        .collect()
}

#[test]
fn the_script_nft_loads_traces_like_its_listing() {
    for name in ["upstream-svc1", "every-feature"] {
        let script = fixture(&format!("{name}.script.nft"));
        assert!(looks_like_nft_text(&script), "{name}");
        let from_script = parse_nft_text(&script).expect("the script parses");
        let from_json = parse_nft_json(&fixture(&format!("{name}.json"))).expect("JSON parses");
        same_traces(
            &named(traces(&from_script)),
            &named(traces(&from_json)),
            name,
        );
    }
}

#[test]
fn the_every_feature_trace_reaches_the_endpoints_through_the_text() {
    let rules = parse_nft_text(&fixture("every-feature.nft")).unwrap();
    let p = Packet::tcp(
        ip("10.0.0.9"),
        40000,
        ip("10.96.0.10"),
        80,
        Entry::Pod { iface: None },
    );
    let t = trace_nft(&rules, &host(), &p).unwrap();
    let out = render_text(&t, &p);
    assert_eq!(t.outcomes.len(), 2, "{out}");
    assert!(out.contains("DNAT 10.0.1.4:8080"), "{out}");
    assert!(out.contains("DNAT 10.0.2.5:8080"), "{out}");
    // Upstream's `dnat ip addr . port to numgen random mod 2 map { … }`, as `nft list`
    // prints it (`dnat ip to numgen …`): one branch per endpoint, 50% each.
    let p = Packet::tcp(
        ip("10.0.0.9"),
        40000,
        ip("10.96.0.13"),
        80,
        Entry::Pod { iface: None },
    );
    let t = trace_nft(&rules, &host(), &p).unwrap();
    let out = render_text(&t, &p);
    assert_eq!(t.outcomes.len(), 2, "{out}");
    for o in &t.outcomes {
        assert!((o.probability - 0.5).abs() < 1e-9, "{out}");
    }
    assert!(out.contains("DNAT 10.0.1.7:8080"), "{out}");
    assert!(out.contains("DNAT 10.0.2.7:8080"), "{out}");
    // `ip saddr != { ranges } drop`: a source outside the ranges is dropped before DNAT.
    let p = Packet::tcp(
        ip("198.18.0.1"),
        40000,
        ip("198.51.100.7"),
        80,
        Entry::External {
            iface: Some("eth0".into()),
        },
    );
    let t = trace_nft(&rules, &host(), &p).unwrap();
    assert!(
        t.outcomes
            .iter()
            .all(|o| o.verdict == kp_trace::Verdict::Drop),
        "{}",
        render_text(&t, &p)
    );
}

#[test]
fn statements_are_typed_like_the_json() {
    let rs = parse_nft_text(
        "table ip t {\n\
         \tset s {\n\t\ttype ipv4_addr\n\t\tflags interval\n\t\telements = { 10.0.0.0/8, 192.168.1.1-192.168.1.5 }\n\t}\n\
         \tchain c {\n\
         \t\ttype filter hook input priority filter + 5; policy drop;\n\
         \t\tct state established,related accept\n\
         \t\tmeta mark & 0x00004000 == 0x00000000 return\n\
         \t\tip saddr . tcp dport { 10.0.0.9 . 53, 10.0.0.10 . 1000-2000 } counter packets 3 bytes 180 drop\n\
         \t\tip6 daddr != ::1 reject with icmpv6 admin-prohibited\n\
         \t\tfib daddr . iif type != local log prefix \"x: \" level info\n\
         \t\tmeta l4proto tcp snat to 192.168.1.1:1000-2000 persistent comment \"a rule\"\n\
         \t}\n\
         }\n",
    )
    .expect("parses");
    let t = &rs.tables[0];
    assert_eq!(t.sets["s"].elements.len(), 2);
    let c = &t.chains["c"];
    let base = c.base.as_ref().unwrap();
    assert_eq!((base.priority, base.policy.as_str()), (5, "drop"));
    let r = |i: usize| &c.rules[i].stmts;
    assert!(matches!(
        &r(0)[0],
        Stmt::Match { op: MatchOp::In, right: Expr::Lit(Lit::List(l)), .. } if l.len() == 2
    ));
    assert!(matches!(
        &r(1)[0],
        Stmt::Match {
            op: MatchOp::Eq,
            left: Expr::Binary { .. },
            right: Expr::Lit(Lit::Num(0))
        }
    ));
    assert_eq!(r(1)[1], Stmt::Verdict(NftVerdict::Return));
    assert!(
        matches!(&r(2)[0], Stmt::Match { left: Expr::Concat(p), right: Expr::Lit(Lit::Set(e)), .. } if p.len() == 2 && e.len() == 2)
    );
    assert_eq!(r(2)[1], Stmt::Counter);
    assert!(matches!(
        &r(3)[1],
        Stmt::Reject { kind: Some(k), code: Some(c) } if k == "icmpv6" && c == "admin-prohibited"
    ));
    assert!(
        matches!(&r(4)[0], Stmt::Match { op: MatchOp::Ne, left: Expr::Fib { flags, .. }, .. } if flags.len() == 2)
    );
    assert!(matches!(&r(4)[1], Stmt::Log { prefix: Some(p) } if p == "x: "));
    assert!(matches!(
        &r(5)[1],
        Stmt::Nat { port: Some(Expr::Lit(Lit::Range(..))), flags, .. } if flags == &["persistent"]
    ));
    assert_eq!(c.rules[5].comment.as_deref(), Some("a rule"));
}

#[test]
fn unknown_statements_are_kept_as_unknown_rules() {
    let rs = parse_nft_text(
        "add table inet f\n\
         add chain inet f c { type filter hook forward priority 0 ; }\n\
         add rule inet f c ip daddr 9.9.9.9 limit rate 10/second drop comment \"limited\"\n\
         add rule inet f c jhash ip saddr mod 2 0 drop\n\
         add rule inet f c tcp dport 22 accept\n",
    )
    .expect("unknown statements do not fail the file");
    let c = &rs.tables[0].chains["c"];
    assert_eq!(c.rules.len(), 3);
    assert!(matches!(&c.rules[0].stmts[0], Stmt::Match { .. }));
    assert!(matches!(
        &c.rules[0].stmts[1],
        Stmt::Unknown { name, json } if name == "limit" && json == "limit rate 10/second drop"
    ));
    assert_eq!(c.rules[0].comment.as_deref(), Some("limited"));
    assert!(matches!(&c.rules[1].stmts[0], Stmt::Unknown { name, .. } if name == "jhash"));
    assert_eq!(c.rules[2].stmts[1], Stmt::Verdict(NftVerdict::Accept));
    // The tracer reports the unknown rule, and goes on.
    let p = Packet::tcp(
        ip("10.0.0.9"),
        40000,
        ip("9.9.9.9"),
        80,
        Entry::Pod { iface: None },
    );
    let t = trace_nft(&rs, &host(), &p).unwrap();
    assert!(t.outcomes[0].uncertain);
    assert!(
        t.outcomes[0].unknown.iter().any(|u| u.contains("limit")),
        "{:?}",
        t.outcomes[0].unknown
    );
}

#[test]
fn commands_apply_in_order() {
    let rs = parse_nft_text(
        "add table ip t\n\
         add chain ip t a\n\
         add chain ip t b\n\
         add rule ip t a tcp dport 1 accept\n\
         add rule ip t a tcp dport 2 accept\n\
         insert rule ip t a tcp dport 0 accept\n\
         add set ip t s { type ipv4_addr ; }\n\
         add element ip t s { 10.0.0.1, 10.0.0.2 }\n\
         delete element ip t s { 10.0.0.1 }\n\
         flush chain ip t a\n\
         add rule ip t a tcp dport 3 accept\n\
         delete chain ip t b\n\
         add table ip gone\n\
         delete table ip gone\n",
    )
    .expect("parses");
    assert_eq!(rs.tables.len(), 1);
    let t = &rs.tables[0];
    assert_eq!(t.chains.keys().collect::<Vec<_>>(), ["a"]);
    assert_eq!(t.chains["a"].rules.len(), 1);
    assert_eq!(t.sets["s"].elements.len(), 1);
    assert_eq!(t.sets["s"].elements[0].key, Lit::Str("10.0.0.2".into()));

    let rs = parse_nft_text(
        "add table ip t\nadd chain ip t a\nadd rule ip t a accept\ninsert rule ip t a drop\n",
    )
    .unwrap();
    assert_eq!(
        rs.tables[0].chains["a"].rules[0].stmts,
        [Stmt::Verdict(NftVerdict::Drop)]
    );
}

#[test]
fn structural_problems_name_the_line() {
    let cases = [
        (
            "add table ip t\nadd rule ip t nochain accept\n",
            2,
            "nochain",
        ),
        (
            "add table ip t\nfrobnicate ip t\n",
            2,
            "unknown command `frobnicate'",
        ),
        ("table ip t {\n\tchain c {\n\t\taccept\n", 3, "never closed"),
        (
            "add chain ip missing c\n",
            1,
            "table ip missing does not exist",
        ),
        (
            "add table ip t\nadd element ip t s { 1.2.3.4 }\n",
            2,
            "set s",
        ),
        (
            "add table ip t\nadd chain ip t c\ndelete rule ip t c handle 4\n",
            3,
            "handles",
        ),
    ];
    for (text, line, needle) in cases {
        match parse_nft_text(text) {
            Err(TraceError::NftText { line: l, message }) => {
                assert_eq!(l, line, "{text}: {message}");
                assert!(message.contains(needle), "{text}: {message}");
            }
            other => panic!("{text}: {other:?}"),
        }
    }
    assert!(!looks_like_nft_text("*nat\n:PREROUTING ACCEPT [0:0]\n"));
    assert!(looks_like_nft_text(
        "# IPv4: nft -f input\nadd table ip kube-proxy\n"
    ));
}
