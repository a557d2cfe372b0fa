//! Split tests: the order of the transactions, what they hold (the lines of upstream's
//! payload but for the chains the kernel already holds as rendered), and every state between
//! them applied to the checking fake (jumps to missing chains are refused there) kept correct
//! for packets.

use std::collections::{BTreeMap, BTreeSet};

use kp_model::{IpFamily, Snapshot, SourceEvent};
use kp_netfilter::{FakeIptables, IpVersion, Iptables, Table};
use kp_testkit::builders::{ServiceBuilder, SliceBuilder};
use kp_track::Tracker;

use super::*;
use crate::iptables::reconcile::digest::TableReader;
use crate::iptables::reconcile::full::{self, FullSync, Layout, Measure, Options};
use crate::iptables::reconcile::{KernelTables, full_payload};
use crate::iptables::render::{self, RenderCache, RenderConfig, ServiceRules};

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

/// The fake's tables as a full sync reads them.
fn kernel(fake: &FakeIptables) -> KernelTables {
    let read = |table| {
        let mut r = TableReader::new(table);
        for line in fake.save(Some(table)).unwrap().lines() {
            r.line(line);
        }
        r.finish().unwrap()
    };
    KernelTables {
        filter: read(Table::Filter),
        nat: read(Table::Nat),
        mangle: read(Table::Mangle),
    }
}

/// Upstream's full payload for `snap` against what `fake` holds: every chain rewritten, one
/// nat transaction.
fn full(fake: &FakeIptables, snap: &Snapshot) -> String {
    let rendered = render::render(snap, &cfg(), None);
    full_payload(&rendered, Some(&kernel(fake))).0
}

/// The proxier's full sync of `snap` against what `fake` holds, with `policy`.
fn sync_payload(
    fake: &FakeIptables,
    snap: &Snapshot,
    policy: Option<SplitPolicy>,
) -> (String, FullSync, usize) {
    let mut k = kernel(fake);
    full::payload(
        snap,
        &cfg(),
        &mut RenderCache::new(),
        Some(&mut k),
        &Options {
            zero_counters: false,
            split: policy,
        },
    )
}

/// The declaration and rule lines of `payload`, sorted, without the `*table`/`COMMIT` lines
/// and without those of `skip`'s chains (`table/chain`).
fn lines_but(payload: &str, skip: &BTreeSet<String>) -> Vec<String> {
    let mut table = "";
    let mut v = Vec::new();
    for l in payload.lines() {
        if let Some(t) = l.strip_prefix('*') {
            table = t;
            continue;
        }
        if l == "COMMIT" {
            continue;
        }
        let chain = l
            .strip_prefix(':')
            .or_else(|| l.strip_prefix("-A "))
            .map(|r| r.split(' ').next().unwrap());
        if !chain.is_some_and(|c| skip.contains(&format!("{table}/{c}"))) {
            v.push(l.to_string());
        }
    }
    v.sort();
    v
}

/// Two sorted line lists are equal (shows the lines of one only).
fn assert_same_lines(got: &[String], want: &[String]) {
    let (mut g, mut w) = (got.to_vec(), want.to_vec());
    for l in got {
        if let Some(i) = w.iter().position(|x| x == l) {
            w.remove(i);
            let j = g.iter().position(|x| x == l).unwrap();
            g.remove(j);
        }
    }
    assert!(
        g.is_empty() && w.is_empty(),
        "sent but not expected: {g:#?}\nexpected but not sent: {w:#?}"
    );
}

/// The chains of ours in `after` (filter, nat and mangle, as `table/chain`) that `before`
/// holds with the same rules: those a full sync leaves alone (the canaries among them).
fn unchanged(before: &FakeIptables, after: &FakeIptables) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for table in [Table::Filter, Table::Nat, Table::Mangle] {
        let (b, a) = (chains(before, table), chains(after, table));
        for (name, rules) in &a {
            if name.starts_with("KUBE-") && b.get(name) == Some(rules) {
                out.insert(format!("{}/{name}", table.name()));
            }
        }
    }
    out
}

/// Of [`unchanged`], those the sync reports kept (not the canaries).
fn kept(same: &BTreeSet<String>) -> usize {
    same.iter()
        .filter(|c| !c.ends_with("/KUBE-PROXY-CANARY"))
        .count()
}

/// A copy of `fake` with `payload` applied.
fn applied(fake: &FakeIptables, payload: &str) -> FakeIptables {
    let copy = FakeIptables::new(IpVersion::V4);
    copy.restore(fake.save(None).unwrap().as_bytes()).unwrap();
    copy.restore(payload.as_bytes()).unwrap();
    copy
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
    let (payload, plan, nat_transactions) = sync_payload(&fake, &snap_after, Some(FINE));
    assert!(
        matches!(plan.layout, Layout::Split { .. }),
        "{:?}",
        plan.layout
    );
    assert!(nat_transactions >= 5, "{nat_transactions}");

    // Upstream's payload, applied at once to a copy, gives the expected end state.
    let upstream = full(&fake, &snap_after);
    let reference = applied(&fake, &upstream);
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

    // What is sent: upstream's lines but for the chains the kernel holds as they are.
    let same = unchanged(&fake, &reference);
    assert!(same.len() > 20 * 4, "{} chains unchanged", same.len());
    assert_eq!(plan.kept_chains, kept(&same));
    assert_same_lines(
        &lines_but(&payload, &BTreeSet::new()),
        &lines_but(&upstream, &same),
    );
    // An unchanged Service's chains are not named.
    let svc20 = before["KUBE-SERVICES"]
        .iter()
        .find(|r| r.contains("-d 10.96.0.20/32"))
        .and_then(|r| r.rsplit(' ').next())
        .unwrap();
    assert!(!payload.contains(&format!(":{svc20} ")) && !payload.contains(&format!("-A {svc20} ")));

    let nat_blocks = apply_step_by_step(&fake, &payload, &before, &after, &keep);
    assert_eq!(
        nat_blocks, nat_transactions,
        "no canary block: the canary is there"
    );
    // Same end state as upstream's one transaction.
    assert_eq!(fake.save(None).unwrap(), reference.save(None).unwrap());
    // The new Services are reachable at the end.
    assert!(!backends(&after, "10.96.0.35", 80).is_empty());
    assert!(backends(&after, "10.96.0.1", 80).is_empty());
}

#[test]
fn transactions_go_leaves_services_entry_then_stale() {
    // A node where an earlier run (another masquerade bit, other Services) left its chains:
    // every chain of this sync is written, and the old Services' chains are stale.
    let mut t = tracker();
    let mut events = Vec::new();
    for i in 100..103 {
        events.extend(service_events(i, 3, 0));
    }
    let old = snapshot(&mut t, events);
    let fake = FakeIptables::new(IpVersion::V4);
    let old_cfg = RenderConfig {
        masquerade_mark: 1 << 13,
        ..cfg()
    };
    fake.restore(
        full_payload(&render::render(&old, &old_cfg, None), None)
            .0
            .as_bytes(),
    )
    .unwrap();
    let mut events = Vec::new();
    for i in 100..103 {
        events.push(SourceEvent::ServiceDelete(kp_model::NamespacedName::new(
            "default",
            format!("svc-{i}"),
        )));
    }
    for i in 0..20 {
        events.extend(service_events(i, 3, 0));
    }
    let snap = snapshot(&mut t, events);
    let (payload, plan, nat_transactions) = sync_payload(&fake, &snap, Some(FINE));
    // Only the filter chains that stayed empty are as they were.
    let reference = applied(&fake, &full(&fake, &snap));
    let same = unchanged(&fake, &reference);
    assert_eq!(plan.kept_chains, kept(&same));
    assert_same_lines(
        &lines_but(&payload, &BTreeSet::new()),
        &lines_but(&full(&fake, &snap), &same),
    );
    assert!(
        same.iter()
            .all(|c| c.starts_with("filter/") || c.ends_with("/KUBE-PROXY-CANARY")),
        "{same:?}"
    );
    let nat: Vec<String> = blocks(&payload)
        .into_iter()
        .filter(|b| b.starts_with("*nat\n") && b != "*nat\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n")
        .collect();
    assert_eq!(nat.len(), nat_transactions);
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
        // Every rule's chain is declared in its block.
        for line in b.lines().filter(|l| l.starts_with("-A ")) {
            let chain = line[3..].split(' ').next().unwrap();
            assert!(b.contains(&format!(":{chain} - [0:0]")), "{line}");
        }
    }
    assert!(entry >= 3, "several blocks of per-Service chains: {entry}");
    // 3: the entry chains, all of them in one block, with no per-Service chain, and the
    // missing jumps from the built-in chains.
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
    // The same end state as upstream's payload.
    fake.restore(payload.as_bytes()).unwrap();
    assert_eq!(fake.save(None).unwrap(), reference.save(None).unwrap());
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
    let (payload, plan, _) = sync_payload(&fake, &snap, Some(FINE));
    assert!(matches!(plan.layout, Layout::Split { .. }));
    let nat: Vec<String> = blocks(&payload)
        .into_iter()
        .filter(|b| b.contains("-X ") || b.starts_with("*nat\n:KUBE-SEP") && !b.contains("-A "))
        .collect();
    let first_delete = nat.iter().position(|b| b.contains("-X ")).unwrap();
    assert!(first_delete >= 2, "stale chains flushed in several blocks");
    assert!(nat[first_delete..].iter().all(|b| !b.contains(":KUBE-")));
    let reference = applied(&fake, &full(&fake, &snap));
    let after = chains(&reference, Table::Nat);
    let keep: Vec<_> = (25..30)
        .map(|i| {
            let ip = format!("10.96.0.{i}");
            let b = backends(&before, &ip, 80);
            (ip, b.clone(), b)
        })
        .collect();
    apply_step_by_step(&fake, &payload, &before, &after, &keep);
    assert_eq!(fake.save(None).unwrap(), reference.save(None).unwrap());
}

#[test]
fn small_zeroed_or_irregular_payloads_are_one_transaction() {
    let mut t = tracker();
    let mut events = Vec::new();
    for i in 0..5 {
        events.extend(service_events(i, 3, 0));
    }
    let snap = snapshot(&mut t, events);
    let empty = FakeIptables::new(IpVersion::V4);
    let (payload, plan, n) = sync_payload(&empty, &snap, Some(NFT_SPLIT));
    assert_eq!((plan.layout, n), (Layout::One, 1));
    assert!(plan.nat_lines < NFT_SPLIT.min_lines);
    assert_eq!(plan.unsplit, None);
    // On an empty node, one transaction is upstream's payload exactly.
    assert_eq!(payload, full(&empty, &snap));
    let (_, plan, n) = sync_payload(&empty, &snap, Some(FINE));
    assert!(matches!(plan.layout, Layout::Split { budget: 40 }) && n > 3);
    let mut k = kernel(&empty);
    let (zeroed, plan, _) = full::payload(
        &snap,
        &cfg(),
        &mut RenderCache::new(),
        Some(&mut k),
        &Options {
            zero_counters: true,
            split: Some(FINE),
        },
    );
    assert_eq!(plan.layout, Layout::One);
    assert!(zeroed.starts_with("*filter\n-Z\n") && zeroed.contains("*nat\n-Z\n"));

    // A rule of a chain its Service does not declare, or a per-Service chain that jumps to
    // an entry chain: the split does not order those (the render writes neither).
    let rendered = render::render_streamed(
        &snap,
        &cfg(),
        &mut RenderCache::new(),
        render::Stream::Measure(&mut |_| {}),
    );
    for (chains, rules, why) in [
        (
            ":KUBE-SVC-A - [0:0]\n",
            "-A KUBE-SVC-B -j KUBE-MARK-MASQ\n",
            "outside its Service's chains",
        ),
        (
            ":KUBE-SVC-A - [0:0]\n",
            "-A KUBE-SVC-A -j KUBE-SERVICES\n",
            "jumps to chain KUBE-SERVICES",
        ),
    ] {
        let mut m = Measure::new(None);
        m.service(ServiceRules { chains, rules });
        let measured = m.finish();
        let plan = full::plan(
            &rendered,
            None,
            &measured,
            &Options {
                zero_counters: false,
                split: Some(FINE),
            },
        );
        assert_eq!(plan.layout, Layout::One, "{why}");
        assert!(
            plan.unsplit.as_deref().is_some_and(|u| u.contains(why)),
            "{:?}",
            plan.unsplit
        );
    }
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
