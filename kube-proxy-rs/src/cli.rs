//! Command line: upstream kube-proxy's flags (same names, same defaults) plus our own
//! (`--manifests`, `--dry-run`, `--once`, `--iptables-backend`) and subcommands.

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
    /// Explain where a packet goes through iptables rules: this node's (`--live`) or a dump
    /// from any kube-proxy (`--rules FILE`, `iptables-save` output, partial dumps accepted).
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
    /// An `iptables-save` (or `ip6tables-save`) dump, or an `nft -j list ruleset` dump
    /// (JSON, recognized by its leading `{`); `-` reads standard input.
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
    /// node; comma-separated or repeated. With --live they are read from the node.
    #[arg(long, value_name = "IP", value_delimiter = ',')]
    pub node_ip: Vec<std::net::IpAddr>,

    /// `ipset save` output, for `-m set` matches (read automatically with --live).
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
    /// table `ip kube-proxy` / `ip6 kube-proxy`, else iptables; with --rules: by the
    /// dump's format), `iptables` or `nftables`.
    #[arg(long, value_enum, default_value = "auto")]
    pub mode: crate::trace::TraceMode,
}

/// `--proxy-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProxyModeArg {
    /// iptables rules (KUBE-SERVICES → KUBE-SVC → KUBE-SEP); the default.
    Iptables,
    /// nftables: table `kube-proxy` (families ip and ip6), verdict maps, one `nft -f`
    /// transaction per sync.
    Nftables,
    /// IPVS virtual servers (not implemented yet).
    Ipvs,
}

impl ProxyModeArg {
    /// The flag's spelling (`iptables`, `nftables`, `ipvs`).
    pub fn name(self) -> &'static str {
        match self {
            ProxyModeArg::Iptables => "iptables",
            ProxyModeArg::Nftables => "nftables",
            ProxyModeArg::Ipvs => "ipvs",
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
    /// `iptables-restore` as found on PATH (Debian: the nf_tables backend).
    Auto,
    /// `iptables-nft-restore`.
    Nft,
    /// `iptables-legacy-restore`.
    Legacy,
}

/// Flags of the proxy itself, named as upstream kube-proxy names them.
#[derive(Debug, Args)]
pub struct ProxyArgs {
    /// A KubeProxyConfiguration file (kubeproxy.config.k8s.io/v1alpha1), as upstream
    /// kube-proxy reads; flags given on the command line override its values.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

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
    #[arg(long, value_name = "PATH")]
    pub manifests: Option<PathBuf>,

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
    /// both modes; upstream's nftables mode reads it from `nftables.masqueradeBit`).
    #[arg(long, default_value_t = 14, value_parser = clap::value_parser!(u8).range(0..=31))]
    pub iptables_masquerade_bit: u8,

    /// Addresses that accept NodePort connections: CIDRs, `primary`, or `all`. Default: `all`
    /// in iptables mode, `primary` (the node's InternalIP) in nftables mode, as upstream.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub nodeport_addresses: Vec<String>,

    /// Accept NodePort connections on 127.0.0.1 (sets route_localnet; IPv4, iptables mode
    /// only: nftables mode never serves NodePorts on loopback, as upstream).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", action = ArgAction::Set)]
    pub iptables_localhost_nodeports: bool,

    /// Minimum time between two syncs (Go duration: 1s, 500ms, 1m30s).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub iptables_min_sync_period: Duration,

    /// Retry interval after a failed sync (Go duration).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub iptables_sync_period: Duration,

    /// Do not drop packets in conntrack state INVALID (set when
    /// nf_conntrack_tcp_be_liberal is enabled on the node).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", action = ArgAction::Set)]
    pub conntrack_tcp_be_liberal: bool,

    /// Which iptables binaries to run.
    #[arg(long, value_enum, default_value = "auto")]
    pub iptables_backend: IptablesBackendArg,

    /// Remove every rule and chain the proxy created (iptables chains of both backends and the
    /// nftables tables `ip kube-proxy` / `ip6 kube-proxy`), then exit.
    #[arg(long)]
    pub cleanup: bool,

    /// Print the iptables-restore (or `nft -f`) input a fresh node would receive, change
    /// nothing, exit.
    #[arg(long)]
    pub dry_run: bool,

    /// Sync once and exit: 0 when the sync succeeded.
    #[arg(long)]
    pub once: bool,

    /// Log verbosity like klog's -v: 0-1 info, 2-3 debug, 4+ trace (RUST_LOG overrides).
    #[arg(short = 'v', long = "v", default_value_t = 0, value_name = "N")]
    pub verbosity: u8,
}

/// Flags of `sandbox`.
#[derive(Debug, Args)]
pub struct SandboxArgs {
    /// The cluster to build: a manifest file or directory (default: the bundled seed example).
    #[arg(long, value_name = "PATH")]
    pub manifests: Option<PathBuf>,

    /// Which proxy mode to run.
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

    /// Print the rules the proxy programmed (`iptables-save` or `nft list ruleset` in the
    /// node namespace).
    #[arg(long)]
    pub show_rules: bool,

    /// Keep the sandbox until Ctrl-C instead of tearing it down after the report, so it can
    /// be explored (`ip netns exec <node> iptables-save` or `… nft list ruleset`).
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
        assert!(Cli::try_parse_from(["kube-proxy-rs", "--proxy-mode=userspace"]).is_err());
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
