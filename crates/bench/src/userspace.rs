//! Userspace mode in the benchmark: [`UserspaceProxier`] with `iptables-legacy-restore`
//! portals and a `kp-relay` [`Relay`] whose sockets live in the node's namespace.
//!
//! Sockets belong to the network namespace of the thread that creates them. The relay
//! creates listening sockets in [`Relay::apply`] (on the calling thread) and backend
//! connections in its tokio tasks (on the runtime's worker threads), so both must be inside
//! the node namespace. [`NsRelay`] therefore starts one dedicated thread in the namespace
//! ([`kp_testkit::Netns::spawn_in`]) that builds a 2-worker multi-thread runtime (its workers
//! are spawned by that thread, so they start in the namespace too), creates the [`Relay`] on
//! it, and then runs every `apply` the proxier asks for, sent over a channel. The runtime
//! lives until the [`NsRelay`] is dropped, i.e. for the whole benchmark point.
//!
//! [`NsRelay`] is the benchmark's copy of the daemon's `LiveRelay` adapter (the binary crate's
//! `userspace_mode.rs`; kp-bench does not depend on the binary), with the namespace hop added.
//!
//! The relay's CPU: the runtime records the thread id of every thread it starts
//! ([`RelayThreads`]); their CPU time is read from `/proc/self/task/<tid>/schedstat` (time on
//! CPU in nanoseconds, user and system) or, without schedstat, from the `utime` + `stime`
//! ticks of `/proc/self/task/<tid>/stat`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;
use kp_model::{Changes, IpFamily, Protocol, Snapshot};
use kp_netfilter::{Backend, Exec, ExecIptables, FakeIptables, IpVersion};
use kp_proxier::SyncReport;
use kp_proxier::userspace::{FakeRelay, Listener, PortalRelay, UserspaceConfig, UserspaceProxier};
use kp_proxier::{FakeHost, LocalDetector, NodePortAddresses, Proxier, ProxierError, ProxyMode};
use kp_relay::{ListenerSpec, Relay, RelayConfig};

/// Worker threads of the relay's runtime.
pub const RELAY_WORKERS: usize = 2;

/// One `apply` for the namespace thread, and where to send its answer.
struct ApplyRequest {
    specs: BTreeMap<String, ListenerSpec>,
    reply: mpsc::Sender<BTreeMap<String, Result<u16, String>>>,
}

/// The thread ids of the relay runtime's threads, and their CPU time.
#[derive(Debug, Clone, Default)]
pub struct RelayThreads {
    tids: Arc<Mutex<Vec<i32>>>,
}

impl RelayThreads {
    /// The thread ids recorded so far.
    pub fn tids(&self) -> Vec<i32> {
        self.tids.lock().map(|t| t.clone()).unwrap_or_default()
    }

    fn record(&self, tid: i32) {
        if let Ok(mut t) = self.tids.lock() {
            t.push(tid);
        }
    }

    /// Total CPU time of the threads still alive, nanoseconds.
    pub fn cpu_ns(&self) -> u64 {
        self.tids().into_iter().map(thread_cpu_ns).sum()
    }
}

/// CPU time (user + system) of thread `tid` of this process, nanoseconds; 0 when it is gone.
pub fn thread_cpu_ns(tid: i32) -> u64 {
    if let Ok(s) = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))
        && let Some(ns) = s.split_whitespace().next().and_then(|v| v.parse().ok())
    {
        return ns;
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")) else {
        return 0;
    };
    // The command may contain spaces: fields are counted after its closing parenthesis.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<u64> = rest
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    // After the command: state(3) ... utime(14) stime(15), i.e. indexes 11 and 12 here.
    let ticks = fields.get(11).copied().unwrap_or(0) + fields.get(12).copied().unwrap_or(0);
    // USER_HZ is 100 on Linux.
    ticks * 10_000_000
}

/// A `kp-relay` [`Relay`] running inside a network namespace, as a [`PortalRelay`] for the
/// proxier: see the [module documentation](self).
pub struct NsRelay {
    requests: Option<mpsc::Sender<ApplyRequest>>,
    thread: Option<JoinHandle<()>>,
    threads: RelayThreads,
}

impl std::fmt::Debug for NsRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NsRelay")
            .field("threads", &self.threads.tids())
            .finish()
    }
}

impl NsRelay {
    /// Starts the namespace thread, its runtime ([`RELAY_WORKERS`] workers) and the relay
    /// with `cfg`. Raises this process's `RLIMIT_NOFILE` soft limit first (a listener per
    /// Service port, six descriptors per relayed connection).
    ///
    /// # Errors
    /// Entering the namespace or building the runtime fails.
    pub fn start(ns: &kp_testkit::Netns, cfg: RelayConfig) -> anyhow::Result<NsRelay> {
        let _ = kp_relay::raise_fd_limit();
        let threads = RelayThreads::default();
        let (tx, rx) = mpsc::channel::<ApplyRequest>();
        let (ready_tx, ready_rx) = mpsc::sync_channel::<Result<(), String>>(1);
        let recorder = threads.clone();
        let thread = ns
            .spawn_in(move || {
                let built = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(RELAY_WORKERS)
                    .thread_name("kp-relay")
                    .enable_all()
                    .on_thread_start(move || recorder.record(nix::unistd::gettid().as_raw()))
                    .build();
                let rt = match built {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let relay = Relay::new(cfg, rt.handle().clone());
                let _ = ready_tx.send(Ok(()));
                drop(ready_tx);
                for req in rx {
                    let out = relay
                        .apply(&req.specs)
                        .into_iter()
                        .map(|(k, r)| (k, r.map_err(|e| e.to_string())))
                        .collect();
                    let _ = req.reply.send(out);
                }
                relay.shutdown();
                drop(relay);
                rt.shutdown_timeout(Duration::from_secs(2));
            })
            .context("starting the relay thread in the node namespace")?;
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => anyhow::bail!("building the relay's runtime: {e}"),
            Err(_) => anyhow::bail!("the relay thread ended before its runtime was built"),
        }
        // The workers record themselves as they start; wait (briefly) until both have.
        let deadline = Instant::now() + Duration::from_secs(2);
        while threads.tids().len() < RELAY_WORKERS && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(NsRelay {
            requests: Some(tx),
            thread: Some(thread),
            threads,
        })
    }

    /// The relay runtime's threads (for their CPU time).
    pub fn threads(&self) -> RelayThreads {
        self.threads.clone()
    }
}

impl Drop for NsRelay {
    fn drop(&mut self) {
        drop(self.requests.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn relay_protocol(p: Protocol) -> kp_relay::Protocol {
    match p {
        Protocol::Udp => kp_relay::Protocol::Udp,
        // The proxier never asks for SCTP.
        Protocol::Tcp | Protocol::Sctp => kp_relay::Protocol::Tcp,
    }
}

impl PortalRelay for NsRelay {
    fn serve(&mut self, listeners: &[Listener]) -> Vec<Result<u16, String>> {
        let specs: BTreeMap<String, ListenerSpec> = listeners
            .iter()
            .map(|l| {
                (
                    l.key(),
                    ListenerSpec {
                        name: l.service.to_string(),
                        protocol: relay_protocol(l.protocol),
                        affinity: l.affinity,
                        endpoints: l.endpoints.clone(),
                    },
                )
            })
            .collect();
        let (reply, answer) = mpsc::channel();
        let sent = self
            .requests
            .as_ref()
            .is_some_and(|tx| tx.send(ApplyRequest { specs, reply }).is_ok());
        let mut ports = if sent {
            answer.recv().unwrap_or_default()
        } else {
            BTreeMap::new()
        };
        listeners
            .iter()
            .map(|l| match ports.remove(&l.key()) {
                Some(r) => r,
                None => Err("the relay thread did not answer for this listener".into()),
            })
            .collect()
    }
}

/// The userspace-mode settings the benchmark uses: ClusterCIDR detection with
/// `cluster_cidr`, NodePorts on every local address.
pub fn userspace_config(cluster_cidr: ipnet::IpNet) -> UserspaceConfig {
    UserspaceConfig {
        nodeport_addresses: NodePortAddresses::all(),
        local_detector: LocalDetector::Cidrs(vec![cluster_cidr]),
    }
}

/// The node's local addresses as the userspace proxier sees them: the synthetic node address
/// (the node's own connections are DNATed to it, as upstream did).
fn node_host() -> Arc<FakeHost> {
    Arc::new(FakeHost::with_addresses(vec![IpAddr::V4(crate::NODE_IP)]))
}

/// A userspace proxier and the relay runtime it drives, as one [`Proxier`]; dropping it stops
/// the relay (its listeners close, its runtime shuts down).
pub struct UserspaceBench {
    proxier: UserspaceProxier<ExecIptables, NsRelay>,
}

impl UserspaceBench {
    /// A userspace proxier writing its portals with `iptables-legacy-restore` through `exec`
    /// (which runs the tools inside `ns`) and listening through an [`NsRelay`] in `ns`.
    ///
    /// # Errors
    /// The relay's thread or runtime cannot be started.
    pub fn new(
        ns: &kp_testkit::Netns,
        exec: Arc<dyn Exec>,
        cluster_cidr: ipnet::IpNet,
    ) -> anyhow::Result<UserspaceBench> {
        let relay = NsRelay::start(ns, RelayConfig::default())?;
        let proxier = UserspaceProxier::new(
            IpFamily::V4,
            userspace_config(cluster_cidr),
            ExecIptables::with_exec(IpVersion::V4, Backend::Legacy, exec),
            relay,
            node_host(),
        );
        Ok(UserspaceBench { proxier })
    }

    /// The relay runtime's threads.
    pub fn relay_threads(&self) -> RelayThreads {
        self.proxier.relay().threads()
    }
}

impl Proxier for UserspaceBench {
    fn mode(&self) -> ProxyMode {
        self.proxier.mode()
    }

    fn family(&self) -> IpFamily {
        self.proxier.family()
    }

    fn sync(&mut self, snapshot: &Snapshot, changes: &Changes) -> Result<SyncReport, ProxierError> {
        self.proxier.sync(snapshot, changes)
    }
}

/// Renders userspace mode's cold payload for `snap` without the kernel or sockets: a first
/// (full) sync of a [`UserspaceProxier`] against [`FakeIptables`] and a [`FakeRelay`] (ports
/// from 36000). Returns the `iptables-restore` payload and the proxier's render time (the
/// listeners, the fake relay, the portal rules; not the fake's own save and restore).
pub fn userspace_payload(snap: &Snapshot) -> (String, Duration) {
    let mut p = UserspaceProxier::new(
        IpFamily::V4,
        userspace_config(crate::pod_cidr()),
        FakeIptables::new(IpVersion::V4),
        FakeRelay::new(36000),
        node_host(),
    );
    let report = p.sync(snap, &Changes::default());
    let took = report.as_ref().map(|r| r.render_time).unwrap_or_default();
    let payload = if report.is_ok() {
        p.runner()
            .last_payload()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    } else {
        String::new()
    };
    (payload, took)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cold_payload_has_a_portal_per_service() {
        let snap = crate::scale_snapshot(20, 3);
        let (payload, took) = userspace_payload(&snap);
        assert!(took > Duration::ZERO);
        assert!(payload.contains("*nat") && payload.contains(":KUBE-PORTALS-CONTAINER"));
        let redirects = payload
            .lines()
            .filter(|l| l.starts_with("-A KUBE-PORTALS-CONTAINER") && l.contains("REDIRECT"))
            .count();
        assert_eq!(redirects, 20, "{payload}");
        // The fake relay's ports.
        assert!(payload.contains("--to-ports 36000"), "{payload}");
    }

    #[test]
    fn this_threads_cpu_time_is_read() {
        let tid = nix::unistd::gettid().as_raw();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert!(x != 1);
        assert!(thread_cpu_ns(tid) > 0);
        assert_eq!(thread_cpu_ns(i32::MAX), 0, "no such thread");
    }
}
