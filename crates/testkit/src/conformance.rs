//! The packet-flow conformance table: the single source of behavioural truth for every proxy
//! mode.
//!
//! Each [`Scenario`] is a small cluster (Services, EndpointSlices, this node's Node object,
//! ServiceCIDRs) plus proxy settings; each [`Row`] is one packet `(name, from, src, proto, dst, port)` and
//! what must happen to it: which backends it can reach and whether it is masqueraded, or
//! that it is dropped, rejected, or left alone. A mode passes when, for every row, tracing
//! the packet through that mode's rendered rules gives exactly the expected outcome; the
//! runner lives with the tests that can render and trace (`kube-proxy-rs/tests/`).
//!
//! The expectations follow upstream kube-proxy's behaviour (its iptables proxier tests and
//! `CategorizeEndpoints`). Addressing used throughout:
//!
//! | what | address |
//! |---|---|
//! | this node (`node-a`) | `192.168.56.10` (eth0), `10.0.1.1` (pod gateway), `127.0.0.1`; `fd00:56::10` |
//! | cluster (pod) CIDR | `10.0.0.0/16` (`fd00:10::/32`); this node's pods `10.0.1.0/24` |
//! | a local pod (client) | `10.0.1.50` on `veth-a` / bridge `cbr0`; `fd00:10:1::50` |
//! | local endpoints | `10.0.1.4`, `10.0.1.5` (`fd00:10:1::4`) |
//! | remote endpoints (`node-b`) | `10.0.2.5`, `10.0.2.6` (`fd00:10:2::5`) |
//! | an external client | `203.0.113.7` (`2001:db8::7`), arriving on `eth0` |
//! | another external client | `198.51.100.9` |

use std::collections::BTreeMap;
use std::net::IpAddr;

use kp_model::{EndpointSlice, IpFamily, Node, Protocol, Service, ServiceCidr, Snapshot};

use crate::builders::{ServiceBuilder, SliceBuilder, ip, snapshot_with_service_cidrs};

/// Where a packet comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum From {
    /// A pod on this node; enters through PREROUTING on this interface.
    Pod {
        /// Interface the packet arrives on (for interface-based local detection).
        iface: &'static str,
    },
    /// Outside the node; enters through PREROUTING on `eth0`.
    External,
    /// A process on the node itself; leaves through OUTPUT.
    Node,
}

/// What must happen to a packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// DNAT to one of these endpoints (`ip:port` text), each equally likely; the flag says
    /// whether that branch is masqueraded.
    Backends(Vec<(&'static str, bool)>),
    /// Dropped: by a DROP rule, or by the kernel (e.g. martian traffic to 127.0.0.0/8).
    Drop,
    /// Rejected (ICMP port unreachable / TCP reset).
    Reject,
    /// Not touched by the proxy: no DNAT, no masquerade, accepted (delivered locally or
    /// routed as it is).
    Unchanged,
}

/// One packet and its expected fate.
#[derive(Debug, Clone)]
pub struct Row {
    /// What the row checks.
    pub name: &'static str,
    /// Where the packet comes from.
    pub from: From,
    /// Source address.
    pub src: IpAddr,
    /// Protocol (ICMP rows use [`Proto::Icmp`]).
    pub proto: Proto,
    /// Destination address.
    pub dst: IpAddr,
    /// Destination port (ignored for ICMP).
    pub port: u16,
    /// What must happen.
    pub expect: Expect,
    /// Why a mode may legitimately differ, with the mode's name; `None` for rows every mode
    /// must pass. Exceptions are those upstream documents (e.g. nftables has no localhost
    /// NodePorts by default).
    pub exceptions: Vec<(&'static str, Expect, &'static str)>,
}

/// A transport protocol or ICMP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// A Service protocol.
    L4(Protocol),
    /// ICMP / ICMPv6 echo (a ping).
    Icmp,
}

/// `--detect-local-mode` and its parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DetectLocal {
    /// `ClusterCIDR` with `--cluster-cidr 10.0.0.0/16,fd00:10::/32`.
    ClusterCidr,
    /// `NodeCIDR` (the Node's `podCIDRs`: `10.0.1.0/24`, `fd00:10:1::/64`).
    NodeCidr,
    /// `BridgeInterface` with `--pod-bridge-interface cbr0`.
    BridgeInterface,
    /// `InterfaceNamePrefix` with `--pod-interface-name-prefix veth`.
    InterfaceNamePrefix,
    /// No detection (no `--cluster-cidr`).
    None,
}

/// Proxy settings of a scenario, mode-independent (each mode maps them to its own flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `--masquerade-all`.
    pub masquerade_all: bool,
    /// `--detect-local-mode`.
    pub detect_local: DetectLocal,
    /// `--nodeport-addresses` (empty: all).
    pub nodeport_addresses: Vec<&'static str>,
    /// `--iptables-localhost-nodeports`.
    pub localhost_nodeports: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            masquerade_all: false,
            detect_local: DetectLocal::ClusterCidr,
            nodeport_addresses: Vec::new(),
            localhost_nodeports: true,
        }
    }
}

/// A cluster, proxy settings, and the packets to check.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Name.
    pub name: &'static str,
    /// Proxy settings.
    pub settings: Settings,
    /// This node's Node object.
    pub node: Node,
    /// This node's local addresses.
    pub local_addrs: Vec<IpAddr>,
    /// Services.
    pub services: Vec<Service>,
    /// EndpointSlices.
    pub slices: Vec<EndpointSlice>,
    /// ServiceCIDRs (none in most scenarios, as before a cluster had them).
    pub service_cidrs: Vec<ServiceCidr>,
    /// Packets.
    pub rows: Vec<Row>,
}

impl Scenario {
    /// The snapshot the tracker builds for `family` on this node from the scenario's
    /// objects, which every mode renders.
    pub fn snapshot(&self, family: IpFamily) -> Snapshot {
        snapshot_with_service_cidrs(
            family,
            NODE,
            Some(self.node.clone()),
            self.services.clone(),
            self.slices.clone(),
            self.service_cidrs.clone(),
        )
    }
}

/// This node's name.
pub const NODE: &str = "node-a";
/// This node's main IPv4 address.
pub const NODE_IP: &str = "192.168.56.10";
/// This node's main IPv6 address.
pub const NODE_IP6: &str = "fd00:56::10";
/// The cluster CIDRs for `--cluster-cidr`.
pub const CLUSTER_CIDRS: [&str; 2] = ["10.0.0.0/16", "fd00:10::/32"];
/// The pod bridge for `BridgeInterface`.
pub const POD_BRIDGE: &str = "cbr0";
/// The pod interface prefix for `InterfaceNamePrefix`.
pub const POD_PREFIX: &str = "veth";

const POD: &str = "10.0.1.50";
const EXT: &str = "203.0.113.7";
const EXT2: &str = "198.51.100.9";
const L1: &str = "10.0.1.4:8080";
const L2: &str = "10.0.1.5:8080";
const R1: &str = "10.0.2.5:8080";

fn node() -> Node {
    Node {
        name: NODE.to_string(),
        labels: BTreeMap::from([
            ("kubernetes.io/hostname".to_string(), NODE.to_string()),
            (
                "topology.kubernetes.io/zone".to_string(),
                "zone-a".to_string(),
            ),
        ]),
        pod_cidrs: ["10.0.1.0/24", "fd00:10:1::/64"]
            .iter()
            .map(|c| c.parse().expect("valid CIDR"))
            .collect(),
        addresses: vec![ip(NODE_IP), ip(NODE_IP6)],
        deleting: false,
        to_be_deleted_taint: false,
    }
}

fn local_addrs() -> Vec<IpAddr> {
    vec![
        ip(NODE_IP),
        ip("10.0.1.1"),
        ip("127.0.0.1"),
        ip(NODE_IP6),
        ip("::1"),
    ]
}

fn row(
    name: &'static str,
    from: From,
    src: &str,
    proto: Proto,
    dst: &str,
    port: u16,
    expect: Expect,
) -> Row {
    Row {
        name,
        from,
        src: ip(src),
        proto,
        dst: ip(dst),
        port,
        expect,
        exceptions: Vec::new(),
    }
}

const TCP: Proto = Proto::L4(Protocol::Tcp);
const UDP: Proto = Proto::L4(Protocol::Udp);
const SCTP: Proto = Proto::L4(Protocol::Sctp);

fn pod() -> From {
    From::Pod { iface: "veth-a" }
}

fn both(masq: bool) -> Expect {
    Expect::Backends(vec![(L1, masq), (R1, masq)])
}

/// Two endpoints, one local and one remote, on port 8080.
fn two_eps(service: &str) -> EndpointSlice {
    SliceBuilder::new(service)
        .port("", 8080)
        .ready("10.0.1.4", NODE)
        .ready("10.0.2.5", "node-b")
        .build()
}

fn scenario(
    name: &'static str,
    services: Vec<Service>,
    slices: Vec<EndpointSlice>,
    rows: Vec<Row>,
) -> Scenario {
    Scenario {
        name,
        settings: Settings::default(),
        node: node(),
        local_addrs: local_addrs(),
        services,
        slices,
        service_cidrs: Vec::new(),
        rows,
    }
}

/// Every scenario of the table.
pub fn scenarios() -> Vec<Scenario> {
    let mut out = vec![
        cluster_ip(),
        hairpin_without_node_name(),
        ports_and_protocols(),
        no_endpoints(),
        node_ports(),
        node_port_addresses(),
        node_port_primary_without_node_address(),
        external_and_load_balancer_ips(),
        source_ranges(),
        external_policy_local(),
        internal_policy_local(),
        affinity_terminating_topology(),
        masquerade_all(),
        ipv6_and_dual_stack(),
    ];
    out.extend(detect_local_modes());
    add_ipvs_exceptions(&mut out);
    add_userspace_exceptions(&mut out);
    out
}

/// Adds `mode`'s exceptions: each `(scenario, row-name prefix, expectation, why)` names
/// exactly one row (a typo in the table is a panic, not a silently unused exception).
fn add_exceptions(
    scenarios: &mut [Scenario],
    mode: &'static str,
    table: Vec<(&str, &str, Expect, &'static str)>,
) {
    for (scenario, row, expect, why) in table {
        let rows: Vec<&mut Row> = scenarios
            .iter_mut()
            .filter(|s| s.name == scenario)
            .flat_map(|s| s.rows.iter_mut())
            .filter(|r| r.name.starts_with(row))
            .collect();
        assert_eq!(rows.len(), 1, "{mode} exception {scenario}: {row}");
        for r in rows {
            r.exceptions.push((mode, expect.clone(), why));
        }
    }
}

/// Userspace mode (docs/userspace.md), besides the one blanket difference its runner
/// applies to every row: the proxy connects to the endpoint itself, so every branch is
/// masqueraded (the client address is always hidden).
fn add_userspace_exceptions(scenarios: &mut [Scenario]) {
    const SOURCE_RANGES: &str = "userspace mode sends only the allowed sources to the proxy (its portals match the ranges); other sources are not proxied and go on as if no Service had the LB IP, where the kernel modes drop them";
    const RESET: &str = "userspace mode's proxy socket accepts the connection and, with no endpoint for this traffic, closes it with a reset (the sandbox's `reset`), where the kernel modes drop it";
    let table: Vec<(&str, &str, Expect, &'static str)> = vec![
        (
            "Services without endpoints",
            "outside traffic to 127.0.0.1:NodePort without endpoints",
            Expect::Reject,
            "userspace mode's NodePort portal (upstream's: `--dst-type LOCAL`) takes 127.0.0.1 like every local address, before routing, and it sets no route_localnet and has no localnet drop; the proxy resets a connection without endpoints. Through 127.0.0.1 a NodePort exposes nothing its node IP does not; services bound to 127.0.0.1 stay out of reach (row: outside traffic to 127.0.0.1 without a NodePort)",
        ),
        (
            "externalTrafficPolicy: Local",
            "no local endpoint: external traffic dropped",
            Expect::Reject,
            RESET,
        ),
        (
            "externalTrafficPolicy: Local",
            "no local endpoint: LB IP dropped",
            Expect::Reject,
            RESET,
        ),
        (
            "internalTrafficPolicy: Local",
            "no local endpoint: dropped",
            Expect::Reject,
            RESET,
        ),
        (
            "targetPort, named ports, UDP and SCTP",
            "SCTP",
            Expect::Unchanged,
            "userspace mode has no SCTP (nor had upstream's): the port gets no proxy socket and no portal",
        ),
        (
            "loadBalancerSourceRanges",
            "client outside every source range",
            Expect::Unchanged,
            SOURCE_RANGES,
        ),
        (
            "loadBalancerSourceRanges",
            "node IP outside every range",
            Expect::Unchanged,
            SOURCE_RANGES,
        ),
    ];
    add_exceptions(scenarios, "userspace", table);
}

/// Upstream's IPVS mode: kube-ipvs0's KUBE-IPVS-FILTER (kubernetes#72236) rejects a new
/// connection to a Service IP (bound to kube-ipvs0) on a protocol and port no Service uses.
const IPVS_FILTER: &str = "IPVS mode binds the Service IP to kube-ipvs0, so the packet is for a local address; upstream's KUBE-IPVS-FILTER rejects a new connection to a kube-ipvs0 address on a protocol/port no ipset lists (kubernetes#72236: host ports must not be reachable through a VIP)";

/// Upstream's IPVS mode uses one virtual server per NodePort / load-balancer IP whose real
/// servers are the local endpoints under externalTrafficPolicy Local, for every client.
const IPVS_NO_SHORT_CIRCUIT: &str = "IPVS mode does not short-circuit pod or node traffic to a Local-policy NodePort: the virtual server's real servers are this node's endpoints for every client, and KUBE-NODE-PORT-LOCAL-* returns before KUBE-MARK-MASQ, so it is not masqueraded either";

/// kubernetes PR #97081: with no local endpoint, upstream's IPVS mode falls back to the
/// cluster-wide endpoints for Local-policy traffic.
const IPVS_LOCAL_FALLBACK: &str = "IPVS mode falls back to the cluster-wide endpoints when a Local-policy Service has no endpoint on this node (kubernetes PR #97081), instead of dropping; the Local set's RETURN leaves the packet unmarked, so it is not masqueraded (upstream: an external client's reply then comes from the pod address and is discarded)";

/// The rows where upstream's IPVS mode legitimately differs from the table's expectation
/// (the iptables mode's), each with the reason; see docs/ipvs.md "Differences from
/// iptables mode".
fn add_ipvs_exceptions(scenarios: &mut [Scenario]) {
    let l1_only = || Expect::Backends(vec![(L1, false)]);
    let r1_kept = || Expect::Backends(vec![(R1, false)]);
    let table: Vec<(&str, &str, Expect, &'static str)> = vec![
        (
            "ClusterIP",
            "a port the Service does not have",
            Expect::Reject,
            IPVS_FILTER,
        ),
        (
            "ClusterIP",
            "UDP to a TCP-only Service port",
            Expect::Reject,
            IPVS_FILTER,
        ),
        (
            "ClusterIP",
            "ping to a ClusterIP",
            Expect::Unchanged,
            "IPVS mode binds the ClusterIP to kube-ipvs0, so the ping reaches the node, which answers it (the seeds' observation); kube-proxy-rs lets echo requests through KUBE-IPVS-FILTER, while upstream's KUBE-IPVS-FILTER has rejected them since it was added (kubernetes/website#41002: ICMP port unreachable)",
        ),
        (
            "NodePort on every local address",
            "node to 127.0.0.1:NodePort",
            Expect::Unchanged,
            "IPVS mode has no localhost NodePorts: upstream creates NodePort virtual servers on the node's non-loopback addresses only, so the packet goes to whatever listens on 127.0.0.1",
        ),
        (
            "externalIPs and LoadBalancer IPs",
            "external IP on another port",
            Expect::Reject,
            IPVS_FILTER,
        ),
        (
            "externalTrafficPolicy: Local",
            "pod to NodePort: short-circuited",
            l1_only(),
            IPVS_NO_SHORT_CIRCUIT,
        ),
        (
            "externalTrafficPolicy: Local",
            "node to NodePort: all endpoints",
            l1_only(),
            IPVS_NO_SHORT_CIRCUIT,
        ),
        (
            "externalTrafficPolicy: Local",
            "no local endpoint: external traffic dropped",
            r1_kept(),
            IPVS_LOCAL_FALLBACK,
        ),
        (
            "externalTrafficPolicy: Local",
            "no local endpoint: LB IP dropped",
            r1_kept(),
            IPVS_LOCAL_FALLBACK,
        ),
        (
            "externalTrafficPolicy: Local",
            "no local endpoint: node traffic still served",
            r1_kept(),
            IPVS_LOCAL_FALLBACK,
        ),
        (
            "hairpin: EndpointSlice entries without nodeName",
            "the pod reaching itself is masqueraded",
            Expect::Backends(vec![("10.0.1.6:8080", false), (R1, false)]),
            "IPVS mode masquerades hairpin traffic through KUBE-LOOP-BACK, which upstream fills with this node's endpoints only (kubernetes PR #66149); an entry without nodeName is not one",
        ),
        (
            "internalTrafficPolicy: Local",
            "no local endpoint: dropped",
            Expect::Reject,
            "IPVS mode keeps the ClusterIP's virtual server with no real server (under internalTrafficPolicy Local the cluster-wide list is empty, so PR #97081's fallback has nothing), and IPVS answers ICMP port unreachable (the kernel's ip_vs_leave) instead of dropping",
        ),
        (
            "internalTrafficPolicy: Local",
            "both policies Local: pod traffic to the NodePort",
            l1_only(),
            IPVS_NO_SHORT_CIRCUIT,
        ),
        (
            "internalTrafficPolicy: Local",
            "both policies Local: node traffic to the NodePort",
            l1_only(),
            IPVS_NO_SHORT_CIRCUIT,
        ),
        (
            "--detect-local-mode BridgeInterface",
            "pod traffic to a Local-policy NodePort",
            l1_only(),
            IPVS_NO_SHORT_CIRCUIT,
        ),
    ];
    add_exceptions(scenarios, "ipvs", table);
}

/// Rows where upstream's nftables mode rejects traffic to a ClusterIP on a port no Service
/// uses (its `cluster-ips-check` chain), where iptables mode leaves the packet alone.
const NFT_CLUSTER_IPS_CHECK: &str = "nftables mode rejects traffic to a ClusterIP on a port no Service uses (upstream's cluster-ips-check chain)";

/// Rows where upstream's nftables mode drops traffic to an address of the Service CIDRs that
/// is no ClusterIP, where the other modes leave the packet alone.
const NFT_UNALLOCATED: &str = "nftables mode drops traffic to an unallocated ClusterIP of the Service CIDRs (upstream's cluster-ips-check chain)";

fn cluster_ip() -> Scenario {
    let mut s = cluster_ip_rows();
    for r in &mut s.rows {
        if matches!(r.expect, Expect::Unchanged) {
            r.exceptions
                .push(("nftables", Expect::Reject, NFT_CLUSTER_IPS_CHECK));
        }
    }
    // The cluster's ServiceCIDR (dual-stack), and a second, smaller one.
    s.service_cidrs = vec![
        ServiceCidr {
            name: "kubernetes".into(),
            cidrs: vec![
                "10.96.0.0/16".parse().expect("CIDR"),
                "fd00:96::/112".parse().expect("CIDR"),
            ],
        },
        ServiceCidr {
            name: "extra".into(),
            cidrs: vec!["10.97.0.0/24".parse().expect("CIDR")],
        },
    ];
    let mut unallocated = |name, src: &str, proto, dst: &str, port| {
        let mut r = row(name, pod(), src, proto, dst, port, Expect::Unchanged);
        r.exceptions
            .push(("nftables", Expect::Drop, NFT_UNALLOCATED));
        s.rows.push(r);
    };
    unallocated(
        "an unallocated ClusterIP of the Service CIDR",
        POD,
        TCP,
        "10.96.0.200",
        80,
    );
    unallocated(
        "an unallocated ClusterIP of the second Service CIDR",
        POD,
        UDP,
        "10.97.0.9",
        53,
    );
    unallocated(
        "an unallocated ClusterIP of the IPv6 Service CIDR",
        "fd00:10:1::50",
        TCP,
        "fd00:96::99",
        80,
    );
    s.rows.push(row(
        "an address outside every Service CIDR: left alone in every mode",
        pod(),
        POD,
        TCP,
        "10.98.0.5",
        80,
        Expect::Unchanged,
    ));
    s
}

fn cluster_ip_rows() -> Scenario {
    let five = (1..=5).fold(SliceBuilder::new("five").port("", 8080), |b, i| {
        b.ready(&format!("10.0.2.{}", 10 + i), "node-b")
    });
    scenario(
        "ClusterIP",
        vec![
            ServiceBuilder::new("default/web", "10.96.0.10")
                .tcp("", 80)
                .build(),
            ServiceBuilder::new("default/one", "10.96.0.11")
                .tcp("", 80)
                .build(),
            ServiceBuilder::new("default/five", "10.96.0.12")
                .tcp("", 80)
                .build(),
        ],
        vec![
            two_eps("web"),
            SliceBuilder::new("one")
                .port("", 8080)
                .ready("10.0.2.5", "node-b")
                .build(),
            five.build(),
        ],
        vec![
            row(
                "pod to ClusterIP: any endpoint, source kept",
                pod(),
                POD,
                TCP,
                "10.96.0.10",
                80,
                both(false),
            ),
            row(
                "external to ClusterIP: masqueraded (off-cluster source)",
                From::External,
                EXT,
                TCP,
                "10.96.0.10",
                80,
                both(true),
            ),
            row(
                "node to ClusterIP: masqueraded",
                From::Node,
                NODE_IP,
                TCP,
                "10.96.0.10",
                80,
                both(true),
            ),
            row(
                "hairpin: a pod reaching itself through its Service is masqueraded",
                pod(),
                "10.0.1.4",
                TCP,
                "10.96.0.10",
                80,
                Expect::Backends(vec![(L1, true), (R1, false)]),
            ),
            row(
                "one endpoint",
                pod(),
                POD,
                TCP,
                "10.96.0.11",
                80,
                Expect::Backends(vec![(R1, false)]),
            ),
            row(
                "five endpoints, equally likely",
                pod(),
                POD,
                TCP,
                "10.96.0.12",
                80,
                Expect::Backends(vec![
                    ("10.0.2.11:8080", false),
                    ("10.0.2.12:8080", false),
                    ("10.0.2.13:8080", false),
                    ("10.0.2.14:8080", false),
                    ("10.0.2.15:8080", false),
                ]),
            ),
            row(
                "a port the Service does not have",
                pod(),
                POD,
                TCP,
                "10.96.0.10",
                81,
                Expect::Unchanged,
            ),
            row(
                "UDP to a TCP-only Service port",
                pod(),
                POD,
                UDP,
                "10.96.0.10",
                80,
                Expect::Unchanged,
            ),
            row(
                "ping to a ClusterIP: no rule, no local address, nothing answers",
                pod(),
                POD,
                Proto::Icmp,
                "10.96.0.10",
                0,
                Expect::Unchanged,
            ),
        ],
    )
}

/// A pod reaching itself through its Service when its EndpointSlice entry has no
/// `nodeName`: upstream masquerades it in both modes (iptables: every KUBE-SEP chain's `-s
/// <endpoint> -j KUBE-MARK-MASQ`; nftables v1.36: every endpoint of the Service in
/// `hairpin-connections`), or the reply would go straight back inside the pod and miss the
/// reverse NAT.
fn hairpin_without_node_name() -> Scenario {
    scenario(
        "hairpin: EndpointSlice entries without nodeName",
        vec![
            ServiceBuilder::new("default/unnamed", "10.96.0.13")
                .tcp("", 80)
                .build(),
        ],
        vec![
            SliceBuilder::new("unnamed")
                .port("", 8080)
                .ready_without_node("10.0.1.6")
                .ready("10.0.2.5", "node-b")
                .build(),
        ],
        vec![
            row(
                "the pod reaching itself is masqueraded",
                pod(),
                "10.0.1.6",
                TCP,
                "10.96.0.13",
                80,
                Expect::Backends(vec![("10.0.1.6:8080", true), (R1, false)]),
            ),
            row(
                "another pod is not",
                pod(),
                POD,
                TCP,
                "10.96.0.13",
                80,
                Expect::Backends(vec![("10.0.1.6:8080", false), (R1, false)]),
            ),
        ],
    )
}

fn ports_and_protocols() -> Scenario {
    scenario(
        "targetPort, named ports, UDP and SCTP",
        vec![
            ServiceBuilder::new("default/multi", "10.96.0.20")
                .tcp("http", 80)
                .tcp("metrics", 9090)
                .build(),
            ServiceBuilder::new("default/dns", "10.96.0.21")
                .udp("dns", 53)
                .tcp("dns-tcp", 53)
                .build(),
            ServiceBuilder::new("default/sig", "10.96.0.22")
                .port("", Protocol::Sctp, 3868)
                .build(),
        ],
        vec![
            SliceBuilder::new("multi")
                .port("http", 8080)
                .port("metrics", 9100)
                .ready("10.0.2.5", "node-b")
                .build(),
            SliceBuilder::new("dns")
                .port_proto("dns", Protocol::Udp, 5353)
                .port_proto("dns-tcp", Protocol::Tcp, 5354)
                .ready("10.0.2.5", "node-b")
                .build(),
            SliceBuilder::new("sig")
                .port_proto("", Protocol::Sctp, 3868)
                .ready("10.0.2.5", "node-b")
                .build(),
        ],
        vec![
            row(
                "named port http: targetPort 8080",
                pod(),
                POD,
                TCP,
                "10.96.0.20",
                80,
                Expect::Backends(vec![(R1, false)]),
            ),
            row(
                "named port metrics: targetPort 9100",
                pod(),
                POD,
                TCP,
                "10.96.0.20",
                9090,
                Expect::Backends(vec![("10.0.2.5:9100", false)]),
            ),
            row(
                "UDP port",
                pod(),
                POD,
                UDP,
                "10.96.0.21",
                53,
                Expect::Backends(vec![("10.0.2.5:5353", false)]),
            ),
            row(
                "TCP port of the same number",
                pod(),
                POD,
                TCP,
                "10.96.0.21",
                53,
                Expect::Backends(vec![("10.0.2.5:5354", false)]),
            ),
            row(
                "SCTP",
                pod(),
                POD,
                SCTP,
                "10.96.0.22",
                3868,
                Expect::Backends(vec![("10.0.2.5:3868", false)]),
            ),
        ],
    )
}

fn no_endpoints() -> Scenario {
    scenario(
        "Services without endpoints",
        vec![
            ServiceBuilder::new("default/empty", "10.96.0.30")
                .tcp("", 80)
                .node_port(30030)
                .external_ips(&["192.168.56.200"])
                .build(),
            ServiceBuilder::new("default/not-serving", "10.96.0.31")
                .tcp("", 80)
                .build(),
        ],
        vec![
            SliceBuilder::new("not-serving")
                .port("", 8080)
                .endpoint("10.0.2.5", "node-b", false, false, true)
                .build(),
        ],
        vec![
            row(
                "pod to ClusterIP: rejected",
                pod(),
                POD,
                TCP,
                "10.96.0.30",
                80,
                Expect::Reject,
            ),
            row(
                "node to ClusterIP: rejected",
                From::Node,
                NODE_IP,
                TCP,
                "10.96.0.30",
                80,
                Expect::Reject,
            ),
            row(
                "external to NodePort: rejected",
                From::External,
                EXT,
                TCP,
                NODE_IP,
                30030,
                Expect::Reject,
            ),
            row(
                "outside traffic to 127.0.0.1:NodePort without endpoints: localnet drop (CVE-2020-8558), before the REJECT",
                From::External,
                EXT,
                TCP,
                "127.0.0.1",
                30030,
                Expect::Drop,
            ),
            row(
                "external to external IP: rejected",
                From::External,
                EXT,
                TCP,
                "192.168.56.200",
                80,
                Expect::Reject,
            ),
            row(
                "only a terminating, not serving endpoint: rejected",
                pod(),
                POD,
                TCP,
                "10.96.0.31",
                80,
                Expect::Reject,
            ),
        ],
    )
}

fn node_ports() -> Scenario {
    let mut s = scenario(
        "NodePort on every local address",
        vec![
            ServiceBuilder::new("default/np", "10.96.0.40")
                .tcp("", 80)
                .node_port(30040)
                .build(),
        ],
        vec![two_eps("np")],
        vec![
            row(
                "external to node IP: masqueraded",
                From::External,
                EXT,
                TCP,
                NODE_IP,
                30040,
                both(true),
            ),
            row(
                "external to another local address",
                From::External,
                EXT,
                TCP,
                "10.0.1.1",
                30040,
                both(true),
            ),
            row(
                "pod to node IP: masqueraded (Cluster policy)",
                pod(),
                POD,
                TCP,
                NODE_IP,
                30040,
                both(true),
            ),
            row(
                "node to its own IP",
                From::Node,
                NODE_IP,
                TCP,
                NODE_IP,
                30040,
                both(true),
            ),
            row(
                "node to the ClusterIP still works",
                From::Node,
                NODE_IP,
                TCP,
                "10.96.0.40",
                80,
                both(true),
            ),
            row(
                "external to a port that is no NodePort: untouched",
                From::External,
                EXT,
                TCP,
                NODE_IP,
                30041,
                Expect::Unchanged,
            ),
            row(
                "node to 127.0.0.1:NodePort (localhost NodePorts)",
                From::Node,
                "127.0.0.1",
                TCP,
                "127.0.0.1",
                30040,
                both(true),
            ),
            row(
                "outside traffic to 127.0.0.1 without a NodePort: localnet drop (CVE-2020-8558)",
                From::External,
                EXT,
                TCP,
                "127.0.0.1",
                22,
                Expect::Drop,
            ),
        ],
    );
    for r in &mut s.rows {
        if r.name.starts_with("node to 127.0.0.1") {
            r.exceptions.push((
                "nftables",
                Expect::Unchanged,
                "upstream's nftables mode does not serve NodePorts on 127.0.0.1 (no route_localnet)",
            ));
        }
        if r.name.starts_with("outside traffic to 127.0.0.1") {
            r.exceptions.push((
                "nftables",
                Expect::Drop,
                "nftables mode does not set route_localnet, so the kernel itself drops martian 127.0.0.0/8 traffic; there is no KUBE-FIREWALL rule",
            ));
        }
    }
    s
}

fn node_port_addresses() -> Scenario {
    let mut s = scenario(
        "--nodeport-addresses 192.168.56.0/24",
        vec![
            ServiceBuilder::new("default/np", "10.96.0.41")
                .tcp("", 80)
                .node_port(30041)
                .build(),
        ],
        vec![two_eps("np")],
        vec![
            row(
                "node IP inside the CIDR",
                From::External,
                EXT,
                TCP,
                NODE_IP,
                30041,
                both(true),
            ),
            row(
                "local address outside the CIDR: untouched",
                From::External,
                EXT,
                TCP,
                "10.0.1.1",
                30041,
                Expect::Unchanged,
            ),
            row(
                "no localhost NodePorts when 127.0.0.1 is outside the CIDRs",
                From::Node,
                "127.0.0.1",
                TCP,
                "127.0.0.1",
                30041,
                Expect::Unchanged,
            ),
        ],
    );
    s.settings.nodeport_addresses = vec!["192.168.56.0/24"];
    s
}

/// `--nodeport-addresses primary` (nftables mode's default) on a dual-stack node whose Node
/// object lists only its IPv4 address: upstream turns `primary` into the node's address for
/// the families it knows one of, and a family without one accepts NodePorts on every local
/// address but loopback (iptables: `--dst-type LOCAL`; nftables: `fib daddr type local`).
fn node_port_primary_without_node_address() -> Scenario {
    let mut s = scenario(
        "--nodeport-addresses primary, the Node lists no IPv6 address",
        vec![
            ServiceBuilder::new("default/dns", "10.96.0.42")
                .also_cluster_ip("fd00:96::42")
                .udp("dns", 53)
                .node_port(30053)
                .build(),
            ServiceBuilder::new("default/dns-empty", "10.96.0.43")
                .also_cluster_ip("fd00:96::43")
                .tcp("dns-tcp", 53)
                .node_port(30054)
                .build(),
        ],
        vec![
            SliceBuilder::new("dns")
                .port_proto("dns", Protocol::Udp, 5353)
                .ready("10.0.2.5", "node-b")
                .build(),
            SliceBuilder::new("dns")
                .named("dns-v6")
                .ipv6()
                .port_proto("dns", Protocol::Udp, 5353)
                .ready("fd00:10:2::5", "node-b")
                .build(),
        ],
        vec![
            row(
                "IPv4: the Node's address accepts the NodePort",
                From::External,
                EXT,
                UDP,
                NODE_IP,
                30053,
                Expect::Backends(vec![("10.0.2.5:5353", true)]),
            ),
            row(
                "IPv4: another local address does not (primary only)",
                From::External,
                EXT,
                UDP,
                "10.0.1.1",
                30053,
                Expect::Unchanged,
            ),
            row(
                "IPv6 without a Node address: every local address accepts the NodePort",
                From::External,
                "2001:db8::7",
                UDP,
                NODE_IP6,
                30053,
                Expect::Backends(vec![("[fd00:10:2::5]:5353", true)]),
            ),
            row(
                "IPv6 without a Node address: a NodePort without endpoints is rejected",
                From::External,
                "2001:db8::7",
                TCP,
                NODE_IP6,
                30054,
                Expect::Reject,
            ),
        ],
    );
    s.settings.nodeport_addresses = vec!["primary"];
    s.node.addresses = vec![ip(NODE_IP)];
    s
}

fn external_and_load_balancer_ips() -> Scenario {
    scenario(
        "externalIPs and LoadBalancer IPs",
        vec![
            ServiceBuilder::new("default/ext", "10.96.0.50")
                .tcp("", 80)
                .external_ips(&["192.168.56.200"])
                .build(),
            ServiceBuilder::new("default/lb", "10.96.0.51")
                .tcp("", 80)
                .node_port(30051)
                .load_balancer(&["192.168.56.201"])
                .load_balancer_proxy_mode("192.168.56.202")
                .build(),
        ],
        vec![two_eps("ext"), two_eps("lb")],
        vec![
            row(
                "external to an external IP: masqueraded",
                From::External,
                EXT,
                TCP,
                "192.168.56.200",
                80,
                both(true),
            ),
            row(
                "pod to an external IP: masqueraded (Cluster policy)",
                pod(),
                POD,
                TCP,
                "192.168.56.200",
                80,
                both(true),
            ),
            row(
                "external IP on another port: untouched",
                From::External,
                EXT,
                TCP,
                "192.168.56.200",
                81,
                Expect::Unchanged,
            ),
            row(
                "LB ingress IP in VIP mode",
                From::External,
                EXT,
                TCP,
                "192.168.56.201",
                80,
                both(true),
            ),
            row(
                "LB ingress IP in Proxy mode is not captured",
                From::External,
                EXT,
                TCP,
                "192.168.56.202",
                80,
                Expect::Unchanged,
            ),
            row(
                "the LB Service's NodePort",
                From::External,
                EXT,
                TCP,
                NODE_IP,
                30051,
                both(true),
            ),
        ],
    )
}

fn source_ranges() -> Scenario {
    scenario(
        "loadBalancerSourceRanges",
        vec![
            ServiceBuilder::new("default/fw", "10.96.0.60")
                .tcp("", 80)
                .node_port(30060)
                .load_balancer(&["192.168.56.203"])
                .source_ranges(&["203.0.113.0/24"])
                .build(),
            ServiceBuilder::new("default/fw-node", "10.96.0.61")
                .tcp("", 80)
                .load_balancer(&["172.16.0.4"])
                .source_ranges(&["203.0.113.0/24", "192.168.56.0/24"])
                .build(),
        ],
        vec![two_eps("fw"), two_eps("fw-node")],
        vec![
            row(
                "client inside a source range",
                From::External,
                EXT,
                TCP,
                "192.168.56.203",
                80,
                both(true),
            ),
            row(
                "client outside every source range: dropped",
                From::External,
                EXT2,
                TCP,
                "192.168.56.203",
                80,
                Expect::Drop,
            ),
            row(
                "NodePorts are not filtered by source ranges",
                From::External,
                EXT2,
                TCP,
                NODE_IP,
                30060,
                both(true),
            ),
            row(
                "the ClusterIP is not filtered either",
                pod(),
                POD,
                TCP,
                "10.96.0.60",
                80,
                both(false),
            ),
            row(
                "node IP inside a range: traffic looping back with the LB IP as source is allowed",
                From::Node,
                "172.16.0.4",
                TCP,
                "172.16.0.4",
                80,
                both(true),
            ),
            row(
                "node IP outside every range: the same looped traffic is dropped",
                From::Node,
                "192.168.56.203",
                TCP,
                "192.168.56.203",
                80,
                Expect::Drop,
            ),
        ],
    )
}

fn external_policy_local() -> Scenario {
    scenario(
        "externalTrafficPolicy: Local",
        vec![
            ServiceBuilder::new("default/local", "10.96.0.70")
                .tcp("", 80)
                .node_port(30070)
                .load_balancer(&["192.168.56.205"])
                .external_local(Some(32070))
                .build(),
            ServiceBuilder::new("default/remote-only", "10.96.0.71")
                .tcp("", 80)
                .node_port(30071)
                .load_balancer(&["192.168.56.206"])
                .external_local(Some(32071))
                .build(),
        ],
        vec![
            two_eps("local"),
            SliceBuilder::new("remote-only")
                .port("", 8080)
                .ready("10.0.2.5", "node-b")
                .build(),
        ],
        vec![
            row(
                "external to NodePort: local endpoint only, client IP kept",
                From::External,
                EXT,
                TCP,
                NODE_IP,
                30070,
                Expect::Backends(vec![(L1, false)]),
            ),
            row(
                "external to LB IP: local endpoint only, client IP kept",
                From::External,
                EXT,
                TCP,
                "192.168.56.205",
                80,
                Expect::Backends(vec![(L1, false)]),
            ),
            row(
                "pod to NodePort: short-circuited to all endpoints",
                pod(),
                POD,
                TCP,
                NODE_IP,
                30070,
                both(false),
            ),
            row(
                "node to NodePort: all endpoints, masqueraded",
                From::Node,
                NODE_IP,
                TCP,
                NODE_IP,
                30070,
                both(true),
            ),
            row(
                "ClusterIP keeps Cluster policy",
                pod(),
                POD,
                TCP,
                "10.96.0.70",
                80,
                both(false),
            ),
            row(
                "health check NodePort is accepted",
                From::External,
                EXT,
                TCP,
                NODE_IP,
                32070,
                Expect::Unchanged,
            ),
            row(
                "outside traffic to 127.0.0.1:health check NodePort: localnet drop (CVE-2020-8558), before the ACCEPT",
                From::External,
                EXT,
                TCP,
                "127.0.0.1",
                32070,
                Expect::Drop,
            ),
            row(
                "no local endpoint: external traffic dropped",
                From::External,
                EXT,
                TCP,
                NODE_IP,
                30071,
                Expect::Drop,
            ),
            row(
                "no local endpoint: LB IP dropped",
                From::External,
                EXT,
                TCP,
                "192.168.56.206",
                80,
                Expect::Drop,
            ),
            row(
                "no local endpoint: pod traffic still short-circuited",
                pod(),
                POD,
                TCP,
                NODE_IP,
                30071,
                Expect::Backends(vec![(R1, false)]),
            ),
            row(
                "no local endpoint: node traffic still served",
                From::Node,
                NODE_IP,
                TCP,
                NODE_IP,
                30071,
                Expect::Backends(vec![(R1, true)]),
            ),
        ],
    )
}

fn internal_policy_local() -> Scenario {
    scenario(
        "internalTrafficPolicy: Local",
        vec![
            ServiceBuilder::new("default/itp", "10.96.0.80")
                .tcp("", 80)
                .internal_local()
                .build(),
            ServiceBuilder::new("default/itp-remote", "10.96.0.81")
                .tcp("", 80)
                .internal_local()
                .build(),
            ServiceBuilder::new("default/both-local", "10.96.0.82")
                .tcp("", 80)
                .node_port(30082)
                .internal_local()
                .external_local(None)
                .build(),
        ],
        vec![
            two_eps("itp"),
            SliceBuilder::new("itp-remote")
                .port("", 8080)
                .ready("10.0.2.5", "node-b")
                .build(),
            two_eps("both-local"),
        ],
        vec![
            row(
                "pod to ClusterIP: local endpoints only",
                pod(),
                POD,
                TCP,
                "10.96.0.80",
                80,
                Expect::Backends(vec![(L1, false)]),
            ),
            row(
                "no local endpoint: dropped",
                pod(),
                POD,
                TCP,
                "10.96.0.81",
                80,
                Expect::Drop,
            ),
            row(
                "both policies Local: ClusterIP uses local endpoints",
                pod(),
                POD,
                TCP,
                "10.96.0.82",
                80,
                Expect::Backends(vec![(L1, false)]),
            ),
            row(
                "both policies Local: external NodePort traffic uses local endpoints",
                From::External,
                EXT,
                TCP,
                NODE_IP,
                30082,
                Expect::Backends(vec![(L1, false)]),
            ),
            row(
                "both policies Local: pod traffic to the NodePort is short-circuited to all endpoints",
                pod(),
                POD,
                TCP,
                NODE_IP,
                30082,
                both(false),
            ),
            row(
                "both policies Local: node traffic to the NodePort uses all endpoints, masqueraded",
                From::Node,
                NODE_IP,
                TCP,
                NODE_IP,
                30082,
                both(true),
            ),
        ],
    )
}

fn affinity_terminating_topology() -> Scenario {
    scenario(
        "affinity, terminating endpoints, topology",
        vec![
            ServiceBuilder::new("default/sticky", "10.96.0.90")
                .tcp("", 80)
                .affinity(10800)
                .build(),
            ServiceBuilder::new("default/term", "10.96.0.91")
                .tcp("", 80)
                .build(),
            ServiceBuilder::new("default/all-term", "10.96.0.92")
                .tcp("", 80)
                .build(),
            ServiceBuilder::new("default/term-local", "10.96.0.93")
                .tcp("", 80)
                .node_port(30093)
                .external_local(None)
                .build(),
            ServiceBuilder::new("default/zone", "10.96.0.94")
                .tcp("", 80)
                .build(),
            ServiceBuilder::new("default/same-node", "10.96.0.95")
                .tcp("", 80)
                .build(),
            ServiceBuilder::new("default/zone-miss", "10.96.0.96")
                .tcp("", 80)
                .build(),
        ],
        vec![
            two_eps("sticky"),
            SliceBuilder::new("term")
                .port("", 8080)
                .endpoint("10.0.1.4", NODE, true, true, false)
                .endpoint("10.0.2.5", "node-b", false, true, true)
                .build(),
            SliceBuilder::new("all-term")
                .port("", 8080)
                .endpoint("10.0.1.4", NODE, false, true, true)
                .endpoint("10.0.2.5", "node-b", false, false, true)
                .build(),
            SliceBuilder::new("term-local")
                .port("", 8080)
                .endpoint("10.0.1.4", NODE, false, true, true)
                .endpoint("10.0.2.5", "node-b", true, true, false)
                .build(),
            SliceBuilder::new("zone")
                .port("", 8080)
                .ready("10.0.1.4", NODE)
                .zone_hints(&["zone-a"])
                .ready("10.0.2.5", "node-b")
                .zone_hints(&["zone-b"])
                .build(),
            SliceBuilder::new("same-node")
                .port("", 8080)
                .ready("10.0.1.5", NODE)
                .node_hints(&[NODE])
                .zone_hints(&["zone-a"])
                .ready("10.0.2.6", "node-b")
                .node_hints(&["node-b"])
                .zone_hints(&["zone-a"])
                .build(),
            SliceBuilder::new("zone-miss")
                .port("", 8080)
                .ready("10.0.1.4", NODE)
                .zone_hints(&["zone-b"])
                .ready("10.0.2.5", "node-b")
                .zone_hints(&["zone-c"])
                .build(),
        ],
        vec![
            row(
                "ClientIP affinity: a new client may get any endpoint",
                pod(),
                POD,
                TCP,
                "10.96.0.90",
                80,
                both(false),
            ),
            row(
                "a terminating endpoint is not used while a ready one exists",
                pod(),
                POD,
                TCP,
                "10.96.0.91",
                80,
                Expect::Backends(vec![(L1, false)]),
            ),
            row(
                "no ready endpoint: serving+terminating ones are used",
                pod(),
                POD,
                TCP,
                "10.96.0.92",
                80,
                Expect::Backends(vec![(L1, false)]),
            ),
            row(
                "Local policy with only a terminating local endpoint: it is used",
                From::External,
                EXT,
                TCP,
                NODE_IP,
                30093,
                Expect::Backends(vec![(L1, false)]),
            ),
            row(
                "PreferSameZone hints: this zone's endpoint",
                pod(),
                POD,
                TCP,
                "10.96.0.94",
                80,
                Expect::Backends(vec![(L1, false)]),
            ),
            row(
                "PreferSameNode hints: this node's endpoint",
                pod(),
                POD,
                TCP,
                "10.96.0.95",
                80,
                Expect::Backends(vec![(L2, false)]),
            ),
            row(
                "hints without this zone: ignored",
                pod(),
                POD,
                TCP,
                "10.96.0.96",
                80,
                both(false),
            ),
        ],
    )
}

fn masquerade_all() -> Scenario {
    let mut s = scenario(
        "--masquerade-all",
        vec![
            ServiceBuilder::new("default/web", "10.96.0.100")
                .tcp("", 80)
                .build(),
        ],
        vec![two_eps("web")],
        vec![row(
            "pod to ClusterIP: masqueraded too",
            pod(),
            POD,
            TCP,
            "10.96.0.100",
            80,
            both(true),
        )],
    );
    s.settings.masquerade_all = true;
    s
}

fn detect_local_modes() -> Vec<Scenario> {
    let services = vec![
        ServiceBuilder::new("default/web", "10.96.0.110")
            .tcp("", 80)
            .node_port(30110)
            .external_local(None)
            .build(),
    ];
    let slices = vec![two_eps("web")];
    let mk = |name: &'static str, mode: DetectLocal, rows: Vec<Row>| {
        let mut s = scenario(name, services.clone(), slices.clone(), rows);
        s.settings.detect_local = mode;
        s
    };
    vec![
        mk(
            "--detect-local-mode NodeCIDR",
            DetectLocal::NodeCidr,
            vec![
                row(
                    "a pod of this node: source kept",
                    pod(),
                    POD,
                    TCP,
                    "10.96.0.110",
                    80,
                    both(false),
                ),
                row(
                    "a pod of another node's CIDR counts as off-node: masqueraded",
                    From::External,
                    "10.0.2.50",
                    TCP,
                    "10.96.0.110",
                    80,
                    both(true),
                ),
            ],
        ),
        mk(
            "--detect-local-mode BridgeInterface",
            DetectLocal::BridgeInterface,
            vec![
                row(
                    "arriving on the pod bridge: source kept",
                    From::Pod { iface: POD_BRIDGE },
                    POD,
                    TCP,
                    "10.96.0.110",
                    80,
                    both(false),
                ),
                row(
                    "arriving on eth0: masqueraded",
                    From::External,
                    POD,
                    TCP,
                    "10.96.0.110",
                    80,
                    both(true),
                ),
                row(
                    "pod traffic to a Local-policy NodePort is short-circuited",
                    From::Pod { iface: POD_BRIDGE },
                    POD,
                    TCP,
                    NODE_IP,
                    30110,
                    both(false),
                ),
            ],
        ),
        mk(
            "--detect-local-mode InterfaceNamePrefix",
            DetectLocal::InterfaceNamePrefix,
            vec![
                row(
                    "arriving on veth*: source kept",
                    From::Pod { iface: "veth1234" },
                    POD,
                    TCP,
                    "10.96.0.110",
                    80,
                    both(false),
                ),
                row(
                    "arriving on eth0: masqueraded",
                    From::External,
                    POD,
                    TCP,
                    "10.96.0.110",
                    80,
                    both(true),
                ),
            ],
        ),
        mk(
            "no local detection (no --cluster-cidr)",
            DetectLocal::None,
            vec![
                row(
                    "nothing is masqueraded for ClusterIPs",
                    From::External,
                    EXT,
                    TCP,
                    "10.96.0.110",
                    80,
                    both(false),
                ),
                row(
                    "Local-policy NodePort from a pod is not short-circuited",
                    pod(),
                    POD,
                    TCP,
                    NODE_IP,
                    30110,
                    Expect::Backends(vec![(L1, false)]),
                ),
            ],
        ),
    ]
}

fn ipv6_and_dual_stack() -> Scenario {
    scenario(
        "IPv6 and dual-stack",
        vec![
            ServiceBuilder::new("default/six", "fd00:96::10")
                .tcp("", 80)
                .node_port(30120)
                .build(),
            ServiceBuilder::new("default/dual", "10.96.0.121")
                .also_cluster_ip("fd00:96::11")
                .tcp("", 80)
                .build(),
            ServiceBuilder::new("default/v4only", "10.96.0.122")
                .tcp("", 80)
                .external_ips(&["192.168.56.210", "fd00:56::210"])
                .build(),
        ],
        vec![
            SliceBuilder::new("six")
                .ipv6()
                .port("", 8080)
                .ready("fd00:10:1::4", NODE)
                .build(),
            two_eps("dual"),
            SliceBuilder::new("dual")
                .named("dual-v6")
                .ipv6()
                .port("", 8080)
                .ready("fd00:10:2::5", "node-b")
                .build(),
            two_eps("v4only"),
        ],
        vec![
            row(
                "IPv6 ClusterIP from a pod",
                pod(),
                "fd00:10:1::50",
                TCP,
                "fd00:96::10",
                80,
                Expect::Backends(vec![("[fd00:10:1::4]:8080", false)]),
            ),
            row(
                "IPv6 ClusterIP from outside: masqueraded",
                From::External,
                "2001:db8::7",
                TCP,
                "fd00:96::10",
                80,
                Expect::Backends(vec![("[fd00:10:1::4]:8080", true)]),
            ),
            row(
                "IPv6 NodePort",
                From::External,
                "2001:db8::7",
                TCP,
                NODE_IP6,
                30120,
                Expect::Backends(vec![("[fd00:10:1::4]:8080", true)]),
            ),
            row(
                "dual-stack Service over IPv4",
                pod(),
                POD,
                TCP,
                "10.96.0.121",
                80,
                both(false),
            ),
            row(
                "dual-stack Service over IPv6",
                pod(),
                "fd00:10:1::50",
                TCP,
                "fd00:96::11",
                80,
                Expect::Backends(vec![("[fd00:10:2::5]:8080", false)]),
            ),
            row(
                "IPv4 external IP of an IPv4-only Service",
                From::External,
                EXT,
                TCP,
                "192.168.56.210",
                80,
                both(true),
            ),
            row(
                "an IPv6 external IP on an IPv4-only Service is ignored",
                From::External,
                "2001:db8::7",
                TCP,
                "fd00:56::210",
                80,
                Expect::Unchanged,
            ),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_well_formed() {
        let all = scenarios();
        assert!(all.len() >= 15);
        let rows: usize = all.iter().map(|s| s.rows.len()).sum();
        assert!(rows >= 70, "{rows} rows");
        for s in &all {
            for r in &s.rows {
                if let Expect::Backends(b) = &r.expect {
                    assert!(!b.is_empty(), "{}: {}", s.name, r.name);
                }
                assert_eq!(
                    kp_model::IpFamily::of(&r.src),
                    kp_model::IpFamily::of(&r.dst),
                    "{}: {}",
                    s.name,
                    r.name
                );
            }
        }
    }
}
