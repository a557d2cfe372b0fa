//! Reconcile tests: payload shapes for full, partial and cleanup runs.

use super::*;
use crate::iptables::render::TableRules;

fn rendered(nat_chains: &[&str], active: &[&str]) -> Rendered {
    Rendered {
        filter: TableRules {
            chains: ["KUBE-SERVICES", "KUBE-FIREWALL"].into_iter().collect(),
            rules: "-A KUBE-FIREWALL -j DROP\n".into(),
            rule_count: 1,
        },
        nat: TableRules {
            chains: nat_chains.iter().map(|c| c.to_string()).collect(),
            rules: "-A KUBE-SERVICES -j KUBE-SVC-A\n".into(),
            rule_count: 1,
        },
        active_nat_chains: active.iter().map(|c| c.to_string()).collect(),
        ..Rendered::default()
    }
}

fn table(chains: &[&str], rules: &[(&str, &str, Option<&str>)]) -> KernelTable {
    KernelTable {
        chains: chains.iter().map(|c| c.to_string()).collect(),
        rules: rules
            .iter()
            .map(|(c, l, t)| (c.to_string(), l.to_string(), t.map(str::to_string)))
            .collect(),
        ..KernelTable::default()
    }
}

#[test]
fn fresh_node_gets_every_jump_in_upstream_order() {
    let (p, stale) = full_payload(
        &rendered(&["KUBE-SERVICES", "KUBE-SVC-A"], &["KUBE-SVC-A"]),
        None,
    );
    assert!(stale.is_empty());
    let input: Vec<&str> = p.lines().filter(|l| l.contains(" INPUT ")).collect();
    // Inserted at the top in reverse, so the final order is the localnet guard
    // (KUBE-FIREWALL, as upstream's prepend of kubelet's jump chains leaves it), the load
    // balancer firewall, nodeports, external.
    assert_eq!(
        input,
        [
            "-I INPUT 1 -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES",
            "-I INPUT 1 -m comment --comment \"kubernetes health check service ports\" -j KUBE-NODEPORTS",
            "-I INPUT 1 -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL",
            "-I INPUT 1 -j KUBE-FIREWALL",
        ]
    );
    let output: Vec<&str> = p.lines().filter(|l| l.contains(" OUTPUT ")).collect();
    assert_eq!(
        output
            .iter()
            .filter(|l| l.contains("filter")
                || l.starts_with("-I OUTPUT 1 -j KUBE-FIREWALL")
                || l.contains("KUBE-PROXY-FIREWALL")
                || l.contains(
                    "conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\""
                ))
            .copied()
            .collect::<Vec<_>>(),
        [
            "-I OUTPUT 1 -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
            "-I OUTPUT 1 -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL",
            "-I OUTPUT 1 -j KUBE-FIREWALL",
        ]
    );
    assert!(p.contains("*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-A - [0:0]\n"));
    assert!(p.contains("-I POSTROUTING 1 -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n"));
    // filter, nat, then the three canary blocks (mangle, nat, filter), as upstream's
    // iptables-save of a node shows them.
    assert_eq!(p.matches("COMMIT\n").count(), 5);
    assert!(p.ends_with(
        "COMMIT\n*mangle\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n*nat\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n*filter\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n"
    ));
    // Chains are declared before any rule uses them.
    let filter_decl = p.find(":KUBE-FIREWALL").unwrap();
    let first_jump = p.find("-I INPUT").unwrap();
    assert!(filter_decl < first_jump);
}

#[test]
fn existing_jumps_are_not_duplicated_and_stale_chains_deleted() {
    let kernel = KernelTables {
        filter: table(
            &["INPUT", "FORWARD", "OUTPUT", "KUBE-SERVICES"],
            &[("INPUT", "-A INPUT -j KUBE-FIREWALL", Some("KUBE-FIREWALL"))],
        ),
        nat: table(
            &[
                "PREROUTING",
                "OUTPUT",
                "POSTROUTING",
                "KUBE-SERVICES",
                "KUBE-SVC-A",
                "KUBE-SVC-OLD",
                "KUBE-SEP-OLD",
                "CALICO-X",
            ],
            &[(
                "PREROUTING",
                "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
                Some("KUBE-SERVICES"),
            )],
        ),
        ..KernelTables::default()
    };
    let (p, stale) = full_payload(
        &rendered(&["KUBE-SERVICES", "KUBE-SVC-A"], &["KUBE-SVC-A"]),
        Some(&kernel),
    );
    assert_eq!(stale, ["KUBE-SEP-OLD", "KUBE-SVC-OLD"]);
    assert!(!p.contains("-A INPUT -j KUBE-FIREWALL"));
    assert!(!p.contains("-I PREROUTING"));
    assert!(p.contains(
        "-I OUTPUT 1 -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"
    ));
    assert!(p.contains(":KUBE-SVC-OLD - [0:0]\n"));
    assert!(p.ends_with(&format!(
        "-X KUBE-SEP-OLD\n-X KUBE-SVC-OLD\nCOMMIT\n{}",
        crate::iptables::canary::CANARY_BLOCKS
    )));
    assert!(!p.contains("CALICO"), "chains of others are never touched");
}

/// The jumps into (and deletions from) filter chain `chain` in `payload`, in the order they
/// are written.
fn jumps_written<'a>(payload: &'a str, chain: &str) -> Vec<&'a str> {
    let filter = payload.split("COMMIT\n").next().unwrap_or_default();
    filter
        .lines()
        .filter(|l| {
            l.starts_with(&format!("-I {chain} 1 ")) || l.starts_with(&format!("-D {chain} "))
        })
        .collect()
}

/// The kube-proxy jumps of `chain` as a kernel holds them, in `order` (indices into the
/// chain's group of [`KUBE_PROXY_JUMPS`]).
fn kernel_jumps(chain: &str, order: &[usize]) -> Vec<(String, String, Option<String>)> {
    let group: Vec<_> = KUBE_PROXY_JUMPS
        .iter()
        .filter(|j| j.table == kp_netfilter::Table::Filter && j.chain == chain)
        .collect();
    order
        .iter()
        .map(|&i| {
            (
                chain.to_string(),
                group[i].rule.to_string(),
                Some(group[i].target.to_string()),
            )
        })
        .collect()
}

fn filter_with(rules: Vec<(String, String, Option<String>)>) -> KernelTables {
    KernelTables {
        filter: KernelTable {
            chains: ["INPUT", "FORWARD", "OUTPUT", "KUBE-FIREWALL"]
                .into_iter()
                .map(str::to_string)
                .collect(),
            rules,
            ..KernelTable::default()
        },
        ..KernelTables::default()
    }
}

/// CVE-2020-8558 hardening: the jump to `KUBE-FIREWALL` ends up above our other jumps in
/// INPUT and OUTPUT, also where the kernel holds it below them (an older kube-proxy-rs
/// appended it) or where it exists alone and ours are about to be inserted above it (a
/// kubelet before 1.28 created it first); where it already is first, nothing is written.
#[test]
fn kube_firewall_jump_is_moved_above_our_jumps() {
    let r = rendered(&["KUBE-SERVICES"], &[]);
    for chain in ["INPUT", "OUTPUT"] {
        let n = KUBE_PROXY_JUMPS
            .iter()
            .filter(|j| j.table == kp_netfilter::Table::Filter && j.chain == chain)
            .count();
        assert_eq!(
            KUBE_PROXY_JUMPS
                .iter()
                .find(|j| j.chain == chain)
                .unwrap()
                .target,
            "KUBE-FIREWALL"
        );
        // In place: first. Nothing to do in this chain.
        let in_place: Vec<usize> = (0..n).collect();
        let (p, _) = full_payload(&r, Some(&filter_with(kernel_jumps(chain, &in_place))));
        assert!(
            jumps_written(&p, chain).is_empty(),
            "{chain}:
{p}"
        );
        // Last (as kube-proxy-rs before this fix appended it): moved to the top.
        let last: Vec<usize> = (1..n).chain([0]).collect();
        let (p, _) = full_payload(&r, Some(&filter_with(kernel_jumps(chain, &last))));
        assert_eq!(
            jumps_written(&p, chain),
            [
                format!("-D {chain} -j KUBE-FIREWALL"),
                format!("-I {chain} 1 -j KUBE-FIREWALL")
            ],
            "{chain}:\n{p}"
        );
        // Alone (kubelet's), ours missing: ours go in, then it above them.
        let (p, _) = full_payload(&r, Some(&filter_with(kernel_jumps(chain, &[0]))));
        let written = jumps_written(&p, chain);
        assert_eq!(
            written.first().copied(),
            Some(format!("-D {chain} -j KUBE-FIREWALL").as_str())
        );
        assert_eq!(
            written.last().copied(),
            Some(format!("-I {chain} 1 -j KUBE-FIREWALL").as_str())
        );
        assert_eq!(written.len(), n + 1, "{chain}:\n{p}");
        // Missing with ours in place: inserted above them.
        let (p, _) = full_payload(&r, Some(&filter_with(kernel_jumps(chain, &in_place[1..]))));
        assert_eq!(
            jumps_written(&p, chain),
            [format!("-I {chain} 1 -j KUBE-FIREWALL")]
        );
    }
}

/// IPv6 (and IPv4 without localhost NodePorts): the render writes no `KUBE-FIREWALL`, but
/// upstream still ensures the chain and its jumps (empty in IPv6): declared where the kernel
/// lacks it, never flushed where it has it.
#[test]
fn empty_kube_firewall_and_its_jumps_without_the_localnet_drop() {
    let mut r = rendered(&["KUBE-SERVICES"], &[]);
    r.filter = TableRules {
        chains: ["KUBE-SERVICES"].into_iter().collect(),
        ..TableRules::default()
    };
    let (p, _) = full_payload(&r, None);
    assert!(
        p.contains("*filter\n:KUBE-SERVICES - [0:0]\n:KUBE-FIREWALL - [0:0]\n"),
        "{p}"
    );
    assert!(!p.contains("-A KUBE-FIREWALL"), "{p}");
    assert!(
        p.contains("-I INPUT 1 -j KUBE-FIREWALL\n") && p.contains("-I OUTPUT 1 -j KUBE-FIREWALL\n")
    );
    // A kernel that has the chain (kubelet's, with its own rules) keeps its contents.
    let (p, _) = full_payload(&r, Some(&filter_with(Vec::new())));
    assert!(!p.contains(":KUBE-FIREWALL"), "{p}");
    assert!(p.contains("-I INPUT 1 -j KUBE-FIREWALL\n"));
}

#[test]
fn partial_deletes_what_the_previous_sync_wrote() {
    let previous: HashSet<String> = ["KUBE-SVC-A", "KUBE-SVC-GONE"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let (p, stale) = partial_payload(&rendered(&["KUBE-SERVICES"], &["KUBE-SVC-A"]), &previous);
    assert_eq!(stale, ["KUBE-SVC-GONE"]);
    assert!(
        !p.contains(":KUBE-SVC-A "),
        "unchanged chains are not declared (so not flushed)"
    );
    assert!(p.contains(":KUBE-SVC-GONE - [0:0]\n"));
    assert!(p.contains("-X KUBE-SVC-GONE\n"));
    assert!(
        !p.contains("-I "),
        "partial syncs do not touch the built-in chains"
    );
    assert!(
        !p.contains("CANARY") && p.matches("COMMIT\n").count() == 2,
        "only full syncs write the canaries"
    );
}

#[test]
fn cleanup_removes_only_ours() {
    let kernel = KernelTables {
        filter: table(
            &[
                "INPUT",
                "FORWARD",
                "OUTPUT",
                "KUBE-SERVICES",
                "KUBE-FIREWALL",
                "KUBE-FORWARD",
                "OTHER",
            ],
            &[
                ("INPUT", "-A INPUT -j KUBE-FIREWALL", Some("KUBE-FIREWALL")),
                ("INPUT", "-A INPUT -j OTHER", Some("OTHER")),
                (
                    "FORWARD",
                    "-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD",
                    Some("KUBE-FORWARD"),
                ),
                ("KUBE-FIREWALL", KUBE_FIREWALL_RULE, Some("DROP")),
            ],
        ),
        nat: table(
            &[
                "PREROUTING",
                "POSTROUTING",
                "KUBE-SERVICES",
                "KUBE-MARK-MASQ",
                "KUBE-SVC-A",
                "KUBE-SEP-B",
                "FOREIGN",
            ],
            &[
                (
                    "PREROUTING",
                    "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
                    Some("KUBE-SERVICES"),
                ),
                (
                    "FOREIGN",
                    "-A FOREIGN -j KUBE-MARK-MASQ",
                    Some("KUBE-MARK-MASQ"),
                ),
                (
                    "KUBE-SERVICES",
                    "-A KUBE-SERVICES -j KUBE-SVC-A",
                    Some("KUBE-SVC-A"),
                ),
            ],
        ),
        ..KernelTables::default()
    };
    let plan = cleanup_payload(&kernel);
    let p = plan.payload.unwrap();
    assert!(p.contains("-D INPUT -j KUBE-FIREWALL\n"));
    assert!(!p.contains("-D INPUT -j OTHER"));
    assert!(p.contains(
        "-D FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n"
    ));
    assert!(p.contains("-X KUBE-FIREWALL\n"));
    assert!(
        p.contains("-X KUBE-SVC-A\n")
            && p.contains("-X KUBE-SEP-B\n")
            && p.contains("-X KUBE-SERVICES\n")
    );
    assert!(
        !p.contains("-X KUBE-MARK-MASQ"),
        "still referenced from a foreign chain"
    );
    assert!(!p.contains("OTHER\n") && !p.contains("FOREIGN"));
    assert_eq!(plan.kept.len(), 1);
    assert!(plan.kept[0].1.contains("FOREIGN"));
    // Every deleted chain is declared (flushed) first.
    for line in p.lines().filter(|l| l.starts_with("-X ")) {
        assert!(p.contains(&format!(":{} - [0:0]", &line[3..])));
    }
}

#[test]
fn cleanup_keeps_a_kube_firewall_with_foreign_rules() {
    let kernel = KernelTables {
        filter: table(
            &["INPUT", "KUBE-FIREWALL"],
            &[
                ("INPUT", "-A INPUT -j KUBE-FIREWALL", Some("KUBE-FIREWALL")),
                (
                    "KUBE-FIREWALL",
                    "-A KUBE-FIREWALL -m mark --mark 0x8000/0x8000 -j DROP",
                    Some("DROP"),
                ),
            ],
        ),
        nat: KernelTable::default(),
        ..KernelTables::default()
    };
    let plan = cleanup_payload(&kernel);
    assert!(plan.payload.is_none());
    assert_eq!(plan.kept.len(), 1);
}

#[test]
fn cleanup_of_a_clean_node_does_nothing() {
    let kernel = KernelTables {
        filter: table(&["INPUT", "FORWARD", "OUTPUT"], &[]),
        nat: table(&["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"], &[]),
        ..KernelTables::default()
    };
    assert_eq!(cleanup_payload(&kernel), CleanupPlan::default());
}

#[test]
fn zero_counters_first_only_when_asked() {
    let mut r = rendered(&["KUBE-SERVICES", "KUBE-SVC-A"], &["KUBE-SVC-A"]);
    let (plain, _) = full_payload_take(&mut r.clone(), None);
    assert!(!plain.contains("-Z"));
    let (p, _) = full_payload_take_with(&mut r, None, true);
    assert!(p.starts_with("*filter\n-Z\n:KUBE-SERVICES - [0:0]\n"));
    assert!(p.contains("*nat\n-Z\n:KUBE-SERVICES - [0:0]\n"));
    assert_eq!(p.replace("-Z\n", ""), plain, "nothing else changes");
}

/// After iptables mode's first sync over IPVS mode's rules: IPVS mode's own chains and the
/// jumps only it writes go; the shared chains (now iptables mode's), iptables mode's jumps,
/// its per-Service chains and KUBE-FIREWALL stay.
#[test]
fn ipvs_leftovers_cleanup_removes_only_what_iptables_mode_does_not_use() {
    let kernel = KernelTables {
        filter: table(
            &[
                "INPUT",
                "FORWARD",
                "OUTPUT",
                "KUBE-FIREWALL",
                "KUBE-FORWARD",
                "KUBE-PROXY-FIREWALL",
                "KUBE-NODE-PORT",
                "KUBE-SOURCE-RANGES-FIREWALL",
                "KUBE-IPVS-FILTER",
                "KUBE-IPVS-OUT-FILTER",
                "KUBE-NODEPORTS",
            ],
            &[
                ("INPUT", "-A INPUT -j KUBE-FIREWALL", Some("KUBE-FIREWALL")),
                (
                    "INPUT",
                    "-A INPUT -m comment --comment \"kubernetes ipvs access filter\" -j KUBE-IPVS-FILTER",
                    Some("KUBE-IPVS-FILTER"),
                ),
                (
                    "INPUT",
                    "-A INPUT -m comment --comment \"kubernetes health check rules\" -j KUBE-NODE-PORT",
                    Some("KUBE-NODE-PORT"),
                ),
                (
                    "INPUT",
                    "-A INPUT -m comment --comment \"kube-proxy firewall rules\" -j KUBE-PROXY-FIREWALL",
                    Some("KUBE-PROXY-FIREWALL"),
                ),
                (
                    "INPUT",
                    "-A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL",
                    Some("KUBE-PROXY-FIREWALL"),
                ),
                (
                    "INPUT",
                    "-A INPUT -m comment --comment \"kubernetes health check service ports\" -j KUBE-NODEPORTS",
                    Some("KUBE-NODEPORTS"),
                ),
                (
                    "FORWARD",
                    "-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD",
                    Some("KUBE-FORWARD"),
                ),
                (
                    "OUTPUT",
                    "-A OUTPUT -m comment --comment \"kubernetes ipvs access filter\" -j KUBE-IPVS-OUT-FILTER",
                    Some("KUBE-IPVS-OUT-FILTER"),
                ),
                (
                    "KUBE-SOURCE-RANGES-FIREWALL",
                    "-A KUBE-SOURCE-RANGES-FIREWALL -j DROP",
                    Some("DROP"),
                ),
                ("KUBE-FIREWALL", KUBE_FIREWALL_RULE, Some("DROP")),
            ],
        ),
        nat: table(
            &[
                "PREROUTING",
                "KUBE-SERVICES",
                "KUBE-NODE-PORT",
                "KUBE-LOAD-BALANCER",
                "KUBE-SVC-A",
            ],
            &[
                (
                    "PREROUTING",
                    "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
                    Some("KUBE-SERVICES"),
                ),
                (
                    "KUBE-SERVICES",
                    "-A KUBE-SERVICES -j KUBE-SVC-A",
                    Some("KUBE-SVC-A"),
                ),
            ],
        ),
        ..KernelTables::default()
    };
    let plan = cleanup_payload_in(&kernel, CleanupScope::IpvsOnly);
    let p = plan.payload.unwrap();
    for gone in [
        "-D INPUT -m comment --comment \"kubernetes ipvs access filter\" -j KUBE-IPVS-FILTER\n",
        "-D INPUT -m comment --comment \"kubernetes health check rules\" -j KUBE-NODE-PORT\n",
        "-D INPUT -m comment --comment \"kube-proxy firewall rules\" -j KUBE-PROXY-FIREWALL\n",
        "-D OUTPUT -m comment --comment \"kubernetes ipvs access filter\" -j KUBE-IPVS-OUT-FILTER\n",
        "-X KUBE-IPVS-FILTER\n",
        "-X KUBE-IPVS-OUT-FILTER\n",
        "-X KUBE-SOURCE-RANGES-FIREWALL\n",
        "-X KUBE-NODE-PORT\n",
        "-X KUBE-LOAD-BALANCER\n",
    ] {
        assert!(p.contains(gone), "{gone:?} missing:\n{p}");
    }
    for kept in [
        "KUBE-FIREWALL",
        "KUBE-FORWARD",
        "KUBE-NODEPORTS",
        "KUBE-SERVICES",
        "KUBE-SVC-A",
        "load balancer firewall",
    ] {
        assert!(!p.contains(kept), "{kept} must stay:\n{p}");
    }
    assert_eq!(
        p.matches("-X KUBE-NODE-PORT\n").count(),
        2,
        "filter and nat:\n{p}"
    );
    // A node without IPVS mode's leftovers: nothing to do.
    let clean = KernelTables {
        filter: table(&["INPUT", "KUBE-FORWARD"], &[]),
        nat: table(&["PREROUTING", "KUBE-SERVICES"], &[]),
        ..KernelTables::default()
    };
    assert_eq!(
        cleanup_payload_in(&clean, CleanupScope::IpvsOnly),
        CleanupPlan::default()
    );
}
