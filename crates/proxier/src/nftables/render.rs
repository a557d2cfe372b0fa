//! Rendering: a [`Snapshot`] becomes the objects of upstream kube-proxy's nftables layout.
//! Pure: no I/O, no clock.
//!
//! The output is split the way a sync needs it:
//! - [`fixed_chains`] and [`containers`]: the base chains, the dispatch and check chains and
//!   the shared sets and maps, which depend on the configuration only;
//! - [`ServiceObjects`] per Service: its chains with their rules, its affinity sets, and the
//!   elements it contributes to the shared sets and maps ([`Element`]).
//!
//! Endpoint selection is upstream v1.36's, one lookup per new connection whatever the number
//! of endpoints: a policy chain (`service-…`, `local-…`) holds one rule,
//! `meta l4proto P dnat ip addr . port to numgen random mod N map { 0 : IP . PORT , … }`;
//! with session affinity it holds one `ip saddr @affinity-X goto endpoint-X` per endpoint and
//! then `numgen random mod N vmap { 0 : goto endpoint-X , … }`, and each `endpoint-` chain
//! records the client and DNATs. Endpoint chains exist only for Services with session
//! affinity, as upstream's. Hairpin traffic is masqueraded by the `masquerading` chain through
//! the `hairpin-connections` set, which holds every endpoint in use.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::IpAddr;

use ipnet::IpNet;
use kp_model::{
    Endpoint, IpFamily, NamespacedName, Protocol, ServicePortInfo, ServicePortName,
    SessionAffinity, Snapshot,
};
use kp_netfilter::quote;
use kp_track::categorize;

use super::names::{
    CLUSTER_IPS, CLUSTER_IPS_CHECK, FILTER_FORWARD, FILTER_INPUT, FILTER_OUTPUT,
    FILTER_OUTPUT_PRE_DNAT, FILTER_PREROUTING_PRE_DNAT, FIREWALL_CHECK, FIREWALL_IPS,
    HAIRPIN_CONNECTIONS, MASQUERADING, NAT_OUTPUT, NAT_POSTROUTING, NAT_PREROUTING,
    NO_ENDPOINT_NODEPORTS, NO_ENDPOINT_SERVICES, NODEPORT_ENDPOINTS_CHECK, NODEPORT_IPS,
    REJECT_CHAIN, SERVICE_ENDPOINTS_CHECK, SERVICE_IPS, SERVICE_NODEPORTS, SERVICES, ServiceChains,
    endpoint_names,
};
use crate::local::LocalMatch;

/// Mode-wide settings of one render, already resolved for the snapshot's family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderConfig {
    /// `--masquerade-all`: mark every packet to a ClusterIP for masquerading.
    pub masquerade_all: bool,
    /// The masquerade mark, `1 << --iptables-masquerade-bit` (default `0x4000`).
    pub masquerade_mark: u32,
    /// How pod traffic is recognised in this family, if at all.
    pub local: Option<LocalMatch>,
    /// `None`: NodePorts on every local address except loopback (`fib daddr type local`);
    /// `Some(ips)`: only on these addresses (the `nodeport-ips` set; loopback is skipped, as
    /// nftables mode never serves NodePorts on 127.0.0.1 or ::1).
    pub nodeport_ips: Option<Vec<IpAddr>>,
    /// The Service CIDRs of this family (the snapshot's, from the ServiceCIDR objects):
    /// `cluster-ips-check` drops new connections to their addresses that are no ClusterIP.
    /// Empty (no ServiceCIDR known yet): no such rule, as upstream.
    pub service_cidrs: Vec<IpNet>,
}

impl Default for RenderConfig {
    fn default() -> Self {
        RenderConfig {
            masquerade_all: false,
            masquerade_mark: 1 << 14,
            local: None,
            nodeport_ips: None,
            service_cidrs: Vec::new(),
        }
    }
}

/// A shared set or map that Services add elements to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Container {
    /// `cluster-ips` (set of addresses).
    ClusterIps,
    /// `service-ips` (map `addr . proto . port : verdict`).
    ServiceIps,
    /// `service-nodeports` (map `proto . port : verdict`).
    ServiceNodePorts,
    /// `no-endpoint-services` (map `addr . proto . port : verdict`).
    NoEndpointServices,
    /// `no-endpoint-nodeports` (map `proto . port : verdict`).
    NoEndpointNodePorts,
    /// `firewall-ips` (map `addr . proto . port : verdict`).
    FirewallIps,
    /// `hairpin-connections` (set `addr . addr . proto . port`). Its elements are not
    /// [`Element`]s: Services give them as [`ServiceObjects::hairpin`].
    HairpinConnections,
}

impl Container {
    /// Every container, in declaration order.
    pub const ALL: [Container; 7] = [
        Container::ClusterIps,
        Container::ServiceIps,
        Container::ServiceNodePorts,
        Container::NoEndpointServices,
        Container::NoEndpointNodePorts,
        Container::FirewallIps,
        Container::HairpinConnections,
    ];

    /// Its name in the table.
    pub fn name(self) -> &'static str {
        match self {
            Container::ClusterIps => CLUSTER_IPS,
            Container::ServiceIps => SERVICE_IPS,
            Container::ServiceNodePorts => SERVICE_NODEPORTS,
            Container::NoEndpointServices => NO_ENDPOINT_SERVICES,
            Container::NoEndpointNodePorts => NO_ENDPOINT_NODEPORTS,
            Container::FirewallIps => FIREWALL_IPS,
            Container::HairpinConnections => HAIRPIN_CONNECTIONS,
        }
    }

    /// `set` or `map`.
    pub fn kind(self) -> &'static str {
        match self {
            Container::ClusterIps | Container::HairpinConnections => "set",
            _ => "map",
        }
    }

    /// Its key type (`KEY : verdict` for maps) and comment, as `nft list` prints them.
    pub fn type_and_comment(self, family: IpFamily) -> (String, &'static str) {
        let addr = addr_type(family);
        match self {
            Container::ClusterIps => (addr.to_string(), "Active ClusterIPs"),
            Container::ServiceIps => (
                format!("{addr} . inet_proto . inet_service : verdict"),
                "ClusterIP, ExternalIP and LoadBalancer IP traffic",
            ),
            Container::ServiceNodePorts => (
                "inet_proto . inet_service : verdict".to_string(),
                "NodePort traffic",
            ),
            Container::NoEndpointServices => (
                format!("{addr} . inet_proto . inet_service : verdict"),
                "vmap to drop or reject packets to services with no endpoints",
            ),
            Container::NoEndpointNodePorts => (
                "inet_proto . inet_service : verdict".to_string(),
                "vmap to drop or reject packets to service nodeports with no endpoints",
            ),
            Container::FirewallIps => (
                format!("{addr} . inet_proto . inet_service : verdict"),
                "destinations that are subject to LoadBalancerSourceRanges",
            ),
            Container::HairpinConnections => (
                format!("{addr} . {addr} . inet_proto . inet_service"),
                "service hairpin connections",
            ),
        }
    }

    /// The `{ type …; comment …; }` body of its declaration, for `family`.
    pub fn declaration(self, family: IpFamily) -> String {
        let (ty, comment) = self.type_and_comment(family);
        format!("{{ type {ty} ; comment {} ; }}", quote(comment))
    }
}

/// The value of an element of a verdict map (`: drop`, `: goto CHAIN`); sets have none.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verdict {
    /// A set element: no value.
    None,
    /// `drop`.
    Drop,
    /// `goto reject-chain` (a Service without endpoints).
    Reject,
    /// `goto CHAIN`, one of the Service's own chains.
    Goto(String),
}

impl Verdict {
    /// Whether the element has no value (a set element).
    pub fn is_none(&self) -> bool {
        matches!(self, Verdict::None)
    }
}

impl std::fmt::Display for Verdict {
    /// The value as nft writes it after ` : ` (empty for [`Verdict::None`]).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::None => Ok(()),
            Verdict::Drop => f.write_str("drop"),
            Verdict::Reject => write!(f, "goto {REJECT_CHAIN}"),
            Verdict::Goto(chain) => write!(f, "goto {chain}"),
        }
    }
}

/// One element a Service contributes to a shared set or map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Element {
    /// Where it goes.
    pub container: Container,
    /// The key as nft writes it (`10.96.0.1 . tcp . 80`).
    pub key: String,
    /// The verdict for maps (`goto service-…`, `drop`); [`Verdict::None`] for sets.
    pub value: Verdict,
    /// An element comment (the ServicePortName, on the no-endpoint maps, like upstream).
    pub comment: Option<String>,
}

impl Element {
    /// The element as it goes between the braces of `add element`.
    pub fn text(&self) -> String {
        let mut s = String::new();
        write_element(&mut s, &self.key, &self.value, self.comment.as_deref());
        s
    }
}

/// Writes an element as it goes between the braces of `add element`:
/// `KEY[ comment "C"][ : VALUE]`.
pub fn write_element(
    out: &mut dyn std::fmt::Write,
    key: &str,
    value: &Verdict,
    comment: Option<&str>,
) {
    let _ = out.write_str(key);
    if let Some(c) = comment {
        let _ = write!(out, " comment {}", quote(c));
    }
    if !value.is_none() {
        let _ = write!(out, " : {value}");
    }
}

/// An element of `hairpin-connections`, `IP . IP . PROTO . PORT`: an endpoint in use. Kept
/// apart from the other [`Element`]s because there is one per endpoint (every Service has
/// some), so the sync state holds these 20 bytes instead of the element's text and claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hairpin {
    /// The endpoint's address.
    pub ip: IpAddr,
    /// The Service port's protocol.
    pub protocol: Protocol,
    /// The endpoint's port.
    pub port: u16,
}

impl std::fmt::Display for Hairpin {
    /// The element as nft writes it: `10.0.1.4 . 10.0.1.4 . tcp . 8080`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} . {} . {} . {}",
            self.ip,
            self.ip,
            self.protocol.as_lower(),
            self.port
        )
    }
}

/// A chain and its rules (nft rule text, in order).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChainRules {
    /// The chain's name.
    pub name: String,
    /// Its rules.
    pub rules: Vec<String>,
}

/// A per-endpoint affinity set: `{ type ipvX_addr ; flags dynamic,timeout ; timeout Ns ; }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AffinitySet {
    /// `affinity-…`.
    pub name: String,
    /// The Service's `sessionAffinityConfig.clientIP.timeoutSeconds`.
    pub timeout_seconds: u32,
}

/// Everything one Service (all its ports) puts into the table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceObjects {
    /// Its chains, in creation order.
    pub chains: Vec<ChainRules>,
    /// Its affinity sets.
    pub sets: Vec<AffinitySet>,
    /// Its elements in the shared sets and maps, but `hairpin-connections`.
    pub elements: Vec<Element>,
    /// Its elements in `hairpin-connections` (one per endpoint in use and port).
    pub hairpin: Vec<Hairpin>,
    /// Its endpoints in the snapshot (all ports, used or not).
    pub endpoints: usize,
}

impl ServiceObjects {
    /// Rules in all its chains.
    pub fn rule_count(&self) -> usize {
        self.chains.iter().map(|c| c.rules.len()).sum()
    }
}

/// A rendered snapshot (all Services, or only those that changed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rendered {
    /// The Services rendered, by name; a changed Service that is absent was deleted (or has
    /// no port in this family).
    pub services: BTreeMap<NamespacedName, ServiceObjects>,
    /// ServicePortNames in the snapshot.
    pub service_ports: usize,
    /// Endpoints of the rendered Services (of the whole snapshot in a full render; a partial
    /// render never walks the whole snapshot).
    pub endpoints: usize,
}

/// `ip` or `ip6`.
pub fn ip_word(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ip",
        IpFamily::V6 => "ip6",
    }
}

/// `ipv4_addr` or `ipv6_addr`.
pub fn addr_type(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ipv4_addr",
        IpFamily::V6 => "ipv6_addr",
    }
}

fn loopback(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "127.0.0.0/8",
        IpFamily::V6 => "::1",
    }
}

/// The mark as upstream prints it (`0x004000`).
fn mark_text(mark: u32) -> String {
    format!("{mark:#08x}")
}

/// The nft match of a local-traffic detector: `ip saddr 10.0.0.0/16`, `iifname "cbr0"`,
/// `iifname "veth*"` (an iptables `+` wildcard becomes nft's `*`), negated with `!=`.
pub fn local_match(family: IpFamily, m: &LocalMatch, negate: bool) -> String {
    let op = if negate { "!= " } else { "" };
    match m {
        LocalMatch::Source(net) => format!("{} saddr {op}{net}", ip_word(family)),
        LocalMatch::Interface(name) => {
            let name = match name.strip_suffix('+') {
                Some(prefix) => format!("{prefix}*"),
                None => name.clone(),
            };
            format!("iifname {op}{}", quote(&name))
        }
    }
}

/// One base chain of the layout: `(name, type, hook, priority as written, priority value)`.
/// nft 1.0.6 accepts the name `dstnat` only on the prerouting hook, so the output-hook
/// chains write the number (upstream's knftables writes `dstnat`, which newer nft accepts).
pub const BASE_CHAINS: [(&str, &str, &str, &str, i32); 8] = [
    (
        FILTER_PREROUTING_PRE_DNAT,
        "filter",
        "prerouting",
        "dstnat - 10",
        -110,
    ),
    (FILTER_OUTPUT_PRE_DNAT, "filter", "output", "-110", -110),
    (FILTER_INPUT, "filter", "input", "filter", 0),
    (FILTER_FORWARD, "filter", "forward", "filter", 0),
    (FILTER_OUTPUT, "filter", "output", "filter", 0),
    (NAT_PREROUTING, "nat", "prerouting", "dstnat", -100),
    (NAT_OUTPUT, "nat", "output", "-100", -100),
    (NAT_POSTROUTING, "nat", "postrouting", "srcnat", 100),
];

/// The regular chains that are not per-Service, in creation order.
pub const FIXED_CHAINS: [&str; 7] = [
    NODEPORT_ENDPOINTS_CHECK,
    SERVICE_ENDPOINTS_CHECK,
    FIREWALL_CHECK,
    SERVICES,
    MASQUERADING,
    CLUSTER_IPS_CHECK,
    REJECT_CHAIN,
];

/// The rules of the base chains and of [`FIXED_CHAINS`] for `family` and `cfg`, in creation
/// order (base chains first).
pub fn fixed_chains(family: IpFamily, cfg: &RenderConfig) -> Vec<ChainRules> {
    let ip = ip_word(family);
    let mark = mark_text(cfg.masquerade_mark);
    let chain = |name: &str, rules: Vec<String>| ChainRules {
        name: name.to_string(),
        rules,
    };
    let new_jump = |target: &str| format!("ct state new jump {target}");
    let mut services = Vec::new();
    if cfg.masquerade_all {
        services.push(format!(
            "{ip} daddr @{CLUSTER_IPS} mark set mark or {mark} comment {}",
            quote("masquerade all clusterIP traffic")
        ));
    } else if let Some(local) = &cfg.local {
        services.push(format!(
            "{ip} daddr @{CLUSTER_IPS} {} mark set mark or {mark} comment {}",
            local_match(family, local, true),
            quote("masquerade clusterIP traffic from outside cluster")
        ));
    }
    services.push(format!(
        "{ip} daddr . meta l4proto . th dport vmap @{SERVICE_IPS}"
    ));
    let nodeport_dst = match cfg.nodeport_ips {
        None => format!("fib daddr type local {ip} daddr != {}", loopback(family)),
        Some(_) => format!("{ip} daddr @{NODEPORT_IPS}"),
    };
    services.push(format!(
        "{nodeport_dst} meta l4proto . th dport vmap @{SERVICE_NODEPORTS}"
    ));
    let nodeport_check_dst = match cfg.nodeport_ips {
        None => format!("{ip} daddr != {}", loopback(family)),
        Some(_) => format!("{ip} daddr @{NODEPORT_IPS}"),
    };
    vec![
        chain(FILTER_PREROUTING_PRE_DNAT, vec![new_jump(FIREWALL_CHECK)]),
        chain(FILTER_OUTPUT_PRE_DNAT, vec![new_jump(FIREWALL_CHECK)]),
        chain(
            FILTER_INPUT,
            vec![
                new_jump(NODEPORT_ENDPOINTS_CHECK),
                new_jump(SERVICE_ENDPOINTS_CHECK),
            ],
        ),
        chain(
            FILTER_FORWARD,
            vec![
                new_jump(SERVICE_ENDPOINTS_CHECK),
                new_jump(CLUSTER_IPS_CHECK),
            ],
        ),
        chain(
            FILTER_OUTPUT,
            vec![
                new_jump(SERVICE_ENDPOINTS_CHECK),
                new_jump(CLUSTER_IPS_CHECK),
            ],
        ),
        chain(NAT_PREROUTING, vec![format!("jump {SERVICES}")]),
        chain(NAT_OUTPUT, vec![format!("jump {SERVICES}")]),
        chain(NAT_POSTROUTING, vec![format!("jump {MASQUERADING}")]),
        chain(
            NODEPORT_ENDPOINTS_CHECK,
            vec![format!(
                "{nodeport_check_dst} meta l4proto . th dport vmap @{NO_ENDPOINT_NODEPORTS}"
            )],
        ),
        chain(
            SERVICE_ENDPOINTS_CHECK,
            vec![format!(
                "{ip} daddr . meta l4proto . th dport vmap @{NO_ENDPOINT_SERVICES}"
            )],
        ),
        chain(
            FIREWALL_CHECK,
            vec![format!(
                "{ip} daddr . meta l4proto . th dport vmap @{FIREWALL_IPS}"
            )],
        ),
        chain(SERVICES, services),
        chain(
            MASQUERADING,
            vec![
                format!("mark and {mark} != 0 mark set mark xor {mark} masquerade fully-random"),
                format!(
                    "ct status dnat {ip} saddr . {ip} daddr . meta l4proto . th dport @{HAIRPIN_CONNECTIONS} masquerade fully-random"
                ),
            ],
        ),
        chain(CLUSTER_IPS_CHECK, cluster_ips_check(family, cfg)),
        chain(REJECT_CHAIN, vec!["reject".to_string()]),
    ]
}

/// The rules of `cluster-ips-check` (upstream's): a new connection to an active ClusterIP
/// on a port no Service uses is rejected; one to any other address of the Service CIDRs (an
/// unallocated ClusterIP) is dropped. Without Service CIDRs only the first rule exists.
pub fn cluster_ips_check(family: IpFamily, cfg: &RenderConfig) -> Vec<String> {
    let ip = ip_word(family);
    let mut rules = vec![format!(
        "{ip} daddr @{CLUSTER_IPS} reject comment {}",
        quote("Reject traffic to invalid ports of ClusterIPs")
    )];
    if !cfg.service_cidrs.is_empty() {
        let cidrs: Vec<String> = cfg.service_cidrs.iter().map(ToString::to_string).collect();
        rules.push(format!(
            "{ip} daddr {{ {} }} drop comment {}",
            cidrs.join(", "),
            quote(SERVICE_CIDRS_DROP_COMMENT)
        ));
    }
    rules
}

/// The comment of `cluster-ips-check`'s drop rule (upstream's).
pub const SERVICE_CIDRS_DROP_COMMENT: &str = "Drop traffic to unallocated ClusterIPs";

/// The comment of `reject-chain`.
pub const REJECT_CHAIN_COMMENT: &str = "helper for @no-endpoint-services / @no-endpoint-nodeports";

/// The comment of `nodeport-ips`.
pub const NODEPORT_IPS_COMMENT: &str = "IPs that accept NodePort traffic";

/// The `{ … }` declaration body of `nodeport-ips`.
pub fn nodeport_ips_declaration(family: IpFamily) -> String {
    format!(
        "{{ type {} ; comment {} ; }}",
        addr_type(family),
        quote(NODEPORT_IPS_COMMENT)
    )
}

/// The elements of `nodeport-ips` (loopback addresses are never included).
pub fn nodeport_ip_elements(cfg: &RenderConfig) -> Vec<IpAddr> {
    cfg.nodeport_ips
        .iter()
        .flatten()
        .copied()
        .filter(|ip| !ip.is_loopback())
        .collect()
}

/// Renders `snap`: every Service when `only` is `None` (a full sync), else only the
/// Services named in `only` (a partial sync; the work is proportional to their number).
pub fn render(
    snap: &Snapshot,
    cfg: &RenderConfig,
    only: Option<&BTreeSet<NamespacedName>>,
) -> Rendered {
    let mut out = Rendered {
        service_ports: snap.services.len(),
        ..Rendered::default()
    };
    for_each_service(snap, cfg, only, &mut |name, objs| {
        out.endpoints += objs.endpoints;
        out.services.insert(name.clone(), objs);
    });
    out
}

/// Renders the Services of `snap` (all of them, or those named in `only`) one at a time, in
/// name order, handing each Service's objects (all its ports) to `f`: what [`render`]
/// collects, without holding more than one Service.
pub fn for_each_service(
    snap: &Snapshot,
    cfg: &RenderConfig,
    only: Option<&BTreeSet<NamespacedName>>,
    f: &mut dyn FnMut(&NamespacedName, ServiceObjects),
) {
    let ctx = Ctx {
        family: snap.family,
        ip: ip_word(snap.family),
        mark: mark_text(cfg.masquerade_mark),
        cfg,
    };
    // The ports of a Service are adjacent in the snapshot (ServicePortNames sort by Service
    // first): a Service is complete when the next port belongs to another one.
    let mut current: Option<(NamespacedName, ServiceObjects)> = None;
    let mut port = |spn: &ServicePortName, svc: &ServicePortInfo| {
        if current.as_ref().is_some_and(|(n, _)| *n != spn.service)
            && let Some((name, objs)) = current.take()
        {
            f(&name, objs);
        }
        let (_, objs) =
            current.get_or_insert_with(|| (spn.service.clone(), ServiceObjects::default()));
        write_service(&ctx, snap, svc, objs);
    };
    match only {
        None => {
            for (spn, svc) in &snap.services {
                port(spn, svc);
            }
        }
        Some(names) => {
            for name in names {
                let start = ServicePortName::new(name.clone(), "", Protocol::Tcp);
                for (spn, svc) in snap
                    .services
                    .range(start..)
                    .take_while(|(spn, _)| &spn.service == name)
                {
                    port(spn, svc);
                }
            }
        }
    }
    if let Some((name, objs)) = current {
        f(&name, objs);
    }
}

/// Every Service's objects, visited in name order as often as a payload needs them: a
/// [`Rendered`] holds them all; [`Rendering`] renders them again at each visit, so that a full
/// sync never holds more than one Service's rules.
pub trait ServiceSet {
    /// Calls `f` with each Service's name and objects, in name order.
    fn each(&self, f: &mut dyn FnMut(&NamespacedName, &ServiceObjects));
}

impl ServiceSet for Rendered {
    fn each(&self, f: &mut dyn FnMut(&NamespacedName, &ServiceObjects)) {
        for (name, objs) in &self.services {
            f(name, objs);
        }
    }
}

/// Every Service of a snapshot, rendered one at a time at each visit
/// ([`for_each_service`]).
#[derive(Debug, Clone, Copy)]
pub struct Rendering<'a> {
    /// The snapshot.
    pub snap: &'a Snapshot,
    /// The render settings.
    pub cfg: &'a RenderConfig,
}

impl ServiceSet for Rendering<'_> {
    fn each(&self, f: &mut dyn FnMut(&NamespacedName, &ServiceObjects)) {
        for_each_service(self.snap, self.cfg, None, &mut |name, objs| f(name, &objs));
    }
}

struct Ctx<'a> {
    family: IpFamily,
    ip: &'static str,
    mark: String,
    cfg: &'a RenderConfig,
}

impl Ctx<'_> {
    fn masquerade(&self) -> String {
        format!("mark set mark or {}", self.mark)
    }
}

/// Appends the `{ 0 : V0 , 1 : V1 , … }` of a `numgen random mod N` lookup over `eps` to
/// `out`, each value written by `value` (upstream's spacing: knftables joins the tokens with
/// single spaces, so the comma stands alone).
fn numgen_elements(out: &mut String, eps: &[&Endpoint], value: impl Fn(&mut String, &Endpoint)) {
    out.push_str("{ ");
    for (i, ep) in eps.iter().enumerate() {
        if i > 0 {
            out.push_str(" , ");
        }
        let _ = write!(out, "{i} : ");
        value(out, ep);
    }
    out.push_str(" }");
}

/// The rule of a policy chain without affinity: one DNAT through an anonymous map indexed by
/// a random number, `meta l4proto P dnat ip addr . port to numgen random mod N map { i : IP
/// . PORT , … }` (IPv6 addresses without brackets, as upstream writes them).
fn dnat_rule(ip: &str, proto: &str, eps: &[&Endpoint]) -> String {
    let mut rule = String::with_capacity(64 + 24 * eps.len());
    let _ = write!(
        rule,
        "meta l4proto {proto} dnat {ip} addr . port to numgen random mod {} map ",
        eps.len()
    );
    numgen_elements(&mut rule, eps, |out, e| {
        let _ = write!(out, "{} . {}", e.ip, e.port);
    });
    rule
}

fn write_service(ctx: &Ctx<'_>, snap: &Snapshot, svc: &ServicePortInfo, out: &mut ServiceObjects) {
    let spn = &svc.name;
    let proto = spn.protocol.as_lower();
    let ip = ctx.ip;
    let names = ServiceChains::new(spn);
    let eps = categorize(
        svc,
        snap.endpoints_of(spn),
        &snap.node_name,
        &snap.node_labels,
    );
    let spn_text = spn.to_string();
    out.endpoints += snap.endpoints_of(spn).len();

    let uses_cluster_chain = !eps.cluster.is_empty() && svc.uses_cluster_endpoints();
    let uses_local_chain = !eps.local.is_empty() && svc.uses_local_endpoints();
    let (internal_chain, has_internal) = if svc.internal_policy_local {
        (&names.local, eps.has_any && !eps.local.is_empty())
    } else {
        (&names.cluster, eps.has_any)
    };
    let (external_policy_chain, has_external) = if svc.external_policy_local {
        (&names.local, eps.has_any && !eps.local.is_empty())
    } else {
        (&names.cluster, eps.has_any)
    };
    let uses_external_chain = eps.has_any && svc.externally_accessible();
    let uses_firewall_chain =
        !svc.load_balancer_vips.is_empty() && !svc.load_balancer_source_ranges.is_empty();
    let verdict = if eps.has_any {
        Verdict::Drop
    } else {
        Verdict::Reject
    };

    let element = |container, key: String, value: Verdict, comment: bool| Element {
        container,
        key,
        value,
        comment: comment.then(|| spn_text.clone()),
    };
    let vip_key = |addr: &IpAddr| format!("{addr} . {proto} . {}", svc.port);

    // ClusterIP.
    out.elements.push(element(
        Container::ClusterIps,
        svc.cluster_ip.to_string(),
        Verdict::None,
        false,
    ));
    if has_internal {
        out.elements.push(element(
            Container::ServiceIps,
            vip_key(&svc.cluster_ip),
            Verdict::Goto(internal_chain.clone()),
            false,
        ));
    } else {
        out.elements.push(element(
            Container::NoEndpointServices,
            vip_key(&svc.cluster_ip),
            verdict.clone(),
            true,
        ));
    }
    // External IPs.
    for addr in &svc.external_ips {
        if eps.has_any {
            out.elements.push(element(
                Container::ServiceIps,
                vip_key(addr),
                Verdict::Goto(names.external.clone()),
                false,
            ));
        }
        if !has_external {
            out.elements.push(element(
                Container::NoEndpointServices,
                vip_key(addr),
                verdict.clone(),
                true,
            ));
        }
    }
    // Load-balancer IPs.
    for addr in &svc.load_balancer_vips {
        if eps.has_any {
            out.elements.push(element(
                Container::ServiceIps,
                vip_key(addr),
                Verdict::Goto(names.external.clone()),
                false,
            ));
        }
        if uses_firewall_chain {
            out.elements.push(element(
                Container::FirewallIps,
                vip_key(addr),
                Verdict::Goto(names.firewall.clone()),
                false,
            ));
        }
        if !has_external {
            out.elements.push(element(
                Container::NoEndpointServices,
                vip_key(addr),
                verdict.clone(),
                true,
            ));
        }
    }
    // NodePort.
    if let Some(node_port) = svc.node_port {
        let key = format!("{proto} . {node_port}");
        if eps.has_any {
            out.elements.push(element(
                Container::ServiceNodePorts,
                key.clone(),
                Verdict::Goto(names.external.clone()),
                false,
            ));
        }
        if !has_external {
            out.elements.push(element(
                Container::NoEndpointNodePorts,
                key,
                verdict.clone(),
                true,
            ));
        }
    }
    // Hairpin: an endpoint reaching itself through the Service is masqueraded. Every
    // endpoint in use goes into the set, as upstream v1.36 does (and as iptables mode's
    // `-s <endpoint> -j KUBE-MARK-MASQ` in every KUBE-SEP chain): an EndpointSlice entry
    // without `nodeName` is not local, yet its pod may well run here. Only a pod on this
    // node can send `ep -> ep`, so the other elements never match.
    for ep in eps.all_reachable.iter() {
        out.hairpin.push(Hairpin {
            ip: ep.ip,
            protocol: spn.protocol,
            port: ep.port,
        });
    }

    // The external chain.
    if uses_external_chain {
        let mut rules = Vec::new();
        if !svc.external_policy_local {
            rules.push(format!(
                "{} comment {}",
                ctx.masquerade(),
                quote("masquerade")
            ));
        } else {
            // Short-circuits go to the Cluster-policy chain; it exists whenever some traffic
            // uses cluster endpoints (kp-model's `uses_cluster_endpoints`).
            if uses_cluster_chain && let Some(local) = &ctx.cfg.local {
                rules.push(format!(
                    "{} goto {} comment {}",
                    local_match(ctx.family, local, false),
                    names.cluster,
                    quote("short-circuit pod traffic")
                ));
            }
            rules.push(format!(
                "fib saddr type local {} comment {}",
                ctx.masquerade(),
                quote("masquerade local traffic")
            ));
            if uses_cluster_chain {
                rules.push(format!(
                    "fib saddr type local goto {} comment {}",
                    names.cluster,
                    quote("short-circuit local traffic")
                ));
            }
        }
        if has_external {
            rules.push(format!("goto {external_policy_chain}"));
        }
        out.chains.push(ChainRules {
            name: names.external.clone(),
            rules,
        });
    }

    // The firewall chain, upstream's one rule: sources outside the ranges are dropped, the
    // rest returns to `firewall-check`. When a range holds the node's primary address, the LB
    // IPs are allowed too (a VIP bound on the node makes the node's own requests come from it).
    if uses_firewall_chain {
        let node_ip = snap.node_ips.first();
        let mut sources: Vec<String> = svc
            .load_balancer_source_ranges
            .iter()
            .map(ToString::to_string)
            .collect();
        if node_ip.is_some_and(|a| {
            svc.load_balancer_source_ranges
                .iter()
                .any(|r| r.contains(a))
        }) {
            sources.extend(svc.load_balancer_vips.iter().map(ToString::to_string));
        }
        out.chains.push(ChainRules {
            name: names.firewall.clone(),
            rules: vec![format!("{ip} saddr != {{ {} }} drop", sources.join(" , "))],
        });
    }

    // Endpoint selection.
    let affinity = match svc.session_affinity {
        SessionAffinity::ClientIp { timeout_seconds } => Some(timeout_seconds),
        SessionAffinity::None => None,
    };
    let dnat = |ep: &Endpoint| format!("meta l4proto {proto} dnat to {ep}");
    match affinity {
        None => {
            for (used, chain, list) in [
                (uses_cluster_chain, &names.cluster, &eps.cluster),
                (uses_local_chain, &names.local, &eps.local),
            ] {
                if !used {
                    continue;
                }
                out.chains.push(ChainRules {
                    name: chain.clone(),
                    rules: vec![dnat_rule(ip, proto, list)],
                });
            }
        }
        Some(timeout_seconds) => {
            let ep_names: Vec<(&Endpoint, String, String)> = eps
                .all_reachable
                .iter()
                .map(|e| {
                    let (chain, set) = endpoint_names(spn, e);
                    (*e, chain, set)
                })
                .collect();
            let lookup = |e: &Endpoint| {
                ep_names
                    .iter()
                    .find(|(x, _, _)| std::ptr::eq(*x, e))
                    .map(|(_, c, s)| (c.as_str(), s.as_str()))
                    .unwrap_or(("", ""))
            };
            for (used, chain, list) in [
                (uses_cluster_chain, &names.cluster, &eps.cluster),
                (uses_local_chain, &names.local, &eps.local),
            ] {
                if !used {
                    continue;
                }
                let mut rules = Vec::with_capacity(list.len() + 1);
                for ep in list.iter() {
                    let (ep_chain, set) = lookup(ep);
                    rules.push(format!("{ip} saddr @{set} goto {ep_chain}"));
                }
                let mut vmap = format!("numgen random mod {} vmap ", list.len());
                numgen_elements(&mut vmap, list, |out, ep| {
                    out.push_str("goto ");
                    out.push_str(lookup(ep).0);
                });
                rules.push(vmap);
                out.chains.push(ChainRules {
                    name: chain.clone(),
                    rules,
                });
            }
            for (ep, chain, set) in &ep_names {
                out.sets.push(AffinitySet {
                    name: set.clone(),
                    timeout_seconds,
                });
                out.chains.push(ChainRules {
                    name: chain.clone(),
                    rules: vec![format!("update @{set} {{ {ip} saddr }}"), dnat(ep)],
                });
            }
        }
    }
}

#[cfg(test)]
mod tests;
