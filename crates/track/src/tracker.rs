//! [`Tracker`]: objects in, per-family snapshots and change sets out.
//!
//! As it rebuilds a Service, the tracker also warns (once per conflict; see [`claims`]) when
//! two Services claim the same destination: IP, port and protocol, or node port.

mod claims;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use claims::{Claims, Destination, Name, Role};
use ipnet::IpNet;
use kp_model::{
    Changes, Endpoint, EndpointSlice, Interner, IpFamily, NamespacedName, Node, ObjectKind,
    Protocol, Service, ServicePortInfo, ServicePortName, ServiceType, SliceAddressType, Snapshot,
    SourceEvent, TrafficPolicy,
};

/// Node labels that matter for topology-aware routing; a change to one of them (or to the
/// node's pod CIDRs or addresses, which rules may embed) forces a full resync (upstream's
/// `OnTopologyChange`).
const TOPOLOGY_LABELS: [&str; 3] = [
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "kubernetes.io/hostname",
];

/// Change tracker for one IP family on one node.
///
/// Feed it [`SourceEvent`]s with [`Tracker::apply`]; take a consistent view with
/// [`Tracker::checkout`]. Applying an object equal to the one held is a no-op, so sources may
/// repeat objects freely. The tracker is initialized once Services and EndpointSlices have
/// both reported their initial list ([`SourceEvent::Synced`]); a proxier must not sync before
/// (it would program a partial view and then delete rules of Services not yet seen).
#[derive(Debug)]
pub struct Tracker {
    family: IpFamily,
    node_name: String,
    services: HashMap<NamespacedName, Service>,
    /// Slices grouped by the Service they belong to, sorted by slice name (so merging is
    /// deterministic). A Service has few slices, usually one: a sorted `Vec` costs one
    /// allocation of exactly the slices, where a `BTreeMap` node holds room for eleven.
    slices: HashMap<NamespacedName, Vec<EndpointSlice>>,
    /// Slice name → Service it currently belongs to (a slice's label may change).
    slice_owner: HashMap<NamespacedName, NamespacedName>,
    node: Option<Node>,
    synced: BTreeSet<ObjectKind>,
    dirty: BTreeSet<NamespacedName>,
    /// Of `dirty`: Services whose Service object changed, and Services whose EndpointSlices
    /// changed (upstream's pending service and endpoint changes, for the metrics).
    dirty_service_objects: BTreeSet<NamespacedName>,
    dirty_slices: BTreeSet<NamespacedName>,
    full_resync_needed: bool,
    /// The view as of the last checkout, shared with the proxier: changed in place
    /// ([`Arc::make_mut`]) when the previous checkout's copy is no longer held, else copied
    /// once, so a one-Service change does not copy the maps of every Service.
    current: Arc<Snapshot>,
    /// Shares repeated texts (namespaces, port names, node names, zones, hints) between all
    /// the objects held.
    interner: Interner,
    /// Trigger times of slices changed since the last checkout.
    trigger_times: Vec<String>,
    /// Node objects for other nodes were seen (so a missing own Node is worth a warning).
    seen_other_nodes: bool,
    /// The missing-Node warning was given.
    warned_no_node: bool,
    /// The destinations each proxied Service claims, to warn once about two Services
    /// claiming the same one.
    claims: Claims,
    /// `--bind-address`, when it is an address of this family: this node's primary IP,
    /// whatever the Node object says.
    primary_ip: Option<IpAddr>,
    /// The CIDRs of this family of each ServiceCIDR object, by object name (objects with
    /// none of this family are not kept).
    service_cidrs: BTreeMap<String, Vec<IpNet>>,
    /// The Service CIDRs may differ from the last checkout's.
    service_cidrs_changed: bool,
}

/// How many Services have changes waiting for the next sync, by what changed; a Service whose
/// object and slices both changed counts in both.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PendingChanges {
    /// Services whose Service object was added, changed or deleted.
    pub services: usize,
    /// Services whose EndpointSlices were added, changed or deleted.
    pub endpoints: usize,
}

impl Tracker {
    /// A tracker for `family` on the node named `node_name` (which decides which endpoints
    /// are local).
    pub fn new(family: IpFamily, node_name: impl Into<String>) -> Self {
        let node_name = node_name.into();
        Tracker {
            family,
            current: Arc::new(Snapshot::empty(family, node_name.clone())),
            node_name,
            services: HashMap::new(),
            slices: HashMap::new(),
            slice_owner: HashMap::new(),
            node: None,
            synced: BTreeSet::new(),
            dirty: BTreeSet::new(),
            dirty_service_objects: BTreeSet::new(),
            dirty_slices: BTreeSet::new(),
            full_resync_needed: false,
            interner: Interner::new(),
            trigger_times: Vec::new(),
            seen_other_nodes: false,
            warned_no_node: false,
            claims: Claims::default(),
            primary_ip: None,
            service_cidrs: BTreeMap::new(),
            service_cidrs_changed: false,
        }
    }

    /// Takes `ip` as this node's primary IP of its family, before the Node object's
    /// addresses, as upstream does with `--bind-address` (its historical name: no socket is
    /// bound). The primary IP is the one `--nodeport-addresses primary` serves NodePorts on
    /// and the one checked against loadBalancerSourceRanges for traffic from the node
    /// itself. An unspecified address (`0.0.0.0`, `::`) or one of the other family changes
    /// nothing.
    pub fn with_primary_ip(mut self, ip: IpAddr) -> Self {
        if !ip.is_unspecified() && self.family.contains(&ip) {
            self.primary_ip = Some(ip);
        }
        self
    }

    /// Leaves the warning about a missing own Node object to another tracker: a dual-stack
    /// proxy runs one tracker per family over the same Nodes, and says it once.
    pub fn without_missing_node_warning(mut self) -> Self {
        self.warned_no_node = true;
        self
    }

    /// The family this tracker builds snapshots for.
    pub fn family(&self) -> IpFamily {
        self.family
    }

    /// The name of the node this tracker programs (`--hostname-override` or the host name).
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// This node's Node object, if the source delivered it.
    pub fn node(&self) -> Option<&Node> {
        self.node.as_ref()
    }

    /// Whether Services and EndpointSlices have both delivered their initial list.
    pub fn is_initialized(&self) -> bool {
        self.synced.contains(&ObjectKind::Service)
            && self.synced.contains(&ObjectKind::EndpointSlice)
    }

    /// Whether changes are waiting for the next checkout.
    pub fn has_pending_changes(&self) -> bool {
        !self.dirty.is_empty() || self.full_resync_needed || self.service_cidrs_changed
    }

    /// Services with changes waiting for the next checkout, by what changed (upstream's
    /// `…service_changes_pending` and `…endpoint_changes_pending` metrics).
    pub fn pending(&self) -> PendingChanges {
        PendingChanges {
            services: self.dirty_service_objects.len(),
            endpoints: self.dirty_slices.len(),
        }
    }

    fn service_changed(&mut self, name: NamespacedName) {
        self.dirty_service_objects.insert(name.clone());
        self.dirty.insert(name);
    }

    fn slices_changed(&mut self, name: NamespacedName) {
        self.dirty_slices.insert(name.clone());
        self.dirty.insert(name);
    }

    /// Applies one event. Returns `true` when it changed something a sync must act on
    /// (including the first `Synced` that completes initialization).
    pub fn apply(&mut self, event: SourceEvent) -> bool {
        match event {
            SourceEvent::ServiceUpsert(mut svc) => {
                // A Service without a ClusterIP of this family (another family's, headless,
                // ExternalName) gives this family nothing to program: it is not kept, as
                // slices of the other family are not (a dual-stack node runs two trackers,
                // and each would otherwise hold every Service). One that had such an IP
                // before is removed.
                if !svc.cluster_ips.iter().any(|ip| self.family.contains(ip)) {
                    return match self.services.remove(&svc.name) {
                        Some(_) => {
                            self.service_changed(svc.name);
                            true
                        }
                        None => false,
                    };
                }
                if self.services.get(&svc.name) == Some(&svc) {
                    return false;
                }
                self.interner.service(&mut svc);
                shrink_service(&mut svc);
                self.service_changed(svc.name.clone());
                self.services.insert(svc.name.clone(), svc);
                true
            }
            SourceEvent::ServiceDelete(name) => {
                if self.services.remove(&name).is_some() {
                    self.service_changed(name);
                    true
                } else {
                    false
                }
            }
            SourceEvent::SliceUpsert(slice) => self.upsert_slice(slice),
            SourceEvent::SliceDelete(name) => self.delete_slice(&name),
            SourceEvent::NodeUpsert(node) => {
                if node.name != self.node_name {
                    self.seen_other_nodes = true;
                    return false;
                }
                let old = self.node.replace(node);
                let new = self.node.as_ref();
                let topology_changed = TOPOLOGY_LABELS.iter().any(|k| {
                    old.as_ref().and_then(|n| n.labels.get(*k))
                        != new.and_then(|n| n.labels.get(*k))
                }) || old.as_ref().map(|n| &n.pod_cidrs)
                    != new.map(|n| &n.pod_cidrs)
                    || old.as_ref().map(|n| &n.addresses) != new.map(|n| &n.addresses);
                if topology_changed {
                    self.full_resync_needed = true;
                }
                topology_changed
            }
            SourceEvent::NodeDelete(name) => {
                if name != self.node_name || self.node.is_none() {
                    return false;
                }
                let had_topology = self.node.take().is_some_and(|n| {
                    TOPOLOGY_LABELS.iter().any(|k| n.labels.contains_key(*k))
                        || !n.pod_cidrs.is_empty()
                        || !n.addresses.is_empty()
                });
                if had_topology {
                    self.full_resync_needed = true;
                }
                had_topology
            }
            SourceEvent::ServiceCidrUpsert(sc) => {
                let nets: Vec<IpNet> = sc
                    .cidrs
                    .into_iter()
                    .filter(|n| self.family.contains(&n.addr()))
                    .collect();
                let held = if nets.is_empty() {
                    self.service_cidrs.remove(&sc.name).is_some()
                } else if self.service_cidrs.get(&sc.name) == Some(&nets) {
                    false
                } else {
                    self.service_cidrs.insert(sc.name, nets);
                    true
                };
                held && self.service_cidrs_moved()
            }
            SourceEvent::ServiceCidrDelete(name) => {
                self.service_cidrs.remove(&name).is_some() && self.service_cidrs_moved()
            }
            SourceEvent::Synced(kind) => {
                let was = self.is_initialized();
                self.synced.insert(kind);
                !was && self.is_initialized()
            }
        }
    }

    /// After a ServiceCIDR change: whether this family's Service CIDRs now differ from the
    /// last checkout's (then the next checkout carries them).
    fn service_cidrs_moved(&mut self) -> bool {
        let moved = effective_service_cidrs(&self.service_cidrs) != self.current.service_cidrs;
        self.service_cidrs_changed |= moved;
        moved
    }

    fn upsert_slice(&mut self, mut slice: EndpointSlice) -> bool {
        let slice_family = match slice.address_type {
            SliceAddressType::V4 => IpFamily::V4,
            SliceAddressType::V6 => IpFamily::V6,
        };
        if slice_family != self.family {
            // Never merged into this family's endpoints (see `merge_slices`), so not kept:
            // a dual-stack proxy holds each slice once, in its family's tracker. A slice's
            // addressType cannot change, but if a copy of this name is held, it goes.
            return self.delete_slice(&slice.name);
        }
        let previous_owner = self.slice_owner.get(&slice.name).cloned();
        if let Some(owner) = &previous_owner {
            if self
                .slices
                .get(owner)
                .and_then(|m| find_slice(m, &slice.name.name).ok().map(|i| &m[i]))
                == Some(&slice)
            {
                return false;
            }
            if *owner != slice.service {
                // The slice moved to another Service: take it out of the old one.
                self.remove_slice_from(owner, &slice.name.name);
                self.slices_changed(owner.clone());
            }
        }
        // Upstream's network-programming latency: one sample per changed slice of this
        // family that carries a trigger time.
        if let Some(t) = &slice.last_change_trigger_time {
            self.trigger_times.push(t.clone());
        }
        self.interner.endpoint_slice(&mut slice);
        // Share the Service's name with the Service object when it is known.
        if let Some((name, _)) = self.services.get_key_value(&slice.service) {
            slice.service = name.clone();
        }
        slice.ports.shrink_to_fit();
        slice.endpoints.shrink_to_fit();
        self.slices_changed(slice.service.clone());
        self.slice_owner
            .insert(slice.name.clone(), slice.service.clone());
        let list = self.slices.entry(slice.service.clone()).or_default();
        match find_slice(list, &slice.name.name) {
            Ok(i) => list[i] = slice,
            Err(i) => {
                // Most Services have one slice: room for exactly one more, not the four a
                // growing Vec takes (10,000 Services x 3 unused slots of ~140 bytes).
                list.reserve_exact(1);
                list.insert(i, slice);
            }
        }
        true
    }

    fn delete_slice(&mut self, name: &NamespacedName) -> bool {
        let Some(owner) = self.slice_owner.remove(name) else {
            return false;
        };
        self.remove_slice_from(&owner, &name.name);
        self.slices_changed(owner);
        true
    }

    fn remove_slice_from(&mut self, owner: &NamespacedName, slice_name: &str) {
        if let Some(m) = self.slices.get_mut(owner) {
            if let Ok(i) = find_slice(m, slice_name) {
                m.remove(i);
            }
            if m.is_empty() {
                self.slices.remove(owner);
            }
        }
    }

    /// Takes the current view and what changed since the previous checkout, and clears the
    /// pending changes. Only changed Services are recomputed.
    pub fn checkout(&mut self) -> (Arc<Snapshot>, Changes) {
        if self.is_initialized()
            && self.node.is_none()
            && self.seen_other_nodes
            && !self.warned_no_node
        {
            self.warned_no_node = true;
            tracing::warn!(
                node = %self.node_name,
                "no Node object named {:?} among the Nodes received: every endpoint is treated as remote (check --hostname-override)",
                self.node_name
            );
        }
        let dirty = std::mem::take(&mut self.dirty);
        self.dirty_service_objects.clear();
        self.dirty_slices.clear();
        for name in &dirty {
            self.rebuild_service(name);
        }
        let node_labels = self
            .node
            .as_ref()
            .map(|n| n.labels.clone())
            .unwrap_or_default();
        let node_ips: Vec<_> = self
            .primary_ip
            .into_iter()
            .chain(
                self.node
                    .iter()
                    .flat_map(|n| n.addresses.iter().copied())
                    .filter(|ip| self.family.contains(ip) && Some(*ip) != self.primary_ip),
            )
            .collect();
        let node_pod_cidrs: Vec<_> = self
            .node
            .as_ref()
            .map(|n| {
                n.pod_cidrs
                    .iter()
                    .copied()
                    .filter(|c| self.family.contains(&c.addr()))
                    .collect()
            })
            .unwrap_or_default();
        if std::mem::take(&mut self.service_cidrs_changed) {
            let cidrs = effective_service_cidrs(&self.service_cidrs);
            if cidrs != self.current.service_cidrs {
                tracing::info!(
                    family = %self.family,
                    service_cidrs = ?cidrs.iter().map(ToString::to_string).collect::<Vec<_>>(),
                    "the Service CIDRs changed"
                );
                Arc::make_mut(&mut self.current).service_cidrs = cidrs;
            }
        }
        if self.current.node_labels != node_labels
            || self.current.node_ips != node_ips
            || self.current.node_pod_cidrs != node_pod_cidrs
        {
            let current = Arc::make_mut(&mut self.current);
            current.node_labels = node_labels;
            current.node_ips = node_ips;
            current.node_pod_cidrs = node_pod_cidrs;
        }
        let changes = Changes {
            services: dirty,
            full_resync_needed: std::mem::take(&mut self.full_resync_needed),
            trigger_times: std::mem::take(&mut self.trigger_times),
        };
        (Arc::clone(&self.current), changes)
    }

    fn rebuild_service(&mut self, name: &NamespacedName) {
        // The Service's ports are a contiguous range of the maps (ServicePortNames order by
        // Service first; the empty port name and TCP sort first).
        let first = ServicePortName::new(name.clone(), "", Protocol::Tcp);
        let old: Vec<(ServicePortName, Arc<ServicePortInfo>)> = self
            .current
            .services
            .range(first..)
            .take_while(|(spn, _)| spn.service == *name)
            .map(|(spn, info)| (spn.clone(), info.clone()))
            .collect();
        // What the Service claimed: its ports as last checked out.
        let old_claims = claims::destinations(old.iter().map(|(_, info)| &**info));
        if !old.is_empty() {
            let current = Arc::make_mut(&mut self.current);
            for (spn, _) in old {
                current.services.remove(&spn);
                current.endpoints.remove(&spn);
            }
        }
        let Some(svc) = self.services.get(name) else {
            self.claim(name, &old_claims, &[]);
            return;
        };
        let infos = service_port_infos(svc, self.family);
        self.claim(name, &old_claims, &claims::destinations(&infos));
        if infos.is_empty() {
            return;
        }
        let mut endpoints = merge_slices(
            self.slices.get(name).map(Vec::as_slice),
            self.family,
            &self.node_name,
        );
        let current = Arc::make_mut(&mut self.current);
        for info in infos {
            let spn = info.name.clone();
            if let Some(eps) = endpoints.remove(&spn) {
                current.endpoints.insert(spn.clone(), eps.into());
            }
            current.services.insert(spn, Arc::new(info));
        }
    }
}

impl Tracker {
    /// Records what `name` claims now, and warns about each conflict with another Service
    /// that was not warned about before.
    fn claim(
        &mut self,
        name: &NamespacedName,
        old: &[(Destination, Role)],
        destinations: &[(Destination, Role)],
    ) {
        for conflict in self.claims.set(name, old, destinations) {
            tracing::warn!(family = %self.family, "{conflict}");
        }
    }
}

/// The Service CIDRs of every ServiceCIDR object (`by_object`), as the snapshot carries
/// them: sorted, each once, and without a CIDR another one contains (two ServiceCIDRs may
/// overlap, as while a range is being replaced by a larger one).
fn effective_service_cidrs(by_object: &BTreeMap<String, Vec<IpNet>>) -> Vec<IpNet> {
    let mut all: Vec<IpNet> = by_object.values().flatten().copied().collect();
    // Wider prefixes sort before the narrower ones at the same address.
    all.sort_by_key(|n| (n.network(), n.prefix_len()));
    all.dedup();
    let mut out: Vec<IpNet> = Vec::with_capacity(all.len());
    for net in all {
        if !out.iter().any(|kept| kept.contains(&net)) {
            out.push(net);
        }
    }
    out
}

/// The index of the slice named `name` in `slices` (sorted by name), or where it would go.
fn find_slice(slices: &[EndpointSlice], name: &str) -> Result<usize, usize> {
    slices.binary_search_by(|s| s.name.name.as_str().cmp(name))
}

/// Drops the spare capacity of a Service's lists: objects are held until replaced.
fn shrink_service(svc: &mut Service) {
    svc.cluster_ips.shrink_to_fit();
    svc.ports.shrink_to_fit();
    svc.external_ips.shrink_to_fit();
    svc.load_balancer_ingress.shrink_to_fit();
    svc.load_balancer_source_ranges.shrink_to_fit();
}

/// Builds the ServicePortInfos of `svc` for `family`; empty when the Service is not proxied
/// in that family (ExternalName, headless, no cluster IP of the family).
pub(crate) fn service_port_infos(svc: &Service, family: IpFamily) -> Vec<ServicePortInfo> {
    if svc.service_type == ServiceType::ExternalName || svc.headless {
        return Vec::new();
    }
    let Some(cluster_ip) = svc
        .cluster_ips
        .iter()
        .copied()
        .find(|ip| family.contains(ip))
    else {
        return Vec::new();
    };
    let has_node_ports = matches!(
        svc.service_type,
        ServiceType::NodePort | ServiceType::LoadBalancer
    );
    let externally_accessible = has_node_ports || !svc.external_ips.is_empty();
    let external_policy_local =
        externally_accessible && svc.external_traffic_policy == TrafficPolicy::Local;
    let health_check_node_port = if svc.service_type == ServiceType::LoadBalancer
        && svc.external_traffic_policy == TrafficPolicy::Local
    {
        svc.health_check_node_port
    } else {
        None
    };
    warn_wrong_family(svc);
    let external_ips: Vec<_> = svc
        .external_ips
        .iter()
        .copied()
        .filter(|ip| family.contains(ip))
        .collect();
    let load_balancer_vips: Vec<_> = if svc.service_type == ServiceType::LoadBalancer {
        svc.load_balancer_ingress
            .iter()
            .filter(|i| i.ip_mode == kp_model::LoadBalancerIpMode::Vip && family.contains(&i.ip))
            .map(|i| i.ip)
            .collect()
    } else {
        Vec::new()
    };
    let load_balancer_source_ranges: Vec<_> = svc
        .load_balancer_source_ranges
        .iter()
        .copied()
        .filter(|net| family.contains(&net.addr()))
        .collect();
    svc.ports
        .iter()
        .map(|p| ServicePortInfo {
            name: ServicePortName::new(svc.name.clone(), p.name.clone(), p.protocol),
            service_type: svc.service_type,
            cluster_ip,
            port: p.port,
            node_port: if has_node_ports { p.node_port } else { None },
            external_ips: external_ips.clone(),
            load_balancer_vips: load_balancer_vips.clone(),
            load_balancer_source_ranges: load_balancer_source_ranges.clone(),
            session_affinity: svc.session_affinity,
            external_policy_local,
            internal_policy_local: svc.internal_traffic_policy == TrafficPolicy::Local,
            health_check_node_port,
            traffic_distribution: svc.traffic_distribution.clone(),
        })
        .collect()
}

/// Logs the addresses of `svc` that no proxier will program: external IPs, load-balancer IPs
/// and source ranges of a family the Service has no cluster IP in (a single-stack Service with
/// an address of the other family). They are skipped, never fatal to the sync.
fn warn_wrong_family(svc: &Service) {
    let served = |ip: &std::net::IpAddr| {
        svc.cluster_ips
            .iter()
            .any(|c| IpFamily::of(c) == IpFamily::of(ip))
    };
    for (i, ip) in svc.external_ips.iter().enumerate() {
        if !served(ip) {
            tracing::warn!(service = %Name(&svc.name), "spec.externalIPs[{i}] {ip} is not of the Service's IP family; ignored");
        }
    }
    for (i, ing) in svc.load_balancer_ingress.iter().enumerate() {
        if !served(&ing.ip) {
            tracing::warn!(service = %Name(&svc.name), "status.loadBalancer.ingress[{i}].ip {} is not of the Service's IP family; ignored", ing.ip);
        }
    }
    for (i, net) in svc.load_balancer_source_ranges.iter().enumerate() {
        if !served(&net.addr()) {
            tracing::warn!(service = %Name(&svc.name), "spec.loadBalancerSourceRanges[{i}] {net} is not of the Service's IP family; ignored");
        }
    }
}

/// An endpoint's `ip:port` text (`[ip]:port` for IPv6) held inline, zero-padded: ordering
/// the arrays orders the texts (text never holds a zero byte, and a prefix sorts first
/// either way), without a String per endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct EndpointKey([u8; 48]);

impl EndpointKey {
    fn of(ep: &Endpoint) -> Self {
        struct Buf {
            bytes: [u8; 48],
            len: usize,
        }
        impl std::fmt::Write for Buf {
            fn write_str(&mut self, s: &str) -> std::fmt::Result {
                let end = self.len + s.len();
                let dst = self.bytes.get_mut(self.len..end).ok_or(std::fmt::Error)?;
                dst.copy_from_slice(s.as_bytes());
                self.len = end;
                Ok(())
            }
        }
        let mut buf = Buf {
            bytes: [0; 48],
            len: 0,
        };
        let _ = std::fmt::Write::write_fmt(&mut buf, format_args!("{ep}"));
        EndpointKey(buf.bytes)
    }
}

/// Merges a Service's slices into endpoints per ServicePortName: slices of another family
/// are ignored, an `ip:port` seen twice is kept once (a local copy wins), and each list is
/// sorted by its `ip:port` text.
pub(crate) fn merge_slices(
    slices: Option<&[EndpointSlice]>,
    family: IpFamily,
    node_name: &str,
) -> HashMap<ServicePortName, Vec<Endpoint>> {
    let mut by_port: HashMap<ServicePortName, BTreeMap<EndpointKey, Endpoint>> = HashMap::new();
    let Some(slices) = slices else {
        return HashMap::new();
    };
    for slice in slices {
        let slice_family = match slice.address_type {
            SliceAddressType::V4 => IpFamily::V4,
            SliceAddressType::V6 => IpFamily::V6,
        };
        if slice_family != family {
            continue;
        }
        for port in &slice.ports {
            let spn = ServicePortName::new(slice.service.clone(), port.name.clone(), port.protocol);
            let set = by_port.entry(spn).or_default();
            for entry in &slice.endpoints {
                if !family.contains(&entry.address) {
                    continue;
                }
                let is_local =
                    !node_name.is_empty() && entry.node_name.as_deref() == Some(node_name);
                let ep = Endpoint {
                    ip: entry.address,
                    port: port.port,
                    is_local,
                    ready: entry.conditions.ready,
                    serving: entry.conditions.serving,
                    terminating: entry.conditions.terminating,
                    topology: entry.topology.clone(),
                };
                let key = EndpointKey::of(&ep);
                match set.get(&key) {
                    Some(_) if !is_local => {}
                    _ => {
                        set.insert(key, ep);
                    }
                }
            }
        }
    }
    by_port
        .into_iter()
        .filter(|(_, set)| !set.is_empty())
        .map(|(spn, set)| (spn, set.into_values().collect()))
        .collect()
}

#[cfg(test)]
mod tests;
