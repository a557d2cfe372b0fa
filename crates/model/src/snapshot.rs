//! The per-family view a proxier renders: [`ServicePortInfo`], [`Endpoint`], [`Snapshot`]
//! and the [`Changes`] since the previous checkout.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use crate::{
    EndpointTopology, HintSet, IpFamily, NamespacedName, ServicePortName, ServiceType,
    SessionAffinity, TrafficDistribution,
};

/// One port of one Service in one IP family: upstream kube-proxy's `ServicePort`.
///
/// Address lists hold only addresses of the snapshot's family; load-balancer IPs only those in
/// `VIP` mode (upstream skips `ipMode: Proxy`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServicePortInfo {
    /// The ServicePortName (service, port name, protocol).
    pub name: ServicePortName,
    /// `spec.type`.
    pub service_type: ServiceType,
    /// The Service's cluster IP of this family.
    pub cluster_ip: IpAddr,
    /// The Service port (`spec.ports[].port`).
    pub port: u16,
    /// The node port, if allocated.
    pub node_port: Option<u16>,
    /// `spec.externalIPs` of this family.
    pub external_ips: Vec<IpAddr>,
    /// Load-balancer ingress IPs of this family in VIP mode.
    pub load_balancer_vips: Vec<IpAddr>,
    /// `spec.loadBalancerSourceRanges` of this family.
    pub load_balancer_source_ranges: Vec<IpNet>,
    /// Session affinity.
    pub session_affinity: SessionAffinity,
    /// `externalTrafficPolicy: Local` on a Service that has external destinations
    /// (upstream's `ExternalPolicyLocal()`).
    pub external_policy_local: bool,
    /// `internalTrafficPolicy: Local`.
    pub internal_policy_local: bool,
    /// `spec.healthCheckNodePort`, when external policy is Local.
    pub health_check_node_port: Option<u16>,
    /// `spec.trafficDistribution`.
    pub traffic_distribution: Option<TrafficDistribution>,
}

impl ServicePortInfo {
    /// Whether the port can be reached from outside the cluster network: it has a NodePort,
    /// external IPs or load-balancer VIPs (upstream's `ExternallyAccessible()`).
    pub fn externally_accessible(&self) -> bool {
        self.node_port.is_some()
            || !self.external_ips.is_empty()
            || !self.load_balancer_vips.is_empty()
    }

    /// Whether some traffic to this port uses cluster-wide endpoints: internal traffic under
    /// Cluster policy, or any external traffic (even under `externalTrafficPolicy: Local`,
    /// pod and node traffic to an external address is short-circuited to the Cluster-policy
    /// endpoints), as upstream's `UsesClusterEndpoints`.
    pub fn uses_cluster_endpoints(&self) -> bool {
        !self.internal_policy_local || self.externally_accessible()
    }

    /// Whether some traffic to this port uses only node-local endpoints.
    pub fn uses_local_endpoints(&self) -> bool {
        self.internal_policy_local || (self.externally_accessible() && self.external_policy_local)
    }
}

/// One endpoint of one ServicePortName, as the tracker resolved it from EndpointSlices.
///
/// `Display` prints `ip:port` (`[ip]:port` for IPv6): upstream's `Endpoint.String()`, which
/// is hashed into `KUBE-SEP-` chain names and used for ordering.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// The endpoint's address.
    pub ip: IpAddr,
    /// The target port (from the slice's port of the same name).
    pub port: u16,
    /// `nodeName` equals this node's name.
    pub is_local: bool,
    /// Ready (serving and not terminating).
    pub ready: bool,
    /// Serving (passing readiness, maybe terminating).
    pub serving: bool,
    /// Terminating.
    pub terminating: bool,
    /// The slice entry's zone and hints, when it has any: the tracker's allocation, shared
    /// (an endpoint is 32 bytes; with the two hint sets inline it was 56).
    pub topology: Option<Arc<EndpointTopology>>,
}

impl Endpoint {
    /// Zone hints, when the slice carries hints.
    pub fn zone_hints(&self) -> Option<&HintSet> {
        self.topology.as_ref().and_then(|t| t.zone_hints.as_ref())
    }

    /// Node hints, when the slice carries hints.
    pub fn node_hints(&self) -> Option<&HintSet> {
        self.topology.as_ref().and_then(|t| t.node_hints.as_ref())
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ip {
            IpAddr::V4(ip) => write!(f, "{ip}:{}", self.port),
            IpAddr::V6(ip) => write!(f, "[{ip}]:{}", self.port),
        }
    }
}

/// Everything a proxier needs for one sync of one IP family. Immutable once checked out;
/// shared with `Arc` so unchanged entries are not copied between syncs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The family every address in this snapshot belongs to.
    pub family: IpFamily,
    /// This node's name (`--hostname-override` or the host name).
    pub node_name: String,
    /// This node's labels, for topology-aware routing.
    pub node_labels: BTreeMap<String, String>,
    /// This node's addresses of this family from its Node object (InternalIP first), for
    /// `--nodeport-addresses primary` and the loadBalancerSourceRanges "node IP" rule.
    pub node_ips: Vec<IpAddr>,
    /// This node's pod CIDRs of this family (`spec.podCIDRs`), for
    /// `--detect-local-mode NodeCIDR`.
    pub node_pod_cidrs: Vec<IpNet>,
    /// Every proxied ServicePortName.
    pub services: BTreeMap<ServicePortName, Arc<ServicePortInfo>>,
    /// Endpoints per ServicePortName, sorted by their `ip:port` text like upstream; only
    /// ServicePortNames with at least one endpoint appear.
    pub endpoints: BTreeMap<ServicePortName, Arc<[Endpoint]>>,
    /// The Service CIDRs of this family (`spec.cidrs` of every ServiceCIDR object: upstream's
    /// `OnServiceCIDRsChanged` list), sorted, each once, and without a CIDR that another one
    /// contains. nftables mode drops traffic to their addresses that are no ClusterIP.
    pub service_cidrs: Vec<IpNet>,
}

impl Snapshot {
    /// An empty snapshot for `family` on node `node_name`.
    pub fn empty(family: IpFamily, node_name: impl Into<String>) -> Self {
        Snapshot {
            family,
            node_name: node_name.into(),
            node_labels: BTreeMap::new(),
            node_ips: Vec::new(),
            node_pod_cidrs: Vec::new(),
            services: BTreeMap::new(),
            endpoints: BTreeMap::new(),
            service_cidrs: Vec::new(),
        }
    }

    /// The endpoints of `name` (empty when it has none).
    pub fn endpoints_of(&self, name: &ServicePortName) -> &[Endpoint] {
        self.endpoints.get(name).map(|e| &e[..]).unwrap_or(&[])
    }
}

/// What changed between two checkouts of the tracker.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Services whose Service object or EndpointSlices changed (added, modified, deleted).
    pub services: BTreeSet<NamespacedName>,
    /// Something changed that affects every Service (node labels used for topology); the
    /// proxier must re-render everything.
    pub full_resync_needed: bool,
    /// `endpoints.kubernetes.io/last-change-trigger-time` (RFC 3339) of the EndpointSlices
    /// that changed, for the network-programming-latency metric.
    pub trigger_times: Vec<String>,
}

impl Changes {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.services.is_empty() && !self.full_resync_needed
    }
}
