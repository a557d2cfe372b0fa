//! IPVS mode: upstream kube-proxy's `--proxy-mode ipvs` layout.
//!
//! Services become kernel IPVS virtual servers (a hash table: the per-packet cost does not
//! grow with the number of Services), their addresses are bound to the dummy link
//! `kube-ipvs0`, and a fixed handful of iptables rules match upstream's ipsets for
//! masquerading, hairpin, NodePorts, firewalls and filtering.
//!
//! - [`render`] turns a snapshot into the desired state (pure).
//! - [`IpvsProxier`] reconciles it with the kernel each sync: it diffs the desired virtual
//!   servers, real servers, kube-ipvs0 addresses and set entries against what the kernel
//!   holds and sends only the differences: one batched IPVS netlink exchange, one batched
//!   address exchange, one `ipset restore` and (when the rules changed, and on every full
//!   sync) one `iptables-restore --noflush`. A full sync (start-up, every
//!   `--ipvs-sync-period`, after any failure) reads the kernel back first, so a restart or
//!   another tool's change is repaired; the syncs in between diff against what the last
//!   successful sync left, so a one-Service change costs the same at any cluster size.
//! - Graceful termination, as upstream: a real server that is no longer wanted first gets
//!   weight 0 (no new connections), and is deleted once it has no active or inactive
//!   connections (checked at each sync), or after [`IpvsConfig::graceful_termination_bound`].
//!   UDP and SCTP real servers are deleted at once (`expire_nodest_conn` ends their flows).
//! - [`cleanup`] removes every IPVS-mode object: virtual servers, ipsets, kube-ipvs0 (the
//!   chains go with [`crate::iptables::cleanup`], which knows IPVS mode's chains too).

pub mod names;
pub mod render;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use kp_model::{Changes, IpFamily, Protocol, Snapshot};
use kp_netfilter::ipset::{Ipset, SetFamily, SetKind, SetSpec, SetState};
use kp_netfilter::{Iptables, Table};
use kp_netlink::ipvs::{IpvsOp, IpvsOps, RealServer, ServiceKey, VirtualServer};
use kp_netlink::link::LinkOps;
use kp_netlink::{ConntrackOps, proto};
use tracing::{debug, info, warn};

use crate::iptables::names::is_dynamic_chain;
use crate::iptables::reconcile::{KernelTable, KernelTables};
use crate::{Host, LocalDetector, NodePortAddresses, Proxier, ProxierError, ProxyMode, SyncReport};
use names::{DUMMY_DEVICE, FILTER_CHAINS, KubeSet, NAT_CHAINS, SetType};
use render::{RenderConfig, Rendered, VsKey};

/// Settings of IPVS mode, named after kube-proxy's flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpvsConfig {
    /// `--ipvs-scheduler` (default `rr`).
    pub scheduler: String,
    /// `--masquerade-all`.
    pub masquerade_all: bool,
    /// `--iptables-masquerade-bit` (0..=31, default 14).
    pub masquerade_bit: u8,
    /// `--detect-local-mode` with its CIDRs or interface.
    pub local_detector: LocalDetector,
    /// `--nodeport-addresses`.
    pub nodeport_addresses: NodePortAddresses,
    /// `--ipvs-exclude-cidrs`: virtual servers inside them are never deleted (they belong
    /// to someone else, e.g. a host load balancer).
    pub exclude_cidrs: Vec<IpNet>,
    /// `--ipvs-strict-arp`: `arp_ignore=1`, `arp_announce=2`, so the node does not answer
    /// ARP for kube-ipvs0's addresses.
    pub strict_arp: bool,
    /// How long a removed TCP real server may keep connections at weight 0 before it is
    /// deleted anyway (upstream waits without bound; 0 deletes at once).
    pub graceful_termination_bound: Duration,
    /// `--ipvs-tcp-timeout`, `--ipvs-tcpfin-timeout`, `--ipvs-udp-timeout` in seconds, set at
    /// start (`ipvsadm --set`); 0 leaves the kernel's value; `None` when all are 0.
    pub timeouts: Option<kp_netlink::ipvs::IpvsTimeouts>,
}

impl Default for IpvsConfig {
    fn default() -> Self {
        IpvsConfig {
            scheduler: "rr".into(),
            masquerade_all: false,
            masquerade_bit: 14,
            local_detector: LocalDetector::None,
            nodeport_addresses: NodePortAddresses::all(),
            exclude_cidrs: Vec::new(),
            strict_arp: false,
            graceful_termination_bound: Duration::from_secs(15 * 60),
            timeouts: None,
        }
    }
}

/// The schedulers upstream documents for `--ipvs-scheduler`, each a kernel module
/// `ip_vs_<name>`.
pub const SCHEDULERS: &[&str] = &[
    "rr", "wrr", "lc", "wlc", "lblc", "lblcr", "sh", "dh", "sed", "nq", "mh", "fo", "ovf",
];

/// `IP_VS_SVC_F_SCHED1`: with `mh`, hash on the source address (upstream's `FlagSourceHash`).
const SOURCE_HASH: u32 = kp_netlink::ipvs::SVC_F_SCHED1;

/// What this family's part of the kernel held after the last successful sync (or what a full
/// sync read back).
#[derive(Debug, Clone, Default)]
struct KernelState {
    /// Our family's virtual servers (outside `--ipvs-exclude-cidrs`) and their real servers.
    services: BTreeMap<ServiceKey, (VirtualServer, Dests)>,
    /// This family's addresses on kube-ipvs0.
    addresses: BTreeSet<IpAddr>,
    /// Our sets of this family, by name.
    sets: BTreeMap<String, SetState>,
}

/// The real servers of one virtual server, sorted by address: a slice of exactly their
/// number (100,000 of them at 10,000 Services × 10 endpoints; a map per virtual server cost
/// twice the memory).
#[derive(Debug, Clone, Default)]
struct Dests(Box<[RealServer]>);

impl Dests {
    /// The real servers of `dests`; of two with one address the later one counts (as
    /// inserting them into a map one after the other).
    fn new(dests: impl IntoIterator<Item = RealServer>) -> Dests {
        let mut v: Vec<RealServer> = dests.into_iter().collect();
        // Stable: equal addresses stay in their order, and the last of each run is kept.
        v.sort_by_key(RealServer::socket_addr);
        let mut out: Vec<RealServer> = Vec::with_capacity(v.len());
        for d in v {
            match out.last_mut() {
                Some(last) if last.socket_addr() == d.socket_addr() => *last = d,
                _ => out.push(d),
            }
        }
        Dests(out.into_boxed_slice())
    }

    fn get(&self, addr: &SocketAddr) -> Option<&RealServer> {
        self.0
            .binary_search_by_key(addr, RealServer::socket_addr)
            .ok()
            .map(|i| &self.0[i])
    }

    fn iter(&self) -> impl Iterator<Item = (SocketAddr, &RealServer)> {
        self.0.iter().map(|d| (d.socket_addr(), d))
    }
}

/// IPVS changes sent per [`IpvsOps::apply`] call (give or take one virtual server's, which
/// always go together): the changes of a full sync (110,000 at 10,000 Services × 10
/// endpoints) are sent as they are worked out, never held all at once.
const OPS_PER_APPLY: usize = 4096;

/// The kube-proxy-owned chains of iptables mode that IPVS mode does not use, in the filter
/// table; IPVS mode's full syncs delete them (a node switching from iptables mode).
const IPTABLES_MODE_FILTER_CHAINS: &[&str] =
    &["KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-NODEPORTS"];

/// IPVS-mode proxier for one family.
pub struct IpvsProxier<I: Iptables> {
    family: IpFamily,
    cfg: IpvsConfig,
    ipt: I,
    ipset: Box<dyn Ipset>,
    ipvs: Box<dyn IpvsOps>,
    links: Box<dyn LinkOps>,
    host: Arc<dyn Host>,
    random_fully: bool,
    needs_full: bool,
    setup_done: bool,
    known: Option<KernelState>,
    last_iptables: Option<String>,
    /// Real servers at weight 0 waiting for their connections to end, with when that began.
    terminating: BTreeMap<(ServiceKey, SocketAddr), Instant>,
    conntrack: crate::conntrack::UdpCleanup,
}

impl<I: Iptables> std::fmt::Debug for IpvsProxier<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpvsProxier")
            .field("family", &self.family)
            .field("cfg", &self.cfg)
            .field("needs_full", &self.needs_full)
            .field("terminating", &self.terminating.len())
            .finish()
    }
}

fn proto_of(p: Protocol) -> u8 {
    match p {
        Protocol::Tcp => proto::TCP,
        Protocol::Udp => proto::UDP,
        Protocol::Sctp => proto::SCTP,
    }
}

fn key_of(k: &VsKey) -> ServiceKey {
    ServiceKey::new(k.addr, proto_of(k.protocol), k.port)
}

fn family_of(addr: &IpAddr) -> IpFamily {
    match addr {
        IpAddr::V4(_) => IpFamily::V4,
        IpAddr::V6(_) => IpFamily::V6,
    }
}

fn set_spec(set: KubeSet, family: IpFamily) -> SetSpec {
    let name = set.name(family);
    let fam = match family {
        IpFamily::V4 => SetFamily::Inet,
        IpFamily::V6 => SetFamily::Inet6,
    };
    let kind = match set.set_type() {
        SetType::HashIp => SetKind::HashIp,
        SetType::HashIpPort => SetKind::HashIpPort,
        SetType::HashIpPortIp => SetKind::HashIpPortIp,
        SetType::HashIpPortNet => SetKind::HashIpPortNet,
        SetType::BitmapPort => return SetSpec::bitmap_port(name, (0, 65535)),
    };
    SetSpec::hash(name, kind, fam)
}

fn kernel_err(what: &str, e: impl std::fmt::Display) -> ProxierError {
    ProxierError::ReadState {
        what: what.to_string(),
        message: e.to_string(),
    }
}

impl<I: Iptables> IpvsProxier<I> {
    /// Builds a proxier from its adapters: iptables for `family`, ipset, an IPVS netlink
    /// handle and an rtnetlink handle, all in the node's network namespace.
    ///
    /// # Errors
    /// [`ProxierError::Config`] for a masquerade bit outside 0..=31 or an empty scheduler.
    pub fn new(
        family: IpFamily,
        cfg: IpvsConfig,
        ipt: I,
        ipset: Box<dyn Ipset>,
        ipvs: Box<dyn IpvsOps>,
        links: Box<dyn LinkOps>,
        host: Arc<dyn Host>,
    ) -> Result<Self, ProxierError> {
        if cfg.masquerade_bit > 31 {
            return Err(ProxierError::Config(format!(
                "--iptables-masquerade-bit must be within 0..=31, got {}",
                cfg.masquerade_bit
            )));
        }
        if cfg.scheduler.is_empty() || cfg.scheduler.len() > kp_netlink::ipvs::SCHED_NAME_MAX {
            return Err(ProxierError::Config(format!(
                "--ipvs-scheduler {:?} is not a scheduler name",
                cfg.scheduler
            )));
        }
        let random_fully = match ipt.version() {
            Ok(v) => v.supports_random_fully(),
            Err(e) => {
                warn!(error = %e, "cannot read the iptables version; not using MASQUERADE --random-fully");
                false
            }
        };
        Ok(IpvsProxier {
            family,
            cfg,
            ipt,
            ipset,
            ipvs,
            links,
            host,
            random_fully,
            needs_full: true,
            setup_done: false,
            known: None,
            last_iptables: None,
            terminating: BTreeMap::new(),
            conntrack: crate::conntrack::UdpCleanup::disabled(),
        })
    }

    /// Enables the UDP stale-conntrack cleanup after syncs (see [`crate::conntrack`]).
    pub fn with_conntrack(mut self, ops: Box<dyn ConntrackOps + Send>) -> Self {
        self.conntrack = crate::conntrack::UdpCleanup::new(ops);
        self
    }

    /// The iptables runner (for dry runs and tests).
    pub fn runner(&self) -> &I {
        &self.ipt
    }

    /// Real servers currently draining at weight 0 (graceful termination).
    pub fn terminating(&self) -> Vec<(ServiceKey, SocketAddr)> {
        self.terminating.keys().copied().collect()
    }

    fn excluded(&self, addr: &IpAddr) -> bool {
        self.cfg.exclude_cidrs.iter().any(|c| c.contains(addr))
    }

    /// Upstream's sysctls for IPVS mode, once.
    fn setup(&mut self) {
        if self.setup_done {
            return;
        }
        self.setup_done = true;
        let mut want: Vec<(&str, &str)> = vec![
            ("net/ipv4/vs/conntrack", "1"),
            ("net/ipv4/vs/expire_nodest_conn", "1"),
            ("net/ipv4/vs/expire_quiescent_template", "1"),
            ("net/ipv4/ip_forward", "1"),
        ];
        if self.family == IpFamily::V6 {
            want.push(("net/ipv6/conf/all/forwarding", "1"));
        }
        // conn_reuse_mode=0 only on kernels 4.1..5.9, where mode 1 drops the first SYN of a
        // reused port for a second (kubernetes#93297); newer kernels are left alone.
        if let Some((major, minor)) = kernel_version()
            && (major, minor) >= (4, 1)
            && (major, minor) < (5, 9)
        {
            want.push(("net/ipv4/vs/conn_reuse_mode", "0"));
        }
        if self.cfg.strict_arp {
            want.push(("net/ipv4/conf/all/arp_ignore", "1"));
            want.push(("net/ipv4/conf/all/arp_announce", "2"));
        }
        if let Some(t) = self.cfg.timeouts {
            match self.ipvs.set_timeouts(t) {
                Ok(()) => info!(
                    tcp = t.tcp,
                    tcpfin = t.tcp_fin,
                    udp = t.udp,
                    "set the IPVS timeouts"
                ),
                Err(e) => warn!(error = %e, "cannot set the IPVS timeouts"),
            }
        }
        for (key, value) in want {
            if self.host.get_sysctl(key).as_deref() == Some(value) {
                continue;
            }
            match self.host.set_sysctl(key, value) {
                Ok(()) => debug!("set {key}={value} for IPVS mode"),
                Err(e) => {
                    warn!(error = %e, "cannot set {key}={value}; IPVS mode may not work as intended")
                }
            }
        }
    }

    /// Reads what the kernel holds for this family.
    fn read_kernel(&mut self) -> Result<KernelState, ProxierError> {
        let mut st = KernelState::default();
        let services = self
            .ipvs
            .services()
            .map_err(|e| kernel_err("IPVS virtual servers", e))?;
        for vs in services {
            if family_of(&vs.key.addr) != self.family || self.excluded(&vs.key.addr) {
                continue;
            }
            let dests = self
                .ipvs
                .destinations(&vs.key)
                .map_err(|e| kernel_err("IPVS real servers", e))?;
            st.services.insert(vs.key, (vs, Dests::new(dests)));
        }
        st.addresses = self
            .links
            .addresses(DUMMY_DEVICE)
            .map_err(|e| kernel_err("kube-ipvs0 addresses", e))?
            .into_iter()
            .filter(|a| family_of(a) == self.family)
            .collect();
        let ours: BTreeSet<String> = KubeSet::ALL.iter().map(|s| s.name(self.family)).collect();
        for set in self.ipset.save()? {
            if ours.contains(&set.spec.name) {
                st.sets.insert(set.spec.name.clone(), set);
            }
        }
        Ok(st)
    }

    /// The render settings for `snap`, from the node's addresses.
    fn render_config(&mut self, snap: &Snapshot) -> Result<RenderConfig, ProxierError> {
        let all = self
            .links
            .local_addresses()
            .map_err(|e| kernel_err("local addresses", e))?;
        let other: BTreeSet<IpAddr> = all
            .iter()
            .filter(|(dev, _)| dev != DUMMY_DEVICE)
            .map(|(_, a)| *a)
            .collect();
        let usable = |ip: &IpAddr| {
            family_of(ip) == self.family
                && !ip.is_loopback()
                && !matches!(ip, IpAddr::V6(v6) if v6.is_unicast_link_local())
        };
        let nodeport_ips: Vec<IpAddr> = if self
            .cfg
            .nodeport_addresses
            .match_all(self.family, &snap.node_ips)
        {
            other.iter().copied().filter(usable).collect()
        } else {
            let local: Vec<IpAddr> = other.iter().copied().collect();
            self.cfg
                .nodeport_addresses
                .node_ips(self.family, &local, &snap.node_ips)
                .into_iter()
                .filter(usable)
                .collect()
        };
        let node_ip = snap
            .node_ips
            .iter()
            .copied()
            .find(|ip| family_of(ip) == self.family)
            .or_else(|| nodeport_ips.first().copied());
        Ok(RenderConfig {
            scheduler: self.cfg.scheduler.clone(),
            masquerade_all: self.cfg.masquerade_all,
            masquerade_mark: 1u32 << self.cfg.masquerade_bit,
            local: self
                .cfg
                .local_detector
                .for_family(self.family, &snap.node_pod_cidrs),
            random_fully: self.random_fully,
            nodeport_ips,
            other_addresses: other,
            node_ip,
        })
    }

    /// Renders the desired state (reads the node's addresses, changes nothing).
    ///
    /// # Errors
    /// [`ProxierError::ReadState`] when the node's addresses cannot be read.
    pub fn render(&mut self, snap: &Snapshot) -> Result<Rendered, ProxierError> {
        let cfg = self.render_config(snap)?;
        Ok(render::render(snap, &cfg))
    }

    fn virtual_server(&self, key: &VsKey, spec: &render::VirtualServerSpec) -> VirtualServer {
        let mut vs = VirtualServer::new(key_of(key), &self.cfg.scheduler);
        if let Some(t) = spec.persistent_timeout {
            vs = vs.persistent(t);
        }
        if self.cfg.scheduler == "mh" {
            vs.flags |= SOURCE_HASH;
        }
        vs
    }

    /// The IPVS operations that turn `have` into `want`, with graceful termination.
    /// Works out the IPVS changes that turn `have` into `want` and applies them, about
    /// [`OPS_PER_APPLY`] at a time, in order (a virtual server before its real servers,
    /// deletions of virtual servers last). Returns how many changes were sent and the
    /// refusals of single changes.
    fn apply_ipvs(
        &mut self,
        want: &Rendered,
        have: &KernelState,
        full: bool,
        now: Instant,
    ) -> Result<(usize, Vec<String>), ProxierError> {
        let mut ops =
            Vec::with_capacity(OPS_PER_APPLY.min(want.endpoints + want.virtual_servers.len() + 16));
        let mut sent = 0;
        let mut failures = Vec::new();
        let mut wanted_keys = BTreeSet::new();
        for (k, spec) in &want.virtual_servers {
            if ops.len() >= OPS_PER_APPLY {
                sent += self.send_ipvs(&mut ops, &mut failures)?;
            }
            let vs = self.virtual_server(k, spec);
            let key = vs.key;
            wanted_keys.insert(key);
            let existing = have.services.get(&key);
            match existing {
                None => ops.push(IpvsOp::AddService(vs)),
                Some((cur, _)) if !cur.same_config(&vs) => ops.push(IpvsOp::EditService(vs)),
                Some(_) => {}
            }
            let empty = Dests::default();
            let cur_dests = existing.map(|(_, d)| d).unwrap_or(&empty);
            let wanted: BTreeSet<SocketAddr> = spec.real_servers.iter().copied().collect();
            for rs in &wanted {
                let desired = RealServer::new(rs.ip(), rs.port(), 1);
                match cur_dests.get(rs) {
                    None => ops.push(IpvsOp::AddDest(key, desired)),
                    Some(cur) => {
                        let draining = self.terminating.remove(&(key, *rs)).is_some();
                        if draining || (full && !cur.same_config(&desired)) {
                            ops.push(IpvsOp::EditDest(key, desired));
                        }
                    }
                }
            }
            for (addr, cur) in cur_dests.iter() {
                let addr = &addr;
                if wanted.contains(addr) {
                    continue;
                }
                let graceful =
                    key.protocol == proto::TCP && !self.cfg.graceful_termination_bound.is_zero();
                if !graceful {
                    self.terminating.remove(&(key, *addr));
                    ops.push(IpvsOp::DelDest(key, *addr));
                    continue;
                }
                let since = *self.terminating.entry((key, *addr)).or_insert(now);
                if cur.weight != 0 {
                    let mut drained = cur.clone();
                    drained.weight = 0;
                    ops.push(IpvsOp::EditDest(key, drained));
                    continue;
                }
                // Already at weight 0: delete once idle or past the bound. Counters in `have`
                // are fresh on full syncs; otherwise ask the kernel.
                let stats = if full {
                    Some(cur.clone())
                } else {
                    self.ipvs
                        .destinations(&key)
                        .map_err(|e| kernel_err("IPVS real servers", e))?
                        .into_iter()
                        .find(|d| d.socket_addr() == *addr)
                };
                let idle = stats.is_none_or(|d| d.active_conns + d.inactive_conns == 0);
                if idle || now.duration_since(since) >= self.cfg.graceful_termination_bound {
                    self.terminating.remove(&(key, *addr));
                    ops.push(IpvsOp::DelDest(key, *addr));
                }
            }
        }
        for key in have.services.keys() {
            if !wanted_keys.contains(key) {
                if ops.len() >= OPS_PER_APPLY {
                    sent += self.send_ipvs(&mut ops, &mut failures)?;
                }
                ops.push(IpvsOp::DelService(*key));
            }
        }
        sent += self.send_ipvs(&mut ops, &mut failures)?;
        self.terminating.retain(|(k, _), _| wanted_keys.contains(k));
        Ok((sent, failures))
    }

    /// Applies `ops` (then empties it); refusals of single changes go to `failures`.
    /// Returns how many were sent.
    fn send_ipvs(
        &mut self,
        ops: &mut Vec<IpvsOp>,
        failures: &mut Vec<String>,
    ) -> Result<usize, ProxierError> {
        if ops.is_empty() {
            return Ok(0);
        }
        let results = self
            .ipvs
            .apply(ops)
            .map_err(|e| kernel_err("IPVS table", e))?;
        failures.extend(
            results
                .into_iter()
                .filter_map(Result::err)
                .map(|r| r.to_string()),
        );
        let n = ops.len();
        ops.clear();
        Ok(n)
    }

    /// The `ipset restore` payload that turns `have` into `want`'s set contents.
    fn ipset_payload(&self, want: &Rendered, have: &KernelState) -> Vec<u8> {
        let desired: Vec<SetState> = KubeSet::ALL
            .iter()
            .map(|s| SetState {
                spec: set_spec(*s, self.family),
                entries: want.sets.get(s).cloned().unwrap_or_default(),
            })
            .collect();
        let current: Vec<SetState> = have.sets.values().cloned().collect();
        kp_netfilter::ipset::diff(&desired, &current)
    }

    /// The one `iptables-restore` payload: our chains (declared, so flushed), the jump rules
    /// missing from the built-in chains, and the rules. With the kernel's tables (full syncs),
    /// jumps into kube-proxy chains that IPVS mode does not use are deleted, and so are the
    /// chains iptables mode left (a node switching modes).
    fn iptables_payload(&self, want: &Rendered, kernel: Option<&KernelTables>) -> String {
        let mut out = String::with_capacity(want.filter_rules.len() + want.nat_rules.len() + 2048);
        for (table, chains, rules, kt) in [
            (
                "filter",
                FILTER_CHAINS,
                &want.filter_rules,
                kernel.map(|k| &k.filter),
            ),
            ("nat", NAT_CHAINS, &want.nat_rules, kernel.map(|k| &k.nat)),
        ] {
            let _ = writeln!(out, "*{table}");
            let stale: Vec<&String> = kt
                .map(|k| {
                    k.chains
                        .iter()
                        .filter(|c| !chains.contains(&c.as_str()))
                        .filter(|c| {
                            if table == "filter" {
                                IPTABLES_MODE_FILTER_CHAINS.contains(&c.as_str())
                            } else {
                                c.as_str() == "KUBE-NODEPORTS" || is_dynamic_chain(c)
                            }
                        })
                        .collect()
                })
                .unwrap_or_default();
            for c in chains
                .iter()
                .copied()
                .chain(stale.iter().map(|s| s.as_str()))
            {
                let _ = writeln!(out, ":{c} - [0:0]");
            }
            // Only a full sync, which has read the kernel, touches the built-in chains: a
            // partial one would add every jump a second time.
            if kt.is_some() {
                out.push_str(&jump_fixups(table, kt));
            }
            for c in &stale {
                let _ = writeln!(out, "-X {c}");
            }
            out.push_str(rules);
            out.push_str("COMMIT\n");
        }
        out
    }

    /// Adds (or deletes) `addrs` on kube-ipvs0 in one batch; returns the refusals, described.
    fn change_addresses(
        &mut self,
        add: bool,
        addrs: &[IpAddr],
    ) -> Result<Vec<String>, ProxierError> {
        if addrs.is_empty() {
            return Ok(Vec::new());
        }
        let results = if add {
            self.links.add_addresses(DUMMY_DEVICE, addrs)
        } else {
            self.links.del_addresses(DUMMY_DEVICE, addrs)
        }
        .map_err(|e| kernel_err("kube-ipvs0 addresses", e))?;
        Ok(results
            .into_iter()
            .filter_map(Result::err)
            .map(|e| e.to_string())
            .collect())
    }

    fn read_tables(&self) -> Result<KernelTables, ProxierError> {
        let read = |table: Table| -> Result<KernelTable, ProxierError> {
            let text = self.ipt.save(Some(table))?;
            crate::iptables::kernel_table_for_sync(&text, table)
        };
        Ok(KernelTables {
            filter: read(Table::Filter)?,
            nat: read(Table::Nat)?,
            ..KernelTables::default()
        })
    }
}

/// The kernel's `major.minor`, from `uname -r`.
fn kernel_version() -> Option<(u32, u32)> {
    let uts = nix::sys::utsname::uname().ok()?;
    let release = uts.release().to_string_lossy().to_string();
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

/// IPVS mode's jump rules from the built-in chains, as upstream writes them (each prepended,
/// so the last listed per chain ends up first).
pub const JUMPS: &[(&str, &str, &str, &str)] = &[
    (
        "nat",
        "OUTPUT",
        "kubernetes service portals",
        names::KUBE_SERVICES,
    ),
    (
        "nat",
        "PREROUTING",
        "kubernetes service portals",
        names::KUBE_SERVICES,
    ),
    (
        "nat",
        "POSTROUTING",
        "kubernetes postrouting rules",
        names::KUBE_POSTROUTING,
    ),
    (
        "filter",
        "FORWARD",
        "kubernetes forwarding rules",
        names::KUBE_FORWARD,
    ),
    (
        "filter",
        "INPUT",
        "kubernetes health check rules",
        names::KUBE_NODE_PORT,
    ),
    (
        "filter",
        "INPUT",
        "kube-proxy firewall rules",
        names::KUBE_PROXY_FIREWALL,
    ),
    (
        "filter",
        "FORWARD",
        "kube-proxy firewall rules",
        names::KUBE_PROXY_FIREWALL,
    ),
    (
        "filter",
        "INPUT",
        "kubernetes ipvs access filter",
        names::KUBE_IPVS_FILTER,
    ),
    (
        "filter",
        "OUTPUT",
        "kubernetes ipvs access filter",
        names::KUBE_IPVS_OUT_FILTER,
    ),
];

fn jump_line(chain: &str, comment: &str, target: &str) -> String {
    format!("-A {chain} -m comment --comment \"{comment}\" -j {target}")
}

/// Jump-rule changes for `table`: kube-proxy jumps that are not IPVS mode's are deleted
/// (`-D`), IPVS mode's missing ones inserted at the top (`-I CHAIN 1`). Only full syncs call
/// it, with the tables they read (a dry run reads its fake's); without one every IPVS jump
/// would be inserted.
fn jump_fixups(table: &str, kernel: Option<&KernelTable>) -> String {
    let mut out = String::new();
    let ours: Vec<String> = JUMPS
        .iter()
        .filter(|j| j.0 == table)
        .map(|j| jump_line(j.1, j.2, j.3))
        .collect();
    if let Some(k) = kernel {
        for (chain, line, target) in &k.rules {
            let Some(t) = target else { continue };
            let kube = t.starts_with("KUBE-") && t != "KUBE-FIREWALL" && t != "KUBE-PROXY-CANARY";
            if matches!(
                chain.as_str(),
                "PREROUTING" | "INPUT" | "FORWARD" | "OUTPUT" | "POSTROUTING"
            ) && kube
                && !ours.contains(line)
            {
                let _ = writeln!(out, "-D{}", &line[2..]);
            }
        }
    }
    for j in JUMPS.iter().filter(|j| j.0 == table) {
        let line = jump_line(j.1, j.2, j.3);
        if kernel.is_some_and(|k| k.rules.iter().any(|(_, l, _)| *l == line)) {
            continue;
        }
        let _ = writeln!(out, "-I {} 1{}", j.1, &line[3 + j.1.len()..]);
    }
    out
}

impl<I: Iptables> Proxier for IpvsProxier<I> {
    fn mode(&self) -> ProxyMode {
        ProxyMode::Ipvs
    }

    fn family(&self) -> IpFamily {
        self.family
    }

    fn sync(&mut self, snap: &Snapshot, changes: &Changes) -> Result<SyncReport, ProxierError> {
        self.setup();
        let full = self.needs_full || changes.full_resync_needed || self.known.is_none();
        self.needs_full = true;
        let t_read = Instant::now();
        self.links
            .ensure_dummy(DUMMY_DEVICE)
            .map_err(|e| kernel_err("kube-ipvs0", e))?;
        let (mut have, tables) = if full {
            // What the last sync left goes first: the kernel is read back anyway.
            self.known = None;
            (self.read_kernel()?, Some(self.read_tables()?))
        } else {
            // Taken, not copied (100k real servers at 10k Services): it is rebuilt when this
            // sync succeeds, and a failure leaves it unset, so the retry is a full sync.
            (self.known.take().unwrap_or_default(), None)
        };
        let read_time = t_read.elapsed();
        let t_render = Instant::now();
        let want = self.render(snap)?;
        let render_time = t_render.elapsed();
        for (key, svc) in &want.conflicts {
            warn!(virtual_server = %key, service = %svc, "two Service ports ask for the same virtual server; the first keeps it");
        }
        let t_apply = Instant::now();
        let mut payload_bytes = 0;

        // 1. Sets first: the iptables rules below reference them.
        let sets = self.ipset_payload(&want, &have);
        if !sets.is_empty() {
            payload_bytes += sets.len();
            self.ipset.restore(&sets)?;
        }
        // 2. Virtual and real servers, sent as they are worked out.
        let now = Instant::now();
        let (ops, mut failures) = self.apply_ipvs(&want, &have, full, now)?;
        // Only the addresses are needed from here on.
        have.services = BTreeMap::new();
        // 3. Addresses the virtual servers need.
        let add: Vec<IpAddr> = want
            .bind_addrs
            .difference(&have.addresses)
            .copied()
            .collect();
        failures.extend(self.change_addresses(true, &add)?);
        // 4. The iptables rules, when they changed (and always on full syncs).
        // Compared by the rendered rules alone: only full syncs fix the jumps from the
        // built-in chains, delete other modes' chains and write the canaries (see
        // `iptables::canary`).
        let rules = format!("{}\u{0}{}", want.filter_rules, want.nat_rules);
        if full || self.last_iptables.as_deref() != Some(rules.as_str()) {
            let mut payload = self.iptables_payload(&want, tables.as_ref());
            if full {
                payload.push_str(crate::iptables::canary::CANARY_BLOCKS);
            }
            payload_bytes += payload.len();
            self.ipt.restore(payload.as_bytes())?;
        }
        // 5. Addresses no virtual server uses any more.
        let del: Vec<IpAddr> = have
            .addresses
            .difference(&want.bind_addrs)
            .copied()
            .collect();
        failures.extend(self.change_addresses(false, &del)?);
        if !failures.is_empty() {
            // Keep what we know unset: the retry is a full sync that reads the kernel back.
            self.known = None;
            return Err(ProxierError::ReadState {
                what: format!("IPVS state ({} change(s) refused)", failures.len()),
                message: failures.join("; "),
            });
        }
        let apply_time = t_apply.elapsed() + read_time;

        // What the kernel now holds, for the next partial sync.
        let mut known = KernelState {
            addresses: want.bind_addrs.clone(),
            ..KernelState::default()
        };
        for (k, spec) in &want.virtual_servers {
            let vs = self.virtual_server(k, spec);
            let key = vs.key;
            let wanted = spec
                .real_servers
                .iter()
                .map(|rs| RealServer::new(rs.ip(), rs.port(), 1));
            let draining = self
                .terminating
                .range((key, SocketAddr::from(([0, 0, 0, 0], 0)))..)
                .take_while(|((tk, _), _)| *tk == key)
                .map(|((_, addr), _)| RealServer::new(addr.ip(), addr.port(), 0));
            known
                .services
                .insert(key, (vs, Dests::new(wanted.chain(draining))));
        }
        for s in KubeSet::ALL {
            let spec = set_spec(s, self.family);
            let entries = want.sets.get(&s).cloned().unwrap_or_default();
            let entries = entries
                .iter()
                .map(|e| spec.canonical_entry(e).unwrap_or_else(|_| e.clone()))
                .collect();
            known
                .sets
                .insert(spec.name.clone(), SetState { spec, entries });
        }
        self.known = Some(known);
        self.last_iptables = Some(rules);
        self.needs_full = false;
        let conntrack = self.conntrack.after_sync(snap, changes, full);
        let report = SyncReport {
            family: Some(self.family),
            full,
            service_ports: want.service_ports,
            endpoints: want.endpoints,
            payload_bytes: payload_bytes + ops * 64,
            filter_rules: want.filter_rules.lines().count(),
            nat_rules: want.nat_rules.lines().count(),
            deleted_chains: 0,
            render_time,
            apply_time,
            conntrack_deleted: conntrack.deleted,
            conntrack_time: conntrack.duration,
            filter_rules_written: 0,
            nat_rules_written: 0,
        };
        info!(
            family = %self.family,
            full,
            services = report.service_ports,
            virtual_servers = want.virtual_servers.len(),
            ipvs_changes = ops,
            addresses_added = add.len(),
            addresses_removed = del.len(),
            draining = self.terminating.len(),
            render_ms = %format!("{:.3}", render_time.as_secs_f64() * 1e3),
            apply_ms = %format!("{:.3}", apply_time.as_secs_f64() * 1e3),
            "synced IPVS rules"
        );
        Ok(report)
    }

    /// The `KUBE-PROXY-CANARY` check of iptables mode ([`crate::iptables::canary`]), for
    /// IPVS mode's iptables rules. The IPVS table, the ipsets and kube-ipvs0 are not
    /// checked: every `--ipvs-sync-period` is a full sync that reads them back anyway.
    fn check_dataplane(&mut self) -> Result<bool, ProxierError> {
        if self.needs_full || self.known.is_none() {
            return Ok(false);
        }
        let missing = crate::iptables::canary::check(&self.ipt, self.family)?;
        self.needs_full |= missing;
        Ok(missing)
    }
}

/// What [`cleanup`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CleanupReport {
    /// Virtual servers deleted.
    pub virtual_servers: usize,
    /// ipsets destroyed.
    pub sets: usize,
    /// Whether kube-ipvs0 was deleted.
    pub dummy_link: bool,
}

impl CleanupReport {
    /// Whether anything was removed.
    pub fn is_empty(&self) -> bool {
        self.virtual_servers == 0 && self.sets == 0 && !self.dummy_link
    }
}

/// Whether `name` is one of upstream's IPVS-mode sets, of either family.
fn is_kube_set(name: &str) -> bool {
    KubeSet::from_name(name, IpFamily::V4).is_some()
        || KubeSet::from_name(name, IpFamily::V6).is_some()
}

/// Whether IPVS mode left something on this node: kube-ipvs0, or one of its ipsets.
pub fn has_leftovers(ipset: &dyn Ipset, links: &mut dyn LinkOps) -> bool {
    let link = links.link_index(DUMMY_DEVICE).ok().flatten().is_some();
    let sets = ipset
        .save()
        .is_ok_and(|sets| sets.iter().any(|s| is_kube_set(&s.spec.name)));
    link || sets
}

/// Removes IPVS mode's kernel objects (upstream's `CleanupLeftovers` for IPVS): the virtual
/// servers (outside `exclude`), the dummy link kube-ipvs0, and upstream's ipsets of both
/// families. Run it after the iptables chains are gone ([`crate::iptables::cleanup`]): a set
/// an iptables rule still references cannot be destroyed.
///
/// # Errors
/// The first failure; what could be removed before it is removed.
pub fn cleanup(
    ipset: &dyn Ipset,
    ipvs: Option<&mut dyn IpvsOps>,
    links: &mut dyn LinkOps,
    exclude: &[IpNet],
) -> Result<CleanupReport, ProxierError> {
    let mut report = CleanupReport::default();
    if let Some(ipvs) = ipvs {
        let services = ipvs
            .services()
            .map_err(|e| kernel_err("IPVS virtual servers", e))?;
        let ops: Vec<IpvsOp> = services
            .iter()
            .filter(|vs| !exclude.iter().any(|c| c.contains(&vs.key.addr)))
            .map(|vs| IpvsOp::DelService(vs.key))
            .collect();
        if !ops.is_empty() {
            let results = ipvs.apply(&ops).map_err(|e| kernel_err("IPVS table", e))?;
            report.virtual_servers = results.iter().filter(|r| r.is_ok()).count();
        }
    }
    report.dummy_link = links
        .delete_link(DUMMY_DEVICE)
        .map_err(|e| kernel_err("kube-ipvs0", e))?;
    let sets = ipset.save()?;
    let mut b = kp_netfilter::ipset::RestoreBuilder::new();
    for s in &sets {
        if is_kube_set(&s.spec.name) {
            b.destroy(&s.spec.name);
            report.sets += 1;
        }
    }
    if !b.is_empty() {
        ipset.restore(&b.finish())?;
    }
    Ok(report)
}

#[cfg(test)]
mod tests;
