//! Command line: upstream kube-proxy's flags (same names, same defaults) plus our own
//! (`--manifests`, `--dry-run`, `--once`, `--iptables-backend`) and subcommands. With
//! `--config`, which flags still count is upstream's rule (`crate::config`); our own
//! settings have fields in the file's `kubeProxyRs` section.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, ArgGroup, Args, Parser, Subcommand, ValueEnum};

/// kube-proxy-rs: a Kubernetes service proxy, compatible with kube-proxy.
///
/// Without a subcommand it runs the proxy: it reads Services, EndpointSlices and Nodes and
/// programs this node so traffic to Service addresses reaches ready Pods.
#[derive(Debug, Parser)]
#[command(name = "kube-proxy-rs", version, about, long_about = None, args_conflicts_with_subcommands = true)]
pub struct Cli {
    /// A subcommand; without one, the proxy runs.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Proxy flags.
    #[command(flatten)]
    pub proxy: ProxyArgs,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Build a network-namespace sandbox (client, node, backends), run the proxy in it, send
    /// requests to every Service and report which backends answered. Needs root.
    Sandbox(SandboxArgs),
    /// Explain where a packet goes through a node's rules (iptables, nftables, IPVS or
    /// userspace mode): this node's (`--live`), dumps from any kube-proxy or our own
    /// `--dry-run` output (`--rules FILE`: `iptables-save` of one or both families, partial
    /// dumps accepted, `nft list ruleset` as text or JSON, or a dry run in any mode, so a
    /// planned change can be traced before it is deployed; IPVS mode adds `--ipsets` and
    /// `--ipvs`, userspace mode `--userspace`).
    Trace(TraceArgs),
}

/// `trace --proto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TraceProto {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
    /// ICMP echo (a ping).
    Icmp,
}

/// `trace --from`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TraceFrom {
    /// A pod on this node (the packet enters through PREROUTING); needs --src.
    Pod,
    /// A process on the node itself (OUTPUT).
    Node,
    /// A client outside the node (PREROUTING).
    External,
}

/// Flags of `trace`. Exactly one of `--rules` and `--live` says which rules to trace.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("source").required(true).args(["rules", "live"])))]
pub struct TraceArgs {
    /// The rules; `-` reads standard input. One of: `iptables-save` or `ip6tables-save`
    /// output, or both concatenated (`iptables-save; ip6tables-save`: the packet's family
    /// picks its part); `nft list ruleset` text, or `nft -j list ruleset` JSON (recognized
    /// by its leading `{`); an `nft -f` script; or the output of `kube-proxy-rs --dry-run`
    /// in any mode (iptables, IPVS and userspace mode: the packet's family's
    /// iptables-restore input, applied to empty tables as a restore would, and in IPVS mode
    /// with that family's IPVS table and ipsets, in userspace mode through its proxy table;
    /// nftables mode: the script of both families).
    #[arg(long, value_name = "FILE")]
    pub rules: Option<PathBuf>,

    /// Read this node's rules (`nft -j list ruleset` or `iptables-save`, see --mode),
    /// addresses and ipsets. Needs root.
    #[arg(long)]
    pub live: bool,

    /// Source address (default: 203.0.113.1 from outside, the node's address from the node).
    #[arg(long)]
    pub src: Option<std::net::IpAddr>,

    /// Destination address: a ClusterIP, node IP, external or load-balancer IP.
    #[arg(long)]
    pub dst: std::net::IpAddr,

    /// Destination port (not for ICMP).
    #[arg(long)]
    pub dport: Option<u16>,

    /// Source port.
    #[arg(long, default_value_t = 40000)]
    pub sport: u16,

    /// Protocol.
    #[arg(long, value_enum, default_value = "tcp")]
    pub proto: TraceProto,

    /// Where the packet comes from.
    #[arg(long, value_enum, default_value = "external")]
    pub from: TraceFrom,

    /// The interface the packet arrives on (for `-i` matches, e.g. the pod bridge).
    #[arg(long, value_name = "NAME")]
    pub iface: Option<String>,

    /// The node's addresses, for `--dst-type LOCAL` (NodePorts) in a dump from another
    /// node (in IPVS mode also kube-ipvs0's, which are taken from the dumps too);
    /// comma-separated or repeated. With --live they are read from the node.
    #[arg(
        long,
        visible_alias = "local-addresses",
        value_name = "IP",
        value_delimiter = ','
    )]
    pub node_ip: Vec<std::net::IpAddr>,

    /// IPVS mode: the IPVS table as `ipvsadm -Sn` prints it, or IPVS mode's --dry-run output
    /// (its table of the packet's family). Traces the --rules dump (and --ipsets) as
    /// kube-proxy's IPVS mode; with --live (and --mode ipvs or auto) the table is read from
    /// the node.
    #[arg(long, value_name = "FILE")]
    pub ipvs: Option<PathBuf>,

    /// Userspace mode: the proxy's table of listeners, as the daemon serves it (`curl
    /// http://127.0.0.1:10249/userspace`) and prints with --dry-run. Traces the --rules dump
    /// as kube-proxy's userspace mode: the portal rules, then the proxy's choice of
    /// endpoint; with --live (and --mode userspace or auto) the table is read from
    /// http://127.0.0.1:10249/userspace.
    #[arg(long, value_name = "FILE")]
    pub userspace: Option<PathBuf>,

    /// `ipset save` output, or IPVS mode's --dry-run output (its ipsets of the packet's
    /// family), for `-m set` matches (read automatically with --live).
    #[arg(long, value_name = "FILE")]
    pub ipsets: Option<PathBuf>,

    /// Whether net.ipv4.conf.all.route_localnet is 1 on that node (default: read with
    /// --live; for a dump, assumed when it has kube-proxy's localnet guard rule).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set)]
    pub route_localnet: Option<bool>,

    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,

    /// Which rules to trace: `auto` (with --live: nftables if the node has kube-proxy's
    /// table `ip kube-proxy` / `ip6 kube-proxy`, else IPVS mode if the node has IPVS
    /// virtual servers, else userspace mode if its iptables rules have the KUBE-PORTALS
    /// chains and the proxy's table can be read, else iptables; with --rules: by the
    /// dump's format, IPVS mode with --ipvs, userspace mode with --userspace), `iptables`,
    /// `nftables`, `ipvs` or `userspace`.
    #[arg(long, value_enum, default_value = "auto")]
    pub mode: crate::trace::TraceMode,
}

/// `--proxy-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProxyModeArg {
    /// iptables rules (KUBE-SERVICES → KUBE-SVC → KUBE-SEP); the default, also taken for an
    /// empty value as upstream does.
    #[value(alias = "")]
    Iptables,
    /// nftables: table `kube-proxy` (families ip and ip6), verdict maps, one `nft -f`
    /// transaction per sync.
    Nftables,
    /// IPVS virtual servers, kube-ipvs0 and ipsets (falls back to iptables mode, with an
    /// error naming what is missing, when the kernel lacks IPVS).
    Ipvs,
    /// A proxy socket per Service port (KUBE-PORTALS-* redirect to it); the proxy picks an
    /// endpoint round robin and retries the next one when a connect fails. The backend
    /// sees the node's address, never the client's.
    Userspace,
}

impl ProxyModeArg {
    /// The flag's spelling (`iptables`, `nftables`, `ipvs`, `userspace`).
    pub fn name(self) -> &'static str {
        match self {
            ProxyModeArg::Iptables => "iptables",
            ProxyModeArg::Nftables => "nftables",
            ProxyModeArg::Ipvs => "ipvs",
            ProxyModeArg::Userspace => "userspace",
        }
    }
}

/// `--detect-local-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DetectLocalModeArg {
    /// Pod traffic comes from `--cluster-cidr`.
    #[value(name = "ClusterCIDR")]
    ClusterCidr,
    /// Pod traffic comes from this node's `spec.podCIDRs`.
    #[value(name = "NodeCIDR")]
    NodeCidr,
    /// Pod traffic arrives on `--pod-bridge-interface`.
    #[value(name = "BridgeInterface")]
    BridgeInterface,
    /// Pod traffic arrives on interfaces named `--pod-interface-name-prefix*`.
    #[value(name = "InterfaceNamePrefix")]
    InterfaceNamePrefix,
}

/// Which iptables binaries to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum IptablesBackendArg {
    /// The backend this node uses, as upstream's image finds it (iptables-wrapper): kubelet's
    /// KUBE-IPTABLES-HINT or KUBE-KUBELET-CANARY chain, else the backend with more rules, else
    /// nf_tables. kube-proxy's chains in the other backend are removed.
    Auto,
    /// `iptables-nft*` (nf_tables); kube-proxy's chains in the legacy backend are removed.
    Nft,
    /// `iptables-legacy*`; kube-proxy's chains in the nf_tables backend are removed.
    Legacy,
}

/// `--iptables-dispatch`: how nat `KUBE-SERVICES` finds a Service's chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum IptablesDispatchArg {
    /// Upstream's layout: one rule per Service address and port, walked in order.
    Upstream,
    /// A balanced tree of `KUBE-SVT-` chains keyed on the destination address (and port).
    Tree,
}

/// Flags of the proxy itself, named as upstream kube-proxy names them.
#[derive(Debug, Args)]
pub struct ProxyArgs {
    /// A KubeProxyConfiguration file (kubeproxy.config.k8s.io/v1alpha1), as upstream
    /// kube-proxy reads. As upstream, the file is then the configuration: of upstream's
    /// flags only --hostname-override, --master and the logging flags override it (others
    /// given are ignored, with a warning); kube-proxy-rs's own flags override its
    /// `kubeProxyRs` section. Unknown fields are warnings. The daemon exits (status 1) when
    /// the file's content changes, so that it is restarted with it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// The `--config` file as read at start (set by `main`, not a flag): its bytes, which
    /// the daemon watches, and the notes to log.
    #[arg(skip)]
    pub config_loaded: Option<crate::config::Loaded>,

    /// Write the effective configuration (defaults, the config file and flags) to FILE as a
    /// KubeProxyConfiguration, then exit.
    #[arg(long, value_name = "FILE")]
    pub write_config_to: Option<PathBuf>,

    /// Path to a kubeconfig file for the API server (else in-cluster configuration, else
    /// the default kubeconfig).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    /// The API server's address (overrides the kubeconfig's).
    #[arg(long, value_name = "URL")]
    pub master: Option<String>,

    /// Address and port of the /healthz and /livez server; empty disables it.
    #[arg(long, default_value = "0.0.0.0:10256", value_name = "IP:PORT")]
    pub healthz_bind_address: String,

    /// Address and port of the /metrics server; empty disables it.
    #[arg(long, default_value = "127.0.0.1:10249", value_name = "IP:PORT")]
    pub metrics_bind_address: String,

    /// Exit when the healthz or metrics port cannot be bound (else retry every 5 s).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", action = ArgAction::Set)]
    pub bind_address_hard_fail: bool,

    /// Which proxy mode to use.
    #[arg(long, value_enum, default_value = "iptables")]
    pub proxy_mode: ProxyModeArg,

    /// Read Services, EndpointSlices and Nodes from this YAML file or directory (as
    /// `kubectl get -o yaml` prints them) instead of the API server; re-read on change.
    /// Without it, the proxy watches the API server (--kubeconfig, --master or in-cluster).
    /// Config file: `kubeProxyRs.manifests`.
    #[arg(long, value_name = "PATH")]
    pub manifests: Option<PathBuf>,

    /// With --manifests: how long a file that is still there but became empty, or lost
    /// every object it defined, keeps its objects (a file rewritten in place is empty for a
    /// moment); a warning says so. 0 removes them at once. Deleting a file always does.
    /// Config file: `kubeProxyRs.manifestGracePeriod`.
    #[arg(long, allow_hyphen_values = true, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub manifest_grace_period: Duration,

    /// With --manifests: where each manifest file's last good version is kept, so a restart
    /// with a broken file still serves what it last defined (the error names the copy and
    /// its Services); empty: nowhere. The daemon only: --dry-run and --once neither read nor
    /// write it.
    /// Config file: `kubeProxyRs.stateDir`.
    #[arg(long, default_value = kp_source::state_dir::DEFAULT_STATE_DIR, value_name = "DIR")]
    pub state_dir: String,

    /// The pod CIDR(s) of the cluster, comma-separated (one per family): traffic from
    /// outside them to a ClusterIP is masqueraded.
    #[arg(long, value_name = "CIDR[,CIDR]", value_delimiter = ',')]
    pub cluster_cidr: Vec<String>,

    /// How pod traffic is recognised; default ClusterCIDR when --cluster-cidr is set.
    #[arg(long, value_enum)]
    pub detect_local_mode: Option<DetectLocalModeArg>,

    /// The bridge pods are attached to (with --detect-local-mode BridgeInterface).
    #[arg(long, value_name = "NAME")]
    pub pod_bridge_interface: Option<String>,

    /// The prefix of pod interfaces (with --detect-local-mode InterfaceNamePrefix).
    #[arg(long, value_name = "PREFIX")]
    pub pod_interface_name_prefix: Option<String>,

    /// This node's name, instead of the host name; decides which endpoints are local.
    #[arg(long, value_name = "NAME")]
    pub hostname_override: Option<String>,

    /// Masquerade all traffic sent to Service cluster IPs.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", action = ArgAction::Set)]
    pub masquerade_all: bool,

    /// The bit of the packet mark (fwmark) that marks packets to masquerade, 0..=31 (used by
    /// the iptables, nftables and IPVS modes; upstream's nftables mode reads it from
    /// `nftables.masqueradeBit`).
    #[arg(long, default_value_t = 14, value_parser = clap::value_parser!(u8).range(0..=31))]
    pub iptables_masquerade_bit: u8,

    /// Addresses that accept NodePort connections: CIDRs, `primary`, or `all`. Default: `all`
    /// in iptables mode, `primary` (the node's InternalIP) in nftables mode, as upstream; a
    /// family the Node object gives no address of accepts them on every local address.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub nodeport_addresses: Vec<String>,

    /// Accept NodePort connections on 127.0.0.1 (sets route_localnet; IPv4, iptables mode:
    /// nftables mode never serves NodePorts on loopback, as upstream, and userspace mode
    /// always does, its proxy sockets being local).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", action = ArgAction::Set)]
    pub iptables_localhost_nodeports: bool,

    /// Minimum time between two syncs (Go duration: 1s, 500ms, 1m30s).
    #[arg(long, allow_hyphen_values = true, default_value = "1s", value_parser = parse_duration)]
    pub iptables_min_sync_period: Duration,

    /// The period that the rules are refreshed: how often they are checked for removal by
    /// something else (the KUBE-PROXY-CANARY chains; nftables: the kube-proxy table) and
    /// rewritten at once when they were, and the retry interval after a failed sync (Go
    /// duration).
    #[arg(long, allow_hyphen_values = true, default_value = "30s", value_parser = parse_duration)]
    pub iptables_sync_period: Duration,

    /// Do not drop packets in conntrack state INVALID; at daemon start also set the
    /// nf_conntrack_tcp_be_liberal sysctl to 1 (as upstream).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", action = ArgAction::Set)]
    pub conntrack_tcp_be_liberal: bool,

    /// Which iptables binaries to run (iptables, IPVS and userspace modes). `auto` detects
    /// the node's backend at start and logs the choice and why; --cleanup and nftables mode
    /// clean both backends with `auto`.
    /// Config file: `kubeProxyRs.iptablesBackend`.
    #[arg(long, value_enum, default_value = "auto")]
    pub iptables_backend: IptablesBackendArg,

    /// iptables mode: start every full sync's restore with `-Z` in each table, and send its
    /// nat table as one transaction. The rules are unchanged, but the packet and byte counters
    /// of every rule in the filter and nat tables, ours and other software's, are reset at
    /// each full sync (start-up, hourly, after a failure). No longer needed for speed: without
    /// it, large full syncs on the nf_tables backend are split into several transactions,
    /// which is as fast or faster and keeps counters. See docs/benchmarks.md. Off by default.
    /// Config file: `kubeProxyRs.iptablesZeroCountersOnFullSync`.
    #[arg(long)]
    pub iptables_zero_counters_on_full_sync: bool,

    /// iptables mode: how nat KUBE-SERVICES dispatches to the per-Service chains. `upstream`
    /// (the default) writes upstream's rules byte for byte: one rule per Service address and
    /// port, which every new connection walks in order. `tree` spreads those rules over a
    /// balanced tree of `KUBE-SVT-` chains keyed on the destination address (and port where
    /// addresses repeat): a new connection crosses O(log n) rules, and a one-Service change
    /// rewrites only the chains on its path. The per-Service chains are the same in both.
    /// Config file: `kubeProxyRs.iptablesDispatch`. See docs/iptables.md.
    #[arg(long, value_enum, default_value = "upstream")]
    pub iptables_dispatch: IptablesDispatchArg,

    /// Remove everything the proxy created in every mode (iptables chains of both backends,
    /// the nftables tables `ip kube-proxy` / `ip6 kube-proxy`, IPVS virtual servers, ipsets
    /// and kube-ipvs0), then exit. Not with --dry-run.
    #[arg(long)]
    pub cleanup: bool,

    /// Print what a fresh node would receive (the `iptables-restore --noflush` or `nft -f`
    /// input, with `#` lines on what loading it needs; in IPVS mode also the ipset payload and
    /// the IPVS table, NodePorts on the Node object's addresses; in userspace mode also the
    /// proxy table, with ports from 36000 up in place of the real ones), change nothing,
    /// exit. From the API
    /// server it is a pre-flight check of the kubeconfig and the server: it exits 1, naming
    /// the server, when the server has not answered for 10 s.
    #[arg(long)]
    pub dry_run: bool,

    /// Sync once and exit: 0 when the sync succeeded (from the API server, 1 when the server
    /// has not answered for 10 s, as --dry-run).
    #[arg(long)]
    pub once: bool,

    /// Log verbosity like klog's -v: 0-1 info, 2-3 debug, 4+ trace; from 6 on also the
    /// API client's requests (RUST_LOG overrides).
    #[arg(short = 'v', long = "v", default_value_t = 0, value_name = "N")]
    pub verbosity: u8,

    /// Overrides the node's primary IP of its family, where `--nodeport-addresses primary`
    /// serves NodePorts (upstream's historical name: no socket is bound to it). `0.0.0.0` /
    /// `::` means "the Node object's first InternalIP".
    #[arg(long, default_value = "0.0.0.0", value_name = "IP")]
    pub bind_address: std::net::IpAddr,

    /// Feature gates, `Name=bool` comma-separated (upstream's syntax). Known gates that
    /// concern kube-proxy are logged; unknown gates get a warning.
    #[arg(long, value_name = "NAME=BOOL,...", value_delimiter = ',', value_parser = parse_feature_gate)]
    pub feature_gates: Vec<(String, bool)>,

    /// The oom_score_adj of the process, -1000..=1000, written to /proc/self/oom_score_adj
    /// when the daemon starts (a warning if it cannot be written).
    #[arg(long, default_value_t = -999, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(-1000..=1000))]
    pub oom_score_adj: i32,

    /// Conntrack entries per CPU: nf_conntrack_max = max(this × CPUs, --conntrack-min);
    /// 0 leaves nf_conntrack_max as it is (and ignores --conntrack-min).
    #[arg(long, default_value_t = 32768, value_parser = clap::value_parser!(i32).range(0..))]
    pub conntrack_max_per_core: i32,

    /// Minimum nf_conntrack_max, whatever --conntrack-max-per-core gives.
    #[arg(long, default_value_t = 131072, value_parser = clap::value_parser!(i32).range(0..))]
    pub conntrack_min: i32,

    /// nf_conntrack_tcp_timeout_established (Go duration; 0 leaves it as it is).
    #[arg(long, allow_hyphen_values = true, default_value = "24h0m0s", value_parser = parse_duration)]
    pub conntrack_tcp_timeout_established: Duration,

    /// nf_conntrack_tcp_timeout_close_wait (Go duration; 0 leaves it as it is).
    #[arg(long, allow_hyphen_values = true, default_value = "1h0m0s", value_parser = parse_duration)]
    pub conntrack_tcp_timeout_close_wait: Duration,

    /// nf_conntrack_udp_timeout, for unreplied UDP flows (Go duration; 0 leaves it as it is).
    #[arg(long, allow_hyphen_values = true, default_value = "0s", value_parser = parse_duration)]
    pub conntrack_udp_timeout: Duration,

    /// nf_conntrack_udp_timeout_stream, for assured UDP flows (Go duration; 0 leaves it).
    #[arg(long, allow_hyphen_values = true, default_value = "0s", value_parser = parse_duration)]
    pub conntrack_udp_timeout_stream: Duration,

    /// Apply the one-time node settings (the conntrack sysctls) and exit.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", action = ArgAction::Set)]
    pub init_only: bool,

    /// Deprecated upstream: the /healthz port (0 disables); used only when
    /// --healthz-bind-address has no port.
    #[arg(long, value_name = "PORT", hide = true, value_parser = clap::value_parser!(u16))]
    pub healthz_port: Option<u16>,

    /// Deprecated upstream: the /metrics port (0 disables); used only when
    /// --metrics-bind-address has no port.
    #[arg(long, value_name = "PORT", hide = true, value_parser = clap::value_parser!(u16))]
    pub metrics_port: Option<u16>,

    /// Upstream flags accepted for compatibility that have no effect here.
    #[command(flatten)]
    pub compat: CompatArgs,
}

/// Upstream kube-proxy flags that kube-proxy-rs accepts with upstream's syntax and defaults
/// but that have no effect (each one given is logged at start). Hidden from `--help`;
/// docs/flags.md lists them.
#[derive(Debug, Args)]
pub struct CompatArgs {
    /// How often configuration from the API server is refreshed (watches are used instead).
    #[arg(long, allow_hyphen_values = true, default_value = "15m0s", value_parser = parse_duration, hide = true)]
    pub config_sync_period: Duration,

    /// Content type of API requests (kube-proxy-rs speaks JSON).
    #[arg(
        long,
        default_value = "application/vnd.kubernetes.protobuf",
        hide = true
    )]
    pub kube_api_content_type: String,

    /// Client QPS to the API server (kube-proxy-rs only lists and watches).
    #[arg(long, default_value_t = 5.0, hide = true)]
    pub kube_api_qps: f32,

    /// Client burst to the API server.
    #[arg(long, default_value_t = 10, hide = true)]
    pub kube_api_burst: i32,

    /// pprof on /debug/pprof (not in kube-proxy-rs).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", action = ArgAction::Set, hide = true)]
    pub profiling: bool,

    /// Show metrics hidden since that version (`<major>.<minor>`); nothing is hidden here.
    #[arg(long, default_value = "", value_name = "VERSION", hide = true)]
    pub show_hidden_metrics_for_version: String,

    /// Userspace mode: the ports the proxy sockets listen on, `BEGIN-END` (inclusive),
    /// `BEGIN+COUNT` or one port; empty: the kernel picks a free port for each.
    #[arg(long, default_value = "", value_name = "RANGE")]
    pub proxy_port_range: String,

    /// Userspace mode: how long an idle UDP flow (one per client address and port) is kept
    /// (Go duration, upstream's default 250ms).
    #[arg(long, allow_hyphen_values = true, default_value = "250ms", value_parser = parse_duration)]
    pub udp_timeout: Duration,

    /// Userspace mode: TCP connections and UDP flows the proxy keeps open at once, over all
    /// Service ports; past it new ones are refused (reset), logged and counted in
    /// kube_proxy_rs_userspace_rejected_connections_total (kube-proxy-rs only).
    /// Config file: `kubeProxyRs.userspaceMaxConnections`.
    #[arg(long, default_value_t = 20000, value_name = "N")]
    pub userspace_max_connections: usize,

    /// IPVS mode: how often the whole IPVS table, kube-ipvs0 and the ipsets are read back and
    /// repaired (a full sync), and the retry interval after a failed sync.
    #[arg(long, allow_hyphen_values = true, default_value = "30s", value_parser = parse_duration)]
    pub ipvs_sync_period: Duration,

    /// IPVS mode: minimum time between syncs.
    #[arg(long, allow_hyphen_values = true, default_value = "1s", value_parser = parse_duration)]
    pub ipvs_min_sync_period: Duration,

    /// IPVS mode: the scheduler of every virtual server (rr, wrr, lc, wlc, lblc, lblcr, sh,
    /// dh, sed, nq, mh; empty: rr).
    #[arg(long, default_value = "")]
    pub ipvs_scheduler: String,

    /// IPVS mode: CIDRs whose virtual servers kube-proxy-rs never deletes (they belong to
    /// someone else).
    #[arg(long, value_delimiter = ',')]
    pub ipvs_exclude_cidrs: Vec<String>,

    /// IPVS mode: set arp_ignore=1 and arp_announce=2, so the node does not answer ARP for
    /// kube-ipvs0's addresses.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", action = ArgAction::Set)]
    pub ipvs_strict_arp: bool,

    /// IPVS mode: idle timeout of established TCP connections (0: the kernel's, 900 s).
    #[arg(long, allow_hyphen_values = true, default_value = "0s", value_parser = parse_duration)]
    pub ipvs_tcp_timeout: Duration,

    /// IPVS mode: timeout of TCP connections after a FIN (0: the kernel's, 120 s).
    #[arg(long, allow_hyphen_values = true, default_value = "0s", value_parser = parse_duration)]
    pub ipvs_tcpfin_timeout: Duration,

    /// IPVS mode: UDP flow timeout (0: the kernel's, 300 s).
    #[arg(long, allow_hyphen_values = true, default_value = "0s", value_parser = parse_duration)]
    pub ipvs_udp_timeout: Duration,

    /// Log format: `text`, or `json` (one JSON object per line on stderr, in klog's JSON
    /// shape: ts, caller, msg, v, err, fields).
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub logging_format: String,

    /// Maximum time between log flushes (logs are written unbuffered here).
    #[arg(long, allow_hyphen_values = true, default_value = "5s", value_parser = parse_duration, hide = true)]
    pub log_flush_frequency: Duration,

    /// Per-file verbosity, `pattern=N` comma-separated (use RUST_LOG instead).
    #[arg(long, value_delimiter = ',', hide = true)]
    pub vmodule: Vec<String>,

    /// Text logs: info to stdout, errors to stderr.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", action = ArgAction::Set, hide = true)]
    pub log_text_split_stream: bool,

    /// Text logs: info buffer size.
    #[arg(long, default_value = "0", hide = true)]
    pub log_text_info_buffer_size: String,

    /// JSON logs: info to stdout, errors to stderr.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", action = ArgAction::Set, hide = true)]
    pub log_json_split_stream: bool,

    /// JSON logs: info buffer size.
    #[arg(long, default_value = "0", hide = true)]
    pub log_json_info_buffer_size: String,

    /// klog: add the file directory to log headers.
    #[arg(long = "add_dir_header", default_value = "false", num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set, hide = true)]
    pub add_dir_header: bool,

    /// klog: log to stderr as well as files.
    #[arg(long = "alsologtostderr", default_value = "false", num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set, hide = true)]
    pub alsologtostderr: bool,

    /// klog: emit a stack trace at `file:N`.
    #[arg(long = "log_backtrace_at", default_value = ":0", hide = true)]
    pub log_backtrace_at: String,

    /// klog: write log files into this directory.
    #[arg(long = "log_dir", default_value = "", hide = true)]
    pub log_dir: String,

    /// klog: write logs to this file.
    #[arg(long = "log_file", default_value = "", hide = true)]
    pub log_file: String,

    /// klog: maximum log file size in MB.
    #[arg(long = "log_file_max_size", default_value_t = 1800, hide = true)]
    pub log_file_max_size: u64,

    /// klog: log to stderr instead of files (logs always go to stderr here).
    #[arg(long = "logtostderr", default_value = "true", num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set, hide = true)]
    pub logtostderr: bool,

    /// klog: write each line to its own severity file only.
    #[arg(long = "one_output", default_value = "false", num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set, hide = true)]
    pub one_output: bool,

    /// klog: no header prefixes.
    #[arg(long = "skip_headers", default_value = "false", num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set, hide = true)]
    pub skip_headers: bool,

    /// klog: no header prefixes in log files.
    #[arg(long = "skip_log_headers", default_value = "false", num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set, hide = true)]
    pub skip_log_headers: bool,

    /// klog: logs at or above this severity go to stderr.
    #[arg(long = "stderrthreshold", default_value = "2", hide = true)]
    pub stderrthreshold: String,
}

impl CompatArgs {
    /// The clap ids of the no-op flags, with their upstream spelling.
    pub const FLAGS: &'static [(&'static str, &'static str)] = &[
        ("config_sync_period", "--config-sync-period"),
        ("kube_api_content_type", "--kube-api-content-type"),
        ("kube_api_qps", "--kube-api-qps"),
        ("kube_api_burst", "--kube-api-burst"),
        ("profiling", "--profiling"),
        (
            "show_hidden_metrics_for_version",
            "--show-hidden-metrics-for-version",
        ),
        ("log_flush_frequency", "--log-flush-frequency"),
        ("vmodule", "--vmodule"),
        ("log_text_split_stream", "--log-text-split-stream"),
        ("log_text_info_buffer_size", "--log-text-info-buffer-size"),
        ("log_json_split_stream", "--log-json-split-stream"),
        ("log_json_info_buffer_size", "--log-json-info-buffer-size"),
        ("add_dir_header", "--add_dir_header"),
        ("alsologtostderr", "--alsologtostderr"),
        ("log_backtrace_at", "--log_backtrace_at"),
        ("log_dir", "--log_dir"),
        ("log_file", "--log_file"),
        ("log_file_max_size", "--log_file_max_size"),
        ("logtostderr", "--logtostderr"),
        ("one_output", "--one_output"),
        ("skip_headers", "--skip_headers"),
        ("skip_log_headers", "--skip_log_headers"),
        ("stderrthreshold", "--stderrthreshold"),
    ];
}

/// Parses one `--feature-gates` entry, `Name=bool` (Go's `strconv.ParseBool` spellings).
///
/// # Errors
/// A message naming the entry when it is not `Name=bool`.
pub fn parse_feature_gate(text: &str) -> Result<(String, bool), String> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| format!("missing bool value for feature gate {:?}", text.trim()))?;
    let name = name.trim();
    if name.is_empty() {
        return Err(format!("empty feature gate name in {text:?}"));
    }
    let value = match value.trim() {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => true,
        "0" | "f" | "F" | "false" | "FALSE" | "False" => false,
        v => return Err(format!("invalid value of {name}={v}, err: not a bool")),
    };
    Ok((name.to_string(), value))
}

/// Flags of `sandbox`.
#[derive(Debug, Args)]
pub struct SandboxArgs {
    /// The cluster to build: a manifest file or directory (default: the bundled seed example).
    #[arg(long, value_name = "PATH")]
    pub manifests: Option<PathBuf>,

    /// Which proxy mode to run. IPVS mode on a kernel without IPVS runs the whole sandbox in
    /// a qemu guest (prepared by scripts/install-deps; the boot takes about 10 s).
    #[arg(long, value_enum, default_value = "iptables")]
    pub proxy_mode: ProxyModeArg,

    /// The node the proxy runs as (default: the first Node in the manifests).
    #[arg(long, value_name = "NAME")]
    pub node: Option<String>,

    /// The cluster's pod CIDR, passed to the proxy as --cluster-cidr.
    #[arg(long, default_value = "10.0.0.0/16")]
    pub cluster_cidr: String,

    /// Requests to send to each Service address from each vantage point (1 or more).
    #[arg(short = 'n', long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
    pub requests: u32,

    /// Print the rules the proxy programmed in the node namespace: `iptables-save`,
    /// `nft list ruleset`, or in IPVS mode `iptables-save`, `ipset save` and `ipvsadm -Ln`.
    #[arg(long)]
    pub show_rules: bool,

    /// Keep the sandbox until Ctrl-C instead of tearing it down after the report, so it can
    /// be explored (`ip netns exec <node> iptables-save` or `… nft list ruleset`). Refused in
    /// IPVS mode when the sandbox runs in a qemu guest.
    #[arg(long)]
    pub keep: bool,
}

/// Parses a Go duration (`1s`, `500ms`, `1m30s`, `1.5h`, `0`).
///
/// # Errors
/// A message naming the text when it is not a duration.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration {text:?} (expected e.g. 1s, 500ms, 1m30s)");
    let s = text.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(bad());
    }
    if s.starts_with('-') && s.len() > 1 {
        return Err(format!(
            "invalid duration {text:?}: durations cannot be negative"
        ));
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        if num_len == 0 {
            return Err(bad());
        }
        let value: f64 = rest[..num_len].parse().map_err(|_| bad())?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += value * scale;
        rest = &rest[unit_len..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("1").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("1x").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn upstream_flag_forms() {
        let cli = Cli::try_parse_from([
            "kube-proxy-rs",
            "--proxy-mode=iptables",
            "--cluster-cidr=10.0.0.0/16",
            "--masquerade-all",
            "--iptables-localhost-nodeports=false",
            "--nodeport-addresses=192.168.0.0/16,primary",
            "--hostname-override=k8s-master",
            "--iptables-min-sync-period=2s",
            "-v=4",
        ])
        .unwrap();
        let p = cli.proxy;
        assert!(p.masquerade_all);
        assert!(!p.iptables_localhost_nodeports);
        assert_eq!(p.nodeport_addresses, ["192.168.0.0/16", "primary"]);
        assert_eq!(p.iptables_min_sync_period, Duration::from_secs(2));
        assert_eq!(p.verbosity, 4);
        assert_eq!(p.iptables_masquerade_bit, 14);
        assert!(Cli::try_parse_from(["kube-proxy-rs", "--iptables-masquerade-bit=32"]).is_err());
        assert!(Cli::try_parse_from(["kube-proxy-rs", "--proxy-mode=kernelspace"]).is_err());
        let cli = Cli::try_parse_from(["kube-proxy-rs", "--proxy-mode=nftables"]).unwrap();
        assert_eq!(cli.proxy.proxy_mode, ProxyModeArg::Nftables);
        let cli =
            Cli::try_parse_from(["kube-proxy-rs", "sandbox", "--proxy-mode", "nftables"]).unwrap();
        assert!(matches!(
            cli.command,
            Some(Command::Sandbox(SandboxArgs {
                proxy_mode: ProxyModeArg::Nftables,
                ..
            }))
        ));
        let cli = Cli::try_parse_from(["kube-proxy-rs", "sandbox", "-n", "10"]).unwrap();
        assert!(matches!(
            cli.command,
            Some(Command::Sandbox(SandboxArgs { requests: 10, .. }))
        ));
    }
}
