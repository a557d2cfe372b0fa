//! `--config`: upstream's `KubeProxyConfiguration` file (`kubeproxy.config.k8s.io/v1alpha1`).
//!
//! The same file works with upstream kube-proxy and with kube-proxy-rs. Every field of the
//! newest v1alpha1 type is read (`k8s.io/kube-proxy` `config/v1alpha1/types.go`, and the
//! component-base `clientConnection` and `logging` sections), with upstream's names, defaults
//! (`pkg/proxy/apis/config/v1alpha1/defaults.go`) and duration format. Each field either
//! takes effect as its flag does or, when it has none here, is logged at start as having no
//! effect ([`Note::NoEffect`]), as the matching no-op flag is.
//!
//! Decoding follows upstream's `loadConfig`: a field the type does not have is not fatal
//! (upstream decodes strictly, then, on a strict-decoding error, decodes v1alpha1 leniently
//! and logs the error); it is logged as a warning naming the field's path
//! ([`Note::UnknownField`]); so is a field repeated in one mapping, whose last value is used
//! ([`Note::DuplicateField`]). A known field with a value of the wrong type, a wrong
//! `apiVersion` or `kind`, or a value out of range is an error naming the field.
//!
//! Precedence is upstream's (`cmd/kube-proxy/app/options.go` `Complete`): with `--config`
//! the file is the configuration. Of upstream's flags only `--hostname-override`, `--master`
//! and the logging flags (`-v`, `--vmodule`, `--logging-format`, `--log-flush-frequency`,
//! `--log-text-*`, `--log-json-*`) still override it; any other upstream flag given with
//! `--config` is ignored, as upstream ignores it, and logged as ignored
//! ([`Note::IgnoredFlag`]). The flags of kube-proxy-rs only (`--manifests`,
//! `--iptables-backend`, ...) have fields in a section of their own, `kubeProxyRs`
//! ([`KubeProxyRs`]), which upstream's lenient decoding skips; on the command line they
//! override the file.
//!
//! `--write-config-to` writes the effective configuration ([`from_args`]). The daemon exits
//! when the file's content changes (`crate::config_watch`), as upstream does, so a
//! ConfigMap edit rolls out by itself.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::ValueEnum;
use kp_model::Escaped;
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

/// `logging.flushFrequency` (component-base `TimeOrMetaDuration`): a duration text (`5s`)
/// or, for backwards compatibility, an integer number of nanoseconds (`5000000000`); `0`
/// means the default, 5s. Written back as a duration text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct FlushFrequency(pub GoDuration);

impl<'de> Deserialize<'de> for FlushFrequency {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = FlushFrequency;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration (\"5s\") or an integer number of nanoseconds")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<FlushFrequency, E> {
                crate::cli::parse_duration(v)
                    .map(|d| FlushFrequency(GoDuration(d)))
                    .map_err(E::custom)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<FlushFrequency, E> {
                Ok(FlushFrequency(GoDuration(Duration::from_nanos(v))))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<FlushFrequency, E> {
                u64::try_from(v)
                    .map_err(|_| E::custom(format!("invalid duration {v}: cannot be negative")))
                    .and_then(|v| self.visit_u64(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// A Kubernetes `resource.Quantity` as text (`0`, `10Mi`, `1e3`), for
/// `logging.options.*.infoBufferSize`; a plain number in the file is read as its text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Quantity(pub String);

impl Default for Quantity {
    fn default() -> Self {
        Quantity("0".into())
    }
}

impl Quantity {
    /// Whether `text` has a quantity's form: a decimal number with an optional binary
    /// (`Ki`..`Ei`) or decimal (`n`, `u`, `m`, `k`, `M`..`E`) suffix, or an exponent.
    fn is_valid(text: &str) -> bool {
        let t = text.strip_prefix(['+', '-']).unwrap_or(text);
        let digits_end = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (number, suffix) = t.split_at(digits_end);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return false;
        }
        const SUFFIXES: &[&str] = &[
            "", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E",
        ];
        if SUFFIXES.contains(&suffix) {
            return true;
        }
        let exponent = suffix.strip_prefix(['e', 'E']).unwrap_or("x");
        let exponent = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
        !exponent.is_empty() && exponent.chars().all(|c| c.is_ascii_digit())
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Quantity;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a quantity such as \"0\" or \"10Mi\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Quantity, E> {
                if Quantity::is_valid(v.trim()) {
                    Ok(Quantity(v.trim().to_string()))
                } else {
                    Err(E::custom(format!(
                        "{:?} is not a quantity (e.g. \"0\", \"64Ki\", \"10Mi\")",
                        Escaped(v)
                    )))
                }
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }
        }
        d.deserialize_any(V)
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
#[serde(rename_all = "camelCase", default)]
pub struct ClientConnection {
    /// Path to a kubeconfig file.
    pub kubeconfig: String,
    /// `acceptContentTypes` (no effect: kube-proxy-rs accepts JSON).
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

/// `logging.vmodule[]` (component-base `VModuleItem`): the `--vmodule` entry
/// `filePattern=verbosity`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct VModuleItem {
    /// `filePattern`: a base file name or glob.
    pub file_pattern: String,
    /// `verbosity`.
    pub verbosity: u32,
}

/// `logging.options.text` / `logging.options.json` (component-base
/// `OutputRoutingOptions`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct OutputRouting {
    /// `splitStream`: info to stdout, errors to stderr (`--log-*-split-stream`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub split_stream: bool,
    /// `infoBufferSize` (`--log-*-info-buffer-size`).
    pub info_buffer_size: Quantity,
}

/// `logging.options` (component-base `FormatOptions`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct FormatOptions {
    /// `text`.
    pub text: OutputRouting,
    /// `json`.
    pub json: OutputRouting,
}

/// `logging` (component-base `LoggingConfiguration`, `k8s.io/component-base/logs/api/v1`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Logging {
    /// `format`: `text` or `json` (`--logging-format`; empty means `text`).
    pub format: String,
    /// `flushFrequency` (`--log-flush-frequency`; default 5s).
    pub flush_frequency: FlushFrequency,
    /// `verbosity` (`-v`).
    pub verbosity: u32,
    /// `vmodule` (`--vmodule`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub vmodule: Vec<VModuleItem>,
    /// `options`.
    pub options: FormatOptions,
}

impl Default for Logging {
    fn default() -> Self {
        Logging {
            format: "text".into(),
            flush_frequency: FlushFrequency(secs(5)),
            verbosity: 0,
            vmodule: Vec::new(),
            options: FormatOptions::default(),
        }
    }
}

/// `iptables`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
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
#[serde(rename_all = "camelCase", default)]
pub struct NftablesSection {
    /// `masqueradeBit` (default 14).
    pub masquerade_bit: Option<i32>,
    /// `masqueradeAll`.
    pub masquerade_all: bool,
    /// `syncPeriod` (default 30s).
    pub sync_period: GoDuration,
    /// `minSyncPeriod` (default 1s).
    pub min_sync_period: GoDuration,
}

impl Default for NftablesSection {
    fn default() -> Self {
        NftablesSection {
            masquerade_bit: Some(14),
            masquerade_all: false,
            sync_period: secs(30),
            min_sync_period: secs(1),
        }
    }
}

/// `ipvs` (IPVS mode, `--ipvs-*`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct IpvsSection {
    /// `syncPeriod` (default 30s).
    pub sync_period: GoDuration,
    /// `minSyncPeriod`.
    pub min_sync_period: GoDuration,
    /// `scheduler`.
    pub scheduler: String,
    /// `excludeCIDRs`.
    #[serde(rename = "excludeCIDRs", deserialize_with = "null_as_empty")]
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
#[serde(rename_all = "camelCase", default)]
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
#[serde(rename_all = "camelCase", default)]
pub struct DetectLocal {
    /// `bridgeInterface`.
    pub bridge_interface: String,
    /// `interfaceNamePrefix`.
    pub interface_name_prefix: String,
}

/// `winkernel` (Windows only: read, and logged as having no effect when set).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
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

/// `kubeProxyRs`: the settings of kube-proxy-rs's own flags, so a DaemonSet that passes only
/// `--config` can set them. Each field is its flag's name in camelCase; an absent field
/// leaves the flag's default, and the flag given on the command line overrides the field.
/// Upstream kube-proxy reading the same file logs the section as an unknown field and
/// ignores it (its lenient v1alpha1 decoding).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeProxyRs {
    /// `iptablesBackend` (`--iptables-backend`).
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "ser_value_enum",
        deserialize_with = "de_value_enum"
    )]
    pub iptables_backend: Option<crate::cli::IptablesBackendArg>,
    /// `iptablesDispatch` (`--iptables-dispatch`).
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "ser_value_enum",
        deserialize_with = "de_value_enum"
    )]
    pub iptables_dispatch: Option<crate::cli::IptablesDispatchArg>,
    /// `iptablesZeroCountersOnFullSync` (`--iptables-zero-counters-on-full-sync`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iptables_zero_counters_on_full_sync: Option<bool>,
    /// `userspaceMaxConnections` (`--userspace-max-connections`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub userspace_max_connections: Option<usize>,
    /// `manifests` (`--manifests`): a manifest file or directory instead of the API server.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub manifests: Option<String>,
    /// `manifestGracePeriod` (`--manifest-grace-period`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub manifest_grace_period: Option<GoDuration>,
    /// `stateDir` (`--state-dir`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<String>,
}

impl KubeProxyRs {
    fn is_empty(&self) -> bool {
        *self == KubeProxyRs::default()
    }
}

/// Serializes a flag's value by its command-line name.
fn ser_value_enum<S: Serializer, T: ValueEnum>(v: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
    match v.as_ref().and_then(ValueEnum::to_possible_value) {
        Some(p) => s.serialize_str(p.get_name()),
        None => s.serialize_none(),
    }
}

/// Reads a flag's value by its command-line name; the error lists the names.
fn de_value_enum<'de, D: Deserializer<'de>, T: ValueEnum>(d: D) -> Result<Option<T>, D::Error> {
    let text = String::deserialize(d)?;
    T::from_str(text.trim(), false).map(Some).map_err(|_| {
        let names: Vec<String> = T::value_variants()
            .iter()
            .filter_map(|v| v.to_possible_value().map(|p| p.get_name().to_string()))
            .collect();
        serde::de::Error::custom(format!(
            "{:?} is not one of {}",
            Escaped(&text),
            names.join(", ")
        ))
    })
}

/// A `KubeProxyConfiguration` document with upstream's defaults for absent fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeProxyConfiguration {
    /// `apiVersion`: must be `kubeproxy.config.k8s.io/v1alpha1`.
    pub api_version: String,
    /// `kind`: must be `KubeProxyConfiguration`.
    pub kind: String,
    /// `featureGates` (`--feature-gates`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub feature_gates: BTreeMap<String, bool>,
    /// `clientConnection`.
    pub client_connection: ClientConnection,
    /// `logging`.
    pub logging: Logging,
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
    /// `enableProfiling` (no pprof in kube-proxy-rs).
    pub enable_profiling: bool,
    /// `showHiddenMetricsForVersion`.
    pub show_hidden_metrics_for_version: String,
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
    /// `portRange` ("now unused" upstream; userspace mode's proxy ports here).
    pub port_range: String,
    /// `windowsRunAsService` (Windows only).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub windows_run_as_service: bool,
    /// `udpIdleTimeout`: removed from upstream's type with its userspace mode (1.26); read
    /// here for userspace mode (`--udp-timeout`, default 250ms).
    pub udp_idle_timeout: Option<GoDuration>,
    /// `kubeProxyRs`: kube-proxy-rs's own settings.
    #[serde(skip_serializing_if = "KubeProxyRs::is_empty")]
    pub kube_proxy_rs: KubeProxyRs,
}

impl Default for KubeProxyConfiguration {
    fn default() -> Self {
        KubeProxyConfiguration {
            api_version: API_VERSION.into(),
            kind: KIND.into(),
            feature_gates: BTreeMap::new(),
            client_connection: ClientConnection::default(),
            logging: Logging::default(),
            hostname_override: String::new(),
            bind_address: "0.0.0.0".into(),
            healthz_bind_address: "0.0.0.0:10256".into(),
            metrics_bind_address: "127.0.0.1:10249".into(),
            bind_address_hard_fail: false,
            enable_profiling: false,
            show_hidden_metrics_for_version: String::new(),
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
            windows_run_as_service: false,
            udp_idle_timeout: None,
            kube_proxy_rs: KubeProxyRs::default(),
        }
    }
}

/// Something the configuration file or the command line beside it calls for a log line at
/// start (the file is read before logging is set up, so these are logged afterwards with
/// [`Note::log`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// A field that neither v1alpha1 nor [`KubeProxyRs`] has, by its path
    /// (`iptables.masqueradeBitt`): ignored, as upstream's lenient decoding ignores it.
    UnknownField {
        /// The field's path in the file.
        path: String,
    },
    /// A field given twice in one mapping (the first one found): the last value is used, as
    /// upstream's lenient decoding does after its strict decoding rejects the repetition.
    DuplicateField {
        /// The repeated key.
        key: String,
    },
    /// An upstream flag given on the command line with `--config`: ignored, as upstream
    /// ignores it; `field` is where the file sets it.
    IgnoredFlag {
        /// The flag (`--proxy-mode`).
        flag: &'static str,
        /// The config field (`mode`).
        field: &'static str,
    },
    /// A field set to a value other than its default that has no effect in kube-proxy-rs.
    NoEffect {
        /// The field's path.
        field: &'static str,
        /// Why, in a few words.
        why: &'static str,
    },
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Note::UnknownField { path } => write!(
                f,
                "unknown field \"{}\" in the configuration file: ignored, as kube-proxy's \
                 lenient decoding of v1alpha1 ignores it (check its spelling and indentation)",
                Escaped(path)
            ),
            Note::DuplicateField { key } => write!(
                f,
                "field \"{}\" appears twice in one mapping of the configuration file: the last \
                 value is used, as kube-proxy's lenient decoding of v1alpha1 does",
                Escaped(key)
            ),
            Note::IgnoredFlag { flag, field } => write!(
                f,
                "{flag} is ignored: with --config, the configuration comes from the file \
                 (field {field}), as in kube-proxy; only --hostname-override, --master, the \
                 logging flags and kube-proxy-rs's own flags override it"
            ),
            Note::NoEffect { field, why } => write!(
                f,
                "config field {field} accepted for compatibility with kube-proxy; it has no \
                 effect in kube-proxy-rs: {why}"
            ),
        }
    }
}

impl Note {
    /// Logs the note: a warning, or for [`Note::NoEffect`] an info line (as the no-op flags'
    /// lines). `file` is the `--config` path.
    pub fn log(&self, file: &Path) {
        let file = file.display().to_string();
        match self {
            Note::NoEffect { field, .. } => {
                tracing::info!(config = %Escaped(&file), field = *field, "{self}")
            }
            _ => tracing::warn!(config = %Escaped(&file), "{self}"),
        }
    }
}

/// The `--config` file as read at start: its path, its bytes (the daemon exits when they
/// change; see `crate::config_watch`) and the notes to log.
#[derive(Debug, Clone, Default)]
pub struct Loaded {
    /// The path given to `--config`.
    pub path: PathBuf,
    /// The bytes that were parsed.
    pub content: Vec<u8>,
    /// What to log once logging is set up.
    pub notes: Vec<Note>,
}

impl KubeProxyConfiguration {
    /// Reads and validates a config file (YAML or JSON); returns it with its bytes and the
    /// unknown fields it has ([`Note::UnknownField`]).
    ///
    /// # Errors
    /// The file cannot be read; it does not parse; a field has the wrong type (the error
    /// names the field's path, e.g. `iptables.masqueradeBit`); `apiVersion` or `kind` is
    /// wrong; a value is out of range.
    pub fn load(path: &Path) -> anyhow::Result<(Self, Loaded)> {
        let content =
            std::fs::read(path).with_context(|| format!("--config {}", path.display()))?;
        let text = String::from_utf8_lossy(&content);
        let (cfg, notes) =
            Self::parse(&text).with_context(|| format!("--config {}", path.display()))?;
        let loaded = Loaded {
            path: path.to_path_buf(),
            content,
            notes,
        };
        Ok((cfg, loaded))
    }

    /// Parses and validates config text; returns the configuration and one
    /// [`Note::UnknownField`] per field it does not know, sorted by path (after a
    /// [`Note::DuplicateField`] when a mapping repeats a key: the last value is used).
    ///
    /// # Errors
    /// As [`load`](Self::load).
    pub fn parse(text: &str) -> anyhow::Result<(Self, Vec<Note>)> {
        let mut unknown = Vec::new();
        let mut value: serde_json::Value = match serde_saphyr::from_str(text) {
            Ok(v) => v,
            // Upstream's strict decoding rejects a repeated field, and its lenient decoding
            // keeps the last value: so here, with a warning.
            Err(e) => match e.without_snippet() {
                serde_saphyr::Error::DuplicateMappingKey { key, .. } => {
                    unknown.push(Note::DuplicateField {
                        key: key.clone().unwrap_or_default(),
                    });
                    let options = serde_saphyr::options! {
                        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::LastWins,
                    };
                    serde_saphyr::from_str_with_options(text, options)
                        .map_err(|e| anyhow::anyhow!("cannot parse YAML: {e}"))?
                }
                _ => bail!("cannot parse YAML: {e}"),
            },
        };
        strip_nulls(&mut value);
        let mut record = |path: serde_ignored::Path<'_>| {
            unknown.push(Note::UnknownField {
                path: path.to_string(),
            })
        };
        let lenient = serde_ignored::Deserializer::new(value, &mut record);
        let mut cfg: KubeProxyConfiguration =
            serde_path_to_error::deserialize(lenient).map_err(|e| {
                let path = e.path().to_string();
                anyhow::anyhow!("{}: {}", Escaped(&path), e.into_inner())
            })?;
        cfg.apply_defaults();
        cfg.validate()?;
        Ok((cfg, unknown))
    }

    /// Upstream's defaulting of zero values (`SetDefaults_KubeProxyConfiguration`, and
    /// component-base's for `logging`): a sync period of `0s`, an empty bind address, an
    /// empty content type, a zero QPS or flush frequency in the file mean "the default", as
    /// kubeadm's generated file relies on (it writes `iptables.syncPeriod: 0s`,
    /// `healthzBindAddress: ""`, `logging.flushFrequency: 0`, ...).
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
        zero(
            &mut self.logging.flush_frequency.0,
            &d.logging.flush_frequency.0,
        );
        for (v, default) in [
            (&mut self.bind_address, &d.bind_address),
            (&mut self.healthz_bind_address, &d.healthz_bind_address),
            (&mut self.metrics_bind_address, &d.metrics_bind_address),
            (
                &mut self.client_connection.content_type,
                &d.client_connection.content_type,
            ),
            (&mut self.logging.format, &d.logging.format),
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
                Escaped(&self.api_version)
            );
        }
        if self.kind != KIND {
            bail!(
                "kind: {:?} is not supported (expected {KIND})",
                Escaped(&self.kind)
            );
        }
        if !matches!(
            self.mode.as_str(),
            "" | "iptables" | "nftables" | "ipvs" | "userspace"
        ) {
            bail!(
                "mode: {:?} is not a proxy mode (iptables, nftables, ipvs or userspace)",
                Escaped(&self.mode)
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
                Escaped(&self.detect_local_mode)
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
                bail!("clusterCIDR: entry {i} {:?} is not a CIDR", Escaped(c));
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
            bail!(
                "bindAddress: {:?} is not an IP address",
                Escaped(&self.bind_address)
            );
        }
        kp_proxier::NodePortAddresses::parse(&self.node_port_addresses)
            .map_err(|e| anyhow::anyhow!("nodePortAddresses: {e}"))?;
        if !matches!(self.logging.format.as_str(), "text" | "json") {
            bail!(
                "logging.format: {:?} is not a log format (text or json)",
                Escaped(&self.logging.format)
            );
        }
        for (i, item) in self.logging.vmodule.iter().enumerate() {
            if item.file_pattern.is_empty()
                || item.file_pattern.contains([',', '='])
                || item.file_pattern.chars().any(char::is_control)
            {
                bail!(
                    "logging.vmodule[{i}].filePattern: {:?} must be a non-empty file name or \
                     glob without ',' or '='",
                    Escaped(&item.file_pattern)
                );
            }
        }
        if self.kube_proxy_rs.userspace_max_connections == Some(0) {
            bail!("kubeProxyRs.userspaceMaxConnections: must be greater than 0");
        }
        Ok(())
    }

    /// The configuration as a YAML document, like upstream's `--write-config-to`.
    ///
    /// # Errors
    /// Serialization failure (not expected).
    pub fn to_yaml(&self) -> anyhow::Result<String> {
        serde_saphyr::to_string(self).map_err(|e| anyhow::anyhow!("writing the configuration: {e}"))
    }

    /// [`Note::NoEffect`] for each field without effect here that the file sets to a value
    /// other than its default. A field whose flag is a no-op is reported only while that flag
    /// is one ([`crate::cli::CompatArgs::FLAGS`]), so a flag that gains an effect takes its
    /// field along.
    fn no_effect_notes(&self) -> Vec<Note> {
        let d = KubeProxyConfiguration::default();
        let noop_flag = |id: &str| crate::cli::CompatArgs::FLAGS.iter().any(|(i, _)| *i == id);
        let (cc, dc) = (&self.client_connection, &d.client_connection);
        let (lo, dl) = (&self.logging, &d.logging);
        let with_flag: [(&'static str, &'static str, bool, &'static str); 13] = [
            (
                "configSyncPeriod",
                "config_sync_period",
                self.config_sync_period != d.config_sync_period,
                "objects are watched, there is no periodic relist",
            ),
            (
                "clientConnection.contentType",
                "kube_api_content_type",
                cc.content_type != dc.content_type,
                "kube-proxy-rs speaks JSON",
            ),
            (
                "clientConnection.qps",
                "kube_api_qps",
                cc.qps != dc.qps,
                "only lists and watches are sent",
            ),
            (
                "clientConnection.burst",
                "kube_api_burst",
                cc.burst != dc.burst,
                "only lists and watches are sent",
            ),
            (
                "enableProfiling",
                "profiling",
                self.enable_profiling,
                "no pprof",
            ),
            (
                "showHiddenMetricsForVersion",
                "show_hidden_metrics_for_version",
                !self.show_hidden_metrics_for_version.is_empty(),
                "no metric is hidden",
            ),
            (
                "logging.format",
                "logging_format",
                lo.format != dl.format,
                "logs stay text",
            ),
            (
                "logging.flushFrequency",
                "log_flush_frequency",
                lo.flush_frequency != dl.flush_frequency,
                "logs are not buffered",
            ),
            (
                "logging.vmodule",
                "vmodule",
                !lo.vmodule.is_empty(),
                "use RUST_LOG (e.g. RUST_LOG=kp_proxier=trace)",
            ),
            (
                "logging.options.text.splitStream",
                "log_text_split_stream",
                lo.options.text.split_stream,
                "logs go to stderr",
            ),
            (
                "logging.options.text.infoBufferSize",
                "log_text_info_buffer_size",
                lo.options.text.info_buffer_size != dl.options.text.info_buffer_size,
                "logs are not buffered",
            ),
            (
                "logging.options.json.splitStream",
                "log_json_split_stream",
                lo.options.json.split_stream,
                "logs go to stderr",
            ),
            (
                "logging.options.json.infoBufferSize",
                "log_json_info_buffer_size",
                lo.options.json.info_buffer_size != dl.options.json.info_buffer_size,
                "logs are not buffered",
            ),
        ];
        let mut notes: Vec<Note> = with_flag
            .into_iter()
            .filter(|(_, id, set, _)| *set && noop_flag(id))
            .map(|(field, _, _, why)| Note::NoEffect { field, why })
            .collect();
        let w = &self.winkernel;
        for (field, set) in [
            (
                "clientConnection.acceptContentTypes",
                !cc.accept_content_types.is_empty(),
            ),
            ("winkernel.networkName", !w.network_name.is_empty()),
            ("winkernel.sourceVip", !w.source_vip.is_empty()),
            ("winkernel.enableDSR", w.enable_dsr),
            (
                "winkernel.rootHnsEndpointName",
                !w.root_hns_endpoint_name.is_empty(),
            ),
            (
                "winkernel.forwardHealthCheckVip",
                w.forward_health_check_vip,
            ),
            ("windowsRunAsService", self.windows_run_as_service),
        ] {
            if set {
                let why = if field.starts_with("clientConnection") {
                    "kube-proxy-rs accepts JSON"
                } else {
                    "Windows only"
                };
                notes.push(Note::NoEffect { field, why });
            }
        }
        notes
    }
}

/// Upstream's flags that map to a config field, with that field: given on the command line
/// with `--config`, each is ignored ([`Note::IgnoredFlag`]). Not here: the flags upstream
/// honours over the file (`--hostname-override`, `--master`, the logging flags), the run
/// modes (`--cleanup`, `--init-only`, `--write-config-to`), klog's flags (no effect either
/// way) and kube-proxy-rs's own flags (a unit test checks that every flag is in this table
/// or in that list).
pub const FILE_WINS: &[(&str, &str, &str)] = &[
    ("proxy_mode", "--proxy-mode", "mode"),
    ("kubeconfig", "--kubeconfig", "clientConnection.kubeconfig"),
    (
        "kube_api_content_type",
        "--kube-api-content-type",
        "clientConnection.contentType",
    ),
    ("kube_api_qps", "--kube-api-qps", "clientConnection.qps"),
    (
        "kube_api_burst",
        "--kube-api-burst",
        "clientConnection.burst",
    ),
    ("cluster_cidr", "--cluster-cidr", "clusterCIDR"),
    (
        "detect_local_mode",
        "--detect-local-mode",
        "detectLocalMode",
    ),
    (
        "pod_bridge_interface",
        "--pod-bridge-interface",
        "detectLocal.bridgeInterface",
    ),
    (
        "pod_interface_name_prefix",
        "--pod-interface-name-prefix",
        "detectLocal.interfaceNamePrefix",
    ),
    (
        "masquerade_all",
        "--masquerade-all",
        "iptables.masqueradeAll / nftables.masqueradeAll",
    ),
    (
        "iptables_masquerade_bit",
        "--iptables-masquerade-bit",
        "iptables.masqueradeBit / nftables.masqueradeBit",
    ),
    (
        "iptables_sync_period",
        "--iptables-sync-period",
        "iptables.syncPeriod / nftables.syncPeriod",
    ),
    (
        "iptables_min_sync_period",
        "--iptables-min-sync-period",
        "iptables.minSyncPeriod / nftables.minSyncPeriod",
    ),
    (
        "iptables_localhost_nodeports",
        "--iptables-localhost-nodeports",
        "iptables.localhostNodePorts",
    ),
    (
        "nodeport_addresses",
        "--nodeport-addresses",
        "nodePortAddresses",
    ),
    (
        "healthz_bind_address",
        "--healthz-bind-address",
        "healthzBindAddress",
    ),
    (
        "metrics_bind_address",
        "--metrics-bind-address",
        "metricsBindAddress",
    ),
    ("healthz_port", "--healthz-port", "healthzBindAddress"),
    ("metrics_port", "--metrics-port", "metricsBindAddress"),
    (
        "bind_address_hard_fail",
        "--bind-address-hard-fail",
        "bindAddressHardFail",
    ),
    ("bind_address", "--bind-address", "bindAddress"),
    ("feature_gates", "--feature-gates", "featureGates"),
    ("oom_score_adj", "--oom-score-adj", "oomScoreAdj"),
    (
        "conntrack_max_per_core",
        "--conntrack-max-per-core",
        "conntrack.maxPerCore",
    ),
    ("conntrack_min", "--conntrack-min", "conntrack.min"),
    (
        "conntrack_tcp_timeout_established",
        "--conntrack-tcp-timeout-established",
        "conntrack.tcpEstablishedTimeout",
    ),
    (
        "conntrack_tcp_timeout_close_wait",
        "--conntrack-tcp-timeout-close-wait",
        "conntrack.tcpCloseWaitTimeout",
    ),
    (
        "conntrack_tcp_be_liberal",
        "--conntrack-tcp-be-liberal",
        "conntrack.tcpBeLiberal",
    ),
    (
        "conntrack_udp_timeout",
        "--conntrack-udp-timeout",
        "conntrack.udpTimeout",
    ),
    (
        "conntrack_udp_timeout_stream",
        "--conntrack-udp-timeout-stream",
        "conntrack.udpStreamTimeout",
    ),
    (
        "config_sync_period",
        "--config-sync-period",
        "configSyncPeriod",
    ),
    ("profiling", "--profiling", "enableProfiling"),
    (
        "show_hidden_metrics_for_version",
        "--show-hidden-metrics-for-version",
        "showHiddenMetricsForVersion",
    ),
    ("proxy_port_range", "--proxy-port-range", "portRange"),
    ("udp_timeout", "--udp-timeout", "udpIdleTimeout"),
    ("ipvs_scheduler", "--ipvs-scheduler", "ipvs.scheduler"),
    (
        "ipvs_exclude_cidrs",
        "--ipvs-exclude-cidrs",
        "ipvs.excludeCIDRs",
    ),
    ("ipvs_strict_arp", "--ipvs-strict-arp", "ipvs.strictARP"),
    ("ipvs_sync_period", "--ipvs-sync-period", "ipvs.syncPeriod"),
    (
        "ipvs_min_sync_period",
        "--ipvs-min-sync-period",
        "ipvs.minSyncPeriod",
    ),
    ("ipvs_tcp_timeout", "--ipvs-tcp-timeout", "ipvs.tcpTimeout"),
    (
        "ipvs_tcpfin_timeout",
        "--ipvs-tcpfin-timeout",
        "ipvs.tcpFinTimeout",
    ),
    ("ipvs_udp_timeout", "--ipvs-udp-timeout", "ipvs.udpTimeout"),
];

/// Applies the config file to `args` as upstream does with `--config` (see the module doc):
/// the file's value for every upstream setting, except that `--hostname-override` and the
/// logging flags given on the command line win (`explicit(id)` tells whether the flag with
/// clap id `id` was), and kube-proxy-rs's own flags given on the command line win over
/// `kubeProxyRs`. Mode-specific sections follow the mode, as upstream's conversion: sync
/// periods and masquerading from `nftables.*` in nftables mode, `iptables.*` otherwise (IPVS
/// mode's periods from `ipvs.*`). Returns the notes to log: the upstream flags ignored
/// ([`Note::IgnoredFlag`]) and the fields set that have no effect ([`Note::NoEffect`]).
///
/// # Errors
/// A value the flags cannot hold (not expected after [`KubeProxyConfiguration::validate`]).
pub fn apply(
    cfg: &KubeProxyConfiguration,
    args: &mut crate::cli::ProxyArgs,
    explicit: impl Fn(&str) -> bool,
) -> anyhow::Result<Vec<Note>> {
    use crate::cli::{DetectLocalModeArg, ProxyModeArg};
    let mut notes: Vec<Note> = FILE_WINS
        .iter()
        .filter(|(id, _, _)| explicit(id))
        .map(|(_, flag, field)| Note::IgnoredFlag { flag, field })
        .collect();
    notes.extend(cfg.no_effect_notes());

    // kube-proxy-rs's own settings: the command line wins.
    let ours = |id: &str| !explicit(id);
    let k = &cfg.kube_proxy_rs;
    if ours("iptables_backend")
        && let Some(v) = k.iptables_backend
    {
        args.iptables_backend = v;
    }
    if ours("iptables_dispatch")
        && let Some(v) = k.iptables_dispatch
    {
        args.iptables_dispatch = v;
    }
    if ours("iptables_zero_counters_on_full_sync")
        && let Some(v) = k.iptables_zero_counters_on_full_sync
    {
        args.iptables_zero_counters_on_full_sync = v;
    }
    if ours("userspace_max_connections")
        && let Some(v) = k.userspace_max_connections
    {
        args.compat.userspace_max_connections = v;
    }
    if ours("manifests")
        && let Some(v) = &k.manifests
    {
        args.manifests = Some(v.into());
    }
    if ours("manifest_grace_period")
        && let Some(v) = k.manifest_grace_period
    {
        args.manifest_grace_period = v.0;
    }
    if ours("state_dir")
        && let Some(v) = &k.state_dir
    {
        args.state_dir.clone_from(v);
    }

    // Upstream's settings: the file's.
    args.proxy_mode = match cfg.mode.as_str() {
        "" | "iptables" => ProxyModeArg::Iptables,
        "nftables" => ProxyModeArg::Nftables,
        "userspace" => ProxyModeArg::Userspace,
        _ => ProxyModeArg::Ipvs,
    };
    let nft = args.proxy_mode == ProxyModeArg::Nftables;
    args.cluster_cidr = cfg
        .cluster_cidr
        .split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(String::from)
        .collect();
    args.detect_local_mode = match cfg.detect_local_mode.as_str() {
        "" => None,
        "NodeCIDR" => Some(DetectLocalModeArg::NodeCidr),
        "BridgeInterface" => Some(DetectLocalModeArg::BridgeInterface),
        "InterfaceNamePrefix" => Some(DetectLocalModeArg::InterfaceNamePrefix),
        _ => Some(DetectLocalModeArg::ClusterCidr),
    };
    let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_string());
    args.pod_bridge_interface = non_empty(&cfg.detect_local.bridge_interface);
    args.pod_interface_name_prefix = non_empty(&cfg.detect_local.interface_name_prefix);
    if !explicit("hostname_override") {
        args.hostname_override = non_empty(&cfg.hostname_override);
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
    args.masquerade_all = masq_all;
    args.iptables_masquerade_bit = u8::try_from(masq_bit.unwrap_or(14)).context("masqueradeBit")?;
    args.iptables_sync_period = sync.0;
    args.iptables_min_sync_period = min_sync.0;
    args.nodeport_addresses = cfg.node_port_addresses.clone();
    args.iptables_localhost_nodeports = cfg.iptables.localhost_node_ports.unwrap_or(true);
    // With --manifests the objects come from files; the file's kubeconfig (kubeadm's always
    // has one) is not a second source.
    args.kubeconfig = (args.manifests.is_none() && !cfg.client_connection.kubeconfig.is_empty())
        .then(|| cfg.client_connection.kubeconfig.clone().into());
    args.healthz_bind_address = cfg.healthz_bind_address.clone();
    args.metrics_bind_address = cfg.metrics_bind_address.clone();
    // Upstream applies the deprecated ports only without a config file.
    args.healthz_port = None;
    args.metrics_port = None;
    args.bind_address_hard_fail = cfg.bind_address_hard_fail;
    args.feature_gates = cfg
        .feature_gates
        .iter()
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    let ip = cfg.bind_address.trim();
    args.bind_address = if ip.is_empty() {
        std::net::IpAddr::from([0, 0, 0, 0])
    } else {
        ip.parse()
            .map_err(|_| anyhow::anyhow!("bindAddress: {:?} is not an IP address", Escaped(ip)))?
    };
    let ct = &cfg.conntrack;
    let dct = ConntrackSection::default();
    args.oom_score_adj = cfg.oom_score_adj.unwrap_or(-999);
    args.conntrack_max_per_core = ct.max_per_core.or(dct.max_per_core).unwrap_or_default();
    args.conntrack_min = ct.min.or(dct.min).unwrap_or_default();
    args.conntrack_tcp_timeout_established = ct
        .tcp_established_timeout
        .or(dct.tcp_established_timeout)
        .unwrap_or_default()
        .0;
    args.conntrack_tcp_timeout_close_wait = ct
        .tcp_close_wait_timeout
        .or(dct.tcp_close_wait_timeout)
        .unwrap_or_default()
        .0;
    args.conntrack_tcp_be_liberal = ct.tcp_be_liberal;
    args.conntrack_udp_timeout = ct.udp_timeout.0;
    args.conntrack_udp_timeout_stream = ct.udp_stream_timeout.0;
    let c = &mut args.compat;
    c.config_sync_period = cfg.config_sync_period.0;
    c.kube_api_content_type = cfg.client_connection.content_type.clone();
    c.kube_api_qps = cfg.client_connection.qps;
    c.kube_api_burst = cfg.client_connection.burst;
    c.profiling = cfg.enable_profiling;
    c.show_hidden_metrics_for_version = cfg.show_hidden_metrics_for_version.clone();
    c.proxy_port_range = cfg.port_range.clone();
    c.udp_timeout = cfg
        .udp_idle_timeout
        .map_or(Duration::from_millis(250), |t| t.0);
    c.ipvs_scheduler = cfg.ipvs.scheduler.clone();
    c.ipvs_exclude_cidrs = cfg.ipvs.exclude_cidrs.clone();
    c.ipvs_strict_arp = cfg.ipvs.strict_arp;
    c.ipvs_sync_period = cfg.ipvs.sync_period.0;
    c.ipvs_min_sync_period = cfg.ipvs.min_sync_period.0;
    c.ipvs_tcp_timeout = cfg.ipvs.tcp_timeout.0;
    c.ipvs_tcpfin_timeout = cfg.ipvs.tcp_fin_timeout.0;
    c.ipvs_udp_timeout = cfg.ipvs.udp_timeout.0;

    // Logging: the command line wins, as upstream's copyLogsFromFlags (--vmodule entries
    // are added to the file's).
    let lo = &cfg.logging;
    if !explicit("verbosity") {
        args.verbosity = u8::try_from(lo.verbosity).unwrap_or(u8::MAX);
    }
    let c = &mut args.compat;
    if !explicit("logging_format") {
        c.logging_format.clone_from(&lo.format);
    }
    if !explicit("log_flush_frequency") {
        c.log_flush_frequency = lo.flush_frequency.0.0;
    }
    let mut vmodule: Vec<String> = lo
        .vmodule
        .iter()
        .map(|i| format!("{}={}", i.file_pattern, i.verbosity))
        .collect();
    if explicit("vmodule") {
        vmodule.append(&mut c.vmodule);
    }
    c.vmodule = vmodule;
    let (text, json) = (&lo.options.text, &lo.options.json);
    if !explicit("log_text_split_stream") {
        c.log_text_split_stream = text.split_stream;
    }
    if !explicit("log_text_info_buffer_size") {
        c.log_text_info_buffer_size
            .clone_from(&text.info_buffer_size.0);
    }
    if !explicit("log_json_split_stream") {
        c.log_json_split_stream = json.split_stream;
    }
    if !explicit("log_json_info_buffer_size") {
        c.log_json_info_buffer_size
            .clone_from(&json.info_buffer_size.0);
    }
    Ok(notes)
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
    cfg.logging = Logging {
        format: c.logging_format.clone(),
        flush_frequency: FlushFrequency(GoDuration(c.log_flush_frequency)),
        verbosity: u32::from(args.verbosity),
        vmodule: c
            .vmodule
            .iter()
            .filter_map(|v| {
                let (pattern, level) = v.split_once('=')?;
                Some(VModuleItem {
                    file_pattern: pattern.trim().to_string(),
                    verbosity: level.trim().parse().ok()?,
                })
            })
            .collect(),
        options: FormatOptions {
            text: OutputRouting {
                split_stream: c.log_text_split_stream,
                info_buffer_size: Quantity(c.log_text_info_buffer_size.clone()),
            },
            json: OutputRouting {
                split_stream: c.log_json_split_stream,
                info_buffer_size: Quantity(c.log_json_info_buffer_size.clone()),
            },
        },
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
    // kube-proxy-rs's own settings, where they differ from their flags' defaults.
    let defaults = <crate::cli::Cli as clap::Parser>::parse_from(["kube-proxy-rs"]).proxy;
    cfg.kube_proxy_rs = KubeProxyRs {
        iptables_backend: (args.iptables_backend != defaults.iptables_backend)
            .then_some(args.iptables_backend),
        iptables_dispatch: (args.iptables_dispatch != defaults.iptables_dispatch)
            .then_some(args.iptables_dispatch),
        iptables_zero_counters_on_full_sync: (args.iptables_zero_counters_on_full_sync
            != defaults.iptables_zero_counters_on_full_sync)
            .then_some(args.iptables_zero_counters_on_full_sync),
        userspace_max_connections: (c.userspace_max_connections
            != defaults.compat.userspace_max_connections)
            .then_some(c.userspace_max_connections),
        manifests: args.manifests.as_ref().map(|p| p.display().to_string()),
        manifest_grace_period: (args.manifest_grace_period != defaults.manifest_grace_period)
            .then_some(GoDuration(args.manifest_grace_period)),
        state_dir: (args.state_dir != defaults.state_dir).then(|| args.state_dir.clone()),
    };
    cfg
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(text: &str) -> KubeProxyConfiguration {
        let (cfg, notes) = KubeProxyConfiguration::parse(text).unwrap();
        assert!(notes.is_empty(), "{notes:?}");
        cfg
    }

    fn err(text: &str) -> String {
        format!("{:#}", KubeProxyConfiguration::parse(text).unwrap_err())
    }

    const BASE: &str =
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";

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
        let cfg = parse(
            r#"
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
"#,
        );
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

    /// Upstream decodes v1alpha1 leniently after a strict-decoding error: an unknown field is
    /// a note naming its path, and decoding goes on. A known field with a bad value stays an
    /// error naming the field.
    #[test]
    fn unknown_fields_are_notes_and_bad_values_errors() {
        let (cfg, notes) = KubeProxyConfiguration::parse(&format!(
            "{BASE}iptables:\n  masqueradeBitt: 3\n  masqueradeBit: 5\nfutureTopLevel: {{a: 1}}\n\
             logging:\n  vmodule:\n  - filePattern: x\n    verbosity: 2\n    color: red\n\
             kubeProxyRs:\n  iptablesBackendd: nft\n"
        ))
        .unwrap();
        assert_eq!(cfg.iptables.masquerade_bit, Some(5), "decoding went on");
        let paths: Vec<String> = notes
            .iter()
            .map(|n| match n {
                Note::UnknownField { path } => path.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            paths,
            [
                "futureTopLevel",
                "iptables.masqueradeBitt",
                "kubeProxyRs.iptablesBackendd",
                "logging.vmodule.0.color",
            ]
        );
        // The field names an operator wrote are shown escaped: no forged log line.
        let (_, notes) =
            KubeProxyConfiguration::parse(&format!("{BASE}\"evil\\nERROR forged\": 1\n")).unwrap();
        let line = notes[0].to_string();
        assert!(
            line.contains(r#"unknown field "evil\nERROR forged""#) && !line.contains('\n'),
            "{line}"
        );

        for (text, field) in [
            ("iptables:\n  masqueradeBit: 40\n", "iptables.masqueradeBit"),
            (
                "iptables:\n  masqueradeBit: many\n",
                "iptables.masqueradeBit",
            ),
            ("mode: kernelspace\n", "mode"),
            ("iptables:\n  syncPeriod: soon\n", "iptables.syncPeriod"),
            ("clusterCIDR: 10.0.0.0/33\n", "clusterCIDR"),
            ("logging:\n  verbosity: loud\n", "logging.verbosity"),
            ("logging:\n  format: xml\n", "logging.format"),
            ("logging:\n  flushFrequency: -3\n", "logging.flushFrequency"),
            (
                "logging:\n  options:\n    json:\n      infoBufferSize: lots\n",
                "logging.options.json.infoBufferSize",
            ),
            (
                "logging:\n  vmodule:\n  - filePattern: a=b\n",
                "logging.vmodule[0].filePattern",
            ),
            ("windowsRunAsService: sometimes\n", "windowsRunAsService"),
            ("featureGates:\n  X: maybe\n", "featureGates.X"),
            (
                "kubeProxyRs:\n  iptablesBackend: fast\n",
                "kubeProxyRs.iptablesBackend",
            ),
            (
                "kubeProxyRs:\n  userspaceMaxConnections: 0\n",
                "kubeProxyRs.userspaceMaxConnections",
            ),
        ] {
            let e = err(&format!("{BASE}{text}"));
            assert!(e.contains(field), "{text:?}: {e}");
        }
        let e = err(&format!("{BASE}kubeProxyRs:\n  iptablesBackend: fast\n"));
        assert!(e.contains("auto, nft, legacy"), "{e}");
        let e = err("apiVersion: v1\nkind: ConfigMap\n");
        assert!(e.contains("apiVersion"), "{e}");

        // A repeated field: the last value, with a note, as upstream's lenient decoding.
        let (cfg, notes) = KubeProxyConfiguration::parse(&format!(
            "{BASE}mode: iptables\nclusterCIDR: 10.0.0.0/16\nmode: nftables\n"
        ))
        .unwrap();
        assert_eq!(cfg.mode, "nftables");
        assert_eq!(notes, [Note::DuplicateField { key: "mode".into() }]);
    }

    #[test]
    fn written_defaults_read_back() {
        let yaml = KubeProxyConfiguration::default().to_yaml().unwrap();
        assert!(yaml.contains("syncPeriod: 30s"), "{yaml}");
        assert!(yaml.contains("configSyncPeriod: 15m0s"), "{yaml}");
        assert!(yaml.contains("healthzBindAddress: 0.0.0.0:10256"), "{yaml}");
        assert!(yaml.contains("flushFrequency: 5s"), "{yaml}");
        assert!(
            !yaml.contains("kubeProxyRs") && !yaml.contains("windowsRunAsService"),
            "nothing of ours or Windows' when nothing is set: {yaml}"
        );
        assert_eq!(parse(&yaml), KubeProxyConfiguration::default());
    }

    /// The file `kubeadm init` writes into the kube-proxy ConfigMap: zero values and `null`s
    /// everywhere, which upstream's defaulting fills; nothing in it is unknown or noted.
    #[test]
    fn kubeadms_generated_file_is_defaulted_like_upstream() {
        let cfg = parse(include_str!("../tests/data/kubeadm-config.conf"));
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
        assert_eq!(cfg.logging, d.logging, "flushFrequency: 0 is the default");
        assert!(
            cfg.no_effect_notes().is_empty(),
            "{:?}",
            cfg.no_effect_notes()
        );
    }

    /// The flags that keep their command-line value beside `--config` (clap ids): upstream's
    /// `--hostname-override`, `--master` and logging flags, the run modes, klog's flags (no
    /// effect either way), and kube-proxy-rs's own flags (over their `kubeProxyRs` field). Every
    /// other flag is in [`FILE_WINS`]; the test below checks it.
    const COMMAND_LINE_WINS: &[&str] = &[
        // Upstream honours these over the file.
        "hostname_override",
        "master",
        "verbosity",
        "vmodule",
        "logging_format",
        "log_flush_frequency",
        "log_text_split_stream",
        "log_text_info_buffer_size",
        "log_json_split_stream",
        "log_json_info_buffer_size",
        // Run modes.
        "config",
        "write_config_to",
        "cleanup",
        "init_only",
        // klog's flags: no config field, no effect.
        "add_dir_header",
        "alsologtostderr",
        "log_backtrace_at",
        "log_dir",
        "log_file",
        "log_file_max_size",
        "logtostderr",
        "one_output",
        "skip_headers",
        "skip_log_headers",
        "stderrthreshold",
        // kube-proxy-rs's own.
        "manifests",
        "manifest_grace_period",
        "state_dir",
        "iptables_backend",
        "iptables_zero_counters_on_full_sync",
        "iptables_dispatch",
        "userspace_max_connections",
        "dry_run",
        "once",
    ];

    fn defaults() -> crate::cli::ProxyArgs {
        crate::cli::Cli::parse_from(["kube-proxy-rs"]).proxy
    }

    /// Every field of the newest upstream type, set to a value other than its default: read
    /// without a note, and each one either reaches its flag or is noted as having no effect.
    #[test]
    fn newest_upstream_file_every_field() {
        use crate::cli::{DetectLocalModeArg, ProxyModeArg};
        let cfg = parse(include_str!("../tests/data/upstream-v1alpha1-full.yaml"));
        let mut a = defaults();
        let notes = apply(&cfg, &mut a, |_| false).unwrap();
        assert_eq!(a.proxy_mode, ProxyModeArg::Nftables);
        assert_eq!(
            a.feature_gates,
            [
                ("KubeProxyDrainingTerminatingNodes".to_string(), false),
                ("TopologyAwareHints".to_string(), true)
            ]
        );
        assert_eq!(
            a.kubeconfig.as_deref(),
            Some(Path::new("/var/lib/kube-proxy/kubeconfig.conf"))
        );
        assert_eq!(a.verbosity, 3);
        assert_eq!(a.hostname_override.as_deref(), Some("node-a"));
        assert_eq!(a.bind_address.to_string(), "192.168.56.10");
        assert_eq!(a.healthz_bind_address, "0.0.0.0:10356");
        assert_eq!(a.metrics_bind_address, "0.0.0.0:10349");
        assert!(a.bind_address_hard_fail);
        // nftables mode: the nftables section's masquerading and periods.
        assert!(a.masquerade_all);
        assert_eq!(a.iptables_masquerade_bit, 12);
        assert_eq!(a.iptables_sync_period, Duration::from_secs(50));
        assert_eq!(a.iptables_min_sync_period, Duration::from_secs(4));
        assert!(!a.iptables_localhost_nodeports);
        assert_eq!(
            a.detect_local_mode,
            Some(DetectLocalModeArg::InterfaceNamePrefix)
        );
        assert_eq!(a.pod_bridge_interface.as_deref(), Some("cni0"));
        assert_eq!(a.pod_interface_name_prefix.as_deref(), Some("veth"));
        assert_eq!(a.cluster_cidr, ["10.244.0.0/16", "fd00:10:244::/56"]);
        assert_eq!(a.nodeport_addresses, ["192.168.56.0/24", "primary"]);
        assert_eq!(a.oom_score_adj, -500);
        assert_eq!(a.conntrack_max_per_core, 65536);
        assert_eq!(a.conntrack_min, 262144);
        assert_eq!(
            a.conntrack_tcp_timeout_established,
            Duration::from_secs(12 * 3600)
        );
        assert_eq!(
            a.conntrack_tcp_timeout_close_wait,
            Duration::from_secs(1800)
        );
        assert!(a.conntrack_tcp_be_liberal);
        assert_eq!(a.conntrack_udp_timeout, Duration::from_secs(30));
        assert_eq!(a.conntrack_udp_timeout_stream, Duration::from_secs(120));
        let c = &a.compat;
        assert_eq!(c.ipvs_scheduler, "lc");
        assert_eq!(c.ipvs_exclude_cidrs, ["10.200.0.0/16"]);
        assert!(c.ipvs_strict_arp);
        assert_eq!(c.ipvs_sync_period, Duration::from_secs(40));
        assert_eq!(c.ipvs_min_sync_period, Duration::from_secs(3));
        assert_eq!(c.ipvs_tcp_timeout, Duration::from_secs(600));
        assert_eq!(c.ipvs_tcpfin_timeout, Duration::from_secs(30));
        assert_eq!(c.ipvs_udp_timeout, Duration::from_secs(20));
        assert_eq!(c.proxy_port_range, "30000-30100");
        assert_eq!(c.config_sync_period, Duration::from_secs(600));
        assert_eq!(c.kube_api_content_type, "application/json");
        assert_eq!(c.kube_api_qps, 50.0);
        assert_eq!(c.kube_api_burst, 100);
        assert!(c.profiling);
        assert_eq!(c.show_hidden_metrics_for_version, "1.34");
        assert_eq!(c.logging_format, "json");
        assert_eq!(c.log_flush_frequency, Duration::from_secs(10));
        assert_eq!(c.vmodule, ["proxier*=5"]);
        assert!(c.log_text_split_stream && c.log_json_split_stream);
        assert_eq!(c.log_text_info_buffer_size, "64Ki");
        assert_eq!(c.log_json_info_buffer_size, "1Mi");
        // Everything without an effect here is noted (the logging fields while their flags
        // are no-ops), nothing else.
        let mut noted: Vec<&str> = notes
            .iter()
            .map(|n| match n {
                Note::NoEffect { field, .. } => *field,
                other => panic!("{other:?}"),
            })
            .collect();
        noted.sort_unstable();
        let mut expected = vec![
            "clientConnection.acceptContentTypes",
            "clientConnection.burst",
            "clientConnection.contentType",
            "clientConnection.qps",
            "configSyncPeriod",
            "enableProfiling",
            "showHiddenMetricsForVersion",
            "windowsRunAsService",
            "winkernel.enableDSR",
            "winkernel.forwardHealthCheckVip",
            "winkernel.networkName",
            "winkernel.rootHnsEndpointName",
            "winkernel.sourceVip",
        ];
        for (field, id) in [
            ("logging.format", "logging_format"),
            ("logging.flushFrequency", "log_flush_frequency"),
            ("logging.vmodule", "vmodule"),
            ("logging.options.text.splitStream", "log_text_split_stream"),
            (
                "logging.options.text.infoBufferSize",
                "log_text_info_buffer_size",
            ),
            ("logging.options.json.splitStream", "log_json_split_stream"),
            (
                "logging.options.json.infoBufferSize",
                "log_json_info_buffer_size",
            ),
        ] {
            if crate::cli::CompatArgs::FLAGS.iter().any(|(i, _)| *i == id) {
                expected.push(field);
            }
        }
        expected.sort_unstable();
        assert_eq!(noted, expected);

        // iptables mode takes the iptables section instead.
        let text = include_str!("../tests/data/upstream-v1alpha1-full.yaml")
            .replace("mode: nftables", "mode: iptables");
        let mut a = defaults();
        apply(&parse(&text), &mut a, |_| false).unwrap();
        assert_eq!(a.iptables_masquerade_bit, 13);
        assert_eq!(a.iptables_sync_period, Duration::from_secs(45));
        assert_eq!(a.iptables_min_sync_period, Duration::from_secs(2));
    }

    #[test]
    fn flush_frequency_and_quantities_take_both_forms() {
        let cfg = parse(&format!(
            "{BASE}logging:\n  flushFrequency: 2000000000\n  options:\n    text:\n      infoBufferSize: 65536\n    json:\n      infoBufferSize: \"1e3\"\n"
        ));
        assert_eq!(cfg.logging.flush_frequency.0, secs(2));
        assert_eq!(cfg.logging.options.text.info_buffer_size.0, "65536");
        assert_eq!(cfg.logging.options.json.info_buffer_size.0, "1e3");
        for bad in ["1.2.3", "Ki", "10Xi", "1e"] {
            assert!(!Quantity::is_valid(bad), "{bad}");
        }
        for good in ["0", "10Mi", "1.5G", "500m", "+3", "2E+3"] {
            assert!(Quantity::is_valid(good), "{good}");
        }
    }

    /// Upstream's precedence with `--config`: the file's values, except `--hostname-override`
    /// and the logging flags; the other upstream flags given are noted as ignored; our own
    /// flags win over `kubeProxyRs`.
    #[test]
    fn with_config_the_file_wins_as_upstream() {
        use crate::cli::{IptablesBackendArg, IptablesDispatchArg};
        let cfg = parse(&format!(
            "{BASE}clusterCIDR: 10.244.0.0/16\nhostnameOverride: from-file\nlogging:\n  verbosity: 1\n  \
             vmodule:\n  - filePattern: a\n    verbosity: 1\nkubeProxyRs:\n  iptablesBackend: legacy\n  \
             iptablesDispatch: tree\n  manifests: /srv/cluster.yaml\n  stateDir: /srv/state\n"
        ));
        let mut a = crate::cli::Cli::parse_from([
            "kube-proxy-rs",
            "--cluster-cidr=10.0.0.0/16",
            "--hostname-override=from-flag",
            "--healthz-port=0",
            "--iptables-backend=nft",
            "--vmodule=b=2",
            "-v=4",
        ])
        .proxy;
        let given = [
            "cluster_cidr",
            "hostname_override",
            "healthz_port",
            "iptables_backend",
            "vmodule",
            "verbosity",
        ];
        let mut notes = apply(&cfg, &mut a, |id| given.contains(&id)).unwrap();
        notes.retain(|n| matches!(n, Note::IgnoredFlag { .. }));
        assert_eq!(a.cluster_cidr, ["10.244.0.0/16"], "the file wins");
        assert_eq!(
            a.healthz_port, None,
            "deprecated ports only without --config"
        );
        assert_eq!(a.hostname_override.as_deref(), Some("from-flag"));
        assert_eq!(a.verbosity, 4);
        assert_eq!(a.compat.vmodule, ["a=1", "b=2"]);
        assert_eq!(a.iptables_backend, IptablesBackendArg::Nft, "our flag wins");
        assert_eq!(a.iptables_dispatch, IptablesDispatchArg::Tree);
        assert_eq!(a.manifests.as_deref(), Some(Path::new("/srv/cluster.yaml")));
        assert_eq!(a.state_dir, "/srv/state");
        assert_eq!(
            a.kubeconfig, None,
            "--manifests: no kubeconfig from the file"
        );
        assert_eq!(
            notes,
            [
                Note::IgnoredFlag {
                    flag: "--cluster-cidr",
                    field: "clusterCIDR"
                },
                Note::IgnoredFlag {
                    flag: "--healthz-port",
                    field: "healthzBindAddress"
                }
            ]
        );
        // Every flag is in exactly one of the two tables (a new flag must say which), and
        // every upstream flag in FILE_WINS is one clap knows by that name.
        let cmd = <crate::cli::Cli as clap::CommandFactory>::command();
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if matches!(id, "help" | "version" | "config_loaded") {
                continue;
            }
            let in_file_wins = FILE_WINS.iter().filter(|(i, _, _)| *i == id).count();
            let in_command_line_wins = COMMAND_LINE_WINS.iter().filter(|i| **i == id).count();
            assert_eq!(
                in_file_wins + in_command_line_wins,
                1,
                "flag {id}: list it in config::FILE_WINS (an upstream flag the file overrides) \
                 or config::COMMAND_LINE_WINS"
            );
        }
        for (id, flag, _) in FILE_WINS {
            let arg = cmd
                .get_arguments()
                .find(|a| a.get_id() == *id)
                .unwrap_or_else(|| panic!("{id}"));
            assert_eq!(format!("--{}", arg.get_long().unwrap()), *flag);
        }
    }

    /// `--write-config-to` writes our own settings under `kubeProxyRs`, and they read back.
    #[test]
    fn our_settings_are_written_and_read_back() {
        let a = crate::cli::Cli::parse_from([
            "kube-proxy-rs",
            "--iptables-backend=legacy",
            "--iptables-dispatch=tree",
            "--manifests=/srv/m",
            "--manifest-grace-period=3s",
        ])
        .proxy;
        let yaml = from_args(&a).to_yaml().unwrap();
        assert!(
            yaml.contains("kubeProxyRs:\n  iptablesBackend: legacy\n  iptablesDispatch: tree\n"),
            "{yaml}"
        );
        let cfg = parse(&yaml);
        let mut b = defaults();
        apply(&cfg, &mut b, |_| false).unwrap();
        assert_eq!(b.iptables_backend, a.iptables_backend);
        assert_eq!(b.iptables_dispatch, a.iptables_dispatch);
        assert_eq!(b.manifests, a.manifests);
        assert_eq!(b.manifest_grace_period, Duration::from_secs(3));
    }
}
