//! `kube-proxy-rs sandbox`: a whole node in network namespaces, for a newcomer.
//!
//! From a manifest (default: the bundled seed example, one nginx Service with two Pods) it
//! builds a `node` namespace (the node's InternalIP on a LAN), a `client` namespace on that
//! LAN, and one backend namespace per endpoint IP, each serving HTTP on its target ports and
//! answering with its own `ip:port`. It runs `kube-proxy-rs` (iptables or nftables mode)
//! inside the node namespace, waits until the rules are programmed, sends requests to every
//! Service address from the client and from the node, and prints which backends answered,
//! how often and how fast.
//! Everything it made (processes, namespaces, the temporary manifest) is removed at the end,
//! on error and on Ctrl-C. It never touches the root network namespace.

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
    ChildGuard, ClientError, HttpBackend, Netns, Topology, UdpEchoBackend, http_get_many,
    udp_request,
};
use kp_track::Tracker;

use crate::cli::{ProxyModeArg, SandboxArgs};

/// Time allowed for one request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

fn check_environment(mode: ProxyModeArg) -> anyhow::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("the sandbox creates network namespaces and needs root: run it as root (sudo)");
    }
    let tools: &[&str] = match mode {
        ProxyModeArg::Nftables => &["ip", "nft"],
        _ => &["ip", "iptables-restore", "iptables-save"],
    };
    for tool in tools {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
            .unwrap_or(false);
        if !found {
            bail!(
                "`{tool}` is not installed: run scripts/install-deps (Debian packages iproute2, iptables, nftables)"
            );
        }
    }
    Ok(())
}

/// Whether the proxy in `ns` has programmed its rules: `KUBE-POSTROUTING` exists (iptables
/// mode) or the `nat-postrouting` chain of table `ip kube-proxy` jumps to `masquerading`
/// (nftables mode).
fn programmed(ns: &Netns, mode: ProxyModeArg) -> bool {
    match mode {
        ProxyModeArg::Nftables => ns
            .run(
                "nft",
                ["list", "chain", "ip", "kube-proxy", "nat-postrouting"],
            )
            .is_ok_and(|s| s.contains("jump masquerading")),
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
}

impl Outcome {
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

fn classify(e: &ClientError) -> String {
    match e {
        ClientError::Refused => "refused".into(),
        ClientError::Timeout => "timed out".into(),
        ClientError::Unreachable => "unreachable".into(),
        ClientError::Other(e) => format!("failed ({e})"),
    }
}

fn http_batch(
    ns: &Netns,
    target: SocketAddr,
    n: usize,
    stop: &AtomicBool,
) -> anyhow::Result<Outcome> {
    let mut out = Outcome::default();
    let mut left = n;
    while left > 0 {
        if stop.load(Ordering::SeqCst) {
            bail!("interrupted");
        }
        let chunk = left.min(25);
        for r in http_get_many(ns, target, chunk, REQUEST_TIMEOUT) {
            match r {
                Ok(reply) => {
                    *out.by_backend.entry(reply.name().to_string()).or_default() += 1;
                    out.latencies.push(reply.elapsed);
                }
                Err(e) => *out.errors.entry(classify(&e)).or_default() += 1,
            }
        }
        left -= chunk;
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
        match udp_request(ns, target, b"ping", REQUEST_TIMEOUT, None) {
            Ok(reply) => {
                *out.by_backend.entry(reply.text()).or_default() += 1;
                out.latencies.push(start.elapsed());
            }
            Err(e) => *out.errors.entry(classify(&e)).or_default() += 1,
        }
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
    if args.proxy_mode == ProxyModeArg::Ipvs {
        bail!(
            "--proxy-mode ipvs is not implemented yet; the sandbox runs iptables or nftables mode"
        );
    }
    let mode = args.proxy_mode;
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        ctrlc::set_handler(move || {
            eprintln!("\ninterrupted: tearing the sandbox down");
            stop.store(true, Ordering::SeqCst);
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
            bail!(
                "--node {n}: no Node of that name in {} (known: {known:?})",
                manifest.display()
            );
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
    if snap.services.is_empty() {
        bail!("{} holds no IPv4 Service to proxy", manifest.display());
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
    let topology = builder.build().context("building the namespace sandbox")?;

    let mut servers_http: Vec<HttpBackend> = Vec::new();
    let mut servers_udp: Vec<UdpEchoBackend> = Vec::new();
    for (i, (ip, ports)) in serves.iter().enumerate() {
        let ns = topology.backend(i).ns();
        for (proto, port) in ports {
            let addr = SocketAddr::new(*ip, *port);
            match proto {
                Protocol::Tcp => servers_http.push(HttpBackend::start(ns, addr, addr.to_string())?),
                Protocol::Udp => {
                    servers_udp.push(UdpEchoBackend::start(ns, addr, addr.to_string())?)
                }
                Protocol::Sctp => eprintln!("note: {addr}/SCTP has no test server in the sandbox"),
            }
        }
    }
    print!("{}", topology.describe());

    // The proxy, inside the node namespace.
    let exe = std::env::current_exe().context("locating the kube-proxy-rs binary")?;
    let log_path = tmp.path().join("kube-proxy-rs.log");
    let log = std::fs::File::create(&log_path).context("creating the proxy log")?;
    let mut cmd = topology.node().command(&exe);
    cmd.arg(format!("--proxy-mode={}", mode.name()))
        .arg("--manifests")
        .arg(&manifest)
        .arg("--hostname-override")
        .arg(&node_name)
        .arg("--cluster-cidr")
        .arg(cluster_cidr.to_string())
        .stdout(log.try_clone().context("proxy log")?)
        .stderr(log);
    let started = Instant::now();
    let mut proxy = ChildGuard::spawn(
        &mut cmd,
        format!("kube-proxy-rs in {}", topology.node().name()),
    )?;
    let node_ns = topology.node();
    let programmed = proxy.wait_for(
        || stop.load(Ordering::SeqCst) || programmed(node_ns, mode),
        Duration::from_secs(30),
    );
    if let Err(e) = programmed {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        bail!("the proxy did not program the node: {e}\n--- proxy log ---\n{log}");
    }
    if stop.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    println!(
        "proxy: kube-proxy-rs --proxy-mode {} --hostname-override {node_name} --cluster-cidr {cluster_cidr}, rules programmed in {:.2} s",
        mode.name(),
        started.elapsed().as_secs_f64(),
    );
    println!(
        "report: per address, the backend that answered each request (ip:port, with the endpoint's nodeName) and the latency of connect+response;\n        \"refused\" is a REJECT (Service without endpoints), \"timed out\" a DROP or no route\n"
    );
    // Let the client reach external and load-balancer IPs through the node, as a router in
    // front of the node would.
    let mut extra_routes = BTreeSet::new();
    for svc in snap.services.values() {
        extra_routes.extend(
            svc.external_ips
                .iter()
                .chain(&svc.load_balancer_vips)
                .copied(),
        );
    }
    for ip in extra_routes {
        let dest = IpNet::new(ip, 32).context("route")?;
        if !plan_service_cidr.contains(&ip) {
            kp_testkit::netns::add_route(topology.client(), dest, node_ip)
                .context("routing an external IP to the node")?;
        }
    }

    let n = args.requests as usize;
    let client = topology.client();
    let node = topology.node();
    for svc in snap.services.values() {
        report_service(svc, &snap, client, node, node_ip, n, &node_of, &stop)?;
    }

    let (dump, dump_args): (&str, &[&str]) = match mode {
        ProxyModeArg::Nftables => ("nft", &["list", "ruleset"]),
        _ => ("iptables-save", &[]),
    };
    let dump_line = format!("{dump} {}", dump_args.join(" "));
    if args.show_rules {
        println!("--- {} in {} ---", dump_line.trim(), node.name());
        print!(
            "{}",
            node.run(dump, dump_args.iter().copied())
                .with_context(|| format!("{dump} in the node namespace"))?
        );
    }
    if args.keep {
        println!(
            "\nThe sandbox stays up; explore it with `ip netns exec {} {}`. Ctrl-C removes it.",
            node.name(),
            dump_line.trim()
        );
        while !stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(200));
            proxy.ensure_running().map_err(|e| anyhow!("{e}"))?;
        }
    }
    // Teardown order: the proxy, the servers, then the namespaces (Topology's drop).
    drop(proxy);
    drop(servers_http);
    drop(servers_udp);
    let namespaces = 2 + topology.clients().len() + topology.backends().len();
    drop(topology);
    drop(tmp);
    println!(
        "sandbox removed: proxy stopped, {namespaces} namespaces deleted, temporary files removed"
    );
    Ok(())
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
                println!("  {label}: SCTP is not exercised by the sandbox");
                continue;
            }
        };
        println!("  {label}  {n} requests: {}", outcome.line(node_of));
    }
    println!();
    Ok(())
}
