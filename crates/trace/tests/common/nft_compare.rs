//! Comparing two readings of one nftables ruleset (the `nft list ruleset` text and the
//! `nft -j list ruleset` JSON): the first difference, named by table, chain or set, and
//! rule, so a failing comparison says where the readers part.
//!
//! Shared by `crates/trace/tests` and `kube-proxy-rs/tests/trace_cli.rs` (by `#[path]`).

#![allow(dead_code)]

use kp_trace::nft::{NftRuleset, Stmt};

/// The first difference between `text` and `json` (after
/// [`NftRuleset::without_format_details`]), or `None` when they are the same IR.
///
/// With `unknown_by_position`, a rule that holds an unknown statement in either reading
/// only has to hold one in the other too (the text reader keeps the rest of the rule as
/// one unknown statement, the JSON reader each unknown expression on its own).
pub fn first_difference(
    text: &NftRuleset,
    json: &NftRuleset,
    unknown_by_position: bool,
) -> Option<String> {
    let (a, b) = (text.without_format_details(), json.without_format_details());
    let names = |rs: &NftRuleset| rs.tables.iter().map(|t| t.label()).collect::<Vec<_>>();
    if names(&a) != names(&b) {
        return Some(format!("tables: {:?} vs {:?}", names(&a), names(&b)));
    }
    for (ta, tb) in a.tables.iter().zip(&b.tables) {
        let l = ta.label();
        let ka: Vec<_> = ta.chains.keys().collect();
        let kb: Vec<_> = tb.chains.keys().collect();
        if ka != kb {
            return Some(format!("{l}: chains {ka:?} vs {kb:?}"));
        }
        for (name, ca) in &ta.chains {
            let cb = &tb.chains[name];
            if ca.base != cb.base || ca.order != cb.order {
                return Some(format!(
                    "{l} chain {name}: {:?} (order {}) vs {:?} (order {})",
                    ca.base, ca.order, cb.base, cb.order
                ));
            }
            if ca.rules.len() != cb.rules.len() {
                return Some(format!(
                    "{l} chain {name}: {} rules vs {}",
                    ca.rules.len(),
                    cb.rules.len()
                ));
            }
            for (i, (ra, rb)) in ca.rules.iter().zip(&cb.rules).enumerate() {
                let unknown = |r: &kp_trace::nft::NftRule| {
                    r.stmts.iter().any(|s| matches!(s, Stmt::Unknown { .. }))
                        || r.stmts
                            .iter()
                            .any(|s| format!("{s:?}").contains("Unknown {"))
                };
                if unknown_by_position && (unknown(ra) || unknown(rb)) {
                    if unknown(ra) != unknown(rb) {
                        return Some(format!(
                            "{l} chain {name} rule {i}: unknown in one reading only:\n  {ra:?}\n  {rb:?}"
                        ));
                    }
                    continue;
                }
                if ra != rb {
                    return Some(format!("{l} chain {name} rule {i}:\n  {ra:?}\n  {rb:?}"));
                }
            }
        }
        let sa: Vec<_> = ta.sets.keys().collect();
        let sb: Vec<_> = tb.sets.keys().collect();
        if sa != sb {
            return Some(format!("{l}: sets {sa:?} vs {sb:?}"));
        }
        for (name, xa) in &ta.sets {
            let xb = &tb.sets[name];
            if xa != xb {
                return Some(format!("{l} set {name}:\n  {xa:?}\n  {xb:?}"));
            }
        }
    }
    None
}

/// A rendered trace with its rules' names (`rule handle 54`, `rule index 0`) made equal:
/// `nft list ruleset` text without `-a`, and scripts, have no handles, so the tracer names
/// their rules by position.
pub fn without_rule_names(trace: &str) -> String {
    let mut out = String::with_capacity(trace.len());
    let mut rest = trace;
    while let Some(i) = ["rule handle ", "rule index "]
        .iter()
        .filter_map(|p| rest.find(p).map(|i| (i, p.len())))
        .min()
        .map(|(i, len)| (i, i + len))
    {
        let (start, digits_at) = i;
        out.push_str(&rest[..start]);
        out.push_str("rule #");
        let after = &rest[digits_at..];
        let n = after.bytes().take_while(u8::is_ascii_digit).count();
        rest = &after[n..];
    }
    out.push_str(rest);
    out
}
