//! iptables mode: upstream kube-proxy's rule layout, applied with one
//! `iptables-restore --noflush --counters` per sync.
//!
//! On the nf_tables backend (`iptables-nft-restore`), a large full sync's nat table is sent as
//! several transactions in that one payload, ordered so that every state in between is
//! correct ([`reconcile::split`]): that tool's cost grows with commands × chains per
//! transaction, so one 10,000-Service transaction takes many minutes and the split one about
//! as long as `iptables-legacy-restore`. The legacy backend gets one transaction per table.
//!
//! [`IptablesProxier`] ties [`render`] (snapshot → rules) to [`reconcile`] (rules + kernel
//! state → restore payload) and to an [`Iptables`] runner. The first sync, any sync after a
//! failure and any sync with `full_resync_needed` are full: they read the kernel's tables
//! (`iptables-save`, line by line), rewrite every chain of ours whose contents there differ
//! from the render (leaving the others, and their counters, alone), add missing jump rules and
//! delete stale chains, writing the payload into the tool's stdin as the render goes
//! ([`reconcile::full`]); other syncs are partial and rewrite only the chains of Services that
//! changed. Full syncs also leave the empty `KUBE-PROXY-CANARY`
//! chains that [`canary`] checks between syncs, so that rules flushed by someone else are
//! rewritten at once. [`cleanup`] implements `--cleanup`.
//!
//! nfacct ([`IptablesProxier::with_nfacct`]): like upstream, every full sync first makes sure
//! the two nfacct counters exist ([`render::NFACCT_CT_STATE_INVALID_DROPPED`],
//! [`render::NFACCT_LOCALHOST_NODEPORTS_ACCEPTED`]), creating them when missing, and the
//! rules name a counter (`-m nfacct --nfacct-name`) only while it exists: a counter that
//! cannot be created (a kernel without nfacct) leaves its rule as upstream writes it on such a
//! node. Without a handle no counter is used. `--cleanup` leaves the counters, as upstream's
//! does (they hold no rules and count nothing once the rules are gone).

pub mod canary;
pub mod names;
pub mod reconcile;
pub mod render;
pub mod tree;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use kp_model::{Changes, IpFamily, Snapshot};
use kp_netfilter::{Iptables, NetfilterBackend, Table};
use kp_netlink::{ConntrackOps, NfacctOps};
use tracing::{debug, info, warn};

use crate::{Host, LocalDetector, NodePortAddresses, Proxier, ProxierError, ProxyMode, SyncReport};
use reconcile::digest::TableReader;
use reconcile::split::{self, SplitPolicy};
use reconcile::{CleanupPlan, KernelTable, KernelTables, full};
use render::{ChainSet, RenderCache, RenderConfig, Rendered};

/// Settings of iptables mode, named after kube-proxy's flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IptablesConfig {
    /// `--masquerade-all`.
    pub masquerade_all: bool,
    /// `--iptables-masquerade-bit` (0..=31, default 14): the mark is `1 << bit`.
    pub masquerade_bit: u8,
    /// `--detect-local-mode` with its CIDRs or interface.
    pub local_detector: LocalDetector,
    /// `--nodeport-addresses`.
    pub nodeport_addresses: NodePortAddresses,
    /// `--iptables-localhost-nodeports` (default true; IPv4 only).
    pub localhost_nodeports: bool,
    /// `--conntrack-tcp-be-liberal`: when set, the INVALID drop is not written.
    pub conntrack_tcp_be_liberal: bool,
}

impl Default for IptablesConfig {
    fn default() -> Self {
        IptablesConfig {
            masquerade_all: false,
            masquerade_bit: 14,
            local_detector: LocalDetector::None,
            nodeport_addresses: NodePortAddresses::all(),
            localhost_nodeports: true,
            conntrack_tcp_be_liberal: false,
        }
    }
}

/// The sysctl that lets the kernel route packets to 127.0.0.0/8 after DNAT.
const ROUTE_LOCALNET: &str = "net/ipv4/conf/all/route_localnet";

/// iptables-mode proxier for one family.
pub struct IptablesProxier<I: Iptables> {
    family: IpFamily,
    cfg: IptablesConfig,
    ipt: I,
    host: Arc<dyn Host>,
    random_fully: bool,
    needs_full: bool,
    setup_done: bool,
    /// Per-Service chains in the kernel after the last successful sync.
    previous_chains: ChainSet,
    /// Chain names and per-Service results kept across syncs (see [`RenderCache`]).
    cache: RenderCache,
    /// Start full-sync payloads with `-Z` (see [`Self::with_zero_counters_on_full_sync`]).
    zero_counters_on_full_sync: bool,
    /// Split large full syncs' nat table into several transactions (see
    /// [`Self::with_split_full_syncs`]); `None`: one transaction.
    split: Option<SplitPolicy>,
    /// The UDP stale-entry cleanup after syncs (disabled without netlink conntrack).
    conntrack: crate::conntrack::UdpCleanup,
    /// The rules the last successful restore wrote, per table.
    last_written: RuleCount,
    /// The kernel's nfacct counters, when the proxier may use them.
    nfacct: Option<Box<dyn NfacctOps + Send>>,
    /// Which counters exist, as the last full sync found them (upstream's `nfAcctCounters`).
    nfacct_counters: NfacctCounters,
    /// Whether a full sync has checked the counters yet.
    nfacct_checked: bool,
    /// How `KUBE-SERVICES` dispatches (see [`Self::with_dispatch`]).
    dispatch: tree::Dispatch,
}

/// Which of upstream's two nfacct counters the rules may name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NfacctCounters {
    /// [`render::NFACCT_CT_STATE_INVALID_DROPPED`] exists.
    pub ct_state_invalid_dropped: bool,
    /// [`render::NFACCT_LOCALHOST_NODEPORTS_ACCEPTED`] exists.
    pub localhost_nodeports_accepted: bool,
}

impl<I: Iptables> std::fmt::Debug for IptablesProxier<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IptablesProxier")
            .field("family", &self.family)
            .field("cfg", &self.cfg)
            .field("random_fully", &self.random_fully)
            .field("needs_full", &self.needs_full)
            .field("nfacct_counters", &self.nfacct_counters)
            .finish()
    }
}

impl<I: Iptables> IptablesProxier<I> {
    /// Builds a proxier. Asks the runner for the iptables version to decide whether
    /// `MASQUERADE --random-fully` is available (iptables >= 1.6.2), as upstream does, and
    /// whether full syncs are split into several nat transactions (the nf_tables backend; see
    /// [`Self::with_split_full_syncs`]).
    ///
    /// # Errors
    /// [`ProxierError::Config`] for a masquerade bit outside 0..=31.
    pub fn new(
        family: IpFamily,
        cfg: IptablesConfig,
        ipt: I,
        host: Arc<dyn Host>,
    ) -> Result<Self, ProxierError> {
        if cfg.masquerade_bit > 31 {
            return Err(ProxierError::Config(format!(
                "--iptables-masquerade-bit must be within 0..=31, got {}",
                cfg.masquerade_bit
            )));
        }
        let (random_fully, split) = match ipt.version() {
            Ok(v) => (
                v.supports_random_fully(),
                (v.backend == NetfilterBackend::NfTables).then_some(split::NFT_SPLIT),
            ),
            Err(e) => {
                warn!(error = %e, "cannot read the iptables version; not using MASQUERADE --random-fully");
                (false, None)
            }
        };
        Ok(IptablesProxier {
            family,
            cfg,
            ipt,
            host,
            random_fully,
            needs_full: true,
            setup_done: false,
            previous_chains: ChainSet::default(),
            cache: RenderCache::new(),
            zero_counters_on_full_sync: false,
            split,
            conntrack: crate::conntrack::UdpCleanup::disabled(),
            last_written: RuleCount::default(),
            nfacct: None,
            nfacct_counters: NfacctCounters::default(),
            nfacct_checked: false,
            dispatch: tree::Dispatch::Upstream,
        })
    }

    /// Uses the kernel's nfacct counters: every full sync ensures both exist and the rules
    /// count into those that do (upstream's `-m nfacct` matches; see the module docs).
    pub fn with_nfacct(mut self, ops: Box<dyn NfacctOps + Send>) -> Self {
        self.nfacct = Some(ops);
        self
    }

    /// Which nfacct counters the rules name (as of the last full sync).
    pub fn nfacct_counters(&self) -> NfacctCounters {
        self.nfacct_counters
    }

    /// Upstream's full-sync step "ensure the nfacct counters": each counter is created when
    /// missing; one that cannot be is left out of the rules, with a warning the first time
    /// and whenever a counter that worked stops working.
    fn ensure_nfacct(&mut self) {
        let Some(ops) = self.nfacct.as_mut() else {
            return;
        };
        let before = self.nfacct_counters;
        let mut now = NfacctCounters::default();
        for (name, was, flag) in [
            (
                render::NFACCT_CT_STATE_INVALID_DROPPED,
                before.ct_state_invalid_dropped,
                &mut now.ct_state_invalid_dropped,
            ),
            (
                render::NFACCT_LOCALHOST_NODEPORTS_ACCEPTED,
                before.localhost_nodeports_accepted,
                &mut now.localhost_nodeports_accepted,
            ),
        ] {
            match ops.ensure(name) {
                Ok(()) => *flag = true,
                Err(e) if was || !self.nfacct_checked => warn!(
                    family = %self.family,
                    counter = name,
                    error = %e,
                    "cannot create the nfacct counter: its rule is written without -m nfacct and its metric is not reported"
                ),
                Err(e) => {
                    debug!(family = %self.family, counter = name, error = %e, "nfacct counter still unavailable")
                }
            }
        }
        self.nfacct_checked = true;
        if now != before {
            debug!(family = %self.family, ?now, "nfacct counters in use");
        }
        self.nfacct_counters = now;
    }

    /// Chooses how nat `KUBE-SERVICES` dispatches (`--iptables-dispatch`): upstream's list
    /// (the default) or the tree of [`tree`], whose partial syncs rewrite only the dispatch
    /// chains that changed. The per-Service chains are the same in both.
    pub fn with_dispatch(mut self, dispatch: tree::Dispatch) -> Self {
        self.dispatch = dispatch;
        self
    }

    /// Enables the UDP stale-conntrack cleanup after syncs (see [`crate::conntrack`]).
    pub fn with_conntrack(mut self, ops: Box<dyn ConntrackOps + Send>) -> Self {
        self.conntrack = crate::conntrack::UdpCleanup::new(ops);
        self
    }

    /// Starts every full-sync payload with `-Z` in each table (off by default).
    ///
    /// `iptables-nft-restore` 1.8.x keeps a name-sorted linked list of every chain a restore
    /// names, so a restore costs commands × chains string compares: about 7 s at 1,000
    /// Services × 10 endpoints and over 3 minutes at 5,000. A command without a chain first
    /// turns that list off; `-Z` (zero counters) is the harmless one. With it, a full sync
    /// loads 5,000 Services in about 6–10 s and 10,000 in about 23 s. The rules written are
    /// unchanged; the packet and byte counters of every rule in the filter and nat tables,
    /// ours and other software's, are reset at each full sync (start-up, hourly, after a
    /// failure). Partial syncs are not affected.
    ///
    /// Full syncs on the nf_tables backend are split into several transactions by default
    /// ([`Self::with_split_full_syncs`]), which loads 10,000 Services in about the time of
    /// `iptables-legacy-restore` without touching counters; with this option set the payload
    /// is sent whole, with `-Z`, as before.
    pub fn with_zero_counters_on_full_sync(mut self, on: bool) -> Self {
        self.zero_counters_on_full_sync = on;
        self
    }

    /// How full syncs cut the nat table into transactions: `Some(policy)` splits a nat block
    /// longer than `policy.min_lines` as [`reconcile::split`] describes, `None` sends one
    /// transaction per table. The default, chosen in [`Self::new`] from
    /// `iptables --version`, is [`split::NFT_SPLIT`] on the nf_tables backend and `None` on
    /// the legacy one (whose restore replaces the whole table per commit, so more commits
    /// would only cost more). Partial syncs and `-Z` payloads are never split.
    pub fn with_split_full_syncs(mut self, policy: Option<SplitPolicy>) -> Self {
        self.split = policy;
        self
    }

    /// The runner (for tests and dry runs that inspect it).
    pub fn runner(&self) -> &I {
        &self.ipt
    }

    fn localhost_nodeports(&self, node_ips: &[IpAddr]) -> bool {
        self.family == IpFamily::V4
            && self.cfg.localhost_nodeports
            && self
                .cfg
                .nodeport_addresses
                .contains_loopback(IpFamily::V4, node_ips)
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
            random_fully: self.random_fully,
            localhost_nodeports: self.localhost_nodeports(&snap.node_ips),
            nodeport_ips,
            drop_invalid: !self.cfg.conntrack_tcp_be_liberal,
            kube_firewall: self.family == IpFamily::V4,
            nfacct_invalid_drop: self.nfacct_counters.ct_state_invalid_dropped,
            nfacct_localhost_nodeports: self.nfacct_counters.localhost_nodeports_accepted,
            dispatch: self.dispatch,
        })
    }

    /// Renders the whole ruleset for `snap` (no kernel access besides local addresses).
    ///
    /// # Errors
    /// As [`render_config`](Self::render_config).
    pub fn render_full(&self, snap: &Snapshot) -> Result<Rendered, ProxierError> {
        Ok(render::render(snap, &self.render_config(snap)?, None))
    }

    fn setup(&mut self, snap: &Snapshot) {
        if self.setup_done {
            return;
        }
        self.setup_done = true;
        if self.localhost_nodeports(&snap.node_ips) {
            match self.host.set_sysctl(ROUTE_LOCALNET, "1") {
                Ok(()) => debug!("set {ROUTE_LOCALNET}=1 for localhost NodePorts"),
                Err(e) => {
                    warn!(error = %e, "cannot set {ROUTE_LOCALNET}=1: NodePorts on 127.0.0.1 will not work")
                }
            }
        }
    }

    /// Runs the restore of a full sync: `plan`'s payload, written by a [`full::Writer`] into
    /// the tool's stdin during a second [`render::Stream::Emit`] pass, a Service at a time.
    /// Returns the bytes and the nat transactions written.
    fn restore_full(
        &mut self,
        snap: &Snapshot,
        cfg: &RenderConfig,
        rendered: &Rendered,
        plan: &full::FullSync,
        kernel: &KernelTables,
    ) -> Result<(usize, usize), ProxierError> {
        if plan.is_empty() {
            // Every chain is as rendered, no jump is missing, nothing is stale, every canary
            // is there: nothing to write, and the tool is not run.
            self.last_written = RuleCount::default();
            return Ok((0, 0));
        }
        let cache = &mut self.cache;
        let mut written = (0, 0);
        let mut rules = RuleCount::default();
        self.ipt.restore_with(&mut |w| {
            let mut counted = RuleCounter::new(w);
            let mut out = full::Writer::new(plan, rendered, Some(kernel), &mut counted);
            out.start();
            render::render_streamed(
                snap,
                cfg,
                cache,
                render::Stream::Emit(&mut |s| out.service(s)),
            );
            written = out.finish()?;
            rules = counted.count();
            Ok(())
        })?;
        self.last_written = rules;
        Ok(written)
    }

    /// Reads the filter, nat and mangle tables for a full sync: one `iptables-save` of every
    /// table (`iptables-nft-save` reads the whole ruleset from the kernel whichever table it
    /// prints, so one call costs what `-t nat` alone does), read line by line from the tool's
    /// stdout ([`Iptables::save_with`]) into the rules of the built-in chains and the digests
    /// of our chains ([`TableReader`]); the dump (30 MB for the nat table at 10,000 Services)
    /// is never held. Other tables are skipped.
    fn read_kernel(&self) -> Result<KernelTables, ProxierError> {
        let mut readers = [
            TableReader::new(Table::Filter),
            TableReader::new(Table::Nat),
            TableReader::new(Table::Mangle),
        ];
        let mut current: Option<usize> = None;
        self.ipt.save_with(None, &mut |r| {
            let mut line = Vec::with_capacity(256);
            loop {
                line.clear();
                if r.read_until(b'\n', &mut line)? == 0 {
                    return Ok(());
                }
                let text = String::from_utf8_lossy(&line);
                let text = text.trim_end_matches('\n');
                if let Some(name) = text.strip_prefix('*') {
                    current = match Table::from_name(name.trim()) {
                        Some(Table::Filter) => Some(0),
                        Some(Table::Nat) => Some(1),
                        Some(Table::Mangle) => Some(2),
                        _ => None,
                    };
                }
                if let Some(i) = current {
                    readers[i].line(text);
                }
                if text == "COMMIT" {
                    current = None;
                }
            }
        })?;
        let [filter, nat, mangle] = readers;
        Ok(KernelTables {
            filter: filter.finish()?,
            nat: nat.finish()?,
            mangle: mangle.finish()?,
        })
    }
}

/// Built-in chains of the filter and nat tables: the only chains whose rules a full sync
/// looks at (for the jump rules into ours).
fn is_builtin_chain(chain: &str) -> bool {
    matches!(
        chain,
        "PREROUTING" | "INPUT" | "FORWARD" | "OUTPUT" | "POSTROUTING"
    )
}

/// Like [`kernel_table`], for a full sync of the modes that keep no digests (IPVS and
/// userspace mode): every chain name, but only the rules of the built-in chains (what
/// [`reconcile::full_payload`] compares jump rules against). The rules
/// of other chains, 400k lines at 10,000 Services, are skipped without parsing; the
/// remaining text goes through the same typed parser.
///
/// # Errors
/// [`ProxierError::ReadState`] when the text does not parse.
pub fn kernel_table_for_sync(text: &str, table: Table) -> Result<KernelTable, ProxierError> {
    let mut reduced = String::with_capacity(4096);
    let mut chains = std::collections::BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("-A ") {
            let chain = rest.split(' ').next().unwrap_or_default();
            if !is_builtin_chain(chain) {
                continue;
            }
        } else if let Some(rest) = line.strip_prefix(':') {
            let chain = rest.split(' ').next().unwrap_or_default();
            if !is_builtin_chain(chain) {
                chains.insert(chain.to_string());
                continue;
            }
        }
        reduced.push_str(line);
        reduced.push('\n');
    }
    let mut out = kernel_table(&reduced, table)?;
    out.chains.append(&mut chains);
    Ok(out)
}

/// Parses `iptables-save` output and extracts one table.
///
/// # Errors
/// [`ProxierError::ReadState`] when the text does not parse.
pub fn kernel_table(text: &str, table: Table) -> Result<KernelTable, ProxierError> {
    let ruleset = kp_netfilter::parse_save(text).map_err(|e| ProxierError::ReadState {
        what: format!("{} table", table.name()),
        message: e.to_string(),
    })?;
    let mut out = KernelTable::default();
    if let Some(t) = ruleset.tables.get(&table) {
        for (name, chain) in t.ordered_chains() {
            out.chains.insert(name.to_string());
            for rule in &chain.rules {
                let mut line = rule.clone();
                line.counters = None;
                out.rules.push((
                    name.to_string(),
                    line.to_string(),
                    rule.jump_chain().map(str::to_string),
                ));
            }
        }
    }
    Ok(out)
}

impl<I: Iptables> IptablesProxier<I> {}

impl<I: Iptables> Proxier for IptablesProxier<I> {
    fn mode(&self) -> ProxyMode {
        ProxyMode::Iptables
    }

    fn family(&self) -> IpFamily {
        self.family
    }

    fn sync(&mut self, snap: &Snapshot, changes: &Changes) -> Result<SyncReport, ProxierError> {
        self.setup(snap);
        let full = self.needs_full || changes.full_resync_needed;
        // Until this sync succeeds, the next one must be full.
        self.needs_full = true;
        let t1 = Instant::now();
        let mut kernel = if full {
            Some(self.read_kernel()?)
        } else {
            None
        };
        if full {
            self.ensure_nfacct();
        }
        let read_time = t1.elapsed();
        let t0 = Instant::now();
        let cfg = self.render_config(snap)?;
        let (rendered, render_time, payload_bytes, stale, nat_transactions, kept_chains, t1) =
            if let Some(kernel) = kernel.as_mut() {
                // A full sync compares every chain with the kernel and writes the payload into
                // the tool's stdin while the render goes (see `reconcile::full`); its payload
                // (30 MB at 10,000 Services on a fresh node) is never held whole.
                let opts = full::Options {
                    zero_counters: self.zero_counters_on_full_sync,
                    split: self.split,
                };
                let mut measure = full::Measure::new(Some(&mut kernel.nat.ours));
                let rendered = render::render_streamed(
                    snap,
                    &cfg,
                    &mut self.cache,
                    render::Stream::Measure(&mut |s| measure.service(s)),
                );
                let measured = measure.finish();
                let plan = full::plan(&rendered, Some(kernel), &measured, &opts);
                if let Some(why) = &plan.unsplit {
                    debug!(%why, "full sync sent as one nat transaction");
                }
                let render_time = t0.elapsed();
                let t1 = Instant::now();
                let (bytes, nat_transactions) =
                    self.restore_full(snap, &cfg, &rendered, &plan, kernel)?;
                let kept = plan.kept_chains;
                (
                    rendered,
                    render_time,
                    bytes,
                    plan.stale,
                    nat_transactions,
                    kept,
                    t1,
                )
            } else {
                let rendered =
                    render::render_cached(snap, &cfg, Some(&changes.services), &mut self.cache);
                let render_time = t0.elapsed();
                let t1 = Instant::now();
                let (payload, stale) = reconcile::partial_payload(&rendered, &self.previous_chains);
                self.ipt.restore(payload.as_bytes())?;
                self.last_written = RuleCount::of(payload.as_bytes());
                (rendered, render_time, payload.len(), stale, 1, 0, t1)
            };
        drop(kernel);
        let apply_time = t1.elapsed() + read_time;
        self.needs_full = false;
        self.previous_chains = rendered.active_nat_chains;
        let conntrack = self.conntrack.after_sync(snap, changes, full);
        let report = SyncReport {
            family: Some(self.family),
            full,
            service_ports: rendered.service_ports,
            endpoints: rendered.endpoints,
            payload_bytes,
            filter_rules: rendered.filter.rule_count,
            nat_rules: rendered.nat_rules_total,
            deleted_chains: stale.len(),
            render_time,
            apply_time,
            conntrack_deleted: conntrack.deleted,
            conntrack_time: conntrack.duration,
            filter_rules_written: self.last_written.filter,
            nat_rules_written: self.last_written.nat,
        };
        info!(
            family = %self.family,
            full,
            services = report.service_ports,
            endpoints = report.endpoints,
            bytes = report.payload_bytes,
            deleted_chains = report.deleted_chains,
            kept_chains,
            nat_transactions,
            render_ms = %format!("{:.3}", render_time.as_secs_f64() * 1e3),
            apply_ms = %format!("{:.3}", apply_time.as_secs_f64() * 1e3),
            "synced iptables rules"
        );
        Ok(report)
    }

    /// Lists `KUBE-PROXY-CANARY` in mangle, nat and filter (three `iptables -S` of one empty
    /// chain; see [`canary`]). Nothing is checked before the first successful sync or while
    /// the next sync is full anyway.
    fn check_dataplane(&mut self) -> Result<bool, ProxierError> {
        if self.needs_full {
            return Ok(false);
        }
        let missing = canary::check(&self.ipt, self.family)?;
        self.needs_full |= missing;
        Ok(missing)
    }
}

/// `--cleanup` for iptables mode: removes our jump rules and chains from the filter and nat
/// tables of the runner's family, and the canary from its mangle table, leaving everything
/// else alone (see [`reconcile::cleanup_payload`]).
///
/// The tables are read with one `iptables-save` of every table, and only tables that exist
/// are written to: a legacy table named in `iptables-legacy-save -t TABLE` or in a restore
/// would be created by the kernel, and every `iptables-nft-save` of an nf_tables node would
/// then warn that legacy tables are present.
///
/// # Errors
/// [`ProxierError`] when the tables cannot be read or the restore fails (nothing changes).
pub fn cleanup<I: Iptables + ?Sized>(ipt: &I) -> Result<CleanupPlan, ProxierError> {
    cleanup_with(ipt, reconcile::CleanupScope::Everything)
}

/// The cleanup of the backend a node does not use (`--iptables-backend`): what
/// [`cleanup`] removes (every mode's chains, the jumps to them and the canaries, from the
/// tables that exist), except `KUBE-FIREWALL`, which is kubelet's on nodes whose kubelet
/// writes it ([`reconcile::CleanupScope::OtherBackend`]). kubelet's own chains
/// (`KUBE-IPTABLES-HINT`, `KUBE-KUBELET-CANARY`, `KUBE-MARK-DROP`, ...) and every other
/// program's rules are never touched, as in [`cleanup`].
///
/// # Errors
/// As [`cleanup`].
pub fn cleanup_other_backend<I: Iptables + ?Sized>(ipt: &I) -> Result<CleanupPlan, ProxierError> {
    cleanup_with(ipt, reconcile::CleanupScope::OtherBackend)
}

/// What stays of IPVS mode in the iptables rules once iptables mode has written its own
/// (a node switched from IPVS mode, after iptables mode's first full sync): the chains only
/// IPVS mode has and its jumps that iptables mode does not write
/// ([`reconcile::CleanupScope::IpvsOnly`]). The chains both modes use are iptables mode's by
/// then and stay, as do its jumps and canaries. Run it before IPVS mode's ipsets are
/// destroyed: its rules reference them.
///
/// # Errors
/// As [`cleanup`].
pub fn cleanup_ipvs_leftovers<I: Iptables + ?Sized>(ipt: &I) -> Result<CleanupPlan, ProxierError> {
    cleanup_with(ipt, reconcile::CleanupScope::IpvsOnly)
}

fn cleanup_with<I: Iptables + ?Sized>(
    ipt: &I,
    scope: reconcile::CleanupScope,
) -> Result<CleanupPlan, ProxierError> {
    let dump = ipt.save(None)?;
    let tables = kp_netfilter::save_tables(&dump);
    let text_of = |table: Table| {
        tables
            .iter()
            .find(|(name, _)| *name == table.name())
            .map(|(_, text)| *text)
    };
    let read = |table: Table| match text_of(table) {
        Some(text) => kernel_table(text, table),
        None => Ok(KernelTable::default()),
    };
    let kernel = KernelTables {
        filter: read(Table::Filter)?,
        nat: read(Table::Nat)?,
        ..KernelTables::default()
    };
    let mut plan = reconcile::cleanup_payload_in(&kernel, scope);
    let canary_in_mangle = text_of(Table::Mangle).is_some_and(|text| {
        text.lines().any(|l| {
            l.strip_prefix(':')
                .and_then(|r| r.split(' ').next())
                .is_some_and(|c| c == canary::KUBE_PROXY_CANARY)
        })
    });
    if canary_in_mangle && scope != reconcile::CleanupScope::IpvsOnly {
        plan.payload
            .get_or_insert_with(String::new)
            .push_str(&canary::mangle_cleanup_block());
        plan.removed
            .push(format!("mangle/{}", canary::KUBE_PROXY_CANARY));
    }
    if let Some(payload) = &plan.payload {
        ipt.restore(payload.as_bytes())?;
    }
    Ok(plan)
}

/// How much of a payload line [`RuleCounter`] looks at: enough for `-A POSTROUTING ` and
/// `*filter`.
const HEAD: usize = 24;

/// Rules (`-A` lines of kube-proxy's own chains, not the jumps from the built-in chains) in
/// an `iptables-restore` payload, per table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuleCount {
    /// In `*filter` blocks.
    pub filter: usize,
    /// In `*nat` blocks.
    pub nat: usize,
}

impl RuleCount {
    /// Counts the rules of a whole payload.
    pub fn of(payload: &[u8]) -> RuleCount {
        let mut counter = RuleCounter::new(std::io::sink());
        // Writing into a sink cannot fail.
        let _ = std::io::Write::write_all(&mut counter, payload);
        counter.count()
    }
}

/// A writer that passes a restore payload through and counts its rules per table as it goes
/// (upstream's `kubeproxy_sync_proxy_rules_iptables_last` counts the rule lines a sync wrote;
/// the full sync's payload is streamed, never held, so it is counted on its way).
struct RuleCounter<W: std::io::Write> {
    inner: W,
    /// The table of the current block (`*filter`, `*nat`, another).
    table: Option<Table>,
    /// The start of the current line (enough to tell `-A CHAIN ` and `*table` apart).
    head: Vec<u8>,
    count: RuleCount,
}

impl<W: std::io::Write> RuleCounter<W> {
    fn new(inner: W) -> Self {
        RuleCounter {
            inner,
            table: None,
            head: Vec::with_capacity(HEAD),
            count: RuleCount::default(),
        }
    }

    fn count(&self) -> RuleCount {
        self.count
    }

    fn end_line(&mut self) {
        let head = &self.head;
        if let Some(name) = head.strip_prefix(b"*") {
            self.table = std::str::from_utf8(name)
                .ok()
                .and_then(|n| Table::from_name(n.trim()));
        } else if let Some(rule) = head.strip_prefix(b"-A ") {
            // Upstream counts the rules of its own chains: the jumps from the built-in chains
            // are not in its restore (it ensures them apart), so they are not counted here.
            let chain = rule.split(|&b| b == b' ').next().unwrap_or_default();
            if is_builtin_chain(&String::from_utf8_lossy(chain)) {
                self.head.clear();
                return;
            }
            match self.table {
                Some(Table::Filter) => self.count.filter += 1,
                Some(Table::Nat) => self.count.nat += 1,
                _ => {}
            }
        }
        self.head.clear();
    }
}

impl<W: std::io::Write> std::io::Write for RuleCounter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        for &b in &buf[..n] {
            if b == b'\n' {
                self.end_line();
            } else if self.head.len() < HEAD {
                self.head.push(b);
            }
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests;
