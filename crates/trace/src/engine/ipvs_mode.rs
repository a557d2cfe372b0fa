//! The IPVS-mode traversal: the iptables hooks in the order IPVS mode's packets see
//! them, with the IPVS scheduling step at LOCAL_IN (incoming packets) or LOCAL_OUT (the
//! node's own packets), the `-m ipvs` and `-m physdev` matches, and the closing notes
//! (see [`crate::ipvs`] for the model).

use std::net::IpAddr;

use kp_netfilter::{IpVersion, Physdev, Table};
use kp_netlink::ipvs::{Forward, SVC_F_PERSISTENT};

use super::{Engine, Pure, State, pure};
use crate::common::{self, Iface, Path, loop_back_local};
use crate::ipvs::service_rule;
use crate::packet::endpoint;
use crate::result::{Delivery, Effect, Step, Trace, Verdict};
use crate::{Entry, Proto, TraceError};

/// Where IPVS looks the packet up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IpvsHook {
    /// `ip_vs_remote_request`: NF_INET_LOCAL_IN, after the filter table.
    LocalIn,
    /// `ip_vs_local_request`: NF_INET_LOCAL_OUT, after nat OUTPUT.
    LocalOut,
}

impl IpvsHook {
    fn name(self) -> &'static str {
        match self {
            IpvsHook::LocalIn => "LOCAL_IN",
            IpvsHook::LocalOut => "LOCAL_OUT",
        }
    }
}

impl Engine<'_> {
    /// Runs an IPVS-mode trace.
    pub(super) fn run_ipvs(mut self) -> Result<Trace, TraceError> {
        use Table::{Filter, Mangle, Nat, Raw, Security};
        let p = self.core.packet;
        for t in [Filter, Nat] {
            if !self.rules.tables.contains_key(&t) {
                self.core.note(format!(
                    "the ruleset has no {t} table: its hooks were not evaluated (as if empty, \
                     policy ACCEPT)"
                ));
            }
        }
        let mut states = vec![self.core.entry_state(super::Ext::default())];
        match &p.entry {
            Entry::Pod { .. } | Entry::External { .. } => {
                self.hook(&mut states, "PREROUTING", &[Raw, Mangle, Nat], None)?;
                self.core.route_incoming_live(&mut states);
                let local = Some(Path::Local);
                self.hook(&mut states, "INPUT", &[Mangle, Filter, Security], local)?;
                self.schedule(&mut states, IpvsHook::LocalIn);
                self.hook(&mut states, "INPUT", &[Nat], local)?;
                // Scheduled to a real server elsewhere: sent out through LOCAL_OUT (nat
                // OUTPUT is not consulted again: the connection's NAT is set up).
                self.hook_where(
                    &mut states,
                    "OUTPUT",
                    &[Raw, Mangle, Filter, Security],
                    |s| s.ext.ipvs_out,
                )?;
                self.hook_where(&mut states, "FORWARD", &[Mangle, Filter, Security], |s| {
                    s.path == Some(Path::Forward) && !s.ext.ipvs_out
                })?;
                self.hook(
                    &mut states,
                    "POSTROUTING",
                    &[Mangle, Nat],
                    Some(Path::Forward),
                )?;
            }
            Entry::Node => {
                self.hook(&mut states, "OUTPUT", &[Raw, Mangle, Nat], None)?;
                self.core.reroute_local_live(&mut states);
                self.schedule(&mut states, IpvsHook::LocalOut);
                // A scheduled packet re-enters LOCAL_OUT from its start.
                self.hook_where(&mut states, "OUTPUT", &[Raw, Mangle], |s| s.ext.ipvs_out)?;
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
        let outcomes: Vec<_> = states
            .into_iter()
            .map(common::State::into_outcome)
            .collect();
        self.ipvs_notes(&outcomes);
        Ok(self.core.into_trace(outcomes))
    }

    /// The IPVS lookup at `hook` for every live packet that reaches it: at LOCAL_IN the
    /// packets delivered locally, at LOCAL_OUT every packet of the node. A virtual server
    /// forks the packet over its real servers of weight > 0, or rejects it without any.
    fn schedule(&mut self, states: &mut Vec<State>, hook: IpvsHook) {
        let Some(table) = self.ipvs else { return };
        let version = self.core.version;
        let proto = self.core.proto;
        let mut next = Vec::with_capacity(states.len());
        for st in states.drain(..) {
            let reaches = st.live()
                && st.ext.ipvs.is_none()
                && (hook == IpvsHook::LocalOut || st.path == Some(Path::Local));
            if !reaches {
                next.push(st);
                continue;
            }
            let found = match (self.core.packet.proto.has_ports(), st.dport) {
                (true, Some(port)) => table.lookup(st.dst, proto, port),
                _ => None,
            };
            let Some((vs, reals, line)) = found else {
                next.push(st);
                continue;
            };
            let key = vs.key.to_string();
            let step = |effect: Effect, detail: String| Step {
                table: "ipvs".into(),
                chain: key.clone(),
                rule_index: None,
                line: (*line > 0).then_some(*line),
                handle: None,
                rule_text: service_rule(vs),
                effect,
                detail,
            };
            let usable: Vec<_> = reals.iter().filter(|r| r.weight > 0).collect();
            let quiesced: Vec<String> = reals
                .iter()
                .filter(|r| r.weight == 0)
                .map(|r| r.socket_addr().to_string())
                .collect();
            if !quiesced.is_empty() {
                self.core.note(format!(
                    "IPVS virtual server {key}: real server(s) {} have weight 0 (quiesced, \
                     e.g. a terminating endpoint kept for its open connections): no new \
                     connection goes there",
                    quiesced.join(", ")
                ));
            }
            if usable.is_empty() {
                let with = match version {
                    IpVersion::V4 => "icmp-port-unreachable",
                    IpVersion::V6 => "icmp6-port-unreachable",
                };
                let mut s = st;
                s.steps.push(step(
                    Effect::Reject,
                    format!(
                        "IPVS virtual server {key} ({}) has no real server with weight > 0",
                        vs.scheduler
                    ),
                ));
                s.verdict = Some(Verdict::Reject(with.into()));
                self.core.note(format!(
                    "IPVS virtual server {key} has no real server with weight > 0: IPVS \
                     answers ICMP port unreachable and drops the packet (the kernel's \
                     ip_vs_leave), so the client sees the connection refused at once"
                ));
                next.push(s);
                continue;
            }
            let n = usable.len();
            let list: Vec<String> = usable
                .iter()
                .map(|r| format!("{} (1/{n})", endpoint(r.addr, Some(r.port))))
                .collect();
            self.core.note(format!(
                "IPVS virtual server {key} ({}) at {} → {}",
                vs.scheduler,
                hook.name(),
                list.join(", ")
            ));
            if vs.scheduler != "rr" {
                self.core.note(format!(
                    "IPVS virtual server {key}: scheduler {} picks a real server from its \
                     own state (connection counts, weights, a hash of the source); every \
                     real server with weight > 0 is traced as equally likely",
                    vs.scheduler
                ));
            }
            if usable.iter().any(|r| r.weight != usable[0].weight) {
                self.core.note(format!(
                    "IPVS virtual server {key}: its real servers have different weights; \
                     the tracer shows them as equally likely"
                ));
            }
            if vs.flags & SVC_F_PERSISTENT != 0 {
                self.core.note(format!(
                    "IPVS virtual server {key} is persistent (timeout {} s; kube-proxy's \
                     sessionAffinity: ClientIP): traced as a new client; a returning client \
                     within {} s of its last connection goes back to the same real server",
                    vs.timeout, vs.timeout
                ));
            }
            self.core.branches += n - 1;
            for (i, r) in usable.iter().enumerate() {
                let mut s = st.clone();
                s.prob *= 1.0 / n as f64;
                let to = endpoint(r.addr, Some(r.port));
                s.steps.push(step(
                    Effect::Dnat,
                    format!(
                        "IPVS virtual server {key} ({}) → {to} ({}/{n})",
                        vs.scheduler,
                        i + 1
                    ),
                ));
                if r.forward != Forward::Masq {
                    s.add_unknown(format!(
                        "IPVS virtual server {key}: real server {to} uses forwarding method {} \
                         (not modelled; traced as Masq, kube-proxy's method)",
                        r.forward.name()
                    ));
                }
                s.dst = r.addr;
                s.dport = Some(r.port);
                s.dnat = Some((r.addr, Some(r.port)));
                s.ext.ipvs = Some((vs.key.addr, vs.key.protocol, vs.key.port));
                let local = self.core.host.is_local(r.addr);
                match hook {
                    IpvsHook::LocalIn if local => {}
                    IpvsHook::LocalIn => {
                        s.path = Some(Path::Forward);
                        s.ext.ipvs_out = true;
                        s.in_iface = Iface::Absent;
                        s.out_iface = self.core.out_iface_for(r.addr);
                    }
                    IpvsHook::LocalOut => {
                        self.core.reroute_local(&mut s);
                        s.ext.ipvs_out = !local;
                    }
                }
                next.push(s);
            }
        }
        *states = next;
    }

    /// `-m physdev`: known when the packet's bridge information is (see
    /// [`crate::Packet::bridged`]); packets of the node never have any.
    pub(super) fn physdev(&self, pd: &Physdev) -> Pure {
        let p = self.core.packet;
        let bridged = match p.entry {
            Entry::Node => Some(false),
            _ => p.bridged,
        };
        match bridged {
            Some(false) => {
                // The kernel's xt_physdev without bridge information: an option matches
                // only when it is negated.
                let negs = [
                    pd.is_in,
                    pd.physdev_in.as_ref().map(|n| n.negated),
                    pd.is_out,
                    pd.physdev_out.as_ref().map(|n| n.negated),
                    pd.is_bridged,
                ];
                pure(negs.iter().flatten().all(|neg| *neg))
            }
            Some(true) if pd.physdev_in.is_none() && pd.physdev_out.is_none() => {
                if pd.is_out.is_some() || pd.is_bridged.is_some() {
                    return Pure::Unknown(
                        "whether a bridged packet leaves by a bridge port is not modelled".into(),
                    );
                }
                pure(pd.is_in.is_none_or(|neg| !neg))
            }
            _ => Pure::Unknown(
                "physdev (bridge port) information is not known (the packet's `bridged`)".into(),
            ),
        }
    }

    /// The notes that explain an IPVS-mode trace: a ping to a Service IP, a virtual
    /// server the packet never reached, a destination that is not a node address.
    fn ipvs_notes(&mut self, outcomes: &[crate::Outcome]) {
        let Some(table) = self.ipvs else { return };
        let p = self.core.packet;
        let dst_local = self.core.host.is_local(p.dst);
        let vips = table.addresses();
        let on_ipvs0 = self.on_kube_ipvs0(p.dst);
        let service_ip = vips.contains(&p.dst) || on_ipvs0;
        let scheduled = outcomes
            .iter()
            .flat_map(|o| &o.steps)
            .any(|s| s.table == "ipvs");
        if p.proto == Proto::Icmp && service_ip && dst_local {
            let all_local = outcomes.iter().all(|o| o.delivery == Delivery::Local);
            let rejected_by_filter = outcomes.iter().find_map(|o| match &o.verdict {
                Verdict::Reject(_) | Verdict::Drop => o
                    .steps
                    .iter()
                    .rev()
                    .find(|s| matches!(s.effect, Effect::Reject | Effect::Drop))
                    .map(|s| format!("{} {}", s.table, s.chain)),
                Verdict::Accept => None,
            });
            let where_ = if on_ipvs0 {
                "bound to kube-ipvs0"
            } else {
                "a virtual server's address"
            };
            if all_local {
                self.core.note(format!(
                    "in IPVS mode {} is a local address of the node ({where_}), and IPVS \
                     balances only TCP, UDP and SCTP: the ping is delivered to the node, which \
                     answers it (in iptables mode a ClusterIP does not answer ping)",
                    p.dst
                ));
            } else if let Some(by) = rejected_by_filter {
                self.core.note(format!(
                    "in IPVS mode {} is a local address of the node ({where_}), so the ping \
                     reaches the node, but {by} refuses it before IPVS (upstream's \
                     KUBE-IPVS-FILTER rejects new connections to a kube-ipvs0 address on a \
                     protocol and port no Service uses, and an echo request is one): the \
                     ping gets ICMP port unreachable instead of a reply",
                    p.dst
                ));
            }
        } else if p.proto.has_ports() && !scheduled {
            let any_vs = table.services.iter().any(|(vs, _, _)| vs.key.addr == p.dst);
            if vips.contains(&p.dst) && !dst_local && p.entry != Entry::Node {
                self.core.note(format!(
                    "the IPVS table has virtual servers on {} but it is not an address of this \
                     node (not bound to kube-ipvs0?), so the packet is routed away and never \
                     reaches IPVS; give the node's addresses, kube-ipvs0's included",
                    p.dst
                ));
            } else if any_vs && dst_local {
                let ports: Vec<String> = table
                    .services
                    .iter()
                    .filter(|(vs, _, _)| vs.key.addr == p.dst)
                    .map(|(vs, _, _)| vs.key.to_string())
                    .collect();
                let reached = outcomes.iter().any(|o| o.verdict == Verdict::Accept);
                if reached {
                    self.core.note(format!(
                        "no IPVS virtual server for {} {}: {} has only {}; the packet is \
                         delivered to the node itself",
                        p.proto,
                        endpoint(p.dst, p.dport),
                        p.dst,
                        ports.join(", ")
                    ));
                }
            }
        }
        if self.core.forwards_unchanged(outcomes) && !vips.contains(&p.dst) {
            self.core.note(format!(
                "no virtual server and not a node address: the packet is routed unchanged \
                 towards {}",
                endpoint(p.dst, p.dport)
            ));
        }
    }

    /// Whether `ip` is in the `KUBE-IPVS-IPS` (`KUBE-6-IPVS-IPS`) ipset: bound to
    /// kube-ipvs0 by kube-proxy.
    fn on_kube_ipvs0(&self, ip: IpAddr) -> bool {
        let name = match self.core.version {
            IpVersion::V4 => "KUBE-IPVS-IPS",
            IpVersion::V6 => "KUBE-6-IPVS-IPS",
        };
        self.core
            .host
            .ipsets
            .get(name)
            .is_some_and(|s| s.test(&[crate::host::SetValue::Ip(ip)]))
    }
}

/// `-m ipvs` (the kernel's xt_ipvs): `--ipvs` tests whether IPVS handled the packet;
/// every other option is false for a packet IPVS did not handle, and otherwise compares
/// the connection's virtual address (`--vaddr`, with a mask), port (`--vport`) and the
/// packet's protocol (`--vproto`).
pub(super) fn ipvs_match(args: &[String], st: &State) -> Pure {
    let mut i = 0;
    let mut negate = false;
    let mut property: Option<bool> = None;
    let mut tests: Vec<(bool, Test)> = Vec::new();
    while i < args.len() {
        let a = args[i].as_str();
        if a == "!" {
            negate = true;
            i += 1;
            continue;
        }
        let value = args.get(i + 1).map(String::as_str);
        let test = match (a, value) {
            ("--ipvs", _) => {
                property = Some(negate);
                negate = false;
                i += 1;
                continue;
            }
            ("--vproto", Some(v)) => match v.parse::<u8>().ok().or(match v {
                "tcp" => Some(6),
                "udp" => Some(17),
                "sctp" => Some(132),
                _ => None,
            }) {
                Some(n) => Test::Proto(n),
                None => return Pure::Unknown(format!("-m ipvs --vproto {v} not understood")),
            },
            ("--vaddr", Some(v)) => match parse_net(v) {
                Some(net) => Test::Addr(net),
                None => return Pure::Unknown(format!("-m ipvs --vaddr {v} not understood")),
            },
            ("--vport", Some(v)) => match v.parse::<u16>() {
                Ok(n) => Test::Port(n),
                Err(_) => return Pure::Unknown(format!("-m ipvs --vport {v} not understood")),
            },
            _ => {
                return Pure::Unknown(format!(
                    "-m ipvs option {a} not modelled (only --ipvs, --vproto, --vaddr, --vport)"
                ));
            }
        };
        tests.push((negate, test));
        negate = false;
        i += 2;
    }
    let has = st.ext.ipvs;
    if tests.is_empty() {
        return pure(has.is_some() ^ property.unwrap_or(false));
    }
    let Some((vaddr, vproto, vport)) = has else {
        return Pure::No;
    };
    if let Some(neg) = property
        && neg
    {
        return Pure::No;
    }
    let ok = tests.iter().all(|(neg, t)| {
        let hit = match t {
            Test::Proto(n) => *n == vproto,
            Test::Addr(net) => net.contains(vaddr),
            Test::Port(n) => *n == vport,
        };
        hit ^ neg
    });
    pure(ok)
}

/// One `-m ipvs` comparison.
enum Test {
    Proto(u8),
    Addr(kp_netfilter::Cidr),
    Port(u16),
}

fn parse_net(s: &str) -> Option<kp_netfilter::Cidr> {
    match s.split_once('/') {
        Some((a, p)) => kp_netfilter::Cidr::new(a.parse().ok()?, p.parse().ok()?),
        None => Some(kp_netfilter::Cidr::host(s.parse().ok()?)),
    }
}
