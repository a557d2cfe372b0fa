//! Test helpers: turning partial dumps (rules only, like the seed's expected lines) into
//! loadable `iptables-save` documents, and small constructors.

#![allow(dead_code)]

use std::net::IpAddr;

use kp_netfilter::{Ruleset, parse_save};
use kp_trace::{Entry, Host};

/// Completes a partial dump (see [`kp_netfilter::complete_partial_save`]).
pub fn complete_dump(text: &str) -> String {
    kp_netfilter::complete_partial_save(text)
        .expect("completable dump")
        .0
}

/// Parses a partial dump after completing it.
pub fn load(text: &str) -> Ruleset {
    parse_save(&complete_dump(text)).expect("completed dump parses")
}

/// The seed's expected lines, completed.
pub fn seed() -> Ruleset {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/seed-nginx/expected-iptables-save.txt"
    ))
    .expect("seed file");
    load(&text)
}

/// The seed node k8s-master.
pub fn node_host() -> Host {
    Host::new([ip("192.168.56.10")])
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().expect("address")
}

pub fn external() -> Entry {
    Entry::External {
        iface: Some("eth0".into()),
    }
}

pub fn pod() -> Entry {
    Entry::Pod {
        iface: Some("veth1234".into()),
    }
}

/// kube-proxy's fixed filter rules and the fixed part of its nat rules, with `filter`
/// and `nat` (partial-dump lines) added; the `KUBE-SERVICES` → `KUBE-NODEPORTS` jump
/// comes last, as kube-proxy writes it.
pub fn kube_dump(filter: &str, nat: &str) -> Ruleset {
    let text = format!(
        r#"*filter
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A INPUT -j KUBE-FIREWALL
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -j KUBE-FIREWALL
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
{filter}
*nat
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
{nat}
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
"#
    );
    load(&text)
}
