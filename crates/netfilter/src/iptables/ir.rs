//! The typed rule IR: what the kernel holds, in the canonical form `iptables-save`
//! prints.
//!
//! A [`Ruleset`] maps [`Table`] → [`TableRules`] → chain name → [`Chain`] → [`Rule`]s.
//! A [`Rule`] is a list of [`Match`]es and an optional [`Target`]. Values are stored the
//! way the kernel stores them (addresses masked to their prefix, `--or-mark X` as the
//! `--set-xmark X/X` it becomes, probabilities as the kernel's 31-bit fixed point, port
//! ranges that cover everything dropped), so two rules the kernel considers equal compare
//! equal here, and `Display` reproduces `iptables-save`'s text exactly (see
//! `tests/kernel.rs`, which checks that against the real binaries).
//!
//! Two defaults depend on the IP family and are filled in by [`Rule::canonicalize`]
//! rather than by the family-agnostic parsers: the `recent` match's `--mask` and
//! `REJECT`'s `--reject-with` (and its aliases). `iptables-save` output always carries
//! both explicitly.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// IP family of a ruleset: [`IpVersion::V4`] is driven through `iptables-*`,
/// [`IpVersion::V6`] through `ip6tables-*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IpVersion {
    /// IPv4 (`iptables`).
    V4,
    /// IPv6 (`ip6tables`).
    V6,
}

impl IpVersion {
    /// The family of an address.
    pub fn of(addr: IpAddr) -> IpVersion {
        match addr {
            IpAddr::V4(_) => IpVersion::V4,
            IpAddr::V6(_) => IpVersion::V6,
        }
    }
}

/// A netfilter table, ordered the way this crate prints them: filter, nat, mangle, raw,
/// security. (`iptables-save` prints tables in whatever order the kernel lists them,
/// which differs between the nft and legacy backends; this crate is deterministic.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    /// `filter`.
    Filter,
    /// `nat`.
    Nat,
    /// `mangle`.
    Mangle,
    /// `raw`.
    Raw,
    /// `security`.
    Security,
}

/// The netfilter hooks in the order `iptables-save` prints builtin chains.
pub const HOOK_ORDER: [&str; 5] = ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"];

impl Table {
    /// All tables in canonical order.
    pub const ALL: [Table; 5] = [
        Table::Filter,
        Table::Nat,
        Table::Mangle,
        Table::Raw,
        Table::Security,
    ];

    /// The table's name as written after `*` / `-t`.
    pub fn name(self) -> &'static str {
        match self {
            Table::Filter => "filter",
            Table::Nat => "nat",
            Table::Mangle => "mangle",
            Table::Raw => "raw",
            Table::Security => "security",
        }
    }

    /// Parses a table name (`filter`, `nat`, `mangle`, `raw`, `security`).
    pub fn from_name(name: &str) -> Option<Table> {
        Table::ALL.into_iter().find(|t| t.name() == name)
    }

    /// The builtin chains of this table, in hook order.
    pub fn builtin_chains(self) -> &'static [&'static str] {
        match self {
            Table::Filter | Table::Security => &["INPUT", "FORWARD", "OUTPUT"],
            Table::Nat => &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"],
            Table::Mangle => &HOOK_ORDER,
            Table::Raw => &["PREROUTING", "OUTPUT"],
        }
    }

    /// Whether `chain` is one of this table's builtin chains.
    pub fn is_builtin_chain(self, chain: &str) -> bool {
        self.builtin_chains().contains(&chain)
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Packet and byte counters, printed `[packets:bytes]`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Counters {
    /// Packets.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
}

impl fmt::Display for Counters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}:{}]", self.packets, self.bytes)
    }
}

/// A whole ruleset: every table that was saved or written.
///
/// `Display` prints an `iptables-save` document (without the `#` comment lines), tables
/// in [`Table`] order, chains builtin-first (hook order) then user chains in byte order
/// (which is `iptables-save`'s order), then the rules chain by chain, then `COMMIT`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ruleset {
    /// The tables, keyed and ordered by [`Table`].
    pub tables: BTreeMap<Table, TableRules>,
}

impl Ruleset {
    /// An empty ruleset (no tables).
    pub fn new() -> Self {
        Self::default()
    }

    /// The chain `name` of `table`, if both exist.
    pub fn chain(&self, table: Table, name: &str) -> Option<&Chain> {
        self.tables.get(&table)?.chains.get(name)
    }

    /// Fills the family-dependent defaults of every rule; see [`Rule::canonicalize`].
    pub fn canonicalize(&mut self, version: IpVersion) {
        for t in self.tables.values_mut() {
            for c in t.chains.values_mut() {
                for r in &mut c.rules {
                    r.canonicalize(version);
                }
            }
        }
    }

    /// Total number of rules in all tables.
    pub fn rule_count(&self) -> usize {
        self.tables
            .values()
            .flat_map(|t| t.chains.values())
            .map(|c| c.rules.len())
            .sum()
    }
}

impl fmt::Display for Ruleset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (table, rules) in &self.tables {
            rules.write_save(*table, f)?;
        }
        Ok(())
    }
}

/// The chains of one table, keyed by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableRules {
    /// Chains by name (byte order; builtin chains are recognised by having a policy).
    pub chains: BTreeMap<String, Chain>,
}

impl TableRules {
    /// A table with no chains at all.
    pub fn new() -> Self {
        Self::default()
    }

    /// A table holding just `table`'s builtin chains, policy `ACCEPT`, no rules: what
    /// the kernel has before anything is written.
    pub fn with_builtins(table: Table) -> Self {
        let chains = table
            .builtin_chains()
            .iter()
            .map(|name| (name.to_string(), Chain::builtin("ACCEPT")))
            .collect();
        TableRules { chains }
    }

    /// Chains in `iptables-save` order: builtin chains (those with a policy) in hook
    /// order, then user chains in byte order.
    pub fn ordered_chains(&self) -> Vec<(&str, &Chain)> {
        let mut out: Vec<(&str, &Chain)> = Vec::with_capacity(self.chains.len());
        for hook in HOOK_ORDER {
            if let Some(c) = self.chains.get(hook).filter(|c| c.policy.is_some()) {
                out.push((hook, c));
            }
        }
        out.extend(
            self.chains
                .iter()
                .filter(|(name, c)| c.policy.is_none() || !HOOK_ORDER.contains(&name.as_str()))
                .map(|(n, c)| (n.as_str(), c)),
        );
        out
    }

    /// Writes this table as an `iptables-save` section: `*table`, one `:CHAIN POLICY
    /// [p:b]` line per chain (`-` as the policy of user chains), the rules, `COMMIT`.
    pub fn write_save(&self, table: Table, out: &mut impl fmt::Write) -> fmt::Result {
        writeln!(out, "*{table}")?;
        let chains = self.ordered_chains();
        for (name, chain) in &chains {
            let policy = chain.policy.as_deref().unwrap_or("-");
            writeln!(out, ":{name} {policy} {}", chain.counters)?;
        }
        for (_, chain) in &chains {
            for rule in &chain.rules {
                writeln!(out, "{rule}")?;
            }
        }
        writeln!(out, "COMMIT")
    }
}

/// One chain.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chain {
    /// The policy of a builtin chain (`ACCEPT`/`DROP`); `None` for user chains.
    pub policy: Option<String>,
    /// Policy counters (always `[0:0]` for user chains).
    pub counters: Counters,
    /// The rules, in order.
    pub rules: Vec<Rule>,
}

impl Chain {
    /// An empty user-defined chain.
    pub fn user() -> Self {
        Chain::default()
    }

    /// An empty builtin chain with `policy`.
    pub fn builtin(policy: &str) -> Self {
        Chain {
            policy: Some(policy.to_string()),
            ..Chain::default()
        }
    }

    /// Whether this is a builtin chain (it has a policy).
    pub fn is_builtin(&self) -> bool {
        self.policy.is_some()
    }
}

/// One rule: `-A chain [matches] [-j/-g target]`.
///
/// `matches` holds the general matches (`-s`, `-d`, `-i`, `-o`, `-p`, `-f`) first, in
/// that order, followed by the `-m` modules in rule order; the parsers build it that way
/// and `Display` prints general matches in canonical order regardless.
///
/// Equality ignores `line` (where the rule was read from), so rules parsed from
/// different texts compare by content.
#[derive(Debug, Clone, Default, Eq)]
pub struct Rule {
    /// The chain the rule belongs to (printed as `-A CHAIN`).
    pub chain: String,
    /// General matches then `-m` modules.
    pub matches: Vec<Match>,
    /// `-j`/`-g` target; `None` for a rule that only counts.
    pub target: Option<Target>,
    /// `[packets:bytes]` prefix from `iptables-save -c` / `iptables-restore --counters`.
    pub counters: Option<Counters>,
    /// 1-based line the rule was parsed from (0 when built in code).
    pub line: usize,
}

impl PartialEq for Rule {
    fn eq(&self, other: &Self) -> bool {
        self.chain == other.chain
            && self.matches == other.matches
            && self.target == other.target
            && self.counters == other.counters
    }
}

impl Rule {
    /// Whether the two rules have the same matches and target (ignoring chain,
    /// counters and line): the test `iptables -D chain spec` uses.
    pub fn same_spec(&self, other: &Rule) -> bool {
        self.matches == other.matches && self.target == other.target
    }

    /// The chain this rule jumps (`-j`) or goes (`-g`) to, if any.
    pub fn jump_chain(&self) -> Option<&str> {
        match &self.target {
            Some(Target::Jump(c) | Target::Goto(c)) => Some(c),
            _ => None,
        }
    }

    /// Fills family-dependent defaults so the rule equals what `iptables-save` prints
    /// for it: the `recent` match's `--mask` (all ones), `REJECT`'s `--reject-with`
    /// (`icmp-port-unreachable` / `icmp6-port-unreachable`) and REJECT aliases
    /// (`host-unreach` → `icmp-host-unreachable`, ...).
    pub fn canonicalize(&mut self, version: IpVersion) {
        for m in &mut self.matches {
            if let Match::Recent(r) = m
                && r.mask.is_none()
            {
                r.mask = Some(match version {
                    IpVersion::V4 => IpAddr::V4(Ipv4Addr::BROADCAST),
                    IpVersion::V6 => IpAddr::V6(Ipv6Addr::from(u128::MAX)),
                });
            }
        }
        if let Some(Target::Reject { with }) = &mut self.target {
            let canonical = match with.as_deref() {
                None => Some(default_reject(version)),
                Some(w) => canonical_reject(version, w),
            };
            if let Some(c) = canonical {
                *with = Some(c.to_string());
            }
        }
    }

    fn general(&self) -> impl Iterator<Item = &Match> {
        (0..6u8).flat_map(move |rank| {
            self.matches
                .iter()
                .filter(move |m| m.general_rank() == Some(rank))
        })
    }
}

fn default_reject(version: IpVersion) -> &'static str {
    match version {
        IpVersion::V4 => "icmp-port-unreachable",
        IpVersion::V6 => "icmp6-port-unreachable",
    }
}

const REJECT_V4: &[(&str, &str)] = &[
    ("icmp-net-unreachable", "net-unreach"),
    ("icmp-host-unreachable", "host-unreach"),
    ("icmp-proto-unreachable", "proto-unreach"),
    ("icmp-port-unreachable", "port-unreach"),
    ("icmp-net-prohibited", "net-prohib"),
    ("icmp-host-prohibited", "host-prohib"),
    ("tcp-reset", "tcp-rst"),
    ("icmp-admin-prohibited", "admin-prohib"),
];

const REJECT_V6: &[(&str, &str)] = &[
    ("icmp6-no-route", "no-route"),
    ("icmp6-adm-prohibited", "adm-prohibited"),
    ("icmp6-addr-unreachable", "addr-unreach"),
    ("icmp6-port-unreachable", "port-unreach"),
    ("tcp-reset", "tcp-rst"),
    ("icmp6-policy-fail", "policy-fail"),
    ("icmp6-reject-route", "reject-route"),
];

/// The canonical `--reject-with` name for `name` (a canonical name or an alias) in
/// `version`, or `None` if it is not a valid reject type for that family.
pub fn canonical_reject(version: IpVersion, name: &str) -> Option<&'static str> {
    let table = match version {
        IpVersion::V4 => REJECT_V4,
        IpVersion::V6 => REJECT_V6,
    };
    table
        .iter()
        .find(|(c, a)| c.eq_ignore_ascii_case(name) || a.eq_ignore_ascii_case(name))
        .map(|(c, _)| *c)
}

/// An address with a prefix length, as matched by `-s`/`-d` (host bits are always
/// zero: the kernel masks them, and so does [`Cidr::new`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// `addr/prefix` with host bits cleared; `None` if `prefix` is longer than the
    /// address (32 / 128).
    pub fn new(addr: IpAddr, prefix: u8) -> Option<Cidr> {
        let addr = match addr {
            IpAddr::V4(a) if prefix <= 32 => {
                let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
                IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
            }
            IpAddr::V6(a) if prefix <= 128 => {
                let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask))
            }
            _ => return None,
        };
        Some(Cidr { addr, prefix })
    }

    /// A single host (`/32` or `/128`).
    pub fn host(addr: IpAddr) -> Cidr {
        let prefix = match addr {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        };
        Cidr { addr, prefix }
    }

    /// The network address.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether this is `0.0.0.0/0` or `::/0`.
    pub fn is_any(&self) -> bool {
        self.prefix == 0
    }

    /// Whether `ip` is inside this network (always false across families).
    pub fn contains(&self, ip: IpAddr) -> bool {
        Cidr::new(ip, self.prefix).is_some_and(|c| c.addr == self.addr)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// An IP protocol number as matched by `-p`.
///
/// `Display` prints the name `iptables-save` prints (from the standard
/// `/etc/protocols` list, e.g. `tcp`, `gre`, `ipv6-icmp`) or the number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Protocol(pub u8);

/// Protocol numbers and their `/etc/protocols` names (the name `iptables-save` prints).
const PROTOCOLS: &[(u8, &str)] = &[
    (1, "icmp"),
    (2, "igmp"),
    (3, "ggp"),
    (4, "ipencap"),
    (5, "st"),
    (6, "tcp"),
    (8, "egp"),
    (9, "igp"),
    (12, "pup"),
    (17, "udp"),
    (20, "hmp"),
    (22, "xns-idp"),
    (27, "rdp"),
    (29, "iso-tp4"),
    (33, "dccp"),
    (36, "xtp"),
    (37, "ddp"),
    (38, "idpr-cmtp"),
    (41, "ipv6"),
    (43, "ipv6-route"),
    (44, "ipv6-frag"),
    (45, "idrp"),
    (46, "rsvp"),
    (47, "gre"),
    (50, "esp"),
    (51, "ah"),
    (57, "skip"),
    (58, "ipv6-icmp"),
    (59, "ipv6-nonxt"),
    (60, "ipv6-opts"),
    (73, "rspf"),
    (81, "vmtp"),
    (88, "eigrp"),
    (89, "ospf"),
    (93, "ax.25"),
    (94, "ipip"),
    (97, "etherip"),
    (98, "encap"),
    (103, "pim"),
    (108, "ipcomp"),
    (112, "vrrp"),
    (115, "l2tp"),
    (124, "isis"),
    (132, "sctp"),
    (133, "fc"),
    (135, "mobility-header"),
    (136, "udplite"),
    (137, "mpls-in-ip"),
    (138, "manet"),
    (139, "hip"),
    (140, "shim6"),
    (141, "wesp"),
    (142, "rohc"),
    (143, "ethernet"),
];

impl Protocol {
    /// `-p all` (matches every protocol; never stored as a match).
    pub const ALL: Protocol = Protocol(0);
    /// ICMP.
    pub const ICMP: Protocol = Protocol(1);
    /// TCP.
    pub const TCP: Protocol = Protocol(6);
    /// UDP.
    pub const UDP: Protocol = Protocol(17);
    /// ICMPv6.
    pub const ICMPV6: Protocol = Protocol(58);
    /// SCTP.
    pub const SCTP: Protocol = Protocol(132);

    /// Parses a `-p` argument: a number, a name from `/etc/protocols`, `all`, or the
    /// aliases `icmpv6` and `mh` (case-insensitive, like iptables).
    pub fn parse(s: &str) -> Option<Protocol> {
        if let Some(n) = parse_c_uint(s).filter(|n| *n <= 255) {
            return Some(Protocol(n as u8));
        }
        let lower = s.to_ascii_lowercase();
        match lower.as_str() {
            "all" => return Some(Protocol::ALL),
            "icmpv6" => return Some(Protocol::ICMPV6),
            "mh" => return Some(Protocol(135)),
            _ => {}
        }
        PROTOCOLS
            .iter()
            .find(|(_, name)| *name == lower)
            .map(|(n, _)| Protocol(*n))
    }

    /// The name `iptables-save` prints, if the protocol has one.
    pub fn name(self) -> Option<&'static str> {
        PROTOCOLS
            .iter()
            .find(|(n, _)| *n == self.0)
            .map(|(_, name)| *name)
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "{}", self.0),
        }
    }
}

/// An inclusive port range; `first == last` for a single port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortRange {
    /// First port.
    pub first: u16,
    /// Last port (>= `first`).
    pub last: u16,
}

impl PortRange {
    /// A single port.
    pub fn single(port: u16) -> Self {
        PortRange {
            first: port,
            last: port,
        }
    }

    /// Whether `port` is in the range.
    pub fn contains(&self, port: u16) -> bool {
        self.first <= port && port <= self.last
    }

    /// Whether this is `0:65535`.
    pub fn is_full(&self) -> bool {
        self.first == 0 && self.last == u16::MAX
    }

    fn fmt_with(&self, sep: char, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}{sep}{}", self.first, self.last)
        }
    }
}

/// Prints `80` or `1000:2000` (the match syntax; NAT targets use `-`).
impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_with(':', f)
    }
}

/// A value with an optional `!` in front.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Negatable<T> {
    /// Whether the test is inverted (`!`).
    pub negated: bool,
    /// The value.
    pub value: T,
}

impl<T> Negatable<T> {
    /// A non-inverted value.
    pub fn plain(value: T) -> Self {
        Negatable {
            negated: false,
            value,
        }
    }
}

/// `--sport`/`--dport` of the `tcp`, `udp` and `sctp` matches. A range covering all
/// ports is not stored (`iptables-save` does not print it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct PortMatch {
    /// `[!] --sport a[:b]`.
    pub sport: Option<Negatable<PortRange>>,
    /// `[!] --dport a[:b]`.
    pub dport: Option<Negatable<PortRange>>,
}

/// Which ports a `multiport` match looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MultiportKind {
    /// `--sports`.
    Source,
    /// `--dports`.
    Destination,
    /// `--ports` (either).
    Either,
}

/// `-m multiport [!] --dports|--sports|--ports p1,p2,a:b`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Multiport {
    /// Which ports.
    pub kind: MultiportKind,
    /// The list (single ports and ranges, in written order).
    pub ports: Vec<PortRange>,
    /// `!`.
    pub negated: bool,
}

/// A `statistic --probability` in the kernel's fixed point: `value / 2^31`.
///
/// Prints with 11 decimals like `iptables-save` (`0.50000000000`); `0.3333333333` is
/// stored as 715827883 and prints `0.33333333349`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Probability(pub u32);

impl Probability {
    const ONE: f64 = 2_147_483_648.0;

    /// Converts `p` in `[0, 1]` the way iptables does (`lround(p * 2^31)`); `None`
    /// outside that range or for NaN.
    pub fn from_f64(p: f64) -> Option<Probability> {
        if !(0.0..=1.0).contains(&p) {
            return None;
        }
        Some(Probability((p * Self::ONE).round() as u32))
    }

    /// The probability as a float.
    pub fn as_f64(self) -> f64 {
        f64::from(self.0) / Self::ONE
    }
}

impl fmt::Display for Probability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.11}", self.as_f64())
    }
}

/// The mode of a `statistic` match.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StatisticMode {
    /// `--mode random --probability P`.
    Random {
        /// The probability.
        probability: Probability,
    },
    /// `--mode nth --every N --packet P` (0 <= P < N).
    Nth {
        /// N.
        every: u32,
        /// P.
        packet: u32,
    },
}

/// `-m statistic`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Statistic {
    /// Mode and parameters.
    pub mode: StatisticMode,
    /// `!` (before `--probability` / `--every`).
    pub negated: bool,
}

/// `-m mark [!] --mark value[/mask]` (mask `0xffffffff` when not written).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MarkMatch {
    /// Value.
    pub value: u32,
    /// Mask.
    pub mask: u32,
    /// `!`.
    pub negated: bool,
}

macro_rules! name_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[$vdoc])* $variant),+
        }
        impl $name {
            /// The name as iptables prints it.
            pub fn name(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
            /// Parses a name (case-insensitive, like iptables).
            pub fn from_name(s: &str) -> Option<Self> {
                $(if s.eq_ignore_ascii_case($text) { return Some($name::$variant); })+
                None
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

name_enum!(
    /// A conntrack state (`--ctstate`, `--state`), ordered as iptables prints them.
    ConnState {
        /// INVALID.
        Invalid = "INVALID",
        /// NEW.
        New = "NEW",
        /// RELATED.
        Related = "RELATED",
        /// ESTABLISHED.
        Established = "ESTABLISHED",
        /// UNTRACKED.
        Untracked = "UNTRACKED",
        /// SNAT (conntrack match only).
        Snat = "SNAT",
        /// DNAT (conntrack match only).
        Dnat = "DNAT",
    }
);

name_enum!(
    /// A conntrack status bit (`--ctstatus`), ordered as iptables prints them.
    CtStatus {
        /// EXPECTED.
        Expected = "EXPECTED",
        /// SEEN_REPLY.
        SeenReply = "SEEN_REPLY",
        /// ASSURED.
        Assured = "ASSURED",
        /// CONFIRMED.
        Confirmed = "CONFIRMED",
    }
);

name_enum!(
    /// An address type (`addrtype --src-type/--dst-type`), ordered as iptables prints
    /// them.
    AddrKind {
        /// UNSPEC.
        Unspec = "UNSPEC",
        /// UNICAST.
        Unicast = "UNICAST",
        /// LOCAL.
        Local = "LOCAL",
        /// BROADCAST.
        Broadcast = "BROADCAST",
        /// ANYCAST.
        Anycast = "ANYCAST",
        /// MULTICAST.
        Multicast = "MULTICAST",
        /// BLACKHOLE.
        Blackhole = "BLACKHOLE",
        /// UNREACHABLE.
        Unreachable = "UNREACHABLE",
        /// PROHIBIT.
        Prohibit = "PROHIBIT",
        /// THROW.
        Throw = "THROW",
        /// NAT.
        Nat = "NAT",
        /// XRESOLVE.
        Xresolve = "XRESOLVE",
    }
);

/// `-m conntrack` (only `--ctstate` and `--ctstatus`; other options make the match
/// [`Match::Unknown`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Conntrack {
    /// `[!] --ctstate S1,S2`.
    pub state: Option<Negatable<BTreeSet<ConnState>>>,
    /// `[!] --ctstatus S1,S2`.
    pub status: Option<Negatable<BTreeSet<CtStatus>>>,
}

/// `-m state [!] --state S1,S2`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StateMatch {
    /// The states.
    pub states: BTreeSet<ConnState>,
    /// `!`.
    pub negated: bool,
}

/// `-m addrtype`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct AddrType {
    /// `[!] --src-type T1,T2`.
    pub src: Option<Negatable<BTreeSet<AddrKind>>>,
    /// `[!] --dst-type T1,T2`.
    pub dst: Option<Negatable<BTreeSet<AddrKind>>>,
    /// `--limit-iface-in`.
    pub limit_iface_in: bool,
    /// `--limit-iface-out`.
    pub limit_iface_out: bool,
}

/// The action of a `recent` match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecentCommand {
    /// `--set`.
    Set,
    /// `--rcheck`.
    Check,
    /// `--update`.
    Update,
    /// `--remove`.
    Remove,
}

/// Which address a `recent` match records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecentSide {
    /// `--rsource` (default).
    Source,
    /// `--rdest`.
    Dest,
}

/// `-m recent`. Prints in `iptables-save` order: `[!] --set|--rcheck|--update|--remove
/// [--seconds N] [--reap] [--hitcount N] [--rttl] --name NAME [--mask M]
/// --rsource|--rdest`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Recent {
    /// `!` before the command.
    pub negated: bool,
    /// The command.
    pub command: RecentCommand,
    /// `--seconds N` (0 is not stored).
    pub seconds: Option<u32>,
    /// `--reap`.
    pub reap: bool,
    /// `--hitcount N` (0 is not stored).
    pub hitcount: Option<u32>,
    /// `--rttl`.
    pub rttl: bool,
    /// `--name` (default `DEFAULT`).
    pub name: String,
    /// `--mask`; `None` until [`Rule::canonicalize`] fills the family's all-ones mask.
    pub mask: Option<IpAddr>,
    /// `--rsource` / `--rdest`.
    pub side: RecentSide,
}

/// A direction flag of `--match-set NAME flags`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SetFlag {
    /// `src`.
    Src,
    /// `dst`.
    Dst,
}

/// `-m set [!] --match-set NAME dst,dst`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SetMatch {
    /// The ipset name.
    pub name: String,
    /// Direction per set dimension.
    pub flags: Vec<SetFlag>,
    /// `!`.
    pub negated: bool,
}

/// `-m physdev`. For the boolean tests, `Some(negated)` means the option is present
/// (`Some(true)` is `! --physdev-is-in`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Physdev {
    /// `[!] --physdev-is-in`.
    pub is_in: Option<bool>,
    /// `[!] --physdev-in NAME`.
    pub physdev_in: Option<Negatable<String>>,
    /// `[!] --physdev-is-out`.
    pub is_out: Option<bool>,
    /// `[!] --physdev-out NAME`.
    pub physdev_out: Option<Negatable<String>>,
    /// `[!] --physdev-is-bridged`.
    pub is_bridged: Option<bool>,
}

/// One match of a rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Match {
    /// `[!] -s addr/prefix` (never `0.0.0.0/0` un-negated: that is no match at all).
    Source {
        /// The network.
        net: Cidr,
        /// `!`.
        negated: bool,
    },
    /// `[!] -d addr/prefix`.
    Destination {
        /// The network.
        net: Cidr,
        /// `!`.
        negated: bool,
    },
    /// `[!] -i name` (`+` suffix = prefix wildcard).
    InInterface {
        /// Interface name, possibly ending in `+`.
        name: String,
        /// `!`.
        negated: bool,
    },
    /// `[!] -o name`.
    OutInterface {
        /// Interface name, possibly ending in `+`.
        name: String,
        /// `!`.
        negated: bool,
    },
    /// `[!] -p proto` (never `all` un-negated).
    Protocol {
        /// The protocol.
        proto: Protocol,
        /// `!`.
        negated: bool,
    },
    /// `[!] -f` (second and further fragments).
    Fragment {
        /// `!`.
        negated: bool,
    },
    /// `-m comment --comment TEXT`.
    Comment(String),
    /// `-m tcp`.
    Tcp(PortMatch),
    /// `-m udp`.
    Udp(PortMatch),
    /// `-m sctp` (ports only).
    Sctp(PortMatch),
    /// `-m multiport`.
    Multiport(Multiport),
    /// `-m statistic`.
    Statistic(Statistic),
    /// `-m mark`.
    Mark(MarkMatch),
    /// `-m conntrack`.
    Conntrack(Conntrack),
    /// `-m state`.
    State(StateMatch),
    /// `-m addrtype`.
    AddrType(AddrType),
    /// `-m recent`.
    Recent(Recent),
    /// `-m set`.
    Set(SetMatch),
    /// `-m nfacct --nfacct-name NAME`.
    Nfacct {
        /// The accounting object.
        name: String,
    },
    /// `-m physdev`.
    Physdev(Physdev),
    /// Any other module, or a known module with options this IR does not model; `args`
    /// are the option tokens exactly as written (including `!`).
    Unknown {
        /// Module name (after `-m`).
        module: String,
        /// Its arguments.
        args: Vec<String>,
    },
}

impl Match {
    /// Position among the general (non `-m`) matches, in print order; `None` for
    /// modules.
    pub fn general_rank(&self) -> Option<u8> {
        Some(match self {
            Match::Source { .. } => 0,
            Match::Destination { .. } => 1,
            Match::InInterface { .. } => 2,
            Match::OutInterface { .. } => 3,
            Match::Protocol { .. } => 4,
            Match::Fragment { .. } => 5,
            _ => return None,
        })
    }

    /// The module name after `-m`, for module matches.
    pub fn module(&self) -> Option<&str> {
        Some(match self {
            Match::Comment(_) => "comment",
            Match::Tcp(_) => "tcp",
            Match::Udp(_) => "udp",
            Match::Sctp(_) => "sctp",
            Match::Multiport(_) => "multiport",
            Match::Statistic(_) => "statistic",
            Match::Mark(_) => "mark",
            Match::Conntrack(_) => "conntrack",
            Match::State(_) => "state",
            Match::AddrType(_) => "addrtype",
            Match::Recent(_) => "recent",
            Match::Set(_) => "set",
            Match::Nfacct { .. } => "nfacct",
            Match::Physdev(_) => "physdev",
            Match::Unknown { module, .. } => module,
            _ => return None,
        })
    }
}

/// The `to` of a DNAT/SNAT target: `[addr[-addr]][:port[-port]]`, IPv6 with port as
/// `[addr]:port`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NatRange {
    /// First and last address (equal for one address).
    pub addrs: Option<(IpAddr, IpAddr)>,
    /// Port range.
    pub ports: Option<PortRange>,
}

/// Options of a DNAT or SNAT target.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NatTarget {
    /// `--to-destination` / `--to-source`.
    pub to: NatRange,
    /// `--random`.
    pub random: bool,
    /// `--random-fully`.
    pub random_fully: bool,
    /// `--persistent`.
    pub persistent: bool,
}

/// The target of a rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// `-j ACCEPT`.
    Accept,
    /// `-j DROP`.
    Drop,
    /// `-j RETURN`.
    Return,
    /// `-j CHAIN` (a user chain).
    Jump(String),
    /// `-g CHAIN`.
    Goto(String),
    /// `-j REJECT [--reject-with TYPE]` (`None` until [`Rule::canonicalize`]).
    Reject {
        /// The reject type.
        with: Option<String>,
    },
    /// `-j DNAT --to-destination ...`.
    Dnat(NatTarget),
    /// `-j SNAT --to-source ...`.
    Snat(NatTarget),
    /// `-j MASQUERADE [--to-ports P[-Q]] [--random] [--random-fully]`.
    Masquerade {
        /// `--to-ports`.
        to_ports: Option<PortRange>,
        /// `--random`.
        random: bool,
        /// `--random-fully`.
        random_fully: bool,
    },
    /// `-j MARK`: the kernel's `mark = (mark & !mask) ^ value`. Every MARK form is
    /// stored (and printed) as `--set-xmark value/mask`: `--set-mark V[/M]` is `V/(M|V)`
    /// (M defaulting to all ones), `--or-mark X` is `X/X`, `--xor-mark X` is `X/0x0`,
    /// `--and-mark X` is `0x0/!X`.
    Mark {
        /// XOR value.
        value: u32,
        /// Bits cleared first.
        mask: u32,
    },
    /// Any other target extension (`LOG`, `CT`, `NOTRACK`, ...), or a known one with
    /// options this IR does not model; `args` exactly as written.
    Unknown {
        /// Target name.
        name: String,
        /// Its arguments.
        args: Vec<String>,
    },
}

impl Target {
    /// The name after `-j`/`-g`.
    pub fn name(&self) -> &str {
        match self {
            Target::Accept => "ACCEPT",
            Target::Drop => "DROP",
            Target::Return => "RETURN",
            Target::Jump(c) | Target::Goto(c) => c,
            Target::Reject { .. } => "REJECT",
            Target::Dnat(_) => "DNAT",
            Target::Snat(_) => "SNAT",
            Target::Masquerade { .. } => "MASQUERADE",
            Target::Mark { .. } => "MARK",
            Target::Unknown { name, .. } => name,
        }
    }
}

// ---------------------------------------------------------------------------------
// Display: the canonical iptables-save form.
// ---------------------------------------------------------------------------------

/// Writes `s` the way `xtables_save_string` does: bare when non-empty and made only of
/// `[A-Za-z0-9_-]`, otherwise double-quoted with `"`, `\` and `'` backslash-escaped.
/// Comments and other free-text values are printed this way by `iptables-save`.
pub fn save_string(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if plain {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if matches!(c, '"' | '\\' | '\'') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// Quotes an argument only when `iptables-restore`'s tokenizer needs it (empty, or
/// containing whitespace or `"`). Used for the arguments of unknown matches/targets.
fn restore_arg(s: &str) -> String {
    if !s.is_empty() && !s.chars().any(|c| c.is_whitespace() || c == '"') {
        s.to_string()
    } else {
        save_string(s)
    }
}

fn bang(negated: bool) -> &'static str {
    if negated { "! " } else { "" }
}

fn join<T: fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    let mut out = String::new();
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{item}");
    }
    out
}

fn hex(v: u32) -> String {
    format!("{v:#x}")
}

impl fmt::Display for PortMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (opt, p) in [("--sport", &self.sport), ("--dport", &self.dport)] {
            if let Some(p) = p.as_ref().filter(|p| !p.value.is_full()) {
                write!(f, " {}{opt} {}", bang(p.negated), p.value)?;
            }
        }
        Ok(())
    }
}

impl fmt::Display for NatRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v6 = matches!(self.addrs, Some((IpAddr::V6(_), _)));
        let bracket = v6 && self.ports.is_some();
        if let Some((a, b)) = self.addrs {
            if bracket {
                f.write_str("[")?;
            }
            write!(f, "{a}")?;
            if a != b {
                write!(f, "-{b}")?;
            }
            if bracket {
                f.write_str("]")?;
            }
        }
        if let Some(p) = self.ports {
            f.write_str(":")?;
            p.fmt_with('-', f)?;
        }
        Ok(())
    }
}

impl fmt::Display for Match {
    /// The match as `iptables-save` prints it, e.g. `! -s 10.0.0.0/16` or
    /// `-m comment --comment "a b"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Match::Source { net, negated } => write!(f, "{}-s {net}", bang(*negated)),
            Match::Destination { net, negated } => write!(f, "{}-d {net}", bang(*negated)),
            Match::InInterface { name, negated } => write!(f, "{}-i {name}", bang(*negated)),
            Match::OutInterface { name, negated } => write!(f, "{}-o {name}", bang(*negated)),
            Match::Protocol { proto, negated } => write!(f, "{}-p {proto}", bang(*negated)),
            Match::Fragment { negated } => write!(f, "{}-f", bang(*negated)),
            Match::Comment(c) => write!(f, "-m comment --comment {}", save_string(c)),
            Match::Tcp(p) => write!(f, "-m tcp{p}"),
            Match::Udp(p) => write!(f, "-m udp{p}"),
            Match::Sctp(p) => write!(f, "-m sctp{p}"),
            Match::Multiport(m) => {
                let opt = match m.kind {
                    MultiportKind::Source => "--sports",
                    MultiportKind::Destination => "--dports",
                    MultiportKind::Either => "--ports",
                };
                write!(
                    f,
                    "-m multiport {}{opt} {}",
                    bang(m.negated),
                    join(&m.ports)
                )
            }
            Match::Statistic(s) => match &s.mode {
                StatisticMode::Random { probability } => write!(
                    f,
                    "-m statistic --mode random {}--probability {probability}",
                    bang(s.negated)
                ),
                StatisticMode::Nth { every, packet } => write!(
                    f,
                    "-m statistic --mode nth {}--every {every} --packet {packet}",
                    bang(s.negated)
                ),
            },
            Match::Mark(m) => {
                write!(f, "-m mark {}--mark {}", bang(m.negated), hex(m.value))?;
                if m.mask != u32::MAX {
                    write!(f, "/{}", hex(m.mask))?;
                }
                Ok(())
            }
            Match::Conntrack(c) => {
                f.write_str("-m conntrack")?;
                if let Some(s) = &c.state {
                    write!(f, " {}--ctstate {}", bang(s.negated), join(&s.value))?;
                }
                if let Some(s) = &c.status {
                    write!(f, " {}--ctstatus {}", bang(s.negated), join(&s.value))?;
                }
                Ok(())
            }
            Match::State(s) => write!(f, "-m state {}--state {}", bang(s.negated), join(&s.states)),
            Match::AddrType(a) => {
                f.write_str("-m addrtype")?;
                if let Some(s) = &a.src {
                    write!(f, " {}--src-type {}", bang(s.negated), join(&s.value))?;
                }
                if let Some(d) = &a.dst {
                    write!(f, " {}--dst-type {}", bang(d.negated), join(&d.value))?;
                }
                if a.limit_iface_in {
                    f.write_str(" --limit-iface-in")?;
                }
                if a.limit_iface_out {
                    f.write_str(" --limit-iface-out")?;
                }
                Ok(())
            }
            Match::Recent(r) => {
                let cmd = match r.command {
                    RecentCommand::Set => "--set",
                    RecentCommand::Check => "--rcheck",
                    RecentCommand::Update => "--update",
                    RecentCommand::Remove => "--remove",
                };
                write!(f, "-m recent {}{cmd}", bang(r.negated))?;
                if let Some(s) = r.seconds {
                    write!(f, " --seconds {s}")?;
                }
                if r.reap {
                    f.write_str(" --reap")?;
                }
                if let Some(h) = r.hitcount {
                    write!(f, " --hitcount {h}")?;
                }
                if r.rttl {
                    f.write_str(" --rttl")?;
                }
                write!(f, " --name {}", r.name)?;
                if let Some(m) = r.mask {
                    write!(f, " --mask {m}")?;
                }
                f.write_str(match r.side {
                    RecentSide::Source => " --rsource",
                    RecentSide::Dest => " --rdest",
                })
            }
            Match::Set(s) => {
                let flags = join(s.flags.iter().map(|fl| match fl {
                    SetFlag::Src => "src",
                    SetFlag::Dst => "dst",
                }));
                write!(
                    f,
                    "-m set {}--match-set {} {flags}",
                    bang(s.negated),
                    s.name
                )
            }
            Match::Nfacct { name } => write!(f, "-m nfacct --nfacct-name {}", save_string(name)),
            Match::Physdev(p) => {
                f.write_str("-m physdev")?;
                let flag = |f: &mut fmt::Formatter<'_>, v: Option<bool>, opt: &str| match v {
                    Some(neg) => write!(f, " {}{opt}", bang(neg)),
                    None => Ok(()),
                };
                flag(f, p.is_in, "--physdev-is-in")?;
                if let Some(i) = &p.physdev_in {
                    write!(f, " {}--physdev-in {}", bang(i.negated), i.value)?;
                }
                flag(f, p.is_out, "--physdev-is-out")?;
                if let Some(o) = &p.physdev_out {
                    write!(f, " {}--physdev-out {}", bang(o.negated), o.value)?;
                }
                flag(f, p.is_bridged, "--physdev-is-bridged")
            }
            Match::Unknown { module, args } => {
                write!(f, "-m {module}")?;
                for a in args {
                    write!(f, " {}", restore_arg(a))?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Display for Target {
    /// The target as `iptables-save` prints it, e.g. `-j MARK --set-xmark
    /// 0x4000/0x4000`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nat_flags = |f: &mut fmt::Formatter<'_>, n: &NatTarget| {
            for (on, opt) in [
                (n.random, " --random"),
                (n.random_fully, " --random-fully"),
                (n.persistent, " --persistent"),
            ] {
                if on {
                    f.write_str(opt)?;
                }
            }
            Ok(())
        };
        match self {
            Target::Goto(c) => write!(f, "-g {c}"),
            Target::Accept | Target::Drop | Target::Return | Target::Jump(_) => {
                write!(f, "-j {}", self.name())
            }
            Target::Reject { with } => {
                f.write_str("-j REJECT")?;
                if let Some(w) = with {
                    write!(f, " --reject-with {w}")?;
                }
                Ok(())
            }
            Target::Dnat(n) => {
                write!(f, "-j DNAT --to-destination {}", n.to)?;
                nat_flags(f, n)
            }
            Target::Snat(n) => {
                write!(f, "-j SNAT --to-source {}", n.to)?;
                nat_flags(f, n)
            }
            Target::Masquerade {
                to_ports,
                random,
                random_fully,
            } => {
                f.write_str("-j MASQUERADE")?;
                if let Some(p) = to_ports {
                    f.write_str(" --to-ports ")?;
                    p.fmt_with('-', f)?;
                }
                if *random {
                    f.write_str(" --random")?;
                }
                if *random_fully {
                    f.write_str(" --random-fully")?;
                }
                Ok(())
            }
            Target::Mark { value, mask } => {
                write!(f, "-j MARK --set-xmark {}/{}", hex(*value), hex(*mask))
            }
            Target::Unknown { name, args } => {
                write!(f, "-j {name}")?;
                for a in args {
                    write!(f, " {}", restore_arg(a))?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Display for Rule {
    /// `[p:b] -A CHAIN <general matches> <-m modules> <-j/-g target>`, exactly as
    /// `iptables-save` prints it (the counters prefix only when present).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(c) = &self.counters {
            write!(f, "{c} ")?;
        }
        write!(f, "-A {}", self.chain)?;
        for m in self.general() {
            write!(f, " {m}")?;
        }
        for m in self.matches.iter().filter(|m| m.general_rank().is_none()) {
            write!(f, " {m}")?;
        }
        if let Some(t) = &self.target {
            write!(f, " {t}")?;
        }
        Ok(())
    }
}

/// Parses an unsigned integer the way C's `strtoul(s, _, 0)` does for a whole string:
/// `0x`/`0X` hex, leading `0` octal, else decimal. No sign, no spaces.
pub(crate) fn parse_c_uint(s: &str) -> Option<u64> {
    let (digits, radix) = if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        (h, 16)
    } else if s.len() > 1 && s.starts_with('0') {
        (&s[1..], 8)
    } else {
        (s, 10)
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u64::from_str_radix(digits, radix).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_string_quotes_like_xtables() {
        assert_eq!(save_string("default_nginx-1"), "default_nginx-1");
        assert_eq!(save_string("default/nginx-svc"), "\"default/nginx-svc\"");
        assert_eq!(save_string(""), "\"\"");
        assert_eq!(save_string("a \"b\" c'd\\"), r#""a \"b\" c\'d\\""#);
    }

    #[test]
    fn probability_matches_kernel_fixed_point() {
        let p = Probability::from_f64(0.3333333333).unwrap();
        assert_eq!(p.to_string(), "0.33333333349");
        assert_eq!(
            Probability::from_f64(0.5).unwrap().to_string(),
            "0.50000000000"
        );
        assert_eq!(
            Probability::from_f64(0.1).unwrap().to_string(),
            "0.10000000009"
        );
        assert_eq!(
            Probability::from_f64(1.0).unwrap().to_string(),
            "1.00000000000"
        );
        assert_eq!(
            Probability::from_f64(0.99999999999).unwrap().to_string(),
            "1.00000000000"
        );
        assert!(Probability::from_f64(1.5).is_none());
        assert!(Probability::from_f64(f64::NAN).is_none());
    }

    #[test]
    fn cidr_masks_host_bits() {
        let c = Cidr::new("10.0.0.5".parse().unwrap(), 8).unwrap();
        assert_eq!(c.to_string(), "10.0.0.0/8");
        assert!(c.contains("10.9.9.9".parse().unwrap()));
        assert!(!c.contains("11.0.0.0".parse().unwrap()));
        assert!(!c.contains("::1".parse().unwrap()));
        let z = Cidr::new("1.2.3.4".parse().unwrap(), 0).unwrap();
        assert!(z.is_any());
        assert_eq!(z.to_string(), "0.0.0.0/0");
        assert!(Cidr::new("1.2.3.4".parse().unwrap(), 33).is_none());
        let v6 = Cidr::new("fd00::1".parse().unwrap(), 64).unwrap();
        assert_eq!(v6.to_string(), "fd00::/64");
    }

    #[test]
    fn protocol_names() {
        assert_eq!(Protocol::parse("TCP"), Some(Protocol::TCP));
        assert_eq!(Protocol::parse("47").unwrap().to_string(), "gre");
        assert_eq!(Protocol::parse("icmpv6").unwrap().to_string(), "ipv6-icmp");
        assert_eq!(Protocol::parse("200").unwrap().to_string(), "200");
        assert_eq!(Protocol::parse("all"), Some(Protocol::ALL));
        assert_eq!(Protocol::parse("bogus"), None);
        assert_eq!(Protocol::parse("256"), None);
    }

    #[test]
    fn c_uint() {
        assert_eq!(parse_c_uint("16384"), Some(16384));
        assert_eq!(parse_c_uint("0x4000"), Some(0x4000));
        assert_eq!(parse_c_uint("010"), Some(8));
        assert_eq!(parse_c_uint("0"), Some(0));
        assert_eq!(parse_c_uint(""), None);
        assert_eq!(parse_c_uint("0x"), None);
        assert_eq!(parse_c_uint("-1"), None);
        assert_eq!(parse_c_uint("08"), None);
    }

    #[test]
    fn chain_order_is_builtins_then_bytes() {
        let mut t = TableRules::with_builtins(Table::Nat);
        for n in ["a", "B", "KUBE-10", "KUBE-1-", "KUBE-1", "_x"] {
            t.chains.insert(n.into(), Chain::user());
        }
        let names: Vec<_> = t.ordered_chains().into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            [
                "PREROUTING",
                "INPUT",
                "OUTPUT",
                "POSTROUTING",
                "B",
                "KUBE-1",
                "KUBE-1-",
                "KUBE-10",
                "_x",
                "a"
            ]
        );
    }
}
