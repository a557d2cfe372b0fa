//! kube-proxy's IPVS mode: the IPVS table ([`IpvsTable`], read from `ipvsadm -Sn` text
//! or built from a netlink dump) and [`trace_ipvs`], which traces a packet through the
//! iptables rules, the ipsets and the IPVS table the way the kernel handles it.
//!
//! The path of a packet in IPVS mode (the kernel's `ip_vs_core.c` hooks):
//!
//! * from a Pod or from outside: raw, mangle, nat PREROUTING (kube-proxy only marks
//!   packets for masquerading and ACCEPTs there: no DNAT) → routing: a Service IP is a
//!   local address (it is bound to `kube-ipvs0`), as is a node address → mangle, filter,
//!   security INPUT (`KUBE-PROXY-FIREWALL`, `KUBE-NODE-PORT`, `KUBE-IPVS-FILTER`) → IPVS
//!   at LOCAL_IN (after filter, before nat INPUT): the virtual server for (destination,
//!   protocol, port), if any, picks a real server and rewrites the destination; the
//!   packet is then sent out through LOCAL_OUT (raw, mangle, filter, security OUTPUT; nat
//!   OUTPUT is not consulted again) and POSTROUTING (mangle, nat: `KUBE-POSTROUTING`
//!   masquerades marked packets and hairpin traffic, `KUBE-LOOP-BACK`). Without a
//!   virtual server the packet continues to nat INPUT and is delivered to the node.
//! * from the node: raw, mangle, nat OUTPUT → reroute → IPVS at LOCAL_OUT (after nat
//!   OUTPUT, before filter OUTPUT): a virtual server rewrites the destination and the
//!   packet re-enters LOCAL_OUT (raw, mangle, filter, security OUTPUT, where `-m ipvs`
//!   sees the IPVS connection: `KUBE-IPVS-OUT-FILTER`) → POSTROUTING; a packet for a node
//!   address comes back over `lo` as in iptables mode.
//!
//! Scheduling: every real server with weight > 0 is a possible destination, traced as
//! equally likely whatever the scheduler (which one the kernel picks depends on its
//! state: the round-robin position, connection counts, a source hash); the scheduler is
//! named in the trace. A persistent virtual server (`-p`, kube-proxy's
//! `sessionAffinity: ClientIP`) is traced for a new client, with a note. A virtual
//! server without a real server of weight > 0 answers ICMP port unreachable and drops
//! the packet (`ip_vs_leave`): the outcome is rejected. IPVS only balances TCP, UDP and
//! SCTP: a ping to a Service IP is delivered to the node (which answers it), unless a
//! filter rule such as upstream's `KUBE-IPVS-FILTER` rejects it first.
//!
//! Real servers are traced as masquerading (`-m`, kube-proxy's only forwarding method);
//! another forwarding method is reported unknown.

use std::collections::BTreeSet;
use std::net::IpAddr;

use kp_netfilter::Ruleset;
use kp_netlink::ipvs::{RealServer, VirtualServer};

use crate::{Host, Packet, Trace, TraceError, TraceOptions};

/// The IPVS table of a node: its virtual servers, each with its real servers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpvsTable {
    /// The virtual servers in dump order, with the 1-based line of their `-A` rule when
    /// read from text (0 otherwise) and their real servers.
    pub services: Vec<(VirtualServer, Vec<RealServer>, usize)>,
}

impl IpvsTable {
    /// Reads `ipvsadm -Sn` (or `ipvsadm -R` input): `-A` and `-a` lines with numeric
    /// addresses, as [`kp_netlink::ipvs::parse_save_text`] accepts them.
    ///
    /// # Errors
    ///
    /// [`TraceError::IpvsSave`] for a line that does not parse (firewall-mark services,
    /// names instead of numbers, a real server before its virtual server, ...).
    pub fn parse(text: &str) -> Result<IpvsTable, TraceError> {
        if text.trim_start().starts_with("IP Virtual Server")
            || text.contains("-> RemoteAddress:Port")
        {
            return Err(TraceError::IpvsSave {
                line: 1,
                message: "this is `ipvsadm -Ln` output (a listing); trace needs the rules form, `ipvsadm -Sn`".into(),
            });
        }
        let services =
            kp_netlink::ipvs::parse_save_text(text).map_err(|e| TraceError::IpvsSave {
                line: e.line,
                message: e.message,
            })?;
        // Each `-A` line's number, in order of appearance (the parser keeps that order).
        let lines: Vec<usize> = text
            .lines()
            .enumerate()
            .filter(|(_, l)| {
                let w = l.split_whitespace().next();
                matches!(w, Some("-A" | "--add-service"))
            })
            .map(|(i, _)| i + 1)
            .collect();
        Ok(IpvsTable {
            services: services
                .into_iter()
                .enumerate()
                .map(|(i, (vs, rs))| (vs, rs, lines.get(i).copied().unwrap_or(0)))
                .collect(),
        })
    }

    /// The table of a dump ([`kp_netlink::ipvs::dump_all`]).
    pub fn from_dump(services: Vec<(VirtualServer, Vec<RealServer>)>) -> IpvsTable {
        IpvsTable {
            services: services.into_iter().map(|(v, r)| (v, r, 0)).collect(),
        }
    }

    /// The virtual server for (`addr`, IP protocol `protocol`, `port`), with its real
    /// servers and line.
    pub fn lookup(
        &self,
        addr: IpAddr,
        protocol: u8,
        port: u16,
    ) -> Option<&(VirtualServer, Vec<RealServer>, usize)> {
        self.services.iter().find(|(vs, _, _)| {
            vs.key.addr == addr && vs.key.protocol == protocol && vs.key.port == port
        })
    }

    /// Every virtual server address. On a node running kube-proxy's IPVS mode each one is
    /// a local address: a Service IP is bound to `kube-ipvs0` (or already on another
    /// interface), and a NodePort's virtual servers use the node's addresses.
    pub fn addresses(&self) -> BTreeSet<IpAddr> {
        self.services.iter().map(|(vs, _, _)| vs.key.addr).collect()
    }

    /// Whether the table has no virtual server.
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
    }
}

/// The `ipvsadm -Sn` rule of a virtual server (`-A -t 10.96.0.10:80 -s rr`).
pub(crate) fn service_rule(vs: &VirtualServer) -> String {
    kp_netlink::ipvs::save_text(&[(vs.clone(), Vec::new())])
        .trim_end()
        .to_string()
}

/// Traces `packet` in IPVS mode with the default options: `rules` are the node's
/// iptables rules (`iptables-save`), `host` its addresses (kube-ipvs0's included) and
/// ipsets (`ipset save`, [`Host::load_ipset_save`]), `ipvs` its IPVS table. See the
/// [module documentation](self) for the model.
///
/// # Errors
///
/// See [`crate::trace_with`].
pub fn trace_ipvs(
    rules: &Ruleset,
    ipvs: &IpvsTable,
    host: &Host,
    packet: &Packet,
) -> Result<Trace, TraceError> {
    trace_ipvs_with(rules, ipvs, host, packet, &TraceOptions::default())
}

/// [`trace_ipvs`] with options.
///
/// # Errors
///
/// See [`crate::trace_with`].
pub fn trace_ipvs_with(
    rules: &Ruleset,
    ipvs: &IpvsTable,
    host: &Host,
    packet: &Packet,
    opts: &TraceOptions,
) -> Result<Trace, TraceError> {
    crate::engine::Engine::new_ipvs(rules, ipvs, host, packet, opts)?.run()
}
