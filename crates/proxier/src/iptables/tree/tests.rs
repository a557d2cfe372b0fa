//! Tree builder tests: depth, stability under one change, determinism, and that walking the
//! tree finds exactly the entries of a packet's key.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::*;

fn v4(n: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(n))
}

fn tcp(addr: IpAddr, port: u16) -> Key {
    Key::new(addr, "tcp", port)
}

/// A deterministic pseudo-random sequence (an LCG; the tests need no real randomness).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// `n` distinct ClusterIPs drawn from 10.96.0.0/12, as the API server allocates them.
fn random_cluster_ips(n: usize, seed: u64) -> Vec<Key> {
    let mut rng = Lcg(seed);
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    while out.len() < n {
        let a = 0x0A60_0000 | (rng.next() as u32 & 0x000F_FFFF);
        if seen.insert(a) {
            out.push(tcp(v4(a), 80));
        }
    }
    out
}

/// The entry text the tests use: unique per key and position.
fn tail(k: &Key, i: usize) -> String {
    format!(
        " -d {}/32 -p {} -m {} --dport {} -j KUBE-SVC-{i}\n",
        k.addr,
        k.proto_name(),
        k.proto_name(),
        k.port
    )
}

/// Every chain's rules as text, by name; entries are named by their key, not their index,
/// so trees of different inputs compare.
fn texts(tree: &Tree, keys: &[Key]) -> BTreeMap<String, String> {
    let tails: Vec<String> = keys
        .iter()
        .map(|k| {
            format!(
                " -d {}/32 -p {} --dport {} -j X\n",
                k.addr,
                k.proto_name(),
                k.port
            )
        })
        .collect();
    let refs: Vec<&str> = tails.iter().map(String::as_str).collect();
    tree.chains
        .iter()
        .map(|c| {
            let mut s = String::new();
            write_chain(c, &refs, &[], &mut s);
            (c.name.clone(), s)
        })
        .collect()
}

fn log2_ceil(n: usize) -> usize {
    (usize::BITS - n.saturating_sub(1).leading_zeros()) as usize
}

#[test]
fn ten_thousand_addresses_give_a_logarithmic_depth() {
    for keys in [
        random_cluster_ips(10_000, 7),
        (1..=10_000u32)
            .map(|i| tcp(v4(0x0A60_0000 + i), 80))
            .collect(),
    ] {
        let tree = build(&keys, DEFAULT_LEAF_RULES);
        let levels = log2_ceil(keys.len() / DEFAULT_LEAF_RULES);
        // A few levels of slack: a binary trie on random bits is not perfectly balanced.
        assert!(
            tree.depth() <= levels + 5,
            "depth {} for {} addresses (log2(n/16) = {levels})",
            tree.depth(),
            keys.len()
        );
        // Two rules per interior chain, at most a leaf's worth at the bottom: against
        // 10,000 rules in upstream's KUBE-SERVICES.
        assert!(
            tree.max_rules_walked() <= 2 * (levels + 5) + DEFAULT_LEAF_RULES,
            "{} rules walked",
            tree.max_rules_walked()
        );
        // Every entry is in exactly one leaf, and every chain name fits iptables' limit.
        let mut entries: Vec<usize> = tree
            .chains
            .iter()
            .flat_map(|c| &c.rules)
            .filter_map(|r| match r {
                TreeRule::Entry(i) => Some(*i),
                TreeRule::Child { .. } => None,
            })
            .collect();
        entries.sort_unstable();
        assert_eq!(entries, (0..keys.len()).collect::<Vec<_>>());
        assert!(tree.chains.iter().all(|c| c.name.len() <= 28));
        let names: BTreeSet<&str> = tree.chains.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names.len(), tree.chains.len(), "chain names are unique");
    }
}

/// The chains that differ between `a` and `b` (added, removed or with other rules).
fn changed(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> BTreeSet<String> {
    a.keys()
        .chain(b.keys())
        .filter(|n| a.get(*n) != b.get(*n))
        .cloned()
        .collect()
}

/// Every changed chain is on the path to `entry` in `tree`, or a child of a chain on it.
fn assert_on_path(tree: &Tree, entry: usize, changed: &BTreeSet<String>, old: &Tree) {
    let path = tree.path_to(entry);
    assert!(!path.is_empty());
    let mut allowed: BTreeSet<String> = path.iter().cloned().collect();
    for t in [tree, old] {
        for c in &t.chains {
            if path.contains(&c.name) {
                for r in &c.rules {
                    if let TreeRule::Child { chain, .. } = r {
                        allowed.insert(chain.clone());
                    }
                }
            }
        }
    }
    let outside: Vec<&String> = changed.difference(&allowed).collect();
    assert!(
        outside.is_empty(),
        "chains off the path changed: {outside:?} (path {path:?})"
    );
    assert!(
        changed.len() <= 2 * path.len() + 2,
        "{} chains changed on a path of {}",
        changed.len(),
        path.len()
    );
}

#[test]
fn adding_or_removing_one_address_changes_only_its_path() {
    let base = random_cluster_ips(2_000, 11);
    let before = build(&base, DEFAULT_LEAF_RULES);
    let before_text = texts(&before, &base);
    let mut rng = Lcg(99);
    for _ in 0..200 {
        // Add one address, at a random place in upstream's order.
        let a = loop {
            let a = tcp(v4(0x0A60_0000 | (rng.next() as u32 & 0x000F_FFFF)), 80);
            if !base.contains(&a) {
                break a;
            }
        };
        let at = rng.next() as usize % (base.len() + 1);
        let mut keys = base.clone();
        keys.insert(at, a);
        let after = build(&keys, DEFAULT_LEAF_RULES);
        let diff = changed(&before_text, &texts(&after, &keys));
        assert!(!diff.is_empty());
        assert_on_path(&after, at, &diff, &before);

        // Remove one.
        let gone = rng.next() as usize % base.len();
        let mut keys = base.clone();
        keys.remove(gone);
        let after = build(&keys, DEFAULT_LEAF_RULES);
        let diff = changed(&before_text, &texts(&after, &keys));
        assert_on_path(&before, gone, &diff, &after);
    }
}

#[test]
fn the_shape_depends_on_the_set_not_the_order() {
    let keys = random_cluster_ips(3_000, 5);
    let a = build(&keys, DEFAULT_LEAF_RULES);
    assert_eq!(a, build(&keys, DEFAULT_LEAF_RULES), "deterministic");
    let mut shuffled = keys.clone();
    let mut rng = Lcg(1);
    for i in (1..shuffled.len()).rev() {
        shuffled.swap(i, rng.next() as usize % (i + 1));
    }
    let b = build(&shuffled, DEFAULT_LEAF_RULES);
    // Same chains with the same lines; only the order of entries within a leaf follows the
    // input (upstream's order).
    let sorted = |t: &BTreeMap<String, String>| -> BTreeMap<String, Vec<String>> {
        t.iter()
            .map(|(n, s)| {
                let mut lines: Vec<String> = s.lines().map(str::to_string).collect();
                lines.sort();
                (n.clone(), lines)
            })
            .collect()
    };
    assert_eq!(sorted(&texts(&a, &keys)), sorted(&texts(&b, &shuffled)));
}

#[test]
fn a_small_set_stays_in_kube_services() {
    let keys: Vec<Key> = (1..=16).map(|i| tcp(v4(0x0A60_0000 + i), 80)).collect();
    let tree = build(&keys, DEFAULT_LEAF_RULES);
    assert_eq!(tree.chains.len(), 1);
    assert_eq!(tree.chains[0].name, "KUBE-SERVICES");
    // In upstream's order, whatever the addresses.
    let rev: Vec<Key> = keys.iter().rev().copied().collect();
    let tree = build(&rev, DEFAULT_LEAF_RULES);
    assert_eq!(
        tree.chains[0].rules,
        (0..16).map(TreeRule::Entry).collect::<Vec<_>>()
    );
    assert_eq!(build(&[], DEFAULT_LEAF_RULES).chains.len(), 1);
}

#[test]
fn interior_rules_match_prefixes_and_ports() {
    let keys = vec![
        tcp(v4(0x0A60_0001), 80),
        tcp(v4(0x0A60_0002), 80),
        tcp(v4(0x0A60_0002), 443),
        Key::new(v4(0x0A60_0002), "udp", 53),
    ];
    let tree = build(&keys, 1);
    let t = texts(&tree, &keys);
    let all: String = tree
        .chains
        .iter()
        .map(|c| t[&c.name].clone())
        .collect::<String>();
    assert_eq!(
        all,
        "-A KUBE-SERVICES -d 10.96.0.1/32 -j KUBE-SVT-0A600001-32\n\
         -A KUBE-SERVICES -d 10.96.0.2/32 -j KUBE-SVT-0A600002-32\n\
         -A KUBE-SVT-0A600001-32 -d 10.96.0.1/32 -p tcp --dport 80 -j X\n\
         -A KUBE-SVT-0A600002-32 -p tcp -g KUBE-SVT-0A600002-T0000-0\n\
         -A KUBE-SVT-0A600002-32 -p udp -g KUBE-SVT-0A600002-U0000-0\n\
         -A KUBE-SVT-0A600002-T0000-0 -p tcp -m tcp --dport 80 -g KUBE-SVT-0A600002-T0050-16\n\
         -A KUBE-SVT-0A600002-T0000-0 -p tcp -m tcp --dport 443 -g KUBE-SVT-0A600002-T01BB-16\n\
         -A KUBE-SVT-0A600002-T0050-16 -d 10.96.0.2/32 -p tcp --dport 80 -j X\n\
         -A KUBE-SVT-0A600002-T01BB-16 -d 10.96.0.2/32 -p tcp --dport 443 -j X\n\
         -A KUBE-SVT-0A600002-U0000-0 -d 10.96.0.2/32 -p udp --dport 53 -j X\n"
    );
    // Port ranges, and the same key twice stays in one leaf in order.
    let mut keys: Vec<Key> = (0..40).map(|p| tcp(v4(0x0A60_0009), 8000 + p)).collect();
    keys.push(tcp(v4(0x0A60_0009), 8000));
    let tree = build(&keys, 4);
    let t = texts(&tree, &keys);
    assert!(
        t.values()
            .any(|s| s.contains("-p tcp -m tcp --dport 8000:8015 -g "))
    );
    let dup: Vec<&TreeChain> = tree
        .chains
        .iter()
        .filter(|c| c.rules.contains(&TreeRule::Entry(40)))
        .collect();
    assert_eq!(dup.len(), 1);
    assert!(dup[0].rules.contains(&TreeRule::Entry(0)));
}

#[test]
fn ipv6_names_are_hashed_and_fit() {
    let keys: Vec<Key> = (0..500u128)
        .map(|i| {
            tcp(
                IpAddr::V6(Ipv6Addr::from(
                    0xfd00_0000_0000_0000_0000_0000_0000_0000 + i * 977,
                )),
                80,
            )
        })
        .collect();
    let tree = build(&keys, 8);
    assert!(tree.chains.len() > 60);
    for c in &tree.chains[1..] {
        assert!(
            c.name.starts_with(TREE_CHAIN_PREFIX) && c.name.len() == 25,
            "{}",
            c.name
        );
    }
    let t = texts(&tree, &keys);
    assert!(t["KUBE-SERVICES"].contains("-d fd00::/"));
}

/// What a packet to `k` meets: walks the tree as the kernel does and returns the entries it
/// is matched against whose key is `k`, in order (the first one wins in the kernel).
fn lookup(tree: &Tree, keys: &[Key], k: &Key) -> Vec<usize> {
    let width = if k.addr.is_ipv4() { 32 } else { 128 };
    let bits = k.bits().0;
    let matches = |m: &str| -> bool {
        let w: Vec<&str> = m.split(' ').collect();
        match w.as_slice() {
            ["-d", net] => {
                let (a, l) = net.split_once('/').unwrap();
                let a: IpAddr = a.parse().unwrap();
                let l: u32 = l.parse().unwrap();
                let a = Key::new(a, "tcp", 0).bits().0;
                prefix(a, l, width) == prefix(bits, l, width)
            }
            ["-p", p] => *p == k.proto_name(),
            ["-p", p, "-m", _, "--dport", ports] => {
                let (lo, hi) = ports.split_once(':').unwrap_or((ports, ports));
                *p == k.proto_name()
                    && (lo.parse::<u16>().unwrap()..=hi.parse::<u16>().unwrap()).contains(&k.port)
            }
            other => panic!("unexpected matches {other:?}"),
        }
    };
    let mut found = Vec::new();
    let mut chain = 0;
    'walk: loop {
        for r in &tree.chains[chain].rules {
            match r {
                TreeRule::Entry(i) if keys[*i] == *k => found.push(*i),
                TreeRule::Entry(_) => {}
                TreeRule::Child {
                    matches: m,
                    chain: c,
                    ..
                } if matches(m) => {
                    chain = tree.chains.iter().position(|x| &x.name == c).unwrap();
                    continue 'walk;
                }
                TreeRule::Child { .. } => {}
            }
        }
        return found;
    }
}

#[test]
fn a_walk_finds_exactly_the_entries_of_its_key() {
    let mut rng = Lcg(3);
    let mut keys = Vec::new();
    for _ in 0..600 {
        let a = v4(0x0A60_0000 | (rng.next() as u32 & 0x3FF));
        let proto = PROTOCOLS[rng.next() as usize % 3];
        keys.push(Key::new(a, proto, 80 + (rng.next() % 40) as u16));
    }
    for leaf in [1, 2, 16] {
        let tree = build(&keys, leaf);
        for (i, k) in keys.iter().enumerate() {
            let want: Vec<usize> = (0..keys.len()).filter(|&j| keys[j] == *k).collect();
            assert_eq!(lookup(&tree, &keys, k), want, "leaf {leaf}, entry {i}");
        }
        // Keys without an entry reach none.
        for p in [79, 200] {
            assert!(lookup(&tree, &keys, &tcp(v4(0x0A60_0001), p)).is_empty());
        }
        assert!(lookup(&tree, &keys, &tcp(v4(0x0B00_0001), 80)).is_empty());
    }
}

#[test]
fn entry_lines_are_split_by_chain() {
    let text = "-A KUBE-POSTROUTING -j RETURN\n\
                -A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m comment --comment \"a/b:p --dport 9\" -m tcp --dport 443 -j KUBE-SVC-A\n\
                -A KUBE-NODEPORTS -p tcp -m tcp --dport 30000 -j KUBE-EXT-A\n\
                -A KUBE-SERVICES -d fd00::1/128 -p udp -m udp --dport 53 -j KUBE-SVC-B\n\
                -A KUBE-SERVICES -m comment --comment \"x\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n";
    let l = split_entry_rules(text);
    assert_eq!(
        l.keys,
        vec![
            Key::new("10.96.0.1".parse().unwrap(), "tcp", 443),
            Key::new("fd00::1".parse().unwrap(), "udp", 53)
        ]
    );
    assert!(l.tails[0].starts_with(" -d 10.96.0.1/32 ") && l.tails[0].ends_with("KUBE-SVC-A\n"));
    assert_eq!(l.services_rest.len(), 1);
    assert_eq!(l.nodeports.len(), 1);
    assert_eq!(l.other, vec!["-A KUBE-POSTROUTING -j RETURN\n"]);
    let _ = tail(&l.keys[0], 0);
}
