//! Userspace mode's portal rules: a pure function from the snapshot and the relay's listening
//! ports to `iptables-restore` text.
//!
//! The layout is upstream's userspace proxier's (kube-proxy before 1.26), with the same chain
//! names and comments, so runbooks and `iptables-save` greps keep working:
//!
//! | table | chain | called from | what it holds |
//! |---|---|---|---|
//! | nat | `KUBE-PORTALS-CONTAINER` | `PREROUTING` (first) | ClusterIP, externalIP and LB-IP traffic of pods and other hosts: `REDIRECT --to-ports P` |
//! | nat | `KUBE-PORTALS-HOST` | `OUTPUT` (first) | the same for the node's own processes: `DNAT --to-destination NODE-IP:P` |
//! | nat | `KUBE-NODEPORT-CONTAINER` | `PREROUTING` (last, `addrtype LOCAL`) | NodePorts: `REDIRECT --to-ports P` |
//! | nat | `KUBE-NODEPORT-HOST` | `OUTPUT` (last, `addrtype LOCAL`) | NodePorts from the node: `DNAT --to-destination NODE-IP:P` |
//! | filter | `KUBE-NODEPORT-NON-LOCAL` | `INPUT` (first) | `ACCEPT` for the proxy ports behind NodePorts |
//!
//! `P` is the relay's listening port for the Service port. REDIRECT sends a packet to the
//! primary address of the interface it arrived on, which the wildcard listener accepts, and
//! conntrack turns the replies back into the Service address (UDP replies come from the
//! Service address, not the proxy's). In OUTPUT upstream DNATs to the node's address rather
//! than redirecting; so do we, and we REDIRECT (to the loopback address) only when the node
//! has no address of the family.
//!
//! Departures from upstream's userspace proxier, each in the direction of the other modes:
//! - the node's own connections to an externalIP or LB IP are sent to the proxy whether or
//!   not the address is local (upstream matched `addrtype --dst-type LOCAL` there), as in
//!   iptables mode;
//! - no `physdev` match (it needs `br_netfilter`);
//! - `loadBalancerSourceRanges` narrow the LB-IP portals to those sources (upstream's
//!   userspace mode ignored them); other sources are not proxied;
//! - a Service whose internal and external traffic use different endpoints
//!   (`externalTrafficPolicy: Local`, `internalTrafficPolicy: Local`) gets a second listener
//!   for its external destinations; pod traffic (`--detect-local-mode`) and the node's own
//!   traffic to those destinations still go to the ClusterIP's listener, as the kernel modes
//!   short-circuit them to the cluster-wide endpoints.

use std::fmt::Write;
use std::net::{IpAddr, SocketAddr};

use kp_model::{Protocol, ServicePortInfo, Snapshot};

use super::{Listener, Scope};
use crate::{LocalMatch, NodePortAddresses};

/// The nat chain for ClusterIP, externalIP and LB-IP traffic arriving from outside the node.
pub const KUBE_PORTALS_CONTAINER: &str = "KUBE-PORTALS-CONTAINER";
/// The nat chain for the same traffic from the node's own processes.
pub const KUBE_PORTALS_HOST: &str = "KUBE-PORTALS-HOST";
/// The nat chain for NodePort traffic arriving from outside the node.
pub const KUBE_NODEPORT_CONTAINER: &str = "KUBE-NODEPORT-CONTAINER";
/// The nat chain for NodePort traffic from the node's own processes.
pub const KUBE_NODEPORT_HOST: &str = "KUBE-NODEPORT-HOST";
/// The filter chain accepting the proxy ports behind NodePorts.
pub const KUBE_NODEPORT_NON_LOCAL: &str = "KUBE-NODEPORT-NON-LOCAL";

/// Userspace mode's nat chains.
pub const NAT_CHAINS: [&str; 4] = [
    KUBE_NODEPORT_CONTAINER,
    KUBE_NODEPORT_HOST,
    KUBE_PORTALS_CONTAINER,
    KUBE_PORTALS_HOST,
];
/// Userspace mode's filter chains.
pub const FILTER_CHAINS: [&str; 1] = [KUBE_NODEPORT_NON_LOCAL];

/// A jump from a built-in chain: `(table, chain, rule without "-A CHAIN", first)`; `first`
/// jumps are inserted at the top of the chain, the others appended (upstream: the NodePort
/// jumps "must be the last rule in the chain").
pub const JUMPS: [(&str, &str, &str, bool); 5] = [
    (
        "nat",
        "PREROUTING",
        "-m comment --comment \"handle ClusterIPs; NOTE: this must be before the NodePort rules\" -j KUBE-PORTALS-CONTAINER",
        true,
    ),
    (
        "nat",
        "OUTPUT",
        "-m comment --comment \"handle ClusterIPs; NOTE: this must be before the NodePort rules\" -j KUBE-PORTALS-HOST",
        true,
    ),
    (
        "nat",
        "PREROUTING",
        "-m addrtype --dst-type LOCAL -m comment --comment \"handle service NodePorts; NOTE: this must be the last rule in the chain\" -j KUBE-NODEPORT-CONTAINER",
        false,
    ),
    (
        "nat",
        "OUTPUT",
        "-m addrtype --dst-type LOCAL -m comment --comment \"handle service NodePorts; NOTE: this must be the last rule in the chain\" -j KUBE-NODEPORT-HOST",
        false,
    ),
    (
        "filter",
        "INPUT",
        "-m comment --comment \"Ensure that non-local NodePort traffic can flow\" -j KUBE-NODEPORT-NON-LOCAL",
        true,
    ),
];

/// The rules of one sync, without table headers: `-A` lines of our chains, in
/// `iptables-save` form.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rendered {
    /// Filter-table rules (`KUBE-NODEPORT-NON-LOCAL`).
    pub filter: String,
    /// Nat-table rules (the four portal chains).
    pub nat: String,
}

/// One listener with its port, as the relay reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Portal {
    /// What the listener serves.
    pub listener: Listener,
    /// Its listening port.
    pub port: u16,
}

/// What the rules need to know about the node.
#[derive(Debug, Clone)]
pub struct NodeView<'a> {
    /// The address the node's own connections are DNATed to (`None`: REDIRECT).
    pub node_ip: Option<IpAddr>,
    /// `--nodeport-addresses`.
    pub nodeport_addresses: &'a NodePortAddresses,
    /// The node's local addresses (for `--nodeport-addresses`, and whether the node's own
    /// address is inside a `loadBalancerSourceRanges` entry).
    pub local_addrs: &'a [IpAddr],
    /// How pod traffic is recognised (`--detect-local-mode`): pod traffic to an external
    /// destination is sent to the ClusterIP's listener, as the kernel modes short-circuit it
    /// to the cluster-wide endpoints.
    pub local: Option<LocalMatch>,
}

fn proto(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        Protocol::Sctp => "sctp",
    }
}

fn host_cidr(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(_) => format!("{ip}/32"),
        IpAddr::V6(_) => format!("{ip}/128"),
    }
}

/// ` -p tcp -m comment --comment "SPN" -m tcp --dport PORT`
fn port_match(out: &mut dyn Write, svc: &ServicePortInfo, port: u16) {
    let p = proto(svc.name.protocol);
    let _ = write!(
        out,
        " -p {p} -m comment --comment \"{}\" -m {p} --dport {port}",
        svc.name
    );
}

/// `-A CHAIN [-s SRC] [-d DST/32] [-i IFACE]`, in `iptables-save`'s order.
fn rule_head(
    out: &mut dyn Write,
    chain: &str,
    src: Option<ipnet::IpNet>,
    dst: Option<IpAddr>,
    local: Option<&LocalMatch>,
) {
    let _ = write!(out, "-A {chain}");
    let src = match local {
        Some(LocalMatch::Source(net)) => Some(*net),
        _ => src,
    };
    if let Some(src) = src {
        let _ = write!(out, " -s {}", src.trunc());
    }
    if let Some(dst) = dst {
        let _ = write!(out, " -d {}", host_cidr(dst));
    }
    if let Some(LocalMatch::Interface(name)) = local {
        let _ = write!(out, " -i {name}");
    }
}

fn container_target(out: &mut dyn Write, port: u16) {
    let _ = writeln!(out, " -j REDIRECT --to-ports {port}");
}

fn host_target(out: &mut dyn Write, node_ip: Option<IpAddr>, port: u16) {
    match node_ip {
        Some(ip) => {
            let _ = writeln!(
                out,
                " -j DNAT --to-destination {}",
                SocketAddr::new(ip, port)
            );
        }
        None => container_target(out, port),
    }
}

/// Renders the portal rules for every Service port of `snap` that has a listener in
/// `portals` (a Service port without one, e.g. SCTP or a listener that could not be opened,
/// gets no rules and keeps no traffic), into two strings. [`render_table`] writes the same
/// text of one table into any writer.
pub fn render(snap: &Snapshot, portals: &[Portal], node: &NodeView<'_>) -> Rendered {
    let mut out = Rendered::default();
    render_table(snap, portals, node, Table::Filter, &mut out.filter);
    render_table(snap, portals, node, Table::Nat, &mut out.nat);
    out
}

/// The table [`render_table`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// `KUBE-NODEPORT-NON-LOCAL`.
    Filter,
    /// The four portal chains, one after the other.
    Nat,
}

/// The chains of the nat table, in the order their rules are written.
const NAT_ORDER: [&str; 4] = [
    KUBE_PORTALS_CONTAINER,
    KUBE_PORTALS_HOST,
    KUBE_NODEPORT_CONTAINER,
    KUBE_NODEPORT_HOST,
];

/// Writes the rules of `table` (the text [`render`] puts in [`Rendered::filter`] or
/// [`Rendered::nat`]) into `out` as it goes, holding nothing but one rule: the nat table is
/// written chain by chain, one pass over the Services each. `portals` must be in the order
/// [`super::listeners`] gives (by ServicePortName).
pub fn render_table(
    snap: &Snapshot,
    portals: &[Portal],
    node: &NodeView<'_>,
    table: Table,
    out: &mut dyn Write,
) {
    let family = snap.family;
    let nodeport_ips: Option<Vec<IpAddr>> =
        if node.nodeport_addresses.match_all(family, &snap.node_ips) {
            None
        } else {
            Some(
                node.nodeport_addresses
                    .node_ips(family, node.local_addrs, &snap.node_ips),
            )
        };
    let chains: &[&str] = match table {
        Table::Filter => &[KUBE_NODEPORT_NON_LOCAL],
        Table::Nat => &NAT_ORDER,
    };
    for chain in chains {
        for (name, svc) in &snap.services {
            // The listeners of a Service port are adjacent (ServicePortName order).
            let first = portals.partition_point(|p| p.listener.service < *name);
            let mine = portals[first..]
                .iter()
                .take_while(|p| p.listener.service == *name);
            let mut ports = [None; 3];
            for p in mine {
                let i = match p.listener.scope {
                    Scope::Internal => 0,
                    Scope::External => 1,
                    Scope::Cluster => 2,
                };
                ports[i].get_or_insert(p.port);
            }
            let Some(internal) = ports[0] else {
                continue;
            };
            let ports = Ports {
                internal,
                external: ports[1].unwrap_or(internal),
                // Under externalTrafficPolicy: Local, pod and node traffic to an external
                // destination goes to the cluster-wide endpoints: the cluster listener's, or
                // the ClusterIP's when they are the same.
                cluster: ports[2].unwrap_or(internal),
            };
            service_rules(snap, svc, &ports, node, nodeport_ips.as_deref(), chain, out);
        }
    }
}

/// The listening ports of one Service port.
struct Ports {
    internal: u16,
    external: u16,
    cluster: u16,
}

/// The rules of one Service port in `chain`.
fn service_rules(
    snap: &Snapshot,
    svc: &ServicePortInfo,
    ports: &Ports,
    node: &NodeView<'_>,
    nodeport_ips: Option<&[IpAddr]>,
    chain: &str,
    out: &mut dyn Write,
) {
    let family = snap.family;
    let Ports {
        internal,
        external,
        cluster,
    } = *ports;
    let host = chain == KUBE_PORTALS_HOST;
    let container = chain == KUBE_PORTALS_CONTAINER;
    let np_container = chain == KUBE_NODEPORT_CONTAINER;
    let np_host = chain == KUBE_NODEPORT_HOST;
    // ClusterIP.
    if container || host {
        let _ = write!(out, "-A {chain} -d {}", host_cidr(svc.cluster_ip));
        port_match(out, svc, svc.port);
        if host {
            host_target(out, node.node_ip, internal);
        } else {
            container_target(out, internal);
        }
    }
    // Where the external listener differs, pod traffic (and the node's own) to an
    // external destination goes to the ClusterIP's listener.
    let short_circuit = svc.external_policy_local && external != cluster;
    if container || host {
        // externalIPs and load-balancer IPs: external destinations.
        // (destination, source range); a source-ranged VIP gets one rule per range, and
        // one for its own address as source when the node is inside a range (traffic
        // looping back through the node, as the kernel modes allow).
        let mut external_dsts: Vec<(IpAddr, Option<ipnet::IpNet>)> =
            svc.external_ips.iter().map(|ip| (*ip, None)).collect();
        for vip in &svc.load_balancer_vips {
            let ranges: Vec<ipnet::IpNet> = svc
                .load_balancer_source_ranges
                .iter()
                .filter(|r| family.contains(&r.addr()))
                .copied()
                .collect();
            if ranges.is_empty() {
                external_dsts.push((*vip, None));
            } else {
                let node_inside = node
                    .local_addrs
                    .iter()
                    .chain(&snap.node_ips)
                    .any(|a| !a.is_loopback() && ranges.iter().any(|r| r.contains(a)));
                if node_inside {
                    external_dsts.push((*vip, Some(ipnet::IpNet::from(*vip))));
                }
                external_dsts.extend(ranges.into_iter().map(|r| (*vip, Some(r))));
            }
        }
        for (dst, src) in external_dsts {
            if container {
                if short_circuit && src.is_none() && node.local.is_some() {
                    rule_head(out, chain, None, Some(dst), node.local.as_ref());
                    port_match(out, svc, svc.port);
                    container_target(out, cluster);
                }
                rule_head(out, chain, src, Some(dst), None);
                port_match(out, svc, svc.port);
                container_target(out, external);
            } else {
                rule_head(out, chain, src, Some(dst), None);
                port_match(out, svc, svc.port);
                host_target(
                    out,
                    node.node_ip,
                    if short_circuit { cluster } else { external },
                );
            }
        }
    }
    // NodePorts.
    let Some(np) = svc.node_port else {
        return;
    };
    if np_container || np_host {
        let all = [None];
        let some: Vec<Option<IpAddr>>;
        let dsts: &[Option<IpAddr>] = match nodeport_ips {
            None => &all,
            Some(ips) => {
                some = ips.iter().map(|ip| Some(*ip)).collect();
                &some
            }
        };
        for dst in dsts {
            if np_container {
                if short_circuit && node.local.is_some() {
                    rule_head(out, chain, None, *dst, node.local.as_ref());
                    port_match(out, svc, np);
                    container_target(out, cluster);
                }
                rule_head(out, chain, None, *dst, None);
                port_match(out, svc, np);
                container_target(out, external);
            } else {
                rule_head(out, chain, None, *dst, None);
                port_match(out, svc, np);
                host_target(
                    out,
                    node.node_ip,
                    if short_circuit { cluster } else { external },
                );
            }
        }
    }
    if chain == KUBE_NODEPORT_NON_LOCAL {
        let _ = write!(out, "-A {KUBE_NODEPORT_NON_LOCAL}");
        port_match(out, svc, external);
        let _ = out.write_str(" -j ACCEPT\n");
    }
}

#[cfg(test)]
#[path = "render/tests.rs"]
mod tests;
