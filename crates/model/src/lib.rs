//! kp-model: the proxy's own vocabulary.
//!
//! Every layer after the source (tracking, rendering, reconciliation, tracing) works on
//! these types and never on Kubernetes API types. The source layer (`kp-source`) turns
//! `v1.Service`, `discovery.k8s.io/v1.EndpointSlice`, `v1.Node` and
//! `networking.k8s.io/v1.ServiceCIDR` objects into the *object* types here ([`Service`],
//! [`EndpointSlice`], [`Node`], [`ServiceCidr`]) after validating them,
//! so every string that reaches a rule generator is already known to be safe to embed in
//! `iptables-restore` or `nft -f` input (DNS labels, IANA service names).
//!
//! The tracker (`kp-track`) turns objects into the *per-family* view a proxier renders:
//! [`ServicePortInfo`] (upstream's `ServicePort`) and [`Endpoint`] grouped in a
//! [`Snapshot`], plus a [`Changes`] record of which Services changed since the last sync.
//!
//! Text that has not been validated (a name being rejected, a value quoted in a message) is
//! printed through [`escape`] (or [`Escaped`]), so that it cannot forge log lines.

mod event;
mod names;
mod object;
mod shared;
mod snapshot;
mod text;

pub use event::{ObjectKind, SourceEvent};
pub use names::{
    NameError, NamespacedName, ServicePortName, validate_dns_label, validate_dns_subdomain,
    validate_port_name, validate_service_name,
};
pub use object::{
    EndpointConditions, EndpointEntry, EndpointPort, EndpointSlice, EndpointTopology,
    LoadBalancerIngress, LoadBalancerIpMode, Node, Service, ServiceCidr, ServicePortSpec,
    ServiceType, SessionAffinity, SliceAddressType, TrafficDistribution, TrafficPolicy,
};
pub use shared::{HintSet, Interner, SharedStr};
pub use snapshot::{Changes, Endpoint, ServicePortInfo, Snapshot};
pub use text::{Escaped, escape};

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// An IP family. Upstream kube-proxy runs one single-stack proxier per family; so do we.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IpFamily {
    /// IPv4 (`iptables`, nftables family `ip`).
    V4,
    /// IPv6 (`ip6tables`, nftables family `ip6`).
    V6,
}

impl IpFamily {
    /// The family of an address.
    pub fn of(ip: &IpAddr) -> IpFamily {
        match ip {
            IpAddr::V4(_) => IpFamily::V4,
            IpAddr::V6(_) => IpFamily::V6,
        }
    }

    /// Whether `ip` belongs to this family.
    pub fn contains(self, ip: &IpAddr) -> bool {
        IpFamily::of(ip) == self
    }

    /// The API spelling: `IPv4` or `IPv6` (as in `spec.ipFamilies` and health JSON).
    pub fn api_name(self) -> &'static str {
        match self {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        }
    }
}

impl fmt::Display for IpFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.api_name())
    }
}

/// A transport protocol a Service port can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Protocol {
    /// Lower-case name, as used in rules and in upstream's chain-name hashes (`tcp`).
    pub fn as_lower(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }

    /// The API spelling (`TCP`, `UDP`, `SCTP`).
    pub fn as_api(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_api())
    }
}

/// The error of [`Protocol::from_str`]: the text is not one of the API's protocols.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownProtocol(pub String);

impl fmt::Display for UnknownProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown protocol {:?} (expected TCP, UDP or SCTP)",
            self.0
        )
    }
}

impl std::error::Error for UnknownProtocol {}

impl FromStr for Protocol {
    type Err = UnknownProtocol;

    /// Parses the API spelling. Like the API server, only the upper-case forms are valid.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "TCP" => Ok(Protocol::Tcp),
            "UDP" => Ok(Protocol::Udp),
            "SCTP" => Ok(Protocol::Sctp),
            other => Err(UnknownProtocol(other.to_string())),
        }
    }
}

/// The proxy modes, named as `--proxy-mode` spells them; shared by the proxiers (which mode a
/// proxier implements) and the metrics server (which mode-specific metrics it registers and
/// what `/proxyMode` answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProxyMode {
    /// `iptables` (the default on Linux, as upstream).
    Iptables,
    /// `nftables`.
    Nftables,
    /// `ipvs`.
    Ipvs,
    /// `userspace`: a proxy socket per Service port (upstream removed it in 1.26).
    Userspace,
}

impl ProxyMode {
    /// The `--proxy-mode` spelling (`iptables`, `nftables`, `ipvs`, `userspace`).
    pub fn as_str(self) -> &'static str {
        match self {
            ProxyMode::Iptables => "iptables",
            ProxyMode::Nftables => "nftables",
            ProxyMode::Ipvs => "ipvs",
            ProxyMode::Userspace => "userspace",
        }
    }
}

impl fmt::Display for ProxyMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error of [`ProxyMode::from_str`]: the text names no proxy mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownProxyMode(pub String);

impl fmt::Display for UnknownProxyMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown proxy mode {:?} (expected iptables, nftables, ipvs or userspace)",
            self.0
        )
    }
}

impl std::error::Error for UnknownProxyMode {}

impl FromStr for ProxyMode {
    type Err = UnknownProxyMode;

    /// Parses the `--proxy-mode` spelling, lower case only.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "iptables" => Ok(ProxyMode::Iptables),
            "nftables" => Ok(ProxyMode::Nftables),
            "ipvs" => Ok(ProxyMode::Ipvs),
            "userspace" => Ok(ProxyMode::Userspace),
            other => Err(UnknownProxyMode(other.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_modes_parse_and_print() {
        for mode in [
            ProxyMode::Iptables,
            ProxyMode::Nftables,
            ProxyMode::Ipvs,
            ProxyMode::Userspace,
        ] {
            assert_eq!(mode.as_str().parse::<ProxyMode>(), Ok(mode));
        }
        assert_eq!(
            "kernelspace".parse::<ProxyMode>(),
            Err(UnknownProxyMode("kernelspace".into()))
        );
    }

    #[test]
    fn protocol_round_trip() {
        for p in [Protocol::Tcp, Protocol::Udp, Protocol::Sctp] {
            assert_eq!(p.as_api().parse::<Protocol>(), Ok(p));
        }
        assert!("tcp".parse::<Protocol>().is_err());
        assert!("ICMP".parse::<Protocol>().is_err());
    }

    #[test]
    fn family_of() {
        assert_eq!(IpFamily::of(&"10.0.0.1".parse().unwrap()), IpFamily::V4);
        assert_eq!(IpFamily::of(&"fd00::1".parse().unwrap()), IpFamily::V6);
    }
}
