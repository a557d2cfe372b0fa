//! Turns the argument list of one rule (`-s ... -m ... -j ...`, already tokenized) into
//! a typed [`Rule`], normalising values the way the kernel stores them.
//!
//! Arguments are grouped the way iptables groups them: general options (`-s`, `-d`,
//! `-i`, `-o`, `-p`, `-f`, `-c`, optionally preceded by `!`) anywhere; everything after
//! `-m NAME` up to the next general option belongs to that module; everything after
//! `-j NAME` to the target. Module options that appear right after `-p tcp|udp|sctp`
//! without an `-m` load that protocol's match implicitly, at that position (as iptables
//! does). Known modules with options this IR does not model become
//! [`Match::Unknown`]/[`Target::Unknown`]; bad *values* of modelled options are errors,
//! as they are for iptables.

use std::collections::BTreeSet;
use std::net::IpAddr;

use super::ir::*;

/// Target extensions iptables ships: `-j NAME` with one of these names is a target
/// extension, anything else is a jump to a user chain.
const TARGET_EXTENSIONS: &[&str] = &[
    "AUDIT",
    "CHECKSUM",
    "CLASSIFY",
    "CLUSTERIP",
    "CONNMARK",
    "CONNSECMARK",
    "CT",
    "DNAT",
    "DNPT",
    "DSCP",
    "ECN",
    "HL",
    "HMARK",
    "IDLETIMER",
    "LED",
    "LOG",
    "MARK",
    "MASQUERADE",
    "MIRROR",
    "NETMAP",
    "NFLOG",
    "NFQUEUE",
    "NOTRACK",
    "QUEUE",
    "RATEEST",
    "REDIRECT",
    "REJECT",
    "SAME",
    "SECMARK",
    "SET",
    "SNAT",
    "SNPT",
    "SYNPROXY",
    "TCPMSS",
    "TCPOPTSTRIP",
    "TEE",
    "TOS",
    "TPROXY",
    "TRACE",
    "TTL",
    "ULOG",
];

/// Whether `name` is a standard verdict or a target extension (so it can be neither a
/// jump destination nor a user chain name).
pub fn is_target_name(name: &str) -> bool {
    matches!(name, "ACCEPT" | "DROP" | "RETURN") || TARGET_EXTENSIONS.contains(&name)
}

/// Longest comment the kernel keeps (longer ones are silently truncated).
const MAX_COMMENT: usize = 255;
/// Longest interface name (IFNAMSIZ - 1).
const MAX_IFNAME: usize = 15;

#[derive(Clone, Copy, PartialEq)]
enum General {
    Source,
    Destination,
    In,
    Out,
    Proto,
    Fragment,
    Match,
    Jump,
    Goto,
    Counters,
}

fn general(opt: &str) -> Option<General> {
    Some(match opt {
        "-s" | "--source" | "--src" => General::Source,
        "-d" | "--destination" | "--dst" => General::Destination,
        "-i" | "--in-interface" => General::In,
        "-o" | "--out-interface" => General::Out,
        "-p" | "--protocol" => General::Proto,
        "-f" | "--fragment" => General::Fragment,
        "-m" | "--match" => General::Match,
        "-j" | "--jump" => General::Jump,
        "-g" | "--goto" => General::Goto,
        "-c" | "--set-counters" => General::Counters,
        _ => return None,
    })
}

/// How many values follow option `opt` of module or target `owner` (0 for flags and
/// options this crate does not know).
fn option_arity(owner: &str, opt: &str) -> usize {
    match (owner, opt) {
        ("set", "--match-set" | "--set") => 2,
        ("tcp", "--tcp-flags") | ("sctp", "--chunk-types") => 2,
        ("recent", "--seconds" | "--hitcount" | "--name" | "--mask") => 1,
        ("comment", "--comment")
        | (
            "tcp" | "udp" | "sctp",
            "--sport" | "--dport" | "--source-port" | "--destination-port",
        )
        | ("tcp", "--tcp-option")
        | (
            "multiport",
            "--sports" | "--dports" | "--ports" | "--source-ports" | "--destination-ports",
        )
        | ("statistic", "--mode" | "--probability" | "--every" | "--packet")
        | ("mark", "--mark")
        | ("state", "--state")
        | ("addrtype", "--src-type" | "--dst-type")
        | ("nfacct", "--nfacct-name")
        | ("physdev", "--physdev-in" | "--physdev-out")
        | ("REJECT", "--reject-with")
        | ("DNAT", "--to-destination")
        | ("SNAT", "--to-source")
        | ("MASQUERADE" | "REDIRECT", "--to-ports")
        | ("MARK", "--set-xmark" | "--set-mark" | "--or-mark" | "--xor-mark" | "--and-mark")
        | ("LOG", "--log-prefix" | "--log-level")
        | (
            "NFLOG",
            "--nflog-group" | "--nflog-prefix" | "--nflog-range" | "--nflog-size"
            | "--nflog-threshold",
        ) => 1,
        ("conntrack", o) if o.starts_with("--ct") => 1,
        _ => 0,
    }
}

enum Owner {
    General,
    Module(usize),
    Target,
}

fn set_once<T>(slot: &mut Option<T>, v: T, opt: &str) -> Result<(), String> {
    if slot.is_some() {
        return Err(format!("multiple {opt} flags not allowed"));
    }
    *slot = Some(v);
    Ok(())
}

fn take<'a>(args: &'a [String], i: &mut usize, opt: &str) -> Result<&'a str, String> {
    let v = args
        .get(*i)
        .ok_or_else(|| format!("option {opt} requires an argument"))?;
    *i += 1;
    Ok(v)
}

/// Parses the arguments of one rule of `chain`.
pub fn parse_rule(chain: &str, args: &[String]) -> Result<Rule, String> {
    let mut src = None;
    let mut dst = None;
    let mut iin = None;
    let mut iout = None;
    let mut proto: Option<(Protocol, bool)> = None;
    let mut frag = None;
    let mut counters = None;
    let mut modules: Vec<(String, Vec<String>)> = Vec::new();
    let mut target: Option<(bool, String, Vec<String>)> = None;
    let mut owner = Owner::General;
    let mut i = 0;
    while i < args.len() {
        let tok = args[i].as_str();
        let next_general = args.get(i + 1).and_then(|n| general(n));
        let (negated, g) = match (tok, general(tok)) {
            ("!", _) if next_general.is_some() => {
                i += 1;
                (true, next_general)
            }
            (_, g) => (false, g),
        };
        let Some(g) = g else {
            // Values of known options are taken verbatim (like getopt does), so a value
            // such as `!` or `-f` is not mistaken for a general option.
            let owned = match owner {
                Owner::Module(m) => {
                    let (name, list) = &mut modules[m];
                    Some((name.as_str(), list))
                }
                Owner::Target => target.as_mut().map(|(_, name, list)| (name.as_str(), list)),
                Owner::General => None,
            };
            if let Some((name, list)) = owned {
                let n = option_arity(name, tok).min(args.len() - i - 1);
                list.extend(args[i..=i + n].iter().cloned());
                i += n + 1;
                continue;
            }
            // A module option right after `-p tcp|udp|sctp` loads that match implicitly.
            let implicit = match proto {
                Some((p, false)) if p == Protocol::TCP => Some("tcp"),
                Some((p, false)) if p == Protocol::UDP => Some("udp"),
                Some((p, false)) if p == Protocol::SCTP => Some("sctp"),
                _ => None,
            };
            match implicit {
                Some(name) if !modules.iter().any(|(n, _)| n == name) => {
                    modules.push((name.to_string(), Vec::new()));
                    owner = Owner::Module(modules.len() - 1);
                    continue; // re-read `tok` as an option of the new module
                }
                _ => return Err(format!("Bad argument `{tok}'")),
            }
        };
        let opt = args[i].as_str();
        i += 1;
        let no_negation = |what: &str| {
            if negated {
                Err(format!("cannot negate {what}"))
            } else {
                Ok(())
            }
        };
        match g {
            General::Source | General::Destination => {
                let v = take(args, &mut i, opt)?;
                let net = parse_cidr(v)?;
                let slot = if g == General::Source {
                    &mut src
                } else {
                    &mut dst
                };
                set_once(
                    slot,
                    (net, negated),
                    if g == General::Source { "-s" } else { "-d" },
                )?;
            }
            General::In | General::Out => {
                let v = take(args, &mut i, opt)?;
                if v.is_empty() {
                    return Err("empty interface name".to_string());
                }
                if v.len() > MAX_IFNAME {
                    return Err(format!(
                        "interface name `{v}' must be shorter than IFNAMSIZ ({MAX_IFNAME})"
                    ));
                }
                let slot = if g == General::In {
                    &mut iin
                } else {
                    &mut iout
                };
                set_once(
                    slot,
                    (v.to_string(), negated),
                    if g == General::In { "-i" } else { "-o" },
                )?;
            }
            General::Proto => {
                let v = take(args, &mut i, opt)?;
                let p = Protocol::parse(v)
                    .ok_or_else(|| format!("unknown protocol `{v}' specified"))?;
                if p == Protocol::ALL && negated {
                    return Err("rule would never match protocol".to_string());
                }
                set_once(&mut proto, (p, negated), "-p")?;
            }
            General::Fragment => set_once(&mut frag, negated, "-f")?,
            General::Match => {
                no_negation("-m")?;
                let name = take(args, &mut i, opt)?;
                modules.push((name.to_string(), Vec::new()));
                owner = Owner::Module(modules.len() - 1);
            }
            General::Jump | General::Goto => {
                no_negation(opt)?;
                let name = take(args, &mut i, opt)?;
                if name.is_empty() {
                    return Err("empty target name".to_string());
                }
                if target.is_some() {
                    return Err("multiple -j/-g flags not allowed".to_string());
                }
                target = Some((g == General::Goto, name.to_string(), Vec::new()));
                owner = Owner::Target;
            }
            General::Counters => {
                no_negation("-c")?;
                let p = take(args, &mut i, opt)?;
                let b = take(args, &mut i, opt)?;
                let parse = |s: &str| parse_c_uint(s).ok_or_else(|| format!("bad counter `{s}'"));
                set_once(
                    &mut counters,
                    Counters {
                        packets: parse(p)?,
                        bytes: parse(b)?,
                    },
                    "-c",
                )?;
            }
        }
    }

    let mut matches = Vec::new();
    // `0.0.0.0/0`, `-i +` and `-p all` match everything: the kernel stores nothing.
    if let Some((net, negated)) = src
        && (negated || !net.is_any())
    {
        matches.push(Match::Source { net, negated });
    }
    if let Some((net, negated)) = dst
        && (negated || !net.is_any())
    {
        matches.push(Match::Destination { net, negated });
    }
    if let Some((name, negated)) = iin
        && (negated || name != "+")
    {
        matches.push(Match::InInterface { name, negated });
    }
    if let Some((name, negated)) = iout
        && (negated || name != "+")
    {
        matches.push(Match::OutInterface { name, negated });
    }
    if let Some((proto, negated)) = proto
        && proto != Protocol::ALL
    {
        matches.push(Match::Protocol { proto, negated });
    }
    if let Some(negated) = frag {
        matches.push(Match::Fragment { negated });
    }
    for (name, margs) in modules {
        matches.push(parse_match(&name, margs)?);
    }
    let target = match target {
        None => None,
        Some((goto, name, targs)) => Some(parse_target(goto, name, targs)?),
    };
    Ok(Rule {
        chain: chain.to_string(),
        matches,
        target,
        counters,
        line: 0,
    })
}

/// Parses `-s`/`-d` values: `addr`, `addr/len` or `addr/dotted-mask` (contiguous).
fn parse_cidr(v: &str) -> Result<Cidr, String> {
    let (a, m) = match v.split_once('/') {
        Some((a, m)) => (a, Some(m)),
        None => (v, None),
    };
    let addr: IpAddr = a.parse().map_err(|_| {
        format!("host/network `{a}' not found (only numeric addresses are supported)")
    })?;
    let max: u8 = if addr.is_ipv4() { 32 } else { 128 };
    let prefix = match m {
        None => max,
        Some(m) => match m.parse::<u8>() {
            Ok(p) if p <= max && !m.starts_with('+') => p,
            _ => mask_to_prefix(addr, m).ok_or_else(|| format!("invalid mask `{m}' specified"))?,
        },
    };
    Cidr::new(addr, prefix).ok_or_else(|| format!("invalid mask `{m:?}' specified"))
}

fn mask_to_prefix(addr: IpAddr, m: &str) -> Option<u8> {
    let bits: u128 = match (addr, m.parse::<IpAddr>().ok()?) {
        (IpAddr::V4(_), IpAddr::V4(mask)) => u128::from(u32::from(mask)) << 96,
        (IpAddr::V6(_), IpAddr::V6(mask)) => u128::from(mask),
        _ => return None,
    };
    let ones = bits.leading_ones();
    if bits.checked_shl(ones).unwrap_or(0) != 0 {
        return None; // non-contiguous
    }
    let ones = if addr.is_ipv4() { ones.min(32) } else { ones };
    u8::try_from(ones).ok()
}

/// Option cursor over one module's / target's arguments.
struct Opts<'a> {
    args: &'a [String],
    i: usize,
}

impl<'a> Opts<'a> {
    fn new(args: &'a [String]) -> Self {
        Opts { args, i: 0 }
    }

    /// Next option and whether it was preceded by `!`.
    fn next(&mut self) -> Option<Result<(bool, &'a str), String>> {
        let tok = self.args.get(self.i)?;
        self.i += 1;
        if tok == "!" {
            return Some(match self.args.get(self.i) {
                Some(o) => {
                    self.i += 1;
                    Ok((true, o.as_str()))
                }
                None => Err("trailing `!'".to_string()),
            });
        }
        Some(Ok((false, tok.as_str())))
    }

    fn value(&mut self, opt: &str) -> Result<&'a str, String> {
        take(self.args, &mut self.i, opt)
    }
}

fn no_neg(negated: bool, opt: &str) -> Result<(), String> {
    if negated {
        Err(format!("option {opt} cannot be inverted"))
    } else {
        Ok(())
    }
}

fn parse_u32(s: &str, what: &str) -> Result<u32, String> {
    parse_c_uint(s)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| format!("bad {what} value `{s}'"))
}

fn parse_port(s: &str) -> Result<u16, String> {
    parse_c_uint(s)
        .and_then(|v| u16::try_from(v).ok())
        .ok_or_else(|| format!("invalid port/service `{s}' specified"))
}

/// `a`, `a<sep>b`, `a<sep>` (to 65535), `<sep>b` (from 0).
fn parse_port_range(s: &str, sep: char) -> Result<PortRange, String> {
    let r = match s.split_once(sep) {
        None => PortRange::single(parse_port(s)?),
        Some((a, b)) => PortRange {
            first: if a.is_empty() { 0 } else { parse_port(a)? },
            last: if b.is_empty() {
                u16::MAX
            } else {
                parse_port(b)?
            },
        },
    };
    if r.first > r.last {
        return Err(format!("invalid portrange (min > max) `{s}'"));
    }
    Ok(r)
}

fn parse_value_mask(s: &str, what: &str) -> Result<(u32, Option<u32>), String> {
    match s.split_once('/') {
        Some((v, m)) => Ok((parse_u32(v, what)?, Some(parse_u32(m, what)?))),
        None => Ok((parse_u32(s, what)?, None)),
    }
}

fn parse_list<T: Ord>(
    s: &str,
    what: &str,
    f: impl Fn(&str) -> Option<T>,
) -> Result<BTreeSet<T>, String> {
    s.split(',')
        .map(|item| f(item).ok_or_else(|| format!("bad {what} `{item}'")))
        .collect()
}

type MatchResult = Result<Option<Match>, String>;

/// Parses module `name` with `args`; modules or options the IR does not model give
/// [`Match::Unknown`].
fn parse_match(name: &str, args: Vec<String>) -> Result<Match, String> {
    let typed = match name {
        "comment" => parse_comment(&args),
        "tcp" => parse_ports(&args).map(|o| o.map(Match::Tcp)),
        "udp" => parse_ports(&args).map(|o| o.map(Match::Udp)),
        "sctp" => parse_ports(&args).map(|o| o.map(Match::Sctp)),
        "multiport" => parse_multiport(&args),
        "statistic" => parse_statistic(&args),
        "mark" => parse_mark_match(&args),
        "conntrack" => parse_conntrack(&args),
        "state" => parse_state(&args),
        "addrtype" => parse_addrtype(&args),
        "recent" => parse_recent(&args),
        "set" => parse_set(&args),
        "nfacct" => parse_nfacct(&args),
        "physdev" => parse_physdev(&args),
        _ => Ok(None),
    };
    match typed {
        Ok(Some(m)) => Ok(m),
        Ok(None) => Ok(Match::Unknown {
            module: name.to_string(),
            args,
        }),
        Err(e) => Err(format!("{name}: {e}")),
    }
}

fn parse_comment(args: &[String]) -> MatchResult {
    let mut o = Opts::new(args);
    let mut comment = None;
    while let Some(opt) = o.next() {
        let (neg, opt) = opt?;
        match opt {
            "--comment" => {
                no_neg(neg, opt)?;
                let v = o.value(opt)?;
                let mut end = v.len().min(MAX_COMMENT);
                while !v.is_char_boundary(end) {
                    end -= 1;
                }
                set_once(&mut comment, v[..end].to_string(), opt)?;
            }
            _ => return Ok(None),
        }
    }
    comment
        .map(|c| Some(Match::Comment(c)))
        .ok_or_else(|| "option \"--comment\" must be specified".to_string())
}

fn parse_ports(args: &[String]) -> Result<Option<PortMatch>, String> {
    let mut o = Opts::new(args);
    let mut pm = PortMatch::default();
    while let Some(opt) = o.next() {
        let (negated, opt) = opt?;
        let (slot, long) = match opt {
            "--sport" | "--source-port" => (&mut pm.sport, "--source-port"),
            "--dport" | "--destination-port" => (&mut pm.dport, "--destination-port"),
            _ => return Ok(None),
        };
        let value = parse_port_range(o.value(opt)?, ':')?;
        if slot.is_some() {
            return Err(format!("Only one `{long}' allowed"));
        }
        *slot = Some(Negatable { negated, value });
    }
    for slot in [&mut pm.sport, &mut pm.dport] {
        if slot
            .as_ref()
            .is_some_and(|p| !p.negated && p.value.is_full())
        {
            *slot = None;
        }
    }
    Ok(Some(pm))
}

fn parse_multiport(args: &[String]) -> MatchResult {
    let mut o = Opts::new(args);
    let mut found: Option<Multiport> = None;
    while let Some(opt) = o.next() {
        let (negated, opt) = opt?;
        let kind = match opt {
            "--sports" | "--source-ports" => MultiportKind::Source,
            "--dports" | "--destination-ports" => MultiportKind::Destination,
            "--ports" => MultiportKind::Either,
            _ => return Ok(None),
        };
        let list = o.value(opt)?;
        let ports = list
            .split(',')
            .map(|p| parse_port_range(p, ':'))
            .collect::<Result<Vec<_>, _>>()?;
        let slots: usize = ports
            .iter()
            .map(|p| if p.first == p.last { 1 } else { 2 })
            .sum();
        if slots > 15 {
            return Err("too many ports specified".to_string());
        }
        set_once(
            &mut found,
            Multiport {
                kind,
                ports,
                negated,
            },
            "multiport port",
        )?;
    }
    found
        .map(|m| Some(Match::Multiport(m)))
        .ok_or_else(|| "one of --sports, --dports or --ports is required".to_string())
}

fn parse_statistic(args: &[String]) -> MatchResult {
    let mut o = Opts::new(args);
    let (mut mode, mut prob, mut every, mut packet) = (None, None, None, None);
    let mut negated = false;
    while let Some(opt) = o.next() {
        let (neg, opt) = opt?;
        match opt {
            "--mode" => {
                no_neg(neg, opt)?;
                set_once(&mut mode, o.value(opt)?, opt)?;
            }
            "--probability" => {
                negated |= neg;
                let v = o.value(opt)?;
                let p = v
                    .parse::<f64>()
                    .ok()
                    .and_then(Probability::from_f64)
                    .ok_or_else(|| format!("bad --probability `{v}'"))?;
                set_once(&mut prob, p, opt)?;
            }
            "--every" => {
                negated |= neg;
                let n = parse_u32(o.value(opt)?, "--every")?;
                if n == 0 {
                    return Err("bad --every `0'".to_string());
                }
                set_once(&mut every, n, opt)?;
            }
            "--packet" => {
                no_neg(neg, opt)?;
                set_once(&mut packet, parse_u32(o.value(opt)?, "--packet")?, opt)?;
            }
            _ => return Ok(None),
        }
    }
    let mode = match (mode, prob, every, packet) {
        (Some("random"), Some(probability), None, None) => StatisticMode::Random { probability },
        (Some("nth"), None, Some(every), Some(packet)) => {
            if packet >= every {
                return Err("the --packet p must be 0 <= p <= n-1".to_string());
            }
            StatisticMode::Nth { every, packet }
        }
        (Some("nth"), None, Some(_), None) => {
            return Err("option \"--every\" also requires \"--packet\"".to_string());
        }
        _ => return Err("bad mode/option combination".to_string()),
    };
    Ok(Some(Match::Statistic(Statistic { mode, negated })))
}

fn parse_mark_match(args: &[String]) -> MatchResult {
    let mut o = Opts::new(args);
    let mut found = None;
    while let Some(opt) = o.next() {
        let (negated, opt) = opt?;
        match opt {
            "--mark" => {
                let (value, mask) = parse_value_mask(o.value(opt)?, "mark")?;
                set_once(
                    &mut found,
                    MarkMatch {
                        value,
                        mask: mask.unwrap_or(u32::MAX),
                        negated,
                    },
                    opt,
                )?;
            }
            _ => return Ok(None),
        }
    }
    found
        .map(|m| Some(Match::Mark(m)))
        .ok_or_else(|| "option \"--mark\" must be specified".to_string())
}

fn parse_conntrack(args: &[String]) -> MatchResult {
    let mut o = Opts::new(args);
    let mut c = Conntrack::default();
    while let Some(opt) = o.next() {
        let (negated, opt) = opt?;
        match opt {
            "--ctstate" => {
                let value = parse_list(o.value(opt)?, "ctstate", ConnState::from_name)?;
                set_once(&mut c.state, Negatable { negated, value }, opt)?;
            }
            "--ctstatus" => {
                let value = parse_list(o.value(opt)?, "ctstatus", CtStatus::from_name)?;
                set_once(&mut c.status, Negatable { negated, value }, opt)?;
            }
            _ => return Ok(None),
        }
    }
    if c.state.is_none() && c.status.is_none() {
        return Err("At least one option is required".to_string());
    }
    Ok(Some(Match::Conntrack(c)))
}

fn parse_state(args: &[String]) -> MatchResult {
    let mut o = Opts::new(args);
    let mut found = None;
    while let Some(opt) = o.next() {
        let (negated, opt) = opt?;
        match opt {
            "--state" => {
                let states = parse_list(o.value(opt)?, "state", |s| {
                    ConnState::from_name(s).filter(|s| *s < ConnState::Snat)
                })?;
                set_once(&mut found, StateMatch { states, negated }, opt)?;
            }
            _ => return Ok(None),
        }
    }
    found
        .map(|s| Some(Match::State(s)))
        .ok_or_else(|| "option \"--state\" must be specified".to_string())
}

fn parse_addrtype(args: &[String]) -> MatchResult {
    let mut o = Opts::new(args);
    let mut a = AddrType::default();
    while let Some(opt) = o.next() {
        let (negated, opt) = opt?;
        match opt {
            "--src-type" | "--dst-type" => {
                let value = parse_list(o.value(opt)?, "type", AddrKind::from_name)?;
                let slot = if opt == "--src-type" {
                    &mut a.src
                } else {
                    &mut a.dst
                };
                set_once(slot, Negatable { negated, value }, opt)?;
            }
            "--limit-iface-in" => {
                no_neg(negated, opt)?;
                a.limit_iface_in = true;
            }
            "--limit-iface-out" => {
                no_neg(negated, opt)?;
                a.limit_iface_out = true;
            }
            _ => return Ok(None),
        }
    }
    if a.limit_iface_in && a.limit_iface_out {
        return Err("you can't specify both --limit-iface-in and --limit-iface-out".to_string());
    }
    Ok(Some(Match::AddrType(a)))
}

fn parse_recent(args: &[String]) -> MatchResult {
    let mut o = Opts::new(args);
    let mut command = None;
    let mut r = Recent {
        negated: false,
        command: RecentCommand::Set,
        seconds: None,
        reap: false,
        hitcount: None,
        rttl: false,
        name: "DEFAULT".to_string(),
        mask: None,
        side: RecentSide::Source,
    };
    while let Some(opt) = o.next() {
        let (negated, opt) = opt?;
        let cmd = match opt {
            "--set" => Some(RecentCommand::Set),
            "--rcheck" => Some(RecentCommand::Check),
            "--update" => Some(RecentCommand::Update),
            "--remove" => Some(RecentCommand::Remove),
            _ => None,
        };
        if let Some(cmd) = cmd {
            if command.is_some() {
                return Err(
                    "only one of --set, --rcheck, --update or --remove is allowed".to_string(),
                );
            }
            command = Some(cmd);
            r.negated = negated;
            continue;
        }
        no_neg(negated, opt)?;
        match opt {
            "--seconds" => {
                r.seconds = Some(parse_u32(o.value(opt)?, "--seconds")?).filter(|s| *s != 0)
            }
            "--hitcount" => {
                r.hitcount = Some(parse_u32(o.value(opt)?, "--hitcount")?).filter(|s| *s != 0)
            }
            "--reap" => r.reap = true,
            "--rttl" => r.rttl = true,
            "--name" => {
                let v = o.value(opt)?;
                if v.is_empty() || v.len() > 200 || v.chars().any(|c| c.is_whitespace() || c == '"')
                {
                    return Err(format!("bad --name `{v}'"));
                }
                r.name = v.to_string();
            }
            "--mask" => {
                let v = o.value(opt)?;
                r.mask = Some(v.parse().map_err(|_| format!("bad --mask `{v}'"))?);
            }
            "--rsource" => r.side = RecentSide::Source,
            "--rdest" => r.side = RecentSide::Dest,
            _ => return Ok(None),
        }
    }
    r.command = command
        .ok_or_else(|| "one of --set, --rcheck, --update or --remove is required".to_string())?;
    if r.reap && r.seconds.is_none() {
        return Err("option \"--reap\" also requires \"--seconds\"".to_string());
    }
    Ok(Some(Match::Recent(r)))
}

fn parse_set(args: &[String]) -> MatchResult {
    let mut o = Opts::new(args);
    let mut found = None;
    while let Some(opt) = o.next() {
        let (negated, opt) = opt?;
        match opt {
            "--match-set" | "--set" => {
                let name = o.value(opt)?;
                let flags = o
                    .value(opt)?
                    .split(',')
                    .map(|f| match f {
                        "src" => Ok(SetFlag::Src),
                        "dst" => Ok(SetFlag::Dst),
                        other => Err(format!("bad set flag `{other}'")),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c == '"') {
                    return Err(format!("bad set name `{name}'"));
                }
                set_once(
                    &mut found,
                    SetMatch {
                        name: name.to_string(),
                        flags,
                        negated,
                    },
                    opt,
                )?;
            }
            _ => return Ok(None),
        }
    }
    found
        .map(|s| Some(Match::Set(s)))
        .ok_or_else(|| "option \"--match-set\" must be specified".to_string())
}

fn parse_nfacct(args: &[String]) -> MatchResult {
    let mut o = Opts::new(args);
    let mut name = None;
    while let Some(opt) = o.next() {
        let (neg, opt) = opt?;
        match opt {
            "--nfacct-name" => {
                no_neg(neg, opt)?;
                set_once(&mut name, o.value(opt)?.to_string(), opt)?;
            }
            _ => return Ok(None),
        }
    }
    name.map(|name| Some(Match::Nfacct { name }))
        .ok_or_else(|| "option \"--nfacct-name\" must be specified".to_string())
}

fn parse_physdev(args: &[String]) -> MatchResult {
    let mut o = Opts::new(args);
    let mut p = Physdev::default();
    while let Some(opt) = o.next() {
        let (negated, opt) = opt?;
        match opt {
            "--physdev-in" | "--physdev-out" => {
                let v = o.value(opt)?;
                if v.is_empty()
                    || v.len() > MAX_IFNAME
                    || v.chars().any(|c| c.is_whitespace() || c == '"')
                {
                    return Err(format!("bad interface name `{v}'"));
                }
                let slot = if opt == "--physdev-in" {
                    &mut p.physdev_in
                } else {
                    &mut p.physdev_out
                };
                set_once(
                    slot,
                    Negatable {
                        negated,
                        value: v.to_string(),
                    },
                    opt,
                )?;
            }
            "--physdev-is-in" => set_once(&mut p.is_in, negated, opt)?,
            "--physdev-is-out" => set_once(&mut p.is_out, negated, opt)?,
            "--physdev-is-bridged" => set_once(&mut p.is_bridged, negated, opt)?,
            _ => return Ok(None),
        }
    }
    if p == Physdev::default() {
        return Err("at least one option is required".to_string());
    }
    Ok(Some(Match::Physdev(p)))
}

type TargetResult = Result<Option<Target>, String>;

fn parse_target(goto: bool, name: String, args: Vec<String>) -> Result<Target, String> {
    if goto {
        if is_target_name(&name) {
            return Err(format!("goto '{name}' is not a chain"));
        }
        if !args.is_empty() {
            return Err(format!("Bad argument `{}'", args[0]));
        }
        return Ok(Target::Goto(name));
    }
    let typed: TargetResult = match name.as_str() {
        "ACCEPT" | "DROP" | "RETURN" => {
            if let Some(a) = args.first() {
                return Err(format!("Bad argument `{a}'"));
            }
            Ok(Some(match name.as_str() {
                "ACCEPT" => Target::Accept,
                "DROP" => Target::Drop,
                _ => Target::Return,
            }))
        }
        "REJECT" => parse_reject(&args),
        "DNAT" => parse_nat(&args, "--to-destination").map(|o| o.map(Target::Dnat)),
        "SNAT" => parse_nat(&args, "--to-source").map(|o| o.map(Target::Snat)),
        "MASQUERADE" => parse_masquerade(&args),
        "MARK" => parse_mark_target(&args),
        n if TARGET_EXTENSIONS.contains(&n) => Ok(None),
        _ => {
            if let Some(a) = args.first() {
                return Err(format!("Bad argument `{a}'"));
            }
            return Ok(Target::Jump(name));
        }
    };
    match typed {
        Ok(Some(t)) => Ok(t),
        Ok(None) => Ok(Target::Unknown { name, args }),
        Err(e) => Err(format!("{name}: {e}")),
    }
}

fn parse_reject(args: &[String]) -> TargetResult {
    let mut o = Opts::new(args);
    let mut with = None;
    while let Some(opt) = o.next() {
        let (neg, opt) = opt?;
        match opt {
            "--reject-with" => {
                no_neg(neg, opt)?;
                let v = o.value(opt)?;
                if canonical_reject(IpVersion::V4, v).is_none()
                    && canonical_reject(IpVersion::V6, v).is_none()
                {
                    return Err(format!("unknown reject type `{v}'"));
                }
                set_once(&mut with, v.to_string(), opt)?;
            }
            _ => return Ok(None),
        }
    }
    Ok(Some(Target::Reject { with }))
}

fn parse_addr(s: &str) -> Result<IpAddr, String> {
    s.parse().map_err(|_| format!("bad IP address `{s}'"))
}

/// `[addr[-addr]][:port[-port]]`, IPv6 with a port as `[addr[-addr]]:port[-port]`.
fn parse_nat_range(s: &str) -> Result<NatRange, String> {
    let (addrs, ports) = if let Some(rest) = s.strip_prefix('[') {
        let (inside, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("missing `]' in `{s}'"))?;
        let ports = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| format!("bad range `{s}'"))?,
            ),
        };
        (Some(inside), ports)
    } else if s.matches(':').count() > 1 {
        (Some(s), None)
    } else {
        match s.split_once(':') {
            Some((a, p)) => ((!a.is_empty()).then_some(a), Some(p)),
            None => (Some(s), None),
        }
    };
    let addrs = match addrs {
        None => None,
        Some(a) => {
            let (first, last) = match a.split_once('-') {
                Some((x, y)) => (parse_addr(x)?, parse_addr(y)?),
                None => {
                    let x = parse_addr(a)?;
                    (x, x)
                }
            };
            if first.is_ipv4() != last.is_ipv4() {
                return Err(format!("mixed address families in `{s}'"));
            }
            Some((first, last))
        }
    };
    let ports = ports.map(|p| parse_port_range(p, '-')).transpose()?;
    if addrs.is_none() && ports.is_none() {
        return Err(format!("bad range `{s}'"));
    }
    Ok(NatRange { addrs, ports })
}

fn parse_nat(args: &[String], to_opt: &str) -> Result<Option<NatTarget>, String> {
    let mut o = Opts::new(args);
    let mut to = None;
    let (mut random, mut random_fully, mut persistent) = (false, false, false);
    while let Some(opt) = o.next() {
        let (neg, opt) = opt?;
        no_neg(neg, opt)?;
        match opt {
            "--random" => random = true,
            "--random-fully" => random_fully = true,
            "--persistent" => persistent = true,
            o2 if o2 == to_opt => set_once(&mut to, parse_nat_range(o.value(opt)?)?, opt)?,
            _ => return Ok(None),
        }
    }
    let to = to.ok_or_else(|| format!("option \"{to_opt}\" must be specified"))?;
    Ok(Some(NatTarget {
        to,
        random,
        random_fully,
        persistent,
    }))
}

fn parse_masquerade(args: &[String]) -> TargetResult {
    let mut o = Opts::new(args);
    let (mut to_ports, mut random, mut random_fully) = (None, false, false);
    while let Some(opt) = o.next() {
        let (neg, opt) = opt?;
        no_neg(neg, opt)?;
        match opt {
            "--to-ports" => set_once(&mut to_ports, parse_port_range(o.value(opt)?, '-')?, opt)?,
            "--random" => random = true,
            "--random-fully" => random_fully = true,
            _ => return Ok(None),
        }
    }
    Ok(Some(Target::Masquerade {
        to_ports,
        random,
        random_fully,
    }))
}

fn parse_mark_target(args: &[String]) -> TargetResult {
    let mut o = Opts::new(args);
    let mut found: Option<(u32, u32)> = None;
    let mut first_opt = String::new();
    while let Some(opt) = o.next() {
        let (neg, opt) = opt?;
        no_neg(neg, opt)?;
        let v = match opt {
            "--set-xmark" | "--set-mark" | "--or-mark" | "--xor-mark" | "--and-mark" => {
                o.value(opt)?
            }
            _ => return Ok(None),
        };
        let (value, mask) = parse_value_mask(v, "mark")?;
        let single = |m: Option<u32>| {
            if m.is_some() {
                Err(format!("option {opt} takes no mask"))
            } else {
                Ok(())
            }
        };
        let xmark = match opt {
            "--set-xmark" => (value, mask.unwrap_or(u32::MAX)),
            "--set-mark" => (value, mask.unwrap_or(u32::MAX) | value),
            "--or-mark" => {
                single(mask)?;
                (value, value)
            }
            "--xor-mark" => {
                single(mask)?;
                (value, 0)
            }
            _ => {
                single(mask)?;
                (0, !value)
            }
        };
        if found.is_some() {
            return Err(format!(
                "option \"{first_opt}\" cannot be used together with \"{opt}\""
            ));
        }
        first_opt = opt.to_string();
        found = Some(xmark);
    }
    let (value, mask) = found.ok_or_else(|| {
        "one of --set-xmark, --set-mark, --or-mark, --xor-mark or --and-mark is required"
            .to_string()
    })?;
    Ok(Some(Target::Mark { value, mask }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iptables::tokenize::tokenize;

    fn rule(spec: &str) -> Rule {
        parse_rule("X", &tokenize(spec).unwrap()).unwrap()
    }

    fn canon(spec: &str) -> String {
        rule(spec).to_string()
    }

    fn err(spec: &str) -> String {
        parse_rule("X", &tokenize(spec).unwrap()).unwrap_err()
    }

    #[test]
    fn general_matches_print_in_canonical_order() {
        assert_eq!(
            canon("-i eth0 -o eth1 -s 1.1.1.1 -d 2.2.2.2 -p udp -j RETURN"),
            "-A X -s 1.1.1.1/32 -d 2.2.2.2/32 -i eth0 -o eth1 -p udp -j RETURN"
        );
        assert_eq!(
            canon("-p tcp -f -s 1.1.1.1 -j RETURN"),
            "-A X -s 1.1.1.1/32 -p tcp -f -j RETURN"
        );
        assert_eq!(
            canon("-s 10.0.0.5/8 -j RETURN"),
            "-A X -s 10.0.0.0/8 -j RETURN"
        );
        assert_eq!(
            canon("-s 10.0.0.5/255.255.0.0 -j RETURN"),
            "-A X -s 10.0.0.0/16 -j RETURN"
        );
        assert_eq!(
            canon("-s 0.0.0.0/0 -p all -i + -j RETURN"),
            "-A X -j RETURN"
        );
        assert_eq!(
            canon("! -s 0.0.0.0/0 -j RETURN"),
            "-A X ! -s 0.0.0.0/0 -j RETURN"
        );
        assert_eq!(canon("-p 47 -j RETURN"), "-A X -p gre -j RETURN");
        assert_eq!(
            canon("-s FD00:0:0::1 -j RETURN"),
            "-A X -s fd00::1/128 -j RETURN"
        );
        assert_eq!(canon("-i eth+ ! -o lo"), "-A X -i eth+ ! -o lo");
    }

    #[test]
    fn implicit_protocol_match() {
        assert_eq!(
            canon("-p tcp --dport 80 -m comment --comment x -j RETURN"),
            "-A X -p tcp -m tcp --dport 80 -m comment --comment x -j RETURN"
        );
        assert_eq!(
            canon("-p udp ! --dport 53 --sport 1000:2000 -j RETURN"),
            "-A X -p udp -m udp --sport 1000:2000 ! --dport 53 -j RETURN"
        );
        assert!(err("--dport 80 -j RETURN").contains("Bad argument"));
    }

    #[test]
    fn ports() {
        assert_eq!(canon("-p tcp -m tcp --dport 0:65535"), "-A X -p tcp -m tcp");
        assert_eq!(
            canon("-p tcp -m tcp --dport 80:80 ! --sport 1:"),
            "-A X -p tcp -m tcp ! --sport 1:65535 --dport 80"
        );
        assert_eq!(
            canon("-p tcp -m tcp --dport :100"),
            "-A X -p tcp -m tcp --dport 0:100"
        );
        assert!(err("-p tcp -m tcp --dport 90:80").contains("min > max"));
        assert!(err("-p tcp -m tcp --dport 80 ! --dport 81").contains("Only one"));
        assert!(err("-p tcp -m tcp --dport http").contains("invalid port"));
        assert_eq!(
            canon("-p tcp -m multiport --dports 80,443,8000:8080"),
            "-A X -p tcp -m multiport --dports 80,443,8000:8080"
        );
        assert!(
            err("-p tcp -m multiport --dports 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16")
                .contains("too many")
        );
    }

    #[test]
    fn marks() {
        assert_eq!(
            canon("-j MARK --or-mark 0x4000"),
            "-A X -j MARK --set-xmark 0x4000/0x4000"
        );
        assert_eq!(
            canon("-j MARK --xor-mark 0x4000"),
            "-A X -j MARK --set-xmark 0x4000/0x0"
        );
        assert_eq!(
            canon("-j MARK --and-mark 0x4000"),
            "-A X -j MARK --set-xmark 0x0/0xffffbfff"
        );
        assert_eq!(
            canon("-j MARK --set-mark 0x4000"),
            "-A X -j MARK --set-xmark 0x4000/0xffffffff"
        );
        assert_eq!(
            canon("-j MARK --set-mark 1/2"),
            "-A X -j MARK --set-xmark 0x1/0x3"
        );
        assert_eq!(
            canon("-j MARK --set-xmark 0x10"),
            "-A X -j MARK --set-xmark 0x10/0xffffffff"
        );
        assert!(err("-j MARK --set-xmark 1/1 --or-mark 2").contains("cannot be used together"));
        assert_eq!(canon("-m mark --mark 16384"), "-A X -m mark --mark 0x4000");
        assert_eq!(
            canon("-m mark --mark 010/0xffffffff"),
            "-A X -m mark --mark 0x8"
        );
        assert_eq!(
            canon("-m mark ! --mark 0x4000/0x4000 -j RETURN"),
            "-A X -m mark ! --mark 0x4000/0x4000 -j RETURN"
        );
    }

    #[test]
    fn statistic() {
        assert_eq!(
            canon("-m statistic --mode random --probability 0.5000000000"),
            "-A X -m statistic --mode random --probability 0.50000000000"
        );
        assert_eq!(
            canon("-m statistic --mode random ! --probability 0.25"),
            "-A X -m statistic --mode random ! --probability 0.25000000000"
        );
        assert_eq!(
            canon("-m statistic --mode nth ! --every 10 --packet 9"),
            "-A X -m statistic --mode nth ! --every 10 --packet 9"
        );
        assert!(err("-m statistic --mode nth --every 2").contains("--packet"));
        assert!(err("-m statistic --mode nth --every 2 --packet 2").contains("n-1"));
        assert!(err("-m statistic --mode random --probability 2").contains("probability"));
    }

    #[test]
    fn conntrack_state_addrtype_sets() {
        assert_eq!(
            canon("-m conntrack ! --ctstatus CONFIRMED ! --ctstate NEW,invalid"),
            "-A X -m conntrack ! --ctstate INVALID,NEW ! --ctstatus CONFIRMED"
        );
        assert_eq!(
            canon("-m state --state ESTABLISHED,RELATED"),
            "-A X -m state --state RELATED,ESTABLISHED"
        );
        assert!(err("-m state --state SNAT").contains("bad state"));
        assert_eq!(
            canon("-m addrtype --src-type LOCAL,UNICAST ! --dst-type LOCAL --limit-iface-in"),
            "-A X -m addrtype --src-type UNICAST,LOCAL ! --dst-type LOCAL --limit-iface-in"
        );
        assert_eq!(
            canon("-m set ! --match-set KUBE-X dst,dst -j ACCEPT"),
            "-A X -m set ! --match-set KUBE-X dst,dst -j ACCEPT"
        );
        assert_eq!(
            canon(
                "-m physdev --physdev-in eth0 ! --physdev-out eth1 --physdev-is-bridged --physdev-is-out"
            ),
            "-A X -m physdev --physdev-in eth0 --physdev-is-out ! --physdev-out eth1 --physdev-is-bridged"
        );
        assert_eq!(
            canon("-m nfacct --nfacct-name foo"),
            "-A X -m nfacct --nfacct-name foo"
        );
    }

    #[test]
    fn recent_defaults_and_canonicalize() {
        let mut r = rule("-m recent --rcheck --seconds 10800 --reap --name KUBE-X -j ACCEPT");
        assert_eq!(
            r.to_string(),
            "-A X -m recent --rcheck --seconds 10800 --reap --name KUBE-X --rsource -j ACCEPT"
        );
        r.canonicalize(IpVersion::V4);
        assert_eq!(
            r.to_string(),
            "-A X -m recent --rcheck --seconds 10800 --reap --name KUBE-X --mask 255.255.255.255 --rsource -j ACCEPT"
        );
        let mut r = rule("-m recent ! --set");
        r.canonicalize(IpVersion::V6);
        assert_eq!(
            r.to_string(),
            "-A X -m recent ! --set --name DEFAULT --mask ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff --rsource"
        );
        assert!(err("-m recent --set --reap").contains("--seconds"));
        assert!(err("-m recent --seconds 5").contains("required"));
    }

    #[test]
    fn comments() {
        assert_eq!(
            canon("-m comment --comment \"a_b-C9\""),
            "-A X -m comment --comment a_b-C9"
        );
        assert_eq!(
            canon("-m comment --comment default/nginx-svc"),
            "-A X -m comment --comment \"default/nginx-svc\""
        );
        assert_eq!(
            canon("-m comment --comment \"\""),
            "-A X -m comment --comment \"\""
        );
        let long = "x".repeat(300);
        assert_eq!(
            canon(&format!("-m comment --comment {long}")),
            format!("-A X -m comment --comment {}", "x".repeat(255))
        );
    }

    #[test]
    fn nat_targets() {
        assert_eq!(
            canon("-p tcp -j DNAT --to-destination 10.0.0.4:80 --persistent --random"),
            "-A X -p tcp -j DNAT --to-destination 10.0.0.4:80 --random --persistent"
        );
        assert_eq!(
            canon("-j DNAT --to-destination 1.2.3.4"),
            "-A X -j DNAT --to-destination 1.2.3.4"
        );
        assert_eq!(
            canon("-p tcp -j DNAT --to-destination [fd00::1]:80"),
            "-A X -p tcp -j DNAT --to-destination [fd00::1]:80"
        );
        assert_eq!(
            canon("-p tcp -j DNAT --to-destination [fd00::1]"),
            "-A X -p tcp -j DNAT --to-destination fd00::1"
        );
        assert_eq!(
            canon("-p tcp -j DNAT --to-destination [fd00::1-fd00::5]:80-90"),
            "-A X -p tcp -j DNAT --to-destination [fd00::1-fd00::5]:80-90"
        );
        assert_eq!(
            canon("-p tcp -j DNAT --to-destination 1.2.3.4-1.2.3.9:80-90"),
            "-A X -p tcp -j DNAT --to-destination 1.2.3.4-1.2.3.9:80-90"
        );
        assert_eq!(
            canon("-p tcp -j DNAT --to-destination :80"),
            "-A X -p tcp -j DNAT --to-destination :80"
        );
        assert_eq!(
            canon("-j SNAT --to-source 1.2.3.4 --random-fully --persistent --random"),
            "-A X -j SNAT --to-source 1.2.3.4 --random --random-fully --persistent"
        );
        assert_eq!(
            canon("-j MASQUERADE --random-fully --random"),
            "-A X -j MASQUERADE --random --random-fully"
        );
        assert_eq!(
            canon("-p tcp -j MASQUERADE --to-ports 1000-2000"),
            "-A X -p tcp -j MASQUERADE --to-ports 1000-2000"
        );
        assert!(err("-j SNAT").contains("--to-source"));
    }

    #[test]
    fn reject_and_unknown_targets() {
        let mut r = rule("-j REJECT --reject-with host-unreach");
        r.canonicalize(IpVersion::V4);
        assert_eq!(
            r.to_string(),
            "-A X -j REJECT --reject-with icmp-host-unreachable"
        );
        let mut r = rule("-j REJECT");
        r.canonicalize(IpVersion::V6);
        assert_eq!(
            r.to_string(),
            "-A X -j REJECT --reject-with icmp6-port-unreachable"
        );
        assert_eq!(
            canon("-j LOG --log-prefix \"hi there\""),
            "-A X -j LOG --log-prefix \"hi there\""
        );
        assert_eq!(canon("-j CT --notrack"), "-A X -j CT --notrack");
        assert_eq!(
            canon("-p tcp -m tcp --tcp-flags FIN,SYN,RST,ACK SYN"),
            "-A X -p tcp -m tcp --tcp-flags FIN,SYN,RST,ACK SYN"
        );
        assert!(matches!(
            rule("-p tcp --syn").matches[1],
            Match::Unknown { .. }
        ));
        assert_eq!(
            rule("-g KUBE-FW").target,
            Some(Target::Goto("KUBE-FW".into()))
        );
        assert!(err("-g ACCEPT").contains("not a chain"));
        assert!(err("-j ACCEPT --foo").contains("Bad argument"));
        assert!(err("-j KUBE-X --foo").contains("Bad argument"));
    }

    #[test]
    fn general_errors() {
        assert!(err("-s 1.1.1.1 -s 2.2.2.2").contains("multiple -s"));
        assert!(err("-s example.com").contains("not found"));
        assert!(err("-s 10.0.0.0/255.0.255.0").contains("invalid mask"));
        assert!(err("-i abcdefghijklmnop").contains("IFNAMSIZ"));
        assert!(err("-p bogus").contains("unknown protocol"));
        assert!(err("! -p all").contains("never match"));
        assert!(err("-s").contains("requires an argument"));
        assert!(err("! -m tcp").contains("Bad argument") || err("! -m tcp").contains("negate"));
        assert!(err("-j A -j B").contains("multiple"));
    }

    #[test]
    fn counters_option() {
        let r = rule("-c 5 6 -j RETURN");
        assert_eq!(
            r.counters,
            Some(Counters {
                packets: 5,
                bytes: 6
            })
        );
        assert_eq!(r.to_string(), "[5:6] -A X -j RETURN");
    }
}
