//! Object names of nftables mode: upstream kube-proxy's table, chains, sets and maps, and its
//! `hashAndTruncate` scheme for per-Service objects.
//!
//! A per-Service object is a prefix (`service-`, `local-`, `external-`, `firewall-`,
//! `endpoint-`, `affinity-`) followed by `HASH-NAME`, where `NAME` is
//! `namespace/service/protocol/portname` (portname empty for an unnamed port, so the name
//! ends in `/`) and, for endpoints, `NAME__ip/port` with the `:` of IPv6 addresses replaced
//! by `.`; `HASH` is the first 8 characters of `base32(sha256(NAME))`. Names longer than 240
//! characters are cut to 237 and end in `...` (never the case for valid Kubernetes names).
//! The seed Service `default/nginx-svc` (TCP, unnamed port) thus gets
//! `service-O4TPQO6D-default/nginx-svc/tcp/`.

use std::net::IpAddr;

use data_encoding::BASE32;
use kp_model::{Endpoint, ServicePortName};
use sha2::{Digest, Sha256};

/// The table, in families `ip` and `ip6`.
pub const TABLE: &str = "kube-proxy";
/// The table's comment.
pub const TABLE_COMMENT: &str = "rules for kube-proxy";

/// Base chain: filter, prerouting, priority dstnat - 10 (loadBalancerSourceRanges).
pub const FILTER_PREROUTING_PRE_DNAT: &str = "filter-prerouting-pre-dnat";
/// Base chain: filter, output, priority dstnat - 10 (loadBalancerSourceRanges).
pub const FILTER_OUTPUT_PRE_DNAT: &str = "filter-output-pre-dnat";
/// Base chain: filter, input, priority filter.
pub const FILTER_INPUT: &str = "filter-input";
/// Base chain: filter, forward, priority filter.
pub const FILTER_FORWARD: &str = "filter-forward";
/// Base chain: filter, output, priority filter.
pub const FILTER_OUTPUT: &str = "filter-output";
/// Base chain: nat, prerouting, priority dstnat.
pub const NAT_PREROUTING: &str = "nat-prerouting";
/// Base chain: nat, output, priority dstnat.
pub const NAT_OUTPUT: &str = "nat-output";
/// Base chain: nat, postrouting, priority srcnat.
pub const NAT_POSTROUTING: &str = "nat-postrouting";

/// Service dispatch through the `service-ips` and `service-nodeports` maps.
pub const SERVICES: &str = "services";
/// Masquerades marked packets and hairpin connections.
pub const MASQUERADING: &str = "masquerading";
/// Rejects or drops new connections to Services without (local) endpoints.
pub const SERVICE_ENDPOINTS_CHECK: &str = "service-endpoints-check";
/// Rejects or drops new connections to NodePorts without (local) endpoints.
pub const NODEPORT_ENDPOINTS_CHECK: &str = "nodeport-endpoints-check";
/// loadBalancerSourceRanges: dispatch through `firewall-ips`.
pub const FIREWALL_CHECK: &str = "firewall-check";
/// Rejects new connections to a ClusterIP on a port no Service uses.
pub const CLUSTER_IPS_CHECK: &str = "cluster-ips-check";
/// `reject`, the target of `goto reject-chain` verdicts.
pub const REJECT_CHAIN: &str = "reject-chain";

/// Set: every ClusterIP.
pub const CLUSTER_IPS: &str = "cluster-ips";
/// Set: the addresses that accept NodePorts (only with `--nodeport-addresses`).
pub const NODEPORT_IPS: &str = "nodeport-ips";
/// Map: `ip . proto . port : verdict` for ClusterIPs, external IPs and load-balancer IPs.
pub const SERVICE_IPS: &str = "service-ips";
/// Map: `proto . port : verdict` for NodePorts.
pub const SERVICE_NODEPORTS: &str = "service-nodeports";
/// Map: `ip . proto . port : drop|goto reject-chain` for Services without endpoints.
pub const NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
/// Map: `proto . port : drop|goto reject-chain` for NodePorts without endpoints.
pub const NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";
/// Map: `ip . proto . port : goto firewall-…` for load-balancer IPs with source ranges.
pub const FIREWALL_IPS: &str = "firewall-ips";
/// Set: `ip . ip . proto . port` of local endpoints, for hairpin masquerading.
pub const HAIRPIN_CONNECTIONS: &str = "hairpin-connections";

/// Prefix of Cluster-policy endpoint-selection chains.
pub const SERVICE_PREFIX: &str = "service-";
/// Prefix of Local-policy endpoint-selection chains.
pub const LOCAL_PREFIX: &str = "local-";
/// Prefix of external-destination chains (NodePort, external IPs, load-balancer IPs).
pub const EXTERNAL_PREFIX: &str = "external-";
/// Prefix of loadBalancerSourceRanges chains.
pub const FIREWALL_PREFIX: &str = "firewall-";
/// Prefix of per-endpoint chains (Services with session affinity only).
pub const ENDPOINT_PREFIX: &str = "endpoint-";
/// Prefix of per-endpoint affinity sets.
pub const AFFINITY_PREFIX: &str = "affinity-";

/// Longest name nftables accepts (knftables' `NameLengthMax`).
pub const NAME_LENGTH_MAX: usize = 256;
/// Longest prefix we put before a hashed name, including its `-`.
const PREFIX_LENGTH_MAX: usize = 16;
/// Longest hashed name.
const BASE_LENGTH_MAX: usize = NAME_LENGTH_MAX - PREFIX_LENGTH_MAX;

/// Whether a chain is a per-Service or per-endpoint chain (upstream's test: fixed chains never
/// contain `/`, hashed names always do).
pub fn is_service_chain(name: &str) -> bool {
    name.contains('/')
}

/// Whether a set is a per-endpoint affinity set.
pub fn is_affinity_set(name: &str) -> bool {
    name.starts_with(AFFINITY_PREFIX)
}

/// Upstream's `hashAndTruncate`: `base32(sha256(name))[:8] + "-" + name`, cut to 240
/// characters with a `...` suffix when longer.
pub fn hash_and_truncate(name: &str) -> String {
    let digest = Sha256::digest(name.as_bytes());
    // 5 bytes are exactly 40 bits: 8 base32 characters without padding.
    let mut out = BASE32.encode(&digest[..5]);
    out.push('-');
    out.push_str(name);
    if out.len() > BASE_LENGTH_MAX {
        let mut cut = BASE_LENGTH_MAX - 3;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push_str("...");
    }
    out
}

/// `namespace/service/protocol/portname` of a ServicePortName.
pub fn service_port_base(spn: &ServicePortName) -> String {
    format!(
        "{}/{}/{}/{}",
        spn.service.namespace,
        spn.service.name,
        spn.protocol.as_lower(),
        spn.port
    )
}

/// `…__ip/port` of an endpoint of `spn`, IPv6 colons replaced by dots.
pub fn endpoint_base(spn: &ServicePortName, ep: &Endpoint) -> String {
    let ip = match ep.ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => v6.to_string().replace(':', "."),
    };
    format!("{}__{ip}/{}", service_port_base(spn), ep.port)
}

/// The per-Service object names of one ServicePortName.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceChains {
    /// `service-…`: Cluster-policy endpoints.
    pub cluster: String,
    /// `local-…`: Local-policy endpoints.
    pub local: String,
    /// `external-…`: NodePort, external IP and load-balancer traffic.
    pub external: String,
    /// `firewall-…`: loadBalancerSourceRanges.
    pub firewall: String,
}

impl ServiceChains {
    /// Names for `spn`.
    pub fn new(spn: &ServicePortName) -> Self {
        let base = hash_and_truncate(&service_port_base(spn));
        ServiceChains {
            cluster: format!("{SERVICE_PREFIX}{base}"),
            local: format!("{LOCAL_PREFIX}{base}"),
            external: format!("{EXTERNAL_PREFIX}{base}"),
            firewall: format!("{FIREWALL_PREFIX}{base}"),
        }
    }
}

/// `endpoint-…` and `affinity-…` of endpoint `ep` of `spn`.
pub fn endpoint_names(spn: &ServicePortName, ep: &Endpoint) -> (String, String) {
    let base = hash_and_truncate(&endpoint_base(spn, ep));
    (
        format!("{ENDPOINT_PREFIX}{base}"),
        format!("{AFFINITY_PREFIX}{base}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use kp_model::{NamespacedName, Protocol};

    fn ep(ip: &str, port: u16) -> Endpoint {
        Endpoint {
            ip: ip.parse().unwrap(),
            port,
            is_local: false,
            ready: true,
            serving: true,
            terminating: false,
            topology: None,
        }
    }

    #[test]
    fn seed_names() {
        // Computed by hand: base32(sha256("default/nginx-svc/tcp/")) = "O4TPQO6DV6TF…",
        // base32(sha256("default/nginx-svc/tcp/__10.0.0.4/80")) = "S6R6MJ22…",
        // base32(sha256("default/nginx-svc/tcp/__10.0.1.2/80")) = "UZAXZVQH…".
        let spn = ServicePortName::new(
            NamespacedName::new("default", "nginx-svc"),
            "",
            Protocol::Tcp,
        );
        let c = ServiceChains::new(&spn);
        assert_eq!(c.cluster, "service-O4TPQO6D-default/nginx-svc/tcp/");
        assert_eq!(c.local, "local-O4TPQO6D-default/nginx-svc/tcp/");
        assert_eq!(c.external, "external-O4TPQO6D-default/nginx-svc/tcp/");
        assert_eq!(c.firewall, "firewall-O4TPQO6D-default/nginx-svc/tcp/");
        assert_eq!(
            endpoint_names(&spn, &ep("10.0.0.4", 80)),
            (
                "endpoint-S6R6MJ22-default/nginx-svc/tcp/__10.0.0.4/80".to_string(),
                "affinity-S6R6MJ22-default/nginx-svc/tcp/__10.0.0.4/80".to_string()
            )
        );
        assert_eq!(
            endpoint_names(&spn, &ep("10.0.1.2", 80)).0,
            "endpoint-UZAXZVQH-default/nginx-svc/tcp/__10.0.1.2/80"
        );
    }

    #[test]
    fn upstream_documented_examples() {
        // The examples in upstream's comments: "ULMVA6XW-ns1/svc1/tcp/p80" and
        // "5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80".
        let spn = ServicePortName::new(NamespacedName::new("ns1", "svc1"), "p80", Protocol::Tcp);
        assert_eq!(
            hash_and_truncate(&service_port_base(&spn)),
            "ULMVA6XW-ns1/svc1/tcp/p80"
        );
        assert_eq!(
            hash_and_truncate(&endpoint_base(&spn, &ep("10.180.0.1", 80))),
            "5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"
        );
    }

    #[test]
    fn ipv6_and_truncation() {
        let spn = ServicePortName::new(NamespacedName::new("a", "b"), "dns", Protocol::Udp);
        let (chain, set) = endpoint_names(&spn, &ep("fd00:10:1::4", 53));
        assert!(chain.ends_with("-a/b/udp/dns__fd00.10.1..4/53"), "{chain}");
        assert!(set.starts_with("affinity-") && !set.contains(':'));
        let long = "x".repeat(300);
        let h = hash_and_truncate(&long);
        assert_eq!(h.len(), 240);
        assert!(h.ends_with("..."));
        assert!(is_service_chain(&chain) && !is_service_chain(SERVICES));
        assert!(is_affinity_set(&set) && !is_affinity_set(CLUSTER_IPS));
        // The longest valid names (63-character parts, an IPv6 endpoint) fit nft's limit.
        let spn = ServicePortName::new(
            NamespacedName::new("n".repeat(63), "s".repeat(63)),
            "p".repeat(63),
            Protocol::Sctp,
        );
        let (chain, _) =
            endpoint_names(&spn, &ep("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 65535));
        assert!(chain.len() <= NAME_LENGTH_MAX);
    }
}
