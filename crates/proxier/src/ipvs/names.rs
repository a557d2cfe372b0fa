//! Upstream kube-proxy's names in IPVS mode: the dummy link, the iptables chains, the ipsets
//! (with their types, comments and the `KUBE-6-` spelling of IPv6 sets) and the iptables
//! rules that match each set.
//!
//! These are compatibility surface: an operator's `ipset list`, `iptables-save` and
//! `ip addr show kube-ipvs0` read the same on a node running kube-proxy-rs as on one running
//! upstream's IPVS mode.

use kp_model::IpFamily;

/// The dummy link every ClusterIP, externalIP and load-balancer IP is bound to, so the node
/// accepts packets for them (and answers ping on them).
pub const DUMMY_DEVICE: &str = "kube-ipvs0";

/// nat: the entry chain from PREROUTING and OUTPUT.
pub const KUBE_SERVICES: &str = "KUBE-SERVICES";
/// nat: masquerades marked packets, and hairpin traffic (`KUBE-LOOP-BACK`).
pub const KUBE_POSTROUTING: &str = "KUBE-POSTROUTING";
/// nat: NodePort traffic; filter: the health-check NodePort accept.
pub const KUBE_NODE_PORT: &str = "KUBE-NODE-PORT";
/// nat: load-balancer traffic, masqueraded unless its policy is Local.
pub const KUBE_LOAD_BALANCER: &str = "KUBE-LOAD-BALANCER";
/// nat: sets the masquerade mark.
pub const KUBE_MARK_MASQ: &str = "KUBE-MARK-MASQ";
/// filter: accepts marked and established forwarded traffic.
pub const KUBE_FORWARD: &str = "KUBE-FORWARD";
/// filter: load-balancer source ranges (from INPUT and FORWARD).
pub const KUBE_PROXY_FIREWALL: &str = "KUBE-PROXY-FIREWALL";
/// filter: the source-range check itself (RETURN on an allowed source, else DROP).
pub const KUBE_SOURCE_RANGES_FIREWALL: &str = "KUBE-SOURCE-RANGES-FIREWALL";
/// filter (INPUT): rejects new connections to a kube-ipvs0 address on a port no Service
/// uses (kubernetes#72236: host ports must not be reachable through a VIP).
pub const KUBE_IPVS_FILTER: &str = "KUBE-IPVS-FILTER";
/// filter (OUTPUT): drops node traffic to a load-balancer IP whose source ranges exclude
/// the node (kubernetes#119656).
pub const KUBE_IPVS_OUT_FILTER: &str = "KUBE-IPVS-OUT-FILTER";

/// The nat chains of IPVS mode, in upstream's declaration order.
pub const NAT_CHAINS: &[&str] = &[
    KUBE_SERVICES,
    KUBE_POSTROUTING,
    KUBE_NODE_PORT,
    KUBE_LOAD_BALANCER,
    KUBE_MARK_MASQ,
];

/// The filter chains of IPVS mode, in upstream's declaration order.
pub const FILTER_CHAINS: &[&str] = &[
    KUBE_FORWARD,
    KUBE_NODE_PORT,
    KUBE_PROXY_FIREWALL,
    KUBE_SOURCE_RANGES_FIREWALL,
    KUBE_IPVS_FILTER,
    KUBE_IPVS_OUT_FILTER,
];

/// An ipset type, as `ipset create` spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SetType {
    /// `hash:ip`.
    HashIp,
    /// `hash:ip,port`.
    HashIpPort,
    /// `hash:ip,port,ip`.
    HashIpPortIp,
    /// `hash:ip,port,net`.
    HashIpPortNet,
    /// `bitmap:port` (range 0-65535, no family).
    BitmapPort,
}

impl SetType {
    /// The type as `ipset` writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            SetType::HashIp => "hash:ip",
            SetType::HashIpPort => "hash:ip,port",
            SetType::HashIpPortIp => "hash:ip,port,ip",
            SetType::HashIpPortNet => "hash:ip,port,net",
            SetType::BitmapPort => "bitmap:port",
        }
    }
}

/// One of upstream's ipsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KubeSet {
    /// `KUBE-LOOP-BACK`: local endpoint `ip,proto:port,ip` for hairpin masquerade.
    LoopBack,
    /// `KUBE-CLUSTER-IP`: every ClusterIP `ip,proto:port`.
    ClusterIp,
    /// `KUBE-EXTERNAL-IP`: externalIPs under Cluster policy.
    ExternalIp,
    /// `KUBE-EXTERNAL-IP-LOCAL`: externalIPs under Local policy.
    ExternalIpLocal,
    /// `KUBE-LOAD-BALANCER`: every load-balancer IP.
    LoadBalancer,
    /// `KUBE-LOAD-BALANCER-FW`: load-balancer IPs with source ranges.
    LoadBalancerFw,
    /// `KUBE-LOAD-BALANCER-LOCAL`: load-balancer IPs under Local policy.
    LoadBalancerLocal,
    /// `KUBE-LOAD-BALANCER-SOURCE-IP`: `lbip,proto:port,lbip` when the node is in a range.
    LoadBalancerSourceIp,
    /// `KUBE-LOAD-BALANCER-SOURCE-CIDR`: `lbip,proto:port,cidr` per source range.
    LoadBalancerSourceCidr,
    /// `KUBE-NODE-PORT-TCP`: TCP NodePorts.
    NodePortTcp,
    /// `KUBE-NODE-PORT-LOCAL-TCP`: TCP NodePorts under Local policy.
    NodePortLocalTcp,
    /// `KUBE-NODE-PORT-UDP`: UDP NodePorts.
    NodePortUdp,
    /// `KUBE-NODE-PORT-LOCAL-UDP`: UDP NodePorts under Local policy.
    NodePortLocalUdp,
    /// `KUBE-NODE-PORT-SCTP-HASH`: SCTP NodePorts, `nodeip,sctp:port`.
    NodePortSctp,
    /// `KUBE-NODE-PORT-LOCAL-SCTP-HASH`: SCTP NodePorts under Local policy.
    NodePortLocalSctp,
    /// `KUBE-HEALTH-CHECK-NODE-PORT`: health-check NodePorts.
    HealthCheckNodePort,
    /// `KUBE-IPVS-IPS`: every address bound to kube-ipvs0.
    IpvsIps,
}

impl KubeSet {
    /// Every set, in upstream's order.
    pub const ALL: [KubeSet; 17] = [
        KubeSet::LoopBack,
        KubeSet::ClusterIp,
        KubeSet::ExternalIp,
        KubeSet::ExternalIpLocal,
        KubeSet::LoadBalancer,
        KubeSet::LoadBalancerFw,
        KubeSet::LoadBalancerLocal,
        KubeSet::LoadBalancerSourceIp,
        KubeSet::LoadBalancerSourceCidr,
        KubeSet::NodePortTcp,
        KubeSet::NodePortLocalTcp,
        KubeSet::NodePortUdp,
        KubeSet::NodePortLocalUdp,
        KubeSet::NodePortSctp,
        KubeSet::NodePortLocalSctp,
        KubeSet::HealthCheckNodePort,
        KubeSet::IpvsIps,
    ];

    /// The IPv4 name (`KUBE-...`).
    pub fn base_name(self) -> &'static str {
        match self {
            KubeSet::LoopBack => "KUBE-LOOP-BACK",
            KubeSet::ClusterIp => "KUBE-CLUSTER-IP",
            KubeSet::ExternalIp => "KUBE-EXTERNAL-IP",
            KubeSet::ExternalIpLocal => "KUBE-EXTERNAL-IP-LOCAL",
            KubeSet::LoadBalancer => "KUBE-LOAD-BALANCER",
            KubeSet::LoadBalancerFw => "KUBE-LOAD-BALANCER-FW",
            KubeSet::LoadBalancerLocal => "KUBE-LOAD-BALANCER-LOCAL",
            KubeSet::LoadBalancerSourceIp => "KUBE-LOAD-BALANCER-SOURCE-IP",
            KubeSet::LoadBalancerSourceCidr => "KUBE-LOAD-BALANCER-SOURCE-CIDR",
            KubeSet::NodePortTcp => "KUBE-NODE-PORT-TCP",
            KubeSet::NodePortLocalTcp => "KUBE-NODE-PORT-LOCAL-TCP",
            KubeSet::NodePortUdp => "KUBE-NODE-PORT-UDP",
            KubeSet::NodePortLocalUdp => "KUBE-NODE-PORT-LOCAL-UDP",
            KubeSet::NodePortSctp => "KUBE-NODE-PORT-SCTP-HASH",
            KubeSet::NodePortLocalSctp => "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
            KubeSet::HealthCheckNodePort => "KUBE-HEALTH-CHECK-NODE-PORT",
            KubeSet::IpvsIps => "KUBE-IPVS-IPS",
        }
    }

    /// The set's name in `family`: IPv6 sets replace `KUBE-` with `KUBE-6-` and are cut to
    /// ipset's 31-character limit, as upstream does (`KUBE-6-LOAD-BALANCER-SOURCE-CIDR` becomes
    /// `KUBE-6-LOAD-BALANCER-SOURCE-CID`).
    pub fn name(self, family: IpFamily) -> String {
        let base = self.base_name();
        match family {
            IpFamily::V4 => base.to_string(),
            IpFamily::V6 => {
                let mut n = format!("KUBE-6-{}", &base["KUBE-".len()..]);
                n.truncate(31);
                n
            }
        }
    }

    /// The ipset type.
    pub fn set_type(self) -> SetType {
        match self {
            KubeSet::LoopBack | KubeSet::LoadBalancerSourceIp => SetType::HashIpPortIp,
            KubeSet::LoadBalancerSourceCidr => SetType::HashIpPortNet,
            KubeSet::NodePortTcp
            | KubeSet::NodePortLocalTcp
            | KubeSet::NodePortUdp
            | KubeSet::NodePortLocalUdp
            | KubeSet::HealthCheckNodePort => SetType::BitmapPort,
            KubeSet::IpvsIps => SetType::HashIp,
            _ => SetType::HashIpPort,
        }
    }

    /// Upstream's comment for the set, used in the iptables rules that match it.
    pub fn comment(self) -> &'static str {
        match self {
            KubeSet::LoopBack => {
                "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose"
            }
            KubeSet::ClusterIp => "Kubernetes service cluster ip + port for masquerade purpose",
            KubeSet::ExternalIp => {
                "Kubernetes service external ip + port for masquerade and filter purpose"
            }
            KubeSet::ExternalIpLocal => {
                "Kubernetes service external ip + port with externalTrafficPolicy=local"
            }
            KubeSet::LoadBalancer => "Kubernetes service lb portal",
            KubeSet::LoadBalancerFw => {
                "Kubernetes service load balancer ip + port for load balancer with sourceRange"
            }
            KubeSet::LoadBalancerLocal => {
                "Kubernetes service load balancer ip + port with externalTrafficPolicy=local"
            }
            KubeSet::LoadBalancerSourceIp => {
                "Kubernetes service load balancer ip + port + source IP for packet filter purpose"
            }
            KubeSet::LoadBalancerSourceCidr => {
                "Kubernetes service load balancer ip + port + source cidr for packet filter purpose"
            }
            KubeSet::NodePortTcp => "Kubernetes nodeport TCP port for masquerade purpose",
            KubeSet::NodePortLocalTcp => {
                "Kubernetes nodeport TCP port with externalTrafficPolicy=local"
            }
            KubeSet::NodePortUdp => "Kubernetes nodeport UDP port for masquerade purpose",
            KubeSet::NodePortLocalUdp => {
                "Kubernetes nodeport UDP port with externalTrafficPolicy=local"
            }
            KubeSet::NodePortSctp => {
                "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'"
            }
            KubeSet::NodePortLocalSctp => {
                "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'"
            }
            KubeSet::HealthCheckNodePort => "Kubernetes health check node port",
            KubeSet::IpvsIps => "Addresses on the ipvs interface",
        }
    }

    /// The set whose name in `family` is `name`, if it is one of ours.
    pub fn from_name(name: &str, family: IpFamily) -> Option<KubeSet> {
        KubeSet::ALL.into_iter().find(|s| s.name(family) == name)
    }
}

/// A rule that matches one set, written only while the set has entries (upstream's
/// `ipsetWithIptablesChain`); the Local NodePort sets come before their Cluster twins so
/// their RETURN wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetRule {
    /// The set.
    pub set: KubeSet,
    /// `true` for the filter table, `false` for nat.
    pub filter: bool,
    /// The chain the rule is appended to.
    pub chain: &'static str,
    /// The jump target.
    pub target: &'static str,
    /// The `--match-set` direction flags.
    pub match_type: &'static str,
    /// A `-p` protocol match, if any.
    pub protocol: Option<&'static str>,
}

const fn set_rule(
    set: KubeSet,
    filter: bool,
    chain: &'static str,
    target: &'static str,
    match_type: &'static str,
    protocol: Option<&'static str>,
) -> SetRule {
    SetRule {
        set,
        filter,
        chain,
        target,
        match_type,
        protocol,
    }
}

/// Upstream's set-matching rules, in order.
pub const SET_RULES: &[SetRule] = &[
    set_rule(
        KubeSet::LoopBack,
        false,
        KUBE_POSTROUTING,
        "MASQUERADE",
        "dst,dst,src",
        None,
    ),
    set_rule(
        KubeSet::LoadBalancer,
        false,
        KUBE_SERVICES,
        KUBE_LOAD_BALANCER,
        "dst,dst",
        None,
    ),
    set_rule(
        KubeSet::LoadBalancerLocal,
        false,
        KUBE_LOAD_BALANCER,
        "RETURN",
        "dst,dst",
        None,
    ),
    set_rule(
        KubeSet::NodePortLocalTcp,
        false,
        KUBE_NODE_PORT,
        "RETURN",
        "dst",
        Some("tcp"),
    ),
    set_rule(
        KubeSet::NodePortTcp,
        false,
        KUBE_NODE_PORT,
        KUBE_MARK_MASQ,
        "dst",
        Some("tcp"),
    ),
    set_rule(
        KubeSet::NodePortLocalUdp,
        false,
        KUBE_NODE_PORT,
        "RETURN",
        "dst",
        Some("udp"),
    ),
    set_rule(
        KubeSet::NodePortUdp,
        false,
        KUBE_NODE_PORT,
        KUBE_MARK_MASQ,
        "dst",
        Some("udp"),
    ),
    set_rule(
        KubeSet::NodePortLocalSctp,
        false,
        KUBE_NODE_PORT,
        "RETURN",
        "dst,dst",
        Some("sctp"),
    ),
    set_rule(
        KubeSet::NodePortSctp,
        false,
        KUBE_NODE_PORT,
        KUBE_MARK_MASQ,
        "dst,dst",
        Some("sctp"),
    ),
    set_rule(
        KubeSet::LoadBalancerFw,
        true,
        KUBE_PROXY_FIREWALL,
        KUBE_SOURCE_RANGES_FIREWALL,
        "dst,dst",
        None,
    ),
    set_rule(
        KubeSet::LoadBalancerSourceCidr,
        true,
        KUBE_SOURCE_RANGES_FIREWALL,
        "RETURN",
        "dst,dst,src",
        None,
    ),
    set_rule(
        KubeSet::LoadBalancerSourceIp,
        true,
        KUBE_SOURCE_RANGES_FIREWALL,
        "RETURN",
        "dst,dst,src",
        None,
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_names_are_prefixed_and_truncated() {
        assert_eq!(KubeSet::ClusterIp.name(IpFamily::V6), "KUBE-6-CLUSTER-IP");
        assert_eq!(
            KubeSet::LoadBalancerSourceCidr.name(IpFamily::V6),
            "KUBE-6-LOAD-BALANCER-SOURCE-CID"
        );
        assert_eq!(
            KubeSet::NodePortLocalSctp.name(IpFamily::V6),
            "KUBE-6-NODE-PORT-LOCAL-SCTP-HAS"
        );
        for s in KubeSet::ALL {
            assert!(s.name(IpFamily::V6).len() <= 31);
            assert_eq!(
                KubeSet::from_name(&s.name(IpFamily::V6), IpFamily::V6),
                Some(s)
            );
            assert_eq!(KubeSet::from_name(s.base_name(), IpFamily::V4), Some(s));
        }
    }
}
