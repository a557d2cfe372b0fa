//! Split tests: the order of the transactions, and every state between them applied to the
//! checking fake (jumps to missing chains are refused there) kept correct for packets.

use std::collections::{BTreeMap, BTreeSet};

use kp_model::{IpFamily, Snapshot, SourceEvent};
use kp_netfilter::{FakeIptables, IpVersion, Iptables, Table};
use kp_testkit::builders::{ServiceBuilder, SliceBuilder};
use kp_track::Tracker;

use super::*;
use crate::iptables::reconcile::{KernelTables, full_payload};
use crate::iptables::render::{self, RenderConfig};
use crate::iptables::{kernel_table, kernel_table_for_sync};

/// Cuts very finely, so that small test rulesets give many transactions.
const FINE: SplitPolicy = SplitPolicy {
    min_lines: 0,
    lines_per_transaction: 40,
    existing_chains_per_extra_line: 0,
};

fn tracker() -> Tracker {
    kp_testkit::builders::synced_tracker(IpFamily::V4, "node-a")
}

/// Service `svc-i` (ClusterIP 10.96.0.i, port 80) with `eps` endpoints 10.1.i.(first..);
/// every third has a NodePort, every fifth is `externalTrafficPolicy: Local` (KUBE-SVL
/// chains), every seventh a LoadBalancer with source ranges (KUBE-FW chains).
fn service_events(i: usize, eps: usize, first: usize) -> Vec<SourceEvent> {
    let name = format!("svc-{i}");
    let mut b = ServiceBuilder::new(&name, &format!("10.96.0.{i}")).tcp("http", 80);
    if i.is_multiple_of(3) || i.is_multiple_of(5) || i.is_multiple_of(7) {
        b = b.node_port(30000 + i as u16);
    }
    if i.is_multiple_of(5) {
        b = b.external_local(None);
    }
    if i.is_multiple_of(7) {
        b = b
            .load_balancer(&[&format!("192.0.2.{i}")])
            .source_ranges(&["203.0.113.0/24"]);
    }
    let mut s = SliceBuilder::new(&name)
        .named(&format!("{name}-x"))
        .port("http", 8080);
    for e in first..first + eps {
        let node = if e.is_multiple_of(2) {
            "node-a"
        } else {
            "node-b"
        };
        s = s.ready(&format!("10.1.{i}.{e}"), node);
    }
    vec![
        SourceEvent::ServiceUpsert(b.build()),
        SourceEvent::SliceUpsert(s.build()),
    ]
}

fn snapshot(t: &mut Tracker, events: Vec<SourceEvent>) -> Snapshot {
    for e in events {
        t.apply(e);
    }
    let (snap, _) = t.checkout();
    (*snap).clone()
}

fn cfg() -> RenderConfig {
    RenderConfig {
        local: Some(crate::LocalMatch::Source("10.1.0.0/16".parse().unwrap())),
        ..RenderConfig::default()
    }
}

fn kernel(fake: &FakeIptables) -> KernelTables {
    KernelTables {
        filter: kernel_table(&fake.save(Some(Table::Filter)).unwrap(), Table::Filter).unwrap(),
        nat: kernel_table_for_sync(&fake.save(Some(Table::Nat)).unwrap(), Table::Nat).unwrap(),
    }
}

/// The full payload for `snap` against what `fake` holds (unsplit).
fn full(fake: &FakeIptables, snap: &Snapshot) -> String {
    let rendered = render::render(snap, &cfg(), None);
    full_payload(&rendered, Some(&kernel(fake)), true).0
}

/// The `*table ... COMMIT` blocks of a payload, in order.
fn blocks(payload: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in payload.lines() {
        cur.push_str(line);
        cur.push('\n');
        if line == "COMMIT" {
            out.push(std::mem::take(&mut cur));
        }
    }
    assert!(cur.is_empty(), "text after the last COMMIT: {cur}");
    out
}

/// Chain → rule lines of one table of the fake.
fn chains(fake: &FakeIptables, table: Table) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    let text = fake.save(Some(table)).unwrap();
    let ruleset = kp_netfilter::parse_save(&text).unwrap();
    if let Some(t) = ruleset.tables.get(&table) {
        for (name, chain) in t.ordered_chains() {
            out.insert(
                name.to_string(),
                chain.rules.iter().map(|r| r.to_string()).collect(),
            );
        }
    }
    out
}

/// The DNAT destinations a new connection to `ip:port` can reach from `KUBE-SERVICES`.
fn backends(nat: &BTreeMap<String, Vec<String>>, ip: &str, port: u16) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let entry = format!("-d {ip}/32 ");
    let dport = format!("--dport {port} ");
    let Some(services) = nat.get("KUBE-SERVICES") else {
        return out;
    };
    let svc = services
        .iter()
        .find(|r| r.contains(&entry) && r.contains(&dport) && r.contains("-j KUBE-SVC-"));
    let Some(svc) = svc.and_then(|r| r.rsplit(' ').next()) else {
        return out;
    };
    for rule in nat.get(svc).into_iter().flatten() {
        let Some(sep) = rule.strip_suffix("").and_then(|r| r.rsplit(' ').next()) else {
            continue;
        };
        if !sep.starts_with("KUBE-SEP-") {
            continue;
        }
        for r in nat.get(sep).into_iter().flatten() {
            if let Some(d) = r.split("--to-destination ").nth(1) {
                out.insert(d.split(' ').next().unwrap_or(d).to_string());
            }
        }
    }
    out
}

/// Applies `split` block by block to `fake` (which holds `before`) and checks, after each
/// block, that every jump target exists, that each of our nat chains holds exactly its rules
/// of before or of after (never a mix, never half), and that every Service of `keep` reaches
/// backends all the time. Returns the number of nat blocks applied.
fn apply_step_by_step(
    fake: &FakeIptables,
    payload: &str,
    before: &BTreeMap<String, Vec<String>>,
    after: &BTreeMap<String, Vec<String>>,
    keep: &[(String, BTreeSet<String>, BTreeSet<String>)],
) -> usize {
    let mut nat_blocks = 0;
    for (k, block) in blocks(payload).iter().enumerate() {
        fake.restore(block.as_bytes())
            .unwrap_or_else(|e| panic!("block {k} failed: {e}\n{block}"));
        if !block.starts_with("*nat\n") {
            continue;
        }
        nat_blocks += 1;
        let now = chains(fake, Table::Nat);
        for (chain, rules) in &now {
            for r in rules {
                if let Some(t) = r.split(" -j ").nth(1).map(|t| t.split(' ').next().unwrap())
                    && t.starts_with("KUBE-")
                {
                    assert!(
                        now.contains_key(t),
                        "block {k}: {chain} jumps to missing {t}"
                    );
                }
            }
            if chain.starts_with("KUBE-") && chain != "KUBE-PROXY-CANARY" {
                // A stale chain may also be flushed already (then nothing live jumps to it).
                let flushed_stale = !after.contains_key(chain) && rules.is_empty();
                assert!(
                    before.get(chain) == Some(rules)
                        || after.get(chain) == Some(rules)
                        || flushed_stale,
                    "block {k}: chain {chain} is neither as before nor as after: {rules:#?}"
                );
            }
        }
        // Once a chain that is gone at the end has been flushed, no chain that stays jumps
        // to it (its referrers were rewritten, in earlier blocks).
        for (chain, rules) in &now {
            if !after.contains_key(chain) || rules != &after[chain] {
                continue;
            }
            for r in rules {
                let t = r.rsplit(' ').next().unwrap_or_default();
                assert!(
                    after.contains_key(t) || !now.contains_key(t) || now[t] == before[t],
                    "block {k}: {chain} jumps to the flushed stale chain {t}"
                );
            }
        }
        for (ip, old, new) in keep {
            let got = backends(&now, ip, 80);
            assert!(
                got == *old || got == *new,
                "block {k}: {ip} reaches {got:?}, expected {old:?} or {new:?}"
            );
        }
    }
    nat_blocks
}

#[test]
fn jump_targets_are_read_outside_quotes() {
    assert_eq!(jump_target("-A X -j KUBE-SEP-A"), Some("KUBE-SEP-A"));
    assert_eq!(
        jump_target("-A X -m comment --comment \"a -j B \\\" -g C\" -g KUBE-SVC-D --x"),
        Some("KUBE-SVC-D")
    );
    assert_eq!(jump_target("-A X -m comment --comment \"-j B\""), None);
    assert_eq!(jump_target("-A X -p tcp"), None);
}

#[test]
fn every_state_between_the_transactions_is_correct() {
    // Before: 30 Services with 3 endpoints each.
    let mut t = tracker();
    let mut events = Vec::new();
    for i in 0..30 {
        events.extend(service_events(i, 3, 0));
    }
    let snap_before = snapshot(&mut t, events);
    let fake = FakeIptables::new(IpVersion::V4);
    fake.restore(full(&fake, &snap_before).as_bytes()).unwrap();
    let before = chains(&fake, Table::Nat);

    // After: svc-0..3 deleted, svc-4..9 with other endpoints (new KUBE-SEP chains, old ones
    // stale), svc-30..39 new, the rest unchanged.
    let mut events = Vec::new();
    for i in 0..4 {
        let name = format!("svc-{i}");
        events.push(SourceEvent::SliceDelete(kp_model::NamespacedName::new(
            "default",
            format!("{name}-x"),
        )));
        events.push(SourceEvent::ServiceDelete(kp_model::NamespacedName::new(
            "default",
            name.as_str(),
        )));
    }
    for i in 4..10 {
        events.extend(service_events(i, 2, 2));
    }
    for i in 30..40 {
        events.extend(service_events(i, 3, 0));
    }
    let snap_after = snapshot(&mut t, events);
    let payload = full(&fake, &snap_after);
    let existing = kernel(&fake)
        .nat
        .chains
        .iter()
        .filter(|c| is_service_chain(c))
        .count();
    let split = split_full_payload(&payload, &FINE, existing).unwrap();
    assert!(split.nat_transactions >= 8, "{}", split.nat_transactions);

    // The unsplit payload, applied at once to a copy, gives the expected end state.
    let reference = FakeIptables::new(IpVersion::V4);
    reference
        .restore(fake.save(None).unwrap().as_bytes())
        .unwrap();
    reference.restore(payload.as_bytes()).unwrap();
    let after = chains(&reference, Table::Nat);

    // Services present before and after: what they reach before and after.
    let keep: Vec<(String, BTreeSet<String>, BTreeSet<String>)> = (4..30)
        .map(|i| {
            let ip = format!("10.96.0.{i}");
            (
                ip.clone(),
                backends(&before, &ip, 80),
                backends(&after, &ip, 80),
            )
        })
        .collect();
    for (ip, old, new) in &keep {
        assert!(!old.is_empty() && !new.is_empty(), "{ip}");
    }
    assert_ne!(keep[0].1, keep[0].2, "svc-4's endpoints changed");

    let nat_blocks = apply_step_by_step(&fake, &split.payload, &before, &after, &keep);
    assert_eq!(
        nat_blocks,
        split.nat_transactions + 1,
        "plus the canary block"
    );
    // Same end state as one transaction, every line sent once.
    assert_eq!(fake.save(None).unwrap(), reference.save(None).unwrap());
    let lines = |p: &str| -> Vec<String> {
        let mut v: Vec<String> = p
            .lines()
            .filter(|l| *l != "*nat" && *l != "COMMIT")
            .map(str::to_string)
            .collect();
        v.sort();
        v
    };
    assert_eq!(lines(&split.payload), lines(&payload));
    // The new Services are reachable at the end.
    assert!(!backends(&after, "10.96.0.35", 80).is_empty());
    assert!(backends(&after, "10.96.0.1", 80).is_empty());
}

#[test]
fn transactions_go_leaves_services_entry_then_stale() {
    let mut t = tracker();
    let mut events = Vec::new();
    for i in 0..20 {
        events.extend(service_events(i, 3, 0));
    }
    let snap = snapshot(&mut t, events);
    let fake = FakeIptables::new(IpVersion::V4);
    fake.restore(full(&fake, &snap).as_bytes()).unwrap();
    let mut events = Vec::new();
    for i in 0..3 {
        let name = format!("svc-{i}");
        events.push(SourceEvent::ServiceDelete(kp_model::NamespacedName::new(
            "default",
            name.as_str(),
        )));
    }
    let snap = snapshot(&mut t, events);
    let payload = full(&fake, &snap);
    let split = split_full_payload(&payload, &FINE, 100).unwrap();
    let nat: Vec<String> = blocks(&split.payload)
        .into_iter()
        .filter(|b| b.starts_with("*nat\n") && b != "*nat\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n")
        .collect();
    assert_eq!(nat.len(), split.nat_transactions);
    // 1: the fixed chains without per-Service jumps.
    assert_eq!(
        nat[0],
        "*nat\n:KUBE-POSTROUTING - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n\
         -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n\
         -A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0\n\
         -A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n\
         -A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\nCOMMIT\n"
    );
    let entry = nat
        .iter()
        .position(|b| b.contains(":KUBE-SERVICES - [0:0]"))
        .unwrap();
    // 2: per-Service chains, whole Services per block, nothing of the entry chains.
    for b in &nat[1..entry] {
        assert!(b.contains(":KUBE-SVC-") || b.contains(":KUBE-SEP-"), "{b}");
        assert!(
            !b.contains("KUBE-SERVICES") && !b.contains("KUBE-NODEPORTS"),
            "{b}"
        );
        assert!(!b.contains("-X "), "{b}");
    }
    assert!(entry >= 3, "several blocks of per-Service chains: {entry}");
    // 3: the entry chains, all of them in one block, with no per-Service chain.
    assert!(nat[entry].contains(":KUBE-NODEPORTS - [0:0]"));
    assert!(!nat[entry].contains(":KUBE-SVC-"));
    // 4: then only the stale chains: flushed and deleted.
    assert_eq!(entry, nat.len() - 2, "one stale block at the end");
    let stale = &nat[nat.len() - 1];
    assert!(stale.lines().all(|l| l == "*nat"
        || l == "COMMIT"
        || l.starts_with(":KUBE-")
        || l.starts_with("-X KUBE-")));
    assert_eq!(
        stale.matches(":KUBE-").count(),
        stale.matches("-X ").count()
    );
    assert!(stale.matches("-X ").count() >= 3 * 4);
}

#[test]
fn many_stale_chains_are_all_flushed_before_any_is_deleted() {
    let mut t = tracker();
    let mut events = Vec::new();
    for i in 0..30 {
        events.extend(service_events(i, 4, 0));
    }
    let snap = snapshot(&mut t, events);
    let fake = FakeIptables::new(IpVersion::V4);
    fake.restore(full(&fake, &snap).as_bytes()).unwrap();
    let before = chains(&fake, Table::Nat);
    let mut events = Vec::new();
    for i in 0..25 {
        events.push(SourceEvent::ServiceDelete(kp_model::NamespacedName::new(
            "default",
            format!("svc-{i}"),
        )));
    }
    let snap = snapshot(&mut t, events);
    let payload = full(&fake, &snap);
    let split = split_full_payload(&payload, &FINE, 0).unwrap();
    let nat: Vec<String> = blocks(&split.payload)
        .into_iter()
        .filter(|b| b.contains("-X ") || b.starts_with("*nat\n:KUBE-SEP") && !b.contains("-A "))
        .collect();
    let first_delete = nat.iter().position(|b| b.contains("-X ")).unwrap();
    assert!(first_delete >= 2, "stale chains flushed in several blocks");
    assert!(nat[first_delete..].iter().all(|b| !b.contains(":KUBE-")));
    let reference = FakeIptables::new(IpVersion::V4);
    reference
        .restore(fake.save(None).unwrap().as_bytes())
        .unwrap();
    reference.restore(payload.as_bytes()).unwrap();
    let after = chains(&reference, Table::Nat);
    let keep: Vec<_> = (25..30)
        .map(|i| {
            let ip = format!("10.96.0.{i}");
            let b = backends(&before, &ip, 80);
            (ip, b.clone(), b)
        })
        .collect();
    apply_step_by_step(&fake, &split.payload, &before, &after, &keep);
    assert_eq!(fake.save(None).unwrap(), reference.save(None).unwrap());
}

#[test]
fn small_or_unknown_payloads_are_left_whole() {
    let mut t = tracker();
    let mut events = Vec::new();
    for i in 0..5 {
        events.extend(service_events(i, 3, 0));
    }
    let snap = snapshot(&mut t, events);
    let payload = full(&FakeIptables::new(IpVersion::V4), &snap);
    let lines = match split_full_payload(&payload, &NFT_SPLIT, 0) {
        Err(Unsplit::Small { lines }) => lines,
        other => panic!("{other:?}"),
    };
    assert!(lines < NFT_SPLIT.min_lines);
    assert!(split_full_payload(&payload, &FINE, 0).is_ok());
    let zeroed = payload.replacen("*nat\n", "*nat\n-Z\n", 1);
    assert!(matches!(
        split_full_payload(&zeroed, &FINE, 0),
        Err(Unsplit::Unsupported(_))
    ));
    let policy = payload.replacen("*nat\n", "*nat\n:PREROUTING ACCEPT [0:0]\n", 1);
    assert!(matches!(
        split_full_payload(&policy, &FINE, 0),
        Err(Unsplit::Unsupported(_))
    ));
    assert!(matches!(
        split_full_payload("*filter\nCOMMIT\n", &FINE, 0),
        Err(Unsplit::Unsupported(_))
    ));
}

#[test]
fn blocks_grow_with_the_chains_already_in_the_kernel() {
    assert_eq!(NFT_SPLIT.budget(0), 1_200);
    assert_eq!(NFT_SPLIT.budget(110_000), 1_200 + 110_000 / 16);
    let flat = SplitPolicy {
        existing_chains_per_extra_line: 0,
        ..NFT_SPLIT
    };
    assert_eq!(flat.budget(110_000), 1_200);
}
