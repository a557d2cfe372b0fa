//! Validated objects as the source delivers them: [`Service`], [`EndpointSlice`], [`Node`],
//! [`ServiceCidr`].
//!
//! These carry only the fields a service proxy reads (upstream kube-proxy's informers see the
//! same subset). Every value has been validated by the source: addresses parsed, ports in
//! range, names valid, so later layers never re-check them.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use crate::{HintSet, NamespacedName, Protocol, SharedStr};

/// `spec.type` of a Service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ServiceType {
    /// `ClusterIP` (the default).
    #[default]
    ClusterIp,
    /// `NodePort`.
    NodePort,
    /// `LoadBalancer`.
    LoadBalancer,
    /// `ExternalName`: a DNS alias, never proxied.
    ExternalName,
}

/// `spec.externalTrafficPolicy` / `spec.internalTrafficPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TrafficPolicy {
    /// `Cluster` (the default): any ready endpoint in the cluster.
    #[default]
    Cluster,
    /// `Local`: only endpoints on this node.
    Local,
}

/// `spec.sessionAffinity` with its timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SessionAffinity {
    /// No affinity (the default).
    #[default]
    None,
    /// `ClientIP`: a client keeps its endpoint for `timeout_seconds` (API default 10800).
    ClientIp {
        /// `sessionAffinityConfig.clientIP.timeoutSeconds`, 1..=86400.
        timeout_seconds: u32,
    },
}

/// `spec.trafficDistribution`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TrafficDistribution {
    /// `PreferClose` (the older spelling) or `PreferSameZone`: use zone hints.
    PreferSameZone,
    /// `PreferSameNode`: use node hints.
    PreferSameNode,
    /// Any other value; ignored, like upstream ignores values it does not know.
    Other(String),
}

/// `status.loadBalancer.ingress[].ipMode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LoadBalancerIpMode {
    /// `VIP` (the default): traffic arrives with the LB IP as destination; the proxy captures it.
    #[default]
    Vip,
    /// `Proxy`: the load balancer rewrites the destination; the proxy must not capture the IP.
    Proxy,
}

/// One load-balancer ingress point that has an IP (hostname-only ingresses are dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LoadBalancerIngress {
    /// The ingress IP.
    pub ip: IpAddr,
    /// How traffic to it arrives.
    pub ip_mode: LoadBalancerIpMode,
}

/// One entry of `spec.ports`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServicePortSpec {
    /// `name` (empty when the Service has a single unnamed port).
    pub name: SharedStr,
    /// `protocol` (API default TCP).
    pub protocol: Protocol,
    /// `port`, 1..=65535.
    pub port: u16,
    /// `nodePort`, when allocated (NodePort and LoadBalancer Services).
    pub node_port: Option<u16>,
}

/// A validated `v1.Service`, restricted to what a proxy reads.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Service {
    /// `metadata.namespace` / `metadata.name`.
    pub name: NamespacedName,
    /// `spec.type`.
    pub service_type: ServiceType,
    /// `spec.clusterIPs` (or `spec.clusterIP`), primary first. Empty when unset.
    pub cluster_ips: Vec<IpAddr>,
    /// `spec.clusterIP: None`: a headless Service, never proxied.
    pub headless: bool,
    /// `spec.ports`.
    pub ports: Vec<ServicePortSpec>,
    /// `spec.externalIPs`.
    pub external_ips: Vec<IpAddr>,
    /// `status.loadBalancer.ingress` entries that carry an IP.
    pub load_balancer_ingress: Vec<LoadBalancerIngress>,
    /// `spec.loadBalancerSourceRanges`.
    pub load_balancer_source_ranges: Vec<IpNet>,
    /// `spec.sessionAffinity` and its timeout.
    pub session_affinity: SessionAffinity,
    /// `spec.externalTrafficPolicy`.
    pub external_traffic_policy: TrafficPolicy,
    /// `spec.internalTrafficPolicy`.
    pub internal_traffic_policy: TrafficPolicy,
    /// `spec.healthCheckNodePort`.
    pub health_check_node_port: Option<u16>,
    /// `spec.trafficDistribution`.
    pub traffic_distribution: Option<TrafficDistribution>,
}

impl Service {
    /// A ClusterIP Service with defaults everywhere; a starting point for tests and builders.
    pub fn cluster_ip(
        name: NamespacedName,
        cluster_ip: IpAddr,
        ports: Vec<ServicePortSpec>,
    ) -> Self {
        Service {
            name,
            service_type: ServiceType::ClusterIp,
            cluster_ips: vec![cluster_ip],
            headless: false,
            ports,
            external_ips: Vec::new(),
            load_balancer_ingress: Vec::new(),
            load_balancer_source_ranges: Vec::new(),
            session_affinity: SessionAffinity::None,
            external_traffic_policy: TrafficPolicy::Cluster,
            internal_traffic_policy: TrafficPolicy::Cluster,
            health_check_node_port: None,
            traffic_distribution: None,
        }
    }
}

/// `addressType` of an EndpointSlice that a proxy uses (FQDN slices are dropped at the source).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SliceAddressType {
    /// `IPv4`.
    V4,
    /// `IPv6`.
    V6,
}

/// One entry of an EndpointSlice's `ports`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointPort {
    /// `name`; matched against the Service port's name. Empty when unnamed.
    pub name: SharedStr,
    /// `protocol` (default TCP).
    pub protocol: Protocol,
    /// `port`, 1..=65535 (a slice port without a number is dropped at the source).
    pub port: u16,
}

/// `conditions` of an endpoint, with the API's defaulting already applied: a missing `ready`
/// or `serving` counts as true, a missing `terminating` as false (as upstream reads them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EndpointConditions {
    /// `ready`: serving and not terminating.
    pub ready: bool,
    /// `serving`: passing readiness, whether or not terminating.
    pub serving: bool,
    /// `terminating`: the Pod is being deleted.
    pub terminating: bool,
}

impl Default for EndpointConditions {
    fn default() -> Self {
        Self {
            ready: true,
            serving: true,
            terminating: false,
        }
    }
}

/// One entry of an EndpointSlice's `endpoints`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EndpointEntry {
    /// `addresses[0]` (upstream uses only the first address).
    pub address: IpAddr,
    /// `conditions`.
    pub conditions: EndpointConditions,
    /// `nodeName`.
    pub node_name: Option<SharedStr>,
    /// `zone` and `hints`, when the endpoint has any: one shared allocation (endpoints mostly
    /// repeat them, and the snapshot's [`Endpoint`](crate::Endpoint)s share it), where four
    /// optional fields cost 64 bytes per endpoint.
    pub topology: Option<Arc<EndpointTopology>>,
}

/// An endpoint's `zone` and topology `hints` (`EndpointSlice.endpoints[]`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct EndpointTopology {
    /// `zone`.
    pub zone: Option<SharedStr>,
    /// `hints.forZones[].name`, when hints are present (as a set: order and repeats are not
    /// kept, the proxy only asks whether a name is there).
    pub zone_hints: Option<HintSet>,
    /// `hints.forNodes[].name`, when hints are present (as a set, like `zone_hints`).
    pub node_hints: Option<HintSet>,
}

impl EndpointTopology {
    /// The topology of these parts, `None` when all three are `None`.
    pub fn of(
        zone: Option<SharedStr>,
        zone_hints: Option<HintSet>,
        node_hints: Option<HintSet>,
    ) -> Option<Arc<Self>> {
        (zone.is_some() || zone_hints.is_some() || node_hints.is_some()).then(|| {
            Arc::new(EndpointTopology {
                zone,
                zone_hints,
                node_hints,
            })
        })
    }

    /// The `topology` of an endpoint, made editable (created empty when absent).
    pub fn edit(topology: &mut Option<Arc<Self>>) -> &mut Self {
        Arc::make_mut(topology.get_or_insert_with(Default::default))
    }
}

impl EndpointEntry {
    /// A ready endpoint on `node`, without hints; for tests and builders.
    pub fn ready(address: IpAddr, node: Option<&str>) -> Self {
        Self {
            address,
            conditions: EndpointConditions::default(),
            node_name: node.map(SharedStr::from),
            topology: None,
        }
    }

    /// `zone`.
    pub fn zone(&self) -> Option<&SharedStr> {
        self.topology.as_ref().and_then(|t| t.zone.as_ref())
    }

    /// `hints.forZones[].name`, when hints are present.
    pub fn zone_hints(&self) -> Option<&HintSet> {
        self.topology.as_ref().and_then(|t| t.zone_hints.as_ref())
    }

    /// `hints.forNodes[].name`, when hints are present.
    pub fn node_hints(&self) -> Option<&HintSet> {
        self.topology.as_ref().and_then(|t| t.node_hints.as_ref())
    }
}

/// A validated `discovery.k8s.io/v1` EndpointSlice with an IP address type.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EndpointSlice {
    /// The slice's own namespace and name.
    pub name: NamespacedName,
    /// The Service it belongs to (label `kubernetes.io/service-name`, same namespace).
    pub service: NamespacedName,
    /// `addressType`.
    pub address_type: SliceAddressType,
    /// `ports`.
    pub ports: Vec<EndpointPort>,
    /// `endpoints`.
    pub endpoints: Vec<EndpointEntry>,
    /// Annotation `endpoints.kubernetes.io/last-change-trigger-time` (RFC 3339), if any; the
    /// start of the network-programming-latency measurement.
    pub last_change_trigger_time: Option<String>,
}

/// A validated `v1.Node`, restricted to what a proxy reads.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Node {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.labels` (topology labels such as `topology.kubernetes.io/zone`).
    pub labels: BTreeMap<String, String>,
    /// `spec.podCIDRs` (or `spec.podCIDR`).
    pub pod_cidrs: Vec<IpNet>,
    /// `status.addresses` of type InternalIP (first; the primary IP is the first of them), then
    /// those of type ExternalIP.
    pub addresses: Vec<IpAddr>,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// The node carries the `ToBeDeletedByClusterAutoscaler` taint.
    pub to_be_deleted_taint: bool,
}

/// A validated `networking.k8s.io/v1` ServiceCIDR: a range ClusterIPs are allocated from.
///
/// Upstream kube-proxy reads only `spec.cidrs` (its `ServiceCIDRConfig` hands the union of
/// every object's CIDRs to the proxier); neither `status.conditions` (`Ready`) nor
/// `metadata.deletionTimestamp` matters: a ServiceCIDR being deleted still holds allocated
/// ClusterIPs until it is gone, so its range stays covered.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct ServiceCidr {
    /// `metadata.name` (ServiceCIDRs are cluster-scoped).
    pub name: String,
    /// `spec.cidrs`: at most two, one per IP family, host bits cleared.
    pub cidrs: Vec<IpNet>,
}
