//! Completing partial `iptables-save` dumps: what operators paste into tickets is often just
//! the interesting `-A` lines (the seed example is such a dump). [`complete_partial_save`]
//! turns such text into a loadable document.
//!
//! Such dumps often lack the rules that lead into kube-proxy's chains from the built-in
//! ones (`iptables-save -t nat | grep KUBE` keeps `KUBE-SERVICES` but drops
//! `-A PREROUTING ... -j KUBE-SERVICES`); without them nothing in kube-proxy's chains is
//! ever reached. [`complete_kube_proxy_jumps`] adds the jumps kube-proxy installs
//! ([`KUBE_PROXY_JUMPS`]) where the dump has the target chain but not the jump, and says
//! which it added, so that a tracer can tell its user.

use std::fmt::Write as _;

use super::ir::{Rule, Ruleset, Table};
use super::spec::{is_target_name, parse_rule};
use super::tokenize::tokenize;
use crate::ParseError;

/// Completes a partial dump into a document [`parse_save`](super::parse_save) accepts:
/// drops `#` lines, declares every builtin chain of each table (policy ACCEPT unless the text
/// declares it), declares every user chain a rule is appended to or jumps to (`-j`/`-g`), and
/// closes each table with `COMMIT`. Returns the text and how many chain declarations were
/// added. A complete dump comes back with the same rules.
///
/// # Errors
/// [`ParseError`] for a rule before any `*table` line, an unknown table, or a line that does
/// not tokenize (unbalanced quotes).
pub fn complete_partial_save(text: &str) -> Result<(String, usize), ParseError> {
    struct Section {
        table: Table,
        declared: Vec<(String, String)>,
        chains: Vec<String>,
        rules: Vec<String>,
    }
    let mut sections: Vec<Section> = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = n + 1;
        let l = raw.trim();
        if l.is_empty() || l.starts_with('#') || l == "COMMIT" {
            continue;
        }
        if let Some(name) = l.strip_prefix('*') {
            let table = Table::from_name(name.trim())
                .ok_or_else(|| ParseError::new(line, format!("unknown table {name:?}")))?;
            sections.push(Section {
                table,
                declared: Vec::new(),
                chains: Vec::new(),
                rules: Vec::new(),
            });
            continue;
        }
        let Some(s) = sections.last_mut() else {
            return Err(ParseError::new(line, "a rule before any *table line"));
        };
        if let Some(decl) = l.strip_prefix(':') {
            let name = decl
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_string();
            s.chains.retain(|c| *c != name);
            s.declared.push((name, l.to_string()));
            continue;
        }
        let toks = tokenize(l).map_err(|e| ParseError::new(line, e))?;
        let mut wanted: Vec<&str> = Vec::new();
        if let Some(c) = toks.get(1) {
            wanted.push(c);
        }
        for w in toks.windows(2) {
            if (w[0] == "-j" || w[0] == "-g") && !is_target_name(&w[1]) {
                wanted.push(&w[1]);
            }
        }
        for c in wanted {
            let known = s.chains.iter().any(|x| x == c) || s.declared.iter().any(|(d, _)| d == c);
            if !known && !s.table.is_builtin_chain(c) {
                s.chains.push(c.to_string());
            }
        }
        s.rules.push(l.to_string());
    }
    let mut out = String::new();
    let mut added = 0;
    for s in sections {
        let _ = writeln!(out, "*{}", s.table);
        for b in s.table.builtin_chains() {
            if !s.declared.iter().any(|(d, _)| d == b) {
                let _ = writeln!(out, ":{b} ACCEPT [0:0]");
            }
        }
        for (_, d) in &s.declared {
            let _ = writeln!(out, "{d}");
        }
        for c in &s.chains {
            let _ = writeln!(out, ":{c} - [0:0]");
            added += 1;
        }
        for r in &s.rules {
            let _ = writeln!(out, "{r}");
        }
        out.push_str("COMMIT\n");
    }
    Ok((out, added))
}

/// The note a tracer gives when [`assume_headless_nat`] put a `*nat` line in front of a dump.
pub const HEADLESS_NAT_NOTE: &str = "assumed the lines before any *table line are the nat \
     table (they name only kube-proxy's nat chains; `iptables-save -t nat | grep KUBE` drops \
     the *nat line)";

/// Whether `chain` is one of kube-proxy's nat chains, or a nat built-in chain kube-proxy
/// jumps from.
fn is_kube_proxy_nat_chain(chain: &str) -> bool {
    const NAMES: &[&str] = &[
        "KUBE-SERVICES",
        "KUBE-NODEPORTS",
        "KUBE-MARK-MASQ",
        "KUBE-MARK-DROP",
        "KUBE-POSTROUTING",
        "KUBE-LOAD-BALANCER",
        "KUBE-NODE-PORT",
        "PREROUTING",
        "OUTPUT",
        "POSTROUTING",
    ];
    const PREFIXES: &[&str] = &[
        "KUBE-SVC-",
        "KUBE-SEP-",
        "KUBE-EXT-",
        "KUBE-SVL-",
        "KUBE-FW-",
        "KUBE-XLB-",
    ];
    NAMES.contains(&chain) || PREFIXES.iter().any(|p| chain.starts_with(p))
}

/// Whether `chain` is one of kube-proxy's (or kubelet's) filter chains, or a filter
/// built-in chain that only filter rules of kube-proxy use.
fn is_kube_proxy_filter_chain(chain: &str) -> bool {
    [
        "KUBE-FORWARD",
        "KUBE-PROXY-FIREWALL",
        "KUBE-EXTERNAL-SERVICES",
        "KUBE-FIREWALL",
        "KUBE-PROXY-CANARY",
        "KUBE-KUBELET-CANARY",
        "INPUT",
        "FORWARD",
    ]
    .contains(&chain)
}

/// A dump pasted through `grep KUBE` has lost its `*nat` line. When the lines before any
/// `*table` line (chain declarations and rules) name only kube-proxy's nat chains, returns
/// the text with a `*nat` line in front of them (say so: [`HEADLESS_NAT_NOTE`]). Returns
/// `Ok(None)` when there are no such lines, or when they name a chain that is not one of
/// kube-proxy's (the dump is then left as it is).
///
/// # Errors
/// [`ParseError`] when those lines mix in filter-table rules (`KUBE-FORWARD`,
/// `KUBE-PROXY-FIREWALL`, `KUBE-EXTERNAL-SERVICES`, `INPUT`, `FORWARD`, a `REJECT`/`ACCEPT`/
/// `DROP` rule, ...): which table each belongs to cannot be told, so the message asks for
/// the `*nat` and `*filter` lines; or for a line that does not tokenize.
pub fn assume_headless_nat(text: &str) -> Result<Option<String>, ParseError> {
    let mut any = false;
    for (n, raw) in text.lines().enumerate() {
        let line = n + 1;
        let l = raw.trim();
        if l.is_empty() || l.starts_with('#') || l == "COMMIT" {
            continue;
        }
        if l.starts_with('*') {
            break;
        }
        any = true;
        let mut named: Vec<String> = Vec::new();
        let mut filter_verdict = None;
        if let Some(decl) = l.strip_prefix(':') {
            named.push(
                decl.split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_string(),
            );
        } else {
            let toks = tokenize(l).map_err(|e| ParseError::new(line, e))?;
            match toks.first().map(String::as_str) {
                Some("-A" | "-I" | "-N") => {}
                _ => return Ok(None),
            }
            if let Some(c) = toks.get(1) {
                named.push(c.clone());
            }
            for w in toks.windows(2) {
                if w[0] == "-j" || w[0] == "-g" {
                    if ["REJECT", "ACCEPT", "DROP"].contains(&w[1].as_str()) {
                        filter_verdict = Some(w[1].clone());
                    } else if !is_target_name(&w[1]) {
                        named.push(w[1].clone());
                    }
                }
            }
        }
        let filter = named
            .iter()
            .find(|c| is_kube_proxy_filter_chain(c))
            .map(|c| format!("chain {c}"))
            .or(filter_verdict.map(|v| format!("-j {v}")));
        if let Some(what) = filter {
            return Err(ParseError::new(
                line,
                format!(
                    "the lines before any *table line mix filter-table rules ({what}) with nat \
                     ones, so which table each belongs to is unknown: keep the `*nat' and \
                     `*filter' lines (e.g. `iptables-save | grep -E '^\\*|KUBE'`) or paste \
                     only `iptables-save -t nat | grep KUBE`"
                ),
            ));
        }
        if !named.iter().all(|c| is_kube_proxy_nat_chain(c)) {
            return Ok(None);
        }
    }
    Ok(any.then(|| format!("*nat\n{text}")))
}

/// One rule kube-proxy installs in a built-in chain to jump into its own chains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KubeProxyJump {
    /// The table.
    pub table: Table,
    /// The built-in chain.
    pub chain: &'static str,
    /// The rule in canonical `iptables-save` form (`-A CHAIN ... -j TARGET`).
    pub rule: &'static str,
    /// kube-proxy's chain it jumps to.
    pub target: &'static str,
}

const fn jump(
    table: Table,
    chain: &'static str,
    rule: &'static str,
    target: &'static str,
) -> KubeProxyJump {
    KubeProxyJump {
        table,
        chain,
        rule,
        target,
    }
}

/// The jumps from the built-in chains that kube-proxy (iptables mode, upstream's and
/// ours) ensures, grouped by built-in chain, each group in its final top-to-bottom order.
/// Upstream inserts each at the top of its chain when it is missing (`EnsureRule(Prepend)`,
/// kubelet's `KUBE-FIREWALL` jumps last), so on a node where kube-proxy creates them all
/// the jump to `KUBE-FIREWALL` comes first: the localnet drop (CVE-2020-8558) is seen
/// before the health-check ACCEPTs and the REJECTs of `KUBE-NODEPORTS` and
/// `KUBE-EXTERNAL-SERVICES`. kube-proxy-rs's proxier installs exactly these
/// (`kp_proxier::iptables::reconcile`).
pub const KUBE_PROXY_JUMPS: &[KubeProxyJump] = &[
    jump(
        Table::Filter,
        "INPUT",
        "-A INPUT -j KUBE-FIREWALL",
        "KUBE-FIREWALL",
    ),
    jump(
        Table::Filter,
        "INPUT",
        "-A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL",
        "KUBE-PROXY-FIREWALL",
    ),
    jump(
        Table::Filter,
        "INPUT",
        "-A INPUT -m comment --comment \"kubernetes health check service ports\" -j KUBE-NODEPORTS",
        "KUBE-NODEPORTS",
    ),
    jump(
        Table::Filter,
        "INPUT",
        "-A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES",
        "KUBE-EXTERNAL-SERVICES",
    ),
    jump(
        Table::Filter,
        "FORWARD",
        "-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL",
        "KUBE-PROXY-FIREWALL",
    ),
    jump(
        Table::Filter,
        "FORWARD",
        "-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD",
        "KUBE-FORWARD",
    ),
    jump(
        Table::Filter,
        "FORWARD",
        "-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
        "KUBE-SERVICES",
    ),
    jump(
        Table::Filter,
        "FORWARD",
        "-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES",
        "KUBE-EXTERNAL-SERVICES",
    ),
    jump(
        Table::Filter,
        "OUTPUT",
        "-A OUTPUT -j KUBE-FIREWALL",
        "KUBE-FIREWALL",
    ),
    jump(
        Table::Filter,
        "OUTPUT",
        "-A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL",
        "KUBE-PROXY-FIREWALL",
    ),
    jump(
        Table::Filter,
        "OUTPUT",
        "-A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
        "KUBE-SERVICES",
    ),
    jump(
        Table::Nat,
        "PREROUTING",
        "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
        "KUBE-SERVICES",
    ),
    jump(
        Table::Nat,
        "OUTPUT",
        "-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
        "KUBE-SERVICES",
    ),
    jump(
        Table::Nat,
        "POSTROUTING",
        "-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING",
        "KUBE-POSTROUTING",
    ),
];

/// Adds to `rules` each of [`KUBE_PROXY_JUMPS`] whose target chain the ruleset has (in
/// that table) while its built-in chain has no rule jumping (`-j`/`-g`) to that chain: a
/// dump with kube-proxy's chains but not kube-proxy's jumps is partial, and kube-proxy
/// would have installed them. They go at the top of the built-in chain, in kube-proxy's
/// order; a missing built-in chain is created
/// (policy ACCEPT). Returns the added jumps as `table CHAIN: rule`, in list order. Meant
/// for dumps, not for a node's live rules (where a missing jump is a real problem to
/// show, not to complete).
pub fn complete_kube_proxy_jumps(rules: &mut Ruleset) -> Vec<String> {
    let mut added = Vec::new();
    let mut prepended: Vec<(Table, &str)> = Vec::new();
    for j in KUBE_PROXY_JUMPS {
        let Some(table) = rules.tables.get_mut(&j.table) else {
            continue;
        };
        if !table.chains.contains_key(j.target) {
            continue;
        }
        let chain = table
            .chains
            .entry(j.chain.to_string())
            .or_insert_with(|| super::ir::Chain::builtin("ACCEPT"));
        if chain.rules.iter().any(|r| r.jump_chain() == Some(j.target)) {
            continue;
        }
        let Some(rule) = jump_rule(j) else { continue };
        // After the jumps this function already put at the top of this chain.
        let at = prepended
            .iter()
            .filter(|(t, c)| *t == j.table && *c == j.chain)
            .count();
        chain.rules.insert(at, rule);
        prepended.push((j.table, j.chain));
        added.push(format!("{} {}: {}", j.table, j.chain, j.rule));
    }
    added
}

fn jump_rule(j: &KubeProxyJump) -> Option<Rule> {
    let toks = tokenize(j.rule).ok()?;
    parse_rule(j.chain, toks.get(2..)?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_save;

    #[test]
    fn seed_style_dump_completes() {
        let partial = "# a comment\n*nat\n-A PREROUTING -j KUBE-SERVICES\n-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-X\n-A KUBE-SVC-X -j KUBE-MARK-MASQ\n*filter\n-A INPUT -j KUBE-FIREWALL\n";
        let (text, added) = complete_partial_save(partial).unwrap();
        assert_eq!(added, 4);
        let rules = parse_save(&text).unwrap();
        assert_eq!(rules.rule_count(), 4);
        assert!(rules.chain(Table::Nat, "KUBE-MARK-MASQ").is_some());
    }

    #[test]
    fn complete_dumps_are_unchanged_in_substance() {
        let full = "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:X - [0:0]\n-A PREROUTING -j X\nCOMMIT\n";
        let (text, added) = complete_partial_save(full).unwrap();
        assert_eq!(added, 0);
        assert_eq!(parse_save(&text).unwrap(), parse_save(full).unwrap());
    }

    #[test]
    fn kube_proxy_jumps_parse() {
        for j in KUBE_PROXY_JUMPS {
            let r = jump_rule(j).unwrap_or_else(|| panic!("{}", j.rule));
            assert_eq!(r.to_string(), j.rule);
            assert_eq!(r.jump_chain(), Some(j.target));
        }
    }

    #[test]
    fn missing_kube_proxy_jumps_are_completed() {
        let partial = "*nat\n-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m tcp --dport 443 -j KUBE-SVC-X\n-A KUBE-SVC-X -j DNAT --to-destination 10.0.0.4:6443\n*filter\n-A INPUT -j ACCEPT\n-A INPUT -j KUBE-FIREWALL\n-A KUBE-FIREWALL -j RETURN\n-A KUBE-FORWARD -j ACCEPT\n";
        let (text, _) = complete_partial_save(partial).unwrap();
        let mut rules = parse_save(&text).unwrap();
        let added = complete_kube_proxy_jumps(&mut rules);
        assert_eq!(
            added,
            [
                "filter FORWARD: -A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD",
                "filter OUTPUT: -A OUTPUT -j KUBE-FIREWALL",
                "nat PREROUTING: -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
                "nat OUTPUT: -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
            ]
        );
        let pre = rules.chain(Table::Nat, "PREROUTING").unwrap();
        assert_eq!(pre.rules[0].jump_chain(), Some("KUBE-SERVICES"));
        // The INPUT jump the dump has is kept as it is, not duplicated.
        let input = rules.chain(Table::Filter, "INPUT").unwrap();
        assert_eq!(input.rules.len(), 2);
        // A second pass adds nothing; neither does a complete dump.
        assert!(complete_kube_proxy_jumps(&mut rules).is_empty());
    }

    #[test]
    fn inserted_jumps_keep_kube_proxys_order() {
        let partial = "*filter\n-A FORWARD -j ACCEPT\n-A KUBE-PROXY-FIREWALL -j RETURN\n-A KUBE-FORWARD -j ACCEPT\n-A KUBE-SERVICES -j RETURN\n-A KUBE-EXTERNAL-SERVICES -j RETURN\n";
        let (text, _) = complete_partial_save(partial).unwrap();
        let mut rules = parse_save(&text).unwrap();
        assert_eq!(complete_kube_proxy_jumps(&mut rules).len(), 8);
        let fwd: Vec<_> = rules
            .chain(Table::Filter, "FORWARD")
            .unwrap()
            .rules
            .iter()
            .map(|r| r.jump_chain().unwrap_or("-"))
            .collect();
        assert_eq!(
            fwd,
            [
                "KUBE-PROXY-FIREWALL",
                "KUBE-FORWARD",
                "KUBE-SERVICES",
                "KUBE-EXTERNAL-SERVICES",
                "-"
            ]
        );
    }

    #[test]
    fn errors_name_the_line() {
        assert_eq!(complete_partial_save("-A X -j Y\n").unwrap_err().line, 1);
        assert_eq!(complete_partial_save("*bogus\n").unwrap_err().line, 1);
        assert_eq!(
            complete_partial_save("*nat\n-A X -m comment --comment \"open\n")
                .unwrap_err()
                .line,
            2
        );
    }

    #[test]
    fn headless_kube_proxy_nat_lines_are_the_nat_table() {
        let grepped = ":KUBE-EXT-X - [0:0]\n-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-X\n-A KUBE-SVC-X -j KUBE-SEP-Y\n-A KUBE-SEP-Y -p tcp -m tcp -j DNAT --to-destination 10.0.0.4:80\n-A KUBE-POSTROUTING -j MASQUERADE --random-fully\n";
        let text = assume_headless_nat(grepped).unwrap().unwrap();
        assert!(text.starts_with("*nat\n"));
        let (done, _) = complete_partial_save(&text).unwrap();
        let rules = parse_save(&done).unwrap();
        assert_eq!(rules.tables.len(), 1);
        for c in [
            "KUBE-EXT-X",
            "KUBE-SERVICES",
            "KUBE-SVC-X",
            "KUBE-SEP-Y",
            "KUBE-POSTROUTING",
        ] {
            assert!(rules.chain(Table::Nat, c).is_some(), "{c}");
        }
        // Already has a table: nothing to do.
        assert_eq!(
            assume_headless_nat("*nat\n-A KUBE-SVC-X -j KUBE-SEP-Y\n").unwrap(),
            None
        );
        // A chain that is not kube-proxy's: left alone.
        assert_eq!(
            assume_headless_nat("-A MY-CHAIN -j KUBE-SERVICES\n").unwrap(),
            None
        );
        assert_eq!(
            assume_headless_nat("table ip kube-proxy {\n").unwrap(),
            None
        );
        // Filter rules mixed in: refused, naming the line.
        let e = assume_headless_nat("-A KUBE-SVC-X -j KUBE-SEP-Y\n-A FORWARD -j KUBE-FORWARD\n")
            .unwrap_err();
        assert_eq!(e.line, 2);
        assert!(
            e.message.contains("keep the `*nat' and `*filter' lines"),
            "{e:?}"
        );
        let e = assume_headless_nat("-A KUBE-SERVICES -d 10.96.0.9/32 -j REJECT\n").unwrap_err();
        assert!(e.message.contains("-j REJECT"), "{e:?}");
    }
}
