//! Userspace mode in the binary: the relay configuration from the flags
//! (`--proxy-port-range`, `--udp-timeout`, `--userspace-max-connections`), the adapter that
//! lets the proxier drive `kp-relay`, the numbers `/metrics` and `/userspace` read from the
//! relays, and the dry run's listener table.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::bail;
use kp_model::{IpFamily, Protocol};
use kp_proxier::userspace::{FakeRelay, Listener, PortalRelay, Scope};
use kp_relay::{ListenerSpec, Relay, RelayConfig};
use kp_trace::{UserspaceListener, UserspaceTable};

use crate::cli::ProxyArgs;

/// Parses `--proxy-port-range`: `BEGIN-END` (inclusive), `BEGIN+COUNT` (BEGIN to
/// BEGIN+COUNT, as upstream), a single port, or empty (the kernel picks).
///
/// # Errors
/// A message naming the flag when the text is not a range of ports within 1..=65535.
pub fn port_range(text: &str) -> anyhow::Result<Option<(u16, u16)>> {
    let t = text.trim();
    if t.is_empty() {
        return Ok(None);
    }
    let port = |s: &str| -> anyhow::Result<u16> {
        match s.trim().parse::<u16>() {
            Ok(p) if p > 0 => Ok(p),
            _ => bail!("--proxy-port-range {t:?}: {s:?} is not a port (1-65535)"),
        }
    };
    let (begin, end) = if let Some((a, b)) = t.split_once('-') {
        (port(a)?, port(b)?)
    } else if let Some((a, n)) = t.split_once('+') {
        let begin = port(a)?;
        let Ok(count) = n.trim().parse::<u16>() else {
            bail!("--proxy-port-range {t:?}: {n:?} is not a port count");
        };
        let Some(end) = begin.checked_add(count) else {
            bail!("--proxy-port-range {t:?} goes past port 65535");
        };
        (begin, end)
    } else {
        let p = port(t)?;
        (p, p)
    };
    if begin > end {
        bail!("--proxy-port-range {t:?}: the first port is above the last");
    }
    Ok(Some((begin, end)))
}

/// The relay settings of one family.
///
/// # Errors
/// A bad `--proxy-port-range`, or `--userspace-max-connections 0`.
pub fn relay_config(args: &ProxyArgs, family: IpFamily) -> anyhow::Result<RelayConfig> {
    if args.compat.userspace_max_connections == 0 {
        bail!("--userspace-max-connections must be at least 1");
    }
    if args.compat.udp_timeout.is_zero() {
        bail!("--udp-timeout must be above 0");
    }
    Ok(RelayConfig {
        bind: wildcard(family),
        port_range: port_range(&args.compat.proxy_port_range)?,
        udp_timeout: args.compat.udp_timeout,
        max_connections: args.compat.userspace_max_connections,
        ..RelayConfig::default()
    })
}

fn wildcard(family: IpFamily) -> IpAddr {
    match family {
        IpFamily::V4 => Ipv4Addr::UNSPECIFIED.into(),
        IpFamily::V6 => Ipv6Addr::UNSPECIFIED.into(),
    }
}

fn relay_protocol(p: Protocol) -> kp_relay::Protocol {
    match p {
        Protocol::Udp => kp_relay::Protocol::Udp,
        // The proxier never asks for SCTP.
        Protocol::Tcp | Protocol::Sctp => kp_relay::Protocol::Tcp,
    }
}

/// The proxier's [`PortalRelay`] over a `kp-relay` [`Relay`].
pub struct LiveRelay {
    /// The relay (shared with the metrics).
    pub relay: Relay,
}

impl PortalRelay for LiveRelay {
    fn serve(&mut self, listeners: &[Listener]) -> Vec<Result<u16, String>> {
        let specs: BTreeMap<String, ListenerSpec> = listeners
            .iter()
            .map(|l| {
                (
                    l.key(),
                    ListenerSpec {
                        name: l.service.to_string(),
                        protocol: relay_protocol(l.protocol),
                        affinity: l.affinity,
                        endpoints: l.endpoints.clone(),
                    },
                )
            })
            .collect();
        let mut ports = self.relay.apply(&specs);
        listeners
            .iter()
            .map(|l| match ports.remove(&l.key()) {
                Some(Ok(port)) => Ok(port),
                Some(Err(e)) => Err(e.to_string()),
                None => Err("the relay did not answer for this listener".into()),
            })
            .collect()
    }
}

/// The dry run's relay: ports handed out from 36000 (the dry run opens nothing), and the
/// table it would serve kept for printing.
pub struct DryRelay {
    fake: FakeRelay,
    family: IpFamily,
    /// The listener table after the last sync.
    pub sink: Arc<Mutex<String>>,
}

impl DryRelay {
    /// A dry-run relay for `family` printing its table into `sink`.
    pub fn new(family: IpFamily, sink: Arc<Mutex<String>>) -> DryRelay {
        DryRelay {
            fake: FakeRelay::new(36000),
            family,
            sink,
        }
    }
}

impl PortalRelay for DryRelay {
    fn serve(&mut self, listeners: &[Listener]) -> Vec<Result<u16, String>> {
        let ports = self.fake.serve(listeners);
        let table = UserspaceTable {
            listeners: listeners
                .iter()
                .zip(&ports)
                .filter_map(|(l, p)| {
                    let port = *p.as_ref().ok()?;
                    Some(table_row(
                        l.protocol == Protocol::Udp,
                        SocketAddr::new(wildcard(self.family), port),
                        l.service.to_string(),
                        l.scope,
                        l.affinity,
                        l.endpoints.clone(),
                    ))
                })
                .collect(),
        };
        if let Ok(mut s) = self.sink.lock() {
            *s = table.to_string();
        }
        ports
    }
}

fn table_row(
    udp: bool,
    listen: SocketAddr,
    service: String,
    scope: Scope,
    affinity: Option<Duration>,
    endpoints: Vec<SocketAddr>,
) -> UserspaceListener {
    UserspaceListener {
        protocol: if udp {
            kp_trace::Proto::Udp
        } else {
            kp_trace::Proto::Tcp
        },
        listen,
        service,
        scope: match scope {
            Scope::Internal => kp_trace::ListenerScope::Internal,
            Scope::External => kp_trace::ListenerScope::External,
            Scope::Cluster => kp_trace::ListenerScope::Cluster,
        },
        affinity: affinity.map(|d| u32::try_from(d.as_secs()).unwrap_or(u32::MAX)),
        endpoints,
    }
}

/// The relays of a userspace-mode daemon, one per family: the source of `/metrics`'
/// userspace numbers and of `/userspace`.
#[derive(Debug, Clone, Default)]
pub struct Relays {
    /// `(family, relay)`.
    pub relays: Vec<(IpFamily, Relay)>,
}

/// Splits a relay key (`SPN`, `SPN external` or `SPN cluster`, see
/// [`Listener::key`]) into the ServicePortName text and the listener's scope.
fn split_key(key: &str) -> (&str, Scope) {
    if let Some(spn) = key.strip_suffix(" external") {
        (spn, Scope::External)
    } else if let Some(spn) = key.strip_suffix(" cluster") {
        (spn, Scope::Cluster)
    } else {
        (key, Scope::Internal)
    }
}

impl kp_admin::UserspaceStats for Relays {
    fn listeners(&self) -> Vec<kp_admin::UserspaceListenerStats> {
        let mut out = Vec::new();
        for (family, relay) in &self.relays {
            for l in relay.listeners() {
                let (spn, scope) = split_key(&l.key);
                out.push(kp_admin::UserspaceListenerStats {
                    ip_family: match family {
                        IpFamily::V4 => "IPv4",
                        IpFamily::V6 => "IPv6",
                    },
                    service_port: spn.to_string(),
                    protocol: match l.protocol {
                        kp_relay::Protocol::Tcp => "TCP",
                        kp_relay::Protocol::Udp => "UDP",
                    },
                    scope: scope.as_str(),
                    port: l.port,
                    endpoints: l.endpoints.len(),
                    active: l.active,
                    accepted_total: l.accepted_total,
                    dial_failures_total: l.dial_failures_total,
                    no_endpoint_total: l.no_endpoint_total,
                    rejected_total: l.rejected_total,
                    bytes_total: l.bytes_total,
                });
            }
        }
        out
    }

    fn table(&self) -> String {
        let mut table = UserspaceTable::default();
        for (family, relay) in &self.relays {
            for l in relay.listeners() {
                let (spn, scope) = split_key(&l.key);
                table.listeners.push(table_row(
                    l.protocol == kp_relay::Protocol::Udp,
                    SocketAddr::new(wildcard(*family), l.port),
                    spn.to_string(),
                    scope,
                    l.affinity,
                    l.endpoints.clone(),
                ));
            }
        }
        table.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_ranges_parse_as_upstream() {
        assert_eq!(port_range("").unwrap(), None);
        assert_eq!(port_range("30000-30100").unwrap(), Some((30000, 30100)));
        assert_eq!(port_range("30000+10").unwrap(), Some((30000, 30010)));
        assert_eq!(port_range("30000").unwrap(), Some((30000, 30000)));
        for bad in ["0-10", "10-5", "a-b", "65000+1000", "70000", "1-"] {
            let e = port_range(bad).unwrap_err().to_string();
            assert!(e.contains("--proxy-port-range"), "{bad}: {e}");
        }
    }

    #[test]
    fn keys_split() {
        assert_eq!(
            split_key("ns/web:http external"),
            ("ns/web:http", Scope::External)
        );
        assert_eq!(
            split_key("ns/web:http cluster"),
            ("ns/web:http", Scope::Cluster)
        );
        assert_eq!(split_key("ns/web:http"), ("ns/web:http", Scope::Internal));
    }
}
