//! The nftables traversal: base chains of every table, hook by hook in priority order,
//! rule by rule and statement by statement, forking the packet at random numbers
//! (`numgen`).
//!
//! The branch state, the routing decisions and the assembly of the result are shared
//! with the iptables tracer ([`crate::common`]); hooks, priorities, base chains and
//! statements are here.

use std::collections::HashSet;
use std::net::IpAddr;

use kp_netfilter::IpVersion;

use super::eval::{
    CmpOp, Kind, Lookup, Truth, V, Val, compare, const_val, kinds, lookup, val_text,
};
use super::ir::{
    BinOp, Expr, Family, Lit, MatchOp, NatKind, NftChain, NftRule, NftRuleset, NftSet, NftTable,
    NftVerdict, SetElem, Stmt,
};
use super::text::{elem_text, expr_text, lit_text, rule_text};
use crate::common::{self, Core, Flow, Iface, Path, loop_back_local};
use crate::packet::endpoint;
use crate::result::{Effect, Mode, Outcome, Step, Trace, Verdict};
use crate::{Entry, Host, Packet, Proto, TraceError, TraceOptions};

/// The priority of conntrack's hooks in prerouting and output: base chains below it see
/// packets without a conntrack entry (`ct state invalid`, other `ct` keys missing).
const PRIO_CONNTRACK: i64 = -200;

/// The largest `numgen` modulus whose values are enumerated (kube-proxy uses one value per
/// endpoint).
const MAX_NUMGEN: u64 = 1 << 16;

/// What only the nftables tracer tracks of a branch.
#[derive(Debug, Clone, Default)]
struct Ext {
    /// The conntrack mark.
    ct_mark: u32,
    /// Whether conntrack has seen the packet (priority above -200, or after prerouting).
    tracked: bool,
    /// A destination NAT binding exists: later nat chains of the hook are skipped.
    nat_dst_done: bool,
    /// A source NAT binding exists: later nat chains of the hook are skipped.
    nat_src_done: bool,
    /// Elements this packet added to sets: (table index, set, key).
    recorded: Vec<(usize, String, Vec<Val>)>,
}

/// One branch's packet and history.
type St = common::State<Ext>;

/// How a rule ended for one branch.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Out {
    NoMatch,
    Next,
    Jump(String),
    Goto(String),
    Return,
    Accept,
    Drop,
    Reject(String),
}

/// What one branch of a statement does.
#[derive(Debug, Clone, PartialEq)]
enum Act {
    /// Go on with the next statement.
    Next(Option<String>),
    SetMark(u32),
    SetCtMark(u32),
    Record(String, Vec<Val>),
    Unrecord(String, Vec<Val>),
    /// The rule does not match.
    NoMatch,
    /// The rule cannot be evaluated: treated as not matching, reported.
    Unknown(String),
    /// A membership test on a set the rules fill from packets (session affinity): a
    /// first connection is not in it.
    Affinity {
        set: String,
        key: Vec<Val>,
    },
    Verdict(NftVerdict, Option<String>),
    Nat {
        kind: NatKind,
        addr: Option<IpAddr>,
        port: Option<u16>,
        /// A range: traced with its first address/port.
        ranged: Option<String>,
        random: bool,
    },
    Reject(String),
}

/// A rule being evaluated for one branch.
struct Pending {
    st: St,
    i: usize,
    /// Take this branch of statement `i` (already forked).
    pick: Option<usize>,
    details: Vec<String>,
    side_effects: bool,
}

/// Where a rule is.
struct Cx<'a> {
    ti: usize,
    table: &'a NftTable,
    chain: &'a NftChain,
    idx: usize,
    rule: &'a NftRule,
}

impl Cx<'_> {
    fn place(&self) -> String {
        let handle = self.rule.handle.map_or_else(
            || format!("rule index {}", self.idx),
            |h| format!("rule handle {h}"),
        );
        format!("{} {} {handle}", self.table.label(), self.chain.name)
    }

    fn step(&self, effect: Effect, detail: String) -> Step {
        Step {
            table: self.table.label(),
            chain: self.chain.name.clone(),
            rule_index: Some(self.idx),
            line: None,
            handle: self.rule.handle,
            rule_text: rule_text(self.rule),
            effect,
            detail,
        }
    }
}

/// One nftables trace in progress.
pub(crate) struct Engine<'a> {
    rules: &'a NftRuleset,
    /// The packet, the host, the notes.
    core: Core<'a>,
    /// Sets that rules fill from the packet path (`update @set`, `add @set`).
    dynamic: HashSet<(usize, String)>,
    /// Reported on every outcome (base chains the model does not run).
    global_unknown: Vec<String>,
}

impl<'a> Engine<'a> {
    /// Checks the inputs and prepares a trace.
    pub(crate) fn new(
        rules: &'a NftRuleset,
        host: &'a Host,
        packet: &'a Packet,
        opts: &TraceOptions,
    ) -> Result<Engine<'a>, TraceError> {
        let core = Core::new(Mode::Nftables, host, packet, opts)?;
        let version = core.version;
        let applies = |f: Family| match f {
            Family::Ip => version == IpVersion::V4,
            Family::Ip6 => version == IpVersion::V6,
            Family::Inet => true,
            _ => false,
        };
        let ip_tables: Vec<Family> = rules
            .tables
            .iter()
            .map(|t| t.family)
            .filter(|f| matches!(f, Family::Ip | Family::Ip6 | Family::Inet))
            .collect();
        if !ip_tables.is_empty() && !ip_tables.iter().any(|f| applies(*f)) {
            return Err(TraceError::FamilyMismatch {
                packet: version,
                ruleset: match version {
                    IpVersion::V4 => IpVersion::V6,
                    IpVersion::V6 => IpVersion::V4,
                },
            });
        }
        let mut dynamic = HashSet::new();
        for (ti, t) in rules.tables.iter().enumerate() {
            for s in t.sets.values() {
                if s.flags.iter().any(|f| f == "dynamic") {
                    dynamic.insert((ti, s.name.clone()));
                }
            }
            for c in t.chains.values() {
                for r in &c.rules {
                    for s in &r.stmts {
                        if let Stmt::SetOp { set, .. } = s {
                            dynamic.insert((ti, set.clone()));
                        }
                    }
                }
            }
        }
        Ok(Engine {
            rules,
            core,
            dynamic,
            global_unknown: Vec::new(),
        })
    }

    fn applies(&self, f: Family) -> bool {
        match f {
            Family::Ip => self.core.version == IpVersion::V4,
            Family::Ip6 => self.core.version == IpVersion::V6,
            Family::Inet => true,
            _ => false,
        }
    }

    /// Runs the trace.
    pub(crate) fn run(mut self) -> Result<Trace, TraceError> {
        let p = self.core.packet;
        self.unevaluated_chains();
        let mut states = vec![self.initial_state()];
        match &p.entry {
            Entry::Pod { .. } | Entry::External { .. } => {
                self.hook(&mut states, "prerouting", None, false)?;
                self.core.route_incoming_live(&mut states);
                self.hook(&mut states, "input", Some(Path::Local), false)?;
                self.hook(&mut states, "forward", Some(Path::Forward), false)?;
                self.hook(&mut states, "postrouting", Some(Path::Forward), false)?;
            }
            Entry::Node => {
                let dst = states[0].dst;
                states[0].path = Some(if self.core.host.is_local(dst) {
                    Path::Local
                } else {
                    Path::Forward
                });
                self.hook(&mut states, "output", None, false)?;
                self.core.reroute_local_live(&mut states);
                self.hook(&mut states, "postrouting", None, false)?;
                if loop_back_local(&mut states) {
                    self.core.note(
                        "locally generated packet for a local address: after output and \
                         postrouting it comes back over lo through the prerouting and input \
                         base chains; nat chains are not consulted again (the connection's NAT \
                         was set up on the way out)"
                            .into(),
                    );
                }
                self.hook(&mut states, "prerouting", Some(Path::Local), true)?;
                self.hook(&mut states, "input", Some(Path::Local), true)?;
            }
        }
        Ok(self.finish(states))
    }

    /// Notes (and marks unknown) base chains the model does not run: non-IP families and
    /// device hooks (`ingress`, `egress`).
    fn unevaluated_chains(&mut self) {
        for t in &self.rules.tables {
            let no_base = !t.chains.is_empty() && t.chains.values().all(|c| c.base.is_none());
            if t.name == "kube-proxy" && self.applies(t.family) && no_base {
                self.core.note(format!(
                    "{} has chains but no base chain (none is attached to a netfilter hook), \
                     so nothing in it is reached; the dump looks partial: kube-proxy's base \
                     chains (nat-prerouting, nat-output, filter-input, ...) are not assumed \
                     — dump the whole table (`nft -j list ruleset`)",
                    t.label()
                ));
            }
            for c in t.chains.values() {
                let Some(b) = &c.base else { continue };
                let device_hook = matches!(b.hook.as_str(), "ingress" | "egress");
                if !self.applies(t.family) || device_hook {
                    let matters = !c.rules.is_empty() || b.policy != "accept";
                    let msg = format!(
                        "{} base chain {} (hook {}) is not evaluated (only the IP hooks \
                         prerouting, input, forward, output and postrouting of ip/ip6/inet \
                         tables are)",
                        t.label(),
                        c.name,
                        b.hook
                    );
                    if matters && (device_hook || t.family == Family::Netdev) {
                        // Such a chain may drop the packet: every outcome is uncertain.
                        self.global_unknown
                            .push(format!("{msg}; it has rules or a drop policy"));
                    } else if matters && t.family == Family::Bridge {
                        self.core.note(msg);
                    }
                }
            }
        }
    }

    fn initial_state(&self) -> St {
        let mut st = self.core.entry_state(Ext::default());
        st.unknown = self.global_unknown.clone();
        st.uncertain = !self.global_unknown.is_empty();
        st
    }

    /// The base chains of `hook` for the packet's family, in the order the kernel runs
    /// them. nat chains run inside the NAT core's hook (priority -100 in prerouting and
    /// output, 100 in input and postrouting), ordered among themselves by their own
    /// priority.
    fn base_chains(&self, hook: &str) -> Vec<(usize, &'a NftChain)> {
        let rules: &'a NftRuleset = self.rules;
        // (effective priority, own priority, table, dump order) -> chain
        type Key = (i64, i64, usize, usize);
        let mut list: Vec<(Key, usize, &'a NftChain)> = Vec::new();
        for (ti, t) in rules.tables.iter().enumerate() {
            if !self.applies(t.family) {
                continue;
            }
            for c in t.chains.values() {
                let Some(b) = &c.base else { continue };
                if b.hook != hook {
                    continue;
                }
                let own = i64::from(b.priority);
                let effective = if b.chain_type == "nat" {
                    match hook {
                        "prerouting" | "output" => -100,
                        _ => 100,
                    }
                } else {
                    own
                };
                list.push(((effective, own, ti, c.order), ti, c));
            }
        }
        list.sort_by_key(|(k, _, _)| *k);
        list.into_iter().map(|(_, ti, c)| (ti, c)).collect()
    }

    /// Runs every base chain of `hook` for the live states on `path` (all if `None`).
    /// `lo_leg`: the loopback leg of node traffic (nat chains are skipped).
    fn hook(
        &mut self,
        states: &mut Vec<St>,
        hook: &str,
        path: Option<Path>,
        lo_leg: bool,
    ) -> Result<(), TraceError> {
        for (ti, chain) in self.base_chains(hook) {
            let Some(base) = &chain.base else { continue };
            let nat = base.chain_type == "nat";
            let dst_manip = matches!(hook, "prerouting" | "output");
            let mut next = Vec::with_capacity(states.len());
            for mut st in states.drain(..) {
                let skip_nat = nat
                    && (lo_leg
                        || (dst_manip && st.ext.nat_dst_done)
                        || (!dst_manip && st.ext.nat_src_done));
                if !st.live() || (path.is_some() && st.path != path) || skip_nat {
                    next.push(st);
                    continue;
                }
                st.ext.tracked = lo_leg
                    || !matches!(hook, "prerouting" | "output")
                    || i64::from(base.priority) >= PRIO_CONNTRACK;
                let before = st.dst;
                for mut s in self.run_base(ti, chain, st)? {
                    if hook == "output" && s.live() && s.dst != before {
                        self.core.reroute_local(&mut s);
                    }
                    next.push(s);
                }
            }
            *states = next;
        }
        Ok(())
    }

    /// Traverses a base chain and applies its policy.
    fn run_base(&mut self, ti: usize, chain: &'a NftChain, st: St) -> Result<Vec<St>, TraceError> {
        let table: &'a NftTable = &self.rules.tables[ti];
        let policy = chain.base.as_ref().map_or("accept", |b| b.policy.as_str());
        let res = self.run_chain(ti, chain, st, 0)?;
        let mut out = Vec::with_capacity(res.len());
        for (mut s, flow) in res {
            match flow {
                Flow::Return => match policy {
                    "accept" => {}
                    "drop" => {
                        s.steps.push(common::chain_step(
                            table.label(),
                            chain.name.clone(),
                            "policy drop".into(),
                            Effect::Policy,
                            String::new(),
                        ));
                        s.verdict = Some(Verdict::Drop);
                    }
                    other => s.add_unknown(format!(
                        "{} {}: policy {other} not understood; treated as accept",
                        table.label(),
                        chain.name
                    )),
                },
                end => s.leave_chain(end),
            }
            out.push(s);
        }
        Ok(out)
    }

    /// Traverses `chain` from its first rule; returns every branch with how it left.
    fn run_chain(
        &mut self,
        ti: usize,
        chain: &'a NftChain,
        st: St,
        depth: usize,
    ) -> Result<Vec<(St, Flow)>, TraceError> {
        let table: &'a NftTable = &self.rules.tables[ti];
        common::check_depth(depth, || (table.label(), chain.name.clone()))?;
        let mut out = Vec::new();
        let mut stack: Vec<(St, usize, bool)> = vec![(st, 0, false)];
        while let Some((mut st, i, matched_any)) = stack.pop() {
            let Some(rule) = chain.rules.get(i) else {
                if depth > 0 && !matched_any {
                    st.steps
                        .push(common::no_rule_matched(table.label(), chain.name.clone()));
                }
                out.push((st, Flow::Return));
                continue;
            };
            let cx = Cx {
                ti,
                table,
                chain,
                idx: i,
                rule,
            };
            let mut cont: Vec<(St, usize, bool)> = Vec::new();
            for (s, o) in self.eval_rule(&cx, st) {
                match o {
                    Out::NoMatch => cont.push((s, i + 1, matched_any)),
                    Out::Next => cont.push((s, i + 1, true)),
                    Out::Return => out.push((s, Flow::Return)),
                    Out::Accept => out.push((s, Flow::Accept)),
                    Out::Drop => out.push((s, Flow::Drop)),
                    Out::Reject(w) => out.push((s, Flow::Reject(w))),
                    Out::Jump(ref c) | Out::Goto(ref c) => {
                        let goto = matches!(o, Out::Goto(_));
                        let Some(sub) = table.chains.get(c) else {
                            // Checked when the verdict was taken; kept for safety.
                            cont.push((s, i + 1, matched_any));
                            continue;
                        };
                        let res = self.run_chain(ti, sub, s, depth + 1)?;
                        if goto {
                            out.extend(res);
                        } else {
                            for (s2, f) in res {
                                if f == Flow::Return {
                                    cont.push((s2, i + 1, true));
                                } else {
                                    out.push((s2, f));
                                }
                            }
                        }
                    }
                }
            }
            for c in cont.into_iter().rev() {
                stack.push(c);
            }
        }
        Ok(out)
    }

    /// Evaluates one rule for one state; returns every branch and how the rule ended.
    fn eval_rule(&mut self, cx: &Cx<'a>, st: St) -> Vec<(St, Out)> {
        let mut done = Vec::new();
        let mut work = vec![Pending {
            st,
            i: 0,
            pick: None,
            details: Vec::new(),
            side_effects: false,
        }];
        while let Some(mut p) = work.pop() {
            loop {
                let Some(stmt) = cx.rule.stmts.get(p.i) else {
                    let effect = if p.side_effects {
                        Effect::Mark
                    } else {
                        Effect::Continue
                    };
                    let detail = p.details.join("; ");
                    p.st.steps.push(cx.step(effect, detail));
                    done.push((p.st, Out::Next));
                    break;
                };
                let branches = self.eval_stmt(cx, stmt, &p.st);
                let (prob, act) = match p.pick.take() {
                    Some(k) => match branches.get(k) {
                        Some((bp, a)) => (*bp, a.clone()),
                        None => (1.0, Act::NoMatch),
                    },
                    None if branches.len() > 1 => {
                        if self.core.branches + branches.len() - 1 > self.core.max_outcomes {
                            if !self.core.capped {
                                self.core.capped = true;
                                self.core.note(format!(
                                    "more than {} outcomes: further random choices were not \
                                     branched (traced as not matching; those outcomes are \
                                     marked uncertain)",
                                    self.core.max_outcomes
                                ));
                            }
                            p.st.add_unknown(format!(
                                "{}: random choice not branched (outcome cap reached): `{}`",
                                cx.place(),
                                rule_text(cx.rule)
                            ));
                            done.push((p.st, Out::NoMatch));
                            break;
                        }
                        self.core.branches += branches.len() - 1;
                        for (k, (bp, _)) in branches.iter().enumerate().skip(1).rev() {
                            let mut st = p.st.clone();
                            st.prob *= bp;
                            work.push(Pending {
                                st,
                                i: p.i,
                                pick: Some(k),
                                details: p.details.clone(),
                                side_effects: p.side_effects,
                            });
                        }
                        let (bp, a) = branches[0].clone();
                        p.st.prob *= bp;
                        (bp, a)
                    }
                    None => match branches.into_iter().next() {
                        Some(b) => b,
                        None => (1.0, Act::NoMatch),
                    },
                };
                let chance = if prob < 1.0 {
                    format!(" (probability {:.1}%)", prob * 100.0)
                } else {
                    String::new()
                };
                match self.apply(cx, &mut p, act, &chance) {
                    Some(out) => {
                        done.push((p.st, out));
                        break;
                    }
                    None => p.i += 1,
                }
            }
        }
        done
    }

    /// Applies one branch of statement `p.i`; `Some` ends the rule.
    fn apply(&mut self, cx: &Cx<'a>, p: &mut Pending, act: Act, chance: &str) -> Option<Out> {
        match act {
            Act::Next(detail) => {
                if let Some(d) = detail {
                    p.details.push(format!("{d}{chance}"));
                } else if !chance.is_empty() {
                    p.details.push(chance.trim().to_string());
                }
                None
            }
            Act::SetMark(m) => {
                p.details.push(format!("mark {:#x} -> {m:#x}", p.st.mark));
                p.st.mark = m;
                p.side_effects = true;
                None
            }
            Act::SetCtMark(m) => {
                p.details
                    .push(format!("ct mark {:#x} -> {m:#x}", p.st.ext.ct_mark));
                p.st.ext.ct_mark = m;
                p.side_effects = true;
                None
            }
            Act::Record(set, key) => {
                let shown = key_text(&key);
                p.details.push(format!("records {shown} in @{set}"));
                let timeout = cx
                    .table
                    .sets
                    .get(&set)
                    .and_then(|s| s.timeout)
                    .map_or_else(String::new, |t| format!(" for {t}s"));
                self.core.note(format!(
                    "{} records {shown} in @{set}{timeout} (session affinity: a returning \
                     client is recognized by it)",
                    cx.place()
                ));
                p.st.ext.recorded.push((cx.ti, set, key));
                p.side_effects = true;
                None
            }
            Act::Unrecord(set, key) => {
                p.details
                    .push(format!("removes {} from @{set}", key_text(&key)));
                p.st.ext
                    .recorded
                    .retain(|(t, s, k)| !(*t == cx.ti && *s == set && *k == key));
                p.side_effects = true;
                None
            }
            Act::NoMatch => Some(self.no_match(cx, p)),
            Act::Unknown(why) => {
                if !self.rest_fails(cx, p.i + 1, &p.st) {
                    p.st.add_unknown(format!(
                        "{}: {why}; the rule was treated as not matching: `{}`",
                        cx.place(),
                        rule_text(cx.rule)
                    ));
                }
                Some(self.no_match(cx, p))
            }
            Act::Affinity { set, key } => {
                if !self.rest_fails(cx, p.i + 1, &p.st) {
                    self.affinity_note(cx, &set, &key);
                }
                Some(self.no_match(cx, p))
            }
            Act::Verdict(v, detail) => {
                if let Some(d) = detail {
                    p.details.push(format!("{d}{chance}"));
                }
                let d = p.details.join("; ");
                let (effect, out) = match v {
                    NftVerdict::Accept => (Effect::Accept, Out::Accept),
                    NftVerdict::Drop => (Effect::Drop, Out::Drop),
                    NftVerdict::Continue => (Effect::Continue, Out::Next),
                    NftVerdict::Return => (Effect::Return, Out::Return),
                    NftVerdict::Jump(c) => (Effect::Jump, Out::Jump(c)),
                    NftVerdict::Goto(c) => (Effect::Goto, Out::Goto(c)),
                    // Filtered out in eval_stmt (unknown).
                    NftVerdict::Queue => (Effect::Continue, Out::Next),
                };
                p.st.steps.push(cx.step(effect, d));
                Some(out)
            }
            Act::Reject(w) => {
                let d = p.details.join("; ");
                p.st.steps.push(cx.step(Effect::Reject, d));
                Some(Out::Reject(w))
            }
            Act::Nat {
                kind,
                addr,
                port,
                ranged,
                random,
            } => {
                // A masquerade port range only picks the source port, which is unknown
                // after masquerading anyway.
                if let Some(r) = ranged.filter(|_| kind != NatKind::Masquerade) {
                    p.st.add_unknown(format!(
                        "{}: NAT to the range {r}: the kernel picks one; traced with the first",
                        cx.place()
                    ));
                }
                let st = &mut p.st;
                let port_proto = self.core.packet.proto.has_ports();
                let (effect, detail) = match kind {
                    NatKind::Dnat => {
                        let a = addr.unwrap_or(st.dst);
                        let pt = if port_proto {
                            port.or(st.dport)
                        } else {
                            st.dport
                        };
                        if a != st.dst || pt != st.dport {
                            st.ct_dnat = true;
                        }
                        st.dst = a;
                        st.dport = pt;
                        st.dnat = Some((a, pt));
                        st.ext.nat_dst_done = true;
                        (
                            Effect::Dnat,
                            format!("destination now {}{chance}", endpoint(a, pt)),
                        )
                    }
                    NatKind::Snat => {
                        let a = addr.unwrap_or(st.src);
                        st.src = a;
                        st.src_known = true;
                        if port_proto && port.is_some() {
                            st.sport = port;
                        }
                        if random {
                            st.sport = None;
                        }
                        st.masquerade = true;
                        st.ct_snat = true;
                        st.ext.nat_src_done = true;
                        (
                            Effect::Snat,
                            format!("source now {}", endpoint(a, st.sport)),
                        )
                    }
                    NatKind::Masquerade | NatKind::Redirect => {
                        st.masquerade = true;
                        st.ct_snat = true;
                        st.src_known = false;
                        st.ext.nat_src_done = true;
                        if random || port.is_some() {
                            st.sport = None;
                        }
                        (
                            Effect::Masquerade,
                            "source becomes the outgoing interface's address".to_string(),
                        )
                    }
                };
                p.details.push(detail);
                let d = p.details.join("; ");
                p.st.steps.push(cx.step(effect, d));
                Some(Out::Accept)
            }
        }
    }

    /// The rule did not match; a step is kept if it changed something on the way.
    fn no_match(&mut self, cx: &Cx<'a>, p: &mut Pending) -> Out {
        if p.side_effects {
            let mut d = p.details.join("; ");
            d.push_str("; then the rule did not match");
            p.st.steps.push(cx.step(Effect::Continue, d));
        }
        Out::NoMatch
    }

    /// Whether a later match of the rule certainly fails (then an unknown earlier one
    /// does not matter).
    fn rest_fails(&mut self, cx: &Cx<'a>, from: usize, st: &St) -> bool {
        for stmt in cx.rule.stmts.iter().skip(from) {
            if let Stmt::Match { .. } = stmt {
                let b = self.eval_stmt(cx, stmt, st);
                if b.len() == 1 && b.iter().all(|(_, a)| *a == Act::NoMatch) {
                    return true;
                }
            }
        }
        false
    }

    fn affinity_note(&mut self, cx: &Cx<'a>, set: &str, key: &[Val]) {
        let target = cx
            .rule
            .stmts
            .iter()
            .find_map(|s| match s {
                Stmt::Verdict(v @ (NftVerdict::Goto(_) | NftVerdict::Jump(_))) => {
                    Some(v.to_string())
                }
                _ => None,
            })
            .unwrap_or_else(|| "this rule's verdict".into());
        let s = cx.table.sets.get(set);
        let within = s
            .and_then(|s| s.timeout)
            .map_or_else(String::new, |t| format!(" within {t}s"));
        let shown = key_text(key);
        let listed = s
            .and_then(|s| {
                s.elements
                    .iter()
                    .find(|e| elem_is(e, key))
                    .map(|e| match e.expires {
                        Some(x) => format!(
                            "; the dump lists {shown} in @{set} (expires in {x}s), so a \
                             connection from it right now takes {target}"
                        ),
                        None => format!(
                            "; the dump lists {shown} in @{set}, so a connection from it right \
                             now takes {target}"
                        ),
                    })
            })
            .unwrap_or_default();
        self.core.note(format!(
            "session affinity ({}): traced as a first connection ({shown} is not in @{set}); a \
             returning client{within} takes {target}{listed}",
            cx.place()
        ));
    }

    // ----- statements -----

    /// The branches of one statement: (relative probability, what it does).
    fn eval_stmt(&mut self, cx: &Cx<'a>, stmt: &Stmt, st: &St) -> Vec<(f64, Act)> {
        let one = |a: Act| vec![(1.0, a)];
        match stmt {
            Stmt::Match { op, left, right } => {
                let dist = self.eval_expr(cx, left, st);
                let mut out = Vec::new();
                for (p, vals) in dist {
                    let act = self.match_act(cx, *op, left, &vals, right, st);
                    out.push((p, act));
                }
                group(out)
            }
            Stmt::Verdict(NftVerdict::Queue) => one(Act::Unknown(
                "verdict `queue` (userspace) not evaluated".into(),
            )),
            Stmt::Verdict(v) => one(self.verdict_act(cx, v.clone(), None)),
            Stmt::Vmap { key, data } => {
                let ks = kinds(key);
                let dist = self.eval_expr(cx, key, st);
                let mut out = Vec::new();
                for (p, vals) in dist {
                    let act = match self.lookup_in(cx, &ks, &vals, data) {
                        Ok((Lookup::Hit(i), elems)) => match elems.get(i) {
                            Some(SetElem {
                                data: Some(Lit::Verdict(v)),
                                ..
                            }) => {
                                let k = ks.first().copied().unwrap_or(Kind::Unknown);
                                let text = match data {
                                    Lit::SetRef(n) => {
                                        format!("@{n}: {}", elem_text(&elems[i], k))
                                    }
                                    _ => elem_text(&elems[i], k),
                                };
                                self.verdict_act(cx, v.clone(), Some(text))
                            }
                            _ => Act::Unknown("the map element has no verdict".into()),
                        },
                        Ok((Lookup::Miss | Lookup::Absent, _)) => Act::NoMatch,
                        Ok((Lookup::Unknown(w), _)) | Err(w) => Act::Unknown(w),
                    };
                    out.push((p, act));
                }
                group(out)
            }
            Stmt::Mangle { key, value } => {
                let target = match key {
                    Expr::Meta(k) if k == "mark" => 0,
                    Expr::Ct { key: k, dir: None } if k == "mark" => 1,
                    Expr::Meta(k) if k == "nftrace" => {
                        return one(Act::Next(Some("nftrace only".into())));
                    }
                    other => {
                        return one(Act::Unknown(format!(
                            "statement `{} set ...` not evaluated",
                            expr_text(other)
                        )));
                    }
                };
                let dist = self.eval_expr(cx, value, st);
                let out = dist
                    .into_iter()
                    .map(|(p, vals)| {
                        let act = match vals.as_slice() {
                            [V::Known(Val::Int(v))] => match u32::try_from(*v) {
                                Ok(m) if target == 0 => Act::SetMark(m),
                                Ok(m) => Act::SetCtMark(m),
                                Err(_) => Act::Unknown(format!("mark value {v} too large")),
                            },
                            [V::Absent] => Act::NoMatch,
                            [V::Unknown(w)] => Act::Unknown(w.clone()),
                            _ => Act::Unknown("the new mark is not an integer".into()),
                        };
                        (p, act)
                    })
                    .collect();
                group(out)
            }
            Stmt::Nat {
                kind,
                addr,
                port,
                flags,
                ..
            } => self.nat_branches(cx, *kind, addr.as_ref(), port.as_ref(), flags, st),
            Stmt::Reject { kind, code } => {
                let w = match (kind.as_deref(), code.as_deref()) {
                    (Some(k), Some(c)) => format!("{k} {c}"),
                    (Some(k), None) => k.to_string(),
                    (None, _) => match self.core.version {
                        IpVersion::V4 => "icmp port-unreachable".into(),
                        IpVersion::V6 => "icmpv6 port-unreachable".into(),
                    },
                };
                one(Act::Reject(w))
            }
            Stmt::SetOp { op, elem, set, .. } => {
                let dist = self.eval_expr(cx, elem, st);
                let out = dist
                    .into_iter()
                    .map(|(p, vals)| {
                        let act = if vals.contains(&V::Absent) {
                            Act::NoMatch
                        } else if let Some(key) = known_all(&vals) {
                            match op.as_str() {
                                "delete" => Act::Unrecord(set.clone(), key),
                                _ => Act::Record(set.clone(), key),
                            }
                        } else {
                            Act::Next(Some(format!(
                                "{op} @{set}: the element's value is not known"
                            )))
                        };
                        (p, act)
                    })
                    .collect();
                group(out)
            }
            Stmt::Counter => one(Act::Next(None)),
            Stmt::Log { .. } => one(Act::Next(Some("log only".into()))),
            Stmt::Xt { kind, name } if kind == "match" && name == "comment" => one(Act::Next(None)),
            Stmt::Xt { kind, name } => one(Act::Unknown(format!(
                "iptables-nft compatibility expression `xt {kind} {name}`: its options are not in \
                 nft's JSON output (trace iptables-nft tables with --mode iptables)"
            ))),
            Stmt::Unknown { name, .. } => {
                one(Act::Unknown(format!("statement `{name}` not evaluated")))
            }
        }
    }

    /// A verdict, after checking that a jump/goto target exists.
    fn verdict_act(&self, cx: &Cx<'a>, v: NftVerdict, detail: Option<String>) -> Act {
        if let NftVerdict::Jump(c) | NftVerdict::Goto(c) = &v
            && !cx.table.chains.contains_key(c)
        {
            return Act::Unknown(format!("{v}: no chain {c} in the dump"));
        }
        if v == NftVerdict::Queue {
            return Act::Unknown("verdict `queue` (userspace) not evaluated".into());
        }
        Act::Verdict(v, detail)
    }

    /// The elements of `data` (`@name` or anonymous) and the lookup of `vals` in them.
    fn lookup_in(
        &self,
        cx: &Cx<'a>,
        ks: &[Kind],
        vals: &[V],
        data: &'a Lit,
    ) -> Result<(Lookup, &'a [SetElem]), String> {
        let elems: &'a [SetElem] = match data {
            Lit::SetRef(n) => {
                let table: &'a NftTable = cx.table;
                let set: &'a NftSet = table
                    .sets
                    .get(n)
                    .ok_or_else(|| format!("set @{n} is not in the dump"))?;
                &set.elements
            }
            Lit::Set(e) => e,
            other => return Err(format!("lookup in {other:?}, not a set")),
        };
        Ok((lookup(ks, vals, elems), elems))
    }

    /// What a match does for one evaluated left side.
    fn match_act(
        &mut self,
        cx: &Cx<'a>,
        op: MatchOp,
        left: &Expr,
        vals: &[V],
        right: &Expr,
        st: &St,
    ) -> Act {
        if vals.contains(&V::Absent) {
            return Act::NoMatch;
        }
        let ks = kinds(left);
        let truth = match right {
            Expr::Lit(Lit::SetRef(name)) if self.dynamic.contains(&(cx.ti, name.clone())) => {
                // A set the rules fill from packets (session affinity).
                let Some(key) = known_all(vals) else {
                    return Act::Unknown(unknown_reason(vals));
                };
                let member = st
                    .ext
                    .recorded
                    .iter()
                    .any(|(t, s, k)| *t == cx.ti && s == name && *k == key);
                if member {
                    Truth::from_bool(op != MatchOp::Ne)
                } else if op == MatchOp::Ne {
                    Truth::Yes
                } else {
                    return Act::Affinity {
                        set: name.clone(),
                        key,
                    };
                }
            }
            Expr::Lit(data @ (Lit::SetRef(_) | Lit::Set(_))) => {
                let member = match self.lookup_in(cx, &ks, vals, data) {
                    Ok((Lookup::Hit(_), _)) => Truth::Yes,
                    Ok((Lookup::Miss, _)) => Truth::No,
                    Ok((Lookup::Absent, _)) => return Act::NoMatch,
                    Ok((Lookup::Unknown(w), _)) | Err(w) => Truth::Unknown(w),
                };
                match op {
                    MatchOp::Ne => member.not(),
                    MatchOp::Eq | MatchOp::In => member,
                    _ => Truth::Unknown("ordering against a set".into()),
                }
            }
            Expr::Lit(Lit::Concat(parts)) => {
                if parts.len() != vals.len() {
                    return Act::Unknown("concatenations of different lengths".into());
                }
                let mut t = Truth::Yes;
                for ((v, lit), k) in vals.iter().zip(parts).zip(&ks) {
                    let c = match v {
                        V::Known(val) => compare(*k, val, CmpOp::Eq, lit),
                        V::Unknown(w) => Truth::Unknown(w.clone()),
                        V::Absent => Truth::No,
                    };
                    match c {
                        Truth::No => {
                            t = Truth::No;
                            break;
                        }
                        Truth::Unknown(w) => t = Truth::Unknown(w),
                        Truth::Yes => {}
                    }
                }
                if op == MatchOp::Ne { t.not() } else { t }
            }
            Expr::Lit(lit) => {
                let kind = ks.first().copied().unwrap_or(Kind::Unknown);
                if let Some(why) = self.fib_route_dependent(left, lit, st) {
                    return Act::Unknown(why);
                }
                match vals {
                    [V::Known(v)] => {
                        let bit = kind.is_bitmask();
                        match op {
                            MatchOp::Eq => compare(kind, v, CmpOp::Eq, lit),
                            MatchOp::In if bit => compare(kind, v, CmpOp::Flags, lit),
                            MatchOp::In => compare(kind, v, CmpOp::Eq, lit),
                            MatchOp::Ne if bit => compare(kind, v, CmpOp::NoFlags, lit),
                            MatchOp::Ne => compare(kind, v, CmpOp::Eq, lit).not(),
                            MatchOp::Lt => compare(kind, v, CmpOp::Lt, lit),
                            MatchOp::Gt => compare(kind, v, CmpOp::Gt, lit),
                            MatchOp::Le => compare(kind, v, CmpOp::Le, lit),
                            MatchOp::Ge => compare(kind, v, CmpOp::Ge, lit),
                        }
                    }
                    [V::Unknown(w)] => Truth::Unknown(w.clone()),
                    _ => Truth::Unknown("a concatenation compared with a single value".into()),
                }
            }
            _ => Truth::Unknown(format!(
                "comparison with `{}` not evaluated",
                expr_text(right)
            )),
        };
        match truth {
            Truth::Yes => Act::Next(None),
            Truth::No => Act::NoMatch,
            Truth::Unknown(w) => Act::Unknown(w),
        }
    }

    /// For `fib ... type` on an address whose type depends on routes (not local, not
    /// multicast/broadcast): unknown if the constant names a route-dependent type, else a
    /// note that the address is assumed unicast.
    fn fib_route_dependent(&mut self, left: &Expr, lit: &Lit, st: &St) -> Option<String> {
        let Expr::Fib { result, flags } = left else {
            return None;
        };
        if result != "type" {
            return None;
        }
        let addr = if flags.iter().any(|f| f == "saddr") {
            st.src
        } else {
            st.dst
        };
        if self.addr_class(addr).is_some() {
            return None;
        }
        let mut names: Vec<String> = Vec::new();
        collect_strs(lit, &mut names);
        if !flags.iter().any(|f| f == "saddr")
            && names.iter().any(|n| n == "local")
            && self.unknown_if_local(addr)
        {
            return Some(self.core.unknown_local(addr));
        }
        let routed = [
            "anycast",
            "blackhole",
            "unreachable",
            "prohibit",
            "throw",
            "nat",
            "xresolve",
        ];
        if names.iter().any(|n| routed.contains(&n.as_str())) {
            return Some(format!(
                "the route type of {addr} depends on the routing table (not modelled)"
            ));
        }
        if names.iter().any(|n| n == "unicast") {
            self.core.note(format!(
                "fib: {addr} is assumed unicast (routes are not modelled)"
            ));
        }
        None
    }

    /// Whether `ip` may be a node address nobody told the tracer about: the node's
    /// addresses are not known ([`crate::Host::local_addrs_incomplete`]) and `ip` is not
    /// in a kube-proxy table's `cluster-ips` set (a ClusterIP is never a node address).
    fn unknown_if_local(&self, ip: IpAddr) -> bool {
        if !self.core.host.local_addrs_incomplete {
            return false;
        }
        let cluster_ip = self
            .rules
            .tables
            .iter()
            .filter(|t| t.name == "kube-proxy")
            .filter_map(|t| t.sets.get("cluster-ips"))
            .flat_map(|s| &s.elements)
            .any(|e| matches!(&e.key, Lit::Str(a) if a.parse::<IpAddr>().ok() == Some(ip)));
        !cluster_ip
    }

    /// The route type of `ip` when it does not depend on routes.
    fn addr_class(&self, ip: IpAddr) -> Option<u128> {
        if self.core.host.is_local(ip) {
            return Some(2);
        }
        if ip.is_multicast() {
            return Some(5);
        }
        match ip {
            IpAddr::V4(a) if a.is_broadcast() || a.is_unspecified() => Some(3),
            IpAddr::V6(a) if a.is_unspecified() => Some(0),
            _ => None,
        }
    }

    /// The branches of a NAT statement.
    fn nat_branches(
        &mut self,
        cx: &Cx<'a>,
        kind: NatKind,
        addr: Option<&Expr>,
        port: Option<&Expr>,
        flags: &[String],
        st: &St,
    ) -> Vec<(f64, Act)> {
        let random = flags.iter().any(|f| f == "random" || f == "fully-random");
        if kind == NatKind::Redirect {
            return vec![(
                1.0,
                Act::Unknown("`redirect` (to a local address of the node) not evaluated".into()),
            )];
        }
        let addr_dist: Vec<(f64, Vec<V>)> = match addr {
            None => vec![(1.0, Vec::new())],
            Some(Expr::Lit(l @ (Lit::Range(..) | Lit::Prefix(..)))) => {
                return vec![(1.0, self.nat_range(kind, l, port, random))];
            }
            Some(e) => self.eval_expr(cx, e, st),
        };
        let mut out = Vec::new();
        for (p, vals) in addr_dist {
            let act = match vals.as_slice() {
                [] => self.nat_act(kind, None, None, port, random),
                [V::Known(Val::Addr(a))] => self.nat_act(kind, Some(*a), None, port, random),
                [V::Known(Val::Addr(a)), V::Known(Val::Int(pt))] => {
                    let pt = u16::try_from(*pt).ok();
                    self.nat_act(kind, Some(*a), pt, port, random)
                }
                v if v.contains(&V::Absent) => Act::NoMatch,
                v if v.iter().any(|x| matches!(x, V::Unknown(_))) => {
                    Act::Unknown(unknown_reason(v))
                }
                _ => Act::Unknown("the NAT address is not an address".into()),
            };
            out.push((p, act));
        }
        group(out)
    }

    fn nat_range(&self, kind: NatKind, l: &Lit, port: Option<&Expr>, random: bool) -> Act {
        let first = match l {
            Lit::Range(a, _) | Lit::Prefix(a, _) => const_val(Kind::Addr, a),
            other => Err(format!("{other:?}")),
        };
        match first {
            Ok(Val::Addr(a)) => match self.nat_act(kind, Some(a), None, port, random) {
                Act::Nat {
                    kind,
                    addr,
                    port,
                    random,
                    ..
                } => Act::Nat {
                    kind,
                    addr,
                    port,
                    ranged: Some(lit_text(l, Kind::Addr)),
                    random,
                },
                other => other,
            },
            _ => Act::Unknown("NAT range not understood".into()),
        }
    }

    fn nat_act(
        &self,
        kind: NatKind,
        addr: Option<IpAddr>,
        port_from_addr: Option<u16>,
        port: Option<&Expr>,
        random: bool,
    ) -> Act {
        if let Some(a) = addr
            && IpVersion::of(a) != self.core.version
        {
            return Act::Unknown(format!("NAT to {a}, an address of the other family"));
        }
        let (port, ranged) = match port {
            None => (port_from_addr, None),
            Some(Expr::Lit(Lit::Num(n))) => (u16::try_from(*n).ok(), None),
            Some(Expr::Lit(l @ Lit::Range(a, _))) => match a.as_ref() {
                Lit::Num(n) => {
                    let ports = lit_text(l, Kind::Port);
                    let text = match addr {
                        Some(IpAddr::V6(a)) => format!("[{a}]:{ports}"),
                        Some(a) => format!("{a}:{ports}"),
                        None => format!(":{ports}"),
                    };
                    (u16::try_from(*n).ok(), Some(text))
                }
                _ => return Act::Unknown("NAT port range not understood".into()),
            },
            Some(other) => {
                return Act::Unknown(format!("NAT port `{}` not evaluated", expr_text(other)));
            }
        };
        Act::Nat {
            kind,
            addr,
            port,
            ranged,
            random,
        }
    }

    // ----- expressions -----

    /// The distribution of the values of `e`: (probability, one value per key part).
    fn eval_expr(&mut self, cx: &Cx<'a>, e: &Expr, st: &St) -> Vec<(f64, Vec<V>)> {
        match e {
            Expr::Numgen {
                mode,
                modulus,
                offset,
            } => {
                if mode != "random" && mode != "inc" {
                    return vec![(1.0, vec![V::Unknown(format!("numgen {mode}"))])];
                }
                if mode == "inc" {
                    self.core.note(format!(
                        "{}: numgen inc mod {modulus} traced as a 1/{modulus} chance for each \
                         value (which value the counter holds is unknown)",
                        cx.place()
                    ));
                }
                let n = *modulus;
                if n > MAX_NUMGEN {
                    return vec![(
                        1.0,
                        vec![V::Unknown(format!(
                            "numgen mod {n}: more than {MAX_NUMGEN} values are not branched"
                        ))],
                    )];
                }
                // n > 0 is guaranteed by the parser; u64 -> f64 loses nothing for real moduli.
                #[allow(clippy::cast_precision_loss)]
                let p = 1.0 / n as f64;
                (0..n)
                    .map(|k| {
                        let v = u128::from(k) + u128::from(*offset);
                        (p, vec![V::Known(Val::Int(v & 0xffff_ffff))])
                    })
                    .collect()
            }
            Expr::Concat(parts) => {
                let mut acc: Vec<(f64, Vec<V>)> = vec![(1.0, Vec::new())];
                for part in parts {
                    let d = self.eval_expr(cx, part, st);
                    let mut next = Vec::with_capacity(acc.len() * d.len());
                    for (pa, va) in &acc {
                        for (pb, vb) in &d {
                            let mut v = va.clone();
                            v.extend(vb.iter().cloned());
                            next.push((pa * pb, v));
                        }
                    }
                    acc = next;
                }
                acc
            }
            Expr::Binary { op, left, right } => {
                let lk = kinds(left).first().copied().unwrap_or(Kind::Unknown);
                let rv = match right.as_ref() {
                    Expr::Lit(l) => match const_val(lk, l) {
                        Ok(Val::Int(i)) => Ok(i),
                        Ok(_) | Err(_) => Err(format!("operand {l:?} not understood")),
                    },
                    other => match self.eval_expr(cx, other, st).as_slice() {
                        [(_, v)] => match v.as_slice() {
                            [V::Known(Val::Int(i))] => Ok(*i),
                            _ => Err("operand not an integer".into()),
                        },
                        _ => Err("random operand".into()),
                    },
                };
                self.eval_expr(cx, left, st)
                    .into_iter()
                    .map(|(p, vals)| {
                        let v = match (vals.as_slice(), &rv) {
                            ([V::Known(Val::Int(x))], Ok(y)) => {
                                let bits = 32u32;
                                let mask = (1u128 << bits) - 1;
                                let sh = u32::try_from(*y).unwrap_or(u32::MAX);
                                V::Known(Val::Int(
                                    match op {
                                        BinOp::And => x & y,
                                        BinOp::Or => x | y,
                                        BinOp::Xor => x ^ y,
                                        BinOp::Shl => x.checked_shl(sh).unwrap_or(0),
                                        BinOp::Shr => x.checked_shr(sh).unwrap_or(0),
                                    } & mask,
                                ))
                            }
                            ([V::Absent], _) => V::Absent,
                            ([V::Unknown(w)], _) => V::Unknown(w.clone()),
                            (_, Err(w)) => V::Unknown(w.clone()),
                            _ => V::Unknown("bitwise operation on a non-integer".into()),
                        };
                        (p, vec![v])
                    })
                    .collect()
            }
            Expr::Map { key, data } => {
                let ks = kinds(key);
                self.eval_expr(cx, key, st)
                    .into_iter()
                    .map(|(p, vals)| {
                        let v = match self.lookup_in(cx, &ks, &vals, data) {
                            Ok((Lookup::Hit(i), elems)) => {
                                match elems.get(i).and_then(|e| e.data.as_ref()) {
                                    Some(Lit::Concat(parts)) => parts.iter().map(guess).collect(),
                                    Some(d) => vec![guess(d)],
                                    None => vec![V::Unknown("map element without data".into())],
                                }
                            }
                            // No element: the kernel ends the rule (NFT_BREAK).
                            Ok((Lookup::Miss | Lookup::Absent, _)) => vec![V::Absent],
                            Ok((Lookup::Unknown(w), _)) | Err(w) => vec![V::Unknown(w)],
                        };
                        (p, v)
                    })
                    .collect()
            }
            Expr::Lit(l) => vec![(1.0, vec![guess(l)])],
            Expr::Unknown { name, .. } => vec![(
                1.0,
                vec![V::Unknown(format!("expression `{name}` not evaluated"))],
            )],
            Expr::Payload { .. } | Expr::Meta(_) | Expr::Ct { .. } | Expr::Fib { .. } => {
                vec![(1.0, vec![self.field(e, st)])]
            }
        }
    }

    /// A packet field's value.
    fn field(&self, e: &Expr, st: &St) -> V {
        let v4 = self.core.version == IpVersion::V4;
        let pkt = self.core.packet;
        let port = |v: Option<u16>, what: &str| match v {
            Some(p) => V::Known(Val::Int(u128::from(p))),
            None => V::Unknown(format!("the packet's {what} is not known")),
        };
        let src = |st: &St| {
            if st.src_known {
                V::Known(Val::Addr(st.src))
            } else {
                V::Unknown("source address after masquerade is not known".into())
            }
        };
        let iface = |i: &Iface, what: &str| match i {
            Iface::Absent => V::Known(Val::Name(String::new())),
            Iface::Name(n) => V::Known(Val::Name(n.clone())),
            Iface::Unknown => V::Unknown(Iface::unknown_reason(what)),
        };
        match e {
            Expr::Payload { protocol, field } => {
                let p = protocol.as_str();
                let f = field.as_str();
                match (p, f) {
                    ("ip", _) if !v4 => V::Absent,
                    ("ip6", _) if v4 => V::Absent,
                    ("ip" | "ip6", "saddr") => src(st),
                    ("ip" | "ip6", "daddr") => V::Known(Val::Addr(st.dst)),
                    ("ip", "protocol") | ("ip6", "nexthdr") => {
                        V::Known(Val::Int(u128::from(self.core.proto)))
                    }
                    ("tcp" | "udp" | "sctp" | "udplite" | "dccp", _) => {
                        let want = match p {
                            "tcp" => 6,
                            "udp" => 17,
                            "sctp" => 132,
                            "udplite" => 136,
                            _ => 33,
                        };
                        if self.core.proto != want {
                            return V::Absent;
                        }
                        match f {
                            "sport" => port(st.sport, "source port"),
                            "dport" => port(st.dport, "destination port"),
                            // The first packet of a TCP connection is a SYN.
                            "flags" if p == "tcp" => V::Known(Val::Int(0x02)),
                            _ => V::Unknown(format!("{p} {f} not modelled")),
                        }
                    }
                    ("th", "sport" | "dport") => {
                        if pkt.proto.has_ports() {
                            if f == "sport" {
                                port(st.sport, "source port")
                            } else {
                                port(st.dport, "destination port")
                            }
                        } else if pkt.proto == Proto::Icmp && f == "sport" {
                            // The first 16 bits of an ICMP header: type and code.
                            V::Known(Val::Int(if v4 { 8 << 8 } else { 128 << 8 }))
                        } else if pkt.proto == Proto::Icmp {
                            V::Unknown(
                                "`th dport` of an ICMP packet is its checksum (not modelled)"
                                    .into(),
                            )
                        } else {
                            V::Unknown(format!(
                                "th {f} of protocol {} not modelled",
                                self.core.proto
                            ))
                        }
                    }
                    ("icmp", "type" | "code") => {
                        if v4 && pkt.proto == Proto::Icmp {
                            V::Known(Val::Int(if f == "type" { 8 } else { 0 }))
                        } else {
                            V::Absent
                        }
                    }
                    ("icmpv6", "type" | "code") => {
                        if !v4 && pkt.proto == Proto::Icmp {
                            V::Known(Val::Int(if f == "type" { 128 } else { 0 }))
                        } else {
                            V::Absent
                        }
                    }
                    _ => V::Unknown(format!("header field `{p} {f}` not modelled")),
                }
            }
            Expr::Meta(k) => match k.as_str() {
                "l4proto" => V::Known(Val::Int(u128::from(self.core.proto))),
                "nfproto" => V::Known(Val::Int(if v4 { 2 } else { 10 })),
                "protocol" => V::Known(Val::Int(if v4 { 0x0800 } else { 0x86dd })),
                "iifname" | "iif" => iface(&st.in_iface, "input interface"),
                "oifname" | "oif" => iface(&st.out_iface, "output interface"),
                "mark" => V::Known(Val::Int(u128::from(st.mark))),
                "pkttype" => V::Known(Val::Int(match st.dst {
                    d if d.is_multicast() => 2,
                    IpAddr::V4(a) if a.is_broadcast() => 1,
                    _ => 0,
                })),
                other => V::Unknown(format!("meta {other} not modelled")),
            },
            Expr::Ct { key, dir } => {
                if !st.ext.tracked {
                    return if key == "state" {
                        V::Known(Val::Int(1))
                    } else {
                        V::Absent
                    };
                }
                let original = dir.as_deref().is_none_or(|d| d == "original");
                match (key.as_str(), original) {
                    ("state", _) => V::Known(Val::Int(8)),
                    ("status", _) => {
                        let mut s = 0u128;
                        if st.confirmed {
                            s |= 8;
                        }
                        if st.ct_snat {
                            s |= 16;
                        }
                        if st.ct_dnat {
                            s |= 32;
                        }
                        V::Known(Val::Int(s))
                    }
                    ("direction", _) => V::Known(Val::Int(0)),
                    ("mark", _) => V::Known(Val::Int(u128::from(st.ext.ct_mark))),
                    ("l3proto", true) => V::Known(Val::Int(if v4 { 2 } else { 10 })),
                    ("protocol", true) => V::Known(Val::Int(u128::from(self.core.proto))),
                    ("ip saddr" | "saddr", true) if v4 => V::Known(Val::Addr(pkt.src)),
                    ("ip daddr" | "daddr", true) if v4 => V::Known(Val::Addr(pkt.dst)),
                    ("ip6 saddr" | "saddr", true) if !v4 => V::Known(Val::Addr(pkt.src)),
                    ("ip6 daddr" | "daddr", true) if !v4 => V::Known(Val::Addr(pkt.dst)),
                    ("ip saddr" | "ip daddr", true) | ("ip6 saddr" | "ip6 daddr", true) => {
                        V::Absent
                    }
                    ("proto-src", true) => port(pkt.sport, "source port"),
                    ("proto-dst", true) => port(pkt.dport, "destination port"),
                    (k, _) => V::Unknown(format!("ct {k} not modelled")),
                }
            }
            Expr::Fib { result, flags } => {
                let on_src = flags.iter().any(|f| f == "saddr");
                let on_dst = flags.iter().any(|f| f == "daddr");
                let extra = flags
                    .iter()
                    .any(|f| !matches!(f.as_str(), "saddr" | "daddr"));
                if on_src == on_dst || extra {
                    return V::Unknown(format!(
                        "fib {} {result}: routes are not modelled",
                        flags.join(" . ")
                    ));
                }
                if result != "type" {
                    return V::Unknown(format!("fib {result}: routes are not modelled"));
                }
                if on_src && !st.src_known {
                    return V::Unknown("source address after masquerade is not known".into());
                }
                let addr = if on_src { st.src } else { st.dst };
                // Not local/multicast/broadcast: unicast (see fib_route_dependent).
                V::Known(Val::Int(self.addr_class(addr).unwrap_or(1)))
            }
            _ => V::Unknown("not a packet field".into()),
        }
    }

    // ----- the result -----

    fn finish(mut self, states: Vec<St>) -> Trace {
        let outcomes: Vec<_> = states.into_iter().map(St::into_outcome).collect();
        for n in self.cluster_ips_notes(&outcomes) {
            self.core.note(n);
        }
        if self.core.forwards_unchanged(&outcomes) {
            let n = self.no_dnat_note();
            self.core.note(n);
        }
        if self.rules.tables.is_empty() {
            self.core
                .note("the ruleset has no tables: nothing was evaluated".into());
        }
        self.core.into_trace(outcomes)
    }

    /// Explains kube-proxy's `cluster-ips-check` chain when it ended a branch.
    fn cluster_ips_notes(&self, outcomes: &[Outcome]) -> Vec<String> {
        let p = self.core.packet;
        let mut out = Vec::new();
        for o in outcomes {
            let Some(last) = o.steps.last() else { continue };
            if last.chain != "cluster-ips-check" {
                continue;
            }
            let what = match p.proto {
                Proto::Icmp => "a ping".to_string(),
                pr => format!(
                    "{pr} to port {}",
                    p.dport.map_or("?".into(), |d| d.to_string())
                ),
            };
            match (&o.verdict, last.effect) {
                (Verdict::Reject(w), Effect::Reject) => out.push(format!(
                    "{} is an active ClusterIP (in kube-proxy's @cluster-ips set) but no Service \
                     port of it matches {what}: in nftables mode kube-proxy's cluster-ips-check \
                     chain rejects such traffic ({w}), so the sender is told at once{}",
                    p.dst,
                    if p.proto == Proto::Icmp {
                        " — ping reports \"Destination Port Unreachable\" instead of timing out \
                         (iptables mode lets it go unanswered); a ClusterIP answers no ping in \
                         either mode"
                    } else {
                        " (connection refused) instead of timing out"
                    }
                )),
                (Verdict::Drop, Effect::Drop) => out.push(format!(
                    "{} is in the service CIDR but is no active ClusterIP: kube-proxy's \
                     cluster-ips-check chain drops traffic to unallocated ClusterIPs, so {what} \
                     gets no answer",
                    p.dst
                )),
                _ => {}
            }
        }
        out
    }

    /// Explains a packet that leaves the node with its original destination.
    fn no_dnat_note(&self) -> String {
        let p = self.core.packet;
        let mut listed: Vec<String> = Vec::new();
        // Elements the packet would match: their map was never looked up.
        let mut not_looked_up: Vec<String> = Vec::new();
        let proto = p.proto.to_string();
        let dport = p.dport.map(|d| d.to_string());
        for t in self.rules.tables.iter().filter(|t| self.applies(t.family)) {
            for s in t.sets.values() {
                if !s.is_map || s.data_type.as_deref() != Some("verdict") {
                    continue;
                }
                for e in &s.elements {
                    let Lit::Concat(parts) = &e.key else { continue };
                    let Some(Lit::Str(first)) = parts.first() else {
                        continue;
                    };
                    if first.parse::<IpAddr>().ok() != Some(p.dst) {
                        continue;
                    }
                    let rest: Vec<String> = parts[1..]
                        .iter()
                        .map(|l| lit_text(l, Kind::Unknown))
                        .collect();
                    let item = format!("{} in @{}", rest.join(" . "), s.name);
                    let matches_packet = rest.first() == Some(&proto)
                        && rest.get(1).map(String::as_str) == dport.as_deref()
                        && rest.len() == 2;
                    let list = if matches_packet {
                        &mut not_looked_up
                    } else {
                        &mut listed
                    };
                    if !list.contains(&item) {
                        list.push(item);
                    }
                }
            }
        }
        let why = if p.proto == Proto::Icmp {
            "so a ping to it goes unanswered"
        } else {
            "so the connection attempt gets no answer"
        };
        if !not_looked_up.is_empty() {
            return format!(
                "no DNAT: kube-proxy's maps list {} as {}, which matches this packet, but no \
                 rule looked them up for it (the rules that use them were not reached from \
                 any base chain); it is routed unchanged towards {}",
                p.dst,
                not_looked_up.join("; "),
                endpoint(p.dst, p.dport)
            );
        }
        self.core.no_dnat_note(&listed, |shown, more| format!(
            "no DNAT: kube-proxy's maps list {} only as {}{more}, which this {} packet is not; it \
             is routed unchanged towards {}, an address no interface owns (a Service IP exists \
             only as map elements for its ports), {why}",
            p.dst,
            shown,
            p.proto,
            p.dst
        ))
    }
}

/// Merges branches that do the same thing (e.g. numgen values mapped to one verdict).
fn group(items: Vec<(f64, Act)>) -> Vec<(f64, Act)> {
    let mut out: Vec<(f64, Act)> = Vec::new();
    for (p, a) in items {
        match out.iter_mut().find(|(_, b)| *b == a) {
            Some(e) => e.0 += p,
            None => out.push((p, a)),
        }
    }
    out
}

/// All parts known: their values.
fn known_all(vals: &[V]) -> Option<Vec<Val>> {
    vals.iter()
        .map(|v| match v {
            V::Known(x) => Some(x.clone()),
            _ => None,
        })
        .collect()
}

fn unknown_reason(vals: &[V]) -> String {
    vals.iter()
        .find_map(|v| match v {
            V::Unknown(w) => Some(w.clone()),
            _ => None,
        })
        .unwrap_or_else(|| "a value is not known".into())
}

/// A constant's value without a kind: numbers are integers, strings addresses or names.
fn guess(l: &Lit) -> V {
    match l {
        Lit::Num(n) => V::Known(Val::Int(u128::from(*n))),
        Lit::Str(s) => match s.parse::<IpAddr>() {
            Ok(a) => V::Known(Val::Addr(a)),
            Err(_) => V::Known(Val::Name(s.clone())),
        },
        other => V::Unknown(format!("value {other:?} not understood")),
    }
}

fn key_text(key: &[Val]) -> String {
    key.iter()
        .map(|v| val_text(Kind::Unknown, v))
        .collect::<Vec<_>>()
        .join(" . ")
}

/// Whether element `e` is exactly `key`.
fn elem_is(e: &SetElem, key: &[Val]) -> bool {
    let parts: Vec<&Lit> = match &e.key {
        Lit::Concat(p) => p.iter().collect(),
        k => vec![k],
    };
    parts.len() == key.len()
        && parts
            .iter()
            .zip(key)
            .all(|(l, v)| guess(l) == V::Known(v.clone()))
}

/// The strings in a constant (for fib type names).
fn collect_strs(l: &Lit, out: &mut Vec<String>) {
    match l {
        Lit::Str(s) => out.push(s.clone()),
        Lit::List(items) | Lit::Concat(items) => {
            for i in items {
                collect_strs(i, out);
            }
        }
        Lit::Set(elems) => {
            for e in elems {
                collect_strs(&e.key, out);
            }
        }
        _ => {}
    }
}
