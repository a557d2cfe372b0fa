//! The packet-flow conformance table (`kp_testkit::conformance`) run through the tracer
//! against the rules each mode renders. No kernel needed: rules go through the checking fake
//! and come back as an `iptables-save` text, exactly what the tracer reads from a live node.
//! IPVS mode's desired state (iptables rules, ipsets, virtual servers, kube-ipvs0's
//! addresses) is rendered and written out as `iptables-save`, `ipset save` and
//! `ipvsadm -Sn` text, the three dumps the tracer reads in IPVS mode.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use kp_model::{Changes, IpFamily};
use kp_netfilter::{FakeIptables, IpVersion, Iptables, parse_save};
use kp_proxier::iptables::tree::Dispatch;
use kp_proxier::iptables::{IptablesConfig, IptablesProxier};
use kp_proxier::{FakeHost, Host, LocalDetector, NodePortAddresses, Proxier};
use kp_testkit::conformance::{
    CLUSTER_CIDRS, DetectLocal, Expect, From, POD_BRIDGE, POD_PREFIX, Proto, Row, Scenario,
    Settings, scenarios,
};
use kp_trace::{Entry, Packet, Trace, Verdict, trace};

fn local_detector(s: &Settings) -> LocalDetector {
    match s.detect_local {
        DetectLocal::ClusterCidr => {
            LocalDetector::Cidrs(CLUSTER_CIDRS.iter().map(|c| c.parse().unwrap()).collect())
        }
        DetectLocal::NodeCidr => LocalDetector::NodeCidr,
        DetectLocal::BridgeInterface => LocalDetector::BridgeInterface(POD_BRIDGE.to_string()),
        DetectLocal::InterfaceNamePrefix => {
            LocalDetector::InterfaceNamePrefix(POD_PREFIX.to_string())
        }
        DetectLocal::None => LocalDetector::None,
    }
}

fn iptables_config(s: &Settings) -> IptablesConfig {
    IptablesConfig {
        masquerade_all: s.masquerade_all,
        local_detector: local_detector(s),
        nodeport_addresses: NodePortAddresses::parse(&s.nodeport_addresses).unwrap(),
        localhost_nodeports: s.localhost_nodeports,
        ..IptablesConfig::default()
    }
}

/// The rules iptables mode writes for `scn` in `family`, read back as the kernel would print
/// them, and whether it enabled `route_localnet`.
fn rules(scn: &Scenario, family: IpFamily) -> (kp_netfilter::Ruleset, bool) {
    rules_with(scn, family, Dispatch::Upstream)
}

/// [`rules`] with `KUBE-SERVICES` dispatching as `dispatch` says.
fn rules_with(
    scn: &Scenario,
    family: IpFamily,
    dispatch: Dispatch,
) -> (kp_netfilter::Ruleset, bool) {
    let snap = scn.snapshot(family);
    let version = match family {
        IpFamily::V4 => IpVersion::V4,
        IpFamily::V6 => IpVersion::V6,
    };
    let host = Arc::new(FakeHost::with_addresses(scn.local_addrs.clone()));
    let mut proxier = IptablesProxier::new(
        family,
        iptables_config(&scn.settings),
        FakeIptables::new(version),
        host.clone(),
    )
    .unwrap()
    .with_dispatch(dispatch);
    proxier.sync(&snap, &Changes::default()).unwrap();
    let saved = proxier.runner().save(None).unwrap();
    let route_localnet = host
        .get_sysctl("net/ipv4/conf/all/route_localnet")
        .as_deref()
        == Some("1");
    (parse_save(&saved).unwrap(), route_localnet)
}

fn packet(row: &Row) -> Packet {
    let entry = match &row.from {
        From::Pod { iface } => Entry::Pod {
            iface: Some(iface.to_string()),
        },
        From::External => Entry::External {
            iface: Some("eth0".to_string()),
        },
        From::Node => Entry::Node,
    };
    match row.proto {
        Proto::Icmp => Packet::ping(row.src, row.dst, entry),
        Proto::L4(kp_model::Protocol::Tcp) => Packet::tcp(row.src, 40000, row.dst, row.port, entry),
        Proto::L4(kp_model::Protocol::Udp) => Packet::udp(row.src, 40000, row.dst, row.port, entry),
        Proto::L4(kp_model::Protocol::Sctp) => {
            let mut p = Packet::tcp(row.src, 40000, row.dst, row.port, entry);
            p.proto = kp_trace::Proto::Sctp;
            p
        }
    }
}

/// Compares a trace with the expectation; `Err` says what differs.
fn check(expect: &Expect, t: &Trace) -> Result<(), String> {
    if t.is_uncertain() {
        let unknown: Vec<&String> = t.outcomes.iter().flat_map(|o| &o.unknown).collect();
        return Err(format!("the trace is uncertain: {unknown:?}"));
    }
    let describe = || {
        t.outcomes
            .iter()
            .map(|o| {
                format!(
                    "{:.3} dnat={:?} masq={} {:?} {:?}",
                    o.probability, o.dnat, o.masquerade, o.verdict, o.delivery
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    match expect {
        Expect::Backends(list) => {
            let mut got: BTreeMap<(String, bool), f64> = BTreeMap::new();
            for o in &t.outcomes {
                let Some((ip, port)) = o.dnat else {
                    return Err(format!("a branch is not DNATed: {}", describe()));
                };
                if o.verdict != Verdict::Accept || o.delivery == kp_trace::Delivery::Dropped {
                    return Err(format!("a branch is not delivered: {}", describe()));
                }
                let to = SocketAddr::new(ip, port.unwrap_or(0)).to_string();
                *got.entry((to, o.masquerade)).or_default() += o.probability;
            }
            let want: BTreeMap<(String, bool), f64> = list
                .iter()
                .map(|(ep, m)| ((ep.to_string(), *m), 1.0 / list.len() as f64))
                .collect();
            let same_keys = got.keys().eq(want.keys());
            let uniform = got
                .iter()
                .all(|(k, p)| want.get(k).is_some_and(|w| (p - w).abs() < 1e-6));
            if !same_keys || !uniform {
                return Err(format!("expected {want:?}, got {got:?}"));
            }
        }
        Expect::Drop => {
            // Dropped by a rule, or accepted by the rules and dropped by the kernel
            // (martian 127.0.0.0/8 traffic): never rejected, which answers the sender.
            if !t.outcomes.iter().all(|o| {
                o.verdict == Verdict::Drop
                    || (o.delivery == kp_trace::Delivery::Dropped
                        && !matches!(o.verdict, Verdict::Reject(_)))
            }) {
                return Err(format!("expected DROP: {}", describe()));
            }
        }
        Expect::Reject => {
            if !t
                .outcomes
                .iter()
                .all(|o| matches!(o.verdict, Verdict::Reject(_)))
            {
                return Err(format!("expected REJECT: {}", describe()));
            }
        }
        Expect::Unchanged => {
            let ok = t.outcomes.iter().all(|o| {
                o.dnat.is_none()
                    && !o.masquerade
                    && o.verdict == Verdict::Accept
                    && o.delivery != kp_trace::Delivery::Dropped
            });
            if !ok {
                return Err(format!("expected the packet untouched: {}", describe()));
            }
        }
    }
    Ok(())
}

/// The rules of one family in a form the tracer evaluates.
enum Rules {
    Iptables(kp_netfilter::Ruleset),
    Nftables(kp_trace::nft::NftRuleset),
    /// IPVS mode: the iptables rules, the IPVS table, the `ipset save` text and the
    /// addresses bound to kube-ipvs0.
    Ipvs(
        kp_netfilter::Ruleset,
        kp_trace::IpvsTable,
        String,
        Vec<std::net::IpAddr>,
    ),
    /// Userspace mode: the portal rules and the proxy table.
    Userspace(kp_netfilter::Ruleset, kp_trace::UserspaceTable),
}

impl Rules {
    fn trace(&self, host: &kp_trace::Host, pkt: &Packet) -> Result<Trace, kp_trace::TraceError> {
        match self {
            Rules::Iptables(r) => trace(r, host, pkt),
            Rules::Nftables(r) => kp_trace::trace_nft(r, host, pkt),
            Rules::Ipvs(r, t, _, _) => kp_trace::trace_ipvs(r, t, host, pkt),
            Rules::Userspace(r, t) => kp_trace::trace_userspace(r, t, host, pkt),
        }
    }
}

/// Runs every row of every scenario against `rules_for(scenario, family)`; `mode` picks the
/// rows' documented exceptions.
fn run_table(mode: &str, rules_for: impl FnMut(&Scenario, IpFamily) -> (Rules, bool)) {
    run_table_as(mode, mode, rules_for);
}

/// [`run_table`], reported as `label` (a layout of `mode` that expects the same results).
fn run_table_as(
    label: &str,
    mode: &str,
    mut rules_for: impl FnMut(&Scenario, IpFamily) -> (Rules, bool),
) {
    let mut failures = Vec::new();
    let mut passed = 0;
    for scn in scenarios() {
        let by_family: BTreeMap<IpFamily, (Rules, bool)> = [IpFamily::V4, IpFamily::V6]
            .into_iter()
            .map(|f| (f, rules_for(&scn, f)))
            .collect();
        for row in &scn.rows {
            let (rules, route_localnet) = &by_family[&IpFamily::of(&row.dst)];
            let mut host = kp_trace::Host::new(scn.local_addrs.clone());
            host.route_localnet = *route_localnet;
            let mut pkt = packet(row);
            if let Rules::Ipvs(_, _, sets, bound) = rules {
                host.load_ipset_save(sets).unwrap();
                host.local_addrs.extend(bound.iter().copied());
                // The table's pods sit on routed veths (and external clients on eth0),
                // not bridge ports, except behind the pod bridge.
                pkt.bridged =
                    Some(matches!(&row.from, From::Pod { iface } if *iface == POD_BRIDGE));
            }
            let expect = row
                .exceptions
                .iter()
                .find(|(m, _, _)| *m == mode)
                .map(|(_, e, _)| e)
                .unwrap_or(&row.expect);
            // Userspace mode always hides the client: the proxy connects to the endpoint
            // from the node (docs/userspace.md). One blanket exception, not one per row.
            let hidden;
            let expect = match expect {
                Expect::Backends(list) if mode == "userspace" => {
                    hidden = Expect::Backends(list.iter().map(|(ep, _)| (*ep, true)).collect());
                    &hidden
                }
                other => other,
            };
            let traced = rules.trace(&host, &pkt);
            match traced
                .map_err(|e| e.to_string())
                .and_then(|t| check(expect, &t).map(|()| t))
            {
                Ok(_) => passed += 1,
                Err(e) => {
                    let text = rules
                        .trace(&host, &pkt)
                        .map(|t| kp_trace::render_text(&t, &pkt))
                        .unwrap_or_default();
                    failures.push(format!("[{}] {}: {e}\n{text}", scn.name, row.name));
                }
            }
        }
    }
    eprintln!(
        "conformance ({label}): {passed} rows passed, {} failed",
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} rows failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[test]
fn conformance_table_iptables_mode() {
    run_table("iptables", |scn, family| {
        let (rules, route_localnet) = rules(scn, family);
        (Rules::Iptables(rules), route_localnet)
    });
}

/// iptables mode with `--iptables-dispatch tree`, with leaves of one and of two entries so
/// that every scenario's few Services get a real tree (with the default 16 they would stay
/// in `KUBE-SERVICES`): the same rows, the same expectations as upstream's layout.
#[test]
fn conformance_table_iptables_tree_layout() {
    for leaf_rules in [1, 2] {
        let mut trees = 0;
        run_table_as(
            &format!("iptables, tree layout, leaves of {leaf_rules}"),
            "iptables",
            |scn, family| {
                let (rules, route_localnet) =
                    rules_with(scn, family, Dispatch::Tree { leaf_rules });
                if rules.to_string().contains(":KUBE-SVT-") {
                    trees += 1;
                }
                (Rules::Iptables(rules), route_localnet)
            },
        );
        // Most scenarios have one or two Services; those with more get a tree.
        assert!(trees >= 3, "only {trees} rulesets had a tree");
    }
}

/// nftables mode: the rules are loaded into a network namespace with the real `nft`, and
/// the tracer reads them back from `nft -j list ruleset`, exactly as from a live node.
#[test]
fn conformance_table_nftables_mode() {
    if !kp_testkit::require_root() {
        return;
    }
    run_table("nftables", |scn, family| {
        let ns = kp_testkit::Netns::new("conform").unwrap();
        let snap = scn.snapshot(family);
        let exec = Arc::new(kp_netfilter::SystemExec::with_prefix(vec![
            "ip".into(),
            "netns".into(),
            "exec".into(),
            ns.name().to_string(),
        ]));
        let cfg = kp_proxier::nftables::NftablesConfig {
            masquerade_all: scn.settings.masquerade_all,
            local_detector: local_detector(&scn.settings),
            // The table's "no --nodeport-addresses" means every local address (upstream's
            // nftables default is `primary`, so spell it out).
            nodeport_addresses: if scn.settings.nodeport_addresses.is_empty() {
                NodePortAddresses::all()
            } else {
                NodePortAddresses::parse(&scn.settings.nodeport_addresses).unwrap()
            },
            ..kp_proxier::nftables::NftablesConfig::default()
        };
        let host = Arc::new(FakeHost::with_addresses(scn.local_addrs.clone()));
        let mut proxier = kp_proxier::nftables::NftablesProxier::new(
            family,
            cfg,
            kp_netfilter::ExecNft::with_exec(exec),
            host,
        )
        .unwrap();
        proxier.sync(&snap, &Changes::default()).unwrap();
        let json = ns.run("nft", ["-j", "list", "ruleset"]).unwrap();
        (
            Rules::Nftables(kp_trace::parse_nft_json(&json).unwrap()),
            false,
        )
    });
}

use kp_proxier::ipvs::JUMPS as IPVS_JUMPS;

/// One table of IPVS mode as `iptables-save` prints it: built-in chains, kube-proxy's
/// chains, the jumps, the rendered rules.
fn ipvs_table_text(table: &str, builtins: &[&str], chains: &[&str], rules: &str) -> String {
    use std::fmt::Write as _;
    let mut out = format!("*{table}\n");
    for c in builtins {
        let _ = writeln!(out, ":{c} ACCEPT [0:0]");
    }
    for c in chains {
        let _ = writeln!(out, ":{c} - [0:0]");
    }
    for c in builtins {
        for (_, chain, comment, target) in IPVS_JUMPS
            .iter()
            .rev()
            .filter(|j| j.0 == table && j.1 == *c)
        {
            let _ = writeln!(
                out,
                "-A {chain} -m comment --comment \"{comment}\" -j {target}"
            );
        }
    }
    out.push_str(rules);
    out.push_str("COMMIT\n");
    out
}

/// IPVS mode's dumps for `scn` in `family`, rendered by `kp_proxier::ipvs::render`.
fn ipvs_rules(scn: &Scenario, family: IpFamily) -> Rules {
    use kp_netlink::ipvs::{RealServer, ServiceKey, VirtualServer, parse_save_text, save_text};
    use kp_proxier::ipvs::names::{FILTER_CHAINS, KubeSet, NAT_CHAINS, SetType};
    use kp_proxier::ipvs::render::{RenderConfig, proto_number, render};
    let snap = scn.snapshot(family);
    let s = &scn.settings;
    let in_family: Vec<std::net::IpAddr> = scn
        .local_addrs
        .iter()
        .copied()
        .filter(|ip| family.contains(ip))
        .collect();
    // NodePorts: the node's non-loopback addresses --nodeport-addresses selects (`primary`:
    // the Node object's address of the family, as the proxier resolves it).
    let npa = NodePortAddresses::parse(&s.nodeport_addresses).unwrap();
    let nodeport_ips: Vec<std::net::IpAddr> = if npa.match_all(family, &snap.node_ips) {
        in_family.clone()
    } else {
        npa.node_ips(family, &in_family, &snap.node_ips)
    }
    .into_iter()
    .filter(|ip| !ip.is_loopback())
    .collect();
    let node_ip = snap
        .node_ips
        .first()
        .copied()
        .or_else(|| nodeport_ips.first().copied());
    let cfg = RenderConfig {
        masquerade_all: s.masquerade_all,
        local: local_detector(s).for_family(family, &scn.node.pod_cidrs),
        nodeport_ips,
        other_addresses: scn.local_addrs.iter().copied().collect(),
        node_ip,
        ..RenderConfig::default()
    };
    let r = render(&snap, &cfg);
    let iptables = format!(
        "{}{}",
        ipvs_table_text(
            "filter",
            &["INPUT", "FORWARD", "OUTPUT"],
            FILTER_CHAINS,
            &r.filter_rules
        ),
        ipvs_table_text(
            "nat",
            &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"],
            NAT_CHAINS,
            &r.nat_rules
        ),
    );
    let mut sets = String::new();
    for (set, entries) in &r.sets {
        let name = set.name(family);
        let ty = set.set_type();
        let fam = match family {
            IpFamily::V4 => "inet",
            IpFamily::V6 => "inet6",
        };
        match ty {
            SetType::BitmapPort => {
                sets.push_str(&format!("create {name} bitmap:port range 0-65535\n"))
            }
            _ => sets.push_str(&format!(
                "create {name} {} family {fam} hashsize 1024 maxelem 65536\n",
                ty.as_str()
            )),
        }
        for e in entries {
            sets.push_str(&format!("add {name} {e}\n"));
        }
    }
    let _ = KubeSet::ALL;
    let services: Vec<(VirtualServer, Vec<RealServer>)> = r
        .virtual_servers
        .iter()
        .map(|(k, spec)| {
            let key = ServiceKey::new(k.addr, proto_number(k.protocol), k.port);
            let mut vs = VirtualServer::new(key, &cfg.scheduler);
            if let Some(t) = spec.persistent_timeout {
                vs = vs.persistent(t);
            }
            let reals = spec
                .real_servers
                .iter()
                .map(|a| RealServer::new(a.ip(), a.port(), 1))
                .collect();
            (vs, reals)
        })
        .collect();
    // Through the text forms, as the tracer reads them from a node.
    let ipvsadm = save_text(&services);
    assert_eq!(parse_save_text(&ipvsadm).unwrap().len(), services.len());
    Rules::Ipvs(
        parse_save(&iptables).unwrap_or_else(|e| panic!("{e}\n{iptables}")),
        kp_trace::IpvsTable::parse(&ipvsadm).unwrap(),
        sets,
        r.bind_addrs.iter().copied().collect(),
    )
}

/// IPVS mode: the render's iptables rules, ipsets and virtual servers traced together.
#[test]
fn conformance_table_ipvs_mode() {
    run_table("ipvs", |scn, family| (ipvs_rules(scn, family), false));
}

/// Userspace mode: the portal rules through the checking fake, and the proxy table of the
/// listeners the proxier asked its relay for (a fake one: ports from 36000), written out and
/// read back as `/userspace` serves it.
fn userspace_rules(scn: &Scenario, family: IpFamily) -> Rules {
    use kp_proxier::userspace::{FakeRelay, UserspaceConfig, UserspaceProxier};
    let snap = scn.snapshot(family);
    let version = match family {
        IpFamily::V4 => IpVersion::V4,
        IpFamily::V6 => IpVersion::V6,
    };
    let host = Arc::new(FakeHost::with_addresses(scn.local_addrs.clone()));
    let cfg = UserspaceConfig {
        nodeport_addresses: NodePortAddresses::parse(&scn.settings.nodeport_addresses).unwrap(),
        local_detector: local_detector(&scn.settings),
    };
    let mut proxier = UserspaceProxier::new(
        family,
        cfg,
        FakeIptables::new(version),
        FakeRelay::new(36000),
        host,
    );
    proxier.sync(&snap, &Changes::default()).unwrap();
    let saved = proxier.runner().save(None).unwrap();
    let wildcard: std::net::IpAddr = match family {
        IpFamily::V4 => std::net::Ipv4Addr::UNSPECIFIED.into(),
        IpFamily::V6 => std::net::Ipv6Addr::UNSPECIFIED.into(),
    };
    let table = kp_trace::UserspaceTable {
        listeners: proxier
            .portals()
            .iter()
            .map(|p| kp_trace::UserspaceListener {
                protocol: match p.listener.protocol {
                    kp_model::Protocol::Udp => kp_trace::Proto::Udp,
                    _ => kp_trace::Proto::Tcp,
                },
                listen: SocketAddr::new(wildcard, p.port),
                service: p.listener.service.to_string(),
                scope: match p.listener.scope {
                    kp_proxier::userspace::Scope::Internal => kp_trace::ListenerScope::Internal,
                    kp_proxier::userspace::Scope::External => kp_trace::ListenerScope::External,
                    kp_proxier::userspace::Scope::Cluster => kp_trace::ListenerScope::Cluster,
                },
                affinity: p
                    .listener
                    .affinity
                    .map(|d| u32::try_from(d.as_secs()).unwrap()),
                endpoints: p.listener.endpoints.to_vec(),
            })
            .collect(),
    };
    let table = kp_trace::UserspaceTable::parse(&table.to_string()).unwrap();
    Rules::Userspace(parse_save(&saved).unwrap(), table)
}

/// Userspace mode: the portal rules, then the proxy's own endpoint choice.
#[test]
fn conformance_table_userspace_mode() {
    run_table("userspace", |scn, family| {
        (userspace_rules(scn, family), false)
    });
}
