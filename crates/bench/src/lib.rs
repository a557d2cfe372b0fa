//! kp-bench: scale benchmarks of the proxy modes.
//!
//! [`scale_snapshot`] builds a synthetic cluster (N Services × M endpoints) directly as a
//! [`Snapshot`]; [`nft_scale`] renders its nftables ruleset, loads it with `nft -f` into a
//! fresh network namespace, and measures a full resync and three one-Service changes (add a
//! Service, change one endpoint, delete a Service) through the real [`NftablesProxier`].
//! The binary (`kp-bench nft-scale`) prints the medians of several runs; the criterion bench
//! `nft_render` times the pure rendering at 10,000 × 10.
//!
//! Everything that touches the kernel happens inside a network namespace created for the
//! run ([`kp_testkit::Netns`]), never in the root namespace.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use ipnet::IpNet;
use kp_model::{
    Changes, Endpoint, IpFamily, NamespacedName, Protocol, ServicePortInfo, ServicePortName,
    ServiceType, SessionAffinity, Snapshot,
};
use kp_netfilter::{ExecNft, Nft, SystemExec, TableObjects};
use kp_proxier::nftables::render::{RenderConfig, render};
use kp_proxier::nftables::{NftablesConfig, NftablesProxier, reconcile};
use kp_proxier::{FakeHost, LocalDetector, NodePortAddresses, Proxier};

/// This node's name in the synthetic cluster.
pub const NODE: &str = "bench-node";

/// The pod CIDR of the synthetic cluster, `10.128.0.0/9` (endpoints are allocated from it).
pub const POD_CIDR: &str = "10.128.0.0/9";

fn v4(base: [u8; 4], offset: usize) -> IpAddr {
    let n = u32::from(Ipv4Addr::from(base)).wrapping_add(offset as u32);
    IpAddr::V4(Ipv4Addr::from(n))
}

/// Service `i` of a synthetic cluster with `endpoints` endpoints each: `ns-<i%100>/svc-<i>`,
/// port `http` 80/TCP, ClusterIP `10.96.0.0 + i + 1`, endpoints `10.128.0.0 + i*M + j + 1`
/// on port 8080; one Service in ten also has a NodePort (while NodePorts last) and the first
/// endpoint of that Service is on this node.
pub fn scale_service(i: usize, endpoints: usize) -> (Arc<ServicePortInfo>, Arc<[Endpoint]>) {
    let name = ServicePortName::new(
        NamespacedName::new(format!("ns-{}", i % 100), format!("svc-{i}")),
        "http",
        Protocol::Tcp,
    );
    let node_port = (i.is_multiple_of(10) && i / 10 < 2700).then(|| 30000 + (i / 10) as u16);
    let info = ServicePortInfo {
        name,
        service_type: if node_port.is_some() {
            ServiceType::NodePort
        } else {
            ServiceType::ClusterIp
        },
        cluster_ip: v4([10, 96, 0, 0], i + 1),
        port: 80,
        node_port,
        external_ips: Vec::new(),
        load_balancer_vips: Vec::new(),
        load_balancer_source_ranges: Vec::new(),
        session_affinity: SessionAffinity::None,
        external_policy_local: false,
        internal_policy_local: false,
        health_check_node_port: None,
        traffic_distribution: None,
    };
    let eps: Vec<Endpoint> = (0..endpoints)
        .map(|j| Endpoint {
            ip: v4([10, 128, 0, 0], i * endpoints + j + 1),
            port: 8080,
            is_local: node_port.is_some() && j == 0,
            ready: true,
            serving: true,
            terminating: false,
            zone_hints: None,
            node_hints: None,
        })
        .collect();
    (Arc::new(info), eps.into())
}

/// A snapshot of `services` Services × `endpoints` endpoints (see [`scale_service`]).
pub fn scale_snapshot(services: usize, endpoints: usize) -> Snapshot {
    let mut snap = Snapshot::empty(IpFamily::V4, NODE);
    snap.node_ips = vec![IpAddr::V4(Ipv4Addr::new(192, 168, 56, 10))];
    for i in 0..services {
        let (info, eps) = scale_service(i, endpoints);
        if !eps.is_empty() {
            snap.endpoints.insert(info.name.clone(), eps);
        }
        snap.services.insert(info.name.clone(), info);
    }
    snap
}

/// The pod CIDR as a network.
fn pod_cidr() -> IpNet {
    IpNet::new(IpAddr::V4(Ipv4Addr::new(10, 128, 0, 0)), 9).unwrap_or_default()
}

/// The render settings the benchmark uses: ClusterCIDR detection, NodePorts on every
/// local address.
pub fn render_config() -> RenderConfig {
    RenderConfig {
        local: LocalDetector::Cidrs(vec![pod_cidr()]).for_family(IpFamily::V4, &[]),
        ..RenderConfig::default()
    }
}

/// Renders the full nftables ruleset of `snap` for a node without our table: the payload and
/// the time it took (render plus payload text).
pub fn render_fresh(snap: &Snapshot) -> (String, Duration) {
    let cfg = render_config();
    let t = Instant::now();
    let rendered = render(snap, &cfg, None);
    let (payload, _, _) =
        reconcile::full_payload(snap.family, &cfg, &rendered, &TableObjects::default());
    (payload, t.elapsed())
}

/// One measured one-Service change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeRun {
    /// What changed.
    pub what: &'static str,
    /// Payload bytes of the partial sync.
    pub bytes: usize,
    /// Render plus `nft -f` (and `ip netns exec`) time.
    pub time: Duration,
}

/// One run of [`nft_scale`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScaleRun {
    /// Services in the snapshot.
    pub services: usize,
    /// Endpoints per Service.
    pub endpoints: usize,
    /// Rendering the full ruleset (no kernel).
    pub render: Duration,
    /// Bytes of the full payload.
    pub payload_bytes: usize,
    /// Loading it with one `nft -f` into an empty namespace.
    pub load: Duration,
    /// A full resync over the loaded table (what happens hourly, or at a restart): list the
    /// table's objects, render, flush and rewrite everything.
    pub resync: Duration,
    /// Bytes of the full resync's payload.
    pub resync_bytes: usize,
    /// One-Service changes through partial syncs.
    pub changes: Vec<ChangeRun>,
}

fn nft_in(ns: &kp_testkit::Netns) -> ExecNft {
    ExecNft::with_exec(Arc::new(SystemExec::with_prefix(vec![
        "ip".into(),
        "netns".into(),
        "exec".into(),
        ns.name().into(),
    ])))
}

/// Runs the scale benchmark once in a fresh network namespace.
///
/// # Errors
/// Creating the namespace (needs root), or an nft failure.
pub fn nft_scale(services: usize, endpoints: usize) -> anyhow::Result<ScaleRun> {
    let mut snap = scale_snapshot(services, endpoints);
    let (payload, render_time) = render_fresh(&snap);
    let ns = kp_testkit::Netns::new("bench").context("creating a network namespace")?;
    let nft = nft_in(&ns);
    let t = Instant::now();
    nft.apply(payload.as_bytes())
        .context("loading the full ruleset")?;
    let load = t.elapsed();

    let cfg = NftablesConfig {
        local_detector: LocalDetector::Cidrs(vec![pod_cidr()]),
        nodeport_addresses: NodePortAddresses::all(),
        ..NftablesConfig::default()
    };
    let mut proxier = NftablesProxier::new(
        IpFamily::V4,
        cfg,
        nft_in(&ns),
        Arc::new(FakeHost::default()),
    )?;
    let t = Instant::now();
    let full = proxier.sync(&snap, &Changes::default())?;
    let resync = t.elapsed();

    let mut changes = Vec::new();
    let mut step = |what: &'static str,
                    snap: &Snapshot,
                    name: &NamespacedName,
                    proxier: &mut NftablesProxier<ExecNft>|
     -> anyhow::Result<()> {
        let ch = Changes {
            services: BTreeSet::from([name.clone()]),
            ..Changes::default()
        };
        let t = Instant::now();
        let r = proxier.sync(snap, &ch)?;
        anyhow::ensure!(!r.full, "expected a partial sync");
        changes.push(ChangeRun {
            what,
            bytes: r.payload_bytes,
            time: t.elapsed(),
        });
        Ok(())
    };
    // Add one Service.
    let (info, eps) = scale_service(services, endpoints);
    let added = info.name.service.clone();
    snap.endpoints.insert(info.name.clone(), eps);
    snap.services.insert(info.name.clone(), info);
    step("add one Service", &snap, &added, &mut proxier)?;
    // Change one endpoint of a Service in the middle.
    let (info, eps) = scale_service(services / 2, endpoints);
    let mut changed: Vec<Endpoint> = eps.to_vec();
    if let Some(first) = changed.first_mut() {
        first.ip = v4([10, 255, 0, 0], 1);
    }
    snap.endpoints.insert(info.name.clone(), changed.into());
    step(
        "change one endpoint",
        &snap,
        &info.name.service,
        &mut proxier,
    )?;
    // Delete the added Service.
    snap.services.retain(|k, _| k.service != added);
    snap.endpoints.retain(|k, _| k.service != added);
    step("delete one Service", &snap, &added, &mut proxier)?;

    Ok(ScaleRun {
        services,
        endpoints,
        render: render_time,
        payload_bytes: payload.len(),
        load,
        resync,
        resync_bytes: full.payload_bytes,
        changes,
    })
}

/// The median of `values` (the lower middle for an even count); zero when empty.
pub fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values
        .get(values.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or_default()
}

/// Medians over several runs of the same size, for printing.
pub fn summarize(runs: &[ScaleRun]) -> BTreeMap<&'static str, Duration> {
    let mut out = BTreeMap::new();
    out.insert("render", median(runs.iter().map(|r| r.render).collect()));
    out.insert("load", median(runs.iter().map(|r| r.load).collect()));
    out.insert("resync", median(runs.iter().map(|r| r.resync).collect()));
    if let Some(first) = runs.first() {
        for (i, c) in first.changes.iter().enumerate() {
            out.insert(
                c.what,
                median(
                    runs.iter()
                        .filter_map(|r| r.changes.get(i).map(|c| c.time))
                        .collect(),
                ),
            );
        }
    }
    out
}
