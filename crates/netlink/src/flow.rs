//! What a conntrack entry looks like: [`Flow`] (original and reply [`Tuple`], [`Status`],
//! zone, id), the address [`Family`] and the [`proto`] numbers.
//!
//! A flow prints like one line of `conntrack -L`:
//! `udp src=192.168.56.100 dst=10.96.0.53 sport=40000 dport=53 src=10.244.1.10
//! dst=192.168.56.100 sport=53 dport=40000 [DNAT]`.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

/// IP protocol numbers (`IPPROTO_*`) for [`Tuple::proto`] and the `proto` filter of
/// [`crate::ConntrackOps::dump`].
pub mod proto {
    /// ICMP (1).
    pub const ICMP: u8 = 1;
    /// TCP (6).
    pub const TCP: u8 = 6;
    /// UDP (17).
    pub const UDP: u8 = 17;
    /// DCCP (33).
    pub const DCCP: u8 = 33;
    /// ICMPv6 (58).
    pub const ICMPV6: u8 = 58;
    /// SCTP (132).
    pub const SCTP: u8 = 132;
    /// UDP-Lite (136).
    pub const UDPLITE: u8 = 136;

    /// Whether the protocol's conntrack tuple is made of source and destination ports
    /// (TCP, UDP, DCCP, SCTP, UDP-Lite): only such entries can be deleted by tuple here.
    pub fn has_ports(proto: u8) -> bool {
        matches!(proto, TCP | UDP | DCCP | SCTP | UDPLITE)
    }

    /// The name `conntrack -L` prints (`udp`), or the number for others.
    pub fn name(proto: u8) -> String {
        match proto {
            ICMP => "icmp".into(),
            TCP => "tcp".into(),
            UDP => "udp".into(),
            DCCP => "dccp".into(),
            ICMPV6 => "icmpv6".into(),
            SCTP => "sctp".into(),
            UDPLITE => "udplite".into(),
            n => n.to_string(),
        }
    }
}

/// An address family, as `conntrack -f ipv4|ipv6` selects it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// IPv4 (`NFPROTO_IPV4`, 2).
    V4,
    /// IPv6 (`NFPROTO_IPV6`, 10).
    V6,
}

impl Family {
    /// The family of an address.
    pub fn of(addr: &IpAddr) -> Family {
        match addr {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    /// Whether `addr` belongs to this family.
    pub fn contains(self, addr: &IpAddr) -> bool {
        Family::of(addr) == self
    }

    /// The `nfgenmsg.nfgen_family` value (`NFPROTO_IPV4` = 2, `NFPROTO_IPV6` = 10).
    pub fn nfproto(self) -> u8 {
        match self {
            Family::V4 => 2,
            Family::V6 => 10,
        }
    }

    /// `ipv4` or `ipv6`, as `conntrack -f` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Family::V4 => "ipv4",
            Family::V6 => "ipv6",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One direction of a conntrack entry (`CTA_TUPLE_ORIG` or `CTA_TUPLE_REPLY`).
///
/// `src_port`/`dst_port` are 0 for protocols without ports (ICMP: its id, type and code
/// are not kept here).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tuple {
    /// Source address (`CTA_IP_V4_SRC` / `CTA_IP_V6_SRC`).
    pub src: IpAddr,
    /// Destination address (`CTA_IP_V4_DST` / `CTA_IP_V6_DST`).
    pub dst: IpAddr,
    /// IP protocol number (`CTA_PROTO_NUM`), see [`proto`].
    pub proto: u8,
    /// Source port (`CTA_PROTO_SRC_PORT`), 0 if none.
    pub src_port: u16,
    /// Destination port (`CTA_PROTO_DST_PORT`), 0 if none.
    pub dst_port: u16,
}

impl Tuple {
    /// A tuple of protocol `proto` from `src` to `dst`.
    pub fn new(proto: u8, src: SocketAddr, dst: SocketAddr) -> Tuple {
        Tuple {
            src: src.ip(),
            dst: dst.ip(),
            proto,
            src_port: src.port(),
            dst_port: dst.port(),
        }
    }

    /// A UDP tuple from `src` to `dst`.
    pub fn udp(src: SocketAddr, dst: SocketAddr) -> Tuple {
        Tuple::new(proto::UDP, src, dst)
    }

    /// The same tuple seen from the other side (source and destination swapped).
    pub fn reversed(&self) -> Tuple {
        Tuple {
            src: self.dst,
            dst: self.src,
            proto: self.proto,
            src_port: self.dst_port,
            dst_port: self.src_port,
        }
    }

    /// Source address and port.
    pub fn src_addr(&self) -> SocketAddr {
        SocketAddr::new(self.src, self.src_port)
    }

    /// Destination address and port.
    pub fn dst_addr(&self) -> SocketAddr {
        SocketAddr::new(self.dst, self.dst_port)
    }
}

impl fmt::Display for Tuple {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "src={} dst={}", self.src, self.dst)?;
        if proto::has_ports(self.proto) {
            write!(f, " sport={} dport={}", self.src_port, self.dst_port)?;
        }
        Ok(())
    }
}

/// Conntrack status bits (`CTA_STATUS`, `enum ip_conntrack_status` in
/// `linux/netfilter/nf_conntrack_common.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Status(pub u32);

impl Status {
    /// `IPS_EXPECTED`: the entry is an expected connection (of a helper).
    pub const EXPECTED: Status = Status(1);
    /// `IPS_SEEN_REPLY`: packets were seen in both directions (not `[UNREPLIED]`).
    pub const SEEN_REPLY: Status = Status(1 << 1);
    /// `IPS_ASSURED`: `[ASSURED]`, not dropped early when the table is full.
    pub const ASSURED: Status = Status(1 << 2);
    /// `IPS_CONFIRMED`: the entry left the hooks and is in the table.
    pub const CONFIRMED: Status = Status(1 << 3);
    /// `IPS_SRC_NAT`: source NAT (e.g. masquerade) applies.
    pub const SRC_NAT: Status = Status(1 << 4);
    /// `IPS_DST_NAT`: destination NAT (e.g. a Service DNAT) applies.
    pub const DST_NAT: Status = Status(1 << 5);
    /// `IPS_SRC_NAT_DONE`: the source NAT binding was set up.
    pub const SRC_NAT_DONE: Status = Status(1 << 7);
    /// `IPS_DST_NAT_DONE`: the destination NAT binding was set up.
    pub const DST_NAT_DONE: Status = Status(1 << 8);
    /// `IPS_DYING`: being destroyed.
    pub const DYING: Status = Status(1 << 9);
    /// `IPS_FIXED_TIMEOUT`: the timeout does not refresh.
    pub const FIXED_TIMEOUT: Status = Status(1 << 10);
    /// `IPS_OFFLOAD`: offloaded to a flowtable.
    pub const OFFLOAD: Status = Status(1 << 14);

    /// The raw bits.
    pub fn bits(self) -> u32 {
        self.0
    }

    /// Whether every bit of `other` is set.
    pub fn contains(self, other: Status) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Status {
    type Output = Status;
    fn bitor(self, rhs: Status) -> Status {
        Status(self.0 | rhs.0)
    }
}

/// One conntrack entry: what `conntrack -L` prints on one line.
///
/// Only [`Flow::original`], [`Flow::zone`] and [`Flow::id`] matter to
/// [`crate::ConntrackOps::delete`]; the other fields are informational.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Flow {
    /// The entry's address family (that of its tuples).
    pub family: Family,
    /// The original direction: the first packet as it arrived (before NAT), e.g.
    /// client → Service IP:port.
    pub original: Tuple,
    /// The reply direction as the reply is expected (after NAT), e.g. endpoint →
    /// client. For a DNATed entry `reply.src` is the endpoint that was chosen.
    pub reply: Tuple,
    /// Status bits (`CTA_STATUS`); [`Status::default`] when the kernel did not send them.
    pub status: Status,
    /// Conntrack zone (`CTA_ZONE`), 0 for the default zone.
    pub zone: u16,
    /// The kernel's entry id (`CTA_ID`). When set, [`crate::ConntrackOps::delete`] deletes
    /// only that entry and not a newer one that reuses the tuple.
    pub id: Option<u32>,
    /// Seconds left before the entry expires (`CTA_TIMEOUT`), if known.
    pub timeout: Option<u32>,
    /// The entry's mark (`CTA_MARK`), if known.
    pub mark: Option<u32>,
}

impl Flow {
    /// An entry with the given tuples, status [`Status::CONFIRMED`], zone 0, no id, timeout
    /// or mark. The family is that of `original.src`.
    pub fn new(original: Tuple, reply: Tuple) -> Flow {
        Flow {
            family: Family::of(&original.src),
            original,
            reply,
            status: Status::CONFIRMED,
            zone: 0,
            id: None,
            timeout: None,
            mark: None,
        }
    }

    /// A UDP entry from `client` to `service`, answered by `endpoint` (DNATed when
    /// `endpoint != service`), as a test or a fake would create it.
    pub fn udp(client: SocketAddr, service: SocketAddr, endpoint: SocketAddr) -> Flow {
        let mut flow = Flow::new(Tuple::udp(client, service), Tuple::udp(endpoint, client));
        if endpoint != service {
            flow.status = flow.status | Status::DST_NAT | Status::DST_NAT_DONE;
        }
        flow
    }

    /// The original destination (the address the client sent to, e.g. a Service IP and
    /// port).
    pub fn original_dst(&self) -> SocketAddr {
        self.original.dst_addr()
    }

    /// The reply source (the address that answers, e.g. the chosen endpoint).
    pub fn reply_src(&self) -> SocketAddr {
        self.reply.src_addr()
    }

    /// Whether the destination was translated: the reply comes from somewhere other than
    /// the original destination. An entry created while a Service had no endpoints is not
    /// DNATed.
    pub fn is_dnat(&self) -> bool {
        self.reply.src != self.original.dst || self.reply.src_port != self.original.dst_port
    }
}

impl fmt::Display for Flow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {}",
            proto::name(self.original.proto),
            self.original,
            self.reply
        )?;
        if !self.status.contains(Status::SEEN_REPLY) {
            f.write_str(" [UNREPLIED]")?;
        }
        if self.zone != 0 {
            write!(f, " zone={}", self.zone)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flows_print_like_conntrack() {
        let flow = Flow::udp(
            "192.168.56.100:40000".parse().unwrap(),
            "10.96.0.53:53".parse().unwrap(),
            "10.244.1.10:53".parse().unwrap(),
        );
        assert_eq!(
            flow.to_string(),
            "udp src=192.168.56.100 dst=10.96.0.53 sport=40000 dport=53 \
             src=10.244.1.10 dst=192.168.56.100 sport=53 dport=40000 [UNREPLIED]"
        );
        assert!(flow.is_dnat());
        assert_eq!(flow.family, Family::V4);
        assert_eq!(flow.original_dst(), "10.96.0.53:53".parse().unwrap());
        assert_eq!(flow.reply_src(), "10.244.1.10:53".parse().unwrap());
        assert!(flow.status.contains(Status::DST_NAT | Status::CONFIRMED));

        let plain = Flow::udp(
            "[fd00::1]:1000".parse().unwrap(),
            "[fd00:10:96::a]:53".parse().unwrap(),
            "[fd00:10:96::a]:53".parse().unwrap(),
        );
        assert!(!plain.is_dnat());
        assert_eq!(plain.family, Family::V6);
        assert_eq!(plain.reply, plain.original.reversed());
        assert!(!plain.status.contains(Status::DST_NAT));
    }

    #[test]
    fn families_and_protocols() {
        assert_eq!(Family::V4.nfproto(), 2);
        assert_eq!(Family::V6.nfproto(), 10);
        assert!(Family::V6.contains(&"::1".parse().unwrap()));
        assert_eq!(Family::V4.to_string(), "ipv4");
        assert!(proto::has_ports(proto::SCTP));
        assert!(!proto::has_ports(proto::ICMP));
        assert_eq!(proto::name(47), "47");
    }
}
