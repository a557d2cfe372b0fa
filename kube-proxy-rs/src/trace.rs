//! `kube-proxy-rs trace`: where does this packet go, and why?
//!
//! Loads the rules — an `iptables-save` dump or an `nft -j list ruleset` dump (a file or
//! standard input), or this node's live rules — completes a partial iptables dump if
//! needed, and runs the packet through [`kp_trace`]; prints the path for an operator or
//! JSON for tools.
//!
//! Which rules (`--mode`): a dump is traced as what it is (JSON is nftables). With
//! `--live`, `auto` picks nftables when the node has kube-proxy's nftables table
//! (`ip kube-proxy` / `ip6 kube-proxy`) and iptables otherwise. A node can have both —
//! kubelet and CNI plugins write iptables rules of their own, and a node switched from
//! iptables mode may keep old KUBE chains — so when it does, `auto` traces nftables (every
//! nft table, which includes iptables-nft's, whose `xt` matches are reported unknown)
//! and says that `--mode iptables` traces the iptables rules.
//!
//! IPVS mode (`--ipvs FILE`, an `ipvsadm -Sn` dump, or `--mode ipvs`; `auto` with
//! `--live` when the node has IPVS virtual servers and no kube-proxy nftables table):
//! the iptables rules, the ipsets and the IPVS table are traced together
//! ([`kp_trace::trace_ipvs`]). The addresses of the virtual servers and the members of
//! `KUBE-IPVS-IPS` are kube-ipvs0's (or the node's) addresses, so a dump's trace takes
//! them as local addresses, with a note.
//!
//! Userspace mode (`--userspace FILE`, the proxy's table as the daemon serves it at
//! `GET /userspace` on its metrics address, or `--mode userspace`; `auto` with `--live`
//! when the node's iptables rules have userspace mode's `KUBE-PORTALS-*` chains and the
//! table can be read from `http://127.0.0.1:10249/userspace`): the portal rules and then
//! the proxy's own choice of endpoint ([`kp_trace::trace_userspace`]). For a dump, the
//! addresses `KUBE-PORTALS-HOST` DNATs to are the node's, and are taken as local
//! addresses, with a note.

use std::io::Read as _;
use std::net::IpAddr;

use anyhow::{Context, anyhow, bail};
use clap::ValueEnum;
use kp_netfilter::{
    Backend, ExecIptables, HEADLESS_NAT_NOTE, IpVersion, Iptables, Ruleset, assume_headless_nat,
    complete_kube_proxy_jumps, complete_partial_save, parse_save,
};
use kp_proxier::{Host as _, RealHost};
use kp_trace::nft::{NftRuleset, looks_like_json, parse_nft_json};
use kp_trace::{
    Entry, Host, IpvsTable, Packet, UserspaceTable, portal_node_addresses, render_text, trace,
    trace_ipvs, trace_nft, trace_userspace,
};

use crate::cli::{TraceArgs, TraceFrom, TraceProto};

/// The comment of upstream's (and our) localnet guard rule; its presence in a dump means
/// the node runs with `route_localnet=1`.
const LOCALNET_GUARD: &str = "block incoming localnet connections";

/// `trace --mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TraceMode {
    /// A dump: by its format (IPVS mode with `--ipvs`, userspace mode with `--userspace`);
    /// live: nftables if kube-proxy's nft table exists, else IPVS if the node has virtual
    /// servers, else userspace mode if the rules have the KUBE-PORTALS chains and the
    /// proxy's table can be read, else iptables.
    Auto,
    /// iptables rules (`iptables-save`).
    Iptables,
    /// nftables rules (`nft -j list ruleset`).
    Nftables,
    /// kube-proxy's IPVS mode: iptables rules, ipsets and the IPVS table (`--ipvs FILE`
    /// for a dump).
    Ipvs,
    /// kube-proxy's userspace mode: iptables portal rules and the proxy's table
    /// (`--userspace FILE` for a dump; with --live read from
    /// http://127.0.0.1:10249/userspace).
    Userspace,
}

/// Where `--live` reads the userspace proxy's table: the daemon's default metrics address.
pub const LIVE_USERSPACE_URL: &str = "http://127.0.0.1:10249/userspace";

/// The address and path of [`LIVE_USERSPACE_URL`].
const LIVE_USERSPACE: (&str, &str) = ("127.0.0.1:10249", "/userspace");

/// The chains only userspace mode's rules have.
const PORTAL_CHAINS: [&str; 2] = ["KUBE-PORTALS-CONTAINER", "KUBE-PORTALS-HOST"];

/// The rules to trace.
enum Rules {
    /// An iptables ruleset, its text (for the localnet guard) and the notes on what was
    /// assumed to complete it (added to the trace's notes).
    Iptables(Ruleset, String, Vec<String>),
    /// An nftables ruleset.
    Nftables(NftRuleset),
}

fn read_dump(args: &TraceArgs) -> anyhow::Result<String> {
    let path = args
        .rules
        .as_ref()
        .ok_or_else(|| anyhow!("pass --rules FILE or --live"))?;
    let (text, name) = if path.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading rules from standard input")?;
        (s, "standard input".to_string())
    } else {
        let s =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        (s, path.display().to_string())
    };
    let has_rules = text.lines().any(|l| {
        let l = l.trim();
        !l.is_empty() && !l.starts_with('#') && l != "COMMIT" && !l.starts_with('*')
    });
    if !has_rules {
        bail!("no rules found in {name}: pass an `iptables-save` or `nft -j list ruleset` dump");
    }
    Ok(text)
}

/// Parses an iptables dump (completing a partial one); for a dump (`dump`, not this
/// node's live rules) also adds kube-proxy's jumps from the built-in chains that the dump
/// lacks, with a note for each.
fn parse_iptables(text: String, dump: bool) -> anyhow::Result<Rules> {
    let mut notes = Vec::new();
    let mut rules = match parse_save(&text) {
        Ok(r) => r,
        Err(first) => {
            if let Some(kind) = nft_text_kind(&text) {
                bail!(
                    "the rules are nftables text ({kind}), not an iptables-save dump: trace \
                     reads nftables rules as JSON, so pass `nft -j list ruleset` output \
                     (`--mode nftables` to insist on it), or trace this node's rules with \
                     `--live`"
                );
            }
            let headless = if dump {
                assume_headless_nat(&text)
                    .map_err(|e| anyhow!("the rules do not parse: {first}; {e}"))?
            } else {
                None
            };
            if headless.is_some() {
                notes.push(HEADLESS_NAT_NOTE.to_string());
            }
            let text = headless.as_deref().unwrap_or(&text);
            let (completed, added) = complete_partial_save(text)
                .map_err(|e| anyhow!("the rules do not parse: {first}; as a partial dump: {e}"))?;
            let r = parse_save(&completed).map_err(|e| anyhow!("the rules do not parse: {e}"))?;
            eprintln!("note: the dump was partial; {added} chain declaration(s) were assumed");
            r
        }
    };
    if dump {
        for jump in complete_kube_proxy_jumps(&mut rules) {
            notes.push(format!(
                "assumed kube-proxy's jump {jump}, which the dump does not contain (it has the \
                 chain the jump leads to; kube-proxy installs this jump)"
            ));
        }
    }
    Ok(Rules::Iptables(rules, text, notes))
}

/// If `text` looks like `nft list ruleset` text (a line `table FAMILY NAME {`), a
/// description of the first such line.
fn nft_text_kind(text: &str) -> Option<String> {
    text.lines().map(str::trim).find_map(|l| {
        let mut words = l.split_whitespace();
        let (Some("table"), Some(family)) = (words.next(), words.next()) else {
            return None;
        };
        let families = ["ip", "ip6", "inet", "arp", "bridge", "netdev"];
        (families.contains(&family) && l.ends_with('{')).then(|| format!("`{l}'"))
    })
}

fn parse_nft(text: &str) -> anyhow::Result<Rules> {
    let rules = parse_nft_json(text).map_err(|e| anyhow!("the rules do not parse: {e}"))?;
    if rules.tables.is_empty() {
        bail!("no rules found: the nft dump has no tables");
    }
    Ok(Rules::Nftables(rules))
}

/// `nft -j list ruleset` on this node.
fn live_nft() -> anyhow::Result<NftRuleset> {
    let out = std::process::Command::new("nft")
        .args(["-j", "list", "ruleset"])
        .output()
        .context("running nft -j list ruleset")?;
    if !out.status.success() {
        bail!(
            "nft -j list ruleset failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    parse_nft_json(&String::from_utf8_lossy(&out.stdout))
        .map_err(|e| anyhow!("reading this node's nftables rules: {e}"))
}

fn live_iptables(version: IpVersion) -> anyhow::Result<String> {
    ExecIptables::new(version, Backend::Default)
        .save(None)
        .map_err(|e| anyhow!("reading this node's rules: {e}"))
}

/// IPVS mode's jumps from the built-in chains (table, chain, comment, target).
pub use kp_proxier::ipvs::JUMPS as IPVS_JUMPS;

/// IPVS mode's jumps from the built-in chains that iptables mode does not have (the
/// others are completed by [`complete_kube_proxy_jumps`]): added to a dump that has the
/// chain but not the jump, in upstream's order, with a note each.
fn complete_ipvs_jumps(rules: &mut Ruleset) -> Vec<String> {
    use kp_netfilter::Table;
    let mut notes = Vec::new();
    // JUMPS lists them in prepend order: the last one per chain ends up first.
    for (table, chain, comment, target) in IPVS_JUMPS.iter().rev() {
        let t = match *table {
            "nat" => Table::Nat,
            _ => Table::Filter,
        };
        let Some(tbl) = rules.tables.get_mut(&t) else {
            continue;
        };
        if !tbl.chains.contains_key(*target) {
            continue;
        }
        let line = format!("-A {chain} -m comment --comment \"{comment}\" -j {target}");
        let has = tbl
            .chains
            .get(*chain)
            .is_some_and(|c| c.rules.iter().any(|r| r.jump_chain() == Some(*target)));
        if has {
            continue;
        }
        let doc = format!("*{table}\n:{chain} ACCEPT [0:0]\n:{target} - [0:0]\n{line}\nCOMMIT\n");
        let Ok(parsed) = parse_save(&doc) else {
            continue;
        };
        let Some(rule) = parsed
            .chain(t, chain)
            .and_then(|c| c.rules.first())
            .cloned()
        else {
            continue;
        };
        let builtin = tbl
            .chains
            .entry((*chain).to_string())
            .or_insert_with(|| parsed.chain(t, chain).cloned().unwrap_or_default());
        let n_ours = builtin
            .rules
            .iter()
            .take_while(|r| r.jump_chain().is_some_and(|c| c.starts_with("KUBE-")))
            .count();
        builtin.rules.insert(n_ours.min(builtin.rules.len()), rule);
        notes.push(format!(
            "assumed kube-proxy's jump {table} {chain}: {line}, which the dump does not contain \
             (it has the chain the jump leads to; kube-proxy's IPVS mode installs this jump)"
        ));
    }
    notes
}

/// The IPVS table: `--ipvs FILE`, or this node's (`--live`).
fn load_ipvs(args: &TraceArgs, live_auto: bool) -> anyhow::Result<Option<IpvsTable>> {
    if let Some(path) = &args.ipvs {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        return IpvsTable::parse(&text)
            .map(Some)
            .map_err(|e| anyhow!("{}: {e}", path.display()));
    }
    if !args.live {
        if args.mode == TraceMode::Ipvs {
            bail!(
                "--mode ipvs with a dump needs the IPVS table: pass --ipvs FILE (`ipvsadm -Sn` output)"
            );
        }
        return Ok(None);
    }
    if args.mode != TraceMode::Ipvs && !live_auto {
        return Ok(None);
    }
    let dumped =
        kp_netlink::ipvs::Ipvs::new().and_then(|mut ipvs| kp_netlink::ipvs::dump_all(&mut ipvs));
    match dumped {
        Ok(services) if !services.is_empty() || args.mode == TraceMode::Ipvs => {
            Ok(Some(IpvsTable::from_dump(services)))
        }
        Ok(_) => Ok(None),
        Err(e) if args.mode == TraceMode::Ipvs => {
            bail!("reading this node's IPVS table: {e}")
        }
        Err(_) => Ok(None),
    }
}

/// Whether the flags ask for userspace mode.
fn userspace_asked(args: &TraceArgs) -> bool {
    args.mode == TraceMode::Userspace || args.userspace.is_some()
}

/// Refuses flags that ask for two modes at once.
fn check_mode_flags(args: &TraceArgs) -> anyhow::Result<()> {
    if args.userspace.is_some() && !matches!(args.mode, TraceMode::Auto | TraceMode::Userspace) {
        bail!(
            "--userspace is userspace mode, which traces iptables rules with the proxy's table: \
             drop --mode {} (or use --mode userspace)",
            args.mode
                .to_possible_value()
                .map_or_else(String::new, |v| v.get_name().to_string())
        );
    }
    if userspace_asked(args) && (args.ipvs.is_some() || args.mode == TraceMode::Ipvs) {
        bail!("--ipvs is IPVS mode and --userspace userspace mode: pass one of them");
    }
    Ok(())
}

/// Adds each of userspace mode's jumps from the built-in chains
/// ([`kp_proxier::userspace::render::JUMPS`]) to a dump that has the chain it leads to but not the
/// jump, where userspace mode puts it (the portals first, the NodePorts last); a note each.
fn complete_userspace_jumps(rules: &mut Ruleset) -> Vec<String> {
    use kp_netfilter::Table;
    let mut notes = Vec::new();
    for (table, chain, rule, first) in kp_proxier::userspace::render::JUMPS {
        let line = format!("-A {chain} {rule}");
        let append = !first;
        let t = match table {
            "nat" => Table::Nat,
            _ => Table::Filter,
        };
        let Some(target) = line.rsplit(' ').next() else {
            continue;
        };
        let Some(tbl) = rules.tables.get_mut(&t) else {
            continue;
        };
        if !tbl.chains.contains_key(target) {
            continue;
        }
        let has = tbl
            .chains
            .get(chain)
            .is_some_and(|c| c.rules.iter().any(|r| r.jump_chain() == Some(target)));
        if has {
            continue;
        }
        let doc = format!("*{table}\n:{chain} ACCEPT [0:0]\n:{target} - [0:0]\n{line}\nCOMMIT\n");
        let Some((mut builtin, rule)) = parse_save(&doc).ok().and_then(|p| {
            let c = p.chain(t, chain)?;
            Some((c.clone(), c.rules.first()?.clone()))
        }) else {
            continue;
        };
        builtin.rules.clear();
        let rules_of = &mut tbl.chains.entry(chain.to_string()).or_insert(builtin).rules;
        if append {
            rules_of.push(rule);
        } else {
            rules_of.insert(0, rule);
        }
        notes.push(format!(
            "assumed kube-proxy's jump {table} {chain}: {line}, which the dump does not contain \
             (it has the chain the jump leads to; kube-proxy's userspace mode installs this jump)"
        ));
    }
    notes
}

/// Whether `rules` have userspace mode's portal chains.
fn has_portal_chains(rules: &Ruleset) -> bool {
    PORTAL_CHAINS
        .iter()
        .any(|c| rules.chain(kp_netfilter::Table::Nat, c).is_some())
}

/// `GET /userspace` from the daemon's default metrics address.
fn fetch_live_userspace() -> anyhow::Result<String> {
    use std::io::Write as _;
    use std::time::Duration;
    let (addr, path) = LIVE_USERSPACE;
    let sock: std::net::SocketAddr = addr.parse()?;
    let timeout = Duration::from_secs(5);
    let mut conn = std::net::TcpStream::connect_timeout(&sock, timeout)
        .with_context(|| format!("connecting to {addr}"))?;
    conn.set_read_timeout(Some(timeout))?;
    conn.set_write_timeout(Some(timeout))?;
    write!(
        conn,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw).context("reading the answer")?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("not an HTTP answer"))?;
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        bail!("the answer is `{status}'");
    }
    Ok(body.to_string())
}

/// The header `--dry-run --proxy-mode userspace` prints above each family's proxy table.
pub(crate) const DRY_RUN_TABLE_HEADER: &str =
    ": userspace proxy table (kube-proxy-rs trace --userspace)";

/// The `family` (`IPv4`, `IPv6`) proxy table of a whole `--dry-run` output (its section runs
/// from its header to the next `# <family>: ` section header); `None` when `text` is not a
/// dry run's output.
fn dry_run_table(text: &str, family: &str) -> Option<String> {
    let header = format!("# {family}{DRY_RUN_TABLE_HEADER}");
    let mut lines = text.lines().skip_while(|l| *l != header);
    lines.next()?;
    let section: Vec<&str> = lines
        .take_while(|l| !(l.starts_with("# IPv4: ") || l.starts_with("# IPv6: ")))
        .collect();
    Some(section.join("\n") + "\n")
}

/// The userspace proxy's table: `--userspace FILE`, or with `--live` the daemon's
/// (`--mode userspace`, or `auto` when `rules` have the portal chains). `Ok(None)`: not
/// userspace mode.
fn load_userspace(args: &TraceArgs, rules: &Rules) -> anyhow::Result<Option<UserspaceTable>> {
    if let Some(path) = &args.userspace {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let family = if args.dst.is_ipv4() { "IPv4" } else { "IPv6" };
        let text = dry_run_table(&text, family).unwrap_or(text);
        return UserspaceTable::parse(&text)
            .map(Some)
            .map_err(|e| anyhow!("{}: {e}", path.display()));
    }
    let portals = matches!(rules, Rules::Iptables(r, _, _) if has_portal_chains(r));
    if !args.live {
        if args.mode == TraceMode::Userspace {
            bail!(
                "--mode userspace with a dump needs the proxy's table: pass --userspace FILE \
                 (on the node: curl {LIVE_USERSPACE_URL} > table.txt)"
            );
        }
        return Ok(None);
    }
    if args.mode != TraceMode::Userspace && !(args.mode == TraceMode::Auto && portals) {
        return Ok(None);
    }
    let table = fetch_live_userspace().and_then(|text| {
        UserspaceTable::parse(&text).map_err(|e| anyhow!("{LIVE_USERSPACE_URL}: {e}"))
    });
    match table {
        Ok(t) => Ok(Some(t)),
        Err(e) if args.mode == TraceMode::Userspace => bail!(
            "--live in userspace mode reads the proxy's table from {LIVE_USERSPACE_URL}, which \
             failed ({e:#}); if the daemon serves metrics elsewhere (--metrics-bind-address), \
             pass --userspace FILE: curl http://ADDRESS/userspace > table.txt"
        ),
        Err(e) => {
            eprintln!(
                "note: this node's rules have userspace mode's KUBE-PORTALS chains, but the \
                 proxy's table could not be read from {LIVE_USERSPACE_URL} ({e:#}): tracing \
                 the iptables rules alone; pass --userspace FILE to follow the proxy"
            );
            Ok(None)
        }
    }
}

fn load_rules(args: &TraceArgs, version: IpVersion) -> anyhow::Result<Rules> {
    if userspace_asked(args) {
        if args.mode == TraceMode::Nftables {
            bail!(
                "--userspace is userspace mode, which traces iptables rules: drop --mode nftables"
            );
        }
        if args.live {
            return parse_iptables(live_iptables(version)?, false);
        }
        let text = read_dump(args)?;
        if looks_like_json(&text) {
            bail!(
                "userspace mode needs the node's iptables rules (`iptables-save`), but the rules \
                 are JSON"
            );
        }
        let mut rules = parse_iptables(text, false)?;
        if let Rules::Iptables(r, _, notes) = &mut rules {
            notes.extend(complete_userspace_jumps(r));
        }
        return Ok(rules);
    }
    if args.mode == TraceMode::Ipvs || args.ipvs.is_some() {
        if args.mode == TraceMode::Nftables {
            bail!("--ipvs is IPVS mode, which traces iptables rules: drop --mode nftables");
        }
        if args.live {
            return parse_iptables(live_iptables(version)?, false);
        }
        let text = read_dump(args)?;
        if looks_like_json(&text) {
            bail!(
                "IPVS mode needs the node's iptables rules (`iptables-save`), but the rules \
                 are JSON"
            );
        }
        // IPVS mode's jumps, not iptables mode's.
        let mut rules = parse_iptables(text, false)?;
        if let Rules::Iptables(r, _, notes) = &mut rules {
            notes.extend(complete_ipvs_jumps(r));
        }
        return Ok(rules);
    }
    if !args.live {
        let text = read_dump(args)?;
        return match (looks_like_json(&text), args.mode) {
            (true, TraceMode::Iptables) => {
                bail!("--mode iptables needs an iptables-save dump, but the rules are JSON")
            }
            (true, _) => parse_nft(&text),
            (false, TraceMode::Nftables) => match nft_text_kind(&text) {
                Some(kind) => bail!(
                    "--mode nftables needs an `nft -j list ruleset` dump (JSON), but the rules \
                     are nftables text ({kind}): pass `nft -j list ruleset` output, or use \
                     `--live`"
                ),
                None => bail!("--mode nftables needs an `nft -j list ruleset` dump (JSON)"),
            },
            (false, _) => parse_iptables(text, true),
        };
    }
    match args.mode {
        TraceMode::Iptables | TraceMode::Ipvs | TraceMode::Userspace => {
            parse_iptables(live_iptables(version)?, false)
        }
        TraceMode::Nftables => Ok(Rules::Nftables(live_nft()?)),
        TraceMode::Auto => match live_nft() {
            Ok(nft) if nft.has_kube_proxy() => {
                let ipt = live_iptables(version).unwrap_or_default();
                if ipt.contains(":KUBE-SERVICES") {
                    eprintln!(
                        "note: tracing nftables rules (this node has kube-proxy's nftables \
                         table); it also has iptables KUBE-SERVICES rules: --mode iptables \
                         traces those"
                    );
                }
                Ok(Rules::Nftables(nft))
            }
            _ => parse_iptables(live_iptables(version)?, false),
        },
    }
}

/// Runs `trace`.
///
/// # Errors
/// Unreadable or unparsable rules, inconsistent addresses, a missing --src for a pod.
pub fn run(args: TraceArgs) -> anyhow::Result<()> {
    let version = match args.dst {
        IpAddr::V4(_) => IpVersion::V4,
        IpAddr::V6(_) => IpVersion::V6,
    };
    check_mode_flags(&args)?;
    let rules = load_rules(&args, version)?;
    let nft = matches!(rules, Rules::Nftables(_));
    let ipvs = if nft || userspace_asked(&args) {
        None
    } else {
        load_ipvs(&args, args.mode == TraceMode::Auto)?
    };
    let userspace = if nft || ipvs.is_some() {
        None
    } else {
        load_userspace(&args, &rules)?
    };
    if userspace.is_some() && args.live && args.mode == TraceMode::Auto {
        eprintln!(
            "note: tracing userspace mode (this node's rules have the KUBE-PORTALS chains and \
             its proxy's table was read from {LIVE_USERSPACE_URL}); --mode iptables traces its \
             iptables rules alone"
        );
    }
    let mut userspace_notes = Vec::new();
    if let Rules::Iptables(r, _, _) = &rules
        && userspace.is_none()
        && ipvs.is_none()
        && !args.live
        && has_portal_chains(r)
    {
        userspace_notes.push(format!(
            "these are kube-proxy's userspace mode's rules (KUBE-PORTALS chains): they send \
             Service traffic to the proxy's own listeners; pass --userspace FILE, the proxy's \
             table (on the node: curl {LIVE_USERSPACE_URL} > table.txt), to follow the proxy to \
             the endpoints"
        ));
    }
    if ipvs.is_some() && args.live && args.mode == TraceMode::Auto {
        eprintln!(
            "note: tracing IPVS mode (this node has IPVS virtual servers); --mode iptables \
             traces its iptables rules alone"
        );
    }

    let mut local: Vec<IpAddr> = args.node_ip.clone();
    if args.live {
        local.extend(
            RealHost
                .local_addresses()
                .context("reading this node's addresses")?,
        );
    }
    // Without --node-ip or --live the node's addresses are unknown: NodePort-style
    // `addrtype --dst-type LOCAL` / `fib daddr type local` tests are then unknown.
    let incomplete = local.is_empty();
    if let (Some(_), Rules::Iptables(r, _, _), false) = (&userspace, &rules, args.live) {
        // Userspace mode DNATs the node's own packets for a Service to the node's primary
        // address.
        let assumed: Vec<IpAddr> = portal_node_addresses(r)
            .into_iter()
            .filter(|ip| !ip.is_loopback() && !local.contains(ip))
            .collect();
        if !assumed.is_empty() {
            let list: Vec<String> = assumed.iter().map(ToString::to_string).collect();
            userspace_notes.push(format!(
                "took {} as local addresses of the node: userspace mode's KUBE-PORTALS-HOST and \
                 KUBE-NODEPORT-HOST rules DNAT the node's own packets to its primary address",
                list.join(", ")
            ));
            local.extend(assumed);
        }
    }
    let mut host = Host::new(local.iter().copied());
    host.local_addrs_incomplete = incomplete;
    host.route_localnet = match (args.route_localnet, args.live) {
        (Some(v), _) => v,
        (None, true) => {
            RealHost
                .get_sysctl("net/ipv4/conf/all/route_localnet")
                .as_deref()
                == Some("1")
        }
        (None, false) => match &rules {
            Rules::Iptables(_, text, _) => text.contains(LOCALNET_GUARD),
            // kube-proxy's nftables mode has no localhost NodePorts.
            Rules::Nftables(_) => false,
        },
    };
    let ipsets = match (&args.ipsets, args.live && !nft) {
        (Some(p), _) => {
            Some(std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?)
        }
        (None, true) => std::process::Command::new("ipset")
            .arg("save")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned()),
        (None, false) => None,
    };
    if let Some(text) = ipsets {
        host.load_ipset_save(&text)
            .map_err(|e| anyhow!("ipsets: {e}"))?;
    }
    let mut ipvs_notes = Vec::new();
    if let Some(table) = &ipvs {
        if ipsets_missing(&host) {
            ipvs_notes.push(
                "IPVS mode without the ipsets (pass --ipsets FILE, `ipset save` output): \
                 the rules' -m set matches are unknown"
                    .to_string(),
            );
        }
        if !args.live {
            // kube-proxy binds every Service IP to kube-ipvs0 (KUBE-IPVS-IPS lists them),
            // and a NodePort's virtual servers use node addresses.
            let mut assumed: Vec<IpAddr> = Vec::new();
            let mut consider = |ip: IpAddr, host: &mut Host| {
                if !host.is_local(ip) {
                    host.local_addrs.push(ip);
                    assumed.push(ip);
                }
            };
            for ip in table.addresses() {
                consider(ip, &mut host);
            }
            for name in ["KUBE-IPVS-IPS", "KUBE-6-IPVS-IPS"] {
                let members: Vec<IpAddr> = host
                    .ipsets
                    .get(name)
                    .map(|s| {
                        s.members
                            .iter()
                            .filter(|m| {
                                m.nets.len() == 1
                                    && !m.nomatch
                                    && m.nets[0] == kp_netfilter::Cidr::host(m.nets[0].addr())
                            })
                            .map(|m| m.nets[0].addr())
                            .collect()
                    })
                    .unwrap_or_default();
                for ip in members {
                    consider(ip, &mut host);
                }
            }
            if !assumed.is_empty() {
                let list: Vec<String> = assumed.iter().map(ToString::to_string).collect();
                ipvs_notes.push(format!(
                    "took {} as local addresses of the node: they are IPVS virtual server \
                     addresses or in KUBE-IPVS-IPS (kube-proxy binds Service IPs to \
                     kube-ipvs0)",
                    list.join(", ")
                ));
            }
            host.local_addrs_incomplete = args.node_ip.is_empty();
        }
    }

    let same_family = |ip: &IpAddr| ip.is_ipv4() == args.dst.is_ipv4();
    let src = match (args.src, args.from) {
        (Some(s), _) => s,
        (None, TraceFrom::Pod) => bail!("--from pod needs --src (the pod's IP address)"),
        (None, TraceFrom::External) => {
            if args.dst.is_ipv4() {
                "203.0.113.1".parse()?
            } else {
                "2001:db8::1".parse()?
            }
        }
        (None, TraceFrom::Node) => {
            let node = local
                .iter()
                .copied()
                .find(|ip| same_family(ip) && !ip.is_loopback());
            match node {
                Some(ip) => ip,
                // A process talking to a loopback address uses a loopback source.
                None if args.dst.is_loopback() => {
                    if args.dst.is_ipv4() {
                        "127.0.0.1".parse()?
                    } else {
                        "::1".parse()?
                    }
                }
                None => bail!(
                    "--from node needs the node's address as the packet's source: pass \
                     --node-ip (or --src)"
                ),
            }
        }
    };
    if !same_family(&src) {
        bail!(
            "--src {src} and --dst {} are of different IP families",
            args.dst
        );
    }
    let entry = match args.from {
        TraceFrom::Pod => Entry::Pod {
            iface: args.iface.clone(),
        },
        TraceFrom::External => Entry::External {
            iface: args.iface.clone().or_else(|| Some("eth0".to_string())),
        },
        TraceFrom::Node => Entry::Node,
    };
    let packet = match args.proto {
        TraceProto::Icmp => {
            if args.dport.is_some() {
                bail!("--dport is for tcp, udp and sctp: an icmp echo (ping) has no ports");
            }
            Packet::ping(src, args.dst, entry)
        }
        proto => {
            let dport = args
                .dport
                .ok_or_else(|| anyhow!("--dport is required for {proto:?}"))?;
            let mut p = Packet::tcp(src, args.sport, args.dst, dport, entry);
            p.proto = match proto {
                TraceProto::Udp => kp_trace::Proto::Udp,
                TraceProto::Sctp => kp_trace::Proto::Sctp,
                _ => kp_trace::Proto::Tcp,
            };
            p
        }
    };
    let mut result = match (&rules, &ipvs, &userspace) {
        (Rules::Iptables(r, _, _), Some(t), _) => trace_ipvs(r, t, &host, &packet),
        (Rules::Iptables(r, _, _), None, Some(t)) => trace_userspace(r, t, &host, &packet),
        (Rules::Iptables(r, _, _), None, None) => trace(r, &host, &packet),
        (Rules::Nftables(r), _, _) => trace_nft(r, &host, &packet),
    }
    .map_err(|e| anyhow!("{e}"))?;
    result.notes.splice(0..0, userspace_notes);
    result.notes.splice(0..0, ipvs_notes);
    if let Rules::Iptables(_, _, notes) = &rules {
        result.notes.splice(0..0, notes.iter().cloned());
    }
    if args.json {
        println!("{}", result.to_json().map_err(|e| anyhow!("{e}"))?);
    } else {
        let text = render_text(&result, &packet);
        print!("{text}");
        if !text.ends_with('\n') {
            println!();
        }
    }
    Ok(())
}

/// Whether none of IPVS mode's ipsets was given.
fn ipsets_missing(host: &Host) -> bool {
    !host
        .ipsets
        .keys()
        .any(|n| n.starts_with("KUBE-") && n.ends_with("CLUSTER-IP"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proxy_table_of_a_whole_dry_run_is_found_per_family() {
        let dry = format!(
            "# IPv4{DRY_RUN_TABLE_HEADER}\n{}\nTCP 0.0.0.0:36000 default/web internal none 10.0.0.4:80\n\
             # IPv6{DRY_RUN_TABLE_HEADER}\n{}\nTCP [::]:36000 default/web6 internal none -\n\
             # IPv4: iptables-restore input\n*filter\nCOMMIT\n",
            kp_trace::userspace::USERSPACE_TABLE_HEADER,
            kp_trace::userspace::USERSPACE_TABLE_HEADER
        );
        let v4 = UserspaceTable::parse(&dry_run_table(&dry, "IPv4").unwrap()).unwrap();
        assert_eq!(v4.listeners.len(), 1);
        assert_eq!(v4.listeners[0].service, "default/web");
        let v6 = UserspaceTable::parse(&dry_run_table(&dry, "IPv6").unwrap()).unwrap();
        assert_eq!(v6.listeners[0].service, "default/web6");
        assert!(dry_run_table("TCP 0.0.0.0:1 a/b internal none -\n", "IPv4").is_none());
    }
}
