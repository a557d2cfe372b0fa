//! Taking a node over from another proxy mode (or the other iptables backend) without a moment
//! with neither ruleset.
//!
//! A node switched from iptables to nftables mode (or any other pair) holds the old mode's
//! rules when the new one starts. Removing them first and then writing the new ones left the
//! node without Service rules for as long as the new mode's start and first sync took (0.6 s
//! at 5,000 Services from iptables to nftables mode, the list from the API server not
//! counted). So the order is the other way round: the new mode writes its rules first, every
//! family of them, and only once each family's first sync has succeeded are the other modes'
//! leftovers removed ([`Takeover`]; the removal itself is `crate::proxy`'s
//! `remove_other_backend` and `remove_other_mode`). A first sync that keeps failing keeps the
//! old rules, which still forward traffic, rather than leaving nothing.
//!
//! For that moment both rulesets are in the kernel, and they agree: each DNATs a Service's
//! traffic to the same endpoints, and whichever NAT hook sees a connection's first packet
//! first sets up its translation (the kernel runs no second NAT rule for a connection that has
//! one), so it does not matter which. iptables mode and IPVS mode share chain names; IPVS
//! mode's first sync removes iptables mode's own chains in the same restore that writes its
//! own, and iptables mode's first sync rewrites the shared chains, after which only IPVS
//! mode's own chains, jumps, ipsets, virtual servers and kube-ipvs0 are removed
//! ([`kp_proxier::iptables::cleanup_ipvs_leftovers`]). IPVS mode's Service addresses on
//! kube-ipvs0 are harmless meanwhile: the other modes DNAT a Service's packets before routing
//! decides they are local.
//!
//! The removal runs once, on a blocking thread, while no sync runs: every proxier is wrapped in
//! [`Guarded`], whose syncs share a lock the removal takes alone, so the new mode's rules and
//! the removal never race in the kernel.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, RwLock};

use kp_model::{Changes, IpFamily, Node, Snapshot};
use kp_proxier::{Proxier, ProxierError, ProxyMode, SyncReport};
use kp_runtime::SyncObserver;
use tokio::sync::watch;

/// Waits for the first successful sync of every family, and keeps syncs and the removal of
/// the other modes' leftovers apart.
#[derive(Debug)]
pub struct Takeover {
    /// The families whose first sync has not succeeded yet.
    pending: Mutex<BTreeSet<IpFamily>>,
    /// Becomes `true` once `pending` is empty.
    synced: watch::Sender<bool>,
    /// Held shared by syncs, alone by the removal.
    kernel: Arc<RwLock<()>>,
}

impl Takeover {
    /// A takeover once each of `families` has synced.
    pub fn new(families: &[IpFamily]) -> Arc<Takeover> {
        let (synced, _) = watch::channel(families.is_empty());
        Arc::new(Takeover {
            pending: Mutex::new(families.iter().copied().collect()),
            synced,
            kernel: Arc::new(RwLock::new(())),
        })
    }

    /// Whether every family's first sync has succeeded.
    pub fn all_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Resolves once every family's first sync has succeeded.
    pub async fn wait_all_synced(&self) {
        let mut rx = self.synced.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// `proxier`, whose syncs and checks never run while the removal does.
    pub fn guard<P: Proxier>(&self, proxier: P) -> Guarded<P> {
        Guarded {
            inner: proxier,
            kernel: self.kernel.clone(),
        }
    }

    /// `inner`, which also tells this takeover about successful syncs.
    pub fn observer(self: &Arc<Self>, inner: Arc<dyn SyncObserver>) -> Arc<dyn SyncObserver> {
        Arc::new(Observer {
            inner,
            takeover: self.clone(),
        })
    }

    /// Runs `removal` (blocking) with no sync running.
    pub fn exclusively<T>(&self, removal: impl FnOnce() -> T) -> T {
        let _alone = self.kernel.write().unwrap_or_else(|e| e.into_inner());
        removal()
    }

    fn synced_once(&self, family: IpFamily) {
        let Ok(mut pending) = self.pending.lock() else {
            return;
        };
        if pending.remove(&family) && pending.is_empty() {
            self.synced.send_replace(true);
        }
    }
}

/// A proxier whose [`Proxier::sync`] and [`Proxier::check_dataplane`] hold the takeover's lock
/// shared (families still sync at the same time; the removal waits for them, and they for it).
pub struct Guarded<P> {
    inner: P,
    kernel: Arc<RwLock<()>>,
}

impl<P: Proxier> Proxier for Guarded<P> {
    fn mode(&self) -> ProxyMode {
        self.inner.mode()
    }
    fn family(&self) -> IpFamily {
        self.inner.family()
    }
    fn sync(&mut self, snapshot: &Snapshot, changes: &Changes) -> Result<SyncReport, ProxierError> {
        let _shared = self.kernel.read().unwrap_or_else(|e| e.into_inner());
        self.inner.sync(snapshot, changes)
    }
    fn check_dataplane(&mut self) -> Result<bool, ProxierError> {
        let _shared = self.kernel.read().unwrap_or_else(|e| e.into_inner());
        self.inner.check_dataplane()
    }
}

/// Passes everything on to the daemon's observer, and successful syncs to the takeover.
struct Observer {
    inner: Arc<dyn SyncObserver>,
    takeover: Arc<Takeover>,
}

impl SyncObserver for Observer {
    fn started(&self, family: IpFamily) {
        self.inner.started(family);
    }
    fn queued(&self, family: IpFamily, pending: kp_runtime::PendingChanges) {
        self.inner.queued(family, pending);
    }
    fn received(&self, family: IpFamily, services: u64, endpoint_slices: u64) {
        self.inner.received(family, services, endpoint_slices);
    }
    fn node_changed(&self, family: IpFamily, node: Option<&Node>) {
        self.inner.node_changed(family, node);
    }
    fn synced(
        &self,
        family: IpFamily,
        result: &Result<SyncReport, ProxierError>,
        duration: std::time::Duration,
        snapshot: &Snapshot,
        changes: &Changes,
        node: Option<&Node>,
    ) {
        self.inner
            .synced(family, result, duration, snapshot, changes, node);
        if result.is_ok() {
            self.takeover.synced_once(family);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Result<SyncReport, ProxierError> {
        Ok(SyncReport::default())
    }

    #[test]
    fn ready_once_every_family_synced_successfully() {
        let t = Takeover::new(&[IpFamily::V4, IpFamily::V6]);
        let o = t.observer(Arc::new(kp_runtime::NoObserver));
        let snap = Snapshot::empty(IpFamily::V4, "n");
        let changes = Changes::default();
        let d = std::time::Duration::ZERO;
        o.synced(IpFamily::V4, &report(), d, &snap, &changes, None);
        assert!(!t.all_synced(), "IPv6 has not synced");
        let failed = Err(ProxierError::Config("x".into()));
        o.synced(IpFamily::V6, &failed, d, &snap, &changes, None);
        assert!(!t.all_synced(), "a failed sync does not count");
        o.synced(IpFamily::V6, &report(), d, &snap, &changes, None);
        assert!(t.all_synced());
    }
}
