//! The opt-in dispatch tree of `KUBE-SERVICES` (`--iptables-dispatch tree`).
//!
//! Upstream's layout puts one rule per ClusterIP, external IP and load-balancer IP (and
//! port) into nat `KUBE-SERVICES`, so a packet that misses conntrack walks a list that grows
//! with the number of Services. In the tree layout those rules (the *entries*, each
//! `-d IP/32 -p PROTO ... --dport PORT -j KUBE-SVC-/SVL-/EXT-/FW-…`, unchanged) are spread
//! over the leaves of a binary trie keyed on the destination: address bits first, then,
//! where one address carries more entries than a leaf holds, the protocol and the port bits.
//!
//! - **Shape.** A node is the set of entries under a prefix of the key. A node with at most
//!   `leaf_rules` entries (or whose entries all share one key) is a leaf and holds them, in
//!   their upstream order; any other node is split at the first bit where its keys differ
//!   (path compression: no chain for a bit every key shares), so every interior chain holds
//!   exactly two rules (up to three for a protocol split). The shape is a function of the
//!   set of keys and their counts, never of the order Services were added: adding or removing
//!   one entry changes only the chains on its path (and creates or removes children of
//!   those), and a chain's name is a function of its prefix.
//! - **Rules.** An interior rule matches its child's own prefix: `-d 10.96.0.0/17`, `-p tcp`
//!   or `-p tcp -m tcp --dport 8192:12287`. From `KUBE-SERVICES` (the root) they jump
//!   (`-j`), so a packet that matches no entry returns there and still reaches the final
//!   `-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS` rule; below the root they go (`-g`):
//!   no return walk, and falling off a leaf returns straight to `KUBE-SERVICES`, whose
//!   remaining rules cannot match (siblings' prefixes are disjoint) but the NodePort jump.
//! - **Equivalence.** Entries with different keys match disjoint packets, so only the order
//!   of entries with one key (two Services claiming the same IP, port and protocol) matters;
//!   they always share a leaf, in upstream's order. A root with at most `leaf_rules` entries
//!   is a leaf: small clusters get exactly upstream's `KUBE-SERVICES`.
//! - **Names.** `KUBE-SVT-` then, for IPv4, the prefix in hex and its length
//!   (`KUBE-SVT-0A600000-17`), or for a node below one address, the address, protocol
//!   letter, port prefix and its length (`KUBE-SVT-0A600001-T1F90-12`); for IPv6 the first 16
//!   base32 characters of the SHA-256 of the prefix's text (`fd00::/108`,
//!   `fd00::1/128 tcp 8080/12`), as upstream's per-Service names.
//! - **Depth.** A chain per branching bit on a packet's path: about `log2(n / leaf_rules)`
//!   for addresses spread over a range (ClusterIPs allocated at random or in sequence; 10
//!   levels for 10,000 Services), at most the key's bit width for adversarial sets.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::names::{KUBE_NODEPORTS, KUBE_SERVICES, TREE_CHAIN_PREFIX, text_hash};

/// How nat `KUBE-SERVICES` dispatches to the per-Service chains.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Dispatch {
    /// Upstream's layout: one rule per Service address and port in `KUBE-SERVICES`, walked in
    /// order (byte-identical to upstream kube-proxy).
    #[default]
    Upstream,
    /// The dispatch tree of this module, with leaves of at most `leaf_rules` entries.
    Tree {
        /// Entries per leaf (at least 1; [`DEFAULT_LEAF_RULES`] by default).
        leaf_rules: usize,
    },
}

impl Dispatch {
    /// The tree layout with [`DEFAULT_LEAF_RULES`].
    pub fn tree() -> Self {
        Dispatch::Tree {
            leaf_rules: DEFAULT_LEAF_RULES,
        }
    }
}

/// Entries per leaf of `--iptables-dispatch tree`: a packet walks at most this many entry
/// rules in its leaf, after about two rules per level above it.
pub const DEFAULT_LEAF_RULES: usize = 16;

/// What an entry matches: destination address, protocol and destination port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    /// The destination address (one family per tree).
    pub addr: IpAddr,
    /// `tcp`, `udp` or `sctp`, as an index into [`PROTOCOLS`].
    pub proto: u8,
    /// The destination port.
    pub port: u16,
}

/// Protocol names by [`Key::proto`].
pub const PROTOCOLS: [&str; 3] = ["tcp", "udp", "sctp"];

impl Key {
    /// The key of `addr`, `proto` (a name of [`PROTOCOLS`]; anything else sorts last) and
    /// `port`.
    pub fn new(addr: IpAddr, proto: &str, port: u16) -> Self {
        let proto = PROTOCOLS
            .iter()
            .position(|p| *p == proto)
            .unwrap_or(PROTOCOLS.len()) as u8;
        Key { addr, proto, port }
    }

    fn proto_name(&self) -> &'static str {
        PROTOCOLS
            .get(usize::from(self.proto))
            .copied()
            .unwrap_or("tcp")
    }

    fn bits(&self) -> (u128, u32) {
        match self.addr {
            IpAddr::V4(a) => (u128::from(u32::from(a)), 32),
            IpAddr::V6(a) => (u128::from(a), 128),
        }
    }
}

/// One rule of a tree chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TreeRule {
    /// Entry `i` of the input (a rule that was in upstream's `KUBE-SERVICES`).
    Entry(usize),
    /// A jump (from the root) or goto (below it) to a child chain.
    Child {
        /// The matches, canonical (`-d 10.96.0.0/17`, `-p tcp -m tcp --dport 80:95`).
        matches: String,
        /// The child chain.
        chain: String,
        /// `-g` rather than `-j`.
        goto: bool,
    },
}

/// One chain of a [`Tree`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeChain {
    /// `KUBE-SERVICES` for the root, else a `KUBE-SVT-` name.
    pub name: String,
    /// Its rules, in order.
    pub rules: Vec<TreeRule>,
}

/// A dispatch tree: `chains[0]` is the root (`KUBE-SERVICES`), every other chain a
/// `KUBE-SVT-` chain reached from exactly one rule of its parent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tree {
    /// The chains, parents before their children.
    pub chains: Vec<TreeChain>,
}

impl Tree {
    /// Chains on the longest path from the root to a leaf, the root included.
    pub fn depth(&self) -> usize {
        self.walk(0, &mut |_, _| {}).0
    }

    /// The most rules a packet can be matched against before it reaches its entry: on the
    /// worst path, every rule of every chain on it (leaves included).
    pub fn max_rules_walked(&self) -> usize {
        self.walk(0, &mut |_, _| {}).1
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.chains.iter().position(|c| c.name == name)
    }

    /// (depth, rules walked) of the subtree at `i`; `visit(chain, depth)` for each chain.
    fn walk(&self, i: usize, visit: &mut dyn FnMut(usize, usize)) -> (usize, usize) {
        let Some(c) = self.chains.get(i) else {
            return (0, 0);
        };
        visit(i, 0);
        let mut best = (1, c.rules.len());
        for r in &c.rules {
            if let TreeRule::Child { chain, .. } = r
                && let Some(j) = self.index(chain)
            {
                let (d, w) = self.walk(j, visit);
                best.0 = best.0.max(1 + d);
                best.1 = best.1.max(c.rules.len() + w);
            }
        }
        best
    }

    /// The chains from the root to the leaf holding entry `entry`, by name.
    pub fn path_to(&self, entry: usize) -> Vec<String> {
        let mut path = Vec::new();
        self.find(0, entry, &mut path);
        path
    }

    fn find(&self, i: usize, entry: usize, path: &mut Vec<String>) -> bool {
        let Some(c) = self.chains.get(i) else {
            return false;
        };
        path.push(c.name.clone());
        for r in &c.rules {
            match r {
                TreeRule::Entry(e) if *e == entry => return true,
                TreeRule::Child { chain, .. } => {
                    if let Some(j) = self.index(chain)
                        && self.find(j, entry, path)
                    {
                        return true;
                    }
                }
                TreeRule::Entry(_) => {}
            }
        }
        path.pop();
        false
    }
}

/// Builds the tree of `keys` (one per entry, all of one family) with leaves of at most
/// `leaf_rules` entries (at least 1).
pub fn build(keys: &[Key], leaf_rules: usize) -> Tree {
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_by_key(|&i| (keys[i], i));
    let mut b = Builder {
        keys,
        order,
        leaf: leaf_rules.max(1),
        chains: Vec::new(),
    };
    b.node(0, keys.len(), KUBE_SERVICES.to_string(), true);
    Tree { chains: b.chains }
}

struct Builder<'a> {
    keys: &'a [Key],
    /// Entry indices sorted by (key, index): every node is a contiguous range.
    order: Vec<usize>,
    leaf: usize,
    chains: Vec<TreeChain>,
}

/// Common leading bits of `a` and `b` in a `width`-bit word.
fn common_bits(a: u128, b: u128, width: u32) -> u32 {
    if a == b {
        width
    } else {
        (a ^ b).leading_zeros() - (128 - width)
    }
}

/// Bit `i` (from the top) of a `width`-bit word.
fn bit(v: u128, i: u32, width: u32) -> bool {
    (v >> (width - 1 - i)) & 1 == 1
}

/// The top `len` bits of a `width`-bit word.
fn prefix(v: u128, len: u32, width: u32) -> u128 {
    if len == 0 {
        0
    } else {
        let low = width - len;
        (v >> low) << low
    }
}

fn addr_text(v: u128, width: u32) -> String {
    if width == 32 {
        Ipv4Addr::from(v as u32).to_string()
    } else {
        Ipv6Addr::from(v).to_string()
    }
}

/// The name of the chain of an address prefix.
fn addr_chain(p: u128, len: u32, width: u32) -> String {
    if width == 32 {
        format!("{TREE_CHAIN_PREFIX}{:08X}-{len}", p as u32)
    } else {
        hashed(&format!("{}/{len}", addr_text(p, width)))
    }
}

/// The name of the chain of a port prefix below one address and protocol.
fn port_chain(k: &Key, p: u16, len: u32) -> String {
    let (a, width) = k.bits();
    if width == 32 {
        let letter = match k.proto {
            0 => 'T',
            1 => 'U',
            _ => 'S',
        };
        format!("{TREE_CHAIN_PREFIX}{:08X}-{letter}{p:04X}-{len}", a as u32)
    } else {
        hashed(&format!(
            "{}/128 {} {p}/{len}",
            addr_text(a, width),
            k.proto_name()
        ))
    }
}

fn hashed(text: &str) -> String {
    let h = text_hash(text);
    let mut s = String::with_capacity(TREE_CHAIN_PREFIX.len() + 16);
    s.push_str(TREE_CHAIN_PREFIX);
    s.extend(h.iter().map(|b| char::from(*b)));
    s
}

impl Builder<'_> {
    fn key(&self, pos: usize) -> &Key {
        &self.keys[self.order[pos]]
    }

    fn node(&mut self, lo: usize, hi: usize, name: String, root: bool) {
        let at = self.chains.len();
        self.chains.push(TreeChain {
            name,
            rules: Vec::new(),
        });
        if hi <= lo {
            return;
        }
        let (first, last) = (*self.key(lo), *self.key(hi - 1));
        if hi - lo <= self.leaf || first == last {
            let mut entries: Vec<usize> = self.order[lo..hi].to_vec();
            entries.sort_unstable();
            self.chains[at].rules = entries.into_iter().map(TreeRule::Entry).collect();
            return;
        }
        // (lo, hi, matches, chain) of each child.
        let mut children: Vec<(usize, usize, String, String)> = Vec::new();
        let (fa, width) = first.bits();
        let (la, _) = last.bits();
        if fa != la {
            let split = common_bits(fa, la, width);
            let mid = lo
                + self.order[lo..hi]
                    .partition_point(|&i| !bit(self.keys[i].bits().0, split, width));
            for (s, e) in [(lo, mid), (mid, hi)] {
                let (a, _) = self.key(s).bits();
                let (z, _) = self.key(e - 1).bits();
                let len = common_bits(a, z, width);
                let p = prefix(a, len, width);
                children.push((
                    s,
                    e,
                    format!("-d {}/{len}", addr_text(p, width)),
                    addr_chain(p, len, width),
                ));
            }
        } else if first.proto != last.proto {
            let mut s = lo;
            while s < hi {
                let proto = self.key(s).proto;
                let e = s + self.order[s..hi].partition_point(|&i| self.keys[i].proto == proto);
                let k = *self.key(s);
                children.push((s, e, format!("-p {}", k.proto_name()), port_chain(&k, 0, 0)));
                s = e;
            }
        } else {
            let (fp, lp) = (u128::from(first.port), u128::from(last.port));
            let split = common_bits(fp, lp, 16);
            let mid = lo
                + self.order[lo..hi]
                    .partition_point(|&i| !bit(u128::from(self.keys[i].port), split, 16));
            for (s, e) in [(lo, mid), (mid, hi)] {
                let k = *self.key(s);
                let (a, z) = (u128::from(k.port), u128::from(self.key(e - 1).port));
                let len = common_bits(a, z, 16);
                let p = prefix(a, len, 16) as u16;
                let top = p | (((1u32 << (16 - len)) - 1) as u16);
                let proto = k.proto_name();
                let ports = if p == top {
                    p.to_string()
                } else {
                    format!("{p}:{top}")
                };
                children.push((
                    s,
                    e,
                    format!("-p {proto} -m {proto} --dport {ports}"),
                    port_chain(&k, p, len),
                ));
            }
        }
        let mut rules = Vec::with_capacity(children.len());
        for (s, e, matches, chain) in children {
            rules.push(TreeRule::Child {
                matches,
                chain: chain.clone(),
                goto: !root,
            });
            self.node(s, e, chain, false);
        }
        self.chains[at].rules = rules;
    }
}

/// `KUBE-SERVICES`'s entry rules and the other lines of a render's entry buffer, split for
/// the tree: see [`split_entry_rules`].
#[derive(Debug, Default)]
pub(crate) struct EntryLines<'a> {
    /// Keys of the dispatch entries, in upstream order.
    pub keys: Vec<Key>,
    /// Each entry's text after `-A KUBE-SERVICES` (from the space before `-d` to the newline
    /// included).
    pub tails: Vec<&'a str>,
    /// `KUBE-SERVICES` lines that are not entries (the NodePort jump), in order.
    pub services_rest: Vec<&'a str>,
    /// `KUBE-NODEPORTS` lines, in order.
    pub nodeports: Vec<&'a str>,
    /// Every other line (the fixed chains' rules), in order.
    pub other: Vec<&'a str>,
}

/// The key of an entry's tail (` -d IP/LEN -p PROTO ... --dport PORT -j TARGET\n`).
fn parse_entry(tail: &str) -> Option<Key> {
    let rest = tail.strip_prefix(" -d ")?;
    let (ip, rest) = rest.split_once('/')?;
    let addr: IpAddr = ip.parse().ok()?;
    let rest = rest.split_once(" -p ")?.1;
    let proto = rest.split(' ').next()?;
    let at = tail.rfind(" --dport ")?;
    let port = tail[at + " --dport ".len()..].split([' ', '\n']).next()?;
    Some(Key::new(addr, proto, port.parse().ok()?))
}

/// Splits the lines of a render's nat entry buffer (`KUBE-SERVICES`, `KUBE-NODEPORTS` and
/// the fixed chains, each line ending in `\n`) for the tree.
pub(crate) fn split_entry_rules(text: &str) -> EntryLines<'_> {
    let services = format!("-A {KUBE_SERVICES} ");
    let nodeports = format!("-A {KUBE_NODEPORTS} ");
    let np_target = format!(" -j {KUBE_NODEPORTS}\n");
    let mut out = EntryLines::default();
    for line in text.split_inclusive('\n') {
        if line.starts_with(&services) {
            let tail = &line[services.len() - 1..];
            match (tail.ends_with(&np_target), parse_entry(tail)) {
                (false, Some(key)) => {
                    out.keys.push(key);
                    out.tails.push(tail);
                }
                _ => out.services_rest.push(line),
            }
        } else if line.starts_with(&nodeports) {
            out.nodeports.push(line);
        } else {
            out.other.push(line);
        }
    }
    out
}

/// Writes the rules of `chain` (entries from `tails`; `after` only for the root: lines that
/// follow the tree's rules) and returns how many lines it wrote.
pub(crate) fn write_chain(
    chain: &TreeChain,
    tails: &[&str],
    after: &[&str],
    out: &mut String,
) -> usize {
    let mut n = 0;
    for r in &chain.rules {
        match r {
            TreeRule::Entry(i) => {
                out.push_str("-A ");
                out.push_str(&chain.name);
                out.push_str(tails.get(*i).copied().unwrap_or("\n"));
            }
            TreeRule::Child {
                matches,
                chain: child,
                goto,
            } => {
                let _ = writeln!(
                    out,
                    "-A {} {matches} -{} {child}",
                    chain.name,
                    if *goto { 'g' } else { 'j' }
                );
            }
        }
        n += 1;
    }
    for line in after {
        out.push_str(line);
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests;
