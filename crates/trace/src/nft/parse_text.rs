//! Reading nftables rules written as text into the IR, the same IR [`super::json`] makes
//! of `nft -j list ruleset`:
//!
//! * `nft list ruleset` output, the block syntax: `table ip kube-proxy { map service-ips {
//!   type ...; elements = { ... } } chain nat-prerouting { type nat hook prerouting
//!   priority dstnat; policy accept; jump services } }`;
//! * an `nft -f` script, the command syntax that nftables mode's `--dry-run` prints (and
//!   upstream kube-proxy feeds `nft -f`): `add table ip kube-proxy`, `add chain ip
//!   kube-proxy X { type ... ; }`, `add rule ip kube-proxy X ...`, `add element ip
//!   kube-proxy M { ... }`, `flush chain|set|map|table ...`, `delete chain|set|map|table
//!   ...`, `delete element ... { ... }`, and `table ... { ... }` blocks among them. The
//!   commands are applied in order, as `nft -f` would apply them to an empty ruleset.
//!
//! `nft -a list ruleset` output works too: its `# handle N` comments give the rules and
//! chains their handles, as in the JSON (other `#` comments are skipped).
//!
//! Values are typed as the JSON types them, so that both readers agree: numbers (`80`,
//! `0x00004000`) are [`Lit::Num`], `10.0.0.0/8` a [`Lit::Prefix`], `1000-2000` and
//! `10.0.0.1-10.0.0.5` a [`Lit::Range`], `a . b` a [`Lit::Concat`], `established,related`
//! a [`Lit::List`], `{ ... }` a [`Lit::Set`] (a one-element set in a match is its element,
//! as nft stores it, unless the element is a concatenation), `@name` a [`Lit::SetRef`], everything else
//! (addresses, `tcp`, `local`, quoted interface names) a [`Lit::Str`]. A match without an
//! operator is `in` on bitmask keys (`ct state new`, `ct status dnat`, `tcp flags ...`) and
//! `==` otherwise; a bare `reject` is the family's ICMP port unreachable, as the kernel
//! reports it back. Durations (`10m`, `3h`, `1d2h`) are seconds.
//!
//! Structural problems (an unbalanced brace, an unknown command, a rule for a chain or an
//! element for a set that was not declared, a handle the text cannot resolve) are
//! [`TraceError::NftText`] errors naming the line. A statement the reader does not know
//! (`limit`, `quota`, `jhash ...`, `notrack`, ...) is kept, with the rest of its rule, as
//! one [`Stmt::Unknown`] holding the text, never dropped and never a failure of the whole
//! file: the tracer then reports the rule as unknown, as it does for an unknown JSON
//! expression.

use std::collections::BTreeMap;

use super::eval::kinds;
use super::ir::{
    BaseChain, BinOp, Expr, Family, Lit, MatchOp, NatKind, NftChain, NftRule, NftRuleset, NftSet,
    NftTable, NftVerdict, SetElem, Stmt,
};
use crate::TraceError;

/// Parses `nft list ruleset` output or an `nft -f` script (see the module docs).
///
/// # Errors
///
/// [`TraceError::NftText`] with the line of a structural problem.
pub fn parse_nft_text(text: &str) -> Result<NftRuleset, TraceError> {
    let toks = lex(text)?;
    let mut p = Parser {
        toks,
        pos: 0,
        rs: NftRuleset::default(),
        index: BTreeMap::new(),
        order: 0,
    };
    p.script()?;
    Ok(p.rs)
}

/// Whether `text` looks like nftables text: its first line that is neither blank nor a `#`
/// comment starts with `table FAMILY` or with an `nft` command (`add`, `flush`, ...)
/// followed by an object type.
pub fn looks_like_nft_text(text: &str) -> bool {
    let Some(line) = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
    else {
        return false;
    };
    let mut w = line.split_whitespace();
    match (w.next(), w.next()) {
        (Some("table"), Some(f)) => Family::from_name(f).is_some(),
        (Some("add" | "create" | "insert" | "flush" | "delete" | "destroy"), Some(obj)) => {
            matches!(
                obj,
                "table" | "chain" | "rule" | "set" | "map" | "element" | "ruleset"
            )
        }
        _ => false,
    }
}

fn err(line: usize, message: impl Into<String>) -> TraceError {
    TraceError::NftText {
        line,
        message: message.into(),
    }
}

/// A token and the line it starts on.
#[derive(Debug, Clone, PartialEq)]
enum Tok {
    /// A word: a keyword, a name, a number, an address, an operator.
    Word(String),
    /// A quoted string, without its quotes.
    Str(String),
    /// `{`.
    Open,
    /// `}`.
    Close,
    /// `,`.
    Comma,
    /// `;` or the end of a line.
    End,
    /// `# handle N`, which `nft -a list ruleset` prints after a rule or a chain's `{`.
    Handle(u64),
}

fn lex(text: &str) -> Result<Vec<(Tok, usize)>, TraceError> {
    let mut out = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = n + 1;
        let mut chars = raw.chars();
        let mut word = String::new();
        let flush = |word: &mut String, out: &mut Vec<(Tok, usize)>| {
            if !word.is_empty() {
                out.push((Tok::Word(std::mem::take(word)), line));
            }
        };
        while let Some(c) = chars.next() {
            match c {
                '#' if word.is_empty() => {
                    let rest: String = chars.by_ref().collect();
                    if let Some(h) = rest
                        .trim()
                        .strip_prefix("handle ")
                        .and_then(|h| h.trim().parse().ok())
                    {
                        out.push((Tok::Handle(h), line));
                    }
                    break;
                }
                '"' => {
                    flush(&mut word, &mut out);
                    let mut s = String::new();
                    let mut closed = false;
                    for c in chars.by_ref() {
                        if c == '"' {
                            closed = true;
                            break;
                        }
                        s.push(c);
                    }
                    if !closed {
                        return Err(err(line, "a quoted string is not closed on its line"));
                    }
                    out.push((Tok::Str(s), line));
                }
                '{' | '}' | ',' | ';' => {
                    flush(&mut word, &mut out);
                    out.push((
                        match c {
                            '{' => Tok::Open,
                            '}' => Tok::Close,
                            ',' => Tok::Comma,
                            _ => Tok::End,
                        },
                        line,
                    ));
                }
                c if c.is_whitespace() => flush(&mut word, &mut out),
                c => word.push(c),
            }
        }
        flush(&mut word, &mut out);
        out.push((Tok::End, line));
    }
    Ok(out)
}

struct Parser {
    toks: Vec<(Tok, usize)>,
    pos: usize,
    rs: NftRuleset,
    index: BTreeMap<(Family, String), usize>,
    order: usize,
}

/// The priority names of the `ip`, `ip6` and `inet` families (and `bridge`'s own).
fn priority_name(family: Family, name: &str) -> Option<i32> {
    Some(match (family, name) {
        (Family::Bridge, "dstnat") => -300,
        (Family::Bridge, "filter") => -200,
        (Family::Bridge, "out") => 100,
        (Family::Bridge, "srcnat") => 300,
        (_, "raw") => -300,
        (_, "mangle") => -150,
        (_, "dstnat") => -100,
        (_, "filter") => 0,
        (_, "security") => 50,
        (_, "srcnat") => 100,
        _ => return None,
    })
}

/// `10m`, `3h`, `1d2h3m4s`, `250ms`, `600` (seconds), as whole seconds.
fn duration(s: &str) -> Option<u64> {
    if let Ok(n) = s.parse::<u64>() {
        return Some(n);
    }
    let mut total_ms: u64 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit())?;
        if digits == 0 {
            return None;
        }
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let ms = match &rest[..unit_len] {
            "d" => 86_400_000,
            "h" => 3_600_000,
            "m" => 60_000,
            "s" => 1000,
            "ms" => 1,
            _ => return None,
        };
        total_ms = total_ms.checked_add(n.checked_mul(ms)?)?;
        rest = &rest[unit_len..];
    }
    Some(total_ms / 1000)
}

fn number(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None if s.bytes().all(|b| b.is_ascii_digit()) && !s.is_empty() => s.parse().ok(),
        None => None,
    }
}

fn is_addr(s: &str) -> bool {
    s.parse::<std::net::IpAddr>().is_ok()
}

/// One constant word (not a quoted string) as the JSON would have it.
fn word_lit(w: &str) -> Lit {
    if let Some(name) = w.strip_prefix('@') {
        return Lit::SetRef(name.to_string());
    }
    if let Some(n) = number(w) {
        return Lit::Num(n);
    }
    if let Some((a, len)) = w.rsplit_once('/')
        && is_addr(a)
        && let Ok(len) = len.parse::<u32>()
    {
        return Lit::Prefix(Box::new(Lit::Str(a.to_string())), len);
    }
    // A range: both ends numbers or both addresses (names like `echo-request` have
    // dashes too). An IPv6 address has no `-`, so the first one that splits it into two
    // valid ends is the one.
    for (i, _) in w.match_indices('-') {
        let (a, b) = (&w[..i], &w[i + 1..]);
        if let (Some(x), Some(y)) = (number(a), number(b)) {
            return Lit::Range(Box::new(Lit::Num(x)), Box::new(Lit::Num(y)));
        }
        if is_addr(a) && is_addr(b) {
            return Lit::Range(
                Box::new(Lit::Str(a.to_string())),
                Box::new(Lit::Str(b.to_string())),
            );
        }
    }
    match w {
        "exists" => Lit::Bool(true),
        "missing" => Lit::Bool(false),
        _ => Lit::Str(w.to_string()),
    }
}

const PAYLOAD_PROTOCOLS: &[&str] = &[
    "ip", "ip6", "tcp", "udp", "udplite", "sctp", "dccp", "th", "icmp", "icmpv6", "ether", "vlan",
    "arp", "ah", "esp", "comp", "igmp",
];

/// `meta` keys that nft writes without `meta`.
const BARE_META: &[&str] = &[
    "mark",
    "iif",
    "iifname",
    "iiftype",
    "oif",
    "oifname",
    "oiftype",
    "skuid",
    "skgid",
    "nftrace",
    "rtclassid",
    "ibriport",
    "obriport",
    "ibrname",
    "obrname",
    "pkttype",
    "cpu",
    "iifgroup",
    "oifgroup",
    "cgroup",
    "ipsec",
    "iifkind",
    "oifkind",
];

/// Reading a token list left to right: what [`Parser`] (a whole file) and [`Rule`] (one rule's
/// statements) share.
trait Cursor {
    /// The tokens, each with its line.
    fn toks(&self) -> &[(Tok, usize)];
    /// The position of the next token.
    fn pos_mut(&mut self) -> &mut usize;
    /// The position of the next token.
    fn pos(&self) -> usize;

    fn peek(&self) -> Option<&Tok> {
        self.toks().get(self.pos()).map(|(t, _)| t)
    }

    fn peek_word(&self) -> Option<&str> {
        match self.peek() {
            Some(Tok::Word(w)) => Some(w),
            _ => None,
        }
    }

    /// Steps over the next token when it is the word `w`.
    fn eat(&mut self, w: &str) -> bool {
        if self.peek_word() == Some(w) {
            *self.pos_mut() += 1;
            true
        } else {
            false
        }
    }
}

impl Cursor for Parser {
    fn toks(&self) -> &[(Tok, usize)] {
        &self.toks
    }
    fn pos_mut(&mut self) -> &mut usize {
        &mut self.pos
    }
    fn pos(&self) -> usize {
        self.pos
    }
}

impl Cursor for Rule<'_> {
    fn toks(&self) -> &[(Tok, usize)] {
        self.toks
    }
    fn pos_mut(&mut self) -> &mut usize {
        &mut self.pos
    }
    fn pos(&self) -> usize {
        self.pos
    }
}

/// A rule's statements as tokens, parsed left to right.
struct Rule<'a> {
    toks: &'a [(Tok, usize)],
    pos: usize,
    family: Family,
}

/// Why a statement could not be read: the rest of the rule becomes one unknown statement.
struct Unknown;

type R<T> = Result<T, Unknown>;

impl Rule<'_> {
    fn peek_word_at(&self, k: usize) -> Option<&str> {
        match self.toks.get(self.pos + k).map(|(t, _)| t) {
            Some(Tok::Word(w)) => Some(w),
            _ => None,
        }
    }

    fn word(&mut self) -> R<String> {
        match self.peek() {
            Some(Tok::Word(w)) => {
                let w = w.clone();
                self.pos += 1;
                Ok(w)
            }
            _ => Err(Unknown),
        }
    }

    fn at_end(&self) -> bool {
        self.pos >= self.toks.len()
    }

    /// The text of the tokens from `from` on, as nft would print them.
    fn text_from(&self, from: usize) -> String {
        let mut out = String::new();
        for (t, _) in &self.toks[from..] {
            let piece = match t {
                Tok::Word(w) => w.clone(),
                Tok::Str(s) => format!("\"{s}\""),
                Tok::Open => "{".into(),
                Tok::Close => "}".into(),
                Tok::Comma => ",".into(),
                Tok::End => ";".into(),
                Tok::Handle(h) => format!("# handle {h}"),
            };
            if !out.is_empty() && !matches!(t, Tok::Comma) {
                out.push(' ');
            }
            out.push_str(&piece);
        }
        out
    }

    fn parse(mut self) -> NftRule {
        let mut rule = NftRule {
            handle: None,
            comment: None,
            stmts: Vec::new(),
        };
        while !self.at_end() {
            let start = self.pos;
            if self.eat("comment") {
                if let Some(Tok::Str(s)) = self.peek() {
                    rule.comment = Some(s.clone());
                    self.pos += 1;
                    continue;
                }
                self.pos = start;
            }
            match self.stmt() {
                Ok(s) => rule.stmts.push(s),
                Err(Unknown) => {
                    // Keep a trailing comment as the rule's comment.
                    let mut end = self.toks.len();
                    if end >= start + 2
                        && matches!(&self.toks[end - 2].0, Tok::Word(w) if w == "comment")
                        && let Tok::Str(s) = &self.toks[end - 1].0
                    {
                        rule.comment = Some(s.clone());
                        end -= 2;
                    }
                    let name = match &self.toks[start].0 {
                        Tok::Word(w) => w.clone(),
                        _ => "?".into(),
                    };
                    let text = Rule {
                        toks: &self.toks[..end],
                        pos: 0,
                        family: self.family,
                    }
                    .text_from(start);
                    rule.stmts.push(Stmt::Unknown { name, json: text });
                    break;
                }
            }
        }
        rule
    }

    fn verdict(&mut self) -> R<Option<NftVerdict>> {
        let Some(w) = self.peek_word() else {
            return Ok(None);
        };
        let v = match w {
            "accept" => NftVerdict::Accept,
            "drop" => NftVerdict::Drop,
            "continue" => NftVerdict::Continue,
            "return" => NftVerdict::Return,
            "jump" | "goto" => {
                let jump = w == "jump";
                self.pos += 1;
                let target = match self.peek() {
                    Some(Tok::Word(t) | Tok::Str(t)) => t.clone(),
                    _ => return Err(Unknown),
                };
                self.pos += 1;
                return Ok(Some(if jump {
                    NftVerdict::Jump(target)
                } else {
                    NftVerdict::Goto(target)
                }));
            }
            _ => return Ok(None),
        };
        self.pos += 1;
        Ok(Some(v))
    }

    fn stmt(&mut self) -> R<Stmt> {
        if let Some(v) = self.verdict()? {
            return Ok(Stmt::Verdict(v));
        }
        let w = self.peek_word().ok_or(Unknown)?.to_string();
        match w.as_str() {
            "counter" => {
                self.pos += 1;
                if self.eat("packets") {
                    self.word()?;
                    if !self.eat("bytes") {
                        return Err(Unknown);
                    }
                    self.word()?;
                }
                Ok(Stmt::Counter)
            }
            "log" => {
                self.pos += 1;
                let mut prefix = None;
                loop {
                    if self.eat("prefix") {
                        match self.peek() {
                            Some(Tok::Str(s)) => prefix = Some(s.clone()),
                            _ => return Err(Unknown),
                        }
                        self.pos += 1;
                    } else if self.eat("level") || self.eat("group") || self.eat("snaplen") {
                        self.word()?;
                    } else {
                        break;
                    }
                }
                Ok(Stmt::Log { prefix })
            }
            "masquerade" | "snat" | "dnat" | "redirect" => self.nat(),
            "reject" => {
                self.pos += 1;
                if self.eat("with") {
                    let kind = self.word()?;
                    if kind == "tcp" {
                        if !self.eat("reset") {
                            return Err(Unknown);
                        }
                        return Ok(Stmt::Reject {
                            kind: Some("tcp reset".into()),
                            code: None,
                        });
                    }
                    let code = self.word()?;
                    return Ok(Stmt::Reject {
                        kind: Some(kind),
                        code: Some(code),
                    });
                }
                let kind = match self.family {
                    Family::Ip => Some("icmp"),
                    Family::Ip6 => Some("icmpv6"),
                    Family::Inet | Family::Bridge | Family::Netdev => Some("icmpx"),
                    Family::Arp => None,
                };
                Ok(Stmt::Reject {
                    kind: kind.map(str::to_string),
                    code: kind.map(|_| "port-unreachable".to_string()),
                })
            }
            "update" | "add" | "delete"
                if self.peek_word_at(1).is_some_and(|s| s.starts_with('@')) =>
            {
                self.pos += 1;
                let set = self.word()?.trim_start_matches('@').to_string();
                if self.peek() != Some(&Tok::Open) {
                    return Err(Unknown);
                }
                self.pos += 1;
                let elem = self.expr()?;
                let timeout = if self.eat("timeout") {
                    Some(duration(&self.word()?).ok_or(Unknown)?)
                } else {
                    None
                };
                if self.peek() != Some(&Tok::Close) {
                    return Err(Unknown);
                }
                self.pos += 1;
                Ok(Stmt::SetOp {
                    op: w,
                    elem,
                    set,
                    timeout,
                })
            }
            "xt" => {
                self.pos += 1;
                let kind = self.word()?;
                let name = match self.peek() {
                    Some(Tok::Word(n) | Tok::Str(n)) => n.clone(),
                    _ => return Err(Unknown),
                };
                self.pos += 1;
                Ok(Stmt::Xt { kind, name })
            }
            _ => {
                let left = self.expr()?;
                if self.eat("set") {
                    let value = self.expr()?;
                    return Ok(Stmt::Mangle { key: left, value });
                }
                if self.eat("vmap") {
                    let data = self.value()?;
                    return Ok(Stmt::Vmap { key: left, data });
                }
                let op = match self.peek_word() {
                    Some("==" | "eq") => Some(MatchOp::Eq),
                    Some("!=" | "ne") => Some(MatchOp::Ne),
                    Some("<" | "lt") => Some(MatchOp::Lt),
                    Some(">" | "gt") => Some(MatchOp::Gt),
                    Some("<=" | "le") => Some(MatchOp::Le),
                    Some(">=" | "ge") => Some(MatchOp::Ge),
                    _ => None,
                };
                if op.is_some() {
                    self.pos += 1;
                }
                let mut right = self.value()?;
                // nft stores a one-element anonymous set as its element (`ip daddr {
                // 10.0.0.0/8 }` is listed as `ip daddr 10.0.0.0/8`), except a
                // concatenation.
                if let Lit::Set(elems) = &right
                    && let [e] = elems.as_slice()
                    && !matches!(e.key, Lit::Concat(_))
                    && e.data.is_none()
                    && e.timeout.is_none()
                    && e.comment.is_none()
                {
                    right = e.key.clone();
                }
                let op = op.unwrap_or_else(|| {
                    let bitmask = kinds(&left).first().is_some_and(|k| k.is_bitmask());
                    if bitmask && !matches!(right, Lit::Set(_)) {
                        MatchOp::In
                    } else {
                        MatchOp::Eq
                    }
                });
                Ok(Stmt::Match {
                    op,
                    left,
                    right: Expr::Lit(right),
                })
            }
        }
    }

    fn nat(&mut self) -> R<Stmt> {
        let kind = match self.word()?.as_str() {
            "dnat" => NatKind::Dnat,
            "snat" => NatKind::Snat,
            "masquerade" => NatKind::Masquerade,
            _ => NatKind::Redirect,
        };
        let mut family = None;
        if let Some(f @ ("ip" | "ip6")) = self.peek_word()
            && matches!(self.peek_word_at(1), Some("to" | "addr" | "prefix"))
        {
            family = Some(f.to_string());
            self.pos += 1;
        }
        // `dnat ip addr . port to EXPR`: the map gives both.
        if self.eat("addr") && !(self.eat(".") && self.eat("port")) {
            return Err(Unknown);
        }
        let (mut addr, mut port) = (None, None);
        if self.eat("to") {
            let w = self.peek_word().ok_or(Unknown)?.to_string();
            if let Some(p) = w.strip_prefix(':') {
                self.pos += 1;
                port = Some(Expr::Lit(word_lit(p)));
            } else if let Some((a, p)) = split_host_port(&w) {
                self.pos += 1;
                addr = Some(Expr::Lit(word_lit(a)));
                if let Some(p) = p {
                    port = Some(Expr::Lit(word_lit(p)));
                }
            } else {
                addr = Some(self.expr()?);
            }
        }
        let mut flags = Vec::new();
        while let Some(f @ ("random" | "fully-random" | "persistent" | "netmap")) = self.peek_word()
        {
            flags.push(f.to_string());
            self.pos += 1;
            while self.peek() == Some(&Tok::Comma) {
                self.pos += 1;
                flags.push(self.word()?);
            }
        }
        Ok(Stmt::Nat {
            kind,
            family,
            addr,
            port,
            flags,
        })
    }

    /// An expression of the packet: a primary with binary operators, `.` concatenations
    /// and a `map` lookup.
    fn expr(&mut self) -> R<Expr> {
        let mut parts = vec![self.binary()?];
        while self.peek_word() == Some(".") {
            self.pos += 1;
            parts.push(self.binary()?);
        }
        let e = if parts.len() == 1 {
            parts.pop().ok_or(Unknown)?
        } else {
            Expr::Concat(parts)
        };
        if self.eat("map") {
            let data = self.value()?;
            return Ok(Expr::Map {
                key: Box::new(e),
                data,
            });
        }
        Ok(e)
    }

    fn binary(&mut self) -> R<Expr> {
        let mut e = self.primary()?;
        loop {
            let op = match self.peek_word() {
                Some("&" | "and") => BinOp::And,
                Some("|" | "or") => BinOp::Or,
                Some("^" | "xor") => BinOp::Xor,
                Some("<<" | "lshift") => BinOp::Shl,
                Some(">>" | "rshift") => BinOp::Shr,
                _ => return Ok(e),
            };
            self.pos += 1;
            let right = self.word()?;
            e = Expr::Binary {
                op,
                left: Box::new(e),
                right: Box::new(Expr::Lit(word_lit(&right))),
            };
        }
    }

    fn primary(&mut self) -> R<Expr> {
        let w = self.word()?;
        match w.as_str() {
            p if PAYLOAD_PROTOCOLS.contains(&p) => {
                let field = self.word()?;
                if field == "option" || field == "hdr" {
                    return Err(Unknown);
                }
                Ok(Expr::Payload { protocol: w, field })
            }
            "meta" => Ok(Expr::Meta(self.word()?)),
            m if BARE_META.contains(&m) => Ok(Expr::Meta(w)),
            "ct" => {
                let mut dir = None;
                if let Some(d @ ("original" | "reply")) = self.peek_word() {
                    dir = Some(d.to_string());
                    self.pos += 1;
                }
                let mut key = self.word()?;
                if key == "ip" || key == "ip6" {
                    key = self.word()?;
                }
                Ok(Expr::Ct { key, dir })
            }
            "fib" => {
                let mut flags = vec![self.word()?];
                while self.eat(".") {
                    flags.push(self.word()?);
                }
                let result = self.word()?;
                Ok(Expr::Fib { result, flags })
            }
            "numgen" => {
                let mode = self.word()?;
                if !self.eat("mod") {
                    return Err(Unknown);
                }
                let modulus = number(&self.word()?).ok_or(Unknown)?;
                let offset = if self.eat("offset") {
                    number(&self.word()?).ok_or(Unknown)?
                } else {
                    0
                };
                if modulus == 0 {
                    return Err(Unknown);
                }
                Ok(Expr::Numgen {
                    mode,
                    modulus,
                    offset,
                })
            }
            _ => Err(Unknown),
        }
    }

    /// A constant: one atom, a `.` concatenation of atoms, or a `,` list of atoms.
    fn value(&mut self) -> R<Lit> {
        let first = self.concat_atom()?;
        if self.peek() != Some(&Tok::Comma) {
            return Ok(first);
        }
        let mut items = vec![first];
        while self.peek() == Some(&Tok::Comma) {
            self.pos += 1;
            items.push(self.atom()?);
        }
        Ok(Lit::List(items))
    }

    fn concat_atom(&mut self) -> R<Lit> {
        let first = self.atom()?;
        if self.peek_word() != Some(".") {
            return Ok(first);
        }
        let mut parts = vec![first];
        while self.eat(".") {
            parts.push(self.atom()?);
        }
        Ok(Lit::Concat(parts))
    }

    fn atom(&mut self) -> R<Lit> {
        match self.peek().cloned() {
            Some(Tok::Str(s)) => {
                self.pos += 1;
                Ok(Lit::Str(s))
            }
            Some(Tok::Open) => {
                self.pos += 1;
                Ok(Lit::Set(self.elements()?))
            }
            Some(Tok::Word(w)) => {
                if let Some(v) = self.verdict()? {
                    return Ok(Lit::Verdict(v));
                }
                self.pos += 1;
                Ok(word_lit(&w))
            }
            _ => Err(Unknown),
        }
    }

    /// The elements of `{ ... }` up to and including the closing brace.
    fn elements(&mut self) -> R<Vec<SetElem>> {
        let mut out = Vec::new();
        loop {
            match self.peek() {
                Some(Tok::Close) => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(Tok::Comma | Tok::End | Tok::Handle(_)) => self.pos += 1,
                None => return Err(Unknown),
                Some(_) => out.push(self.element()?),
            }
        }
    }

    fn element(&mut self) -> R<SetElem> {
        let key = self.concat_atom()?;
        let mut elem = SetElem {
            key,
            data: None,
            timeout: None,
            expires: None,
            comment: None,
        };
        loop {
            match self.peek_word() {
                Some("timeout") => {
                    self.pos += 1;
                    elem.timeout = Some(duration(&self.word()?).ok_or(Unknown)?);
                }
                Some("expires") => {
                    self.pos += 1;
                    elem.expires = Some(duration(&self.word()?).ok_or(Unknown)?);
                }
                Some("counter") => {
                    self.pos += 1;
                    if self.eat("packets") {
                        self.word()?;
                        self.eat("bytes");
                        self.word()?;
                    }
                }
                Some("comment") => {
                    self.pos += 1;
                    match self.peek() {
                        Some(Tok::Str(s)) => elem.comment = Some(s.clone()),
                        _ => return Err(Unknown),
                    }
                    self.pos += 1;
                }
                Some(":") => {
                    self.pos += 1;
                    elem.data = Some(self.concat_atom()?);
                }
                _ => return Ok(elem),
            }
        }
    }
}

/// `10.0.0.1:80` → (`10.0.0.1`, `80`); `[fd00::1]:80` → (`fd00::1`, `80`); a bare
/// address → (address, none). `None` for anything else.
fn split_host_port(w: &str) -> Option<(&str, Option<&str>)> {
    if let Some(rest) = w.strip_prefix('[') {
        let (a, p) = rest.split_once(']')?;
        return Some((a, p.strip_prefix(':')));
    }
    if is_addr(w) || is_range_of_addrs(w) {
        return Some((w, None));
    }
    let (a, p) = w.rsplit_once(':')?;
    (a.parse::<std::net::Ipv4Addr>().is_ok() || is_range_of_addrs(a)).then_some((a, Some(p)))
}

fn is_range_of_addrs(w: &str) -> bool {
    matches!(word_lit(w), Lit::Range(a, _) if matches!(*a, Lit::Str(_)))
}

impl Parser {
    fn line(&self) -> usize {
        self.toks
            .get(self.pos)
            .or_else(|| self.toks.last())
            .map_or(0, |(_, l)| *l)
    }

    fn bump(&mut self) {
        self.pos += 1;
    }

    fn eat_tok(&mut self, t: &Tok) -> bool {
        if self.peek() == Some(t) {
            self.bump();
            true
        } else {
            false
        }
    }

    /// Skips line ends, `;` and the handles of tables and sets (`nft -a`).
    fn skip_ends(&mut self) {
        while matches!(self.peek(), Some(Tok::End | Tok::Handle(_))) {
            self.bump();
        }
    }

    /// A name: a word or a quoted string.
    fn name(&mut self, what: &str) -> Result<String, TraceError> {
        match self.peek().cloned() {
            Some(Tok::Word(w) | Tok::Str(w)) => {
                self.bump();
                Ok(w)
            }
            _ => Err(err(self.line(), format!("expected {what}"))),
        }
    }

    /// `[FAMILY] NAME` (the family defaults to `ip`, as in nft).
    fn family_and_table(&mut self) -> Result<(Family, String), TraceError> {
        let first = self.name("a table's family or name")?;
        match Family::from_name(&first) {
            Some(f) if matches!(self.peek(), Some(Tok::Word(_) | Tok::Str(_))) => {
                Ok((f, self.name("a table name")?))
            }
            _ => Ok((Family::Ip, first)),
        }
    }

    fn table_index(&mut self, family: Family, name: &str) -> usize {
        let rs = &mut self.rs;
        *self
            .index
            .entry((family, name.to_string()))
            .or_insert_with(|| {
                rs.tables.push(NftTable {
                    family,
                    name: name.to_string(),
                    chains: BTreeMap::new(),
                    sets: BTreeMap::new(),
                });
                rs.tables.len() - 1
            })
    }

    fn existing_table(&self, family: Family, name: &str) -> Result<usize, TraceError> {
        self.index
            .get(&(family, name.to_string()))
            .copied()
            .ok_or_else(|| err(self.line(), format!("table {family} {name} does not exist")))
    }

    fn script(&mut self) -> Result<(), TraceError> {
        loop {
            self.skip_ends();
            let Some(tok) = self.peek().cloned() else {
                return Ok(());
            };
            let line = self.line();
            let Tok::Word(cmd) = tok else {
                return Err(err(line, "expected a command or `table`"));
            };
            self.bump();
            match cmd.as_str() {
                "table" => {
                    let (f, name) = self.family_and_table()?;
                    let ti = self.table_index(f, &name);
                    if self.eat_tok(&Tok::Open) {
                        self.table_body(ti)?;
                    }
                }
                "add" | "create" | "insert" => self.add(&cmd)?,
                "flush" => self.flush()?,
                "delete" | "destroy" => self.delete(&cmd)?,
                "list" | "reset" => self.skip_statement(),
                other => {
                    return Err(err(
                        line,
                        format!(
                            "unknown command `{other}' (expected add, create, insert, flush, delete, destroy or a table block)"
                        ),
                    ));
                }
            }
        }
    }

    /// Skips to the end of the statement (past balanced braces).
    fn skip_statement(&mut self) {
        let mut depth = 0usize;
        while let Some(t) = self.peek().cloned() {
            match t {
                Tok::Open => depth += 1,
                Tok::Close if depth == 0 => return,
                Tok::Close => depth -= 1,
                Tok::End if depth == 0 => return,
                _ => {}
            }
            self.bump();
        }
    }

    fn add(&mut self, cmd: &str) -> Result<(), TraceError> {
        let line = self.line();
        let obj = self.name("an object type (table, chain, rule, set, map, element)")?;
        match obj.as_str() {
            "table" => {
                let (f, name) = self.family_and_table()?;
                let ti = self.table_index(f, &name);
                if self.eat_tok(&Tok::Open) {
                    self.table_body(ti)?;
                }
            }
            "chain" => {
                let (f, table) = self.family_and_table()?;
                let ti = self.existing_table(f, &table)?;
                let name = self.name("a chain name")?;
                self.chain_decl(ti, &name);
                if self.eat_tok(&Tok::Open) {
                    self.chain_body(ti, &name)?;
                }
            }
            "rule" => {
                let (f, table) = self.family_and_table()?;
                let ti = self.existing_table(f, &table)?;
                let chain = self.name("a chain name")?;
                let mut at: Option<usize> = None;
                if let Some(kw @ ("position" | "handle" | "index")) = self.peek_word() {
                    let kw = kw.to_string();
                    self.bump();
                    let n = self.name("a number")?;
                    if kw == "index" {
                        at = n.parse().ok();
                    } else {
                        return Err(err(
                            line,
                            format!(
                                "`{cmd} rule ... {kw} {n}': the text has no rule handles to \
                                 place the rule by"
                            ),
                        ));
                    }
                }
                let rule = self.rule(f)?;
                let t = &mut self.rs.tables[ti];
                let c = t.chains.get_mut(&chain).ok_or_else(|| {
                    err(
                        line,
                        format!(
                            "rule for chain {chain}, which does not exist in table {f} {table}"
                        ),
                    )
                })?;
                let i = match (cmd, at) {
                    ("insert", None) => 0,
                    ("insert", Some(i)) => i,
                    (_, Some(i)) => i + 1,
                    (_, None) => c.rules.len(),
                };
                c.rules.insert(i.min(c.rules.len()), rule);
            }
            "set" | "map" => {
                let (f, table) = self.family_and_table()?;
                let ti = self.existing_table(f, &table)?;
                let name = self.name("a set name")?;
                if !self.eat_tok(&Tok::Open) {
                    return Err(err(line, format!("{obj} {name}: expected `{{'")));
                }
                self.set_body(ti, &name, obj == "map")?;
            }
            "element" => {
                let (f, table) = self.family_and_table()?;
                let ti = self.existing_table(f, &table)?;
                let name = self.name("a set name")?;
                let elems = self.element_list(f, line)?;
                let set = self.rs.tables[ti].sets.get_mut(&name).ok_or_else(|| {
                    err(
                        line,
                        format!("elements for set {name}, which does not exist"),
                    )
                })?;
                set.elements.extend(elems);
            }
            _ => {
                // counter, quota, flowtable, ct helper, limit, ...: not traced.
                self.skip_statement();
            }
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), TraceError> {
        let line = self.line();
        let obj = self.name("an object type")?;
        match obj.as_str() {
            "ruleset" => {
                self.rs.tables.clear();
                self.index.clear();
                // `flush ruleset FAMILY` (rare) is taken as the whole ruleset.
                if self.peek_word().and_then(Family::from_name).is_some() {
                    self.bump();
                }
            }
            "table" => {
                let (f, table) = self.family_and_table()?;
                let ti = self.existing_table(f, &table)?;
                let t = &mut self.rs.tables[ti];
                t.chains.values_mut().for_each(|c| c.rules.clear());
                t.sets.values_mut().for_each(|s| s.elements.clear());
            }
            "chain" => {
                let (f, table) = self.family_and_table()?;
                let ti = self.existing_table(f, &table)?;
                let name = self.name("a chain name")?;
                let c = self.rs.tables[ti].chains.get_mut(&name).ok_or_else(|| {
                    err(line, format!("flush of chain {name}, which does not exist"))
                })?;
                c.rules.clear();
            }
            "set" | "map" => {
                let (f, table) = self.family_and_table()?;
                let ti = self.existing_table(f, &table)?;
                let name = self.name("a set name")?;
                let s = self.rs.tables[ti].sets.get_mut(&name).ok_or_else(|| {
                    err(line, format!("flush of {obj} {name}, which does not exist"))
                })?;
                s.elements.clear();
            }
            _ => self.skip_statement(),
        }
        Ok(())
    }

    fn delete(&mut self, cmd: &str) -> Result<(), TraceError> {
        let line = self.line();
        let obj = self.name("an object type")?;
        let destroy = cmd == "destroy";
        match obj.as_str() {
            "table" => {
                let (f, table) = self.family_and_table()?;
                match self.index.remove(&(f, table.clone())) {
                    Some(i) => {
                        self.rs.tables.remove(i);
                        for v in self.index.values_mut() {
                            if *v > i {
                                *v -= 1;
                            }
                        }
                    }
                    None if destroy => {}
                    None => {
                        return Err(err(line, format!("table {f} {table} does not exist")));
                    }
                }
            }
            "chain" | "set" | "map" => {
                let (f, table) = self.family_and_table()?;
                let ti = match self.existing_table(f, &table) {
                    Ok(ti) => ti,
                    Err(_) if destroy => {
                        self.skip_statement();
                        return Ok(());
                    }
                    Err(e) => return Err(e),
                };
                if self.eat("handle") {
                    return Err(err(
                        line,
                        format!("`{cmd} {obj} ... handle': the text has no handles"),
                    ));
                }
                let name = self.name("a name")?;
                let t = &mut self.rs.tables[ti];
                let gone = if obj == "chain" {
                    t.chains.remove(&name).is_some()
                } else {
                    t.sets.remove(&name).is_some()
                };
                if !gone && !destroy {
                    return Err(err(line, format!("{obj} {name} does not exist")));
                }
            }
            "element" => {
                let (f, table) = self.family_and_table()?;
                let ti = self.existing_table(f, &table)?;
                let name = self.name("a set name")?;
                let elems = self.element_list(f, line)?;
                if let Some(s) = self.rs.tables[ti].sets.get_mut(&name) {
                    s.elements.retain(|e| !elems.iter().any(|d| d.key == e.key));
                } else if !destroy {
                    return Err(err(line, format!("set {name} does not exist")));
                }
            }
            "rule" => {
                return Err(err(
                    line,
                    format!("`{cmd} rule': the text has no rule handles to find the rule by"),
                ));
            }
            _ => self.skip_statement(),
        }
        Ok(())
    }

    /// `{ elem, ... }` of an `add|delete element` command.
    fn element_list(&mut self, family: Family, line: usize) -> Result<Vec<SetElem>, TraceError> {
        if !self.eat_tok(&Tok::Open) {
            return Err(err(line, "expected `{' and the elements"));
        }
        let start = self.pos;
        self.skip_block()?;
        let toks = &self.toks[start..self.pos];
        let mut r = Rule {
            toks,
            pos: 0,
            family,
        };
        r.elements()
            .map_err(|Unknown| err(line, "cannot read the elements"))
    }

    /// Skips to just past the `}` closing a block whose `{` was just taken.
    fn skip_block(&mut self) -> Result<(), TraceError> {
        let line = self.line();
        let mut depth = 1usize;
        while let Some(t) = self.peek().cloned() {
            self.bump();
            match t {
                Tok::Open => depth += 1,
                Tok::Close => {
                    depth -= 1;
                    if depth == 0 {
                        return Ok(());
                    }
                }
                _ => {}
            }
        }
        Err(err(line, "a `{' is never closed"))
    }

    fn table_body(&mut self, ti: usize) -> Result<(), TraceError> {
        loop {
            self.skip_ends();
            let line = self.line();
            match self.peek().cloned() {
                Some(Tok::Close) => {
                    self.bump();
                    return Ok(());
                }
                None => return Err(err(line, "the table's `{' is never closed")),
                Some(Tok::Word(w)) => {
                    self.bump();
                    match w.as_str() {
                        "chain" => {
                            let name = self.name("a chain name")?;
                            self.chain_decl(ti, &name);
                            if self.eat_tok(&Tok::Open) {
                                self.chain_body(ti, &name)?;
                            }
                        }
                        "set" | "map" => {
                            let name = self.name("a set name")?;
                            if !self.eat_tok(&Tok::Open) {
                                return Err(err(line, format!("{w} {name}: expected `{{'")));
                            }
                            self.set_body(ti, &name, w == "map")?;
                        }
                        _ => {
                            // comment, flags, flowtable, counter, quota, ...
                            self.skip_statement();
                        }
                    }
                }
                Some(_) => self.skip_statement_or_token(),
            }
        }
    }

    fn skip_statement_or_token(&mut self) {
        let before = self.pos;
        self.skip_statement();
        if self.pos == before {
            self.bump();
        }
    }

    fn chain_decl(&mut self, ti: usize, name: &str) {
        let t = &mut self.rs.tables[ti];
        if !t.chains.contains_key(name) {
            self.order += 1;
            t.chains.insert(
                name.to_string(),
                NftChain {
                    name: name.to_string(),
                    handle: None,
                    base: None,
                    rules: Vec::new(),
                    order: self.order,
                },
            );
        }
    }

    /// A chain's body: its base chain properties and its rules, to the closing `}`.
    fn chain_body(&mut self, ti: usize, name: &str) -> Result<(), TraceError> {
        let family = self.rs.tables[ti].family;
        if let Some(Tok::Handle(h)) = self.peek().cloned() {
            self.bump();
            self.chain_mut(ti, name).handle = Some(h);
        }
        loop {
            self.skip_ends();
            let line = self.line();
            match self.peek().cloned() {
                Some(Tok::Close) => {
                    self.bump();
                    return Ok(());
                }
                None => return Err(err(line, format!("chain {name}: `{{' is never closed"))),
                Some(Tok::Word(w)) if w == "type" => {
                    self.bump();
                    let chain_type = self.name("a chain type")?;
                    if !self.eat("hook") {
                        return Err(err(line, format!("chain {name}: expected `hook'")));
                    }
                    let hook = self.name("a hook")?;
                    let mut device = None;
                    if self.eat("device") {
                        device = Some(self.name("a device")?);
                    }
                    if !self.eat("priority") {
                        return Err(err(line, format!("chain {name}: expected `priority'")));
                    }
                    let priority = self.priority(family, name)?;
                    let c = self.chain_mut(ti, name);
                    let policy = c
                        .base
                        .as_ref()
                        .map_or_else(|| "accept".to_string(), |b| b.policy.clone());
                    c.base = Some(BaseChain {
                        chain_type,
                        hook,
                        priority,
                        policy,
                        device,
                    });
                }
                Some(Tok::Word(w)) if w == "policy" => {
                    self.bump();
                    let policy = self.name("a policy")?;
                    if let Some(b) = self.chain_mut(ti, name).base.as_mut() {
                        b.policy = policy;
                    }
                }
                Some(Tok::Word(w))
                    if w == "comment"
                        && matches!(self.toks.get(self.pos + 1), Some((Tok::Str(_), _))) =>
                {
                    // The chain's comment, when it stands alone on its line.
                    let after = self.toks.get(self.pos + 2).map(|(t, _)| t);
                    if matches!(after, Some(Tok::End | Tok::Close) | None) {
                        self.pos += 2;
                    } else {
                        let rule = self.rule(family)?;
                        self.chain_mut(ti, name).rules.push(rule);
                    }
                }
                Some(Tok::Word(w)) if w == "devices" => self.skip_statement(),
                Some(_) => {
                    let rule = self.rule(family)?;
                    self.chain_mut(ti, name).rules.push(rule);
                }
            }
        }
    }

    fn chain_mut(&mut self, ti: usize, name: &str) -> &mut NftChain {
        self.rs.tables[ti]
            .chains
            .get_mut(name)
            .expect("declared before its body")
    }

    /// `dstnat`, `-110`, `dstnat - 10`, `filter + 5`.
    fn priority(&mut self, family: Family, chain: &str) -> Result<i32, TraceError> {
        let line = self.line();
        let w = self.name("a priority")?;
        let base = match w.parse::<i32>() {
            Ok(n) => n,
            Err(_) => priority_name(family, &w)
                .ok_or_else(|| err(line, format!("chain {chain}: unknown priority `{w}'")))?,
        };
        let sign = match self.peek_word() {
            Some("-") => -1,
            Some("+") => 1,
            _ => return Ok(base),
        };
        self.bump();
        let n: i32 = self
            .name("a number")?
            .parse()
            .map_err(|_| err(line, format!("chain {chain}: bad priority offset")))?;
        Ok(base + sign * n)
    }

    /// One rule: its tokens up to the end of the line (or `;`) outside braces, or the `}`
    /// closing the chain.
    fn rule(&mut self, family: Family) -> Result<NftRule, TraceError> {
        let start = self.pos;
        let mut depth = 0usize;
        let mut toks = Vec::new();
        let mut handle = None;
        while let Some(t) = self.peek().cloned() {
            match t {
                Tok::Open => depth += 1,
                Tok::Close if depth == 0 => break,
                Tok::Close => depth -= 1,
                Tok::End if depth == 0 => break,
                Tok::Handle(h) => handle = Some(h),
                _ => {}
            }
            self.bump();
            if !matches!(t, Tok::End | Tok::Handle(_)) {
                toks.push(self.toks[self.pos - 1].clone());
            }
        }
        if depth > 0 {
            return Err(err(self.toks[start].1, "a `{' in the rule is never closed"));
        }
        let mut rule = Rule {
            toks: &toks,
            pos: 0,
            family,
        }
        .parse();
        rule.handle = handle;
        Ok(rule)
    }

    /// A set's or map's body, to the closing `}`.
    fn set_body(&mut self, ti: usize, name: &str, is_map: bool) -> Result<(), TraceError> {
        let family = self.rs.tables[ti].family;
        let mut set = self.rs.tables[ti]
            .sets
            .remove(name)
            .unwrap_or_else(|| NftSet {
                name: name.to_string(),
                is_map,
                key_type: Vec::new(),
                data_type: None,
                flags: Vec::new(),
                timeout: None,
                elements: Vec::new(),
            });
        loop {
            self.skip_ends();
            let line = self.line();
            match self.peek().cloned() {
                Some(Tok::Close) => {
                    self.bump();
                    break;
                }
                None => return Err(err(line, format!("set {name}: `{{' is never closed"))),
                Some(Tok::Word(w)) => {
                    self.bump();
                    match w.as_str() {
                        "type" => {
                            let mut key = vec![self.name("a type")?];
                            while self.eat(".") {
                                key.push(self.name("a type")?);
                            }
                            set.key_type = key;
                            if self.eat(":") {
                                let mut data = vec![self.name("a type")?];
                                while self.eat(".") {
                                    data.push(self.name("a type")?);
                                }
                                set.data_type = Some(data.join(" . "));
                            }
                        }
                        "flags" => {
                            let mut flags = vec![self.name("a flag")?];
                            while self.eat_tok(&Tok::Comma) {
                                flags.push(self.name("a flag")?);
                            }
                            set.flags = flags;
                        }
                        "timeout" => {
                            let v = self.name("a timeout")?;
                            set.timeout = Some(duration(&v).ok_or_else(|| {
                                err(line, format!("set {name}: bad timeout `{v}'"))
                            })?);
                        }
                        "elements" => {
                            self.eat("=");
                            let elems = self.element_list(family, line)?;
                            set.elements.extend(elems);
                        }
                        _ => self.skip_statement(),
                    }
                }
                Some(_) => self.skip_statement_or_token(),
            }
        }
        self.rs.tables[ti].sets.insert(name.to_string(), set);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_words_are_typed_like_the_json() {
        assert_eq!(duration("10m"), Some(600));
        assert_eq!(duration("3h"), Some(10800));
        assert_eq!(duration("1d2h3m4s250ms"), Some(93784));
        assert_eq!(duration("10800"), Some(10800));
        assert_eq!(duration("x"), None);
        assert_eq!(word_lit("0x00004000"), Lit::Num(0x4000));
        assert_eq!(word_lit("80"), Lit::Num(80));
        assert_eq!(
            word_lit("10.0.0.0/8"),
            Lit::Prefix(Box::new(Lit::Str("10.0.0.0".into())), 8)
        );
        assert_eq!(
            word_lit("1000-2000"),
            Lit::Range(Box::new(Lit::Num(1000)), Box::new(Lit::Num(2000)))
        );
        assert_eq!(word_lit("echo-request"), Lit::Str("echo-request".into()));
        assert_eq!(word_lit("fd00::1"), Lit::Str("fd00::1".into()));
        assert_eq!(word_lit("@m"), Lit::SetRef("m".into()));
        assert_eq!(
            split_host_port("10.0.0.1:80"),
            Some(("10.0.0.1", Some("80")))
        );
        assert_eq!(
            split_host_port("[fd00::1]:80"),
            Some(("fd00::1", Some("80")))
        );
        assert_eq!(split_host_port("fd00::1"), Some(("fd00::1", None)));
        assert_eq!(split_host_port("ip"), None);
    }
}
