//! [`Topology`]: the standard node / clients / backends layout.
//!
//! # Addressing plan (defaults; each family's plan is a [`FamilyPlan`])
//!
//! ```text
//!                        node network 192.168.56.0/24 (fd00:56::/64)
//!   client ── eth0 ─┐    bridge br0 in the "lan" namespace
//!   client1 ─ eth0 ─┼── lan ──┐
//!   ...             ┘         └─ eth0 ── node ── vbe0 ══ eth0 ── be0  (pod 10.244.1.10)
//!                                              └─ vbe1 ══ eth0 ── be1  (pod 10.244.1.11)
//! ```
//!
//! | namespace | interface | IPv4 | IPv6 (with [`TopologyBuilder::dual_stack`]) |
//! |-----------|-----------|------|------|
//! | `lan`     | `br0` + ports `p-node`, `p-client<k>` | none (a plain L2 switch) | none |
//! | `node`    | `eth0` (on the lan) | `192.168.56.10/24` | `fd00:56::10/64` |
//! | `node`    | `vbe<i>` (to backend i) | `169.254.1.1/32 scope link` | `fe80::1/64` |
//! | `client`  | `eth0` | `192.168.56.100/24` | `fd00:56::100/64` |
//! | `client<k>` (extra, [`Topology::add_client`]) | `eth0` | `192.168.56.(100+k)/24` | `fd00:56::(100+k)/64` (hex) |
//! | `be<i>`   | `eth0` | pod IP `10.244.1.(10+i)/32` | pod IP `fd00:10:244::1:(10+i)/128` (hex) |
//!
//! Routes:
//!
//! * **node**: forwarding on (`net.ipv4.ip_forward=1`, `net.ipv6.conf.all.forwarding=1`,
//!   set inside the node namespace) and ICMP redirects off (`send_redirects=0`: a redirect
//!   would use up the ICMP rate-limit token a REJECT's port-unreachable needs); per pod IP a host route `POD/32 dev vbe<i> src NODE_IP`
//!   (point-to-point, like a CNI); the service CIDR `dev eth0 src NODE_IP`, standing in
//!   for a real node's default route so that traffic to a ClusterIP is routed (and reaches
//!   the FORWARD/OUTPUT filter hooks, where a proxy's REJECT rules live) and node-local
//!   clients can connect to ClusterIPs. No default route.
//! * **client** (and extra clients created with `route_to_cluster`): the service CIDR
//!   (default `10.96.0.0/12`, IPv6 `fd00:10:96::/112`) and the pod CIDR (default
//!   `10.244.0.0/16`, IPv6 `fd00:10:244::/64`) via the node's address. Everything else on
//!   the node network is directly connected.
//! * **backend**: `default via 169.254.1.1 dev eth0 onlink` (IPv6 `default via fe80::1 dev
//!   eth0`); the node answers ARP/NDP for the gateway because it holds that address on
//!   `vbe<i>`. The pod IP is the only routable address, so it is the source of every reply.
//!
//! Auto-allocated pod IPs are `pod CIDR + 266 + i` (IPv4) and `pod CIDR + 0x1_0010 + i`
//! (IPv6); [`TopologyBuilder::backend`] takes explicit IPs instead.
//!
//! Dropping the [`Topology`] drops what it holds ([`Topology::hold`]: processes, servers)
//! first, then the namespaces in reverse order of creation.

use std::any::Any;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ipnet::IpNet;
use kp_model::IpFamily;

use super::{Netns, add_address, add_route, add_route_dev, veth};
use crate::backend::HttpBackend;
use crate::error::{Error, Result};

/// The node's gateway address for IPv4 backends (held on every `vbe<i>`, scope link).
pub const GATEWAY_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
/// The node's gateway address for IPv6 backends (held on every `vbe<i>`).
pub const GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
/// The node's interface on the node network.
pub const NODE_IF: &str = "eth0";
/// The bridge in the `lan` namespace that forms the node network.
pub const LAN_BRIDGE: &str = "br0";

const POD_OFFSET_V4: u128 = 266;
const POD_OFFSET_V6: u128 = 0x1_0010;

/// The addresses of one IP family in a [`Topology`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FamilyPlan {
    /// The node's address and the node network's prefix (`192.168.56.10/24`).
    pub node: IpNet,
    /// The main client's address on the node network (`192.168.56.100/24`); extra clients
    /// get the following addresses.
    pub client: IpNet,
    /// The service CIDR routed from the clients to the node (`10.96.0.0/12`).
    pub service_cidr: IpNet,
    /// The pod CIDR routed from the clients to the node; auto-allocated pod IPs come from
    /// it (`10.244.0.0/16`).
    pub pod_cidr: IpNet,
}

impl FamilyPlan {
    /// The default IPv4 plan: node `192.168.56.10/24`, client `192.168.56.100/24`,
    /// services `10.96.0.0/12`, pods `10.244.0.0/16`.
    pub fn ipv4() -> FamilyPlan {
        FamilyPlan {
            node: net("192.168.56.10/24"),
            client: net("192.168.56.100/24"),
            service_cidr: net("10.96.0.0/12"),
            pod_cidr: net("10.244.0.0/16"),
        }
    }

    /// The default IPv6 plan: node `fd00:56::10/64`, client `fd00:56::100/64`, services
    /// `fd00:10:96::/112`, pods `fd00:10:244::/64`.
    pub fn ipv6() -> FamilyPlan {
        FamilyPlan {
            node: net("fd00:56::10/64"),
            client: net("fd00:56::100/64"),
            service_cidr: net("fd00:10:96::/112"),
            pod_cidr: net("fd00:10:244::/64"),
        }
    }

    /// The plan's family (that of `node`).
    pub fn family(&self) -> IpFamily {
        IpFamily::of(&self.node.addr())
    }

    /// The `n`-th address of the service CIDR (`service_ip(10)` = `10.96.0.10`), handy for
    /// ClusterIPs. `None` when outside the CIDR.
    pub fn service_ip(&self, n: u128) -> Option<IpAddr> {
        nth(self.service_cidr, n)
    }

    fn validate(&self) -> Result<()> {
        let family = self.family();
        for (what, n) in [
            ("client", self.client),
            ("service_cidr", self.service_cidr),
            ("pod_cidr", self.pod_cidr),
        ] {
            if !family.contains(&n.addr()) {
                return Err(Error::invalid(
                    "family plan",
                    format!("{what} {n} is not of the node's family ({})", self.node),
                ));
            }
        }
        if self.node.trunc() != self.client.trunc() || self.node.addr() == self.client.addr() {
            return Err(Error::invalid(
                "family plan",
                format!(
                    "node {} and client {} must be different addresses on the same network",
                    self.node, self.client
                ),
            ));
        }
        Ok(())
    }
}

fn net(s: &str) -> IpNet {
    s.parse().expect("built-in network literal")
}

/// `net`'s network address plus `n`, if still inside `net`.
fn nth(net: IpNet, n: u128) -> Option<IpAddr> {
    offset(net.network(), n).filter(|ip| net.contains(ip))
}

fn offset(ip: IpAddr, n: u128) -> Option<IpAddr> {
    match ip {
        IpAddr::V4(a) => {
            let n = u32::try_from(n).ok()?;
            u32::from(a).checked_add(n).map(|x| IpAddr::V4(x.into()))
        }
        IpAddr::V6(a) => u128::from(a).checked_add(n).map(|x| IpAddr::V6(x.into())),
    }
}

fn host_net(ip: IpAddr) -> IpNet {
    let len = if ip.is_ipv4() { 32 } else { 128 };
    IpNet::new(ip, len).expect("full-length prefix is valid")
}

#[derive(Debug, Clone)]
enum BackendSpec {
    Auto,
    Explicit(Vec<IpAddr>),
}

/// Builds a [`Topology`]; start with [`Topology::builder`].
#[derive(Debug, Clone)]
pub struct TopologyBuilder {
    v4: Option<FamilyPlan>,
    v6: Option<FamilyPlan>,
    backends: Vec<BackendSpec>,
}

impl Default for TopologyBuilder {
    fn default() -> Self {
        TopologyBuilder {
            v4: Some(FamilyPlan::ipv4()),
            v6: None,
            backends: Vec::new(),
        }
    }
}

impl TopologyBuilder {
    /// IPv4 only with [`FamilyPlan::ipv4`], no backends.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets (or replaces) the plan of `plan`'s family.
    pub fn family(mut self, plan: FamilyPlan) -> Self {
        match plan.family() {
            IpFamily::V4 => self.v4 = Some(plan),
            IpFamily::V6 => self.v6 = Some(plan),
        }
        self
    }

    /// Removes a family (e.g. `without(IpFamily::V4)` after `dual_stack()` for IPv6 only).
    pub fn without(mut self, family: IpFamily) -> Self {
        match family {
            IpFamily::V4 => self.v4 = None,
            IpFamily::V6 => self.v6 = None,
        }
        self
    }

    /// Adds IPv6 with [`FamilyPlan::ipv6`] (unless an IPv6 plan is already set).
    pub fn dual_stack(mut self) -> Self {
        self.v6.get_or_insert_with(FamilyPlan::ipv6);
        self
    }

    /// IPv6 only, with [`FamilyPlan::ipv6`].
    pub fn ipv6_only(self) -> Self {
        self.dual_stack().without(IpFamily::V4)
    }

    /// Adds `n` backends, each with one auto-allocated pod IP per family.
    pub fn backends(mut self, n: usize) -> Self {
        self.backends
            .extend(std::iter::repeat_n(BackendSpec::Auto, n));
        self
    }

    /// Adds one backend holding exactly `ips` (e.g. two pod IPs, or one per family).
    ///
    /// Clients reach them only if they are inside a plan's pod CIDR.
    pub fn backend(mut self, ips: Vec<IpAddr>) -> Self {
        self.backends.push(BackendSpec::Explicit(ips));
        self
    }

    fn plans(&self) -> Vec<FamilyPlan> {
        self.v4.iter().chain(self.v6.iter()).cloned().collect()
    }

    fn resolve_backends(&self, plans: &[FamilyPlan]) -> Result<Vec<Vec<IpAddr>>> {
        let mut all = Vec::with_capacity(self.backends.len());
        let mut seen = std::collections::HashSet::new();
        for (i, spec) in self.backends.iter().enumerate() {
            let ips = match spec {
                BackendSpec::Explicit(ips) => {
                    if ips.is_empty() {
                        return Err(Error::invalid("backend", format!("be{i} has no IPs")));
                    }
                    for ip in ips {
                        if !plans.iter().any(|p| p.family().contains(ip)) {
                            return Err(Error::invalid(
                                "backend",
                                format!("be{i}: {ip} is of a family the topology does not have"),
                            ));
                        }
                    }
                    ips.clone()
                }
                BackendSpec::Auto => plans
                    .iter()
                    .map(|p| {
                        let base = match p.family() {
                            IpFamily::V4 => POD_OFFSET_V4,
                            IpFamily::V6 => POD_OFFSET_V6,
                        };
                        nth(p.pod_cidr, base + i as u128).ok_or_else(|| {
                            Error::invalid(
                                "backend",
                                format!(
                                    "pod CIDR {} is too small for an automatic IP for be{i}; \
                                     give explicit IPs with TopologyBuilder::backend",
                                    p.pod_cidr
                                ),
                            )
                        })
                    })
                    .collect::<Result<Vec<_>>>()?,
            };
            for ip in &ips {
                if !seen.insert(*ip) {
                    return Err(Error::invalid("backend", format!("pod IP {ip} used twice")));
                }
            }
            all.push(ips);
        }
        Ok(all)
    }

    /// Creates the namespaces, links, addresses, routes and sysctls.
    ///
    /// On error everything created so far is torn down again.
    pub fn build(self) -> Result<Topology> {
        let plans = self.plans();
        if plans.is_empty() {
            return Err(Error::invalid("topology", "no IP family configured"));
        }
        for plan in &plans {
            plan.validate()?;
        }
        let backend_ips = self.resolve_backends(&plans)?;

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
            // Best effort (only exists with br_netfilter): keep the switch a plain switch.
            let _ = lan.sysctl(&format!("net.bridge.{key}"), "0");
        }

        let node = Netns::new("node")?;
        veth(&node, NODE_IF, &lan, "p-node")?;
        lan.ip(["link", "set", "p-node", "master", LAN_BRIDGE])?;
        for plan in &plans {
            add_address(&node, NODE_IF, plan.node)?;
        }
        node.sysctl("net.ipv4.ip_forward", "1")?;
        // Service traffic from clients on the node network leaves by the interface it came
        // in on (the service CIDR is routed out eth0, like a node's default route), so the
        // kernel would send an ICMP redirect first; that redirect uses up the per-host ICMP
        // rate-limit token and the proxy's REJECT (port unreachable) would then be dropped,
        // turning "connection refused" into a timeout. Routers disable redirects; so do we.
        for conf in ["all", "default", NODE_IF] {
            node.sysctl(&format!("net.ipv4.conf.{conf}.send_redirects"), "0")?;
        }
        if std::path::Path::new("/proc/sys/net/ipv6").exists() {
            node.sysctl("net.ipv6.conf.all.forwarding", "1")?;
        }
        for plan in &plans {
            add_route_dev(&node, plan.service_cidr, NODE_IF, Some(plan.node.addr()))?;
        }

        let mut topology = Topology {
            held: Vec::new(),
            clients: Vec::new(),
            backends: Vec::new(),
            node,
            lan,
            plans,
        };
        topology.add_client_named("client", 0, true)?;
        for (i, ips) in backend_ips.into_iter().enumerate() {
            topology.add_backend(i, ips)?;
        }
        Ok(topology)
    }
}

/// A client namespace on the node network.
#[derive(Debug)]
pub struct ClientHost {
    ns: Netns,
    addrs: Vec<IpNet>,
}

impl ClientHost {
    /// The client's namespace.
    pub fn ns(&self) -> &Netns {
        &self.ns
    }

    /// Its addresses on the node network (one per family).
    pub fn addrs(&self) -> &[IpNet] {
        &self.addrs
    }

    /// Its address of `family`, if the topology has that family.
    pub fn ip(&self, family: IpFamily) -> Option<IpAddr> {
        self.addrs
            .iter()
            .map(IpNet::addr)
            .find(|a| family.contains(a))
    }
}

/// A backend ("pod") namespace behind the node.
#[derive(Debug)]
pub struct BackendPod {
    ns: Netns,
    ips: Vec<IpAddr>,
    node_if: String,
    index: usize,
}

impl BackendPod {
    /// The backend's namespace (role `be<i>`).
    pub fn ns(&self) -> &Netns {
        &self.ns
    }

    /// Its pod IPs.
    pub fn ips(&self) -> &[IpAddr] {
        &self.ips
    }

    /// Its first pod IP of `family`.
    pub fn ip(&self, family: IpFamily) -> Option<IpAddr> {
        self.ips.iter().copied().find(|a| family.contains(a))
    }

    /// The node-side interface of its veth pair (`vbe<i>`).
    pub fn node_if(&self) -> &str {
        &self.node_if
    }

    /// Its index `i` (role `be<i>`).
    pub fn index(&self) -> usize {
        self.index
    }

    /// Its name as the HTTP/UDP backends of [`Topology::start_http`] use it: `be<i>`.
    pub fn name(&self) -> String {
        format!("be{}", self.index)
    }
}

/// The standard test layout: a `node`, a `client` on the node network, and backends
/// behind the node. See the [module documentation](crate::netns::topology) for the
/// addressing plan.
///
/// Build it with [`Topology::builder`]. Everything is torn down on drop: first what was
/// given to [`Topology::hold`] (newest first), then extra clients, backends, the client,
/// the node and the lan (reverse order of creation).
pub struct Topology {
    held: Vec<Box<dyn Any + Send>>,
    clients: Vec<ClientHost>,
    backends: Vec<BackendPod>,
    node: Netns,
    lan: Netns,
    plans: Vec<FamilyPlan>,
}

impl std::fmt::Debug for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Topology")
            .field("held", &self.held.len())
            .field("clients", &self.clients)
            .field("backends", &self.backends)
            .field("node", &self.node)
            .field("lan", &self.lan)
            .field("plans", &self.plans)
            .finish()
    }
}

impl Topology {
    /// A builder: IPv4 with the default plan, no backends.
    pub fn builder() -> TopologyBuilder {
        TopologyBuilder::new()
    }

    /// The node namespace (where the proxy runs).
    pub fn node(&self) -> &Netns {
        &self.node
    }

    /// The namespace holding the node network's bridge.
    pub fn lan(&self) -> &Netns {
        &self.lan
    }

    /// The main client's namespace.
    pub fn client(&self) -> &Netns {
        &self.clients[0].ns
    }

    /// All clients; index 0 is the main client, then those from [`Topology::add_client`].
    pub fn clients(&self) -> &[ClientHost] {
        &self.clients
    }

    /// The backends, in order (`be0`, `be1`, ...).
    pub fn backends(&self) -> &[BackendPod] {
        &self.backends
    }

    /// Backend `i`. Panics if there is no such backend.
    pub fn backend(&self, i: usize) -> &BackendPod {
        &self.backends[i]
    }

    /// The families of the topology, IPv4 first.
    pub fn families(&self) -> Vec<IpFamily> {
        self.plans.iter().map(FamilyPlan::family).collect()
    }

    /// The plan of `family`, if the topology has it.
    pub fn plan(&self, family: IpFamily) -> Option<&FamilyPlan> {
        self.plans.iter().find(|p| p.family() == family)
    }

    /// The node's address of `family`.
    pub fn node_ip(&self, family: IpFamily) -> Option<IpAddr> {
        self.plan(family).map(|p| p.node.addr())
    }

    /// The main client's address of `family`.
    pub fn client_ip(&self, family: IpFamily) -> Option<IpAddr> {
        self.clients[0].ip(family)
    }

    /// The service CIDRs (one per family).
    pub fn service_cidrs(&self) -> Vec<IpNet> {
        self.plans.iter().map(|p| p.service_cidr).collect()
    }

    /// The pod CIDRs (one per family).
    pub fn pod_cidrs(&self) -> Vec<IpNet> {
        self.plans.iter().map(|p| p.pod_cidr).collect()
    }

    /// Keeps `resource` (a [`crate::ChildGuard`], an [`HttpBackend`], ...) alive until
    /// the topology is dropped, and drops it before any namespace.
    pub fn hold<R: Send + 'static>(&mut self, resource: R) {
        self.held.push(Box::new(resource));
    }

    /// Adds a client namespace (`client<k>`) on the node network with the next free
    /// addresses after the main client's; returns its index in [`Topology::clients`].
    ///
    /// With `route_to_cluster` it gets the same service and pod CIDR routes via the node
    /// as the main client; without, it only reaches the node network directly (an
    /// "outside" client using node IPs, NodePorts and external IPs).
    pub fn add_client(&mut self, route_to_cluster: bool) -> Result<usize> {
        let k = self.clients.len();
        self.add_client_named(&format!("client{k}"), k, route_to_cluster)
    }

    fn add_client_named(&mut self, role: &str, k: usize, route_to_cluster: bool) -> Result<usize> {
        let mut addrs = Vec::new();
        for plan in &self.plans {
            let ip = offset(plan.client.addr(), k as u128)
                .filter(|ip| plan.client.contains(ip) && *ip != plan.node.addr())
                .ok_or_else(|| {
                    Error::invalid(
                        "client",
                        format!("no address left for client {k} after {}", plan.client),
                    )
                })?;
            addrs.push(IpNet::new(ip, plan.client.prefix_len()).expect("prefix of the plan"));
        }
        let ns = Netns::new(role)?;
        let port = format!("p-client{k}");
        veth(&ns, "eth0", &self.lan, &port)?;
        self.lan
            .ip(["link", "set", port.as_str(), "master", LAN_BRIDGE])?;
        for (plan, addr) in self.plans.iter().zip(&addrs) {
            add_address(&ns, "eth0", *addr)?;
            if route_to_cluster {
                add_route(&ns, plan.service_cidr, plan.node.addr())?;
                add_route(&ns, plan.pod_cidr, plan.node.addr())?;
            }
        }
        self.clients.push(ClientHost { ns, addrs });
        Ok(self.clients.len() - 1)
    }

    fn add_backend(&mut self, i: usize, ips: Vec<IpAddr>) -> Result<()> {
        let ns = Netns::new(&format!("be{i}"))?;
        let node_if = format!("vbe{i}");
        veth(&self.node, &node_if, &ns, "eth0")?;
        let has_v4 = ips.iter().any(IpAddr::is_ipv4);
        let has_v6 = ips.iter().any(IpAddr::is_ipv6);
        if has_v4 {
            let gw = GATEWAY_V4.to_string();
            self.node.ip([
                "addr",
                "add",
                &format!("{gw}/32"),
                "dev",
                &node_if,
                "scope",
                "link",
            ])?;
            ns.ip([
                "route", "add", "default", "via", &gw, "dev", "eth0", "onlink",
            ])?;
        }
        if has_v6 {
            let gw = GATEWAY_V6.to_string();
            self.node
                .ip(["addr", "add", &format!("{gw}/64"), "dev", &node_if, "nodad"])?;
            ns.ip(["route", "add", "default", "via", &gw, "dev", "eth0"])?;
        }
        for ip in &ips {
            add_address(&ns, "eth0", host_net(*ip))?;
            let src = self.node_ip(IpFamily::of(ip));
            add_route_dev(&self.node, host_net(*ip), &node_if, src)?;
        }
        self.backends.push(BackendPod {
            ns,
            ips,
            node_if,
            index: i,
        });
        Ok(())
    }

    /// Starts an [`HttpBackend`] named `be<i>` on `POD_IP:port` for every pod IP of every
    /// backend, in backend order.
    ///
    /// The caller owns them (or passes them to [`Topology::hold`]).
    pub fn start_http(&self, port: u16) -> Result<Vec<HttpBackend>> {
        let mut servers = Vec::new();
        for b in &self.backends {
            for ip in &b.ips {
                servers.push(HttpBackend::start(
                    &b.ns,
                    SocketAddr::new(*ip, port),
                    b.name(),
                )?);
            }
        }
        Ok(servers)
    }

    /// A human-readable summary of namespaces, interfaces, addresses and routes (what
    /// `kube-proxy-rs sandbox` prints).
    pub fn describe(&self) -> String {
        let mut out = String::new();
        let join = |v: &mut dyn Iterator<Item = String>| v.collect::<Vec<_>>().join(", ");
        let node_addrs = join(&mut self.plans.iter().map(|p| p.node.to_string()));
        let services = join(&mut self.plans.iter().map(|p| p.service_cidr.to_string()));
        let pods = join(&mut self.plans.iter().map(|p| p.pod_cidr.to_string()));
        let _ = writeln!(
            out,
            "lan     {:<24} bridge {LAN_BRIDGE} (node network)",
            self.lan.name()
        );
        let _ = writeln!(
            out,
            "node    {:<24} {NODE_IF} {node_addrs}; forwarding on; services {services} dev {NODE_IF}",
            self.node.name()
        );
        for c in &self.clients {
            let addrs = join(&mut c.addrs.iter().map(IpNet::to_string));
            let _ = writeln!(out, "{:<7} {:<24} eth0 {addrs}", c.ns.role(), c.ns.name());
        }
        let _ = writeln!(
            out,
            "        clients route {services} and {pods} via the node"
        );
        for b in &self.backends {
            let ips = join(&mut b.ips.iter().map(IpAddr::to_string));
            let _ = writeln!(
                out,
                "{:<7} {:<24} eth0 {ips}; default via the node ({}); node: {ips} dev {}",
                b.ns.role(),
                b.ns.name(),
                gateways(&b.ips),
                b.node_if
            );
        }
        out
    }
}

/// The node-side gateway addresses a backend with `ips` routes through.
fn gateways(ips: &[IpAddr]) -> String {
    let mut gw = Vec::new();
    if ips.iter().any(IpAddr::is_ipv4) {
        gw.push(GATEWAY_V4.to_string());
    }
    if ips.iter().any(IpAddr::is_ipv6) {
        gw.push(GATEWAY_V6.to_string());
    }
    gw.join(", ")
}

impl Drop for Topology {
    fn drop(&mut self) {
        while let Some(resource) = self.held.pop() {
            drop(resource);
        }
        while self.clients.len() > 1 {
            self.clients.pop();
        }
        while let Some(backend) = self.backends.pop() {
            drop(backend);
        }
        self.clients.clear();
        // `node` then `lan` are dropped after this, in field order.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_pod_ips_follow_the_plan() {
        let b = TopologyBuilder::new().dual_stack().backends(2);
        let ips = b.resolve_backends(&b.plans()).unwrap();
        let want: Vec<Vec<IpAddr>> = vec![
            vec![
                "10.244.1.10".parse().unwrap(),
                "fd00:10:244::1:10".parse().unwrap(),
            ],
            vec![
                "10.244.1.11".parse().unwrap(),
                "fd00:10:244::1:11".parse().unwrap(),
            ],
        ];
        assert_eq!(ips, want);
    }

    #[test]
    fn plans_are_validated() {
        let mut p = FamilyPlan::ipv4();
        p.client = net("192.168.57.100/24");
        assert!(p.validate().is_err());
        let mut p = FamilyPlan::ipv4();
        p.pod_cidr = net("fd00::/64");
        assert!(p.validate().is_err());
        assert!(FamilyPlan::ipv6().validate().is_ok());
        assert_eq!(
            FamilyPlan::ipv4().service_ip(10),
            Some("10.96.0.10".parse().unwrap())
        );
    }

    #[test]
    fn backends_are_validated() {
        let b = TopologyBuilder::new().backend(vec!["fd00::1".parse().unwrap()]);
        assert!(b.resolve_backends(&b.plans()).is_err());
        let b = TopologyBuilder::new()
            .backends(1)
            .backend(vec!["10.244.1.10".parse().unwrap()]);
        assert!(b.resolve_backends(&b.plans()).is_err());
        let mut small = FamilyPlan::ipv4();
        small.pod_cidr = net("10.244.0.0/24");
        let b = TopologyBuilder::new().family(small).backends(1);
        assert!(b.resolve_backends(&b.plans()).is_err());
    }
}
