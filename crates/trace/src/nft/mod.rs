//! The packet tracer for nftables rules: [`parse_nft_json`] reads `nft -j list ruleset`,
//! [`parse_nft_text`] reads `nft list ruleset` text and `nft -f` scripts (what nftables
//! mode's `--dry-run` prints) into the same IR, and [`trace_nft`] evaluates a [`Packet`] through it and returns the same [`Trace`] as the
//! iptables tracer ([`crate::trace`]), so callers treat both modes alike.
//!
//! ```no_run
//! use kp_trace::nft::{parse_nft_json, trace_nft};
//! use kp_trace::{Entry, Host, Packet, render_text};
//!
//! let json = std::process::Command::new("nft").args(["-j", "list", "ruleset"]).output()?;
//! let rules = parse_nft_json(&String::from_utf8_lossy(&json.stdout))?;
//! let pkt = Packet::tcp(
//!     "10.0.0.9".parse()?, 40000, "172.30.0.41".parse()?, 80,
//!     Entry::Pod { iface: None },
//! );
//! let t = trace_nft(&rules, &Host::new(["192.168.0.2".parse()?]), &pkt)?;
//! print!("{}", render_text(&t, &pkt));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # The model
//!
//! Every table of family `ip` (IPv4 packets), `ip6` (IPv6) and `inet` (both) takes part.
//! At each hook the base chains of all those tables run in priority order (ties in dump
//! order); `nat` chains run inside the NAT core's hook — priority -100 (dstnat) in
//! prerouting and output, 100 (srcnat) in input and postrouting — ordered among
//! themselves by their own priority, and once one of them has NATed the packet the later
//! ones of that hook are skipped (the connection has its binding). For kube-proxy's table
//! that is: `filter-prerouting-pre-dnat` (dstnat-10) before `nat-prerouting` (dstnat); the
//! routing decision on the (possibly DNATed) destination; then `filter-input` (filter) for
//! a node address, or `filter-forward` (filter) and `nat-postrouting` (srcnat).
//!
//! A packet from a process on the node ([`crate::Entry::Node`]) takes the output hook
//! (`filter-output-pre-dnat`, `nat-output`, `filter-output`; after a DNAT in output the
//! packet is rerouted at once, as the kernel does), then postrouting; if its (final)
//! destination is a node address it comes back over `lo` through prerouting and input
//! (nat chains are not consulted again; `ct status` has `confirmed`).
//!
//! Base chains below conntrack's priority (-200) in prerouting and output see no
//! conntrack entry: `ct state` is `invalid` there and other `ct` keys do not match.
//! Everywhere else the packet is the first of a new connection: `ct state new`, `ct
//! status` with `dnat`/`snat` once NATed (and `confirmed` on the loopback leg),
//! `ct direction original`, `ct mark` 0 unless set.
//!
//! Chains: `jump` enters a chain and comes back, `goto` comes back to the caller's
//! caller, `return` (or the end of a regular chain) goes back, the end of a base chain (or
//! `return` in it) applies the policy. `accept` ends the current base chain (the next
//! base chain of the hook still sees the packet); `drop` and `reject` end the packet.
//! `dnat`, `snat` and `masquerade` end the base chain like `accept`. A verdict map lookup
//! without a matching element ends the rule (the next rule follows).
//!
//! Statements, evaluated left to right; a match that fails ends the rule:
//!
//! * matches on `ip`/`ip6 saddr|daddr|protocol|nexthdr`, `tcp|udp|sctp|th sport|dport`,
//!   `tcp flags` (a first packet is a SYN), `icmp|icmpv6 type|code`, `meta l4proto|
//!   nfproto|protocol|iifname|oifname|iif|oif|mark|pkttype`, `ct state|status|direction|
//!   mark|original ip saddr|daddr|l3proto|protocol|proto-src|proto-dst`, `fib saddr|daddr
//!   type`, bitwise expressions (`meta mark & 0x4000 != 0`), concatenations, `numgen`;
//!   with `==`, `!=`, `<`, `>`, `<=`, `>=`, flag tests (`ct state new`, `ct state
//!   established,related`), prefixes, ranges, interface wildcards (`veth*`), anonymous sets
//!   and named sets (interval sets of CIDRs, concatenations, `!= @set`). As in the kernel,
//!   a header field of another protocol than the packet's (`tcp dport` on a UDP packet,
//!   `ip saddr` on an IPv6 packet in an `inet` table) makes the rule not match, whatever
//!   the operator;
//! * verdict maps (`... vmap @service-ips`, anonymous `vmap { ... }`);
//! * `numgen random mod N [offset O]`: a fresh random number for each evaluation; the trace
//!   forks into one branch per distinct result, each with its probability (`numgen random
//!   mod 2 vmap { 0 : goto a, 1 : goto b }` gives two branches of 50%; `numgen random
//!   mod 3 0` matches with 1/3). `numgen inc` is traced the same way, with a note;
//! * `meta mark set ...` / `ct mark set ...` with `|`, `&`, `^`, shifts;
//! * `dnat to ADDR[:PORT]`, `dnat ip addr . port to KEY map { ... }`, `dnat to numgen
//!   ... map { ... }` (one branch per value), `snat`, `masquerade` (the source becomes
//!   the outgoing interface's address: unknown afterwards), ranges (traced with their
//!   first address/port, reported unknown);
//! * `reject [with ...]`, `counter`, `log`, `update|add|delete @set { ... }` (recorded for
//!   the rest of this trace);
//! * session affinity: a membership test on a set the rules fill from packets
//!   (`ip saddr @affinity-...`) is traced as a first connection (not a member, unless this
//!   trace added it), with a note naming where a returning client goes — and whether the
//!   dump lists the client in the set right now.
//!
//! Never guessed: any other expression or statement (`jhash`, `limit`, `quota`,
//! `notrack`, `queue`, `redirect`, `rt`, `socket`, `osf`, `exthdr`, iptables-nft `xt`
//! expressions other than `comment`, ...), a field of the packet that was not given (a
//! port, an interface name), `fib` results that depend on routes (`oif`, types other
//! than local/broadcast/multicast/unicast), and base chains on device hooks (`ingress`,
//! `egress`, `netdev` tables) that hold rules: each is listed in [`Outcome::unknown`]
//! (with the rule's place and text), the outcome is marked uncertain, and a rule holding
//! it is treated as not matching — unless another match of the rule certainly fails.
//! Routing is the same simplified model as the iptables tracer's (see the crate docs).
//!
//! [`Outcome::unknown`]: crate::Outcome::unknown

mod engine;
mod eval;
mod ir;
mod json;
mod parse_text;
mod text;

pub use ir::{
    BaseChain, BinOp, Expr, Family, Lit, MatchOp, NatKind, NftChain, NftRule, NftRuleset, NftSet,
    NftTable, NftVerdict, SetElem, Stmt,
};
pub use json::parse_nft_json;
pub use parse_text::{looks_like_nft_text, parse_nft_text};

use crate::{Host, Packet, Trace, TraceError, TraceOptions};

/// Whether `text` looks like a JSON document (an `nft -j` dump) rather than an
/// `iptables-save` dump: its first non-blank character is `{`.
pub fn looks_like_json(text: &str) -> bool {
    text.trim_start().starts_with('{')
}

/// The rule in `nft` syntax, rebuilt from the IR (as the trace's steps show it).
pub fn rule_text(rule: &NftRule) -> String {
    text::rule_text(rule)
}

/// Traces `packet` through the nftables `rules` on `host` with the default options.
///
/// # Errors
///
/// See [`trace_nft_with`].
pub fn trace_nft(rules: &NftRuleset, host: &Host, packet: &Packet) -> Result<Trace, TraceError> {
    trace_nft_with(rules, host, packet, &TraceOptions::default())
}

/// Traces `packet` through the nftables `rules` on `host`. The outcomes' probabilities
/// sum to 1.
///
/// # Errors
///
/// [`TraceError::MixedFamily`] if source and destination differ in family,
/// [`TraceError::FamilyMismatch`] if every `ip`/`ip6`/`inet` table is of the other family,
/// [`TraceError::PortsWithoutPortProtocol`] for ports on ICMP/other packets, and
/// [`TraceError::ChainDepth`] if chains nest more than [`crate::MAX_DEPTH`] deep.
pub fn trace_nft_with(
    rules: &NftRuleset,
    host: &Host,
    packet: &Packet,
    opts: &TraceOptions,
) -> Result<Trace, TraceError> {
    engine::Engine::new(rules, host, packet, opts)?.run()
}
