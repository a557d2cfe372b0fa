//! What the sandbox does not probe, and why: one line per Service or address of the
//! manifests that gets no request.
//!
//! The sandbox's network is IPv4 and it probes what kube-proxy programs: a Service port of
//! the IPv4 snapshot, at its ClusterIP, NodePort, external IPs and load-balancer IPs. The
//! rest of the manifests is named here so that nothing disappears silently: headless and
//! ExternalName Services (kube-proxy programs nothing for them, as upstream), Services with
//! no port or no ClusterIP, IPv6 addresses (the IPv6 ClusterIP of a dual-stack Service, IPv6
//! external and load-balancer IPs, IPv6-only Services), and load-balancer IPs with
//! `ipMode: Proxy` (the load balancer proxies itself, so no rule captures them). SCTP ports
//! are named where they are met (the sandbox has no SCTP server).

use std::collections::BTreeMap;
use std::net::IpAddr;

use kp_model::{LoadBalancerIpMode, NamespacedName, Service, ServiceType};

/// What of a Service is not probed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Unprobed {
    /// Why the whole Service is not probed; `None` when some of it is.
    pub whole: Option<String>,
    /// Addresses of a probed Service that are not, each with its reason:
    /// `2001:db8::1 (IPv6 ClusterIP of a dual-stack Service: …)`.
    pub addresses: Vec<String>,
}

impl Unprobed {
    fn is_empty(&self) -> bool {
        self.whole.is_none() && self.addresses.is_empty()
    }
}

/// Why IPv6 is skipped, said once per address.
const IPV6: &str = "the sandbox's network is IPv4";

/// The Services of `services` with something not probed, by name.
pub fn plan<'a>(
    services: impl IntoIterator<Item = &'a Service>,
) -> BTreeMap<NamespacedName, Unprobed> {
    let mut out = BTreeMap::new();
    for svc in services {
        let u = of_service(svc);
        if !u.is_empty() {
            out.insert(svc.name.clone(), u);
        }
    }
    out
}

fn of_service(svc: &Service) -> Unprobed {
    let whole = if svc.service_type == ServiceType::ExternalName {
        Some(
            "type ExternalName: a DNS alias (CNAME); kube-proxy programs nothing for it"
                .to_string(),
        )
    } else if svc.headless {
        Some(
            "headless (clusterIP: None): DNS returns the Pods' own addresses; kube-proxy programs nothing for it"
                .to_string(),
        )
    } else if svc.cluster_ips.is_empty() {
        Some("no clusterIP: kube-proxy programs nothing for it".to_string())
    } else if svc.ports.is_empty() {
        Some("no ports: kube-proxy programs nothing for it".to_string())
    } else if !svc.cluster_ips.iter().any(IpAddr::is_ipv4) {
        Some(format!(
            "IPv6 only (clusterIP {}): {IPV6}",
            svc.cluster_ips[0]
        ))
    } else {
        None
    };
    if whole.is_some() {
        return Unprobed {
            whole,
            addresses: Vec::new(),
        };
    }
    let mut addresses = Vec::new();
    for ip in svc.cluster_ips.iter().filter(|ip| ip.is_ipv6()) {
        addresses.push(format!(
            "{ip} (the IPv6 ClusterIP of a dual-stack Service: {IPV6})"
        ));
    }
    for ip in svc.external_ips.iter().filter(|ip| ip.is_ipv6()) {
        addresses.push(format!("{ip} (IPv6 external IP: {IPV6})"));
    }
    for ing in &svc.load_balancer_ingress {
        if ing.ip.is_ipv6() {
            addresses.push(format!("{} (IPv6 load-balancer IP: {IPV6})", ing.ip));
        } else if ing.ip_mode == LoadBalancerIpMode::Proxy {
            addresses.push(format!(
                "{} (load-balancer IP with ipMode: Proxy: the load balancer proxies to the node itself, so kube-proxy programs no rule for it)",
                ing.ip
            ));
        }
    }
    Unprobed {
        whole: None,
        addresses,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kp_model::{LoadBalancerIngress, Protocol, ServicePortSpec};

    fn svc(name: &str, ips: &[&str]) -> Service {
        let mut s = Service::cluster_ip(
            NamespacedName::new("default", name),
            ips[0].parse().unwrap(),
            vec![ServicePortSpec {
                name: "".into(),
                protocol: Protocol::Tcp,
                port: 80,
                node_port: None,
            }],
        );
        s.cluster_ips = ips.iter().map(|ip| ip.parse().unwrap()).collect();
        s
    }

    #[test]
    fn each_unprobed_service_and_address_gets_its_reason() {
        let plain = svc("plain", &["10.96.0.1"]);
        let mut headless = svc("headless", &["10.96.0.2"]);
        headless.headless = true;
        headless.cluster_ips.clear();
        let mut alias = svc("alias", &["10.96.0.3"]);
        alias.service_type = ServiceType::ExternalName;
        alias.cluster_ips.clear();
        let dual = svc("dual", &["10.96.0.4", "fd00:10:96::4"]);
        let v6 = svc("v6", &["fd00:10:96::5"]);
        let mut lb = svc("lb", &["10.96.0.6"]);
        lb.service_type = ServiceType::LoadBalancer;
        lb.external_ips = vec!["2001:db8::7".parse().unwrap()];
        lb.load_balancer_ingress = vec![
            LoadBalancerIngress {
                ip: "192.0.2.10".parse().unwrap(),
                ip_mode: LoadBalancerIpMode::Vip,
            },
            LoadBalancerIngress {
                ip: "192.0.2.11".parse().unwrap(),
                ip_mode: LoadBalancerIpMode::Proxy,
            },
        ];
        let p = plan([&plain, &headless, &alias, &dual, &v6, &lb]);
        let name = |n: &str| NamespacedName::new("default", n);
        assert!(!p.contains_key(&name("plain")));
        assert!(
            p[&name("headless")]
                .whole
                .as_ref()
                .unwrap()
                .starts_with("headless")
        );
        assert!(
            p[&name("alias")]
                .whole
                .as_ref()
                .unwrap()
                .contains("ExternalName")
        );
        assert!(
            p[&name("v6")]
                .whole
                .as_ref()
                .unwrap()
                .starts_with("IPv6 only")
        );
        assert_eq!(p[&name("dual")].whole, None);
        assert_eq!(
            p[&name("dual")].addresses,
            [
                "fd00:10:96::4 (the IPv6 ClusterIP of a dual-stack Service: the sandbox's network is IPv4)"
            ]
        );
        let lb = &p[&name("lb")].addresses;
        assert_eq!(lb.len(), 2, "{lb:?}");
        assert!(lb[0].starts_with("2001:db8::7 (IPv6 external IP"));
        assert!(lb[1].starts_with("192.0.2.11 (load-balancer IP with ipMode: Proxy"));
    }
}
