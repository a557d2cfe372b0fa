//! iptables mode's nfacct counters in the daemon: the proxier's handle (which creates the
//! counters at every full sync, as upstream does), the dry run's read-only probe, and the
//! reader behind the two `/metrics` counters.
//!
//! Dry run: a dry run must not change the node, so it never creates a counter. It asks the
//! kernel for each counter instead: one that exists, or that does not exist yet on a kernel
//! that has nfacct (`ENOENT`, so the daemon would create it at its first full sync), is
//! printed with its `-m nfacct` match, exactly what the daemon would write; a kernel without
//! nfacct, or a dry run without `CAP_NET_ADMIN` (nfnetlink answers `EPERM`), prints the rules
//! without it (what the daemon writes when it cannot create a counter).

use std::sync::Mutex;

use kp_admin::{NfacctPackets, NfacctReader};
use kp_netlink::{Nfacct, NfacctCounter, NfacctOps};
use kp_proxier::iptables::render::{
    NFACCT_CT_STATE_INVALID_DROPPED, NFACCT_LOCALHOST_NODEPORTS_ACCEPTED,
};
use tracing::{debug, warn};

/// The proxier's nfacct handle for `family`: the kernel's counters, or for a dry run a
/// read-only probe of them; `None` (rules without `-m nfacct`, as upstream when
/// `nfacct.New` fails) when the kernel has no nfacct or cannot be asked.
pub fn proxier_handle(
    dry_run: bool,
    family: kp_model::IpFamily,
) -> Option<Box<dyn NfacctOps + Send>> {
    match Nfacct::new() {
        Ok(n) if dry_run => Some(Box::new(ProbeOnly(n))),
        Ok(n) => Some(Box::new(n)),
        Err(e) => {
            warn!(%family, error = %e, "no nfacct: the iptables rules are written without -m nfacct and the nfacct metrics are not reported");
            None
        }
    }
}

/// A dry run's nfacct: `ensure` only reads (see the module docs); `add` is refused.
#[derive(Debug)]
pub struct ProbeOnly<T>(pub T);

impl<T: NfacctOps> NfacctOps for ProbeOnly<T> {
    fn get(&mut self, name: &str) -> kp_netlink::Result<Option<NfacctCounter>> {
        self.0.get(name)
    }

    fn add(&mut self, name: &str) -> kp_netlink::Result<bool> {
        Err(kp_netlink::Error::Unsupported {
            op: format!("creating nfacct counter {name:?}"),
            reason: "a dry run does not change the node".into(),
        })
    }

    /// The counter exists or could be created: a kernel that answers (found, or `ENOENT`)
    /// has nfacct.
    fn ensure(&mut self, name: &str) -> kp_netlink::Result<()> {
        self.0.get(name).map(|_| ())
    }
}

/// Reads the two counters for `/metrics` at scrape time (upstream's collector); a counter
/// that cannot be read is left out of the scrape.
#[derive(Debug)]
pub struct MetricsReader<T>(pub Mutex<T>);

impl<T: NfacctOps + std::fmt::Debug + Send> NfacctReader for MetricsReader<T> {
    fn read(&self) -> NfacctPackets {
        let Ok(mut n) = self.0.lock() else {
            return NfacctPackets::default();
        };
        let mut packets = |name: &str| match n.get(name) {
            Ok(Some(c)) => Some(c.packets),
            Ok(None) => {
                debug!(counter = name, "nfacct counter does not exist (yet)");
                None
            }
            Err(e) => {
                debug!(counter = name, error = %e, "cannot read the nfacct counter");
                None
            }
        };
        NfacctPackets {
            ct_state_invalid_dropped: packets(NFACCT_CT_STATE_INVALID_DROPPED),
            localhost_nodeports_accepted: packets(NFACCT_LOCALHOST_NODEPORTS_ACCEPTED),
        }
    }
}

/// The reader for `/metrics`, when the kernel has nfacct.
pub fn metrics_reader() -> Option<MetricsReader<Nfacct>> {
    match Nfacct::new() {
        Ok(n) => Some(MetricsReader(Mutex::new(n))),
        Err(e) => {
            debug!(error = %e, "no nfacct: the nfacct metrics are not reported");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kp_netlink::FakeNfacct;

    #[test]
    fn a_dry_run_never_creates_a_counter() {
        let kernel = FakeNfacct::new();
        let mut probe = ProbeOnly(kernel.clone());
        probe.ensure(NFACCT_CT_STATE_INVALID_DROPPED).unwrap();
        assert!(kernel.counters().is_empty(), "nothing created");
        assert!(probe.add("x").is_err());
        kernel.set(NFACCT_CT_STATE_INVALID_DROPPED, 1, 1);
        probe.ensure(NFACCT_CT_STATE_INVALID_DROPPED).unwrap();
        let mut none = ProbeOnly(FakeNfacct::unsupported());
        assert!(none.ensure(NFACCT_CT_STATE_INVALID_DROPPED).is_err());
    }

    #[test]
    fn metrics_read_packets_and_leave_missing_counters_out() {
        let kernel = FakeNfacct::new();
        kernel.set(NFACCT_LOCALHOST_NODEPORTS_ACCEPTED, 12, 720);
        let reader = MetricsReader(Mutex::new(kernel.clone()));
        assert_eq!(
            reader.read(),
            NfacctPackets {
                ct_state_invalid_dropped: None,
                localhost_nodeports_accepted: Some(12),
            }
        );
        let none = MetricsReader(Mutex::new(FakeNfacct::unsupported()));
        assert_eq!(none.read(), NfacctPackets::default());
    }
}
