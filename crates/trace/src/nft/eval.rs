//! Values and comparisons: what a packet field evaluates to, what a JSON constant means
//! for it ([`Kind`]), and set/map lookups — all three-valued: a field can be known, unknown
//! (not given, or not modelled: the rule's outcome is then uncertain), or absent (the
//! field's protocol is not the packet's: the rule cannot match, as the kernel's implicit
//! dependency match — `meta l4proto tcp` before `tcp dport` — fails).

use std::net::IpAddr;

use kp_netfilter::Cidr;

use super::ir::{Expr, Lit, SetElem};

/// What kind of value an expression produces; decides how constants are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// An IPv4 or IPv6 address.
    Addr,
    /// An IP protocol number (`inet_proto`: `tcp`, `udp`, ...).
    Proto,
    /// A port (`inet_service`).
    Port,
    /// A packet or conntrack mark (32 bits).
    Mark,
    /// Another integer of this many bits.
    Int(u32),
    /// An interface name (`iifname`; `veth*` is a prefix).
    IfName,
    /// An interface (`iif`): compared by name.
    IfIndex,
    /// `meta nfproto` (`ipv4`, `ipv6`).
    NfProto,
    /// `meta protocol` (`ip`, `ip6`).
    EtherType,
    /// `ct state` (a bitmask).
    CtState,
    /// `ct status` (a bitmask).
    CtStatus,
    /// `ct direction`.
    CtDir,
    /// `fib ... type`.
    FibType,
    /// `icmp type`.
    IcmpType,
    /// `icmpv6 type`.
    Icmp6Type,
    /// `tcp flags` (a bitmask).
    TcpFlags,
    /// `meta pkttype`.
    PktType,
    /// Not known.
    Unknown,
}

impl Kind {
    /// Whether the kind is a bitmask (`in` tests flags).
    pub(crate) fn is_bitmask(self) -> bool {
        matches!(self, Kind::CtState | Kind::CtStatus | Kind::TcpFlags)
    }

    /// Width in bits of an integer kind.
    fn bits(self) -> u32 {
        match self {
            Kind::Proto | Kind::IcmpType | Kind::Icmp6Type | Kind::TcpFlags | Kind::PktType => 8,
            Kind::Port | Kind::EtherType => 16,
            Kind::Int(b) => b,
            _ => 32,
        }
    }
}

/// The kinds of the parts of `e` (one per concatenated part).
pub(crate) fn kinds(e: &Expr) -> Vec<Kind> {
    match e {
        Expr::Concat(parts) => parts.iter().flat_map(kinds).collect(),
        Expr::Binary { left, .. } => kinds(left),
        _ => vec![kind(e)],
    }
}

fn kind(e: &Expr) -> Kind {
    match e {
        Expr::Payload { protocol, field } => match (protocol.as_str(), field.as_str()) {
            ("ip" | "ip6", "saddr" | "daddr") => Kind::Addr,
            ("ip", "protocol") | ("ip6", "nexthdr") => Kind::Proto,
            ("tcp" | "udp" | "udplite" | "sctp" | "dccp" | "th", "sport" | "dport") => Kind::Port,
            ("icmp", "type") => Kind::IcmpType,
            ("icmpv6", "type") => Kind::Icmp6Type,
            ("tcp", "flags") => Kind::TcpFlags,
            _ => Kind::Unknown,
        },
        Expr::Meta(k) => match k.as_str() {
            "l4proto" => Kind::Proto,
            "nfproto" => Kind::NfProto,
            "protocol" => Kind::EtherType,
            "iifname" | "oifname" => Kind::IfName,
            "iif" | "oif" => Kind::IfIndex,
            "mark" => Kind::Mark,
            "pkttype" => Kind::PktType,
            _ => Kind::Unknown,
        },
        Expr::Ct { key, .. } => match key.as_str() {
            "state" => Kind::CtState,
            "status" => Kind::CtStatus,
            "direction" => Kind::CtDir,
            "mark" => Kind::Mark,
            "ip saddr" | "ip daddr" | "ip6 saddr" | "ip6 daddr" | "saddr" | "daddr" => Kind::Addr,
            "l3proto" => Kind::NfProto,
            "protocol" => Kind::Proto,
            "proto-src" | "proto-dst" => Kind::Port,
            _ => Kind::Unknown,
        },
        Expr::Fib { result, .. } => match result.as_str() {
            "type" => Kind::FibType,
            "oifname" => Kind::IfName,
            "oif" => Kind::IfIndex,
            _ => Kind::Unknown,
        },
        Expr::Numgen { .. } => Kind::Int(32),
        Expr::Binary { left, .. } => kind(left),
        _ => Kind::Unknown,
    }
}

/// A runtime value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Val {
    /// An integer (protocols, ports, marks, flags, types).
    Int(u128),
    /// An address.
    Addr(IpAddr),
    /// An interface name.
    Name(String),
}

/// One evaluated part of a key.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum V {
    /// The value.
    Known(Val),
    /// Not known (why).
    Unknown(String),
    /// The field does not exist in this packet: the rule cannot match.
    Absent,
}

/// `IPPROTO_*` names.
const PROTOS: &[(&str, u8)] = &[
    ("icmp", 1),
    ("igmp", 2),
    ("ipip", 4),
    ("tcp", 6),
    ("egp", 8),
    ("udp", 17),
    ("ipv6", 41),
    ("gre", 47),
    ("esp", 50),
    ("ah", 51),
    ("icmpv6", 58),
    ("ipv6-icmp", 58),
    ("comp", 108),
    ("sctp", 132),
    ("udplite", 136),
];

const CT_STATES: &[(&str, u128)] = &[
    ("invalid", 1),
    ("established", 2),
    ("related", 4),
    ("new", 8),
    ("untracked", 64),
];

const CT_STATUS: &[(&str, u128)] = &[
    ("expected", 1),
    ("seen-reply", 2),
    ("assured", 4),
    ("confirmed", 8),
    ("snat", 16),
    ("dnat", 32),
    ("dying", 512),
];

const TCP_FLAGS: &[(&str, u128)] = &[
    ("fin", 1),
    ("syn", 2),
    ("rst", 4),
    ("psh", 8),
    ("ack", 16),
    ("urg", 32),
    ("ecn", 64),
    ("cwr", 128),
];

/// `RTN_*` route types.
pub(crate) const FIB_TYPES: &[(&str, u128)] = &[
    ("unspec", 0),
    ("unicast", 1),
    ("local", 2),
    ("broadcast", 3),
    ("anycast", 4),
    ("multicast", 5),
    ("blackhole", 6),
    ("unreachable", 7),
    ("prohibit", 8),
    ("throw", 9),
    ("nat", 10),
    ("xresolve", 11),
];

const ICMP_TYPES: &[(&str, u128)] = &[
    ("echo-reply", 0),
    ("destination-unreachable", 3),
    ("source-quench", 4),
    ("redirect", 5),
    ("echo-request", 8),
    ("router-advertisement", 9),
    ("router-solicitation", 10),
    ("time-exceeded", 11),
    ("parameter-problem", 12),
    ("timestamp-request", 13),
    ("timestamp-reply", 14),
    ("info-request", 15),
    ("info-reply", 16),
    ("address-mask-request", 17),
    ("address-mask-reply", 18),
];

const ICMP6_TYPES: &[(&str, u128)] = &[
    ("destination-unreachable", 1),
    ("packet-too-big", 2),
    ("time-exceeded", 3),
    ("parameter-problem", 4),
    ("echo-request", 128),
    ("echo-reply", 129),
    ("mld-listener-query", 130),
    ("mld-listener-report", 131),
    ("mld-listener-done", 132),
    ("nd-router-solicit", 133),
    ("nd-router-advert", 134),
    ("nd-neighbor-solicit", 135),
    ("nd-neighbor-advert", 136),
    ("nd-redirect", 137),
];

fn named(table: &[(&str, u128)], s: &str) -> Option<u128> {
    table.iter().find(|(n, _)| *n == s).map(|(_, v)| *v)
}

fn int_str(s: &str) -> Option<u128> {
    match s.strip_prefix("0x") {
        Some(h) => u128::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// The value a constant has for `kind`.
pub(crate) fn const_val(kind: Kind, lit: &Lit) -> Result<Val, String> {
    let bad = || format!("constant {lit:?} not understood for a {kind:?} value");
    match lit {
        Lit::Num(n) => match kind {
            Kind::Addr | Kind::IfName | Kind::IfIndex => Err(bad()),
            _ => Ok(Val::Int(u128::from(*n))),
        },
        Lit::Str(s) => {
            let v = match kind {
                Kind::Addr => return s.parse().map(Val::Addr).map_err(|_| bad()),
                Kind::IfName | Kind::IfIndex => return Ok(Val::Name(s.clone())),
                Kind::Proto => PROTOS
                    .iter()
                    .find(|(n, _)| *n == s)
                    .map(|(_, p)| u128::from(*p))
                    .or_else(|| int_str(s)),
                Kind::NfProto => match s.as_str() {
                    "ipv4" => Some(2),
                    "ipv6" => Some(10),
                    _ => int_str(s),
                },
                Kind::EtherType => match s.as_str() {
                    "ip" => Some(0x0800),
                    "ip6" => Some(0x86dd),
                    "arp" => Some(0x0806),
                    "vlan" => Some(0x8100),
                    _ => int_str(s),
                },
                Kind::CtState => named(CT_STATES, s),
                Kind::CtStatus => named(CT_STATUS, s),
                Kind::CtDir => match s.as_str() {
                    "original" => Some(0),
                    "reply" => Some(1),
                    _ => None,
                },
                Kind::FibType => named(FIB_TYPES, s),
                Kind::IcmpType => named(ICMP_TYPES, s).or_else(|| int_str(s)),
                Kind::Icmp6Type => named(ICMP6_TYPES, s).or_else(|| int_str(s)),
                Kind::TcpFlags => named(TCP_FLAGS, s),
                Kind::PktType => match s.as_str() {
                    "host" => Some(0),
                    "broadcast" => Some(1),
                    "multicast" => Some(2),
                    "other" => Some(3),
                    _ => None,
                },
                Kind::Port | Kind::Mark | Kind::Int(_) => int_str(s),
                Kind::Unknown => None,
            };
            v.map(Val::Int).ok_or_else(bad)
        }
        Lit::List(items) if kind.is_bitmask() => {
            let mut mask = 0u128;
            for i in items {
                match const_val(kind, i)? {
                    Val::Int(b) => mask |= b,
                    _ => return Err(bad()),
                }
            }
            Ok(Val::Int(mask))
        }
        _ => Err(bad()),
    }
}

/// A constant typed for comparison.
#[derive(Debug, Clone)]
enum Pat {
    Val(Val),
    /// An address network.
    Net(Cidr),
    /// The top `len` bits of a `bits`-wide integer.
    IntPrefix(u128, u32, u32),
    Range(Val, Val),
    /// An interface name prefix (`veth*`).
    Wild(String),
}

fn pat(kind: Kind, lit: &Lit) -> Result<Pat, String> {
    match lit {
        Lit::Prefix(a, len) => match kind {
            Kind::Addr => {
                let Val::Addr(ip) = const_val(kind, a)? else {
                    return Err(format!("bad prefix {lit:?}"));
                };
                let len = u8::try_from(*len).map_err(|_| format!("bad prefix {lit:?}"))?;
                Cidr::new(ip, len)
                    .map(Pat::Net)
                    .ok_or_else(|| format!("bad prefix {lit:?}"))
            }
            _ => match const_val(kind, a)? {
                Val::Int(v) => Ok(Pat::IntPrefix(v, *len, kind.bits())),
                _ => Err(format!("bad prefix {lit:?}")),
            },
        },
        Lit::Range(a, b) => Ok(Pat::Range(const_val(kind, a)?, const_val(kind, b)?)),
        Lit::Str(s) if kind == Kind::IfName && s.ends_with('*') && !s.ends_with("\\*") => {
            Ok(Pat::Wild(s.trim_end_matches('*').to_string()))
        }
        other => const_val(kind, other).map(Pat::Val),
    }
}

fn ordinal(v: &Val) -> Option<(u8, u128)> {
    match v {
        Val::Int(i) => Some((0, *i)),
        Val::Addr(IpAddr::V4(a)) => Some((4, u128::from(u32::from(*a)))),
        Val::Addr(IpAddr::V6(a)) => Some((6, u128::from(*a))),
        Val::Name(_) => None,
    }
}

fn test(v: &Val, p: &Pat) -> bool {
    match p {
        Pat::Val(x) => x == v,
        Pat::Net(net) => matches!(v, Val::Addr(ip) if net.contains(*ip)),
        Pat::IntPrefix(x, len, bits) => match v {
            Val::Int(i) => {
                let shift = bits.saturating_sub(*len);
                i.checked_shr(shift).unwrap_or(0) == x.checked_shr(shift).unwrap_or(0)
            }
            _ => false,
        },
        Pat::Range(a, b) => match (ordinal(v), ordinal(a), ordinal(b)) {
            (Some((fv, x)), Some((fa, lo)), Some((fb, hi))) => {
                fv == fa && fv == fb && lo <= x && x <= hi
            }
            _ => false,
        },
        Pat::Wild(prefix) => matches!(v, Val::Name(n) if n.starts_with(prefix.as_str())),
    }
}

/// Three-valued result.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Truth {
    Yes,
    No,
    Unknown(String),
}

impl Truth {
    pub(crate) fn from_bool(b: bool) -> Truth {
        if b { Truth::Yes } else { Truth::No }
    }

    pub(crate) fn not(self) -> Truth {
        match self {
            Truth::Yes => Truth::No,
            Truth::No => Truth::Yes,
            u => u,
        }
    }
}

/// `v OP lit` for one value of `kind` (the operator already folded into `op`).
pub(crate) fn compare(kind: Kind, v: &Val, op: CmpOp, lit: &Lit) -> Truth {
    let p = match pat(kind, lit) {
        Ok(p) => p,
        Err(e) => return Truth::Unknown(e),
    };
    match op {
        CmpOp::Eq => Truth::from_bool(test(v, &p)),
        CmpOp::Flags => match (v, &p) {
            (Val::Int(x), Pat::Val(Val::Int(m))) => Truth::from_bool(x & m != 0),
            _ => Truth::from_bool(test(v, &p)),
        },
        CmpOp::NoFlags => match (v, &p) {
            (Val::Int(x), Pat::Val(Val::Int(m))) => Truth::from_bool(x & m == 0),
            _ => Truth::from_bool(!test(v, &p)),
        },
        CmpOp::Lt | CmpOp::Gt | CmpOp::Le | CmpOp::Ge => {
            let (Some((fv, x)), Pat::Val(c)) = (ordinal(v), &p) else {
                return Truth::Unknown(format!("cannot order {v:?} against {lit:?}"));
            };
            let Some((fc, y)) = ordinal(c) else {
                return Truth::Unknown(format!("cannot order {v:?} against {lit:?}"));
            };
            if fv != fc {
                return Truth::No;
            }
            Truth::from_bool(match op {
                CmpOp::Lt => x < y,
                CmpOp::Gt => x > y,
                CmpOp::Le => x <= y,
                _ => x >= y,
            })
        }
    }
}

/// A comparison, with `!=` on plain values folded into a negated `Eq` by the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CmpOp {
    Eq,
    /// Any of the flags set (`ct state new`, `ct state established,related`).
    Flags,
    /// None of the flags set (`ct state != established`).
    NoFlags,
    Lt,
    Gt,
    Le,
    Ge,
}

/// The result of a set or map lookup.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Lookup {
    /// The element with this index matched.
    Hit(usize),
    /// No element matched.
    Miss,
    /// It depends on something unknown.
    Unknown(String),
    /// A part of the key does not exist in this packet.
    Absent,
}

/// Looks `vals` (one per key part, of `kinds`) up in `elems`. Elements of a set never
/// overlap, so a definite hit decides even if other elements are undecided.
pub(crate) fn lookup(kinds: &[Kind], vals: &[V], elems: &[SetElem]) -> Lookup {
    if vals.contains(&V::Absent) {
        return Lookup::Absent;
    }
    let mut undecided: Option<String> = None;
    for (i, e) in elems.iter().enumerate() {
        let parts: Vec<&Lit> = match &e.key {
            Lit::Concat(p) => p.iter().collect(),
            k => vec![k],
        };
        if parts.len() != vals.len() {
            undecided.get_or_insert_with(|| {
                format!(
                    "element {:?} has {} parts, the key {}",
                    e.key,
                    parts.len(),
                    vals.len()
                )
            });
            continue;
        }
        let mut all = true;
        let mut why: Option<String> = None;
        for ((v, lit), k) in vals.iter().zip(parts).zip(kinds) {
            match v {
                V::Known(val) => match compare(*k, val, CmpOp::Eq, lit) {
                    Truth::Yes => {}
                    Truth::No => {
                        all = false;
                        why = None;
                        break;
                    }
                    Truth::Unknown(w) => {
                        all = false;
                        why.get_or_insert(w);
                    }
                },
                V::Unknown(w) => {
                    all = false;
                    why.get_or_insert_with(|| w.clone());
                }
                V::Absent => return Lookup::Absent,
            }
        }
        if all {
            return Lookup::Hit(i);
        }
        if let Some(w) = why {
            undecided.get_or_insert(w);
        }
    }
    match undecided {
        Some(w) => Lookup::Unknown(w),
        None => Lookup::Miss,
    }
}

/// Formats a runtime value as `nft` would print it for `kind`.
pub(crate) fn val_text(kind: Kind, v: &Val) -> String {
    match v {
        Val::Addr(a) => a.to_string(),
        Val::Name(n) => format!("\"{n}\""),
        Val::Int(i) => {
            let from =
                |t: &[(&str, u128)]| t.iter().find(|(_, x)| x == i).map(|(n, _)| n.to_string());
            let name = match kind {
                Kind::Proto => PROTOS
                    .iter()
                    .find(|(_, p)| u128::from(*p) == *i)
                    .map(|(n, _)| n.to_string()),
                Kind::CtState => from(CT_STATES),
                Kind::FibType => from(FIB_TYPES),
                Kind::IcmpType => from(ICMP_TYPES),
                Kind::Icmp6Type => from(ICMP6_TYPES),
                Kind::Mark | Kind::CtStatus | Kind::TcpFlags => Some(format!("{i:#x}")),
                _ => None,
            };
            name.unwrap_or_else(|| i.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: &str) -> Lit {
        Lit::Str(x.into())
    }

    #[test]
    fn constants_by_kind() {
        assert_eq!(const_val(Kind::Proto, &s("tcp")), Ok(Val::Int(6)));
        assert_eq!(const_val(Kind::CtState, &s("new")), Ok(Val::Int(8)));
        assert_eq!(
            const_val(
                Kind::CtState,
                &Lit::List(vec![s("established"), s("related")])
            ),
            Ok(Val::Int(6))
        );
        assert!(const_val(Kind::Addr, &Lit::Num(3)).is_err());
        assert!(const_val(Kind::Unknown, &s("x")).is_err());
        let mark = Lit::Prefix(Box::new(Lit::Num(0x15)), 16);
        // `meta mark 0x15/16`: the top 16 bits of 0x15 (zero).
        assert_eq!(
            compare(Kind::Mark, &Val::Int(0x4000), CmpOp::Eq, &mark),
            Truth::Yes
        );
        assert_eq!(
            compare(Kind::Mark, &Val::Int(0x1_0000), CmpOp::Eq, &mark),
            Truth::No
        );
        let veth = s("veth*");
        assert_eq!(
            compare(Kind::IfName, &Val::Name("veth12".into()), CmpOp::Eq, &veth),
            Truth::Yes
        );
    }

    #[test]
    fn concatenated_lookup_is_three_valued() {
        let elems = vec![SetElem {
            key: Lit::Concat(vec![s("172.30.0.41"), s("tcp"), Lit::Num(80)]),
            data: None,
            timeout: None,
            expires: None,
            comment: None,
        }];
        let kinds = [Kind::Addr, Kind::Proto, Kind::Port];
        let addr = V::Known(Val::Addr("172.30.0.41".parse().expect("ip")));
        let hit = [addr.clone(), V::Known(Val::Int(6)), V::Known(Val::Int(80))];
        assert_eq!(lookup(&kinds, &hit, &elems), Lookup::Hit(0));
        // ICMP: the protocol decides even though `th dport` is unknown.
        let icmp = [
            addr.clone(),
            V::Known(Val::Int(1)),
            V::Unknown("checksum".into()),
        ];
        assert_eq!(lookup(&kinds, &icmp, &elems), Lookup::Miss);
        let noport = [addr, V::Known(Val::Int(6)), V::Unknown("no port".into())];
        assert!(matches!(
            lookup(&kinds, &noport, &elems),
            Lookup::Unknown(_)
        ));
    }
}
