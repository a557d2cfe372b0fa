//! The IR printed back in `nft` syntax, close to what `nft list ruleset` shows
//! (`ip daddr . meta l4proto . th dport vmap @service-ips`, `meta l4proto tcp dnat to
//! 10.180.0.1:80`), for the trace's steps.

use std::fmt::{self, Write as _};

use super::eval::{Kind, kinds};
use super::ir::{Expr, Lit, MatchOp, NatKind, NftRule, NftVerdict, SetElem, Stmt};

/// The rule in `nft` syntax, with its comment.
pub(crate) fn rule_text(rule: &NftRule) -> String {
    let mut parts: Vec<String> = rule.stmts.iter().map(stmt_text).collect();
    if let Some(c) = &rule.comment {
        parts.push(format!("comment \"{c}\""));
    }
    parts.join(" ")
}

impl fmt::Display for NftVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NftVerdict::Accept => f.write_str("accept"),
            NftVerdict::Drop => f.write_str("drop"),
            NftVerdict::Continue => f.write_str("continue"),
            NftVerdict::Return => f.write_str("return"),
            NftVerdict::Jump(c) => write!(f, "jump {c}"),
            NftVerdict::Goto(c) => write!(f, "goto {c}"),
            NftVerdict::Queue => f.write_str("queue"),
        }
    }
}

/// One statement in `nft` syntax.
pub(crate) fn stmt_text(s: &Stmt) -> String {
    match s {
        Stmt::Match { op, left, right } => {
            let kind = kinds(left).first().copied().unwrap_or(Kind::Unknown);
            let r = match right {
                Expr::Lit(l) => lit_text(l, kind),
                other => expr_text(other),
            };
            let op = match op {
                MatchOp::Eq if matches!(left, Expr::Binary { .. }) => "== ",
                MatchOp::Eq | MatchOp::In => "",
                MatchOp::Ne => "!= ",
                MatchOp::Lt => "< ",
                MatchOp::Gt => "> ",
                MatchOp::Le => "<= ",
                MatchOp::Ge => ">= ",
            };
            format!("{} {op}{r}", expr_text(left))
        }
        Stmt::Verdict(v) => v.to_string(),
        Stmt::Vmap { key, data } => {
            let kind = kinds(key).first().copied().unwrap_or(Kind::Unknown);
            format!("{} vmap {}", expr_text(key), lit_text(data, kind))
        }
        Stmt::Mangle { key, value } => format!("{} set {}", expr_text(key), expr_text(value)),
        Stmt::Nat {
            kind,
            family,
            addr,
            port,
            flags,
        } => {
            let mut out = String::from(match kind {
                NatKind::Dnat => "dnat",
                NatKind::Snat => "snat",
                NatKind::Masquerade => "masquerade",
                NatKind::Redirect => "redirect",
            });
            if let Some(f) = family {
                let _ = write!(out, " {f}");
            }
            if addr.is_some() || port.is_some() {
                out.push_str(" to ");
            }
            if let Some(a) = addr {
                let t = match a {
                    Expr::Lit(Lit::Str(s)) if s.contains(':') && port.is_some() => {
                        format!("[{s}]")
                    }
                    other => expr_text(other),
                };
                out.push_str(&t);
            }
            if let Some(p) = port {
                let _ = write!(out, ":{}", expr_text(p));
            }
            for fl in flags {
                let _ = write!(out, " {fl}");
            }
            out
        }
        Stmt::Reject { kind, code } => match (kind.as_deref(), code.as_deref()) {
            (None, _) => "reject".into(),
            (Some("icmp" | "icmpv6" | "icmpx"), Some("port-unreachable")) => "reject".into(),
            (Some(k), Some(c)) => format!("reject with {k} {c}"),
            (Some(k), None) => format!("reject with {k}"),
        },
        Stmt::SetOp {
            op,
            elem,
            set,
            timeout,
        } => {
            let t = timeout.map_or_else(String::new, |t| format!(" timeout {t}s"));
            format!("{op} @{set} {{ {}{t} }}", expr_text(elem))
        }
        Stmt::Counter => "counter".into(),
        Stmt::Log { prefix } => match prefix {
            Some(p) => format!("log prefix \"{p}\""),
            None => "log".into(),
        },
        Stmt::Xt { kind, name } => format!("xt {kind} {name}"),
        Stmt::Unknown { json, .. } => format!("<unknown statement {json}>"),
    }
}

/// An expression in `nft` syntax.
pub(crate) fn expr_text(e: &Expr) -> String {
    match e {
        Expr::Payload { protocol, field } => format!("{protocol} {field}"),
        Expr::Meta(k) => match k.as_str() {
            "iifname" | "oifname" | "iif" | "oif" | "iifgroup" | "oifgroup" => k.clone(),
            _ => format!("meta {k}"),
        },
        Expr::Ct { key, dir } => match dir {
            Some(d) => format!("ct {d} {key}"),
            None => format!("ct {key}"),
        },
        Expr::Fib { result, flags } => format!("fib {} {result}", flags.join(" . ")),
        Expr::Numgen {
            mode,
            modulus,
            offset,
        } => {
            if *offset == 0 {
                format!("numgen {mode} mod {modulus}")
            } else {
                format!("numgen {mode} mod {modulus} offset {offset}")
            }
        }
        Expr::Concat(parts) => parts.iter().map(expr_text).collect::<Vec<_>>().join(" . "),
        Expr::Binary { op, left, right } => {
            let kind = kinds(left).first().copied().unwrap_or(Kind::Unknown);
            let r = match right.as_ref() {
                Expr::Lit(l) => lit_text(l, kind),
                other => expr_text(other),
            };
            format!("{} {} {r}", expr_text(left), op.symbol())
        }
        Expr::Map { key, data } => {
            let kind = kinds(key).first().copied().unwrap_or(Kind::Unknown);
            format!("{} map {}", expr_text(key), lit_text(data, kind))
        }
        Expr::Lit(l) => lit_text(l, Kind::Unknown),
        Expr::Unknown { json, .. } => format!("<unknown expression {json}>"),
    }
}

/// A constant, printed for a value of `kind` (marks in hex, interface names quoted;
/// anonymous sets of addresses and prefixes in ascending order, as `nft list` prints them).
pub(crate) fn lit_text(l: &Lit, kind: Kind) -> String {
    match l {
        Lit::Num(n) => match kind {
            Kind::Mark | Kind::CtStatus => format!("{n:#x}"),
            _ => n.to_string(),
        },
        Lit::Str(s) => match kind {
            Kind::IfName | Kind::IfIndex => format!("\"{s}\""),
            _ => s.clone(),
        },
        Lit::Bool(b) => if *b { "exists" } else { "missing" }.to_string(),
        Lit::Prefix(a, len) => format!("{}/{len}", lit_text(a, kind)),
        Lit::Range(a, b) => format!("{}-{}", lit_text(a, kind), lit_text(b, kind)),
        Lit::Concat(parts) => parts
            .iter()
            .map(|p| lit_text(p, Kind::Unknown))
            .collect::<Vec<_>>()
            .join(" . "),
        Lit::List(items) => items
            .iter()
            .map(|i| lit_text(i, kind))
            .collect::<Vec<_>>()
            .join(","),
        Lit::Set(elems) => {
            let mut order: Vec<&SetElem> = elems.iter().collect();
            // A set of addresses and prefixes in ascending order, as `nft list` prints it
            // (the kernel keeps an interval set sorted), whatever order a script wrote.
            let keys: Option<Vec<(std::net::IpAddr, u32)>> =
                elems.iter().map(address_key).collect();
            if let Some(keys) = keys {
                let mut pairs: Vec<(&(std::net::IpAddr, u32), &SetElem)> =
                    keys.iter().zip(elems).collect();
                pairs.sort_by_key(|(k, _)| **k);
                order = pairs.into_iter().map(|(_, e)| e).collect();
            }
            let items: Vec<String> = order.iter().map(|e| elem_text(e, kind)).collect();
            format!("{{ {} }}", items.join(", "))
        }
        Lit::SetRef(n) => format!("@{n}"),
        Lit::Verdict(v) => v.to_string(),
    }
}

/// The sort key of a set element that is an address or a prefix (`10.0.0.0/8`) without
/// data; `None` for anything else.
fn address_key(e: &SetElem) -> Option<(std::net::IpAddr, u32)> {
    if e.data.is_some() {
        return None;
    }
    match &e.key {
        Lit::Str(a) => a.parse().ok().map(|ip| (ip, 128)),
        Lit::Prefix(a, len) => match &**a {
            Lit::Str(a) => a.parse().ok().map(|ip| (ip, *len)),
            _ => None,
        },
        _ => None,
    }
}

/// A set element (`172.30.0.41 . tcp . 80 : goto service-...`).
pub(crate) fn elem_text(e: &SetElem, kind: Kind) -> String {
    let mut key = lit_text(&e.key, kind);
    if let Some(c) = &e.comment {
        key.push_str(&format!(" comment \"{c}\""));
    }
    match &e.data {
        Some(d) => format!("{key} : {}", lit_text(d, Kind::Unknown)),
        None => key,
    }
}
