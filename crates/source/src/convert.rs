//! Conversion of k8s-openapi objects into validated kp-model objects.
//!
//! [`service`], [`endpoint_slice`], [`node`] and [`service_cidr`] take the Kubernetes API types (as deserialized
//! from a manifest or, later, from an API-server watch) and return the [`kp_model`] object, or a
//! [`SourceError::Invalid`] naming the first field that is wrong, with a field path in the API's
//! JSON spelling (`spec.ports[1].port`). An object with a problem is rejected whole: a proxy
//! must not program half a Service.
//!
//! What is validated is everything that can end up in a rule: names (DNS labels, so they are
//! safe inside `iptables-restore` comments and nftables names), IP addresses, CIDRs, port
//! numbers and the enumerated fields. The API server's defaulting is applied on the way, so a
//! hand-written manifest means what `kubectl apply` would make of it: a missing namespace is
//! `default`, a missing protocol is `TCP`, a missing `type` is `ClusterIP`, and so on. As in the
//! Go API types (where a string cannot be nil), an empty string counts as absent for these
//! defaulted fields.
//!
//! Some objects are deliberately not handled by a service proxy; for those the functions return
//! [`Converted::Ignored`] rather than an error, mirroring the label selector upstream
//! kube-proxy puts on both its Service and its EndpointSlice informers
//! (`!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless`): Services and
//! EndpointSlices labelled `service.kubernetes.io/service-proxy-name` or
//! `service.kubernetes.io/headless` (whatever the value), and EndpointSlices of
//! `addressType: FQDN`. ExternalName and headless (`clusterIP: None`) Services without those
//! labels are converted (the tracker skips them), so a Service that changes type is seen as a
//! change.
//!
//! IP addresses and CIDRs are read as upstream reads them (`k8s.io/utils/net`'s
//! `ParseIPSloppy` and `ParseCIDRSloppy`): an IPv4 part may have leading zeros, and it is read
//! as **decimal** (`172.30.0.041` is `172.30.0.41`, `010.0.0.0/8` is `10.0.0.0/8`), as Go did
//! before 1.17 and as objects stored back then still spell it. The object is accepted, and a
//! [`ConvertWarning`] (collected by the `*_with_warnings` functions) names the field and both
//! spellings. Only the parsed address goes any further, so the sloppy text never reaches a rule.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::api::networking::v1 as networking;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kp_model::{
    EndpointConditions, EndpointEntry, EndpointPort, EndpointSlice, EndpointTopology, HintSet,
    Interner, LoadBalancerIngress, LoadBalancerIpMode, NameError, NamespacedName, Node, Protocol,
    Service, ServiceCidr, ServicePortSpec, ServiceType, SessionAffinity, SliceAddressType,
    TrafficDistribution, TrafficPolicy, validate_dns_label, validate_dns_subdomain,
    validate_port_name, validate_service_name,
};

use crate::SourceError;

/// Label that hands a Service (or its slices) to another service proxy; upstream kube-proxy
/// ignores every object that has it, whatever its value.
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// Label the EndpointSlice controller puts on slices of headless Services.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// Label naming the Service an EndpointSlice belongs to (in the slice's namespace).
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// Annotation with the time of the change that triggered the slice's last update (RFC 3339).
pub const ANNOTATION_LAST_CHANGE_TRIGGER_TIME: &str =
    "endpoints.kubernetes.io/last-change-trigger-time";
/// Taint key the cluster autoscaler puts on a node it is about to delete.
pub const TAINT_TO_BE_DELETED: &str = "ToBeDeletedByClusterAutoscaler";
/// `sessionAffinityConfig.clientIP.timeoutSeconds` when absent (3 hours), as the API defaults it.
pub const DEFAULT_CLIENT_IP_TIMEOUT_SECONDS: u32 = 10800;
/// The largest valid `sessionAffinityConfig.clientIP.timeoutSeconds` (one day).
pub const MAX_CLIENT_IP_TIMEOUT_SECONDS: u32 = 86400;

/// Something about an object that was accepted but deserves a warning: an address spelled with
/// leading zeros, read as upstream reads it.
///
/// `Display` is `FIELD: MESSAGE`, e.g.
/// `spec.clusterIP: "172.30.0.041" has leading zeros; read as 172.30.0.41 (decimal, as upstream kube-proxy reads it)`.
/// The message quotes the object's text with `{:?}`, so it is safe to log.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConvertWarning {
    /// The field path inside the object, as in [`SourceError::Invalid`].
    pub field: String,
    /// What was found and what was made of it, quoting the object's text.
    pub message: String,
}

impl std::fmt::Display for ConvertWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Where a conversion puts its warnings.
type Warnings = Vec<ConvertWarning>;

/// The outcome of a conversion that may deliberately skip an object.
#[derive(Debug, Clone, PartialEq)]
pub enum Converted<T> {
    /// The validated object.
    Object(T),
    /// The object is valid for Kubernetes but not for this proxy (another proxy's Service, a
    /// headless Service's slice, an FQDN slice); the text says why, for a debug log.
    Ignored(String),
}

type Result<T> = std::result::Result<T, SourceError>;

fn invalid<T>(field: impl Into<String>, message: impl Into<String>) -> Result<T> {
    Err(SourceError::invalid(field, message))
}

fn name_error(field: impl Into<String>, e: NameError) -> SourceError {
    SourceError::invalid(field, e.to_string())
}

fn has_label(meta: &ObjectMeta, key: &str) -> bool {
    meta.labels.as_ref().is_some_and(|l| l.contains_key(key))
}

/// Treats an empty string as absent, like Go's API defaulting does.
fn non_empty(s: Option<&str>) -> Option<&str> {
    s.filter(|s| !s.is_empty())
}

/// The namespace of a namespaced object: `metadata.namespace`, or `default` when absent (as
/// `kubectl apply` would do with the default context), validated as a DNS-1123 label.
fn namespace_of(meta: &ObjectMeta) -> Result<String> {
    let ns = non_empty(meta.namespace.as_deref()).unwrap_or("default");
    validate_dns_label(ns).map_err(|e| name_error("metadata.namespace", e))?;
    Ok(ns.to_string())
}

/// Parses an IP address, as upstream's `ParseIPSloppy` does: an IPv4 address (alone or as the
/// last 32 bits of an IPv6 address) may have leading zeros in its parts, read as decimal; then
/// a warning says so. Like the API server's strict validation, IPv4-mapped IPv6 addresses
/// (`::ffff:10.0.0.1`) are refused: they would put an IPv4 destination in an IPv6 rule.
fn parse_ip(warnings: &mut Warnings, field: &str, text: &str) -> Result<IpAddr> {
    let parsed = match text.parse::<IpAddr>() {
        Ok(ip) => Some(ip),
        Err(_) => sloppy_ip(text).inspect(|ip| {
            warnings.push(leading_zeros(field, text, ip));
        }),
    };
    match parsed {
        Some(IpAddr::V6(v6)) if v6.to_ipv4_mapped().is_some() => invalid(
            field,
            format!("{text:?} is an IPv4-mapped IPv6 address, which is not allowed"),
        ),
        Some(ip) => Ok(ip),
        None => invalid(field, format!("{text:?} is not a valid IP address")),
    }
}

/// The warning for an address or CIDR spelled with leading zeros.
fn leading_zeros(field: &str, text: &str, read_as: &dyn std::fmt::Display) -> ConvertWarning {
    ConvertWarning {
        field: field.to_string(),
        message: format!(
            "{text:?} has leading zeros; read as {read_as} (decimal, as upstream kube-proxy \
             reads it)"
        ),
    }
}

/// An IPv4 address in dotted decimal with leading zeros allowed (Go's parser before 1.17, kept
/// by `k8s.io/utils/net`): four parts of one or more decimal digits, each at most 255.
fn sloppy_ipv4(text: &str) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut parts = text.split('.');
    for octet in &mut octets {
        let part = parts.next()?;
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let digits = part.trim_start_matches('0');
        *octet = if digits.is_empty() {
            0
        } else {
            digits.parse().ok()?
        };
    }
    parts.next().is_none().then_some(Ipv4Addr::from(octets))
}

/// [`sloppy_ipv4`] for a whole address: an IPv4 address, or an IPv6 address whose last 32
/// bits are written as a (sloppy) IPv4 address. `None` when it is not an address even so.
fn sloppy_ip(text: &str) -> Option<IpAddr> {
    match text.rfind(':') {
        None => sloppy_ipv4(text).map(IpAddr::V4),
        Some(colon) => {
            let (head, tail) = text.split_at(colon + 1);
            let v4 = sloppy_ipv4(tail)?;
            format!("{head}{v4}")
                .parse::<Ipv6Addr>()
                .ok()
                .map(IpAddr::V6)
        }
    }
}

/// Parses a CIDR; the result has its host bits cleared (as Go's `net.ParseCIDR` returns it).
/// Leading zeros are accepted as by [`parse_ip`] (upstream's `ParseCIDRSloppy`), with a
/// warning. With `lenient`, surrounding spaces are trimmed and a bare address means a host
/// prefix (`/32` or `/128`), as the API server and upstream kube-proxy accept for
/// `loadBalancerSourceRanges`.
fn parse_cidr(warnings: &mut Warnings, field: &str, text: &str, lenient: bool) -> Result<IpNet> {
    let t = if lenient { text.trim() } else { text };
    // ipnet's parser takes some leading zeros silently: look for them first.
    if has_leading_zeros(t) {
        if let Some(net) = sloppy_cidr(t, lenient) {
            warnings.push(leading_zeros(field, text, &net));
            return Ok(net);
        }
    } else {
        if let Ok(net) = t.parse::<IpNet>() {
            return Ok(net.trunc());
        }
        if lenient && let Ok(ip) = t.parse::<IpAddr>() {
            return Ok(IpNet::from(ip));
        }
    }
    invalid(field, format!("{text:?} is not a valid CIDR"))
}

/// Whether a CIDR's dotted-decimal part (an IPv4 address, or the last 32 bits of an IPv6
/// one) or its prefix length has a number written with a leading zero (`010`, `/08`).
fn has_leading_zeros(text: &str) -> bool {
    let zero_led = |n: &str| n.len() > 1 && n.starts_with('0');
    let (addr, prefix) = text.split_once('/').unwrap_or((text, ""));
    let dotted = addr.rsplit(':').next().unwrap_or(addr);
    zero_led(prefix) || (dotted.contains('.') && dotted.split('.').any(zero_led))
}

/// A CIDR whose address (or prefix length) has leading zeros; with `lenient`, a bare address
/// too. Host bits are cleared.
fn sloppy_cidr(text: &str, lenient: bool) -> Option<IpNet> {
    let (addr, prefix) = match text.split_once('/') {
        Some((addr, prefix)) => (addr, Some(prefix)),
        None if lenient => (text, None),
        None => return None,
    };
    let ip = sloppy_ip(addr).or_else(|| addr.parse().ok())?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let len = match prefix {
        None => max,
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
            let digits = p.trim_start_matches('0');
            if digits.is_empty() {
                0
            } else {
                digits.parse::<u8>().ok().filter(|&l| l <= max)?
            }
        }
        Some(_) => return None,
    };
    IpNet::new(ip, len).ok().map(|net| net.trunc())
}

/// A port number, 1..=65535.
fn port_number(field: &str, value: i32) -> Result<u16> {
    match u16::try_from(value) {
        Ok(p) if p != 0 => Ok(p),
        _ => invalid(field, format!("{value} is out of range 1-65535")),
    }
}

/// An optional allocated port (`nodePort`, `healthCheckNodePort`): absent or 0 means "not
/// allocated" (0 is what a client sends to ask for an allocation), otherwise 1..=65535.
fn optional_port(field: &str, value: Option<i32>) -> Result<Option<u16>> {
    match value {
        None | Some(0) => Ok(None),
        Some(v) => port_number(field, v).map(Some),
    }
}

/// A protocol; absent or empty means TCP (the API default).
fn protocol(field: &str, value: Option<&str>) -> Result<Protocol> {
    match non_empty(value) {
        None => Ok(Protocol::Tcp),
        Some(p) => p
            .parse()
            .map_err(|e: kp_model::UnknownProtocol| SourceError::invalid(field, e.to_string())),
    }
}

fn traffic_policy(field: &str, value: Option<&str>) -> Result<TrafficPolicy> {
    match non_empty(value) {
        None | Some("Cluster") => Ok(TrafficPolicy::Cluster),
        Some("Local") => Ok(TrafficPolicy::Local),
        Some(other) => invalid(
            field,
            format!("unknown traffic policy {other:?} (expected Cluster or Local)"),
        ),
    }
}

/// Validates a label value (`[A-Za-z0-9]` at both ends, `-_.` inside, at most 63 characters,
/// or empty), the syntax of zone names.
fn label_value(field: &str, value: &str) -> Result<()> {
    let ok = value.len() <= 63
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && value
            .bytes()
            .next()
            .is_none_or(|b| b.is_ascii_alphanumeric())
        && value
            .bytes()
            .last()
            .is_none_or(|b| b.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        invalid(
            field,
            format!(
                "{value:?} is not valid: must be at most 63 characters of alphanumerics, '-', \
                 '_' or '.', starting and ending with an alphanumeric character"
            ),
        )
    }
}

/// Converts a `v1.Service`; warnings are dropped (see [`service_with_warnings`]).
///
/// # Errors
/// As [`service_with_warnings`].
pub fn service(svc: &core::Service) -> Result<Converted<Service>> {
    service_with_warnings(svc, &mut Vec::new())
}

/// Converts a `v1.Service`, adding to `warnings` what was accepted with a warning (addresses
/// with leading zeros).
///
/// Returns [`Converted::Ignored`] for a Service labelled `service.kubernetes.io/service-proxy-name`
/// (it belongs to another proxy) or `service.kubernetes.io/headless`: upstream's informer
/// filters both out. `clusterIP: None` gives a headless Service with no cluster IPs; an empty
/// or absent `clusterIP` gives none either.
///
/// # Errors
/// [`SourceError::Invalid`] for the first invalid field: namespace (DNS-1123 label), name
/// (DNS-1035 label), `spec.type`, cluster IPs (at most one per family, `clusterIPs[0]` equal to
/// `clusterIP`), ports (names, duplicates, unnamed port among several, protocol, 1..=65535,
/// node ports), external IPs, load-balancer ingress IPs and `ipMode`, source ranges, session
/// affinity and its timeout (1..=86400), traffic policies, `healthCheckNodePort`.
pub fn service_with_warnings(
    svc: &core::Service,
    warnings: &mut Vec<ConvertWarning>,
) -> Result<Converted<Service>> {
    let meta = &svc.metadata;
    for label in [LABEL_SERVICE_PROXY_NAME, LABEL_HEADLESS] {
        if has_label(meta, label) {
            return Ok(Converted::Ignored(format!("it has label {label}")));
        }
    }
    let namespace = namespace_of(meta)?;
    let name = meta.name.as_deref().unwrap_or("");
    validate_service_name(name).map_err(|e| name_error("metadata.name", e))?;

    let default_spec = core::ServiceSpec::default();
    let spec = svc.spec.as_ref().unwrap_or(&default_spec);

    let service_type = match non_empty(spec.type_.as_deref()) {
        None | Some("ClusterIP") => ServiceType::ClusterIp,
        Some("NodePort") => ServiceType::NodePort,
        Some("LoadBalancer") => ServiceType::LoadBalancer,
        Some("ExternalName") => ServiceType::ExternalName,
        Some(other) => {
            return invalid(
                "spec.type",
                format!(
                    "unknown Service type {other:?} (expected ClusterIP, NodePort, \
                     LoadBalancer or ExternalName)"
                ),
            );
        }
    };

    let (headless, cluster_ips) = cluster_ips(warnings, spec)?;
    let ports = service_ports(spec.ports.as_deref().unwrap_or(&[]))?;

    let external_ips = spec
        .external_ips
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, ip)| parse_ip(warnings, &format!("spec.externalIPs[{i}]"), ip))
        .collect::<Result<Vec<_>>>()?;

    let mut load_balancer_ingress = Vec::new();
    let ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_deref())
        .unwrap_or(&[]);
    for (i, ing) in ingress.iter().enumerate() {
        // Hostname-only ingresses (some cloud load balancers) have nothing a proxy can capture.
        let Some(text) = non_empty(ing.ip.as_deref()) else {
            continue;
        };
        let ip = parse_ip(
            warnings,
            &format!("status.loadBalancer.ingress[{i}].ip"),
            text,
        )?;
        let ip_mode = match non_empty(ing.ip_mode.as_deref()) {
            None | Some("VIP") => LoadBalancerIpMode::Vip,
            Some("Proxy") => LoadBalancerIpMode::Proxy,
            Some(other) => {
                return invalid(
                    format!("status.loadBalancer.ingress[{i}].ipMode"),
                    format!("unknown ipMode {other:?} (expected VIP or Proxy)"),
                );
            }
        };
        load_balancer_ingress.push(LoadBalancerIngress { ip, ip_mode });
    }

    let load_balancer_source_ranges = spec
        .load_balancer_source_ranges
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, r)| {
            parse_cidr(
                warnings,
                &format!("spec.loadBalancerSourceRanges[{i}]"),
                r,
                true,
            )
        })
        .collect::<Result<Vec<_>>>()?;

    let session_affinity = match non_empty(spec.session_affinity.as_deref()) {
        None | Some("None") => SessionAffinity::None,
        Some("ClientIP") => {
            let timeout = spec
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds);
            let timeout_seconds = match timeout {
                None => DEFAULT_CLIENT_IP_TIMEOUT_SECONDS,
                Some(t) => match u32::try_from(t) {
                    Ok(t) if (1..=MAX_CLIENT_IP_TIMEOUT_SECONDS).contains(&t) => t,
                    _ => {
                        return invalid(
                            "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                            format!("{t} is out of range 1-{MAX_CLIENT_IP_TIMEOUT_SECONDS}"),
                        );
                    }
                },
            };
            SessionAffinity::ClientIp { timeout_seconds }
        }
        Some(other) => {
            return invalid(
                "spec.sessionAffinity",
                format!("unknown session affinity {other:?} (expected None or ClientIP)"),
            );
        }
    };

    let external_traffic_policy = traffic_policy(
        "spec.externalTrafficPolicy",
        spec.external_traffic_policy.as_deref(),
    )?;
    let internal_traffic_policy = traffic_policy(
        "spec.internalTrafficPolicy",
        spec.internal_traffic_policy.as_deref(),
    )?;
    let health_check_node_port =
        optional_port("spec.healthCheckNodePort", spec.health_check_node_port)?;
    let traffic_distribution = non_empty(spec.traffic_distribution.as_deref()).map(|td| match td {
        "PreferClose" | "PreferSameZone" => TrafficDistribution::PreferSameZone,
        "PreferSameNode" => TrafficDistribution::PreferSameNode,
        other => TrafficDistribution::Other(other.to_string()),
    });

    Ok(Converted::Object(Service {
        name: NamespacedName::new(namespace, name),
        service_type,
        cluster_ips,
        headless,
        ports,
        external_ips,
        load_balancer_ingress,
        load_balancer_source_ranges,
        session_affinity,
        external_traffic_policy,
        internal_traffic_policy,
        health_check_node_port,
        traffic_distribution,
    }))
}

/// `spec.clusterIPs` (preferred) or `spec.clusterIP`: `(headless, addresses)`.
fn cluster_ips(warnings: &mut Warnings, spec: &core::ServiceSpec) -> Result<(bool, Vec<IpAddr>)> {
    let single = spec.cluster_ip.as_deref().unwrap_or("");
    let list = spec.cluster_ips.as_deref().unwrap_or(&[]);
    let Some(first) = list.first() else {
        return match single {
            "" => Ok((false, Vec::new())),
            "None" => Ok((true, Vec::new())),
            text => Ok((false, vec![parse_ip(warnings, "spec.clusterIP", text)?])),
        };
    };
    if !single.is_empty() && single != first {
        return invalid(
            "spec.clusterIPs[0]",
            format!("{first:?} does not match spec.clusterIP {single:?}"),
        );
    }
    if first == "None" {
        if list.len() > 1 {
            return invalid(
                "spec.clusterIPs",
                "a headless Service must have only \"None\"",
            );
        }
        return Ok((true, Vec::new()));
    }
    if list.len() > 2 {
        return invalid(
            "spec.clusterIPs",
            format!(
                "{} addresses given; at most 2 (one per IP family) are allowed",
                list.len()
            ),
        );
    }
    let ips = list
        .iter()
        .enumerate()
        .map(|(i, t)| parse_ip(warnings, &format!("spec.clusterIPs[{i}]"), t))
        .collect::<Result<Vec<_>>>()?;
    if let [a, b] = ips[..]
        && a.is_ipv4() == b.is_ipv4()
    {
        return invalid(
            "spec.clusterIPs[1]",
            format!(
                "{:?} has the same IP family as spec.clusterIPs[0]; a dual-stack Service needs \
                 one IPv4 and one IPv6 address",
                list[1]
            ),
        );
    }
    Ok((false, ips))
}

fn service_ports(input: &[core::ServicePort]) -> Result<Vec<ServicePortSpec>> {
    let mut ports = Vec::with_capacity(input.len());
    let mut names: HashMap<&str, usize> = HashMap::new();
    let mut numbers: HashMap<(u16, Protocol), usize> = HashMap::new();
    for (i, p) in input.iter().enumerate() {
        let field = |f: &str| format!("spec.ports[{i}].{f}");
        let name = p.name.as_deref().unwrap_or("");
        validate_port_name(name).map_err(|e| name_error(field("name"), e))?;
        if name.is_empty() && input.len() > 1 {
            return invalid(
                field("name"),
                "must be set when the Service has more than one port",
            );
        }
        if let Some(j) = names.insert(name, i) {
            return invalid(
                field("name"),
                format!("duplicate port name {name:?} (also spec.ports[{j}])"),
            );
        }
        let protocol = protocol(&field("protocol"), p.protocol.as_deref())?;
        let port = port_number(&field("port"), p.port)?;
        if let Some(j) = numbers.insert((port, protocol), i) {
            return invalid(
                field("port"),
                format!("duplicate port {port}/{protocol} (also spec.ports[{j}])"),
            );
        }
        let node_port = optional_port(&field("nodePort"), p.node_port)?;
        ports.push(ServicePortSpec {
            name: name.into(),
            protocol,
            port,
            node_port,
        });
    }
    Ok(ports)
}

/// Converts a `discovery.k8s.io/v1` EndpointSlice; warnings are dropped (see
/// [`endpoint_slice_with_warnings`]).
///
/// # Errors
/// As [`endpoint_slice_with_warnings`].
pub fn endpoint_slice(slice: &discovery::EndpointSlice) -> Result<Converted<EndpointSlice>> {
    endpoint_slice_with_warnings(slice, &mut Vec::new())
}

/// Converts a `discovery.k8s.io/v1` EndpointSlice, adding to `warnings` what was accepted with
/// a warning (addresses with leading zeros).
///
/// Returns [`Converted::Ignored`] for slices labelled `service.kubernetes.io/headless` or
/// `service.kubernetes.io/service-proxy-name` and for `addressType: FQDN`. Each endpoint uses
/// only `addresses[0]` (as upstream); conditions default to ready and serving, not terminating;
/// hints are `Some` only when the hint list is present and non-empty (as upstream reads them). A
/// port without a `port` number is dropped (upstream skips it); a port without a name has the
/// name `""`.
///
/// # Errors
/// [`SourceError::Invalid`] for the first invalid field: `addressType`, namespace, name
/// (DNS-1123 subdomain), the `kubernetes.io/service-name` label (missing, or not a Service
/// name), an endpoint without addresses, an address that does not parse or is of the wrong
/// family, `nodeName`, `zone` and hint names, port names, protocols and numbers.
pub fn endpoint_slice_with_warnings(
    slice: &discovery::EndpointSlice,
    warnings: &mut Vec<ConvertWarning>,
) -> Result<Converted<EndpointSlice>> {
    let meta = &slice.metadata;
    for label in [LABEL_HEADLESS, LABEL_SERVICE_PROXY_NAME] {
        if has_label(meta, label) {
            return Ok(Converted::Ignored(format!("it has label {label}")));
        }
    }
    let address_type = match slice.address_type.as_str() {
        "IPv4" => SliceAddressType::V4,
        "IPv6" => SliceAddressType::V6,
        "FQDN" => return Ok(Converted::Ignored("its addressType is FQDN".to_string())),
        other => {
            return invalid(
                "addressType",
                format!("unknown addressType {other:?} (expected IPv4, IPv6 or FQDN)"),
            );
        }
    };
    let namespace = namespace_of(meta)?;
    let name = meta.name.as_deref().unwrap_or("");
    validate_dns_subdomain(name).map_err(|e| name_error("metadata.name", e))?;
    let Some(service_name) = meta.labels.as_ref().and_then(|l| l.get(LABEL_SERVICE_NAME)) else {
        return invalid(
            "metadata.labels",
            format!("missing label {LABEL_SERVICE_NAME:?}"),
        );
    };
    validate_service_name(service_name)
        .map_err(|e| name_error(format!("metadata.labels[{LABEL_SERVICE_NAME:?}]"), e))?;

    let endpoints = slice
        .endpoints
        .iter()
        .enumerate()
        .map(|(i, ep)| endpoint_entry(warnings, i, ep, address_type))
        .collect::<Result<Vec<_>>>()?;
    // Collecting through `Result` cannot size the Vec up front: it grows to the next power
    // of two (16 entries for a slice of 10), and the source keeps it as long as the object.
    let mut endpoints = endpoints;
    endpoints.shrink_to_fit();

    let mut ports = Vec::new();
    for (i, p) in slice.ports.iter().flatten().enumerate() {
        let field = |f: &str| format!("ports[{i}].{f}");
        let name = p.name.as_deref().unwrap_or("");
        validate_port_name(name).map_err(|e| name_error(field("name"), e))?;
        let protocol = protocol(&field("protocol"), p.protocol.as_deref())?;
        let Some(number) = p.port else { continue };
        let port = port_number(&field("port"), number)?;
        ports.push(EndpointPort {
            name: name.into(),
            protocol,
            port,
        });
    }

    let last_change_trigger_time = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_LAST_CHANGE_TRIGGER_TIME))
        .cloned();

    let mut slice = EndpointSlice {
        name: NamespacedName::new(namespace.clone(), name),
        service: NamespacedName::new(namespace, service_name.as_str()),
        address_type,
        ports,
        endpoints,
        last_change_trigger_time,
    };
    // Endpoints of one slice mostly share node names, zones and hints: hold each text once.
    Interner::new().endpoint_slice(&mut slice);
    Ok(Converted::Object(slice))
}

fn endpoint_entry(
    warnings: &mut Warnings,
    i: usize,
    ep: &discovery::Endpoint,
    address_type: SliceAddressType,
) -> Result<EndpointEntry> {
    let field = |f: &str| format!("endpoints[{i}].{f}");
    let Some(text) = ep.addresses.first() else {
        return invalid(field("addresses"), "must contain at least one address");
    };
    let address = parse_ip(warnings, &field("addresses[0]"), text)?;
    let (want_v4, family) = match address_type {
        SliceAddressType::V4 => (true, "IPv4"),
        SliceAddressType::V6 => (false, "IPv6"),
    };
    if address.is_ipv4() != want_v4 {
        return invalid(
            field("addresses[0]"),
            format!("{text:?} is not an {family} address (addressType is {family})"),
        );
    }
    let c = ep.conditions.as_ref();
    let conditions = EndpointConditions {
        ready: c.and_then(|c| c.ready).unwrap_or(true),
        serving: c.and_then(|c| c.serving).unwrap_or(true),
        terminating: c.and_then(|c| c.terminating).unwrap_or(false),
    };
    let node_name = non_empty(ep.node_name.as_deref())
        .map(|n| {
            validate_dns_subdomain(n).map_err(|e| name_error(field("nodeName"), e))?;
            Ok(n.into())
        })
        .transpose()?;
    let zone = non_empty(ep.zone.as_deref())
        .map(|z| {
            label_value(&field("zone"), z)?;
            Ok(z.into())
        })
        .transpose()?;
    let hints = ep.hints.as_ref();
    let zone_hints = match hints.and_then(|h| h.for_zones.as_deref()) {
        Some(zones) if !zones.is_empty() => Some(
            zones
                .iter()
                .enumerate()
                .map(|(j, z)| {
                    label_value(&field(&format!("hints.forZones[{j}].name")), &z.name)?;
                    Ok(z.name.as_str())
                })
                .collect::<Result<HintSet>>()?,
        ),
        _ => None,
    };
    let node_hints = match hints.and_then(|h| h.for_nodes.as_deref()) {
        Some(nodes) if !nodes.is_empty() => Some(
            nodes
                .iter()
                .enumerate()
                .map(|(j, n)| {
                    validate_dns_subdomain(&n.name)
                        .map_err(|e| name_error(field(&format!("hints.forNodes[{j}].name")), e))?;
                    Ok(n.name.as_str())
                })
                .collect::<Result<HintSet>>()?,
        ),
        _ => None,
    };
    Ok(EndpointEntry {
        address,
        conditions,
        node_name,
        topology: EndpointTopology::of(zone, zone_hints, node_hints),
    })
}

/// Converts a `v1.Node`; warnings are dropped (see [`node_with_warnings`]).
///
/// # Errors
/// As [`node_with_warnings`].
pub fn node(node: &core::Node) -> Result<Node> {
    node_with_warnings(node, &mut Vec::new())
}

/// Converts a `v1.Node`, adding to `warnings` what was accepted with a warning (addresses and
/// pod CIDRs with leading zeros). Nodes are never ignored.
///
/// `pod_cidrs` come from `spec.podCIDRs`, or `spec.podCIDR` when the list is empty;
/// `addresses` are the `status.addresses` of type `InternalIP`, then those of type `ExternalIP`
/// (other types, such as `Hostname`, are skipped); `deleting` is whether `metadata.deletionTimestamp`
/// is set; `to_be_deleted_taint` whether a taint has the key `ToBeDeletedByClusterAutoscaler`.
///
/// # Errors
/// [`SourceError::Invalid`] for an invalid name (DNS-1123 subdomain), pod CIDR or address.
pub fn node_with_warnings(node: &core::Node, warnings: &mut Vec<ConvertWarning>) -> Result<Node> {
    let meta = &node.metadata;
    let name = meta.name.as_deref().unwrap_or("");
    validate_dns_subdomain(name).map_err(|e| name_error("metadata.name", e))?;
    let labels: BTreeMap<String, String> = meta.labels.clone().unwrap_or_default();

    let spec = node.spec.as_ref();
    let mut pod_cidrs = Vec::new();
    match spec
        .and_then(|s| s.pod_cidrs.as_deref())
        .filter(|l| !l.is_empty())
    {
        Some(list) => {
            for (i, c) in list.iter().enumerate() {
                pod_cidrs.push(parse_cidr(
                    warnings,
                    &format!("spec.podCIDRs[{i}]"),
                    c,
                    false,
                )?);
            }
        }
        None => {
            if let Some(c) = non_empty(spec.and_then(|s| s.pod_cidr.as_deref())) {
                pod_cidrs.push(parse_cidr(warnings, "spec.podCIDR", c, false)?);
            }
        }
    }

    // InternalIP addresses first (the node's primary IP is the first of them), then
    // ExternalIP; other types, such as Hostname, are skipped.
    let mut addresses = Vec::new();
    let status_addresses = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_deref())
        .unwrap_or(&[]);
    for wanted in ["InternalIP", "ExternalIP"] {
        for (i, a) in status_addresses.iter().enumerate() {
            if a.type_ == wanted {
                addresses.push(parse_ip(
                    warnings,
                    &format!("status.addresses[{i}].address"),
                    &a.address,
                )?);
            }
        }
    }

    let to_be_deleted_taint = spec
        .and_then(|s| s.taints.as_deref())
        .unwrap_or(&[])
        .iter()
        .any(|t| t.key == TAINT_TO_BE_DELETED);

    Ok(Node {
        name: name.to_string(),
        labels,
        pod_cidrs,
        addresses,
        deleting: meta.deletion_timestamp.is_some(),
        to_be_deleted_taint,
    })
}

/// The most CIDRs a ServiceCIDR may list: one per IP family (the API server's limit).
pub const MAX_SERVICE_CIDRS: usize = 2;

/// Converts a `networking.k8s.io/v1` ServiceCIDR; warnings are dropped (see
/// [`service_cidr_with_warnings`]).
///
/// # Errors
/// As [`service_cidr_with_warnings`].
pub fn service_cidr(object: &networking::ServiceCIDR) -> Result<ServiceCidr> {
    service_cidr_with_warnings(object, &mut Vec::new())
}

/// Converts a `networking.k8s.io/v1` ServiceCIDR, adding to `warnings` the CIDRs read with
/// leading zeros. Only `spec.cidrs` is read, as upstream kube-proxy reads it: the `Ready`
/// condition and `metadata.deletionTimestamp` do not matter (a ServiceCIDR being deleted
/// still holds allocated ClusterIPs). Host bits are cleared (`10.96.0.1/12` is
/// `10.96.0.0/12`); the API server stores only the canonical form. An empty or missing
/// `spec.cidrs` gives an object with no CIDR.
///
/// # Errors
/// [`SourceError::Invalid`] for an invalid name (DNS-1123 subdomain), a CIDR that does not
/// parse (`spec.cidrs[1]`), more than [`MAX_SERVICE_CIDRS`] CIDRs or two of one IP family
/// (`spec.cidrs`), as the API server validates them.
pub fn service_cidr_with_warnings(
    object: &networking::ServiceCIDR,
    warnings: &mut Vec<ConvertWarning>,
) -> Result<ServiceCidr> {
    let name = object.metadata.name.as_deref().unwrap_or("");
    validate_dns_subdomain(name).map_err(|e| name_error("metadata.name", e))?;
    let texts = object
        .spec
        .as_ref()
        .and_then(|s| s.cidrs.as_deref())
        .unwrap_or(&[]);
    if texts.len() > MAX_SERVICE_CIDRS {
        return invalid(
            "spec.cidrs",
            format!(
                "{} CIDRs listed; at most {MAX_SERVICE_CIDRS} are allowed (one per IP family)",
                texts.len()
            ),
        );
    }
    let mut cidrs: Vec<IpNet> = Vec::with_capacity(texts.len());
    for (i, text) in texts.iter().enumerate() {
        let net = parse_cidr(warnings, &format!("spec.cidrs[{i}]"), text, false)?;
        if let Some(other) = cidrs
            .iter()
            .find(|c| c.addr().is_ipv4() == net.addr().is_ipv4())
        {
            return invalid(
                "spec.cidrs",
                format!(
                    "{other} and {net} are of the same IP family; at most one CIDR per family is allowed"
                ),
            );
        }
        cidrs.push(net);
    }
    Ok(ServiceCidr {
        name: name.to_string(),
        cidrs,
    })
}
