//! Datapath benchmark (W3–W5 of the performance anchors): with N background Services
//! programmed by a mode, the new-connection latency through one ClusterIP, requests per
//! second with and without keepalive, and CPU per 1,000 new connections.
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
//! IPVS mode has no rule walk: both positions cost the same (a hash lookup), so a run may
//! measure only `last` ([`DatapathOptions::positions`]), the worst case of the rule-walking
//! modes.
//!
//! Sysctls, set only inside the benchmark's namespaces: client
//! `net.ipv4.ip_local_port_range = 1024 65000`, `net.ipv4.tcp_tw_reuse = 1`; backends
//! `net.core.somaxconn = 4096`; node `net.netfilter.nf_conntrack_max = 262144` (where the
//! kernel lets a namespace set it; recorded in the results).

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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

use crate::control::{Timed, proxier_in};
use crate::{Mode, scale_snapshot};

/// The probed Services' port and the backends' port.
const SERVICE_PORT: u16 = 80;
const BACKEND_PORT: u16 = 8080;
/// The first source port of latency probes.
const PROBE_PORT_BASE: u16 = 10_000;

/// Settings of [`datapath_point`].
#[derive(Debug, Clone)]
pub struct DatapathOptions {
    /// Latency probes per position.
    pub probes: usize,
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
    /// run, milliseconds.
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
        }
    }
}

/// One position (first or last) of one mode at one size.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PositionResult {
    /// `first` or `last` in KUBE-SERVICES order.
    pub position: String,
    /// The probed ClusterIP.
    pub cluster_ip: String,
    /// New-connection (connect) latency.
    pub connect: Percentiles,
    /// Requests on kept-alive connections.
    pub keepalive: Throughput,
    /// A new connection per request.
    pub close: Throughput,
}

/// The datapath results of one mode at one size.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DatapathPoint {
    /// Mode label.
    pub mode: String,
    /// Background Services (each with 10 endpoints), besides the two probed ones.
    pub services: usize,
    /// Loading the rules (the proxier's full sync).
    pub load: Timed,
    /// Sysctls that could not be set in the namespaces (kernel refused), if any.
    pub sysctl_warnings: Vec<String>,
    /// Per position; empty when the rules could not be loaded.
    pub positions: Vec<PositionResult>,
}

/// Adds the two probed Services, with the topology's backends as endpoints.
fn add_probed(snap: &mut Snapshot, backends: &[IpAddr]) -> [(String, IpAddr); 2] {
    let probes = [
        ("a-probe", "first", Ipv4Addr::new(10, 111, 255, 1)),
        ("zz-probe", "last", Ipv4Addr::new(10, 111, 255, 2)),
    ];
    for (ns, name, ip) in probes {
        let spn = ServicePortName::new(NamespacedName::new(ns, name), "http", Protocol::Tcp);
        let info = ServicePortInfo {
            name: spn.clone(),
            service_type: ServiceType::ClusterIp,
            cluster_ip: IpAddr::V4(ip),
            port: SERVICE_PORT,
            node_port: None,
            external_ips: Vec::new(),
            load_balancer_vips: Vec::new(),
            load_balancer_source_ranges: Vec::new(),
            session_affinity: SessionAffinity::None,
            external_policy_local: false,
            internal_policy_local: false,
            health_check_node_port: None,
            traffic_distribution: None,
        };
        let mut eps: Vec<Endpoint> = backends
            .iter()
            .map(|ip| Endpoint {
                ip: *ip,
                port: BACKEND_PORT,
                is_local: true,
                ready: true,
                serving: true,
                terminating: false,
                zone_hints: None,
                node_hints: None,
            })
            .collect();
        eps.sort_by_key(|e| e.to_string());
        snap.endpoints.insert(spn.clone(), eps.into());
        snap.services.insert(spn, Arc::new(info));
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

fn latency(client: &Netns, target: SocketAddrV4, probes: usize, port_base: u16) -> Percentiles {
    let results: Vec<Option<f64>> = client
        .in_ns(|| {
            (0..probes)
                .map(|k| probe_connect(port_base.wrapping_add(k as u16), target))
                .collect()
        })
        .unwrap_or_default();
    let mut ok: Vec<f64> = results.iter().flatten().copied().collect();
    ok.sort_by(f64::total_cmp);
    Percentiles {
        n: ok.len(),
        failed: probes.saturating_sub(ok.len()),
        p01_us: percentile(&ok, 0.01),
        p50_us: percentile(&ok, 0.50),
        p90_us: percentile(&ok, 0.90),
        p99_us: percentile(&ok, 0.99),
    }
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
/// keepalive: one connection per thread (re-opened if the server closes it).
fn throughput(
    client: &Netns,
    target: SocketAddr,
    keepalive: bool,
    concurrency: usize,
    seconds: f64,
) -> Throughput {
    let stop = Arc::new(AtomicBool::new(false));
    let requests = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let conns = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    let before = cpu_stat();
    let start = Instant::now();
    for _ in 0..concurrency.max(1) {
        let (stop, requests, failed, conns) = (
            stop.clone(),
            requests.clone(),
            failed.clone(),
            conns.clone(),
        );
        let h = client.spawn_in(move || {
            let mut buf = Vec::with_capacity(512);
            let mut stream: Option<TcpStream> = None;
            while !stop.load(Ordering::Relaxed) {
                if !keepalive {
                    conns.fetch_add(1, Ordering::Relaxed);
                    if one_close_request(target) {
                        requests.fetch_add(1, Ordering::Relaxed);
                    } else {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    continue;
                }
                if stream.is_none() {
                    conns.fetch_add(1, Ordering::Relaxed);
                    stream = TcpStream::connect_timeout(&target, Duration::from_secs(2)).ok();
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
    let after = cpu_stat();
    let requests = requests.load(Ordering::Relaxed);
    let connections = conns.load(Ordering::Relaxed);
    let busy = jiffies_ms(after.busy.saturating_sub(before.busy));
    let per = if keepalive { requests } else { connections };
    Throughput {
        requests,
        failed: failed.load(Ordering::Relaxed),
        connections,
        rps: requests as f64 / elapsed.max(1e-9),
        cpu_busy_ms: busy,
        cpu_system_ms: jiffies_ms(after.system.saturating_sub(before.system)),
        cpu_softirq_ms: jiffies_ms(after.softirq.saturating_sub(before.softirq)),
        cpu_ms_per_1k: if per > 0 {
            busy / per as f64 * 1000.0
        } else {
            f64::NAN
        },
    }
}

/// Measures one mode with `services` background Services in a fresh topology.
///
/// # Errors
/// Building the topology (needs root) or starting the backends fails.
pub fn datapath_point(
    mode: Mode,
    services: usize,
    opts: &DatapathOptions,
) -> anyhow::Result<DatapathPoint> {
    let topo = Topology::builder()
        .backends(10)
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
    set(topo.node(), "net.netfilter.nf_conntrack_max", "262144");
    for b in topo.backends() {
        set(b.ns(), "net.core.somaxconn", "4096");
    }
    let _servers: Vec<HttpBackend> = topo.start_http(BACKEND_PORT)?;
    let backend_ips: Vec<IpAddr> = topo
        .backends()
        .iter()
        .filter_map(|b| b.ip(kp_model::IpFamily::V4))
        .collect();
    let mut snap = scale_snapshot(services, 10);
    let probed = add_probed(&mut snap, &backend_ips);

    let mut proxier = proxier_in(mode, topo.node(), opts.tool_timeout, "10.244.0.0/16")?;
    let t = Instant::now();
    let r = proxier.sync(&snap, &Changes::default());
    let elapsed = t.elapsed();
    let load = match r {
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
    let mut positions = Vec::new();
    if load.ms().is_some() {
        let mut port_base = PROBE_PORT_BASE;
        for (position, ip) in &probed {
            if !opts.positions.iter().any(|p| p == position) {
                continue;
            }
            let IpAddr::V4(v4) = ip else { continue };
            let target = SocketAddrV4::new(*v4, SERVICE_PORT);
            // Warm up (ARP, backend threads), from ephemeral ports.
            for _ in 0..20 {
                let _ = topo.client().in_ns(|| one_close_request(target.into()));
            }
            let connect = latency(topo.client(), target, opts.probes, port_base);
            port_base = port_base.wrapping_add(opts.probes as u16 + 1);
            let keepalive = if opts.keepalive {
                throughput(
                    topo.client(),
                    target.into(),
                    true,
                    opts.concurrency,
                    opts.rps_seconds,
                )
            } else {
                Throughput::not_measured()
            };
            let close = throughput(
                topo.client(),
                target.into(),
                false,
                opts.concurrency,
                opts.rps_seconds,
            );
            positions.push(PositionResult {
                position: position.clone(),
                cluster_ip: ip.to_string(),
                connect,
                keepalive,
                close,
            });
        }
    }
    drop(proxier);
    drop(topo);
    Ok(DatapathPoint {
        mode: mode.label().into(),
        services,
        load,
        sysctl_warnings: warnings,
        positions,
    })
}
