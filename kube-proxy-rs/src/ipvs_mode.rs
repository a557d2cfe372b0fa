//! IPVS mode in the binary: its configuration from the flags, the start-up checks that
//! decide whether IPVS mode can run on this node (and the fallback to iptables mode when it
//! cannot, as seed 003 describes kube-proxy doing), `--cleanup` of its kernel objects, and the
//! printing adapters of `--dry-run`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use ipnet::IpNet;
use kp_netfilter::ipset::{ExecIpset, FakeIpset, Ipset, IpsetVersion, SetState};
use kp_netlink::ipvs::{
    FakeIpvs, Ipvs, IpvsInfo, IpvsOp, IpvsOps, RealServer, ServiceKey, VirtualServer,
};
use kp_netlink::link::{FakeLinks, LinkOps, Links};
use kp_proxier::ipvs::{IpvsConfig, SCHEDULERS};
use kp_proxier::{LocalDetector, NodePortAddresses};
use tracing::{info, warn};

use crate::cli::ProxyArgs;

/// How long a removed TCP real server may drain at weight 0 before it is deleted anyway.
pub const GRACEFUL_TERMINATION_BOUND: Duration = Duration::from_secs(15 * 60);

/// Builds the IPVS-mode configuration from the flags.
///
/// # Errors
/// A message naming the flag whose value is invalid (`--ipvs-scheduler` not one of
/// upstream's schedulers, a bad `--ipvs-exclude-cidrs` entry).
pub fn ipvs_config(args: &ProxyArgs, local_detector: LocalDetector) -> anyhow::Result<IpvsConfig> {
    let scheduler = match args.compat.ipvs_scheduler.trim() {
        "" => "rr".to_string(),
        s => s.to_string(),
    };
    if !SCHEDULERS.contains(&scheduler.as_str()) {
        bail!(
            "--ipvs-scheduler {scheduler:?} is not an IPVS scheduler (one of {})",
            SCHEDULERS.join(", ")
        );
    }
    if args.compat.ipvs_sync_period.is_zero() {
        bail!("--ipvs-sync-period must be greater than 0");
    }
    if args.compat.ipvs_min_sync_period > args.compat.ipvs_sync_period {
        bail!(
            "--ipvs-min-sync-period {:?} must not be longer than --ipvs-sync-period {:?}",
            args.compat.ipvs_min_sync_period,
            args.compat.ipvs_sync_period
        );
    }
    let mut exclude_cidrs = Vec::new();
    for c in args
        .compat
        .ipvs_exclude_cidrs
        .iter()
        .map(|c| c.trim())
        .filter(|c| !c.is_empty())
    {
        let net: IpNet = c
            .parse()
            .with_context(|| format!("--ipvs-exclude-cidrs: {c:?} is not a CIDR"))?;
        exclude_cidrs.push(net);
    }
    Ok(IpvsConfig {
        scheduler,
        masquerade_all: args.masquerade_all,
        masquerade_bit: args.iptables_masquerade_bit,
        local_detector,
        nodeport_addresses: NodePortAddresses::parse(&args.nodeport_addresses)?,
        exclude_cidrs,
        strict_arp: args.compat.ipvs_strict_arp,
        graceful_termination_bound: GRACEFUL_TERMINATION_BOUND,
        timeouts: timeouts(args)?,
    })
}

/// `--ipvs-tcp-timeout`, `--ipvs-tcpfin-timeout`, `--ipvs-udp-timeout` as whole seconds;
/// `None` when all are 0 (the kernel's values stay).
fn timeouts(args: &ProxyArgs) -> anyhow::Result<Option<kp_netlink::ipvs::IpvsTimeouts>> {
    let secs = |flag: &str, d: Duration| -> anyhow::Result<u32> {
        let s = d.as_secs();
        if s > u64::from(kp_netlink::ipvs::TIMEOUT_MAX) {
            bail!("{flag} {d:?} is longer than the kernel accepts");
        }
        Ok(s as u32)
    };
    let c = &args.compat;
    let t = kp_netlink::ipvs::IpvsTimeouts::new(
        secs("--ipvs-tcp-timeout", c.ipvs_tcp_timeout)?,
        secs("--ipvs-tcpfin-timeout", c.ipvs_tcpfin_timeout)?,
        secs("--ipvs-udp-timeout", c.ipvs_udp_timeout)?,
    );
    Ok((t.tcp > 0 || t.tcp_fin > 0 || t.udp > 0).then_some(t))
}

/// What the start-up check found missing for IPVS mode (empty: IPVS mode can run).
///
/// Mirrors upstream's `CanUseIPVSProxier` and the checks seed 003 lists: the kernel's IPVS
/// (the `IPVS` generic-netlink family, i.e. `ip_vs`), the schedulers `rr`, `wrr`, `sh` and
/// the configured one (each a dummy virtual server `198.51.100.0:20000` added and deleted,
/// which also loads `ip_vs_<name>` where modules can load), conntrack (`nf_conntrack`), dummy
/// links (for kube-ipvs0), and the `ipset` tool at version 6.0 or later.
pub fn missing_for_ipvs(scheduler: &str) -> Vec<String> {
    let mut missing = Vec::new();
    match Ipvs::new() {
        Err(e) => missing.push(format!("the kernel's IPVS (ip_vs): {e}")),
        Ok(mut ipvs) => {
            let mut wanted = vec!["rr", "wrr", "sh"];
            if !wanted.contains(&scheduler) {
                wanted.push(scheduler);
            }
            for s in wanted {
                match kp_netlink::ipvs::scheduler_probe(&mut ipvs, s) {
                    Ok(true) => {}
                    Ok(false) => missing.push(format!("the IPVS scheduler {s} (ip_vs_{s})")),
                    Err(e) => missing.push(format!("the IPVS scheduler {s} (ip_vs_{s}): {e}")),
                }
            }
        }
    }
    if !std::path::Path::new("/proc/sys/net/netfilter/nf_conntrack_max").exists() {
        missing.push("conntrack (nf_conntrack)".into());
    }
    match Links::new() {
        Err(e) => missing.push(format!("rtnetlink: {e}")),
        Ok(mut links) => {
            let existed = links.link_index(kp_proxier::ipvs::names::DUMMY_DEVICE);
            if !matches!(existed, Ok(Some(_))) {
                match links.ensure_dummy(kp_proxier::ipvs::names::DUMMY_DEVICE) {
                    Ok(_) => {
                        // Created only to test: IPVS mode creates it again at its first sync.
                        let _ = links.delete_link(kp_proxier::ipvs::names::DUMMY_DEVICE);
                    }
                    Err(e) => missing.push(format!("dummy links (kube-ipvs0): {e}")),
                }
            }
        }
    }
    match ExecIpset::new().version() {
        Ok(v) if v.is_supported() => {}
        Ok(v) => missing.push(format!("ipset 6.0 or later (found {v})")),
        Err(e) => missing.push(format!("the ipset tool: {e}")),
    }
    missing
}

/// Removes IPVS mode's kernel objects (virtual servers outside `exclude`, kube-ipvs0, the
/// ipsets of both families). Run it after the iptables chains are gone. Returns whether
/// anything was removed; `Err(())` when something failed (logged).
pub fn cleanup_objects(exclude: &[IpNet], quiet_when_absent: bool) -> Result<bool, ()> {
    let ipset = ExecIpset::new();
    let mut ipvs = Ipvs::new().ok();
    let mut links = match Links::new() {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("IPVS cleanup: rtnetlink: {e}");
            return Err(());
        }
    };
    if ipset.version().is_err() {
        // No ipset tool: nothing of ours can be in ipsets; still remove the rest.
        if !quiet_when_absent {
            info!("no ipset tool: skipping ipsets");
        }
    }
    let ipvs_ref: Option<&mut dyn IpvsOps> = ipvs.as_mut().map(|i| i as &mut dyn IpvsOps);
    let result = if ipset.version().is_ok() {
        kp_proxier::ipvs::cleanup(&ipset, ipvs_ref, &mut links, exclude)
    } else {
        kp_proxier::ipvs::cleanup(&NoIpset, ipvs_ref, &mut links, exclude)
    };
    match result {
        Ok(report) => {
            if !report.is_empty() {
                info!(
                    virtual_servers = report.virtual_servers,
                    ipsets = report.sets,
                    kube_ipvs0 = report.dummy_link,
                    "removed IPVS-mode objects"
                );
            }
            Ok(!report.is_empty())
        }
        Err(e) => {
            tracing::error!("IPVS cleanup failed: {e}");
            Err(())
        }
    }
}

/// Whether IPVS mode left objects on this node (kube-ipvs0 or one of its ipsets).
pub fn has_leftovers() -> bool {
    let Ok(mut links) = Links::new() else {
        return false;
    };
    let ipset = ExecIpset::new();
    if ipset.version().is_err() {
        return kp_proxier::ipvs::has_leftovers(&NoIpset, &mut links);
    }
    kp_proxier::ipvs::has_leftovers(&ipset, &mut links)
}

/// An ipset stand-in for hosts without the tool: no sets.
struct NoIpset;

impl Ipset for NoIpset {
    fn version(&self) -> Result<IpsetVersion, kp_netfilter::Error> {
        IpsetVersion::parse("ipset v7.0, protocol version: 7").map_err(|e| {
            kp_netfilter::Error::Parse(kp_netfilter::ParseError {
                line: 0,
                message: e,
            })
        })
    }
    fn save(&self) -> Result<Vec<SetState>, kp_netfilter::Error> {
        Ok(Vec::new())
    }
    fn restore(&self, _payload: &[u8]) -> Result<(), kp_netfilter::Error> {
        Ok(())
    }
}

/// The ipset runner of `--dry-run`: a checking fake that keeps each payload for printing.
pub struct PrintingIpset {
    /// The fake the payloads are applied to (so an invalid payload still fails).
    pub fake: FakeIpset,
    /// Where the payloads go.
    pub sink: Arc<Mutex<String>>,
}

impl Ipset for PrintingIpset {
    fn version(&self) -> Result<IpsetVersion, kp_netfilter::Error> {
        self.fake.version()
    }
    fn save(&self) -> Result<Vec<SetState>, kp_netfilter::Error> {
        self.fake.save()
    }
    fn restore(&self, payload: &[u8]) -> Result<(), kp_netfilter::Error> {
        self.fake.restore(payload)?;
        if let Ok(mut s) = self.sink.lock() {
            s.push_str(&String::from_utf8_lossy(payload));
        }
        Ok(())
    }
}

/// The IPVS handle of `--dry-run`: a checking fake whose resulting table is printed in
/// `ipvsadm -S -n` form.
pub struct PrintingIpvs {
    /// The fake table.
    pub fake: FakeIpvs,
    /// Where the resulting table goes (rewritten after each batch).
    pub sink: Arc<Mutex<String>>,
}

impl IpvsOps for PrintingIpvs {
    fn info(&mut self) -> kp_netlink::Result<IpvsInfo> {
        self.fake.info()
    }
    fn services(&mut self) -> kp_netlink::Result<Vec<VirtualServer>> {
        self.fake.services()
    }
    fn destinations(&mut self, svc: &ServiceKey) -> kp_netlink::Result<Vec<RealServer>> {
        self.fake.destinations(svc)
    }
    fn apply(
        &mut self,
        ops: &[IpvsOp],
    ) -> kp_netlink::Result<Vec<Result<(), kp_netlink::ipvs::OpError>>> {
        let out = self.fake.apply(ops)?;
        let table = kp_netlink::ipvs::dump_all(&mut self.fake)?;
        if let Ok(mut s) = self.sink.lock() {
            *s = kp_netlink::ipvs::save_text(&table);
        }
        Ok(out)
    }
    fn flush(&mut self) -> kp_netlink::Result<()> {
        self.fake.flush()
    }
    fn set_timeouts(&mut self, t: kp_netlink::ipvs::IpvsTimeouts) -> kp_netlink::Result<()> {
        self.fake.set_timeouts(t)
    }
}

/// This node's addresses for IPVS mode's `--dry-run`, shared by both families' proxiers and
/// the printing of the output.
///
/// On the node, the daemon puts NodePort virtual servers on the addresses of the node's
/// interfaces that `--nodeport-addresses` selects (as upstream's IPVS mode). A dry run may run
/// elsewhere (a laptop, CI) whose addresses say nothing about the node: once the source has
/// delivered this node's Node object, its `status.addresses` (InternalIP, ExternalIP) stand
/// for the node's addresses; without one, this machine's addresses are used (right when the
/// dry run runs on the node). The output's header says which ([`DryRunNode::header`]).
#[derive(Debug, Clone, Default)]
pub struct DryRunNode {
    /// The Node object's `status.addresses`, once delivered ([`DryRunNode::observe`]).
    node_object: Arc<Mutex<Option<Vec<std::net::IpAddr>>>>,
    /// What the last rendering used.
    used: Arc<Mutex<Option<UsedAddresses>>>,
}

/// The node addresses a dry run's rendering used: whether they were the Node object's (else
/// this machine's), and the addresses.
type UsedAddresses = (bool, Vec<std::net::IpAddr>);

impl DryRunNode {
    /// Takes note of this node's Node object (named `node`) in a batch of source events.
    pub fn observe(&self, node: &str, batch: &[kp_model::SourceEvent]) {
        for ev in batch {
            let addresses = match ev {
                kp_model::SourceEvent::NodeUpsert(n) if n.name == node => Some(n.addresses.clone()),
                kp_model::SourceEvent::NodeDelete(n) if n == node => None,
                _ => continue,
            };
            if let Ok(mut cell) = self.node_object.lock() {
                *cell = addresses;
            }
        }
    }

    /// The `#` lines under a family's IPVS table saying whose addresses the NodePort virtual
    /// servers are on; empty before any rendering.
    pub fn header(&self, family: kp_model::IpFamily, node: &str) -> String {
        let Some((from_node, addrs)) = self.used.lock().ok().and_then(|u| u.clone()) else {
            return String::new();
        };
        let list: Vec<String> = addrs
            .iter()
            .filter(|a| {
                family.contains(a)
                    && !a.is_loopback()
                    && !matches!(a, std::net::IpAddr::V6(v6) if v6.is_unicast_link_local())
            })
            .map(ToString::to_string)
            .collect();
        let list = if list.is_empty() {
            "none of this family".to_string()
        } else {
            list.join(", ")
        };
        if from_node {
            format!(
                "# NodePort virtual servers: on the addresses of Node {node} (its status.addresses: {list}) that --nodeport-addresses selects; on the node, the daemon uses the addresses of its interfaces\n"
            )
        } else {
            format!(
                "# NodePort virtual servers: on the addresses of the machine this dry run ran on ({list}), as no Node {node} was given; they are the node's only when it ran on the node\n"
            )
        }
    }

    /// The links of the dry run, reading the addresses as this says.
    pub fn links(&self) -> DryRunLinks {
        let mut machine = Vec::new();
        match Links::new().and_then(|mut real| real.local_addresses()) {
            Ok(addrs) => machine.extend(
                addrs
                    .into_iter()
                    .filter(|(dev, _)| dev != kp_proxier::ipvs::names::DUMMY_DEVICE),
            ),
            Err(e) => warn!(
                "dry run: cannot read this machine's addresses ({e}); NodePort virtual servers are shown only on the Node object's addresses"
            ),
        }
        DryRunLinks {
            fake: FakeLinks::new(),
            machine,
            node: self.clone(),
        }
    }
}

/// The links of `--dry-run`: an empty node (kube-ipvs0 not yet there, created in a fake),
/// whose other addresses are the Node object's or this machine's ([`DryRunNode`]).
pub struct DryRunLinks {
    fake: FakeLinks,
    machine: Vec<(String, std::net::IpAddr)>,
    node: DryRunNode,
}

impl LinkOps for DryRunLinks {
    fn ensure_dummy(&mut self, name: &str) -> kp_netlink::link::LinkResult<u32> {
        self.fake.ensure_dummy(name)
    }
    fn link_index(&mut self, name: &str) -> kp_netlink::link::LinkResult<Option<u32>> {
        self.fake.link_index(name)
    }
    fn addresses(&mut self, name: &str) -> kp_netlink::link::LinkResult<Vec<std::net::IpAddr>> {
        self.fake.addresses(name)
    }
    fn add_addresses(
        &mut self,
        name: &str,
        addrs: &[std::net::IpAddr],
    ) -> kp_netlink::link::LinkResult<Vec<kp_netlink::link::LinkResult<()>>> {
        self.fake.add_addresses(name, addrs)
    }
    fn del_addresses(
        &mut self,
        name: &str,
        addrs: &[std::net::IpAddr],
    ) -> kp_netlink::link::LinkResult<Vec<kp_netlink::link::LinkResult<()>>> {
        self.fake.del_addresses(name, addrs)
    }
    fn delete_link(&mut self, name: &str) -> kp_netlink::link::LinkResult<bool> {
        self.fake.delete_link(name)
    }
    /// kube-ipvs0's addresses (the fake's), and the Node object's addresses when it was
    /// delivered with some, else this machine's.
    fn local_addresses(&mut self) -> kp_netlink::link::LinkResult<Vec<(String, std::net::IpAddr)>> {
        let mut out = self.fake.local_addresses()?;
        let node = self.node.node_object.lock().ok().and_then(|n| n.clone());
        let (from_node, others): (bool, Vec<(String, std::net::IpAddr)>) = match node {
            Some(addrs) if !addrs.is_empty() => (
                true,
                addrs
                    .into_iter()
                    .map(|a| ("node-object".to_string(), a))
                    .collect(),
            ),
            _ => (false, self.machine.clone()),
        };
        if let Ok(mut used) = self.node.used.lock() {
            *used = Some((from_node, others.iter().map(|(_, a)| *a).collect()));
        }
        out.extend(others);
        out.sort();
        Ok(out)
    }
}
