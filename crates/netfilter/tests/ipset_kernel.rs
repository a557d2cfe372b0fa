//! ipset against the real kernel: the REAL `ipset` binary, run with `ip netns exec` inside
//! a fresh network namespace per test (ipsets are per network namespace; the namespace,
//! and with it every set, is deleted on drop, even when the test fails). Checks that
//! `ExecIpset` reads back what was written, that `FakeIpset` agrees with the kernel on a
//! sequence of payloads (success or failure, the failing line, the resulting state), that
//! `diff` converges, and how fast 100,000 entries load.
//!
//! Needs root, iproute2 and ipset; skipped with a message otherwise.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use common::{Netns, have, kernel_tests_possible};
use kp_netfilter::ipset::*;
use kp_netfilter::{Error, SystemExec};

fn possible(test: &str) -> bool {
    if !kernel_tests_possible(test) {
        return false;
    }
    if !have("ipset") {
        eprintln!("skipping {test}: ipset is not installed");
        return false;
    }
    true
}

fn runner(ns: &Netns) -> ExecIpset {
    ExecIpset::with_exec(Arc::new(SystemExec::with_prefix(ns.prefix())))
}

/// What must agree between kernel and fake: everything but the hashsize (the kernel
/// grows it) and, for bitmaps, the family.
type Comparable = BTreeMap<
    String,
    (
        SetKind,
        Option<SetFamily>,
        u32,
        Option<(u16, u16)>,
        bool,
        BTreeSet<String>,
    ),
>;

fn comparable(sets: &[SetState]) -> Comparable {
    sets.iter()
        .map(|s| {
            let sp = &s.spec;
            let hash = sp.kind.has_family();
            (
                sp.name.clone(),
                (
                    sp.kind,
                    hash.then_some(sp.family),
                    if hash { sp.maxelem } else { 0 },
                    sp.range,
                    sp.comment,
                    s.entries.clone(),
                ),
            )
        })
        .collect()
}

/// The failing line named in an error, if any.
fn failed_line(e: &Error) -> Option<usize> {
    let Error::Command { stderr, .. } = e else {
        return None;
    };
    let rest = stderr.split_once("Error in line ")?.1;
    rest.split(':').next()?.parse().ok()
}

#[test]
fn version_is_supported() {
    if !possible("version_is_supported") {
        return;
    }
    let ns = Netns::new();
    let v = runner(&ns).version().expect("ipset version");
    assert!(v.is_supported(), "{v}");
    assert!(v.protocol >= 6, "{v:?}");
}

#[test]
fn upstream_set_types_round_trip_in_canonical_form() {
    if !possible("upstream_set_types_round_trip_in_canonical_form") {
        return;
    }
    let ns = Netns::new();
    let ipset = runner(&ns);
    use SetFamily::*;
    use SetKind::*;
    // (spec, entries as written, entries as ipset save prints them)
    let cases: Vec<(SetSpec, Vec<&str>, Vec<&str>)> = vec![
        (
            SetSpec::hash("KUBE-CLUSTER-IP", HashIpPort, Inet),
            vec![
                "10.96.0.1,tcp:443",
                "10.96.0.10,17:53",
                "10.96.0.11,80",
                "10.96.0.12,sctp:9",
            ],
            vec![
                "10.96.0.1,tcp:443",
                "10.96.0.10,udp:53",
                "10.96.0.11,tcp:80",
                "10.96.0.12,sctp:9",
            ],
        ),
        (
            SetSpec::hash("KUBE-6-CLUSTER-IP", HashIpPort, Inet6),
            vec!["2001:0db8:0000::0001,tcp:443", "fd00::a,udplite:7"],
            vec!["2001:db8::1,tcp:443", "fd00::a,udplite:7"],
        ),
        (
            SetSpec::hash("KUBE-LOOP-BACK", HashIpPortIp, Inet),
            vec!["10.0.0.4,tcp:80,10.0.0.4"],
            vec!["10.0.0.4,tcp:80,10.0.0.4"],
        ),
        (
            SetSpec::hash("KUBE-6-LOOP-BACK", HashIpPortIp, Inet6),
            vec!["fd00::4,6:80,fd00:0::4"],
            vec!["fd00::4,tcp:80,fd00::4"],
        ),
        (
            SetSpec::hash("KUBE-LOAD-BALANCER-SOURCE-CIDR", HashIpPortNet, Inet),
            vec![
                "1.2.3.4,tcp:80,10.0.0.0/8",
                "1.2.3.4,tcp:80,10.0.0.1/32",
                "1.2.3.4,tcp:80,10.1.2.3/16",
            ],
            vec![
                "1.2.3.4,tcp:80,10.0.0.0/8",
                "1.2.3.4,tcp:80,10.0.0.1",
                "1.2.3.4,tcp:80,10.1.0.0/16",
            ],
        ),
        (
            SetSpec::hash("KUBE-6-LB-SOURCE-CIDR", HashIpPortNet, Inet6),
            vec!["fd00::1,udp:53,fd00:1::1/64", "fd00::1,udp:53,fd00::2/128"],
            vec!["fd00::1,udp:53,fd00:1::/64", "fd00::1,udp:53,fd00::2"],
        ),
        (
            SetSpec::bitmap_port("KUBE-NODE-PORT-TCP", (0, 65535)),
            vec!["30080", "tcp:30081", "0", "65535"],
            vec!["30080", "30081", "0", "65535"],
        ),
        (
            SetSpec::hash("KUBE-LOAD-BALANCER-SOURCE-IP", HashIp, Inet),
            vec!["10.0.0.1"],
            vec!["10.0.0.1"],
        ),
        (
            SetSpec::hash("KUBE-6-HEALTH-CHECK-IP", HashIp, Inet6),
            vec!["fd00:0:0:0::1", "::ffff:1.2.3.4"],
            vec!["fd00::1", "::ffff:1.2.3.4"],
        ),
        (
            SetSpec::hash("KUBE-NET", HashNet, Inet),
            vec!["10.2.3.4/24", "10.0.0.1/32"],
            vec!["10.2.3.0/24", "10.0.0.1"],
        ),
        (
            SetSpec {
                comment: true,
                maxelem: 1000,
                hashsize: 64,
                ..SetSpec::hash("KUBE-COMMENTED", HashIpPort, Inet)
            },
            vec!["10.0.0.1,tcp:1"],
            vec!["10.0.0.1,tcp:1"],
        ),
    ];
    let mut b = RestoreBuilder::new();
    for (spec, written, printed) in &cases {
        b.create(spec);
        for (w, p) in written.iter().zip(printed) {
            assert_eq!(
                spec.canonical_entry(w).as_deref(),
                Ok(*p),
                "{} {w}",
                spec.kind
            );
            b.add(&spec.name, w);
        }
    }
    let payload = b.finish();
    ipset.restore(&payload).expect("restore upstream set types");
    let fake = FakeIpset::new();
    fake.restore(&payload).expect("fake restore");

    let text = ipset.save_text().expect("save");
    let saved = parse_save(&text).expect("parse save");
    let expected: Vec<SetState> = cases
        .iter()
        .map(|(spec, _, printed)| SetState::with_entries(spec.clone(), printed.iter().copied()))
        .collect();
    assert_eq!(
        comparable(&saved),
        comparable(&expected),
        "kernel save:\n{text}"
    );
    assert_eq!(comparable(&fake.sets()), comparable(&expected));
    // Hash sizes as the kernel reports them for these small sets: what was asked for.
    for s in &saved {
        if s.spec.kind.has_family() {
            let asked = cases.iter().find(|c| c.0.name == s.spec.name).unwrap();
            assert_eq!(s.spec.hashsize, asked.0.hashsize, "{}", s.spec.name);
        }
    }
    // The same payload again is idempotent (everything is -exist).
    ipset.restore(&payload).expect("second restore");
    fake.restore(&payload).expect("second fake restore");
    assert_eq!(comparable(&ipset.save().unwrap()), comparable(&expected));
}

/// Payloads applied in order to both; each entry: the payload and whether it succeeds.
const SEQUENCE: &[(&str, bool)] = &[
    (
        "create KUBE-A hash:ip,port family inet hashsize 1024 maxelem 65536\n\
         add KUBE-A 10.0.0.1,tcp:80\nadd KUBE-A 10.0.0.2,udp:53\n\
         create KUBE-B hash:ip family inet6\nadd KUBE-B fd00::1\n",
        true,
    ),
    (
        "create KUBE-A hash:ip,port family inet hashsize 1024 maxelem 65536\n",
        false,
    ),
    (
        "create KUBE-A hash:ip,port family inet hashsize 4096 maxelem 65536 -exist\n",
        true,
    ),
    ("create KUBE-A hash:ip family inet -exist\n", false),
    (
        "create KUBE-A hash:ip,port family inet maxelem 100 -exist\n",
        false,
    ),
    (
        "create KUBE-A hash:ip,port family inet comment -exist\n",
        false,
    ),
    // Kernel refusal at line 2: line 1 stays applied.
    (
        "add KUBE-A 10.0.0.3,tcp:80\nadd KUBE-A 10.0.0.1,tcp:80\nadd KUBE-A 10.0.0.4,tcp:80\n",
        false,
    ),
    (
        "add KUBE-A 10.0.0.1,tcp:80 -exist\ndel -exist KUBE-A 10.9.9.9,tcp:1\n",
        true,
    ),
    ("del KUBE-A 10.9.9.9,tcp:1\n", false),
    // A syntax error (wrong family) drops the collected adds before it.
    (
        "add KUBE-A 10.0.0.5,tcp:80\nadd KUBE-A fd00::1,tcp:80\n",
        false,
    ),
    // ... but not the ones sent before a create.
    (
        "add KUBE-A 10.0.0.6,tcp:80\ncreate KUBE-C bitmap:port range 0-65535\n\
         add KUBE-C 30080\nadd KUBE-C tcp:30081\nadd KUBE-NOPE 1.2.3.4\n",
        false,
    ),
    (
        "create KUBE-D bitmap:port range 0-1000\nadd KUBE-D 80\nadd KUBE-D 1001\n",
        false,
    ),
    (
        "create KUBE-E hash:net family inet\nadd KUBE-E 10.1.2.3/16\n\
         add KUBE-E 10.0.0.1/32\nadd KUBE-E 10.0.0.0/0\n",
        false,
    ),
    (
        "create KUBE-F hash:ip,port,net family inet6\nadd KUBE-F fd00::1,tcp:80,fd00:1::/64\n\
         create KUBE-G hash:ip,port,ip family inet\nadd KUBE-G 10.0.0.4,6:80,10.0.0.4\n",
        true,
    ),
    (
        "create KUBE-T hash:ip,port family inet6\nadd KUBE-T fd00::9,sctp:9\nswap KUBE-T KUBE-A\n",
        false,
    ),
    ("swap KUBE-T KUBE-B\n", false),
    (
        "create KUBE-T2 hash:ip family inet6 maxelem 10\nadd KUBE-T2 fd00::2\n\
         swap KUBE-T2 KUBE-B\ndestroy KUBE-T2\n",
        true,
    ),
    ("flush KUBE-NOPE\n", false),
    ("destroy KUBE-NOPE\n", false),
    (
        "flush KUBE-E\nrename KUBE-E KUBE-E2\ndestroy KUBE-E2\n",
        true,
    ),
    ("add KUBE-A 10.0.0.7,tcp:80\nflush KUBE-NOPE\n", false),
    ("add KUBE-A 10.0.0.8,tcp:80 bogus\n", false),
    (
        "# a comment\n\nadd KUBE-A 10.0.0.9,tcp:80\nCOMMIT\nadd KUBE-A 10.0.0.10,tcp:80\n",
        true,
    ),
    (
        "create KUBE-H hash:ip comment\nadd KUBE-H 1.1.1.1 comment \"x y\"\n\
         add KUBE-A 10.0.0.11,tcp:80 comment \"no\"\n",
        false,
    ),
    (
        "add KUBE-H 1.1.1.2 comment \"x y\"\nadd KUBE-H 1.1.1.3\n",
        true,
    ),
    (
        "create KUBE-1234567890123456789012345678901 hash:ip\n",
        false,
    ),
    // Kernel quirk: -exist does not compare the family.
    ("create KUBE-A hash:ip,port family inet6 -exist\n", true),
    (
        "add KUBE-A 10.0.0.12,tcp:80\ndel KUBE-A 10.0.0.12,tcp:80\n\
         del KUBE-A 10.0.0.12,tcp:80\nadd KUBE-A 10.0.0.13,tcp:80\n",
        false,
    ),
    (
        "create KUBE-M hash:ip family inet maxelem 2\nadd KUBE-M 1.1.1.1\nadd KUBE-M 1.1.1.2\nadd KUBE-M 1.1.1.3\n",
        false,
    ),
    (
        "create KUBE-D bitmap:port range 0-1000 -exist\ncreate KUBE-D bitmap:port range 0-2000 -exist\n",
        false,
    ),
];

#[test]
fn fake_agrees_with_kernel() {
    if !possible("fake_agrees_with_kernel") {
        return;
    }
    let ns = Netns::new();
    let ipset = runner(&ns);
    let fake = FakeIpset::new();
    for (i, (payload, ok)) in SEQUENCE.iter().enumerate() {
        let real = ipset.restore(payload.as_bytes());
        let faked = fake.restore(payload.as_bytes());
        assert_eq!(real.is_ok(), *ok, "step {i}: kernel: {real:?}\n{payload}");
        assert_eq!(faked.is_ok(), *ok, "step {i}: fake: {faked:?}\n{payload}");
        if let (Err(r), Err(f)) = (&real, &faked) {
            if let Some(line) = failed_line(r) {
                assert_eq!(failed_line(f), Some(line), "step {i}: {r} / {f}");
            }
            assert!(
                failed_line(f).is_some(),
                "step {i}: the fake names the line: {f}"
            );
        }
        let text = ipset.save_text().expect("save");
        let saved = parse_save(&text).expect("parse");
        assert_eq!(
            comparable(&saved),
            comparable(&fake.sets()),
            "step {i} after\n{payload}\nkernel:\n{text}\nfake:\n{}",
            fake.save_text()
        );
    }
}

#[test]
fn destroy_of_a_referenced_set_fails_alike() {
    if !possible("destroy_of_a_referenced_set_fails_alike") || !have("iptables") {
        return;
    }
    let ns = Netns::new();
    let ipset = runner(&ns);
    let fake = FakeIpset::new();
    let create = "create KUBE-X hash:ip family inet\n";
    ipset.restore(create.as_bytes()).unwrap();
    fake.restore(create.as_bytes()).unwrap();
    let out = ns.run(
        &[
            "iptables",
            "-A",
            "INPUT",
            "-m",
            "set",
            "--match-set",
            "KUBE-X",
            "src",
            "-j",
            "ACCEPT",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    fake.set_in_use("KUBE-X", true);
    let real = ipset.restore(b"destroy KUBE-X\n").unwrap_err();
    let faked = fake.restore(b"destroy KUBE-X\n").unwrap_err();
    assert!(real.to_string().contains("in use"), "{real}");
    assert!(faked.to_string().contains("in use"), "{faked}");
    // flush and swap-in stay possible while referenced: what diff relies on.
    let swap = "create KUBE-IPSET-SWAP-TMP hash:ip family inet maxelem 10\n\
                add KUBE-IPSET-SWAP-TMP 1.2.3.4\nswap KUBE-IPSET-SWAP-TMP KUBE-X\n\
                destroy KUBE-IPSET-SWAP-TMP\nflush KUBE-X\n";
    ipset.restore(swap.as_bytes()).unwrap();
    fake.restore(swap.as_bytes()).unwrap();
    assert_eq!(comparable(&ipset.save().unwrap()), comparable(&fake.sets()));
}

#[test]
fn diff_converges_on_the_kernel_and_the_fake() {
    if !possible("diff_converges_on_the_kernel_and_the_fake") {
        return;
    }
    let ns = Netns::new();
    let ipset = runner(&ns);
    let fake = FakeIpset::new();
    let start = "create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536\n\
                 add KUBE-CLUSTER-IP 10.96.0.1,tcp:443\nadd KUBE-CLUSTER-IP 10.96.0.9,udp:53\n\
                 create KUBE-LOOP-BACK hash:ip,port,ip family inet maxelem 100\n\
                 add KUBE-LOOP-BACK 10.0.0.4,tcp:80,10.0.0.4\n\
                 create KUBE-NODE-PORT-TCP hash:ip family inet\n\
                 create KUBE-IPSET-SWAP-TMP hash:ip family inet6\n\
                 create OTHER hash:ip family inet\n";
    ipset.restore(start.as_bytes()).unwrap();
    fake.restore(start.as_bytes()).unwrap();
    let desired = vec![
        SetState::with_entries(
            SetSpec::hash("KUBE-CLUSTER-IP", SetKind::HashIpPort, SetFamily::Inet),
            ["10.96.0.1,tcp:443", "10.96.0.10,6:53"],
        ),
        // maxelem changed: built aside and swapped in.
        SetState::with_entries(
            SetSpec::hash("KUBE-LOOP-BACK", SetKind::HashIpPortIp, SetFamily::Inet),
            ["10.0.0.4,tcp:80,10.0.0.4", "10.0.0.5,tcp:80,10.0.0.5"],
        ),
        // type changed: destroyed and re-created.
        SetState::with_entries(
            SetSpec::bitmap_port("KUBE-NODE-PORT-TCP", (0, 65535)),
            ["30080"],
        ),
        SetState::with_entries(
            SetSpec::hash("KUBE-6-CLUSTER-IP", SetKind::HashIpPort, SetFamily::Inet6),
            ["fd00::1,tcp:80"],
        ),
    ];
    let current = ipset.save().unwrap();
    assert_eq!(comparable(&current), comparable(&fake.save().unwrap()));
    let payload = diff(&desired, &current);
    let text = String::from_utf8(payload.clone()).unwrap();
    ipset
        .restore(&payload)
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    fake.restore(&payload)
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    let after = ipset.save().unwrap();
    assert_eq!(comparable(&after), comparable(&fake.sets()), "{text}");
    let mine: Vec<SetState> = after
        .iter()
        .filter(|s| desired.iter().any(|d| d.spec.name == s.spec.name))
        .cloned()
        .collect();
    let canonical: Vec<SetState> = desired
        .iter()
        .map(|d| {
            SetState::with_entries(
                d.spec.clone(),
                d.entries.iter().map(|e| d.spec.canonical_entry(e).unwrap()),
            )
        })
        .collect();
    assert_eq!(comparable(&mine), comparable(&canonical), "{text}");
    assert!(
        after.iter().any(|s| s.spec.name == "OTHER"),
        "others are left alone"
    );
    assert!(!after.iter().any(|s| s.spec.name == TEMP_SET_NAME));
    assert!(
        diff(&desired, &after).is_empty(),
        "{:?}",
        String::from_utf8(diff(&desired, &after))
    );
}

#[test]
fn restore_of_100k_entries() {
    if !possible("restore_of_100k_entries") {
        return;
    }
    let ns = Netns::new();
    let ipset = runner(&ns);
    let spec = SetSpec {
        maxelem: 262_144,
        ..SetSpec::hash("KUBE-CLUSTER-IP", SetKind::HashIpPort, SetFamily::Inet)
    };
    let mut b = RestoreBuilder::new();
    b.create(&spec);
    for i in 0..100_000u32 {
        let ip = std::net::Ipv4Addr::from(0x0a60_0000 + i);
        b.add(&spec.name, &format!("{ip},tcp:{}", 80 + i % 7));
    }
    let payload = b.finish();
    let started = Instant::now();
    ipset.restore(&payload).expect("restore 100k");
    let restore = started.elapsed();
    let started = Instant::now();
    let sets = ipset.save().expect("save 100k");
    let save = started.elapsed();
    eprintln!(
        "ipset restore of 100,000 entries ({} bytes): {restore:?}; ipset save + parse: {save:?}",
        payload.len()
    );
    assert_eq!(sets[0].entries.len(), 100_000);
    let fake = FakeIpset::new();
    let started = Instant::now();
    fake.restore(&payload).unwrap();
    eprintln!(
        "FakeIpset restore of the same payload: {:?}",
        started.elapsed()
    );
    assert_eq!(comparable(&sets), comparable(&fake.sets()));
    // A diff against the loaded state is empty, and computing it is cheap.
    let started = Instant::now();
    assert!(
        diff(
            &[SetState {
                spec,
                entries: sets[0].entries.clone()
            }],
            &sets
        )
        .is_empty()
    );
    eprintln!("diff of 100,000 unchanged entries: {:?}", started.elapsed());
}
