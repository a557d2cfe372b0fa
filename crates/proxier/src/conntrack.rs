//! UDP stale-conntrack cleanup, shared by every mode (upstream's conntrack reconciler,
//! kubernetes#59368, #48370, #125467).
//!
//! UDP has no connection teardown: a conntrack entry created for a client that reuses one
//! source port (a DNS resolver, a statsd or syslog sender) keeps sending its datagrams to the
//! endpoint chosen when the entry was created, even after that endpoint is gone, and an entry
//! created while the Service had no endpoints keeps black-holing traffic after endpoints
//! appear. After a sync, [`stale_udp_flows`] picks the UDP entries whose original destination
//! is a Service address (cluster IP, external IP, load-balancer IP) and port, or whose
//! original destination port is a NodePort, but whose reply source is not one of that
//! Service port's serving endpoints; [`cleanup_udp`] deletes them over netlink. As upstream
//! does, traffic policies, topology and terminating state are ignored: any serving endpoint
//! keeps its entries.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use kp_model::{Changes, NamespacedName, Protocol, Snapshot};
use kp_netlink::{ConntrackOps, Family, Flow, proto};

/// What a Service port's UDP entries may legitimately point to.
#[derive(Debug, Default)]
struct UdpServices {
    /// (Service address, port) → serving endpoint IPs.
    by_vip: HashMap<(IpAddr, u16), HashSet<IpAddr>>,
    /// NodePort → serving endpoint IPs.
    by_node_port: HashMap<u16, HashSet<IpAddr>>,
}

impl UdpServices {
    fn of(snap: &Snapshot) -> Self {
        let mut out = UdpServices::default();
        for (spn, svc) in &snap.services {
            if spn.protocol != Protocol::Udp {
                continue;
            }
            let serving: HashSet<IpAddr> = snap
                .endpoints_of(spn)
                .iter()
                .filter(|e| e.serving)
                .map(|e| e.ip)
                .collect();
            for ip in std::iter::once(&svc.cluster_ip)
                .chain(&svc.external_ips)
                .chain(&svc.load_balancer_vips)
            {
                out.by_vip
                    .entry((*ip, svc.port))
                    .or_default()
                    .extend(serving.iter().copied());
            }
            if let Some(np) = svc.node_port {
                out.by_node_port
                    .entry(np)
                    .or_default()
                    .extend(serving.iter().copied());
            }
        }
        out
    }

    fn is_stale(&self, flow: &Flow) -> bool {
        if flow.original.proto != proto::UDP {
            return false;
        }
        let reply_src = flow.reply.src;
        if let Some(serving) = self
            .by_vip
            .get(&(flow.original.dst, flow.original.dst_port))
        {
            return !serving.contains(&reply_src);
        }
        if let Some(serving) = self.by_node_port.get(&flow.original.dst_port) {
            return !serving.contains(&reply_src);
        }
        false
    }
}

/// The UDP entries among `flows` that point where `snap` no longer sends traffic.
pub fn stale_udp_flows<'a>(snap: &Snapshot, flows: &'a [Flow]) -> Vec<&'a Flow> {
    let services = UdpServices::of(snap);
    flows.iter().filter(|f| services.is_stale(f)).collect()
}

/// The UDP Services of `snap` (by name), to decide whether a change needs a cleanup.
pub fn udp_services(snap: &Snapshot) -> HashSet<NamespacedName> {
    snap.services
        .keys()
        .filter(|spn| spn.protocol == Protocol::Udp)
        .map(|spn| spn.service.clone())
        .collect()
}

/// Errors of a cleanup (the sync itself already succeeded).
#[derive(Debug, thiserror::Error)]
#[error("conntrack cleanup: {0}")]
pub struct CleanupError(#[from] kp_netlink::Error);

/// Dumps the family's UDP entries and deletes the stale ones; returns how many were deleted.
/// Entries that vanished in the meantime are not errors.
///
/// # Errors
/// [`CleanupError`] when the dump or a delete fails.
pub fn cleanup_udp(
    ops: &mut (dyn ConntrackOps + Send),
    snap: &Snapshot,
) -> Result<usize, CleanupError> {
    let family = match snap.family {
        kp_model::IpFamily::V4 => Family::V4,
        kp_model::IpFamily::V6 => Family::V6,
    };
    let flows = ops.dump(family, Some(proto::UDP))?;
    let mut deleted = 0;
    for flow in stale_udp_flows(snap, &flows) {
        if ops.delete(flow)? {
            tracing::debug!(%flow, "deleted stale UDP conntrack entry");
            deleted += 1;
        }
    }
    Ok(deleted)
}

/// The UDP conntrack cleanup as a proxier runs it after each successful sync: it remembers
/// which Services had UDP ports at the previous sync, and cleans up after a full sync or
/// when a changed Service has (or had) a UDP port. Without netlink access
/// ([`UdpCleanup::disabled`]) it does nothing.
#[derive(Default)]
pub struct UdpCleanup {
    ops: Option<Box<dyn ConntrackOps + Send>>,
    udp_services: HashSet<NamespacedName>,
}

impl UdpCleanup {
    /// A cleanup that never touches conntrack.
    pub fn disabled() -> Self {
        Self::default()
    }

    /// A cleanup that deletes stale entries through `ops`.
    pub fn new(ops: Box<dyn ConntrackOps + Send>) -> Self {
        UdpCleanup {
            ops: Some(ops),
            udp_services: HashSet::new(),
        }
    }

    /// Runs after a successful sync of `snap` with `changes` (`full`: a full sync): how many
    /// entries were deleted and how long the reconciliation took (`None` when it did not run:
    /// no netlink access, or no UDP Service changed in a partial sync). A failure is logged,
    /// not returned: the sync itself stands, and the entries expire on their own; its time is
    /// still reported, as upstream observes `kubeproxy_conntrack_reconciler_sync_duration_seconds`
    /// whatever the outcome.
    pub fn after_sync(&mut self, snap: &Snapshot, changes: &Changes, full: bool) -> Reconciled {
        let now = udp_services(snap);
        let needed = full
            || changes
                .services
                .iter()
                .any(|s| now.contains(s) || self.udp_services.contains(s));
        self.udp_services = now;
        let Some(ops) = self.ops.as_mut() else {
            return Reconciled::default();
        };
        if !needed {
            return Reconciled::default();
        }
        let started = std::time::Instant::now();
        let result = cleanup_udp(ops.as_mut(), snap);
        let duration = Some(started.elapsed());
        match result {
            Ok(n) => {
                if n > 0 {
                    tracing::info!(family = %snap.family, deleted = n, "deleted stale UDP conntrack entries");
                }
                Reconciled {
                    deleted: n,
                    duration,
                }
            }
            Err(e) => {
                tracing::warn!(family = %snap.family, error = %e, "UDP conntrack cleanup failed; stale entries may remain until they expire");
                Reconciled {
                    deleted: 0,
                    duration,
                }
            }
        }
    }
}

/// What one [`UdpCleanup::after_sync`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Stale UDP entries deleted.
    pub deleted: usize,
    /// How long the reconciliation (the dump and the deletes) took; `None` when it did not
    /// run.
    pub duration: Option<std::time::Duration>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use kp_model::IpFamily;
    use kp_netlink::FakeConntrack;
    use kp_testkit::builders::{ServiceBuilder, SliceBuilder, snapshot};

    fn sa(s: &str) -> std::net::SocketAddr {
        s.parse().unwrap()
    }

    fn snap() -> Snapshot {
        snapshot(
            IpFamily::V4,
            "n1",
            vec![
                ServiceBuilder::new("dns", "10.96.0.10")
                    .tcp("dns-tcp", 53)
                    .udp("dns", 53)
                    .node_port(30053)
                    .build(),
                ServiceBuilder::new("empty", "10.96.0.11")
                    .udp("", 514)
                    .build(),
                ServiceBuilder::new("web", "10.96.0.12").tcp("", 80).build(),
            ],
            vec![
                SliceBuilder::new("dns")
                    .port_proto("dns", Protocol::Udp, 5353)
                    .port_proto("dns-tcp", Protocol::Tcp, 5353)
                    .ready("10.0.0.5", "n1")
                    .endpoint("10.0.0.6", "n2", false, true, true)
                    .build(),
            ],
        )
    }

    #[test]
    fn picks_entries_to_gone_endpoints_and_undnated_entries() {
        let client = sa("10.0.1.9:40000");
        let flows = vec![
            Flow::udp(client, sa("10.96.0.10:53"), sa("10.0.0.5:5353")), // serving: keep
            Flow::udp(client, sa("10.96.0.10:53"), sa("10.0.0.6:5353")), // serving+terminating: keep
            Flow::udp(client, sa("10.96.0.10:53"), sa("10.0.0.9:5353")), // endpoint gone: stale
            Flow::udp(client, sa("10.96.0.11:514"), sa("10.96.0.11:514")), // no endpoints: stale
            Flow::udp(client, sa("192.168.56.10:30053"), sa("10.0.0.9:5353")), // NodePort, gone: stale
            Flow::udp(client, sa("192.168.56.10:30053"), sa("10.0.0.5:5353")), // NodePort, serving: keep
            Flow::udp(client, sa("10.96.0.12:80"), sa("10.0.0.9:80")), // not a UDP Service: keep
            Flow::udp(client, sa("8.8.8.8:53"), sa("8.8.8.8:53")),     // not a Service: keep
        ];
        let stale: Vec<String> = stale_udp_flows(&snap(), &flows)
            .iter()
            .map(|f| f.reply.src.to_string())
            .collect();
        assert_eq!(stale, ["10.0.0.9", "10.96.0.11", "10.0.0.9"]);
    }

    #[test]
    fn cleanup_deletes_through_the_seam() {
        let client = sa("10.0.1.9:40000");
        // Two clients (the kernel holds one entry per original tuple).
        let other = sa("10.0.1.9:40001");
        let mut fake = FakeConntrack::with_flows(vec![
            Flow::udp(client, sa("10.96.0.10:53"), sa("10.0.0.5:5353")),
            Flow::udp(other, sa("10.96.0.10:53"), sa("10.0.0.9:5353")),
        ]);
        assert_eq!(fake.flows().len(), 2);
        assert_eq!(cleanup_udp(&mut fake, &snap()).unwrap(), 1);
        assert_eq!(fake.flows().len(), 1);
        assert_eq!(cleanup_udp(&mut fake, &snap()).unwrap(), 0);
    }
}
