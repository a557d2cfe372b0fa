//! The traversal engine: walks the netfilter hooks in the kernel's order and the chains
//! of each table rule by rule, forking the packet's state at `statistic` matches.
//!
//! The model (see the crate documentation for the full list of simplifications):
//!
//! * incoming (Pod / External): raw, mangle, nat PREROUTING → routing decision on the
//!   (possibly DNATed) destination → local: mangle, filter, security, nat INPUT;
//!   otherwise: mangle, filter, security FORWARD → mangle, nat POSTROUTING;
//! * from the node: raw, mangle, nat OUTPUT → reroute → filter, security OUTPUT →
//!   mangle, nat POSTROUTING → if the destination is local, the packet comes back over
//!   `lo`: raw, mangle PREROUTING and mangle, filter, security INPUT (nat is not consulted
//!   again: the connection's NAT bindings were set up on the way out).
//!
//! The branch state, the routing decisions and the assembly of the result are shared
//! with the nftables tracer ([`crate::common`]); the tables, chains, matches and targets
//! of iptables are here. IPVS mode's traversal is in `ipvs_mode`, userspace mode's proxy
//! step in `userspace_mode`.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use kp_netfilter::{
    AddrKind, AddrType, Chain, Cidr, ConnState, Conntrack, CtStatus, IpVersion, Match, Multiport,
    MultiportKind, NatRange, PortMatch, PortRange, Recent, RecentCommand, Rule, Ruleset, SetFlag,
    SetMatch, StatisticMode, Table, Target,
};

use crate::common::{self, Core, Flow, Iface, Path, loop_back_local};
use crate::host::{Dim, SetValue};
use crate::ipvs::IpvsTable;
use crate::userspace::UserspaceTable;

mod ipvs_mode;
mod userspace_mode;
use crate::packet::endpoint;
use crate::result::{Effect, Mode, Step, Trace, Verdict};
use crate::{Entry, Host, Packet, Proto, TraceError, TraceOptions};
use ipvs_mode::ipvs_match;

/// Targets that only log or count: the packet continues as if they were not there.
const PASSIVE_TARGETS: &[&str] = &["LOG", "NFLOG", "ULOG", "TRACE", "AUDIT"];

/// What only the iptables tracer tracks of a branch.
#[derive(Debug, Clone, Default)]
struct Ext {
    /// `recent --set` lists this packet was added to (`name|side`).
    recent_set: Vec<String>,
    /// IPVS mode: the virtual server (address, protocol, port) that scheduled the packet
    /// (the kernel's `skb->ipvs_property` and connection, what `-m ipvs` tests).
    ipvs: Option<(IpAddr, u8, u16)>,
    /// IPVS mode: the packet was scheduled at LOCAL_IN to a real server elsewhere and is
    /// sent out through LOCAL_OUT and POSTROUTING (not through FORWARD).
    ipvs_out: bool,
    /// A REDIRECT in PREROUTING sent the packet to an address of its incoming interface
    /// that the tracer cannot name (no node address of the family was given): `dst` is the
    /// unspecified address, and matches on the destination address are unknown.
    dst_unknown: bool,
}

/// The nat hooks where `-j REDIRECT` is valid: it redirects to a local address that
/// depends on the hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RedirectHook {
    /// nat PREROUTING: the primary address of the incoming interface.
    Prerouting,
    /// nat OUTPUT: the loopback address.
    Output,
}

/// One branch's view of the packet and its history.
type State = common::State<Ext>;

/// A pending traversal position inside one chain invocation.
struct Item {
    st: State,
    i: usize,
    matched_any: bool,
    /// The match result of rule `i`, when already decided by a fork.
    decided: Option<bool>,
}

/// The result of a match evaluated without side effects.
enum Pure {
    Yes,
    No,
    Unknown(String),
    /// `recent --rcheck/--update`: false for a client without an entry.
    NoFirstConnection,
    /// True, with side effects or forks handled afterwards (statistic, recent --set).
    Effect,
}

fn pure(b: bool) -> Pure {
    if b { Pure::Yes } else { Pure::No }
}

/// One trace in progress.
pub(crate) struct Engine<'a> {
    rules: &'a Ruleset,
    /// IPVS mode: the IPVS table.
    ipvs: Option<&'a IpvsTable>,
    /// Userspace mode: the proxy's listeners.
    userspace: Option<&'a UserspaceTable>,
    /// The builtin chain being traversed, when REDIRECT is valid there.
    redirect_at: Option<RedirectHook>,
    /// The packet, the host, the notes.
    core: Core<'a>,
}

impl<'a> Engine<'a> {
    /// Checks the inputs and prepares a trace.
    pub(crate) fn new(
        rules: &'a Ruleset,
        host: &'a Host,
        packet: &'a Packet,
        opts: &TraceOptions,
    ) -> Result<Engine<'a>, TraceError> {
        let core = Core::new(Mode::Iptables, host, packet, opts)?;
        Engine::checked(rules, None, core)
    }

    /// Checks the inputs and prepares an IPVS-mode trace.
    pub(crate) fn new_ipvs(
        rules: &'a Ruleset,
        ipvs: &'a IpvsTable,
        host: &'a Host,
        packet: &'a Packet,
        opts: &TraceOptions,
    ) -> Result<Engine<'a>, TraceError> {
        let core = Core::new(Mode::Ipvs, host, packet, opts)?;
        Engine::checked(rules, Some(ipvs), core)
    }

    /// Checks the inputs and prepares a userspace-mode trace.
    pub(crate) fn new_userspace(
        rules: &'a Ruleset,
        table: &'a UserspaceTable,
        host: &'a Host,
        packet: &'a Packet,
        opts: &TraceOptions,
    ) -> Result<Engine<'a>, TraceError> {
        let core = Core::new(Mode::Userspace, host, packet, opts)?;
        let mut e = Engine::checked(rules, None, core)?;
        e.userspace = Some(table);
        Ok(e)
    }

    fn checked(
        rules: &'a Ruleset,
        ipvs: Option<&'a IpvsTable>,
        core: Core<'a>,
    ) -> Result<Engine<'a>, TraceError> {
        if let Some(only) = single_family(rules)
            && only != core.version
        {
            return Err(TraceError::FamilyMismatch {
                packet: core.version,
                ruleset: only,
            });
        }
        Ok(Engine {
            rules,
            ipvs,
            userspace: None,
            redirect_at: None,
            core,
        })
    }

    /// Runs the trace.
    pub(crate) fn run(mut self) -> Result<Trace, TraceError> {
        use Table::{Filter, Mangle, Nat, Raw, Security};
        let p = self.core.packet;
        if self.ipvs.is_some() {
            return self.run_ipvs();
        }
        for t in [Filter, Nat] {
            if !self.rules.tables.contains_key(&t) {
                self.core.note(format!(
                    "the ruleset has no {t} table: its hooks were not evaluated (as if empty, \
                     policy ACCEPT)"
                ));
            }
        }
        let mut states = vec![self.core.entry_state(Ext::default())];
        match &p.entry {
            Entry::Pod { .. } | Entry::External { .. } => {
                self.hook(&mut states, "PREROUTING", &[Raw, Mangle, Nat], None)?;
                self.core.route_incoming_live(&mut states);
                let local = Some(Path::Local);
                let fwd = Some(Path::Forward);
                self.hook(
                    &mut states,
                    "INPUT",
                    &[Mangle, Filter, Security, Nat],
                    local,
                )?;
                self.hook(&mut states, "FORWARD", &[Mangle, Filter, Security], fwd)?;
                self.hook(&mut states, "POSTROUTING", &[Mangle, Nat], fwd)?;
            }
            Entry::Node => {
                self.hook(&mut states, "OUTPUT", &[Raw, Mangle, Nat], None)?;
                self.core.reroute_local_live(&mut states);
                self.hook(&mut states, "OUTPUT", &[Filter, Security], None)?;
                self.hook(&mut states, "POSTROUTING", &[Mangle, Nat], None)?;
                if loop_back_local(&mut states) {
                    self.core.note(
                        "locally generated packet for a local address: after OUTPUT and \
                         POSTROUTING it comes back over lo through raw/mangle PREROUTING and \
                         mangle/filter INPUT; nat PREROUTING/INPUT are not consulted again \
                         (the connection's NAT was set up on the way out)"
                            .into(),
                    );
                }
                let local = Some(Path::Local);
                self.hook(&mut states, "PREROUTING", &[Raw, Mangle], local)?;
                self.hook(&mut states, "INPUT", &[Mangle, Filter, Security], local)?;
            }
        }
        Ok(self.finish(states))
    }

    /// Runs `hook` of each table in `tables` (in order) for every live state on `path`
    /// (all when `None`).
    fn hook(
        &mut self,
        states: &mut Vec<State>,
        hook: &str,
        tables: &[Table],
        path: Option<Path>,
    ) -> Result<(), TraceError> {
        self.hook_where(states, hook, tables, |st| path.is_none() || st.path == path)
    }

    /// Runs `hook` of each table in `tables` (in order) for every live state `which`
    /// selects.
    fn hook_where(
        &mut self,
        states: &mut Vec<State>,
        hook: &str,
        tables: &[Table],
        which: impl Fn(&State) -> bool,
    ) -> Result<(), TraceError> {
        for &table in tables {
            let mut next = Vec::with_capacity(states.len());
            for st in states.drain(..) {
                if !st.live() || !which(&st) {
                    next.push(st);
                } else {
                    next.extend(self.run_builtin(table, hook, st)?);
                }
            }
            *states = next;
        }
        Ok(())
    }

    /// Traverses one builtin chain and applies its policy.
    fn run_builtin(
        &mut self,
        table: Table,
        hook: &str,
        st: State,
    ) -> Result<Vec<State>, TraceError> {
        let rules: &'a Ruleset = self.rules;
        let Some(chain) = rules.chain(table, hook) else {
            return Ok(vec![st]);
        };
        let policy = chain.policy.as_deref().unwrap_or("ACCEPT");
        self.redirect_at = match (table, hook) {
            (Table::Nat, "PREROUTING") => Some(RedirectHook::Prerouting),
            (Table::Nat, "OUTPUT") => Some(RedirectHook::Output),
            _ => None,
        };
        let res = self.run_chain(table, hook, chain, st, 0)?;
        let mut out = Vec::with_capacity(res.len());
        for (mut s, flow) in res {
            match flow {
                Flow::Return => {
                    if policy != "ACCEPT" || !chain.rules.is_empty() {
                        s.steps.push(common::chain_step(
                            table.name().to_string(),
                            hook.to_string(),
                            format!("-P {hook} {policy}"),
                            Effect::Policy,
                            "policy".into(),
                        ));
                    }
                    match policy {
                        "ACCEPT" => {}
                        "DROP" => s.verdict = Some(Verdict::Drop),
                        other => s.add_unknown(format!(
                            "{table} {hook}: policy {other} not understood; treated as ACCEPT"
                        )),
                    }
                }
                end => s.leave_chain(end),
            }
            out.push(s);
        }
        Ok(out)
    }

    /// Traverses `chain` (named `name`) from its first rule. Returns every branch with how
    /// it left the chain.
    fn run_chain(
        &mut self,
        table: Table,
        name: &str,
        chain: &'a Chain,
        st: State,
        depth: usize,
    ) -> Result<Vec<(State, Flow)>, TraceError> {
        common::check_depth(depth, || (table.name().to_string(), name.to_string()))?;
        let rules: &'a Ruleset = self.rules;
        let builtin = depth == 0;
        let mut out = Vec::new();
        let mut stack = vec![Item {
            st,
            i: 0,
            matched_any: false,
            decided: None,
        }];
        while let Some(Item {
            mut st,
            mut i,
            mut matched_any,
            mut decided,
        }) = stack.pop()
        {
            loop {
                let Some(rule) = chain.rules.get(i) else {
                    if !builtin && !matched_any {
                        st.steps.push(common::no_rule_matched(
                            table.name().to_string(),
                            name.to_string(),
                        ));
                    }
                    out.push((st, Flow::Return));
                    break;
                };
                let matched = match decided.take() {
                    Some(m) => m,
                    None => {
                        let mut extras = Vec::new();
                        let m = self.match_rule(table, name, i, rule, &mut st, &mut extras);
                        for e in extras.into_iter().rev() {
                            stack.push(Item {
                                st: e,
                                i,
                                matched_any,
                                decided: Some(false),
                            });
                        }
                        m
                    }
                };
                if !matched {
                    i += 1;
                    continue;
                }
                matched_any = true;
                let step = |effect: Effect, detail: String| Step {
                    table: table.name().to_string(),
                    chain: name.to_string(),
                    rule_index: Some(i),
                    line: (rule.line > 0).then_some(rule.line),
                    handle: None,
                    rule_text: rule.to_string(),
                    effect,
                    detail,
                };
                match &rule.target {
                    None => {
                        st.steps.push(step(Effect::Continue, String::new()));
                        i += 1;
                    }
                    Some(t @ (Target::Jump(c) | Target::Goto(c))) => {
                        let goto = matches!(t, Target::Goto(_));
                        let Some(sub) = rules.chain(table, c) else {
                            st.add_unknown(format!(
                                "{table} {name} rule index {i}: {} {c}, a chain not in the ruleset; \
                                 the rule was treated as not matching: `{rule}`",
                                if goto { "goes to" } else { "jumps to" }
                            ));
                            i += 1;
                            continue;
                        };
                        let effect = if goto { Effect::Goto } else { Effect::Jump };
                        st.steps.push(step(effect, statistic_detail(rule)));
                        let res = self.run_chain(table, c, sub, st, depth + 1)?;
                        if goto {
                            out.extend(res);
                        } else {
                            let mut back = Vec::new();
                            for (s, flow) in res {
                                if flow == Flow::Return {
                                    back.push(s);
                                } else {
                                    out.push((s, flow));
                                }
                            }
                            for s in back.into_iter().rev() {
                                stack.push(Item {
                                    st: s,
                                    i: i + 1,
                                    matched_any: true,
                                    decided: None,
                                });
                            }
                        }
                        break;
                    }
                    Some(Target::Return) => {
                        st.steps.push(step(Effect::Return, String::new()));
                        out.push((st, Flow::Return));
                        break;
                    }
                    Some(Target::Accept) => {
                        st.steps.push(step(Effect::Accept, String::new()));
                        out.push((st, Flow::Accept));
                        break;
                    }
                    Some(Target::Drop) => {
                        st.steps.push(step(Effect::Drop, String::new()));
                        out.push((st, Flow::Drop));
                        break;
                    }
                    Some(Target::Reject { with }) => {
                        let w = with
                            .clone()
                            .unwrap_or_else(|| default_reject(self.core.version).to_string());
                        st.steps.push(step(Effect::Reject, String::new()));
                        out.push((st, Flow::Reject(w)));
                        break;
                    }
                    Some(Target::Dnat(n)) if table == Table::Nat => {
                        let detail = self.apply_dnat(&mut st, &n.to, table, name, i);
                        st.steps.push(step(Effect::Dnat, detail));
                        out.push((st, Flow::Accept));
                        break;
                    }
                    Some(Target::Snat(n)) if table == Table::Nat => {
                        let detail = self.apply_snat(&mut st, &n.to, table, name, i);
                        st.steps.push(step(Effect::Snat, detail));
                        out.push((st, Flow::Accept));
                        break;
                    }
                    Some(Target::Masquerade {
                        to_ports,
                        random,
                        random_fully,
                    }) if table == Table::Nat => {
                        st.masquerade = true;
                        st.ct_snat = true;
                        st.src_known = false;
                        if to_ports.is_some() || *random || *random_fully {
                            st.sport = None;
                        }
                        let detail = "source becomes the outgoing interface's address".into();
                        st.steps.push(step(Effect::Masquerade, detail));
                        out.push((st, Flow::Accept));
                        break;
                    }
                    Some(Target::Unknown { name: t, args })
                        if t == "REDIRECT"
                            && let Some(at) = self.redirect_at
                            && let Some(to_ports) = redirect_ports(args) =>
                    {
                        let detail = self.apply_redirect(&mut st, to_ports, at, table, name, i);
                        st.steps.push(step(Effect::Dnat, detail));
                        out.push((st, Flow::Accept));
                        break;
                    }
                    Some(Target::Mark { value, mask }) => {
                        let old = st.mark;
                        st.mark = (old & !mask) ^ value;
                        let detail = format!("mark {old:#x} -> {:#x}", st.mark);
                        st.steps.push(step(Effect::Mark, detail));
                        i += 1;
                    }
                    Some(Target::Unknown { name: t, .. })
                        if PASSIVE_TARGETS.contains(&t.as_str()) =>
                    {
                        st.steps
                            .push(step(Effect::Continue, format!("{t} only logs")));
                        i += 1;
                    }
                    Some(t) => {
                        st.add_unknown(format!(
                            "{table} {name} rule index {i}: target {} not evaluated (traced as if it \
                             did nothing and the packet went on): `{rule}`",
                            t.name()
                        ));
                        st.steps
                            .push(step(Effect::Continue, "not evaluated".into()));
                        i += 1;
                    }
                }
            }
        }
        Ok(out)
    }

    /// Applies a DNAT target; returns the step detail.
    fn apply_dnat(
        &mut self,
        st: &mut State,
        to: &NatRange,
        table: Table,
        chain: &str,
        i: usize,
    ) -> String {
        let (addr, port) = self.nat_choice(st, to, st.dst, st.dport, table, chain, i);
        if addr != st.dst || port != st.dport {
            st.ct_dnat = true;
        }
        st.dst = addr;
        st.dport = port;
        st.dnat = Some((addr, port));
        format!("destination now {}", endpoint(addr, port))
    }

    /// Applies a REDIRECT target (a DNAT to a local address: in nat OUTPUT the loopback
    /// address, in nat PREROUTING the primary address of the incoming interface, port
    /// `to_ports` or the original one); returns the step detail.
    fn apply_redirect(
        &mut self,
        st: &mut State,
        to_ports: Option<PortRange>,
        at: RedirectHook,
        table: Table,
        chain: &str,
        i: usize,
    ) -> String {
        let v6 = self.core.version == IpVersion::V6;
        let mut known = true;
        let addr = match at {
            RedirectHook::Output => {
                if v6 {
                    IpAddr::V6(Ipv6Addr::LOCALHOST)
                } else {
                    IpAddr::V4(Ipv4Addr::LOCALHOST)
                }
            }
            RedirectHook::Prerouting => match self.interface_address(st.dst) {
                Some(a) => a,
                None => {
                    known = false;
                    if v6 {
                        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
                    } else {
                        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
                    }
                }
            },
        };
        let port = match (to_ports, self.core.packet.proto.has_ports()) {
            (Some(r), true) => {
                if r.first != r.last {
                    st.add_unknown(format!(
                        "{table} {chain} rule index {i}: REDIRECT to the port range {}-{}: the \
                         kernel picks one; traced with the first, {}",
                        r.first, r.last, r.first
                    ));
                }
                Some(r.first)
            }
            _ => st.dport,
        };
        if addr != st.dst || port != st.dport {
            st.ct_dnat = true;
        }
        st.dst = addr;
        st.dport = port;
        st.dnat = Some((addr, port));
        st.ext.dst_unknown = !known;
        st.redirected_local = true;
        let port_text = port.map_or_else(String::new, |p| format!(", port {p}"));
        match (at, known) {
            (RedirectHook::Output, _) => {
                format!(
                    "REDIRECT: destination now {} (the loopback address)",
                    endpoint(addr, port)
                )
            }
            (RedirectHook::Prerouting, true) => {
                self.core.note(format!(
                    "REDIRECT in nat PREROUTING sends the packet to the primary address of the \
                     interface it arrived on; interface addresses are not modelled, so it is \
                     traced as {addr}, the node's first {} address (an interface without an \
                     address makes the kernel drop the packet)",
                    if v6 { "IPv6" } else { "IPv4" }
                ));
                format!(
                    "REDIRECT: destination now {} (an address of the incoming interface)",
                    endpoint(addr, port)
                )
            }
            (RedirectHook::Prerouting, false) => {
                self.core.note(format!(
                    "REDIRECT in nat PREROUTING sends the packet to the primary address of the \
                     interface it arrived on, which the tracer cannot name (the node's \
                     addresses were not given: --node-ip); shown as {addr}, and delivered \
                     locally"
                ));
                format!(
                    "REDIRECT: destination now the incoming interface's address{port_text} \
                     (delivered locally)"
                )
            }
        }
    }

    /// The address a REDIRECT in PREROUTING traces for a packet to `dst`: the node's first
    /// address of the family that is not loopback (nor link-local in IPv6 unless `dst` is:
    /// the kernel's choice among an interface's addresses); `None` without one.
    fn interface_address(&self, dst: IpAddr) -> Option<IpAddr> {
        let link_local = |ip: &IpAddr| match ip {
            IpAddr::V6(a) => a.is_unicast_link_local(),
            IpAddr::V4(_) => false,
        };
        self.core
            .host
            .local_addrs
            .iter()
            .copied()
            .filter(|a| a.is_ipv4() == dst.is_ipv4() && !a.is_loopback() && !a.is_unspecified())
            .find(|a| !link_local(a) || link_local(&dst))
    }

    /// Applies an SNAT target; returns the step detail.
    fn apply_snat(
        &mut self,
        st: &mut State,
        to: &NatRange,
        table: Table,
        chain: &str,
        i: usize,
    ) -> String {
        let (addr, port) = self.nat_choice(st, to, st.src, st.sport, table, chain, i);
        st.src = addr;
        st.src_known = true;
        st.sport = port;
        st.masquerade = true;
        st.ct_snat = true;
        format!("source now {}", endpoint(addr, port))
    }

    /// The address and port a NAT range maps to: the first of each range (a range is
    /// reported unknown: the kernel picks one).
    #[allow(clippy::too_many_arguments)]
    fn nat_choice(
        &self,
        st: &mut State,
        to: &NatRange,
        addr: IpAddr,
        port: Option<u16>,
        table: Table,
        chain: &str,
        i: usize,
    ) -> (IpAddr, Option<u16>) {
        let mut ranged = false;
        let addr = match to.addrs {
            Some((a, b)) => {
                ranged |= a != b;
                a
            }
            None => addr,
        };
        let port = match (to.ports, self.core.packet.proto.has_ports()) {
            (Some(r), true) => {
                ranged |= r.first != r.last;
                Some(r.first)
            }
            _ => port,
        };
        if ranged {
            st.add_unknown(format!(
                "{table} {chain} rule index {i}: NAT to the range {to}: the kernel picks one; \
                 traced with the first, {}",
                endpoint(addr, port)
            ));
        }
        (addr, port)
    }

    /// Decides whether `rule` matches `st`. Forks at `statistic` matches: `st` becomes
    /// the matching branch and the not-matching ones are appended to `extras`.
    fn match_rule(
        &mut self,
        table: Table,
        chain: &str,
        i: usize,
        rule: &Rule,
        st: &mut State,
        extras: &mut Vec<State>,
    ) -> bool {
        let mut unknowns = Vec::new();
        let mut recents: Vec<&Recent> = Vec::new();
        for m in &rule.matches {
            match self.pure(m, st) {
                Pure::Yes | Pure::Effect => {}
                Pure::No => return false,
                Pure::Unknown(why) => unknowns.push(why),
                Pure::NoFirstConnection => {
                    if let Match::Recent(r) = m {
                        recents.push(r);
                    }
                }
            }
        }
        if !recents.is_empty() {
            if unknowns.is_empty() {
                let to = rule
                    .jump_chain()
                    .map_or_else(|| "this rule's target".to_string(), str::to_string);
                for r in recents {
                    let within = r
                        .seconds
                        .map_or_else(String::new, |s| format!(" within {s}s"));
                    self.core.note(format!(
                        "session affinity ({table} {chain} rule index {i}): traced as a first \
                         connection; a returning client{within} (recent list {}) goes back \
                         to {to}",
                        r.name
                    ));
                }
            }
            return false;
        }
        if !unknowns.is_empty() {
            for why in unknowns {
                st.add_unknown(format!(
                    "{table} {chain} rule index {i}: {why}; the rule was treated as not matching: \
                     `{rule}`"
                ));
            }
            return false;
        }
        for m in &rule.matches {
            match m {
                Match::Recent(r) if r.command == RecentCommand::Set => {
                    st.ext.recent_set.push(recent_key(r));
                    self.core.note(format!(
                        "{table} {chain} rule index {i} records the client in recent list {} (session \
                         affinity)",
                        r.name
                    ));
                }
                Match::Statistic(s) => {
                    let p = match s.mode {
                        StatisticMode::Random { probability } => probability.as_f64(),
                        StatisticMode::Nth { every, .. } => 1.0 / f64::from(every),
                    };
                    if let StatisticMode::Nth { every, .. } = s.mode {
                        self.core.note(format!(
                            "{table} {chain} rule index {i}: statistic nth (every {every}) traced as \
                             a 1/{every} chance: which connection number this is is unknown"
                        ));
                    }
                    let p = if s.negated { 1.0 - p } else { p };
                    if p <= 0.0 {
                        return false;
                    }
                    if p >= 1.0 {
                        continue;
                    }
                    if self.core.branches >= self.core.max_outcomes {
                        if !self.core.capped {
                            self.core.capped = true;
                            self.core.note(format!(
                                "more than {} outcomes: further statistic matches were not \
                                 branched (traced as not matching; those outcomes are marked \
                                 uncertain)",
                                self.core.max_outcomes
                            ));
                        }
                        st.add_unknown(format!(
                            "{table} {chain} rule index {i}: statistic match not branched (outcome \
                             cap reached): `{rule}`"
                        ));
                        return false;
                    }
                    self.core.branches += 1;
                    let mut other = st.clone();
                    other.prob *= 1.0 - p;
                    st.prob *= p;
                    extras.push(other);
                }
                _ => {}
            }
        }
        true
    }

    /// Evaluates one match without side effects.
    fn pure(&mut self, m: &Match, st: &State) -> Pure {
        match m {
            Match::Source { net, negated } => {
                if st.src_known {
                    pure(net.contains(st.src) ^ negated)
                } else {
                    Pure::Unknown("source address after MASQUERADE is not known".into())
                }
            }
            Match::Destination { .. } if st.ext.dst_unknown && !m_is_any(m) => {
                Pure::Unknown(DST_UNKNOWN.into())
            }
            Match::Destination { net, negated } => pure(net.contains(st.dst) ^ negated),
            Match::InInterface { name, negated } => {
                iface_match(&st.in_iface, name, *negated, "input interface")
            }
            Match::OutInterface { name, negated } => {
                iface_match(&st.out_iface, name, *negated, "output interface")
            }
            Match::Protocol { proto, negated } => {
                pure((proto.0 == 0 || proto.0 == self.core.proto) ^ negated)
            }
            // The traced packet is the first (so unfragmented) packet of a connection.
            Match::Fragment { negated } => pure(*negated),
            Match::Comment(_) | Match::Nfacct { .. } => Pure::Yes,
            Match::Tcp(pm) => self.ports(6, pm, st),
            Match::Udp(pm) => self.ports(17, pm, st),
            Match::Sctp(pm) => self.ports(132, pm, st),
            Match::Multiport(mp) => self.multiport(mp, st),
            Match::Statistic(_) => Pure::Effect,
            Match::Mark(mm) => pure(((st.mark & mm.mask) == mm.value) ^ mm.negated),
            Match::Conntrack(c) => conntrack(c, st),
            Match::State(s) => pure(s.states.contains(&ConnState::New) ^ s.negated),
            Match::AddrType(a) => self.addrtype(a, st),
            Match::Recent(r) => {
                let seen = st.ext.recent_set.contains(&recent_key(r));
                match r.command {
                    RecentCommand::Set => {
                        if r.negated {
                            Pure::No
                        } else {
                            Pure::Effect
                        }
                    }
                    RecentCommand::Remove => pure(seen ^ r.negated),
                    RecentCommand::Check | RecentCommand::Update => {
                        if seen ^ r.negated {
                            Pure::Yes
                        } else if seen {
                            Pure::No
                        } else {
                            Pure::NoFirstConnection
                        }
                    }
                }
            }
            Match::Set(s) => self.set_match(s, st),
            Match::Physdev(pd) => self.physdev(pd),
            Match::Unknown { module, args } if module == "ipvs" && self.ipvs.is_some() => {
                ipvs_match(args, st)
            }
            Match::Unknown { module, args } if module == "icmp" || module == "icmp6" => {
                self.icmp_type(args)
            }
            Match::Unknown { module, .. } => Pure::Unknown(format!(
                "match `-m {module}` (or its options) not understood"
            )),
        }
    }

    /// `-m icmp --icmp-type T` / `-m icmp6 --icmpv6-type T`: the traced ICMP packet is an echo
    /// request (type 8, or 128 in ICMPv6).
    fn icmp_type(&self, args: &[String]) -> Pure {
        if !matches!(self.core.proto, 1 | 58) {
            return Pure::No;
        }
        let (negated, value) = match args {
            [flag, v] if flag == "--icmp-type" || flag == "--icmpv6-type" => (false, v),
            [bang, flag, v]
                if bang == "!" && (flag == "--icmp-type" || flag == "--icmpv6-type") =>
            {
                (true, v)
            }
            _ => {
                return Pure::Unknown(format!("match `-m icmp {}` not understood", args.join(" ")));
            }
        };
        let echo = matches!(
            value.as_str(),
            "8" | "8/0" | "128" | "128/0" | "echo-request" | "ping"
        );
        pure(echo ^ negated)
    }

    fn ports(&self, proto: u8, pm: &PortMatch, st: &State) -> Pure {
        if self.core.proto != proto {
            return Pure::No;
        }
        let mut unknown = None;
        for (test, val, what) in [
            (&pm.sport, st.sport, "source port"),
            (&pm.dport, st.dport, "destination port"),
        ] {
            if let Some(t) = test {
                match val {
                    None => unknown = Some(what),
                    Some(p) => {
                        if t.value.contains(p) == t.negated {
                            return Pure::No;
                        }
                    }
                }
            }
        }
        match unknown {
            Some(what) => Pure::Unknown(format!("the packet's {what} is not known")),
            None => Pure::Yes,
        }
    }

    fn multiport(&self, mp: &Multiport, st: &State) -> Pure {
        if ![6, 17, 33, 132, 136].contains(&self.core.proto) {
            return Pure::No;
        }
        let hit = |p: Option<u16>| p.map(|p| mp.ports.iter().any(|r| r.contains(p)));
        let r = match mp.kind {
            MultiportKind::Source => hit(st.sport),
            MultiportKind::Destination => hit(st.dport),
            MultiportKind::Either => match (hit(st.sport), hit(st.dport)) {
                (Some(true), _) | (_, Some(true)) => Some(true),
                (Some(false), Some(false)) => Some(false),
                _ => None,
            },
        };
        match r {
            Some(b) => pure(b ^ mp.negated),
            None => Pure::Unknown("the packet's port is not known".into()),
        }
    }

    fn addrtype(&mut self, a: &AddrType, st: &State) -> Pure {
        if a.limit_iface_in || a.limit_iface_out {
            self.core.note(
                "addrtype --limit-iface-in/--limit-iface-out ignored: address types are \
                 evaluated for the whole node"
                    .into(),
            );
        }
        let mut result = Pure::Yes;
        for (sel, addr, known, dst_side) in [
            (&a.src, st.src, st.src_known, false),
            (&a.dst, st.dst, true, true),
        ] {
            let Some(sel) = sel else { continue };
            if !known {
                return Pure::Unknown("source address after MASQUERADE is not known".into());
            }
            let kind = if dst_side && st.ext.dst_unknown {
                Some(AddrKind::Local)
            } else {
                self.addr_kind(addr)
            };
            match kind {
                Some(kind) => {
                    if sel.value.contains(&kind) == sel.negated {
                        return Pure::No;
                    }
                }
                None if dst_side
                    && self.unknown_if_local(addr)
                    && sel.value.contains(&AddrKind::Local) =>
                {
                    return Pure::Unknown(self.core.unknown_local(addr));
                }
                None => {
                    // A non-local unicast-looking address: UNICAST if a route exists,
                    // else BLACKHOLE/UNREACHABLE/PROHIBIT/THROW from the routing table.
                    let routed = [
                        AddrKind::Blackhole,
                        AddrKind::Unreachable,
                        AddrKind::Prohibit,
                        AddrKind::Throw,
                        AddrKind::Nat,
                        AddrKind::Xresolve,
                        AddrKind::Anycast,
                    ];
                    let has_unicast = sel.value.contains(&AddrKind::Unicast);
                    let has_routed = routed.iter().any(|k| sel.value.contains(k));
                    if has_unicast {
                        self.core.note(format!(
                            "addrtype: {addr} is assumed UNICAST (routes are not modelled)"
                        ));
                        if sel.negated {
                            return Pure::No;
                        }
                    } else if has_routed {
                        result = Pure::Unknown(format!(
                            "the address type of {addr} depends on the routing table"
                        ));
                    } else if !sel.negated {
                        return Pure::No;
                    }
                }
            }
        }
        result
    }

    /// Whether `ip` (not a known node, loopback, multicast or broadcast address) may be
    /// a node address nobody told the tracer about: the node's addresses are not known
    /// ([`Host::local_addrs_incomplete`]) and `ip` is not a Service's ClusterIP (a nat
    /// rule `-d IP/32` commented `... cluster IP`), which is never a node address.
    fn unknown_if_local(&self, ip: IpAddr) -> bool {
        if !self.core.host.local_addrs_incomplete {
            return false;
        }
        let host = Cidr::host(ip);
        let Some(nat) = self.rules.tables.get(&Table::Nat) else {
            return true;
        };
        let cluster_ip = nat.chains.values().flat_map(|c| &c.rules).any(|r| {
            let names = r
                .matches
                .iter()
                .any(|m| matches!(m, Match::Destination { net, negated: false } if *net == host));
            names
                && r.matches
                    .iter()
                    .any(|m| matches!(m, Match::Comment(c) if c.ends_with("cluster IP")))
        });
        !cluster_ip
    }

    /// The address type of `ip` when it does not depend on routes.
    fn addr_kind(&self, ip: IpAddr) -> Option<AddrKind> {
        if self.core.host.is_local(ip) {
            return Some(AddrKind::Local);
        }
        if ip.is_multicast() {
            return Some(AddrKind::Multicast);
        }
        match ip {
            IpAddr::V4(a) if a.is_broadcast() || a.is_unspecified() => Some(AddrKind::Broadcast),
            IpAddr::V6(a) if a.is_unspecified() => Some(AddrKind::Unspec),
            _ => None,
        }
    }

    fn set_match(&self, s: &SetMatch, st: &State) -> Pure {
        let Some(set) = self.core.host.ipsets.get(&s.name) else {
            return Pure::Unknown(format!("the contents of ipset {} were not given", s.name));
        };
        let dims = set.set_type.dims();
        // The kernel never matches with fewer direction flags than the set has
        // dimensions, nor across families.
        if s.flags.len() < dims.len() || set.family.is_some_and(|f| f != self.core.version) {
            return pure(s.negated);
        }
        let mut vals = Vec::with_capacity(dims.len());
        for (dim, flag) in dims.iter().zip(&s.flags) {
            let src = *flag == SetFlag::Src;
            let v = match dim {
                Dim::Ip => {
                    if src && !st.src_known {
                        return Pure::Unknown(
                            "source address after MASQUERADE is not known".into(),
                        );
                    }
                    if !src && st.ext.dst_unknown {
                        return Pure::Unknown(DST_UNKNOWN.into());
                    }
                    SetValue::Ip(if src { st.src } else { st.dst })
                }
                Dim::Port => match self.core.packet.proto {
                    Proto::Tcp | Proto::Udp | Proto::Sctp => {
                        let Some(port) = (if src { st.sport } else { st.dport }) else {
                            return Pure::Unknown("the packet's port is not known".into());
                        };
                        SetValue::Port {
                            proto: self.core.proto,
                            port,
                        }
                    }
                    Proto::Icmp => SetValue::Echo {
                        proto: self.core.proto,
                    },
                    Proto::Other(_) => return pure(s.negated),
                },
            };
            vals.push(v);
        }
        pure(set.test(&vals) ^ s.negated)
    }

    /// Turns the final states into the trace, with the closing notes (in userspace mode
    /// after the proxy's step).
    fn finish(mut self, states: Vec<State>) -> Trace {
        let states = match self.userspace {
            Some(table) => self.proxy(table, states),
            None => states,
        };
        let outcomes: Vec<_> = states.into_iter().map(State::into_outcome).collect();
        if self.core.forwards_unchanged(&outcomes) {
            for n in self.no_dnat_notes(&outcomes) {
                self.core.note(n);
            }
        }
        self.core.into_trace(outcomes)
    }

    /// Explains a packet that leaves the node with its original destination. The nat
    /// rules that name the destination are sorted by what the trace did with them: a
    /// rule in a chain no jump leads to from the hook's nat chain is reported as not
    /// reached (never as a rule the packet does not match); a rule the packet matched is
    /// not listed; the others are what the packet does not match.
    fn no_dnat_notes(&self, outcomes: &[crate::Outcome]) -> Vec<String> {
        let p = self.core.packet;
        let host = Cidr::host(p.dst);
        let nat = Table::Nat.name();
        let hook = match p.entry {
            Entry::Node => "OUTPUT",
            _ => "PREROUTING",
        };
        // The nat chains jumps lead to from the hook's chain, whatever the packet.
        let mut reachable: Vec<&str> = vec![hook];
        let mut i = 0;
        while let Some(&name) = reachable.get(i) {
            i += 1;
            if let Some(chain) = self.rules.chain(Table::Nat, name) {
                for c in chain.rules.iter().filter_map(Rule::jump_chain) {
                    if !reachable.contains(&c) {
                        reachable.push(c);
                    }
                }
            }
        }
        let entered = |chain: &str| reachable.contains(&chain);
        let matched = |chain: &str, i: usize| {
            outcomes
                .iter()
                .flat_map(|o| &o.steps)
                .any(|s| s.table == nat && s.chain == chain && s.rule_index == Some(i))
        };
        let mut reqs: Vec<String> = Vec::new();
        let mut seen: Vec<String> = Vec::new();
        let mut unreached: Vec<&str> = Vec::new();
        if let Some(tables) = self.rules.tables.get(&Table::Nat) {
            for (name, chain) in &tables.chains {
                for (i, r) in chain.rules.iter().enumerate() {
                    let names_dst = r.matches.iter().any(
                        |m| matches!(m, Match::Destination { net, negated: false } if *net == host),
                    );
                    if !names_dst {
                        continue;
                    }
                    if !entered(name) {
                        if !unreached.contains(&name.as_str()) {
                            unreached.push(name);
                        }
                    } else if !matched(name, i) {
                        let (what, req) = requirement(name, r);
                        if !seen.contains(&what) {
                            seen.push(what);
                            reqs.push(req);
                        }
                    }
                }
            }
        }
        let (mode, rules_kind) = match self.core.mode {
            Mode::Userspace => ("userspace mode", "REDIRECT and DNAT rules"),
            _ => ("iptables mode", "DNAT rules"),
        };
        let why = if p.proto == Proto::Icmp {
            format!("this is why a ClusterIP cannot be pinged in {mode}")
        } else {
            "the connection attempt gets no answer".to_string()
        };
        let mut notes = Vec::new();
        if !unreached.is_empty() {
            notes.push(format!(
                "no DNAT: the nat rules for {} are in {}, which the packet never reaches from \
                 nat {hook} (no rule leads there; a partial dump may lack kube-proxy's jump \
                 `-A {hook} -j KUBE-SERVICES`), so they were not evaluated; the packet is \
                 routed unchanged towards {}",
                p.dst,
                unreached.join(", "),
                endpoint(p.dst, p.dport)
            ));
        }
        if !reqs.is_empty() || unreached.is_empty() {
            notes.push(self.core.no_dnat_note(&reqs, |shown, more| format!(
                "no DNAT: nat rules for {} only match {}{more}, which this {} packet does not; it \
                 is routed unchanged towards {}, an address no interface owns (a Service IP in \
                 {mode} exists only as {rules_kind} for its ports), so nothing answers: {why}",
                p.dst,
                shown,
                p.proto,
                p.dst
            )));
        }
        notes
    }
}

/// What a rule requires besides its destination (`tcp dport 8080`), and that with
/// where it is (`tcp dport 8080 in KUBE-SERVICES ("default/nginx-svc cluster IP")`).
fn requirement(chain: &str, r: &Rule) -> (String, String) {
    let mut parts: Vec<String> = Vec::new();
    for m in &r.matches {
        match m {
            Match::Protocol { proto, negated } => {
                parts.push(format!("{}{proto}", if *negated { "not " } else { "" }));
            }
            Match::Tcp(pm) | Match::Udp(pm) | Match::Sctp(pm) => {
                if let Some(d) = &pm.dport {
                    let not = if d.negated { "not " } else { "" };
                    parts.push(format!("{not}dport {}", d.value));
                }
            }
            Match::Multiport(mp) if mp.kind != MultiportKind::Source => {
                let list: Vec<String> = mp.ports.iter().map(ToString::to_string).collect();
                parts.push(format!("dports {}", list.join(",")));
            }
            _ => {}
        }
    }
    if parts.is_empty() {
        parts.push("other conditions".into());
    }
    let comment = r
        .matches
        .iter()
        .find_map(|m| match m {
            Match::Comment(c) => Some(format!(" (\"{c}\")")),
            _ => None,
        })
        .unwrap_or_default();
    let what = parts.join(" ");
    let full = format!("{what} in {chain}{comment}");
    (what, full)
}

/// Why a match on the destination address after a REDIRECT to an unnamed address is
/// unknown.
const DST_UNKNOWN: &str = "the destination after REDIRECT is an address of the incoming interface, \
                           which is not known (give the node's addresses)";

/// Whether a `-d` match is `0.0.0.0/0` / `::/0` (true for any destination).
fn m_is_any(m: &Match) -> bool {
    matches!(m, Match::Destination { net, negated: false } if net.is_any())
}

/// The `--to-ports` of a REDIRECT target's options (`Some(None)` without it), or `None`
/// when they hold anything but `--to-ports P[-Q]` and `--random`.
fn redirect_ports(args: &[String]) -> Option<Option<PortRange>> {
    let mut ports = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--to-ports" | "--to-port" if ports.is_none() => {
                let v = it.next()?;
                let (a, b) = match v.split_once('-') {
                    Some((a, b)) => (a.parse().ok()?, b.parse().ok()?),
                    None => {
                        let p = v.parse().ok()?;
                        (p, p)
                    }
                };
                if a > b {
                    return None;
                }
                ports = Some(PortRange { first: a, last: b });
            }
            "--random" => {}
            _ => return None,
        }
    }
    Some(ports)
}

fn statistic_detail(rule: &Rule) -> String {
    for m in &rule.matches {
        if let Match::Statistic(s) = m {
            let p = match s.mode {
                StatisticMode::Random { probability } => probability.as_f64(),
                StatisticMode::Nth { every, .. } => 1.0 / f64::from(every),
            };
            let p = if s.negated { 1.0 - p } else { p };
            return format!("taken with probability {:.1}%", p * 100.0);
        }
    }
    String::new()
}

fn recent_key(r: &Recent) -> String {
    format!("{}|{:?}", r.name, r.side)
}

fn default_reject(v: IpVersion) -> &'static str {
    match v {
        IpVersion::V4 => "icmp-port-unreachable",
        IpVersion::V6 => "icmp6-port-unreachable",
    }
}

fn iface_match(iface: &Iface, pattern: &str, negated: bool, what: &str) -> Pure {
    let hit = match iface {
        Iface::Absent => false,
        Iface::Name(n) => match pattern.strip_suffix('+') {
            Some(prefix) => n.starts_with(prefix),
            None => n == pattern,
        },
        Iface::Unknown => return Pure::Unknown(Iface::unknown_reason(what)),
    };
    pure(hit ^ negated)
}

fn conntrack(c: &Conntrack, st: &State) -> Pure {
    if let Some(s) = &c.state {
        let mut have = BTreeSet::from([ConnState::New]);
        if st.ct_dnat {
            have.insert(ConnState::Dnat);
        }
        if st.ct_snat {
            have.insert(ConnState::Snat);
        }
        let hit = s.value.iter().any(|x| have.contains(x));
        if hit == s.negated {
            return Pure::No;
        }
    }
    if let Some(s) = &c.status {
        let hit = st.confirmed && s.value.contains(&CtStatus::Confirmed);
        if hit == s.negated {
            return Pure::No;
        }
    }
    Pure::Yes
}

/// The only family the ruleset's addresses have, if they all have one.
fn single_family(rules: &Ruleset) -> Option<IpVersion> {
    let (mut v4, mut v6) = (false, false);
    let mut see = |ip: IpAddr| match ip {
        IpAddr::V4(_) => v4 = true,
        IpAddr::V6(_) => v6 = true,
    };
    for t in rules.tables.values() {
        for c in t.chains.values() {
            for r in &c.rules {
                for m in &r.matches {
                    if let Match::Source { net, .. } | Match::Destination { net, .. } = m {
                        see(net.addr());
                    }
                }
                if let Some(Target::Dnat(n) | Target::Snat(n)) = &r.target
                    && let Some((a, _)) = n.to.addrs
                {
                    see(a);
                }
            }
        }
    }
    match (v4, v6) {
        (true, false) => Some(IpVersion::V4),
        (false, true) => Some(IpVersion::V6),
        _ => None,
    }
}
