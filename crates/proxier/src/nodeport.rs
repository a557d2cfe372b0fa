//! `--nodeport-addresses`: which local addresses accept NodePort traffic.
//!
//! Mirrors upstream's `NodePortAddresses`: a list of CIDRs and the keyword `primary` (this
//! node's primary IP per family, from the Node object). Per family, a list without entries of
//! that family matches every local address ("MatchAll"), which iptables mode writes as one
//! `-m addrtype --dst-type LOCAL` rule; otherwise one `-d <ip>` rule per matching local
//! address.

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

    /// Whether every local address of `family` accepts NodePorts.
    pub fn match_all(&self, family: IpFamily) -> bool {
        !self.primary && !self.cidrs.iter().any(|c| family.contains(&c.addr()))
    }

    /// Whether the loopback address of `family` accepts NodePorts.
    pub fn contains_loopback(&self, family: IpFamily) -> bool {
        let lo: IpAddr = match family {
            IpFamily::V4 => [127, 0, 0, 1].into(),
            IpFamily::V6 => std::net::Ipv6Addr::LOCALHOST.into(),
        };
        self.match_all(family) || self.cidrs.iter().any(|c| c.contains(&lo))
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
        assert!(all.match_all(IpFamily::V4) && all.contains_loopback(IpFamily::V4));
        let some = NodePortAddresses::parse(&["192.168.56.0/24", "fd00::/64"]).unwrap();
        assert!(!some.match_all(IpFamily::V4) && !some.contains_loopback(IpFamily::V4));
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
            v4only.match_all(IpFamily::V6),
            "a family without CIDRs matches all"
        );
        let lo = NodePortAddresses::parse(&["127.0.0.0/8"]).unwrap();
        assert!(lo.contains_loopback(IpFamily::V4));
        let primary = NodePortAddresses::parse(&["primary"]).unwrap();
        assert_eq!(
            primary.node_ips(IpFamily::V4, &local, &[ip("192.168.56.10"), ip("1.2.3.4")]),
            [ip("192.168.56.10")]
        );
        assert!(NodePortAddresses::parse(&["nonsense"]).is_err());
        assert!(NodePortAddresses::parse(&["10.0.0.0/33"]).is_err());
    }
}
