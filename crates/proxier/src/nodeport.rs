//! `--nodeport-addresses`: which local addresses accept NodePort traffic.
//!
//! Mirrors upstream's `NodePortAddresses`: a list of CIDRs and the keyword `primary` (this
//! node's primary IP per family, from the Node object). Per family, a list without entries of
//! that family matches every local address ("MatchAll"), which iptables mode writes as one
//! `-m addrtype --dst-type LOCAL` rule and nftables mode as `fib daddr type local`; otherwise
//! one `-d <ip>` rule per matching local address (nftables: the `nodeport-ips` set).
//!
//! `primary` stands for the node's address of the family only when the Node object has one:
//! upstream's kube-proxy turns `primary` into `<nodeIP>/32` and `<nodeIP>/128` for the
//! families it knows a node address of, so a family without one (no Node object, or a
//! dual-stack node whose Node lists only an IPv4 address) has no entry and matches every
//! local address.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use kp_model::IpFamily;

/// Parsed `--nodeport-addresses`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodePortAddresses {
    cidrs: Vec<IpNet>,
    primary: bool,
}

/// A `--nodeport-addresses` entry that is neither a CIDR nor a known keyword.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadNodePortAddress(pub String);

impl fmt::Display for BadNodePortAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid --nodeport-addresses entry {:?}: expected a CIDR, \"primary\" or \"all\"",
            self.0
        )
    }
}

impl std::error::Error for BadNodePortAddress {}

impl NodePortAddresses {
    /// Every local address (the iptables-mode default).
    pub fn all() -> Self {
        Self::default()
    }

    /// Parses entries: CIDRs, `primary`, and `all` (alone, or an empty list) for every address.
    ///
    /// # Errors
    /// [`BadNodePortAddress`] naming the first entry that is not understood.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, BadNodePortAddress> {
        let mut out = Self::default();
        for e in entries {
            let e = e.as_ref().trim();
            match e {
                "" | "all" => {}
                "primary" => out.primary = true,
                other => {
                    let net: IpNet = other
                        .parse()
                        .map_err(|_| BadNodePortAddress(other.to_string()))?;
                    out.cidrs.push(net.trunc());
                }
            }
        }
        Ok(out)
    }

    /// Whether every local address of `family` accepts NodePorts: no CIDR of `family` was
    /// given, and `primary` was not given or `node_ips` (the Node object's addresses, its
    /// primary first) has no address of `family` (see the module documentation).
    pub fn match_all(&self, family: IpFamily, node_ips: &[IpAddr]) -> bool {
        let primary = self.primary && node_ips.iter().any(|ip| family.contains(ip));
        !primary && !self.cidrs.iter().any(|c| family.contains(&c.addr()))
    }

    /// Whether the loopback address of `family` accepts NodePorts (`node_ips` as for
    /// [`match_all`](Self::match_all)).
    pub fn contains_loopback(&self, family: IpFamily, node_ips: &[IpAddr]) -> bool {
        let lo: IpAddr = match family {
            IpFamily::V4 => [127, 0, 0, 1].into(),
            IpFamily::V6 => std::net::Ipv6Addr::LOCALHOST.into(),
        };
        self.match_all(family, node_ips) || self.cidrs.iter().any(|c| c.contains(&lo))
    }

    /// The addresses of `family` that accept NodePorts when not [`match_all`](Self::match_all):
    /// local addresses inside a CIDR, plus the node's primary IP when `primary` was given.
    /// Sorted and deduplicated.
    pub fn node_ips(&self, family: IpFamily, local: &[IpAddr], node_ips: &[IpAddr]) -> Vec<IpAddr> {
        let mut out: Vec<IpAddr> = local
            .iter()
            .copied()
            .filter(|ip| family.contains(ip) && self.cidrs.iter().any(|c| c.contains(ip)))
            .collect();
        if self.primary {
            out.extend(
                node_ips
                    .iter()
                    .copied()
                    .filter(|ip| family.contains(ip))
                    .take(1),
            );
        }
        out.sort();
        out.dedup();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn parse_and_match() {
        let all = NodePortAddresses::parse::<&str>(&[]).unwrap();
        assert!(all.match_all(IpFamily::V4, &[]) && all.contains_loopback(IpFamily::V4, &[]));
        let some = NodePortAddresses::parse(&["192.168.56.0/24", "fd00::/64"]).unwrap();
        assert!(!some.match_all(IpFamily::V4, &[]) && !some.contains_loopback(IpFamily::V4, &[]));
        let local = [
            ip("127.0.0.1"),
            ip("192.168.56.10"),
            ip("10.1.1.1"),
            ip("fd00::5"),
        ];
        assert_eq!(
            some.node_ips(IpFamily::V4, &local, &[]),
            [ip("192.168.56.10")]
        );
        assert_eq!(some.node_ips(IpFamily::V6, &local, &[]), [ip("fd00::5")]);
        let v4only = NodePortAddresses::parse(&["10.0.0.0/8"]).unwrap();
        assert!(
            v4only.match_all(IpFamily::V6, &[]),
            "a family without CIDRs matches all"
        );
        let lo = NodePortAddresses::parse(&["127.0.0.0/8"]).unwrap();
        assert!(lo.contains_loopback(IpFamily::V4, &[]));
        let primary = NodePortAddresses::parse(&["primary"]).unwrap();
        assert_eq!(
            primary.node_ips(IpFamily::V4, &local, &[ip("192.168.56.10"), ip("1.2.3.4")]),
            [ip("192.168.56.10")]
        );
        assert!(NodePortAddresses::parse(&["nonsense"]).is_err());
    }

    /// Upstream: `primary` becomes `<nodeIP>/32` and `<nodeIP>/128` for the families the
    /// Node object gives an address of; a family without one matches every local address.
    #[test]
    fn primary_without_a_node_address_of_the_family_matches_all() {
        let primary = NodePortAddresses::parse(&["primary"]).unwrap();
        let v4_node = [ip("192.168.56.10")];
        assert!(!primary.match_all(IpFamily::V4, &v4_node));
        assert!(primary.match_all(IpFamily::V6, &v4_node));
        assert!(primary.match_all(IpFamily::V4, &[]));
        assert!(primary.match_all(IpFamily::V6, &[]));
        assert!(primary.contains_loopback(IpFamily::V4, &[]));
        assert!(!primary.contains_loopback(IpFamily::V4, &v4_node));
        // A CIDR of the family still restricts it.
        let mixed = NodePortAddresses::parse(&["primary", "fd00::/64"]).unwrap();
        assert!(!mixed.match_all(IpFamily::V6, &v4_node));
        assert!(NodePortAddresses::parse(&["10.0.0.0/33"]).is_err());
    }
}
