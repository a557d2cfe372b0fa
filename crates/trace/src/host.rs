//! The node a packet is traced on: its addresses, its ipsets and `route_localnet`.
//!
//! ipset contents are given as the strings `ipset save` prints (`add NAME 10.0.0.1,tcp:80`
//! → member `10.0.0.1,tcp:80`), either one set at a time ([`Host::add_ipset`]) or as a
//! whole `ipset save` document ([`Host::load_ipset_save`]). Supported types: `hash:ip`,
//! `hash:ip,port`, `hash:ip,port,ip`, `hash:ip,port,net`, `hash:net`, `bitmap:port` —
//! the ones kube-proxy's IPVS mode and common firewalls use.

use std::collections::BTreeMap;
use std::net::IpAddr;

use kp_netfilter::{Cidr, IpVersion, PortRange};

use crate::TraceError;

/// The node: which addresses are its own, the ipsets `-m set` looks up, and the
/// `net.ipv4.conf.all.route_localnet` sysctl.
#[derive(Debug, Clone, Default)]
pub struct Host {
    /// The node's own addresses (`addrtype LOCAL`, and the routing decision: a packet
    /// to one of them is delivered locally). `127.0.0.0/8` and `::1` are always local.
    pub local_addrs: Vec<IpAddr>,
    /// ipsets by name. A `-m set` match naming a set not in this map is unknown.
    pub ipsets: BTreeMap<String, IpSet>,
    /// `route_localnet`: whether the kernel routes packets to or from `127.0.0.0/8`
    /// that arrive on (or leave by) a non-loopback interface. kube-proxy sets it for
    /// localhost NodePorts. IPv6 has no such switch: `::1` never crosses an interface.
    pub route_localnet: bool,
    /// Whether [`Host::local_addrs`] may be incomplete: the node's addresses were not
    /// given (a dump from another node traced without them). Then whether a destination
    /// outside `local_addrs` is local is unknown: `addrtype --dst-type LOCAL` and
    /// nftables' `fib daddr type local` on it are reported unknown (the outcome is
    /// uncertain), except for loopback, multicast and broadcast addresses and a
    /// Service's ClusterIP, which are never node addresses. The routing decision still
    /// treats only `local_addrs` as local.
    pub local_addrs_incomplete: bool,
}

impl Host {
    /// A node owning `local_addrs`, with no ipsets and `route_localnet` off.
    pub fn new(local_addrs: impl IntoIterator<Item = IpAddr>) -> Host {
        Host {
            local_addrs: local_addrs.into_iter().collect(),
            ..Host::default()
        }
    }

    /// Whether `ip` is an address of this node (loopback addresses always are).
    pub fn is_local(&self, ip: IpAddr) -> bool {
        ip.is_loopback() || self.local_addrs.contains(&ip)
    }

    /// Adds (or replaces) set `name` of type `set_type` (`hash:ip`, ...) with `members`
    /// in `ipset save` form (element first, then options; only `nomatch` is honoured).
    ///
    /// # Errors
    ///
    /// [`TraceError::Ipset`] for an unsupported type or a member that does not parse.
    pub fn add_ipset<S: AsRef<str>>(
        &mut self,
        name: &str,
        set_type: &str,
        members: &[S],
    ) -> Result<(), TraceError> {
        let err = |message: String| TraceError::Ipset {
            set: name.to_string(),
            message,
        };
        let kind = SetType::from_name(set_type)
            .ok_or_else(|| err(format!("unsupported set type `{set_type}'")))?;
        let mut set = IpSet::new(kind, None);
        for m in members {
            set.add(m.as_ref()).map_err(err)?;
        }
        self.ipsets.insert(name.to_string(), set);
        Ok(())
    }

    /// Loads every set of an `ipset save` document (`create NAME TYPE [family inet|inet6]
    /// ...` and `add NAME MEMBER [options]` lines; blank and `#` lines are skipped).
    /// Sets of unsupported types are stored empty-and-unknown: matches on them are
    /// reported unknown, like sets that were not given.
    ///
    /// # Errors
    ///
    /// [`TraceError::IpsetSave`] for a malformed line or member, or an `add` to a set
    /// that was not created.
    pub fn load_ipset_save(&mut self, text: &str) -> Result<(), TraceError> {
        let mut unsupported: Vec<String> = Vec::new();
        for (idx, raw) in text.lines().enumerate() {
            let line = idx + 1;
            let err = |message: String| TraceError::IpsetSave { line, message };
            let l = raw.trim();
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            let mut parts = l.split_whitespace();
            let cmd = parts.next().unwrap_or_default();
            let name = parts
                .next()
                .ok_or_else(|| err(format!("`{cmd}' without a set name")))?;
            match cmd {
                "create" | "-N" => {
                    let ty = parts
                        .next()
                        .ok_or_else(|| err(format!("set {name}: missing type")))?;
                    let opts: Vec<&str> = parts.collect();
                    let family = opts
                        .windows(2)
                        .find(|w| w[0] == "family")
                        .map(|w| match w[1] {
                            "inet6" => Ok(IpVersion::V6),
                            "inet" => Ok(IpVersion::V4),
                            other => Err(err(format!("set {name}: bad family `{other}'"))),
                        })
                        .transpose()?;
                    match SetType::from_name(ty) {
                        Some(kind) => {
                            unsupported.retain(|n| n != name);
                            self.ipsets
                                .insert(name.to_string(), IpSet::new(kind, family));
                        }
                        None => {
                            self.ipsets.remove(name);
                            unsupported.push(name.to_string());
                        }
                    }
                }
                "add" | "-A" => {
                    if unsupported.iter().any(|n| n == name) {
                        continue;
                    }
                    let set = self
                        .ipsets
                        .get_mut(name)
                        .ok_or_else(|| err(format!("add to set {name}, which was not created")))?;
                    let member: Vec<&str> = parts.collect();
                    set.add(&member.join(" "))
                        .map_err(|m| err(format!("set {name}: {m}")))?;
                }
                other => return Err(err(format!("unknown ipset command `{other}'"))),
            }
        }
        Ok(())
    }
}

/// The ipset types the tracer can evaluate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetType {
    /// `hash:ip`: one address per member.
    HashIp,
    /// `hash:ip,port`: address, `proto:port`.
    HashIpPort,
    /// `hash:ip,port,ip`: address, `proto:port`, address.
    HashIpPortIp,
    /// `hash:ip,port,net`: address, `proto:port`, network.
    HashIpPortNet,
    /// `hash:net`: one network per member (`nomatch` members carve out exceptions).
    HashNet,
    /// `bitmap:port`: TCP/UDP/SCTP/UDPLite ports.
    BitmapPort,
}

impl SetType {
    /// Parses the type name as `ipset` prints it.
    pub fn from_name(name: &str) -> Option<SetType> {
        Some(match name {
            "hash:ip" => SetType::HashIp,
            "hash:ip,port" => SetType::HashIpPort,
            "hash:ip,port,ip" => SetType::HashIpPortIp,
            "hash:ip,port,net" => SetType::HashIpPortNet,
            "hash:net" => SetType::HashNet,
            "bitmap:port" => SetType::BitmapPort,
            _ => return None,
        })
    }

    /// The kinds of the set's dimensions, in order.
    pub(crate) fn dims(self) -> &'static [Dim] {
        match self {
            SetType::HashIp | SetType::HashNet => &[Dim::Ip],
            SetType::HashIpPort => &[Dim::Ip, Dim::Port],
            SetType::HashIpPortIp | SetType::HashIpPortNet => &[Dim::Ip, Dim::Port, Dim::Ip],
            SetType::BitmapPort => &[Dim::Port],
        }
    }

    /// The set's dimension: how many `src`/`dst` flags a `--match-set` needs.
    pub fn dimension(self) -> usize {
        self.dims().len()
    }
}

/// The kind of one set dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dim {
    /// An address or network.
    Ip,
    /// A `proto:port`.
    Port,
}

/// The port part of a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetPort {
    /// `proto:port[-port]` for a protocol with ports (`bitmap:port`: any of them).
    Ports {
        /// Protocol number; `None` for `bitmap:port` (any port protocol).
        proto: Option<u8>,
        /// The ports.
        range: PortRange,
    },
    /// `icmp:TYPE` / `icmpv6:TYPE`; only whether it is the echo request (ping) matters.
    Icmp {
        /// Protocol number (1 or 58).
        proto: u8,
        /// Whether the type is `echo-request` (`8/0`, or `128/0` for ICMPv6).
        echo_request: bool,
    },
}

/// One member of a set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetMember {
    /// Address parts (`hash:ip` members are host networks), in dimension order.
    pub nets: Vec<Cidr>,
    /// The port part, if the type has one.
    pub port: Option<SetPort>,
    /// `nomatch`: a `hash:net`-style exception.
    pub nomatch: bool,
}

/// The contents of one ipset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpSet {
    /// The type.
    pub set_type: SetType,
    /// The family (`family inet|inet6`, else that of the first address member).
    pub family: Option<IpVersion>,
    /// The members.
    pub members: Vec<SetMember>,
}

impl IpSet {
    /// An empty set.
    pub fn new(set_type: SetType, family: Option<IpVersion>) -> IpSet {
        IpSet {
            set_type,
            family,
            members: Vec::new(),
        }
    }

    /// Adds a member in `ipset save` form (`10.0.0.1,tcp:80`, `10.0.0.0/8 nomatch`,
    /// `30080`).
    ///
    /// # Errors
    ///
    /// A message naming the element that does not parse.
    pub fn add(&mut self, member: &str) -> Result<(), String> {
        let mut toks = member.split_whitespace();
        let elem = toks.next().ok_or("empty member")?;
        let nomatch = toks.any(|t| t == "nomatch");
        let parts: Vec<&str> = elem.split(',').collect();
        let dims = self.set_type.dims();
        if parts.len() != dims.len() {
            return Err(format!(
                "member `{elem}' has {} parts, type needs {}",
                parts.len(),
                dims.len()
            ));
        }
        let mut nets = Vec::new();
        let mut port = None;
        for (part, dim) in parts.iter().zip(dims) {
            match dim {
                Dim::Ip => {
                    let net = parse_net(part).ok_or_else(|| format!("bad address `{part}'"))?;
                    let v = IpVersion::of(net.addr());
                    match self.family {
                        None => self.family = Some(v),
                        Some(f) if f != v => {
                            return Err(format!("address `{part}' is not of the set's family"));
                        }
                        Some(_) => {}
                    }
                    nets.push(net);
                }
                Dim::Port => {
                    let bitmap = self.set_type == SetType::BitmapPort;
                    port = Some(parse_set_port(part, bitmap)?);
                }
            }
        }
        self.members.push(SetMember {
            nets,
            port,
            nomatch,
        });
        Ok(())
    }

    /// Whether the values `vals` (one per dimension, already picked by the
    /// `src`/`dst` flags) are in the set. Follows the kernel: the most specific matching
    /// member decides, and a `nomatch` member means "not in the set".
    pub(crate) fn test(&self, vals: &[SetValue]) -> bool {
        let mut best: Option<(u32, bool)> = None;
        for m in &self.members {
            let mut net_i = 0;
            let mut specificity = 0u32;
            let mut ok = true;
            for (dim, v) in self.set_type.dims().iter().zip(vals) {
                match (dim, v) {
                    (Dim::Ip, SetValue::Ip(ip)) => {
                        let Some(net) = m.nets.get(net_i) else {
                            ok = false;
                            break;
                        };
                        net_i += 1;
                        specificity += u32::from(net.prefix());
                        if !net.contains(*ip) {
                            ok = false;
                            break;
                        }
                    }
                    (Dim::Port, SetValue::Port { proto, port }) => {
                        let hit = match m.port {
                            Some(SetPort::Ports { proto: p, range }) => {
                                p.is_none_or(|p| p == *proto) && range.contains(*port)
                            }
                            _ => false,
                        };
                        if !hit {
                            ok = false;
                            break;
                        }
                    }
                    (Dim::Port, SetValue::Echo { proto }) => {
                        let hit = matches!(m.port, Some(SetPort::Icmp { proto: p, echo_request: true }) if p == *proto);
                        if !hit {
                            ok = false;
                            break;
                        }
                    }
                    _ => {
                        ok = false;
                        break;
                    }
                }
            }
            if ok && best.is_none_or(|(s, _)| specificity > s) {
                best = Some((specificity, m.nomatch));
            }
        }
        best.is_some_and(|(_, nomatch)| !nomatch)
    }
}

/// A packet value looked up in one set dimension.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SetValue {
    /// An address.
    Ip(IpAddr),
    /// A port of a port protocol.
    Port { proto: u8, port: u16 },
    /// An ICMP echo request of protocol `proto`.
    Echo { proto: u8 },
}

fn parse_net(s: &str) -> Option<Cidr> {
    match s.split_once('/') {
        Some((a, p)) => Cidr::new(a.parse().ok()?, p.parse().ok()?),
        None => Some(Cidr::host(s.parse().ok()?)),
    }
}

fn parse_port_range(s: &str) -> Option<PortRange> {
    let (a, b) = s.split_once('-').unwrap_or((s, s));
    let (first, last) = (a.parse().ok()?, b.parse().ok()?);
    (first <= last).then_some(PortRange { first, last })
}

fn parse_set_port(s: &str, bitmap: bool) -> Result<SetPort, String> {
    let bad = || format!("bad port `{s}'");
    let (proto, port) = match s.split_once(':') {
        Some((p, rest)) => (Some(p.to_ascii_lowercase()), rest),
        None => (None, s),
    };
    let proto_num = match proto.as_deref() {
        None => Some(6),
        Some("tcp") => Some(6),
        Some("udp") => Some(17),
        Some("sctp") => Some(132),
        Some("udplite") => Some(136),
        Some("icmp") => {
            let echo = matches!(port, "echo-request" | "ping" | "8/0");
            return Ok(SetPort::Icmp {
                proto: 1,
                echo_request: echo,
            });
        }
        Some("icmpv6") => {
            let echo = matches!(port, "echo-request" | "ping" | "128/0");
            return Ok(SetPort::Icmp {
                proto: 58,
                echo_request: echo,
            });
        }
        Some(_) => return Err(bad()),
    };
    let range = parse_port_range(port).ok_or_else(bad)?;
    Ok(SetPort::Ports {
        proto: if bitmap { None } else { proto_num },
        range,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn hash_net_nomatch_most_specific_wins() {
        let mut h = Host::default();
        h.add_ipset("n", "hash:net", &["10.0.0.0/8", "10.1.0.0/16 nomatch"])
            .unwrap();
        let s = &h.ipsets["n"];
        assert!(s.test(&[SetValue::Ip(ip("10.2.0.1"))]));
        assert!(!s.test(&[SetValue::Ip(ip("10.1.0.1"))]));
        assert!(!s.test(&[SetValue::Ip(ip("11.0.0.1"))]));
        assert!(!s.test(&[SetValue::Ip(ip("fd00::1"))]));
    }

    #[test]
    fn ip_port_and_bitmap() {
        let mut h = Host::default();
        h.load_ipset_save(
            "create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536\n\
             add KUBE-CLUSTER-IP 10.96.0.1,tcp:443\n\
             add KUBE-CLUSTER-IP 10.96.0.10,udp:53\n\
             create KUBE-NODE-PORT-TCP bitmap:port range 0-65535\n\
             add KUBE-NODE-PORT-TCP 30080\n\
             create X list:set\nadd X KUBE-CLUSTER-IP\n",
        )
        .unwrap();
        let c = &h.ipsets["KUBE-CLUSTER-IP"];
        let tcp = |port| SetValue::Port { proto: 6, port };
        assert!(c.test(&[SetValue::Ip(ip("10.96.0.1")), tcp(443)]));
        assert!(!c.test(&[SetValue::Ip(ip("10.96.0.1")), tcp(80)]));
        let udp = SetValue::Port {
            proto: 17,
            port: 53,
        };
        assert!(c.test(&[SetValue::Ip(ip("10.96.0.10")), udp]));
        let b = &h.ipsets["KUBE-NODE-PORT-TCP"];
        assert!(b.test(&[tcp(30080)]));
        assert!(!h.ipsets.contains_key("X"));
        assert!(h.load_ipset_save("add NOPE 1.2.3.4\n").is_err());
        assert!(h.add_ipset("bad", "hash:ip", &["1.2.3.4,tcp:80"]).is_err());
        assert!(
            h.add_ipset("bad", "hash:ip,port", &["1.2.3.4,bogus:80"])
                .is_err()
        );
    }
}
