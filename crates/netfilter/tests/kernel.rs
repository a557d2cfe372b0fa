//! Kernel tests: run the REAL iptables binaries (nft and legacy backends) inside a
//! fresh network namespace per test (deleted on drop, even on failure) and check that
//! `iptables-save` output, parsed by `parse_save` and printed by `Display`, equals the
//! save text rule for rule; and that `FakeIptables` agrees with the kernel on a
//! sequence of restores, including failing ones.
//!
//! Needs root (CI runs as root); skipped with a message otherwise.

mod common;

use std::sync::Arc;

use common::{Netns, have, kernel_tests_possible, save_lines};
use kp_netfilter::*;

const KUBE_NAT: &str = r#"*nat
:KUBE-SERVICES - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-SVC-HL5LMXD5JFHQZ6LN - [0:0]
:KUBE-SEP-GS5MQAG4332XHLUZ - [0:0]
:KUBE-SEP-OTHER - [0:0]
:KUBE-EXTRA - [0:0]
-I PREROUTING 1 -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-SERVICES -d 10.96.138.71/32 -p tcp -m comment --comment "default/nginx-svc cluster IP" -m tcp --dport 8080 -j KUBE-SVC-HL5LMXD5JFHQZ6LN
-A KUBE-SVC-HL5LMXD5JFHQZ6LN ! -s 10.0.0.0/16 -d 10.96.138.71/32 -p tcp -m comment --comment "default/nginx-svc cluster IP" -m tcp --dport 8080 -j KUBE-MARK-MASQ
-A KUBE-SVC-HL5LMXD5JFHQZ6LN -m comment --comment "default/nginx-svc -> 10.0.0.4:80" -m recent --rcheck --seconds 10800 --reap --name KUBE-SEP-GS5MQAG4332XHLUZ --mask 255.255.255.255 --rsource -j KUBE-SEP-GS5MQAG4332XHLUZ
-A KUBE-SVC-HL5LMXD5JFHQZ6LN -m comment --comment "default/nginx-svc -> 10.0.0.4:80" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-GS5MQAG4332XHLUZ
-A KUBE-SVC-HL5LMXD5JFHQZ6LN -m comment --comment "default/nginx-svc -> 10.0.0.5:80" -m statistic --mode random --probability 0.3333333333 -j KUBE-SEP-OTHER
-A KUBE-SVC-HL5LMXD5JFHQZ6LN -m comment --comment "default/nginx-svc -> 10.0.0.6:80" -j KUBE-SEP-OTHER
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-SEP-GS5MQAG4332XHLUZ -s 10.0.0.4/32 -m comment --comment default/nginx-svc -j KUBE-MARK-MASQ
-A KUBE-SEP-GS5MQAG4332XHLUZ -p tcp -m comment --comment default/nginx-svc -m recent --set --name KUBE-SEP-GS5MQAG4332XHLUZ --mask 255.255.255.255 --rsource -m tcp -j DNAT --to-destination 10.0.0.4:80
-A KUBE-SEP-OTHER -p udp -m comment --comment plain_word-1 -m udp -j DNAT --to-destination 10.0.0.5:53 --random --persistent
-A KUBE-NODEPORTS -p tcp -m comment --comment "default/nginx-svc:http" -m tcp --dport 30080 -j KUBE-SVC-HL5LMXD5JFHQZ6LN
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-EXTRA -p tcp -j DNAT --to-destination 10.0.0.1-10.0.0.9:80-90
-A KUBE-EXTRA -p tcp -j DNAT --to-destination :8080
-A KUBE-EXTRA -j DNAT --to-destination 10.0.0.1
-A KUBE-EXTRA -p tcp -j SNAT --to-source 10.0.0.1 --random-fully
-A KUBE-EXTRA -p tcp -j MASQUERADE --to-ports 1000-2000 --random
-A KUBE-EXTRA -p udp -j MASQUERADE --to-ports 53
-A KUBE-EXTRA -j MARK --set-mark 0x4000
-A KUBE-EXTRA -j MARK --set-mark 1/2
-A KUBE-EXTRA -j MARK --and-mark 0x4000
-A KUBE-EXTRA -j MARK --set-xmark 0x10
-A KUBE-EXTRA -m statistic --mode random --probability 0.1 -j RETURN
-A KUBE-EXTRA -m statistic --mode random --probability 1 -j RETURN
-A KUBE-EXTRA -m statistic --mode random ! --probability 0.25 -j RETURN
-A KUBE-EXTRA -m statistic --mode nth --every 3 --packet 1 -j RETURN
-A KUBE-EXTRA -m mark --mark 16384 -j RETURN
-A KUBE-EXTRA -s 10.1.2.3/8 -d 1.2.3.4 -j RETURN
-A KUBE-EXTRA -s 10.1.2.3/255.255.0.0 -j RETURN
-A KUBE-EXTRA -m addrtype --src-type LOCAL,UNICAST --dst-type LOCAL --limit-iface-out -j RETURN
-A KUBE-EXTRA -p 47 -j RETURN
-A KUBE-EXTRA -p TCP -j RETURN
-A KUBE-EXTRA -p all -j RETURN
COMMIT
"#;

const KUBE_FILTER: &str = r#"*filter
:KUBE-FORWARD - [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-EXTRA - [0:0]
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A INPUT -j KUBE-FIREWALL
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
-A KUBE-EXTERNAL-SERVICES -d 192.168.1.10/32 -p tcp -m comment --comment "default/svc:http has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable
-A KUBE-EXTERNAL-SERVICES -p tcp -m comment --comment "default/svc:np has no endpoints" -m addrtype --dst-type LOCAL -m tcp --dport 30080 -j REJECT
-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
-A KUBE-EXTRA -m recent --set --name KUBE-X --rsource -j ACCEPT
-A KUBE-EXTRA -m recent --rcheck --seconds 10800 --reap --name KUBE-X --mask 255.255.255.255 --rsource -j ACCEPT
-A KUBE-EXTRA -m recent ! --update --seconds 60 --hitcount 3 --rttl --name Y --rdest -j DROP
-A KUBE-EXTRA -p tcp -m multiport --dports 80,443,8000:8080 -j ACCEPT
-A KUBE-EXTRA -p udp -m multiport ! --sports 53,5353 -j ACCEPT
-A KUBE-EXTRA -p tcp -m multiport --ports 1,2 -j ACCEPT
-A KUBE-EXTRA -m state --state NEW,ESTABLISHED -j ACCEPT
-A KUBE-EXTRA -m conntrack --ctstatus CONFIRMED,ASSURED -j ACCEPT
-A KUBE-EXTRA -m conntrack ! --ctstatus CONFIRMED ! --ctstate NEW -j ACCEPT
-A KUBE-EXTRA -m physdev ! --physdev-is-in -j ACCEPT
-A KUBE-EXTRA -m physdev --physdev-in eth0 ! --physdev-out eth1 --physdev-is-bridged -j ACCEPT
-A KUBE-EXTRA -i eth+ ! -o lo -j ACCEPT
-A KUBE-EXTRA -p tcp -m tcp --sport 1000:2000 ! --dport 22 -j REJECT --reject-with tcp-reset
-A KUBE-EXTRA -p tcp -m tcp --dport 0:65535 -j ACCEPT
-A KUBE-EXTRA -p tcp --dport 7 -j ACCEPT
-A KUBE-EXTRA -p sctp -m sctp --dport 9 -j ACCEPT
-A KUBE-EXTRA -m addrtype ! --src-type LOCAL --limit-iface-in -j ACCEPT
-A KUBE-EXTRA -p tcp -f -j DROP
-A KUBE-EXTRA -j REJECT --reject-with host-unreach
-A KUBE-EXTRA -g KUBE-FORWARD
-A KUBE-EXTRA -m comment --comment "a \"quoted\" 'thing' \\ here" -j RETURN
-A KUBE-EXTRA -m comment --comment "" -j RETURN
-A KUBE-EXTRA -m comment --comment "tab	in" -j RETURN
-A KUBE-EXTRA -p tcp -m tcp --tcp-flags SYN,ACK SYN -j LOG --log-prefix "kp test: "
-A KUBE-EXTRA -m mark ! --mark 0x8000/0x8000 -j RETURN
-A KUBE-EXTRA -m mark --mark 010 -j RETURN
"#;

/// Rules needing ipsets (created in the namespace when `ipset` exists).
const KUBE_FILTER_SETS: &str = "-A KUBE-EXTRA -m set --match-set KUBE-TEST-IPPORT dst,dst -j ACCEPT
-A KUBE-EXTRA -m set ! --match-set KUBE-TEST-IP src -j ACCEPT
";

const KUBE_NAT_V6: &str = r#"*nat
:KUBE-SERVICES - [0:0]
:KUBE-SEP-V6 - [0:0]
:KUBE-MARK-MASQ - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -d fd00:10:96::1/128 -p tcp -m comment --comment "default/v6 cluster IP" -m tcp --dport 80 -j KUBE-SEP-V6
-A KUBE-SERVICES ! -s fd00:10::/64 -d fd00:10:96::1 -p tcp -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SEP-V6 -s FD00:0:0::1/128 -j KUBE-MARK-MASQ
-A KUBE-SEP-V6 -p tcp -m recent --set --name KUBE-SEP-V6 --rsource -m tcp -j DNAT --to-destination [fd00::1]:8080
-A KUBE-SEP-V6 -p tcp -m tcp -j DNAT --to-destination [fd00::1]
-A KUBE-SEP-V6 -p tcp -m tcp -j DNAT --to-destination [fd00::1-fd00::5]:80-90
-A KUBE-SEP-V6 -p icmpv6 -j RETURN
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
COMMIT
*filter
:KUBE-EXTRA - [0:0]
-A KUBE-EXTRA -j REJECT
-A KUBE-EXTRA -p tcp -j REJECT --reject-with tcp-reset
-A KUBE-EXTRA -m recent --rcheck --seconds 5 --name X --mask ffff:ffff:: -j ACCEPT
COMMIT
"#;

fn runner(ns: &Netns, v: IpVersion, backend: Backend) -> ExecIptables {
    ExecIptables::with_exec(v, backend, Arc::new(SystemExec::with_prefix(ns.prefix())))
}

fn with_ipsets(ns: &Netns) -> bool {
    if !have("ipset") {
        eprintln!("ipset binary not found: skipping the -m set rules");
        return false;
    }
    for (name, kind) in [
        ("KUBE-TEST-IPPORT", "hash:ip,port"),
        ("KUBE-TEST-IP", "hash:ip"),
    ] {
        let out = ns.run(&["ipset", "create", name, kind], None);
        if !out.status.success() {
            eprintln!(
                "ipset create failed ({}): skipping the -m set rules",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return false;
        }
    }
    true
}

/// Parses `text`, prints it back and compares line by line with the original.
fn assert_display_matches_save(text: &str, what: &str) -> Ruleset {
    let rs = parse_save(text).unwrap_or_else(|e| panic!("{what}: parse_save: {e}\n{text}"));
    let printed = rs.to_string();
    let want = save_lines(text);
    let got = save_lines(&printed);
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        assert_eq!(g, w, "{what}: line {} differs", i + 1);
    }
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: line count differs\n{printed}"
    );
    rs
}

fn round_trip(backend: Backend) {
    let ns = Netns::new();
    let ipt = runner(&ns, IpVersion::V4, backend);
    let version = ipt.version().expect("iptables --version");
    let expected_backend = match backend {
        Backend::Legacy => NetfilterBackend::Legacy,
        _ => version.backend,
    };
    assert_eq!(version.backend, expected_backend);
    let mut filter = KUBE_FILTER.to_string();
    let sets = with_ipsets(&ns);
    if sets {
        filter.push_str(KUBE_FILTER_SETS);
    }
    filter.push_str("COMMIT\n");
    let payload = format!("{KUBE_NAT}{filter}");
    ipt.restore(payload.as_bytes())
        .unwrap_or_else(|e| panic!("{backend:?}: restore failed: {e}"));

    let fake = FakeIptables::new(IpVersion::V4);
    fake.restore(payload.as_bytes()).expect("fake restore");

    let mut rule_count = 0;
    for table in [Table::Nat, Table::Filter] {
        let text = ipt.save(Some(table)).expect("iptables-save");
        let rs = assert_display_matches_save(&text, &format!("{backend:?} {table}"));
        let kernel = &rs.tables[&table];
        rule_count += kernel.chains.values().map(|c| c.rules.len()).sum::<usize>();
        // The fake canonicalises the restore input to exactly what the kernel holds.
        let fake_table = fake.table(table);
        for (name, chain) in &kernel.chains {
            let fc = fake_table
                .chains
                .get(name)
                .unwrap_or_else(|| panic!("fake lacks chain {name}"));
            for (i, (k, f)) in chain.rules.iter().zip(&fc.rules).enumerate() {
                assert_eq!(
                    f,
                    k,
                    "{backend:?} {table} {name} rule {}: fake {f} kernel {k}",
                    i + 1
                );
            }
            assert_eq!(fc.rules.len(), chain.rules.len(), "{table} {name}");
        }
        assert_eq!(&fake_table, kernel, "{backend:?} {table}: fake differs");

        // Quirks the Display must reproduce (checked against the kernel's own text).
        if table == Table::Nat {
            for needle in [
                "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000",
                "-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0",
                "--probability 0.50000000000 -j KUBE-SEP-GS5MQAG4332XHLUZ",
                "--probability 0.33333333349 -j KUBE-SEP-OTHER",
                "-A KUBE-SEP-GS5MQAG4332XHLUZ -s 10.0.0.4/32 -m comment --comment \"default/nginx-svc\" -j KUBE-MARK-MASQ",
                "-m comment --comment plain_word-1 -m udp",
                "-A KUBE-EXTRA -j MARK --set-xmark 0x0/0xffffbfff",
                "-A KUBE-EXTRA -s 10.0.0.0/8 -d 1.2.3.4/32 -j RETURN",
                "-A KUBE-EXTRA -p gre -j RETURN",
            ] {
                assert!(
                    text.contains(needle),
                    "{backend:?}: missing {needle:?} in\n{text}"
                );
            }
        } else {
            for needle in [
                "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
                "--name KUBE-X --mask 255.255.255.255 --rsource -j ACCEPT",
                "-A KUBE-EXTRA -j REJECT --reject-with icmp-host-unreachable",
                r#"--comment "a \"quoted\" \'thing\' \\ here""#,
            ] {
                assert!(
                    text.contains(needle),
                    "{backend:?}: missing {needle:?} in\n{text}"
                );
            }
            if sets {
                assert!(text.contains("-m set --match-set KUBE-TEST-IPPORT dst,dst -j ACCEPT"));
                assert!(text.contains("-m set ! --match-set KUBE-TEST-IP src -j ACCEPT"));
            }
        }
    }
    assert!(rule_count >= 70, "only {rule_count} rules");
}

fn round_trip_v6(backend: Backend) {
    let ns = Netns::new();
    let ipt = runner(&ns, IpVersion::V6, backend);
    ipt.restore(KUBE_NAT_V6.as_bytes())
        .unwrap_or_else(|e| panic!("{backend:?}: ip6tables-restore failed: {e}"));
    let fake = FakeIptables::new(IpVersion::V6);
    fake.restore(KUBE_NAT_V6.as_bytes()).expect("fake restore");
    for table in [Table::Nat, Table::Filter] {
        let text = ipt.save(Some(table)).expect("ip6tables-save");
        let rs = assert_display_matches_save(&text, &format!("v6 {backend:?} {table}"));
        assert_eq!(
            fake.table(table),
            rs.tables[&table],
            "v6 {backend:?} {table}"
        );
    }
    let nat = ipt.save(Some(Table::Nat)).unwrap();
    assert!(nat.contains("--to-destination [fd00::1]:8080"));
    assert!(nat.contains("-j DNAT --to-destination fd00::1\n"));
    assert!(nat.contains("-p ipv6-icmp"));
    let filter = ipt.save(Some(Table::Filter)).unwrap();
    assert!(filter.contains("-j REJECT --reject-with icmp6-port-unreachable"));
}

#[test]
fn kube_proxy_rules_round_trip_nft_default() {
    if kernel_tests_possible("kube_proxy_rules_round_trip_nft_default") {
        round_trip(Backend::Default);
    }
}

#[test]
fn kube_proxy_rules_round_trip_legacy() {
    if kernel_tests_possible("kube_proxy_rules_round_trip_legacy") {
        round_trip(Backend::Legacy);
    }
}

#[test]
fn ipv6_rules_round_trip_nft_default() {
    if kernel_tests_possible("ipv6_rules_round_trip_nft_default") {
        round_trip_v6(Backend::Default);
    }
}

#[test]
fn ipv6_rules_round_trip_legacy() {
    if kernel_tests_possible("ipv6_rules_round_trip_legacy") {
        round_trip_v6(Backend::Legacy);
    }
}

/// Restore steps: payload and whether it must succeed.
const STEPS: &[(&str, bool)] = &[
    (
        "*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-A - [0:0]
:KUBE-SEP-A1 - [0:0]
:KUBE-SEP-A2 - [0:0]
:KUBE-MARK-MASQ - [0:0]
-A PREROUTING -j KUBE-SERVICES
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m comment --comment \"default/a\" -m tcp --dport 80 -j KUBE-SVC-A
-A KUBE-SVC-A -m statistic --mode random --probability 0.5 -j KUBE-SEP-A1
-A KUBE-SVC-A -j KUBE-SEP-A2
-A KUBE-SEP-A1 -s 10.0.0.1 -j KUBE-MARK-MASQ
-A KUBE-SEP-A1 -p tcp -m tcp -j DNAT --to-destination 10.0.0.1:8080
-A KUBE-SEP-A2 -p tcp -m tcp -j DNAT --to-destination 10.0.0.2:8080
COMMIT
*filter
:KUBE-FORWARD - [0:0]
-A FORWARD -j KUBE-FORWARD
-A KUBE-FORWARD -m mark --mark 0x4000/0x4000 -j ACCEPT
COMMIT
",
        true,
    ),
    // A jump to a chain that does not exist: the whole nat block (including the flush
    // by declaration) is discarded.
    (
        "*nat\n:KUBE-SVC-A - [0:0]\n-A KUBE-SVC-A -j KUBE-SEP-MISSING\nCOMMIT\n",
        false,
    ),
    // -X of an empty chain that is still referenced.
    ("*nat\n:KUBE-SEP-A2 - [0:0]\n-X KUBE-SEP-A2\nCOMMIT\n", false),
    // Endpoint removal the way kube-proxy does it.
    (
        "*nat\n:KUBE-SVC-A - [0:0]\n:KUBE-SEP-A2 - [0:0]\n-A KUBE-SVC-A -j KUBE-SEP-A1\n-X KUBE-SEP-A2\nCOMMIT\n",
        true,
    ),
    // -X of a non-empty, referenced chain.
    ("*nat\n-X KUBE-SEP-A1\nCOMMIT\n", false),
    // -N of an existing chain.
    ("*nat\n-N KUBE-SERVICES\nCOMMIT\n", false),
    // -N of a builtin chain.
    ("*nat\n-N OUTPUT\nCOMMIT\n", false),
    // Two tables, the second fails: the first stays committed.
    (
        "*filter\n-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\nCOMMIT\n*nat\n-A KUBE-SERVICES -j NOPE\nCOMMIT\n",
        false,
    ),
    // Missing COMMIT: nothing applied.
    ("*filter\n-A KUBE-FORWARD -j ACCEPT\n", false),
    (
        "*filter
-I KUBE-FORWARD 2 -m comment --comment \"inserted\" -j ACCEPT
-R KUBE-FORWARD 1 -m mark --mark 0x4000/0x4000 -m comment --comment replaced -j ACCEPT
-A KUBE-FORWARD -s 10.0.0.0/8 -j RETURN
-A KUBE-FORWARD -p tcp -m tcp --dport 22 -j REJECT
-D KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-D KUBE-FORWARD -p tcp -m tcp --dport 22 -j REJECT --reject-with icmp-port-unreachable
-I KUBE-FORWARD -j RETURN
-D KUBE-FORWARD 1
COMMIT
",
        true,
    ),
    ("*filter\n-D KUBE-FORWARD -j DROP\nCOMMIT\n", false),
    ("*filter\n-D KUBE-FORWARD 99\nCOMMIT\n", false),
    ("*filter\n-I KUBE-FORWARD 99 -j ACCEPT\nCOMMIT\n", false),
    ("*filter\n-R KUBE-FORWARD 99 -j ACCEPT\nCOMMIT\n", false),
    ("*nat\n-A KUBE-SERVICES -j DROP\nCOMMIT\n", false),
    ("*nat\n-X PREROUTING\nCOMMIT\n", false),
    ("*filter\n-F NOPE\nCOMMIT\n", false),
    ("*filter\n-A NOPE -j ACCEPT\nCOMMIT\n", false),
    ("*bogus\nCOMMIT\n", false),
    ("*filter\n-A KUBE-FORWARD -j INPUT\nCOMMIT\n", false),
    ("*filter\n-A KUBE-FORWARD -m tcp --dport 80 -j ACCEPT\nCOMMIT\n", false),
    ("*filter\n-A KUBE-FORWARD -m multiport --dports 80 -j ACCEPT\nCOMMIT\n", false),
    ("*nat\n-A KUBE-SERVICES -j DNAT --to-destination 1.2.3.4:80\nCOMMIT\n", false),
    ("*filter\n-A KUBE-FORWARD -j DNAT --to-destination 1.2.3.4\nCOMMIT\n", false),
    ("*nat\n-A KUBE-SERVICES -j REJECT\nCOMMIT\n", false),
    ("*filter\n-N ACCEPT\nCOMMIT\n", false),
    ("*filter\n-N ABCDEFGHIJKLMNOPQRSTUVWXYZ012\nCOMMIT\n", false),
    ("*filter\n-N ABCDEFGHIJKLMNOPQRSTUVWXYZ01\nCOMMIT\n", true),
    ("*filter\n:FORWARD DROP [0:0]\n-P OUTPUT ACCEPT\nCOMMIT\n", true),
    ("*nat\n-P OUTPUT DROP\nCOMMIT\n", false),
    ("*filter\n-Z\n-F\n-X\nCOMMIT\n", true),
    ("*nat\n-F\n-X\nCOMMIT\n", true),
];

fn agree(backend: Backend) {
    let ns = Netns::new();
    let ipt = runner(&ns, IpVersion::V4, backend);
    let fake = FakeIptables::new(IpVersion::V4);
    for (i, (payload, want_ok)) in STEPS.iter().enumerate() {
        let kernel = ipt.restore(payload.as_bytes());
        let faked = fake.restore(payload.as_bytes());
        let step = format!("{backend:?} step {}: {payload:?}", i + 1);
        assert_eq!(
            kernel.is_ok(),
            faked.is_ok(),
            "{step}: kernel {kernel:?} vs fake {faked:?}"
        );
        assert_eq!(kernel.is_ok(), *want_ok, "{step}: kernel {kernel:?}");
        for err in [kernel.err(), faked.err()].into_iter().flatten() {
            match err {
                Error::Command {
                    command,
                    status,
                    stderr,
                } => {
                    assert!(
                        command.contains("-restore --noflush --counters"),
                        "{command}"
                    );
                    assert_ne!(status, 0);
                    assert!(!stderr.is_empty(), "{step}: empty stderr");
                }
                other => panic!("{step}: unexpected error {other:?}"),
            }
        }
        for table in [Table::Nat, Table::Filter] {
            let text = ipt.save(Some(table)).expect("save");
            let k = parse_save(&text).expect("parse kernel save");
            let f = parse_save(&fake.save(Some(table)).unwrap()).expect("parse fake save");
            assert_eq!(
                f.tables[&table],
                k.tables[&table],
                "{step}: {table} differs\nkernel:\n{text}\nfake:\n{}",
                fake.save(Some(table)).unwrap()
            );
        }
    }
}

#[test]
fn fake_agrees_with_kernel_nft_default() {
    if kernel_tests_possible("fake_agrees_with_kernel_nft_default") {
        agree(Backend::Default);
    }
}

#[test]
fn fake_agrees_with_kernel_legacy() {
    if kernel_tests_possible("fake_agrees_with_kernel_legacy") {
        agree(Backend::Legacy);
    }
}

#[test]
fn failed_restore_reports_command_status_and_stderr() {
    if !kernel_tests_possible("failed_restore_reports_command_status_and_stderr") {
        return;
    }
    let ns = Netns::new();
    for backend in [Backend::Default, Backend::Legacy] {
        let ipt = runner(&ns, IpVersion::V4, backend);
        let err = ipt
            .restore(b"*filter\n-A INPUT -j KUBE-NOPE\nCOMMIT\n")
            .unwrap_err();
        let Error::Command {
            command,
            status,
            stderr,
        } = err
        else {
            panic!("unexpected {err:?}");
        };
        assert!(command.starts_with("ip netns exec "), "{command}");
        assert!(
            command.ends_with("-restore --noflush --counters --wait=5"),
            "{command}"
        );
        assert_ne!(status, 0);
        assert!(stderr.contains("KUBE-NOPE"), "{stderr}");
    }
}

/// `chain_exists` against the real binaries of both backends and families, and the fake on
/// the same steps: a chain created in mangle, nat and filter by one restore that names a
/// table twice (as a full sync's canary blocks do), then `-F` and `-X` of the nat table as
/// an operator or a firewall reload would run them.
#[test]
fn chain_exists_agrees_with_the_kernel() {
    if !kernel_tests_possible("chain_exists_agrees_with_the_kernel") {
        return;
    }
    const CANARY: &str = "KUBE-PROXY-CANARY";
    let create = "*filter\n:KUBE-SERVICES - [0:0]\nCOMMIT\n*nat\n:KUBE-SERVICES - [0:0]\nCOMMIT\n\
                  *mangle\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n*nat\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n\
                  *filter\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n";
    for backend in [Backend::Default, Backend::Legacy] {
        for v in [IpVersion::V4, IpVersion::V6] {
            let ns = Netns::new();
            let ipt = runner(&ns, v, backend);
            let fake = FakeIptables::new(v);
            let what = format!("{backend:?} {v:?}");
            let both = |table: Table, chain: &str| {
                let kernel = ipt.chain_exists(table, chain).unwrap();
                let faked = fake.chain_exists(table, chain).unwrap();
                assert_eq!(kernel, faked, "{what}: {table} {chain}");
                kernel
            };
            for t in [Table::Mangle, Table::Nat, Table::Filter] {
                assert!(!both(t, CANARY), "{what}: no canary before the restore");
                assert!(both(t, "OUTPUT"), "{what}: built-in chains exist");
            }
            ipt.restore(create.as_bytes()).unwrap();
            fake.restore(create.as_bytes()).unwrap();
            for t in [Table::Mangle, Table::Nat, Table::Filter] {
                assert!(both(t, CANARY), "{what}: {t}");
            }
            assert!(both(Table::Nat, "KUBE-SERVICES"));
            let flush = "*nat\n-F\n-X\nCOMMIT\n";
            ipt.restore(flush.as_bytes()).unwrap();
            fake.restore(flush.as_bytes()).unwrap();
            assert!(!both(Table::Nat, CANARY), "{what}: gone with nat -X");
            assert!(!both(Table::Nat, "KUBE-SERVICES"));
            assert!(both(Table::Mangle, CANARY) && both(Table::Filter, CANARY));
        }
    }
}
