//! nftables mode: upstream kube-proxy's nftables layout (table `kube-proxy` in families `ip`
//! and `ip6`), applied with one `nft -f -` transaction per sync.
//!
//! [`NftablesProxier`] ties [`render`] (snapshot → chains, sets and elements) to
//! [`reconcile`] (→ one payload) and to an [`Nft`] runner. The first sync, any sync after a
//! failure and any sync with `full_resync_needed` list the table's chains and sets, rewrite
//! everything and delete what is stale; other syncs are partial and touch only the Services
//! that changed, so their size does not grow with the number of Services. A failed
//! transaction changes nothing (nft commits all or nothing) and makes the next sync full.
//! [`cleanup`] deletes both tables (`--cleanup`, and the switch to iptables mode).
//!
//! Between syncs, [`Proxier::check_dataplane`] lists one small base chain,
//! `nat-prerouting`, and looks for its only rule, `jump services`: a `nft delete table ip
//! kube-proxy` (or `nft flush ruleset`) removes the chain, a `nft flush table ip kube-proxy`
//! (which keeps chains, sets and maps) removes the rule. Either makes the next sync full and
//! asks for it at once; the table needs no object of its own for this, so its layout stays
//! upstream's.
//!
//! The rules are upstream v1.36's, rule for rule (endpoint selection by one `numgen random
//! mod N` map lookup, source ranges as `ip saddr != { … } drop`, every endpoint in
//! `hairpin-connections`). Differences in how the table is maintained are listed in
//! `docs/nftables.md`: stale chains deleted in the same transaction, the `nodeport-ips` set
//! kept in step with the node's addresses on every sync, and the `cluster-ips-check` drop of
//! unallocated addresses of the Service CIDRs rewritten by the next sync, partial or full,
//! when the ServiceCIDRs change (upstream waits for its next full sync).

pub mod names;
pub mod reconcile;
pub mod render;

use std::sync::Arc;
use std::time::Instant;

use kp_model::{Changes, IpFamily, Snapshot};
use kp_netfilter::{IpVersion, Nft};
use kp_netlink::ConntrackOps;
use tracing::{info, warn};

use crate::{Host, LocalDetector, NodePortAddresses, Proxier, ProxierError, ProxyMode, SyncReport};
use names::{NAT_PREROUTING, SERVICES, TABLE};
use reconcile::State;
use render::RenderConfig;

/// Settings of nftables mode, named after kube-proxy's flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftablesConfig {
    /// `--masquerade-all`.
    pub masquerade_all: bool,
    /// The masquerade bit (upstream's `nftables.masqueradeBit`; our flag
    /// `--iptables-masquerade-bit`), 0..=31, default 14: the mark is `1 << bit`.
    pub masquerade_bit: u8,
    /// `--detect-local-mode` with its CIDRs or interface.
    pub local_detector: LocalDetector,
    /// `--nodeport-addresses`. Upstream's default in nftables mode is `primary` (the node's
    /// primary address per family); NodePorts are never served on loopback addresses.
    pub nodeport_addresses: NodePortAddresses,
}

impl Default for NftablesConfig {
    fn default() -> Self {
        NftablesConfig {
            masquerade_all: false,
            masquerade_bit: 14,
            local_detector: LocalDetector::None,
            nodeport_addresses: NodePortAddresses::parse(&["primary"]).unwrap_or_default(),
        }
    }
}

/// The oldest `nft` that understands every rule we write (upstream's knftables needs 1.0.1).
pub const MIN_NFT_VERSION: (u32, u32, u32) = (1, 0, 1);

/// The kernel family of a model family.
pub fn ip_version(family: IpFamily) -> IpVersion {
    match family {
        IpFamily::V4 => IpVersion::V4,
        IpFamily::V6 => IpVersion::V6,
    }
}

/// nftables-mode proxier for one family.
pub struct NftablesProxier<N: Nft> {
    family: IpFamily,
    cfg: NftablesConfig,
    nft: N,
    host: Arc<dyn Host>,
    needs_full: bool,
    /// What the last successful sync left in the table.
    state: State,
    /// The UDP stale-entry cleanup after syncs (disabled without netlink conntrack).
    conntrack: crate::conntrack::UdpCleanup,
    /// Whether "no address accepts NodePorts" was logged already.
    warned_no_nodeport_ips: bool,
}

impl<N: Nft> std::fmt::Debug for NftablesProxier<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NftablesProxier")
            .field("family", &self.family)
            .field("cfg", &self.cfg)
            .field("needs_full", &self.needs_full)
            .finish_non_exhaustive()
    }
}

impl<N: Nft> NftablesProxier<N> {
    /// Builds a proxier. Asks the runner for the nft version (`nft --version`); a version
    /// that cannot be read is only warned about (the first sync will tell).
    ///
    /// # Errors
    /// [`ProxierError::Config`] for a masquerade bit outside 0..=31 or an `nft` older than
    /// [`MIN_NFT_VERSION`].
    pub fn new(
        family: IpFamily,
        cfg: NftablesConfig,
        nft: N,
        host: Arc<dyn Host>,
    ) -> Result<Self, ProxierError> {
        if cfg.masquerade_bit > 31 {
            return Err(ProxierError::Config(format!(
                "the masquerade bit must be within 0..=31, got {}",
                cfg.masquerade_bit
            )));
        }
        match nft.version() {
            Ok(v) => {
                let (major, minor, patch) = MIN_NFT_VERSION;
                if !v.at_least(major, minor, patch) {
                    return Err(ProxierError::Config(format!(
                        "nftables mode needs nft {major}.{minor}.{patch} or newer, found {v}"
                    )));
                }
            }
            Err(e) => warn!(error = %e, "cannot read the nft version"),
        }
        Ok(NftablesProxier {
            family,
            cfg,
            nft,
            host,
            needs_full: true,
            state: State::default(),
            conntrack: crate::conntrack::UdpCleanup::disabled(),
            warned_no_nodeport_ips: false,
        })
    }

    /// Enables the UDP stale-conntrack cleanup after syncs (see [`crate::conntrack`]).
    pub fn with_conntrack(mut self, ops: Box<dyn ConntrackOps + Send>) -> Self {
        self.conntrack = crate::conntrack::UdpCleanup::new(ops);
        self
    }

    /// The runner (for tests and dry runs that inspect it).
    pub fn runner(&self) -> &N {
        &self.nft
    }

    /// The bookkeeping of the last successful sync.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// The render settings for `snap`, resolving NodePort addresses against the node.
    ///
    /// # Errors
    /// [`ProxierError::Host`] when local addresses are needed and cannot be read.
    pub fn render_config(&self, snap: &Snapshot) -> Result<RenderConfig, ProxierError> {
        let nodeport_ips = if self
            .cfg
            .nodeport_addresses
            .match_all(self.family, &snap.node_ips)
        {
            None
        } else {
            let local = self
                .host
                .local_addresses()
                .map_err(|source| ProxierError::Host {
                    what: "reading local addresses".into(),
                    source,
                })?;
            Some(
                self.cfg
                    .nodeport_addresses
                    .node_ips(self.family, &local, &snap.node_ips),
            )
        };
        Ok(RenderConfig {
            masquerade_all: self.cfg.masquerade_all,
            masquerade_mark: 1u32 << self.cfg.masquerade_bit,
            local: self
                .cfg
                .local_detector
                .for_family(self.family, &snap.node_pod_cidrs),
            nodeport_ips,
            service_cidrs: snap.service_cidrs.clone(),
        })
    }
}

impl<N: Nft> Proxier for NftablesProxier<N> {
    fn mode(&self) -> ProxyMode {
        ProxyMode::Nftables
    }

    fn family(&self) -> IpFamily {
        self.family
    }

    fn sync(&mut self, snap: &Snapshot, changes: &Changes) -> Result<SyncReport, ProxierError> {
        let mut full = self.needs_full || changes.full_resync_needed;
        // Until this sync succeeds, the next one must be full.
        self.needs_full = true;
        let t0 = Instant::now();
        let cfg = self.render_config(snap)?;
        if cfg.nodeport_ips.as_ref().is_some_and(|ips| ips.is_empty())
            && !self.warned_no_nodeport_ips
            && snap.services.values().any(|s| s.node_port.is_some())
        {
            self.warned_no_nodeport_ips = true;
            warn!(
                family = %self.family,
                "no local address matches --nodeport-addresses (default `primary`: this node's address from its Node object); NodePorts are not served in this family"
            );
        }
        if !full && reconcile::fixed_fingerprint(self.family, &cfg) != self.state.fixed() {
            // The fixed chains changed (e.g. the node's pod CIDR with NodeCIDR detection).
            full = true;
        }
        let mut apply_time = std::time::Duration::ZERO;
        let (render_time, stats) = if full {
            // Streamed: the first pass plans the state, the second writes the payload into
            // nft's stdin as it renders each Service again (see `reconcile`).
            let t = Instant::now();
            let kernel = self.nft.list_objects(ip_version(self.family), TABLE)?;
            apply_time += t.elapsed();
            // The old state goes first: two of them would only raise the peak (the sync is
            // full whatever happens to this one).
            self.state = State::default();
            let services = render::Rendering { snap, cfg: &cfg };
            let state = reconcile::plan_full(self.family, &cfg, &services);
            let render_time = t0.elapsed().saturating_sub(apply_time);
            let t1 = Instant::now();
            let mut written = None;
            self.nft.apply_with(&mut |w| {
                let stats =
                    reconcile::write_full(self.family, &cfg, &services, &kernel, &state, w)?;
                written = Some(stats);
                Ok(())
            })?;
            apply_time += t1.elapsed();
            self.state = state;
            (render_time, written.unwrap_or_default())
        } else {
            let rendered = render::render(snap, &cfg, Some(&changes.services));
            let (payload, stats) = reconcile::partial_payload(
                self.family,
                &cfg,
                &rendered,
                &changes.services,
                &mut self.state,
            );
            let render_time = t0.elapsed();
            let t1 = Instant::now();
            if !payload.is_empty() {
                self.nft.apply(payload.as_bytes())?;
            }
            apply_time += t1.elapsed();
            (render_time, stats)
        };
        self.needs_full = false;
        let conntrack = self.conntrack.after_sync(snap, changes, full);
        let report = SyncReport {
            family: Some(self.family),
            full,
            service_ports: snap.services.len(),
            endpoints: self.state.endpoints(),
            payload_bytes: stats.bytes,
            filter_rules: self.state.filter_rules(),
            nat_rules: self.state.rules() - self.state.filter_rules(),
            deleted_chains: stats.chains_deleted,
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
            endpoints = report.endpoints,
            bytes = report.payload_bytes,
            chains_written = stats.chains_written,
            deleted_chains = stats.chains_deleted,
            elements_added = stats.elements_added,
            elements_deleted = stats.elements_deleted,
            render_ms = %format!("{:.3}", render_time.as_secs_f64() * 1e3),
            apply_ms = %format!("{:.3}", apply_time.as_secs_f64() * 1e3),
            "synced nftables rules"
        );
        Ok(report)
    }

    /// One `nft list chain ip|ip6 kube-proxy nat-prerouting`: the chain must exist and hold
    /// its `jump services` rule (see the module documentation). Nothing is checked before the
    /// first successful sync or while the next sync is full anyway.
    fn check_dataplane(&mut self) -> Result<bool, ProxierError> {
        if self.needs_full {
            return Ok(false);
        }
        let family = ip_version(self.family);
        let canary = format!("jump {SERVICES}");
        let problem = match self.nft.list_chain(family, TABLE, NAT_PREROUTING)? {
            None => "its chain nat-prerouting (or the whole table) is gone",
            Some(text) if !text.lines().any(|l| l.trim() == canary) => {
                "its chain nat-prerouting lost its rule (the table was flushed)"
            }
            Some(_) => return Ok(false),
        };
        warn!(
            family = %self.family,
            "nftables rules were removed by something else (table {} {TABLE}: {problem}); resyncing everything",
            kp_netfilter::family_name(family)
        );
        self.needs_full = true;
        Ok(true)
    }
}

/// `--cleanup` for nftables mode (and what iptables mode does at start): deletes the
/// `kube-proxy` table of both families (`nft delete table ip kube-proxy`, `… ip6 …`).
/// Returns the families whose table existed.
///
/// # Errors
/// [`ProxierError::Netfilter`] when nft fails (a missing `nft` binary is an
/// [`std::io::ErrorKind::NotFound`] I/O error).
pub fn cleanup<N: Nft + ?Sized>(nft: &N) -> Result<Vec<IpFamily>, ProxierError> {
    let mut deleted = Vec::new();
    for family in [IpFamily::V4, IpFamily::V6] {
        if nft.delete_table(ip_version(family), TABLE)? {
            deleted.push(family);
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests;
