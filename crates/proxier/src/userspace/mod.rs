//! Userspace mode: kube-proxy's first mode, a proxy socket per Service port.
//!
//! For each Service port the proxy listens on a local port (a [`PortalRelay`], in the daemon
//! `kp-relay`'s splice relay); iptables nat rules ([`render`]) send the Service's ClusterIP,
//! externalIP, LB-IP and NodePort traffic to that port; the relay picks an endpoint round
//! robin (ClientIP affinity when asked), connects to it itself and relays the bytes, and
//! retries the next endpoint when a connect fails, which the kernel modes cannot do.
//!
//! A sync: work out the listeners the snapshot needs ([`listeners`]: one per Service port,
//! plus one for external destinations when they use other endpoints), make the relay serve
//! exactly those (new ones opened, changed ones updated in place without touching open
//! connections, gone ones closed), then write the portal rules pointing at the listening
//! ports in one `iptables-restore --noflush` (only when they changed, and on every full sync,
//! which also reads the kernel back and repairs the jumps from the built-in chains).
//!
//! Endpoint selection is the other modes' ([`kp_track::categorize`]): traffic
//! policies, topology hints, the terminating fallback. What userspace mode cannot do: keep
//! the client's address (the backend always sees the node), and SCTP (upstream's userspace
//! mode had no SCTP either; such ports are skipped with a warning). See docs/userspace.md.

pub mod render;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kp_model::{Changes, IpFamily, Protocol, ServicePortName, SessionAffinity, Snapshot};
use kp_netfilter::{Iptables, Table};
use tracing::{error, info, warn};

use crate::iptables::reconcile::KernelTable;
use crate::{Host, NodePortAddresses, Proxier, ProxierError, ProxyMode, SyncReport};
pub use render::{FILTER_CHAINS, NAT_CHAINS, NodeView, Portal, Rendered};

/// Which traffic of a Service port a listener takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// The ClusterIP, and the external destinations when they use the same endpoints.
    Internal,
    /// The external destinations (NodePort, externalIPs, LB IPs), when they use other
    /// endpoints than the ClusterIP (`externalTrafficPolicy: Local`).
    External,
    /// Pod and node traffic to the external destinations under `externalTrafficPolicy:
    /// Local`, which the kernel modes short-circuit to the cluster-wide endpoints, when
    /// neither other listener has those (`internalTrafficPolicy: Local` too).
    Cluster,
}

impl Scope {
    /// `internal`, `external` or `cluster` (metrics labels, the proxy table).
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Internal => "internal",
            Scope::External => "external",
            Scope::Cluster => "cluster",
        }
    }
}

/// One listener of the relay: what it serves and where it sends connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    /// The Service port.
    pub service: ServicePortName,
    /// Which of the port's traffic it takes.
    pub scope: Scope,
    /// TCP or UDP.
    pub protocol: Protocol,
    /// ClientIP session affinity timeout; `None`: no affinity.
    pub affinity: Option<Duration>,
    /// The endpoints (`ip:port`), in the snapshot's order; one allocation that the relay
    /// shares rather than copies.
    pub endpoints: Arc<[SocketAddr]>,
}

impl Listener {
    /// The relay key: `SPN`, `SPN external` or `SPN cluster`.
    pub fn key(&self) -> String {
        match self.scope {
            Scope::Internal => self.service.to_string(),
            other => format!("{} {}", self.service, other.as_str()),
        }
    }
}

/// The proxy sockets: the seam between the proxier (which decides what to listen for) and
/// the relay that listens and moves bytes.
pub trait PortalRelay: Send {
    /// Serves exactly `listeners`: opens the new ones, updates the others in place (their
    /// ports stay), closes the ones not listed. Returns each listener's port, in order, or
    /// why it could not listen.
    fn serve(&mut self, listeners: &[Listener]) -> Vec<Result<u16, String>>;
}

/// A [`PortalRelay`] that listens nowhere: ports are handed out from `base` in the order
/// listeners are first seen, and kept while they are served. For dry runs and tests.
#[derive(Debug, Clone)]
pub struct FakeRelay {
    next: u16,
    ports: BTreeMap<String, u16>,
    /// What the last [`PortalRelay::serve`] asked for.
    pub served: Vec<Listener>,
    /// Keys that fail to listen (tests).
    pub failing: BTreeSet<String>,
}

impl FakeRelay {
    /// A fake whose first port is `base`.
    pub fn new(base: u16) -> FakeRelay {
        FakeRelay {
            next: base,
            ports: BTreeMap::new(),
            served: Vec::new(),
            failing: BTreeSet::new(),
        }
    }
}

impl PortalRelay for FakeRelay {
    fn serve(&mut self, listeners: &[Listener]) -> Vec<Result<u16, String>> {
        let keys: BTreeSet<String> = listeners.iter().map(Listener::key).collect();
        self.ports.retain(|k, _| keys.contains(k));
        self.served = listeners.to_vec();
        listeners
            .iter()
            .map(|l| {
                let key = l.key();
                if self.failing.contains(&key) {
                    return Err("injected failure".into());
                }
                let next = &mut self.next;
                Ok(*self.ports.entry(key).or_insert_with(|| {
                    let p = *next;
                    *next = next.wrapping_add(1);
                    p
                }))
            })
            .collect()
    }
}

impl<T: PortalRelay + ?Sized> PortalRelay for Box<T> {
    fn serve(&mut self, listeners: &[Listener]) -> Vec<Result<u16, String>> {
        (**self).serve(listeners)
    }
}

/// Userspace-mode settings.
#[derive(Debug, Clone, Default)]
pub struct UserspaceConfig {
    /// `--nodeport-addresses`.
    pub nodeport_addresses: NodePortAddresses,
    /// `--detect-local-mode`: pod traffic to a Service's external destinations uses the
    /// ClusterIP's listener (see [`render`]).
    pub local_detector: crate::LocalDetector,
}

/// The listeners `snap` needs, in ServicePortName order. SCTP ports are left out (returned
/// in the second list).
pub fn listeners(snap: &Snapshot) -> (Vec<Listener>, Vec<ServicePortName>) {
    // One listener per Service port, a few more for external destinations.
    let mut out = Vec::with_capacity(snap.services.len() + snap.services.len() / 8);
    let mut sctp = Vec::new();
    for (name, svc) in &snap.services {
        if name.protocol == Protocol::Sctp {
            sctp.push(name.clone());
            continue;
        }
        let eps = snap.endpoints_of(name);
        let cat = kp_track::categorize(svc, eps, &snap.node_name, &snap.node_labels);
        let addrs = |list: &[&kp_model::Endpoint]| -> Arc<[SocketAddr]> {
            list.iter().map(|e| SocketAddr::new(e.ip, e.port)).collect()
        };
        let internal = if svc.internal_policy_local {
            addrs(&cat.local)
        } else {
            addrs(&cat.cluster)
        };
        let affinity = match svc.session_affinity {
            SessionAffinity::None => None,
            SessionAffinity::ClientIp { timeout_seconds } => {
                Some(Duration::from_secs(u64::from(timeout_seconds)))
            }
        };
        let make = |scope: Scope, endpoints: Arc<[SocketAddr]>| Listener {
            service: name.clone(),
            scope,
            protocol: name.protocol,
            affinity,
            endpoints,
        };
        let mut mine = Vec::new();
        if svc.externally_accessible() {
            let external = if svc.external_policy_local {
                addrs(&cat.local)
            } else {
                addrs(&cat.cluster)
            };
            let cluster = addrs(&cat.cluster);
            if svc.external_policy_local && cluster != internal && cluster != external {
                mine.push(make(Scope::Cluster, cluster));
            }
            if external != internal {
                mine.push(make(Scope::External, external));
            }
        }
        out.push(make(Scope::Internal, internal));
        out.append(&mut mine);
    }
    (out, sctp)
}

/// Userspace-mode proxier for one family.
pub struct UserspaceProxier<I: Iptables, R: PortalRelay> {
    family: IpFamily,
    cfg: UserspaceConfig,
    ipt: I,
    relay: R,
    host: Arc<dyn Host>,
    needs_full: bool,
    /// The digest of the rules the last sync wrote ([`RulesDigest`]), to skip writing the
    /// same rules again; the rules themselves are not kept.
    last_rules: Option<RulesDigest>,
    portals: Vec<Portal>,
    warned_sctp: BTreeSet<ServicePortName>,
    failed: BTreeMap<String, String>,
}

impl<I: Iptables, R: PortalRelay> UserspaceProxier<I, R> {
    /// A proxier writing rules with `ipt` and listening through `relay`.
    pub fn new(
        family: IpFamily,
        cfg: UserspaceConfig,
        ipt: I,
        relay: R,
        host: Arc<dyn Host>,
    ) -> UserspaceProxier<I, R> {
        UserspaceProxier {
            family,
            cfg,
            ipt,
            relay,
            host,
            needs_full: true,
            last_rules: None,
            portals: Vec::new(),
            warned_sctp: BTreeSet::new(),
            failed: BTreeMap::new(),
        }
    }

    /// The iptables runner (tests read the rules back through it).
    pub fn runner(&self) -> &I {
        &self.ipt
    }

    /// The relay.
    pub fn relay(&self) -> &R {
        &self.relay
    }

    /// The listeners the last sync served, with their ports.
    pub fn portals(&self) -> &[Portal] {
        &self.portals
    }

    /// The address the node's own connections to a Service are DNATed to: the Node's first
    /// address of this family that is local, else the first local non-loopback,
    /// non-link-local address of the family; `None` (REDIRECT) when there is none.
    fn node_ip(&self, snap: &Snapshot, local: &[IpAddr]) -> Option<IpAddr> {
        let usable = |ip: &IpAddr| {
            self.family.contains(ip)
                && !ip.is_loopback()
                && !ip.is_unspecified()
                && match ip {
                    IpAddr::V4(v4) => !v4.is_link_local(),
                    IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) != 0xfe80,
                }
        };
        snap.node_ips
            .iter()
            .find(|ip| usable(ip) && local.contains(ip))
            .or_else(|| local.iter().find(|ip| usable(ip)))
            .copied()
    }

    /// Writes the restore payload into `out`: per table its chain declarations (and on a
    /// full sync the jump repairs and the deletion of another mode's chains), the rules as
    /// [`render::render_table`] writes them, `COMMIT`.
    fn write_payload(
        rules: &RenderInput<'_>,
        kernel: Option<&(KernelTable, KernelTable)>,
        out: &mut dyn std::fmt::Write,
    ) {
        for (table, name, chains, kt) in [
            (
                render::Table::Filter,
                "filter",
                &FILTER_CHAINS[..],
                kernel.map(|k| &k.0),
            ),
            (
                render::Table::Nat,
                "nat",
                &NAT_CHAINS[..],
                kernel.map(|k| &k.1),
            ),
        ] {
            let _ = writeln!(out, "*{name}");
            let stale = kt.map(|k| other_mode_chains(name, k)).unwrap_or_default();
            for c in chains
                .iter()
                .copied()
                .chain(stale.iter().map(String::as_str))
            {
                let _ = writeln!(out, ":{c} - [0:0]");
            }
            // A partial sync trusts the jumps the last full one checked; only full syncs
            // (and a dry run, whose kernel is empty) write them.
            if let Some(k) = kt {
                let _ = out.write_str(&jump_fixups(name, Some(k)));
            }
            for c in &stale {
                let _ = writeln!(out, "-X {c}");
            }
            rules.write(table, out);
            let _ = out.write_str("COMMIT\n");
        }
    }
}

/// What the portal rules are rendered from.
struct RenderInput<'a> {
    snap: &'a Snapshot,
    portals: &'a [Portal],
    node: &'a NodeView<'a>,
}

impl RenderInput<'_> {
    fn write(&self, table: render::Table, out: &mut dyn std::fmt::Write) {
        render::render_table(self.snap, self.portals, self.node, table, out);
    }
}

/// A SHA-256 digest of a sync's rules (filter, a NUL, nat) and their line counts: the
/// state a sync keeps to tell whether the next one has anything to write (at 10,000
/// Services the text is ~3 MB, the digest 32 bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
struct RulesDigest {
    digest: [u8; 32],
    filter_rules: usize,
    nat_rules: usize,
}

/// A [`std::fmt::Write`] that hashes and counts lines, for [`RulesDigest`].
struct Hashing {
    hasher: sha2::Sha256,
    lines: usize,
}

impl std::fmt::Write for Hashing {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        use sha2::Digest as _;
        self.hasher.update(s.as_bytes());
        self.lines += s.bytes().filter(|b| *b == b'\n').count();
        Ok(())
    }
}

impl RulesDigest {
    /// Renders the rules once, into the hash.
    fn of(rules: &RenderInput<'_>) -> RulesDigest {
        use sha2::Digest as _;
        let mut h = Hashing {
            hasher: sha2::Sha256::new(),
            lines: 0,
        };
        rules.write(render::Table::Filter, &mut h);
        let filter_rules = h.lines;
        h.hasher.update([0u8]);
        rules.write(render::Table::Nat, &mut h);
        RulesDigest {
            digest: h.hasher.finalize().into(),
            filter_rules,
            nat_rules: h.lines - filter_rules,
        }
    }
}

/// iptables-mode and IPVS-mode chains in `kernel` that userspace mode deletes on a full
/// sync (a node switching modes).
fn other_mode_chains(table: &str, kernel: &KernelTable) -> Vec<String> {
    kernel
        .chains
        .iter()
        .filter(|c| {
            let c = c.as_str();
            if table == "filter" {
                crate::iptables::reconcile::CLEANUP_FILTER.contains(&c)
            } else {
                crate::iptables::reconcile::CLEANUP_NAT.contains(&c)
                    || crate::iptables::names::is_dynamic_chain(c)
            }
        })
        .filter(|c| !NAT_CHAINS.contains(&c.as_str()) && !FILTER_CHAINS.contains(&c.as_str()))
        // Shared by the modes: a full sync writes it again (see `iptables::canary`).
        .filter(|c| c.as_str() != crate::iptables::canary::KUBE_PROXY_CANARY)
        .cloned()
        .collect()
}

fn jump_line(chain: &str, rule: &str) -> String {
    format!("-A {chain} {rule}")
}

/// Jump-rule changes for `table`: kube-proxy jumps from built-in chains that are not
/// userspace mode's are deleted, and so are second copies of ours; missing ones of ours are
/// inserted at the top (portals) or appended (NodePorts). Without the kernel's table every
/// jump is written.
fn jump_fixups(table: &str, kernel: Option<&KernelTable>) -> String {
    let mut out = String::new();
    let ours: Vec<String> = render::JUMPS
        .iter()
        .filter(|j| j.0 == table)
        .map(|j| jump_line(j.1, j.2))
        .collect();
    if let Some(k) = kernel {
        let mut seen = BTreeSet::new();
        for (chain, line, target) in &k.rules {
            let Some(t) = target else { continue };
            let kube = t.starts_with("KUBE-") && t != "KUBE-FIREWALL" && t != "KUBE-PROXY-CANARY";
            let builtin = matches!(
                chain.as_str(),
                "PREROUTING" | "INPUT" | "FORWARD" | "OUTPUT" | "POSTROUTING"
            );
            // `-D` with a rule spec deletes its first copy; a duplicate of ours is deleted
            // the same way, leaving one.
            if builtin && kube && (!ours.contains(line) || !seen.insert(line.clone())) {
                let _ = writeln!(out, "-D{}", &line[2..]);
            }
        }
    }
    for (t, chain, rule, first) in render::JUMPS {
        if t != table {
            continue;
        }
        let line = jump_line(chain, rule);
        if kernel.is_some_and(|k| k.rules.iter().any(|(_, l, _)| *l == line)) {
            continue;
        }
        if first {
            let _ = writeln!(out, "-I {chain} 1 {rule}");
        } else {
            let _ = writeln!(out, "{line}");
        }
    }
    out
}

impl<I: Iptables, R: PortalRelay> Proxier for UserspaceProxier<I, R> {
    fn mode(&self) -> ProxyMode {
        ProxyMode::Userspace
    }

    fn family(&self) -> IpFamily {
        self.family
    }

    fn sync(&mut self, snap: &Snapshot, changes: &Changes) -> Result<SyncReport, ProxierError> {
        let full = self.needs_full || changes.full_resync_needed;
        self.needs_full = true;
        let t_render = Instant::now();
        let (wanted, sctp) = listeners(snap);
        for name in sctp {
            if self.warned_sctp.insert(name.clone()) {
                warn!(service = %name, "userspace mode cannot proxy SCTP; this Service port gets no rules");
            }
        }
        let ports = self.relay.serve(&wanted);
        let mut portals = Vec::with_capacity(wanted.len());
        let mut failed = BTreeMap::new();
        for (listener, port) in wanted.into_iter().zip(ports) {
            match port {
                Ok(port) => portals.push(Portal { listener, port }),
                Err(e) => {
                    let key = listener.key();
                    if self.failed.get(&key) != Some(&e) {
                        error!(service = %listener.service, scope = listener.scope.as_str(), error = %e, "cannot open the proxy socket; this Service port gets no rules until it can");
                    }
                    failed.insert(key, e);
                }
            }
        }
        self.failed = failed;
        let local = self
            .host
            .local_addresses()
            .map_err(|e| ProxierError::Host {
                what: "reading the node's addresses".into(),
                source: e,
            })?;
        let node = NodeView {
            node_ip: self.node_ip(snap, &local),
            nodeport_addresses: &self.cfg.nodeport_addresses,
            local_addrs: &local,
            local: self
                .cfg
                .local_detector
                .for_family(self.family, &snap.node_pod_cidrs),
        };
        let input = RenderInput {
            snap,
            portals: &portals,
            node: &node,
        };
        // The rules are rendered into a digest, and only when they changed (or on a full
        // sync) again, straight into iptables-restore's stdin: never held whole.
        let digest = RulesDigest::of(&input);
        let render_time = t_render.elapsed();
        let t_apply = Instant::now();
        let mut payload_bytes = 0;
        if full || self.last_rules.as_ref() != Some(&digest) {
            let kernel = if full {
                let read = |table: Table| -> Result<KernelTable, ProxierError> {
                    let text = self.ipt.save(Some(table))?;
                    crate::iptables::kernel_table_for_sync(&text, table)
                };
                Some((read(Table::Filter)?, read(Table::Nat)?))
            } else {
                None
            };
            self.ipt.restore_with(&mut |w| {
                let mut out = crate::IoText::new(w);
                Self::write_payload(&input, kernel.as_ref(), &mut out);
                if full {
                    let _ = out.write_str(crate::iptables::canary::CANARY_BLOCKS);
                }
                payload_bytes = out.finish()?;
                Ok(())
            })?;
        }
        let apply_time = t_apply.elapsed();
        info!(
            family = %self.family,
            full,
            services = snap.services.len(),
            listeners = portals.len(),
            bytes = payload_bytes,
            render_ms = %format!("{:.3}", render_time.as_secs_f64() * 1e3),
            apply_ms = %format!("{:.3}", apply_time.as_secs_f64() * 1e3),
            "synced userspace portals"
        );
        let (filter_rules, nat_rules) = (digest.filter_rules, digest.nat_rules);
        self.portals = portals;
        self.last_rules = Some(digest);
        self.needs_full = false;
        Ok(SyncReport {
            family: Some(self.family),
            full,
            service_ports: snap.services.len(),
            endpoints: snap.endpoints.values().map(|e| e.len()).sum(),
            payload_bytes,
            filter_rules,
            nat_rules,
            deleted_chains: 0,
            render_time,
            apply_time,
            conntrack_deleted: 0,
            conntrack_time: None,
            filter_rules_written: 0,
            nat_rules_written: 0,
        })
    }

    /// The `KUBE-PROXY-CANARY` check of iptables mode ([`crate::iptables::canary`]): the
    /// portal rules are iptables rules like any other. The proxy sockets are not checked
    /// (nothing outside this process can close them).
    fn check_dataplane(&mut self) -> Result<bool, ProxierError> {
        if self.needs_full {
            return Ok(false);
        }
        // A proxy socket that could not be opened (its port taken, the range exhausted) is
        // tried again every sync period, not only when something else changes.
        if !self.failed.is_empty() {
            info!(
                listeners = self.failed.len(),
                "retrying the proxy sockets that could not be opened"
            );
            self.needs_full = true;
            return Ok(true);
        }
        let missing = crate::iptables::canary::check(&self.ipt, self.family)?;
        self.needs_full |= missing;
        Ok(missing)
    }
}

/// Whether `ipt`'s tables hold userspace mode's chains.
///
/// # Errors
/// The tables could not be read.
pub fn has_leftovers<I: Iptables + ?Sized>(ipt: &I) -> Result<bool, ProxierError> {
    let nat = ipt.save(Some(Table::Nat))?;
    let filter = ipt.save(Some(Table::Filter))?;
    let has = |text: &str, chains: &[&str]| {
        text.lines().any(|l| {
            l.strip_prefix(':')
                .and_then(|r| r.split(' ').next())
                .is_some_and(|c| chains.contains(&c))
        })
    };
    Ok(has(&nat, &NAT_CHAINS) || has(&filter, &FILTER_CHAINS))
}

/// Removes userspace mode's chains and the jumps to them, and the `KUBE-PROXY-CANARY`
/// chains of its full syncs (the next mode's first full sync writes its own), leaving every
/// other rule alone; returns the chains removed, as `table/chain`. Used when another mode
/// starts.
///
/// # Errors
/// The tables could not be read or the restore failed.
pub fn cleanup<I: Iptables + ?Sized>(ipt: &I) -> Result<Vec<String>, ProxierError> {
    let mut out = String::new();
    let mut removed = Vec::new();
    let canary = crate::iptables::canary::KUBE_PROXY_CANARY;
    for (table, name, chains) in [
        (Table::Filter, "filter", &FILTER_CHAINS[..]),
        (Table::Nat, "nat", &NAT_CHAINS[..]),
    ] {
        let text = ipt.save(Some(table))?;
        let kt = crate::iptables::kernel_table(&text, table)?;
        let present: Vec<&str> = chains
            .iter()
            .copied()
            .chain([canary])
            .filter(|c| kt.chains.contains(*c))
            .collect();
        if present.is_empty() {
            continue;
        }
        let _ = writeln!(out, "*{name}");
        for (chain, line, target) in &kt.rules {
            if target.as_deref().is_some_and(|t| present.contains(&t))
                && !chains.contains(&chain.as_str())
            {
                let _ = writeln!(out, "-D{}", &line[2..]);
            }
        }
        for c in &present {
            let _ = writeln!(out, ":{c} - [0:0]");
        }
        for c in &present {
            let _ = writeln!(out, "-X {c}");
            removed.push(format!("{name}/{c}"));
        }
        out.push_str("COMMIT\n");
    }
    if let Some(mangle) = crate::iptables::canary::mangle_cleanup(ipt)? {
        out.push_str(&mangle);
        removed.push(format!("mangle/{canary}"));
    }
    if !out.is_empty() {
        ipt.restore(out.as_bytes())?;
    }
    Ok(removed)
}

#[cfg(test)]
mod tests;
