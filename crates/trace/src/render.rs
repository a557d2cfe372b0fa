//! [`render_text`]: the human-readable explanation of a [`Trace`].

use std::fmt::Write as _;

use crate::packet::endpoint;
use crate::result::{Delivery, Effect, Mode, Outcome, Step, Trace, Verdict};
use crate::{Entry, Packet};

/// Renders `trace` (of `packet`) for an operator: a header line, the steps every branch
/// shares (one per line: table, chain, the rule as `iptables-save` prints it — or in
/// `nft` syntax for nftables — and what it did), then one line per branch (probability,
/// the chain that DNATed it, the new destination, where it goes, whether it is
/// masqueraded, the verdict), then anything unknown and the notes. A packet from the node
/// that leaves it is "sent out" (not "forwarded").
///
/// ```text
/// packet tcp 192.168.56.100:40000 -> 10.96.138.71:8080 from external (PREROUTING)
/// nat PREROUTING  -A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
/// ...
///    50.0%  -> KUBE-SEP-GS5MQAG4332XHLUZ  DNAT 10.0.0.4:80  forwarded, masqueraded, filter ACCEPT
/// ```
///
/// In IPVS mode the branch names the virtual server that picked the real server:
///
/// ```text
///    50.0%  -> IPVS TCP 10.96.0.10:80  DNAT 10.0.1.4:8080  forwarded, masqueraded, filter ACCEPT
/// ```
///
/// In userspace mode a branch the proxy relays names its listener and the endpoint it
/// connects to (a REDIRECT shows as a DNAT to the local address):
///
/// ```text
///    50.0%  -> userspace proxy TCP 0.0.0.0:36001  connects to 10.0.1.4:80  proxied, masqueraded, filter ACCEPT
///   100.0%  -> KUBE-PORTALS-CONTAINER  DNAT 192.168.56.10:36001  rejected, not masqueraded, REJECT tcp-reset by userspace proxy TCP 0.0.0.0:36001 (no endpoints)
/// ```
///
/// For nftables the hooks are named as `nft` names them and the tables by family and
/// name:
///
/// ```text
/// packet tcp 10.0.0.9:40000 -> 172.30.0.41:80 from a pod via veth1 (prerouting)
/// ip kube-proxy nat-prerouting  jump services
/// ip kube-proxy services  ip daddr . meta l4proto . th dport vmap @service-ips  (@service-ips: 172.30.0.41 . tcp . 80 : goto service-...)
/// ...
///    50.0%  -> endpoint-...__10.180.0.1/80  DNAT 10.180.0.1:80  forwarded, not masqueraded, accepted
/// ```
pub fn render_text(trace: &Trace, packet: &Packet) -> String {
    let mut out = String::new();
    let nft = trace.mode == Mode::Nftables;
    let (pre, output) = if nft {
        ("prerouting", "output")
    } else {
        ("PREROUTING", "OUTPUT")
    };
    let from = match &packet.entry {
        Entry::Pod { iface } => format!("from a pod{} ({pre})", via(iface.as_deref())),
        Entry::External { iface } => {
            format!("from external{} ({pre})", via(iface.as_deref()))
        }
        Entry::Node => format!("from the node ({output})"),
    };
    let _ = writeln!(
        out,
        "packet {} {} -> {} {from}",
        packet.proto,
        endpoint(packet.src, packet.sport),
        endpoint(packet.dst, packet.dport)
    );
    let prefix = common_prefix(&trace.outcomes);
    if let Some(first) = trace.outcomes.first() {
        let steps = &first.steps[..prefix];
        let mut i = 0;
        while i < steps.len() {
            let run = dispatch_run(&steps[i..]);
            if run >= 2 {
                let _ = writeln!(out, "{}", dispatch_line(&steps[i..i + run]));
                i += run;
            } else {
                let _ = writeln!(out, "{}", step_line(&steps[i]));
                i += 1;
            }
        }
    }
    for o in &trace.outcomes {
        let _ = writeln!(out, "{}", outcome_line(o, trace, packet));
    }
    let mut seen: Vec<&str> = Vec::new();
    for u in trace.outcomes.iter().flat_map(|o| &o.unknown) {
        if !seen.contains(&u.as_str()) {
            seen.push(u);
            let _ = writeln!(out, "unknown: {u}");
        }
    }
    for n in &trace.notes {
        let _ = writeln!(out, "note: {n}");
    }
    out
}

fn via(iface: Option<&str>) -> String {
    iface.map_or_else(String::new, |i| format!(" via {i}"))
}

/// How many leading steps all outcomes share.
fn common_prefix(outcomes: &[Outcome]) -> usize {
    let Some(first) = outcomes.first() else {
        return 0;
    };
    let mut n = first.steps.len();
    for o in &outcomes[1..] {
        n = n.min(
            first
                .steps
                .iter()
                .zip(&o.steps)
                .take_while(|(a, b)| a == b)
                .count(),
        );
    }
    n
}

/// Prefix of the chains of kube-proxy-rs's dispatch tree (`--iptables-dispatch tree`).
const TREE_CHAIN_PREFIX: &str = "KUBE-SVT-";

/// The tree chain a step's rule jumps or goes to, and the rule's matches.
fn tree_hop(s: &Step) -> Option<(&str, &str)> {
    if matches!(s.effect, Effect::Jump | Effect::Goto) {
        let body = s.rule_text.strip_prefix("-A ")?.split_once(' ')?.1;
        for verb in [" -j ", " -g "] {
            if let Some((matches, target)) = body.rsplit_once(verb)
                && target.starts_with(TREE_CHAIN_PREFIX)
            {
                return Some((matches, target));
            }
        }
    }
    None
}

/// How many steps from the start of `steps` descend the dispatch tree.
fn dispatch_run(steps: &[Step]) -> usize {
    steps.iter().take_while(|s| tree_hop(s).is_some()).count()
}

/// The descent through the dispatch tree on one line: the chain it starts in, each hop's
/// match and the leaf chain it ends in.
fn dispatch_line(run: &[Step]) -> String {
    let first = &run[0];
    let hops: Vec<&str> = run.iter().filter_map(tree_hop).map(|(m, _)| m).collect();
    let leaf = run.last().and_then(tree_hop).map_or("", |(_, t)| t);
    format!(
        "{} {}  dispatch tree, {} levels: {} -> {leaf}",
        first.table,
        first.chain,
        run.len(),
        hops.join(", ")
    )
}

fn step_line(s: &Step) -> String {
    let head = format!("{} {}", s.table, s.chain);
    match s.effect {
        Effect::Policy if s.rule_text.starts_with("policy ") => format!("{head}  {}", s.rule_text),
        Effect::Policy => format!("{head}  {} (policy)", s.rule_text),
        Effect::Return if s.rule_index.is_none() => format!("{head}  (no rule matched: return)"),
        // Userspace mode: the listener's table line names its protocol and address.
        _ if s.table == "userspace" => format!("userspace proxy  {}  ({})", s.rule_text, s.detail),
        _ if s.detail.is_empty() => format!("{head}  {}", s.rule_text),
        _ => format!("{head}  {}  ({})", s.rule_text, s.detail),
    }
}

fn outcome_line(o: &Outcome, trace: &Trace, packet: &Packet) -> String {
    let proxied = o
        .steps
        .iter()
        .rev()
        .find(|s| s.effect == Effect::Proxy && s.table == "userspace");
    let target = match (o.dnat, proxied) {
        (Some((ip, port)), Some(s)) => {
            format!(
                "-> userspace proxy {}  connects to {}",
                s.chain,
                endpoint(ip, port)
            )
        }
        (Some((ip, port)), None) if ip.is_unspecified() => {
            let chain = o
                .steps
                .iter()
                .rev()
                .find(|s| s.effect == Effect::Dnat)
                .map_or(String::new(), |s| s.chain.clone());
            let port = port.map_or_else(String::new, |p| format!(":{p}"));
            format!("-> {chain}  DNAT (incoming interface's address){port}")
        }
        (Some((ip, port)), None) => {
            let chain = o
                .steps
                .iter()
                .rev()
                .find(|s| s.effect == Effect::Dnat)
                .map_or(String::new(), |s| {
                    if s.table == "ipvs" {
                        format!("IPVS {}", s.chain)
                    } else {
                        s.chain.clone()
                    }
                });
            format!("-> {chain}  DNAT {}", endpoint(ip, port))
        }
        (None, _) => {
            let (ip, port) = trace.original_dst;
            format!("no DNAT ({} unchanged)", endpoint(ip, port))
        }
    };
    let masq = if o.masquerade {
        "masqueraded"
    } else {
        "not masqueraded"
    };
    let verdict = match &o.verdict {
        Verdict::Accept if trace.mode == Mode::Nftables => "accepted".to_string(),
        Verdict::Accept => "filter ACCEPT".to_string(),
        v => {
            let by = o
                .steps
                .iter()
                .rev()
                .find(|s| matches!(s.effect, Effect::Drop | Effect::Reject | Effect::Policy));
            match by {
                Some(s) if s.table == "ipvs" => {
                    format!("{v} by IPVS {} (no real server)", s.chain)
                }
                Some(s) if s.table == "userspace" => {
                    format!("{v} by userspace proxy {} (no endpoints)", s.chain)
                }
                Some(s) => format!("{} {v} in {}", s.table, s.chain),
                None => v.to_string(),
            }
        }
    };
    let flag = if o.uncertain { "  [uncertain]" } else { "" };
    // A locally generated packet is not forwarded: it is sent out of the node.
    // A REJECT answers the sender: say "rejected", not "dropped".
    // A relayed connection goes to the endpoint over the proxy's own connection.
    let delivery = match (o.delivery, &packet.entry, &o.verdict) {
        (Delivery::Forwarded, _, _) if proxied.is_some() => "proxied".to_string(),
        (Delivery::Local, _, _) if proxied.is_some() => "proxied to the node itself".to_string(),
        (Delivery::Forwarded, Entry::Node, _) => "sent out".to_string(),
        (Delivery::Dropped, _, Verdict::Reject(_)) => "rejected".to_string(),
        (d, _, _) => d.to_string(),
    };
    format!(
        "  {:5.1}%  {target}  {delivery}, {masq}, {verdict}{flag}",
        o.probability * 100.0,
    )
}
