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
//! The text is written from the listeners at scrape time, in pieces: [`Chunks`] visits
//! [`BATCH`] listeners at a time ([`UserspaceStats::visit`]) and makes one piece of the
//! response of each batch, so a scrape holds about one piece whatever the number of
//! listeners (at 10,000 Services the text is ~12 MB; it used to be built whole, with a label
//! map per metric, and raised the daemon's peak by ~28 MiB). Series of one metric are in
//! listener order (IP family, then ServicePortName); between two pieces a sync may change
//! the listeners, so one scrape can mix the listeners of two moments (never a series twice
//! within a metric, since the visit goes on after the last listener it saw). The
//! `/userspace` table is served the same way ([`UserspaceStats::table_rows`]).
//!
//! `scope` is `internal` for a listener serving a Service port's ClusterIP (and its external
//! destinations when they use the same endpoints), `external` for the second listener a
//! port gets when its external destinations use other endpoints (`externalTrafficPolicy:
//! Local`), and `cluster` for the one that takes pod and node traffic to those destinations
//! to every endpoint when both traffic policies are Local.

use std::sync::{Arc, Mutex};

/// Listeners visited per batch (per piece of the response).
pub const BATCH: usize = 256;

/// One listener's numbers, borrowed from the relay while it is visited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UserspaceListenerStats<'a> {
    /// `IPv4` or `IPv6`.
    pub ip_family: &'static str,
    /// The ServicePortName text (`namespace/name:port`).
    pub service_port: &'a str,
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

/// Where the numbers come from (the daemon's relays), a batch of listeners at a time.
///
/// A position is an opaque text that a visit returned; a visit that starts after it goes on
/// with the next listener in the same order, even if listeners were added or removed since.
pub trait UserspaceStats: std::fmt::Debug + Send + Sync {
    /// Calls `f` with at most `limit` listeners, in order (IP family, then key), starting
    /// after the position `after` (`None`: at the first). Returns the position of the last
    /// listener visited when `limit` listeners were visited (more may follow), `None` when
    /// the visit reached the end.
    fn visit(
        &self,
        after: Option<&str>,
        limit: usize,
        f: &mut dyn FnMut(&UserspaceListenerStats<'_>),
    ) -> Option<String>;

    /// The proxy table (`kp_trace`'s userspace table text, served on `/userspace`) in the
    /// same batches: appends the rows of at most `limit` listeners after `after` to `out`
    /// (the first batch, `after == None`, starts with the table's header line) and returns
    /// the position as [`visit`](Self::visit) does.
    fn table_rows(&self, after: Option<&str>, limit: usize, out: &mut String) -> Option<String>;
}

/// The slot a daemon fills once its relays exist.
pub(crate) type StatsSlot = Arc<Mutex<Option<Arc<dyn UserspaceStats>>>>;

/// One metric of the table in the module docs.
struct Metric {
    /// The name without the `_total` a counter gets.
    name: &'static str,
    help: &'static str,
    counter: bool,
    /// `kube_proxy_rs_userspace_listener_info`: value 1 and a `port` label.
    info: bool,
    value: fn(&UserspaceListenerStats<'_>) -> u64,
}

fn usize_value(n: usize) -> u64 {
    // As a gauge's i64 prints it.
    u64::try_from(i64::try_from(n).unwrap_or(i64::MAX)).unwrap_or(u64::MAX)
}

/// The metrics, in the order `/metrics` shows them.
const METRICS: [Metric; 8] = [
    Metric {
        name: "kube_proxy_rs_userspace_listener_info",
        help: "A userspace-mode proxy socket and the port it listens on",
        counter: false,
        info: true,
        value: |_| 1,
    },
    Metric {
        name: "kube_proxy_rs_userspace_endpoints",
        help: "Endpoints a userspace-mode proxy socket sends connections to",
        counter: false,
        info: false,
        value: |s| usize_value(s.endpoints),
    },
    Metric {
        name: "kube_proxy_rs_userspace_open_connections",
        help: "TCP connections and UDP flows a userspace-mode proxy socket has open",
        counter: false,
        info: false,
        value: |s| usize_value(s.active),
    },
    Metric {
        name: "kube_proxy_rs_userspace_connections",
        help: "TCP connections accepted and UDP flows created by a userspace-mode proxy socket",
        counter: true,
        info: false,
        value: |s| s.accepted_total,
    },
    Metric {
        name: "kube_proxy_rs_userspace_dial_failures",
        help: "Backend connects of a userspace-mode proxy socket that failed (each retry counts)",
        counter: true,
        info: false,
        value: |s| s.dial_failures_total,
    },
    Metric {
        name: "kube_proxy_rs_userspace_no_endpoint_connections",
        help: "Clients a userspace-mode proxy socket closed because no endpoint answered or none existed",
        counter: true,
        info: false,
        value: |s| s.no_endpoint_total,
    },
    Metric {
        name: "kube_proxy_rs_userspace_rejected_connections",
        help: "Clients refused at --userspace-max-connections",
        counter: true,
        info: false,
        value: |s| s.rejected_total,
    },
    Metric {
        name: "kube_proxy_rs_userspace_bytes",
        help: "Bytes a userspace-mode proxy socket relayed, both directions",
        counter: true,
        info: false,
        value: |s| s.bytes_total,
    },
];

impl Metric {
    fn full_name(&self, out: &mut String) {
        out.push_str(self.name);
        if self.counter {
            out.push_str("_total");
        }
    }

    /// `# HELP` and `# TYPE`, as the Prometheus text format 0.0.4 writes them.
    fn descriptor(&self, out: &mut String) {
        out.push_str("# HELP ");
        self.full_name(out);
        out.push(' ');
        out.push_str(self.help);
        out.push_str("\n# TYPE ");
        self.full_name(out);
        out.push_str(if self.counter {
            " counter\n"
        } else {
            " gauge\n"
        });
    }

    /// One series: `NAME{LABELS} VALUE`.
    fn series(&self, out: &mut String, s: &UserspaceListenerStats<'_>) {
        use std::fmt::Write as _;
        self.full_name(out);
        out.push_str("{ip_family=\"");
        label_value(out, s.ip_family);
        out.push_str("\",service_port=\"");
        label_value(out, s.service_port);
        out.push_str("\",protocol=\"");
        label_value(out, s.protocol);
        out.push_str("\",scope=\"");
        label_value(out, s.scope);
        if self.info {
            let _ = write!(out, "\",port=\"{}", s.port);
        }
        let _ = writeln!(out, "\"}} {}", (self.value)(s));
    }
}

/// A label value, escaped as the text format wants (`\\`, `\"`, `\n`).
fn label_value(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// The size a piece of the response grows to before it is handed out (it may exceed it by
/// one batch).
const PIECE: usize = 64 * 1024;

/// The userspace metrics' text in pieces, each made when it is asked for (see the module
/// docs). Without a source (before the daemon's relays exist) only the descriptors.
pub(crate) struct Chunks {
    source: Option<Arc<dyn UserspaceStats>>,
    /// Index into [`METRICS`]; its length when done.
    metric: usize,
    /// Where the current metric's visit goes on.
    after: Option<String>,
    /// Whether the current metric's descriptor was written.
    started: bool,
}

impl Chunks {
    pub(crate) fn new(source: Option<Arc<dyn UserspaceStats>>) -> Chunks {
        Chunks {
            source,
            metric: 0,
            after: None,
            started: false,
        }
    }
}

impl Iterator for Chunks {
    type Item = String;

    fn next(&mut self) -> Option<String> {
        if self.metric >= METRICS.len() {
            return None;
        }
        let mut out = String::with_capacity(PIECE + PIECE / 2);
        while out.len() < PIECE && self.metric < METRICS.len() {
            let m = &METRICS[self.metric];
            if !self.started {
                m.descriptor(&mut out);
                self.started = true;
            }
            let more = match &self.source {
                Some(source) => {
                    source.visit(self.after.as_deref(), BATCH, &mut |s| m.series(&mut out, s))
                }
                None => None,
            };
            match more {
                Some(position) => self.after = Some(position),
                None => {
                    self.metric += 1;
                    self.after = None;
                    self.started = false;
                }
            }
        }
        Some(out)
    }
}

/// The `/userspace` table in pieces of [`BATCH`] listeners, each made when it is asked for.
pub(crate) struct TableChunks {
    source: Arc<dyn UserspaceStats>,
    after: Option<String>,
    done: bool,
}

impl TableChunks {
    pub(crate) fn new(source: Arc<dyn UserspaceStats>) -> TableChunks {
        TableChunks {
            source,
            after: None,
            done: false,
        }
    }
}

impl Iterator for TableChunks {
    type Item = String;

    fn next(&mut self) -> Option<String> {
        if self.done {
            return None;
        }
        let mut out = String::new();
        match self
            .source
            .table_rows(self.after.as_deref(), BATCH, &mut out)
        {
            Some(position) => self.after = Some(position),
            None => self.done = true,
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Metrics;
    use kp_model::ProxyMode;
    use prometheus_client::encoding::EncodeLabelSet;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge;
    use prometheus_client::registry::Registry;

    /// `n` listeners (`ns-I/svc-I:http`, one in three UDP and `external`), visited by
    /// index; the position is the index of the last one visited.
    #[derive(Debug)]
    struct Many {
        names: Vec<String>,
    }

    impl Many {
        fn new(n: usize) -> Many {
            Many {
                names: (0..n)
                    .map(|i| format!("ns-{}/svc-{i}:http", i % 7))
                    .collect(),
            }
        }

        fn stats(&self, i: usize) -> UserspaceListenerStats<'_> {
            let n = i as u64;
            UserspaceListenerStats {
                ip_family: if i.is_multiple_of(2) { "IPv4" } else { "IPv6" },
                service_port: &self.names[i],
                protocol: if i.is_multiple_of(3) { "UDP" } else { "TCP" },
                scope: if i.is_multiple_of(3) {
                    "external"
                } else {
                    "internal"
                },
                port: 30000 + (i % 30000) as u16,
                endpoints: i % 11,
                active: i % 5,
                accepted_total: n * 3,
                dial_failures_total: n % 4,
                no_endpoint_total: n % 2,
                rejected_total: n % 3,
                bytes_total: n * 1000,
            }
        }

        fn range(
            &self,
            after: Option<&str>,
            limit: usize,
        ) -> (std::ops::Range<usize>, Option<String>) {
            let start = after.map_or(0, |a| a.parse::<usize>().unwrap() + 1);
            let end = (start + limit).min(self.names.len());
            let more = (end - start == limit).then(|| (end - 1).to_string());
            (start..end, more)
        }
    }

    impl UserspaceStats for Many {
        fn visit(
            &self,
            after: Option<&str>,
            limit: usize,
            f: &mut dyn FnMut(&UserspaceListenerStats<'_>),
        ) -> Option<String> {
            let (range, more) = self.range(after, limit);
            for i in range {
                f(&self.stats(i));
            }
            more
        }
        fn table_rows(
            &self,
            after: Option<&str>,
            limit: usize,
            out: &mut String,
        ) -> Option<String> {
            if after.is_none() {
                out.push_str("# header\n");
            }
            let (range, more) = self.range(after, limit);
            for i in range {
                out.push_str(&self.names[i]);
                out.push('\n');
            }
            more
        }
    }

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

    /// The same metrics through prometheus-client's families (how they were encoded before
    /// they were written in pieces): the reference for the text.
    #[derive(Debug)]
    struct Reference(Vec<UserspaceListenerStats<'static>>);

    impl prometheus_client::collector::Collector for Reference {
        fn encode(
            &self,
            mut encoder: prometheus_client::encoding::DescriptorEncoder,
        ) -> Result<(), std::fmt::Error> {
            use prometheus_client::encoding::EncodeMetric;
            let info: Family<InfoLabels, Gauge> = Family::default();
            let gauges: [Family<ListenerLabels, Gauge>; 2] = Default::default();
            let counters: [Family<ListenerLabels, Counter>; 5] = Default::default();
            for s in &self.0 {
                info.get_or_create(&InfoLabels {
                    ip_family: s.ip_family,
                    service_port: s.service_port.to_string(),
                    protocol: s.protocol,
                    scope: s.scope,
                    port: s.port.to_string(),
                })
                .set(1);
                let l = ListenerLabels {
                    ip_family: s.ip_family,
                    service_port: s.service_port.to_string(),
                    protocol: s.protocol,
                    scope: s.scope,
                };
                gauges[0].get_or_create(&l).set(s.endpoints as i64);
                gauges[1].get_or_create(&l).set(s.active as i64);
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
                    counters[i].get_or_create(&l).inc_by(v);
                }
            }
            let e = encoder.encode_descriptor(
                METRICS[0].name,
                METRICS[0].help,
                None,
                info.metric_type(),
            )?;
            info.encode(e)?;
            for (m, fam) in METRICS[1..3].iter().zip(&gauges) {
                let e = encoder.encode_descriptor(m.name, m.help, None, fam.metric_type())?;
                fam.encode(e)?;
            }
            for (m, fam) in METRICS[3..].iter().zip(&counters) {
                let e = encoder.encode_descriptor(m.name, m.help, None, fam.metric_type())?;
                fam.encode(e)?;
            }
            Ok(())
        }
    }

    /// Each metric's block: its descriptor lines, then its series sorted (a family's series
    /// come in hash order).
    fn blocks(text: &str) -> Vec<Vec<&str>> {
        let mut out: Vec<Vec<&str>> = Vec::new();
        for line in text.lines() {
            if line.starts_with("# HELP") {
                out.push(Vec::new());
            }
            out.last_mut().unwrap().push(line);
        }
        for b in &mut out {
            b[2..].sort_unstable();
        }
        out
    }

    #[test]
    fn the_pieces_are_the_text_prometheus_client_writes() {
        let many = Many::new(700);
        let mut odd = many.stats(5);
        odd.service_port = "ns/we\"ird\\:p\nort";
        let all: Vec<UserspaceListenerStats<'static>> = (0..700)
            .map(|i| {
                let s = if i == 5 { odd } else { many.stats(i) };
                UserspaceListenerStats {
                    service_port: String::leak(s.service_port.to_string()),
                    ..s
                }
            })
            .collect();
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Reference(all)));
        let mut reference = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut reference, &registry).unwrap();

        #[derive(Debug)]
        struct WithOdd(Many, UserspaceListenerStats<'static>);
        impl UserspaceStats for WithOdd {
            fn visit(
                &self,
                after: Option<&str>,
                limit: usize,
                f: &mut dyn FnMut(&UserspaceListenerStats<'_>),
            ) -> Option<String> {
                self.0.visit(after, limit, &mut |s| {
                    if s.port == 30005 { f(&self.1) } else { f(s) }
                })
            }
            fn table_rows(&self, a: Option<&str>, l: usize, out: &mut String) -> Option<String> {
                self.0.table_rows(a, l, out)
            }
        }
        let odd: UserspaceListenerStats<'static> = UserspaceListenerStats {
            service_port: "ns/we\"ird\\:p\nort",
            ..odd
        };
        let pieces: String = Chunks::new(Some(Arc::new(WithOdd(Many::new(700), odd)))).collect();
        assert_eq!(blocks(&pieces), blocks(&reference));
        assert!(
            pieces.contains("service_port=\"ns/we\\\"ird\\\\:p\\nort\""),
            "{pieces}"
        );
        // Listener order within a metric.
        let first = pieces.find("service_port=\"ns-0/svc-0:http\"").unwrap();
        let second = pieces.find("service_port=\"ns-1/svc-1:http\"").unwrap();
        assert!(first < second);
    }

    #[test]
    fn a_scrape_is_made_of_bounded_pieces() {
        // 5,000 listeners: ~4 MB of text in pieces of at most 64 KiB and one batch.
        let source: Arc<dyn UserspaceStats> = Arc::new(Many::new(5000));
        let pieces: Vec<String> = Chunks::new(Some(source.clone())).collect();
        let total: usize = pieces.iter().map(String::len).sum();
        let biggest = pieces.iter().map(String::len).max().unwrap();
        assert!(total > 3_000_000, "{total}");
        assert!(biggest <= PIECE + BATCH * 200, "{biggest}");
        assert!(
            pieces.len() > total / (PIECE + BATCH * 200),
            "{}",
            pieces.len()
        );
        assert_eq!(
            pieces
                .concat()
                .matches("kube_proxy_rs_userspace_bytes_total{")
                .count(),
            5000
        );
        // The table likewise, BATCH listeners a piece, the header first.
        let table: Vec<String> = TableChunks::new(source).collect();
        assert!(table.len() > 5000 / BATCH, "{}", table.len());
        assert!(table[0].starts_with("# header\nns-0/svc-0:http\n"));
        assert_eq!(table.concat().lines().count(), 5001);
        // Without a source: the descriptors alone.
        let empty: String = Chunks::new(None).collect();
        assert_eq!(empty.lines().count(), 16, "{empty}");
    }

    #[derive(Debug)]
    struct Fixed;

    impl UserspaceStats for Fixed {
        fn visit(
            &self,
            _: Option<&str>,
            _: usize,
            f: &mut dyn FnMut(&UserspaceListenerStats<'_>),
        ) -> Option<String> {
            f(&UserspaceListenerStats {
                ip_family: "IPv4",
                service_port: "ns/web:http",
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
            });
            None
        }
        fn table_rows(&self, _: Option<&str>, _: usize, out: &mut String) -> Option<String> {
            out.push_str("TCP 0.0.0.0:36001 ns/web:http internal none 10.0.1.4:80\n");
            None
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
