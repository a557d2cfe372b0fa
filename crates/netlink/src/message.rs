//! ctnetlink message building and parsing, without a socket.
//!
//! Requests are `NetlinkMessage<NetfilterMessage>` values of `netlink-packet-netfilter`,
//! serialized by `netlink-packet-core`:
//!
//! * dump: `IPCTNL_MSG_CT_GET` with `NLM_F_REQUEST | NLM_F_DUMP` and no attributes (what
//!   `conntrack -L -f ipv4` sends);
//! * delete: `IPCTNL_MSG_CT_DELETE` with `NLM_F_REQUEST | NLM_F_ACK`, `CTA_TUPLE_ORIG`
//!   (`CTA_TUPLE_IP` {src, dst}, `CTA_TUPLE_PROTO` {num, sport, dport}), then `CTA_ZONE`
//!   when the zone is not 0 and `CTA_ID` when the id is known. A delete without a tuple
//!   would flush the whole table, so [`delete_request`] always has one.
//!
//! Replies are read one datagram at a time by [`parse_datagram`], which walks the netlink
//! messages in it (multipart dumps pack several entries per datagram), keeps those with the
//! request's sequence number, and turns each into a [`Reply`]: a [`Flow`], `NLMSG_DONE`,
//! an ACK or an error code. Framing problems (lengths that do not add up) fail the whole
//! datagram; an entry whose attributes cannot be decoded becomes [`Reply::Skipped`] so one
//! odd entry does not hide the others.
//!
//! The unit tests compare against bytes captured from `conntrack` and the kernel with
//! `strace` (see `testdata/*.hex`, whose headers say how each was obtained).

use std::net::IpAddr;

use netlink_packet_core::{
    DefaultNla, ErrorBuffer, NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST, NLMSG_DONE,
    NLMSG_ERROR, NLMSG_NOOP, NLMSG_OVERRUN, NetlinkBuffer, NetlinkHeader, NetlinkMessage,
    NetlinkPayload, Nla, ParseableParametrized,
};
use netlink_packet_netfilter::conntrack::{
    ConntrackAttribute, ConntrackMessage, IPTuple, ProtoTuple, Protocol, Tuple as NfTuple,
};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};

use crate::flow::{Family, Flow, Status, Tuple, proto};

/// `NFNL_SUBSYS_CTNETLINK` (`linux/netfilter/nfnetlink.h`).
const NFNL_SUBSYS_CTNETLINK: u8 = 1;
/// `CTA_ID` (`linux/netfilter/nfnetlink_conntrack.h`), a big-endian u32; the netfilter
/// crate leaves it raw.
const CTA_ID: u16 = 12;
/// `CTA_ZONE`, a big-endian u16; left raw by the netfilter crate.
const CTA_ZONE: u16 = 18;
/// `NLA_TYPE_MASK`: an attribute's type without the nested / byte-order flags.
const NLA_TYPE_MASK: u16 = 0x3fff;
/// Length of `struct nlmsghdr`.
const NLMSG_HDRLEN: usize = 16;

/// The dump request for `family` (like `conntrack -L -f ipv4`).
pub(crate) fn dump_request(family: Family, seq: u32) -> Vec<u8> {
    serialize(
        family,
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
        ConntrackMessage::Get(Vec::new()),
    )
}

/// Why `flow` cannot be deleted by tuple, if it cannot.
pub(crate) fn check_deletable(flow: &Flow) -> Result<(), String> {
    let t = &flow.original;
    if !proto::has_ports(t.proto) {
        return Err(format!(
            "deleting entries of protocol {} is not supported (only TCP, UDP, SCTP, DCCP and \
             UDP-Lite tuples are built)",
            proto::name(t.proto)
        ));
    }
    if !flow.family.contains(&t.src) || !flow.family.contains(&t.dst) {
        return Err(format!(
            "the original tuple {t} is not of the flow's family {}",
            flow.family
        ));
    }
    Ok(())
}

/// The delete request for `flow` (like `conntrack -D` with its original tuple): see the
/// module documentation for the attributes. Errors say why the flow cannot be deleted.
pub(crate) fn delete_request(flow: &Flow, seq: u32) -> Result<Vec<u8>, String> {
    check_deletable(flow)?;
    let t = &flow.original;
    let mut attributes = vec![ConntrackAttribute::CtaTupleOrig(vec![
        NfTuple::Ip(vec![
            IPTuple::SourceAddress(t.src),
            IPTuple::DestinationAddress(t.dst),
        ]),
        NfTuple::Proto(vec![
            ProtoTuple::Protocol(Protocol::from(t.proto)),
            ProtoTuple::SourcePort(t.src_port),
            ProtoTuple::DestinationPort(t.dst_port),
        ]),
    ])];
    if flow.zone != 0 {
        attributes.push(ConntrackAttribute::Other(DefaultNla::new(
            CTA_ZONE,
            flow.zone.to_be_bytes().to_vec(),
        )));
    }
    if let Some(id) = flow.id {
        attributes.push(ConntrackAttribute::Other(DefaultNla::new(
            CTA_ID,
            id.to_be_bytes().to_vec(),
        )));
    }
    Ok(serialize(
        flow.family,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        ConntrackMessage::Delete(attributes),
    ))
}

fn serialize(family: Family, flags: u16, seq: u32, message: ConntrackMessage) -> Vec<u8> {
    let nf_family = match family {
        Family::V4 => NetfilterProtoFamily::IPv4,
        Family::V6 => NetfilterProtoFamily::IPv6,
    };
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = seq;
    let mut packet = NetlinkMessage::new(
        header,
        NetlinkPayload::from(NetfilterMessage::new(
            NetfilterHeader::new(nf_family, 0, 0),
            message,
        )),
    );
    packet.finalize();
    let mut buf = vec![0; packet.buffer_len()];
    packet.serialize(&mut buf);
    buf
}

/// One netlink message of a reply, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    /// A conntrack entry (`IPCTNL_MSG_CT_NEW` in a dump).
    Flow(Flow),
    /// A conntrack message whose attributes could not be decoded, with the reason.
    Skipped(String),
    /// `NLMSG_DONE` with status 0: the dump is complete.
    Done,
    /// `NLMSG_ERROR` with code 0: the request succeeded.
    Ack,
    /// `NLMSG_ERROR` with a non-zero code, or `NLMSG_DONE` carrying a dump error: the
    /// positive errno.
    Error(i32),
}

/// The messages of one datagram that belong to the request with the given sequence
/// number.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Datagram {
    /// The decoded messages, in order.
    pub(crate) replies: Vec<Reply>,
    /// Whether a message carried `NLM_F_DUMP_INTR` (the table changed during the dump).
    pub(crate) interrupted: bool,
}

/// Decodes one received datagram, keeping the messages whose sequence number is `seq`
/// (others are leftovers of an earlier, abandoned request). Errors describe broken
/// framing.
pub(crate) fn parse_datagram(buf: &[u8], seq: u32) -> Result<Datagram, String> {
    let mut out = Datagram::default();
    for (offset, message) in messages(buf)? {
        if message.sequence_number() != seq {
            continue;
        }
        if message.flags() & NLM_F_DUMP_INTR != 0 {
            out.interrupted = true;
        }
        let message_type = message.message_type();
        let payload = message.payload();
        let reply = match control(message_type, payload, offset)? {
            Some(Control::Noop) => continue,
            Some(Control::Ack) => Reply::Ack,
            Some(Control::Done) => Reply::Done,
            Some(Control::Error(code)) => Reply::Error(code),
            None if (message_type >> 8) as u8 == NFNL_SUBSYS_CTNETLINK => {
                match decode_flow(payload, message_type) {
                    Ok(flow) => Reply::Flow(flow),
                    Err(why) => Reply::Skipped(why),
                }
            }
            None => Reply::Skipped(format!("unexpected message type {message_type:#06x}")),
        };
        out.replies.push(reply);
    }
    Ok(out)
}

/// A netlink control message (`NLMSG_NOOP`, `NLMSG_ERROR`, `NLMSG_DONE`) as both decoders
/// (ctnetlink and IPVS) read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Control {
    /// `NLMSG_NOOP`: nothing to do.
    Noop,
    /// `NLMSG_ERROR` with code 0.
    Ack,
    /// `NLMSG_DONE` with status 0.
    Done,
    /// `NLMSG_ERROR` with a non-zero code, or a `NLMSG_DONE` carrying a dump error: the
    /// positive errno.
    Error(i32),
}

/// Classifies a control message; `Ok(None)` for any other type. `NLMSG_OVERRUN` and a
/// truncated `NLMSG_ERROR` are errors (the description names the message's offset `at`).
pub(crate) fn control(
    message_type: u16,
    payload: &[u8],
    at: usize,
) -> Result<Option<Control>, String> {
    Ok(Some(match message_type {
        NLMSG_NOOP => Control::Noop,
        NLMSG_ERROR => {
            let error = ErrorBuffer::new_checked(payload)
                .map_err(|e| format!("NLMSG_ERROR at offset {at}: {e}"))?;
            match error.code() {
                None => Control::Ack,
                Some(code) => Control::Error(code.get().saturating_neg()),
            }
        }
        NLMSG_DONE => match payload.get(..4) {
            Some(&[a, b, c, d]) if i32::from_ne_bytes([a, b, c, d]) != 0 => {
                Control::Error(i32::from_ne_bytes([a, b, c, d]).saturating_neg())
            }
            _ => Control::Done,
        },
        NLMSG_OVERRUN => return Err("NLMSG_OVERRUN: the kernel dropped data".into()),
        _ => return Ok(None),
    }))
}

/// One message of a datagram and its offset in it.
pub(crate) type Located<'a> = (usize, NetlinkBuffer<&'a [u8]>);

/// Splits a received datagram into its messages, each with its offset; errors describe
/// broken framing (a header that does not fit, a length below the header's).
pub(crate) fn messages(buf: &[u8]) -> Result<Vec<Located<'_>>, String> {
    let mut out = Vec::new();
    let mut offset = 0;
    while offset < buf.len() {
        let message = NetlinkBuffer::new_checked(&buf[offset..])
            .map_err(|e| format!("message at offset {offset}: {e}"))?;
        let len = message.length() as usize;
        if len < NLMSG_HDRLEN {
            return Err(format!(
                "message at offset {offset} has length {len}, below the header's {NLMSG_HDRLEN}"
            ));
        }
        out.push((offset, message));
        // NLMSG_ALIGN: the next message starts at a multiple of 4 (the last may be unpadded).
        offset = offset.saturating_add(len.saturating_add(3) & !3);
    }
    Ok(out)
}

/// Decodes the payload (`nfgenmsg` + attributes) of one ctnetlink message.
fn decode_flow(payload: &[u8], message_type: u16) -> Result<Flow, String> {
    let message = NetfilterMessage::parse_with_param(payload, message_type)
        .map_err(|e| format!("undecodable conntrack message: {e}"))?;
    let attributes = match message.inner {
        NetfilterMessageInner::Conntrack(
            ConntrackMessage::New(a) | ConntrackMessage::Get(a) | ConntrackMessage::Delete(a),
        ) => a,
        other => return Err(format!("unexpected ctnetlink message {other:?}")),
    };
    flow_from_attributes(&attributes)
}

/// Builds a [`Flow`] from the attributes of one entry.
fn flow_from_attributes(attributes: &[ConntrackAttribute]) -> Result<Flow, String> {
    let mut original = None;
    let mut reply = None;
    let mut status = Status::default();
    let (mut zone, mut id, mut timeout, mut mark) = (0, None, None, None);
    for attribute in attributes {
        match attribute {
            ConntrackAttribute::CtaTupleOrig(t) => original = Some(tuple(t, "CTA_TUPLE_ORIG")?),
            ConntrackAttribute::CtaTupleReply(t) => reply = Some(tuple(t, "CTA_TUPLE_REPLY")?),
            ConntrackAttribute::CtaStatus(s) => status = Status(s.bits()),
            ConntrackAttribute::CtaTimeout(t) => timeout = Some(*t),
            ConntrackAttribute::CtaMark(m) => mark = Some(*m),
            ConntrackAttribute::Other(nla) => match nla.kind() & NLA_TYPE_MASK {
                CTA_ZONE => zone = u16::from_be_bytes(value(nla, "CTA_ZONE")?),
                CTA_ID => id = Some(u32::from_be_bytes(value(nla, "CTA_ID")?)),
                _ => {}
            },
            _ => {}
        }
    }
    let original = original.ok_or("entry without CTA_TUPLE_ORIG")?;
    let reply = reply.ok_or("entry without CTA_TUPLE_REPLY")?;
    let family = Family::of(&original.src);
    if [original.dst, reply.src, reply.dst]
        .iter()
        .any(|a| !family.contains(a))
    {
        return Err(format!("entry mixes address families: {original} {reply}"));
    }
    Ok(Flow {
        family,
        original,
        reply,
        status,
        zone,
        id,
        timeout,
        mark,
    })
}

/// The value of a raw attribute as exactly `N` bytes.
fn value<const N: usize>(nla: &DefaultNla, name: &str) -> Result<[u8; N], String> {
    if nla.value_len() != N {
        return Err(format!(
            "{name} has {} bytes, expected {N}",
            nla.value_len()
        ));
    }
    let mut out = [0u8; N];
    nla.emit_value(&mut out);
    Ok(out)
}

/// A [`Tuple`] from the nested attributes of `CTA_TUPLE_ORIG` / `CTA_TUPLE_REPLY`.
fn tuple(parts: &[NfTuple], name: &str) -> Result<Tuple, String> {
    let (mut src, mut dst, mut number) = (None::<IpAddr>, None::<IpAddr>, None::<u8>);
    let (mut src_port, mut dst_port) = (0, 0);
    for part in parts {
        match part {
            NfTuple::Ip(ips) => {
                for ip in ips {
                    match ip {
                        IPTuple::SourceAddress(a) => src = Some(*a),
                        IPTuple::DestinationAddress(a) => dst = Some(*a),
                        _ => {}
                    }
                }
            }
            NfTuple::Proto(protos) => {
                for p in protos {
                    match p {
                        ProtoTuple::Protocol(p) => number = Some(u8::from(*p)),
                        ProtoTuple::SourcePort(port) => src_port = *port,
                        ProtoTuple::DestinationPort(port) => dst_port = *port,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Ok(Tuple {
        src: src.ok_or_else(|| format!("{name} without a source address"))?,
        dst: dst.ok_or_else(|| format!("{name} without a destination address"))?,
        proto: number.ok_or_else(|| format!("{name} without CTA_PROTO_NUM"))?,
        src_port,
        dst_port,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes from a `testdata/*.hex` file: hex pairs, `#` comments.
    fn hex(text: &str) -> Vec<u8> {
        let bytes: Vec<u8> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .flat_map(str::split_whitespace)
            .map(|b| u8::from_str_radix(b, 16).expect("hex byte"))
            .collect();
        let declared = text
            .lines()
            .find_map(|l| l.strip_prefix("# ")?.strip_suffix(" bytes")?.parse().ok());
        assert_eq!(Some(bytes.len()), declared, "length in the file's header");
        bytes
    }

    fn seq_of(bytes: &[u8]) -> u32 {
        u32::from_ne_bytes(bytes[8..12].try_into().unwrap())
    }

    const DUMP_REQUEST_V4: &str = include_str!("testdata/dump_request_v4.hex");
    const DUMP_REQUEST_V6: &str = include_str!("testdata/dump_request_v6.hex");
    const DUMP_REPLY_V4: &str = include_str!("testdata/dump_reply_v4.hex");
    const DUMP_REPLY_V6: &str = include_str!("testdata/dump_reply_v6.hex");
    const DUMP_DONE: &str = include_str!("testdata/dump_done.hex");
    const DELETE_V4_CONNTRACK: &str = include_str!("testdata/delete_v4_conntrack.hex");
    const DELETE_V6_CONNTRACK: &str = include_str!("testdata/delete_v6_conntrack.hex");
    const DELETE_ACK: &str = include_str!("testdata/delete_ack.hex");

    fn v4_flow() -> Flow {
        Flow::udp(
            "192.168.56.100:40000".parse().unwrap(),
            "10.96.0.53:53".parse().unwrap(),
            "10.244.1.10:53".parse().unwrap(),
        )
    }

    #[test]
    fn dump_requests_are_what_conntrack_sends() {
        for (family, golden) in [(Family::V4, DUMP_REQUEST_V4), (Family::V6, DUMP_REQUEST_V6)] {
            let golden = hex(golden);
            assert_eq!(dump_request(family, seq_of(&golden)), golden, "{family}");
        }
    }

    #[test]
    fn delete_request_is_the_hand_built_layout() {
        // struct nlmsghdr + struct nfgenmsg + CTA_TUPLE_ORIG, from the kernel's
        // netlink.h / nfnetlink.h / nfnetlink_conntrack.h, native (little) endian header
        // and network-order payload values.
        #[rustfmt::skip]
        let expected: Vec<u8> = vec![
            0x48, 0, 0, 0,          // nlmsg_len 72
            0x02, 0x01,             // nlmsg_type: NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_DELETE
            0x05, 0x00,             // nlmsg_flags: NLM_F_REQUEST | NLM_F_ACK
            0x2a, 0, 0, 0,          // nlmsg_seq 42
            0, 0, 0, 0,             // nlmsg_pid 0 (the kernel)
            0x02, 0x00, 0x00, 0x00, // nfgen_family AF_INET, version NFNETLINK_V0, res_id 0
            0x34, 0x00, 0x01, 0x80, // CTA_TUPLE_ORIG | NLA_F_NESTED, 52 bytes
            0x14, 0x00, 0x01, 0x80, //   CTA_TUPLE_IP | NLA_F_NESTED, 20 bytes
            0x08, 0x00, 0x01, 0x00, 192, 168, 56, 100, // CTA_IP_V4_SRC
            0x08, 0x00, 0x02, 0x00, 10, 96, 0, 53,     // CTA_IP_V4_DST
            0x1c, 0x00, 0x02, 0x80, //   CTA_TUPLE_PROTO | NLA_F_NESTED, 28 bytes
            0x05, 0x00, 0x01, 0x00, 17, 0, 0, 0,       // CTA_PROTO_NUM udp, 3 bytes padding
            0x06, 0x00, 0x02, 0x00, 0x9c, 0x40, 0, 0,  // CTA_PROTO_SRC_PORT 40000
            0x06, 0x00, 0x03, 0x00, 0x00, 0x35, 0, 0,  // CTA_PROTO_DST_PORT 53
        ];
        assert_eq!(delete_request(&v4_flow(), 42).unwrap(), expected);

        // With a zone and an id, CTA_ZONE and CTA_ID follow the tuple.
        let mut flow = v4_flow();
        flow.zone = 7;
        flow.id = Some(0xdfe4_fc7d);
        let mut expected = expected;
        expected[0] = 0x48 + 8 + 8;
        #[rustfmt::skip]
        expected.extend([
            0x06, 0x00, 0x12, 0x00, 0x00, 0x07, 0, 0,       // CTA_ZONE 7
            0x08, 0x00, 0x0c, 0x00, 0xdf, 0xe4, 0xfc, 0x7d, // CTA_ID
        ]);
        assert_eq!(delete_request(&flow, 42).unwrap(), expected);
    }

    #[test]
    fn delete_request_tuples_match_what_conntrack_sends() {
        // conntrack -D sends more attributes than the tuple (see the file headers): the
        // header fields and CTA_TUPLE_ORIG must be byte-identical.
        let cases = [
            (DELETE_V4_CONNTRACK, v4_flow(), 52),
            (
                DELETE_V6_CONNTRACK,
                Flow::udp(
                    "[fd00:56::100]:40001".parse().unwrap(),
                    "[fd00:10:96::35]:53".parse().unwrap(),
                    "[fd00:10:244::1:10]:53".parse().unwrap(),
                ),
                76,
            ),
        ];
        for (golden, flow, tuple_len) in cases {
            let golden = hex(golden);
            let ours = delete_request(&flow, seq_of(&golden)).unwrap();
            assert_eq!(ours.len(), 20 + tuple_len);
            assert_eq!(ours[0..4], (ours.len() as u32).to_ne_bytes());
            assert_eq!(ours[4..20], golden[4..20], "header and nfgenmsg of {flow}");
            assert_eq!(
                ours[20..],
                golden[20..20 + tuple_len],
                "CTA_TUPLE_ORIG of {flow}"
            );
        }
    }

    #[test]
    fn delete_refuses_what_it_cannot_express() {
        let mut icmp = v4_flow();
        icmp.original.proto = proto::ICMP;
        assert!(delete_request(&icmp, 1).unwrap_err().contains("icmp"));
        let mut mixed = v4_flow();
        mixed.original.dst = "fd00::1".parse().unwrap();
        assert!(delete_request(&mixed, 1).unwrap_err().contains("family"));
    }

    fn flows(datagram: &Datagram) -> Vec<&Flow> {
        datagram
            .replies
            .iter()
            .filter_map(|r| match r {
                Reply::Flow(f) => Some(f),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn captured_ipv4_dump_is_parsed() {
        let bytes = hex(DUMP_REPLY_V4);
        let seq = seq_of(&bytes);
        let datagram = parse_datagram(&bytes, seq).unwrap();
        assert!(!datagram.interrupted);
        assert_eq!(datagram.replies.len(), 4);
        let got = flows(&datagram);
        assert_eq!(got.len(), 4);

        let mut first = v4_flow();
        first.status = Status::CONFIRMED;
        first.id = Some(0xdfe4_fc7d);
        first.timeout = Some(80);
        first.mark = Some(0);
        assert_eq!(got[0], &first);
        assert!(got[0].is_dnat());

        let tcp = got[1];
        assert_eq!(
            tcp.original,
            Tuple::new(
                proto::TCP,
                "192.168.56.100:41000".parse().unwrap(),
                "10.96.0.80:80".parse().unwrap()
            )
        );
        assert_eq!(tcp.reply, tcp.original.reversed());
        assert_eq!(
            tcp.status,
            Status::SEEN_REPLY | Status::ASSURED | Status::CONFIRMED
        );
        assert_eq!((tcp.id, tcp.timeout), (Some(0x3811_ed2d), Some(297)));

        let zoned = got[2];
        assert_eq!(zoned.zone, 7);
        assert_eq!(
            zoned.original.src_addr(),
            "192.168.56.101:40003".parse().unwrap()
        );
        assert!(!zoned.is_dnat());

        let dnat = got[3];
        assert_eq!(dnat.original_dst(), "10.96.0.53:53".parse().unwrap());
        assert_eq!(dnat.reply_src(), "10.0.0.1:5353".parse().unwrap());
        assert_eq!(dnat.status.bits(), 0x1aa);
        assert!(dnat.status.contains(Status::DST_NAT | Status::SEEN_REPLY));
        assert!(dnat.is_dnat());
        assert_eq!(
            dnat.to_string(),
            "udp src=10.0.0.1 dst=10.96.0.53 sport=40002 dport=53 \
             src=10.0.0.1 dst=10.0.0.1 sport=5353 dport=40002"
        );

        let done = hex(DUMP_DONE);
        assert_eq!(
            parse_datagram(&done, seq).unwrap().replies,
            vec![Reply::Done]
        );
    }

    #[test]
    fn captured_ipv6_dump_is_parsed() {
        let bytes = hex(DUMP_REPLY_V6);
        let datagram = parse_datagram(&bytes, seq_of(&bytes)).unwrap();
        let got = flows(&datagram);
        assert_eq!(got.len(), 1);
        let flow = got[0];
        assert_eq!(flow.family, Family::V6);
        assert_eq!(flow.original_dst(), "[fd00:10:96::35]:53".parse().unwrap());
        assert_eq!(
            flow.original.src_addr(),
            "[fd00:56::100]:40001".parse().unwrap()
        );
        assert_eq!(flow.reply_src(), "[fd00:10:244::1:10]:53".parse().unwrap());
        assert_eq!(flow.id, Some(0xc04e_0598));
        assert_eq!(flow.status, Status::CONFIRMED);
    }

    #[test]
    fn other_sequence_numbers_are_ignored() {
        let bytes = hex(DUMP_REPLY_V4);
        let datagram = parse_datagram(&bytes, seq_of(&bytes).wrapping_add(1)).unwrap();
        assert_eq!(datagram, Datagram::default());
    }

    #[test]
    fn acks_and_errors() {
        let ack = hex(DELETE_ACK);
        assert_eq!(
            parse_datagram(&ack, seq_of(&ack)).unwrap().replies,
            vec![Reply::Ack]
        );
        // The same message with error -ENOENT (as the kernel answers a delete of an
        // entry that is gone), and a DONE carrying a dump error (-EPERM).
        let mut enoent = ack.clone();
        enoent[16..20].copy_from_slice(&(-2i32).to_ne_bytes());
        assert_eq!(
            parse_datagram(&enoent, seq_of(&ack)).unwrap().replies,
            vec![Reply::Error(2)]
        );
        let mut failed_done = hex(DUMP_DONE);
        failed_done[16..20].copy_from_slice(&(-1i32).to_ne_bytes());
        assert_eq!(
            parse_datagram(&failed_done, seq_of(&failed_done))
                .unwrap()
                .replies,
            vec![Reply::Error(1)]
        );
    }

    #[test]
    fn dump_interrupted_flag_is_reported() {
        let mut bytes = hex(DUMP_REPLY_V4);
        bytes[6] |= NLM_F_DUMP_INTR as u8;
        assert!(parse_datagram(&bytes, seq_of(&bytes)).unwrap().interrupted);
    }

    #[test]
    fn an_undecodable_entry_is_skipped_not_fatal() {
        let mut bytes = hex(DUMP_REPLY_V4);
        // The first entry's CTA_STATUS (at 0x7c: 08 00 03 00, value 4 bytes): claim a
        // 5-byte value, which the netfilter crate rejects. Its length still fits the
        // message, so the framing stays intact.
        assert_eq!(bytes[0x7c..0x80], [8, 0, 3, 0]);
        bytes[0x7c] = 5;
        let datagram = parse_datagram(&bytes, seq_of(&bytes)).unwrap();
        assert!(
            matches!(datagram.replies[0], Reply::Skipped(_)),
            "{datagram:?}"
        );
        assert_eq!(flows(&datagram).len(), 3);
    }

    #[test]
    fn broken_framing_is_an_error() {
        let bytes = hex(DUMP_REPLY_V4);
        let seq = seq_of(&bytes);
        // Cut inside the last message: its length points past the datagram.
        assert!(parse_datagram(&bytes[..900], seq).is_err());
        // A length below the header size.
        let mut short = bytes.clone();
        short[0..4].copy_from_slice(&8u32.to_ne_bytes());
        assert!(parse_datagram(&short, seq).is_err());
        assert!(parse_datagram(&[], seq).unwrap().replies.is_empty());
    }

    #[test]
    fn arbitrary_corruption_never_panics() {
        let bytes = hex(DUMP_REPLY_V4);
        let seq = seq_of(&bytes);
        for cut in 0..bytes.len() {
            let _ = parse_datagram(&bytes[..cut], seq);
        }
        for i in 0..bytes.len() {
            for flip in [0x01u8, 0x04, 0x80, 0xff] {
                let mut corrupt = bytes.clone();
                corrupt[i] ^= flip;
                let _ = parse_datagram(&corrupt, seq);
            }
        }
    }
}
