//! Parsers for `iptables-save` output ([`parse_save`]) and `iptables-restore` input
//! ([`parse_restore`] / [`RestoreParser`]). Both tokenize lines with
//! `iptables-restore`'s quoting rules and report errors as [`ParseError`] with 1-based
//! line numbers.

use std::collections::btree_map::Entry;

use super::ir::{Chain, Counters, Rule, Ruleset, Table, TableRules};
use super::spec::parse_rule;
use super::tokenize::tokenize;
use crate::error::ParseError;

/// Parses `[packets:bytes]`.
fn parse_counters(s: &str) -> Option<Counters> {
    let inner = s.strip_prefix('[')?.strip_suffix(']')?;
    let (p, b) = inner.split_once(':')?;
    Some(Counters {
        packets: p.parse().ok()?,
        bytes: b.parse().ok()?,
    })
}

/// A `:NAME POLICY [p:b]` line.
struct ChainLine {
    name: String,
    policy: Option<String>,
    counters: Option<Counters>,
}

fn parse_chain_line(rest: &str) -> Result<ChainLine, String> {
    let mut parts = rest.split_whitespace();
    let name = parts
        .next()
        .filter(|n| !n.is_empty())
        .ok_or("missing chain name")?;
    let policy = parts
        .next()
        .ok_or_else(|| format!("missing policy for chain `{name}'"))?;
    let counters = match parts.next() {
        None => None,
        Some(c) => Some(
            parse_counters(c)
                .ok_or_else(|| format!("invalid policy counters for chain `{name}'"))?,
        ),
    };
    if let Some(extra) = parts.next() {
        return Err(format!("unexpected `{extra}' after chain declaration"));
    }
    Ok(ChainLine {
        name: name.to_string(),
        policy: (policy != "-").then(|| policy.to_string()),
        counters,
    })
}

/// Splits an optional leading `[p:b]` counters token off a rule line's tokens.
fn split_counters(tokens: &mut Vec<String>) -> Result<Option<Counters>, String> {
    match tokens.first() {
        Some(t) if t.starts_with('[') => {
            let c = parse_counters(t).ok_or_else(|| format!("bad counters `{t}'"))?;
            tokens.remove(0);
            Ok(Some(c))
        }
        _ => Ok(None),
    }
}

/// Splits `iptables-save` output of every table into the text of each table, in the order
/// printed: `(name, text)` where `text` runs from the `*name` line through its `COMMIT` line
/// (or to the end, if it has none), so that each is the output `iptables-save -t name`
/// would have printed. Lines before the first table (comments) belong to none.
///
/// Reading all tables with one `iptables-save` and picking some this way, rather than
/// running `iptables-save -t TABLE`, matters on the legacy backend: naming a table that does
/// not exist makes the kernel create it.
pub fn save_tables(text: &str) -> Vec<(&str, &str)> {
    let mut out = Vec::new();
    let mut start: Option<(usize, &str)> = None;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let here = offset;
        offset += line.len();
        let l = line.trim();
        if let Some(name) = l.strip_prefix('*') {
            if let Some((s, n)) = start.take() {
                out.push((n, &text[s..here]));
            }
            start = Some((here, name.trim()));
        } else if l == "COMMIT"
            && let Some((s, n)) = start.take()
        {
            out.push((n, &text[s..offset]));
        }
    }
    if let Some((s, n)) = start {
        out.push((n, &text[s..]));
    }
    out
}

/// Parses `iptables-save` output (with or without `-c`) into a [`Ruleset`].
///
/// Accepts `#` comment lines and blank lines, `*table` headers, `:CHAIN POLICY [p:b]`
/// declarations (policy `-` for user chains), `[p:b] -A CHAIN spec` / `-A CHAIN spec`
/// rules (quoted arguments with `\"` escapes) and `COMMIT`. Every chain a rule is
/// appended to must have been declared; every table must end with `COMMIT`.
///
/// Values come back in the kernel's canonical form, so `parse_save(text)?.to_string()`
/// reproduces `text` minus its comment lines (modulo the table order).
pub fn parse_save(text: &str) -> Result<Ruleset, ParseError> {
    let mut rs = Ruleset::new();
    let mut current: Option<(Table, TableRules, usize)> = None;
    let mut last = 0;
    for (idx, raw) in text.lines().enumerate() {
        let line = idx + 1;
        last = line;
        let l = raw.trim();
        let err = |m: String| ParseError::new(line, m);
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        if let Some(name) = l.strip_prefix('*') {
            if current.is_some() {
                return Err(err(format!("table `{name}' starts before COMMIT")));
            }
            let t = Table::from_name(name.trim())
                .ok_or_else(|| err(format!("table name '{name}' invalid")))?;
            if rs.tables.contains_key(&t) {
                return Err(err(format!("table `{t}' appears twice")));
            }
            current = Some((t, TableRules::new(), line));
            continue;
        }
        let Some((table, rules, _)) = current.as_mut() else {
            return Err(err(format!("`{l}' outside of a table")));
        };
        if l == "COMMIT" {
            if let Some((t, r, _)) = current.take() {
                rs.tables.insert(t, r);
            }
            continue;
        }
        if let Some(rest) = l.strip_prefix(':') {
            let c = parse_chain_line(rest).map_err(err)?;
            match rules.chains.entry(c.name) {
                Entry::Occupied(o) => {
                    return Err(err(format!("chain `{}' declared twice", o.key())));
                }
                Entry::Vacant(v) => {
                    v.insert(Chain {
                        policy: c.policy,
                        counters: c.counters.unwrap_or_default(),
                        rules: Vec::new(),
                    });
                }
            }
            continue;
        }
        let mut tokens = tokenize(l).map_err(err)?;
        let counters = split_counters(&mut tokens).map_err(err)?;
        match tokens.first().map(String::as_str) {
            Some("-A" | "--append") => {}
            _ => return Err(err(format!("expected `-A CHAIN ...' in table {table}"))),
        }
        let chain_name = tokens
            .get(1)
            .ok_or_else(|| err("`-A' without a chain".into()))?;
        let mut rule = parse_rule(chain_name, &tokens[2..]).map_err(err)?;
        if counters.is_some() {
            if rule.counters.is_some() {
                return Err(err("counters given twice".into()));
            }
            rule.counters = counters;
        }
        rule.line = line;
        let chain = rules
            .chains
            .get_mut(chain_name)
            .ok_or_else(|| err(format!("rule for undeclared chain `{chain_name}'")))?;
        chain.rules.push(rule);
    }
    if let Some((t, _, _)) = current {
        return Err(ParseError::new(
            last + 1,
            format!("COMMIT expected for table {t}"),
        ));
    }
    Ok(rs)
}

/// What to delete with `-D`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeleteTarget {
    /// `-D CHAIN N` (1-based).
    Index(usize),
    /// `-D CHAIN spec`: the first rule with the same matches and target.
    Rule(Rule),
}

/// One operation of `iptables-restore` input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestoreOp {
    /// `*table`: start a table transaction.
    Table(Table),
    /// `:NAME POLICY [p:b]`. Under `--noflush` a builtin chain gets the policy (and
    /// counters) unless the policy is `-`; a user chain (policy `-`) is created, or
    /// flushed if it exists.
    DeclareChain {
        /// Chain name.
        name: String,
        /// `None` for `-`.
        policy: Option<String>,
        /// The `[p:b]` part, if present.
        counters: Option<Counters>,
    },
    /// `-A CHAIN spec` (the rule carries its chain and line).
    Append(Rule),
    /// `-I CHAIN [N] spec` (N is 1-based, default 1).
    Insert {
        /// The rule (with its chain).
        rule: Rule,
        /// Position.
        position: usize,
    },
    /// `-R CHAIN N spec`.
    Replace {
        /// The new rule (with its chain).
        rule: Rule,
        /// 1-based position.
        position: usize,
    },
    /// `-D CHAIN N` or `-D CHAIN spec`.
    Delete {
        /// Chain.
        chain: String,
        /// Which rule.
        target: DeleteTarget,
    },
    /// `-N CHAIN`.
    NewChain(String),
    /// `-X [CHAIN]` (`None`: every user chain of the table).
    DeleteChain(Option<String>),
    /// `-F [CHAIN]` (`None`: every chain of the table).
    Flush(Option<String>),
    /// `-Z [CHAIN]`.
    Zero(Option<String>),
    /// `-P CHAIN POLICY`.
    Policy {
        /// Builtin chain.
        chain: String,
        /// `ACCEPT`/`DROP`.
        policy: String,
    },
    /// `COMMIT`: apply the table transaction.
    Commit,
}

/// An operation with the 1-based line it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreCommand {
    /// Line number.
    pub line: usize,
    /// The operation.
    pub op: RestoreOp,
}

/// Streaming parser of `iptables-restore` input: yields one [`RestoreCommand`] per
/// meaningful line, or the first [`ParseError`] (after which it stops). Like
/// `iptables-restore` it checks the structure as it goes: commands only inside a
/// `*table` ... `COMMIT` block, no nested tables, and a `COMMIT` before the end (the
/// error for a missing one is reported at the line after the last).
///
/// Streaming matters because `iptables-restore` commits each table at its `COMMIT`:
/// an error in a later table leaves earlier tables applied. Use [`parse_restore`] to
/// get everything or the first error.
pub struct RestoreParser<'a> {
    lines: std::iter::Enumerate<std::str::Lines<'a>>,
    table: Option<Table>,
    last_line: usize,
    done: bool,
}

impl<'a> RestoreParser<'a> {
    /// A parser over `text`.
    pub fn new(text: &'a str) -> Self {
        RestoreParser {
            lines: text.lines().enumerate(),
            table: None,
            last_line: 0,
            done: false,
        }
    }
}

impl Iterator for RestoreParser<'_> {
    type Item = Result<RestoreCommand, ParseError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        loop {
            let Some((idx, raw)) = self.lines.next() else {
                self.done = true;
                return self.table.map(|t| {
                    Err(ParseError::new(
                        self.last_line + 1,
                        format!("COMMIT expected for table {t}"),
                    ))
                });
            };
            let line = idx + 1;
            self.last_line = line;
            let l = raw.trim();
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            let result = parse_restore_line(l, &mut self.table);
            return Some(match result {
                Ok(mut op) => {
                    if let RestoreOp::Append(r)
                    | RestoreOp::Insert { rule: r, .. }
                    | RestoreOp::Replace { rule: r, .. }
                    | RestoreOp::Delete {
                        target: DeleteTarget::Rule(r),
                        ..
                    } = &mut op
                    {
                        r.line = line;
                    }
                    Ok(RestoreCommand { line, op })
                }
                Err(m) => {
                    self.done = true;
                    Err(ParseError::new(line, m))
                }
            });
        }
    }
}

fn parse_position(s: &str, what: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("Invalid rule number `{s}' for {what}")),
    }
}

fn is_number(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

fn parse_restore_line(l: &str, table: &mut Option<Table>) -> Result<RestoreOp, String> {
    if let Some(name) = l.strip_prefix('*') {
        if table.is_some() {
            return Err(format!("Bad argument `{l}' (table started before COMMIT)"));
        }
        let t = Table::from_name(name.trim())
            .ok_or_else(|| format!("table name '{}' invalid", name.trim()))?;
        *table = Some(t);
        return Ok(RestoreOp::Table(t));
    }
    if table.is_none() {
        return Err(format!("`{l}' outside of a table (missing `*table' line)"));
    }
    if l == "COMMIT" {
        *table = None;
        return Ok(RestoreOp::Commit);
    }
    if let Some(rest) = l.strip_prefix(':') {
        let c = parse_chain_line(rest)?;
        return Ok(RestoreOp::DeclareChain {
            name: c.name,
            policy: c.policy,
            counters: c.counters,
        });
    }
    let mut tokens = tokenize(l)?;
    let counters = split_counters(&mut tokens)?;
    let cmd = tokens.first().cloned().unwrap_or_default();
    let chain = tokens.get(1).cloned();
    let need_chain = || {
        chain
            .clone()
            .ok_or_else(|| format!("option `{cmd}' requires a chain"))
    };
    let rest = tokens.get(2..).unwrap_or(&[]);
    let no_rest = || match rest.first() {
        Some(a) => Err(format!("Bad argument `{a}'")),
        None => Ok(()),
    };
    let rule_from = |chain: &str, args: &[String]| -> Result<Rule, String> {
        let mut r = parse_rule(chain, args)?;
        if counters.is_some() {
            if r.counters.is_some() {
                return Err("counters given twice".to_string());
            }
            r.counters = counters;
        }
        Ok(r)
    };
    let op = match cmd.as_str() {
        "-A" | "--append" => RestoreOp::Append(rule_from(&need_chain()?, rest)?),
        "-I" | "--insert" => {
            let chain = need_chain()?;
            let (position, args) = match rest.first() {
                Some(n) if is_number(n) => (parse_position(n, "insert")?, &rest[1..]),
                _ => (1, rest),
            };
            RestoreOp::Insert {
                rule: rule_from(&chain, args)?,
                position,
            }
        }
        "-R" | "--replace" => {
            let chain = need_chain()?;
            let n = rest.first().ok_or("-R requires a rule number")?;
            RestoreOp::Replace {
                position: parse_position(n, "replace")?,
                rule: rule_from(&chain, &rest[1..])?,
            }
        }
        "-D" | "--delete" => {
            let chain = need_chain()?;
            let target = match rest {
                [n] if is_number(n) => DeleteTarget::Index(parse_position(n, "delete")?),
                _ => DeleteTarget::Rule(rule_from(&chain, rest)?),
            };
            RestoreOp::Delete { chain, target }
        }
        "-N" | "--new-chain" | "--new" => {
            no_rest()?;
            RestoreOp::NewChain(need_chain()?)
        }
        "-X" | "--delete-chain" => {
            no_rest()?;
            RestoreOp::DeleteChain(chain)
        }
        "-F" | "--flush" => {
            no_rest()?;
            RestoreOp::Flush(chain)
        }
        "-Z" | "--zero" => {
            no_rest()?;
            RestoreOp::Zero(chain)
        }
        "-P" | "--policy" => {
            let chain = need_chain()?;
            let policy = match rest {
                [p] => p.clone(),
                _ => return Err("-P requires a chain and a policy".to_string()),
            };
            RestoreOp::Policy { chain, policy }
        }
        _ => return Err(format!("Bad argument `{cmd}'")),
    };
    if counters.is_some()
        && !matches!(
            &op,
            RestoreOp::Append(_) | RestoreOp::Insert { .. } | RestoreOp::Replace { .. }
        )
    {
        return Err("counters are only allowed on -A, -I and -R".to_string());
    }
    Ok(op)
}

/// Parses a whole `iptables-restore` input into its operations, or the first error.
/// See [`RestoreParser`] for the accepted syntax. Rules carry their line numbers.
pub fn parse_restore(text: &str) -> Result<Vec<RestoreCommand>, ParseError> {
    RestoreParser::new(text).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iptables::ir::{Match, Target};

    const SAVE: &str = r#"# Generated by iptables-save v1.8.9 (nf_tables) on Mon Nov 30 09:20:49 2026
*filter
:INPUT ACCEPT [10:200]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FW - [0:0]
[3:180] -A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
[0:0] -A FORWARD -g KUBE-FW
COMMIT
# Completed on Mon Nov 30 09:20:49 2026
*nat
:PREROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -m comment --comment "a \"quoted\" \'thing\'" -j RETURN
COMMIT
"#;

    #[test]
    fn parses_save_with_counters_and_quotes() {
        let rs = parse_save(SAVE).unwrap();
        let f = &rs.tables[&Table::Filter];
        assert_eq!(f.chains["INPUT"].policy.as_deref(), Some("ACCEPT"));
        assert_eq!(
            f.chains["INPUT"].counters,
            Counters {
                packets: 10,
                bytes: 200
            }
        );
        assert_eq!(f.chains["FORWARD"].policy.as_deref(), Some("DROP"));
        assert_eq!(f.chains["KUBE-FW"].policy, None);
        let r = &f.chains["INPUT"].rules[0];
        assert_eq!(
            r.counters,
            Some(Counters {
                packets: 3,
                bytes: 180
            })
        );
        assert_eq!(r.line, 7);
        assert_eq!(r.target, Some(Target::Accept));
        let n = &rs.tables[&Table::Nat];
        assert_eq!(
            n.chains["KUBE-SERVICES"].rules[0].matches[0],
            Match::Comment("a \"quoted\" 'thing'".into())
        );
        // Printing reproduces the input minus comments.
        let expected: String = SAVE
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(rs.to_string(), expected);
    }

    #[test]
    fn save_errors_have_line_numbers() {
        let e =
            parse_save("*filter\n:INPUT ACCEPT [0:0]\n-A NOPE -j ACCEPT\nCOMMIT\n").unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.message.contains("undeclared"));
        let e = parse_save("*filter\n:INPUT ACCEPT [0:0]\n").unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.message.contains("COMMIT"));
        let e = parse_save("*bogus\nCOMMIT\n").unwrap_err();
        assert_eq!(e.line, 1);
        let e = parse_save("\n\n-A X -j ACCEPT\n").unwrap_err();
        assert_eq!(e.line, 3);
        let e =
            parse_save("*nat\n:X - [0:0]\n-A X -m comment --comment \"oops\nCOMMIT\n").unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.message.contains("unterminated"));
        let e = parse_save("*nat\n:X - [x:0]\nCOMMIT\n").unwrap_err();
        assert_eq!(e.line, 2);
    }

    #[test]
    fn parses_restore_commands() {
        let text = "*nat\n:KUBE-SVC - [0:0]\n:PREROUTING ACCEPT [1:2]\n-N KUBE-NEW\n-I PREROUTING 1 -j KUBE-SVC\n-I KUBE-SVC -j RETURN\n-D KUBE-SVC 1\n-D KUBE-SVC -j RETURN\n-R KUBE-SVC 2 -j ACCEPT\n-X KUBE-NEW\n-X\n-F\n-F KUBE-SVC\n-Z\n-P PREROUTING ACCEPT\n[1:2] -A KUBE-SVC -j RETURN\nCOMMIT\n";
        let cmds = parse_restore(text).unwrap();
        let ops: Vec<_> = cmds.iter().map(|c| &c.op).collect();
        assert_eq!(ops[0], &RestoreOp::Table(Table::Nat));
        assert_eq!(
            ops[1],
            &RestoreOp::DeclareChain {
                name: "KUBE-SVC".into(),
                policy: None,
                counters: Some(Counters::default())
            }
        );
        assert!(
            matches!(ops[4], RestoreOp::Insert { position: 1, rule } if rule.chain == "PREROUTING")
        );
        assert!(matches!(ops[5], RestoreOp::Insert { position: 1, .. }));
        assert!(matches!(
            ops[6],
            RestoreOp::Delete {
                target: DeleteTarget::Index(1),
                ..
            }
        ));
        assert!(matches!(
            ops[7],
            RestoreOp::Delete {
                target: DeleteTarget::Rule(_),
                ..
            }
        ));
        assert!(matches!(ops[8], RestoreOp::Replace { position: 2, .. }));
        assert_eq!(ops[10], &RestoreOp::DeleteChain(None));
        assert_eq!(ops[11], &RestoreOp::Flush(None));
        assert!(
            matches!(ops[15], RestoreOp::Append(r) if r.counters == Some(Counters { packets: 1, bytes: 2 }) && r.line == 16)
        );
        assert_eq!(ops[16], &RestoreOp::Commit);
        assert_eq!(cmds[16].line, 17);
    }

    #[test]
    fn restore_structure_errors() {
        let e = parse_restore("*nat\n-A X -j ACCEPT\n").unwrap_err();
        assert_eq!((e.line, e.message.contains("COMMIT")), (3, true));
        let e = parse_restore("-A X -j ACCEPT\n").unwrap_err();
        assert_eq!(e.line, 1);
        let e = parse_restore("*nat\n*filter\nCOMMIT\n").unwrap_err();
        assert_eq!(e.line, 2);
        let e = parse_restore("*bogus\nCOMMIT\n").unwrap_err();
        assert_eq!(e.line, 1);
        let e = parse_restore("COMMIT\n").unwrap_err();
        assert_eq!(e.line, 1);
        let e = parse_restore("*nat\n-I X 0 -j ACCEPT\nCOMMIT\n").unwrap_err();
        assert_eq!(e.line, 2);
        let e = parse_restore("*nat\n-Q X\nCOMMIT\n").unwrap_err();
        assert_eq!(e.line, 2);
        let e = parse_restore("*nat\n-N A B\nCOMMIT\n").unwrap_err();
        assert_eq!(e.line, 2);
    }

    #[test]
    fn restore_parser_streams_until_error() {
        let text = "*nat\n-A X -j ACCEPT\nCOMMIT\n*filter\n-A Y -s bad -j ACCEPT\nCOMMIT\n";
        let items: Vec<_> = RestoreParser::new(text).collect();
        assert_eq!(items.len(), 5);
        assert!(items[..4].iter().all(Result::is_ok));
        assert_eq!(items[4].as_ref().unwrap_err().line, 5);
    }

    #[test]
    fn save_tables_splits_a_whole_save_into_what_each_table_would_print() {
        let text = "# Generated by iptables-save v1.8.9\n*mangle\n:PREROUTING ACCEPT [0:0]\n\
                    -A PREROUTING -j MARK --set-xmark 0x1/0x1\nCOMMIT\n# Completed\n\
                    *nat\n:KUBE-SERVICES - [0:0]\nCOMMIT\n*filter\n:INPUT ACCEPT [0:0]\n";
        let tables = save_tables(text);
        assert_eq!(
            tables,
            [
                (
                    "mangle",
                    "*mangle\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -j MARK --set-xmark 0x1/0x1\nCOMMIT\n"
                ),
                ("nat", "*nat\n:KUBE-SERVICES - [0:0]\nCOMMIT\n"),
                // No COMMIT: to the end.
                ("filter", "*filter\n:INPUT ACCEPT [0:0]\n"),
            ]
        );
        assert!(save_tables("").is_empty());
        assert!(save_tables("# Generated by iptables-legacy-save\n").is_empty());
        // Each part parses as the table alone.
        let nat = parse_save(tables[1].1).unwrap();
        assert!(nat.chain(Table::Nat, "KUBE-SERVICES").is_some());
    }
}
