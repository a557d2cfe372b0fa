//! `kube-proxy-rs sandbox`: a whole node in network namespaces, for a newcomer.
//!
//! From a manifest (default: the bundled seed example, one nginx Service with two Pods) it
//! builds a `node` namespace (the node's InternalIP on a LAN), a `client` namespace on that
//! LAN, and one backend namespace per endpoint IP, each serving HTTP on its target ports and
//! answering with its own `ip:port`. It runs `kube-proxy-rs` (iptables, nftables or IPVS
//! mode) inside the node namespace, waits until the rules are programmed, sends requests to
//! every Service address from the client and from the node, and prints which backends
//! answered, how often and how fast, and whether each ClusterIP answers a ping (only in IPVS
//! mode, where it is an address of the node's `kube-ipvs0`). In IPVS mode it also prints each
//! Service's virtual server.
//!
//! IPVS mode on a kernel without IPVS (or dummy links): the sandbox re-runs itself, with the
//! same arguments, inside a qemu guest booting Debian's kernel (`kp_testkit::vm`, prepared by
//! `scripts/install-deps`; the guest sees the host's filesystem and is discarded at power-off),
//! streams the guest's output, and stops qemu on Ctrl-C. `--keep` is refused there: nothing
//! in the guest can be explored from the host.
//! Everything it made (processes, namespaces, the temporary manifest) is removed at the end,
//! on error and on Ctrl-C, and it says so in every case. It never touches the root network
//! namespace; the only sysctls it sets are the node namespace's own.
//!
//! Probes are short (a 1 s timeout each, the interrupt flag checked between any two), and an
//! address whose first probes all fail is given up after [`GIVE_UP_AFTER`] of them. Inside
//! the node namespace the kernel's ICMP rate limits are lifted, so that every `REJECT` of a
//! Service without endpoints answers at once (by default only ~1 ICMP error per second per
//! peer is sent, and each dropped one makes the client's `connect` wait 1 s for a SYN
//! retransmission). The proxy's warnings and errors (its log is a file in the temporary
//! directory) are echoed on the sandbox's output.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use ipnet::IpNet;
use kp_model::{IpFamily, Protocol, ServicePortInfo, Snapshot};
use kp_source::manifests::{ManifestSet, load_path};
use kp_testkit::golden::SEED_CLUSTER;
use kp_testkit::netns::topology::FamilyPlan;
use kp_testkit::{
    ChildGuard, ClientError, HttpBackend, Netns, Topology, UdpEchoBackend, http_get_while,
    udp_request,
};
use kp_track::Tracker;

use crate::cli::{ProxyModeArg, SandboxArgs};
use crate::ping::ping;

mod unprobed;
pub(crate) mod words;

use unprobed::Unprobed;

/// Time allowed for one request: short, so that Ctrl-C is honoured within about a second.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

/// The limit of a whole sandbox run in the qemu guest (boot, sandbox, power-off).
const GUEST_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// How long the proxy may take to program the node: everything is 10-30 times slower in the
/// qemu guest (software emulation).
fn programming_timeout() -> Duration {
    if kp_testkit::vm::in_guest() {
        Duration::from_secs(120)
    } else {
        Duration::from_secs(30)
    }
}

/// An address whose first this-many requests all failed (and none answered) is not sent the
/// rest: the report says how many were sent.
pub const GIVE_UP_AFTER: usize = 10;

/// ICMP rate limits lifted inside the node namespace (per-namespace sysctls): without this
/// the kernel sends about one ICMP error per second per peer (`icmp_ratelimit`, burst 6) and
/// 1000 per second overall (`icmp_msgs_per_sec`, burst 50), so most `REJECT`s of a Service
/// without endpoints would reach the client as silence and a 1 s SYN retransmission.
const NODE_ICMP_SYSCTLS: &[(&str, &str)] = &[
    ("net.ipv4.icmp_ratelimit", "0"),
    ("net.ipv4.icmp_msgs_per_sec", "1000000"),
    ("net.ipv4.icmp_msgs_burst", "100000"),
    ("net.ipv6.icmp.ratelimit", "0"),
];

/// Lifts the ICMP rate limits of [`NODE_ICMP_SYSCTLS`] in `node`, where present (a sysctl
/// that is not per-namespace on this kernel does not appear in a new namespace and is left
/// alone).
fn lift_icmp_rate_limits(node: &Netns) {
    for (key, value) in NODE_ICMP_SYSCTLS {
        if node.read_sysctl(key).is_err() {
            continue;
        }
        if let Err(e) = node.sysctl(key, value) {
            eprintln!("note: could not set {key}={value} in {}: {e}", node.name());
        }
    }
}

/// The proxy's log file, read as it grows: yields its new `WARN`/`ERROR` lines.
struct ProxyLog {
    path: PathBuf,
    offset: u64,
    shown: usize,
}

impl ProxyLog {
    fn new(path: PathBuf) -> ProxyLog {
        ProxyLog {
            path,
            offset: 0,
            shown: 0,
        }
    }

    /// The warning and error lines completed since the previous call.
    fn new_problems(&mut self) -> Vec<String> {
        use std::io::{Read, Seek, SeekFrom};
        let Ok(mut f) = std::fs::File::open(&self.path) else {
            return Vec::new();
        };
        let mut buf = Vec::new();
        if f.seek(SeekFrom::Start(self.offset)).is_err() || f.read_to_end(&mut buf).is_err() {
            return Vec::new();
        }
        let Some(end) = buf.iter().rposition(|&b| b == b'\n') else {
            return Vec::new();
        };
        self.offset += end as u64 + 1;
        let lines: Vec<String> = String::from_utf8_lossy(&buf[..end])
            .lines()
            .filter(|l| is_problem(l))
            .map(str::to_string)
            .collect();
        self.shown += lines.len();
        lines
    }

    /// Prints the new warning and error lines, each prefixed with `proxy log: `.
    fn echo(&mut self) {
        for line in self.new_problems() {
            println!("proxy log: {line}");
        }
    }
}

/// Whether a line of the proxy's log (tracing's format without colours: timestamp, level,
/// message) is a warning or an error.
fn is_problem(line: &str) -> bool {
    line.split_whitespace()
        .take(2)
        .any(|w| w == "WARN" || w == "ERROR")
}

fn check_environment(mode: ProxyModeArg) -> anyhow::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("the sandbox creates network namespaces and needs root: run it as root (sudo)");
    }
    let tools: &[&str] = match mode {
        ProxyModeArg::Nftables => &["ip", "nft"],
        ProxyModeArg::Ipvs => &[
            "ip",
            "iptables-restore",
            "iptables-save",
            "ipset",
            "ipvsadm",
        ],
        _ => &["ip", "iptables-restore", "iptables-save"],
    };
    for tool in tools {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
            .unwrap_or(false);
        if !found {
            bail!(
                "`{tool}` is not installed: run scripts/install-deps (Debian packages iproute2, iptables, nftables, ipset, ipvsadm)"
            );
        }
    }
    Ok(())
}

/// Whether the proxy in `ns` has programmed its rules: `KUBE-POSTROUTING` exists (iptables
/// mode), the `nat-postrouting` chain of table `ip kube-proxy` jumps to `masquerading`
/// (nftables mode), `KUBE-IPVS-FILTER` exists and a virtual server is there (IPVS mode), or
/// `KUBE-PORTALS-CONTAINER` has a portal (userspace mode).
fn programmed(ns: &Netns, mode: ProxyModeArg) -> bool {
    match mode {
        ProxyModeArg::Ipvs => {
            ns.run("iptables-save", ["-t", "filter"])
                .is_ok_and(|s| s.contains("-A KUBE-IPVS-FILTER"))
                && ns
                    .run("ipvsadm", ["-S", "-n"])
                    .is_ok_and(|s| s.contains("-A "))
        }
        ProxyModeArg::Nftables => ns
            .run(
                "nft",
                ["list", "chain", "ip", "kube-proxy", "nat-postrouting"],
            )
            .is_ok_and(|s| s.contains("jump masquerading")),
        ProxyModeArg::Userspace => ns
            .run("iptables-save", ["-t", "nat"])
            .is_ok_and(|s| s.contains("-A KUBE-PORTALS-CONTAINER")),
        _ => ns
            .run("iptables-save", ["-t", "nat"])
            .is_ok_and(|s| s.contains("-A KUBE-POSTROUTING")),
    }
}

/// The smallest network containing every address (for the client's route to Service IPs).
fn covering(ips: &[IpAddr], default: IpNet) -> IpNet {
    let mut net = default;
    for ip in ips {
        while !net.contains(ip) && net.prefix_len() > 0 {
            net = IpNet::new(net.addr(), net.prefix_len() - 1)
                .map(|n| n.trunc())
                .unwrap_or(net);
        }
    }
    net
}

struct Percentiles {
    p50: Duration,
    p99: Duration,
}

fn percentiles(mut v: Vec<Duration>) -> Option<Percentiles> {
    if v.is_empty() {
        return None;
    }
    v.sort();
    let at = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize];
    Some(Percentiles {
        p50: at(0.50),
        p99: at(0.99),
    })
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// What one batch of requests saw.
#[derive(Default)]
struct Outcome {
    by_backend: BTreeMap<String, usize>,
    latencies: Vec<Duration>,
    errors: BTreeMap<String, usize>,
    /// Requests sent.
    sent: usize,
}

impl Outcome {
    /// Records one result; returns whether to go on: not when the first [`GIVE_UP_AFTER`]
    /// requests all failed.
    fn record<T>(
        &mut self,
        r: Result<T, &ClientError>,
        ok: impl FnOnce(T) -> (String, Duration),
    ) -> bool {
        self.sent += 1;
        match r {
            Ok(reply) => {
                let (backend, elapsed) = ok(reply);
                *self.by_backend.entry(backend).or_default() += 1;
                self.latencies.push(elapsed);
            }
            Err(e) => *self.errors.entry(words::for_error(e)).or_default() += 1,
        }
        !self.gave_up()
    }

    /// Whether it stopped early: [`GIVE_UP_AFTER`] requests sent, none answered.
    fn gave_up(&self) -> bool {
        self.by_backend.is_empty() && self.sent >= GIVE_UP_AFTER
    }

    /// `N requests: …`, or `K of N requests (…): …` when it gave up early.
    fn summary(&self, n: usize, node_of: &BTreeMap<String, String>) -> String {
        if self.sent < n {
            format!(
                "{} of {n} requests (the first {} all failed; the rest were not sent): {}",
                self.sent,
                self.sent,
                self.line(node_of)
            )
        } else {
            format!("{n} requests: {}", self.line(node_of))
        }
    }

    fn line(&self, node_of: &BTreeMap<String, String>) -> String {
        let mut parts: Vec<String> = self
            .by_backend
            .iter()
            .map(|(b, n)| match node_of.get(b) {
                Some(node) => format!("{b} (nodeName {node}) {n}"),
                None => format!("{b} {n}"),
            })
            .collect();
        for (e, n) in &self.errors {
            parts.push(format!("{e} {n}"));
        }
        let lat = percentiles(self.latencies.clone())
            .map(|p| format!("   p50 {}  p99 {}", ms(p.p50), ms(p.p99)))
            .unwrap_or_default();
        format!("{}{lat}", parts.join(", "))
    }
}

fn http_batch(
    ns: &Netns,
    target: SocketAddr,
    n: usize,
    stop: &AtomicBool,
) -> anyhow::Result<Outcome> {
    let mut out = Outcome::default();
    let mut interrupted = false;
    let results = http_get_while(ns, target, n, REQUEST_TIMEOUT, |r| {
        interrupted = stop.load(Ordering::SeqCst);
        let go_on = out.record(r.as_ref(), |reply| {
            (reply.name().to_string(), reply.elapsed)
        });
        go_on && !interrupted
    });
    if interrupted || stop.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    // A failure to enter the namespace is one result that `record` did not see.
    if results.len() > out.sent
        && let Some(Err(e)) = results.last()
    {
        bail!("probing {target} from {}: {e}", ns.name());
    }
    Ok(out)
}

fn udp_batch(
    ns: &Netns,
    target: SocketAddr,
    n: usize,
    stop: &AtomicBool,
) -> anyhow::Result<Outcome> {
    let mut out = Outcome::default();
    for _ in 0..n {
        if stop.load(Ordering::SeqCst) {
            bail!("interrupted");
        }
        let start = Instant::now();
        let r = udp_request(ns, target, b"ping", REQUEST_TIMEOUT, None);
        if !out.record(r.as_ref(), |reply| (reply.text(), start.elapsed())) {
            break;
        }
    }
    if stop.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(out)
}

fn snapshot_of(set: &ManifestSet, node: &str) -> Snapshot {
    let mut tracker = Tracker::new(IpFamily::V4, node);
    for ev in set.initial_events() {
        tracker.apply(ev);
    }
    (*tracker.checkout().0).clone()
}

fn write_manifest(dir: &Path, args: &SandboxArgs) -> anyhow::Result<PathBuf> {
    match &args.manifests {
        Some(p) => std::fs::canonicalize(p).with_context(|| format!("--manifests {}", p.display())),
        None => {
            let path = dir.join("cluster.yaml");
            std::fs::write(&path, SEED_CLUSTER).context("writing the bundled example")?;
            Ok(path)
        }
    }
}

/// Runs the sandbox.
///
/// # Errors
/// Not root, tools missing, an unusable manifest, or a proxy that does not come up (its log
/// is printed).
pub fn run(args: SandboxArgs) -> anyhow::Result<()> {
    check_environment(args.proxy_mode)?;
    if args.proxy_mode == ProxyModeArg::Ipvs
        && !kp_testkit::vm::in_guest()
        && !kp_testkit::vm::host_has_ipvs()
    {
        return run_in_guest(&args);
    }
    let mode = args.proxy_mode;
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        ctrlc::set_handler(move || {
            // Said once, however many signals arrive.
            if !stop.swap(true, Ordering::SeqCst) {
                eprintln!("\ninterrupted: tearing the sandbox down");
            }
        })
        .context("installing the Ctrl-C handler")?;
    }
    let cluster_cidr: IpNet = args
        .cluster_cidr
        .parse()
        .map_err(|_| anyhow!("--cluster-cidr {:?} is not a CIDR", args.cluster_cidr))?;
    let tmp = tempfile::Builder::new()
        .prefix("kube-proxy-rs-sandbox-")
        .tempdir()
        .context("creating a temporary directory")?;
    let manifest = write_manifest(tmp.path(), &args)?;
    let (set, errors) = load_path(&manifest);
    for e in &errors {
        eprintln!("manifest error (object skipped): {e}");
    }
    let node_name = match &args.node {
        Some(n) if !set.nodes.is_empty() && !set.nodes.contains_key(n) => {
            let known: Vec<&String> = set.nodes.keys().collect();
            // Without --manifests, the file read is a temporary copy of the bundled example:
            // name the example, not a path that is gone once the sandbox exits.
            let source = match &args.manifests {
                Some(_) => manifest.display().to_string(),
                None => "the bundled example (examples/seed-nginx/cluster.yaml)".to_string(),
            };
            bail!("--node {n}: no Node of that name in {source} (known: {known:?})");
        }
        Some(n) => n.clone(),
        None => set
            .nodes
            .keys()
            .next()
            .cloned()
            .unwrap_or_else(|| "sandbox-node".to_string()),
    };
    let node_ip = set
        .nodes
        .get(&node_name)
        .and_then(|n| n.addresses.iter().copied().find(IpAddr::is_ipv4))
        .unwrap_or_else(|| IpAddr::from([192, 168, 56, 10]));
    let snap = snapshot_of(&set, &node_name);
    let unprobed = unprobed::plan(set.services.values());
    if snap.services.is_empty() {
        let why: Vec<String> = unprobed
            .iter()
            .filter_map(|(name, u)| u.whole.as_ref().map(|w| format!("\n  {name}: {w}")))
            .collect();
        bail!(
            "{} holds no IPv4 Service to proxy{}",
            manifest.display(),
            why.concat()
        );
    }

    // Backends: every endpoint IP, with the ports and protocols it serves.
    let mut serves: BTreeMap<IpAddr, BTreeSet<(Protocol, u16)>> = BTreeMap::new();
    for (spn, eps) in &snap.endpoints {
        for ep in eps.iter() {
            serves
                .entry(ep.ip)
                .or_default()
                .insert((spn.protocol, ep.port));
        }
    }
    let mut node_of: BTreeMap<String, String> = BTreeMap::new();
    for slice in set.slices.values() {
        for e in &slice.endpoints {
            if let Some(n) = &e.node_name {
                for p in &slice.ports {
                    node_of.insert(
                        SocketAddr::new(e.address, p.port).to_string(),
                        n.to_string(),
                    );
                }
            }
        }
    }

    let node_net = IpNet::new(node_ip, 24).context("node address")?;
    let client_ip = {
        let base = u32::from(match node_net.trunc().addr() {
            IpAddr::V4(v4) => v4,
            IpAddr::V6(_) => bail!("the sandbox needs an IPv4 node address"),
        });
        let mut c = IpAddr::from(std::net::Ipv4Addr::from(base + 100));
        if c == node_ip {
            c = IpAddr::from(std::net::Ipv4Addr::from(base + 101));
        }
        c
    };
    let vips: Vec<IpAddr> = snap.services.values().map(|s| s.cluster_ip).collect();
    let plan_service_cidr = covering(
        &vips,
        "10.96.0.0/12".parse().context("default service CIDR")?,
    );
    let plan = FamilyPlan {
        node: node_net,
        client: IpNet::new(client_ip, 24).context("client address")?,
        service_cidr: plan_service_cidr,
        pod_cidr: cluster_cidr,
    };
    let mut builder = Topology::builder().family(plan);
    for ip in serves.keys() {
        builder = builder.backend(vec![*ip]);
    }
    println!("kube-proxy-rs sandbox: building namespaces for node {node_name} ({node_ip})");
    let topology = match builder.build() {
        Ok(t) => t,
        Err(e) => {
            // The builder deletes what it had made when it fails (an interrupt kills the
            // `ip` command it was running).
            drop(tmp);
            println!(
                "sandbox removed: the namespaces built so far were deleted, temporary files removed"
            );
            if stop.load(Ordering::SeqCst) {
                bail!("interrupted while building the namespaces");
            }
            return Err(anyhow!(e).context("building the namespace sandbox"));
        }
    };
    let log_path = tmp.path().join("kube-proxy-rs.log");
    let mut log = ProxyLog::new(log_path.clone());
    let sandbox = Sandbox {
        args: &args,
        mode,
        snap: &snap,
        node_name: &node_name,
        node_ip,
        cluster_cidr,
        manifest: &manifest,
        serves: &serves,
        node_of: &node_of,
        service_cidr: plan_service_cidr,
        client_ip,
        unprobed: &unprobed,
        stop: &stop,
    };
    // Whatever happens in there (success, error, interrupt), everything is removed and the
    // sandbox says so.
    let result = sandbox.drive(&topology, &mut log);
    log.echo();
    let problems = log.shown;
    let namespaces = 2 + topology.clients().len() + topology.backends().len();
    drop(topology);
    drop(tmp);
    if problems > 0 {
        println!(
            "proxy log: {problems} warning/error line{} (shown above, prefixed `proxy log:`)",
            if problems == 1 { "" } else { "s" }
        );
    }
    println!(
        "sandbox removed: proxy stopped, {namespaces} namespaces deleted, temporary files removed"
    );
    result
}

/// IPVS mode on a kernel without IPVS: runs this same command (same arguments) in a qemu
/// guest, streaming its output; Ctrl-C stops qemu, and everything in the guest goes with it.
fn run_in_guest(args: &SandboxArgs) -> anyhow::Result<()> {
    use kp_testkit::Error as TkError;
    if args.keep {
        bail!(
            "--keep does not work with --proxy-mode ipvs on this kernel: it has no IPVS, so the \
             sandbox runs in a qemu guest, whose namespaces cannot be explored from here and which \
             is discarded when it ends; drop --keep (add --show-rules to see iptables-save, the \
             ipsets and ipvsadm -Ln of the node)"
        );
    }
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        ctrlc::set_handler(move || {
            if !stop.swap(true, Ordering::SeqCst) {
                eprintln!("\ninterrupted: stopping the qemu guest");
            }
        })
        .context("installing the Ctrl-C handler")?;
    }
    println!(
        "kube-proxy-rs sandbox: this kernel has no IPVS, so the sandbox runs in a qemu guest \
         (Debian's kernel, prepared by scripts/install-deps; booting takes about 10 s)"
    );
    let exe = std::env::current_exe().context("locating the kube-proxy-rs binary")?;
    let out = kp_testkit::vm::GuestCommand::new(&exe)
        .args(std::env::args_os().skip(1))
        .timeout(GUEST_TIMEOUT)
        .stream(true)
        .interrupt_on(stop)
        .run();
    match out {
        Ok(out) => {
            println!(
                "qemu guest: booted in {:.1} s, {:.1} s in all, powered off (nothing of it is left)",
                out.boot.as_secs_f64(),
                out.elapsed.as_secs_f64()
            );
            if out.code != 0 {
                bail!(
                    "the sandbox in the qemu guest failed (exit code {}; its error is above)",
                    out.code
                );
            }
            Ok(())
        }
        Err(TkError::VmInterrupted { .. }) => {
            println!(
                "sandbox removed: qemu stopped; the guest, with every namespace and process the \
                 sandbox made in it, is gone"
            );
            bail!("interrupted")
        }
        Err(e @ TkError::VmUnavailable { .. }) => Err(anyhow!(e)
            .context("--proxy-mode ipvs needs a qemu guest here (this kernel has no IPVS)")),
        Err(e) => Err(anyhow!(e).context("running the sandbox in a qemu guest")),
    }
}

/// What the sandbox runs with, once its namespaces exist.
struct Sandbox<'a> {
    args: &'a SandboxArgs,
    mode: ProxyModeArg,
    snap: &'a Snapshot,
    node_name: &'a str,
    node_ip: IpAddr,
    cluster_cidr: IpNet,
    manifest: &'a Path,
    serves: &'a BTreeMap<IpAddr, BTreeSet<(Protocol, u16)>>,
    node_of: &'a BTreeMap<String, String>,
    service_cidr: IpNet,
    /// The client's address: the node's route to external and load-balancer IPs.
    client_ip: IpAddr,
    /// What of the manifests' Services is not probed, and why.
    unprobed: &'a BTreeMap<kp_model::NamespacedName, Unprobed>,
    stop: &'a AtomicBool,
}

impl Sandbox<'_> {
    fn interrupted(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Starts the servers and the proxy in `topology`, probes every Service and reports;
    /// with `--keep`, waits for Ctrl-C. The servers and the proxy are stopped when it
    /// returns, before the caller removes the namespaces.
    fn drive(&self, topology: &Topology, log: &mut ProxyLog) -> anyhow::Result<()> {
        let (args, mode, snap) = (self.args, self.mode, self.snap);
        let mut servers_http: Vec<HttpBackend> = Vec::new();
        let mut servers_udp: Vec<UdpEchoBackend> = Vec::new();
        for (i, (ip, ports)) in self.serves.iter().enumerate() {
            let ns = topology.backend(i).ns();
            for (proto, port) in ports {
                let addr = SocketAddr::new(*ip, *port);
                match proto {
                    Protocol::Tcp => {
                        servers_http.push(HttpBackend::start(ns, addr, addr.to_string())?)
                    }
                    Protocol::Udp => {
                        servers_udp.push(UdpEchoBackend::start(ns, addr, addr.to_string())?)
                    }
                    Protocol::Sctp => {
                        eprintln!("note: {addr}/SCTP has no test server in the sandbox")
                    }
                }
            }
        }
        print!("{}", topology.describe());
        let node = topology.node();
        lift_icmp_rate_limits(node);

        // The proxy, inside the node namespace.
        let exe = std::env::current_exe().context("locating the kube-proxy-rs binary")?;
        let log_file = std::fs::File::create(&log.path).context("creating the proxy log")?;
        println!(
            "proxy log: {} ({}deleted with the sandbox; its warnings and errors are repeated here)",
            log.path.display(),
            if kp_testkit::vm::in_guest() {
                "in the qemu guest, "
            } else {
                ""
            }
        );
        let mut cmd = node.command(&exe);
        cmd.arg(format!("--proxy-mode={}", mode.name()))
            .arg("--manifests")
            .arg(self.manifest)
            .arg("--hostname-override")
            .arg(self.node_name)
            .arg("--cluster-cidr")
            .arg(self.cluster_cidr.to_string())
            // Machine-wide settings a sandbox must not touch: the conntrack table size is
            // global to the host, and the proxy runs with the sandbox's own OOM score.
            .arg("--conntrack-max-per-core=0")
            .arg("--oom-score-adj=0")
            // Nor the node's state directory: the sandbox's manifests are its own.
            .arg("--state-dir=")
            .stdout(log_file.try_clone().context("proxy log")?)
            .stderr(log_file);
        let started = Instant::now();
        let mut proxy = ChildGuard::spawn(&mut cmd, format!("kube-proxy-rs in {}", node.name()))?;
        let programmed = proxy.wait_for(
            || self.interrupted() || programmed(node, mode),
            programming_timeout(),
        );
        if let Err(e) = programmed {
            let text = std::fs::read_to_string(&log.path).unwrap_or_default();
            log.new_problems(); // printed in full here
            bail!("the proxy did not program the node: {e}\n--- proxy log ---\n{text}");
        }
        if self.interrupted() {
            bail!("interrupted");
        }
        println!(
            "proxy: kube-proxy-rs --proxy-mode {} --hostname-override {} --cluster-cidr {}, rules programmed in {:.2} s",
            mode.name(),
            self.node_name,
            self.cluster_cidr,
            started.elapsed().as_secs_f64(),
        );
        log.echo();
        println!("{}", report_legend(mode));
        // Let the client reach external and load-balancer IPs through the node, as a router
        // in front of the node would.
        let mut extra_routes = BTreeSet::new();
        for svc in snap.services.values() {
            extra_routes.extend(
                svc.external_ips
                    .iter()
                    .chain(&svc.load_balancer_vips)
                    .copied(),
            );
        }
        // The node routes them onward (to the client, its router here), as a node with a
        // default route does: a packet that no rule takes (a client outside
        // loadBalancerSourceRanges) then reaches the filter table's DROP, as in nftables mode,
        // instead of the node's "no route" ICMP error.
        for ip in extra_routes {
            let dest = IpNet::new(ip, 32).context("route")?;
            if !self.service_cidr.contains(&ip) {
                kp_testkit::netns::add_route(topology.client(), dest, self.node_ip)
                    .context("routing an external IP to the node")?;
                kp_testkit::netns::add_route(node, dest, self.client_ip)
                    .context("routing an external IP onward from the node")?;
            }
        }

        let n = args.requests as usize;
        let client = topology.client();
        let mut pinged = BTreeSet::new();
        let mut named = BTreeSet::new();
        for svc in snap.services.values() {
            report_service(
                svc,
                snap,
                client,
                node,
                self.node_ip,
                n,
                self.node_of,
                self.stop,
            )?;
            if mode == ProxyModeArg::Ipvs {
                println!("  {}", ipvs_line(node, svc));
            }
            // One ping per ClusterIP (several Service ports may share it).
            if pinged.insert(svc.cluster_ip) {
                let answer = ping(client, svc.cluster_ip, REQUEST_TIMEOUT)
                    .with_context(|| format!("pinging {} from the client", svc.cluster_ip))?;
                println!("  ping {}: {answer}", svc.cluster_ip);
            }
            // The Service's addresses that are not probed, under its first port.
            if named.insert(&svc.name.service)
                && let Some(u) = self.unprobed.get(&svc.name.service)
            {
                for a in &u.addresses {
                    println!("  {}", words::with_detail(words::NOT_PROBED, a));
                }
            }
            println!();
        }
        // The Services that are not probed at all.
        let mut whole = false;
        for (name, u) in self.unprobed {
            if let Some(why) = &u.whole {
                println!("{name}  {}", words::with_detail(words::NOT_PROBED, why));
                whole = true;
            }
        }
        if whole {
            println!();
        }
        log.echo();

        let dumps: &[(&str, &[&str])] = match mode {
            ProxyModeArg::Nftables => &[("nft", &["list", "ruleset"])],
            ProxyModeArg::Ipvs => &[
                ("iptables-save", &[]),
                ("ipset", &["save"]),
                ("ipvsadm", &["-Ln"]),
            ],
            _ => &[("iptables-save", &[])],
        };
        let dump_line = |(dump, dump_args): &(&str, &[&str])| {
            format!("{dump} {}", dump_args.join(" ")).trim().to_string()
        };
        if args.show_rules {
            for d in dumps {
                println!("--- {} in {} ---", dump_line(d), node.name());
                print!(
                    "{}",
                    node.run(d.0, d.1.iter().copied())
                        .with_context(|| format!("{} in the node namespace", d.0))?
                );
            }
        }
        if args.keep {
            println!(
                "\nThe sandbox stays up; explore it with `ip netns exec {} {}`. Ctrl-C removes it.\n\
                 The proxy logs to {}; its warnings and errors appear here as they happen.",
                node.name(),
                dumps.last().map(dump_line).unwrap_or_default(),
                log.path.display()
            );
            while !self.interrupted() {
                std::thread::sleep(Duration::from_millis(200));
                log.echo();
                proxy.ensure_running().map_err(|e| anyhow!("{e}"))?;
            }
        }
        // Teardown order: the proxy, then the servers; the caller removes the namespaces.
        drop(proxy);
        drop(servers_http);
        drop(servers_udp);
        Ok(())
    }
}

/// The legend printed before the report: what a line shows, then every word it may use
/// ([`words::WORDS`]).
fn report_legend(mode: ProxyModeArg) -> String {
    let head = format!(
        "report: per address, the backend that answered each request (ip:port, with the \
         endpoint's nodeName) and the latency of connect+response; an address whose first \
         {GIVE_UP_AFTER} requests all fail is not sent the rest. \"ping\" is one ICMP echo from \
         the client to the ClusterIP.{} The words for what a request or a ping got:",
        if mode == ProxyModeArg::Ipvs {
            " \"ipvs\" is the Service's virtual server (ipvsadm -Ln): scheduler, real servers \
             and weights, and whether kube-ipvs0 holds the ClusterIP."
        } else {
            ""
        }
    );
    let mut out = textwrap::fill(
        &head,
        textwrap::Options::new(100).subsequent_indent("        "),
    );
    out.push('\n');
    out.push_str(&words::legend("          "));
    out
}

#[allow(clippy::too_many_arguments)]
fn report_service(
    svc: &ServicePortInfo,
    snap: &Snapshot,
    client: &Netns,
    node: &Netns,
    node_ip: IpAddr,
    n: usize,
    node_of: &BTreeMap<String, String>,
    stop: &AtomicBool,
) -> anyhow::Result<()> {
    let eps = snap.endpoints_of(&svc.name);
    let kind = match svc.service_type {
        kp_model::ServiceType::LoadBalancer => "LoadBalancer",
        kp_model::ServiceType::NodePort => "NodePort",
        _ => "ClusterIP",
    };
    println!(
        "{}  {kind} {}:{}/{}  ({} endpoint{})",
        svc.name,
        svc.cluster_ip,
        svc.port,
        svc.name.protocol,
        eps.len(),
        if eps.len() == 1 { "" } else { "s" }
    );
    let vip = SocketAddr::new(svc.cluster_ip, svc.port);
    let mut targets: Vec<(String, &Netns, SocketAddr)> = vec![
        (format!("client -> {vip}"), client, vip),
        (format!("node   -> {vip}"), node, vip),
    ];
    if let Some(np) = svc.node_port {
        let addr = SocketAddr::new(node_ip, np);
        targets.push((format!("client -> {addr} (NodePort)"), client, addr));
    }
    for ip in &svc.external_ips {
        let addr = SocketAddr::new(*ip, svc.port);
        targets.push((format!("client -> {addr} (external IP)"), client, addr));
    }
    for ip in &svc.load_balancer_vips {
        let addr = SocketAddr::new(*ip, svc.port);
        targets.push((format!("client -> {addr} (load balancer)"), client, addr));
    }
    for (label, ns, target) in targets {
        let outcome = match svc.name.protocol {
            Protocol::Tcp => http_batch(ns, target, n, stop)?,
            Protocol::Udp => udp_batch(ns, target, n, stop)?,
            Protocol::Sctp => {
                println!(
                    "  {label}  {}",
                    words::with_detail(
                        words::NOT_PROBED,
                        "SCTP (the sandbox has no SCTP client or server)"
                    )
                );
                continue;
            }
        };
        println!("  {label}  {}", outcome.summary(n, node_of));
    }
    Ok(())
}

/// `ipvs: TCP 10.96.138.71:8080 rr -> 10.0.0.4:80 (w 1), 10.0.1.2:80 (w 1); kube-ipvs0
/// holds 10.96.138.71`: the Service's virtual server as `ipvsadm -Ln` lists it in `node`.
fn ipvs_line(node: &Netns, svc: &ServicePortInfo) -> String {
    let flag = match svc.name.protocol {
        Protocol::Tcp => "-t",
        Protocol::Udp => "-u",
        Protocol::Sctp => "--sctp-service",
    };
    let vs = SocketAddr::new(svc.cluster_ip, svc.port).to_string();
    let listing = node
        .run("ipvsadm", ["-L", "-n", flag, vs.as_str()])
        .unwrap_or_default();
    let addrs = node
        .run("ip", ["-o", "addr", "show", "dev", "kube-ipvs0"])
        .unwrap_or_default();
    let held = addrs
        .split_whitespace()
        .any(|w| w.split('/').next() == Some(svc.cluster_ip.to_string().as_str()));
    let holds = if held {
        format!("kube-ipvs0 holds {}", svc.cluster_ip)
    } else {
        format!("kube-ipvs0 does not hold {}", svc.cluster_ip)
    };
    match parse_virtual_server(&listing) {
        Some(line) => format!("ipvs: {line}; {holds}"),
        None => format!(
            "ipvs: no virtual server {} {vs}; {holds}",
            svc.name.protocol
        ),
    }
}

/// `TCP 10.96.138.71:8080 rr -> 10.0.0.4:80 (w 1), 10.0.1.2:80 (w 1)` from the
/// `ipvsadm -L -n -t ADDR` listing of one virtual server.
fn parse_virtual_server(listing: &str) -> Option<String> {
    let mut head = None;
    let mut reals = Vec::new();
    for line in listing.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            [proto, addr, rest @ ..] if ["TCP", "UDP", "SCTP"].contains(proto) => {
                head = Some(format!("{proto} {addr} {}", rest.join(" ")));
            }
            ["->", addr, _forward, weight, ..]
                if head.is_some() && weight.parse::<u32>().is_ok() =>
            {
                reals.push(format!("{addr} (w {weight})"));
            }
            _ => {}
        }
    }
    let head = head?;
    Some(if reals.is_empty() {
        format!("{head} -> no real servers")
    } else {
        format!("{head} -> {}", reals.join(", "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_that_only_fails_is_given_up_and_says_so() {
        let mut out = Outcome::default();
        let refused: Result<(), ClientError> = Err(ClientError::Refused);
        let mut sent = 0;
        while out.record(refused.as_ref().map(|_| ()), |()| unreachable!()) {
            sent += 1;
        }
        assert_eq!(sent + 1, GIVE_UP_AFTER);
        let line = out.summary(200, &BTreeMap::new());
        assert_eq!(
            line,
            format!(
                "{GIVE_UP_AFTER} of 200 requests (the first {GIVE_UP_AFTER} all failed; the rest were not sent): refused {GIVE_UP_AFTER}"
            )
        );
    }

    #[test]
    fn an_address_that_answered_once_gets_every_request() {
        let mut out = Outcome::default();
        assert!(out.record(Ok(()), |()| (
            "10.0.0.4:80".into(),
            Duration::from_millis(1)
        )));
        for _ in 0..50 {
            assert!(out.record(Err(&ClientError::Timeout), |()| unreachable!()));
        }
        assert_eq!(
            out.summary(51, &BTreeMap::new()),
            "51 requests: 10.0.0.4:80 1, timed out 50   p50 1.00 ms  p99 1.00 ms"
        );
    }

    #[test]
    fn a_virtual_server_listing_becomes_one_line() {
        let listing = "IP Virtual Server version 1.2.1 (size=4096)\n\
            Prot LocalAddress:Port Scheduler Flags\n\
            \x20 -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n\
            TCP  10.96.138.71:8080 rr\n\
            \x20 -> 10.0.0.4:80                  Masq    1      0          0\n\
            \x20 -> 10.0.1.2:80                  Masq    1      0          3\n";
        assert_eq!(
            parse_virtual_server(listing).unwrap(),
            "TCP 10.96.138.71:8080 rr -> 10.0.0.4:80 (w 1), 10.0.1.2:80 (w 1)"
        );
        let empty = "Prot LocalAddress:Port Scheduler Flags\n\
            \x20 -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n\
            UDP  10.96.0.10:53 rr persistent 10800\n";
        assert_eq!(
            parse_virtual_server(empty).unwrap(),
            "UDP 10.96.0.10:53 rr persistent 10800 -> no real servers"
        );
        assert_eq!(parse_virtual_server(""), None);
    }

    #[test]
    fn the_proxy_log_yields_new_complete_warning_and_error_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kube-proxy-rs.log");
        let mut log = ProxyLog::new(path.clone());
        assert!(log.new_problems().is_empty(), "no file yet");
        std::fs::write(
            &path,
            "2026-01-01T00:00:00Z  INFO synced\n2026-01-01T00:00:01Z  WARN no Node\n2026-01-01T00:00:02Z ERROR bad",
        )
        .unwrap();
        assert_eq!(log.new_problems(), ["2026-01-01T00:00:01Z  WARN no Node"]);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        std::io::Write::write_all(
            &mut f,
            b" clusterIP\n2026-01-01T00:00:03Z  INFO WARN later\n",
        )
        .unwrap();
        assert_eq!(
            log.new_problems(),
            ["2026-01-01T00:00:02Z ERROR bad clusterIP"]
        );
        assert!(log.new_problems().is_empty());
        assert_eq!(log.shown, 2);
    }
}
