//! The nftables IR: what `nft -j list ruleset` describes, kept close to the libnftables
//! JSON schema (tables, chains, rules as statement lists, named sets and maps).
//!
//! Right-hand values ([`Lit`]) stay untyped, as the JSON has them (`"10.0.0.1"`, `"tcp"`,
//! `80`, `{"prefix": ...}`): what a literal means depends on what it is compared with, so
//! the evaluator types it against the left-hand expression when it needs it.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

/// An nftables address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Family {
    /// `ip`: IPv4 packets only.
    Ip,
    /// `ip6`: IPv6 packets only.
    Ip6,
    /// `inet`: both.
    Inet,
    /// `arp` (not traced).
    Arp,
    /// `bridge` (not traced).
    Bridge,
    /// `netdev` (not traced).
    Netdev,
}

impl Family {
    /// The name as `nft` prints it.
    pub fn name(self) -> &'static str {
        match self {
            Family::Ip => "ip",
            Family::Ip6 => "ip6",
            Family::Inet => "inet",
            Family::Arp => "arp",
            Family::Bridge => "bridge",
            Family::Netdev => "netdev",
        }
    }

    /// Parses a family name.
    pub fn from_name(name: &str) -> Option<Family> {
        Some(match name {
            "ip" => Family::Ip,
            "ip6" => Family::Ip6,
            "inet" => Family::Inet,
            "arp" => Family::Arp,
            "bridge" => Family::Bridge,
            "netdev" => Family::Netdev,
            _ => return None,
        })
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A whole `nft list ruleset`: its tables in dump order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NftRuleset {
    /// The tables.
    pub tables: Vec<NftTable>,
    /// `metainfo.version` of the `nft` that printed the dump, if given.
    pub nft_version: Option<String>,
}

impl NftRuleset {
    /// The table `name` of `family`.
    pub fn table(&self, family: Family, name: &str) -> Option<&NftTable> {
        self.tables
            .iter()
            .find(|t| t.family == family && t.name == name)
    }

    /// Whether kube-proxy's nftables mode programmed this ruleset: a table `kube-proxy` in
    /// family `ip` or `ip6`.
    pub fn has_kube_proxy(&self) -> bool {
        self.table(Family::Ip, "kube-proxy").is_some()
            || self.table(Family::Ip6, "kube-proxy").is_some()
    }

    /// This ruleset without what only one of its two printed forms carries, so that the
    /// `nft -j list ruleset` JSON and the `nft list ruleset` text of the same rules compare
    /// equal: handles (only JSON and `nft -a` print them), the `nft` version (JSON's
    /// `metainfo`), and the `dynamic` set flag (the text has it, nft 1.0.6's JSON leaves it
    /// out; the tracer takes a set that rules add elements to as dynamic either way).
    pub fn without_format_details(&self) -> NftRuleset {
        let mut rs = self.clone();
        rs.nft_version = None;
        for t in &mut rs.tables {
            for c in t.chains.values_mut() {
                c.handle = None;
                for r in &mut c.rules {
                    r.handle = None;
                }
            }
            for s in t.sets.values_mut() {
                s.flags.retain(|f| f != "dynamic");
            }
        }
        rs
    }
}

/// One table.
#[derive(Debug, Clone, PartialEq)]
pub struct NftTable {
    /// Family.
    pub family: Family,
    /// Name.
    pub name: String,
    /// Chains by name; [`NftChain::order`] keeps the dump order.
    pub chains: BTreeMap<String, NftChain>,
    /// Named sets and maps by name.
    pub sets: BTreeMap<String, NftSet>,
}

impl NftTable {
    /// `family name`, as the tracer names the table in its steps (`ip kube-proxy`).
    pub fn label(&self) -> String {
        format!("{} {}", self.family, self.name)
    }
}

/// One chain.
#[derive(Debug, Clone, PartialEq)]
pub struct NftChain {
    /// Name.
    pub name: String,
    /// Handle, if the dump has one.
    pub handle: Option<u64>,
    /// Base chain properties; `None` for a regular chain (entered only by jump/goto).
    pub base: Option<BaseChain>,
    /// Rules, in order.
    pub rules: Vec<NftRule>,
    /// Position in the dump (ties between base chains of equal priority are broken by it,
    /// as the kernel runs them in registration order).
    pub order: usize,
}

/// Hook, type, priority and policy of a base chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseChain {
    /// `filter`, `nat` or `route`.
    pub chain_type: String,
    /// `prerouting`, `input`, `forward`, `output`, `postrouting`, `ingress`, ...
    pub hook: String,
    /// The numeric priority (`dstnat` is -100, `filter` 0, `srcnat` 100, ...).
    pub priority: i32,
    /// The policy: `accept` or `drop`.
    pub policy: String,
    /// The device of an `ingress`/`egress` chain.
    pub device: Option<String>,
}

/// One rule: a list of statements evaluated left to right.
#[derive(Debug, Clone, PartialEq)]
pub struct NftRule {
    /// Handle, if the dump has one.
    pub handle: Option<u64>,
    /// The rule's comment.
    pub comment: Option<String>,
    /// Statements.
    pub stmts: Vec<Stmt>,
}

/// A named set or map.
#[derive(Debug, Clone, PartialEq)]
pub struct NftSet {
    /// Name.
    pub name: String,
    /// A map (`map` object) rather than a set.
    pub is_map: bool,
    /// The key type, one entry per concatenated part (`ipv4_addr`, `inet_proto`, ...).
    pub key_type: Vec<String>,
    /// A map's data type (`verdict`, `ipv4_addr . inet_service`, ...).
    pub data_type: Option<String>,
    /// Flags (`interval`, `timeout`, `dynamic`, `constant`).
    pub flags: Vec<String>,
    /// Default element timeout in seconds.
    pub timeout: Option<u64>,
    /// Elements.
    pub elements: Vec<SetElem>,
}

/// One element of a set or map.
#[derive(Debug, Clone, PartialEq)]
pub struct SetElem {
    /// The key (a value, a prefix, a range or a concatenation of those).
    pub key: Lit,
    /// A map element's data (a verdict, an address, `addr . port`, ...).
    pub data: Option<Lit>,
    /// The element's timeout in seconds.
    pub timeout: Option<u64>,
    /// Seconds until the element expires.
    pub expires: Option<u64>,
    /// The element's comment.
    pub comment: Option<String>,
}

/// A constant as the JSON writes it; typed on use (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub enum Lit {
    /// A number (port, mark, protocol number ...).
    Num(u64),
    /// A string: an address, a symbolic constant (`tcp`, `new`, `local`,
    /// `echo-request`), an interface name (`eth0`, `veth*`).
    Str(String),
    /// A boolean (`exists`/`missing` lookups).
    Bool(bool),
    /// `addr/len` (also on integers: `meta mark 0x15/16`).
    Prefix(Box<Lit>, u32),
    /// `low-high`.
    Range(Box<Lit>, Box<Lit>),
    /// `a . b . c`.
    Concat(Vec<Lit>),
    /// A list of flags (`established,related`).
    List(Vec<Lit>),
    /// An anonymous set or map `{ ... }`.
    Set(Vec<SetElem>),
    /// A named set or map, `@name`.
    SetRef(String),
    /// A verdict (map data).
    Verdict(NftVerdict),
}

/// A verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NftVerdict {
    /// `accept`.
    Accept,
    /// `drop`.
    Drop,
    /// `continue`.
    Continue,
    /// `return`.
    Return,
    /// `jump CHAIN`.
    Jump(String),
    /// `goto CHAIN`.
    Goto(String),
    /// `queue` (not evaluated).
    Queue,
}

/// Bitwise and shift operators of a binary expression.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    /// `&`.
    And,
    /// `|`.
    Or,
    /// `^`.
    Xor,
    /// `<<`.
    Shl,
    /// `>>`.
    Shr,
}

impl BinOp {
    /// The JSON / nft symbol.
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::And => "&",
            BinOp::Or => "|",
            BinOp::Xor => "^",
            BinOp::Shl => "<<",
            BinOp::Shr => ">>",
        }
    }
}

/// An expression producing a value from the packet (or a constant).
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// `ip daddr`, `th dport`, `tcp flags`, ...: a header field.
    Payload {
        /// Header: `ip`, `ip6`, `tcp`, `udp`, `sctp`, `th`, `icmp`, `icmpv6`, ...
        protocol: String,
        /// Field: `saddr`, `dport`, `type`, ...
        field: String,
    },
    /// `meta KEY` (`l4proto`, `mark`, `iifname`, ...).
    Meta(String),
    /// `ct [DIR] KEY` (`state`, `status`, `mark`, `original ip daddr`, ...).
    Ct {
        /// Key (`state`, `ip daddr`, ...).
        key: String,
        /// Direction (`original`, `reply`), if any.
        dir: Option<String>,
    },
    /// `fib FLAGS RESULT` (`fib daddr type`).
    Fib {
        /// `type`, `oif`, `oifname`.
        result: String,
        /// `saddr`/`daddr` plus `iif`/`oif`/`mark`.
        flags: Vec<String>,
    },
    /// `numgen MODE mod N [offset O]`.
    Numgen {
        /// `random` or `inc`.
        mode: String,
        /// The modulus N.
        modulus: u64,
        /// The offset O.
        offset: u64,
    },
    /// `a . b . c`.
    Concat(Vec<Expr>),
    /// `left OP right`.
    Binary {
        /// Operator.
        op: BinOp,
        /// Left operand.
        left: Box<Expr>,
        /// Right operand.
        right: Box<Expr>,
    },
    /// `KEY map DATA`: a map lookup producing a value (NAT targets).
    Map {
        /// The lookup key.
        key: Box<Expr>,
        /// `@name` or an anonymous map.
        data: Lit,
    },
    /// A constant.
    Lit(Lit),
    /// An expression the tracer does not know (`jhash`, `rt`, `socket`, `osf`, `exthdr`,
    /// ...).
    Unknown {
        /// The expression's JSON key (`jhash`).
        name: String,
        /// Its JSON.
        json: String,
    },
}

/// A relational operator of a match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchOp {
    /// `==` (also the implicit operator).
    Eq,
    /// `!=`.
    Ne,
    /// `<`.
    Lt,
    /// `>`.
    Gt,
    /// `<=`.
    Le,
    /// `>=`.
    Ge,
    /// `in`: a flag test for bitmasks (`ct state new`), membership for sets.
    In,
}

/// The kind of a NAT statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NatKind {
    /// `dnat`.
    Dnat,
    /// `snat`.
    Snat,
    /// `masquerade`.
    Masquerade,
    /// `redirect` (not evaluated).
    Redirect,
}

/// One statement of a rule.
#[derive(Debug, Clone, PartialEq)]
pub enum Stmt {
    /// `left OP right`: the rule goes on only if it holds.
    Match {
        /// Operator.
        op: MatchOp,
        /// What is tested.
        left: Expr,
        /// What it is compared with (a constant, a set, `@set`).
        right: Expr,
    },
    /// A verdict.
    Verdict(NftVerdict),
    /// `KEY vmap DATA`: a verdict map lookup; no element, no verdict (the rule ends).
    Vmap {
        /// The lookup key.
        key: Expr,
        /// `@name` or an anonymous verdict map.
        data: Lit,
    },
    /// `KEY set VALUE` (`meta mark set ...`, `ct mark set ...`).
    Mangle {
        /// What is set.
        key: Expr,
        /// The new value.
        value: Expr,
    },
    /// `dnat`, `snat`, `masquerade`, `redirect`.
    Nat {
        /// Which.
        kind: NatKind,
        /// `ip`/`ip6` (the `dnat ip to ...` form).
        family: Option<String>,
        /// The address (or `addr . port`) expression.
        addr: Option<Expr>,
        /// The port expression.
        port: Option<Expr>,
        /// Flags (`fully-random`, `persistent`, ...).
        flags: Vec<String>,
    },
    /// `reject [with TYPE CODE]`.
    Reject {
        /// `icmp`, `icmpv6`, `icmpx`, `tcp reset`.
        kind: Option<String>,
        /// `port-unreachable`, `admin-prohibited`, ...
        code: Option<String>,
    },
    /// `update @set { elem }` / `add @set { elem }` / `delete @set { elem }`.
    SetOp {
        /// `update`, `add`, `delete`.
        op: String,
        /// The element expression (`ip saddr`).
        elem: Expr,
        /// The set's name.
        set: String,
        /// A timeout given in the statement.
        timeout: Option<u64>,
    },
    /// `counter`.
    Counter,
    /// `log [prefix ...]`.
    Log {
        /// The prefix.
        prefix: Option<String>,
    },
    /// An iptables-nft compatibility expression (`xt match comment`): its options are not
    /// in the JSON. Only `comment` matches are evaluated (they always match).
    Xt {
        /// `match` or `target`.
        kind: String,
        /// The xtables module name.
        name: String,
    },
    /// A statement the tracer does not know (`limit`, `quota`, `notrack`, `queue`, ...),
    /// with its JSON.
    Unknown {
        /// The statement's JSON key.
        name: String,
        /// Its JSON.
        json: String,
    },
}
