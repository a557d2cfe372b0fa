//! Userspace mode's numbers on `/metrics`, and its proxy table on `/userspace`.
//!
//! Upstream's userspace proxier exported no metrics of its own, so these names are ours
//! (`kube_proxy_rs_userspace_*`). They are read from the relay at scrape time through
//! [`UserspaceStats`], so a scrape always shows the listeners as they are now:
//!
//! | metric | type | labels | what |
//! |---|---|---|---|
//! | `kube_proxy_rs_userspace_listener_info` | gauge (1) | `ip_family`, `service_port`, `protocol`, `scope`, `port` | a proxy socket, and the port it listens on |
//! | `kube_proxy_rs_userspace_endpoints` | gauge | `ip_family`, `service_port`, `protocol`, `scope` | endpoints the listener sends connections to |
//! | `kube_proxy_rs_userspace_open_connections` | gauge | same | TCP connections / UDP flows open now |
//! | `kube_proxy_rs_userspace_connections_total` | counter | same | TCP connections accepted / UDP flows created |
//! | `kube_proxy_rs_userspace_dial_failures_total` | counter | same | backend connects that failed (each retry counts) |
//! | `kube_proxy_rs_userspace_no_endpoint_connections_total` | counter | same | clients closed because no endpoint answered or none existed |
//! | `kube_proxy_rs_userspace_rejected_connections_total` | counter | same | clients refused at `--userspace-max-connections` |
//! | `kube_proxy_rs_userspace_bytes_total` | counter | same | bytes relayed, both directions |
//!
//! `scope` is `internal` for a listener serving a Service port's ClusterIP (and its external
//! destinations when they use the same endpoints), `external` for the second listener a
//! port gets when its external destinations use other endpoints (`externalTrafficPolicy:
//! Local`), and `cluster` for the one that takes pod and node traffic to those destinations
//! to every endpoint when both traffic policies are Local.

use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

/// One listener's numbers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserspaceListenerStats {
    /// `IPv4` or `IPv6`.
    pub ip_family: &'static str,
    /// The ServicePortName text (`namespace/name:port`).
    pub service_port: String,
    /// `TCP` or `UDP`.
    pub protocol: &'static str,
    /// `internal`, `external` or `cluster` (see the module docs).
    pub scope: &'static str,
    /// The listening port.
    pub port: u16,
    /// Endpoints it sends connections to.
    pub endpoints: usize,
    /// Open TCP connections / UDP flows.
    pub active: usize,
    /// TCP connections accepted / UDP flows created.
    pub accepted_total: u64,
    /// Failed backend connects.
    pub dial_failures_total: u64,
    /// Clients closed without an endpoint.
    pub no_endpoint_total: u64,
    /// Clients refused at the connection limit.
    pub rejected_total: u64,
    /// Bytes relayed.
    pub bytes_total: u64,
}

/// Where the numbers come from (the daemon's relays).
pub trait UserspaceStats: std::fmt::Debug + Send + Sync {
    /// Every listener now.
    fn listeners(&self) -> Vec<UserspaceListenerStats>;
    /// The proxy table (`kp_trace`'s userspace table text) served on `/userspace`.
    fn table(&self) -> String;
}

/// The slot a daemon fills once its relays exist.
pub(crate) type StatsSlot = Arc<Mutex<Option<Arc<dyn UserspaceStats>>>>;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InfoLabels {
    ip_family: &'static str,
    service_port: String,
    protocol: &'static str,
    scope: &'static str,
    port: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabels {
    ip_family: &'static str,
    service_port: String,
    protocol: &'static str,
    scope: &'static str,
}

/// The collector registered in userspace mode.
#[derive(Debug)]
pub(crate) struct UserspaceCollector {
    pub(crate) slot: StatsSlot,
}

fn to_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Collector for UserspaceCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let source = self.slot.lock().ok().and_then(|s| s.clone());
        let stats = source.map(|s| s.listeners()).unwrap_or_default();
        let info: Family<InfoLabels, Gauge> = Family::default();
        let gauges: [(&str, &str, Family<ListenerLabels, Gauge>); 2] = [
            (
                "kube_proxy_rs_userspace_endpoints",
                "Endpoints a userspace-mode proxy socket sends connections to",
                Family::default(),
            ),
            (
                "kube_proxy_rs_userspace_open_connections",
                "TCP connections and UDP flows a userspace-mode proxy socket has open",
                Family::default(),
            ),
        ];
        let counters: [(&str, &str, Family<ListenerLabels, Counter>); 5] = [
            (
                "kube_proxy_rs_userspace_connections",
                "TCP connections accepted and UDP flows created by a userspace-mode proxy socket",
                Family::default(),
            ),
            (
                "kube_proxy_rs_userspace_dial_failures",
                "Backend connects of a userspace-mode proxy socket that failed (each retry counts)",
                Family::default(),
            ),
            (
                "kube_proxy_rs_userspace_no_endpoint_connections",
                "Clients a userspace-mode proxy socket closed because no endpoint answered or none existed",
                Family::default(),
            ),
            (
                "kube_proxy_rs_userspace_rejected_connections",
                "Clients refused at --userspace-max-connections",
                Family::default(),
            ),
            (
                "kube_proxy_rs_userspace_bytes",
                "Bytes a userspace-mode proxy socket relayed, both directions",
                Family::default(),
            ),
        ];
        for s in &stats {
            info.get_or_create(&InfoLabels {
                ip_family: s.ip_family,
                service_port: s.service_port.clone(),
                protocol: s.protocol,
                scope: s.scope,
                port: s.port.to_string(),
            })
            .set(1);
            let l = ListenerLabels {
                ip_family: s.ip_family,
                service_port: s.service_port.clone(),
                protocol: s.protocol,
                scope: s.scope,
            };
            gauges[0].2.get_or_create(&l).set(to_i64(s.endpoints));
            gauges[1].2.get_or_create(&l).set(to_i64(s.active));
            for (i, v) in [
                s.accepted_total,
                s.dial_failures_total,
                s.no_endpoint_total,
                s.rejected_total,
                s.bytes_total,
            ]
            .into_iter()
            .enumerate()
            {
                counters[i].2.get_or_create(&l).inc_by(v);
            }
        }
        let e = encoder.encode_descriptor(
            "kube_proxy_rs_userspace_listener_info",
            "A userspace-mode proxy socket and the port it listens on",
            None,
            info.metric_type(),
        )?;
        info.encode(e)?;
        for (name, help, fam) in &gauges {
            let e = encoder.encode_descriptor(name, help, None, fam.metric_type())?;
            fam.encode(e)?;
        }
        for (name, help, fam) in &counters {
            let e = encoder.encode_descriptor(name, help, None, fam.metric_type())?;
            fam.encode(e)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Metrics;
    use kp_model::ProxyMode;

    #[derive(Debug)]
    struct Fixed;

    impl UserspaceStats for Fixed {
        fn listeners(&self) -> Vec<UserspaceListenerStats> {
            vec![UserspaceListenerStats {
                ip_family: "IPv4",
                service_port: "ns/web:http".into(),
                protocol: "TCP",
                scope: "internal",
                port: 36001,
                endpoints: 2,
                active: 3,
                accepted_total: 10,
                dial_failures_total: 4,
                no_endpoint_total: 1,
                rejected_total: 2,
                bytes_total: 999,
            }]
        }
        fn table(&self) -> String {
            "TCP 0.0.0.0:36001 ns/web:http internal none 10.0.1.4:80\n".into()
        }
    }

    #[test]
    fn listeners_appear_in_metrics_at_scrape_time() {
        let m = Metrics::new(ProxyMode::Userspace);
        assert!(m.userspace_table().is_none());
        let before = m.encode().unwrap();
        assert!(
            !before.contains("kube_proxy_rs_userspace_listener_info{"),
            "{before}"
        );
        m.set_userspace(Arc::new(Fixed));
        let text = m.encode().unwrap();
        let labels =
            "ip_family=\"IPv4\",service_port=\"ns/web:http\",protocol=\"TCP\",scope=\"internal\"";
        for line in [
            format!("kube_proxy_rs_userspace_listener_info{{{labels},port=\"36001\"}} 1"),
            format!("kube_proxy_rs_userspace_endpoints{{{labels}}} 2"),
            format!("kube_proxy_rs_userspace_open_connections{{{labels}}} 3"),
            format!("kube_proxy_rs_userspace_connections_total{{{labels}}} 10"),
            format!("kube_proxy_rs_userspace_dial_failures_total{{{labels}}} 4"),
            format!("kube_proxy_rs_userspace_no_endpoint_connections_total{{{labels}}} 1"),
            format!("kube_proxy_rs_userspace_rejected_connections_total{{{labels}}} 2"),
            format!("kube_proxy_rs_userspace_bytes_total{{{labels}}} 999"),
        ] {
            assert!(text.contains(&line), "missing {line} in\n{text}");
        }
        assert!(
            m.userspace_table()
                .unwrap()
                .starts_with("TCP 0.0.0.0:36001")
        );
        let other = Metrics::new(ProxyMode::Iptables);
        other.set_userspace(Arc::new(Fixed));
        assert!(!other.encode().unwrap().contains("kube_proxy_rs_userspace"));
    }
}
