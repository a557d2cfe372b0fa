//! The userspace-mode proxy step: after the iptables hooks, a packet delivered locally to a
//! port the proxy listens on becomes the proxy's own connection to one of the listener's
//! endpoints (see [`crate::userspace`] for the model).

use super::{Engine, State};
use crate::common::Path;
use crate::packet::endpoint;
use crate::result::{Effect, Step, Verdict};
use crate::userspace::{UserspaceListener, UserspaceTable, proto_name};
use crate::{Entry, Proto};

impl Engine<'_> {
    /// Hands every live packet delivered locally to a port with a listener of its
    /// protocol to the proxy: one branch per endpoint (round robin, so equally likely), a
    /// reset (TCP) or a drop (UDP) without endpoints. Other packets are kept as they are,
    /// with a note when the rules sent them to a local port nothing in the table listens
    /// on.
    pub(super) fn proxy(&mut self, table: &UserspaceTable, states: Vec<State>) -> Vec<State> {
        let proto = self.core.packet.proto;
        let mut out = Vec::with_capacity(states.len());
        for mut st in states {
            let port = match (proto, st.dport) {
                (Proto::Tcp | Proto::Udp, Some(p)) if st.live() => p,
                _ => {
                    out.push(st);
                    continue;
                }
            };
            if st.path != Some(Path::Local) {
                self.forwarded_to_a_listener_port(table, &st, port);
                out.push(st);
                continue;
            }
            let listener = if st.ext.dst_unknown {
                // Delivered to an address of the incoming interface the tracer cannot
                // name: a wildcard listener takes it whatever it is.
                let v4 = st.dst.is_ipv4();
                let mut on_port: Vec<&UserspaceListener> = table
                    .on_port(proto, port)
                    .filter(|l| l.listen.is_ipv4() == v4)
                    .collect();
                on_port.sort_by_key(|l| !l.listen.ip().is_unspecified());
                let first = on_port.first().copied();
                if let Some(l) = first
                    && !l.listen.ip().is_unspecified()
                {
                    st.add_unknown(format!(
                        "userspace proxy listener {} ({}) listens on {} only: whether the \
                         REDIRECT's address (an address of the incoming interface) is that one \
                         is not known; traced as reaching it (give the node's addresses)",
                        l.key(),
                        l.service,
                        l.listen.ip()
                    ));
                }
                first
            } else {
                table.lookup(proto, st.dst, port)
            };
            let Some(l) = listener else {
                if st.dnat.is_some() {
                    self.no_listener(table, &st, port);
                }
                out.push(st);
                continue;
            };
            self.relay(l, st, &mut out);
        }
        out
    }

    /// The proxy's handling of `st` by listener `l`: one branch per endpoint, or the
    /// packet refused without endpoints; the branches are appended to `out`.
    fn relay(&mut self, l: &UserspaceListener, st: State, out: &mut Vec<State>) {
        let key = l.key();
        let step = |effect: Effect, detail: String| Step {
            table: "userspace".into(),
            chain: key.clone(),
            rule_index: None,
            line: None,
            handle: None,
            rule_text: l.to_string(),
            effect,
            detail,
        };
        let scope = match l.scope {
            crate::ListenerScope::External => {
                "external traffic: NodePort, external IPs, load balancers"
            }
            crate::ListenerScope::Cluster => {
                "pod and node traffic to external destinations, short-circuited to every endpoint"
            }
            crate::ListenerScope::Internal => "ClusterIP traffic",
        };
        let who = format!(
            "userspace proxy listener {} ({}, {scope})",
            l.listen, l.service
        );
        if l.endpoints.is_empty() {
            let mut s = st;
            if l.protocol == Proto::Udp {
                s.steps.push(step(
                    Effect::Drop,
                    format!("{who} has no endpoints: the datagram is read and dropped"),
                ));
                s.verdict = Some(Verdict::Drop);
                self.core.note(format!(
                    "{who} has no endpoints: the proxy reads the datagram and drops it, so the \
                     client gets no reply"
                ));
            } else {
                s.steps.push(step(
                    Effect::Reject,
                    format!("{who} has no endpoints: the connection is accepted and reset"),
                ));
                s.verdict = Some(Verdict::Reject("tcp-reset".into()));
                self.core.note(format!(
                    "{who} has no endpoints: the proxy accepts the connection and closes it \
                     at once, so the client sees its connection reset"
                ));
            }
            out.push(s);
            return;
        }
        let n = l.endpoints.len();
        let rr = if n == 1 {
            format!("{who} connects to its one endpoint, retrying it if a connect fails")
        } else {
            format!(
                "{who} connects to one of {n} endpoints round robin, retrying the next one if \
                 a connect fails"
            )
        };
        let affinity = l.affinity.map_or_else(String::new, |secs| {
            format!(
                "; session affinity by client IP ({secs} s): traced as a new client, a \
                 returning client within {secs} s of its last connection goes to the same \
                 endpoint"
            )
        });
        let list: Vec<String> = l.endpoints.iter().map(|e| format!("{e} (1/{n})")).collect();
        self.core
            .note(format!("{rr}: {}{affinity}", list.join(", ")));
        let hidden = match self.core.packet.entry {
            Entry::Node => "",
            _ => ", never the client's",
        };
        self.core.note(format!(
            "userspace mode: the proxy relays the connection over a connection of its own, \
             from the node, so the endpoint sees a node address as the source{hidden}; that \
             connection leaves through nat and filter OUTPUT like any of the node's and is not \
             traced here (trace it from the node to the endpoint)"
        ));
        self.core.branches += n - 1;
        for (i, ep) in l.endpoints.iter().enumerate() {
            let mut s = st.clone();
            s.prob *= 1.0 / n as f64;
            s.steps.push(step(
                Effect::Proxy,
                format!(
                    "{rr}: {} ({}/{n}){affinity}",
                    endpoint(ep.ip(), Some(ep.port())),
                    i + 1
                ),
            ));
            s.dst = ep.ip();
            s.dport = Some(ep.port());
            s.dnat = Some((ep.ip(), Some(ep.port())));
            s.masquerade = true;
            s.ext.dst_unknown = false;
            s.redirected_local = false;
            s.path = Some(if self.core.host.is_local(ep.ip()) {
                Path::Local
            } else {
                Path::Forward
            });
            out.push(s);
        }
    }

    /// The note for a packet the rules sent to local port `port` (by REDIRECT or DNAT)
    /// where the table has no listener for it.
    fn no_listener(&mut self, table: &UserspaceTable, st: &State, port: u16) {
        let proto = proto_name(self.core.packet.proto);
        let to = if st.ext.dst_unknown {
            format!("local port {port}")
        } else {
            endpoint(st.dst, Some(port))
        };
        let elsewhere: Vec<String> = table
            .on_port(self.core.packet.proto, port)
            .map(UserspaceListener::key)
            .collect();
        let also = if elsewhere.is_empty() {
            String::new()
        } else {
            format!(" (it has {} on other addresses)", elsewhere.join(", "))
        };
        self.core.note(format!(
            "the rules send the packet to {to}, but the userspace proxy table has no {proto} \
             listener there{also}: the proxy does not relay it, and the node refuses the \
             connection unless another process listens on that port (are the rules and the \
             table from the same sync?)"
        ));
    }

    /// The note for a packet sent to `st.dst`:`port` off the node while the table listens
    /// on `port`: the destination is probably the node's address (userspace mode's
    /// `KUBE-PORTALS-HOST` DNATs to it), which the tracer was not told.
    fn forwarded_to_a_listener_port(&mut self, table: &UserspaceTable, st: &State, port: u16) {
        let Some((addr, _)) = st.dnat else { return };
        let v4 = addr.is_ipv4();
        let wild = table
            .on_port(self.core.packet.proto, port)
            .find(|l| l.listen.is_ipv4() == v4 && l.listen.ip().is_unspecified());
        let Some(l) = wild else { return };
        if self.core.host.is_local(addr) {
            return;
        }
        self.core.note(format!(
            "the packet is DNATed to {}, and userspace proxy listener {} ({}) listens on that \
             port, but {addr} is not one of the node's addresses given to the tracer, so the \
             packet leaves the node: if it is this node's address (userspace mode DNATs the \
             node's own packets to the node's primary address), give it (--node-ip)",
            endpoint(addr, Some(port)),
            l.key(),
            l.service
        ));
    }
}
