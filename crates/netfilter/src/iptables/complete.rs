//! Completing partial `iptables-save` dumps: what operators paste into tickets is often just
//! the interesting `-A` lines (the seed example is such a dump). [`complete_partial_save`]
//! turns such text into a loadable document.

use std::fmt::Write as _;

use super::ir::Table;
use super::spec::is_target_name;
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
}
