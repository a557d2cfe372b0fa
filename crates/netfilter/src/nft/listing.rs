//! Reading what `nft` prints: the objects of one table ([`parse_objects`], from `nft list
//! chains`, `nft -t list sets` and `nft -t list maps`) and a canonical form of a full `nft list table` listing
//! ([`canonical_listing`]) for comparing two rulesets regardless of the order their objects
//! were created in.

use std::collections::BTreeMap;
use std::time::Duration;

use super::syntax::{parse_nft_duration, priority_value};
use crate::error::ParseError;

/// The hook of a base chain, as `nft list` prints it: `type nat hook prerouting priority
/// dstnat; policy accept;`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseChainSpec {
    /// `filter`, `nat` or `route`.
    pub chain_type: String,
    /// `prerouting`, `input`, `forward`, `output`, `postrouting`.
    pub hook: String,
    /// The priority as printed (`dstnat - 10`, `-100`).
    pub priority_text: String,
    /// The priority's numeric value (see [`priority_value`]); `None` when not understood.
    pub priority: Option<i32>,
}

/// A named set or map as `nft -t list sets` / `nft -t list maps` print it (elements omitted).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetInfo {
    /// The `type` line (`ipv4_addr`, `ipv4_addr . inet_proto . inet_service`).
    pub key_type: String,
    /// The `flags` (`dynamic`, `timeout`, `interval`, ...).
    pub flags: Vec<String>,
    /// The default element timeout, when set.
    pub timeout: Option<Duration>,
    /// The comment, without quotes, when set.
    pub comment: Option<String>,
}

/// The chains and sets of one table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableObjects {
    /// Whether the table appeared in the listing at all.
    pub exists: bool,
    /// Every chain: its base-chain hook, or `None` for a regular chain.
    pub chains: BTreeMap<String, Option<BaseChainSpec>>,
    /// Every named set.
    pub sets: BTreeMap<String, SetInfo>,
    /// Every named map (`key_type` holds the whole `type` line, `KEY : VALUE`).
    pub maps: BTreeMap<String, SetInfo>,
}

/// A name as nft prints it, without the quotes it adds around unusual names.
fn unquote(name: &str) -> &str {
    name.strip_prefix('"')
        .and_then(|n| n.strip_suffix('"'))
        .unwrap_or(name)
}

/// Parses `type T hook H priority P; policy X;`.
fn parse_base_chain(line: &str) -> Option<BaseChainSpec> {
    let spec = line.split(';').next()?.trim();
    let rest = spec.strip_prefix("type ")?;
    let (chain_type, rest) = rest.split_once(" hook ")?;
    let (hook, priority_text) = match rest.split_once(" device ") {
        Some((hook, dev)) => (hook, dev.split_once(" priority ")?.1),
        None => rest.split_once(" priority ")?,
    };
    Some(BaseChainSpec {
        chain_type: chain_type.trim().to_string(),
        hook: hook.trim().to_string(),
        priority_text: priority_text.trim().to_string(),
        priority: priority_value(priority_text),
    })
}

/// Parses the concatenated output of `nft list chains FAMILY`, `nft -t list sets FAMILY` and
/// `nft -t list maps FAMILY` and keeps the objects of table `table` of family `family` (`ip`, `ip6`).
///
/// # Errors
/// [`ParseError`] (1-based line) when a block is opened inside another one in a way nft never
/// prints, or the text ends inside a block of that table.
pub fn parse_objects(text: &str, family: &str, table: &str) -> Result<TableObjects, ParseError> {
    let mut out = TableObjects::default();
    let mut in_table: Option<bool> = None; // Some(ours?) while inside a table block
    let mut current: Option<(&str, String)> = None; // (kind, name) of the open object
    let mut last_line = 0;
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        last_line = n;
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("table ") {
            if in_table.is_some() {
                return Err(ParseError::new(n, "`table` inside another table"));
            }
            let mut words = rest.split_whitespace();
            let fam = words.next().unwrap_or("");
            let name = unquote(words.next().unwrap_or(""));
            let ours = fam == family && name == table;
            out.exists |= ours;
            in_table = Some(ours);
            continue;
        }
        let Some(ours) = in_table else {
            continue;
        };
        if line == "}" {
            if current.take().is_none() {
                in_table = None;
            }
            continue;
        }
        if let Some((kind, name)) = &current {
            if !ours {
                continue;
            }
            match *kind {
                "chain" => {
                    if line.starts_with("type ")
                        && let Some(spec) = parse_base_chain(line)
                    {
                        out.chains.insert(name.clone(), Some(spec));
                    }
                }
                "set" | "map" => {
                    let all = if *kind == "set" {
                        &mut out.sets
                    } else {
                        &mut out.maps
                    };
                    let info = all.entry(name.clone()).or_default();
                    if let Some(t) = line.strip_prefix("type ") {
                        info.key_type = t.trim().to_string();
                    } else if let Some(f) = line.strip_prefix("flags ") {
                        info.flags = f.split(',').map(|s| s.trim().to_string()).collect();
                    } else if let Some(t) = line.strip_prefix("timeout ") {
                        info.timeout = parse_nft_duration(t);
                    } else if let Some(c) = line.strip_prefix("comment ") {
                        info.comment = Some(unquote(c.trim()).to_string());
                    }
                }
                _ => {}
            }
            continue;
        }
        let Some(head) = line.strip_suffix('{') else {
            continue;
        };
        let mut words = head.split_whitespace();
        let kind = match words.next() {
            Some("chain") => "chain",
            Some("set") => "set",
            Some("map") => "map",
            Some(_) => "other",
            None => return Err(ParseError::new(n, "a block without a name")),
        };
        let name = unquote(words.next().unwrap_or("")).to_string();
        if ours {
            match kind {
                "chain" => {
                    out.chains.insert(name.clone(), None);
                }
                "set" => {
                    out.sets.insert(name.clone(), SetInfo::default());
                }
                "map" => {
                    out.maps.insert(name.clone(), SetInfo::default());
                }
                _ => {}
            }
        }
        current = Some((kind, name));
    }
    if in_table.is_some() {
        return Err(ParseError::new(
            last_line,
            "the listing ends inside a block",
        ));
    }
    Ok(out)
}

/// Net count of `{` minus `}` outside quoted strings.
fn brace_balance(line: &str) -> i32 {
    let mut depth = 0;
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            '{' if !quoted => depth += 1,
            '}' if !quoted => depth -= 1,
            _ => {}
        }
    }
    depth
}

/// Splits an element list at commas outside quotes.
fn split_elements(list: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut depth = 0;
    for c in list.chars() {
        match c {
            '"' => quoted = !quoted,
            '{' if !quoted => depth += 1,
            '}' if !quoted => depth -= 1,
            ',' if !quoted && depth == 0 => {
                out.push(cur.trim().to_string());
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// A canonical form of `nft list table` (or `nft list ruleset`) output, for comparing two
/// rulesets whose objects were created in a different order: tables, and the sets, maps and
/// chains inside each, are sorted by kind and name; `elements = { ... }` lists are put one
/// element per line, sorted; indentation is normalised. Rule order inside a chain is kept
/// (it matters). Text that is not understood is kept as it is.
pub fn canonical_listing(text: &str) -> String {
    // table header -> (table-level lines, blocks: (kind, name) -> lines)
    type Blocks = BTreeMap<(u8, String), Vec<String>>;
    let mut tables: BTreeMap<String, (Vec<String>, Blocks)> = BTreeMap::new();
    let mut table: Option<String> = None;
    let mut block: Option<(u8, String)> = None;
    let mut depth = 0;
    let mut elements: Option<String> = None;
    let mut elements_depth = 0;
    for raw in text.lines() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(acc) = elements.as_mut() {
            acc.push(' ');
            acc.push_str(line);
            elements_depth += brace_balance(line);
            if elements_depth <= 0 {
                let acc = elements.take().unwrap_or_default();
                if let (Some(t), Some(b)) = (&table, &block)
                    && let Some((_, blocks)) = tables.get_mut(t)
                {
                    let lines = blocks.entry(b.clone()).or_default();
                    push_elements(lines, &acc);
                }
            }
            continue;
        }
        let balance = brace_balance(line);
        if depth == 0 {
            if line.starts_with("table ") {
                let name = line.trim_end_matches('{').trim().to_string();
                tables.entry(name.clone()).or_default();
                table = Some(name);
            }
            depth += balance;
            continue;
        }
        let Some(t) = table.clone() else {
            depth += balance;
            continue;
        };
        let entry = tables.entry(t).or_default();
        if depth == 1 {
            if line.ends_with('{') && balance > 0 {
                let head = line.trim_end_matches('{').trim();
                let mut words = head.splitn(2, ' ');
                let kind = match words.next().unwrap_or("") {
                    "set" => 0,
                    "map" => 1,
                    "chain" => 2,
                    _ => 3,
                };
                let key = (kind, head.to_string());
                entry.1.entry(key.clone()).or_default();
                block = Some(key);
            } else if line != "}" {
                entry.0.push(line.to_string());
            }
            depth += balance;
            if depth <= 0 {
                table = None;
                depth = 0;
            }
            continue;
        }
        // Inside a block (depth >= 2).
        depth += balance;
        if depth == 1 {
            block = None;
            continue;
        }
        let Some(b) = block.clone() else { continue };
        if line.starts_with("elements = {") {
            if balance > 0 {
                elements = Some(line.to_string());
                elements_depth = balance;
                // The block's depth is restored when the list closes.
                depth -= balance;
            } else {
                push_elements(entry.1.entry(b).or_default(), line);
            }
            continue;
        }
        entry.1.entry(b).or_default().push(line.to_string());
    }
    let mut out = String::new();
    for (name, (header, blocks)) in tables {
        out.push_str(&name);
        out.push_str(" {\n");
        for l in header {
            out.push('\t');
            out.push_str(&l);
            out.push('\n');
        }
        for ((_, head), lines) in blocks {
            out.push('\t');
            out.push_str(&head);
            out.push_str(" {\n");
            for l in lines {
                out.push_str("\t\t");
                out.push_str(&l);
                out.push('\n');
            }
            out.push_str("\t}\n");
        }
        out.push_str("}\n");
    }
    out
}

/// Appends `elements = { a, b }` as a sorted, one-per-line list.
fn push_elements(lines: &mut Vec<String>, text: &str) {
    let inner = text
        .split_once('{')
        .map(|(_, rest)| rest)
        .and_then(|rest| rest.rfind('}').map(|i| &rest[..i]))
        .unwrap_or("");
    let mut elems = split_elements(inner);
    elems.sort();
    lines.push("elements = {".to_string());
    for e in elems {
        lines.push(format!("\t{e}"));
    }
    lines.push("}".to_string());
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHAINS: &str = "table ip filter {\n\tchain INPUT {\n\t\ttype filter hook input priority filter; policy accept;\n\t}\n}\ntable ip kube-proxy {\n\tchain nat-prerouting {\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t}\n\tchain filter-prerouting-pre-dnat {\n\t\ttype filter hook prerouting priority dstnat - 10; policy accept;\n\t}\n\tchain services {\n\t}\n\tchain service-O4TPQO6D-default/nginx-svc/tcp/ {\n\t}\n}\n";
    const SETS: &str = "table ip kube-proxy {\n\tmap service-ips {\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n\t}\n\tset cluster-ips {\n\t\ttype ipv4_addr\n\t\tcomment \"Active ClusterIPs\"\n\t}\n\tset affinity-X-default/s/tcp/__10.0.0.4/80 {\n\t\ttype ipv4_addr\n\t\tflags dynamic,timeout\n\t\ttimeout 3h\n\t}\n}\n";

    #[test]
    fn objects_of_one_table() {
        let text = format!("{CHAINS}\n{SETS}");
        let o = parse_objects(&text, "ip", "kube-proxy").unwrap();
        assert!(o.exists);
        assert_eq!(o.chains.len(), 4);
        assert!(!o.chains.contains_key("INPUT"), "other tables are ignored");
        let pre = o.chains["filter-prerouting-pre-dnat"].as_ref().unwrap();
        assert_eq!(
            (pre.chain_type.as_str(), pre.hook.as_str(), pre.priority),
            ("filter", "prerouting", Some(-110))
        );
        assert_eq!(
            o.chains["nat-prerouting"].as_ref().unwrap().priority,
            Some(-100)
        );
        assert_eq!(o.chains["services"], None);
        assert!(
            o.chains
                .contains_key("service-O4TPQO6D-default/nginx-svc/tcp/")
        );
        let aff = &o.sets["affinity-X-default/s/tcp/__10.0.0.4/80"];
        assert_eq!(aff.timeout, Some(Duration::from_secs(10800)));
        assert_eq!(aff.flags, ["dynamic", "timeout"]);
        assert_eq!(o.sets["cluster-ips"].key_type, "ipv4_addr");
        assert_eq!(
            o.sets["cluster-ips"].comment.as_deref(),
            Some("Active ClusterIPs")
        );
        assert_eq!(
            o.maps["service-ips"].key_type,
            "ipv4_addr . inet_proto . inet_service : verdict"
        );
        assert!(!o.sets.contains_key("service-ips"));
        let none = parse_objects(CHAINS, "ip6", "kube-proxy").unwrap();
        assert!(!none.exists && none.chains.is_empty());
        assert!(parse_objects("", "ip", "kube-proxy").unwrap() == TableObjects::default());
        assert!(parse_objects("table ip kube-proxy {\n\tchain a {\n", "ip", "kube-proxy").is_err());
        assert!(parse_objects("table ip a {\ntable ip b {\n", "ip", "kube-proxy").is_err());
    }

    #[test]
    fn canonical_listing_ignores_creation_order() {
        let a = "table ip kube-proxy {\n\tcomment \"rules for kube-proxy\"\n\tset cluster-ips {\n\t\ttype ipv4_addr\n\t\telements = { 10.96.0.2, 10.96.0.1,\n\t\t\t     10.96.0.3 }\n\t}\n\tchain b {\n\t\tgoto a\n\t}\n\tchain a {\n\t\tupdate @s { ip saddr }\n\t\tdrop\n\t}\n}\n";
        let b = "table ip kube-proxy {\n\tcomment \"rules for kube-proxy\"\n\tset cluster-ips {\n\t\ttype ipv4_addr\n\t\telements = { 10.96.0.1, 10.96.0.3, 10.96.0.2 }\n\t}\n\tchain a {\n\t\tupdate @s { ip saddr }\n\t\tdrop\n\t}\n\tchain b {\n\t\tgoto a\n\t}\n}\n";
        assert_eq!(canonical_listing(a), canonical_listing(b));
        let c = b.replace(
            "\t\tupdate @s { ip saddr }\n\t\tdrop\n",
            "\t\tdrop\n\t\tupdate @s { ip saddr }\n",
        );
        assert_ne!(
            canonical_listing(a),
            canonical_listing(&c),
            "rule order matters"
        );
        let canon = canonical_listing(a);
        assert!(
            canon.contains("\t\t\t10.96.0.1\n\t\t\t10.96.0.2\n\t\t\t10.96.0.3\n"),
            "{canon}"
        );
        assert!(canon.find("chain a").unwrap() < canon.find("chain b").unwrap());
    }
}
