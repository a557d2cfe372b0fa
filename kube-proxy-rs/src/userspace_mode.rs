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
                        l.endpoints.to_vec(),
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

impl Relays {
    /// Visits at most `limit` listeners after the position `after`, in order (the relays in
    /// turn, each in key order); returns the position to go on from when `limit` were
    /// visited and more may follow, `None` at the end (see
    /// [`kp_admin::UserspaceStats::visit`]). A position is `INDEX KEY` (after `KEY` of
    /// `relays[INDEX]`) or `INDEX` (at the first listener of `relays[INDEX]`).
    fn visit_relays(
        &self,
        after: Option<&str>,
        limit: usize,
        f: &mut dyn FnMut(IpFamily, &kp_relay::ListenerView<'_>),
    ) -> Option<String> {
        let (start, mut key) = match after {
            None => (0, None),
            Some(p) => match p.split_once(' ') {
                Some((i, key)) => (i.parse::<usize>().ok()?, Some(key)),
                None => (p.parse::<usize>().ok()?, None),
            },
        };
        let mut left = limit;
        for (i, (family, relay)) in self.relays.iter().enumerate().skip(start) {
            let mut visited = 0;
            let more = relay.visit_listeners(key.take(), left, &mut |l| {
                visited += 1;
                f(*family, l);
            });
            if let Some(last) = more {
                return Some(format!("{i} {last}"));
            }
            left -= visited;
            if left == 0 {
                return (i + 1 < self.relays.len()).then(|| (i + 1).to_string());
            }
        }
        None
    }
}

impl kp_admin::UserspaceStats for Relays {
    fn visit(
        &self,
        after: Option<&str>,
        limit: usize,
        f: &mut dyn FnMut(&kp_admin::UserspaceListenerStats<'_>),
    ) -> Option<String> {
        self.visit_relays(after, limit, &mut |family, l| {
            let (spn, scope) = split_key(l.key);
            f(&kp_admin::UserspaceListenerStats {
                ip_family: match family {
                    IpFamily::V4 => "IPv4",
                    IpFamily::V6 => "IPv6",
                },
                service_port: spn,
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
        })
    }

    fn table_rows(&self, after: Option<&str>, limit: usize, out: &mut String) -> Option<String> {
        use std::fmt::Write as _;
        if after.is_none() {
            let _ = writeln!(out, "{}", kp_trace::userspace::USERSPACE_TABLE_HEADER);
        }
        self.visit_relays(after, limit, &mut |family, l| {
            let (spn, scope) = split_key(l.key);
            let row = table_row(
                l.protocol == kp_relay::Protocol::Udp,
                SocketAddr::new(wildcard(family), l.port),
                spn.to_string(),
                scope,
                l.affinity,
                l.endpoints.to_vec(),
            );
            let _ = writeln!(out, "{row}");
        })
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

    /// Two relays (the families of a dual-stack node) are visited in batches across their
    /// boundary: every listener once, in order, and the table's rows the same way.
    #[test]
    fn relays_are_visited_in_batches_across_families() {
        use kp_admin::UserspaceStats as _;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let relay = |n: usize, endpoint: SocketAddr| {
            let r = Relay::new(
                RelayConfig {
                    bind: Ipv4Addr::LOCALHOST.into(),
                    ..RelayConfig::default()
                },
                rt.handle().clone(),
            );
            let specs: BTreeMap<String, ListenerSpec> = (0..n)
                .map(|i| {
                    (
                        format!("ns/svc-{i}:http"),
                        ListenerSpec {
                            name: format!("ns/svc-{i}:http"),
                            protocol: kp_relay::Protocol::Tcp,
                            affinity: None,
                            endpoints: Arc::from([endpoint]),
                        },
                    )
                })
                .collect();
            assert!(r.apply(&specs).values().all(Result::is_ok));
            r
        };
        let relays = Relays {
            relays: vec![
                (IpFamily::V4, relay(3, "10.0.0.1:80".parse().unwrap())),
                (IpFamily::V6, relay(2, "[fd00::1]:80".parse().unwrap())),
            ],
        };
        for limit in [1, 2, 3, 5, 100] {
            let mut seen = Vec::new();
            let mut after: Option<String> = None;
            loop {
                let more = relays.visit(after.as_deref(), limit, &mut |s| {
                    seen.push(format!("{} {}", s.ip_family, s.service_port));
                });
                match more {
                    Some(p) => after = Some(p),
                    None => break,
                }
            }
            assert_eq!(
                seen,
                [
                    "IPv4 ns/svc-0:http",
                    "IPv4 ns/svc-1:http",
                    "IPv4 ns/svc-2:http",
                    "IPv6 ns/svc-0:http",
                    "IPv6 ns/svc-1:http"
                ],
                "limit {limit}"
            );
        }
        let mut table = String::new();
        let mut after = relays.table_rows(None, 2, &mut table);
        while let Some(p) = after {
            after = relays.table_rows(Some(&p), 2, &mut table);
        }
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 6, "{table}");
        assert_eq!(lines[0], kp_trace::userspace::USERSPACE_TABLE_HEADER);
        assert!(lines[4].starts_with("TCP [::]:"), "{table}");
        assert!(
            lines[4].ends_with(" ns/svc-0:http internal none [fd00::1]:80"),
            "{table}"
        );
        let parsed = kp_trace::UserspaceTable::parse(&table).unwrap();
        assert_eq!(parsed.listeners.len(), 5);
    }
}
