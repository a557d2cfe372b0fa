//! [`Claims`]: which Services use each destination (IP, port and protocol, or node port and
//! protocol), so that two Services claiming the same one get a warning.
//!
//! Nothing stops two Services from naming the same destination: two manifests with the same
//! `clusterIP` and port, or one Service's `externalIPs` entry equal to another's cluster IP.
//! The rules of both are written and only one of them receives the traffic, which is hard to
//! see from the rules. The tracker keeps the destinations of every Service it proxies and, as
//! it rebuilds a Service, warns once per conflict (a destination and a pair of Services): not
//! again at the next sync, nor when one of the two changes without ending the conflict; again
//! if the conflict ends and comes back.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;

use kp_model::{Escaped, NamespacedName, Protocol, ServicePortInfo};

/// Something a Service port makes reachable, which no other Service should also claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Destination {
    /// An address (cluster IP, external IP or load-balancer IP), port and protocol.
    Ip(IpAddr, u16, Protocol),
    /// A node port and protocol (every node address of the family).
    NodePort(u16, Protocol),
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Destination::Ip(IpAddr::V4(ip), port, proto) => write!(f, "{ip}:{port}/{proto}"),
            Destination::Ip(IpAddr::V6(ip), port, proto) => write!(f, "[{ip}]:{port}/{proto}"),
            Destination::NodePort(port, proto) => write!(f, "node port {port}/{proto}"),
        }
    }
}

/// How a Service claims a destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Its cluster IP (`spec.clusterIPs`).
    ClusterIp,
    /// One of its `spec.externalIPs`.
    ExternalIp,
    /// One of its load-balancer ingress IPs (`status.loadBalancer.ingress`).
    LoadBalancerIp,
    /// One of its `spec.ports[].nodePort`.
    NodePort,
}

impl Role {
    fn describe(self) -> &'static str {
        match self {
            Role::ClusterIp => "the cluster IP",
            Role::ExternalIp => "an external IP",
            Role::LoadBalancerIp => "a load-balancer IP",
            Role::NodePort => "a node port",
        }
    }
}

/// Two Services claiming one destination; `Display` is the warning's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Conflict {
    pub(crate) destination: Destination,
    /// The Service that held the destination first, and how.
    pub(crate) first: (NamespacedName, Role),
    /// The Service that claims it too, and how.
    pub(crate) second: (NamespacedName, Role),
}

/// A Service's name, escaped for a log line (names are validated by the sources; this is a
/// second line of defence for other feeders of the tracker).
pub(crate) struct Name<'a>(pub(crate) &'a NamespacedName);

impl fmt::Display for Name<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}",
            Escaped(&self.0.namespace),
            Escaped(&self.0.name)
        )
    }
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (a, a_role) = &self.first;
        let (b, b_role) = &self.second;
        write!(
            f,
            "Services {} and {} both claim {} ({} of {}, {} of {}); only one of them receives \
             its traffic",
            Name(a),
            Name(b),
            self.destination,
            a_role.describe(),
            Name(a),
            b_role.describe(),
            Name(b),
        )
    }
}

/// The destinations of a Service port list: cluster IP, external IPs and load-balancer VIPs
/// with the port, and the node port; each once (the first role wins).
pub(crate) fn destinations<'a>(
    infos: impl IntoIterator<Item = &'a ServicePortInfo>,
) -> Vec<(Destination, Role)> {
    let mut out: Vec<(Destination, Role)> = Vec::new();
    let mut push = |d: Destination, role: Role| {
        if !out.iter().any(|(seen, _)| *seen == d) {
            out.push((d, role));
        }
    };
    for info in infos {
        let proto = info.name.protocol;
        push(
            Destination::Ip(info.cluster_ip, info.port, proto),
            Role::ClusterIp,
        );
        for ip in &info.external_ips {
            push(Destination::Ip(*ip, info.port, proto), Role::ExternalIp);
        }
        for ip in &info.load_balancer_vips {
            push(Destination::Ip(*ip, info.port, proto), Role::LoadBalancerIp);
        }
        if let Some(node_port) = info.node_port {
            push(Destination::NodePort(node_port, proto), Role::NodePort);
        }
    }
    out
}

/// The destinations claimed by every Service, and the conflicts already warned about.
#[derive(Debug, Default)]
pub(crate) struct Claims {
    /// Destination → the Services claiming it, in the order they claimed it. (What each
    /// Service claims is not kept: the caller has it, from the snapshot's ports.)
    holders: HashMap<Destination, Vec<(NamespacedName, Role)>>,
    /// Conflicts warned about: the destination and the two Services, in name order.
    warned: HashSet<(Destination, NamespacedName, NamespacedName)>,
}

impl Claims {
    /// Replaces the destinations of `service`, `old` (what it claimed before, as this was
    /// last given), by `claims` (empty when it is gone or not proxied); returns the conflicts
    /// not warned about before.
    pub(crate) fn set(
        &mut self,
        service: &NamespacedName,
        old: &[(Destination, Role)],
        claims: &[(Destination, Role)],
    ) -> Vec<Conflict> {
        for (d, _) in old {
            if claims.iter().any(|(new, _)| new == d) {
                continue;
            }
            // No longer claimed: the conflicts about it end.
            if let Some(list) = self.holders.get_mut(d) {
                list.retain(|(name, _)| name != service);
                if list.is_empty() {
                    self.holders.remove(d);
                }
            }
            self.warned
                .retain(|(wd, a, b)| wd != d || (a != service && b != service));
        }
        let mut conflicts = Vec::new();
        for &(d, role) in claims {
            let list = self.holders.entry(d).or_default();
            match list.iter_mut().find(|(name, _)| name == service) {
                Some(entry) => entry.1 = role,
                None => list.push((service.clone(), role)),
            }
            for (other, other_role) in list.iter() {
                if other == service {
                    continue;
                }
                let key = if other < service {
                    (d, other.clone(), service.clone())
                } else {
                    (d, service.clone(), other.clone())
                };
                if self.warned.insert(key) {
                    conflicts.push(Conflict {
                        destination: d,
                        first: (other.clone(), *other_role),
                        second: (service.clone(), role),
                    });
                }
            }
        }
        conflicts
    }
}
