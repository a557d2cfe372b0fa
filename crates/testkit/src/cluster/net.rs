//! The test cluster's network: a LAN namespace with a bridge, one namespace per node on it,
//! and one workload pod behind each worker (the addressing plan is in [`super`]'s
//! documentation). Everything is a kp-testkit [`Netns`], deleted when [`ClusterNet`] is
//! dropped (pods, then nodes, then the LAN).

use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;

use super::state::{NodeState, WorkloadPod};
use crate::netns::topology::{GATEWAY_V4, LAN_BRIDGE, NODE_IF};
use crate::{Error, Netns, Result, add_address, add_route, add_route_dev, veth};

/// The LAN's prefix length and first address (`192.168.56.0/24`).
pub const LAN: Ipv4Addr = Ipv4Addr::new(192, 168, 56, 0);
/// The service CIDR (kubeadm's default).
pub const SERVICE_CIDR: &str = "10.96.0.0/12";
/// The `kubernetes` Service's ClusterIP.
pub const KUBERNETES_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 1);
/// The API server's port on the control plane (kubeadm's).
pub const API_PORT: u16 = 6443;
/// The most workers [`ClusterNet::build`] makes (addresses `.11` to `.30`).
pub const MAX_WORKERS: usize = 20;
/// The port the workload pods' HTTP servers listen on.
pub const WEB_PORT: u16 = 8080;

/// The node names: `master`, then `worker-1` to `worker-<workers>`.
pub fn node_names(workers: usize) -> Vec<String> {
    std::iter::once("master".to_string())
        .chain((1..=workers).map(|i| format!("worker-{i}")))
        .collect()
}

/// Node `i`'s address (`192.168.56.(10+i)`).
pub fn node_ip(i: usize) -> Ipv4Addr {
    let [a, b, c, _] = LAN.octets();
    Ipv4Addr::new(a, b, c, 10 + i as u8)
}

/// Node `i`'s pod CIDR (`10.244.i.0/24`).
pub fn pod_cidr(i: usize) -> IpNet {
    IpNet::new(IpAddr::V4(Ipv4Addr::new(10, 244, i as u8, 0)), 24).expect("a /24")
}

/// The workload pod's address behind node `i` (`10.244.i.10`).
pub fn pod_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 244, i as u8, 10)
}

/// The namespaces, links and routes of a test cluster.
#[derive(Debug)]
pub struct ClusterNet {
    /// The workload pods' namespaces (dropped first).
    pub pods: Vec<(WorkloadPod, Netns)>,
    /// The nodes' namespaces, control plane first.
    pub nodes: Vec<(NodeState, Netns)>,
    /// The LAN namespace holding the bridge (dropped last).
    pub lan: Netns,
}

impl ClusterNet {
    /// Builds the LAN, the control plane `master` and `workers` workers, each worker with one
    /// workload pod; on error, everything made so far is deleted again.
    ///
    /// # Errors
    /// [`Error::Invalid`] for 0 or more than [`MAX_WORKERS`] workers; the errors of
    /// [`Netns::new`] and `ip`.
    pub fn build(workers: usize) -> Result<ClusterNet> {
        if !(1..=MAX_WORKERS).contains(&workers) {
            return Err(Error::invalid(
                "workers",
                format!("{workers}: between 1 and {MAX_WORKERS}"),
            ));
        }
        let lan = Netns::new("lan")?;
        lan.ip([
            "link",
            "add",
            LAN_BRIDGE,
            "type",
            "bridge",
            "forward_delay",
            "0",
        ])?;
        lan.ip(["link", "set", LAN_BRIDGE, "up"])?;
        for key in [
            "bridge-nf-call-iptables",
            "bridge-nf-call-ip6tables",
            "bridge-nf-call-arptables",
        ] {
            // Best effort (only with br_netfilter): keep the switch a plain switch.
            let _ = lan.sysctl(&format!("net.bridge.{key}"), "0");
        }
        let mut net = ClusterNet {
            pods: Vec::new(),
            nodes: Vec::new(),
            lan,
        };
        let names = node_names(workers);
        for (i, name) in names.iter().enumerate() {
            net.add_node(i, name, workers)?;
        }
        for i in 1..names.len() {
            net.add_pod(i)?;
        }
        Ok(net)
    }

    fn add_node(&mut self, i: usize, name: &str, workers: usize) -> Result<()> {
        let ns = Netns::new(name)?;
        let port = format!("p-{i}");
        veth(&ns, NODE_IF, &self.lan, &port)?;
        self.lan
            .ip(["link", "set", port.as_str(), "master", LAN_BRIDGE])?;
        let ip = node_ip(i);
        add_address(&ns, NODE_IF, IpNet::new(IpAddr::V4(ip), 24).expect("a /24"))?;
        ns.sysctl("net.ipv4.ip_forward", "1")?;
        // As in Topology: no ICMP redirects, which would use up the rate-limit token a
        // REJECT's port-unreachable needs.
        for conf in ["all", "default", NODE_IF] {
            ns.sysctl(&format!("net.ipv4.conf.{conf}.send_redirects"), "0")?;
        }
        add_route_dev(
            &ns,
            SERVICE_CIDR.parse().expect("a CIDR"),
            NODE_IF,
            Some(IpAddr::V4(ip)),
        )?;
        for j in 0..=workers {
            if j != i {
                add_route(&ns, pod_cidr(j), IpAddr::V4(node_ip(j)))?;
            }
        }
        self.nodes.push((
            NodeState {
                name: name.to_string(),
                namespace: ns.name().to_string(),
                ip,
                pod_cidr: pod_cidr(i).to_string(),
                control_plane: i == 0,
            },
            ns,
        ));
        Ok(())
    }

    fn add_pod(&mut self, i: usize) -> Result<()> {
        let (node, node_ns) = &self.nodes[i];
        let name = format!("web-{}", node.name);
        let ns = Netns::new(&name)?;
        veth(node_ns, "vweb", &ns, "eth0")?;
        let gw = GATEWAY_V4.to_string();
        node_ns.ip([
            "addr",
            "add",
            &format!("{gw}/32"),
            "dev",
            "vweb",
            "scope",
            "link",
        ])?;
        ns.ip([
            "route", "add", "default", "via", &gw, "dev", "eth0", "onlink",
        ])?;
        let ip = pod_ip(i);
        let host = IpNet::new(IpAddr::V4(ip), 32).expect("a /32");
        add_address(&ns, "eth0", host)?;
        add_route_dev(node_ns, host, "vweb", Some(IpAddr::V4(node.ip)))?;
        let pod = WorkloadPod {
            name,
            node: node.name.clone(),
            namespace: ns.name().to_string(),
            ip,
        };
        self.pods.push((pod, ns));
        Ok(())
    }

    /// The namespace of node `name`.
    pub fn node_ns(&self, name: &str) -> Option<&Netns> {
        self.nodes
            .iter()
            .find(|(n, _)| n.name == name)
            .map(|(_, ns)| ns)
    }
}

impl Drop for ClusterNet {
    fn drop(&mut self) {
        while let Some(pod) = self.pods.pop() {
            drop(pod);
        }
        while let Some(node) = self.nodes.pop() {
            drop(node);
        }
        // `lan` is dropped after this.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addressing_plan() {
        assert_eq!(node_names(2), ["master", "worker-1", "worker-2"]);
        assert_eq!(node_ip(0), Ipv4Addr::new(192, 168, 56, 10));
        assert_eq!(node_ip(MAX_WORKERS), Ipv4Addr::new(192, 168, 56, 30));
        assert_eq!(pod_cidr(2).to_string(), "10.244.2.0/24");
        assert_eq!(pod_ip(1), Ipv4Addr::new(10, 244, 1, 10));
    }
}
