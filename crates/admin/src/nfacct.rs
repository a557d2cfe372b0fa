//! iptables mode's two nfacct metrics (upstream `pkg/proxy/metrics`, its
//! `nfacctMetricCollector`):
//!
//! | metric | type | labels | nfacct counter |
//! |---|---|---|---|
//! | `kubeproxy_iptables_ct_state_invalid_dropped_packets_total` | counter | | `ct_state_invalid_dropped_pkts` (the `KUBE-FORWARD` INVALID drop) |
//! | `kubeproxy_iptables_localhost_nodeports_accepted_packets_total` | counter | | `localhost_nps_accepted_pkts` (NodePorts reached on 127.0.0.0/8) |
//!
//! As upstream's collector, the values are the counters' packet counts read from the kernel
//! at scrape time (through [`NfacctReader`]), and a counter that cannot be read (no nfacct in
//! the kernel, or it was never created) leaves its metric out of the scrape rather than
//! reporting 0. Registered in iptables mode only; without a reader
//! ([`crate::Metrics::set_nfacct`]) neither metric appears.

use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;

/// The counters' packets now; `None` for one that cannot be read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NfacctPackets {
    /// Packets of `ct_state_invalid_dropped_pkts`.
    pub ct_state_invalid_dropped: Option<u64>,
    /// Packets of `localhost_nps_accepted_pkts`.
    pub localhost_nodeports_accepted: Option<u64>,
}

/// Where the collector reads the counters (the binary's nfacct handle).
pub trait NfacctReader: std::fmt::Debug + Send + Sync {
    /// The counters now.
    fn read(&self) -> NfacctPackets;
}

/// The slot a daemon fills with its reader.
pub(crate) type ReaderSlot = Arc<Mutex<Option<Arc<dyn NfacctReader>>>>;

/// The collector registered in iptables mode.
#[derive(Debug)]
pub(crate) struct NfacctCollector {
    pub(crate) slot: ReaderSlot,
}

/// Name (without `_total`, which the encoder appends to a counter's descriptor and sample)
/// and help of each metric.
const CT_STATE_INVALID: (&str, &str) = (
    "kubeproxy_iptables_ct_state_invalid_dropped_packets",
    "[ALPHA] packets dropped by iptables to work around conntrack problems",
);
const LOCALHOST_NODEPORTS: (&str, &str) = (
    "kubeproxy_iptables_localhost_nodeports_accepted_packets",
    "[ALPHA] Number of packets accepted on nodeports of loopback interface",
);

impl Collector for NfacctCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let reader = self.slot.lock().ok().and_then(|s| s.clone());
        let Some(reader) = reader else {
            return Ok(());
        };
        let packets = reader.read();
        for ((name, help), value) in [
            (CT_STATE_INVALID, packets.ct_state_invalid_dropped),
            (LOCALHOST_NODEPORTS, packets.localhost_nodeports_accepted),
        ] {
            if let Some(v) = value {
                let counter = ConstCounter::new(v);
                let e = encoder.encode_descriptor(name, help, None, counter.metric_type())?;
                counter.encode(e)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Metrics, ProxyMode};

    #[derive(Debug)]
    struct Fixed(NfacctPackets);

    impl NfacctReader for Fixed {
        fn read(&self) -> NfacctPackets {
            self.0
        }
    }

    #[test]
    fn counters_are_read_at_scrape_time_and_missing_ones_left_out() {
        let m = Metrics::new(ProxyMode::Iptables);
        assert!(!m.encode().unwrap().contains("nodeports_accepted"));
        m.set_nfacct(Arc::new(Fixed(NfacctPackets {
            ct_state_invalid_dropped: Some(7),
            localhost_nodeports_accepted: Some(42),
        })));
        let text = m.encode().unwrap();
        for line in [
            // As upstream's Go registry prints them (name with `_total`, no final period).
            "# HELP kubeproxy_iptables_ct_state_invalid_dropped_packets_total [ALPHA] packets dropped by iptables to work around conntrack problems",
            "# TYPE kubeproxy_iptables_ct_state_invalid_dropped_packets_total counter",
            "kubeproxy_iptables_ct_state_invalid_dropped_packets_total 7",
            "# HELP kubeproxy_iptables_localhost_nodeports_accepted_packets_total [ALPHA] Number of packets accepted on nodeports of loopback interface",
            "# TYPE kubeproxy_iptables_localhost_nodeports_accepted_packets_total counter",
            "kubeproxy_iptables_localhost_nodeports_accepted_packets_total 42",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
        m.set_nfacct(Arc::new(Fixed(NfacctPackets {
            ct_state_invalid_dropped: Some(8),
            localhost_nodeports_accepted: None,
        })));
        let text = m.encode().unwrap();
        assert!(text.contains("kubeproxy_iptables_ct_state_invalid_dropped_packets_total 8\n"));
        assert!(!text.contains("localhost_nodeports"), "{text}");
    }

    #[test]
    fn only_iptables_mode_has_them() {
        for mode in [ProxyMode::Nftables, ProxyMode::Ipvs, ProxyMode::Userspace] {
            let m = Metrics::new(mode);
            m.set_nfacct(Arc::new(Fixed(NfacctPackets {
                ct_state_invalid_dropped: Some(1),
                localhost_nodeports_accepted: Some(1),
            })));
            assert!(
                !m.encode().unwrap().contains("kubeproxy_iptables_"),
                "{mode:?}"
            );
        }
    }
}
