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
//!
//! `kp-bench all` runs the whole suite side by side for every mode: [`control`] (render,
//! kernel load, syncs, one-Service changes, RSS), [`datapath`] (new-connection latency,
//! requests per second, CPU per connection, bulk throughput through a ClusterIP) and writes
//! JSON, Markdown and SVG charts ([`report`]); with `--daemon-sizes` it also measures the
//! real daemon's own peak memory from each source ([`daemon`], also `kp-bench daemon-rss`).
//!
//! Userspace mode ([`Mode::Userspace`], [`userspace`]) runs its `kp-relay` inside the
//! benchmark process, on a runtime whose threads are in the node namespace; the
//! [`Mode::Direct`] pseudo-mode is the baseline every mode is compared with: the client
//! connects to the backend pods directly, in the same topology and run.

pub mod control;
pub mod daemon;
pub mod datapath;
pub mod report;
pub mod stream;
pub mod userspace;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use ipnet::IpNet;
use kp_model::{
    Changes, Endpoint, EndpointEntry, EndpointPort, EndpointSlice, IpFamily, NamespacedName,
    ObjectKind, Protocol, Service, ServicePortInfo, ServicePortName, ServicePortSpec, ServiceType,
    SessionAffinity, SliceAddressType, Snapshot, SourceEvent,
};
use kp_netfilter::{ExecNft, Nft, SystemExec, TableObjects};
use kp_proxier::nftables::render::{RenderConfig, render};
use kp_proxier::nftables::{NftablesConfig, NftablesProxier, reconcile};
use kp_proxier::{FakeHost, LocalDetector, NodePortAddresses, Proxier};

/// This node's name in the synthetic cluster.
pub const NODE: &str = "bench-node";

/// The pod CIDR of the synthetic cluster, `10.128.0.0/9` (endpoints are allocated from it).
pub const POD_CIDR: &str = "10.128.0.0/9";

/// A proxy mode under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mode {
    /// iptables mode, `iptables-legacy-restore`.
    IptablesLegacy,
    /// iptables mode, `iptables-nft-restore` (Debian's default `iptables-restore`), as the
    /// proxier runs it by default: large full syncs split into several nat transactions
    /// ([`kp_proxier::iptables::reconcile::split`]).
    IptablesNft,
    /// iptables mode, `iptables-nft-restore`, every full sync one nat transaction (the
    /// behaviour before the split, kept to measure it side by side:
    /// [`kp_proxier::iptables::IptablesProxier::with_split_full_syncs`] `(None)`).
    IptablesNftOne,
    /// iptables mode, `iptables-nft-restore`, full syncs starting with `-Z`
    /// ([`kp_proxier::iptables::IptablesProxier::with_zero_counters_on_full_sync`]).
    IptablesNftZero,
    /// iptables mode, `iptables-legacy-restore`, with `--iptables-dispatch tree`
    /// ([`kp_proxier::iptables::tree`]): `KUBE-SERVICES` dispatches through a tree of
    /// `KUBE-SVT-` chains.
    IptablesLegacyTree,
    /// iptables mode, `iptables-nft-restore` (split full syncs, as [`Mode::IptablesNft`]),
    /// with `--iptables-dispatch tree`.
    IptablesNftTree,
    /// nftables mode, `nft -f`.
    Nftables,
    /// IPVS mode: virtual servers over generic netlink, kube-ipvs0 addresses over rtnetlink,
    /// `ipset restore`, and a fixed handful of rules through `iptables-legacy-restore`. Needs
    /// a kernel with IPVS and dummy links (the qemu guest of [`kp_testkit::vm`] here).
    Ipvs,
    /// Userspace mode: a `kp-relay` proxy socket per Service port (tokio tasks, `splice(2)`
    /// through a pipe per direction, [`userspace::NsRelay`]) and iptables nat `REDIRECT`
    /// portals through `iptables-legacy-restore`.
    Userspace,
    /// Not a proxy mode: the baseline. The client connects straight to the backend pods'
    /// IP:port (round robin over the ten backends, client side); no Service, no rules, no
    /// control plane.
    Direct,
}

impl Mode {
    /// Every mode, in report order (the [`Mode::Direct`] baseline last).
    pub const ALL: [Mode; 10] = [
        Mode::IptablesLegacy,
        Mode::IptablesNft,
        Mode::IptablesNftOne,
        Mode::IptablesNftZero,
        Mode::IptablesLegacyTree,
        Mode::IptablesNftTree,
        Mode::Nftables,
        Mode::Ipvs,
        Mode::Userspace,
        Mode::Direct,
    ];

    /// The modes any kernel with netfilter can run (every mode but [`Mode::Ipvs`]), and the
    /// [`Mode::Direct`] baseline: the default of `kp-bench all` on a host without IPVS.
    /// [`Mode::IptablesNftOne`] is left out (it takes minutes from 2,000 Services on); select
    /// it with `--modes`.
    pub const HOST: [Mode; 8] = [
        Mode::IptablesLegacy,
        Mode::IptablesNft,
        Mode::IptablesNftZero,
        Mode::IptablesLegacyTree,
        Mode::IptablesNftTree,
        Mode::Nftables,
        Mode::Userspace,
        Mode::Direct,
    ];

    /// The modes `kp-bench vm` compares inside the guest: one of each kind.
    pub const VM: [Mode; 3] = [Mode::IptablesLegacy, Mode::Nftables, Mode::Ipvs];

    /// `iptables-legacy`, `iptables-nft`, `iptables-nft-one`, `iptables-nft-zero`,
    /// `iptables-legacy-tree`, `iptables-nft-tree`, `nftables`, `ipvs`, `userspace`, `direct`.
    pub fn label(self) -> &'static str {
        match self {
            Mode::IptablesLegacy => "iptables-legacy",
            Mode::IptablesNft => "iptables-nft",
            Mode::IptablesNftOne => "iptables-nft-one",
            Mode::IptablesNftZero => "iptables-nft-zero",
            Mode::IptablesLegacyTree => "iptables-legacy-tree",
            Mode::IptablesNftTree => "iptables-nft-tree",
            Mode::Nftables => "nftables",
            Mode::Ipvs => "ipvs",
            Mode::Userspace => "userspace",
            Mode::Direct => "direct",
        }
    }

    /// Whether the mode programs anything (every mode but the [`Mode::Direct`] baseline,
    /// which has no control plane).
    pub fn has_rules(self) -> bool {
        self != Mode::Direct
    }

    /// Whether this is iptables mode (any backend).
    pub fn is_iptables(self) -> bool {
        matches!(
            self,
            Mode::IptablesLegacy
                | Mode::IptablesNft
                | Mode::IptablesNftOne
                | Mode::IptablesNftZero
                | Mode::IptablesLegacyTree
                | Mode::IptablesNftTree
        )
    }

    /// Whether this is iptables mode on the legacy backend (`iptables-legacy-restore`).
    pub fn is_iptables_legacy(self) -> bool {
        matches!(self, Mode::IptablesLegacy | Mode::IptablesLegacyTree)
    }

    /// Whether this is iptables mode with `--iptables-dispatch tree`.
    pub fn is_tree(self) -> bool {
        matches!(self, Mode::IptablesLegacyTree | Mode::IptablesNftTree)
    }

    /// How iptables mode dispatches in this mode.
    pub fn dispatch(self) -> kp_proxier::iptables::tree::Dispatch {
        if self.is_tree() {
            kp_proxier::iptables::tree::Dispatch::tree()
        } else {
            kp_proxier::iptables::tree::Dispatch::Upstream
        }
    }

    /// The daemon mode of the same name, for the daemon-memory points: `None` for the
    /// benchmark-only variants (`iptables-nft-one`, `iptables-nft-zero`, the two tree modes) and
    /// `direct`.
    pub fn daemon_mode(self) -> Option<kp_testkit::rss::DaemonMode> {
        use kp_testkit::rss::DaemonMode;
        match self {
            Mode::IptablesLegacy => Some(DaemonMode::IptablesLegacy),
            Mode::IptablesNft => Some(DaemonMode::IptablesNft),
            Mode::Nftables => Some(DaemonMode::Nftables),
            Mode::Ipvs => Some(DaemonMode::Ipvs),
            Mode::Userspace => Some(DaemonMode::Userspace),
            Mode::IptablesNftOne
            | Mode::IptablesNftZero
            | Mode::IptablesLegacyTree
            | Mode::IptablesNftTree
            | Mode::Direct => None,
        }
    }

    /// Parses a [`Mode::label`].
    pub fn parse(s: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.label() == s)
    }
}

/// Renders the cold full payload of `mode` for `snap` (a node without our rules) and the time
/// it took (render plus payload text, no kernel). Userspace mode: the portal rules of a first
/// sync against fakes ([`userspace::userspace_payload`]); [`Mode::Direct`]: nothing.
pub fn render_payload(mode: Mode, snap: &Snapshot) -> (String, Duration) {
    match mode {
        Mode::Nftables => render_fresh(snap),
        Mode::Ipvs => {
            let (p, took) = ipvs_payload(snap);
            (p.text(), took)
        }
        Mode::Userspace => userspace::userspace_payload(snap),
        Mode::Direct => (String::new(), Duration::ZERO),
        Mode::IptablesLegacy
        | Mode::IptablesNft
        | Mode::IptablesNftOne
        | Mode::IptablesNftZero
        | Mode::IptablesLegacyTree
        | Mode::IptablesNftTree => {
            let cfg = kp_proxier::iptables::render::RenderConfig {
                dispatch: mode.dispatch(),
                ..iptables_render_config()
            };
            let t = Instant::now();
            // What the nf_tables backend sends a fresh node by default: the split payload of
            // the proxier's full sync (two render passes, as it streams it).
            let payload = if matches!(mode, Mode::IptablesNft | Mode::IptablesNftTree) {
                use kp_proxier::iptables::reconcile::{full, split};
                full::payload(
                    snap,
                    &cfg,
                    &mut kp_proxier::iptables::render::RenderCache::new(),
                    None,
                    &full::Options {
                        zero_counters: false,
                        split: Some(split::NFT_SPLIT),
                    },
                )
                .0
            } else {
                let mut r = kp_proxier::iptables::render::render(snap, &cfg, None);
                kp_proxier::iptables::reconcile::full_payload_take_with(
                    &mut r,
                    None,
                    mode == Mode::IptablesNftZero,
                )
                .0
            };
            (payload, t.elapsed())
        }
    }
}

/// The cold IPVS-mode payload of a snapshot, in the kernel tools' text forms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpvsPayload {
    /// `ipvsadm --restore` input: the virtual and real servers ([`kp_netlink::ipvs::save_text`]).
    pub ipvsadm: String,
    /// `ipset restore` input: upstream's sets with their entries.
    pub ipset: Vec<u8>,
    /// The fixed iptables rules (filter and nat), `iptables-restore` input.
    pub iptables: String,
    /// IPVS netlink requests a cold sync sends: one per virtual server and real server.
    pub requests: usize,
    /// Addresses bound to kube-ipvs0.
    pub addresses: usize,
}

impl IpvsPayload {
    /// The three payloads one after the other (for `kp-bench dump` and the byte counts).
    pub fn text(&self) -> String {
        format!(
            "# ipvsadm --restore\n{}# ipset restore\n{}# iptables-restore\n{}",
            self.ipvsadm,
            String::from_utf8_lossy(&self.ipset),
            self.iptables
        )
    }
}

/// The node address of the synthetic cluster (a NodePort gets a virtual server on it).
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 56, 10);

/// The IPVS render settings the benchmark uses: the defaults (`rr`), ClusterCIDR detection
/// with `cluster_cidr`, NodePorts on [`NODE_IP`], as the proxier resolves them in a namespace
/// whose only non-loopback address is [`NODE_IP`].
pub fn ipvs_render_config(cluster_cidr: IpNet) -> kp_proxier::ipvs::render::RenderConfig {
    let node = IpAddr::V4(NODE_IP);
    kp_proxier::ipvs::render::RenderConfig {
        local: LocalDetector::Cidrs(vec![cluster_cidr]).for_family(IpFamily::V4, &[]),
        nodeport_ips: vec![node],
        other_addresses: [IpAddr::V4(Ipv4Addr::LOCALHOST), node].into(),
        node_ip: Some(node),
        ..kp_proxier::ipvs::render::RenderConfig::default()
    }
}

/// The ipset spec of one of upstream's IPVS-mode sets (IPv4), as the proxier creates it.
pub fn ipvs_set_spec(set: kp_proxier::ipvs::names::KubeSet) -> kp_netfilter::ipset::SetSpec {
    use kp_netfilter::ipset::{SetFamily, SetKind, SetSpec};
    use kp_proxier::ipvs::names::SetType;
    let name = set.name(IpFamily::V4);
    let kind = match set.set_type() {
        SetType::HashIp => SetKind::HashIp,
        SetType::HashIpPort => SetKind::HashIpPort,
        SetType::HashIpPortIp => SetKind::HashIpPortIp,
        SetType::HashIpPortNet => SetKind::HashIpPortNet,
        SetType::BitmapPort => return SetSpec::bitmap_port(name, (0, 65535)),
    };
    SetSpec::hash(name, kind, SetFamily::Inet)
}

/// Renders the cold IPVS-mode payload of `snap` (render plus the three texts, no kernel) and
/// the time it took.
pub fn ipvs_payload(snap: &Snapshot) -> (IpvsPayload, Duration) {
    use kp_netlink::ipvs::{RealServer, ServiceKey, VirtualServer};
    use kp_proxier::ipvs::names::{FILTER_CHAINS, KubeSet, NAT_CHAINS};
    let cfg = ipvs_render_config(pod_cidr());
    let t = Instant::now();
    let r = kp_proxier::ipvs::render::render(snap, &cfg);
    let mut requests = 0;
    let services: Vec<(VirtualServer, Vec<RealServer>)> = r
        .virtual_servers
        .iter()
        .map(|(k, spec)| {
            let key = ServiceKey::new(
                k.addr,
                kp_proxier::ipvs::render::proto_number(k.protocol),
                k.port,
            );
            let mut vs = VirtualServer::new(key, &cfg.scheduler);
            if let Some(t) = spec.persistent_timeout {
                vs = vs.persistent(t);
            }
            let reals: Vec<RealServer> = spec
                .real_servers
                .iter()
                .map(|rs| RealServer::new(rs.ip(), rs.port(), 1))
                .collect();
            requests += 1 + reals.len();
            (vs, reals)
        })
        .collect();
    let ipvsadm = kp_netlink::ipvs::save_text(&services);
    let desired: Vec<kp_netfilter::ipset::SetState> = KubeSet::ALL
        .iter()
        .map(|s| kp_netfilter::ipset::SetState {
            spec: ipvs_set_spec(*s),
            entries: r.sets.get(s).cloned().unwrap_or_default(),
        })
        .collect();
    let ipset = kp_netfilter::ipset::diff(&desired, &[]);
    let mut iptables = String::new();
    for (table, chains, rules) in [
        ("filter", FILTER_CHAINS, &r.filter_rules),
        ("nat", NAT_CHAINS, &r.nat_rules),
    ] {
        iptables.push_str(&format!("*{table}\n"));
        for c in chains {
            iptables.push_str(&format!(":{c} - [0:0]\n"));
        }
        iptables.push_str(rules);
        iptables.push_str("COMMIT\n");
    }
    let took = t.elapsed();
    (
        IpvsPayload {
            ipvsadm,
            ipset,
            iptables,
            requests,
            addresses: r.bind_addrs.len(),
        },
        took,
    )
}

/// The iptables render settings the benchmark uses: ClusterCIDR detection with
/// [`POD_CIDR`], NodePorts on every local address, IPv4.
pub fn iptables_render_config() -> kp_proxier::iptables::render::RenderConfig {
    kp_proxier::iptables::render::RenderConfig {
        local: LocalDetector::Cidrs(vec![pod_cidr()]).for_family(IpFamily::V4, &[]),
        ..kp_proxier::iptables::render::RenderConfig::default()
    }
}

pub(crate) fn v4(base: [u8; 4], offset: usize) -> IpAddr {
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
            topology: None,
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

/// The source events of the same synthetic cluster as [`scale_snapshot`] (one Service and
/// one EndpointSlice per Service, then `Synced` for both kinds), for feeding a
/// [`kp_track::Tracker`].
pub fn scale_events(services: usize, endpoints: usize) -> Vec<SourceEvent> {
    let mut out = Vec::with_capacity(2 * services + 2);
    for i in 0..services {
        let (svc, slice) = scale_objects(i, endpoints);
        out.push(SourceEvent::ServiceUpsert(svc));
        out.push(SourceEvent::SliceUpsert(slice));
    }
    out.push(SourceEvent::Synced(ObjectKind::Service));
    out.push(SourceEvent::Synced(ObjectKind::EndpointSlice));
    out
}

/// Service `i` and its EndpointSlice as source objects (the same cluster as
/// [`scale_service`]).
pub fn scale_objects(i: usize, endpoints: usize) -> (Service, EndpointSlice) {
    let (info, eps) = scale_service(i, endpoints);
    let name = info.name.service.clone();
    let mut svc = Service::cluster_ip(
        name.clone(),
        info.cluster_ip,
        vec![ServicePortSpec {
            name: info.name.port.clone(),
            protocol: info.name.protocol,
            port: info.port,
            node_port: info.node_port,
        }],
    );
    svc.service_type = info.service_type;
    let slice = EndpointSlice {
        name: NamespacedName::new(name.namespace.clone(), format!("{}-abcde", name.name)),
        service: name,
        address_type: SliceAddressType::V4,
        ports: vec![EndpointPort {
            name: info.name.port.clone(),
            protocol: info.name.protocol,
            port: 8080,
        }],
        endpoints: eps
            .iter()
            .map(|e| EndpointEntry::ready(e.ip, Some(if e.is_local { NODE } else { "other" })))
            .collect(),
        last_change_trigger_time: None,
    };
    (svc, slice)
}

/// The pod CIDR as a network.
pub(crate) fn pod_cidr() -> IpNet {
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

/// Settings of [`run_all`].
#[derive(Debug, Clone)]
pub struct AllOptions {
    /// Modes to measure.
    pub modes: Vec<Mode>,
    /// Control-plane sizes (Services × 10 endpoints).
    pub control_sizes: Vec<usize>,
    /// Datapath sizes (background Services).
    pub datapath_sizes: Vec<usize>,
    /// Control-plane runs per point.
    pub runs: usize,
    /// Latency probes per datapath point and position.
    pub probes: usize,
    /// Endpoints of each probed Service ([`datapath::DatapathOptions::probe_endpoints`]).
    pub probe_endpoints: usize,
    /// Seconds per requests-per-second run.
    pub rps_seconds: f64,
    /// Client threads of the requests-per-second runs.
    pub concurrency: usize,
    /// Timeout of each kernel-tool run.
    pub tool_timeout: Duration,
    /// The `kp-bench` binary for the RSS child (`None`: RSS not measured).
    pub rss_binary: Option<std::path::PathBuf>,
    /// Datapath positions of the probed Service to measure: `first` and/or `last` in
    /// KUBE-SERVICES order.
    pub positions: Vec<String>,
    /// Also measure requests per second on kept-alive connections.
    pub keepalive: bool,
    /// Seconds of each bulk-throughput measurement (0: not measured).
    pub bulk_seconds: f64,
    /// Parallel long-lived connections of the bulk-throughput measurements (one measurement
    /// per entry).
    pub bulk_streams: Vec<usize>,
    /// Datapath rounds ([`datapath::DatapathOptions::rounds`]): at each size every mode is
    /// set up at once and measured round by round, each round with its share of the probes
    /// and seconds.
    pub rounds: usize,
    /// Sizes of the daemon-memory points ([`daemon`]; empty: not measured).
    pub daemon_sizes: Vec<usize>,
    /// Sources of the daemon-memory points.
    pub daemon_sources: Vec<kp_testkit::rss::Source>,
    /// The `kube-proxy-rs` binary for the daemon-memory points (`None`: not measured).
    pub proxy_binary: Option<std::path::PathBuf>,
    /// How long one daemon may take to complete its first sync.
    pub daemon_timeout: Duration,
    /// How long to wait after a daemon's first sync before reading its memory.
    pub daemon_settle: Duration,
    /// Quick mode (recorded in the report).
    pub quick: bool,
    /// The command line (recorded in the report).
    pub command: String,
}

/// The command line as a report records it: the program as `kp-bench`, whatever path or
/// name it was run by (a report is read on other machines), then the arguments as given.
/// `args` is the process's arguments, the program first (`std::env::args()`).
pub fn command_line(args: impl IntoIterator<Item = String>) -> String {
    let mut args = args.into_iter();
    let _program = args.next();
    std::iter::once("kp-bench".to_string())
        .chain(args)
        .collect::<Vec<_>>()
        .join(" ")
}

impl AllOptions {
    /// The full run: 100, 1k, 5k, 10k Services, 3 runs, 2,000 probes, bulk throughput with
    /// 1 and 4 streams for 3 s each, 10-minute timeouts.
    pub fn full() -> Self {
        AllOptions {
            modes: Mode::HOST.to_vec(),
            control_sizes: vec![100, 1000, 5000, 10_000],
            datapath_sizes: vec![0, 1000, 5000, 10_000],
            runs: 3,
            probes: 2000,
            probe_endpoints: datapath::DEFAULT_PROBE_ENDPOINTS,
            rps_seconds: 3.0,
            concurrency: 4,
            tool_timeout: Duration::from_secs(600),
            rss_binary: None,
            positions: vec!["first".into(), "last".into()],
            keepalive: true,
            bulk_seconds: 3.0,
            bulk_streams: vec![1, 4],
            rounds: 1,
            daemon_sizes: vec![1000, 5000, 10_000],
            daemon_sources: kp_testkit::rss::Source::ALL.to_vec(),
            proxy_binary: None,
            daemon_timeout: Duration::from_secs(600),
            daemon_settle: Duration::from_secs(2),
            quick: false,
            command: String::new(),
        }
    }

    /// The defaults of `kp-bench vm` (inside the emulated guest, ~15-20 minutes): the three
    /// [`Mode::VM`] modes; control plane at 1,000 Services, one run; datapath at 0, 1k, 5k
    /// and 10k background Services, the probed Service last only, 300 probes, 2 s of
    /// new-connection requests for the CPU per connection, no keepalive or bulk run;
    /// 10-minute tool timeouts.
    pub fn vm() -> Self {
        AllOptions {
            modes: Mode::VM.to_vec(),
            control_sizes: vec![1000],
            runs: 1,
            probes: 300,
            rps_seconds: 2.0,
            concurrency: 2,
            tool_timeout: Duration::from_secs(600),
            positions: vec!["last".into()],
            keepalive: false,
            bulk_seconds: 0.0,
            daemon_sizes: Vec::new(),
            ..AllOptions::full()
        }
    }

    /// The quick run for CI: 100 Services, 200 probes, one run, 0.2 s bulk runs, two
    /// datapath rounds, short timeouts.
    pub fn quick() -> Self {
        AllOptions {
            control_sizes: vec![100],
            datapath_sizes: vec![0, 100],
            runs: 1,
            probes: 200,
            rps_seconds: 0.3,
            concurrency: 2,
            bulk_seconds: 0.2,
            rounds: 2,
            tool_timeout: Duration::from_secs(120),
            daemon_sizes: vec![100],
            daemon_timeout: Duration::from_secs(120),
            daemon_settle: Duration::from_millis(500),
            quick: true,
            ..AllOptions::full()
        }
    }
}

/// Runs every benchmark side by side (each point measures the modes one after the other)
/// and returns the report. Progress goes to stderr.
///
/// # Errors
/// Creating namespaces fails (needs root).
pub fn run_all(opts: &AllOptions) -> anyhow::Result<RunReportAlias> {
    let started = Instant::now();
    let load_start = load_average();
    let started_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let copts = control::ControlOptions {
        runs: opts.runs,
        tool_timeout: opts.tool_timeout,
        rss_binary: opts.rss_binary.clone(),
    };
    let mut control_points = Vec::new();
    for &n in &opts.control_sizes {
        // The direct baseline has no control plane.
        for &mode in opts.modes.iter().filter(|m| m.has_rules()) {
            eprintln!(
                "[{:>6.0} s] control plane: {} at {n} Services",
                started.elapsed().as_secs_f64(),
                mode.label()
            );
            // A size above one whose load already timed out would time out too.
            let timed_out = control_points.iter().find(|c: &&control::ControlPoint| {
                c.mode == mode.label() && c.services < n && c.floor.ms().is_none()
            });
            if let Some(c) = timed_out {
                control_points.push(control::ControlPoint::skipped(
                    mode,
                    n,
                    10,
                    format!("the kernel tool did not finish at {} Services", c.services),
                ));
                continue;
            }
            let p = control::control_point(mode, n, 10, &copts)?;
            eprintln!(
                "           render {}, floor {}, cold sync {}, resync {}",
                control::fmt_ms(p.render_ms),
                p.floor.cell(),
                p.cold_sync.cell(),
                p.resync.cell()
            );
            control_points.push(p);
        }
    }
    let dopts = datapath::DatapathOptions {
        probes: opts.probes,
        probe_endpoints: opts.probe_endpoints,
        rps_seconds: opts.rps_seconds,
        concurrency: opts.concurrency,
        tool_timeout: opts.tool_timeout,
        positions: opts.positions.clone(),
        keepalive: opts.keepalive,
        bulk_seconds: opts.bulk_seconds,
        bulk_streams: opts.bulk_streams.clone(),
        rounds: opts.rounds,
    };
    let mut datapath_points = Vec::new();
    for &n in &opts.datapath_sizes {
        // Do not wait again for a load the control plane already saw time out.
        let hopeless = |mode: Mode| {
            control_points.iter().any(|c: &control::ControlPoint| {
                c.mode == mode.label() && c.services <= n && c.floor.ms().is_none()
            })
        };
        let runnable: Vec<Mode> = opts
            .modes
            .iter()
            .copied()
            .filter(|m| !hopeless(*m))
            .collect();
        eprintln!(
            "[{:>6.0} s] datapath: {} with {n} background Services, {} round(s)",
            started.elapsed().as_secs_f64(),
            runnable
                .iter()
                .map(|m| m.label())
                .collect::<Vec<_>>()
                .join(", "),
            dopts.rounds.max(1)
        );
        let mut measured = datapath::datapath_points(&runnable, n, &dopts)?.into_iter();
        for &mode in &opts.modes {
            if hopeless(mode) {
                datapath_points.push(datapath::DatapathPoint {
                    mode: mode.label().into(),
                    services: n,
                    probe_endpoints: opts.probe_endpoints,
                    load: control::Timed::Skipped {
                        reason: "the kernel tool did not load this size in the control-plane run"
                            .into(),
                    },
                    sysctl_warnings: Vec::new(),
                    positions: Vec::new(),
                });
            } else if let Some(p) = measured.next() {
                datapath_points.push(p);
            }
        }
    }
    let daemon_points = match &opts.proxy_binary {
        Some(binary) if !opts.daemon_sizes.is_empty() => {
            eprintln!(
                "[{:>6.0} s] daemon memory at {:?} Services",
                started.elapsed().as_secs_f64(),
                opts.daemon_sizes
            );
            daemon::run(&daemon::DaemonOptions {
                sizes: opts.daemon_sizes.clone(),
                endpoints: 10,
                modes: opts.modes.iter().filter_map(|m| m.daemon_mode()).collect(),
                sources: opts.daemon_sources.clone(),
                binary: binary.clone(),
                timeout: opts.daemon_timeout,
                settle: opts.daemon_settle,
            })
        }
        _ => Vec::new(),
    };
    Ok(report::RunReport {
        command: opts.command.clone(),
        started_unix,
        duration_s: started.elapsed().as_secs_f64(),
        quick: opts.quick,
        machine: report::MachineInfo::read(),
        environment: kp_testkit::vm::in_guest().then(|| report::GUEST_NOTE.to_string()),
        load_average: Some((load_start, load_average())),
        control: control_points,
        datapath: datapath_points,
        daemon: daemon_points,
    })
}

/// `/proc/loadavg`, trimmed (empty when unreadable).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The report type of [`run_all`].
pub type RunReportAlias = report::RunReport;

#[cfg(test)]
mod command_line_tests {
    use super::command_line;

    #[test]
    fn the_recorded_command_names_kp_bench_not_a_path() {
        let args = [
            "/work/bench-bin/kp-bench-run",
            "all",
            "--out",
            "docs/benchmarks",
        ];
        assert_eq!(
            command_line(args.iter().map(|s| s.to_string())),
            "kp-bench all --out docs/benchmarks"
        );
    }
}
