//! Validation: every error message of [`crate::convert`], seen through a manifest (so each one
//! names the file, the object and the field), and the defaults applied to valid objects.

use std::net::IpAddr;

use kp_model::{
    EndpointConditions, EndpointPort, LoadBalancerIngress, LoadBalancerIpMode, NamespacedName,
    Protocol, ServiceType, SessionAffinity, SliceAddressType, TrafficDistribution, TrafficPolicy,
};

use super::{errors_only, parse, service_yaml, slice_yaml};

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test IP")
}

/// The single error of a Service with `spec`.
fn service_error(spec: &str) -> String {
    let errors = errors_only(&service_yaml(spec));
    assert_eq!(errors.len(), 1, "{errors:#?}");
    errors[0].clone()
}

fn slice_error(rest: &str) -> String {
    let errors = errors_only(&slice_yaml(rest));
    assert_eq!(errors.len(), 1, "{errors:#?}");
    errors[0].clone()
}

const PORT: &str = "  ports:\n  - port: 80\n";

#[test]
fn service_ip_errors() {
    assert_eq!(
        service_error(&format!("  clusterIP: 10.96.1.300\n{PORT}")),
        "t.yaml:1: Service default/web: spec.clusterIP: \"10.96.1.300\" is not a valid IP address"
    );
    assert_eq!(
        service_error(&format!(
            "  clusterIP: 10.0.0.1\n  clusterIPs: [10.0.0.2]\n{PORT}"
        )),
        "t.yaml:1: Service default/web: spec.clusterIPs[0]: \"10.0.0.2\" does not match \
         spec.clusterIP \"10.0.0.1\""
    );
    assert_eq!(
        service_error(&format!("  clusterIPs: [10.0.0.1, 10.0.0.2]\n{PORT}")),
        "t.yaml:1: Service default/web: spec.clusterIPs[1]: \"10.0.0.2\" has the same IP family \
         as spec.clusterIPs[0]; a dual-stack Service needs one IPv4 and one IPv6 address"
    );
    assert_eq!(
        service_error(&format!(
            "  clusterIPs: [10.0.0.1, 'fd00::1', 10.0.0.3]\n{PORT}"
        )),
        "t.yaml:1: Service default/web: spec.clusterIPs: 3 addresses given; at most 2 (one per \
         IP family) are allowed"
    );
    assert_eq!(
        service_error(&format!("  clusterIP: '::ffff:10.0.0.1'\n{PORT}")),
        "t.yaml:1: Service default/web: spec.clusterIP: \"::ffff:10.0.0.1\" is an IPv4-mapped \
         IPv6 address, which is not allowed"
    );
    assert_eq!(
        service_error(&format!("  externalIPs: [1.2.3.4, nope]\n{PORT}")),
        "t.yaml:1: Service default/web: spec.externalIPs[1]: \"nope\" is not a valid IP address"
    );
    assert_eq!(
        service_error(&format!(
            "  loadBalancerSourceRanges: [' 10.0.0.0/8', 10.0.0.0/33]\n{PORT}"
        )),
        "t.yaml:1: Service default/web: spec.loadBalancerSourceRanges[1]: \"10.0.0.0/33\" is not \
         a valid CIDR"
    );
}

#[test]
fn service_port_errors() {
    let cases = [
        (
            "  ports:\n  - port: 70000\n",
            "spec.ports[0].port: 70000 is out of range 1-65535",
        ),
        (
            "  ports:\n  - protocol: TCP\n",
            "spec.ports[0].port: 0 is out of range 1-65535",
        ),
        (
            "  ports:\n  - port: 80\n    protocol: ICMP\n",
            "spec.ports[0].protocol: unknown protocol \"ICMP\" (expected TCP, UDP or SCTP)",
        ),
        (
            "  ports:\n  - port: 80\n    protocol: tcp\n",
            "spec.ports[0].protocol: unknown protocol \"tcp\" (expected TCP, UDP or SCTP)",
        ),
        (
            "  ports:\n  - port: 80\n    name: HTTP\n",
            "spec.ports[0].name: \"HTTP\" is not valid: must consist of lower case alphanumeric \
             characters or '-'",
        ),
        (
            "  ports:\n  - port: 80\n    name: a\n  - port: 81\n    name: a\n",
            "spec.ports[1].name: duplicate port name \"a\" (also spec.ports[0])",
        ),
        (
            "  ports:\n  - port: 80\n    name: a\n  - port: 81\n",
            "spec.ports[1].name: must be set when the Service has more than one port",
        ),
        (
            "  ports:\n  - port: 80\n    name: a\n  - port: 80\n    name: b\n",
            "spec.ports[1].port: duplicate port 80/TCP (also spec.ports[0])",
        ),
        (
            "  type: NodePort\n  ports:\n  - port: 80\n    nodePort: 65536\n",
            "spec.ports[0].nodePort: 65536 is out of range 1-65535",
        ),
        (
            "  ports:\n  - port: http\n",
            "spec.ports[0].port: invalid type: string \"http\", expected i32",
        ),
    ];
    for (spec, want) in cases {
        assert_eq!(
            service_error(spec),
            format!("t.yaml:1: Service default/web: {want}"),
            "{spec}"
        );
    }
}

#[test]
fn service_enum_errors() {
    let cases = [
        (
            "  type: Magic\n",
            "spec.type: unknown Service type \"Magic\" (expected ClusterIP, \
          NodePort, LoadBalancer or ExternalName)",
        ),
        (
            "  sessionAffinity: Cookie\n",
            "spec.sessionAffinity: unknown session affinity \
          \"Cookie\" (expected None or ClientIP)",
        ),
        (
            "  sessionAffinity: ClientIP\n  sessionAffinityConfig:\n    clientIP:\n      \
             timeoutSeconds: 0\n",
            "spec.sessionAffinityConfig.clientIP.timeoutSeconds: 0 is out of range 1-86400",
        ),
        (
            "  sessionAffinity: ClientIP\n  sessionAffinityConfig:\n    clientIP:\n      \
             timeoutSeconds: 86401\n",
            "spec.sessionAffinityConfig.clientIP.timeoutSeconds: 86401 is out of range 1-86400",
        ),
        (
            "  externalTrafficPolicy: Global\n",
            "spec.externalTrafficPolicy: unknown traffic \
          policy \"Global\" (expected Cluster or Local)",
        ),
        (
            "  internalTrafficPolicy: local\n",
            "spec.internalTrafficPolicy: unknown traffic \
          policy \"local\" (expected Cluster or Local)",
        ),
        (
            "  healthCheckNodePort: -1\n",
            "spec.healthCheckNodePort: -1 is out of range 1-65535",
        ),
    ];
    for (spec, want) in cases {
        let spec = format!("{spec}{PORT}");
        assert_eq!(
            service_error(&spec),
            format!("t.yaml:1: Service default/web: {want}"),
            "{spec}"
        );
    }
    let lb =
        "  type: LoadBalancer\n  ports:\n  - port: 80\nstatus:\n  loadBalancer:\n    ingress:\n";
    assert_eq!(
        service_error(&format!("{lb}    - ip: 1.2.3.256\n")),
        "t.yaml:1: Service default/web: status.loadBalancer.ingress[0].ip: \"1.2.3.256\" is not \
         a valid IP address"
    );
    assert_eq!(
        service_error(&format!(
            "{lb}    - hostname: lb.example.com\n    - ip: 1.2.3.4\n      ipMode: Tunnel\n"
        )),
        "t.yaml:1: Service default/web: status.loadBalancer.ingress[1].ipMode: unknown ipMode \
         \"Tunnel\" (expected VIP or Proxy)"
    );
}

#[test]
fn service_name_errors() {
    let text = "apiVersion: v1\nkind: Service\nmetadata:\n  name: Nginx_Svc\nspec:\n  ports:\n  - port: 80\n";
    assert_eq!(
        errors_only(text),
        [
            "t.yaml:1: Service default/Nginx_Svc: metadata.name: \"Nginx_Svc\" is not valid: must \
          consist of lower case alphanumeric characters or '-'"
        ]
    );
    let text = "apiVersion: v1\nkind: Service\nmetadata:\n  name: 1web\nspec: {}\n";
    assert_eq!(
        errors_only(text),
        [
            "t.yaml:1: Service default/1web: metadata.name: \"1web\" is not valid: must start with a \
          lower case letter (DNS-1035 label)"
        ]
    );
    let text = "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: Kube_System\nspec: {}\n";
    assert_eq!(
        errors_only(text),
        [
            "t.yaml:1: Service Kube_System/web: metadata.namespace: \"Kube_System\" is not valid: \
          must consist of lower case alphanumeric characters or '-'"
        ]
    );
    let text = "apiVersion: v1\nkind: Service\nmetadata: {}\nspec: {}\n";
    assert_eq!(
        errors_only(text),
        [
            "t.yaml:1: Service default/<unnamed>: metadata.name: \"\" is not valid: must not be empty"
        ]
    );
}

#[test]
fn service_defaults_and_fields() {
    let text = "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  type: LoadBalancer\n  \
        clusterIPs: [10.96.0.10, 'fd00::10']\n  externalIPs: [192.0.2.1]\n  \
        loadBalancerSourceRanges: [' 203.0.113.7 ', '2001:db8::/32', 10.1.2.3/8]\n  \
        sessionAffinity: ClientIP\n  externalTrafficPolicy: Local\n  healthCheckNodePort: 30999\n  \
        trafficDistribution: PreferClose\n  ports:\n  - name: http\n    port: 80\n    nodePort: 30080\n  \
        - name: dns\n    port: 53\n    protocol: UDP\n    nodePort: 0\nstatus:\n  loadBalancer:\n    \
        ingress:\n    - hostname: only.example.com\n    - ip: 198.51.100.1\n    - ip: 198.51.100.2\n      \
        ipMode: Proxy\n";
    let (set, errors) = parse(text);
    assert!(errors.is_empty(), "{errors:#?}");
    let svc = &set.services[&NamespacedName::new("default", "web")];
    assert_eq!(svc.service_type, ServiceType::LoadBalancer);
    assert_eq!(svc.cluster_ips, [ip("10.96.0.10"), ip("fd00::10")]);
    assert!(!svc.headless);
    assert_eq!(svc.external_ips, [ip("192.0.2.1")]);
    let ranges: Vec<String> = svc
        .load_balancer_source_ranges
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(ranges, ["203.0.113.7/32", "2001:db8::/32", "10.0.0.0/8"]);
    assert_eq!(
        svc.session_affinity,
        SessionAffinity::ClientIp {
            timeout_seconds: 10800
        }
    );
    assert_eq!(svc.external_traffic_policy, TrafficPolicy::Local);
    assert_eq!(svc.internal_traffic_policy, TrafficPolicy::Cluster);
    assert_eq!(svc.health_check_node_port, Some(30999));
    assert_eq!(
        svc.traffic_distribution,
        Some(TrafficDistribution::PreferSameZone)
    );
    assert_eq!(svc.ports.len(), 2);
    assert_eq!(
        (svc.ports[0].protocol, svc.ports[0].node_port),
        (Protocol::Tcp, Some(30080))
    );
    assert_eq!(
        (svc.ports[1].protocol, svc.ports[1].node_port),
        (Protocol::Udp, None)
    );
    assert_eq!(
        svc.load_balancer_ingress,
        [
            LoadBalancerIngress {
                ip: ip("198.51.100.1"),
                ip_mode: LoadBalancerIpMode::Vip
            },
            LoadBalancerIngress {
                ip: ip("198.51.100.2"),
                ip_mode: LoadBalancerIpMode::Proxy
            },
        ]
    );

    // Headless, ExternalName and other traffic distributions are converted, not filtered.
    let text = "apiVersion: v1\nkind: Service\nmetadata:\n  name: headless\nspec:\n  clusterIP: None\n  \
        trafficDistribution: PreferSameNode\n---\napiVersion: v1\nkind: Service\nmetadata:\n  \
        name: ext\nspec:\n  type: ExternalName\n  externalName: example.com\n  trafficDistribution: Magic\n";
    let (set, errors) = parse(text);
    assert!(errors.is_empty(), "{errors:#?}");
    let headless = &set.services[&NamespacedName::new("default", "headless")];
    assert!(headless.headless && headless.cluster_ips.is_empty());
    assert_eq!(
        headless.traffic_distribution,
        Some(TrafficDistribution::PreferSameNode)
    );
    let ext = &set.services[&NamespacedName::new("default", "ext")];
    assert_eq!(ext.service_type, ServiceType::ExternalName);
    assert_eq!(
        ext.traffic_distribution,
        Some(TrafficDistribution::Other("Magic".into()))
    );
    assert!(!ext.headless && ext.cluster_ips.is_empty());
}

#[test]
fn slice_errors() {
    let no_label = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-abc\n\
        addressType: IPv4\nendpoints: []\n";
    assert_eq!(
        errors_only(no_label),
        [
            "t.yaml:1: EndpointSlice default/web-abc: metadata.labels: missing label \
          \"kubernetes.io/service-name\""
        ]
    );
    let cases = [
        (
            "endpoints:\n- addresses: [10.0.0.256]\n",
            "endpoints[0].addresses[0]: \"10.0.0.256\" is not a valid IP address",
        ),
        (
            "endpoints:\n- addresses: [10.0.0.1]\n- addresses: ['fd00::1']\n",
            "endpoints[1].addresses[0]: \"fd00::1\" is not an IPv4 address (addressType is IPv4)",
        ),
        (
            "endpoints:\n- addresses: []\n",
            "endpoints[0].addresses: must contain at least one address",
        ),
        (
            "endpoints:\n- addresses: [10.0.0.1]\n  nodeName: Node_1\n",
            "endpoints[0].nodeName: \"Node_1\" is not valid: must consist of lower case \
             alphanumeric characters or '-'",
        ),
        (
            "endpoints: []\nports:\n- port: 80\n  name: HTTP\n",
            "ports[0].name: \"HTTP\" is not valid: must consist of lower case alphanumeric \
             characters or '-'",
        ),
        (
            "endpoints: []\nports:\n- port: 0\n",
            "ports[0].port: 0 is out of range 1-65535",
        ),
        (
            "endpoints: []\nports:\n- port: 65536\n",
            "ports[0].port: 65536 is out of range 1-65535",
        ),
        (
            "endpoints: []\nports:\n- port: 80\n  protocol: ICMP\n",
            "ports[0].protocol: unknown protocol \"ICMP\" (expected TCP, UDP or SCTP)",
        ),
        (
            "endpoints:\n- addresses: [10.0.0.1]\n  conditions:\n    ready: maybe\n",
            "endpoints[0].conditions.ready: invalid type: string \"maybe\", expected a boolean",
        ),
    ];
    for (rest, want) in cases {
        assert_eq!(
            slice_error(rest),
            format!("t.yaml:1: EndpointSlice default/web-abc: {want}"),
            "{rest}"
        );
    }
    let bad_type = slice_yaml("endpoints: []\n").replace("addressType: IPv4", "addressType: IPv5");
    assert_eq!(
        errors_only(&bad_type),
        [
            "t.yaml:1: EndpointSlice default/web-abc: addressType: unknown addressType \"IPv5\" \
          (expected IPv4, IPv6 or FQDN)"
        ]
    );
    let bad_name = slice_yaml("endpoints: []\n").replace("name: web-abc", "name: web..abc");
    assert_eq!(
        errors_only(&bad_name),
        [
            "t.yaml:1: EndpointSlice default/web..abc: metadata.name: \"web..abc\" is not valid: \
          must not contain empty labels between dots"
        ]
    );
    let bad_service =
        slice_yaml("endpoints: []\n").replace("service-name: web", "service-name: Web");
    assert_eq!(
        errors_only(&bad_service),
        [
            "t.yaml:1: EndpointSlice default/web-abc: metadata.labels[\"kubernetes.io/service-name\"]: \
          \"Web\" is not valid: must consist of lower case alphanumeric characters or '-'"
        ]
    );
}

#[test]
fn slice_defaults_and_fields() {
    let text = slice_yaml(
        "endpoints:\n- addresses: [10.0.0.1, 10.0.0.9]\n  nodeName: n1\n  zone: zone-a\n  \
         hints:\n    forZones: [{name: zone-a}]\n    forNodes: [{name: n1}]\n\
         - addresses: [10.0.0.2]\n  conditions:\n    ready: false\n    terminating: true\n\
         ports:\n- port: 8080\n- name: dns\n  port: 53\n  protocol: UDP\n- name: unset\n",
    )
    .replace(
        "metadata:\n",
        "metadata:\n  annotations:\n    endpoints.kubernetes.io/last-change-trigger-time: \
         '2024-05-01T10:00:00Z'\n",
    );
    let (set, errors) = parse(&text);
    assert!(errors.is_empty(), "{errors:#?}");
    let slice = &set.slices[&NamespacedName::new("default", "web-abc")];
    assert_eq!(slice.service, NamespacedName::new("default", "web"));
    assert_eq!(slice.address_type, SliceAddressType::V4);
    assert_eq!(
        slice.last_change_trigger_time.as_deref(),
        Some("2024-05-01T10:00:00Z")
    );
    assert_eq!(
        slice.ports,
        [
            EndpointPort {
                name: "".into(),
                protocol: Protocol::Tcp,
                port: 8080
            },
            EndpointPort {
                name: "dns".into(),
                protocol: Protocol::Udp,
                port: 53
            },
        ]
    );
    let [a, b] = &slice.endpoints[..] else {
        panic!("two endpoints: {slice:?}")
    };
    assert_eq!(a.address, ip("10.0.0.1"));
    assert_eq!(a.conditions, EndpointConditions::default());
    assert_eq!(a.node_name.as_deref(), Some("n1"));
    assert_eq!(a.zone().map(|z| z.as_str()), Some("zone-a"));
    assert_eq!(
        a.zone_hints(),
        Some(&kp_model::HintSet::from_iter(["zone-a"]))
    );
    assert_eq!(a.node_hints(), Some(&kp_model::HintSet::from_iter(["n1"])));
    assert_eq!(
        b.conditions,
        EndpointConditions {
            ready: false,
            serving: true,
            terminating: true
        }
    );
    assert_eq!((b.node_name.as_ref(), b.topology.as_ref()), (None, None));
}

#[test]
fn ignored_objects() {
    // FQDN slices, objects labelled headless, and other proxies' objects: ignored, not errors.
    let fqdn = slice_yaml("endpoints:\n- addresses: [example.com]\n")
        .replace("addressType: IPv4", "addressType: FQDN");
    let headless = slice_yaml("endpoints: []\n").replace(
        "  labels:\n",
        "  labels:\n    service.kubernetes.io/headless: \"\"\n",
    );
    let other_proxy_slice = slice_yaml("endpoints: []\n").replace(
        "  labels:\n",
        "  labels:\n    service.kubernetes.io/service-proxy-name: x\n",
    );
    let other_proxy_service = service_yaml(PORT).replace(
        "metadata:\n",
        "metadata:\n  labels:\n    service.kubernetes.io/service-proxy-name: x\n",
    );
    // Upstream's Service informer has the headless label in its selector too.
    let headless_service = service_yaml(PORT).replace(
        "metadata:\n",
        "metadata:\n  labels:\n    service.kubernetes.io/headless: \"\"\n",
    );
    for text in [
        fqdn,
        headless,
        other_proxy_slice,
        other_proxy_service,
        headless_service,
    ] {
        let (set, errors) = parse(&text);
        assert!(
            errors.is_empty() && set.is_empty(),
            "{text}: {errors:#?} {set:?}"
        );
    }
    // Other kinds, and known kinds with another apiVersion, are skipped too.
    let text = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: d\n---\n\
        apiVersion: discovery.k8s.io/v1beta1\nkind: EndpointSlice\nmetadata:\n  name: s\n";
    let (set, errors) = parse(text);
    assert!(errors.is_empty() && set.is_empty(), "{errors:#?} {set:?}");
}

#[test]
fn node_fields_and_errors() {
    let text = "apiVersion: v1\nkind: Node\nmetadata:\n  name: n1\n  labels:\n    \
        topology.kubernetes.io/zone: zone-a\n  deletionTimestamp: '2024-05-01T10:00:00Z'\nspec:\n  \
        podCIDR: 10.0.0.0/24\n  podCIDRs: [10.0.0.0/24, 'fd00:1::/64']\n  taints:\n  - key: \
        ToBeDeletedByClusterAutoscaler\n    effect: NoSchedule\nstatus:\n  addresses:\n  - type: \
        Hostname\n    address: n1\n  - type: InternalIP\n    address: 192.168.1.10\n  - type: \
        ExternalIP\n    address: 203.0.113.10\n";
    let (set, errors) = parse(text);
    assert!(errors.is_empty(), "{errors:#?}");
    let node = &set.nodes["n1"];
    assert_eq!(node.labels["topology.kubernetes.io/zone"], "zone-a");
    let cidrs: Vec<String> = node.pod_cidrs.iter().map(ToString::to_string).collect();
    assert_eq!(cidrs, ["10.0.0.0/24", "fd00:1::/64"]);
    assert_eq!(node.addresses, [ip("192.168.1.10"), ip("203.0.113.10")]);
    assert!(node.deleting && node.to_be_deleted_taint);

    let node_error = |body: &str| {
        let errors = errors_only(&format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: n1\n{body}"
        ));
        assert_eq!(errors.len(), 1, "{errors:#?}");
        errors[0].clone()
    };
    assert_eq!(
        node_error("spec:\n  podCIDR: 10.0.0.0\n"),
        "t.yaml:1: Node n1: spec.podCIDR: \"10.0.0.0\" is not a valid CIDR"
    );
    assert_eq!(
        node_error("spec:\n  podCIDRs: [10.0.0.0/24, bad]\n"),
        "t.yaml:1: Node n1: spec.podCIDRs[1]: \"bad\" is not a valid CIDR"
    );
    assert_eq!(
        node_error("status:\n  addresses:\n  - type: InternalIP\n    address: 192.168.1\n"),
        "t.yaml:1: Node n1: status.addresses[0].address: \"192.168.1\" is not a valid IP address"
    );
    let errors = errors_only("apiVersion: v1\nkind: Node\nmetadata:\n  name: N1\n");
    assert_eq!(
        errors,
        [
            "t.yaml:1: Node N1: metadata.name: \"N1\" is not valid: must consist of lower case \
          alphanumeric characters or '-'"
        ]
    );
}
