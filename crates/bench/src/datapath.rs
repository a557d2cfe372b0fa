//! Datapath benchmark (W3–W5 of the performance anchors): with N background Services
//! programmed by a mode, the new-connection latency through one ClusterIP, requests per
//! second with and without keepalive, CPU per 1,000 new connections, and bulk throughput on
//! long-lived connections.
//!
//! Layout: [`kp_testkit::Topology`] with a `client`, the `node` (where the proxier programs
//! its rules) and ten backend namespaces running [`HttpBackend`]s. Two probed Services point
//! at the ten backends: `a-probe/first` sorts before every background Service (first in
//! iptables' `KUBE-SERVICES`, the best case) and `zz-probe/last` after all of them (last,
//! the worst case: a new connection walks every rule before it).
//!
//! A latency probe is a TCP connect from the client namespace, timed from `connect()` to
//! its return (SYN → SYN/ACK through the DNAT), from a source port used once per
//! namespace lifetime, so every probe misses conntrack; the connection is then reset
//! (`SO_LINGER` 0) so nothing lingers in TIME_WAIT.
//!
//! A request probe is one HTTP request on a new connection (connect, `GET`, the whole
//! response, `Connection: close`), timed end to end: in userspace mode the SYN/ACK comes from
//! the proxy socket, before the relay has even dialed a backend, so only this probe sees the
//! relay's per-connection work.
//!
//! Bulk throughput: every backend also runs a [`StreamBackend`] on port 9000 (it writes a
//! fixed buffer in a loop until the client closes), and each probed Service has a second
//! port, `stream` 9000/TCP, pointing at them. One or more client threads each open one
//! connection to it and read as fast as they can for [`DatapathOptions::bulk_seconds`]
//! (after a short warm-up); the result is MB/s (10^6 bytes per second) over all streams.
//!
//! IPVS mode has no rule walk: both positions cost the same (a hash lookup), so a run may
//! measure only `last` ([`DatapathOptions::positions`]), the worst case of the rule-walking
//! modes.
//!
//! The [`Mode::Direct`] baseline loads nothing: its one position, `pod`, targets the ten
//! backend pods' IP:port directly (round robin, client side), with the same probes.
//!
//! CPU: machine-wide busy time from `/proc/stat` (which includes everything: the client, the
//! backends, the kernel's softirq work and, in userspace mode, the relay); the benchmark
//! process's own CPU time (`getrusage(RUSAGE_SELF)`: client and backend threads, and the
//! relay in userspace mode); and, in userspace mode, the relay runtime's threads alone
//! ([`RelayThreads`], from `/proc/self/task/<tid>/schedstat`).
//!
//! Rounds: [`datapath_points`] sets every mode of a size up at once ([`Prepared`], each in its
//! own topology) and measures them in [`DatapathOptions::rounds`] rounds, round `r` of every
//! mode before round `r + 1` of any, each round with its share of the probes and seconds;
//! percentiles are over the probes of all rounds, rates the median of the rounds'.
//!
//! Sysctls, set only inside the benchmark's namespaces: client
//! `net.ipv4.ip_local_port_range = 1024 65000`, `net.ipv4.tcp_tw_reuse = 1`; backends
//! `net.core.somaxconn = 4096`; node `net.netfilter.nf_conntrack_max = 262144` (where the
//! kernel lets a namespace set it; recorded in the results; not for the direct baseline).

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use kp_model::{
    Changes, Endpoint, NamespacedName, Protocol, ServicePortInfo, ServicePortName, ServiceType,
    SessionAffinity, Snapshot,
};
use kp_testkit::{HttpBackend, Netns, Topology};
use nix::sys::socket::{
    AddressFamily, SockFlag, SockType, SockaddrIn, bind, connect, setsockopt, socket, sockopt,
};
use serde::{Deserialize, Serialize};

use crate::control::{Timed, proxier_with_relay_in};
use crate::stream::StreamBackend;
use crate::userspace::RelayThreads;
use crate::{Mode, scale_snapshot};

/// The probed Services' port and the backends' port.
const SERVICE_PORT: u16 = 80;
const BACKEND_PORT: u16 = 8080;
/// The probed Services' `stream` port and the stream backends' port.
const STREAM_PORT: u16 = 9000;
/// Endpoints of a probed Service unless [`DatapathOptions::probe_endpoints`] says otherwise:
/// one per backend namespace.
pub const DEFAULT_PROBE_ENDPOINTS: usize = 10;
/// Backend namespaces of the datapath topology.
const BACKEND_NAMESPACES: usize = 10;

/// The first source port of latency probes.
const PROBE_PORT_BASE: u16 = 10_000;
/// The position label of the [`Mode::Direct`] baseline.
pub const DIRECT_POSITION: &str = "pod";

/// Settings of [`datapath_point`].
#[derive(Debug, Clone)]
pub struct DatapathOptions {
    /// Latency probes per position (connect probes, and as many request probes).
    pub probes: usize,
    /// Endpoints of each probed Service (default [`DEFAULT_PROBE_ENDPOINTS`]): spread over
    /// the ten backend namespaces, each holding as many pod IPs as it takes (a server on
    /// every IP), so that the per-connection cost of picking among many endpoints shows.
    pub probe_endpoints: usize,
    /// Seconds of each requests-per-second run.
    pub rps_seconds: f64,
    /// Client threads of the requests-per-second runs.
    pub concurrency: usize,
    /// Timeout of each kernel-tool run.
    pub tool_timeout: Duration,
    /// Positions to probe (`first`, `last`).
    pub positions: Vec<String>,
    /// Also run the keepalive requests-per-second measurement (otherwise reported empty).
    pub keepalive: bool,
    /// Seconds of each bulk-throughput measurement; 0: none.
    pub bulk_seconds: f64,
    /// Parallel connections of the bulk-throughput measurements, one measurement each.
    pub bulk_streams: Vec<usize>,
    /// Rounds: every budget above (probes, seconds) is split into this many rounds, and
    /// [`datapath_points`] runs round `r` of every mode before round `r + 1` of any, so that
    /// a burst of load from elsewhere on the machine hits every mode alike. Latency
    /// percentiles are over the probes of all rounds; rates are the median of the rounds'.
    pub rounds: usize,
}

impl DatapathOptions {
    fn round_count(&self) -> usize {
        self.rounds.max(1)
    }

    /// The probes of round `r` (the remainder goes to the first rounds).
    fn probes_in(&self, r: usize) -> usize {
        let n = self.round_count();
        self.probes / n + usize::from(r < self.probes % n)
    }
}

fn nan() -> f64 {
    f64::NAN
}

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Percentiles {
    /// Successful probes.
    pub n: usize,
    /// Probes that failed (timeout, refused).
    pub failed: usize,
    /// 1st percentile.
    #[serde(deserialize_with = "crate::report::nan_f64")]
    pub p01_us: f64,
    /// Median.
    #[serde(deserialize_with = "crate::report::nan_f64")]
    pub p50_us: f64,
    /// 90th percentile.
    #[serde(deserialize_with = "crate::report::nan_f64")]
    pub p90_us: f64,
    /// 99th percentile.
    #[serde(deserialize_with = "crate::report::nan_f64")]
    pub p99_us: f64,
}

impl Percentiles {
    /// Not measured: no probes, NaN percentiles.
    pub fn not_measured() -> Percentiles {
        Percentiles {
            n: 0,
            failed: 0,
            p01_us: f64::NAN,
            p50_us: f64::NAN,
            p90_us: f64::NAN,
            p99_us: f64::NAN,
        }
    }

    /// The percentiles of `results` (one per probe; `None`: the probe failed).
    fn of(results: &[Option<f64>]) -> Percentiles {
        let mut ok: Vec<f64> = results.iter().flatten().copied().collect();
        ok.sort_by(f64::total_cmp);
        Percentiles {
            n: ok.len(),
            failed: results.len().saturating_sub(ok.len()),
            p01_us: percentile(&ok, 0.01),
            p50_us: percentile(&ok, 0.50),
            p90_us: percentile(&ok, 0.90),
            p99_us: percentile(&ok, 0.99),
        }
    }
}

/// Requests per second and the CPU it took.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Throughput {
    /// Completed requests.
    pub requests: u64,
    /// Failed requests.
    pub failed: u64,
    /// New TCP connections made.
    pub connections: u64,
    /// Requests per second.
    #[serde(deserialize_with = "crate::report::nan_f64")]
    pub rps: f64,
    /// Machine-wide busy CPU (user+nice+system+irq+softirq+steal, `/proc/stat`) during the
    /// run, milliseconds. Includes the userspace relay (it runs on this machine).
    #[serde(deserialize_with = "crate::report::nan_f64")]
    pub cpu_busy_ms: f64,
    /// Of which system time.
    #[serde(deserialize_with = "crate::report::nan_f64")]
    pub cpu_system_ms: f64,
    /// Of which softirq time.
    #[serde(deserialize_with = "crate::report::nan_f64")]
    pub cpu_softirq_ms: f64,
    /// Busy CPU per 1,000 new connections (close mode) or per 1,000 requests (keepalive),
    /// milliseconds.
    #[serde(deserialize_with = "crate::report::nan_f64")]
    pub cpu_ms_per_1k: f64,
    /// CPU time of the benchmark process (`getrusage(RUSAGE_SELF)`, user + system: client
    /// and backend threads, and the relay in userspace mode) during the run, milliseconds.
    #[serde(default = "nan", deserialize_with = "crate::report::nan_f64")]
    pub process_cpu_ms: f64,
    /// Userspace mode: CPU time of the relay runtime's threads during the run,
    /// milliseconds (NaN in the other modes, whose proxying is kernel work inside the
    /// machine-wide figure).
    #[serde(default = "nan", deserialize_with = "crate::report::nan_f64")]
    pub proxy_cpu_ms: f64,
    /// Requests per second of each round ([`DatapathOptions::rounds`]); `rps` is their
    /// median.
    #[serde(default)]
    pub round_rps: Vec<f64>,
}

impl Throughput {
    /// A measurement that was not run (zero requests, NaN rates).
    pub fn not_measured() -> Throughput {
        Throughput {
            requests: 0,
            failed: 0,
            connections: 0,
            rps: f64::NAN,
            cpu_busy_ms: f64::NAN,
            cpu_system_ms: f64::NAN,
            cpu_softirq_ms: f64::NAN,
            cpu_ms_per_1k: f64::NAN,
            process_cpu_ms: f64::NAN,
            proxy_cpu_ms: f64::NAN,
            round_rps: Vec::new(),
        }
    }

    /// One measurement from its rounds: counts and CPU summed, `rps` the median of the
    /// rounds' rates, CPU per 1,000 requests (`keepalive`) or new connections.
    fn merge(rounds: &[Throughput], keepalive: bool) -> Throughput {
        if rounds.is_empty() {
            return Throughput::not_measured();
        }
        let sum_u = |f: fn(&Throughput) -> u64| rounds.iter().map(f).sum::<u64>();
        let sum_f = |f: fn(&Throughput) -> f64| rounds.iter().map(f).sum::<f64>();
        let requests = sum_u(|t| t.requests);
        let connections = sum_u(|t| t.connections);
        let busy = sum_f(|t| t.cpu_busy_ms);
        let per = if keepalive { requests } else { connections };
        let round_rps: Vec<f64> = rounds.iter().map(|t| t.rps).collect();
        Throughput {
            requests,
            failed: sum_u(|t| t.failed),
            connections,
            rps: median_f64(&round_rps),
            cpu_busy_ms: busy,
            cpu_system_ms: sum_f(|t| t.cpu_system_ms),
            cpu_softirq_ms: sum_f(|t| t.cpu_softirq_ms),
            cpu_ms_per_1k: if per > 0 {
                busy / per as f64 * 1000.0
            } else {
                f64::NAN
            },
            process_cpu_ms: sum_f(|t| t.process_cpu_ms),
            proxy_cpu_ms: sum_f(|t| t.proxy_cpu_ms),
            round_rps,
        }
    }

    /// `ms` per 1,000 new connections (for the new-connection runs); NaN without any.
    pub fn per_1k_connections(&self, ms: f64) -> f64 {
        if self.connections == 0 {
            f64::NAN
        } else {
            ms / self.connections as f64 * 1000.0
        }
    }
}

/// Bulk throughput: `streams` long-lived connections reading from the stream backends.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Bulk {
    /// Parallel connections.
    pub streams: usize,
    /// Connections that could not be opened or ended before the run did.
    pub failed: usize,
    /// The measured window (after the warm-up), seconds.
    #[serde(deserialize_with = "crate::report::nan_f64")]
    pub seconds: f64,
    /// Bytes read by all streams in the window.
    pub bytes: u64,
    /// Throughput, MB/s (10^6 bytes per second).
    #[serde(deserialize_with = "crate::report::nan_f64")]
    pub mb_per_s: f64,
    /// Machine-wide busy CPU in the window, milliseconds.
    #[serde(deserialize_with = "crate::report::nan_f64")]
    pub cpu_busy_ms: f64,
    /// The benchmark process's CPU time in the window, milliseconds.
    #[serde(deserialize_with = "crate::report::nan_f64")]
    pub process_cpu_ms: f64,
    /// Userspace mode: the relay runtime's CPU time in the window, milliseconds (NaN
    /// otherwise).
    #[serde(deserialize_with = "crate::report::nan_f64")]
    pub proxy_cpu_ms: f64,
    /// MB/s of each round ([`DatapathOptions::rounds`]); `mb_per_s` is their median.
    #[serde(default)]
    pub round_mb_per_s: Vec<f64>,
}

impl Bulk {
    /// One measurement from its rounds: bytes, seconds and CPU summed, `mb_per_s` the
    /// median of the rounds' rates.
    fn merge(rounds: &[Bulk]) -> Option<Bulk> {
        let first = rounds.first()?;
        let sum_f = |f: fn(&Bulk) -> f64| rounds.iter().map(f).sum::<f64>();
        let round_mb_per_s: Vec<f64> = rounds.iter().map(|b| b.mb_per_s).collect();
        Some(Bulk {
            streams: first.streams,
            failed: rounds.iter().map(|b| b.failed).sum(),
            seconds: sum_f(|b| b.seconds),
            bytes: rounds.iter().map(|b| b.bytes).sum(),
            mb_per_s: median_f64(&round_mb_per_s),
            cpu_busy_ms: sum_f(|b| b.cpu_busy_ms),
            process_cpu_ms: sum_f(|b| b.process_cpu_ms),
            proxy_cpu_ms: sum_f(|b| b.proxy_cpu_ms),
            round_mb_per_s,
        })
    }

    /// `ms` per GB (10^9 bytes) moved; NaN when nothing moved.
    pub fn per_gb(&self, ms: f64) -> f64 {
        if self.bytes == 0 {
            f64::NAN
        } else {
            ms / (self.bytes as f64 / 1e9)
        }
    }
}

/// One position (first or last; `pod` for the direct baseline) of one mode at one size.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PositionResult {
    /// `first` or `last` in KUBE-SERVICES order; [`DIRECT_POSITION`] for the baseline.
    pub position: String,
    /// The probed ClusterIP (the baseline: the range of pod IPs).
    pub cluster_ip: String,
    /// New-connection (connect) latency.
    pub connect: Percentiles,
    /// One HTTP request on a new connection, end to end.
    #[serde(default = "Percentiles::not_measured")]
    pub request: Percentiles,
    /// Requests on kept-alive connections.
    pub keepalive: Throughput,
    /// A new connection per request.
    pub close: Throughput,
    /// Bulk throughput, one entry per [`DatapathOptions::bulk_streams`].
    #[serde(default)]
    pub bulk: Vec<Bulk>,
}

/// The datapath results of one mode at one size.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DatapathPoint {
    /// Mode label.
    pub mode: String,
    /// Background Services (each with 10 endpoints), besides the two probed ones (the
    /// direct baseline loads none; the size only places it beside the modes it ran with).
    pub services: usize,
    /// Endpoints of each probed Service (the direct baseline: pod IPs it rotates over).
    #[serde(default = "default_probe_endpoints")]
    pub probe_endpoints: usize,
    /// Loading the rules (the proxier's full sync; 0 ms for the direct baseline).
    pub load: Timed,
    /// Sysctls that could not be set in the namespaces (kernel refused), if any.
    pub sysctl_warnings: Vec<String>,
    /// Per position; empty when the rules could not be loaded.
    pub positions: Vec<PositionResult>,
}

fn default_probe_endpoints() -> usize {
    DEFAULT_PROBE_ENDPOINTS
}

/// The pod IPs of backend `i` when the probed Services have `endpoints` endpoints: the
/// first is the topology's automatic one (10.244.1.(10+i)); further ones are
/// 10.244.(1+k).(10+i), so that `endpoints` IPs are spread over the ten backends.
fn backend_ips(i: usize, endpoints: usize) -> Vec<IpAddr> {
    let per = endpoints.max(1).div_ceil(BACKEND_NAMESPACES);
    (0..per)
        .filter(|k| k * BACKEND_NAMESPACES + i < endpoints.max(BACKEND_NAMESPACES))
        .map(|k| IpAddr::V4(Ipv4Addr::new(10, 244, 1 + k as u8, 10 + i as u8)))
        .collect()
}

fn service_port_info(spn: &ServicePortName, ip: Ipv4Addr, port: u16) -> ServicePortInfo {
    ServicePortInfo {
        name: spn.clone(),
        service_type: ServiceType::ClusterIp,
        cluster_ip: IpAddr::V4(ip),
        port,
        node_port: None,
        external_ips: Vec::new(),
        load_balancer_vips: Vec::new(),
        load_balancer_source_ranges: Vec::new(),
        session_affinity: SessionAffinity::None,
        external_policy_local: false,
        internal_policy_local: false,
        health_check_node_port: None,
        traffic_distribution: None,
    }
}

/// Adds the two probed Services (ports `http` 80 → 8080 and `stream` 9000 → 9000), with the
/// topology's backends as endpoints.
fn add_probed(snap: &mut Snapshot, backends: &[IpAddr]) -> [(String, IpAddr); 2] {
    let probes = [
        ("a-probe", "first", Ipv4Addr::new(10, 111, 255, 1)),
        ("zz-probe", "last", Ipv4Addr::new(10, 111, 255, 2)),
    ];
    for (ns, name, ip) in probes {
        for (port_name, port, target) in [
            ("http", SERVICE_PORT, BACKEND_PORT),
            ("stream", STREAM_PORT, STREAM_PORT),
        ] {
            let spn = ServicePortName::new(NamespacedName::new(ns, name), port_name, Protocol::Tcp);
            let info = service_port_info(&spn, ip, port);
            let mut eps: Vec<Endpoint> = backends
                .iter()
                .map(|ip| Endpoint {
                    ip: *ip,
                    port: target,
                    is_local: true,
                    ready: true,
                    serving: true,
                    terminating: false,
                    topology: None,
                })
                .collect();
            eps.sort_by_key(|e| e.to_string());
            snap.endpoints.insert(spn.clone(), eps.into());
            snap.services.insert(spn, Arc::new(info));
        }
    }
    probes.map(|(_, pos, ip)| (pos.to_string(), IpAddr::V4(ip)))
}

/// Machine-wide CPU counters from `/proc/stat` (jiffies).
#[derive(Debug, Clone, Copy, Default)]
struct CpuStat {
    busy: u64,
    system: u64,
    softirq: u64,
}

fn cpu_stat() -> CpuStat {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = text.lines().find(|l| l.starts_with("cpu ")) else {
        return CpuStat::default();
    };
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let get = |i: usize| v.get(i).copied().unwrap_or(0);
    // user nice system idle iowait irq softirq steal
    CpuStat {
        busy: get(0) + get(1) + get(2) + get(5) + get(6) + get(7),
        system: get(2),
        softirq: get(6),
    }
}

fn jiffies_ms(j: u64) -> f64 {
    // USER_HZ is 100 on Linux.
    j as f64 * 10.0
}

/// This process's CPU time (user + system), microseconds.
fn process_cpu_us() -> u64 {
    use nix::sys::resource::{UsageWho, getrusage};
    let Ok(u) = getrusage(UsageWho::RUSAGE_SELF) else {
        return 0;
    };
    let us = |t: nix::sys::time::TimeVal| {
        u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000 + u64::try_from(t.tv_usec()).unwrap_or(0)
    };
    us(u.user_time()) + us(u.system_time())
}

/// The three CPU counters at one instant.
#[derive(Debug, Clone, Copy)]
struct CpuSample {
    machine: CpuStat,
    process_us: u64,
    proxy_ns: Option<u64>,
}

/// CPU used between two samples, milliseconds.
#[derive(Debug, Clone, Copy)]
struct CpuUsed {
    busy: f64,
    system: f64,
    softirq: f64,
    process: f64,
    proxy: f64,
}

impl CpuSample {
    fn take(proxy: Option<&RelayThreads>) -> CpuSample {
        CpuSample {
            machine: cpu_stat(),
            process_us: process_cpu_us(),
            proxy_ns: proxy.map(RelayThreads::cpu_ns),
        }
    }

    fn since(&self, before: &CpuSample) -> CpuUsed {
        CpuUsed {
            busy: jiffies_ms(self.machine.busy.saturating_sub(before.machine.busy)),
            system: jiffies_ms(self.machine.system.saturating_sub(before.machine.system)),
            softirq: jiffies_ms(self.machine.softirq.saturating_sub(before.machine.softirq)),
            process: self.process_us.saturating_sub(before.process_us) as f64 / 1e3,
            proxy: match (self.proxy_ns, before.proxy_ns) {
                (Some(a), Some(b)) => a.saturating_sub(b) as f64 / 1e6,
                _ => f64::NAN,
            },
        }
    }
}

/// The median of `v` (the mean of the two middle values for an even count); NaN when empty.
fn median_f64(v: &[f64]) -> f64 {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(idx).copied().unwrap_or(f64::NAN)
}

/// One timed connect from `src_port` to `target`, then a reset. Returns microseconds.
fn probe_connect(src_port: u16, target: SocketAddrV4) -> Option<f64> {
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .ok()?;
    setsockopt(&fd, sockopt::ReuseAddr, &true).ok()?;
    setsockopt(
        &fd,
        sockopt::SendTimeout,
        &nix::sys::time::TimeVal::new(2, 0),
    )
    .ok()?;
    setsockopt(
        &fd,
        sockopt::Linger,
        &nix::libc::linger {
            l_onoff: 1,
            l_linger: 0,
        },
    )
    .ok()?;
    use std::os::fd::AsRawFd as _;
    bind(
        fd.as_raw_fd(),
        &SockaddrIn::from(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, src_port)),
    )
    .ok()?;
    let t = Instant::now();
    let r = connect(fd.as_raw_fd(), &SockaddrIn::from(target));
    let us = t.elapsed().as_secs_f64() * 1e6;
    drop(fd);
    r.ok().map(|_| us)
}

/// `probes` connect probes from the client, probe `k` to `targets[k % len]` from source port
/// `port_base + k`.
fn latency(
    client: &Netns,
    targets: &[SocketAddrV4],
    probes: usize,
    port_base: u16,
) -> Vec<Option<f64>> {
    client
        .in_ns(|| {
            (0..probes)
                .map(|k| {
                    let target = targets[k % targets.len()];
                    probe_connect(port_base.wrapping_add(k as u16), target)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `probes` request probes ([`one_close_request`], timed), probe `k` to `targets[k % len]`.
fn request_latency(client: &Netns, targets: &[SocketAddr], probes: usize) -> Vec<Option<f64>> {
    client
        .in_ns(|| {
            (0..probes)
                .map(|k| {
                    let t = Instant::now();
                    one_close_request(targets[k % targets.len()])
                        .then(|| t.elapsed().as_secs_f64() * 1e6)
                })
                .collect()
        })
        .unwrap_or_default()
}

const REQUEST_CLOSE: &[u8] = b"GET / HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n";
const REQUEST_KEEP: &[u8] = b"GET / HTTP/1.1\r\nHost: bench\r\nConnection: keep-alive\r\n\r\n";

/// Reads one response with a Content-Length body from `s` (keep-alive).
fn read_response(s: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    buf.clear();
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                return true;
            }
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// One HTTP request on a new connection (`Connection: close`): connect, send, read the whole
/// response; whether it was a 200.
fn one_close_request(target: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&target, Duration::from_secs(2)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(REQUEST_CLOSE).is_err() {
        return false;
    }
    let mut buf = Vec::with_capacity(256);
    s.read_to_end(&mut buf).is_ok() && buf.starts_with(b"HTTP/1.1 200")
}

/// Runs `concurrency` client threads in `client` for `seconds`, each a loop of requests;
/// keepalive: one connection per thread (re-opened if the server closes it). Thread `i`
/// starts at `targets[i % len]` and moves to the next target with every new connection.
fn throughput(
    client: &Netns,
    targets: &Arc<[SocketAddr]>,
    keepalive: bool,
    concurrency: usize,
    seconds: f64,
    proxy: Option<&RelayThreads>,
) -> Throughput {
    let stop = Arc::new(AtomicBool::new(false));
    let requests = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let conns = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    let before = CpuSample::take(proxy);
    let start = Instant::now();
    for i in 0..concurrency.max(1) {
        let (stop, requests, failed, conns) = (
            stop.clone(),
            requests.clone(),
            failed.clone(),
            conns.clone(),
        );
        let targets = Arc::clone(targets);
        let h = client.spawn_in(move || {
            let mut buf = Vec::with_capacity(512);
            let mut stream: Option<TcpStream> = None;
            let mut next = i;
            let mut target = || {
                let t = targets[next % targets.len()];
                next += 1;
                t
            };
            while !stop.load(Ordering::Relaxed) {
                if !keepalive {
                    conns.fetch_add(1, Ordering::Relaxed);
                    if one_close_request(target()) {
                        requests.fetch_add(1, Ordering::Relaxed);
                    } else {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    continue;
                }
                if stream.is_none() {
                    conns.fetch_add(1, Ordering::Relaxed);
                    stream = TcpStream::connect_timeout(&target(), Duration::from_secs(2)).ok();
                    if let Some(s) = &stream {
                        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                        let _ = s.set_nodelay(true);
                    }
                }
                let ok = match stream.as_mut() {
                    Some(s) => s.write_all(REQUEST_KEEP).is_ok() && read_response(s, &mut buf),
                    None => false,
                };
                if ok {
                    requests.fetch_add(1, Ordering::Relaxed);
                } else {
                    failed.fetch_add(1, Ordering::Relaxed);
                    stream = None;
                }
            }
        });
        if let Ok(h) = h {
            handles.push(h);
        }
    }
    std::thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        let _ = h.join();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let used = CpuSample::take(proxy).since(&before);
    let requests = requests.load(Ordering::Relaxed);
    let connections = conns.load(Ordering::Relaxed);
    let per = if keepalive { requests } else { connections };
    Throughput {
        requests,
        failed: failed.load(Ordering::Relaxed),
        connections,
        rps: requests as f64 / elapsed.max(1e-9),
        cpu_busy_ms: used.busy,
        cpu_system_ms: used.system,
        cpu_softirq_ms: used.softirq,
        cpu_ms_per_1k: if per > 0 {
            used.busy / per as f64 * 1000.0
        } else {
            f64::NAN
        },
        process_cpu_ms: used.process,
        proxy_cpu_ms: used.proxy,
        round_rps: Vec::new(),
    }
}

/// Bytes per `read` of a bulk stream.
const BULK_READ: usize = 256 * 1024;

/// `streams` client threads, each with one connection to `targets[i % len]`, read as fast as
/// they can; bytes are counted over `seconds` after a warm-up of a fifth of that (at most
/// 0.5 s), once every stream has connected.
fn bulk(
    client: &Netns,
    targets: &[SocketAddr],
    streams: usize,
    seconds: f64,
    proxy: Option<&RelayThreads>,
) -> Bulk {
    let stop = Arc::new(AtomicBool::new(false));
    let bytes = Arc::new(AtomicU64::new(0));
    let connected = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let streams = streams.max(1);
    let mut handles = Vec::new();
    for i in 0..streams {
        let target = targets[i % targets.len()];
        let (t_stop, t_bytes, t_connected, t_failed) = (
            stop.clone(),
            bytes.clone(),
            connected.clone(),
            failed.clone(),
        );
        let h = client.spawn_in(move || {
            let Ok(mut s) = TcpStream::connect_timeout(&target, Duration::from_secs(2)) else {
                t_failed.fetch_add(1, Ordering::Relaxed);
                return;
            };
            t_connected.fetch_add(1, Ordering::Relaxed);
            let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
            let mut buf = vec![0u8; BULK_READ];
            while !t_stop.load(Ordering::Relaxed) {
                match s.read(&mut buf) {
                    Ok(0) => {
                        t_failed.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    Ok(n) => {
                        t_bytes.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock
                                | std::io::ErrorKind::TimedOut
                                | std::io::ErrorKind::Interrupted
                        ) => {}
                    Err(_) => {
                        t_failed.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                }
            }
        });
        match h {
            Ok(h) => handles.push(h),
            Err(_) => {
                failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while connected.load(Ordering::Relaxed) + failed.load(Ordering::Relaxed) < streams
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_secs_f64((seconds / 5.0).min(0.5)));
    let b0 = bytes.load(Ordering::Relaxed);
    let before = CpuSample::take(proxy);
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    let b1 = bytes.load(Ordering::Relaxed);
    let used = CpuSample::take(proxy).since(&before);
    let window = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        let _ = h.join();
    }
    let moved = b1.saturating_sub(b0);
    let mb_per_s = moved as f64 / window.max(1e-9) / 1e6;
    Bulk {
        streams,
        failed: failed.load(Ordering::Relaxed),
        seconds: window,
        bytes: moved,
        mb_per_s,
        cpu_busy_ms: used.busy,
        process_cpu_ms: used.process,
        proxy_cpu_ms: used.proxy,
        round_mb_per_s: vec![mb_per_s],
    }
}

/// The targets of one measured position: the HTTP and the stream addresses (one each for a
/// ClusterIP; every backend for the direct baseline).
struct Targets {
    http: Vec<SocketAddrV4>,
    stream: Vec<SocketAddr>,
}

/// One position to measure and its raw samples, accumulated over the rounds.
struct Position {
    name: String,
    label: String,
    targets: Targets,
    /// The first source port of its connect probes (unique per client namespace).
    port_base: u16,
    connect: Vec<Option<f64>>,
    request: Vec<Option<f64>>,
    keepalive: Vec<Throughput>,
    close: Vec<Throughput>,
    /// Per entry of [`DatapathOptions::bulk_streams`], the rounds.
    bulk: Vec<Vec<Bulk>>,
}

impl Position {
    fn new(name: &str, label: String, targets: Targets, port_base: u16) -> Position {
        Position {
            name: name.into(),
            label,
            targets,
            port_base,
            connect: Vec::new(),
            request: Vec::new(),
            keepalive: Vec::new(),
            close: Vec::new(),
            bulk: Vec::new(),
        }
    }

    /// Round `r`: warm-up, connect probes, request probes, keepalive and new-connection
    /// requests per second, bulk throughput, with round `r`'s share of every budget.
    fn measure_round(
        &mut self,
        client: &Netns,
        opts: &DatapathOptions,
        r: usize,
        proxy: Option<&RelayThreads>,
    ) {
        let rounds = opts.round_count() as f64;
        let http: Arc<[SocketAddr]> = self
            .targets
            .http
            .iter()
            .map(|a| SocketAddr::V4(*a))
            .collect();
        // Warm up (ARP, backend threads, the relay's listener), from ephemeral ports.
        let _ = client.in_ns(|| {
            for k in 0..10 {
                let _ = one_close_request(http[k % http.len()]);
            }
        });
        let probes = opts.probes_in(r);
        let base = self.port_base.wrapping_add(self.connect.len() as u16);
        self.connect
            .extend(latency(client, &self.targets.http, probes, base));
        self.request.extend(request_latency(client, &http, probes));
        let seconds = opts.rps_seconds / rounds;
        if opts.keepalive {
            self.keepalive.push(throughput(
                client,
                &http,
                true,
                opts.concurrency,
                seconds,
                proxy,
            ));
        }
        self.close.push(throughput(
            client,
            &http,
            false,
            opts.concurrency,
            seconds,
            proxy,
        ));
        if opts.bulk_seconds > 0.0 && !self.targets.stream.is_empty() {
            self.bulk.resize_with(opts.bulk_streams.len(), Vec::new);
            for (i, &n) in opts.bulk_streams.iter().enumerate() {
                let b = bulk(
                    client,
                    &self.targets.stream,
                    n,
                    opts.bulk_seconds / rounds,
                    proxy,
                );
                self.bulk[i].push(b);
            }
        }
    }

    fn result(&self) -> PositionResult {
        PositionResult {
            position: self.name.clone(),
            cluster_ip: self.label.clone(),
            connect: Percentiles::of(&self.connect),
            request: Percentiles::of(&self.request),
            keepalive: Throughput::merge(&self.keepalive, true),
            close: Throughput::merge(&self.close, false),
            bulk: self.bulk.iter().filter_map(|r| Bulk::merge(r)).collect(),
        }
    }
}

/// One mode's topology, backends and rules at one size, ready to be measured round by
/// round; dropping it stops the proxier (and the relay), the backends, then the namespaces.
pub struct Prepared {
    mode: Mode,
    services: usize,
    probe_endpoints: usize,
    load: Timed,
    warnings: Vec<String>,
    positions: Vec<Position>,
    relay: Option<RelayThreads>,
    // Dropped in this order: the proxier first, the backends, the namespaces last.
    proxier: Option<Box<dyn kp_proxier::Proxier>>,
    _stream_servers: Vec<StreamBackend>,
    _http_servers: Vec<HttpBackend>,
    topo: Topology,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("mode", &self.mode)
            .field("services", &self.services)
            .field("load", &self.load)
            .finish()
    }
}

impl Prepared {
    /// Builds the topology for `mode` with `services` background Services, starts the
    /// backends and loads the rules ([`Mode::Direct`]: none; its position targets the pods).
    ///
    /// # Errors
    /// Building the topology (needs root) or starting the backends fails.
    pub fn new(mode: Mode, services: usize, opts: &DatapathOptions) -> anyhow::Result<Prepared> {
        anyhow::ensure!(
            (1..=2540).contains(&opts.probe_endpoints),
            "the probed Services need 1 to 2,540 endpoints, not {}",
            opts.probe_endpoints
        );
        let topo = (0..BACKEND_NAMESPACES)
            .fold(Topology::builder(), |b, i| {
                b.backend(backend_ips(i, opts.probe_endpoints))
            })
            .build()
            .context("building the namespace topology")?;
        let mut warnings = Vec::new();
        let mut set = |ns: &Netns, key: &str, value: &str| {
            if let Err(e) = ns.sysctl(key, value) {
                warnings.push(format!("{} {key}={value}: {e}", ns.role()));
            }
        };
        set(topo.client(), "net.ipv4.ip_local_port_range", "1024 65000");
        set(topo.client(), "net.ipv4.tcp_tw_reuse", "1");
        if mode.has_rules() {
            set(topo.node(), "net.netfilter.nf_conntrack_max", "262144");
        }
        for b in topo.backends() {
            set(b.ns(), "net.core.somaxconn", "4096");
        }
        let http_servers = topo.start_http(BACKEND_PORT)?;
        // Every pod IP of every backend, IP by IP across the backends (the first
        // `probe_endpoints` of them are the probed Services' endpoints).
        let mut backend_ips: Vec<(usize, Ipv4Addr)> = Vec::new();
        for (i, b) in topo.backends().iter().enumerate() {
            for ip in b.ips() {
                if let IpAddr::V4(ip) = ip {
                    backend_ips.push((i, *ip));
                }
            }
        }
        backend_ips.sort_by_key(|(i, ip)| (ip.octets()[2], *i));
        backend_ips.truncate(opts.probe_endpoints);
        anyhow::ensure!(!backend_ips.is_empty(), "the topology has no IPv4 backends");
        let mut stream_servers = Vec::new();
        if opts.bulk_seconds > 0.0 {
            for (i, ip) in &backend_ips {
                stream_servers.push(StreamBackend::start(
                    topo.backends()[*i].ns(),
                    SocketAddr::V4(SocketAddrV4::new(*ip, STREAM_PORT)),
                )?);
            }
        }
        let backend_ips: Vec<Ipv4Addr> = backend_ips.into_iter().map(|(_, ip)| ip).collect();
        let mut prepared = Prepared {
            mode,
            services,
            probe_endpoints: backend_ips.len(),
            load: Timed::Ok { ms: 0.0 },
            warnings,
            positions: Vec::new(),
            relay: None,
            proxier: None,
            _stream_servers: stream_servers,
            _http_servers: http_servers,
            topo,
        };
        if mode == Mode::Direct {
            let targets = Targets {
                http: backend_ips
                    .iter()
                    .map(|ip| SocketAddrV4::new(*ip, BACKEND_PORT))
                    .collect(),
                stream: backend_ips
                    .iter()
                    .map(|ip| SocketAddr::V4(SocketAddrV4::new(*ip, STREAM_PORT)))
                    .collect(),
            };
            let label = match (backend_ips.first(), backend_ips.last()) {
                (Some(a), Some(b)) if a != b => format!("{a}-{b} (pods)"),
                (Some(a), _) => format!("{a} (pod)"),
                _ => String::new(),
            };
            prepared.positions.push(Position::new(
                DIRECT_POSITION,
                label,
                targets,
                PROBE_PORT_BASE,
            ));
            return Ok(prepared);
        }

        let mut snap = scale_snapshot(services, 10);
        let ips: Vec<IpAddr> = backend_ips.iter().map(|ip| IpAddr::V4(*ip)).collect();
        let probed = add_probed(&mut snap, &ips);
        let (mut proxier, relay) = proxier_with_relay_in(
            mode,
            prepared.topo.node(),
            opts.tool_timeout,
            "10.244.0.0/16",
        )?;
        let t = Instant::now();
        let r = proxier.sync(&snap, &Changes::default());
        let elapsed = t.elapsed();
        prepared.load = match r {
            Ok(_) => Timed::Ok {
                ms: elapsed.as_secs_f64() * 1e3,
            },
            Err(_) if elapsed >= opts.tool_timeout => Timed::Timeout {
                after_s: opts.tool_timeout.as_secs(),
            },
            Err(e) => Timed::Failed {
                error: e.to_string(),
            },
        };
        prepared.proxier = Some(proxier);
        prepared.relay = relay;
        if prepared.load.ms().is_some() {
            let mut port_base = PROBE_PORT_BASE;
            for (position, ip) in &probed {
                if !opts.positions.iter().any(|p| p == position) {
                    continue;
                }
                let IpAddr::V4(v4) = ip else { continue };
                let targets = Targets {
                    http: vec![SocketAddrV4::new(*v4, SERVICE_PORT)],
                    stream: vec![SocketAddr::V4(SocketAddrV4::new(*v4, STREAM_PORT))],
                };
                prepared.positions.push(Position::new(
                    position,
                    ip.to_string(),
                    targets,
                    port_base,
                ));
                port_base = port_base.wrapping_add(opts.probes as u16 + 1);
            }
        }
        Ok(prepared)
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Measures round `r` of every position.
    pub fn measure_round(&mut self, opts: &DatapathOptions, r: usize) {
        let client = self.topo.client();
        for p in &mut self.positions {
            p.measure_round(client, opts, r, self.relay.as_ref());
        }
    }

    /// The results so far; tears everything down.
    pub fn finish(self) -> DatapathPoint {
        let positions = self.positions.iter().map(Position::result).collect();
        let point = DatapathPoint {
            mode: self.mode.label().into(),
            services: self.services,
            probe_endpoints: self.probe_endpoints,
            load: self.load.clone(),
            sysctl_warnings: self.warnings.clone(),
            positions,
        };
        // `self` (proxier, backends, namespaces) is dropped here.
        point
    }
}

/// Measures one mode with `services` background Services in a fresh topology, every round
/// one after the other ([`Mode::Direct`]: no rules, the backends directly).
///
/// # Errors
/// Building the topology (needs root) or starting the backends fails.
pub fn datapath_point(
    mode: Mode,
    services: usize,
    opts: &DatapathOptions,
) -> anyhow::Result<DatapathPoint> {
    datapath_points(&[mode], services, opts)?
        .into_iter()
        .next()
        .context("no datapath point")
}

/// Measures `modes` side by side at one size: prepares every mode (each in its own
/// topology), then runs round 0 of every mode, round 1 of every mode, and so on. Returns one
/// point per mode, in order.
///
/// # Errors
/// Building a topology (needs root) or starting the backends fails.
pub fn datapath_points(
    modes: &[Mode],
    services: usize,
    opts: &DatapathOptions,
) -> anyhow::Result<Vec<DatapathPoint>> {
    let started = Instant::now();
    let mut prepared = Vec::with_capacity(modes.len());
    for &mode in modes {
        let p = Prepared::new(mode, services, opts)?;
        eprintln!(
            "           {} ready after {:.1} s (rules: {})",
            mode.label(),
            started.elapsed().as_secs_f64(),
            p.load.cell()
        );
        prepared.push(p);
    }
    for r in 0..opts.round_count() {
        for p in &mut prepared {
            p.measure_round(opts, r);
        }
        eprintln!(
            "           round {} of {} done after {:.1} s",
            r + 1,
            opts.round_count(),
            started.elapsed().as_secs_f64()
        );
    }
    let points: Vec<DatapathPoint> = prepared.into_iter().map(Prepared::finish).collect();
    eprintln!(
        "           torn down after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(points)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_endpoints_are_spread_over_the_ten_backends() {
        let all = |n| {
            (0..BACKEND_NAMESPACES)
                .flat_map(|i| backend_ips(i, n))
                .collect::<Vec<_>>()
        };
        // The default: one automatic pod IP per backend.
        assert_eq!(backend_ips(3, 10), [IpAddr::from([10, 244, 1, 13])]);
        assert_eq!(all(1).len(), 10, "every backend keeps one IP");
        let hundred = all(100);
        assert_eq!(hundred.len(), 100);
        assert_eq!(
            hundred
                .iter()
                .collect::<std::collections::BTreeSet<_>>()
                .len(),
            100
        );
        assert_eq!(
            backend_ips(9, 100).last(),
            Some(&IpAddr::from([10, 244, 10, 19]))
        );
        assert_eq!(
            all(25).len(),
            25,
            "three IPs for five backends, two for the rest"
        );
        assert_eq!(backend_ips(4, 25).len(), 3);
        assert_eq!(backend_ips(5, 25).len(), 2);
    }

    fn opts(probes: usize, rounds: usize) -> DatapathOptions {
        DatapathOptions {
            probes,
            probe_endpoints: DEFAULT_PROBE_ENDPOINTS,
            rps_seconds: 1.0,
            concurrency: 1,
            tool_timeout: Duration::from_secs(1),
            positions: vec!["last".into()],
            keepalive: true,
            bulk_seconds: 1.0,
            bulk_streams: vec![1],
            rounds,
        }
    }

    #[test]
    fn rounds_split_the_probes_exactly() {
        let o = opts(10, 3);
        let split: Vec<usize> = (0..3).map(|r| o.probes_in(r)).collect();
        assert_eq!(split, [4, 3, 3]);
        assert_eq!(opts(10, 0).probes_in(0), 10, "0 rounds means one");
    }

    #[test]
    fn medians_ignore_nan_and_average_the_middle_pair() {
        assert_eq!(median_f64(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median_f64(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median_f64(&[f64::NAN, 5.0]), 5.0);
        assert!(median_f64(&[]).is_nan());
    }

    fn round(rps: f64, requests: u64, connections: u64, busy: f64) -> Throughput {
        Throughput {
            requests,
            failed: 1,
            connections,
            rps,
            cpu_busy_ms: busy,
            cpu_system_ms: 1.0,
            cpu_softirq_ms: 1.0,
            cpu_ms_per_1k: f64::NAN,
            process_cpu_ms: busy / 2.0,
            proxy_cpu_ms: f64::NAN,
            round_rps: Vec::new(),
        }
    }

    #[test]
    fn throughput_rounds_merge_to_the_median_rate_and_summed_cpu() {
        let rounds = [
            round(100.0, 100, 100, 50.0),
            round(300.0, 300, 300, 150.0),
            round(200.0, 200, 200, 100.0),
        ];
        let t = Throughput::merge(&rounds, false);
        assert_eq!(t.rps, 200.0);
        assert_eq!(t.round_rps, [100.0, 300.0, 200.0]);
        assert_eq!((t.requests, t.connections, t.failed), (600, 600, 3));
        assert_eq!(t.cpu_busy_ms, 300.0);
        assert_eq!(t.cpu_ms_per_1k, 500.0, "300 ms over 600 connections");
        assert_eq!(t.per_1k_connections(t.process_cpu_ms), 250.0);
        assert!(t.proxy_cpu_ms.is_nan(), "no relay in any round");
        // Keepalive: per 1,000 requests.
        let mut ka = rounds.clone();
        for r in &mut ka {
            r.connections = 1;
        }
        assert_eq!(Throughput::merge(&ka, true).cpu_ms_per_1k, 500.0);
        assert!(Throughput::merge(&[], true).rps.is_nan());
    }

    #[test]
    fn bulk_rounds_merge_to_the_median_rate() {
        let one = |mb: f64| Bulk {
            streams: 4,
            failed: 0,
            seconds: 1.0,
            bytes: (mb * 1e6) as u64,
            mb_per_s: mb,
            cpu_busy_ms: 100.0,
            process_cpu_ms: 80.0,
            proxy_cpu_ms: 20.0,
            round_mb_per_s: vec![mb],
        };
        let b = Bulk::merge(&[one(1000.0), one(3000.0), one(2000.0)]).unwrap();
        assert_eq!(b.streams, 4);
        assert_eq!(b.mb_per_s, 2000.0);
        assert_eq!(b.bytes, 6_000_000_000);
        assert_eq!(b.per_gb(b.process_cpu_ms), 40.0, "240 ms for 6 GB");
        assert_eq!(b.per_gb(b.proxy_cpu_ms), 10.0);
        assert!(Bulk::merge(&[]).is_none());
    }

    #[test]
    fn percentiles_count_failures() {
        let p = Percentiles::of(&[Some(3.0), None, Some(1.0), Some(2.0)]);
        assert_eq!((p.n, p.failed), (3, 1));
        assert_eq!(p.p50_us, 2.0);
        assert_eq!(p.p01_us, 1.0);
        assert_eq!(p.p99_us, 3.0);
    }

    #[test]
    fn probed_services_have_an_http_and_a_stream_port() {
        let mut snap = scale_snapshot(0, 10);
        let backends = [IpAddr::V4(Ipv4Addr::new(10, 244, 1, 10))];
        let probed = add_probed(&mut snap, &backends);
        assert_eq!(probed[0].0, "first");
        assert_eq!(probed[1].0, "last");
        assert_eq!(snap.services.len(), 4);
        let ports: Vec<(u16, u16)> = snap
            .services
            .iter()
            .map(|(name, svc)| (svc.port, snap.endpoints_of(name)[0].port))
            .collect();
        assert!(ports.contains(&(SERVICE_PORT, BACKEND_PORT)));
        assert!(ports.contains(&(STREAM_PORT, STREAM_PORT)));
    }
}
