//! Rendering: a [`Snapshot`] becomes the `filter` and `nat` rules of upstream kube-proxy's
//! iptables mode. Pure: no I/O, no clock.
//!
//! Rules are written as `iptables-restore` lines in the canonical order `iptables-save` prints
//! them (`-s`, `-d`, `-i`, `-p`, then matches, then the target), so what we send is what the
//! kernel gives back, modulo the probability of `-m statistic`, which is written with 10
//! decimals like upstream and printed back by `iptables-save` with 11.
//!
//! Layout (upstream's):
//! - nat `KUBE-SERVICES`: per ServicePortName a ClusterIP rule (to `KUBE-SVC-` or `KUBE-SVL-`),
//!   external IP and load-balancer IP rules (to `KUBE-EXT-` or `KUBE-FW-`), and last the jump
//!   to `KUBE-NODEPORTS` for local destinations.
//! - `KUBE-SVC-`/`KUBE-SVL-`: masquerade rule for off-cluster sources (or all sources with
//!   `--masquerade-all`), affinity checks, then one `-m statistic --probability 1/(n-i)` rule
//!   per endpoint, the last unconditional.
//! - `KUBE-SEP-`: hairpin masquerade (`-s <endpoint>`), affinity `--set`, DNAT.
//! - filter `KUBE-SERVICES`/`KUBE-EXTERNAL-SERVICES`: REJECT (no endpoints) or DROP (no local
//!   endpoints for a Local policy); `KUBE-FORWARD`: INVALID drop and mark/established accepts;
//!   `KUBE-FIREWALL`: the localnet drop guarding localhost NodePorts.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt::{self, Write as _};
use std::net::IpAddr;

use kp_model::{IpFamily, NamespacedName, ServicePortInfo, SessionAffinity, Snapshot};
use kp_track::categorize;

use super::names::{
    KUBE_EXTERNAL_SERVICES, KUBE_FIREWALL, KUBE_FORWARD, KUBE_MARK_MASQ, KUBE_NODEPORTS,
    KUBE_POSTROUTING, KUBE_PROXY_FIREWALL, KUBE_SERVICES, ServiceChains, endpoint_chain,
};
use crate::local::LocalMatch;

/// Above this many endpoints in total, per-endpoint comments are left out to shrink the
/// ruleset (upstream's "large cluster mode", same threshold).
pub const LARGE_CLUSTER_ENDPOINTS: usize = 1000;

/// The filter chains we own, in declaration order.
pub const FILTER_CHAINS: [&str; 5] = [
    KUBE_SERVICES,
    KUBE_EXTERNAL_SERVICES,
    KUBE_FORWARD,
    KUBE_NODEPORTS,
    KUBE_PROXY_FIREWALL,
];
/// The fixed nat chains we own, in declaration order.
pub const NAT_CHAINS: [&str; 4] = [
    KUBE_SERVICES,
    KUBE_NODEPORTS,
    KUBE_POSTROUTING,
    KUBE_MARK_MASQ,
];

/// Mode-wide settings of one render, already resolved for the snapshot's family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderConfig {
    /// `--masquerade-all`: masquerade every packet to a ClusterIP.
    pub masquerade_all: bool,
    /// The masquerade mark, `1 << --iptables-masquerade-bit` (default `0x4000`).
    pub masquerade_mark: u32,
    /// How pod traffic is recognised in this family, if at all.
    pub local: Option<LocalMatch>,
    /// Append `--random-fully` to MASQUERADE (iptables >= 1.6.2).
    pub random_fully: bool,
    /// Localhost NodePorts are served (IPv4, `--iptables-localhost-nodeports`, loopback
    /// within `--nodeport-addresses`): no `! -d 127.0.0.0/8` exclusion, and the
    /// `KUBE-FIREWALL` localnet drop is written.
    pub localhost_nodeports: bool,
    /// `None`: NodePorts on every local address (`-m addrtype --dst-type LOCAL`);
    /// `Some(ips)`: only on these addresses (`-d <ip>` each).
    pub nodeport_ips: Option<Vec<IpAddr>>,
    /// Write the `KUBE-FORWARD` INVALID drop (off when `nf_conntrack_tcp_be_liberal` is set).
    pub drop_invalid: bool,
    /// Write the `KUBE-FIREWALL` chain (IPv4 only, as upstream).
    pub kube_firewall: bool,
}

impl Default for RenderConfig {
    fn default() -> Self {
        RenderConfig {
            masquerade_all: false,
            masquerade_mark: 1 << 14,
            local: None,
            random_fully: true,
            localhost_nodeports: true,
            nodeport_ips: None,
            drop_invalid: true,
            kube_firewall: true,
        }
    }
}

/// The rules of one table: chains to declare (which flushes them under `--noflush`) and the
/// `-A` lines to write into them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableRules {
    /// Chain names, in declaration order.
    pub chains: Vec<String>,
    /// `-A …` lines, each ending in `\n`.
    pub rules: String,
    /// Number of lines in `rules`.
    pub rule_count: usize,
}

/// A rendered ruleset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rendered {
    /// The filter table.
    pub filter: TableRules,
    /// The nat table: fixed chains plus the per-Service chains that were written.
    pub nat: TableRules,
    /// Every per-Service and per-endpoint nat chain the ruleset uses, whether written in this
    /// render or skipped as unchanged; anything else with a service-chain prefix is stale.
    pub active_nat_chains: HashSet<String>,
    /// nat rules that would exist in the kernel after applying (written + skipped).
    pub nat_rules_total: usize,
    /// Services rendered (ServicePortNames).
    pub service_ports: usize,
    /// Endpoints in the snapshot.
    pub endpoints: usize,
    /// Whether per-endpoint comments were left out (large cluster mode).
    pub large_cluster: bool,
}

/// A line under construction; writing arguments in canonical order is the caller's job.
struct Line<'a> {
    out: &'a mut TableRules,
}

impl<'a> Line<'a> {
    fn new(out: &'a mut TableRules, chain: &str) -> Self {
        out.rules.push_str("-A ");
        out.rules.push_str(chain);
        Line { out }
    }

    fn arg(self, s: impl fmt::Display) -> Self {
        let _ = write!(self.out.rules, " {s}");
        self
    }

    fn comment(self, c: impl fmt::Display) -> Self {
        let _ = write!(self.out.rules, " -m comment --comment \"{c}\"");
        self
    }

    fn comment_if(self, on: bool, c: impl fmt::Display) -> Self {
        if on { self.comment(c) } else { self }
    }

    fn end(self, target: impl fmt::Display) {
        let _ = writeln!(self.out.rules, " -j {target}");
        self.out.rule_count += 1;
    }
}

/// An address with its host prefix length, as iptables-save prints it.
struct Host(IpAddr);

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            IpAddr::V4(ip) => write!(f, "{ip}/32"),
            IpAddr::V6(ip) => write!(f, "{ip}/128"),
        }
    }
}

/// `-m statistic` probability for picking endpoint `i` of `n` when the earlier ones were not
/// picked: `1/(n-i)`, printed with 10 decimals like upstream.
pub fn probability(n: usize, i: usize) -> String {
    format!("{:.10}", 1.0 / (n - i) as f64)
}

struct Ctx<'a> {
    cfg: &'a RenderConfig,
    family: IpFamily,
    mark: String,
    reject: &'static str,
    loopback: &'static str,
    comments: bool,
}

impl Ctx<'_> {
    /// `! -s CIDR` / `-s CIDR` part of a local match (goes before `-d`).
    fn src_part(&self, negate: bool) -> String {
        match &self.cfg.local {
            Some(LocalMatch::Source(net)) => {
                if negate {
                    format!(" ! -s {net}")
                } else {
                    format!(" -s {net}")
                }
            }
            _ => String::new(),
        }
    }

    /// `! -i IF` / `-i IF` part of a local match (goes after `-d`).
    fn iface_part(&self, negate: bool) -> String {
        match &self.cfg.local {
            Some(LocalMatch::Interface(name)) => {
                if negate {
                    format!(" ! -i {name}")
                } else {
                    format!(" -i {name}")
                }
            }
            _ => String::new(),
        }
    }
}

/// Renders `snap`. Per-Service nat chains are written for every Service when `only` is
/// `None` (a full sync), else only for the Services in `only` (a partial sync); the fixed
/// chains and the filter table are always written in full.
pub fn render(
    snap: &Snapshot,
    cfg: &RenderConfig,
    only: Option<&BTreeSet<NamespacedName>>,
) -> Rendered {
    let total_endpoints: usize = snap
        .services
        .keys()
        .map(|spn| snap.endpoints_of(spn).len())
        .sum();
    let large_cluster = total_endpoints > LARGE_CLUSTER_ENDPOINTS;
    let ctx = Ctx {
        cfg,
        family: snap.family,
        mark: format!("{:#x}", cfg.masquerade_mark),
        reject: match snap.family {
            IpFamily::V4 => "REJECT --reject-with icmp-port-unreachable",
            IpFamily::V6 => "REJECT --reject-with icmp6-port-unreachable",
        },
        loopback: match snap.family {
            IpFamily::V4 => "127.0.0.0/8",
            IpFamily::V6 => "::1/128",
        },
        comments: !large_cluster,
    };
    let mut out = Rendered {
        service_ports: snap.services.len(),
        endpoints: total_endpoints,
        large_cluster,
        ..Rendered::default()
    };
    let mut filter = TableRules {
        chains: FILTER_CHAINS.iter().map(|c| c.to_string()).collect(),
        ..TableRules::default()
    };
    if cfg.kube_firewall {
        filter.chains.push(KUBE_FIREWALL.to_string());
    }
    let mut nat = TableRules {
        chains: NAT_CHAINS.iter().map(|c| c.to_string()).collect(),
        ..TableRules::default()
    };
    // Per-Service chains go to a separate buffer so that KUBE-SERVICES lines come first,
    // then the chains in Service order (easier to read, like upstream's output).
    let mut svc_nat = TableRules::default();
    let mut skipped = TableRules::default();

    write_fixed_nat(&ctx, &mut nat);
    if cfg.kube_firewall && cfg.localhost_nodeports {
        Line::new(&mut filter, KUBE_FIREWALL)
            .arg("! -s 127.0.0.0/8 -d 127.0.0.0/8")
            .comment("block incoming localnet connections")
            .arg("-m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT")
            .end("DROP");
    }

    for (spn, svc) in &snap.services {
        let write = only.is_none_or(|set| set.contains(&spn.service));
        let chains_out = if write { &mut svc_nat } else { &mut skipped };
        write_service(
            &ctx,
            snap,
            svc,
            &mut nat,
            &mut filter,
            chains_out,
            &mut out.active_nat_chains,
        );
    }

    // The NodePort jump must be the last rule of KUBE-SERVICES.
    let np_comment = "kubernetes service nodeports; NOTE: this must be the last rule in this chain";
    match &cfg.nodeport_ips {
        None => {
            let mut l = Line::new(&mut nat, KUBE_SERVICES);
            if !(ctx.family == IpFamily::V4 && cfg.localhost_nodeports) {
                l = l.arg(format_args!("! -d {}", ctx.loopback));
            }
            l.comment(np_comment)
                .arg("-m addrtype --dst-type LOCAL")
                .end(KUBE_NODEPORTS);
        }
        Some(ips) => {
            for ip in ips {
                if ip.is_loopback() && !(ctx.family == IpFamily::V4 && cfg.localhost_nodeports) {
                    continue;
                }
                Line::new(&mut nat, KUBE_SERVICES)
                    .arg(format_args!("-d {}", Host(*ip)))
                    .comment(np_comment)
                    .end(KUBE_NODEPORTS);
            }
        }
    }

    if cfg.drop_invalid {
        Line::new(&mut filter, KUBE_FORWARD)
            .arg("-m conntrack --ctstate INVALID")
            .end("DROP");
    }
    Line::new(&mut filter, KUBE_FORWARD)
        .comment("kubernetes forwarding rules")
        .arg(format_args!("-m mark --mark {m}/{m}", m = ctx.mark))
        .end("ACCEPT");
    Line::new(&mut filter, KUBE_FORWARD)
        .comment("kubernetes forwarding conntrack rule")
        .arg("-m conntrack --ctstate RELATED,ESTABLISHED")
        .end("ACCEPT");

    nat.chains.extend(svc_nat.chains);
    nat.rules.push_str(&svc_nat.rules);
    nat.rule_count += svc_nat.rule_count;
    out.nat_rules_total = nat.rule_count + skipped.rule_count;
    out.filter = filter;
    out.nat = nat;
    out
}

fn write_fixed_nat(ctx: &Ctx<'_>, nat: &mut TableRules) {
    let m = &ctx.mark;
    Line::new(nat, KUBE_POSTROUTING)
        .arg(format_args!("-m mark ! --mark {m}/{m}"))
        .end("RETURN");
    Line::new(nat, KUBE_POSTROUTING).end(format_args!("MARK --set-xmark {m}/0x0"));
    Line::new(nat, KUBE_POSTROUTING)
        .comment("kubernetes service traffic requiring SNAT")
        .end(if ctx.cfg.random_fully {
            "MASQUERADE --random-fully"
        } else {
            "MASQUERADE"
        });
    Line::new(nat, KUBE_MARK_MASQ).end(format_args!("MARK --set-xmark {m}/{m}"));
}

#[allow(clippy::too_many_arguments)]
fn write_service(
    ctx: &Ctx<'_>,
    snap: &Snapshot,
    svc: &ServicePortInfo,
    nat: &mut TableRules,
    filter: &mut TableRules,
    chains_out: &mut TableRules,
    active: &mut HashSet<String>,
) {
    let spn = &svc.name;
    let proto = spn.protocol.as_lower();
    let names = ServiceChains::new(spn);
    let eps = categorize(
        svc,
        snap.endpoints_of(spn),
        &snap.node_name,
        &snap.node_labels,
    );

    let uses_cluster_chain = !eps.cluster.is_empty() && svc.uses_cluster_endpoints();
    let uses_local_chain = !eps.local.is_empty() && svc.uses_local_endpoints();

    let mut internal_chain = names.svc.as_str();
    let mut has_internal = eps.has_any;
    if svc.internal_policy_local {
        internal_chain = names.svl.as_str();
        has_internal &= !eps.local.is_empty();
    }
    let mut external_policy_chain = names.svc.as_str();
    let mut has_external = eps.has_any;
    if svc.external_policy_local {
        external_policy_chain = names.svl.as_str();
        has_external &= !eps.local.is_empty();
    }
    let uses_ext_chain = eps.has_any && svc.externally_accessible();
    let uses_fw_chain = eps.has_any
        && !svc.load_balancer_vips.is_empty()
        && !svc.load_balancer_source_ranges.is_empty();
    let lb_chain = if uses_fw_chain {
        names.fw.as_str()
    } else {
        names.ext.as_str()
    };

    // What filter rules say when traffic has nowhere to go.
    let (internal_filter, external_filter, filter_comment) = if !eps.has_any {
        (ctx.reject, ctx.reject, format!("{spn} has no endpoints"))
    } else {
        ("DROP", "DROP", format!("{spn} has no local endpoints"))
    };

    // ClusterIP.
    let cip = Host(svc.cluster_ip);
    if has_internal {
        Line::new(nat, KUBE_SERVICES)
            .arg(format_args!("-d {cip} -p {proto}"))
            .comment(format_args!("{spn} cluster IP"))
            .arg(format_args!("-m {proto} --dport {}", svc.port))
            .end(internal_chain);
    } else {
        Line::new(filter, KUBE_SERVICES)
            .arg(format_args!("-d {cip} -p {proto}"))
            .comment(&filter_comment)
            .arg(format_args!("-m {proto} --dport {}", svc.port))
            .end(internal_filter);
    }

    // External IPs.
    for ip in &svc.external_ips {
        if eps.has_any {
            Line::new(nat, KUBE_SERVICES)
                .arg(format_args!("-d {} -p {proto}", Host(*ip)))
                .comment(format_args!("{spn} external IP"))
                .arg(format_args!("-m {proto} --dport {}", svc.port))
                .end(&names.ext);
        }
        if !has_external {
            Line::new(filter, KUBE_EXTERNAL_SERVICES)
                .arg(format_args!("-d {} -p {proto}", Host(*ip)))
                .comment(&filter_comment)
                .arg(format_args!("-m {proto} --dport {}", svc.port))
                .end(external_filter);
        }
    }

    // Load-balancer IPs.
    for ip in &svc.load_balancer_vips {
        if eps.has_any {
            Line::new(nat, KUBE_SERVICES)
                .arg(format_args!("-d {} -p {proto}", Host(*ip)))
                .comment(format_args!("{spn} loadbalancer IP"))
                .arg(format_args!("-m {proto} --dport {}", svc.port))
                .end(lb_chain);
        }
        if uses_fw_chain {
            Line::new(filter, KUBE_PROXY_FIREWALL)
                .arg(format_args!("-d {} -p {proto}", Host(*ip)))
                .comment(format_args!("{spn} traffic not accepted by {}", names.fw))
                .arg(format_args!("-m {proto} --dport {}", svc.port))
                .end("DROP");
        }
    }
    if !has_external {
        for ip in &svc.load_balancer_vips {
            Line::new(filter, KUBE_EXTERNAL_SERVICES)
                .arg(format_args!("-d {} -p {proto}", Host(*ip)))
                .comment(&filter_comment)
                .arg(format_args!("-m {proto} --dport {}", svc.port))
                .end(external_filter);
        }
    }

    // NodePort.
    if let Some(node_port) = svc.node_port {
        if eps.has_any {
            Line::new(nat, KUBE_NODEPORTS)
                .arg(format_args!("-p {proto}"))
                .comment(spn)
                .arg(format_args!("-m {proto} --dport {node_port}"))
                .end(&names.ext);
        }
        if !has_external {
            Line::new(filter, KUBE_EXTERNAL_SERVICES)
                .arg(format_args!("-p {proto}"))
                .comment(&filter_comment)
                .arg(format_args!(
                    "-m addrtype --dst-type LOCAL -m {proto} --dport {node_port}"
                ))
                .end(external_filter);
        }
    }

    // Health check NodePort.
    if let Some(hc) = svc.health_check_node_port {
        Line::new(filter, KUBE_NODEPORTS)
            .arg("-p tcp")
            .comment(format_args!("{spn} health check node port"))
            .arg(format_args!("-m tcp --dport {hc}"))
            .end("ACCEPT");
    }

    // From here on: per-Service chains (skippable in partial syncs).
    let nat = chains_out;
    if has_internal {
        if ctx.cfg.masquerade_all {
            Line::new(nat, internal_chain)
                .arg(format_args!("-d {cip} -p {proto}"))
                .comment(format_args!("{spn} cluster IP"))
                .arg(format_args!("-m {proto} --dport {}", svc.port))
                .end(KUBE_MARK_MASQ);
        } else if ctx.cfg.local.is_some() {
            let _ = write!(nat.rules, "-A {internal_chain}{}", ctx.src_part(true));
            let _ = write!(nat.rules, " -d {cip}{} -p {proto}", ctx.iface_part(true));
            Line { out: nat }
                .comment(format_args!("{spn} cluster IP"))
                .arg(format_args!("-m {proto} --dport {}", svc.port))
                .end(KUBE_MARK_MASQ);
        }
    }

    if uses_ext_chain {
        nat.chains.push(names.ext.clone());
        active.insert(names.ext.clone());
        if !svc.external_policy_local {
            Line::new(nat, &names.ext)
                .comment(format_args!(
                    "masquerade traffic for {spn} external destinations"
                ))
                .end(KUBE_MARK_MASQ);
        } else {
            if ctx.cfg.local.is_some() {
                let _ = write!(
                    nat.rules,
                    "-A {}{}{}",
                    names.ext,
                    ctx.src_part(false),
                    ctx.iface_part(false)
                );
                Line { out: nat }
                    .comment(format_args!("pod traffic for {spn} external destinations"))
                    .end(&names.svc);
            }
            Line::new(nat, &names.ext)
                .comment(format_args!(
                    "masquerade LOCAL traffic for {spn} external destinations"
                ))
                .arg("-m addrtype --src-type LOCAL")
                .end(KUBE_MARK_MASQ);
            Line::new(nat, &names.ext)
                .comment(format_args!(
                    "route LOCAL traffic for {spn} external destinations"
                ))
                .arg("-m addrtype --src-type LOCAL")
                .end(&names.svc);
        }
        if has_external {
            Line::new(nat, &names.ext).end(external_policy_chain);
        }
    }

    if uses_fw_chain {
        nat.chains.push(names.fw.clone());
        active.insert(names.fw.clone());
        let comment = format!("{spn} loadbalancer IP");
        let mut allow_from_node = false;
        for range in &svc.load_balancer_source_ranges {
            Line::new(nat, &names.fw)
                .arg(format_args!("-s {range}"))
                .comment(&comment)
                .end(&names.ext);
            allow_from_node |= snap.node_ips.iter().any(|ip| range.contains(ip));
        }
        if allow_from_node {
            for ip in &svc.load_balancer_vips {
                Line::new(nat, &names.fw)
                    .arg(format_args!("-s {}", Host(*ip)))
                    .comment(&comment)
                    .end(&names.ext);
            }
        }
        // The last rule only counts: it has no target, so nothing happens and the packet
        // falls through to the KUBE-PROXY-FIREWALL drop.
        let _ = writeln!(
            nat.rules,
            "-A {} -m comment --comment \"other traffic to {spn} will be dropped by KUBE-PROXY-FIREWALL\"",
            names.fw
        );
        nat.rule_count += 1;
    }

    let affinity = match svc.session_affinity {
        SessionAffinity::ClientIp { timeout_seconds } => Some(timeout_seconds),
        SessionAffinity::None => None,
    };
    // Endpoint chain names, computed once per endpoint; the categorized lists borrow from the
    // snapshot, so an endpoint is identified by its address in memory.
    let sep_names: Vec<(&kp_model::Endpoint, String)> = eps
        .all_reachable
        .iter()
        .map(|e| (*e, endpoint_chain(spn, e)))
        .collect();
    let sep_index: HashMap<usize, usize> = sep_names
        .iter()
        .enumerate()
        .map(|(i, (e, _))| (*e as *const kp_model::Endpoint as usize, i))
        .collect();
    let sep_of = |e: &kp_model::Endpoint| -> &str {
        sep_index
            .get(&(e as *const kp_model::Endpoint as usize))
            .map(|i| sep_names[*i].1.as_str())
            .unwrap_or_default()
    };

    for (used, chain, list) in [
        (uses_cluster_chain, &names.svc, &eps.cluster),
        (uses_local_chain, &names.svl, &eps.local),
    ] {
        if !used {
            continue;
        }
        nat.chains.push(chain.clone());
        active.insert(chain.clone());
        if let Some(timeout) = affinity {
            for ep in list.iter() {
                let sep = sep_of(ep);
                Line::new(nat, chain)
                    .comment_if(ctx.comments, format_args!("{spn} -> {ep}"))
                    .arg(format_args!(
                        "-m recent --rcheck --seconds {timeout} --reap --name {sep} --mask {} --rsource",
                        mask(ctx.family)
                    ))
                    .end(sep);
            }
        }
        let n = list.len();
        for (i, ep) in list.iter().enumerate() {
            let mut l =
                Line::new(nat, chain).comment_if(ctx.comments, format_args!("{spn} -> {ep}"));
            if i + 1 < n {
                l = l.arg(format_args!(
                    "-m statistic --mode random --probability {}",
                    probability(n, i)
                ));
            }
            l.end(sep_of(ep));
        }
    }

    for (ep, sep) in &sep_names {
        nat.chains.push(sep.clone());
        active.insert(sep.clone());
        Line::new(nat, sep)
            .arg(format_args!("-s {}", Host(ep.ip)))
            .comment_if(ctx.comments, spn)
            .end(KUBE_MARK_MASQ);
        let mut l = Line::new(nat, sep)
            .arg(format_args!("-p {proto}"))
            .comment_if(ctx.comments, spn);
        if affinity.is_some() {
            l = l.arg(format_args!(
                "-m recent --set --name {sep} --mask {} --rsource",
                mask(ctx.family)
            ));
        }
        l.arg(format_args!("-m {proto}"))
            .end(format_args!("DNAT --to-destination {ep}"));
    }
}

fn mask(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "255.255.255.255",
        IpFamily::V6 => "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
    }
}

#[cfg(test)]
mod tests;
