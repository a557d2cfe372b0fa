//! kp-trace: a packet tracer over iptables and nftables rules (and kube-proxy's IPVS and
//! userspace modes).
//!
//! Two front ends share one result: [`trace`] evaluates an `iptables-save` dump
//! ([`kp_netfilter::Ruleset`]); [`nft::trace_nft`] evaluates `nft -j list ruleset`
//! ([`nft::NftRuleset`], read with [`nft::parse_nft_json`], or from `nft list ruleset`
//! text and `nft -f` scripts with [`nft::parse_nft_text`]; its model is documented in
//! [`nft`]). Both return a [`Trace`] (with [`Trace::mode`] saying which), rendered by
//! [`render_text`]. Two more front ends trace kube-proxy's other modes over iptables
//! rules: [`trace_ipvs`] (with the IPVS table, [`ipvs`]) and [`trace_userspace`] (with
//! the userspace proxy's listeners, [`userspace`]). The rest of this page describes the
//! iptables model.
//!
//! "Why can't I reach (or ping) my ClusterIP?" — [`trace`] evaluates one packet (the
//! first packet of a new connection) through a parsed [`Ruleset`] (our own rules, or any
//! kube-proxy's `iptables-save` dump read with [`kp_netfilter::parse_save`]) and returns
//! every way it can go: one [`Outcome`] per probabilistic branch (`statistic` matches
//! fork the packet), with the rules that matched, the DNAT, masquerading, the mark, the
//! tables' verdict and where the packet ends up. [`render_text`] prints that for an
//! operator; every result type serializes to JSON with serde.
//!
//! ```
//! use kp_netfilter::parse_save;
//! use kp_trace::{Entry, Host, Packet, render_text, trace};
//!
//! let rules = parse_save(
//!     "*nat\n:PREROUTING ACCEPT [0:0]\n:SVC - [0:0]\n\
//!      -A PREROUTING -d 10.96.0.1/32 -p tcp -m tcp --dport 80 -j SVC\n\
//!      -A SVC -p tcp -m tcp -j DNAT --to-destination 10.0.0.4:8080\nCOMMIT\n",
//! )?;
//! let host = Host::new(["192.168.1.10".parse()?]);
//! let pkt = Packet::tcp(
//!     "192.168.1.99".parse()?, 40000, "10.96.0.1".parse()?, 80,
//!     Entry::External { iface: None },
//! );
//! let t = trace(&rules, &host, &pkt)?;
//! assert_eq!(t.outcomes[0].dnat, Some(("10.0.0.4".parse()?, Some(8080))));
//! println!("{}", render_text(&t, &pkt));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # The model
//!
//! Hooks, in the kernel's priority order (raw, mangle, nat, filter and security are
//! all walked when the ruleset has them):
//!
//! * a packet from a Pod or from outside ([`Entry::Pod`], [`Entry::External`]): raw,
//!   mangle, nat PREROUTING → routing decision on the (possibly DNATed) destination →
//!   a node address: mangle, filter, security, nat INPUT ([`Delivery::Local`]);
//!   otherwise mangle, filter, security FORWARD → mangle, nat POSTROUTING
//!   ([`Delivery::Forwarded`]);
//! * a packet from a process on the node ([`Entry::Node`]): raw, mangle, nat OUTPUT →
//!   reroute → filter, security OUTPUT → mangle, nat POSTROUTING. If the (final)
//!   destination is a node address the packet then comes back over `lo`, as in the
//!   kernel: raw, mangle PREROUTING and mangle, filter, security INPUT, with input
//!   interface `lo` and conntrack status CONFIRMED; nat PREROUTING/INPUT are not
//!   consulted again (the connection's NAT bindings already exist).
//!
//! Chains: `-j` enters a user chain and comes back, `-g` enters it and comes back to
//! the caller's caller, `RETURN` (or the end of a chain) goes back, a builtin chain's end
//! applies its policy. ACCEPT ends the current table's traversal of the hook; DROP and
//! REJECT end the packet. In the nat table the first DNAT/SNAT/MASQUERADE ends the
//! traversal of that hook; DNAT changes the destination for everything after it,
//! including the routing decision. REDIRECT (`[--to-ports P[-Q]]`, in nat PREROUTING and
//! OUTPUT and the chains they call) is a DNAT to a local address, port P (the original
//! port without `--to-ports`): in OUTPUT `127.0.0.1` / `::1`; in PREROUTING the primary
//! address of the incoming interface, which is traced as the node's first address of the
//! family in [`Host::local_addrs`] (not loopback, nor link-local unless the destination
//! is: interface addresses are not modelled), with a note. When the node has none, the
//! address is not known: it is shown as `0.0.0.0` / `::`, the packet is delivered
//! locally, and later matches on the destination address are unknown. MARK (`mark =
//! (mark & !mask) ^ value`) and rules without a target continue; LOG-like targets
//! continue.
//!
//! Matches: `-s/-d/-i/-o/-p/-f` (with `!`, `+` interface wildcards), `comment`,
//! `tcp/udp/sctp` ports, `multiport`, `mark`, `conntrack --ctstate` (the packet is NEW;
//! also DNAT/SNAT once a DNAT/SNAT happened in this trace) and `--ctstatus` (nothing set,
//! CONFIRMED on the loopback leg), `state` (NEW), `addrtype` (LOCAL from
//! [`Host::local_addrs`] plus loopback — a destination's LOCAL is unknown when
//! [`Host::local_addrs_incomplete`], unless it is a Service's ClusterIP —, MULTICAST, BROADCAST for 255.255.255.255 and
//! 0.0.0.0; any other address is assumed UNICAST when that matters, with a note),
//! `statistic` (random: the packet takes the rule with probability P and goes on with
//! 1−P; nth --every N: the same with 1/N), `recent` (a first connection: `--rcheck` and
//! `--update` do not match, with a note that a returning client goes back to the rule's
//! target; `--set` matches and is recorded), `set` (with [`Host::ipsets`]), `nfacct`.
//!
//! Anything the tracer cannot evaluate — an unknown match module, `physdev`, a missing
//! interface name or port, an ipset whose contents were not given, a route-dependent
//! address type, an unknown target, a jump to a chain not in the dump — is never
//! guessed: it is listed in [`Outcome::unknown`], the outcome is marked
//! [`Outcome::uncertain`], and a rule with such a match is treated as not matching
//! (an unknown target is traced as doing nothing).
//!
//! Simplifications: routes are not modelled (a destination is local iff it is a node
//! address; every other packet is forwarded, or sent out for node traffic; `-o` is
//! known only from [`Packet::out_iface`], and is `lo` for node traffic to a node
//! address); the kernel's loopback checks are: a packet arriving from outside with a
//! 127.0.0.0/8 source or destination is dropped unless [`Host::route_localnet`] (always
//! for IPv6 `::1`), and node traffic with a loopback source cannot leave the node unless
//! `route_localnet`; a DNAT/SNAT to a range is traced with the range's first address and
//! port (and reported unknown); MASQUERADE makes the source address unknown for what
//! follows; fragments are not modelled (the packet is the unfragmented first one).
//!
//! Branching: `statistic` matches fork the trace, so a Service with n endpoints gives n
//! outcomes (each branch costs only the rules it passes). The number of outcomes is
//! capped ([`TraceOptions::max_outcomes`], 100 000 by default); past the cap
//! `statistic` matches stop forking (traced as not matching, outcome uncertain) and a
//! note says so.

mod common;
mod engine;
mod error;
mod host;
pub mod ipvs;
pub mod nft;
mod packet;
mod render;
mod result;
pub mod userspace;

pub use common::MAX_DEPTH;
pub use error::TraceError;
pub use host::{Host, IpSet, SetMember, SetPort, SetType};
pub use ipvs::{IpvsTable, trace_ipvs, trace_ipvs_with};
pub use nft::{parse_nft_json, parse_nft_text, trace_nft, trace_nft_with};
pub use packet::{Entry, Packet, Proto};
pub use render::render_text;
pub use result::{Delivery, Destination, Effect, Mode, Outcome, Step, Trace, Verdict};
pub use userspace::{
    ListenerScope, UserspaceListener, UserspaceTable, portal_node_addresses, trace_userspace,
    trace_userspace_with,
};

use kp_netfilter::Ruleset;

/// Default for [`TraceOptions::max_outcomes`].
pub const DEFAULT_MAX_OUTCOMES: usize = 100_000;

/// Tuning of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceOptions {
    /// The most outcomes a trace may produce (at least 1); see the crate docs.
    pub max_outcomes: usize,
}

impl Default for TraceOptions {
    fn default() -> Self {
        TraceOptions {
            max_outcomes: DEFAULT_MAX_OUTCOMES,
        }
    }
}

/// Traces `packet` through `rules` on `host` with the default options.
///
/// # Errors
///
/// See [`trace_with`].
pub fn trace(rules: &Ruleset, host: &Host, packet: &Packet) -> Result<Trace, TraceError> {
    trace_with(rules, host, packet, &TraceOptions::default())
}

/// Traces `packet` through `rules` on `host`. The outcomes' probabilities sum to 1.
///
/// # Errors
///
/// [`TraceError::MixedFamily`] if source and destination differ in family,
/// [`TraceError::FamilyMismatch`] if every address in `rules` is of the other family,
/// [`TraceError::PortsWithoutPortProtocol`] for ports on ICMP/other packets, and
/// [`TraceError::ChainDepth`] if chains nest more than [`MAX_DEPTH`] deep (a loop).
pub fn trace_with(
    rules: &Ruleset,
    host: &Host,
    packet: &Packet,
    opts: &TraceOptions,
) -> Result<Trace, TraceError> {
    engine::Engine::new(rules, host, packet, opts)?.run()
}
