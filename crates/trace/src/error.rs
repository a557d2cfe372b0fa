//! The crate's one error type, [`TraceError`].

use std::net::IpAddr;

use kp_netfilter::IpVersion;

/// Everything that makes a trace impossible. Rules the tracer does not understand are
/// *not* errors: they are reported in [`crate::Outcome::unknown`] and make the outcome
/// uncertain.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The packet's source and destination are of different families.
    #[error("the packet mixes address families: source {src}, destination {dst}")]
    MixedFamily {
        /// Source address.
        src: IpAddr,
        /// Destination address.
        dst: IpAddr,
    },
    /// The ruleset holds addresses of the other family only (an `ip6tables-save` dump
    /// traced with an IPv4 packet, or the reverse).
    #[error("the packet is {packet:?} but every address in the ruleset is {ruleset:?}")]
    FamilyMismatch {
        /// The packet's family.
        packet: IpVersion,
        /// The only family the ruleset's addresses have.
        ruleset: IpVersion,
    },
    /// Ports were given for a protocol that has none (ICMP, or `Other`).
    #[error("protocol {proto} has no ports, but the packet gives a port")]
    PortsWithoutPortProtocol {
        /// The protocol's name.
        proto: String,
    },
    /// Chains call each other deeper than the tracer allows: the ruleset has a loop
    /// (which the kernel would refuse to load) or is absurdly deep.
    #[error("{table} chain {chain} is nested more than {limit} calls deep (a jump loop?)")]
    ChainDepth {
        /// Table of the chain where the limit was hit (`nat`, or `ip kube-proxy`).
        table: String,
        /// The chain being entered.
        chain: String,
        /// The depth limit.
        limit: usize,
    },
    /// An ipset type or member could not be parsed.
    #[error("ipset {set}: {message}")]
    Ipset {
        /// The set's name.
        set: String,
        /// What is wrong.
        message: String,
    },
    /// A line of `ipset save` output could not be parsed.
    #[error("ipset save input, line {line}: {message}")]
    IpsetSave {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// An `ipvsadm -Sn` dump could not be read.
    #[error("ipvsadm -Sn input, line {line}: {message}")]
    IpvsSave {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// A userspace proxy table ([`crate::UserspaceTable`]) could not be read.
    #[error("userspace proxy table, line {line}, field {field}: {message}")]
    UserspaceTable {
        /// 1-based line number.
        line: usize,
        /// The field (`protocol`, `listen-address`, `service-port`, `scope`, `affinity`,
        /// `endpoints`).
        field: &'static str,
        /// What is wrong.
        message: String,
    },
    /// An `nft -j list ruleset` document could not be read: not JSON, or not the
    /// libnftables schema (an object with an `nftables` array of objects).
    #[error("nftables JSON: {0}")]
    NftJson(String),
    /// nftables text (`nft list ruleset` output or an `nft -f` script) could not be read:
    /// an unbalanced brace, an unknown command, a rule for a chain (or elements for a set)
    /// not declared before, or a rule handle the text cannot resolve.
    #[error("nftables text, line {line}: {message}")]
    NftText {
        /// The line (1-based) where the problem is.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// JSON serialization failed (it cannot for the types of this crate; kept so that
    /// [`crate::Trace::to_json`] does not need to panic).
    #[error("JSON serialization: {0}")]
    Json(#[from] serde_json::Error),
}
