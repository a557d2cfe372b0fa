//! What the iptables tracer ([`crate::engine`]) and the nftables tracer
//! ([`crate::nft`]) share: the checks of the traced packet and the trace's running
//! context ([`Core`]: host, packet, outcome cap, notes), one branch's view of the packet
//! ([`State`], with each engine's own fields in [`State::ext`]), the interface and
//! routing model ([`Iface`], [`Path`], [`Core::route_incoming`], [`Core::reroute_local`]),
//! how a chain traversal ends ([`Flow`]) and how the final states become the public
//! [`Trace`].
//!
//! What differs between the two rule models (iptables tables and builtin chains versus
//! nftables hooks, priorities and base chains) stays in each engine.

use std::collections::HashSet;
use std::net::IpAddr;

use kp_netfilter::IpVersion;

use crate::packet::endpoint;
use crate::result::{Delivery, Effect, Mode, Outcome, Step, Trace, Verdict};
use crate::{Entry, Host, Packet, TraceError, TraceOptions};

/// How deep chains may call each other before the trace gives up (kube-proxy's rules
/// are at most 6 deep; the kernel refuses loops).
pub const MAX_DEPTH: usize = 64;

/// What the tracer knows about an interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Iface {
    /// There is none at this hook (no input device in OUTPUT, no output device in
    /// PREROUTING/INPUT): iptables' `-i x` is false and `! -i x` true; nftables'
    /// `iifname` is `""` (so `iifname "eth0"` is false and `iifname != "eth0"` true), as
    /// in the kernel.
    Absent,
    /// A known name.
    Name(String),
    /// There is one, but its name was not given.
    Unknown,
}

impl Iface {
    /// The interface named `name`, or an unknown one when no name was given.
    pub(crate) fn given(name: Option<String>) -> Iface {
        name.map_or(Iface::Unknown, Iface::Name)
    }

    /// Why a match on an [`Iface::Unknown`] interface cannot be evaluated; `what` is
    /// `"input interface"` or `"output interface"`.
    pub(crate) fn unknown_reason(what: &str) -> String {
        format!("the {what} is not known (give it in the packet's entry / out_iface)")
    }
}

/// The routing decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    /// To a node address: delivered locally (INPUT / input).
    Local,
    /// Elsewhere: forwarded, or sent out for node traffic.
    Forward,
}

/// How a chain traversal ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Flow {
    /// A return or the end of the chain: back to the caller (the policy for a builtin /
    /// base chain).
    Return,
    /// An accept, or a NAT: this table / base chain is done with the packet for this hook.
    Accept,
    /// A drop.
    Drop,
    /// A reject with this type.
    Reject(String),
}

/// Fails with [`TraceError::ChainDepth`] when a chain is entered more than
/// [`MAX_DEPTH`] calls deep; `place` gives its table and chain names.
pub(crate) fn check_depth(
    depth: usize,
    place: impl FnOnce() -> (String, String),
) -> Result<(), TraceError> {
    if depth > MAX_DEPTH {
        let (table, chain) = place();
        return Err(TraceError::ChainDepth {
            table,
            chain,
            limit: MAX_DEPTH,
        });
    }
    Ok(())
}

/// The step of a called chain that ended without any of its rules matching (back to
/// the caller).
pub(crate) fn no_rule_matched(table: String, chain: String) -> Step {
    chain_step(
        table,
        chain,
        String::new(),
        Effect::Return,
        "no rule matched".into(),
    )
}

/// A step of a chain that no rule of it took (its end, its policy), shown as
/// `rule_text`.
pub(crate) fn chain_step(
    table: String,
    chain: String,
    rule_text: String,
    effect: Effect,
    detail: String,
) -> Step {
    Step {
        table,
        chain,
        rule_index: None,
        line: None,
        handle: None,
        rule_text,
        effect,
        detail,
    }
}

/// One branch's view of the packet and its history. `X` holds what only one engine
/// tracks (iptables' `recent` lists, nftables' ct mark and NAT bindings, ...).
#[derive(Debug, Clone)]
pub(crate) struct State<X> {
    /// The branch's probability.
    pub(crate) prob: f64,
    /// The current source address.
    pub(crate) src: IpAddr,
    /// False after a masquerade (the source becomes the outgoing interface's address).
    pub(crate) src_known: bool,
    /// The current destination address.
    pub(crate) dst: IpAddr,
    /// The source port; `None` = not carried (port-less protocol) or not known.
    pub(crate) sport: Option<u16>,
    /// The destination port; `None` as for `sport`.
    pub(crate) dport: Option<u16>,
    /// The packet mark.
    pub(crate) mark: u32,
    /// The destination NAT applied, if any.
    pub(crate) dnat: Option<(IpAddr, Option<u16>)>,
    /// Whether the source was NATed (masquerade or SNAT).
    pub(crate) masquerade: bool,
    /// conntrack status bit IPS_DST_NAT (`--ctstate DNAT`, `ct status dnat`).
    pub(crate) ct_dnat: bool,
    /// conntrack status bit IPS_SRC_NAT (`--ctstate SNAT`, `ct status snat`).
    pub(crate) ct_snat: bool,
    /// IPS_CONFIRMED: only on the loopback leg of a locally delivered packet.
    pub(crate) confirmed: bool,
    /// The input interface.
    pub(crate) in_iface: Iface,
    /// The output interface.
    pub(crate) out_iface: Iface,
    /// The rules and policies the branch went through.
    pub(crate) steps: Vec<Step>,
    /// What could not be evaluated (each once).
    pub(crate) unknown: Vec<String>,
    /// Whether anything could not be evaluated.
    pub(crate) uncertain: bool,
    /// Set when a table / base chain dropped or rejected the packet.
    pub(crate) verdict: Option<Verdict>,
    /// Dropped by the kernel's routing checks.
    pub(crate) routing_drop: bool,
    /// The routing decision, once taken.
    pub(crate) path: Option<Path>,
    /// A REDIRECT sent the packet to a local address the tracer cannot name (the node's
    /// addresses were not given): the routing decision delivers it locally.
    pub(crate) redirected_local: bool,
    /// The engine's own state.
    pub(crate) ext: X,
}

impl<X> State<X> {
    /// The packet as it enters, before any hook, with the engine's own state `ext`.
    /// Interfaces are unknown until the entry sets them.
    pub(crate) fn new(p: &Packet, ext: X) -> State<X> {
        State {
            prob: 1.0,
            src: p.src,
            src_known: true,
            dst: p.dst,
            sport: p.sport,
            dport: p.dport,
            mark: 0,
            dnat: None,
            masquerade: false,
            ct_dnat: false,
            ct_snat: false,
            confirmed: false,
            in_iface: Iface::Unknown,
            out_iface: Iface::Unknown,
            steps: Vec::new(),
            unknown: Vec::new(),
            uncertain: false,
            verdict: None,
            routing_drop: false,
            path: None,
            redirected_local: false,
            ext,
        }
    }

    /// Whether the packet is still travelling (neither dropped by a verdict nor by
    /// routing).
    pub(crate) fn live(&self) -> bool {
        self.verdict.is_none() && !self.routing_drop
    }

    /// Records something that could not be evaluated and marks the branch uncertain.
    pub(crate) fn add_unknown(&mut self, what: String) {
        self.uncertain = true;
        if !self.unknown.contains(&what) {
            self.unknown.push(what);
        }
    }

    /// Applies how a builtin / base chain was left other than by its end (the end,
    /// [`Flow::Return`], is its policy's business): a drop or reject becomes the verdict,
    /// an accept lets the packet go on.
    pub(crate) fn leave_chain(&mut self, flow: Flow) {
        match flow {
            Flow::Return | Flow::Accept => {}
            Flow::Drop => self.verdict = Some(Verdict::Drop),
            Flow::Reject(w) => self.verdict = Some(Verdict::Reject(w)),
        }
    }

    /// Turns the packet that came back over `lo` after postrouting (node traffic to a
    /// node address) into its loopback leg: input `lo`, no output interface, conntrack
    /// entry confirmed.
    pub(crate) fn loop_back(&mut self) {
        self.in_iface = Iface::Name("lo".into());
        self.out_iface = Iface::Absent;
        self.confirmed = true;
    }

    /// The branch's outcome, once the trace is over.
    pub(crate) fn into_outcome(self) -> Outcome {
        let verdict = self.verdict.clone().unwrap_or(Verdict::Accept);
        let delivery = if self.verdict.is_some() || self.routing_drop {
            Delivery::Dropped
        } else if self.path == Some(Path::Local) {
            Delivery::Local
        } else {
            Delivery::Forwarded
        };
        Outcome {
            probability: self.prob,
            steps: self.steps,
            dnat: self.dnat,
            masquerade: self.masquerade,
            mark: self.mark,
            verdict,
            delivery,
            unknown: self.unknown,
            uncertain: self.uncertain,
        }
    }
}

/// What a trace in progress knows besides the rules, whichever their kind.
pub(crate) struct Core<'a> {
    /// Which tracer runs.
    pub(crate) mode: Mode,
    /// The node.
    pub(crate) host: &'a Host,
    /// The traced packet.
    pub(crate) packet: &'a Packet,
    /// The packet's family.
    pub(crate) version: IpVersion,
    /// The packet's IP protocol number.
    pub(crate) proto: u8,
    /// [`TraceOptions::max_outcomes`] (at least 1).
    pub(crate) max_outcomes: usize,
    /// How many branches the trace has so far.
    pub(crate) branches: usize,
    /// Whether forking stopped at the outcome cap.
    pub(crate) capped: bool,
    /// The trace's notes, in order, each once.
    notes: Vec<String>,
    /// The notes already given.
    seen_notes: HashSet<String>,
}

impl<'a> Core<'a> {
    /// Checks the packet and prepares the context of a `mode` trace.
    ///
    /// # Errors
    ///
    /// [`TraceError::MixedFamily`] if source and destination differ in family,
    /// [`TraceError::PortsWithoutPortProtocol`] for ports on ICMP/other packets.
    pub(crate) fn new(
        mode: Mode,
        host: &'a Host,
        packet: &'a Packet,
        opts: &TraceOptions,
    ) -> Result<Core<'a>, TraceError> {
        let version = packet.version();
        if IpVersion::of(packet.dst) != version {
            return Err(TraceError::MixedFamily {
                src: packet.src,
                dst: packet.dst,
            });
        }
        if !packet.proto.has_ports() && (packet.sport.is_some() || packet.dport.is_some()) {
            return Err(TraceError::PortsWithoutPortProtocol {
                proto: packet.proto.to_string(),
            });
        }
        Ok(Core {
            mode,
            host,
            packet,
            version,
            proto: packet.proto.number(version),
            max_outcomes: opts.max_outcomes.max(1),
            branches: 1,
            capped: false,
            notes: Vec::new(),
            seen_notes: HashSet::new(),
        })
    }

    /// Adds a note to the trace (once).
    pub(crate) fn note(&mut self, n: String) {
        if self.seen_notes.insert(n.clone()) {
            self.notes.push(n);
        }
    }

    /// Why a "is `addr` a local address" test is unknown (the node's addresses were not
    /// given, [`Host::local_addrs_incomplete`]); adds the hint note once.
    pub(crate) fn unknown_local(&mut self, addr: IpAddr) -> String {
        self.note(format!(
            "the node's addresses were not given, so whether {addr} is one of them (a \
             NodePort or other node-local destination) is not known: give them with \
             --node-ip (or trace with --live on the node)"
        ));
        format!("whether {addr} is an address of this node (address type LOCAL) is not known")
    }

    /// Whether the kernel keeps loopback addresses off non-loopback interfaces: always
    /// for IPv6 `::1`, for IPv4 127.0.0.0/8 unless `route_localnet`.
    fn loopback_confined(&self) -> bool {
        self.version == IpVersion::V6 || !self.host.route_localnet
    }

    /// The end of a routing note: the sysctl that lifts the check, when there is one.
    fn unless_route_localnet(&self) -> &'static str {
        if self.version == IpVersion::V6 {
            ""
        } else {
            " unless route_localnet=1"
        }
    }

    /// The output interface towards `dst`: `lo` for a node address, else the packet's
    /// given `out_iface` (unknown without it: routes are not modelled).
    pub(crate) fn out_iface_for(&self, dst: IpAddr) -> Iface {
        if self.host.is_local(dst) {
            Iface::Name("lo".into())
        } else {
            Iface::given(self.packet.out_iface.clone())
        }
    }

    /// The packet as it enters at its [`Entry`], with the engine's own state `ext`: from
    /// an interface (no output interface yet), or from a local process (no input
    /// interface, the output interface towards the destination).
    pub(crate) fn entry_state<X>(&self, ext: X) -> State<X> {
        let mut st = State::new(self.packet, ext);
        match &self.packet.entry {
            Entry::Pod { iface } | Entry::External { iface } => {
                st.in_iface = Iface::given(iface.clone());
                st.out_iface = Iface::Absent;
            }
            Entry::Node => {
                st.in_iface = Iface::Absent;
                st.out_iface = self.out_iface_for(st.dst);
            }
        }
        st
    }

    /// The routing decision for every live packet that came in from an interface (see
    /// [`Core::route_incoming`]).
    pub(crate) fn route_incoming_live<X>(&mut self, states: &mut [State<X>]) {
        for st in states.iter_mut().filter(|s| s.live()) {
            self.route_incoming(st);
        }
    }

    /// The routing decision for a packet that came in from an interface: martian
    /// loopback addresses are dropped, a node address is delivered locally, anything
    /// else is forwarded.
    pub(crate) fn route_incoming<X>(&mut self, st: &mut State<X>) {
        for (addr, what, prep) in [(st.dst, "destination", "for"), (st.src, "source", "from")] {
            if addr.is_loopback() && self.loopback_confined() {
                st.routing_drop = true;
                // The two tracers word this note differently.
                let packets = match self.mode {
                    Mode::Iptables | Mode::Ipvs | Mode::Userspace => format!("{prep} {addr}"),
                    Mode::Nftables => format!("with {what} {addr}"),
                };
                self.note(format!(
                    "the kernel drops packets {packets} that arrive on a non-loopback interface \
                     (martian {what}){}",
                    self.unless_route_localnet()
                ));
                return;
            }
        }
        if st.redirected_local || self.host.is_local(st.dst) {
            st.path = Some(Path::Local);
            st.out_iface = Iface::Absent;
        } else {
            st.path = Some(Path::Forward);
            st.out_iface = self.out_iface_for(st.dst);
        }
    }

    /// The reroute of every live locally generated packet (see [`Core::reroute_local`]).
    pub(crate) fn reroute_local_live<X>(&mut self, states: &mut [State<X>]) {
        for st in states.iter_mut().filter(|s| s.live()) {
            self.reroute_local(st);
        }
    }

    /// The reroute of a locally generated packet (after the output hook's DNAT): a node
    /// address is delivered locally over `lo`, anything else leaves the node (not with a
    /// loopback source, unless allowed).
    pub(crate) fn reroute_local<X>(&mut self, st: &mut State<X>) {
        let local = self.host.is_local(st.dst);
        st.path = Some(if local { Path::Local } else { Path::Forward });
        st.out_iface = self.out_iface_for(st.dst);
        if !local && st.src.is_loopback() && self.loopback_confined() {
            st.routing_drop = true;
            self.note(format!(
                "the kernel will not send a packet with source {} out of a non-loopback \
                 interface{}",
                st.src,
                self.unless_route_localnet()
            ));
        }
    }

    /// Whether some outcome forwards the packet unchanged to a destination that is not a
    /// node address (what the engines' "no DNAT" note explains).
    pub(crate) fn forwards_unchanged(&self, outcomes: &[Outcome]) -> bool {
        let unchanged = outcomes
            .iter()
            .any(|o| o.dnat.is_none() && o.delivery == Delivery::Forwarded);
        unchanged && !self.host.is_local(self.packet.dst)
    }

    /// The "no DNAT" note for a packet that leaves the node with its original
    /// destination. `listed` are the rules (or map elements) that name the destination
    /// for other packets; when there are some, `explain` words the note from the first
    /// five of them (joined) and the `" and N more"` for the rest.
    pub(crate) fn no_dnat_note(
        &self,
        listed: &[String],
        explain: impl FnOnce(String, String) -> String,
    ) -> String {
        if listed.is_empty() {
            let p = self.packet;
            return format!(
                "no DNAT: the packet is routed unchanged towards {}, which is not an address \
                 of this node",
                endpoint(p.dst, p.dport)
            );
        }
        let shown = listed.len().min(5);
        let more = if listed.len() > shown {
            format!(" and {} more", listed.len() - shown)
        } else {
            String::new()
        };
        explain(listed[..shown].join("; "), more)
    }

    /// The finished trace.
    pub(crate) fn into_trace(self, outcomes: Vec<Outcome>) -> Trace {
        Trace {
            mode: self.mode,
            outcomes,
            notes: self.notes,
            original_dst: (self.packet.dst, self.packet.dport),
        }
    }
}

/// Turns the live packets that are delivered locally after postrouting (node traffic
/// to a node address) into their loopback leg ([`State::loop_back`]); whether there was
/// any.
pub(crate) fn loop_back_local<X>(states: &mut [State<X>]) -> bool {
    let mut looped = false;
    for st in states
        .iter_mut()
        .filter(|s| s.live() && s.path == Some(Path::Local))
    {
        st.loop_back();
        looped = true;
    }
    looped
}
