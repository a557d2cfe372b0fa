//! kp-runtime: the sync loop between sources, the tracker and a proxier.
//!
//! [`SyncLoop`] receives batches of [`SourceEvent`]s, applies them to a
//! [`Tracker`], and runs the proxier with upstream kube-proxy's bounded-frequency semantics:
//!
//! - nothing is synced before Services and EndpointSlices have delivered their initial list;
//! - a burst of changes is coalesced into one sync, and two syncs are at least
//!   `min_interval` apart (`--iptables-min-sync-period`, default 1 s), measured from the end
//!   of one sync to the start of the next;
//! - after a failed sync the next one is attempted `retry_interval` later
//!   (`--iptables-sync-period`, default 30 s) and is a full sync;
//! - at least every `full_interval` (1 h, upstream's `FullSyncPeriod`) everything is
//!   rewritten even when nothing changed;
//! - every `check_interval` (`--iptables-sync-period`, or `--ipvs-sync-period` in IPVS
//!   mode) after the first successful sync, [`Proxier::check_dataplane`] looks cheaply for
//!   rules removed by someone else (upstream's `KUBE-PROXY-CANARY` chains); when something is
//!   missing a full sync runs at once instead of at the next change or the hourly sync.
//!
//! Shutdown takes effect between syncs: a sync in flight runs on a blocking thread and is never
//! abandoned half-way by the loop. [`Activity`] says what a loop is busy with, so the daemon can
//! say what it waits for and bound that wait (kube-proxy-rs/src/shutdown.rs).
//!
//! Time comes from tokio, so tests run with paused time.

use std::time::Duration;

use kp_model::{Changes, IpFamily, Node, Snapshot, SourceEvent};
use kp_proxier::{Proxier, ProxierError, SyncReport};
pub use kp_track::PendingChanges;
use kp_track::Tracker;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

/// Timing of the sync loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunnerConfig {
    /// Minimum time between the end of one sync and the start of the next.
    pub min_interval: Duration,
    /// Delay before retrying after a failed sync.
    pub retry_interval: Duration,
    /// Maximum time between full syncs.
    pub full_interval: Duration,
    /// Time between two [`Proxier::check_dataplane`] calls (upstream checks its canaries
    /// every sync period); zero turns the checks off. No check runs before the first
    /// successful sync, nor while the retry of a failed sync is pending (it is full anyway).
    pub check_interval: Duration,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        RunnerConfig {
            min_interval: Duration::from_secs(1),
            retry_interval: Duration::from_secs(30),
            full_interval: Duration::from_secs(3600),
            check_interval: Duration::from_secs(30),
        }
    }
}

/// Errors that end the loop.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// `--once`: the single sync failed.
    #[error("sync failed: {0}")]
    SyncFailed(#[source] ProxierError),
    /// The source stopped before delivering its initial list.
    #[error("the source ended before delivering its initial list of Services and EndpointSlices")]
    SourceEndedEarly,
    /// The sync task panicked or was cancelled.
    #[error("the sync task failed: {0}")]
    Task(String),
}

/// Whether the loop keeps running or stops after the first sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunMode {
    /// Keep running until shutdown.
    Daemon,
    /// Sync once (after the initial list) and return (`--once`).
    Once,
}

/// Counters of a finished loop, for tests and logs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoopStats {
    /// Successful syncs.
    pub syncs: u64,
    /// Failed syncs.
    pub failures: u64,
    /// Successful full syncs.
    pub full_syncs: u64,
    /// [`Proxier::check_dataplane`] calls that ran (whatever their result).
    pub checks: u64,
    /// Checks that found rules missing (each followed at once by a full sync).
    pub repairs: u64,
    /// The last successful sync's report.
    pub last_report: Option<SyncReport>,
}

/// What a sync loop tells the rest of the process (health, metrics, health-check servers).
/// Every method has an empty default; implementations must be cheap and must not block.
pub trait SyncObserver: Send + Sync {
    /// The loop started; upstream's health server counts a family as updated at start-up.
    fn started(&self, _family: IpFamily) {}

    /// Changes are waiting for the next sync; `pending` counts the Services they concern.
    fn queued(&self, _family: IpFamily, _pending: PendingChanges) {}

    /// A batch of source events changed `services` Service objects and `endpoint_slices`
    /// EndpointSlices (events that changed nothing are not counted), for upstream's
    /// `…service_changes_total` and `…endpoint_changes_total` counters.
    fn received(&self, _family: IpFamily, _services: u64, _endpoint_slices: u64) {}

    /// A batch of source events carried this node's Node object (added, changed or deleted),
    /// whether or not it needs a sync: `node` is the Node now known (`None` once it is
    /// deleted). Upstream's `NodeEligibleHandler` updates the health server's eligibility on
    /// every Node event, not at the next sync, so that `/healthz` fails as soon as the Node is
    /// being deleted or tainted `ToBeDeletedByClusterAutoscaler` (on a quiet cluster the next
    /// sync can be an hour away).
    fn node_changed(&self, _family: IpFamily, _node: Option<&Node>) {}

    /// A sync finished, successfully or not, after `duration`. `snapshot` and `changes` are
    /// what it was asked to program; `node` is this node's Node object, if known.
    fn synced(
        &self,
        _family: IpFamily,
        _result: &Result<SyncReport, ProxierError>,
        _duration: Duration,
        _snapshot: &Snapshot,
        _changes: &Changes,
        _node: Option<&Node>,
    ) {
    }
}

/// What a sync loop is busy with right now ([`Activity`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Busy {
    /// The loop's IP family.
    pub family: IpFamily,
    /// What it runs.
    pub work: Work,
    /// Since when (monotonic).
    pub since: std::time::Instant,
}

/// The kinds of work a sync loop does on a blocking thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// A sync that rewrites everything: the first one, a retry after a failure, a repair, the
    /// periodic one, or one the changes asked for.
    FullSync,
    /// A sync of the changed Services only (the proxier may still decide on a full one).
    Sync,
    /// A [`Proxier::check_dataplane`] call.
    Check,
}

impl std::fmt::Display for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Work::FullSync => "full sync",
            Work::Sync => "sync",
            Work::Check => "check of the rules",
        })
    }
}

/// What a sync loop is doing, shared with whoever wants to know: the daemon says at
/// shutdown which sync (and which external command) it waits for. Cheap to clone (one
/// shared cell); `None` while the loop waits for events or its next sync.
#[derive(Debug, Clone, Default)]
pub struct Activity(std::sync::Arc<std::sync::Mutex<Option<Busy>>>);

impl Activity {
    /// What the loop is busy with now, if anything.
    pub fn current(&self) -> Option<Busy> {
        self.0.lock().ok().and_then(|b| *b)
    }

    fn set(&self, busy: Option<Busy>) {
        if let Ok(mut b) = self.0.lock() {
            *b = busy;
        }
    }
}

/// An observer that does nothing.
#[derive(Debug, Default)]
pub struct NoObserver;

impl SyncObserver for NoObserver {}

/// The sync loop for one proxier (one IP family).
pub struct SyncLoop<P: Proxier + 'static> {
    tracker: Tracker,
    proxier: Option<P>,
    cfg: RunnerConfig,
    stats: LoopStats,
    observer: std::sync::Arc<dyn SyncObserver>,
    activity: Activity,
}

impl<P: Proxier + 'static> SyncLoop<P> {
    /// A loop over `tracker` and `proxier` with timing `cfg`.
    pub fn new(tracker: Tracker, proxier: P, cfg: RunnerConfig) -> Self {
        SyncLoop {
            tracker,
            proxier: Some(proxier),
            cfg,
            stats: LoopStats::default(),
            observer: std::sync::Arc::new(NoObserver),
            activity: Activity::default(),
        }
    }

    /// Records in `activity` what the loop is busy with (see [`Activity`]).
    pub fn with_activity(mut self, activity: Activity) -> Self {
        self.activity = activity;
        self
    }

    /// Reports to `observer` (health, metrics) from now on.
    pub fn with_observer(mut self, observer: std::sync::Arc<dyn SyncObserver>) -> Self {
        self.observer = observer;
        self
    }

    /// Runs until `shutdown` resolves (daemon), or after one sync (`RunMode::Once`).
    ///
    /// # Errors
    /// [`RuntimeError::SyncFailed`] when the single sync of `--once` fails;
    /// [`RuntimeError::SourceEndedEarly`] when `events` closes before initialization.
    pub async fn run(
        mut self,
        mut events: mpsc::Receiver<Vec<SourceEvent>>,
        mode: RunMode,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<LoopStats, RuntimeError> {
        tokio::pin!(shutdown);
        let family = self.tracker.family();
        self.observer.started(family);
        let mut pending = false;
        let mut events_open = true;
        let mut last_end: Option<Instant> = None;
        let mut retry_at: Option<Instant> = None;
        let mut last_full: Option<Instant> = None;
        // The next dataplane check, set by the first successful sync; a check that found
        // something missing sets `repair`, which starts a full sync at once.
        let mut next_check: Option<Instant> = None;
        let mut repair = false;
        loop {
            // When may the next sync start?
            let now = Instant::now();
            let due = if !self.tracker.is_initialized() {
                None
            } else if repair {
                Some(now)
            } else if let Some(at) = retry_at {
                Some(at)
            } else if pending || last_end.is_none() {
                Some(last_end.map_or(now, |e| e + self.cfg.min_interval))
            } else {
                last_full.map(|f| f + self.cfg.full_interval)
            };
            let sleep = tokio::time::sleep_until(due.unwrap_or(now + Duration::from_secs(86400)));
            // Checked only between a successful sync and the next one that is due for
            // another reason: a pending retry is a full sync already.
            let check_due = next_check.filter(|_| retry_at.is_none() && !repair);
            let check_sleep =
                tokio::time::sleep_until(check_due.unwrap_or(now + Duration::from_secs(86400)));
            tokio::select! {
                biased;
                () = &mut shutdown => {
                    // The daemon says it once for every family (its rules stay in place).
                    debug!(%family, "sync loop stopping");
                    return Ok(self.stats);
                }
                batch = events.recv(), if events_open => match batch {
                    Some(batch) => {
                        let mut changed = false;
                        let (mut services, mut slices) = (0u64, 0u64);
                        let mut node_event = false;
                        for ev in batch {
                            node_event |= matches!(&ev, SourceEvent::NodeUpsert(n) if n.name == self.tracker.node_name())
                                || matches!(&ev, SourceEvent::NodeDelete(n) if *n == self.tracker.node_name());
                            let counter = match &ev {
                                SourceEvent::ServiceUpsert(_) | SourceEvent::ServiceDelete(_) => Some(&mut services),
                                SourceEvent::SliceUpsert(_) | SourceEvent::SliceDelete(_) => Some(&mut slices),
                                _ => None,
                            };
                            let applied = self.tracker.apply(ev);
                            if applied && let Some(n) = counter {
                                *n += 1;
                            }
                            changed |= applied;
                        }
                        if services + slices > 0 {
                            self.observer.received(family, services, slices);
                        }
                        if node_event {
                            self.observer.node_changed(family, self.tracker.node());
                        }
                        if changed && self.tracker.has_pending_changes() {
                            self.observer.queued(family, self.tracker.pending());
                        }
                        pending |= changed;
                    }
                    None => {
                        events_open = false;
                        if !self.tracker.is_initialized() {
                            return Err(RuntimeError::SourceEndedEarly);
                        }
                        warn!("the source stopped; keeping the programmed rules and resyncing periodically");
                    }
                },
                () = sleep, if due.is_some() => {
                    let full_due = repair
                        || last_full.is_some_and(|f| Instant::now() >= f + self.cfg.full_interval);
                    pending = false;
                    retry_at = None;
                    repair = false;
                    match self.sync_once(full_due).await? {
                        Ok(report) => {
                            if report.full {
                                last_full = Some(Instant::now());
                            }
                            if next_check.is_none() && !self.cfg.check_interval.is_zero() {
                                next_check = Some(Instant::now() + self.cfg.check_interval);
                            }
                            if mode == RunMode::Once {
                                return Ok(self.stats);
                            }
                        }
                        Err(e) => {
                            if mode == RunMode::Once {
                                return Err(RuntimeError::SyncFailed(e));
                            }
                            retry_at = Some(Instant::now() + self.cfg.retry_interval.min(self.cfg.full_interval));
                        }
                    }
                    last_end = Some(Instant::now());
                }
                () = check_sleep, if check_due.is_some() => {
                    repair = self.check_once().await?;
                    next_check = Some(Instant::now() + self.cfg.check_interval);
                }
            }
        }
    }

    /// One [`Proxier::check_dataplane`] on a blocking thread (it runs external commands);
    /// `true` when a full sync must run now. A check that cannot run is logged and counts
    /// as "nothing missing": the next one comes a check interval later.
    async fn check_once(&mut self) -> Result<bool, RuntimeError> {
        let Some(mut proxier) = self.proxier.take() else {
            return Err(RuntimeError::Task(
                "proxier lost after an earlier failure".into(),
            ));
        };
        self.activity.set(Some(Busy {
            family: self.tracker.family(),
            work: Work::Check,
            since: std::time::Instant::now(),
        }));
        let joined = tokio::task::spawn_blocking(move || {
            let result = proxier.check_dataplane();
            (proxier, result)
        })
        .await;
        self.activity.set(None);
        let (proxier, result) = joined.map_err(|e| RuntimeError::Task(e.to_string()))?;
        self.proxier = Some(proxier);
        self.stats.checks += 1;
        match result {
            Ok(true) => {
                self.stats.repairs += 1;
                info!(family = %self.tracker.family(), "rules are missing from the kernel: running a full sync now");
                Ok(true)
            }
            Ok(false) => Ok(false),
            Err(e) => {
                warn!(family = %self.tracker.family(), error = %e, "cannot check whether the rules are still in place; checking again in {:?}", self.cfg.check_interval);
                Ok(false)
            }
        }
    }

    /// One sync on a blocking thread (the proxier runs external commands).
    async fn sync_once(
        &mut self,
        force_full: bool,
    ) -> Result<Result<SyncReport, ProxierError>, RuntimeError> {
        let (snapshot, mut changes) = self.tracker.checkout();
        changes.full_resync_needed |= force_full;
        debug!(
            changed_services = changes.services.len(),
            full_requested = changes.full_resync_needed,
            "syncing"
        );
        let Some(mut proxier) = self.proxier.take() else {
            return Err(RuntimeError::Task(
                "proxier lost after an earlier failure".into(),
            ));
        };
        let started = std::time::Instant::now();
        // The first sync rewrites everything, as does one the changes ask to.
        let full = changes.full_resync_needed || self.stats.syncs == 0;
        self.activity.set(Some(Busy {
            family: self.tracker.family(),
            work: if full { Work::FullSync } else { Work::Sync },
            since: started,
        }));
        let joined = tokio::task::spawn_blocking(move || {
            let result = proxier.sync(&snapshot, &changes);
            (proxier, result, snapshot, changes)
        })
        .await;
        self.activity.set(None);
        let (proxier, result, snapshot, changes) =
            joined.map_err(|e| RuntimeError::Task(e.to_string()))?;
        self.proxier = Some(proxier);
        self.observer.synced(
            self.tracker.family(),
            &result,
            started.elapsed(),
            &snapshot,
            &changes,
            self.tracker.node(),
        );
        match &result {
            Ok(report) => {
                self.stats.syncs += 1;
                if report.full {
                    self.stats.full_syncs += 1;
                }
                self.stats.last_report = Some(report.clone());
            }
            Err(e) => {
                self.stats.failures += 1;
                error!(error = %e, retry_in_s = self.cfg.retry_interval.as_secs_f64(), "sync failed; the kernel keeps its previous rules, retrying with a full sync");
            }
        }
        Ok(result)
    }
}

#[cfg(test)]
mod tests;
