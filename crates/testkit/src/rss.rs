//! The `kube-proxy-rs` daemon's own memory, measured as an operator runs it.
//!
//! [`measure`] generates a synthetic cluster ([`Cluster`]: N Services × E endpoints, one
//! EndpointSlice each, and the Node object of the proxy's node), hands it to the REAL daemon
//! binary through one of its sources ([`Source`]: manifest files, in one of two layouts, or
//! the in-process [`crate::apiserver::TestApiServer`] through `--master`), runs the daemon in a
//! network namespace created for the measurement, waits for its first sync to complete (the
//! `kubeproxy_sync_proxy_rules_last_timestamp_seconds` gauge of its `/metrics`, scraped from
//! inside the namespace), lets it settle, and reads `VmHWM` (the peak) and `VmRSS` (now) from
//! `/proc/PID/status`.
//!
//! The daemon, the API server, the namespace and the temporary files are all owned by guards:
//! they are stopped and removed when [`measure`] returns, whether it succeeded or not.
//!
//! ```no_run
//! use std::path::Path;
//! use kp_testkit::rss::{DaemonMode, MeasureOptions, Source, measure};
//!
//! let opts = MeasureOptions::new(Path::new("target/release/kube-proxy-rs"), DaemonMode::Nftables,
//!     Source::ManifestDocuments, 1000);
//! let m = measure(&opts)?;
//! println!("VmHWM {:.1} MiB, VmRSS {:.1} MiB", m.hwm_mib(), m.rss_mib());
//! # Ok::<(), kp_testkit::rss::RssError>(())
//! ```

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::apiserver::{ApiServerError, TestApiServer};
use crate::netns::Netns;
use crate::process::ChildGuard;

/// The node the proxy runs as (`--hostname-override`), also the Node object's name.
pub const NODE: &str = "rss-node";

/// The Node's InternalIP in the synthetic cluster.
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 56, 10);

/// The pod CIDR of the synthetic cluster (`--cluster-cidr`); endpoints are allocated from it.
pub const POD_CIDR: &str = "10.128.0.0/9";

/// Where the daemon serves `/metrics` inside its namespace.
const METRICS: &str = "127.0.0.1:10249";

/// The gauge whose `IPv4` value becomes non-zero when the first IPv4 sync succeeded.
const SYNCED_GAUGE: &str = "kubeproxy_sync_proxy_rules_last_timestamp_seconds";

/// What can go wrong during a measurement.
#[derive(Debug, thiserror::Error)]
pub enum RssError {
    /// Creating the namespace or spawning the daemon failed.
    #[error(transparent)]
    Harness(#[from] crate::Error),
    /// The test API server failed.
    #[error(transparent)]
    ApiServer(#[from] ApiServerError),
    /// A file could not be written or read.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The daemon exited or did not complete its first sync in time.
    #[error("{message}; the end of its log:\n{log}")]
    Daemon {
        /// What happened.
        message: String,
        /// The last lines of the daemon's log.
        log: String,
    },
    /// `/proc/PID/status` lacked a field.
    #[error("/proc/{pid}/status has no {field}")]
    Status {
        /// The daemon's pid.
        pid: u32,
        /// The missing field.
        field: &'static str,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RssError {
    let what = what.into();
    move |source| RssError::Io { what, source }
}

/// The proxy mode (and iptables backend) the daemon runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DaemonMode {
    /// `--proxy-mode iptables --iptables-backend legacy`.
    IptablesLegacy,
    /// `--proxy-mode iptables --iptables-backend nft`.
    IptablesNft,
    /// `--proxy-mode nftables`.
    Nftables,
    /// `--proxy-mode userspace` (its portals through `iptables-restore` as found on PATH).
    Userspace,
    /// `--proxy-mode ipvs` (needs a kernel with IPVS: the daemon falls back to iptables mode
    /// without it, so [`DaemonMode::available`] says whether this kernel has it).
    Ipvs,
}

impl DaemonMode {
    /// Every mode, in report order.
    pub const ALL: [DaemonMode; 5] = [
        DaemonMode::IptablesLegacy,
        DaemonMode::IptablesNft,
        DaemonMode::Nftables,
        DaemonMode::Userspace,
        DaemonMode::Ipvs,
    ];

    /// `iptables-legacy`, `iptables-nft`, `nftables`, `userspace`, `ipvs` (kp-bench's labels).
    pub fn label(self) -> &'static str {
        match self {
            DaemonMode::IptablesLegacy => "iptables-legacy",
            DaemonMode::IptablesNft => "iptables-nft",
            DaemonMode::Nftables => "nftables",
            DaemonMode::Userspace => "userspace",
            DaemonMode::Ipvs => "ipvs",
        }
    }

    /// Parses a [`DaemonMode::label`].
    pub fn parse(s: &str) -> Option<DaemonMode> {
        DaemonMode::ALL.into_iter().find(|m| m.label() == s)
    }

    /// The daemon's flags for this mode.
    pub fn flags(self) -> &'static [&'static str] {
        match self {
            DaemonMode::IptablesLegacy => &["--proxy-mode=iptables", "--iptables-backend=legacy"],
            DaemonMode::IptablesNft => &["--proxy-mode=iptables", "--iptables-backend=nft"],
            DaemonMode::Nftables => &["--proxy-mode=nftables"],
            DaemonMode::Userspace => &["--proxy-mode=userspace"],
            DaemonMode::Ipvs => &["--proxy-mode=ipvs"],
        }
    }

    /// `Err(reason)` when this kernel cannot run the mode (IPVS mode without IPVS: the daemon
    /// would measure its fallback to iptables mode instead).
    pub fn available(self) -> Result<(), String> {
        if self == DaemonMode::Ipvs && !Path::new("/proc/net/ip_vs").exists() {
            return Err("this kernel has no IPVS (/proc/net/ip_vs is missing): measure IPVS mode in the qemu guest".into());
        }
        Ok(())
    }
}

/// How the daemon gets the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    /// `--manifests DIR`: one file per namespace, each object its own `---` document (as one
    /// keeps manifests for `kubectl apply`), plus `node.yaml`.
    ManifestDocuments,
    /// `--manifests FILE`: one `kind: List` file holding every object (as
    /// `kubectl get services,endpointslices,nodes -A -o yaml` prints it).
    ManifestList,
    /// `--master URL` of a [`TestApiServer`] inside the daemon's namespace, holding every
    /// object (the daemon lists and watches it as it would a real API server).
    Api,
}

impl Source {
    /// Every source, in report order.
    pub const ALL: [Source; 3] = [Source::ManifestDocuments, Source::ManifestList, Source::Api];

    /// `manifests`, `manifests-list`, `api`.
    pub fn label(self) -> &'static str {
        match self {
            Source::ManifestDocuments => "manifests",
            Source::ManifestList => "manifests-list",
            Source::Api => "api",
        }
    }

    /// Parses a [`Source::label`].
    pub fn parse(s: &str) -> Option<Source> {
        Source::ALL.into_iter().find(|m| m.label() == s)
    }
}

/// A synthetic cluster: `services` Services × `endpoints` endpoints, one EndpointSlice each,
/// and the Node object of [`NODE`].
///
/// Service `i` is `ns-<i % 100>/svc-<i>`, ClusterIP `10.96.0.0 + i + 1`, port `http` 80/TCP
/// to 8080; one Service in ten is a NodePort (`30000 + i / 10`, while they last), and its first
/// endpoint is on this node. Endpoints are `10.128.0.0 + i * E + j + 1`, ready, each with
/// the Pod it belongs to (`targetRef`) and a node name, as the EndpointSlice controller writes
/// them. The objects carry what the API server adds (uid, creationTimestamp, the
/// Service's selector, IP families), so both sources see objects of a realistic size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cluster {
    /// Services (each with one EndpointSlice).
    pub services: usize,
    /// Endpoints per Service.
    pub endpoints: usize,
}

fn v4(base: [u8; 4], offset: usize) -> Ipv4Addr {
    // Offsets stay far below 2^32 for any size measured here.
    Ipv4Addr::from(u32::from(Ipv4Addr::from(base)).wrapping_add(offset as u32))
}

/// A uid-like string that is unique per (kind letter, index).
fn uid(kind: u8, i: usize) -> String {
    format!("{:08x}-0000-4000-8000-{:02x}{:010x}", i, kind, i)
}

impl Cluster {
    /// `services` Services × `endpoints` endpoints.
    pub fn new(services: usize, endpoints: usize) -> Cluster {
        Cluster {
            services,
            endpoints,
        }
    }

    /// The namespace of Service `i`.
    pub fn namespace(i: usize) -> String {
        format!("ns-{}", i % 100)
    }

    /// Service `i` as the API server returns it.
    pub fn service(&self, i: usize) -> Value {
        let node_port = (i.is_multiple_of(10) && i / 10 < 2700).then(|| 30000 + i / 10);
        let mut port = json!({"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080});
        if let Some(np) = node_port {
            port["nodePort"] = json!(np);
        }
        let ip = v4([10, 96, 0, 0], i + 1).to_string();
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": format!("svc-{i}"),
                "namespace": Self::namespace(i),
                "uid": uid(b's', i),
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "labels": {"app": format!("svc-{i}")},
            },
            "spec": {
                "type": if node_port.is_some() { "NodePort" } else { "ClusterIP" },
                "clusterIP": ip,
                "clusterIPs": [ip],
                "ipFamilies": ["IPv4"],
                "ipFamilyPolicy": "SingleStack",
                "internalTrafficPolicy": "Cluster",
                "sessionAffinity": "None",
                "selector": {"app": format!("svc-{i}")},
                "ports": [port],
            },
            "status": {"loadBalancer": {}},
        })
    }

    /// The EndpointSlice of Service `i`.
    pub fn endpoint_slice(&self, i: usize) -> Value {
        let local = i.is_multiple_of(10) && i / 10 < 2700;
        let ns = Self::namespace(i);
        let endpoints: Vec<Value> = (0..self.endpoints)
            .map(|j| {
                json!({
                    "addresses": [v4([10, 128, 0, 0], i * self.endpoints + j + 1).to_string()],
                    "conditions": {"ready": true, "serving": true, "terminating": false},
                    "nodeName": if local && j == 0 { NODE.to_string() } else { format!("node-{}", j % 7) },
                    "targetRef": {
                        "kind": "Pod",
                        "name": format!("svc-{i}-pod-{j}"),
                        "namespace": ns,
                        "uid": uid(b'p', i * self.endpoints + j),
                    },
                })
            })
            .collect();
        json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": format!("svc-{i}-abcde"),
                "namespace": ns,
                "uid": uid(b'e', i),
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "generateName": format!("svc-{i}-"),
                "labels": {
                    "kubernetes.io/service-name": format!("svc-{i}"),
                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                },
            },
            "addressType": "IPv4",
            "endpoints": endpoints,
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        })
    }

    /// The Node object of [`NODE`], with [`NODE_IP`] as its InternalIP.
    pub fn node(&self) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": NODE,
                "uid": uid(b'n', 0),
                "labels": {"kubernetes.io/hostname": NODE},
            },
            "status": {
                "addresses": [
                    {"type": "InternalIP", "address": NODE_IP.to_string()},
                    {"type": "Hostname", "address": NODE},
                ],
            },
        })
    }

    /// Every object: the Node, then each Service followed by its EndpointSlice.
    pub fn objects(&self) -> impl Iterator<Item = Value> + '_ {
        std::iter::once(self.node())
            .chain((0..self.services).flat_map(|i| [self.service(i), self.endpoint_slice(i)]))
    }

    /// Writes the cluster for `--manifests` in the layout of `source` below `dir` and returns
    /// the path to pass: the directory (one multi-document file per namespace and
    /// `node.yaml`) for [`Source::ManifestDocuments`], `dir/cluster.yaml` (one `kind: List`)
    /// for [`Source::ManifestList`]. [`Source::Api`] writes nothing and returns `dir`.
    ///
    /// # Errors
    /// Writing a file fails.
    pub fn write_manifests(&self, source: Source, dir: &Path) -> Result<PathBuf, RssError> {
        let yaml = |v: &Value| -> String {
            // serde-saphyr cannot fail on a JSON value.
            serde_saphyr::to_string(v).unwrap_or_default()
        };
        match source {
            Source::Api => Ok(dir.to_path_buf()),
            Source::ManifestList => {
                let list = json!({
                    "apiVersion": "v1",
                    "kind": "List",
                    "metadata": {"resourceVersion": ""},
                    "items": self.objects().collect::<Vec<_>>(),
                });
                let path = dir.join("cluster.yaml");
                std::fs::write(&path, yaml(&list))
                    .map_err(io_err(format!("writing {}", path.display())))?;
                Ok(path)
            }
            Source::ManifestDocuments => {
                let root = dir.join("manifests");
                std::fs::create_dir_all(&root)
                    .map_err(io_err(format!("creating {}", root.display())))?;
                let node = root.join("node.yaml");
                std::fs::write(&node, yaml(&self.node()))
                    .map_err(io_err(format!("writing {}", node.display())))?;
                let namespaces = self.services.min(100);
                let mut files = vec![String::new(); namespaces];
                for i in 0..self.services {
                    let text = &mut files[i % 100];
                    for object in [self.service(i), self.endpoint_slice(i)] {
                        text.push_str("---\n");
                        text.push_str(&yaml(&object));
                    }
                }
                for (n, text) in files.iter().enumerate() {
                    let path = root.join(format!("ns-{n}.yaml"));
                    std::fs::write(&path, text)
                        .map_err(io_err(format!("writing {}", path.display())))?;
                }
                Ok(root)
            }
        }
    }
}

/// What [`measure`] runs.
#[derive(Debug, Clone)]
pub struct MeasureOptions {
    /// The `kube-proxy-rs` binary.
    pub binary: PathBuf,
    /// The proxy mode.
    pub mode: DaemonMode,
    /// The source of the cluster.
    pub source: Source,
    /// The cluster.
    pub cluster: Cluster,
    /// How long the first sync may take (from the daemon's start).
    pub timeout: Duration,
    /// How long to wait after the first sync before reading `/proc/PID/status` (the IPv6
    /// sync and whatever the first sync left to free).
    pub settle: Duration,
    /// More daemon flags (after the ones [`measure`] passes).
    pub extra_args: Vec<String>,
}

impl MeasureOptions {
    /// `services` Services × 10 endpoints, a 300 s timeout, 2 s to settle.
    pub fn new(binary: &Path, mode: DaemonMode, source: Source, services: usize) -> Self {
        MeasureOptions {
            binary: binary.to_path_buf(),
            mode,
            source,
            cluster: Cluster::new(services, 10),
            timeout: Duration::from_secs(300),
            settle: Duration::from_secs(2),
            extra_args: Vec::new(),
        }
    }
}

/// One measurement of the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Measurement {
    /// `VmHWM` after the first sync (and the settle time), KiB: the peak resident set.
    pub hwm_kib: u64,
    /// `VmRSS` at the same moment, KiB: the steady state after the first sync.
    pub rss_kib: u64,
    /// From the daemon's start until its first IPv4 sync was seen to have completed.
    pub first_sync: Duration,
}

impl Measurement {
    /// [`Measurement::hwm_kib`] in MiB.
    pub fn hwm_mib(&self) -> f64 {
        self.hwm_kib as f64 / 1024.0
    }

    /// [`Measurement::rss_kib`] in MiB.
    pub fn rss_mib(&self) -> f64 {
        self.rss_kib as f64 / 1024.0
    }
}

/// A [`TestApiServer`] on a thread inside a namespace; stopped on drop.
struct ApiInNs {
    server: TestApiServer,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ApiInNs {
    fn start(ns: &Netns) -> Result<ApiInNs, RssError> {
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = ns.spawn_in(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = tx.send(Err(ApiServerError::Io(e)));
                    return;
                }
            };
            rt.block_on(async move {
                match TestApiServer::start().await {
                    Ok(server) => {
                        let _ = tx.send(Ok(server));
                        let _ = stop_rx.await;
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                    }
                }
            });
        })?;
        let server = rx
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| RssError::Io {
                what: "starting the test API server".into(),
                source: std::io::Error::other("it did not start within 10 s"),
            })??;
        Ok(ApiInNs {
            server,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }
}

impl Drop for ApiInNs {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// `/metrics` of the daemon, scraped from inside `ns` (empty when it does not answer yet).
fn scrape(ns: &Netns) -> String {
    ns.in_ns(|| -> std::io::Result<String> {
        let addr: SocketAddr = METRICS.parse().map_err(std::io::Error::other)?;
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    })
    .ok()
    .and_then(Result::ok)
    .unwrap_or_default()
}

/// Whether `metrics` shows a completed IPv4 sync, and a completed IPv6 sync when the daemon
/// runs one.
fn first_sync_done(metrics: &str) -> bool {
    let values: Vec<(bool, f64)> = metrics
        .lines()
        .filter(|l| l.starts_with(SYNCED_GAUGE) && !l.starts_with('#'))
        .filter_map(|l| {
            let (labels, value) = l.rsplit_once(' ')?;
            Some((labels.contains("IPv4"), value.parse::<f64>().ok()?))
        })
        .collect();
    values.iter().any(|(v4, t)| *v4 && *t > 0.0) && values.iter().all(|(_, t)| *t > 0.0)
}

/// A field of `/proc/PID/status` in KiB (`VmHWM:     1234 kB`).
fn status_kib(status: &str, pid: u32, field: &'static str) -> Result<u64, RssError> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .ok_or(RssError::Status { pid, field })
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Runs the daemon once as `opts` says and measures it (see the module documentation).
/// Needs root; everything runs in a namespace created here and is removed before it returns.
///
/// # Errors
/// The namespace, the files or the API server cannot be set up, or the daemon exits or does
/// not complete its first sync within `opts.timeout`.
pub fn measure(opts: &MeasureOptions) -> Result<Measurement, RssError> {
    let ns = Netns::new("rss")?;
    let dir = tempfile::Builder::new()
        .prefix("kp-rss-")
        .tempdir()
        .map_err(io_err("creating a temporary directory"))?;
    let mut args: Vec<String> = opts.mode.flags().iter().map(|s| s.to_string()).collect();
    args.extend([
        format!("--hostname-override={NODE}"),
        format!("--cluster-cidr={POD_CIDR}"),
        format!("--metrics-bind-address={METRICS}"),
        "--healthz-bind-address=127.0.0.1:10256".into(),
        format!("--state-dir={}", dir.path().join("state").display()),
    ]);
    // Kept alive until the measurement is done (dropped after the daemon).
    let _api = match opts.source {
        Source::Api => {
            let api = ApiInNs::start(&ns)?;
            for object in opts.cluster.objects() {
                api.server.upsert_value(object)?;
            }
            args.push(format!("--master={}", api.server.url()));
            Some(api)
        }
        Source::ManifestDocuments | Source::ManifestList => {
            let path = opts.cluster.write_manifests(opts.source, dir.path())?;
            args.push(format!("--manifests={}", path.display()));
            None
        }
    };
    args.extend(opts.extra_args.iter().cloned());
    let log_path = dir.path().join("proxy.log");
    let log = std::fs::File::create(&log_path).map_err(io_err("creating the daemon's log"))?;
    let log_err = log
        .try_clone()
        .map_err(io_err("duplicating the log's file"))?;
    let mut cmd = ns.command(&opts.binary);
    cmd.args(&args)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err);
    let started = Instant::now();
    let mut daemon = ChildGuard::spawn(&mut cmd, format!("kube-proxy-rs in {}", ns.name()))?;
    let pid = daemon.id();
    let daemon_error = |message: String| RssError::Daemon {
        message,
        log: log_tail(&log_path),
    };
    loop {
        if first_sync_done(&scrape(&ns)) {
            break;
        }
        if let Some(status) = daemon.try_wait()? {
            return Err(daemon_error(format!(
                "kube-proxy-rs exited ({status}) before its first sync"
            )));
        }
        if started.elapsed() > opts.timeout {
            return Err(daemon_error(format!(
                "kube-proxy-rs did not complete its first sync within {:?}",
                opts.timeout
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let first_sync = started.elapsed();
    std::thread::sleep(opts.settle);
    daemon.ensure_running()?;
    let status_path = format!("/proc/{pid}/status");
    let status =
        std::fs::read_to_string(&status_path).map_err(io_err(format!("reading {status_path}")))?;
    let m = Measurement {
        hwm_kib: status_kib(&status, pid, "VmHWM")?,
        rss_kib: status_kib(&status, pid, "VmRSS")?,
        first_sync,
    };
    drop(daemon);
    Ok(m)
}

/// The growth of the peak per Service between two measurements of the same mode and source:
/// `(HWM(large) - HWM(small)) / (large - small)`, in KiB per Service.
pub fn hwm_kib_per_service(small: (usize, &Measurement), large: (usize, &Measurement)) -> f64 {
    let services = large.0.saturating_sub(small.0).max(1) as f64;
    (large.1.hwm_kib as f64 - small.1.hwm_kib as f64) / services
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_sync_needs_every_family_synced() {
        let g = SYNCED_GAUGE;
        assert!(!first_sync_done(""));
        assert!(!first_sync_done(&format!("{g}{{ip_family=\"IPv4\"}} 0\n")));
        assert!(first_sync_done(&format!(
            "# HELP {g} x\n{g}{{ip_family=\"IPv4\"}} 1.7e9\n"
        )));
        assert!(!first_sync_done(&format!(
            "{g}{{ip_family=\"IPv4\"}} 1.7e9\n{g}{{ip_family=\"IPv6\"}} 0\n"
        )));
    }

    #[test]
    fn status_fields_are_read_in_kib() {
        let status = "Name:\tkube-proxy-rs\nVmHWM:\t  150000 kB\nVmRSS:\t   90000 kB\n";
        assert_eq!(status_kib(status, 1, "VmHWM").unwrap(), 150_000);
        assert_eq!(status_kib(status, 1, "VmRSS").unwrap(), 90_000);
        assert!(status_kib(status, 1, "VmSwap").is_err());
    }

    #[test]
    fn manifests_hold_every_object() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = Cluster::new(120, 3);
        for source in [Source::ManifestDocuments, Source::ManifestList] {
            let sub = dir.path().join(source.label());
            std::fs::create_dir_all(&sub).unwrap();
            let path = cluster.write_manifests(source, &sub).unwrap();
            let text: String = if path.is_dir() {
                std::fs::read_dir(&path)
                    .unwrap()
                    .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
                    .collect()
            } else {
                std::fs::read_to_string(&path).unwrap()
            };
            assert_eq!(text.matches("kind: Service\n").count(), 120, "{source:?}");
            assert_eq!(text.matches("kind: EndpointSlice\n").count(), 120);
            assert_eq!(text.matches("kind: Node\n").count(), 1);
            assert_eq!(text.matches("targetRef:").count(), 360);
        }
    }
}
