//! Sync-loop tests with paused time and a scripted proxier.

use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kp_model::{
    Changes, IpFamily, NamespacedName, ObjectKind, Protocol, Service, ServicePortSpec, Snapshot,
    SourceEvent,
};
use kp_proxier::{Proxier, ProxierError, ProxyMode, SyncReport};
use kp_track::Tracker;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::*;

#[derive(Clone, Default)]
struct Script {
    calls: Arc<Mutex<Vec<(Instant, Changes, usize)>>>,
    fail_next: Arc<AtomicUsize>,
    /// When each `check_dataplane` ran.
    checks: Arc<Mutex<Vec<Instant>>>,
    /// The next N checks report missing rules.
    missing_next: Arc<AtomicUsize>,
    /// The next N checks fail.
    check_fails_next: Arc<AtomicUsize>,
}

/// Takes one from `n` if it is not zero.
fn take_one(n: &AtomicUsize) -> bool {
    n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
        .is_ok()
}

struct FakeProxier(Script);

impl Proxier for FakeProxier {
    fn mode(&self) -> ProxyMode {
        ProxyMode::Iptables
    }
    fn family(&self) -> IpFamily {
        IpFamily::V4
    }
    fn sync(&mut self, snapshot: &Snapshot, changes: &Changes) -> Result<SyncReport, ProxierError> {
        self.0.calls.lock().unwrap().push((
            Instant::now(),
            changes.clone(),
            snapshot.services.len(),
        ));
        if self.0.fail_next.load(Ordering::SeqCst) > 0 {
            self.0.fail_next.fetch_sub(1, Ordering::SeqCst);
            return Err(ProxierError::Config("scripted failure".into()));
        }
        Ok(SyncReport {
            full: changes.full_resync_needed,
            ..SyncReport::default()
        })
    }
    fn check_dataplane(&mut self) -> Result<bool, ProxierError> {
        self.0.checks.lock().unwrap().push(Instant::now());
        if take_one(&self.0.check_fails_next) {
            return Err(ProxierError::Config("scripted check failure".into()));
        }
        Ok(take_one(&self.0.missing_next))
    }
}

fn svc(i: u8) -> SourceEvent {
    let ip: IpAddr = format!("10.96.0.{i}").parse().unwrap();
    SourceEvent::ServiceUpsert(Service::cluster_ip(
        NamespacedName::new("default", format!("s{i}")),
        ip,
        vec![ServicePortSpec {
            name: "".into(),
            protocol: Protocol::Tcp,
            port: 80,
            node_port: None,
        }],
    ))
}

fn synced() -> Vec<SourceEvent> {
    vec![
        SourceEvent::Synced(ObjectKind::Service),
        SourceEvent::Synced(ObjectKind::EndpointSlice),
        SourceEvent::Synced(ObjectKind::Node),
    ]
}

struct Harness {
    tx: mpsc::Sender<Vec<SourceEvent>>,
    stop: Option<oneshot::Sender<()>>,
    script: Script,
    handle: tokio::task::JoinHandle<Result<LoopStats, RuntimeError>>,
}

fn start(mode: RunMode) -> Harness {
    start_with(mode, RunnerConfig::default())
}

fn start_with(mode: RunMode, cfg: RunnerConfig) -> Harness {
    let script = Script::default();
    let (tx, rx) = mpsc::channel(64);
    let (stop, stopped) = oneshot::channel::<()>();
    let sync_loop = SyncLoop::new(
        Tracker::new(IpFamily::V4, "n1"),
        FakeProxier(script.clone()),
        cfg,
    );
    let handle = tokio::spawn(sync_loop.run(rx, mode, async {
        let _ = stopped.await;
    }));
    Harness {
        tx,
        stop: Some(stop),
        script,
        handle,
    }
}

impl Harness {
    fn calls(&self) -> Vec<(Instant, Changes, usize)> {
        self.script.calls.lock().unwrap().clone()
    }
    fn checks(&self) -> Vec<Instant> {
        self.script.checks.lock().unwrap().clone()
    }
    async fn finish(mut self) -> LoopStats {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.handle.await.unwrap().unwrap()
    }
}

async fn settle() {
    // Let the loop and its blocking sync task run without advancing the paused clock much.
    for _ in 0..20 {
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn no_sync_before_the_initial_list() {
    let h = start(RunMode::Daemon);
    h.tx.send(vec![svc(1)]).await.unwrap();
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert!(h.calls().is_empty(), "must not program a partial view");
    h.tx.send(synced()).await.unwrap();
    settle().await;
    let calls = h.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].2, 1, "the first sync sees the whole initial list");
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn bursts_are_coalesced_and_rate_limited() {
    let h = start(RunMode::Daemon);
    h.tx.send(synced()).await.unwrap();
    settle().await;
    assert_eq!(h.calls().len(), 1);
    let first_end = Instant::now();
    for i in 1..=5 {
        h.tx.send(vec![svc(i)]).await.unwrap();
    }
    settle().await;
    assert_eq!(
        h.calls().len(),
        1,
        "no second sync within the minimum interval"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    settle().await;
    let calls = h.calls();
    assert_eq!(calls.len(), 2, "five changes, one sync");
    assert!(calls[1].0 >= first_end + Duration::from_millis(950));
    assert_eq!(calls[1].1.services.len(), 5);
    // Quiet: no more syncs for a long while (the next full sync is an hour away).
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(h.calls().len(), 2);
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_sync_is_retried_after_the_sync_period() {
    let h = start(RunMode::Daemon);
    h.script.fail_next.store(1, Ordering::SeqCst);
    h.tx.send(synced()).await.unwrap();
    settle().await;
    assert_eq!(h.calls().len(), 1);
    let failed_at = h.calls()[0].0;
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert_eq!(h.calls().len(), 1, "no retry before the retry interval");
    tokio::time::sleep(Duration::from_secs(2)).await;
    settle().await;
    let calls = h.calls();
    assert_eq!(calls.len(), 2);
    assert!(calls[1].0 >= failed_at + Duration::from_secs(30));
    let stats = h.finish().await;
    assert_eq!((stats.syncs, stats.failures), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn hourly_full_resync() {
    let h = start(RunMode::Daemon);
    h.tx.send(synced()).await.unwrap();
    settle().await;
    // The fake reports `full` only when asked for it; mark the first sync full by asking
    // for a topology change is not possible here, so the hourly timer starts after the first
    // full sync reported by the proxier. Force one: a node label change.
    let mut node = kp_model::Node {
        name: "n1".into(),
        ..kp_model::Node::default()
    };
    node.labels
        .insert("topology.kubernetes.io/zone".into(), "a".into());
    h.tx.send(vec![SourceEvent::NodeUpsert(node)])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    settle().await;
    assert_eq!(h.calls().len(), 2);
    assert!(h.calls()[1].1.full_resync_needed);
    tokio::time::sleep(Duration::from_secs(3601)).await;
    settle().await;
    let calls = h.calls();
    assert_eq!(calls.len(), 3);
    assert!(calls[2].1.full_resync_needed, "the hourly sync is full");
    assert!(calls[2].1.services.is_empty());
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn once_mode() {
    let h = start(RunMode::Once);
    h.tx.send(vec![svc(1)]).await.unwrap();
    h.tx.send(synced()).await.unwrap();
    let stats = h.handle.await.unwrap().unwrap();
    assert_eq!(stats.syncs, 1);

    let h = start(RunMode::Once);
    h.script.fail_next.store(1, Ordering::SeqCst);
    h.tx.send(synced()).await.unwrap();
    assert!(matches!(
        h.handle.await.unwrap(),
        Err(RuntimeError::SyncFailed(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn source_ending_before_initialization_is_an_error() {
    let h = start(RunMode::Daemon);
    drop(h.tx);
    assert!(matches!(
        h.handle.await.unwrap(),
        Err(RuntimeError::SourceEndedEarly)
    ));
}

#[derive(Default)]
struct Recorder(Mutex<Vec<String>>);

impl SyncObserver for Recorder {
    fn started(&self, family: IpFamily) {
        self.0.lock().unwrap().push(format!("started {family}"));
    }
    fn queued(&self, _family: IpFamily, pending: kp_track::PendingChanges) {
        self.0.lock().unwrap().push(format!(
            "queued services={} endpoints={}",
            pending.services, pending.endpoints
        ));
    }
    fn received(&self, _family: IpFamily, services: u64, slices: u64) {
        self.0
            .lock()
            .unwrap()
            .push(format!("received services={services} slices={slices}"));
    }
    fn synced(
        &self,
        _family: IpFamily,
        result: &Result<SyncReport, ProxierError>,
        _duration: Duration,
        snapshot: &Snapshot,
        _changes: &Changes,
        _node: Option<&kp_model::Node>,
    ) {
        self.0.lock().unwrap().push(format!(
            "synced ok={} services={}",
            result.is_ok(),
            snapshot.services.len()
        ));
    }
}

#[tokio::test(start_paused = true)]
async fn the_observer_sees_start_queue_and_sync() {
    let script = Script::default();
    let (tx, rx) = mpsc::channel(8);
    let recorder = Arc::new(Recorder::default());
    let sync_loop = SyncLoop::new(
        Tracker::new(IpFamily::V4, "n1"),
        FakeProxier(script.clone()),
        RunnerConfig::default(),
    )
    .with_observer(recorder.clone());
    let handle = tokio::spawn(sync_loop.run(rx, RunMode::Once, std::future::pending()));
    tx.send(vec![svc(1), svc(2)]).await.unwrap();
    tx.send(synced()).await.unwrap();
    handle.await.unwrap().unwrap();
    let log = recorder.0.lock().unwrap().clone();
    // `queued` may repeat while changes wait (the initial list completing is one more);
    // health only keeps the oldest.
    assert_eq!(
        log[..2],
        ["started IPv4", "received services=2 slices=0"],
        "{log:?}"
    );
    assert!(
        log[2..log.len() - 1]
            .iter()
            .all(|l| l == "queued services=2 endpoints=0"),
        "{log:?}"
    );
    assert_eq!(
        log.last().map(String::as_str),
        Some("synced ok=true services=2")
    );
}

/// Pending and received changes are counted by kind: Service objects and EndpointSlices, a
/// Service whose object and slices both changed in each; events that change nothing are not
/// counted.
#[tokio::test(start_paused = true)]
async fn the_observer_sees_changes_by_kind() {
    let slice = |n: &str| {
        SourceEvent::SliceUpsert(kp_model::EndpointSlice {
            name: NamespacedName::new("default", n),
            service: NamespacedName::new("default", "s1"),
            address_type: kp_model::SliceAddressType::V4,
            ports: Vec::new(),
            endpoints: Vec::new(),
            last_change_trigger_time: None,
        })
    };
    let (tx, rx) = mpsc::channel(8);
    let recorder = Arc::new(Recorder::default());
    let sync_loop = SyncLoop::new(
        Tracker::new(IpFamily::V4, "n1"),
        FakeProxier(Script::default()),
        RunnerConfig::default(),
    )
    .with_observer(recorder.clone());
    let handle = tokio::spawn(sync_loop.run(rx, RunMode::Once, std::future::pending()));
    tx.send(vec![svc(1), slice("s1-a"), slice("s1-b"), svc(2)])
        .await
        .unwrap();
    // The same objects again change nothing.
    tx.send(vec![svc(1), slice("s1-a")]).await.unwrap();
    tx.send(synced()).await.unwrap();
    handle.await.unwrap().unwrap();
    let log = recorder.0.lock().unwrap().clone();
    assert_eq!(
        log[..3],
        [
            "started IPv4",
            "received services=2 slices=2",
            "queued services=2 endpoints=1",
        ],
        "{log:?}"
    );
    assert_eq!(
        log.iter().filter(|l| l.starts_with("received")).count(),
        1,
        "{log:?}"
    );
}

/// After the first successful sync the dataplane is checked every `check_interval` (30 s by
/// default, `--iptables-sync-period`); a check that finds nothing missing syncs nothing, and
/// one that finds rules missing starts a full sync at once, not at the next change or the
/// hourly full sync.
#[tokio::test(start_paused = true)]
async fn the_dataplane_is_checked_every_period_and_repaired_at_once() {
    let h = start(RunMode::Daemon);
    h.tx.send(synced()).await.unwrap();
    settle().await;
    assert_eq!(h.calls().len(), 1);
    let first = h.calls()[0].0;
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert!(
        h.checks().is_empty(),
        "no check before one period has passed"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    settle().await;
    assert_eq!(h.checks().len(), 1);
    assert!(h.checks()[0] >= first + Duration::from_secs(30));
    assert_eq!(h.calls().len(), 1, "nothing missing: nothing synced");
    // Five quiet periods: five checks, still no sync.
    tokio::time::sleep(Duration::from_secs(150)).await;
    settle().await;
    assert_eq!(h.checks().len(), 6);
    assert_eq!(h.calls().len(), 1);

    // Someone flushes the rules: the next check finds it and a full sync follows at once.
    h.script.missing_next.store(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(30)).await;
    settle().await;
    let checks = h.checks();
    assert_eq!(checks.len(), 7);
    let calls = h.calls();
    assert_eq!(calls.len(), 2, "the repair sync ran");
    assert!(calls[1].1.full_resync_needed, "the repair is a full sync");
    assert!(
        calls[1].0 - checks[6] < Duration::from_millis(100),
        "the repair runs at once, not after --iptables-min-sync-period or later"
    );
    // The checks go on every period.
    tokio::time::sleep(Duration::from_secs(30)).await;
    settle().await;
    assert_eq!(h.checks().len(), 8);
    assert_eq!(h.calls().len(), 2);
    let stats = h.finish().await;
    assert_eq!((stats.checks, stats.repairs), (8, 1));
    assert_eq!((stats.syncs, stats.full_syncs), (2, 1));
}

/// Nothing is checked before the first successful sync (there is nothing to find yet), nor
/// while the retry of a failed sync is pending (it rewrites everything anyway); the check
/// that was due meanwhile runs right after the retry.
#[tokio::test(start_paused = true)]
async fn no_check_before_the_first_sync_nor_while_a_retry_is_pending() {
    let h = start(RunMode::Daemon);
    h.tx.send(vec![svc(1)]).await.unwrap();
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert!(h.checks().is_empty(), "no check before the initial list");

    // The first sync fails: still nothing to check until its retry succeeded.
    h.script.fail_next.store(1, Ordering::SeqCst);
    h.tx.send(synced()).await.unwrap();
    settle().await;
    assert_eq!(h.calls().len(), 1);
    tokio::time::sleep(Duration::from_secs(31)).await;
    settle().await;
    assert_eq!(h.calls().len(), 2, "the retry ran");
    let retried = h.calls()[1].0;
    assert!(h.checks().is_empty());
    tokio::time::sleep(Duration::from_secs(31)).await;
    settle().await;
    assert_eq!(h.checks().len(), 1);
    assert!(h.checks()[0] >= retried + Duration::from_secs(30));

    // A change whose sync fails 10 s before the next check: that check waits for the retry.
    tokio::time::sleep(Duration::from_secs(20)).await;
    h.script.fail_next.store(1, Ordering::SeqCst);
    h.tx.send(vec![svc(2)]).await.unwrap();
    settle().await;
    assert_eq!(h.calls().len(), 3);
    tokio::time::sleep(Duration::from_secs(15)).await;
    settle().await;
    assert_eq!(h.checks().len(), 1, "no check while the retry is pending");
    tokio::time::sleep(Duration::from_secs(16)).await;
    settle().await;
    let calls = h.calls();
    assert_eq!(calls.len(), 4, "the retry ran");
    assert_eq!(h.checks().len(), 2, "the overdue check ran after the retry");
    assert!(h.checks()[1] >= calls[3].0);
    h.finish().await;
}

/// A check that cannot run (a busy xtables lock, a missing binary) syncs nothing; the next
/// one comes a period later. A zero interval turns the checks off.
#[tokio::test(start_paused = true)]
async fn a_failed_check_waits_for_the_next_period_and_zero_turns_checks_off() {
    let h = start(RunMode::Daemon);
    h.script.check_fails_next.store(1, Ordering::SeqCst);
    h.tx.send(synced()).await.unwrap();
    settle().await;
    tokio::time::sleep(Duration::from_secs(31)).await;
    settle().await;
    assert_eq!(h.checks().len(), 1);
    assert_eq!(h.calls().len(), 1, "a failed check is not a reason to sync");
    tokio::time::sleep(Duration::from_secs(30)).await;
    settle().await;
    assert_eq!(h.checks().len(), 2);
    assert_eq!(h.calls().len(), 1);
    let stats = h.finish().await;
    assert_eq!((stats.checks, stats.repairs), (2, 0));

    let h = start_with(
        RunMode::Daemon,
        RunnerConfig {
            check_interval: Duration::ZERO,
            ..RunnerConfig::default()
        },
    );
    h.tx.send(synced()).await.unwrap();
    settle().await;
    tokio::time::sleep(Duration::from_secs(600)).await;
    settle().await;
    assert!(h.checks().is_empty());
    assert_eq!(h.calls().len(), 1);
    h.finish().await;
}

/// The check period is the loop's own setting (IPVS mode passes `--ipvs-sync-period`).
#[tokio::test(start_paused = true)]
async fn the_check_interval_is_configurable() {
    let h = start_with(
        RunMode::Daemon,
        RunnerConfig {
            check_interval: Duration::from_secs(2),
            ..RunnerConfig::default()
        },
    );
    h.tx.send(synced()).await.unwrap();
    settle().await;
    tokio::time::sleep(Duration::from_millis(10_500)).await;
    settle().await;
    assert_eq!(h.checks().len(), 5);
    h.finish().await;
}

/// A proxier whose syncs block until the test lets them through.
struct GatedProxier(Mutex<std::sync::mpsc::Receiver<()>>);

impl Proxier for GatedProxier {
    fn mode(&self) -> ProxyMode {
        ProxyMode::Iptables
    }
    fn family(&self) -> IpFamily {
        IpFamily::V4
    }
    fn sync(&mut self, _: &Snapshot, changes: &Changes) -> Result<SyncReport, ProxierError> {
        let _ = self.0.lock().unwrap().recv();
        Ok(SyncReport {
            full: changes.full_resync_needed,
            ..SyncReport::default()
        })
    }
    fn check_dataplane(&mut self) -> Result<bool, ProxierError> {
        Ok(false)
    }
}

/// While a sync runs, [`Activity`] says which (the first one is full); a stop requested then
/// takes effect once it has finished, never in the middle (the daemon bounds that wait).
#[tokio::test]
async fn activity_names_the_sync_in_flight_and_a_stop_waits_for_it() {
    let (gate, gated) = std::sync::mpsc::channel::<()>();
    let activity = Activity::default();
    let (tx, rx) = mpsc::channel(64);
    let (stop, stopped) = oneshot::channel::<()>();
    let sync_loop = SyncLoop::new(
        Tracker::new(IpFamily::V4, "n1"),
        GatedProxier(Mutex::new(gated)),
        RunnerConfig::default(),
    )
    .with_activity(activity.clone());
    let handle = tokio::spawn(sync_loop.run(rx, RunMode::Daemon, async {
        let _ = stopped.await;
    }));
    assert_eq!(activity.current(), None, "idle before the initial list");
    tx.send(synced()).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let busy = loop {
        if let Some(b) = activity.current() {
            break b;
        }
        assert!(std::time::Instant::now() < deadline, "no sync started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!((busy.family, busy.work), (IpFamily::V4, Work::FullSync));
    assert_eq!(busy.work.to_string(), "full sync");
    stop.send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !handle.is_finished(),
        "the loop stopped in the middle of a sync"
    );
    gate.send(()).unwrap();
    let stats = handle.await.unwrap().unwrap();
    assert_eq!(stats.syncs, 1);
    assert_eq!(activity.current(), None, "idle once the sync finished");
}
