//! Running the proxy: flags → configuration → source, tracker, sync loop, proxier.

use std::net::IpAddr;
use std::sync::Arc;

use anyhow::{Context, anyhow, bail};
use ipnet::IpNet;
use kp_model::IpFamily;
use kp_netfilter::{
    Backend, ExecIptables, ExecNft, FakeIptables, IpVersion, Iptables, Nft, NftVersion,
    TableObjects,
};
use kp_proxier::iptables::{IptablesConfig, IptablesProxier};
use kp_proxier::ipvs::IpvsProxier;
use kp_proxier::nftables::{NftablesConfig, NftablesProxier};
use kp_proxier::{Host, LocalDetector, NodePortAddresses, Proxier, RealHost};
use kp_runtime::{RunMode, RunnerConfig, SyncLoop};
use kp_track::Tracker;
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

use crate::cli::{
    DetectLocalModeArg, IptablesBackendArg, IptablesDispatchArg, ProxyArgs, ProxyModeArg,
};

/// The node name: `--hostname-override`, else the host name, lower-cased and trimmed (as
/// upstream's `GetHostname`).
pub fn node_name(override_name: Option<&str>) -> anyhow::Result<String> {
    let name = match override_name {
        Some(n) if !n.trim().is_empty() => n.trim().to_lowercase(),
        _ => nix::unistd::gethostname()
            .context("reading the host name")?
            .to_string_lossy()
            .trim()
            .to_lowercase(),
    };
    if name.is_empty() {
        bail!("empty node name: pass --hostname-override");
    }
    Ok(name)
}

/// Checks an interface name or prefix that will be written into rules.
fn interface_name(flag: &str, value: Option<&str>, max: usize) -> anyhow::Result<String> {
    let v = value.ok_or_else(|| anyhow!("{flag} is required with this --detect-local-mode"))?;
    let ok = !v.is_empty()
        && v.len() <= max
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'@' | b':'));
    if !ok {
        bail!(
            "{flag} {v:?} is not a valid interface name (1-{max} characters of [A-Za-z0-9-_.@:])"
        );
    }
    Ok(v.to_string())
}

/// Parses the cluster CIDRs (`--cluster-cidr`, or `clusterCIDR` in a `--config` file, named
/// by `name` in errors): empty entries are skipped; at most one CIDR per IP family, as
/// upstream's validation requires (one IPv4 and one IPv6 CIDR for a dual-stack cluster). A
/// second CIDR of a family would otherwise be ignored, and traffic from its pods masqueraded.
///
/// # Errors
/// An entry that is not a CIDR, or two of the same family, naming `name` and the entries.
pub(crate) fn cluster_cidrs<'a>(
    name: &str,
    entries: impl IntoIterator<Item = &'a str>,
) -> anyhow::Result<Vec<IpNet>> {
    let mut cidrs: Vec<(IpNet, &str)> = Vec::new();
    for c in entries.into_iter().map(str::trim).filter(|c| !c.is_empty()) {
        let net: IpNet = c
            .parse()
            .map_err(|_| anyhow!("{name}: {c:?} is not a CIDR"))?;
        if let Some((_, first)) = cidrs
            .iter()
            .find(|(other, _)| other.addr().is_ipv4() == net.addr().is_ipv4())
        {
            let family = if net.addr().is_ipv4() { "IPv4" } else { "IPv6" };
            bail!(
                "{name}: {first:?} and {c:?} are both {family}; give at most one CIDR per IP \
                 family (one IPv4 and one IPv6 CIDR for a dual-stack cluster)"
            );
        }
        cidrs.push((net.trunc(), c));
    }
    Ok(cidrs.into_iter().map(|(net, _)| net).collect())
}

/// `--detect-local-mode` with `--cluster-cidr`, `--pod-bridge-interface` or
/// `--pod-interface-name-prefix`.
///
/// # Errors
/// A message naming the flag whose value is invalid.
fn local_detector(args: &ProxyArgs) -> anyhow::Result<LocalDetector> {
    let cidrs = cluster_cidrs(
        "--cluster-cidr",
        args.cluster_cidr.iter().map(String::as_str),
    )?;
    let mode = args
        .detect_local_mode
        .unwrap_or(DetectLocalModeArg::ClusterCidr);
    Ok(match mode {
        // Warned about by `run` when it programs rules (not for --cleanup).
        DetectLocalModeArg::ClusterCidr if cidrs.is_empty() => LocalDetector::None,
        DetectLocalModeArg::ClusterCidr => LocalDetector::Cidrs(cidrs),
        DetectLocalModeArg::NodeCidr => LocalDetector::NodeCidr,
        DetectLocalModeArg::BridgeInterface => LocalDetector::BridgeInterface(interface_name(
            "--pod-bridge-interface",
            args.pod_bridge_interface.as_deref(),
            15,
        )?),
        DetectLocalModeArg::InterfaceNamePrefix => {
            LocalDetector::InterfaceNamePrefix(interface_name(
                "--pod-interface-name-prefix",
                args.pod_interface_name_prefix.as_deref(),
                14,
            )?)
        }
    })
}

/// Builds the iptables-mode configuration from the flags and the local-traffic detector
/// ([`local_detector`]).
///
/// # Errors
/// A message naming the flag whose value is invalid.
pub fn iptables_config(
    args: &ProxyArgs,
    local_detector: LocalDetector,
) -> anyhow::Result<IptablesConfig> {
    let nodeport_addresses = NodePortAddresses::parse(&args.nodeport_addresses)?;
    Ok(IptablesConfig {
        masquerade_all: args.masquerade_all,
        masquerade_bit: args.iptables_masquerade_bit,
        local_detector,
        nodeport_addresses,
        localhost_nodeports: args.iptables_localhost_nodeports,
        conntrack_tcp_be_liberal: args.conntrack_tcp_be_liberal,
    })
}

/// Builds the nftables-mode configuration from the flags and the local-traffic detector
/// ([`local_detector`]). Without `--nodeport-addresses`
/// NodePorts are accepted on the node's primary address only (`primary`), upstream's default
/// in nftables mode; `--iptables-localhost-nodeports` and `--conntrack-tcp-be-liberal` do not
/// apply (nftables mode never serves NodePorts on loopback and has no INVALID drop).
///
/// # Errors
/// A message naming the flag whose value is invalid.
pub fn nftables_config(
    args: &ProxyArgs,
    local_detector: LocalDetector,
) -> anyhow::Result<NftablesConfig> {
    let nodeport_addresses = if args.nodeport_addresses.iter().all(|a| a.trim().is_empty()) {
        NodePortAddresses::parse(&["primary"])?
    } else {
        NodePortAddresses::parse(&args.nodeport_addresses)?
    };
    Ok(NftablesConfig {
        masquerade_all: args.masquerade_all,
        masquerade_bit: args.iptables_masquerade_bit,
        local_detector,
        nodeport_addresses,
    })
}

/// The backend `--iptables-backend` names: [`Backend::Default`] for `auto`, which
/// [`choose_backend`] resolves for the modes that program iptables, and which the cleanups of
/// `--cleanup` and nftables mode take as "both backends".
fn backend(arg: IptablesBackendArg) -> Backend {
    match arg {
        IptablesBackendArg::Auto => Backend::Default,
        IptablesBackendArg::Nft => Backend::Nft,
        IptablesBackendArg::Legacy => Backend::Legacy,
    }
}

/// The backend the iptables, IPVS and userspace modes program: the one `--iptables-backend`
/// names, or with `auto` the one this node uses ([`kp_netfilter::detect_backend`]: kubelet's
/// `KUBE-IPTABLES-HINT`/`KUBE-KUBELET-CANARY` chains, else the backend holding more rules,
/// else nf_tables; iptables-wrapper's choice). The choice and its reason are logged.
///
/// A dry run without CAP_NET_ADMIN cannot read the node's rules: it takes `iptables` as found
/// on PATH (only its version shapes the payload).
pub fn choose_backend(arg: IptablesBackendArg, dry_run: bool) -> Backend {
    match arg {
        IptablesBackendArg::Nft | IptablesBackendArg::Legacy => {
            let backend = backend(arg);
            info!(
                backend = backend.name(),
                "iptables backend: {} (--iptables-backend)",
                backend.name()
            );
            backend
        }
        IptablesBackendArg::Auto if dry_run && !has_net_admin() => Backend::Default,
        IptablesBackendArg::Auto => {
            let choice = kp_netfilter::detect_backend();
            for e in &choice.errors {
                warn!("detecting the iptables backend: {e}");
            }
            info!(
                backend = choice.backend.name(),
                "iptables backend: {} ({choice})",
                choice.backend.name()
            );
            choice.backend
        }
    }
}

/// When a run of the iptables-based modes takes over a node (once its first sync has written
/// its rules, crate::takeover), removes kube-proxy's chains from the backend it does not use ([`kp_proxier::iptables::cleanup_other_backend`], both
/// families): the rules a kube-proxy left there (in the other backend, because its image
/// chose differently or its flags said so) would go on matching and DNATing to old
/// endpoints next to ours. Only tables that exist are read or written, so no legacy table is
/// created on an nf_tables node. Missing binaries mean there is nothing to clean; failures
/// are logged and the proxy starts anyway. Returns how many chains were removed.
fn remove_other_backend(backend: Backend) -> usize {
    let Some(other) = backend.other() else {
        return 0;
    };
    let mut removed = 0;
    for version in [IpVersion::V4, IpVersion::V6] {
        let ipt = ExecIptables::new(version, other);
        let tool = ipt.binary(kp_netfilter::Tool::Main);
        match kp_proxier::iptables::cleanup_other_backend(&ipt) {
            Ok(plan) if plan.removed.is_empty() => {}
            Ok(plan) => {
                for chain in &plan.removed {
                    debug!(backend = tool, "removed chain {chain}");
                }
                let kept: Vec<String> = plan
                    .kept
                    .iter()
                    .map(|(chain, why)| format!("{chain} ({why})"))
                    .collect();
                let message = format!(
                    "removed the chains an earlier kube-proxy left in {tool}, the backend this node does not use"
                );
                if kept.is_empty() {
                    info!(backend = tool, chains = plan.removed.len(), "{message}");
                } else {
                    info!(backend = tool, chains = plan.removed.len(), kept = %kept.join(", "), "{message}");
                }
                removed += plan.removed.len();
            }
            Err(kp_proxier::ProxierError::Netfilter(kp_netfilter::Error::BinaryNotFound {
                ..
            })) => {}
            Err(e) => warn!(
                backend = tool,
                "cannot remove kube-proxy's chains from {tool}, the backend this node does not use: {e}"
            ),
        }
    }
    removed
}

fn iptables_dispatch(arg: IptablesDispatchArg) -> kp_proxier::iptables::tree::Dispatch {
    match arg {
        IptablesDispatchArg::Upstream => kp_proxier::iptables::tree::Dispatch::Upstream,
        IptablesDispatchArg::Tree => kp_proxier::iptables::tree::Dispatch::tree(),
    }
}

/// A host for `--dry-run`: reads local addresses, never writes a sysctl.
struct ReadOnlyHost;

impl Host for ReadOnlyHost {
    fn local_addresses(&self) -> std::io::Result<Vec<IpAddr>> {
        RealHost.local_addresses()
    }
    fn set_sysctl(&self, key: &str, value: &str) -> std::io::Result<()> {
        info!("dry run: would set {key}={value}");
        Ok(())
    }
    fn get_sysctl(&self, key: &str) -> Option<String> {
        RealHost.get_sysctl(key)
    }
}

/// Removes iptables-mode rules from both families. With `--iptables-backend auto` it cleans
/// both the nf_tables and the legacy backend, since rules may have been written with either
/// (a backend whose binaries are missing is skipped). Only tables that exist are read and
/// written ([`kp_proxier::iptables::cleanup`]): no legacy table is created on a node that
/// has none. Returns how many chains were removed; `Err` when a cleanup failed (logged).
fn cleanup_iptables(backend: Backend) -> Result<usize, ()> {
    let backends: &[(Backend, &str)] = match backend {
        Backend::Default => &[(Backend::Nft, "nf_tables"), (Backend::Legacy, "legacy")],
        Backend::Nft => &[(Backend::Nft, "nf_tables")],
        Backend::Legacy => &[(Backend::Legacy, "legacy")],
    };
    let mut failed = false;
    let mut removed = 0;
    for (backend, name) in backends {
        for version in [IpVersion::V4, IpVersion::V6] {
            let ipt = ExecIptables::new(version, *backend);
            match kp_proxier::iptables::cleanup(&ipt) {
                Ok(plan) => {
                    for chain in &plan.removed {
                        info!(backend = name, family = ?version, "removed chain {chain}");
                    }
                    for (chain, why) in &plan.kept {
                        warn!(backend = name, family = ?version, "kept chain {chain}: {why}");
                    }
                    removed += plan.removed.len();
                }
                Err(kp_proxier::ProxierError::Netfilter(kp_netfilter::Error::BinaryNotFound {
                    binary,
                    ..
                })) => {
                    info!(
                        backend = name,
                        "{binary} is not installed; nothing to clean there"
                    );
                }
                Err(e) => {
                    error!(backend = name, family = ?version, "iptables cleanup failed: {e}");
                    failed = true;
                }
            }
        }
    }
    if failed { Err(()) } else { Ok(removed) }
}

/// Deletes the nftables-mode tables (`ip kube-proxy`, `ip6 kube-proxy`). Returns how many
/// existed; `Err` when nft failed (logged). A missing `nft` means there is nothing to clean.
fn cleanup_nftables() -> Result<usize, ()> {
    match kp_proxier::nftables::cleanup(&ExecNft::new()) {
        Ok(families) => {
            for f in &families {
                info!(family = %f, "deleted nftables table kube-proxy");
            }
            Ok(families.len())
        }
        Err(kp_proxier::ProxierError::Netfilter(kp_netfilter::Error::Io { source, .. }))
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            info!("nft is not installed; no nftables rules to clean");
            Ok(0)
        }
        Err(e) => {
            error!("nftables cleanup failed: {e}");
            Err(())
        }
    }
}

/// Removes userspace mode's portal chains from both families (every backend with `auto`),
/// leaving everything else; returns how many chains went.
fn cleanup_userspace(backend: Backend) -> usize {
    let backends: Vec<Backend> = match backend {
        Backend::Default => vec![Backend::Nft, Backend::Legacy],
        other => vec![other],
    };
    let mut removed = 0;
    for backend in backends {
        for version in [IpVersion::V4, IpVersion::V6] {
            let ipt = ExecIptables::new(version, backend);
            if !kp_proxier::userspace::has_leftovers(&ipt).unwrap_or(false) {
                continue;
            }
            match kp_proxier::userspace::cleanup(&ipt) {
                Ok(chains) => removed += chains.len(),
                Err(e) => warn!(family = ?version, "cannot remove userspace mode's chains: {e}"),
            }
        }
    }
    removed
}

/// `--cleanup`: removes the rules of both modes from both families (upstream's
/// `platformCleanup` does the same), leaving everything else alone.
fn cleanup(backend: Backend, ipvs_exclude: &[IpNet]) -> anyhow::Result<()> {
    // Chains first: an ipset an iptables rule references cannot be destroyed.
    let iptables = cleanup_iptables(backend);
    let nftables = cleanup_nftables();
    let ipvs = crate::ipvs_mode::cleanup_objects(ipvs_exclude, false);
    match (iptables, nftables, ipvs) {
        (Ok(0), Ok(0), Ok(false)) => {
            info!("no rules of kube-proxy-rs found");
            Ok(())
        }
        (Ok(_), Ok(_), Ok(_)) => Ok(()),
        _ => bail!("cleanup did not complete"),
    }
}

/// Once this mode's first sync has written every family's rules (crate::takeover), removes
/// what the other modes left, so a node can switch modes without a reboot and without a moment
/// without rules (upstream removes them before its first sync): iptables chains (and IPVS
/// mode's objects) in nftables mode, the nftables tables in the other modes, IPVS mode's own
/// chains, jumps, ipsets, virtual servers and kube-ipvs0 in iptables mode. Failures are
/// logged; the proxy goes on.
///
/// After a fallback from IPVS mode (`ipvs_fallback`), IPVS mode's objects are left in place:
/// the operator asked for IPVS mode, and its next start, once the node has what it lacks,
/// takes them over.
fn remove_other_mode(
    mode: ProxyModeArg,
    backend: Backend,
    ipvs_exclude: &[IpNet],
    ipvs_fallback: bool,
) {
    let nftables = || {
        if let Ok(n) = cleanup_nftables()
            && n > 0
        {
            info!(
                tables = n,
                "removed the nftables-mode tables of an earlier run"
            );
        }
    };
    match mode {
        ProxyModeArg::Nftables => {
            if let Ok(n) = cleanup_iptables(backend)
                && n > 0
            {
                info!(
                    chains = n,
                    "removed the iptables-mode and IPVS-mode rules of an earlier run"
                );
            }
            let _ = crate::ipvs_mode::cleanup_objects(ipvs_exclude, true);
        }
        ProxyModeArg::Iptables => {
            nftables();
            if cleanup_userspace(backend) > 0 {
                info!("removed the userspace-mode portal chains of an earlier run");
            }
            // IPVS mode shares chains with iptables mode, which its first sync has rewritten:
            // what is left of IPVS mode are its own chains and jumps (which reference its
            // ipsets), then the sets, virtual servers and kube-ipvs0.
            if ipvs_fallback {
                if crate::ipvs_mode::has_leftovers() {
                    warn!(
                        "IPVS-mode objects of an earlier run are left in place (fallback from IPVS mode); --cleanup removes them"
                    );
                }
            } else if crate::ipvs_mode::has_leftovers()
                && cleanup_ipvs_iptables(backend).is_ok()
                && let Ok(true) = crate::ipvs_mode::cleanup_objects(ipvs_exclude, true)
            {
                info!(
                    "removed the IPVS-mode rules, ipsets, virtual servers and kube-ipvs0 of an earlier run"
                );
            }
        }
        // iptables mode's own chains are removed by IPVS mode's first full sync, in the same
        // iptables-restore that writes IPVS mode's rules.
        ProxyModeArg::Ipvs => {
            nftables();
            if cleanup_userspace(backend) > 0 {
                info!("removed the userspace-mode portal chains of an earlier run");
            }
        }
        // Userspace mode's first full sync deletes iptables mode's chains in its own
        // restore; an IPVS run went before it ([`remove_before_first_sync`]).
        ProxyModeArg::Userspace => nftables(),
    }
}

/// What must go before this mode's first sync: in userspace mode, an IPVS run, whole (its
/// rules reference its ipsets, and userspace mode's restore does not rewrite them).
fn remove_before_first_sync(mode: ProxyModeArg, backend: Backend, ipvs_exclude: &[IpNet]) {
    if mode == ProxyModeArg::Userspace && crate::ipvs_mode::has_leftovers() {
        let _ = cleanup_iptables(backend);
        if let Ok(true) = crate::ipvs_mode::cleanup_objects(ipvs_exclude, true) {
            info!(
                "removed the IPVS-mode rules, ipsets, virtual servers and kube-ipvs0 of an earlier run"
            );
        }
    }
}

/// Removes IPVS mode's own chains and jumps from both families of `backend` once iptables
/// mode's rules are written ([`kp_proxier::iptables::cleanup_ipvs_leftovers`]); `Err` when
/// one failed (logged), so its ipsets, still referenced, are left.
fn cleanup_ipvs_iptables(backend: Backend) -> Result<(), ()> {
    let mut failed = false;
    for version in [IpVersion::V4, IpVersion::V6] {
        let ipt = ExecIptables::new(version, backend);
        match kp_proxier::iptables::cleanup_ipvs_leftovers(&ipt) {
            Ok(plan) => {
                for chain in &plan.removed {
                    debug!(family = ?version, "removed IPVS-mode chain {chain}");
                }
            }
            Err(kp_proxier::ProxierError::Netfilter(kp_netfilter::Error::BinaryNotFound {
                ..
            })) => {}
            Err(e) => {
                error!(family = ?version, "cannot remove IPVS mode's iptables rules: {e}");
                failed = true;
            }
        }
    }
    if failed { Err(()) } else { Ok(()) }
}

/// Whether this process may change netfilter rules (CAP_NET_ADMIN in its effective set).
fn has_net_admin() -> bool {
    const CAP_NET_ADMIN: u32 = 12;
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << CAP_NET_ADMIN) != 0)
}

/// SIGTERM and SIGINT, each time they come (a second one ends the wait for a sync in
/// flight, see crate::shutdown). A signal whose handler cannot be installed never comes.
struct Signals {
    term: Option<tokio::signal::unix::Signal>,
    int: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn new() -> Signals {
        use tokio::signal::unix::{SignalKind, signal};
        Signals {
            term: signal(SignalKind::terminate()).ok(),
            int: signal(SignalKind::interrupt()).ok(),
        }
    }

    /// The next signal's name.
    async fn recv(&mut self) -> &'static str {
        async fn next(s: &mut Option<tokio::signal::unix::Signal>) {
            let got = match s {
                Some(s) => s.recv().await.is_some(),
                None => false,
            };
            if !got {
                std::future::pending::<()>().await;
            }
        }
        tokio::select! {
            () = next(&mut self.term) => "SIGTERM",
            () = next(&mut self.int) => "SIGINT",
        }
    }
}

/// Spawns one family's sync loop on `loops`; what it is busy with goes to a new entry of
/// `activities` (crate::shutdown says what a stop waits for).
#[allow(clippy::too_many_arguments)]
fn spawn_loop<P: Proxier + 'static>(
    loops: &mut tokio::task::JoinSet<(IpFamily, Result<(), kp_runtime::RuntimeError>)>,
    activities: &mut Vec<kp_runtime::Activity>,
    family: IpFamily,
    sync_loop: SyncLoop<P>,
    events: mpsc::Receiver<Vec<kp_model::SourceEvent>>,
    mode: RunMode,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    observer: Arc<dyn kp_runtime::SyncObserver>,
) {
    let activity = kp_runtime::Activity::default();
    activities.push(activity.clone());
    let sync_loop = sync_loop.with_observer(observer).with_activity(activity);
    loops.spawn(async move {
        (
            family,
            sync_loop.run(events, mode, shutdown).await.map(|_| ()),
        )
    });
}

/// Upstream's IPVS deprecation message (logged at start, and the `IPVSDeprecation` event).
const IPVS_DEPRECATION: &str = "The ipvs proxier is now deprecated and may be removed in a future release. Please use 'nftables' instead.";

/// How long a one-shot run (`--dry-run`, `--once`) from the API server waits for the server
/// to answer (every kind's first request, or again after a failure) before it gives up.
/// Generous for a reachable server, whose first answer comes in milliseconds (however long
/// the lists then take), and short enough for a pre-flight check (docs/deploy.md).
pub const ONE_SHOT_API_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Resolves with an error once `health` has not been [`SourceHealth::Connected`] for `limit`
/// (from the start, or since the last time it was): the error names `server`, where its
/// address came from, and the last failure. Never resolves while the server answers.
///
/// [`SourceHealth::Connected`]: kp_source::api::SourceHealth::Connected
async fn unreachable_for(
    mut health: tokio::sync::watch::Receiver<kp_source::api::SourceHealth>,
    limit: std::time::Duration,
    server: String,
    origin: kp_source::api::ServerOrigin,
) -> anyhow::Error {
    use kp_source::api::SourceHealth;
    loop {
        // Not connected: wait at most `limit` for that to change.
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if health.borrow_and_update().is_connected() {
                break;
            }
            match tokio::time::timeout_at(deadline, health.changed()).await {
                Ok(Ok(())) => {}
                // The source is gone: its own result ends the run.
                Ok(Err(_)) => std::future::pending::<()>().await,
                Err(_) => {
                    let why = match &*health.borrow() {
                        SourceHealth::Disconnected { error, .. } => error.clone(),
                        _ => "no answer yet".to_string(),
                    };
                    return anyhow!(
                        "cannot reach the API server {server} ({origin}) within {} s: {why}",
                        limit.as_secs()
                    );
                }
            }
        }
        // Connected: wait until it is not.
        while health.borrow_and_update().is_connected() {
            if health.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// The `kubernetes` Service's ClusterIP when the in-cluster configuration's
/// `KUBERNETES_SERVICE_HOST` is it: the kubelet gives every container `KUBERNETES_PORT`
/// (`tcp://IP:PORT` of that Service) too, and an operator who points
/// `KUBERNETES_SERVICE_HOST` at the control plane makes the two differ.
fn in_cluster_service_ip() -> Option<String> {
    let host = std::env::var("KUBERNETES_SERVICE_HOST").ok()?;
    let service = std::env::var("KUBERNETES_PORT").ok()?;
    let service_host = service
        .strip_prefix("tcp://")?
        .rsplit_once(':')?
        .0
        .trim_matches(['[', ']']);
    (service_host == host.trim_matches(['[', ']'])).then_some(host)
}

/// Runs the proxy as the flags say.
///
/// # Errors
/// Invalid flags, a missing source, a failed `--once`/`--cleanup`, or a source failure.
pub fn run(mut args: ProxyArgs) -> anyhow::Result<()> {
    let detector = local_detector(&args)?;
    let no_cluster_cidr = matches!(detector, LocalDetector::None);
    let ipt_cfg = iptables_config(&args, detector.clone())?;
    let nft_cfg = nftables_config(&args, detector.clone())?;
    // IPVS settings are checked only in IPVS mode, as upstream (a leftover typo must not stop
    // iptables mode); cleanup needs only the exclude list.
    let ipvs_cfg = if args.proxy_mode == ProxyModeArg::Ipvs {
        crate::ipvs_mode::ipvs_config(&args, detector)?
    } else {
        crate::ipvs_mode::ipvs_config(&args, detector).unwrap_or_default()
    };
    // `auto` stays unresolved for --cleanup and nftables mode, which clean both backends.
    let requested = backend(args.iptables_backend);
    if !args.dry_run && !has_net_admin() {
        bail!(
            "changing netfilter rules needs root (CAP_NET_ADMIN); run as root, or use --dry-run to preview the rules"
        );
    }
    if args.cleanup {
        if args.dry_run {
            bail!(
                "--cleanup removes rules; it has no --dry-run (iptables-save, nft list ruleset, ipset list and ipvsadm -Ln show what it would remove)"
            );
        }
        return cleanup(requested, &ipvs_cfg.exclude_cidrs);
    }
    if no_cluster_cidr {
        // Upstream warns the same way: without a way to tell pods from other sources,
        // neither the off-cluster masquerade rule nor the pod short-circuit is written.
        warn!(
            "no --cluster-cidr: traffic to ClusterIPs from outside the cluster is not masqueraded, and pod traffic to Local-policy NodePorts is not short-circuited"
        );
    }
    // IPVS mode needs kernel features and a tool; without them fall back to iptables mode
    // with a warning naming what is missing, as kube-proxy did (seed 003), rather than
    // failing at every restart.
    let mut ipvs_fallback: Vec<String> = Vec::new();
    if args.proxy_mode == ProxyModeArg::Ipvs && !args.dry_run && !args.init_only {
        ipvs_fallback = crate::ipvs_mode::missing_for_ipvs(&ipvs_cfg.scheduler);
        if !ipvs_fallback.is_empty() {
            error!(
                missing = %ipvs_fallback.join("; "),
                "IPVS mode cannot run on this node: falling back to iptables mode"
            );
            args.proxy_mode = ProxyModeArg::Iptables;
        }
    }
    if args.proxy_mode == ProxyModeArg::Ipvs
        && args.dry_run
        && kp_netlink::ipvs::Ipvs::new().is_err()
    {
        warn!(
            "dry run: this kernel has no IPVS, so the daemon would fall back to iptables mode here; printing what IPVS mode writes on a node that has it"
        );
    }
    let nft_mode = args.proxy_mode == ProxyModeArg::Nftables;
    // The backend the iptables-based modes program (and read, check and clean up), chosen
    // once; nftables mode only cleans iptables leftovers, from both backends with `auto`.
    let backend = if nft_mode {
        requested
    } else {
        choose_backend(args.iptables_backend, args.dry_run)
    };
    let ipvs_mode = args.proxy_mode == ProxyModeArg::Ipvs;
    let userspace_mode = args.proxy_mode == ProxyModeArg::Userspace;
    let userspace_cfg = if userspace_mode {
        Some(kp_proxier::userspace::UserspaceConfig {
            nodeport_addresses: NodePortAddresses::parse(&args.nodeport_addresses)?,
            local_detector: ipt_cfg.local_detector.clone(),
        })
    } else {
        None
    };
    if userspace_mode {
        // Both families' settings are checked before anything is changed.
        crate::userspace_mode::relay_config(&args, IpFamily::V4)?;
        if args.once && !args.dry_run {
            warn!(
                "--once in userspace mode: the proxy sockets close when this process exits, so the portals it writes lead nowhere until a userspace-mode daemon runs again"
            );
        }
        if !args.dry_run {
            match kp_relay::raise_fd_limit() {
                Ok(n) => info!(open_files = n, "userspace mode: raised the open-file limit"),
                Err(e) => warn!(error = %e, "userspace mode: cannot raise the open-file limit"),
            }
        }
    }
    let conntrack = crate::nodesetup::ConntrackSettings::from_args(&args);
    if args.init_only && !args.dry_run {
        // Upstream's --init-only: the set-up that needs full privileges, then exit.
        crate::nodesetup::apply_conntrack(&conntrack);
        info!("--init-only: node settings applied, exiting");
        return Ok(());
    }
    if let Some(path) = &args.manifests
        && let Err(e) = std::fs::metadata(path)
    {
        // The system's own words: "No such file or directory", "Too many levels of symbolic
        // links" (a link loop), "Permission denied", ...
        bail!("--manifests {}: {e}", path.display());
    }
    if args.manifests.is_some() && (args.kubeconfig.is_some() || args.master.is_some()) {
        bail!("--manifests and --kubeconfig/--master both name a source of Services; pass one");
    }
    let node = node_name(args.hostname_override.as_deref())?;
    let runner = if ipvs_mode {
        // Upstream's IPVS proxier re-reads and repairs the whole table every sync period.
        RunnerConfig {
            min_interval: args.compat.ipvs_min_sync_period,
            retry_interval: args.compat.ipvs_sync_period,
            full_interval: args.compat.ipvs_sync_period,
            check_interval: args.compat.ipvs_sync_period,
        }
    } else {
        // Upstream checks its KUBE-PROXY-CANARY chains every --iptables-sync-period.
        RunnerConfig {
            min_interval: args.iptables_min_sync_period,
            retry_interval: args.iptables_sync_period,
            check_interval: args.iptables_sync_period,
            ..RunnerConfig::default()
        }
    };
    match &args.manifests {
        Some(path) => {
            info!(node = %node, mode = args.proxy_mode.name(), manifests = %path.display(), "starting kube-proxy-rs")
        }
        None => {
            info!(node = %node, mode = args.proxy_mode.name(), source = "API server", "starting kube-proxy-rs")
        }
    }
    if !args.dry_run && !args.once {
        // Upstream applies these when its daemon starts.
        crate::nodesetup::apply_oom_score_adj(args.oom_score_adj);
        crate::nodesetup::apply_conntrack(&conntrack);
    }
    if !args.dry_run {
        // Only what this mode's first sync cannot coexist with goes now; the rest of the
        // other modes' leftovers once it has written its rules (crate::takeover).
        remove_before_first_sync(args.proxy_mode, backend, &ipvs_cfg.exclude_cidrs);
    }
    let remove_leftovers = {
        let (mode, exclude, fallback) = (
            args.proxy_mode,
            ipvs_cfg.exclude_cidrs.clone(),
            !ipvs_fallback.is_empty(),
        );
        move || {
            if mode != ProxyModeArg::Nftables {
                remove_other_backend(backend);
            }
            remove_other_mode(mode, backend, &exclude, fallback);
        }
    };

    // /configz: the effective configuration, after a fallback from IPVS mode.
    let configz = crate::configz::document(&args);
    let families = families(args.proxy_mode, backend, args.dry_run);
    info!(families = ?families, "programming these IP families");

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let result = rt.block_on(async move {
        let admin_mode = if nft_mode {
            kp_admin::ProxyMode::Nftables
        } else if ipvs_mode {
            kp_admin::ProxyMode::Ipvs
        } else if userspace_mode {
            kp_admin::ProxyMode::Userspace
        } else {
            kp_admin::ProxyMode::Iptables
        };
        let sync_period = if ipvs_mode { args.compat.ipvs_sync_period } else { args.iptables_sync_period };
        let mut admin = crate::admin::Admin::new(
            admin_mode,
            sync_period,
            args.manifests.is_none(),
            &families,
        );
        admin.node = node.clone();
        admin.metrics.set_build_info(&crate::admin::build_info());
        admin.metrics.set_configz(crate::configz::GROUP, configz);
        if !ipvs_fallback.is_empty() {
            admin.metrics.mode_fallback("ipvs", "iptables");
        }
        if admin_mode == kp_admin::ProxyMode::Iptables
            && !args.dry_run
            && !args.once
            && let Some(reader) = crate::nfacct::metrics_reader()
        {
            admin.metrics.set_nfacct(Arc::new(reader));
        }
        let (tx, mut rx) = mpsc::channel::<Vec<kp_model::SourceEvent>>(64);
        let skipped = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = skipped.clone();
        let mut source: tokio::task::JoinHandle<anyhow::Result<()>> = match args.manifests.clone() {
            Some(path) => {
                let state_dir = (!args.dry_run && !args.once && !args.state_dir.trim().is_empty())
                    .then(|| Arc::new(kp_source::state_dir::StateDir::new(args.state_dir.trim())));
                let opts = kp_source::watch::WatchOptions {
                    grace: args.manifest_grace_period,
                    state_dir,
                };
                tokio::spawn(async move {
                kp_source::watch::watch_manifests_with(path, opts, tx, move |e| {
                    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    error!("{e}")
                })
                .await
                .map_err(|e| anyhow!(e).context("manifest source"))
                })
            }
            None => {
                let (config, origin) =
                    kp_source::api::config(args.kubeconfig.clone(), args.master.clone())
                        .await
                        .map_err(|e| anyhow!(e).context("connecting to the API server"))?;
                let server = kp_source::api::server_url(&config);
                info!("API server {server} ({origin})");
                if origin == kp_source::api::ServerOrigin::InCluster
                    && let Some(ip) = in_cluster_service_ip()
                {
                    warn!(
                        server = %server,
                        "the API server address {ip} is the `kubernetes` Service's ClusterIP (KUBERNETES_SERVICE_HOST): it answers only through Service rules, so on a new or rebooted node this proxy cannot reach it to write them; give a kubeconfig naming the control-plane endpoint (clientConnection.kubeconfig, as kubeadm's kube-proxy ConfigMap does), or set KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT to it (docs/deploy.md)"
                    );
                }
                let host = crate::restclient::host_label(&config.cluster_url);
                let client = kube::Client::try_from(config).map_err(|e| {
                    anyhow!(e).context(format!("building the API client for {server} ({origin})"))
                })?;
                // Every request is counted and timed as client-go's (rest_client_*).
                let client = crate::restclient::instrumented(client, host, admin.metrics.clone());
                if !args.dry_run && !args.once {
                    admin.events = Some(crate::events::Events::new(client.clone(), &node));
                }
                let api = kp_source::api::ApiSource::new(client, node.clone())
                    .with_server(server.clone());
                let mut health = api.health();
                let metrics = admin.metrics.clone();
                let log_server = server.clone();
                tokio::spawn(async move {
                    // The dataplane stays as it is while the API server is unreachable;
                    // say so once per change of state, and in the connectivity metrics.
                    while health.changed().await.is_ok() {
                        let state = health.borrow_and_update().clone();
                        metrics.api_server_connected(state.is_connected());
                        match state {
                            kp_source::api::SourceHealth::Disconnected { error, .. } => {
                                warn!(server = %log_server, %error, "API server unreachable: keeping the programmed rules, retrying with backoff")
                            }
                            kp_source::api::SourceHealth::Connected => info!(server = %log_server, "connected to the API server"),
                            kp_source::api::SourceHealth::Connecting => {}
                        }
                    }
                });
                // A one-shot run (--dry-run, --once) is a check an operator waits for: it
                // gives up when the server stays unreachable, naming it.
                let give_up = (args.dry_run || args.once).then(|| {
                    unreachable_for(api.health(), ONE_SHOT_API_LIMIT, server.clone(), origin.clone())
                });
                tokio::spawn(async move {
                    let run = api.run(tx, move |e| {
                        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        error!("{e}")
                    });
                    match give_up {
                        Some(give_up) => tokio::select! {
                            r = run => r.map_err(|e| anyhow!(e).context("API source")),
                            e = give_up => Err(e),
                        },
                        None => run.await.map_err(|e| anyhow!(e).context("API source")),
                    }
                })
            }
        };
        // One sync loop per family (upstream's dual-stack "meta proxier"); every batch of
        // events is split between them (kp_track::split_by_family).
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut loops = tokio::task::JoinSet::new();
        let mut activities: Vec<kp_runtime::Activity> = Vec::new();
        let mut servers = tokio::task::JoinSet::new();
        if !args.dry_run && !args.once {
            let hc_addresses = if args.nodeport_addresses.iter().all(|a| a.trim().is_empty() || a.trim() == "all") {
                kp_admin::HealthCheckAddresses::All
            } else {
                let local = RealHost.local_addresses().unwrap_or_default();
                let npa = NodePortAddresses::parse(&args.nodeport_addresses)?;
                let mut ips = npa.node_ips(IpFamily::V4, &local, &[]);
                ips.extend(npa.node_ips(IpFamily::V6, &local, &[]));
                kp_admin::HealthCheckAddresses::Ips(ips)
            };
            admin.start(
                &args,
                &node,
                hc_addresses,
                &mut servers,
                stop_rx.clone(),
            )?;
        }
        let mut senders = Vec::new();
        let mut outputs: Vec<(IpFamily, Arc<std::sync::Mutex<String>>)> = Vec::new();
        let mut ipvs_outputs: Vec<(IpFamily, Sink, Sink)> = Vec::new();
        let mut userspace_outputs: Vec<(IpFamily, Sink)> = Vec::new();
        let mut relays = crate::userspace_mode::Relays::default();
        // IPVS mode's dry run: the Node object's addresses stand for the node's.
        let dry_run_node = crate::ipvs_mode::DryRunNode::default();
        let mode = if args.once || args.dry_run {
            RunMode::Once
        } else {
            RunMode::Daemon
        };
        // The other modes' leftovers go once this mode has written every family's rules
        // (crate::takeover).
        let takeover = crate::takeover::Takeover::new(&families);
        for (i, family) in families.into_iter().enumerate() {
            let observer: Arc<dyn kp_runtime::SyncObserver> =
                takeover.observer(Arc::new(crate::admin::Observer::new(admin.clone(), i == 0)));
            let (ftx, frx) = mpsc::channel(64);
            senders.push((family, ftx));
            let tracker = Tracker::new(family, node.clone()).with_primary_ip(args.bind_address);
            // One warning about a missing own Node, not one per family.
            let tracker = if i == 0 { tracker } else { tracker.without_missing_node_warning() };
            let version = match family {
                IpFamily::V4 => IpVersion::V4,
                IpFamily::V6 => IpVersion::V6,
            };
            let mut stop = stop_rx.clone();
            let shutdown = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            let sink = Arc::new(std::sync::Mutex::new(String::new()));
            if args.dry_run {
                outputs.push((family, sink.clone()));
            }
            let host: Arc<dyn Host> = if args.dry_run {
                Arc::new(ReadOnlyHost)
            } else {
                Arc::new(RealHost)
            };
            let conntrack = || match kp_netlink::Conntrack::new() {
                Ok(ct) => Some(Box::new(ct)),
                Err(e) => {
                    warn!(%family, error = %e, "no netlink conntrack access: stale UDP conntrack entries will not be cleaned up");
                    None
                }
            };
            if let Some(ucfg) = &userspace_cfg {
                let relay: Box<dyn kp_proxier::userspace::PortalRelay> = if args.dry_run {
                    let table = Arc::new(std::sync::Mutex::new(String::new()));
                    userspace_outputs.push((family, table.clone()));
                    Box::new(crate::userspace_mode::DryRelay::new(family, table))
                } else {
                    let relay = kp_relay::Relay::new(
                        crate::userspace_mode::relay_config(&args, family)?,
                        tokio::runtime::Handle::current(),
                    );
                    relays.relays.push((family, relay.clone()));
                    Box::new(crate::userspace_mode::LiveRelay { relay })
                };
                let ipt: Box<dyn Iptables> = if args.dry_run {
                    Box::new(PrintingIptables::on_this_node(version, backend, sink))
                } else {
                    Box::new(ExecIptables::new(version, backend))
                };
                let proxier = kp_proxier::userspace::UserspaceProxier::new(family, ucfg.clone(), ipt, relay, host);
                let sync_loop = SyncLoop::new(tracker, takeover.guard(proxier), runner);
                spawn_loop(&mut loops, &mut activities, family, sync_loop, frx, mode, shutdown, observer.clone());
                continue;
            }
            if ipvs_mode {
                let ipt = |sink: Arc<std::sync::Mutex<String>>| -> Box<dyn Iptables> {
                    if args.dry_run {
                        Box::new(PrintingIptables::on_this_node(version, backend, sink))
                    } else {
                        Box::new(ExecIptables::new(version, backend))
                    }
                };
                let proxier = if args.dry_run {
                    let ipset_sink = Arc::new(std::sync::Mutex::new(String::new()));
                    let ipvs_sink = Arc::new(std::sync::Mutex::new(String::new()));
                    ipvs_outputs.push((family, ipset_sink.clone(), ipvs_sink.clone()));
                    IpvsProxier::new(
                        family,
                        ipvs_cfg.clone(),
                        ipt(sink),
                        Box::new(crate::ipvs_mode::PrintingIpset { fake: kp_netfilter::ipset::FakeIpset::new(), sink: ipset_sink }),
                        Box::new(crate::ipvs_mode::PrintingIpvs { fake: kp_netlink::ipvs::FakeIpvs::new(), sink: ipvs_sink }),
                        Box::new(dry_run_node.links()),
                        host,
                    )?
                } else {
                    let ipvs = kp_netlink::ipvs::Ipvs::new().context("opening the kernel's IPVS over netlink")?;
                    let links = kp_netlink::link::Links::new().context("opening rtnetlink")?;
                    let mut p = IpvsProxier::new(
                        family,
                        ipvs_cfg.clone(),
                        ipt(sink),
                        Box::new(kp_netfilter::ipset::ExecIpset::new()),
                        Box::new(ipvs),
                        Box::new(links),
                        host,
                    )?;
                    if let Some(ct) = conntrack() {
                        p = p.with_conntrack(ct);
                    }
                    p
                };
                let sync_loop = SyncLoop::new(tracker, takeover.guard(proxier), runner);
                spawn_loop(&mut loops, &mut activities, family, sync_loop, frx, mode, shutdown, observer.clone());
                continue;
            }
            match (nft_mode, args.dry_run) {
                (false, true) => {
                    let ipt = PrintingIptables::on_this_node(version, backend, sink);
                    let mut proxier = IptablesProxier::new(family, ipt_cfg.clone(), ipt, host)?
                        .with_zero_counters_on_full_sync(args.iptables_zero_counters_on_full_sync)
                        .with_dispatch(iptables_dispatch(args.iptables_dispatch));
                    if let Some(n) = crate::nfacct::proxier_handle(true, family) {
                        proxier = proxier.with_nfacct(n);
                    }
                    let sync_loop = SyncLoop::new(tracker, takeover.guard(proxier), runner);
                    spawn_loop(&mut loops, &mut activities, family, sync_loop, frx, mode, shutdown, observer.clone());
                }
                (false, false) => {
                    let ipt = ExecIptables::new(version, backend);
                    let mut proxier = IptablesProxier::new(family, ipt_cfg.clone(), ipt, host)?
                        .with_zero_counters_on_full_sync(args.iptables_zero_counters_on_full_sync)
                        .with_dispatch(iptables_dispatch(args.iptables_dispatch));
                    if let Some(ct) = conntrack() {
                        proxier = proxier.with_conntrack(ct);
                    }
                    if let Some(n) = crate::nfacct::proxier_handle(false, family) {
                        proxier = proxier.with_nfacct(n);
                    }
                    let sync_loop = SyncLoop::new(tracker, takeover.guard(proxier), runner);
                    spawn_loop(&mut loops, &mut activities, family, sync_loop, frx, mode, shutdown, observer.clone());
                }
                (true, true) => {
                    let proxier = NftablesProxier::new(family, nft_cfg.clone(), PrintingNft { sink }, host)?;
                    let sync_loop = SyncLoop::new(tracker, takeover.guard(proxier), runner);
                    spawn_loop(&mut loops, &mut activities, family, sync_loop, frx, mode, shutdown, observer.clone());
                }
                (true, false) => {
                    let mut proxier = NftablesProxier::new(family, nft_cfg.clone(), ExecNft::new(), host)?;
                    if let Some(ct) = conntrack() {
                        proxier = proxier.with_conntrack(ct);
                    }
                    let sync_loop = SyncLoop::new(tracker, takeover.guard(proxier), runner);
                    spawn_loop(&mut loops, &mut activities, family, sync_loop, frx, mode, shutdown, observer.clone());
                }
            }
        }
        if !relays.relays.is_empty() {
            admin.metrics.set_userspace(Arc::new(relays.clone()));
        }
        if ipvs_mode && !args.dry_run {
            // Upstream (1.35, KEP-5495) says so at every start, in the log (as an error) and
            // as an event. Here it is information: kube-proxy-rs keeps IPVS mode, and a
            // node that asked for it is not in error.
            info!("{IPVS_DEPRECATION}");
        }
        if let Some(events) = &admin.events {
            if ipvs_mode {
                events.post(true, "IPVSDeprecation", "StartKubeProxy", Some(IPVS_DEPRECATION.into()), events.node_ref());
            }
            // Upstream's "birth cry", once the sources and sync loops run.
            events.post(false, "Starting", "StartKubeProxy", None, events.node_ref());
        }
        let observe_node = (args.dry_run && ipvs_mode).then(|| (dry_run_node.clone(), node.clone()));
        let fan_out = tokio::spawn(async move {
            let families: Vec<IpFamily> = senders.iter().map(|(f, _)| *f).collect();
            while let Some(batch) = rx.recv().await {
                // Before the trackers see it, so that the sync it leads to reads it.
                if let Some((dry_run_node, node)) = &observe_node {
                    dry_run_node.observe(node, &batch);
                }
                // Each family's tracker gets whole only the objects it keeps (a Service with
                // a ClusterIP of its family, a slice of its addressType), the others as a
                // delete of their name: no tracker holds a copy of the whole batch.
                for ((_, s), share) in senders.iter().zip(kp_track::split_by_family(batch, &families)) {
                    let _ = s.send(share).await;
                }
            }
        });
        let mut signals = Signals::new();
        // As upstream, the daemon exits when its --config file changes, to be restarted with it.
        let config_changed = crate::config_watch::changed(
            args.config_loaded.take().filter(|_| mode == RunMode::Daemon),
        );
        tokio::pin!(config_changed);
        let mut config_done = false;
        let mut result: anyhow::Result<()> = Ok(());
        let mut source_done = false;
        // Once a stop is asked for, the loops finish the syncs in flight within this
        // (crate::shutdown); a second signal ends the wait at once.
        let mut give_up_at: Option<tokio::time::Instant> = None;
        let stop = |why: &str, give_up_at: &mut Option<tokio::time::Instant>| {
            let _ = stop_tx.send(true);
            if give_up_at.is_none() {
                crate::shutdown::log_stopping(why, &activities);
                *give_up_at = Some(tokio::time::Instant::now() + crate::shutdown::SHUTDOWN_WAIT);
            }
        };
        let give_up = |give_up_at: Option<tokio::time::Instant>| async move {
            match give_up_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        // The other modes' leftovers, removed once every family's first sync has succeeded
        // (crate::takeover); never by a dry run, nor once the daemon stops.
        let mut take_over: Option<Box<dyn FnOnce() + Send>> =
            (!args.dry_run).then(|| Box::new(remove_leftovers) as Box<dyn FnOnce() + Send>);
        let mut taking_over: Option<tokio::task::JoinHandle<()>> = None;
        let start_takeover = |job: Box<dyn FnOnce() + Send>| {
            let takeover = takeover.clone();
            tokio::task::spawn_blocking(move || takeover.exclusively(job))
        };
        let mut gave_up = false;
        loop {
            tokio::select! {
                () = takeover.wait_all_synced(), if take_over.is_some() && give_up_at.is_none() => {
                    taking_over = take_over.take().map(start_takeover);
                }
                name = signals.recv() => {
                    if give_up_at.is_some() {
                        crate::shutdown::give_up(&format!("{name} again"), &activities);
                        gave_up = true;
                        break;
                    }
                    stop(name, &mut give_up_at);
                }
                () = give_up(give_up_at) => {
                    crate::shutdown::give_up(
                        &format!("still running after {} s", crate::shutdown::SHUTDOWN_WAIT.as_secs()),
                        &activities,
                    );
                    gave_up = true;
                    break;
                }
                e = &mut config_changed, if !config_done => {
                    config_done = true;
                    result = Err(e);
                    stop("the --config file changed", &mut give_up_at);
                }
                s = &mut source, if !source_done => {
                    source_done = true;
                    if let Ok(Err(e)) = s {
                        result = Err(e);
                        stop("the source of Services failed", &mut give_up_at);
                    }
                }
                Some(Ok(Err(e))) = servers.join_next() => {
                    // Only a hard-fail bind error ends a server task with an error; upstream
                    // posts an event about it before exiting.
                    if let Some(events) = &admin.events {
                        let reason = if format!("{e}").starts_with("healthz") {
                            "FailedToStartProxierHealthcheck"
                        } else {
                            "FailedToStartMetricServer"
                        };
                        events
                            .post_and_wait(true, reason, "StartKubeProxy", Some(format!("{e:#}")), events.node_ref(), std::time::Duration::from_secs(5))
                            .await;
                    }
                    result = Err(e);
                    stop("a server failed to start", &mut give_up_at);
                }
                joined = loops.join_next() => match joined {
                    None => break,
                    Some(Ok((family, Err(e)))) => {
                        // A source that failed closes the loops' events: its own error says
                        // why, not the loop's "ended early" (the two arrive in either order).
                        if !source_done && matches!(e, kp_runtime::RuntimeError::SourceEndedEarly) {
                            source_done = true;
                            if let Ok(Err(source_error)) = (&mut source).await {
                                result = Err(source_error);
                            }
                        }
                        if result.is_ok() {
                            result = Err(anyhow!(e).context(format!("{family} proxier")));
                        }
                        stop("a sync loop ended with an error", &mut give_up_at);
                    }
                    Some(Ok((_, Ok(())))) => {}
                    Some(Err(e)) => {
                        result = Err(anyhow!("a sync loop failed: {e}"));
                        stop("a sync loop failed", &mut give_up_at);
                    }
                },
            }
        }
        // --once: the loops ended after their first sync, maybe before the branch above ran.
        if takeover.all_synced() && give_up_at.is_none() && result.is_ok()
            && let Some(job) = take_over.take()
        {
            taking_over = Some(start_takeover(job));
        }
        // The removal runs to its end, within the bound of a stop.
        if let Some(task) = taking_over
            && !gave_up
        {
            let finished = match give_up_at {
                Some(at) => tokio::time::timeout_at(at, task).await.is_ok(),
                None => {
                    let _ = task.await;
                    true
                }
            };
            if !finished {
                crate::shutdown::give_up(
                    &format!("still running after {} s", crate::shutdown::SHUTDOWN_WAIT.as_secs()),
                    &activities,
                );
            }
        }
        source.abort();
        fan_out.abort();
        if mode == RunMode::Daemon {
            // Once for every family; a dry run or --once never gets here as a daemon.
            info!("shutting down; the programmed rules stay in place");
        }
        if result.is_err() {
            // Nothing was synced: no empty "would write" sections after the error.
            ipvs_outputs.clear();
            userspace_outputs.clear();
            outputs.clear();
        }
        // Printed at once, so that a reader that stops early (`| head`) ends the run quietly
        // (crate::stdout).
        let mut printed = String::new();
        for (family, ipset_sink, ipvs_sink) in ipvs_outputs {
            let sets = ipset_sink.lock().map(|s| s.clone()).unwrap_or_default();
            let table = ipvs_sink.lock().map(|s| s.clone()).unwrap_or_default();
            printed.push_str(&format!("# {family}{}\n{sets}", crate::dry_run::IPSET_HEADER));
            printed.push_str(&format!(
                "# {family}{}\n{}{table}",
                crate::dry_run::IPVS_TABLE_HEADER,
                dry_run_node.header(family, &node)
            ));
        }
        for (family, table) in userspace_outputs {
            let text = table.lock().map(|s| s.clone()).unwrap_or_default();
            printed.push_str(&format!("# {family}{}\n{text}", crate::trace::DRY_RUN_TABLE_HEADER));
        }
        for (family, sink) in outputs {
            let text = sink.lock().map(|s| s.clone()).unwrap_or_default();
            if nft_mode {
                printed.push_str(&format!("# {family}: nft -f input\n{text}"));
            } else {
                printed.push_str(&crate::dry_run::iptables_section(family, &text));
            }
        }
        if !printed.is_empty() {
            crate::stdout::print(&printed)?;
        }
        let skipped = skipped.load(std::sync::atomic::Ordering::Relaxed);
        if result.is_ok() && args.dry_run && skipped > 0 {
            // So `--dry-run` can validate manifests in CI.
            bail!("{skipped} manifest problem(s) reported above; the objects concerned are not in the output");
        }
        result
    });
    // A sync the shutdown gave up on may still be on a blocking thread (its commands were
    // killed, so it ends soon): do not wait for it as dropping the runtime would.
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    result
}

/// The families to program: IPv4, and IPv6 when the kernel has it (`/proc/sys/net/ipv6`)
/// and the mode's tool runs (`ip6tables` of `backend`, or `nft`; always in a dry run).
fn families(mode: ProxyModeArg, backend: Backend, dry_run: bool) -> Vec<IpFamily> {
    let mut out = vec![IpFamily::V4];
    let kernel_v6 = std::path::Path::new("/proc/sys/net/ipv6").exists();
    let tool_works = || match mode {
        ProxyModeArg::Nftables => ExecNft::new().version().is_ok(),
        _ => ExecIptables::new(IpVersion::V6, backend).version().is_ok(),
    };
    if kernel_v6 && (dry_run || tool_works()) {
        out.push(IpFamily::V6);
    } else {
        warn!(
            "IPv6 is not available (no /proc/sys/net/ipv6, or no working {}): programming IPv4 only",
            if mode == ProxyModeArg::Nftables {
                "nft"
            } else {
                "ip6tables"
            }
        );
    }
    out
}

/// Where a dry run collects what it would send.
type Sink = Arc<std::sync::Mutex<String>>;

/// The runner of `--dry-run`: applies each payload to a checking fake (so an invalid payload
/// still fails) and keeps it for printing instead of touching the kernel.
impl PrintingIptables {
    /// A dry run's iptables: it checks payloads like the kernel and reports this node's
    /// iptables version (when iptables is installed), so what it prints is what the daemon
    /// would write here (e.g. `MASQUERADE --random-fully` only where iptables has it).
    fn on_this_node(version: IpVersion, backend: Backend, sink: Sink) -> PrintingIptables {
        let fake = match ExecIptables::new(version, backend).version() {
            Ok(v) => FakeIptables::new(version).with_version(v),
            Err(_) => FakeIptables::new(version),
        };
        PrintingIptables { fake, sink }
    }
}

struct PrintingIptables {
    fake: FakeIptables,
    sink: Arc<std::sync::Mutex<String>>,
}

impl Iptables for PrintingIptables {
    fn ip_version(&self) -> IpVersion {
        self.fake.ip_version()
    }
    fn restore(&self, payload: &[u8]) -> Result<(), kp_netfilter::Error> {
        self.fake.restore(payload)?;
        if let Ok(mut s) = self.sink.lock() {
            s.push_str(&String::from_utf8_lossy(payload));
        }
        Ok(())
    }
    fn save(&self, table: Option<kp_netfilter::Table>) -> Result<String, kp_netfilter::Error> {
        self.fake.save(table)
    }
    fn version(&self) -> Result<kp_netfilter::IptablesVersion, kp_netfilter::Error> {
        self.fake.version()
    }
    fn chain_exists(
        &self,
        table: kp_netfilter::Table,
        chain: &str,
    ) -> Result<bool, kp_netfilter::Error> {
        self.fake.chain_exists(table, chain)
    }
}

/// The nft runner of `--dry-run`: an empty kernel that keeps every payload for printing.
struct PrintingNft {
    sink: Arc<std::sync::Mutex<String>>,
}

impl Nft for PrintingNft {
    fn apply(&self, payload: &[u8]) -> Result<(), kp_netfilter::Error> {
        if let Ok(mut s) = self.sink.lock() {
            s.push_str(&String::from_utf8_lossy(payload));
        }
        Ok(())
    }
    fn list_table(&self, _: IpVersion, _: &str) -> Result<Option<String>, kp_netfilter::Error> {
        Ok(None)
    }
    fn list_chain(
        &self,
        _: IpVersion,
        _: &str,
        _: &str,
    ) -> Result<Option<String>, kp_netfilter::Error> {
        Ok(None)
    }
    fn list_objects(&self, _: IpVersion, _: &str) -> Result<TableObjects, kp_netfilter::Error> {
        Ok(TableObjects::default())
    }
    fn delete_table(&self, _: IpVersion, _: &str) -> Result<bool, kp_netfilter::Error> {
        Ok(false)
    }
    fn version(&self) -> Result<NftVersion, kp_netfilter::Error> {
        let (major, minor, patch) = kp_proxier::nftables::MIN_NFT_VERSION;
        Ok(NftVersion {
            major,
            minor,
            patch,
        })
    }
}
