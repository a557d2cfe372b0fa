//! Chain names of iptables mode, with upstream kube-proxy's hash scheme.
//!
//! Per-Service chains are `KUBE-SVC-`, `KUBE-SVL-`, `KUBE-EXT-`, `KUBE-FW-` followed by the
//! first 16 characters of `base32(sha256(<ServicePortName> + <protocol>))`; endpoint chains
//! are `KUBE-SEP-` followed by `base32(sha256(<ServicePortName> + <protocol> + <ip:port>))`
//! truncated the same way. The ServicePortName is printed `ns/name[:port]` and the protocol
//! lower-cased, so the names equal those upstream kube-proxy creates for the same Service.

use std::fmt::Write as _;

use data_encoding::BASE32;
use kp_model::{Endpoint, ServicePortName};
use sha2::{Digest, Sha256};

/// nat: entry chain for Service VIPs, jumped to from PREROUTING and OUTPUT.
pub const KUBE_SERVICES: &str = "KUBE-SERVICES";
/// nat and filter: NodePort entry chain.
pub const KUBE_NODEPORTS: &str = "KUBE-NODEPORTS";
/// nat: masquerades marked packets, jumped to from POSTROUTING.
pub const KUBE_POSTROUTING: &str = "KUBE-POSTROUTING";
/// nat: sets the masquerade mark.
pub const KUBE_MARK_MASQ: &str = "KUBE-MARK-MASQ";
/// filter: rejects for external destinations without endpoints.
pub const KUBE_EXTERNAL_SERVICES: &str = "KUBE-EXTERNAL-SERVICES";
/// filter: forwarding accepts and the INVALID drop.
pub const KUBE_FORWARD: &str = "KUBE-FORWARD";
/// filter: loadBalancerSourceRanges drops.
pub const KUBE_PROXY_FIREWALL: &str = "KUBE-PROXY-FIREWALL";
/// filter: the localnet drop that guards localhost NodePorts (a copy of kubelet's chain).
pub const KUBE_FIREWALL: &str = "KUBE-FIREWALL";

/// Prefixes of per-Service and per-endpoint nat chains; a chain with one of these prefixes that
/// is not in the desired ruleset is stale and gets deleted.
pub const SERVICE_CHAIN_PREFIXES: [&str; 5] = [
    "KUBE-SVC-",
    "KUBE-SVL-",
    "KUBE-EXT-",
    "KUBE-FW-",
    "KUBE-SEP-",
];

/// Whether `chain` is a per-Service or per-endpoint chain of ours.
pub fn is_service_chain(chain: &str) -> bool {
    SERVICE_CHAIN_PREFIXES.iter().any(|p| chain.starts_with(p))
}

/// The first 16 base32 characters of the SHA-256 of the concatenated parts.
fn hash16(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
    }
    let digest = h.finalize();
    // 10 bytes are exactly 80 bits, which base32 spells in 16 characters without padding.
    BASE32.encode(&digest[..10])
}

/// The per-Service chain names of one ServicePortName.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceChains {
    /// `KUBE-SVC-…`: Cluster-policy endpoints.
    pub svc: String,
    /// `KUBE-SVL-…`: Local-policy endpoints.
    pub svl: String,
    /// `KUBE-EXT-…`: external destinations (NodePort, externalIPs, LB IPs).
    pub ext: String,
    /// `KUBE-FW-…`: loadBalancerSourceRanges.
    pub fw: String,
}

impl ServiceChains {
    /// Names for `spn` (hashing `spn` and its lower-case protocol).
    pub fn new(spn: &ServicePortName) -> Self {
        let text = spn.to_string();
        let hash = hash16(&[&text, spn.protocol.as_lower()]);
        ServiceChains {
            svc: format!("KUBE-SVC-{hash}"),
            svl: format!("KUBE-SVL-{hash}"),
            ext: format!("KUBE-EXT-{hash}"),
            fw: format!("KUBE-FW-{hash}"),
        }
    }
}

/// `KUBE-SEP-…` for endpoint `ep` of `spn`.
pub fn endpoint_chain(spn: &ServicePortName, ep: &Endpoint) -> String {
    let mut ep_text = String::with_capacity(24);
    let _ = write!(ep_text, "{ep}");
    let spn_text = spn.to_string();
    format!(
        "KUBE-SEP-{}",
        hash16(&[&spn_text, spn.protocol.as_lower(), &ep_text])
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use kp_model::{NamespacedName, Protocol};

    fn ep(ip: &str, port: u16) -> Endpoint {
        Endpoint {
            ip: ip.parse().unwrap(),
            port,
            is_local: false,
            ready: true,
            serving: true,
            terminating: false,
            zone_hints: None,
            node_hints: None,
        }
    }

    #[test]
    fn seed_names_match_upstream() {
        // Names printed by upstream kube-proxy for the seed cluster (seed 003).
        let spn = ServicePortName::new(
            NamespacedName::new("default", "nginx-svc"),
            "",
            Protocol::Tcp,
        );
        assert_eq!(ServiceChains::new(&spn).svc, "KUBE-SVC-HL5LMXD5JFHQZ6LN");
        assert_eq!(
            endpoint_chain(&spn, &ep("10.0.0.4", 80)),
            "KUBE-SEP-GS5MQAG4332XHLUZ"
        );
        assert_eq!(
            endpoint_chain(&spn, &ep("10.0.1.2", 80)),
            "KUBE-SEP-H5CTQI4CMO4ES5BQ"
        );
    }

    #[test]
    fn names_fit_iptables_limit() {
        let spn = ServicePortName::new(NamespacedName::new("a", "b"), "http", Protocol::Sctp);
        let c = ServiceChains::new(&spn);
        for n in [&c.svc, &c.svl, &c.ext, &c.fw] {
            assert!(n.len() <= 28, "{n}");
            assert!(is_service_chain(n));
        }
        assert!(!is_service_chain(KUBE_SERVICES));
        let v6 = endpoint_chain(&spn, &ep("fd00::1", 8080));
        assert_eq!(v6.len(), 25);
    }
}
