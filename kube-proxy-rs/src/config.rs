//! `--config`: upstream's `KubeProxyConfiguration` file (`kubeproxy.config.k8s.io/v1alpha1`).
//!
//! The same file works with upstream kube-proxy and with kube-proxy-rs: the fields, their
//! names, their defaults and their duration format are upstream's (`k8s.io/kube-proxy`
//! `config/v1alpha1/types.go` and `pkg/proxy/apis/config/v1alpha1/defaults.go`). Unknown
//! fields are rejected with an error naming the field's path, as upstream's strict decoding
//! does. Fields that only matter to other platforms or modes (`winkernel`, `ipvs`,
//! `portRange`, `enableProfiling`, ...) are accepted and ignored. `--write-config-to` writes
//! the effective defaults.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The config file's `apiVersion`.
pub const API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";
/// The config file's `kind`.
pub const KIND: &str = "KubeProxyConfiguration";

/// A duration in Go's `time.Duration` text form (`30s`, `1m0s`, `24h0m0s`), as
/// `metav1.Duration` serializes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GoDuration(pub Duration);

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if d.is_zero() {
            return f.write_str("0s");
        }
        let total = d.as_secs();
        let (h, m, s) = (total / 3600, (total / 60) % 60, total % 60);
        let frac = d.subsec_nanos();
        if total == 0 {
            // Below one second Go prints ms/µs/ns.
            return if frac.is_multiple_of(1_000_000) {
                write!(f, "{}ms", frac / 1_000_000)
            } else if frac.is_multiple_of(1000) {
                write!(f, "{}µs", frac / 1000)
            } else {
                write!(f, "{frac}ns")
            };
        }
        let secs = if frac == 0 {
            format!("{s}s")
        } else {
            let digits = format!("{:09}", frac);
            format!("{s}.{}s", digits.trim_end_matches('0'))
        };
        if h > 0 {
            write!(f, "{h}h{m}m{secs}")
        } else if m > 0 {
            write!(f, "{m}m{secs}")
        } else {
            f.write_str(&secs)
        }
    }
}

impl Serialize for GoDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        crate::cli::parse_duration(&text)
            .map(GoDuration)
            .map_err(serde::de::Error::custom)
    }
}

/// Reads `null` (as upstream's `--write-config-to` prints empty lists) as an empty list.
fn null_as_empty<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(Option::<Vec<String>>::deserialize(d)?.unwrap_or_default())
}

/// Removes `null` members, recursively. Upstream's decoder leaves a field that is `null` at
/// its zero value, which defaulting then fills; kubeadm's file has such fields
/// (`ipvs.excludeCIDRs: null`).
fn strip_nulls(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(members) => {
            members.retain(|_, m| !m.is_null());
            members.values_mut().for_each(strip_nulls);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

fn secs(n: u64) -> GoDuration {
    GoDuration(Duration::from_secs(n))
}

/// `clientConnection` (component-base `ClientConnectionConfiguration`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ClientConnection {
    /// Path to a kubeconfig file.
    pub kubeconfig: String,
    /// `acceptContentTypes`.
    pub accept_content_types: String,
    /// `contentType` (default protobuf; kube-proxy-rs always speaks JSON).
    pub content_type: String,
    /// `qps` (default 5).
    pub qps: f32,
    /// `burst` (default 10).
    pub burst: i32,
}

impl Default for ClientConnection {
    fn default() -> Self {
        ClientConnection {
            kubeconfig: String::new(),
            accept_content_types: String::new(),
            content_type: "application/vnd.kubernetes.protobuf".into(),
            qps: 5.0,
            burst: 10,
        }
    }
}

/// `iptables`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct IptablesSection {
    /// `masqueradeBit` (0..=31, default 14).
    pub masquerade_bit: Option<i32>,
    /// `masqueradeAll`.
    pub masquerade_all: bool,
    /// `localhostNodePorts` (default true).
    pub localhost_node_ports: Option<bool>,
    /// `syncPeriod` (default 30s).
    pub sync_period: GoDuration,
    /// `minSyncPeriod` (default 1s).
    pub min_sync_period: GoDuration,
}

impl Default for IptablesSection {
    fn default() -> Self {
        IptablesSection {
            masquerade_bit: Some(14),
            masquerade_all: false,
            localhost_node_ports: Some(true),
            sync_period: secs(30),
            min_sync_period: secs(1),
        }
    }
}

/// `nftables`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct NftablesSection {
    /// `masqueradeBit` (default 14).
    pub masquerade_bit: Option<i32>,
    /// `masqueradeAll`.
    pub masquerade_all: bool,
    /// `syncPeriod` (default 30s).
    pub sync_period: GoDuration,
    /// `minSyncPeriod` (default 1s).
    pub min_sync_period: GoDuration,
    /// `tableName` (upstream's newer field; kube-proxy-rs uses `kube-proxy`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub table_name: String,
}

impl Default for NftablesSection {
    fn default() -> Self {
        NftablesSection {
            masquerade_bit: Some(14),
            masquerade_all: false,
            sync_period: secs(30),
            min_sync_period: secs(1),
            table_name: String::new(),
        }
    }
}

/// `ipvs` (accepted; IPVS mode is not built yet).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct IpvsSection {
    /// `syncPeriod` (default 30s).
    pub sync_period: GoDuration,
    /// `minSyncPeriod`.
    pub min_sync_period: GoDuration,
    /// `scheduler`.
    pub scheduler: String,
    /// `excludeCIDRs`.
    #[serde(rename = "excludeCIDRs")]
    pub exclude_cidrs: Vec<String>,
    /// `strictARP`.
    #[serde(rename = "strictARP")]
    pub strict_arp: bool,
    /// `tcpTimeout`.
    pub tcp_timeout: GoDuration,
    /// `tcpFinTimeout`.
    pub tcp_fin_timeout: GoDuration,
    /// `udpTimeout`.
    pub udp_timeout: GoDuration,
}

impl Default for IpvsSection {
    fn default() -> Self {
        IpvsSection {
            sync_period: secs(30),
            min_sync_period: GoDuration::default(),
            scheduler: String::new(),
            exclude_cidrs: Vec::new(),
            strict_arp: false,
            tcp_timeout: GoDuration::default(),
            tcp_fin_timeout: GoDuration::default(),
            udp_timeout: GoDuration::default(),
        }
    }
}

/// `conntrack`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ConntrackSection {
    /// `maxPerCore` (default 32768).
    pub max_per_core: Option<i32>,
    /// `min` (default 131072).
    pub min: Option<i32>,
    /// `tcpEstablishedTimeout` (default 24h).
    pub tcp_established_timeout: Option<GoDuration>,
    /// `tcpCloseWaitTimeout` (default 1h).
    pub tcp_close_wait_timeout: Option<GoDuration>,
    /// `tcpBeLiberal`.
    pub tcp_be_liberal: bool,
    /// `udpTimeout`.
    pub udp_timeout: GoDuration,
    /// `udpStreamTimeout`.
    pub udp_stream_timeout: GoDuration,
}

impl Default for ConntrackSection {
    fn default() -> Self {
        ConntrackSection {
            max_per_core: Some(32768),
            min: Some(131072),
            tcp_established_timeout: Some(secs(24 * 3600)),
            tcp_close_wait_timeout: Some(secs(3600)),
            tcp_be_liberal: false,
            udp_timeout: GoDuration::default(),
            udp_stream_timeout: GoDuration::default(),
        }
    }
}

/// `detectLocal`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DetectLocal {
    /// `bridgeInterface`.
    pub bridge_interface: String,
    /// `interfaceNamePrefix`.
    pub interface_name_prefix: String,
}

/// `winkernel` (Windows only; accepted and ignored).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Winkernel {
    /// `networkName`.
    pub network_name: String,
    /// `sourceVip`.
    pub source_vip: String,
    /// `enableDSR`.
    #[serde(rename = "enableDSR")]
    pub enable_dsr: bool,
    /// `rootHnsEndpointName`.
    pub root_hns_endpoint_name: String,
    /// `forwardHealthCheckVip`.
    pub forward_health_check_vip: bool,
}

/// A `KubeProxyConfiguration` document with upstream's defaults for absent fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct KubeProxyConfiguration {
    /// `apiVersion`: must be `kubeproxy.config.k8s.io/v1alpha1`.
    pub api_version: String,
    /// `kind`: must be `KubeProxyConfiguration`.
    pub kind: String,
    /// `featureGates` (accepted; logged when set).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub feature_gates: BTreeMap<String, bool>,
    /// `clientConnection`.
    pub client_connection: ClientConnection,
    /// `logging` (component-base logging options; accepted, `verbosity` is honoured).
    #[serde(skip_serializing_if = "serde_json::Value::is_null")]
    pub logging: serde_json::Value,
    /// `hostnameOverride`.
    pub hostname_override: String,
    /// `bindAddress` (default `0.0.0.0`).
    pub bind_address: String,
    /// `healthzBindAddress` (default `0.0.0.0:10256`).
    pub healthz_bind_address: String,
    /// `metricsBindAddress` (default `127.0.0.1:10249`).
    pub metrics_bind_address: String,
    /// `bindAddressHardFail`.
    pub bind_address_hard_fail: bool,
    /// `enableProfiling` (accepted; no pprof in kube-proxy-rs).
    pub enable_profiling: bool,
    /// `showHiddenMetricsForVersion`.
    pub show_hidden_metrics_for_version: String,
    /// `serviceProxyName` (upstream's newer field).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub service_proxy_name: String,
    /// `mode` (`""` means iptables on Linux).
    pub mode: String,
    /// `iptables`.
    pub iptables: IptablesSection,
    /// `ipvs`.
    pub ipvs: IpvsSection,
    /// `nftables`.
    pub nftables: NftablesSection,
    /// `winkernel`.
    pub winkernel: Winkernel,
    /// `detectLocalMode` (`""` means ClusterCIDR).
    pub detect_local_mode: String,
    /// `detectLocal`.
    pub detect_local: DetectLocal,
    /// `clusterCIDR` (comma-separated, one per family).
    #[serde(rename = "clusterCIDR")]
    pub cluster_cidr: String,
    /// `nodePortAddresses` (`null` as in upstream's written files means none).
    #[serde(deserialize_with = "null_as_empty")]
    pub node_port_addresses: Vec<String>,
    /// `oomScoreAdj` (default -999).
    pub oom_score_adj: Option<i32>,
    /// `conntrack`.
    pub conntrack: ConntrackSection,
    /// `configSyncPeriod` (default 15m).
    pub config_sync_period: GoDuration,
    /// `portRange` (userspace mode's proxy ports).
    pub port_range: String,
    /// `udpIdleTimeout` (userspace mode; default 250ms).
    pub udp_idle_timeout: Option<GoDuration>,
}

impl Default for KubeProxyConfiguration {
    fn default() -> Self {
        KubeProxyConfiguration {
            api_version: API_VERSION.into(),
            kind: KIND.into(),
            feature_gates: BTreeMap::new(),
            client_connection: ClientConnection::default(),
            logging: serde_json::Value::Null,
            hostname_override: String::new(),
            bind_address: "0.0.0.0".into(),
            healthz_bind_address: "0.0.0.0:10256".into(),
            metrics_bind_address: "127.0.0.1:10249".into(),
            bind_address_hard_fail: false,
            enable_profiling: false,
            show_hidden_metrics_for_version: String::new(),
            service_proxy_name: String::new(),
            mode: String::new(),
            iptables: IptablesSection::default(),
            ipvs: IpvsSection::default(),
            nftables: NftablesSection::default(),
            winkernel: Winkernel::default(),
            detect_local_mode: String::new(),
            detect_local: DetectLocal::default(),
            cluster_cidr: String::new(),
            node_port_addresses: Vec::new(),
            oom_score_adj: Some(-999),
            conntrack: ConntrackSection::default(),
            config_sync_period: secs(15 * 60),
            port_range: String::new(),
            udp_idle_timeout: None,
        }
    }
}

impl KubeProxyConfiguration {
    /// Reads and validates a config file (YAML or JSON).
    ///
    /// # Errors
    /// The file cannot be read; it does not parse; a field is unknown or has the wrong type
    /// (the error names the field's path, e.g. `iptables.masqueradeBitt`); `apiVersion` or
    /// `kind` is wrong; a value is out of range.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--config {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("--config {}", path.display()))
    }

    /// Parses and validates config text.
    ///
    /// # Errors
    /// As [`load`](Self::load).
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let mut value: serde_json::Value =
            serde_saphyr::from_str(text).map_err(|e| anyhow::anyhow!("cannot parse YAML: {e}"))?;
        strip_nulls(&mut value);
        let mut cfg: KubeProxyConfiguration =
            serde_path_to_error::deserialize(value).map_err(|e| {
                let path = e.path().to_string();
                anyhow::anyhow!("{path}: {}", e.into_inner())
            })?;
        cfg.apply_defaults();
        cfg.validate()?;
        Ok(cfg)
    }

    /// Upstream's defaulting of zero values (`SetDefaults_KubeProxyConfiguration`): a sync
    /// period of `0s`, an empty bind address, an empty content type or a zero QPS in the file
    /// mean "the default", as kubeadm's generated file relies on (it writes
    /// `iptables.syncPeriod: 0s`, `healthzBindAddress: ""`, ...).
    pub fn apply_defaults(&mut self) {
        let d = KubeProxyConfiguration::default();
        let zero = |v: &mut GoDuration, default: &GoDuration| {
            if v.0.is_zero() {
                *v = *default;
            }
        };
        zero(&mut self.iptables.sync_period, &d.iptables.sync_period);
        zero(
            &mut self.iptables.min_sync_period,
            &d.iptables.min_sync_period,
        );
        zero(&mut self.nftables.sync_period, &d.nftables.sync_period);
        zero(
            &mut self.nftables.min_sync_period,
            &d.nftables.min_sync_period,
        );
        zero(&mut self.ipvs.sync_period, &d.ipvs.sync_period);
        zero(&mut self.config_sync_period, &d.config_sync_period);
        for (v, default) in [
            (&mut self.bind_address, &d.bind_address),
            (&mut self.healthz_bind_address, &d.healthz_bind_address),
            (&mut self.metrics_bind_address, &d.metrics_bind_address),
            (
                &mut self.client_connection.content_type,
                &d.client_connection.content_type,
            ),
        ] {
            if v.trim().is_empty() {
                v.clone_from(default);
            }
        }
        if self.client_connection.qps == 0.0 {
            self.client_connection.qps = d.client_connection.qps;
        }
        if self.client_connection.burst == 0 {
            self.client_connection.burst = d.client_connection.burst;
        }
    }

    /// Checks what upstream's validation checks that matters here.
    ///
    /// # Errors
    /// A message naming the field.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.api_version != API_VERSION {
            bail!(
                "apiVersion: {:?} is not supported (expected {API_VERSION})",
                self.api_version
            );
        }
        if self.kind != KIND {
            bail!("kind: {:?} is not supported (expected {KIND})", self.kind);
        }
        if !matches!(
            self.mode.as_str(),
            "" | "iptables" | "nftables" | "ipvs" | "userspace"
        ) {
            bail!(
                "mode: {:?} is not a proxy mode (iptables, nftables, ipvs or userspace)",
                self.mode
            );
        }
        for (field, bit) in [
            ("iptables.masqueradeBit", self.iptables.masquerade_bit),
            ("nftables.masqueradeBit", self.nftables.masquerade_bit),
        ] {
            if let Some(b) = bit
                && !(0..=31).contains(&b)
            {
                bail!("{field}: {b} must be within 0..=31");
            }
        }
        if self.iptables.sync_period.0.is_zero() {
            bail!("iptables.syncPeriod: must be greater than 0");
        }
        if !matches!(
            self.detect_local_mode.as_str(),
            "" | "ClusterCIDR" | "NodeCIDR" | "BridgeInterface" | "InterfaceNamePrefix"
        ) {
            bail!(
                "detectLocalMode: {:?} is not a local-traffic detection mode",
                self.detect_local_mode
            );
        }
        for (i, c) in self
            .cluster_cidr
            .split(',')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .enumerate()
        {
            if c.parse::<ipnet::IpNet>().is_err() {
                bail!("clusterCIDR: entry {i} {c:?} is not a CIDR");
            }
        }
        crate::proxy::cluster_cidrs("clusterCIDR", self.cluster_cidr.split(','))?;
        if let Some(v) = self.oom_score_adj
            && !(-1000..=1000).contains(&v)
        {
            bail!("oomScoreAdj: {v} must be within -1000..=1000");
        }
        for (field, v) in [
            ("conntrack.maxPerCore", self.conntrack.max_per_core),
            ("conntrack.min", self.conntrack.min),
        ] {
            if let Some(v) = v
                && v < 0
            {
                bail!("{field}: {v} must be greater than or equal to 0");
            }
        }
        if !self.bind_address.trim().is_empty()
            && self
                .bind_address
                .trim()
                .parse::<std::net::IpAddr>()
                .is_err()
        {
            bail!("bindAddress: {:?} is not an IP address", self.bind_address);
        }
        kp_proxier::NodePortAddresses::parse(&self.node_port_addresses)
            .map_err(|e| anyhow::anyhow!("nodePortAddresses: {e}"))?;
        Ok(())
    }

    /// The defaults as a YAML document, like upstream's `--write-config-to`.
    ///
    /// # Errors
    /// Serialization failure (not expected).
    pub fn to_yaml(&self) -> anyhow::Result<String> {
        serde_saphyr::to_string(self).map_err(|e| anyhow::anyhow!("writing the configuration: {e}"))
    }
}

/// Settings the config file can carry, applied to the flags that were not given on the
/// command line (`explicit(id)` tells whether the flag with clap id `id` was given).
/// Mode-specific sections follow the mode: `nftables.*` in nftables mode, `iptables.*`
/// otherwise.
pub fn apply(
    cfg: &KubeProxyConfiguration,
    args: &mut crate::cli::ProxyArgs,
    explicit: impl Fn(&str) -> bool,
) -> anyhow::Result<()> {
    use crate::cli::{DetectLocalModeArg, ProxyModeArg};
    let set = |id: &str| !explicit(id);
    if set("proxy_mode") {
        args.proxy_mode = match cfg.mode.as_str() {
            "" | "iptables" => ProxyModeArg::Iptables,
            "nftables" => ProxyModeArg::Nftables,
            "userspace" => ProxyModeArg::Userspace,
            _ => ProxyModeArg::Ipvs,
        };
    }
    let nft = args.proxy_mode == ProxyModeArg::Nftables;
    if set("cluster_cidr") {
        args.cluster_cidr = cfg
            .cluster_cidr
            .split(',')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(String::from)
            .collect();
    }
    if set("detect_local_mode") && !cfg.detect_local_mode.is_empty() {
        args.detect_local_mode = Some(match cfg.detect_local_mode.as_str() {
            "NodeCIDR" => DetectLocalModeArg::NodeCidr,
            "BridgeInterface" => DetectLocalModeArg::BridgeInterface,
            "InterfaceNamePrefix" => DetectLocalModeArg::InterfaceNamePrefix,
            _ => DetectLocalModeArg::ClusterCidr,
        });
    }
    if set("pod_bridge_interface") && !cfg.detect_local.bridge_interface.is_empty() {
        args.pod_bridge_interface = Some(cfg.detect_local.bridge_interface.clone());
    }
    if set("pod_interface_name_prefix") && !cfg.detect_local.interface_name_prefix.is_empty() {
        args.pod_interface_name_prefix = Some(cfg.detect_local.interface_name_prefix.clone());
    }
    if set("hostname_override") && !cfg.hostname_override.is_empty() {
        args.hostname_override = Some(cfg.hostname_override.clone());
    }
    let (masq_all, masq_bit, sync, min_sync) = if nft {
        (
            cfg.nftables.masquerade_all,
            cfg.nftables.masquerade_bit,
            cfg.nftables.sync_period,
            cfg.nftables.min_sync_period,
        )
    } else {
        (
            cfg.iptables.masquerade_all,
            cfg.iptables.masquerade_bit,
            cfg.iptables.sync_period,
            cfg.iptables.min_sync_period,
        )
    };
    if set("masquerade_all") {
        args.masquerade_all = masq_all;
    }
    if set("iptables_masquerade_bit")
        && let Some(bit) = masq_bit
    {
        args.iptables_masquerade_bit = u8::try_from(bit).context("masqueradeBit")?;
    }
    if set("iptables_sync_period") {
        args.iptables_sync_period = sync.0;
    }
    if set("iptables_min_sync_period") {
        args.iptables_min_sync_period = min_sync.0;
    }
    if set("nodeport_addresses") {
        args.nodeport_addresses = cfg.node_port_addresses.clone();
    }
    if set("iptables_localhost_nodeports")
        && let Some(v) = cfg.iptables.localhost_node_ports
    {
        args.iptables_localhost_nodeports = v;
    }
    if set("conntrack_tcp_be_liberal") {
        args.conntrack_tcp_be_liberal = cfg.conntrack.tcp_be_liberal;
    }
    // With --manifests the objects come from files; the file's kubeconfig (kubeadm's always
    // has one) is not a second source.
    if set("kubeconfig") && args.manifests.is_none() && !cfg.client_connection.kubeconfig.is_empty()
    {
        args.kubeconfig = Some(cfg.client_connection.kubeconfig.clone().into());
    }
    if set("healthz_bind_address") {
        args.healthz_bind_address = cfg.healthz_bind_address.clone();
    }
    if set("metrics_bind_address") {
        args.metrics_bind_address = cfg.metrics_bind_address.clone();
    }
    if set("bind_address_hard_fail") {
        args.bind_address_hard_fail = cfg.bind_address_hard_fail;
    }
    if set("verbosity")
        && let Some(v) = cfg
            .logging
            .get("verbosity")
            .and_then(serde_json::Value::as_u64)
    {
        args.verbosity = u8::try_from(v).unwrap_or(u8::MAX);
    }
    if set("feature_gates") {
        args.feature_gates = cfg
            .feature_gates
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
    }
    if set("bind_address") {
        let ip = cfg.bind_address.trim();
        args.bind_address = if ip.is_empty() {
            std::net::IpAddr::from([0, 0, 0, 0])
        } else {
            ip.parse()
                .map_err(|_| anyhow::anyhow!("bindAddress: {ip:?} is not an IP address"))?
        };
    }
    if set("oom_score_adj")
        && let Some(v) = cfg.oom_score_adj
    {
        args.oom_score_adj = v;
    }
    let ct = &cfg.conntrack;
    if set("conntrack_max_per_core")
        && let Some(v) = ct.max_per_core
    {
        args.conntrack_max_per_core = v;
    }
    if set("conntrack_min")
        && let Some(v) = ct.min
    {
        args.conntrack_min = v;
    }
    if set("conntrack_tcp_timeout_established")
        && let Some(v) = ct.tcp_established_timeout
    {
        args.conntrack_tcp_timeout_established = v.0;
    }
    if set("conntrack_tcp_timeout_close_wait")
        && let Some(v) = ct.tcp_close_wait_timeout
    {
        args.conntrack_tcp_timeout_close_wait = v.0;
    }
    if set("conntrack_udp_timeout") {
        args.conntrack_udp_timeout = ct.udp_timeout.0;
    }
    if set("conntrack_udp_timeout_stream") {
        args.conntrack_udp_timeout_stream = ct.udp_stream_timeout.0;
    }
    let c = &mut args.compat;
    if set("config_sync_period") {
        c.config_sync_period = cfg.config_sync_period.0;
    }
    if set("kube_api_content_type") {
        c.kube_api_content_type = cfg.client_connection.content_type.clone();
    }
    if set("kube_api_qps") {
        c.kube_api_qps = cfg.client_connection.qps;
    }
    if set("kube_api_burst") {
        c.kube_api_burst = cfg.client_connection.burst;
    }
    if set("profiling") {
        c.profiling = cfg.enable_profiling;
    }
    if set("show_hidden_metrics_for_version") {
        c.show_hidden_metrics_for_version = cfg.show_hidden_metrics_for_version.clone();
    }
    if set("proxy_port_range") {
        c.proxy_port_range = cfg.port_range.clone();
    }
    if set("udp_timeout")
        && let Some(t) = cfg.udp_idle_timeout
    {
        c.udp_timeout = t.0;
    }
    if set("ipvs_scheduler") {
        c.ipvs_scheduler = cfg.ipvs.scheduler.clone();
    }
    if set("ipvs_exclude_cidrs") {
        c.ipvs_exclude_cidrs = cfg.ipvs.exclude_cidrs.clone();
    }
    if set("ipvs_strict_arp") {
        c.ipvs_strict_arp = cfg.ipvs.strict_arp;
    }
    if set("ipvs_sync_period") {
        c.ipvs_sync_period = cfg.ipvs.sync_period.0;
    }
    if set("ipvs_min_sync_period") {
        c.ipvs_min_sync_period = cfg.ipvs.min_sync_period.0;
    }
    if set("ipvs_tcp_timeout") {
        c.ipvs_tcp_timeout = cfg.ipvs.tcp_timeout.0;
    }
    if set("ipvs_tcpfin_timeout") {
        c.ipvs_tcpfin_timeout = cfg.ipvs.tcp_fin_timeout.0;
    }
    if set("ipvs_udp_timeout") {
        c.ipvs_udp_timeout = cfg.ipvs.udp_timeout.0;
    }
    if set("logging_format")
        && let Some(f) = cfg
            .logging
            .get("format")
            .and_then(serde_json::Value::as_str)
        && !f.is_empty()
    {
        c.logging_format = f.to_string();
    }
    Ok(())
}

/// The effective configuration of `args`, for `--write-config-to`.
pub fn from_args(args: &crate::cli::ProxyArgs) -> KubeProxyConfiguration {
    use crate::cli::{DetectLocalModeArg, ProxyModeArg};
    let mut cfg = KubeProxyConfiguration {
        mode: args.proxy_mode.name().to_string(),
        cluster_cidr: args.cluster_cidr.join(","),
        hostname_override: args.hostname_override.clone().unwrap_or_default(),
        node_port_addresses: args.nodeport_addresses.clone(),
        healthz_bind_address: args.healthz_bind_address.clone(),
        metrics_bind_address: args.metrics_bind_address.clone(),
        bind_address_hard_fail: args.bind_address_hard_fail,
        detect_local_mode: match args.detect_local_mode {
            None => String::new(),
            Some(DetectLocalModeArg::ClusterCidr) => "ClusterCIDR".into(),
            Some(DetectLocalModeArg::NodeCidr) => "NodeCIDR".into(),
            Some(DetectLocalModeArg::BridgeInterface) => "BridgeInterface".into(),
            Some(DetectLocalModeArg::InterfaceNamePrefix) => "InterfaceNamePrefix".into(),
        },
        ..KubeProxyConfiguration::default()
    };
    cfg.detect_local.bridge_interface = args.pod_bridge_interface.clone().unwrap_or_default();
    cfg.detect_local.interface_name_prefix =
        args.pod_interface_name_prefix.clone().unwrap_or_default();
    cfg.client_connection.kubeconfig = args
        .kubeconfig
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    cfg.conntrack = ConntrackSection {
        max_per_core: Some(args.conntrack_max_per_core),
        min: Some(args.conntrack_min),
        tcp_established_timeout: Some(GoDuration(args.conntrack_tcp_timeout_established)),
        tcp_close_wait_timeout: Some(GoDuration(args.conntrack_tcp_timeout_close_wait)),
        tcp_be_liberal: args.conntrack_tcp_be_liberal,
        udp_timeout: GoDuration(args.conntrack_udp_timeout),
        udp_stream_timeout: GoDuration(args.conntrack_udp_timeout_stream),
    };
    cfg.feature_gates = args.feature_gates.iter().cloned().collect();
    cfg.bind_address = args.bind_address.to_string();
    cfg.oom_score_adj = Some(args.oom_score_adj);
    let c = &args.compat;
    cfg.config_sync_period = GoDuration(c.config_sync_period);
    cfg.client_connection.content_type = c.kube_api_content_type.clone();
    cfg.client_connection.qps = c.kube_api_qps;
    cfg.client_connection.burst = c.kube_api_burst;
    cfg.enable_profiling = c.profiling;
    cfg.show_hidden_metrics_for_version = c.show_hidden_metrics_for_version.clone();
    cfg.port_range = c.proxy_port_range.clone();
    cfg.udp_idle_timeout = Some(GoDuration(c.udp_timeout));
    cfg.ipvs = IpvsSection {
        sync_period: GoDuration(c.ipvs_sync_period),
        min_sync_period: GoDuration(c.ipvs_min_sync_period),
        scheduler: c.ipvs_scheduler.clone(),
        exclude_cidrs: c.ipvs_exclude_cidrs.clone(),
        strict_arp: c.ipvs_strict_arp,
        tcp_timeout: GoDuration(c.ipvs_tcp_timeout),
        tcp_fin_timeout: GoDuration(c.ipvs_tcpfin_timeout),
        udp_timeout: GoDuration(c.ipvs_udp_timeout),
    };
    let bit = Some(i32::from(args.iptables_masquerade_bit));
    let (sync, min_sync) = (
        GoDuration(args.iptables_sync_period),
        GoDuration(args.iptables_min_sync_period),
    );
    cfg.iptables = IptablesSection {
        masquerade_bit: bit,
        masquerade_all: args.masquerade_all,
        localhost_node_ports: Some(args.iptables_localhost_nodeports),
        sync_period: sync,
        min_sync_period: min_sync,
    };
    cfg.nftables.masquerade_bit = bit;
    cfg.nftables.masquerade_all = args.masquerade_all;
    cfg.nftables.sync_period = sync;
    cfg.nftables.min_sync_period = min_sync;
    if args.proxy_mode == ProxyModeArg::Iptables {
        cfg.mode = "iptables".into();
    }
    cfg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(secs(30).to_string(), "30s");
        assert_eq!(secs(90).to_string(), "1m30s");
        assert_eq!(secs(15 * 60).to_string(), "15m0s");
        assert_eq!(secs(24 * 3600).to_string(), "24h0m0s");
        assert_eq!(GoDuration(Duration::from_millis(250)).to_string(), "250ms");
        assert_eq!(GoDuration(Duration::from_millis(1500)).to_string(), "1.5s");
        assert_eq!(GoDuration(Duration::ZERO).to_string(), "0s");
    }

    #[test]
    fn upstream_style_file() {
        let text = r#"
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
bindAddress: 0.0.0.0
clientConnection:
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 5
clusterCIDR: 10.244.0.0/16
mode: "iptables"
iptables:
  masqueradeAll: false
  masqueradeBit: 14
  minSyncPeriod: 0s
  syncPeriod: 30s
nodePortAddresses: null
conntrack:
  maxPerCore: null
  tcpEstablishedTimeout: 24h0m0s
detectLocalMode: ""
"#;
        let cfg = KubeProxyConfiguration::parse(text).unwrap();
        assert_eq!(cfg.cluster_cidr, "10.244.0.0/16");
        // Upstream defaults a zero minSyncPeriod to 1s (SetDefaults_KubeProxyConfiguration).
        assert_eq!(cfg.iptables.min_sync_period, secs(1));
        assert_eq!(
            cfg.healthz_bind_address, "0.0.0.0:10256",
            "absent fields take upstream's defaults"
        );
        assert_eq!(
            cfg.client_connection.kubeconfig,
            "/var/lib/kube-proxy/kubeconfig.conf"
        );
    }

    #[test]
    fn unknown_fields_and_bad_values_are_named() {
        let base = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";
        let err = KubeProxyConfiguration::parse(&format!("{base}iptables:\n  masqueradeBitt: 3\n"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("iptables") && err.contains("masqueradeBitt"),
            "{err}"
        );
        let err = KubeProxyConfiguration::parse(&format!("{base}iptables:\n  masqueradeBit: 40\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("iptables.masqueradeBit"), "{err}");
        let err = KubeProxyConfiguration::parse(&format!("{base}mode: kernelspace\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("mode"), "{err}");
        let err = KubeProxyConfiguration::parse(&format!("{base}iptables:\n  syncPeriod: soon\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("iptables.syncPeriod"), "{err}");
        let err = KubeProxyConfiguration::parse("apiVersion: v1\nkind: ConfigMap\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("apiVersion"), "{err}");
        let err = KubeProxyConfiguration::parse(&format!("{base}clusterCIDR: 10.0.0.0/33\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("clusterCIDR"), "{err}");
    }

    #[test]
    fn written_defaults_read_back() {
        let yaml = KubeProxyConfiguration::default().to_yaml().unwrap();
        assert!(yaml.contains("syncPeriod: 30s"), "{yaml}");
        assert!(yaml.contains("configSyncPeriod: 15m0s"), "{yaml}");
        assert!(yaml.contains("healthzBindAddress: 0.0.0.0:10256"), "{yaml}");
        assert_eq!(
            KubeProxyConfiguration::parse(&yaml).unwrap(),
            KubeProxyConfiguration::default()
        );
    }

    /// The file `kubeadm init` writes into the kube-proxy ConfigMap (Kubernetes 1.31): zero
    /// values and `null`s everywhere, which upstream's defaulting fills.
    #[test]
    fn kubeadms_generated_file_is_defaulted_like_upstream() {
        let cfg = KubeProxyConfiguration::parse(include_str!("../tests/data/kubeadm-config.conf"))
            .unwrap();
        let d = KubeProxyConfiguration::default();
        assert_eq!(cfg.iptables.sync_period, secs(30));
        assert_eq!(cfg.iptables.min_sync_period, secs(1));
        assert_eq!(cfg.nftables.sync_period, d.nftables.sync_period);
        assert_eq!(cfg.config_sync_period, secs(15 * 60));
        assert_eq!(cfg.healthz_bind_address, "0.0.0.0:10256");
        assert_eq!(cfg.metrics_bind_address, "127.0.0.1:10249");
        assert_eq!(cfg.conntrack.max_per_core, Some(32768));
        assert_eq!(cfg.oom_score_adj, Some(-999));
        assert!(cfg.ipvs.exclude_cidrs.is_empty());
        assert_eq!(cfg.cluster_cidr, "10.244.0.0/16");
        assert_eq!(
            cfg.client_connection.kubeconfig,
            "/var/lib/kube-proxy/kubeconfig.conf"
        );
        assert_eq!(cfg.client_connection.qps, d.client_connection.qps);
    }
}
