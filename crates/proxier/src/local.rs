//! Local-traffic detection (`--detect-local-mode`): which packets come from this cluster's
//! pods. Used to masquerade off-cluster traffic to ClusterIPs and to short-circuit pod
//! traffic to external destinations, exactly like upstream's `LocalTrafficDetector`.

use ipnet::IpNet;
use kp_model::IpFamily;

/// How pod traffic is recognised.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum LocalDetector {
    /// No detection: neither the off-cluster masquerade rule nor the pod short-circuit exist.
    #[default]
    None,
    /// `ClusterCIDR`: the source is inside the cluster's pod CIDR (one per family).
    Cidrs(Vec<IpNet>),
    /// `NodeCIDR`: the source is inside this node's pod CIDR (`spec.podCIDRs` of the Node).
    NodeCidr,
    /// `BridgeInterface`: the packet arrived on this bridge.
    BridgeInterface(String),
    /// `InterfaceNamePrefix`: the packet arrived on an interface with this prefix.
    InterfaceNamePrefix(String),
}

/// The match that recognises local traffic in one family, as iptables arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalMatch {
    /// `-s CIDR` (negated: `! -s CIDR`).
    Source(IpNet),
    /// `-i NAME` (negated: `! -i NAME`); a prefix is written `NAME+`.
    Interface(String),
}

impl LocalDetector {
    /// The match for `family`, or `None` when detection is off or has no CIDR of the family.
    /// `node_pod_cidrs` are this node's pod CIDRs (used by `NodeCIDR`).
    pub fn for_family(&self, family: IpFamily, node_pod_cidrs: &[IpNet]) -> Option<LocalMatch> {
        match self {
            LocalDetector::None => None,
            LocalDetector::Cidrs(cidrs) => cidrs
                .iter()
                .find(|c| family.contains(&c.addr()))
                .map(|c| LocalMatch::Source(c.trunc())),
            LocalDetector::NodeCidr => node_pod_cidrs
                .iter()
                .find(|c| family.contains(&c.addr()))
                .map(|c| LocalMatch::Source(c.trunc())),
            LocalDetector::BridgeInterface(name) => Some(LocalMatch::Interface(name.clone())),
            LocalDetector::InterfaceNamePrefix(prefix) => {
                Some(LocalMatch::Interface(format!("{prefix}+")))
            }
        }
    }
}
