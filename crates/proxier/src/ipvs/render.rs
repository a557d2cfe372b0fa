//! Rendering for IPVS mode: a [`Snapshot`] becomes the desired kernel state, as a pure
//! function with no kernel access.
//!
//! The desired state has four parts, mirroring upstream kube-proxy's IPVS proxier:
//! - **virtual servers** ([`Rendered::virtual_servers`]): one per ClusterIP, externalIP and
//!   load-balancer IP port, and one per NodePort and node address; each with its real servers
//!   (masquerading, weight 1), the scheduler, and persistence for `sessionAffinity: ClientIP`;
//! - **addresses** bound to `kube-ipvs0` ([`Rendered::bind_addrs`]): every ClusterIP, and every
//!   externalIP and load-balancer IP not already on another interface of the node;
//! - **ipset entries** ([`Rendered::sets`]) of upstream's sets (see [`super::names`]);
//! - **iptables rules** ([`Rendered::filter_rules`], [`Rendered::nat_rules`]): a fixed handful
//!   that match the sets, in `iptables-save`'s canonical form. Their number does not grow with
//!   the number of Services: that is what makes IPVS mode's per-packet cost flat.
//!
//! Endpoint selection follows upstream's IPVS mode, which differs from iptables mode in one
//! place: traffic that would use only node-local endpoints (externalTrafficPolicy or
//! internalTrafficPolicy `Local`) falls back to the cluster-wide endpoints when this node has
//! none (kubernetes PR #97081), instead of dropping it. For a Service whose only traffic is
//! internal with policy Local, the cluster-wide list is empty, so its virtual server has no
//! real servers and connections get no answer.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use kp_model::{
    Endpoint, IpFamily, NamespacedName, Protocol, ServicePortInfo, ServicePortName,
    SessionAffinity, Snapshot,
};
use kp_track::categorize;

use super::names::{
    KUBE_FORWARD, KUBE_IPVS_FILTER, KUBE_IPVS_OUT_FILTER, KUBE_LOAD_BALANCER, KUBE_MARK_MASQ,
    KUBE_NODE_PORT, KUBE_POSTROUTING, KUBE_SERVICES, KUBE_SOURCE_RANGES_FIREWALL, KubeSet,
    SET_RULES,
};
use crate::LocalMatch;

/// Settings for one render, resolved against the node by the proxier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderConfig {
    /// `--ipvs-scheduler` (default `rr`).
    pub scheduler: String,
    /// `--masquerade-all`.
    pub masquerade_all: bool,
    /// The masquerade mark, `1 << --iptables-masquerade-bit`.
    pub masquerade_mark: u32,
    /// The local-traffic match of this family (`--detect-local-mode`), if any.
    pub local: Option<LocalMatch>,
    /// Append `--random-fully` to MASQUERADE (iptables >= 1.6.2).
    pub random_fully: bool,
    /// Node addresses that get a virtual server per NodePort: those `--nodeport-addresses`
    /// selects, without loopback and without kube-ipvs0's addresses. Sorted.
    pub nodeport_ips: Vec<IpAddr>,
    /// Addresses on interfaces other than kube-ipvs0: an externalIP or load-balancer IP
    /// among them is not bound to kube-ipvs0 (upstream does the same).
    pub other_addresses: BTreeSet<IpAddr>,
    /// The node's primary IP: a load-balancer IP whose source ranges contain it is reachable
    /// from the node (`KUBE-LOAD-BALANCER-SOURCE-IP`), otherwise node traffic to it is
    /// dropped (`KUBE-IPVS-OUT-FILTER`).
    pub node_ip: Option<IpAddr>,
}

impl Default for RenderConfig {
    fn default() -> Self {
        RenderConfig {
            scheduler: "rr".into(),
            masquerade_all: false,
            masquerade_mark: 0x4000,
            local: None,
            random_fully: true,
            nodeport_ips: Vec::new(),
            other_addresses: BTreeSet::new(),
            node_ip: None,
        }
    }
}

/// A virtual server's identity: address, protocol and port (what `ipvsadm` prints as
/// `TCP 10.96.0.1:443`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VsKey {
    /// The virtual address.
    pub addr: IpAddr,
    /// The protocol.
    pub protocol: Protocol,
    /// The virtual port.
    pub port: u16,
}

impl std::fmt::Display for VsKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}",
            self.protocol.as_api(),
            SocketAddr::new(self.addr, self.port)
        )
    }
}

/// The kind of address a virtual server serves, for logs and the tracer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum VsKind {
    /// The ClusterIP.
    ClusterIp,
    /// An externalIP.
    ExternalIp,
    /// A load-balancer ingress IP.
    LoadBalancer,
    /// A NodePort on one node address.
    NodePort,
}

/// One desired virtual server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtualServerSpec {
    /// The ServicePortName it serves.
    pub service: ServicePortName,
    /// What kind of address it is.
    pub kind: VsKind,
    /// `Some(seconds)` for `sessionAffinity: ClientIP`: a persistent virtual server with that
    /// timeout (upstream's `FlagPersistent`).
    pub persistent_timeout: Option<u32>,
    /// Real servers (`ip:port`), sorted; each masquerading with weight 1.
    pub real_servers: Vec<SocketAddr>,
}

/// The desired state of one family.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rendered {
    /// Every virtual server.
    pub virtual_servers: BTreeMap<VsKey, VirtualServerSpec>,
    /// Addresses bound to kube-ipvs0 (`/32` or `/128`).
    pub bind_addrs: BTreeSet<IpAddr>,
    /// Entries of each of upstream's sets (every set is present, maybe empty), in `ipset
    /// save`'s spelling.
    pub sets: BTreeMap<KubeSet, BTreeSet<String>>,
    /// filter rules (`-A CHAIN ...` lines, canonical form).
    pub filter_rules: String,
    /// nat rules (`-A CHAIN ...` lines, canonical form).
    pub nat_rules: String,
    /// ServicePortNames rendered.
    pub service_ports: usize,
    /// Endpoints in the snapshot.
    pub endpoints: usize,
    /// Services with internalTrafficPolicy Local and endpoints elsewhere but none here.
    pub no_local_internal: BTreeSet<NamespacedName>,
    /// Services with externalTrafficPolicy Local and endpoints elsewhere but none here.
    pub no_local_external: BTreeSet<NamespacedName>,
    /// Virtual servers that two Service ports both asked for: the first (in ServicePortName
    /// order) keeps it.
    pub conflicts: Vec<(VsKey, ServicePortName)>,
}

/// An ipset entry `ip,proto:port`.
fn ip_port(ip: IpAddr, proto: Protocol, port: u16) -> String {
    format!("{ip},{}:{port}", proto.as_lower())
}

/// The real servers of one virtual server: local endpoints when `local_only` and this node
/// has some, otherwise the cluster-wide ones (upstream's IPVS fallback).
fn real_servers(endpoints: &[&Endpoint], local: &[&Endpoint], local_only: bool) -> Vec<SocketAddr> {
    let chosen = if local_only && !local.is_empty() {
        local
    } else {
        endpoints
    };
    let mut out: Vec<SocketAddr> = chosen
        .iter()
        .map(|e| SocketAddr::new(e.ip, e.port))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Renders the desired IPVS-mode state of `snap`.
pub fn render(snap: &Snapshot, cfg: &RenderConfig) -> Rendered {
    let mut out = Rendered {
        sets: KubeSet::ALL.iter().map(|s| (*s, BTreeSet::new())).collect(),
        ..Rendered::default()
    };
    let mut lb_no_node_access: Vec<(IpAddr, Protocol, u16)> = Vec::new();
    for (name, svc) in &snap.services {
        out.service_ports += 1;
        let eps = snap.endpoints_of(name);
        out.endpoints += eps.len();
        render_service(snap, cfg, name, svc, eps, &mut out, &mut lb_no_node_access);
    }
    let family = snap.family;
    let bound: BTreeSet<String> = out.bind_addrs.iter().map(IpAddr::to_string).collect();
    out.sets.insert(KubeSet::IpvsIps, bound);
    out.filter_rules = filter_rules(family, cfg, &out.sets, &lb_no_node_access);
    out.nat_rules = nat_rules(family, cfg, &out.sets);
    out
}

fn set_insert(out: &mut Rendered, set: KubeSet, entry: String) {
    if let Some(s) = out.sets.get_mut(&set) {
        s.insert(entry);
    }
}

fn add_vs(out: &mut Rendered, key: VsKey, spec: VirtualServerSpec) -> bool {
    if let Some(existing) = out.virtual_servers.get(&key) {
        if existing.service != spec.service {
            out.conflicts.push((key, spec.service));
        }
        return false;
    }
    out.virtual_servers.insert(key, spec);
    true
}

/// An externalIP or load-balancer IP virtual server; its address is bound to kube-ipvs0
/// unless it is already on another interface of the node (upstream does the same).
fn add_external_vs(
    out: &mut Rendered,
    cfg: &RenderConfig,
    addr: IpAddr,
    protocol: Protocol,
    port: u16,
    spec: VirtualServerSpec,
) {
    let key = VsKey {
        addr,
        protocol,
        port,
    };
    if add_vs(out, key, spec) && !cfg.other_addresses.contains(&addr) {
        out.bind_addrs.insert(addr);
    }
}

#[allow(clippy::too_many_arguments)]
fn render_service(
    snap: &Snapshot,
    cfg: &RenderConfig,
    name: &ServicePortName,
    svc: &ServicePortInfo,
    eps: &[Endpoint],
    out: &mut Rendered,
    lb_no_node_access: &mut Vec<(IpAddr, Protocol, u16)>,
) {
    let proto = name.protocol;
    let cat = categorize(svc, eps, &snap.node_name, &snap.node_labels);
    let persistent_timeout = match svc.session_affinity {
        SessionAffinity::ClientIp { timeout_seconds } => Some(timeout_seconds),
        SessionAffinity::None => None,
    };
    // Hairpin: a local endpoint reaching itself through the Service is masqueraded.
    for e in eps.iter().filter(|e| e.is_local) {
        set_insert(
            out,
            KubeSet::LoopBack,
            format!("{},{}", ip_port(e.ip, proto, e.port), e.ip),
        );
    }
    let no_local = |local_only: bool| local_only && cat.local.is_empty() && cat.has_any;
    let spec = |kind: VsKind, local_only: bool| VirtualServerSpec {
        service: name.clone(),
        kind,
        persistent_timeout,
        real_servers: real_servers(&cat.cluster, &cat.local, local_only),
    };

    // ClusterIP.
    set_insert(
        out,
        KubeSet::ClusterIp,
        ip_port(svc.cluster_ip, proto, svc.port),
    );
    let key = VsKey {
        addr: svc.cluster_ip,
        protocol: proto,
        port: svc.port,
    };
    if add_vs(out, key, spec(VsKind::ClusterIp, svc.internal_policy_local)) {
        out.bind_addrs.insert(svc.cluster_ip);
    }
    if no_local(svc.internal_policy_local) {
        out.no_local_internal.insert(name.service.clone());
    }
    let ext_local = svc.external_policy_local;
    if svc.externally_accessible() && no_local(ext_local) {
        out.no_local_external.insert(name.service.clone());
    }

    // externalIPs.
    for &ip in &svc.external_ips {
        let set = if ext_local {
            KubeSet::ExternalIpLocal
        } else {
            KubeSet::ExternalIp
        };
        set_insert(out, set, ip_port(ip, proto, svc.port));
        add_external_vs(
            out,
            cfg,
            ip,
            proto,
            svc.port,
            spec(VsKind::ExternalIp, ext_local),
        );
    }

    // Load-balancer ingress IPs.
    for &ip in &svc.load_balancer_vips {
        let entry = ip_port(ip, proto, svc.port);
        set_insert(out, KubeSet::LoadBalancer, entry.clone());
        if ext_local {
            set_insert(out, KubeSet::LoadBalancerLocal, entry.clone());
        }
        if !svc.load_balancer_source_ranges.is_empty() {
            set_insert(out, KubeSet::LoadBalancerFw, entry.clone());
            let mut allow_from_node = false;
            for cidr in &svc.load_balancer_source_ranges {
                set_insert(
                    out,
                    KubeSet::LoadBalancerSourceCidr,
                    format!("{entry},{}", cidr.trunc()),
                );
                allow_from_node |= cfg.node_ip.is_some_and(|n| cidr.contains(&n));
            }
            if allow_from_node {
                set_insert(out, KubeSet::LoadBalancerSourceIp, format!("{entry},{ip}"));
            } else {
                lb_no_node_access.push((ip, proto, svc.port));
            }
        }
        add_external_vs(
            out,
            cfg,
            ip,
            proto,
            svc.port,
            spec(VsKind::LoadBalancer, ext_local),
        );
    }

    // NodePorts: one virtual server per node address.
    if let Some(node_port) = svc.node_port
        && !cfg.nodeport_ips.is_empty()
    {
        match proto {
            Protocol::Tcp | Protocol::Udp => {
                let (set, local_set) = if proto == Protocol::Tcp {
                    (KubeSet::NodePortTcp, KubeSet::NodePortLocalTcp)
                } else {
                    (KubeSet::NodePortUdp, KubeSet::NodePortLocalUdp)
                };
                set_insert(out, set, node_port.to_string());
                if ext_local {
                    set_insert(out, local_set, node_port.to_string());
                }
            }
            Protocol::Sctp => {
                for &ip in &cfg.nodeport_ips {
                    let entry = ip_port(ip, proto, node_port);
                    set_insert(out, KubeSet::NodePortSctp, entry.clone());
                    if ext_local {
                        set_insert(out, KubeSet::NodePortLocalSctp, entry);
                    }
                }
            }
        }
        for &ip in &cfg.nodeport_ips {
            let key = VsKey {
                addr: ip,
                protocol: proto,
                port: node_port,
            };
            add_vs(out, key, spec(VsKind::NodePort, ext_local));
        }
    }

    if let Some(hc) = svc.health_check_node_port {
        set_insert(out, KubeSet::HealthCheckNodePort, hc.to_string());
    }
}

/// `-A CHAIN [-p P] -m comment --comment "C" -m set --match-set NAME FLAGS`
fn set_match(
    out: &mut String,
    chain: &str,
    proto: Option<&str>,
    set: KubeSet,
    family: IpFamily,
    flags: &str,
) {
    let _ = write!(out, "-A {chain}");
    if let Some(p) = proto {
        let _ = write!(out, " -p {p}");
    }
    let _ = write!(
        out,
        " -m comment --comment \"{}\" -m set --match-set {} {flags}",
        set.comment(),
        set.name(family)
    );
}

fn nonempty(sets: &BTreeMap<KubeSet, BTreeSet<String>>, set: KubeSet) -> bool {
    sets.get(&set).is_some_and(|s| !s.is_empty())
}

/// The nat rules of IPVS mode, in upstream's order and `iptables-save`'s spelling.
fn nat_rules(
    family: IpFamily,
    cfg: &RenderConfig,
    sets: &BTreeMap<KubeSet, BTreeSet<String>>,
) -> String {
    let mut out = String::with_capacity(4096);
    let lo = match family {
        IpFamily::V4 => "127.0.0.0/8",
        IpFamily::V6 => "::1/128",
    };
    let _ = writeln!(out, "-A {KUBE_SERVICES} -s {lo} -j RETURN");
    for r in SET_RULES.iter().filter(|r| !r.filter) {
        if nonempty(sets, r.set) {
            set_match(&mut out, r.chain, r.protocol, r.set, family, r.match_type);
            let _ = writeln!(out, " -j {}", r.target);
        }
    }
    if nonempty(sets, KubeSet::ClusterIp) {
        let set = KubeSet::ClusterIp;
        let (pre, flags) = if cfg.masquerade_all {
            (String::new(), "dst,dst")
        } else {
            match &cfg.local {
                Some(LocalMatch::Source(net)) => (format!(" ! -s {net}"), "dst,dst"),
                Some(LocalMatch::Interface(name)) => (format!(" ! -i {name}"), "dst,dst"),
                None => (String::new(), "src,dst"),
            }
        };
        let _ = writeln!(
            out,
            "-A {KUBE_SERVICES}{pre} -m comment --comment \"{}\" -m set --match-set {} {flags} -j {KUBE_MARK_MASQ}",
            set.comment(),
            set.name(family)
        );
    }
    let external = |out: &mut String, set: KubeSet, masq: bool| {
        let head = || {
            let mut h = String::new();
            set_match(&mut h, KUBE_SERVICES, None, set, family, "dst,dst");
            h
        };
        if masq {
            let _ = writeln!(out, "{} -j {KUBE_MARK_MASQ}", head());
        }
        let _ = writeln!(
            out,
            "{} -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT",
            head()
        );
        let _ = writeln!(out, "{} -m addrtype --dst-type LOCAL -j ACCEPT", head());
    };
    if nonempty(sets, KubeSet::ExternalIp) {
        external(&mut out, KubeSet::ExternalIp, true);
    }
    if nonempty(sets, KubeSet::ExternalIpLocal) {
        external(&mut out, KubeSet::ExternalIpLocal, false);
    }
    let _ = writeln!(
        out,
        "-A {KUBE_SERVICES} -m addrtype --dst-type LOCAL -j {KUBE_NODE_PORT}"
    );
    let _ = writeln!(out, "-A {KUBE_LOAD_BALANCER} -j {KUBE_MARK_MASQ}");
    for set in [KubeSet::ClusterIp, KubeSet::LoadBalancer] {
        if nonempty(sets, set) {
            let _ = writeln!(
                out,
                "-A {KUBE_SERVICES} -m set --match-set {} dst,dst -j ACCEPT",
                set.name(family)
            );
        }
    }
    let m = format!("{:#x}", cfg.masquerade_mark);
    let _ = writeln!(
        out,
        "-A {KUBE_POSTROUTING} -m mark ! --mark {m}/{m} -j RETURN"
    );
    let _ = writeln!(out, "-A {KUBE_POSTROUTING} -j MARK --set-xmark {m}/0x0");
    let _ = writeln!(
        out,
        "-A {KUBE_POSTROUTING} -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE{}",
        if cfg.random_fully {
            " --random-fully"
        } else {
            ""
        }
    );
    let _ = writeln!(out, "-A {KUBE_MARK_MASQ} -j MARK --set-xmark {m}/{m}");
    out
}

/// The filter rules of IPVS mode, in upstream's order and `iptables-save`'s spelling.
fn filter_rules(
    family: IpFamily,
    cfg: &RenderConfig,
    sets: &BTreeMap<KubeSet, BTreeSet<String>>,
    lb_no_node_access: &[(IpAddr, Protocol, u16)],
) -> String {
    let mut out = String::with_capacity(4096);
    for r in SET_RULES.iter().filter(|r| r.filter) {
        if nonempty(sets, r.set) {
            set_match(&mut out, r.chain, r.protocol, r.set, family, r.match_type);
            let _ = writeln!(out, " -j {}", r.target);
        }
    }
    let _ = writeln!(out, "-A {KUBE_SOURCE_RANGES_FIREWALL} -j DROP");
    let host_prefix = match family {
        IpFamily::V4 => 32,
        IpFamily::V6 => 128,
    };
    // As `iptables-save` prints it: `--vproto` first, the address without its /32.
    for (ip, proto, port) in lb_no_node_access {
        let _ = writeln!(
            out,
            "-A {KUBE_IPVS_OUT_FILTER} -s {ip}/{host_prefix} -m ipvs --vproto {} --vaddr {ip} --vport {port} -j DROP",
            proto_number(*proto)
        );
    }
    let m = format!("{:#x}", cfg.masquerade_mark);
    let _ = writeln!(
        out,
        "-A {KUBE_FORWARD} -m comment --comment \"kubernetes forwarding rules\" -m mark --mark {m}/{m} -j ACCEPT"
    );
    let _ = writeln!(
        out,
        "-A {KUBE_FORWARD} -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
    );
    let hc = KubeSet::HealthCheckNodePort;
    let _ = writeln!(
        out,
        "-A {KUBE_NODE_PORT} -m comment --comment \"{}\" -m set --match-set {} dst -j ACCEPT",
        hc.comment(),
        hc.name(family)
    );
    for (set, flags) in [
        (KubeSet::LoadBalancer, "dst,dst"),
        (KubeSet::ClusterIp, "dst,dst"),
        (KubeSet::ExternalIp, "dst,dst"),
        (KubeSet::ExternalIpLocal, "dst,dst"),
        (KubeSet::HealthCheckNodePort, "dst"),
    ] {
        let _ = writeln!(
            out,
            "-A {KUBE_IPVS_FILTER} -m set --match-set {} {flags} -j RETURN",
            set.name(family)
        );
    }
    // Not upstream: let pings through, so a ClusterIP answers ping as the seeds describe
    // IPVS mode (upstream's REJECT below has refused them since 1.27, kubernetes/website
    // #41002). Only echo requests: no host port becomes reachable through a VIP.
    let _ = writeln!(
        out,
        "-A {KUBE_IPVS_FILTER} {} -j RETURN",
        match family {
            IpFamily::V4 => "-p icmp -m icmp --icmp-type 8",
            IpFamily::V6 => "-p ipv6-icmp -m icmp6 --icmpv6-type 128",
        }
    );
    let _ = writeln!(
        out,
        "-A {KUBE_IPVS_FILTER} -m conntrack --ctstate NEW -m set --match-set {} dst -j REJECT --reject-with {}",
        KubeSet::IpvsIps.name(family),
        match family {
            IpFamily::V4 => "icmp-port-unreachable",
            IpFamily::V6 => "icmp6-port-unreachable",
        }
    );
    out
}

/// The IP protocol number (`6`, `17`, `132`), as the kernel and `-m ipvs --vproto` print it.
pub fn proto_number(p: Protocol) -> u8 {
    match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

#[cfg(test)]
mod tests;
