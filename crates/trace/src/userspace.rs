//! kube-proxy's userspace mode: the proxy's table of listeners ([`UserspaceTable`], the
//! text the daemon serves as `GET /userspace` and prints in `--dry-run`) and
//! [`trace_userspace`], which traces a packet through the portal rules and then through
//! the proxy's own choice of endpoint.
//!
//! In userspace mode the nat rules send a Service's traffic to a socket of the proxy on
//! the node: `KUBE-PORTALS-CONTAINER` (nat PREROUTING: pods and other hosts) and
//! `KUBE-NODEPORT-CONTAINER` `-j REDIRECT --to-ports P`, `KUBE-PORTALS-HOST` and
//! `KUBE-NODEPORT-HOST` (nat OUTPUT: the node's own processes) `-j DNAT --to-destination
//! NODE-IP:P` (or `REDIRECT` when the node has no address of the family). The iptables
//! trace follows them ([`crate::trace`] knows `REDIRECT`: see the crate documentation);
//! the packet is delivered locally to port P. There the proxy's listener accepts the
//! connection (reads the datagram) and opens a connection of its own to an endpoint:
//!
//! * every outcome delivered locally (and accepted by the filter table) to a port on which
//!   the table has a listener of the packet's protocol — listening on the wildcard address
//!   of the packet's family or on the very address the packet was delivered to (a
//!   specific address wins over the wildcard, as with the kernel's sockets) — becomes one
//!   outcome per endpoint, equally likely (the proxy picks them round robin, and retries
//!   the next one when a connect fails), with [`crate::Outcome::dnat`] the endpoint,
//!   [`crate::Outcome::masquerade`] set (the proxy's connection comes from the node, so
//!   the endpoint never sees the client's address) and a [`crate::Effect::Proxy`] step in
//!   table `userspace`;
//! * a listener without endpoints: a TCP connection is accepted and reset at once
//!   ([`crate::Verdict::Reject`] `tcp-reset`); a UDP datagram is read and dropped, with no
//!   reply ([`crate::Verdict::Drop`]);
//! * session affinity (`clientip:<seconds>`) is traced for a new client, with a note;
//! * every other outcome is kept as the iptables trace says (no listener on the port:
//!   the node itself answers, or refuses, the connection; a note says so when the rules
//!   sent the packet to a local port the table has no listener on).
//!
//! The proxy's own connection to the endpoint is a new connection from the node: it is
//! not traced here (trace it as a packet from the node to the endpoint).
//!
//! # The table's text
//!
//! One listener per line, fields separated by single spaces; `#` lines and blank lines
//! are ignored:
//!
//! ```text
//! # kube-proxy-rs userspace proxy table: protocol listen-address service-port scope affinity endpoints
//! TCP 0.0.0.0:36001 default/web:http internal none 10.0.1.4:80,10.0.2.5:80
//! TCP 0.0.0.0:36002 default/web:http external clientip:10800 10.0.1.4:80
//! UDP [::]:36003 kube-system/dns:dns internal none -
//! ```
//!
//! `TCP` or `UDP`; the listen address (`0.0.0.0` / `[::]` for the wildcard); the Service
//! port's name (`namespace/name:port`, no spaces); `internal` (ClusterIP traffic) or
//! `external` (NodePort, external IP and load-balancer traffic when it uses other
//! endpoints, e.g. with `externalTrafficPolicy: Local`) or `cluster` (pod and node traffic
//! to those destinations, sent to every endpoint when both traffic policies are Local);
//! `none` or `clientip:<seconds>`;
//! the endpoints, comma-separated `ip:port` (`[ip]:port` for IPv6), or `-` for none.
//!
//! ```
//! use kp_trace::UserspaceTable;
//!
//! let text = "TCP 0.0.0.0:36001 default/web:http internal none 10.0.1.4:80,10.0.2.5:80\n";
//! let table = UserspaceTable::parse(text)?;
//! assert_eq!(table.listeners[0].endpoints.len(), 2);
//! assert_eq!(UserspaceTable::parse(&table.to_string())?, table);
//! # Ok::<(), kp_trace::TraceError>(())
//! ```

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use kp_netfilter::{Ruleset, Table, Target};

use crate::{Host, Packet, Proto, Trace, TraceError, TraceOptions};

/// The comment line [`UserspaceTable`]'s `Display` starts with: the fields' names.
pub const USERSPACE_TABLE_HEADER: &str = "# kube-proxy-rs userspace proxy table: protocol listen-address service-port scope affinity endpoints";

/// The nat chains in which userspace mode DNATs the node's own packets to its primary
/// address (`KUBE-PORTALS-HOST`, `KUBE-NODEPORT-HOST`).
pub const HOST_PORTAL_CHAINS: [&str; 2] = ["KUBE-PORTALS-HOST", "KUBE-NODEPORT-HOST"];

/// The userspace proxy's listeners: what [`trace_userspace`] hands a locally delivered
/// packet to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserspaceTable {
    /// The listeners, in table order.
    pub listeners: Vec<UserspaceListener>,
}

/// Which traffic of a Service port a listener takes (the table's `scope` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ListenerScope {
    /// `internal`: ClusterIP traffic (and the external destinations when they use the same
    /// endpoints).
    Internal,
    /// `external`: NodePort, external-IP and load-balancer traffic, with its own endpoints
    /// (e.g. `externalTrafficPolicy: Local`).
    External,
    /// `cluster`: pod and node traffic to the external destinations, short-circuited to
    /// the cluster-wide endpoints when neither other listener has them (both traffic
    /// policies Local).
    Cluster,
}

impl ListenerScope {
    /// The table's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ListenerScope::Internal => "internal",
            ListenerScope::External => "external",
            ListenerScope::Cluster => "cluster",
        }
    }
}

/// One listening socket of the userspace proxy and where it sends what it accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserspaceListener {
    /// [`Proto::Tcp`] or [`Proto::Udp`] (the only protocols the userspace proxy relays).
    pub protocol: Proto,
    /// The address and port the socket is bound to (`0.0.0.0` / `::` for every address
    /// of the family).
    pub listen: SocketAddr,
    /// The Service port it serves (`namespace/name:port`).
    pub service: String,
    /// Which of the Service port's traffic it takes.
    pub scope: ListenerScope,
    /// Session affinity by client IP, with its timeout in seconds; `None`: none.
    pub affinity: Option<u32>,
    /// The endpoints it connects to, in round-robin order (empty: none).
    pub endpoints: Vec<SocketAddr>,
}

impl UserspaceListener {
    /// `TCP 0.0.0.0:36001`: the listener's protocol and address (a trace step's chain).
    pub fn key(&self) -> String {
        format!("{} {}", proto_name(self.protocol), self.listen)
    }

    /// Whether a packet of `protocol` delivered to `addr`:`port` reaches this listener:
    /// same protocol and port, and the listener is bound to `addr` or to the wildcard
    /// address of `addr`'s family.
    pub fn accepts(&self, protocol: Proto, addr: IpAddr, port: u16) -> bool {
        self.protocol == protocol
            && self.listen.port() == port
            && (self.listen.ip() == addr
                || (self.listen.ip().is_unspecified()
                    && self.listen.ip().is_ipv4() == addr.is_ipv4()))
    }
}

impl UserspaceTable {
    /// Reads the table's text (see the [module documentation](self)).
    ///
    /// # Errors
    ///
    /// [`TraceError::UserspaceTable`], naming the 1-based line and the field: a line
    /// without exactly six fields, a protocol other than `TCP`/`UDP`, an address that is
    /// not `ip:port` (`[ip]:port`), a scope other than `internal`/`external`/`cluster`, an affinity
    /// other than `none`/`clientip:<seconds>`, a bad endpoint or one of the other family,
    /// or a second listener of the same protocol and address.
    pub fn parse(text: &str) -> Result<UserspaceTable, TraceError> {
        let mut listeners: Vec<UserspaceListener> = Vec::new();
        let mut lines: Vec<usize> = Vec::new();
        for (idx, raw) in text.lines().enumerate() {
            let line = idx + 1;
            let l = raw.trim();
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            let err = |field: &'static str, message: String| TraceError::UserspaceTable {
                line,
                field,
                message,
            };
            let fields: Vec<&str> = l.split_whitespace().collect();
            const NAMES: [&str; 6] = [
                "protocol",
                "listen-address",
                "service-port",
                "scope",
                "affinity",
                "endpoints",
            ];
            if fields.len() < NAMES.len() {
                return Err(err(
                    NAMES[fields.len()],
                    format!(
                        "missing: a listener has 6 fields ({}), this line has {}",
                        NAMES.join(" "),
                        fields.len()
                    ),
                ));
            }
            if fields.len() > NAMES.len() {
                return Err(err(
                    "endpoints",
                    format!(
                        "unexpected `{}' after the endpoints (endpoints are separated by \
                         commas, not spaces)",
                        fields[NAMES.len()]
                    ),
                ));
            }
            let protocol = match fields[0] {
                "TCP" => Proto::Tcp,
                "UDP" => Proto::Udp,
                other => {
                    return Err(err("protocol", format!("`{other}' is not TCP or UDP")));
                }
            };
            let listen: SocketAddr = fields[1].parse().map_err(|_| {
                err(
                    "listen-address",
                    format!(
                        "`{}' is not ip:port ([ip]:port for IPv6; 0.0.0.0 or [::] for every \
                         address)",
                        fields[1]
                    ),
                )
            })?;
            let service = fields[2].to_string();
            let scope = match fields[3] {
                "internal" => ListenerScope::Internal,
                "external" => ListenerScope::External,
                "cluster" => ListenerScope::Cluster,
                other => {
                    return Err(err(
                        "scope",
                        format!("`{other}' is not internal, external or cluster"),
                    ));
                }
            };
            let affinity = match fields[4] {
                "none" => None,
                a => {
                    let secs = a
                        .strip_prefix("clientip:")
                        .and_then(|s| s.parse::<u32>().ok())
                        .ok_or_else(|| {
                            err(
                                "affinity",
                                format!("`{a}' is not none or clientip:<seconds>"),
                            )
                        })?;
                    Some(secs)
                }
            };
            let endpoints = match fields[5] {
                "-" => Vec::new(),
                list => {
                    let mut eps = Vec::new();
                    for e in list.split(',') {
                        let ep: SocketAddr = e.parse().map_err(|_| {
                            err(
                                "endpoints",
                                format!(
                                    "`{e}' is not ip:port ([ip]:port for IPv6); write `-' \
                                     for no endpoints"
                                ),
                            )
                        })?;
                        if ep.is_ipv4() != listen.is_ipv4() {
                            return Err(err(
                                "endpoints",
                                format!(
                                    "endpoint {ep} is of the other family than the listener \
                                     {listen}"
                                ),
                            ));
                        }
                        eps.push(ep);
                    }
                    eps
                }
            };
            if let Some(i) = listeners
                .iter()
                .position(|o| o.protocol == protocol && o.listen == listen)
            {
                return Err(err(
                    "listen-address",
                    format!(
                        "a second {} listener on {listen} (the first is on line {})",
                        proto_name(protocol),
                        lines[i]
                    ),
                ));
            }
            listeners.push(UserspaceListener {
                protocol,
                listen,
                service,
                scope,
                affinity,
                endpoints,
            });
            lines.push(line);
        }
        Ok(UserspaceTable { listeners })
    }

    /// The listener a packet of `protocol` delivered to `addr`:`port` reaches: one bound
    /// to `addr` itself, else one bound to the wildcard address of its family.
    pub fn lookup(&self, protocol: Proto, addr: IpAddr, port: u16) -> Option<&UserspaceListener> {
        let ok = |l: &&UserspaceListener| l.accepts(protocol, addr, port);
        self.listeners
            .iter()
            .filter(ok)
            .find(|l| l.listen.ip() == addr)
            .or_else(|| self.listeners.iter().find(ok))
    }

    /// The listeners of `protocol` on `port`, whatever their address.
    pub fn on_port(&self, protocol: Proto, port: u16) -> impl Iterator<Item = &UserspaceListener> {
        self.listeners
            .iter()
            .filter(move |l| l.protocol == protocol && l.listen.port() == port)
    }

    /// Whether the table has no listener.
    pub fn is_empty(&self) -> bool {
        self.listeners.is_empty()
    }
}

impl std::str::FromStr for UserspaceTable {
    type Err = TraceError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        UserspaceTable::parse(s)
    }
}

/// One table line: `TCP 0.0.0.0:36001 default/web:http internal none 10.0.1.4:80`.
impl fmt::Display for UserspaceListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {} {} ",
            self.key(),
            self.service,
            self.scope.as_str(),
            match self.affinity {
                None => "none".to_string(),
                Some(s) => format!("clientip:{s}"),
            }
        )?;
        if self.endpoints.is_empty() {
            return f.write_str("-");
        }
        for (i, e) in self.endpoints.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// The table's text: [`USERSPACE_TABLE_HEADER`], then one line per listener, each
/// ending in a newline.
impl fmt::Display for UserspaceTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{USERSPACE_TABLE_HEADER}")?;
        for l in &self.listeners {
            writeln!(f, "{l}")?;
        }
        Ok(())
    }
}

/// `TCP` / `UDP` (the table's spelling).
pub(crate) fn proto_name(p: Proto) -> String {
    match p {
        Proto::Tcp => "TCP".into(),
        Proto::Udp => "UDP".into(),
        other => other.to_string().to_uppercase(),
    }
}

/// The node addresses userspace mode's rules name: the DNAT targets in
/// [`HOST_PORTAL_CHAINS`] (the node's primary address of the family, to which the node's
/// own packets for a Service are sent). A dump traced without the node's addresses can
/// take them as local addresses.
pub fn portal_node_addresses(rules: &Ruleset) -> BTreeSet<IpAddr> {
    HOST_PORTAL_CHAINS
        .iter()
        .filter_map(|c| rules.chain(Table::Nat, c))
        .flat_map(|c| &c.rules)
        .filter_map(|r| match &r.target {
            Some(Target::Dnat(n)) => n.to.addrs.map(|(a, _)| a),
            _ => None,
        })
        .collect()
}

/// Traces `packet` in userspace mode with the default options: `rules` are the node's
/// iptables rules (`iptables-save`), `host` its addresses, `table` the proxy's listeners.
/// See the [module documentation](self) for the model.
///
/// # Errors
///
/// See [`crate::trace_with`].
pub fn trace_userspace(
    rules: &Ruleset,
    table: &UserspaceTable,
    host: &Host,
    packet: &Packet,
) -> Result<Trace, TraceError> {
    trace_userspace_with(rules, table, host, packet, &TraceOptions::default())
}

/// [`trace_userspace`] with options.
///
/// # Errors
///
/// See [`crate::trace_with`].
pub fn trace_userspace_with(
    rules: &Ruleset,
    table: &UserspaceTable,
    host: &Host,
    packet: &Packet,
    opts: &TraceOptions,
) -> Result<Trace, TraceError> {
    crate::engine::Engine::new_userspace(rules, table, host, packet, opts)?.run()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "# kube-proxy-rs userspace proxy table: protocol listen-address service-port scope affinity endpoints
TCP 0.0.0.0:36001 default/web:http internal none 10.0.1.4:80,10.0.2.5:80
TCP 0.0.0.0:36002 default/web:http external clientip:10800 10.0.1.4:80
UDP [::]:36003 kube-system/dns:dns internal none -
";

    #[test]
    fn parses_the_documented_example() {
        let t = UserspaceTable::parse(SAMPLE).unwrap();
        assert_eq!(t.listeners.len(), 3);
        let l = &t.listeners[0];
        assert_eq!(l.protocol, Proto::Tcp);
        assert_eq!(l.listen, "0.0.0.0:36001".parse().unwrap());
        assert_eq!(l.service, "default/web:http");
        assert_eq!(l.scope, ListenerScope::Internal);
        assert_eq!(l.affinity, None);
        assert_eq!(
            l.endpoints,
            vec![
                "10.0.1.4:80".parse::<SocketAddr>().unwrap(),
                "10.0.2.5:80".parse().unwrap()
            ]
        );
        assert_eq!(t.listeners[1].scope, ListenerScope::External);
        assert_eq!(t.listeners[1].affinity, Some(10800));
        assert_eq!(t.listeners[2].protocol, Proto::Udp);
        assert_eq!(t.listeners[2].listen, "[::]:36003".parse().unwrap());
        assert!(t.listeners[2].endpoints.is_empty());
    }

    #[test]
    fn prints_exactly_the_documented_format() {
        let t = UserspaceTable::parse(SAMPLE).unwrap();
        assert_eq!(t.to_string(), SAMPLE);
        assert_eq!(UserspaceTable::parse(&t.to_string()).unwrap(), t);
        assert_eq!(
            UserspaceTable::default().to_string(),
            format!("{USERSPACE_TABLE_HEADER}\n")
        );
    }

    #[test]
    fn errors_name_the_line_and_the_field() {
        let cases = [
            ("\n\nTCP 0.0.0.0:1 a/b:c internal none\n", 3, "endpoints"),
            ("SCTP 0.0.0.0:1 a/b:c internal none -", 1, "protocol"),
            ("TCP 0.0.0.0 a/b:c internal none -", 1, "listen-address"),
            ("TCP ::1:80 a/b:c internal none -", 1, "listen-address"),
            ("TCP 0.0.0.0:1 a/b:c both none -", 1, "scope"),
            ("TCP 0.0.0.0:1 a/b:c internal clientip -", 1, "affinity"),
            ("TCP 0.0.0.0:1 a/b:c internal clientip:x -", 1, "affinity"),
            (
                "TCP 0.0.0.0:1 a/b:c internal none 10.0.0.1:80,",
                1,
                "endpoints",
            ),
            ("TCP 0.0.0.0:1 a/b:c internal none 10.0.0.1", 1, "endpoints"),
            (
                "TCP 0.0.0.0:1 a/b:c internal none [fd00::1]:80",
                1,
                "endpoints",
            ),
            (
                "TCP 0.0.0.0:1 a/b:c internal none 10.0.0.1:80 10.0.0.2:80",
                1,
                "endpoints",
            ),
            ("TCP", 1, "listen-address"),
            (
                "TCP 0.0.0.0:1 a/b:c internal none -\n# x\nTCP 0.0.0.0:1 a/b:d internal none -",
                3,
                "listen-address",
            ),
        ];
        for (text, want_line, want_field) in cases {
            match UserspaceTable::parse(text) {
                Err(e @ TraceError::UserspaceTable { line, field, .. }) => {
                    assert_eq!((line, field), (want_line, want_field), "{text:?}: {e}");
                    let msg = e.to_string();
                    assert!(
                        msg.contains(&format!("line {want_line}")) && msg.contains(want_field),
                        "{msg}"
                    );
                }
                other => panic!("{text:?}: {other:?}"),
            }
        }
        // The duplicate names the first listener's line.
        let e = UserspaceTable::parse(
            "TCP 0.0.0.0:1 a/b:c internal none -\nTCP 0.0.0.0:1 a/b:d internal none -",
        )
        .unwrap_err();
        assert!(e.to_string().contains("line 1"), "{e}");
    }

    #[test]
    fn lookup_prefers_the_specific_address() {
        let t = UserspaceTable::parse(
            "TCP 0.0.0.0:36001 a/b:c internal none -\n\
             TCP 192.168.56.10:36001 a/b:d internal none -\n\
             TCP [::]:36001 a/b:e internal none -\n",
        )
        .unwrap();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let svc = |a: &str, p: u16| t.lookup(Proto::Tcp, ip(a), p).map(|l| l.service.as_str());
        assert_eq!(svc("192.168.56.10", 36001), Some("a/b:d"));
        assert_eq!(svc("127.0.0.1", 36001), Some("a/b:c"));
        assert_eq!(svc("::1", 36001), Some("a/b:e"));
        assert_eq!(svc("127.0.0.1", 36002), None);
        assert_eq!(t.lookup(Proto::Udp, ip("127.0.0.1"), 36001), None);
    }

    mod prop {
        use super::super::*;
        use proptest::prelude::*;
        use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV6};

        fn addr(v6: bool) -> impl Strategy<Value = SocketAddr> {
            (any::<[u8; 16]>(), any::<u16>()).prop_map(move |(b, port)| {
                if v6 {
                    SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(b), port, 0, 0))
                } else {
                    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3])), port)
                }
            })
        }

        fn listener() -> impl Strategy<Value = UserspaceListener> {
            any::<bool>().prop_flat_map(|v6| {
                (
                    prop_oneof![Just(Proto::Tcp), Just(Proto::Udp)],
                    addr(v6),
                    "[a-z0-9-]{1,12}/[a-z0-9-]{1,12}(:[a-z0-9-]{1,8})?",
                    prop_oneof![
                        Just(ListenerScope::Internal),
                        Just(ListenerScope::External),
                        Just(ListenerScope::Cluster),
                    ],
                    proptest::option::of(any::<u32>()),
                    proptest::collection::vec(addr(v6), 0..4),
                )
                    .prop_map(
                        |(protocol, listen, service, scope, affinity, endpoints)| {
                            UserspaceListener {
                                protocol,
                                listen,
                                service,
                                scope,
                                affinity,
                                endpoints,
                            }
                        },
                    )
            })
        }

        proptest! {
            #[test]
            fn print_then_parse_is_the_identity(ls in proptest::collection::vec(listener(), 0..6)) {
                let mut table = UserspaceTable::default();
                for l in ls {
                    if !table.listeners.iter().any(|o| o.protocol == l.protocol && o.listen == l.listen) {
                        table.listeners.push(l);
                    }
                }
                let text = table.to_string();
                prop_assert_eq!(UserspaceTable::parse(&text).unwrap(), table);
            }

            #[test]
            fn parse_never_panics(text in "(?s).{0,300}") {
                let _ = UserspaceTable::parse(&text);
            }

            #[test]
            fn parse_never_panics_on_near_misses(
                fields in proptest::collection::vec(
                    prop_oneof![
                        Just("TCP".to_string()), Just("UDP".to_string()),
                        Just("0.0.0.0:1".to_string()), Just("[::]:65535".to_string()),
                        Just("internal".to_string()), Just("external".to_string()),
                        Just("none".to_string()), Just("clientip:".to_string()),
                        Just("-".to_string()), Just(",".to_string()),
                        Just("#".to_string()), Just("\n".to_string()),
                        "[0-9a-f:.,\\[\\]-]{0,20}",
                    ],
                    0..14,
                )
            ) {
                let _ = UserspaceTable::parse(&fields.join(" "));
            }
        }
    }
}
