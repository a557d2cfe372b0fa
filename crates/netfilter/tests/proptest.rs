//! Property tests: `parse_save(ruleset.to_string()) == ruleset` for generated rulesets
//! in canonical form, and no parser (nor the fake) panics on arbitrary input.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use kp_netfilter::*;
use proptest::collection::{btree_set, vec};
use proptest::option;
use proptest::prelude::*;

fn chain_name() -> impl Strategy<Value = String> {
    "[A-Z][A-Z0-9_-]{0,27}".prop_filter("not a target", |n| !is_target_name(n))
}

fn ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<u32>().prop_map(|v| IpAddr::V4(Ipv4Addr::from(v))),
        any::<u128>().prop_map(|v| IpAddr::V6(Ipv6Addr::from(v))),
    ]
}

fn cidr() -> impl Strategy<Value = Cidr> {
    (ip(), 0u8..=128).prop_map(|(a, p)| {
        let max = if a.is_ipv4() { 32 } else { 128 };
        Cidr::new(a, p % (max + 1)).expect("valid prefix")
    })
}

fn iface() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9.]{0,13}\\+?"
}

fn port_range() -> impl Strategy<Value = PortRange> {
    (any::<u16>(), any::<u16>()).prop_map(|(a, b)| PortRange {
        first: a.min(b),
        last: a.max(b),
    })
}

fn neg<T: std::fmt::Debug + Clone>(
    s: impl Strategy<Value = T>,
) -> impl Strategy<Value = Negatable<T>> {
    (any::<bool>(), s).prop_map(|(negated, value)| Negatable { negated, value })
}

fn port_match() -> impl Strategy<Value = PortMatch> {
    let p = || option::of(neg(port_range().prop_filter("not full", |r| !r.is_full())));
    (p(), p()).prop_map(|(sport, dport)| PortMatch { sport, dport })
}

/// Free text without line breaks (comments may contain anything else).
fn text() -> impl Strategy<Value = String> {
    "[^\n\r]{0,40}"
}

fn plain_word() -> impl Strategy<Value = String> {
    "[A-Za-z0-9_][A-Za-z0-9_.:,/=-]{0,15}"
}

fn kinds<T: Ord + Copy + std::fmt::Debug + 'static>(
    all: Vec<T>,
) -> impl Strategy<Value = BTreeSet<T>> {
    btree_set(proptest::sample::select(all), 1..4)
}

const GENERAL_LONG: &[&str] = &[
    "--source",
    "--src",
    "--destination",
    "--dst",
    "--in-interface",
    "--out-interface",
    "--protocol",
    "--fragment",
    "--match",
    "--jump",
    "--goto",
    "--set-counters",
];

fn module() -> impl Strategy<Value = Match> {
    let states = vec![
        ConnState::Invalid,
        ConnState::New,
        ConnState::Related,
        ConnState::Established,
        ConnState::Untracked,
        ConnState::Snat,
        ConnState::Dnat,
    ];
    let statuses = vec![
        CtStatus::Expected,
        CtStatus::SeenReply,
        CtStatus::Assured,
        CtStatus::Confirmed,
    ];
    let addr_kinds = vec![
        AddrKind::Unspec,
        AddrKind::Unicast,
        AddrKind::Local,
        AddrKind::Broadcast,
        AddrKind::Anycast,
        AddrKind::Multicast,
        AddrKind::Blackhole,
        AddrKind::Unreachable,
        AddrKind::Prohibit,
        AddrKind::Throw,
        AddrKind::Nat,
        AddrKind::Xresolve,
    ];
    let states2 = states.clone();
    prop_oneof![
        "[^\n\r]{0,60}".prop_map(Match::Comment),
        port_match().prop_map(Match::Tcp),
        port_match().prop_map(Match::Udp),
        port_match().prop_map(Match::Sctp),
        (
            proptest::sample::select(vec![
                MultiportKind::Source,
                MultiportKind::Destination,
                MultiportKind::Either
            ]),
            vec(port_range(), 1..8), // at most 7 ranges = 14 of the 15 slots
            any::<bool>()
        )
            .prop_map(|(kind, ports, negated)| Match::Multiport(Multiport {
                kind,
                ports,
                negated
            })),
        (0u32..=(1 << 31), any::<bool>()).prop_map(|(p, negated)| Match::Statistic(Statistic {
            mode: StatisticMode::Random {
                probability: Probability(p)
            },
            negated
        })),
        (1u32..1000, any::<u32>(), any::<bool>()).prop_map(|(every, p, negated)| {
            Match::Statistic(Statistic {
                mode: StatisticMode::Nth {
                    every,
                    packet: p % every,
                },
                negated,
            })
        }),
        (any::<u32>(), any::<u32>(), any::<bool>()).prop_map(|(value, mask, negated)| Match::Mark(
            MarkMatch {
                value,
                mask,
                negated
            }
        )),
        (
            option::of(neg(kinds(states))),
            option::of(neg(kinds(statuses)))
        )
            .prop_filter("one option", |(a, b)| a.is_some() || b.is_some())
            .prop_map(|(state, status)| Match::Conntrack(Conntrack { state, status })),
        (kinds(states2[..5].to_vec()), any::<bool>())
            .prop_map(|(states, negated)| Match::State(StateMatch { states, negated })),
        (
            option::of(neg(kinds(addr_kinds.clone()))),
            option::of(neg(kinds(addr_kinds))),
            0u8..3
        )
            .prop_map(|(src, dst, limit)| Match::AddrType(AddrType {
                src,
                dst,
                limit_iface_in: limit == 1,
                limit_iface_out: limit == 2,
            })),
        (
            any::<bool>(),
            proptest::sample::select(vec![
                RecentCommand::Set,
                RecentCommand::Check,
                RecentCommand::Update,
                RecentCommand::Remove
            ]),
            option::of(1u32..100_000),
            any::<bool>(),
            option::of(1u32..100),
            any::<bool>(),
            "[A-Za-z0-9_][A-Za-z0-9_-]{0,19}",
            ip(),
            any::<bool>(),
        )
            .prop_map(
                |(negated, command, seconds, reap, hitcount, rttl, name, mask, dest)| {
                    Match::Recent(Recent {
                        negated,
                        command,
                        reap: reap && seconds.is_some(),
                        seconds,
                        hitcount,
                        rttl,
                        name,
                        mask: Some(mask),
                        side: if dest {
                            RecentSide::Dest
                        } else {
                            RecentSide::Source
                        },
                    })
                }
            ),
        (
            "[A-Za-z0-9_][A-Za-z0-9_-]{0,19}",
            vec(
                proptest::sample::select(vec![SetFlag::Src, SetFlag::Dst]),
                1..4
            ),
            any::<bool>()
        )
            .prop_map(|(name, flags, negated)| Match::Set(SetMatch {
                name,
                flags,
                negated
            })),
        text().prop_map(|name| Match::Nfacct { name }),
        (
            option::of(any::<bool>()),
            option::of(neg("[a-z][a-z0-9]{0,14}")),
            option::of(any::<bool>()),
            option::of(neg("[a-z][a-z0-9]{0,14}")),
            option::of(any::<bool>())
        )
            .prop_map(|(is_in, physdev_in, is_out, physdev_out, is_bridged)| {
                Physdev {
                    is_in,
                    physdev_in,
                    is_out,
                    physdev_out,
                    is_bridged,
                }
            })
            .prop_filter("one option", |p| *p != Physdev::default())
            .prop_map(Match::Physdev),
        (
            proptest::sample::select(vec!["limit", "length", "hashlimit", "u32", "owner"]),
            vec(
                prop_oneof![
                    "--[a-z][a-z-]{0,10}".prop_filter("not a general option", |s| {
                        // `-s`/`--src`/`--jump`... belong to the rule, not the module
                        // (iptables has the same grouping).
                        !GENERAL_LONG.contains(&s.as_str())
                    }),
                    plain_word(),
                    text().prop_filter("not an option", |s| !s.starts_with('-') && s != "!"),
                ],
                0..5
            )
        )
            .prop_map(|(module, args)| Match::Unknown {
                module: module.to_string(),
                args
            }),
    ]
}

fn nat_target() -> impl Strategy<Value = NatTarget> {
    let addrs = prop_oneof![
        (any::<u32>(), any::<u32>())
            .prop_map(|(a, b)| { (IpAddr::V4(Ipv4Addr::from(a)), IpAddr::V4(Ipv4Addr::from(b))) }),
        (any::<u128>(), any::<u128>())
            .prop_map(|(a, b)| { (IpAddr::V6(Ipv6Addr::from(a)), IpAddr::V6(Ipv6Addr::from(b))) }),
        ip().prop_map(|a| (a, a)),
    ];
    (
        option::of(addrs),
        option::of(port_range()),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_filter("addr or port", |(a, p, ..)| a.is_some() || p.is_some())
        .prop_map(
            |(addrs, ports, random, random_fully, persistent)| NatTarget {
                to: NatRange { addrs, ports },
                random,
                random_fully,
                persistent,
            },
        )
}

fn target(chains: Vec<String>) -> impl Strategy<Value = Target> {
    let chains2 = chains.clone();
    prop_oneof![
        Just(Target::Accept),
        Just(Target::Drop),
        Just(Target::Return),
        proptest::sample::select(chains).prop_map(Target::Jump),
        proptest::sample::select(chains2).prop_map(Target::Goto),
        proptest::sample::select(vec![
            "icmp-port-unreachable",
            "tcp-reset",
            "icmp6-adm-prohibited",
            "icmp-admin-prohibited"
        ])
        .prop_map(|w| Target::Reject {
            with: Some(w.to_string())
        }),
        nat_target().prop_map(Target::Dnat),
        nat_target().prop_map(Target::Snat),
        (option::of(port_range()), any::<bool>(), any::<bool>()).prop_map(
            |(to_ports, random, random_fully)| Target::Masquerade {
                to_ports,
                random,
                random_fully
            }
        ),
        (any::<u32>(), any::<u32>()).prop_map(|(value, mask)| Target::Mark { value, mask }),
        (
            proptest::sample::select(vec!["LOG", "CT", "NOTRACK", "NFLOG", "TCPMSS"]),
            vec(plain_word(), 0..4)
        )
            .prop_map(|(name, args)| Target::Unknown {
                name: name.to_string(),
                args
            }),
    ]
}

fn general() -> impl Strategy<Value = Vec<Match>> {
    (
        option::of((cidr(), any::<bool>())),
        option::of((cidr(), any::<bool>())),
        option::of((iface(), any::<bool>())),
        option::of((iface(), any::<bool>())),
        option::of((1u8..=255, any::<bool>())),
        option::of(any::<bool>()),
    )
        .prop_map(|(s, d, i, o, p, f)| {
            let mut m = Vec::new();
            if let Some((net, negated)) = s.filter(|(n, neg)| *neg || !n.is_any()) {
                m.push(Match::Source { net, negated });
            }
            if let Some((net, negated)) = d.filter(|(n, neg)| *neg || !n.is_any()) {
                m.push(Match::Destination { net, negated });
            }
            if let Some((name, negated)) = i {
                m.push(Match::InInterface { name, negated });
            }
            if let Some((name, negated)) = o {
                m.push(Match::OutInterface { name, negated });
            }
            if let Some((p, negated)) = p {
                m.push(Match::Protocol {
                    proto: Protocol(p),
                    negated,
                });
            }
            if let Some(negated) = f {
                m.push(Match::Fragment { negated });
            }
            m
        })
}

fn rule(chain: String, chains: Vec<String>) -> impl Strategy<Value = Rule> {
    (
        general(),
        vec(module(), 0..4),
        option::of(target(chains)),
        option::of((any::<u64>(), any::<u64>())),
    )
        .prop_map(move |(mut matches, modules, target, counters)| {
            matches.extend(modules);
            Rule {
                chain: chain.clone(),
                matches,
                target,
                counters: counters.map(|(packets, bytes)| Counters { packets, bytes }),
                line: 0,
            }
        })
}

fn table_rules(table: Table) -> impl Strategy<Value = TableRules> {
    (
        btree_set(chain_name(), 1..4),
        vec(
            (
                proptest::sample::select(vec!["ACCEPT", "DROP"]),
                any::<u32>(),
                any::<u32>(),
            ),
            table.builtin_chains().len(),
        ),
    )
        .prop_flat_map(move |(users, policies)| {
            let users: Vec<String> = users
                .into_iter()
                .filter(|n| !table.is_builtin_chain(n))
                .collect();
            let mut names: Vec<(String, Option<(String, Counters)>)> = table
                .builtin_chains()
                .iter()
                .zip(policies)
                .map(|(n, (p, a, b))| {
                    (
                        n.to_string(),
                        Some((
                            p.to_string(),
                            Counters {
                                packets: a.into(),
                                bytes: b.into(),
                            },
                        )),
                    )
                })
                .collect();
            names.extend(users.iter().map(|u| (u.clone(), None)));
            let targets = if users.is_empty() {
                vec!["SOME-CHAIN".to_string()]
            } else {
                users.clone()
            };
            let per_chain: Vec<_> = names
                .into_iter()
                .map(|(name, builtin)| {
                    (
                        Just(name.clone()),
                        Just(builtin),
                        vec(rule(name, targets.clone()), 0..4),
                    )
                })
                .collect();
            per_chain.prop_map(|chains| {
                let chains: BTreeMap<String, Chain> = chains
                    .into_iter()
                    .map(|(name, builtin, rules)| {
                        let (policy, counters) = match builtin {
                            Some((p, c)) => (Some(p), c),
                            None => (None, Counters::default()),
                        };
                        (
                            name,
                            Chain {
                                policy,
                                counters,
                                rules,
                            },
                        )
                    })
                    .collect();
                TableRules { chains }
            })
        })
}

fn ruleset() -> impl Strategy<Value = Ruleset> {
    (
        option::of(table_rules(Table::Filter)),
        option::of(table_rules(Table::Nat)),
        option::of(table_rules(Table::Mangle)),
        option::of(table_rules(Table::Raw)),
    )
        .prop_map(|(f, n, m, r)| {
            let mut rs = Ruleset::new();
            for (t, rules) in [
                (Table::Filter, f),
                (Table::Nat, n),
                (Table::Mangle, m),
                (Table::Raw, r),
            ] {
                if let Some(rules) = rules {
                    rs.tables.insert(t, rules);
                }
            }
            rs
        })
}

/// Tokens that look like iptables input, to drive the parsers deep.
fn token() -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::sample::select(vec![
            "-A",
            "-I",
            "-D",
            "-R",
            "-N",
            "-X",
            "-F",
            "-Z",
            "-P",
            "-s",
            "-d",
            "-i",
            "-o",
            "-p",
            "-f",
            "-m",
            "-j",
            "-g",
            "-c",
            "!",
            "tcp",
            "udp",
            "sctp",
            "comment",
            "--comment",
            "--dport",
            "--sport",
            "multiport",
            "--dports",
            "statistic",
            "--mode",
            "random",
            "nth",
            "--probability",
            "--every",
            "--packet",
            "mark",
            "--mark",
            "conntrack",
            "--ctstate",
            "--ctstatus",
            "state",
            "--state",
            "addrtype",
            "--src-type",
            "--dst-type",
            "recent",
            "--set",
            "--rcheck",
            "--seconds",
            "--reap",
            "--name",
            "--mask",
            "set",
            "--match-set",
            "nfacct",
            "--nfacct-name",
            "physdev",
            "--physdev-is-in",
            "MARK",
            "--set-xmark",
            "--or-mark",
            "DNAT",
            "SNAT",
            "--to-destination",
            "--to-source",
            "MASQUERADE",
            "--to-ports",
            "REJECT",
            "--reject-with",
            "ACCEPT",
            "DROP",
            "RETURN",
            "KUBE-A",
            "X",
            "1",
            "0",
            "80:90",
            "1.2.3.4",
            "10.0.0.0/8",
            "[fd00::1]:80",
            "0x4000/0x4000",
            "0.5",
            "NEW,ESTABLISHED",
            "LOCAL",
            "dst,dst",
            "\"a b\"",
            "\"",
            "\\\"",
            "[1:2]",
            "*nat",
            ":KUBE-A",
            "COMMIT",
        ])
        .prop_map(str::to_string),
        "[^\n]{0,6}",
    ]
}

fn line() -> impl Strategy<Value = String> {
    vec(token(), 0..10).prop_map(|t| t.join(" "))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn save_round_trips(rs in ruleset()) {
        let text = rs.to_string();
        let parsed = parse_save(&text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(&parsed, &rs, "text:\n{}", text);
        prop_assert_eq!(parsed.to_string(), text);
    }

    #[test]
    fn rule_display_round_trips_through_restore_parser(rs in ruleset()) {
        // The same rules as -A commands of a restore payload.
        for (table, rules) in &rs.tables {
            let mut payload = format!("*{table}\n");
            let mut want = Vec::new();
            for (_, chain) in rules.ordered_chains() {
                for r in &chain.rules {
                    payload.push_str(&format!("{r}\n"));
                    want.push(r.clone());
                }
            }
            payload.push_str("COMMIT\n");
            let cmds = parse_restore(&payload).map_err(|e| TestCaseError::fail(format!("{e}\n{payload}")))?;
            let got: Vec<Rule> = cmds.into_iter().filter_map(|c| match c.op {
                RestoreOp::Append(r) => Some(r),
                _ => None,
            }).collect();
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in vec(any::<u8>(), 0..512)) {
        let text = String::from_utf8_lossy(&bytes);
        let _ = parse_save(&text);
        let _ = parse_restore(&text);
        let _ = tokenize(&text);
        let _ = FakeIptables::new(IpVersion::V4).restore(&bytes);
    }

    #[test]
    fn iptables_like_input_never_panics(lines in vec(line(), 0..12), v6 in any::<bool>()) {
        let body = lines.join("\n");
        for text in [body.clone(), format!("*nat\n{body}\nCOMMIT\n"), format!("*filter\n:INPUT ACCEPT [0:0]\n{body}\nCOMMIT\n")] {
            let _ = parse_save(&text);
            let _ = parse_restore(&text);
            let fake = FakeIptables::new(if v6 { IpVersion::V6 } else { IpVersion::V4 });
            let _ = fake.restore(text.as_bytes());
            // Whatever the fake accepted, it can print and re-read.
            let saved = fake.save(None).unwrap();
            let reparsed = parse_save(&saved).map_err(|e| TestCaseError::fail(format!("{e}\n{saved}")))?;
            prop_assert_eq!(reparsed, fake.ruleset());
        }
    }

    #[test]
    fn rule_lines_never_panic(tokens in vec(token(), 0..16)) {
        let _ = parse_restore(&format!("*nat\n-A X {}\nCOMMIT\n", tokens.join(" ")));
        let _ = parse_save(&format!("*nat\n:X - [0:0]\n-A X {}\nCOMMIT\n", tokens.join(" ")));
    }
}
