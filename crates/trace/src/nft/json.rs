//! Reading `nft -j list ruleset` (the libnftables JSON schema) into the IR.
//!
//! The document is `{"nftables": [OBJECT, ...]}` where each object has one key: `metainfo`,
//! `table`, `chain`, `rule`, `set`, `map`, `element`, or others (`flowtable`, `counter`,
//! `quota`, `ct helper`, `limit`, ... — ignored: they are only referenced by name from
//! rules, and a rule using them holds an expression the tracer reports as unknown).
//!
//! Structural problems (not JSON, no `nftables` array, a rule for a chain that was not
//! listed) are errors. An expression or statement the tracer does not know is kept as
//! [`Expr::Unknown`] / [`Stmt::Unknown`] with its JSON, never dropped.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::ir::{
    BaseChain, BinOp, Expr, Family, Lit, MatchOp, NatKind, NftChain, NftRule, NftRuleset, NftSet,
    NftTable, NftVerdict, SetElem, Stmt,
};
use crate::TraceError;

fn err(message: impl Into<String>) -> TraceError {
    TraceError::NftJson(message.into())
}

/// Parses the output of `nft -j list ruleset` (or `nft -j list table ...`).
///
/// # Errors
///
/// [`TraceError::NftJson`] when the text is not JSON or not in the libnftables schema.
pub fn parse_nft_json(text: &str) -> Result<NftRuleset, TraceError> {
    let doc: Value = serde_json::from_str(text).map_err(|e| err(format!("not JSON: {e}")))?;
    let items = doc
        .get("nftables")
        .and_then(Value::as_array)
        .ok_or_else(|| err("expected an object with an `nftables` array"))?;
    let mut rs = NftRuleset::default();
    // (family, table) -> index in rs.tables
    let mut index: BTreeMap<(Family, String), usize> = BTreeMap::new();
    let mut order = 0usize;
    for (n, item) in items.iter().enumerate() {
        let obj = item
            .as_object()
            .ok_or_else(|| err(format!("item {n} of `nftables` is not an object")))?;
        let Some((kind, body)) = obj.iter().next() else {
            continue;
        };
        let at = |m: String| err(format!("{kind} (item {n}): {m}"));
        match kind.as_str() {
            "metainfo" => {
                rs.nft_version = body
                    .get("version")
                    .and_then(Value::as_str)
                    .map(str::to_string);
            }
            "table" => {
                let (family, name) = family_and(body, "name").map_err(at)?;
                table_mut(&mut rs, &mut index, family, &name);
            }
            "chain" => {
                let (family, table) = family_and(body, "table").map_err(at)?;
                let name = str_field(body, "name").map_err(at)?;
                let t = table_mut(&mut rs, &mut index, family, &table);
                let base = body
                    .get("hook")
                    .and_then(Value::as_str)
                    .map(|hook| BaseChain {
                        chain_type: body
                            .get("type")
                            .and_then(Value::as_str)
                            .unwrap_or("filter")
                            .to_string(),
                        hook: hook.to_string(),
                        priority: body
                            .get("prio")
                            .and_then(Value::as_i64)
                            .and_then(|p| i32::try_from(p).ok())
                            .unwrap_or(0),
                        policy: body
                            .get("policy")
                            .and_then(Value::as_str)
                            .unwrap_or("accept")
                            .to_string(),
                        device: body.get("dev").and_then(Value::as_str).map(str::to_string),
                    });
                order += 1;
                let handle = body.get("handle").and_then(Value::as_u64);
                let chain = t.chains.entry(name.clone()).or_insert_with(|| NftChain {
                    name,
                    handle,
                    base: None,
                    rules: Vec::new(),
                    order,
                });
                if base.is_some() {
                    chain.base = base;
                }
            }
            "rule" => {
                let (family, table) = family_and(body, "table").map_err(at)?;
                let chain = str_field(body, "chain").map_err(at)?;
                let exprs = body
                    .get("expr")
                    .and_then(Value::as_array)
                    .map(Vec::as_slice)
                    .unwrap_or_default();
                let rule = NftRule {
                    handle: body.get("handle").and_then(Value::as_u64),
                    comment: body
                        .get("comment")
                        .and_then(Value::as_str)
                        .map(str::to_string),
                    stmts: exprs.iter().map(parse_stmt).collect(),
                };
                let t = table_mut(&mut rs, &mut index, family, &table);
                let c = t.chains.get_mut(&chain).ok_or_else(|| {
                    at(format!(
                        "rule for chain {chain}, which the dump does not list in table {family} {table}"
                    ))
                })?;
                c.rules.push(rule);
            }
            "set" | "map" => {
                let (family, table) = family_and(body, "table").map_err(at)?;
                let name = str_field(body, "name").map_err(at)?;
                let set = NftSet {
                    name: name.clone(),
                    is_map: kind == "map",
                    key_type: type_list(body.get("type")),
                    data_type: body.get("map").map(|m| type_list(Some(m)).join(" . ")),
                    flags: str_list(body.get("flags")),
                    timeout: body.get("timeout").and_then(Value::as_u64),
                    elements: body
                        .get("elem")
                        .and_then(Value::as_array)
                        .map(|a| a.iter().map(parse_elem).collect())
                        .unwrap_or_default(),
                };
                let t = table_mut(&mut rs, &mut index, family, &table);
                t.sets.insert(name, set);
            }
            "element" => {
                let (family, table) = family_and(body, "table").map_err(at)?;
                let name = str_field(body, "name").map_err(at)?;
                let t = table_mut(&mut rs, &mut index, family, &table);
                let set = t
                    .sets
                    .get_mut(&name)
                    .ok_or_else(|| at(format!("elements for set {name}, which is not listed")))?;
                if let Some(a) = body.get("elem").and_then(Value::as_array) {
                    set.elements.extend(a.iter().map(parse_elem));
                }
            }
            _ => {}
        }
    }
    Ok(rs)
}

fn table_mut<'a>(
    rs: &'a mut NftRuleset,
    index: &mut BTreeMap<(Family, String), usize>,
    family: Family,
    table: &str,
) -> &'a mut NftTable {
    let i = *index.entry((family, table.to_string())).or_insert_with(|| {
        rs.tables.push(NftTable {
            family,
            name: table.to_string(),
            chains: BTreeMap::new(),
            sets: BTreeMap::new(),
        });
        rs.tables.len() - 1
    });
    &mut rs.tables[i]
}

fn str_field(body: &Value, key: &str) -> Result<String, String> {
    body.get(key)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| format!("missing string `{key}'"))
}

fn family_and(body: &Value, key: &str) -> Result<(Family, String), String> {
    let f = str_field(body, "family")?;
    let family = Family::from_name(&f).ok_or_else(|| format!("unknown family `{f}'"))?;
    Ok((family, str_field(body, key)?))
}

/// `"ipv4_addr"` or `["ipv4_addr", "inet_proto", "inet_service"]`.
fn type_list(v: Option<&Value>) -> Vec<String> {
    match v {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_string))
            .collect(),
        Some(other) => vec![other.to_string()],
        None => Vec::new(),
    }
}

/// A string or an array of strings (flags).
fn str_list(v: Option<&Value>) -> Vec<String> {
    match v {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        _ => Vec::new(),
    }
}

/// The single key of a one-key object.
fn single(v: &Value) -> Option<(&str, &Value)> {
    let o: &Map<String, Value> = v.as_object()?;
    if o.len() != 1 {
        return None;
    }
    o.iter().next().map(|(k, v)| (k.as_str(), v))
}

fn parse_verdict(key: &str, body: &Value) -> Option<NftVerdict> {
    let target = || {
        body.get("target")
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    Some(match key {
        "accept" => NftVerdict::Accept,
        "drop" => NftVerdict::Drop,
        "continue" => NftVerdict::Continue,
        "return" => NftVerdict::Return,
        "jump" => NftVerdict::Jump(target()?),
        "goto" => NftVerdict::Goto(target()?),
        _ => return None,
    })
}

/// One statement of a rule's `expr` array.
pub(crate) fn parse_stmt(v: &Value) -> Stmt {
    let unknown = |name: &str| Stmt::Unknown {
        name: name.to_string(),
        json: v.to_string(),
    };
    let Some((key, body)) = single(v) else {
        return unknown("?");
    };
    if let Some(verdict) = parse_verdict(key, body) {
        return Stmt::Verdict(verdict);
    }
    match key {
        "match" => {
            let op = match body.get("op").and_then(Value::as_str).unwrap_or("==") {
                "==" => MatchOp::Eq,
                "!=" => MatchOp::Ne,
                "<" => MatchOp::Lt,
                ">" => MatchOp::Gt,
                "<=" => MatchOp::Le,
                ">=" => MatchOp::Ge,
                "in" => MatchOp::In,
                _ => return unknown(key),
            };
            match (body.get("left"), body.get("right")) {
                (Some(l), Some(r)) => Stmt::Match {
                    op,
                    left: parse_expr(l),
                    right: parse_expr(r),
                },
                _ => unknown(key),
            }
        }
        "vmap" => match (body.get("key"), body.get("data")) {
            (Some(k), Some(d)) => match parse_lit(d) {
                Some(data) => Stmt::Vmap {
                    key: parse_expr(k),
                    data,
                },
                None => unknown(key),
            },
            _ => unknown(key),
        },
        "mangle" => match (body.get("key"), body.get("value")) {
            (Some(k), Some(val)) => Stmt::Mangle {
                key: parse_expr(k),
                value: parse_expr(val),
            },
            _ => unknown(key),
        },
        "dnat" | "snat" | "masquerade" | "redirect" => {
            let kind = match key {
                "dnat" => NatKind::Dnat,
                "snat" => NatKind::Snat,
                "masquerade" => NatKind::Masquerade,
                _ => NatKind::Redirect,
            };
            Stmt::Nat {
                kind,
                family: body
                    .get("family")
                    .and_then(Value::as_str)
                    .map(str::to_string),
                addr: body.get("addr").map(parse_expr),
                port: body.get("port").map(parse_expr),
                flags: str_list(body.get("flags")),
            }
        }
        "reject" => Stmt::Reject {
            kind: body.get("type").and_then(Value::as_str).map(str::to_string),
            code: body.get("expr").and_then(Value::as_str).map(str::to_string),
        },
        "set" => {
            let op = body.get("op").and_then(Value::as_str);
            let set = body.get("set").and_then(Value::as_str);
            let elem = body.get("elem");
            match (op, set, elem) {
                (Some(op), Some(set), Some(elem)) => {
                    let (elem, timeout) = match single(elem) {
                        Some(("elem", e)) => (
                            e.get("val").map_or_else(
                                || Expr::Unknown {
                                    name: "elem".into(),
                                    json: elem.to_string(),
                                },
                                parse_expr,
                            ),
                            e.get("timeout").and_then(Value::as_u64),
                        ),
                        _ => (parse_expr(elem), None),
                    };
                    Stmt::SetOp {
                        op: op.to_string(),
                        elem,
                        set: set.trim_start_matches('@').to_string(),
                        timeout,
                    }
                }
                _ => unknown(key),
            }
        }
        "counter" => Stmt::Counter,
        "log" => Stmt::Log {
            prefix: body
                .get("prefix")
                .and_then(Value::as_str)
                .map(str::to_string),
        },
        "xt" => Stmt::Xt {
            kind: body
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_string(),
            name: body
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_string(),
        },
        other => unknown(other),
    }
}

/// An expression (a packet field, a computation, or a constant).
pub(crate) fn parse_expr(v: &Value) -> Expr {
    let unknown = || Expr::Unknown {
        name: single(v).map_or("?", |(k, _)| k).to_string(),
        json: v.to_string(),
    };
    if let Some((key, body)) = single(v) {
        let s = |k: &str| body.get(k).and_then(Value::as_str).map(str::to_string);
        match key {
            "payload" => {
                return match (s("protocol"), s("field")) {
                    (Some(protocol), Some(field)) => Expr::Payload { protocol, field },
                    _ => unknown(),
                };
            }
            "meta" => return s("key").map_or_else(unknown, Expr::Meta),
            "ct" => {
                return match s("key") {
                    Some(k) => Expr::Ct {
                        key: k,
                        dir: s("dir"),
                    },
                    None => unknown(),
                };
            }
            "fib" => {
                return match s("result") {
                    Some(result) => Expr::Fib {
                        result,
                        flags: str_list(body.get("flags")),
                    },
                    None => unknown(),
                };
            }
            "numgen" => {
                let modulus = body.get("mod").and_then(Value::as_u64);
                return match (s("mode"), modulus) {
                    (Some(mode), Some(modulus)) if modulus > 0 => Expr::Numgen {
                        mode,
                        modulus,
                        offset: body.get("offset").and_then(Value::as_u64).unwrap_or(0),
                    },
                    _ => unknown(),
                };
            }
            "concat" => {
                if let Some(parts) = body.as_array() {
                    if let Some(lits) = parts.iter().map(parse_lit).collect::<Option<Vec<_>>>() {
                        return Expr::Lit(Lit::Concat(lits));
                    }
                    return Expr::Concat(parts.iter().map(parse_expr).collect());
                }
                return unknown();
            }
            "map" => {
                return match (body.get("key"), body.get("data").and_then(parse_lit)) {
                    (Some(k), Some(data)) => Expr::Map {
                        key: Box::new(parse_expr(k)),
                        data,
                    },
                    _ => unknown(),
                };
            }
            "&" | "|" | "^" | "<<" | ">>" => {
                let op = match key {
                    "&" => BinOp::And,
                    "|" => BinOp::Or,
                    "^" => BinOp::Xor,
                    "<<" => BinOp::Shl,
                    _ => BinOp::Shr,
                };
                return match body.as_array().map(Vec::as_slice) {
                    Some([l, r]) => Expr::Binary {
                        op,
                        left: Box::new(parse_expr(l)),
                        right: Box::new(parse_expr(r)),
                    },
                    _ => unknown(),
                };
            }
            _ => {}
        }
    }
    parse_lit(v).map_or_else(unknown, Expr::Lit)
}

/// A constant; `None` if `v` is not one.
pub(crate) fn parse_lit(v: &Value) -> Option<Lit> {
    match v {
        Value::String(s) => Some(match s.strip_prefix('@') {
            Some(name) => Lit::SetRef(name.to_string()),
            None => Lit::Str(s.clone()),
        }),
        Value::Number(n) => n.as_u64().map(Lit::Num),
        Value::Bool(b) => Some(Lit::Bool(*b)),
        Value::Array(a) => a
            .iter()
            .map(parse_lit)
            .collect::<Option<_>>()
            .map(Lit::List),
        Value::Object(_) => {
            let (key, body) = single(v)?;
            if let Some(verdict) = parse_verdict(key, body) {
                return Some(Lit::Verdict(verdict));
            }
            match key {
                "prefix" => {
                    let addr = parse_lit(body.get("addr")?)?;
                    let len = u32::try_from(body.get("len")?.as_u64()?).ok()?;
                    Some(Lit::Prefix(Box::new(addr), len))
                }
                "range" => match body.as_array()?.as_slice() {
                    [a, b] => Some(Lit::Range(Box::new(parse_lit(a)?), Box::new(parse_lit(b)?))),
                    _ => None,
                },
                "concat" => body
                    .as_array()?
                    .iter()
                    .map(parse_lit)
                    .collect::<Option<_>>()
                    .map(Lit::Concat),
                "set" => match body {
                    Value::Array(a) => Some(Lit::Set(a.iter().map(parse_elem).collect())),
                    single_elem => Some(Lit::Set(vec![parse_elem(single_elem)])),
                },
                "elem" => parse_lit(body.get("val")?),
                _ => None,
            }
        }
        Value::Null => None,
    }
}

/// A set or map element: `KEY`, `{"elem": {"val": KEY, ...}}`, or `[KEY, DATA]`.
fn parse_elem(v: &Value) -> SetElem {
    let (key_v, data) = match v.as_array().map(Vec::as_slice) {
        Some([k, d]) => (k, parse_lit(d)),
        _ => (v, None),
    };
    let mut elem = SetElem {
        key: Lit::Str(key_v.to_string()),
        data,
        timeout: None,
        expires: None,
        comment: None,
    };
    match single(key_v) {
        Some(("elem", body)) => {
            if let Some(k) = body.get("val").and_then(parse_lit) {
                elem.key = k;
            }
            elem.timeout = body.get("timeout").and_then(Value::as_u64);
            elem.expires = body.get("expires").and_then(Value::as_u64);
            elem.comment = body
                .get("comment")
                .and_then(Value::as_str)
                .map(str::to_string);
        }
        _ => {
            if let Some(k) = parse_lit(key_v) {
                elem.key = k;
            }
        }
    }
    elem
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_what_is_not_a_dump() {
        assert!(parse_nft_json("*nat\n").is_err());
        assert!(parse_nft_json("{\"x\": 1}").is_err());
        assert!(parse_nft_json("{\"nftables\": [1]}").is_err());
        let orphan =
            r#"{"nftables": [{"rule": {"family": "ip", "table": "t", "chain": "c", "expr": []}}]}"#;
        assert!(parse_nft_json(orphan).is_err());
        let empty = parse_nft_json(r#"{"nftables": []}"#).expect("empty dump");
        assert!(empty.tables.is_empty());
    }

    #[test]
    fn keeps_unknown_expressions() {
        let text = r#"{"nftables": [
          {"table": {"family": "inet", "name": "t"}},
          {"chain": {"family": "inet", "table": "t", "name": "c", "type": "filter", "hook": "input", "prio": 0, "policy": "drop"}},
          {"rule": {"family": "inet", "table": "t", "chain": "c", "handle": 4, "expr": [
             {"match": {"op": "==", "left": {"jhash": {"mod": 2, "expr": {"payload": {"protocol": "ip", "field": "saddr"}}}}, "right": 0}},
             {"limit": {"rate": 10, "per": "second"}},
             {"accept": null}]}}]}"#;
        let rs = parse_nft_json(text).expect("parses");
        let c = &rs.tables[0].chains["c"];
        assert_eq!(c.base.as_ref().map(|b| b.policy.as_str()), Some("drop"));
        let stmts = &c.rules[0].stmts;
        assert!(matches!(
            &stmts[0],
            Stmt::Match {
                left: Expr::Unknown { name, .. },
                ..
            } if name == "jhash"
        ));
        assert!(matches!(&stmts[1], Stmt::Unknown { name, .. } if name == "limit"));
        assert_eq!(stmts[2], Stmt::Verdict(NftVerdict::Accept));
    }
}
