//! Semantics of `FakeIptables`: each kernel check, per-table transactions, `:CHAIN`
//! flush semantics under `--noflush`, counters and failure injection, and a large
//! ruleset to keep it honest about cost.

use std::time::Instant;

use kp_netfilter::*;

fn fake_with(setup: &str) -> FakeIptables {
    let f = FakeIptables::new(IpVersion::V4);
    f.restore(setup.as_bytes()).expect("setup restore");
    f
}

const SETUP: &str = "*nat
:KUBE-A - [0:0]
:KUBE-B - [0:0]
-A PREROUTING -j KUBE-A
-A KUBE-A -j KUBE-B
-A KUBE-B -j RETURN
COMMIT
";

/// Restores `payload`, expects failure, and checks nothing changed.
fn fails(f: &FakeIptables, payload: &str, needle: &str) {
    let before = f.ruleset();
    let err = f.restore(payload.as_bytes()).unwrap_err();
    match &err {
        Error::Command {
            command,
            status,
            stderr,
        } => {
            assert_eq!(command, "iptables-restore --noflush --counters");
            assert_ne!(*status, 0);
            assert!(stderr.starts_with("iptables-restore: line "), "{stderr}");
            assert!(
                stderr.contains(needle),
                "{payload:?}: {stderr:?} lacks {needle:?}"
            );
        }
        e => panic!("unexpected {e:?}"),
    }
    assert_eq!(f.ruleset(), before, "{payload:?} changed state");
}

fn nat_text(f: &FakeIptables) -> String {
    f.save(Some(Table::Nat)).unwrap()
}

#[test]
fn save_prints_canonical_form() {
    let f = fake_with(SETUP);
    assert_eq!(
        nat_text(&f),
        "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-A - [0:0]\n:KUBE-B - [0:0]\n-A PREROUTING -j KUBE-A\n-A KUBE-A -j KUBE-B\n-A KUBE-B -j RETURN\nCOMMIT\n"
    );
    // Untouched tables print their builtins only; save(None) prints touched tables.
    assert_eq!(
        f.save(Some(Table::Raw)).unwrap(),
        "*raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n"
    );
    assert!(f.save(None).unwrap().starts_with("*nat\n"));
    assert!(!f.save(None).unwrap().contains("*filter"));
    assert_eq!(parse_save(&f.save(None).unwrap()).unwrap(), f.ruleset());
}

#[test]
fn restore_canonicalises_rules() {
    let f = fake_with(
        "*nat\n:X - [0:0]\n-A X -j MARK --or-mark 0x4000\n-A X -m statistic --mode random --probability 0.3333333333 -j RETURN\n-A X -p tcp --dport 80 -s 10.1.2.3/8 -j RETURN\nCOMMIT\n*filter\n-A INPUT -j REJECT\n-A INPUT -m recent --set\nCOMMIT\n",
    );
    let nat = nat_text(&f);
    assert!(nat.contains("-A X -j MARK --set-xmark 0x4000/0x4000\n"));
    assert!(nat.contains("--probability 0.33333333349 -j RETURN\n"));
    assert!(nat.contains("-A X -s 10.0.0.0/8 -p tcp -m tcp --dport 80 -j RETURN\n"));
    let filter = f.save(Some(Table::Filter)).unwrap();
    assert!(filter.contains("-A INPUT -j REJECT --reject-with icmp-port-unreachable\n"));
    assert!(
        filter
            .contains("-A INPUT -m recent --set --name DEFAULT --mask 255.255.255.255 --rsource\n")
    );
}

#[test]
fn jump_to_missing_chain_fails() {
    let f = fake_with(SETUP);
    fails(
        &f,
        "*nat\n-A KUBE-A -j KUBE-MISSING\nCOMMIT\n",
        "line 2 failed: Chain 'KUBE-MISSING' does not exist",
    );
    fails(
        &f,
        "*nat\n-A KUBE-A -g KUBE-MISSING\nCOMMIT\n",
        "KUBE-MISSING",
    );
    // Declared later in the same payload is too late.
    fails(
        &f,
        "*nat\n-A KUBE-A -j KUBE-C\n:KUBE-C - [0:0]\nCOMMIT\n",
        "line 2 failed",
    );
    // Jumping to a builtin chain is not allowed either.
    fails(&f, "*nat\n-A KUBE-A -j OUTPUT\nCOMMIT\n", "OUTPUT");
    // A chain of another table does not count.
    fails(&f, "*filter\n-A INPUT -j KUBE-A\nCOMMIT\n", "KUBE-A");
    // Declared earlier in the same payload is fine.
    f.restore(b"*nat\n:KUBE-C - [0:0]\n-A KUBE-A -j KUBE-C\nCOMMIT\n")
        .unwrap();
}

#[test]
fn delete_chain_checks() {
    let f = fake_with(SETUP);
    // Still has rules.
    fails(&f, "*nat\n-X KUBE-B\nCOMMIT\n", "not empty");
    // Empty but referenced.
    fails(
        &f,
        "*nat\n-F KUBE-B\n-X KUBE-B\nCOMMIT\n",
        "referenced by 1 rule",
    );
    fails(
        &f,
        "*nat\n:KUBE-B - [0:0]\n-X KUBE-B\nCOMMIT\n",
        "referenced",
    );
    // Missing and builtin.
    fails(
        &f,
        "*nat\n-X KUBE-NOPE\nCOMMIT\n",
        "No chain/target/match by that name",
    );
    fails(&f, "*nat\n-X PREROUTING\nCOMMIT\n", "No chain/target/match");
    // -X without a chain deletes every user chain, failing if any is in use.
    fails(&f, "*nat\n-X\nCOMMIT\n", "not empty");
    // Unreference then delete works.
    f.restore(b"*nat\n:KUBE-A - [0:0]\n:KUBE-B - [0:0]\n-X KUBE-B\nCOMMIT\n")
        .unwrap();
    assert!(f.ruleset().chain(Table::Nat, "KUBE-B").is_none());
    // A self-reference goes away with the flush.
    f.restore(b"*nat\n-N C\n-A C -j C\n-F C\n-X C\nCOMMIT\n")
        .unwrap();
    f.restore(b"*nat\n-F\n-X\nCOMMIT\n").unwrap();
    assert_eq!(
        f.ruleset().tables[&Table::Nat],
        TableRules::with_builtins(Table::Nat)
    );
}

#[test]
fn flush_delete_rule_and_missing_chain_checks() {
    let f = fake_with(SETUP);
    fails(&f, "*nat\n-F KUBE-NOPE\nCOMMIT\n", "No chain");
    fails(&f, "*nat\n-Z KUBE-NOPE\nCOMMIT\n", "No chain");
    fails(&f, "*nat\n-A KUBE-NOPE -j RETURN\nCOMMIT\n", "No chain");
    fails(&f, "*nat\n-D KUBE-NOPE 1\nCOMMIT\n", "No chain");
    fails(
        &f,
        "*nat\n-D KUBE-B -j ACCEPT\nCOMMIT\n",
        "Bad rule (does a matching rule exist",
    );
    fails(
        &f,
        "*nat\n-D KUBE-B 2\nCOMMIT\n",
        "Index of deletion too big",
    );
    fails(
        &f,
        "*nat\n-I KUBE-B 3 -j RETURN\nCOMMIT\n",
        "Index of insertion too big",
    );
    fails(
        &f,
        "*nat\n-R KUBE-B 2 -j RETURN\nCOMMIT\n",
        "Index of replacement too big",
    );
    // Delete by spec matches the canonical form.
    f.restore(b"*nat\n-A KUBE-B -d 1.2.3.4 -j MARK --set-mark 0x1\n-D KUBE-B -d 1.2.3.4/32 -j MARK --set-xmark 0x1/0xffffffff\nCOMMIT\n")
        .unwrap();
    // Insert / replace / delete by index.
    f.restore(b"*nat\n-I KUBE-B 2 -j ACCEPT\n-I KUBE-B -s 10.0.0.1 -j RETURN\n-R KUBE-B 3 -d 10.0.0.2 -j RETURN\n-D KUBE-B 2\nCOMMIT\n")
        .unwrap();
    let rules: Vec<String> = f
        .ruleset()
        .chain(Table::Nat, "KUBE-B")
        .unwrap()
        .rules
        .iter()
        .map(|r| r.to_string())
        .collect();
    assert_eq!(
        rules,
        [
            "-A KUBE-B -s 10.0.0.1/32 -j RETURN",
            "-A KUBE-B -d 10.0.0.2/32 -j RETURN"
        ]
    );
}

#[test]
fn new_chain_checks() {
    let f = fake_with(SETUP);
    fails(&f, "*nat\n-N KUBE-A\nCOMMIT\n", "Chain already exists");
    fails(&f, "*nat\n-N POSTROUTING\nCOMMIT\n", "Chain already exists");
    fails(&f, "*nat\n-N ACCEPT\nCOMMIT\n", "clash with target name");
    fails(&f, "*nat\n-N DNAT\nCOMMIT\n", "clash");
    fails(
        &f,
        "*nat\n-N ABCDEFGHIJKLMNOPQRSTUVWXYZ012\nCOMMIT\n",
        "too long",
    );
    fails(
        &f,
        "*nat\n:ABCDEFGHIJKLMNOPQRSTUVWXYZ012 - [0:0]\nCOMMIT\n",
        "too long",
    );
    f.restore(b"*nat\n-N ABCDEFGHIJKLMNOPQRSTUVWXYZ01\nCOMMIT\n")
        .unwrap();
    // A chain named like another table's builtin is an ordinary user chain here.
    f.restore(b"*raw\n-N INPUT\n-A INPUT -j RETURN\n-A PREROUTING -j INPUT\nCOMMIT\n")
        .unwrap();
}

#[test]
fn structure_checks() {
    let f = fake_with(SETUP);
    fails(&f, "*nat\n-A KUBE-A -j RETURN\n", "COMMIT expected");
    fails(&f, "*bogus\nCOMMIT\n", "table name 'bogus' invalid");
    fails(&f, "-A KUBE-A -j RETURN\nCOMMIT\n", "outside of a table");
    fails(&f, "*nat\n*filter\nCOMMIT\n", "line 2");
    fails(&f, "COMMIT\n", "line 1");
    fails(
        &f,
        "*nat\n-A KUBE-A -m comment --comment \"open\nCOMMIT\n",
        "unterminated",
    );
    fails(
        &f,
        "*nat\n-A KUBE-A -s bad -j RETURN\nCOMMIT\n",
        "line 2: host/network",
    );
    // Empty payload and comment-only payload are fine.
    f.restore(b"").unwrap();
    f.restore(b"# nothing\n\n").unwrap();
}

#[test]
fn builtin_chains_and_policies() {
    let f = FakeIptables::new(IpVersion::V4);
    for (t, chains) in [
        (Table::Filter, &["INPUT", "FORWARD", "OUTPUT"][..]),
        (
            Table::Nat,
            &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"][..],
        ),
        (
            Table::Mangle,
            &["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"][..],
        ),
        (Table::Raw, &["PREROUTING", "OUTPUT"][..]),
    ] {
        let payload = format!("*{t}\n-F\n-X\nCOMMIT\n");
        f.restore(payload.as_bytes()).unwrap();
        let rules = f.table(t);
        let names: Vec<&str> = rules.ordered_chains().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, chains);
        for c in chains {
            fails(&f, &format!("*{t}\n-X {c}\nCOMMIT\n"), "No chain");
        }
    }
    // `:BUILTIN -` leaves it alone; a policy sets it (with counters under --counters).
    f.restore(b"*filter\n-A INPUT -j ACCEPT\n:INPUT - [0:0]\n:FORWARD DROP [5:10]\nCOMMIT\n")
        .unwrap();
    let filter = f.table(Table::Filter);
    assert_eq!(
        filter.chains["INPUT"].rules.len(),
        1,
        "builtins are not flushed by `:`"
    );
    assert_eq!(filter.chains["FORWARD"].policy.as_deref(), Some("DROP"));
    assert_eq!(
        filter.chains["FORWARD"].counters,
        Counters {
            packets: 5,
            bytes: 10
        }
    );
    f.restore(b"*filter\n-P FORWARD ACCEPT\n-Z\nCOMMIT\n")
        .unwrap();
    let filter = f.table(Table::Filter);
    assert_eq!(filter.chains["FORWARD"].policy.as_deref(), Some("ACCEPT"));
    assert_eq!(filter.chains["FORWARD"].counters, Counters::default());
    fails(
        &f,
        "*nat\n:PREROUTING DROP [0:0]\nCOMMIT\n",
        "DROP is therefore inhibited",
    );
    fails(&f, "*nat\n-P OUTPUT DROP\nCOMMIT\n", "inhibited");
    fails(&f, "*filter\n-P OUTPUT MAYBE\nCOMMIT\n", "Bad policy");
    f.restore(b"*filter\n-N U\nCOMMIT\n").unwrap();
    fails(
        &f,
        "*filter\n-P U DROP\nCOMMIT\n",
        "Bad built-in chain name",
    );
    fails(&f, "*filter\n:U ACCEPT [0:0]\nCOMMIT\n", "Can't set policy");
}

#[test]
fn user_chain_declaration_creates_or_flushes() {
    let f = fake_with(SETUP);
    f.restore(b"*nat\n:KUBE-A - [0:0]\n:KUBE-NEW - [0:0]\nCOMMIT\n")
        .unwrap();
    let nat = f.table(Table::Nat);
    assert!(nat.chains["KUBE-A"].rules.is_empty());
    assert!(nat.chains["KUBE-NEW"].rules.is_empty());
    assert_eq!(
        nat.chains["KUBE-B"].rules.len(),
        1,
        "undeclared chains are left alone"
    );
    assert_eq!(nat.chains["PREROUTING"].rules.len(), 1);
    // KUBE-B is no longer referenced (KUBE-A was flushed), so it can go now.
    f.restore(b"*nat\n-F KUBE-B\n-X KUBE-B\nCOMMIT\n").unwrap();
}

#[test]
fn target_and_match_checks() {
    let f = fake_with(SETUP);
    fails(&f, "*nat\n-A KUBE-A -j DROP\nCOMMIT\n", "inhibited");
    fails(
        &f,
        "*nat\n-A KUBE-A -j REJECT\nCOMMIT\n",
        "only valid in filter",
    );
    fails(
        &f,
        "*filter\n-A INPUT -j DNAT --to-destination 1.2.3.4\nCOMMIT\n",
        "only valid in nat",
    );
    fails(
        &f,
        "*mangle\n-A INPUT -j MASQUERADE\nCOMMIT\n",
        "only valid in nat",
    );
    fails(
        &f,
        "*filter\n-A INPUT -m tcp --dport 80 -j ACCEPT\nCOMMIT\n",
        "TCP match requires '-p tcp'",
    );
    fails(
        &f,
        "*filter\n-A INPUT -p udp -m tcp -j ACCEPT\nCOMMIT\n",
        "requires",
    );
    fails(
        &f,
        "*filter\n-A INPUT ! -p tcp -m tcp -j ACCEPT\nCOMMIT\n",
        "requires",
    );
    fails(
        &f,
        "*filter\n-A INPUT -m multiport --dports 1,2 -j ACCEPT\nCOMMIT\n",
        "multiport needs",
    );
    fails(
        &f,
        "*nat\n-A KUBE-A -j DNAT --to-destination 1.2.3.4:80\nCOMMIT\n",
        "port specification",
    );
    fails(
        &f,
        "*nat\n-A KUBE-A -j MASQUERADE --to-ports 80\nCOMMIT\n",
        "port specification",
    );
    fails(
        &f,
        "*nat\n-A KUBE-A -s fd00::1 -j RETURN\nCOMMIT\n",
        "not an V4 address",
    );
    fails(
        &f,
        "*nat\n-A KUBE-A -p tcp -j DNAT --to-destination [fd00::1]:80\nCOMMIT\n",
        "V4",
    );
    fails(
        &f,
        "*filter\n-A INPUT -j REJECT --reject-with icmp6-no-route\nCOMMIT\n",
        "unknown reject type",
    );
    // MARK works in any table, and all of these are fine.
    f.restore(b"*filter\n-A INPUT -j MARK --set-xmark 0x1/0x1\n-A INPUT -p udp -m udp --dport 53 -j ACCEPT\n-A INPUT -p tcp -m multiport --dports 1,2 -j ACCEPT\nCOMMIT\n")
        .unwrap();

    let f6 = FakeIptables::new(IpVersion::V6);
    f6.restore(b"*filter\n-A INPUT -s fd00::/64 -j REJECT --reject-with port-unreach\nCOMMIT\n")
        .unwrap();
    assert!(
        f6.save(Some(Table::Filter))
            .unwrap()
            .contains("-A INPUT -s fd00::/64 -j REJECT --reject-with icmp6-port-unreachable")
    );
    let err = f6
        .restore(b"*filter\n-A INPUT -s 10.0.0.1 -j ACCEPT\nCOMMIT\n")
        .unwrap_err();
    assert!(err.to_string().contains("V6"), "{err}");
}

#[test]
fn tables_commit_separately() {
    let f = fake_with(SETUP);
    let err = f
        .restore(
            b"*filter\n:KUBE-F - [0:0]\nCOMMIT\n*nat\n:KUBE-A - [0:0]\n-A KUBE-A -j NOPE\nCOMMIT\n",
        )
        .unwrap_err();
    assert!(err.to_string().contains("line 6 failed"), "{err}");
    // filter (committed before the error) stays; nat is untouched.
    assert!(f.ruleset().chain(Table::Filter, "KUBE-F").is_some());
    assert_eq!(f.table(Table::Nat).chains["KUBE-A"].rules.len(), 1);
}

#[test]
fn counters_payload_and_injected_failure() {
    let f = FakeIptables::new(IpVersion::V4);
    assert_eq!(f.restore_count(), 0);
    assert_eq!(f.last_payload(), None);
    f.restore(b"*nat\n:X - [0:0]\nCOMMIT\n").unwrap();
    f.fail_next_restore("iptables-restore: line 1 failed: injected");
    let err = f.restore(b"*nat\n-A X -j RETURN\nCOMMIT\n").unwrap_err();
    assert!(
        matches!(&err, Error::Command { status: 1, stderr, .. } if stderr.contains("injected"))
    );
    assert_eq!(f.restore_count(), 2);
    assert_eq!(f.last_payload().unwrap(), b"*nat\n-A X -j RETURN\nCOMMIT\n");
    assert!(
        f.table(Table::Nat).chains["X"].rules.is_empty(),
        "injected failure applies nothing"
    );
    // Only the next restore fails.
    f.restore(b"*nat\n-A X -j RETURN\nCOMMIT\n").unwrap();
    assert_eq!(f.table(Table::Nat).chains["X"].rules.len(), 1);
    f.save(None).unwrap();
    assert_eq!(f.save_count(), 1);
    assert_eq!(f.ip_version(), IpVersion::V4);
    assert_eq!(f.version().unwrap().backend, NetfilterBackend::NfTables);
    let old = IptablesVersion {
        major: 1,
        minor: 4,
        patch: 21,
        backend: NetfilterBackend::Legacy,
    };
    let f = FakeIptables::new(IpVersion::V6).with_version(old);
    assert!(!f.version().unwrap().supports_random_fully());
}

#[test]
fn rule_counters_are_accepted_but_not_saved() {
    let f = FakeIptables::new(IpVersion::V4);
    f.restore(b"*filter\n[5:6] -A INPUT -j ACCEPT\n-A INPUT -c 1 2 -j DROP\nCOMMIT\n")
        .unwrap();
    assert_eq!(
        f.save(Some(Table::Filter)).unwrap(),
        "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\n-A INPUT -j DROP\nCOMMIT\n"
    );
}

/// A kube-proxy-shaped payload for `services` services with `endpoints` endpoints each.
fn big_payload(services: usize, endpoints: usize, generation: usize) -> String {
    let mut chains = String::new();
    let mut rules = String::new();
    chains.push_str("*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n");
    rules.push_str("-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n");
    for s in 0..services {
        let svc = format!("KUBE-SVC-{s:016X}");
        chains.push_str(&format!(":{svc} - [0:0]\n"));
        let (a, b) = (s / 256 % 256, s % 256);
        rules.push_str(&format!(
            "-A KUBE-SERVICES -d 10.96.{a}.{b}/32 -p tcp -m comment --comment \"ns/svc-{s}:http cluster IP\" -m tcp --dport 80 -j {svc}\n"
        ));
        for e in 0..endpoints {
            let sep = format!("KUBE-SEP-{s:012X}{e:04X}");
            chains.push_str(&format!(":{sep} - [0:0]\n"));
            let left = endpoints - e;
            if left > 1 {
                let p = 1.0 / left as f64;
                rules.push_str(&format!(
                    "-A {svc} -m comment --comment \"ns/svc-{s}:http -> 10.{}.{a}.{b}:8080\" -m statistic --mode random --probability {p:.10} -j {sep}\n",
                    e + generation
                ));
            } else {
                rules.push_str(&format!(
                    "-A {svc} -m comment --comment \"ns/svc-{s}:http -> 10.{}.{a}.{b}:8080\" -j {sep}\n",
                    e + generation
                ));
            }
            rules.push_str(&format!(
                "-A {sep} -s 10.{e}.{a}.{b}/32 -m comment --comment ns/svc-{s}:http -j KUBE-MARK-MASQ\n-A {sep} -p tcp -m comment --comment ns/svc-{s}:http -m tcp -j DNAT --to-destination 10.{e}.{a}.{b}:8080\n"
            ));
        }
    }
    format!("{chains}{rules}COMMIT\n")
}

#[test]
fn large_rulesets_are_cheap() {
    // 8k services x 4 endpoints ~ 100k rules; a full resync of the same shape, then a
    // small partial update, like the proxier does.
    let f = FakeIptables::new(IpVersion::V4);
    let start = Instant::now();
    let payload = big_payload(8_000, 4, 0);
    f.restore(payload.as_bytes()).unwrap();
    let first = start.elapsed();
    let n = f.ruleset().rule_count();
    assert_eq!(n, 1 + 8_000 * (1 + 4 * 3));
    let start = Instant::now();
    f.restore(big_payload(8_000, 4, 1).as_bytes()).unwrap();
    let second = start.elapsed();
    let start = Instant::now();
    f.restore(b"*nat\n:KUBE-SVC-0000000000000000 - [0:0]\n-A KUBE-SVC-0000000000000000 -j KUBE-SEP-0000000000000000\nCOMMIT\n")
        .unwrap();
    let partial = start.elapsed();
    eprintln!("{n} rules: first restore {first:?}, full resync {second:?}, partial {partial:?}");
    // Generous bounds (debug build, shared CI); a per-rule linear scan would blow them.
    assert!(first.as_secs() < 60 && second.as_secs() < 60);
    assert!(
        partial.as_millis() < 2_000,
        "partial restore took {partial:?}"
    );
}
