//! What a trace returns: [`Trace`] → probabilistic [`Outcome`]s → [`Step`]s.

use std::fmt;
use std::net::IpAddr;

use serde::Serialize;

use crate::TraceError;

/// What a rule (or a chain's end) did to the packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Effect {
    /// `-j CHAIN`: entered a user chain (returns here afterwards).
    Jump,
    /// `-g CHAIN`: went to a user chain (returns to this chain's caller).
    Goto,
    /// `-j RETURN`, or the end of a user chain reached without any rule matching
    /// (then `rule_index` is `None`).
    Return,
    /// `-j ACCEPT`: ends this table's chain traversal for this hook.
    Accept,
    /// `-j DROP`.
    Drop,
    /// `-j REJECT`.
    Reject,
    /// `-j DNAT`, or `-j REDIRECT` (a DNAT to a local address): destination rewritten;
    /// ends the nat traversal of this hook. IPVS mode's scheduling is one too.
    Dnat,
    /// `-j SNAT`: source rewritten; ends the nat traversal of this hook.
    Snat,
    /// `-j MASQUERADE`: source rewritten to the outgoing interface's address.
    Masquerade,
    /// `-j MARK`: mark changed, traversal continues.
    Mark,
    /// A rule without a target (or with a non-terminating target such as `LOG`, or one
    /// not understood): traversal continues with the next rule.
    Continue,
    /// A builtin chain's policy applied (the end of the chain, or `RETURN` from it).
    Policy,
    /// Userspace mode: a listener of the proxy accepted the connection and the proxy
    /// connects to an endpoint itself (step table `userspace`; see [`crate::userspace`]).
    Proxy,
}

/// One event on the packet's path: a rule that matched, a policy, or a user chain
/// left without any match.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Step {
    /// Table: the iptables table's name (`nat`), or for nftables the family and the
    /// table's name (`ip kube-proxy`).
    pub table: String,
    /// Chain.
    pub chain: String,
    /// 0-based index of the rule in its chain (`iptables -L --line-numbers` shows this
    /// + 1); `None` for policies and chain ends.
    pub rule_index: Option<usize>,
    /// The rule's 1-based line in the parsed dump, when it came from text.
    pub line: Option<usize>,
    /// nftables only: the rule's handle (`nft -a list ruleset` prints it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handle: Option<u64>,
    /// The rule in canonical `iptables-save` form (`-A CHAIN ...`), or for nftables in
    /// `nft` syntax (rebuilt from the JSON dump); `-P CHAIN POLICY` (`policy drop`) for a
    /// policy; empty for the end of a user chain.
    pub rule_text: String,
    /// What happened.
    pub effect: Effect,
    /// A short explanation (`mark 0x0 -> 0x4000`, `dst now 10.0.0.4:80`, `taken with
    /// probability 0.5`), empty when the rule speaks for itself.
    pub detail: String,
}

/// The verdict of the tables (mostly the filter table) on the packet.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub enum Verdict {
    /// Every traversed chain let the packet through.
    Accept,
    /// A `DROP` rule or policy.
    Drop,
    /// A `REJECT` rule, with its `--reject-with` type (e.g. `icmp-port-unreachable`).
    Reject(String),
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Accept => f.write_str("ACCEPT"),
            Verdict::Drop => f.write_str("DROP"),
            Verdict::Reject(w) => write!(f, "REJECT {w}"),
        }
    }
}

/// Where the packet ends up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Delivery {
    /// Delivered to a local socket on the node (its destination is a node address).
    Local,
    /// Leaves the node: routed on to another host or a Pod (for packets from the
    /// node itself: sent out).
    Forwarded,
    /// Dropped: by a DROP/REJECT verdict, or by the kernel's routing checks (loopback
    /// addresses on a non-loopback interface; see the trace notes).
    Dropped,
}

impl fmt::Display for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Delivery::Local => "delivered locally",
            Delivery::Forwarded => "forwarded",
            Delivery::Dropped => "dropped",
        })
    }
}

/// One probabilistic branch of a trace: a path the packet takes with `probability`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    /// Probability of this branch, in `[0, 1]`; the outcomes of a trace sum to 1.
    pub probability: f64,
    /// The matched rules, policies and empty chain ends, in order.
    pub steps: Vec<Step>,
    /// The destination after DNAT (address, and port for port protocols) if a DNAT
    /// (or REDIRECT) rule applied; in userspace mode, the endpoint the proxy connects to.
    /// A REDIRECT in PREROUTING when the node has no address of the family known to the
    /// tracer gives the unspecified address (`0.0.0.0` / `::`): "an address of the
    /// incoming interface".
    pub dnat: Option<(IpAddr, Option<u16>)>,
    /// Whether a MASQUERADE or SNAT target applied (in nat POSTROUTING, or nat INPUT); in
    /// userspace mode also when the proxy relays the connection (it connects from the
    /// node).
    pub masquerade: bool,
    /// The packet mark when the trace ends.
    pub mark: u32,
    /// The tables' verdict.
    pub verdict: Verdict,
    /// Where the packet ends up.
    pub delivery: Delivery,
    /// Matches and targets the tracer could not evaluate, each with its table, chain
    /// and rule. A rule with such a match was treated as not matching.
    pub unknown: Vec<String>,
    /// Whether anything unknown influenced this branch (so it may be wrong).
    pub uncertain: bool,
}

/// Where a summary line's packets go.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Destination {
    /// Final destination address (after DNAT, if any).
    pub ip: IpAddr,
    /// Final destination port (port protocols only).
    pub port: Option<u16>,
    /// Whether a DNAT produced this destination.
    pub dnat: bool,
    /// Where the packet ends up.
    pub delivery: Delivery,
}

/// Which kind of rules a trace evaluated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Mode {
    /// iptables rules (an `iptables-save` dump): [`crate::trace`].
    Iptables,
    /// nftables rules (an `nft -j list ruleset` dump): [`crate::nft::trace_nft`].
    Nftables,
    /// kube-proxy's IPVS mode: iptables rules with ipsets and the IPVS table (an
    /// `ipvsadm -Sn` dump): [`crate::trace_ipvs`].
    Ipvs,
    /// kube-proxy's userspace mode: iptables portal rules and the proxy's listeners (a
    /// [`crate::UserspaceTable`]): [`crate::trace_userspace`].
    Userspace,
}

/// The result of tracing one packet.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Trace {
    /// The rules' kind.
    pub mode: Mode,
    /// The branches, in rule order (the first endpoint of a Service first).
    pub outcomes: Vec<Outcome>,
    /// Explanations and the assumptions made (session affinity, ignored options,
    /// kernel routing checks, the outcome cap, why no DNAT happened ...).
    pub notes: Vec<String>,
    /// The packet's destination before any DNAT, used by [`Trace::summary`].
    pub original_dst: (IpAddr, Option<u16>),
}

impl Trace {
    /// The outcomes merged by (destination, masquerade, verdict): one line per
    /// distinct ending, with the summed probability, in first-appearance order.
    pub fn summary(&self) -> Vec<(Destination, f64, bool, Verdict)> {
        let mut out: Vec<(Destination, f64, bool, Verdict)> = Vec::new();
        for o in &self.outcomes {
            let (ip, port) = o.dnat.unwrap_or(self.original_dst);
            let dest = Destination {
                ip,
                port,
                dnat: o.dnat.is_some(),
                delivery: o.delivery,
            };
            match out
                .iter_mut()
                .find(|(d, _, m, v)| *d == dest && *m == o.masquerade && *v == o.verdict)
            {
                Some(line) => line.1 += o.probability,
                None => out.push((dest, o.probability, o.masquerade, o.verdict.clone())),
            }
        }
        out
    }

    /// Whether any outcome is uncertain.
    pub fn is_uncertain(&self) -> bool {
        self.outcomes.iter().any(|o| o.uncertain)
    }

    /// The trace as pretty-printed JSON.
    ///
    /// # Errors
    ///
    /// [`TraceError::Json`] (not expected: every field serializes).
    pub fn to_json(&self) -> Result<String, TraceError> {
        Ok(serde_json::to_string_pretty(self)?)
    }
}
