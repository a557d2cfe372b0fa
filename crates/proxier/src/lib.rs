//! kp-proxier: the proxy modes.
//!
//! A [`Proxier`] programs one IP family of the node from a [`Snapshot`](kp_model::Snapshot):
//! it *renders* the desired rules (a pure function, golden-tested) and *reconciles* them with
//! the kernel in one atomic transaction per sync. Each mode lives in its own module with the
//! same file set (`names.rs`, `render.rs`, `reconcile.rs`); today: [`iptables`],
//! [`nftables`], [`ipvs`] and [`userspace`] (whose data path is the `kp-relay` crate).
//!
//! Between syncs [`Proxier::check_dataplane`] looks cheaply for signs that someone flushed
//! the rules (the `KUBE-PROXY-CANARY` chains of [`iptables::canary`]), so that the caller can
//! repair them with a full sync at once.
//!
//! Shared pieces: [`conntrack`] (UDP stale-entry cleanup after a sync), [`LocalDetector`] (`--detect-local-mode`), [`NodePortAddresses`]
//! (`--nodeport-addresses`) and the [`Host`] seam (local addresses, sysctls).

pub mod conntrack;
pub mod host;
pub mod iptables;
pub mod ipvs;
pub mod local;
pub mod nftables;
pub mod nodeport;
pub mod userspace;

pub use host::{FakeHost, Host, RealHost};
pub use local::{LocalDetector, LocalMatch};
pub use nodeport::{BadNodePortAddress, NodePortAddresses};

use std::time::Duration;

pub use kp_model::ProxyMode;

/// A [`std::fmt::Write`] over an [`std::io::Write`] (a kernel tool's stdin), for payloads
/// rendered as text straight into the tool: it keeps the first I/O error (every later write
/// fails at once, so the render runs on without writing) and counts the bytes written.
pub(crate) struct IoText<'a> {
    inner: &'a mut dyn std::io::Write,
    error: Option<std::io::Error>,
    bytes: usize,
}

impl<'a> IoText<'a> {
    /// Writes into `inner`.
    pub(crate) fn new(inner: &'a mut dyn std::io::Write) -> Self {
        IoText {
            inner,
            error: None,
            bytes: 0,
        }
    }

    /// The bytes written, or the first error.
    pub(crate) fn finish(self) -> std::io::Result<usize> {
        match self.error {
            Some(e) => Err(e),
            None => Ok(self.bytes),
        }
    }
}

impl std::fmt::Write for IoText<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        if self.error.is_some() {
            return Err(std::fmt::Error);
        }
        match self.inner.write_all(s.as_bytes()) {
            Ok(()) => {
                self.bytes += s.len();
                Ok(())
            }
            Err(e) => {
                self.error = Some(e);
                Err(std::fmt::Error)
            }
        }
    }
}

use kp_model::{Changes, IpFamily, Snapshot};

/// Errors of a sync or cleanup. A failed sync leaves the kernel as it was (the restore is
/// all-or-nothing) and the next sync is a full one.
#[derive(Debug, thiserror::Error)]
pub enum ProxierError {
    /// The kernel update command failed; carries the command, exit status and stderr.
    #[error("{0}")]
    Netfilter(#[from] kp_netfilter::Error),
    /// The kernel's current rules could not be read or understood.
    #[error("cannot read the current {what}: {message}")]
    ReadState {
        /// What was being read (e.g. `nat table`).
        what: String,
        /// Why it failed.
        message: String,
    },
    /// A host facility (sysctl, interface addresses) failed.
    #[error("{what}: {source}")]
    Host {
        /// What was being done.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Invalid configuration (detected when the proxier is built).
    #[error("invalid configuration: {0}")]
    Config(String),
}

/// What one sync did, for logs, metrics and benchmarks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// The family synced.
    pub family: Option<IpFamily>,
    /// A full sync (the kernel read, every chain that differs from the render rewritten)
    /// rather than a partial one.
    pub full: bool,
    /// ServicePortNames in the snapshot.
    pub service_ports: usize,
    /// Endpoints in the snapshot.
    pub endpoints: usize,
    /// Bytes sent to the kernel tool.
    pub payload_bytes: usize,
    /// Rules in the filter table after the sync (ours).
    pub filter_rules: usize,
    /// Rules in the nat table after the sync (ours).
    pub nat_rules: usize,
    /// Stale chains deleted.
    pub deleted_chains: usize,
    /// Time spent rendering.
    pub render_time: Duration,
    /// Time spent in the kernel tool (reading state and applying).
    pub apply_time: Duration,
    /// Stale UDP conntrack entries deleted after the sync.
    pub conntrack_deleted: usize,
    /// How long the UDP conntrack reconciliation after the sync took (upstream's
    /// `kubeproxy_conntrack_reconciler_sync_duration_seconds`); `None` when it did not run
    /// (no netlink conntrack access, or a partial sync that changed no UDP Service).
    pub conntrack_time: Option<Duration>,
    /// Rules (`-A` lines of our chains) of the filter table that this sync sent to `iptables-restore`
    /// (upstream's `kubeproxy_sync_proxy_rules_iptables_last{table="filter"}`); in iptables
    /// mode only, 0 in the other modes.
    pub filter_rules_written: usize,
    /// Rules (`-A` lines of our chains) of the nat table that this sync sent: a partial sync writes only
    /// the chains of the changed Services (and the top-level chains), a full sync only the
    /// chains that differ from the kernel's (upstream's
    /// `kubeproxy_sync_proxy_rules_iptables_last{table="nat"}`); in iptables mode only.
    pub nat_rules_written: usize,
}

/// A proxy mode for one IP family.
pub trait Proxier: Send {
    /// The mode.
    fn mode(&self) -> ProxyMode;

    /// The family this proxier programs.
    fn family(&self) -> IpFamily;

    /// Programs the kernel so it matches `snapshot`. `changes` lists the Services that changed
    /// since the previous successful sync; with `changes.full_resync_needed` (or after any
    /// failure, or on the first sync) everything is rewritten.
    ///
    /// # Errors
    /// [`ProxierError`]; the kernel keeps its previous rules, the next sync is full.
    fn sync(&mut self, snapshot: &Snapshot, changes: &Changes) -> Result<SyncReport, ProxierError>;

    /// Checks cheaply, between syncs, whether something else removed what the last sync
    /// wrote (an operator's `iptables -t nat -F; iptables -t nat -X`, a firewall reload, an
    /// `nft delete table`): iptables, IPVS and userspace modes look for their empty
    /// `KUBE-PROXY-CANARY` chains in the mangle, nat and filter tables, nftables mode for
    /// its table and the rule of one base chain. `Ok(true)` means something is missing: the
    /// proxier has logged a warning and its next sync is full; the caller should run it at
    /// once. `Ok(false)` also when there is nothing to check yet (before the first
    /// successful sync, or while a full retry is pending). The default checks nothing.
    ///
    /// # Errors
    /// [`ProxierError`] when the check itself could not run (a busy lock, a missing binary);
    /// nothing is known to be missing then.
    fn check_dataplane(&mut self) -> Result<bool, ProxierError> {
        Ok(false)
    }
}
