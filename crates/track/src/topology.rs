//! Endpoint selection: which endpoints each kind of traffic may use.
//!
//! Mirrors upstream kube-proxy's `CategorizeEndpoints`:
//! - *Cluster* traffic uses ready endpoints, filtered by topology hints when every ready
//!   endpoint carries hints and one matches this node (PreferSameNode) or this node's zone
//!   (PreferSameZone); if there is no ready endpoint anywhere it falls back to endpoints that
//!   are serving and terminating.
//! - *Local* traffic uses this node's ready endpoints, else this node's serving and
//!   terminating endpoints.
//! - `all_reachable` is the union a proxier must create endpoint chains for.

use std::collections::BTreeMap;

use kp_model::{Endpoint, ServicePortInfo};

/// The zone label of a Node.
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// The result of [`categorize`]; slices borrow from the snapshot's endpoint list and keep its
/// order (sorted by `ip:port`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Categorized<'a> {
    /// Endpoints for traffic under Cluster policy (empty when no traffic uses it).
    pub cluster: Vec<&'a Endpoint>,
    /// Endpoints for traffic under Local policy (empty when no traffic uses it).
    pub local: Vec<&'a Endpoint>,
    /// Every endpoint some traffic can reach: the union of `cluster` and `local`.
    pub all_reachable: Vec<&'a Endpoint>,
    /// Whether the Service has a usable endpoint anywhere in the cluster, on this node or
    /// not; when false, the Service is treated as having no endpoints (REJECT).
    pub has_any: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TopologyMode {
    None,
    SameNode,
    SameZone,
}

fn topology_mode(endpoints: &[Endpoint], node_name: &str, zone: Option<&str>) -> TopologyMode {
    let mut all_node_hints = true;
    let mut hint_for_node = false;
    let mut all_zone_hints = true;
    let mut hint_for_zone = false;
    let mut any_ready = false;
    for ep in endpoints.iter().filter(|e| e.ready) {
        any_ready = true;
        match ep.node_hints() {
            Some(h) if !h.is_empty() => hint_for_node |= h.contains(node_name),
            _ => all_node_hints = false,
        }
        match ep.zone_hints() {
            Some(h) if !h.is_empty() => hint_for_zone |= zone.is_some_and(|z| h.contains(z)),
            _ => all_zone_hints = false,
        }
    }
    if !any_ready {
        return TopologyMode::None;
    }
    if all_node_hints && hint_for_node {
        TopologyMode::SameNode
    } else if all_zone_hints && hint_for_zone {
        TopologyMode::SameZone
    } else {
        TopologyMode::None
    }
}

fn topology_allows(ep: &Endpoint, mode: TopologyMode, node_name: &str, zone: Option<&str>) -> bool {
    match mode {
        TopologyMode::None => true,
        TopologyMode::SameNode => ep.node_hints().is_some_and(|h| h.contains(node_name)),
        TopologyMode::SameZone => ep
            .zone_hints()
            .is_some_and(|h| zone.is_some_and(|z| h.contains(z))),
    }
}

fn select(endpoints: &[Endpoint], keep: impl Fn(&Endpoint) -> bool) -> Vec<usize> {
    endpoints
        .iter()
        .enumerate()
        .filter(|(_, e)| keep(e))
        .map(|(i, _)| i)
        .collect()
}

/// Splits `endpoints` (one ServicePortName's endpoints, sorted) by the kind of traffic that
/// may use them, for the port `svc` on node `node_name` with labels `node_labels`.
pub fn categorize<'a>(
    svc: &ServicePortInfo,
    endpoints: &'a [Endpoint],
    node_name: &str,
    node_labels: &BTreeMap<String, String>,
) -> Categorized<'a> {
    let mut has_any = false;
    let mut cluster = Vec::new();
    if svc.uses_cluster_endpoints() {
        let zone = node_labels.get(ZONE_LABEL).map(String::as_str);
        let mode = topology_mode(endpoints, node_name, zone);
        cluster = select(endpoints, |e| {
            e.ready && topology_allows(e, mode, node_name, zone)
        });
        if cluster.is_empty() {
            cluster = select(endpoints, |e| e.serving && e.terminating);
        }
        has_any = !cluster.is_empty();
    }
    let mut local = Vec::new();
    if svc.uses_local_endpoints() {
        let mut local_ready = false;
        let mut local_terminating = false;
        for e in endpoints {
            if e.ready {
                has_any = true;
                local_ready |= e.is_local;
            } else if e.serving && e.terminating {
                has_any = true;
                local_terminating |= e.is_local;
            }
        }
        if local_ready {
            local = select(endpoints, |e| e.is_local && e.ready);
        } else if local_terminating {
            local = select(endpoints, |e| e.is_local && e.serving && e.terminating);
        }
    }
    // Union of two sorted index lists, in the snapshot's order.
    let mut all = Vec::with_capacity(cluster.len().max(local.len()));
    let (mut i, mut j) = (0, 0);
    while i < cluster.len() || j < local.len() {
        let next = match (cluster.get(i), local.get(j)) {
            (Some(&a), Some(&b)) if a == b => {
                i += 1;
                j += 1;
                a
            }
            (Some(&a), Some(&b)) if a < b => {
                i += 1;
                a
            }
            (Some(_), Some(&b)) | (None, Some(&b)) => {
                j += 1;
                b
            }
            (Some(&a), None) => {
                i += 1;
                a
            }
            (None, None) => break,
        };
        all.push(next);
    }
    let refs = |idx: Vec<usize>| idx.into_iter().map(|i| &endpoints[i]).collect::<Vec<_>>();
    Categorized {
        cluster: refs(cluster),
        local: refs(local),
        all_reachable: refs(all),
        has_any,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kp_model::{EndpointTopology, HintSet};
    use kp_model::{NamespacedName, Protocol, ServicePortName, ServiceType, SessionAffinity};

    fn info(internal_local: bool, external_local: bool, node_port: bool) -> ServicePortInfo {
        ServicePortInfo {
            name: ServicePortName::new(NamespacedName::new("ns", "s"), "", Protocol::Tcp),
            service_type: if node_port {
                ServiceType::NodePort
            } else {
                ServiceType::ClusterIp
            },
            cluster_ip: "10.96.0.1".parse().unwrap(),
            port: 80,
            node_port: node_port.then_some(30080),
            external_ips: vec![],
            load_balancer_vips: vec![],
            load_balancer_source_ranges: vec![],
            session_affinity: SessionAffinity::None,
            external_policy_local: external_local,
            internal_policy_local: internal_local,
            health_check_node_port: None,
            traffic_distribution: None,
        }
    }

    fn ep(last: u8, local: bool, ready: bool, serving: bool, terminating: bool) -> Endpoint {
        Endpoint {
            ip: format!("10.0.0.{last}").parse().unwrap(),
            port: 80,
            is_local: local,
            ready,
            serving,
            terminating,
            topology: None,
        }
    }

    fn ips(v: &[&Endpoint]) -> Vec<String> {
        v.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn cluster_policy_uses_ready_then_terminating() {
        let eps = vec![
            ep(1, false, true, true, false),
            ep(2, true, false, true, true),
            ep(3, false, false, false, true),
        ];
        let c = categorize(&info(false, false, false), &eps, "n1", &BTreeMap::new());
        assert_eq!(ips(&c.cluster), ["10.0.0.1:80"]);
        assert!(c.local.is_empty());
        assert_eq!(ips(&c.all_reachable), ["10.0.0.1:80"]);
        assert!(c.has_any);
        // No ready endpoint anywhere: serving+terminating ones are used.
        let eps = vec![
            ep(2, true, false, true, true),
            ep(3, false, false, false, true),
        ];
        let c = categorize(&info(false, false, false), &eps, "n1", &BTreeMap::new());
        assert_eq!(ips(&c.cluster), ["10.0.0.2:80"]);
        // Not serving at all: nothing.
        let eps = vec![ep(3, false, false, false, true)];
        let c = categorize(&info(false, false, false), &eps, "n1", &BTreeMap::new());
        assert!(c.cluster.is_empty() && !c.has_any);
    }

    #[test]
    fn local_policies() {
        let eps = vec![
            ep(1, false, true, true, false),
            ep(2, true, true, true, false),
            ep(3, true, false, true, true),
        ];
        // internalTrafficPolicy Local, ClusterIP only: only local ready endpoints.
        let c = categorize(&info(true, false, false), &eps, "n1", &BTreeMap::new());
        assert!(c.cluster.is_empty());
        assert_eq!(ips(&c.local), ["10.0.0.2:80"]);
        assert_eq!(ips(&c.all_reachable), ["10.0.0.2:80"]);
        assert!(c.has_any);
        // externalTrafficPolicy Local on a NodePort: cluster for internal, local for external.
        let c = categorize(&info(false, true, true), &eps, "n1", &BTreeMap::new());
        assert_eq!(ips(&c.cluster), ["10.0.0.1:80", "10.0.0.2:80"]);
        assert_eq!(ips(&c.local), ["10.0.0.2:80"]);
        assert_eq!(ips(&c.all_reachable), ["10.0.0.1:80", "10.0.0.2:80"]);
        // No local ready endpoint: local serving+terminating endpoints are used for Local.
        let eps = vec![
            ep(1, false, true, true, false),
            ep(3, true, false, true, true),
        ];
        let c = categorize(&info(false, true, true), &eps, "n1", &BTreeMap::new());
        assert_eq!(ips(&c.local), ["10.0.0.3:80"]);
        assert_eq!(ips(&c.all_reachable), ["10.0.0.1:80", "10.0.0.3:80"]);
        // No local endpoint at all, but a remote one: has_any stays true.
        let eps = vec![ep(1, false, true, true, false)];
        let c = categorize(&info(true, false, false), &eps, "n1", &BTreeMap::new());
        assert!(c.local.is_empty() && c.all_reachable.is_empty() && c.has_any);
    }

    #[test]
    fn topology_hints() {
        let zone = |e: &mut Endpoint, z: &str| {
            EndpointTopology::edit(&mut e.topology).zone_hints = Some(HintSet::from_iter([z]))
        };
        let mut a = ep(1, false, true, true, false);
        let mut b = ep(2, false, true, true, false);
        zone(&mut a, "za");
        zone(&mut b, "zb");
        let labels = BTreeMap::from([(ZONE_LABEL.to_string(), "zb".to_string())]);
        let eps = vec![a.clone(), b.clone()];
        let c = categorize(&info(false, false, false), &eps, "n1", &labels);
        assert_eq!(
            ips(&c.cluster),
            ["10.0.0.2:80"],
            "PreferSameZone keeps this zone's endpoints"
        );
        // A zone without hints: hints ignored.
        let other = BTreeMap::from([(ZONE_LABEL.to_string(), "zc".to_string())]);
        let c = categorize(&info(false, false, false), &eps, "n1", &other);
        assert_eq!(c.cluster.len(), 2);
        // One endpoint without hints: hints ignored.
        let eps2 = vec![a.clone(), ep(3, false, true, true, false)];
        let c = categorize(&info(false, false, false), &eps2, "n1", &labels);
        assert_eq!(c.cluster.len(), 2);
        // Node hints win over zone hints when every endpoint has them and one names this node.
        EndpointTopology::edit(&mut a.topology).node_hints = Some(HintSet::from_iter(["n1"]));
        EndpointTopology::edit(&mut b.topology).node_hints = Some(HintSet::from_iter(["n2"]));
        let eps = vec![a, b];
        let c = categorize(&info(false, false, false), &eps, "n1", &labels);
        assert_eq!(ips(&c.cluster), ["10.0.0.1:80"]);
    }
}
