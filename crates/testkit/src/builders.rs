//! Builders for model objects and snapshots, so tests say what matters about a Service and
//! leave the rest at the API's defaults.
//!
//! ```
//! use kp_model::IpFamily;
//! use kp_testkit::builders::{ServiceBuilder, SliceBuilder, snapshot};
//!
//! let svc = ServiceBuilder::new("default/web", "10.96.0.10").tcp("", 80).node_port(30080).build();
//! let eps = SliceBuilder::new("default/web").port("", 8080).ready("10.0.0.4", "node-a").build();
//! let snap = snapshot(IpFamily::V4, "node-a", vec![svc], vec![eps]);
//! assert_eq!(snap.services.len(), 1);
//! ```

use std::net::IpAddr;

use ipnet::IpNet;
use kp_model::{
    EndpointConditions, EndpointEntry, EndpointPort, EndpointSlice, EndpointTopology, IpFamily,
    LoadBalancerIngress, LoadBalancerIpMode, NamespacedName, Node, ObjectKind, Protocol, Service,
    ServiceCidr, ServicePortSpec, ServiceType, SessionAffinity, SliceAddressType, Snapshot,
    SourceEvent, TrafficPolicy,
};
use kp_track::Tracker;

/// Parses an address; panics on a typo (test input only).
pub fn ip(s: &str) -> IpAddr {
    s.parse()
        .unwrap_or_else(|_| panic!("test address {s:?} does not parse"))
}

fn nsn(name: &str) -> NamespacedName {
    match name.split_once('/') {
        Some((ns, n)) => NamespacedName::new(ns, n),
        None => NamespacedName::new("default", name),
    }
}

/// Builds a [`Service`]; `name` is `namespace/name` (or just `name` in `default`).
#[derive(Debug, Clone)]
pub struct ServiceBuilder {
    svc: Service,
}

impl ServiceBuilder {
    /// A ClusterIP Service without ports.
    pub fn new(name: &str, cluster_ip: &str) -> Self {
        ServiceBuilder {
            svc: Service::cluster_ip(nsn(name), ip(cluster_ip), Vec::new()),
        }
    }

    /// Adds a cluster IP of the other family (dual-stack).
    pub fn also_cluster_ip(mut self, cluster_ip: &str) -> Self {
        self.svc.cluster_ips.push(ip(cluster_ip));
        self
    }

    /// Adds a port.
    pub fn port(mut self, name: &str, protocol: Protocol, port: u16) -> Self {
        self.svc.ports.push(ServicePortSpec {
            name: name.into(),
            protocol,
            port,
            node_port: None,
        });
        self
    }

    /// Adds a TCP port.
    pub fn tcp(self, name: &str, port: u16) -> Self {
        self.port(name, Protocol::Tcp, port)
    }

    /// Adds a UDP port.
    pub fn udp(self, name: &str, port: u16) -> Self {
        self.port(name, Protocol::Udp, port)
    }

    /// Gives the last port a NodePort and makes the Service `type: NodePort` (unless it is
    /// already a LoadBalancer).
    pub fn node_port(mut self, node_port: u16) -> Self {
        if let Some(p) = self.svc.ports.last_mut() {
            p.node_port = Some(node_port);
        }
        if self.svc.service_type == ServiceType::ClusterIp {
            self.svc.service_type = ServiceType::NodePort;
        }
        self
    }

    /// Makes it `type: LoadBalancer` with these ingress IPs in VIP mode.
    pub fn load_balancer(mut self, ips: &[&str]) -> Self {
        self.svc.service_type = ServiceType::LoadBalancer;
        self.svc
            .load_balancer_ingress
            .extend(ips.iter().map(|i| LoadBalancerIngress {
                ip: ip(i),
                ip_mode: LoadBalancerIpMode::Vip,
            }));
        self
    }

    /// Adds a load-balancer ingress IP in `Proxy` mode.
    pub fn load_balancer_proxy_mode(mut self, lb_ip: &str) -> Self {
        self.svc.service_type = ServiceType::LoadBalancer;
        self.svc.load_balancer_ingress.push(LoadBalancerIngress {
            ip: ip(lb_ip),
            ip_mode: LoadBalancerIpMode::Proxy,
        });
        self
    }

    /// Sets `spec.loadBalancerSourceRanges`.
    pub fn source_ranges(mut self, ranges: &[&str]) -> Self {
        self.svc.load_balancer_source_ranges = ranges
            .iter()
            .map(|r| {
                r.parse::<IpNet>()
                    .unwrap_or_else(|_| panic!("bad CIDR {r}"))
            })
            .collect();
        self
    }

    /// Sets `spec.externalIPs`.
    pub fn external_ips(mut self, ips: &[&str]) -> Self {
        self.svc.external_ips = ips.iter().map(|i| ip(i)).collect();
        self
    }

    /// `externalTrafficPolicy: Local` with this `healthCheckNodePort`.
    pub fn external_local(mut self, health_check_node_port: Option<u16>) -> Self {
        self.svc.external_traffic_policy = TrafficPolicy::Local;
        self.svc.health_check_node_port = health_check_node_port;
        self
    }

    /// `internalTrafficPolicy: Local`.
    pub fn internal_local(mut self) -> Self {
        self.svc.internal_traffic_policy = TrafficPolicy::Local;
        self
    }

    /// `sessionAffinity: ClientIP` with this timeout.
    pub fn affinity(mut self, timeout_seconds: u32) -> Self {
        self.svc.session_affinity = SessionAffinity::ClientIp { timeout_seconds };
        self
    }

    /// The Service.
    pub fn build(self) -> Service {
        self.svc
    }
}

/// Builds an [`EndpointSlice`] for a Service (`namespace/name`); the slice is named
/// `<service>-<n>` where `n` is given by [`SliceBuilder::named`] (default `abcde`).
#[derive(Debug, Clone)]
pub struct SliceBuilder {
    slice: EndpointSlice,
}

impl SliceBuilder {
    /// An IPv4 slice for `service` without ports or endpoints.
    pub fn new(service: &str) -> Self {
        let svc = nsn(service);
        SliceBuilder {
            slice: EndpointSlice {
                name: NamespacedName::new(svc.namespace.clone(), format!("{}-abcde", svc.name)),
                service: svc,
                address_type: SliceAddressType::V4,
                ports: Vec::new(),
                endpoints: Vec::new(),
                last_change_trigger_time: None,
            },
        }
    }

    /// Renames the slice (a Service may have several).
    pub fn named(mut self, name: &str) -> Self {
        self.slice.name.name = name.into();
        self
    }

    /// Makes it an IPv6 slice.
    pub fn ipv6(mut self) -> Self {
        self.slice.address_type = SliceAddressType::V6;
        self
    }

    /// Adds a TCP port.
    pub fn port(self, name: &str, port: u16) -> Self {
        self.port_proto(name, Protocol::Tcp, port)
    }

    /// Adds a port with a protocol.
    pub fn port_proto(mut self, name: &str, protocol: Protocol, port: u16) -> Self {
        self.slice.ports.push(EndpointPort {
            name: name.into(),
            protocol,
            port,
        });
        self
    }

    /// Adds a ready endpoint on `node`.
    pub fn ready(mut self, address: &str, node: &str) -> Self {
        self.slice
            .endpoints
            .push(EndpointEntry::ready(ip(address), Some(node)));
        self
    }

    /// Adds a ready endpoint whose entry has no `nodeName` (manually managed slices, old
    /// controllers): no node counts it as local.
    pub fn ready_without_node(mut self, address: &str) -> Self {
        self.slice
            .endpoints
            .push(EndpointEntry::ready(ip(address), None));
        self
    }

    /// Adds an endpoint with explicit conditions.
    pub fn endpoint(
        mut self,
        address: &str,
        node: &str,
        ready: bool,
        serving: bool,
        terminating: bool,
    ) -> Self {
        let mut e = EndpointEntry::ready(ip(address), Some(node));
        e.conditions = EndpointConditions {
            ready,
            serving,
            terminating,
        };
        self.slice.endpoints.push(e);
        self
    }

    /// Sets zone hints on the last endpoint.
    pub fn zone_hints(mut self, zones: &[&str]) -> Self {
        if let Some(e) = self.slice.endpoints.last_mut() {
            EndpointTopology::edit(&mut e.topology).zone_hints =
                Some(zones.iter().map(|z| z.to_string()).collect());
        }
        self
    }

    /// Sets node hints on the last endpoint.
    pub fn node_hints(mut self, nodes: &[&str]) -> Self {
        if let Some(e) = self.slice.endpoints.last_mut() {
            EndpointTopology::edit(&mut e.topology).node_hints =
                Some(nodes.iter().map(|n| n.to_string()).collect());
        }
        self
    }

    /// The slice.
    pub fn build(self) -> EndpointSlice {
        self.slice
    }
}

/// A snapshot as the tracker builds it for `family` on `node` from these objects (all three
/// kinds reported synced).
pub fn snapshot(
    family: IpFamily,
    node: &str,
    services: Vec<Service>,
    slices: Vec<EndpointSlice>,
) -> Snapshot {
    snapshot_with_node(family, node, None, services, slices)
}

/// A tracker for `family` on node `node` whose Services, EndpointSlices and Nodes have all
/// delivered their (empty) initial lists, so it checks out snapshots at once.
pub fn synced_tracker(family: IpFamily, node: &str) -> Tracker {
    let mut t = Tracker::new(family, node);
    for k in [
        ObjectKind::Service,
        ObjectKind::EndpointSlice,
        ObjectKind::Node,
    ] {
        t.apply(SourceEvent::Synced(k));
    }
    t
}

/// As [`snapshot`], with this node's Node object (labels, addresses, pod CIDRs).
pub fn snapshot_with_node(
    family: IpFamily,
    node: &str,
    node_object: Option<Node>,
    services: Vec<Service>,
    slices: Vec<EndpointSlice>,
) -> Snapshot {
    snapshot_with_service_cidrs(family, node, node_object, services, slices, Vec::new())
}

/// As [`snapshot_with_node`], with ServiceCIDR objects (the snapshot keeps those of
/// `family`).
pub fn snapshot_with_service_cidrs(
    family: IpFamily,
    node: &str,
    node_object: Option<Node>,
    services: Vec<Service>,
    slices: Vec<EndpointSlice>,
    service_cidrs: Vec<ServiceCidr>,
) -> Snapshot {
    let mut t = synced_tracker(family, node);
    if let Some(n) = node_object {
        t.apply(SourceEvent::NodeUpsert(n));
    }
    for sc in service_cidrs {
        t.apply(SourceEvent::ServiceCidrUpsert(sc));
    }
    for s in services {
        t.apply(SourceEvent::ServiceUpsert(s));
    }
    for s in slices {
        t.apply(SourceEvent::SliceUpsert(s));
    }
    (*t.checkout().0).clone()
}
