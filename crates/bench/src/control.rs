//! Control-plane benchmark (W1/W2 of the performance anchors): for each mode and size, the
//! cold render, the kernel tool alone loading the same payload (the floor), the proxier's
//! cold full sync and full resync, one-Service changes, payload bytes, and the iptables-save
//! read split into the tool and our parse.
//!
//! Every kernel-tool run happens inside a fresh network namespace and under `timeout`; a run
//! that hits the timeout is reported as a timeout, never as a number.
//!
//! IPVS mode ([`Mode::Ipvs`], on a kernel with IPVS): the payload is the three texts of
//! [`crate::IpvsPayload`]; the floor is `ipset restore` of the sets followed by `ipvsadm
//! --restore` of the same virtual and real servers (the tools alone, in an empty namespace);
//! the proxier is [`IpvsProxier`] with its real adapters (IPVS over generic netlink,
//! kube-ipvs0 over rtnetlink, `ipset`, `iptables-legacy-restore`), opened inside the
//! namespace; the "save" column is `ipvsadm -S -n` of the loaded table.
//!
//! Userspace mode ([`Mode::Userspace`]): the payload is the portal rules of a first sync
//! against fakes ([`crate::userspace::userspace_payload`]: no kernel, no sockets); the floor
//! is `iptables-legacy-restore --noflush --counters` of it; the proxier is
//! [`crate::userspace::UserspaceBench`], so its syncs include opening (and closing) the
//! relay's listening sockets in the namespace, one per Service port. An endpoint change
//! only updates the relay (no rule changes, nothing restored: 0 bytes). There is no save
//! column. [`Mode::Direct`] has no control plane.

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use kp_model::{Changes, Endpoint, IpFamily, NamespacedName, Snapshot};
use kp_netfilter::{Backend, Exec, ExecIptables, ExecNft, IpVersion, SystemExec, Table};
use kp_proxier::iptables::{IptablesConfig, IptablesProxier};
use kp_proxier::ipvs::{IpvsConfig, IpvsProxier};
use kp_proxier::nftables::{NftablesConfig, NftablesProxier};
use kp_proxier::{FakeHost, LocalDetector, NodePortAddresses, Proxier, SyncReport};
use serde::{Deserialize, Serialize};

use crate::userspace::{RelayThreads, UserspaceBench};
use crate::{Mode, pod_cidr, scale_service, scale_snapshot, v4};

/// What a step of an older run's JSON, which did not have it, reads as.
fn not_measured() -> Timed {
    Timed::Skipped {
        reason: "not measured in this run".into(),
    }
}

/// The outcome of one timed step.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Timed {
    /// Finished in `ms` milliseconds.
    Ok {
        /// Wall time in milliseconds.
        ms: f64,
    },
    /// Hit the timeout (seconds) and was killed.
    Timeout {
        /// The timeout in seconds.
        after_s: u64,
    },
    /// Not run (an earlier step of the same point timed out or failed).
    Skipped {
        /// Why.
        reason: String,
    },
    /// Failed.
    Failed {
        /// The error.
        error: String,
    },
}

impl Timed {
    /// Milliseconds when finished.
    pub fn ms(&self) -> Option<f64> {
        match self {
            Timed::Ok { ms } => Some(*ms),
            _ => None,
        }
    }

    fn ok(d: Duration) -> Timed {
        Timed::Ok {
            ms: d.as_secs_f64() * 1e3,
        }
    }

    /// A short cell for tables: `12.3 ms`, `timeout (600 s)`, `skipped`, `failed`.
    pub fn cell(&self) -> String {
        match self {
            Timed::Ok { ms } => fmt_ms(*ms),
            Timed::Timeout { after_s } => format!("timeout (>{after_s} s)"),
            Timed::Skipped { .. } => "skipped".into(),
            Timed::Failed { .. } => "failed".into(),
        }
    }
}

/// `0.42 ms`, `12.3 ms`, `4.56 s`.
pub fn fmt_ms(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{:.2} s", ms / 1e3)
    } else if ms >= 10.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{ms:.2} ms")
    }
}

/// One one-Service change.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Change {
    /// What changed.
    pub what: String,
    /// The whole partial sync (render + kernel tool).
    pub sync: Timed,
    /// Our part of it (render + payload), from the sync report.
    pub render_ms: Option<f64>,
    /// Payload bytes sent to the kernel.
    pub bytes: usize,
}

/// Control-plane results of one mode at one size (medians over `runs`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ControlPoint {
    /// Mode label (`iptables-legacy`, `iptables-nft`, `nftables`).
    pub mode: String,
    /// Services.
    pub services: usize,
    /// Endpoints per Service.
    pub endpoints: usize,
    /// Runs the medians are over.
    pub runs: usize,
    /// Cold render of the full ruleset plus payload (no kernel), median.
    #[serde(deserialize_with = "crate::report::nan_f64")]
    pub render_ms: f64,
    /// Bytes of the cold full payload.
    pub payload_bytes: usize,
    /// Lines of the cold full payload.
    pub payload_lines: usize,
    /// The kernel tool alone loading the same payload into an empty namespace.
    pub floor: Timed,
    /// The proxier's first (cold) full sync into an empty namespace: read the (empty)
    /// kernel, render, restore.
    pub cold_sync: Timed,
    /// cold_sync / floor.
    pub overhead_ratio: Option<f64>,
    /// A full resync over the loaded ruleset (what a restart or the hourly resync does):
    /// read the kernel (iptables-save), render, restore.
    pub resync: Timed,
    /// Bytes of the resync payload.
    pub resync_bytes: usize,
    /// A full resync after one endpoint of every Service changed (the worst case of a
    /// resync that writes only what differs: every Service's chains are rewritten), after
    /// the one-Service changes.
    #[serde(default = "not_measured")]
    pub resync_changed: Timed,
    /// Bytes of that resync's payload.
    #[serde(default)]
    pub resync_changed_bytes: usize,
    /// iptables modes: `iptables-save -t nat` of the loaded ruleset (the tool alone).
    pub save_tool: Timed,
    /// iptables modes: parsing that dump the way a full sync does (chain names and built-in
    /// jump rules only).
    pub save_parse_ms: Option<f64>,
    /// iptables modes: parsing it with the full typed parser (the previous way).
    pub save_parse_full_ms: Option<f64>,
    /// IPVS mode: netlink requests of the cold sync (one per virtual and real server).
    #[serde(default)]
    pub ipvs_requests: Option<usize>,
    /// One-Service changes through partial syncs.
    pub changes: Vec<Change>,
    /// The proxy's peak RSS (VmHWM of a child process that builds the tracker state from
    /// source events and runs one full sync into a namespace), MiB.
    pub peak_rss_mib: Option<f64>,
    /// Of which the tracker and snapshot alone (VmHWM before the sync), MiB.
    pub state_rss_mib: Option<f64>,
}

impl ControlPoint {
    /// A point not measured, with the reason.
    pub fn skipped(mode: Mode, services: usize, endpoints: usize, reason: String) -> Self {
        let skip = Timed::Skipped { reason };
        ControlPoint {
            mode: mode.label().into(),
            services,
            endpoints,
            runs: 0,
            render_ms: f64::NAN,
            payload_bytes: 0,
            payload_lines: 0,
            floor: skip.clone(),
            cold_sync: skip.clone(),
            overhead_ratio: None,
            resync: skip.clone(),
            resync_bytes: 0,
            resync_changed: skip.clone(),
            resync_changed_bytes: 0,
            save_tool: skip,
            save_parse_ms: None,
            save_parse_full_ms: None,
            ipvs_requests: None,
            changes: Vec::new(),
            peak_rss_mib: None,
            state_rss_mib: None,
        }
    }
}

/// A network namespace and the prefix that runs commands inside it under a timeout.
pub(crate) fn ns_prefix(ns: &kp_testkit::Netns, timeout: Duration) -> Vec<String> {
    vec![
        "timeout".into(),
        "--kill-after=10".into(),
        format!("{}", timeout.as_secs().max(1)),
        "ip".into(),
        "netns".into(),
        "exec".into(),
        ns.name().into(),
    ]
}

/// The proxier of `mode`, driving the kernel tools inside `ns`.
pub(crate) fn proxier_in(
    mode: Mode,
    ns: &kp_testkit::Netns,
    timeout: Duration,
    cluster_cidr: &str,
) -> anyhow::Result<Box<dyn Proxier>> {
    Ok(proxier_with_relay_in(mode, ns, timeout, cluster_cidr)?.0)
}

/// [`proxier_in`], and for userspace mode the threads of its relay's runtime (whose CPU the
/// datapath counts as the proxy's).
pub(crate) fn proxier_with_relay_in(
    mode: Mode,
    ns: &kp_testkit::Netns,
    timeout: Duration,
    cluster_cidr: &str,
) -> anyhow::Result<(Box<dyn Proxier>, Option<RelayThreads>)> {
    let exec: Arc<dyn Exec> = Arc::new(SystemExec::with_prefix(ns_prefix(ns, timeout)));
    let cidr = cluster_cidr.parse().unwrap_or_else(|_| pod_cidr());
    let detector = LocalDetector::Cidrs(vec![cidr]);
    let host = Arc::new(FakeHost::default());
    let proxier: Box<dyn Proxier> = match mode {
        Mode::Userspace => {
            let p = UserspaceBench::new(ns, exec, cidr)?;
            let threads = p.relay_threads();
            return Ok((Box::new(p), Some(threads)));
        }
        Mode::Direct => anyhow::bail!("the direct baseline has no proxier"),
        Mode::IptablesLegacy
        | Mode::IptablesNft
        | Mode::IptablesNftOne
        | Mode::IptablesNftZero
        | Mode::IptablesLegacyTree
        | Mode::IptablesNftTree => {
            let backend = if mode.is_iptables_legacy() {
                Backend::Legacy
            } else {
                Backend::Nft
            };
            let cfg = IptablesConfig {
                local_detector: detector,
                nodeport_addresses: NodePortAddresses::all(),
                ..IptablesConfig::default()
            };
            Box::new(
                IptablesProxier::new(
                    IpFamily::V4,
                    cfg,
                    ExecIptables::with_exec(IpVersion::V4, backend, exec),
                    host,
                )?
                .with_zero_counters_on_full_sync(mode == Mode::IptablesNftZero)
                .with_dispatch(mode.dispatch())
                .with_split_full_syncs(match mode {
                    Mode::IptablesNft | Mode::IptablesNftTree => {
                        Some(kp_proxier::iptables::reconcile::split::NFT_SPLIT)
                    }
                    _ => None,
                }),
            )
        }
        Mode::Nftables => {
            let cfg = NftablesConfig {
                local_detector: detector,
                nodeport_addresses: NodePortAddresses::all(),
                ..NftablesConfig::default()
            };
            Box::new(NftablesProxier::new(
                IpFamily::V4,
                cfg,
                ExecNft::with_exec(exec),
                host,
            )?)
        }
        Mode::Ipvs => {
            ipvs_sysctls(ns);
            let cfg = IpvsConfig {
                local_detector: detector,
                nodeport_addresses: NodePortAddresses::all(),
                ..IpvsConfig::default()
            };
            // Both sockets belong to the namespace they are created in.
            let (ipvs, links) = ns
                .in_ns(|| {
                    (
                        kp_netlink::ipvs::Ipvs::with_timeout(timeout),
                        kp_netlink::link::Links::new(),
                    )
                })
                .context("entering the namespace")?;
            let ipvs = ipvs.context("opening IPVS over netlink (does this kernel have IPVS?)")?;
            let links = links.context("opening rtnetlink")?;
            Box::new(IpvsProxier::new(
                IpFamily::V4,
                cfg,
                ExecIptables::with_exec(IpVersion::V4, Backend::Legacy, exec.clone()),
                Box::new(kp_netfilter::ipset::ExecIpset::with_exec(exec)),
                Box::new(ipvs),
                Box::new(links),
                host,
            )?)
        }
    };
    Ok((proxier, None))
}

/// The sysctls the IPVS proxier sets at start (its host is a fake here), set inside `ns`
/// only; best effort.
pub(crate) fn ipvs_sysctls(ns: &kp_testkit::Netns) {
    for (k, v) in [
        ("net.ipv4.vs.conntrack", "1"),
        ("net.ipv4.vs.expire_nodest_conn", "1"),
        ("net.ipv4.vs.expire_quiescent_template", "1"),
        ("net.ipv4.ip_forward", "1"),
    ] {
        let _ = ns.sysctl(k, v);
    }
}

/// Gives `ns` the synthetic node's address ([`crate::NODE_IP`]) on a dummy `eth0`, so the
/// IPVS proxier finds the same NodePort address the cold render assumes.
pub(crate) fn add_node_address(ns: &kp_testkit::Netns) -> anyhow::Result<()> {
    ns.ip(["link", "add", "eth0", "type", "dummy"])?;
    ns.ip([
        "addr",
        "add",
        &format!("{}/24", crate::NODE_IP),
        "dev",
        "eth0",
    ])?;
    ns.ip(["link", "set", "eth0", "up"])?;
    Ok(())
}

/// The IPVS floor: `ipset restore` of the sets, then `ipvsadm --restore` of the virtual and
/// real servers, in `ns`; the sum of both (the first failure or timeout otherwise).
fn ipvs_floor(ns: &kp_testkit::Netns, p: &crate::IpvsPayload, timeout: Duration) -> Timed {
    let (sets, _) = tool_in(ns, &["ipset", "restore"], &p.ipset, timeout);
    let Some(a) = sets.ms() else {
        return sets;
    };
    let (servers, _) = tool_in(ns, &["ipvsadm", "--restore"], p.ipvsadm.as_bytes(), timeout);
    match servers.ms() {
        Some(b) => Timed::Ok { ms: a + b },
        None => servers,
    }
}

/// Runs `argv` inside `ns` with `stdin`, under `timeout`.
pub(crate) fn tool_in(
    ns: &kp_testkit::Netns,
    argv: &[&str],
    stdin: &[u8],
    timeout: Duration,
) -> (Timed, Vec<u8>) {
    let prefix = ns_prefix(ns, timeout);
    let exec = SystemExec::new();
    let full: Vec<String> = prefix
        .into_iter()
        .chain(argv.iter().map(|s| s.to_string()))
        .collect();
    let t = Instant::now();
    let r = exec.run(&full, if stdin.is_empty() { None } else { Some(stdin) });
    let elapsed = t.elapsed();
    match r {
        Ok(out) if out.status == 0 => (Timed::ok(elapsed), out.stdout),
        Ok(out) if out.status == 124 || out.status == 137 => (
            Timed::Timeout {
                after_s: timeout.as_secs(),
            },
            Vec::new(),
        ),
        Ok(out) => (
            Timed::Failed {
                error: format!(
                    "{} exited {}: {}",
                    argv.join(" "),
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                        .chars()
                        .take(400)
                        .collect::<String>()
                ),
            },
            Vec::new(),
        ),
        Err(e) => (
            Timed::Failed {
                error: e.to_string(),
            },
            Vec::new(),
        ),
    }
}

/// The floor command of a mode: the kernel tool that loads a payload.
pub fn floor_argv(mode: Mode) -> Vec<&'static str> {
    match mode {
        Mode::IptablesLegacy | Mode::IptablesLegacyTree => {
            vec!["iptables-legacy-restore", "--noflush", "--counters"]
        }
        Mode::IptablesNft
        | Mode::IptablesNftOne
        | Mode::IptablesNftZero
        | Mode::IptablesNftTree => {
            vec!["iptables-nft-restore", "--noflush", "--counters"]
        }
        Mode::Nftables => vec!["nft", "-f", "-"],
        Mode::Ipvs => vec!["ipvsadm", "--restore"],
        Mode::Userspace => vec!["iptables-legacy-restore", "--noflush", "--counters"],
        Mode::Direct => vec!["true"],
    }
}

fn sync_timed(
    p: &mut dyn Proxier,
    snap: &Snapshot,
    changes: &Changes,
    timeout: Duration,
) -> (Timed, Option<SyncReport>) {
    let t = Instant::now();
    let r = p.sync(snap, changes);
    let elapsed = t.elapsed();
    match r {
        Ok(rep) => (Timed::ok(elapsed), Some(rep)),
        Err(_) if elapsed >= timeout => (
            Timed::Timeout {
                after_s: timeout.as_secs(),
            },
            None,
        ),
        Err(e) => (
            Timed::Failed {
                error: e.to_string(),
            },
            None,
        ),
    }
}

fn median_f(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    v.get((v.len() - 1) / 2).copied()
}

/// The median of the finished runs, or the first non-finished outcome.
fn median_timed(v: &[Timed]) -> Timed {
    let oks: Vec<f64> = v.iter().filter_map(Timed::ms).collect();
    if oks.len() == v.len()
        && let Some(m) = median_f(oks)
    {
        return Timed::Ok { ms: m };
    }
    v.iter()
        .find(|t| t.ms().is_none())
        .cloned()
        .unwrap_or(Timed::Skipped {
            reason: "no run".into(),
        })
}

/// Settings of [`control_point`].
#[derive(Debug, Clone)]
pub struct ControlOptions {
    /// Runs per point (medians are reported).
    pub runs: usize,
    /// Timeout of each kernel-tool run.
    pub tool_timeout: Duration,
    /// Measure the peak RSS in a child process (`kp-bench rss`), given the binary.
    pub rss_binary: Option<std::path::PathBuf>,
}

/// Measures one mode at one size. Each run uses fresh namespaces.
///
/// # Errors
/// Creating a namespace fails (needs root).
pub fn control_point(
    mode: Mode,
    services: usize,
    endpoints: usize,
    opts: &ControlOptions,
) -> anyhow::Result<ControlPoint> {
    let base = scale_snapshot(services, endpoints);
    let timeout = opts.tool_timeout;
    let mut renders = Vec::new();
    let mut floors = Vec::new();
    let mut colds = Vec::new();
    let mut resyncs = Vec::new();
    let mut saves = Vec::new();
    let mut parses = Vec::new();
    let mut parses_full = Vec::new();
    let mut change_runs: Vec<Vec<Change>> = Vec::new();
    let mut payload_bytes = 0;
    let mut payload_lines = 0;
    let mut resync_bytes = 0;
    let mut resyncs_changed = Vec::new();
    let mut resync_changed_bytes = 0;
    let mut ipvs_requests = None;
    for _ in 0..opts.runs.max(1) {
        // Cold render (+ payload) without the kernel.
        let (payload, render) = crate::render_payload(mode, &base);
        renders.push(render.as_secs_f64() * 1e3);
        payload_bytes = payload.len();
        payload_lines = payload.bytes().filter(|b| *b == b'\n').count();

        // The floor: the tool alone.
        let ns = kp_testkit::Netns::new("cp-floor").context("creating a network namespace")?;
        let floor = if mode == Mode::Ipvs {
            let (p, _) = crate::ipvs_payload(&base);
            ipvs_requests = Some(p.requests);
            ipvs_floor(&ns, &p, timeout)
        } else {
            tool_in(&ns, &floor_argv(mode), payload.as_bytes(), timeout).0
        };
        drop(ns);
        drop(payload);
        let floor_done = floor.ms().is_some();
        floors.push(floor);
        if !floor_done {
            colds.push(Timed::Skipped {
                reason: "the kernel tool alone did not finish".into(),
            });
            resyncs.push(Timed::Skipped {
                reason: "the kernel tool alone did not finish".into(),
            });
            break;
        }

        // The proxier: cold full sync, full resync, one-Service changes.
        let ns = kp_testkit::Netns::new("cp-sync").context("creating a network namespace")?;
        if mode == Mode::Ipvs {
            add_node_address(&ns)?;
        }
        let mut p = proxier_in(mode, &ns, timeout, crate::POD_CIDR)?;
        let (cold, _) = sync_timed(p.as_mut(), &base, &Changes::default(), timeout);
        let cold_ok = cold.ms().is_some();
        colds.push(cold);
        if !cold_ok {
            resyncs.push(Timed::Skipped {
                reason: "the cold sync did not finish".into(),
            });
            break;
        }
        let full = Changes {
            full_resync_needed: true,
            ..Changes::default()
        };
        let (resync, rep) = sync_timed(p.as_mut(), &base, &full, timeout);
        resync_bytes = rep.map(|r| r.payload_bytes).unwrap_or_default();
        resyncs.push(resync);

        if mode == Mode::Ipvs {
            let (t, _) = tool_in(&ns, &["ipvsadm", "-S", "-n"], b"", timeout);
            saves.push(t);
        } else if mode.is_iptables() {
            let save = if mode.is_iptables_legacy() {
                "iptables-legacy-save"
            } else {
                "iptables-nft-save"
            };
            let (t, out) = tool_in(&ns, &[save, "-t", "nat"], b"", timeout);
            saves.push(t);
            let text = String::from_utf8_lossy(&out).into_owned();
            let t = Instant::now();
            let light = kp_proxier::iptables::kernel_table_for_sync(&text, Table::Nat);
            parses.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            let heavy = kp_proxier::iptables::kernel_table(&text, Table::Nat);
            parses_full.push(t.elapsed().as_secs_f64() * 1e3);
            if let (Ok(a), Ok(b)) = (&light, &heavy) {
                anyhow::ensure!(
                    a.chains == b.chains,
                    "the light and the full parser disagree on chain names"
                );
            }
        }
        change_runs.push(one_service_changes(
            p.as_mut(),
            base.clone(),
            services,
            endpoints,
            timeout,
        ));
        let (t, rep) = sync_timed(p.as_mut(), &every_service_changed(&base), &full, timeout);
        resync_changed_bytes = rep.map(|r| r.payload_bytes).unwrap_or_default();
        resyncs_changed.push(t);
        drop(p);
        drop(ns);
    }
    let changes = merge_changes(&change_runs);
    let floor = median_timed(&floors);
    let cold_sync = median_timed(&colds);
    let overhead_ratio = match (cold_sync.ms(), floor.ms()) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    let (peak_rss_mib, state_rss_mib) = match &opts.rss_binary {
        Some(bin) if floor.ms().is_some() => measure_rss(bin, mode, services, endpoints, timeout),
        _ => (None, None),
    };
    Ok(ControlPoint {
        mode: mode.label().into(),
        services,
        endpoints,
        runs: renders.len(),
        render_ms: median_f(renders).unwrap_or(f64::NAN),
        payload_bytes,
        payload_lines,
        floor,
        cold_sync,
        overhead_ratio,
        resync: median_timed(&resyncs),
        resync_bytes,
        resync_changed: if resyncs_changed.is_empty() {
            not_measured()
        } else {
            median_timed(&resyncs_changed)
        },
        resync_changed_bytes,
        save_tool: if saves.is_empty() {
            Timed::Skipped {
                reason: "not iptables or IPVS mode, or nothing loaded".into(),
            }
        } else {
            median_timed(&saves)
        },
        save_parse_ms: median_f(parses),
        save_parse_full_ms: median_f(parses_full),
        ipvs_requests,
        changes,
        peak_rss_mib,
        state_rss_mib,
    })
}

fn merge_changes(runs: &[Vec<Change>]) -> Vec<Change> {
    let Some(first) = runs.first() else {
        return Vec::new();
    };
    first
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let all: Vec<&Change> = runs.iter().filter_map(|r| r.get(i)).collect();
            let syncs: Vec<Timed> = all.iter().map(|c| c.sync.clone()).collect();
            Change {
                what: c.what.clone(),
                sync: median_timed(&syncs),
                render_ms: median_f(all.iter().filter_map(|c| c.render_ms).collect()),
                bytes: c.bytes,
            }
        })
        .collect()
}

/// Add one Service, change one endpoint of the middle Service, delete the added Service;
/// each a partial sync.
fn one_service_changes(
    p: &mut dyn Proxier,
    mut snap: Snapshot,
    services: usize,
    endpoints: usize,
    timeout: Duration,
) -> Vec<Change> {
    let mut out = Vec::new();
    let mut step = |what: &str, snap: &Snapshot, name: &NamespacedName| {
        let ch = Changes {
            services: BTreeSet::from([name.clone()]),
            ..Changes::default()
        };
        let (t, rep) = sync_timed(p, snap, &ch, timeout);
        out.push(Change {
            what: what.into(),
            sync: t,
            render_ms: rep.as_ref().map(|r| r.render_time.as_secs_f64() * 1e3),
            bytes: rep.map(|r| r.payload_bytes).unwrap_or_default(),
        });
    };
    let (info, eps) = scale_service(services, endpoints);
    let added = info.name.service.clone();
    snap.endpoints.insert(info.name.clone(), eps);
    snap.services.insert(info.name.clone(), info);
    step("add one Service", &snap, &added);
    let (info, eps) = scale_service(services / 2, endpoints);
    let mut changed: Vec<Endpoint> = eps.to_vec();
    if let Some(first) = changed.first_mut() {
        first.ip = v4([10, 255, 0, 0], 1);
    }
    snap.endpoints.insert(info.name.clone(), changed.into());
    step("change one endpoint", &snap, &info.name.service);
    snap.services.retain(|k, _| k.service != added);
    snap.endpoints.retain(|k, _| k.service != added);
    step("delete one Service", &snap, &added);
    out
}

/// `snap` with the first endpoint of every Service moved to another address: each Service's
/// `KUBE-SVC` chain changes, one `KUBE-SEP` chain is new and one stale.
fn every_service_changed(snap: &Snapshot) -> Snapshot {
    let mut out = snap.clone();
    for (i, eps) in out.endpoints.values_mut().enumerate() {
        let mut moved: Vec<Endpoint> = eps.to_vec();
        if let Some(first) = moved.first_mut() {
            first.ip = crate::v4([10, 254, 0, 0], i);
        }
        *eps = moved.into();
    }
    out
}

/// Runs `BIN rss --mode M --services N --endpoints E` and reads the two VmHWM lines it prints.
fn measure_rss(
    bin: &std::path::Path,
    mode: Mode,
    services: usize,
    endpoints: usize,
    timeout: Duration,
) -> (Option<f64>, Option<f64>) {
    let out = Command::new(bin)
        .args([
            "rss",
            "--mode",
            mode.label(),
            "--services",
            &services.to_string(),
            "--endpoints",
            &endpoints.to_string(),
            "--tool-timeout",
            &timeout.as_secs().to_string(),
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output();
    let Ok(out) = out else {
        return (None, None);
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let get = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    (get("peak_rss_mib="), get("state_rss_mib="))
}

/// VmHWM of this process, MiB.
pub fn vm_hwm_mib() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: f64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

/// The body of `kp-bench rss`: build the tracker state from source events (as the daemon
/// does), check out a snapshot, record VmHWM, run one full sync of `mode` into a fresh
/// namespace, record VmHWM again. Prints `state_rss_mib=` and `peak_rss_mib=`.
///
/// # Errors
/// Namespace creation or the sync fails.
pub fn rss_child(
    mode: Mode,
    services: usize,
    endpoints: usize,
    timeout: Duration,
) -> anyhow::Result<(f64, f64)> {
    let mut tracker = kp_track::Tracker::new(IpFamily::V4, crate::NODE);
    // Objects one at a time, as a source delivers them (no list of all events held).
    for i in 0..services {
        let (svc, slice) = crate::scale_objects(i, endpoints);
        tracker.apply(kp_model::SourceEvent::ServiceUpsert(svc));
        tracker.apply(kp_model::SourceEvent::SliceUpsert(slice));
    }
    tracker.apply(kp_model::SourceEvent::Synced(kp_model::ObjectKind::Service));
    tracker.apply(kp_model::SourceEvent::Synced(
        kp_model::ObjectKind::EndpointSlice,
    ));
    let (snap, changes) = tracker.checkout();
    let state = vm_hwm_mib().unwrap_or(f64::NAN);
    let ns = kp_testkit::Netns::new("rss").context("creating a network namespace")?;
    let mut p = proxier_in(mode, &ns, timeout, crate::POD_CIDR)?;
    p.sync(&snap, &changes)?;
    let peak = vm_hwm_mib().unwrap_or(f64::NAN);
    drop(p);
    drop(ns);
    Ok((state, peak))
}
