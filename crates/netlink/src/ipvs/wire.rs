//! IPVS generic netlink messages, without a socket.
//!
//! Every request is `struct nlmsghdr` + `struct genlmsghdr` (`cmd`, version
//! `IPVS_GENL_VERSION` = 1) + attributes, built as a `netlink-packet-generic`
//! `GenlMessage` whose payload ([`IpvsPayload`]) holds the IPVS attributes. The family's
//! message type is the id the controller assigned to `IPVS` (looked up with
//! `CTRL_CMD_GETFAMILY`, [`family_request`]).
//!
//! Layout per command (attribute numbers from `include/uapi/linux/ip_vs.h`; nests carry
//! `NLA_F_NESTED`, which the kernel accepts and ignores):
//!
//! * `IPVS_CMD_NEW_SERVICE` (1) / `IPVS_CMD_SET_SERVICE` (2): `IPVS_CMD_ATTR_SERVICE` (1)
//!   { `AF` u16, `PROTOCOL` u16, `ADDR` 16 bytes (`union nf_inet_addr`, IPv4 in the
//!   first 4), `PORT` be16, `SCHED_NAME` NUL-terminated, `FLAGS` {flags u32, mask u32 =
//!   `0xffffffff`}, `TIMEOUT` u32, `NETMASK` u32 }: the key plus the four attributes
//!   `ip_vs_genl_parse_service` requires for a "full entry". `IP_VS_SVC_F_HASHED` is
//!   never sent.
//! * `IPVS_CMD_DEL_SERVICE` (3): the service nest with the key only.
//! * `IPVS_CMD_NEW_DEST` (5) / `IPVS_CMD_SET_DEST` (6): the key nest, then
//!   `IPVS_CMD_ATTR_DEST` (2) { `ADDR`, `PORT` be16, `FWD_METHOD` u32, `WEIGHT` u32,
//!   `U_THRESH` 0, `L_THRESH` 0, `ADDR_FAMILY` u16 } (the first six are what the kernel
//!   requires for a full destination; the family lets a tunnel have another one).
//! * `IPVS_CMD_DEL_DEST` (7): the key nest, then the dest nest with `ADDR`, `PORT`,
//!   `ADDR_FAMILY`.
//! * `IPVS_CMD_GET_SERVICE` (4) with `NLM_F_DUMP` and no attributes; `IPVS_CMD_GET_DEST`
//!   (8) with `NLM_F_DUMP` and the key nest; `IPVS_CMD_GET_INFO` (15) and
//!   `IPVS_CMD_FLUSH` (17) without attributes.
//! * `IPVS_CMD_SET_CONFIG` (12): top-level `IPVS_CMD_ATTR_TIMEOUT_TCP` (4),
//!   `_TCP_FIN` (5), `_UDP` (6), u32 seconds each, all three always (0: unchanged), as
//!   ipvsadm's `ipvs_set_timeout` sends them. `IPVS_CMD_GET_CONFIG` (13) has no
//!   attributes; the kernel answers `IPVS_CMD_SET_CONFIG` with the same three.
//!
//! Integers are in host order except ports (network order); the IPv4 netmask is the
//! kernel's `__be32` as stored, see [`super::VirtualServer::netmask`]. Changes carry
//! `NLM_F_REQUEST | NLM_F_ACK`.
//!
//! Replies are walked by [`parse_datagram`]; the decoders ([`decode_service`],
//! [`decode_dest`], [`decode_info`], [`decode_config`], [`decode_family_id`]) return a reason instead of
//! panicking on anything the kernel (or a corrupted buffer) sends.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::message::Control;
use netlink_packet_core::{
    DecodeError, DefaultNla, Emitable, NLA_F_NESTED, NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR,
    NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload, Nla, NlasIterator, Parseable,
    ParseableParametrized,
};
use netlink_packet_generic::constants::GENL_ID_CTRL;
use netlink_packet_generic::ctrl::nlas::GenlCtrlAttrs;
use netlink_packet_generic::ctrl::{GenlCtrl, GenlCtrlCmd};
use netlink_packet_generic::{GenlFamily, GenlHeader, GenlMessage};
use nix::errno::Errno;

use super::{
    Forward, IpvsInfo, IpvsOp, IpvsTimeouts, RealServer, SCHED_NAME_MAX, SVC_F_HASHED, ServiceKey,
    VirtualServer,
};

/// `IPVS_GENL_NAME`.
pub(crate) const IPVS_GENL_NAME: &str = "IPVS";
/// `IPVS_GENL_VERSION`.
pub(crate) const IPVS_GENL_VERSION: u8 = 1;

pub(crate) const CMD_NEW_SERVICE: u8 = 1;
pub(crate) const CMD_SET_SERVICE: u8 = 2;
pub(crate) const CMD_DEL_SERVICE: u8 = 3;
pub(crate) const CMD_GET_SERVICE: u8 = 4;
pub(crate) const CMD_NEW_DEST: u8 = 5;
pub(crate) const CMD_SET_DEST: u8 = 6;
pub(crate) const CMD_DEL_DEST: u8 = 7;
pub(crate) const CMD_GET_DEST: u8 = 8;
pub(crate) const CMD_SET_CONFIG: u8 = 12;
pub(crate) const CMD_GET_CONFIG: u8 = 13;
pub(crate) const CMD_SET_INFO: u8 = 14;
pub(crate) const CMD_GET_INFO: u8 = 15;
pub(crate) const CMD_FLUSH: u8 = 17;

const CMD_ATTR_SERVICE: u16 = 1;
const CMD_ATTR_DEST: u16 = 2;
const CMD_ATTR_TIMEOUT_TCP: u16 = 4;
const CMD_ATTR_TIMEOUT_TCP_FIN: u16 = 5;
const CMD_ATTR_TIMEOUT_UDP: u16 = 6;

const SVC_ATTR_AF: u16 = 1;
const SVC_ATTR_PROTOCOL: u16 = 2;
const SVC_ATTR_ADDR: u16 = 3;
const SVC_ATTR_PORT: u16 = 4;
const SVC_ATTR_FWMARK: u16 = 5;
const SVC_ATTR_SCHED_NAME: u16 = 6;
const SVC_ATTR_FLAGS: u16 = 7;
const SVC_ATTR_TIMEOUT: u16 = 8;
const SVC_ATTR_NETMASK: u16 = 9;

const DEST_ATTR_ADDR: u16 = 1;
const DEST_ATTR_PORT: u16 = 2;
const DEST_ATTR_FWD_METHOD: u16 = 3;
const DEST_ATTR_WEIGHT: u16 = 4;
const DEST_ATTR_U_THRESH: u16 = 5;
const DEST_ATTR_L_THRESH: u16 = 6;
const DEST_ATTR_ACTIVE_CONNS: u16 = 7;
const DEST_ATTR_INACT_CONNS: u16 = 8;
const DEST_ATTR_ADDR_FAMILY: u16 = 11;

const INFO_ATTR_VERSION: u16 = 1;
const INFO_ATTR_CONN_TAB_SIZE: u16 = 2;

/// `CTRL_ATTR_FAMILY_ID` (`linux/genetlink.h`), for the fallback decoder.
const CTRL_ATTR_FAMILY_ID: u16 = 1;

const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;
/// `NLA_TYPE_MASK`.
const NLA_TYPE_MASK: u16 = 0x3fff;

/// The payload of an IPVS generic netlink message: its command and top-level attributes
/// (nests are [`DefaultNla`]s whose value is the emitted inner attributes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IpvsPayload {
    pub(crate) cmd: u8,
    pub(crate) attrs: Vec<DefaultNla>,
}

impl GenlFamily for IpvsPayload {
    fn family_name() -> &'static str {
        IPVS_GENL_NAME
    }

    fn command(&self) -> u8 {
        self.cmd
    }

    fn version(&self) -> u8 {
        IPVS_GENL_VERSION
    }
}

impl Emitable for IpvsPayload {
    fn buffer_len(&self) -> usize {
        self.attrs.as_slice().buffer_len()
    }

    fn emit(&self, buffer: &mut [u8]) {
        self.attrs.as_slice().emit(buffer)
    }
}

impl ParseableParametrized<[u8], GenlHeader> for IpvsPayload {
    fn parse_with_param(buf: &[u8], header: GenlHeader) -> Result<Self, DecodeError> {
        let attrs = NlasIterator::new(buf)
            .map(|nla| nla.and_then(|nla| DefaultNla::parse(&nla)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(IpvsPayload {
            cmd: header.cmd,
            attrs,
        })
    }
}

fn serialize<P>(message_type_payload: GenlMessage<P>, flags: u16, seq: u32) -> Vec<u8>
where
    P: GenlFamily + Emitable + std::fmt::Debug,
{
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = seq;
    let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(message_type_payload));
    packet.finalize();
    let mut buf = vec![0; packet.buffer_len()];
    packet.serialize(&mut buf);
    buf
}

fn ipvs_request(family_id: u16, cmd: u8, flags: u16, seq: u32, attrs: Vec<DefaultNla>) -> Vec<u8> {
    let mut message = GenlMessage::from_payload(IpvsPayload { cmd, attrs });
    message.set_resolved_family_id(family_id);
    serialize(message, flags, seq)
}

/// `CTRL_CMD_GETFAMILY` for `IPVS`, to the controller (`GENL_ID_CTRL`).
pub(crate) fn family_request(seq: u32) -> Vec<u8> {
    let message = GenlMessage::from_payload(GenlCtrl {
        cmd: GenlCtrlCmd::GetFamily,
        nlas: vec![GenlCtrlAttrs::FamilyName(IPVS_GENL_NAME.to_owned())],
    });
    serialize(message, NLM_F_REQUEST | NLM_F_ACK, seq)
}

/// The dump of every virtual server.
pub(crate) fn services_request(family_id: u16, seq: u32) -> Vec<u8> {
    ipvs_request(
        family_id,
        CMD_GET_SERVICE,
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
        Vec::new(),
    )
}

/// The dump of `key`'s real servers.
pub(crate) fn dests_request(family_id: u16, key: &ServiceKey, seq: u32) -> Vec<u8> {
    ipvs_request(
        family_id,
        CMD_GET_DEST,
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
        vec![nested(CMD_ATTR_SERVICE, &key_attrs(key))],
    )
}

/// `IPVS_CMD_GET_INFO`.
pub(crate) fn info_request(family_id: u16, seq: u32) -> Vec<u8> {
    ipvs_request(
        family_id,
        CMD_GET_INFO,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        Vec::new(),
    )
}

/// `IPVS_CMD_GET_CONFIG`.
pub(crate) fn get_config_request(family_id: u16, seq: u32) -> Vec<u8> {
    ipvs_request(
        family_id,
        CMD_GET_CONFIG,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        Vec::new(),
    )
}

/// `IPVS_CMD_SET_CONFIG` with the three timeouts.
pub(crate) fn set_config_request(family_id: u16, timeouts: &IpvsTimeouts, seq: u32) -> Vec<u8> {
    ipvs_request(
        family_id,
        CMD_SET_CONFIG,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        vec![
            u32_attr(CMD_ATTR_TIMEOUT_TCP, timeouts.tcp),
            u32_attr(CMD_ATTR_TIMEOUT_TCP_FIN, timeouts.tcp_fin),
            u32_attr(CMD_ATTR_TIMEOUT_UDP, timeouts.udp),
        ],
    )
}

/// `IPVS_CMD_FLUSH`.
pub(crate) fn flush_request(family_id: u16, seq: u32) -> Vec<u8> {
    ipvs_request(
        family_id,
        CMD_FLUSH,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        Vec::new(),
    )
}

/// What the kernel would refuse before looking anything up, with its errno: a scheduler
/// name the attribute policy rejects (`NLA_NUL_STRING` of at most 15 bytes: `EINVAL`).
pub(crate) fn check_op(op: &IpvsOp) -> Result<(), Errno> {
    if let IpvsOp::AddService(vs) | IpvsOp::EditService(vs) = op
        && (vs.scheduler.len() > SCHED_NAME_MAX || vs.scheduler.contains('\0'))
    {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

/// The request for one change; `Err` with the kernel's errno for what [`check_op`]
/// refuses (nothing is sent for it).
pub(crate) fn op_request(family_id: u16, op: &IpvsOp, seq: u32) -> Result<Vec<u8>, Errno> {
    check_op(op)?;
    let (cmd, attrs) = match op {
        IpvsOp::AddService(vs) => (CMD_NEW_SERVICE, vec![service_nest(vs)]),
        IpvsOp::EditService(vs) => (CMD_SET_SERVICE, vec![service_nest(vs)]),
        IpvsOp::DelService(key) => (
            CMD_DEL_SERVICE,
            vec![nested(CMD_ATTR_SERVICE, &key_attrs(key))],
        ),
        IpvsOp::AddDest(key, rs) => (
            CMD_NEW_DEST,
            vec![nested(CMD_ATTR_SERVICE, &key_attrs(key)), dest_nest(rs)],
        ),
        IpvsOp::EditDest(key, rs) => (
            CMD_SET_DEST,
            vec![nested(CMD_ATTR_SERVICE, &key_attrs(key)), dest_nest(rs)],
        ),
        IpvsOp::DelDest(key, dest) => (
            CMD_DEL_DEST,
            vec![
                nested(CMD_ATTR_SERVICE, &key_attrs(key)),
                nested(
                    CMD_ATTR_DEST,
                    &[
                        addr_attr(DEST_ATTR_ADDR, dest.ip()),
                        be16_attr(DEST_ATTR_PORT, dest.port()),
                        u16_attr(DEST_ATTR_ADDR_FAMILY, af(&dest.ip())),
                    ],
                ),
            ],
        ),
    };
    Ok(ipvs_request(
        family_id,
        cmd,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        attrs,
    ))
}

fn af(addr: &IpAddr) -> u16 {
    match addr {
        IpAddr::V4(_) => AF_INET,
        IpAddr::V6(_) => AF_INET6,
    }
}

fn u16_attr(kind: u16, value: u16) -> DefaultNla {
    DefaultNla::new(kind, value.to_ne_bytes().to_vec())
}

fn be16_attr(kind: u16, value: u16) -> DefaultNla {
    DefaultNla::new(kind, value.to_be_bytes().to_vec())
}

fn u32_attr(kind: u16, value: u32) -> DefaultNla {
    DefaultNla::new(kind, value.to_ne_bytes().to_vec())
}

/// A `union nf_inet_addr`: 16 bytes, IPv4 in the first four (as ipvsadm and the kernel's
/// dumps lay it out).
fn addr_attr(kind: u16, addr: IpAddr) -> DefaultNla {
    let mut value = vec![0; 16];
    match addr {
        IpAddr::V4(a) => value[..4].copy_from_slice(&a.octets()),
        IpAddr::V6(a) => value.copy_from_slice(&a.octets()),
    }
    DefaultNla::new(kind, value)
}

fn nested(kind: u16, attrs: &[DefaultNla]) -> DefaultNla {
    let mut value = vec![0; attrs.buffer_len()];
    attrs.emit(&mut value);
    DefaultNla::new(kind | NLA_F_NESTED, value)
}

fn key_attrs(key: &ServiceKey) -> Vec<DefaultNla> {
    vec![
        u16_attr(SVC_ATTR_AF, af(&key.addr)),
        u16_attr(SVC_ATTR_PROTOCOL, u16::from(key.protocol)),
        addr_attr(SVC_ATTR_ADDR, key.addr),
        be16_attr(SVC_ATTR_PORT, key.port),
    ]
}

fn service_nest(vs: &VirtualServer) -> DefaultNla {
    let mut attrs = key_attrs(&vs.key);
    let mut name = vs.scheduler.as_bytes().to_vec();
    name.push(0);
    attrs.push(DefaultNla::new(SVC_ATTR_SCHED_NAME, name));
    let mut flags = (vs.flags & !SVC_F_HASHED).to_ne_bytes().to_vec();
    flags.extend(u32::MAX.to_ne_bytes());
    attrs.push(DefaultNla::new(SVC_ATTR_FLAGS, flags));
    attrs.push(u32_attr(SVC_ATTR_TIMEOUT, vs.timeout));
    attrs.push(u32_attr(SVC_ATTR_NETMASK, vs.netmask));
    nested(CMD_ATTR_SERVICE, &attrs)
}

fn dest_nest(rs: &RealServer) -> DefaultNla {
    nested(
        CMD_ATTR_DEST,
        &[
            addr_attr(DEST_ATTR_ADDR, rs.addr),
            be16_attr(DEST_ATTR_PORT, rs.port),
            u32_attr(DEST_ATTR_FWD_METHOD, rs.forward.code()),
            u32_attr(DEST_ATTR_WEIGHT, rs.weight),
            u32_attr(DEST_ATTR_U_THRESH, 0),
            u32_attr(DEST_ATTR_L_THRESH, 0),
            u16_attr(DEST_ATTR_ADDR_FAMILY, af(&rs.addr)),
        ],
    )
}

/// One netlink message of a reply, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    /// A message of the IPVS family (a dump entry, the info answer).
    Ipvs(IpvsPayload),
    /// A controller message (`CTRL_CMD_NEWFAMILY`); the payload after `nlmsghdr`.
    Ctrl(Vec<u8>),
    /// A message that could not be decoded, with the reason.
    Skipped(String),
    /// `NLMSG_DONE` with status 0.
    Done,
    /// `NLMSG_ERROR` with code 0.
    Ack,
    /// `NLMSG_ERROR` with a non-zero code, or a `NLMSG_DONE` carrying a dump error: the
    /// positive errno.
    Error(i32),
}

/// One message of a datagram with its sequence number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Incoming {
    pub(crate) seq: u32,
    /// `NLM_F_DUMP_INTR`: the table changed during the dump.
    pub(crate) interrupted: bool,
    pub(crate) reply: Reply,
}

/// Decodes one received datagram (every message, whatever its sequence number: batches
/// match many). `family_id` is the IPVS family's message type. Errors describe broken
/// framing.
pub(crate) fn parse_datagram(buf: &[u8], family_id: u16) -> Result<Vec<Incoming>, String> {
    let mut out = Vec::new();
    for (at, message) in crate::message::messages(buf)? {
        let seq = message.sequence_number();
        let interrupted = message.flags() & NLM_F_DUMP_INTR != 0;
        let message_type = message.message_type();
        let payload = message.payload();
        let reply = match crate::message::control(message_type, payload, at)? {
            Some(Control::Noop) => continue,
            Some(Control::Ack) => Reply::Ack,
            Some(Control::Done) => Reply::Done,
            Some(Control::Error(code)) => Reply::Error(code),
            None if message_type == GENL_ID_CTRL => Reply::Ctrl(payload.to_vec()),
            None if message_type == family_id => {
                match GenlMessage::<IpvsPayload>::parse_with_param(payload, message_type) {
                    Ok(m) => Reply::Ipvs(m.payload),
                    Err(e) => Reply::Skipped(format!("undecodable IPVS message: {e}")),
                }
            }
            None => Reply::Skipped(format!("unexpected message type {message_type:#06x}")),
        };
        out.push(Incoming {
            seq,
            interrupted,
            reply,
        });
    }
    Ok(out)
}

/// The attributes in `buf`, as (type without flags, value).
fn attrs_of(buf: &[u8]) -> Result<Vec<(u16, &[u8])>, String> {
    NlasIterator::new(buf)
        .map(|nla| {
            let nla = nla.map_err(|e| e.to_string())?;
            let kind = nla.kind() & NLA_TYPE_MASK;
            // new_checked verified 4 <= length <= the buffer's size.
            let length = usize::from(nla.length());
            Ok((kind, nla.into_inner().get(4..length).unwrap_or_default()))
        })
        .collect()
}

fn top_level(attrs: &[DefaultNla], kind: u16) -> Option<&DefaultNla> {
    attrs.iter().find(|a| a.kind() & NLA_TYPE_MASK == kind)
}

fn value_of(nla: &DefaultNla) -> Vec<u8> {
    let mut out = vec![0; nla.value_len()];
    nla.emit_value(&mut out);
    out
}

fn fixed<const N: usize>(value: &[u8], name: &str) -> Result<[u8; N], String> {
    value
        .get(..N)
        .and_then(|v| v.try_into().ok())
        .ok_or_else(|| format!("{name} has {} bytes, expected {N}", value.len()))
}

fn find<'a>(attrs: &[(u16, &'a [u8])], kind: u16) -> Option<&'a [u8]> {
    attrs.iter().find(|(k, _)| *k == kind).map(|(_, v)| *v)
}

fn need<'a>(attrs: &[(u16, &'a [u8])], kind: u16, name: &str) -> Result<&'a [u8], String> {
    find(attrs, kind).ok_or_else(|| format!("no {name}"))
}

fn u16_of(v: &[u8], name: &str) -> Result<u16, String> {
    Ok(u16::from_ne_bytes(fixed(v, name)?))
}

fn be16_of(v: &[u8], name: &str) -> Result<u16, String> {
    Ok(u16::from_be_bytes(fixed(v, name)?))
}

fn u32_of(v: &[u8], name: &str) -> Result<u32, String> {
    Ok(u32::from_ne_bytes(fixed(v, name)?))
}

fn addr_of(v: &[u8], family: u16, name: &str) -> Result<IpAddr, String> {
    match family {
        AF_INET => Ok(IpAddr::V4(Ipv4Addr::from(fixed::<4>(v, name)?))),
        AF_INET6 => Ok(IpAddr::V6(Ipv6Addr::from(fixed::<16>(v, name)?))),
        f => Err(format!("{name} of unknown address family {f}")),
    }
}

/// The nested attributes of the top-level attribute `kind` of a message.
fn nest(payload: &IpvsPayload, kind: u16, name: &str) -> Result<Vec<u8>, String> {
    top_level(&payload.attrs, kind)
        .map(value_of)
        .ok_or_else(|| format!("message without {name}"))
}

/// A virtual server from a dump entry (`IPVS_CMD_NEW_SERVICE` with
/// `IPVS_CMD_ATTR_SERVICE`). Firewall-mark services are refused with a reason.
pub(crate) fn decode_service(payload: &IpvsPayload) -> Result<VirtualServer, String> {
    let value = nest(payload, CMD_ATTR_SERVICE, "IPVS_CMD_ATTR_SERVICE")?;
    let attrs = attrs_of(&value)?;
    let family = u16_of(
        need(&attrs, SVC_ATTR_AF, "IPVS_SVC_ATTR_AF")?,
        "IPVS_SVC_ATTR_AF",
    )?;
    if let Some(mark) = find(&attrs, SVC_ATTR_FWMARK) {
        let mark = u32_of(mark, "IPVS_SVC_ATTR_FWMARK")?;
        if mark != 0 {
            return Err(format!(
                "firewall-mark service (FWM {mark}) is not modelled"
            ));
        }
    }
    let protocol = u16_of(
        need(&attrs, SVC_ATTR_PROTOCOL, "IPVS_SVC_ATTR_PROTOCOL")?,
        "IPVS_SVC_ATTR_PROTOCOL",
    )?;
    let protocol =
        u8::try_from(protocol).map_err(|_| format!("protocol {protocol} out of range"))?;
    let addr = addr_of(
        need(&attrs, SVC_ATTR_ADDR, "IPVS_SVC_ATTR_ADDR")?,
        family,
        "IPVS_SVC_ATTR_ADDR",
    )?;
    let port = be16_of(
        need(&attrs, SVC_ATTR_PORT, "IPVS_SVC_ATTR_PORT")?,
        "IPVS_SVC_ATTR_PORT",
    )?;
    let sched = need(&attrs, SVC_ATTR_SCHED_NAME, "IPVS_SVC_ATTR_SCHED_NAME")?;
    let sched = sched.split(|b| *b == 0).next().unwrap_or_default();
    let scheduler = String::from_utf8_lossy(sched).into_owned();
    let flags = match find(&attrs, SVC_ATTR_FLAGS) {
        Some(v) => u32_of(v, "IPVS_SVC_ATTR_FLAGS")?,
        None => 0,
    };
    let timeout = match find(&attrs, SVC_ATTR_TIMEOUT) {
        Some(v) => u32_of(v, "IPVS_SVC_ATTR_TIMEOUT")?,
        None => 0,
    };
    let netmask = match find(&attrs, SVC_ATTR_NETMASK) {
        Some(v) => u32_of(v, "IPVS_SVC_ATTR_NETMASK")?,
        None => super::default_netmask(&addr),
    };
    Ok(VirtualServer {
        key: ServiceKey::new(addr, protocol, port),
        scheduler,
        flags,
        timeout,
        netmask,
    })
}

/// A real server from a dump entry (`IPVS_CMD_NEW_DEST` with `IPVS_CMD_ATTR_DEST`).
/// `service_addr` gives the family when the kernel sends no `IPVS_DEST_ATTR_ADDR_FAMILY`
/// (before Linux 3.18).
pub(crate) fn decode_dest(
    payload: &IpvsPayload,
    service_addr: &IpAddr,
) -> Result<RealServer, String> {
    let value = nest(payload, CMD_ATTR_DEST, "IPVS_CMD_ATTR_DEST")?;
    let attrs = attrs_of(&value)?;
    let family = match find(&attrs, DEST_ATTR_ADDR_FAMILY) {
        Some(v) => u16_of(v, "IPVS_DEST_ATTR_ADDR_FAMILY")?,
        None => af(service_addr),
    };
    let addr = addr_of(
        need(&attrs, DEST_ATTR_ADDR, "IPVS_DEST_ATTR_ADDR")?,
        family,
        "IPVS_DEST_ATTR_ADDR",
    )?;
    let port = be16_of(
        need(&attrs, DEST_ATTR_PORT, "IPVS_DEST_ATTR_PORT")?,
        "IPVS_DEST_ATTR_PORT",
    )?;
    let fwd = u32_of(
        need(&attrs, DEST_ATTR_FWD_METHOD, "IPVS_DEST_ATTR_FWD_METHOD")?,
        "IPVS_DEST_ATTR_FWD_METHOD",
    )?;
    let forward =
        Forward::from_code(fwd).ok_or_else(|| format!("unknown forwarding method {fwd}"))?;
    let weight = u32_of(
        need(&attrs, DEST_ATTR_WEIGHT, "IPVS_DEST_ATTR_WEIGHT")?,
        "IPVS_DEST_ATTR_WEIGHT",
    )?;
    let counter = |kind, name| match find(&attrs, kind) {
        Some(v) => u32_of(v, name),
        None => Ok(0),
    };
    Ok(RealServer {
        addr,
        port,
        weight,
        forward,
        active_conns: counter(DEST_ATTR_ACTIVE_CONNS, "IPVS_DEST_ATTR_ACTIVE_CONNS")?,
        inactive_conns: counter(DEST_ATTR_INACT_CONNS, "IPVS_DEST_ATTR_INACT_CONNS")?,
    })
}

/// The answer to `IPVS_CMD_GET_INFO` (`IPVS_CMD_SET_INFO` with top-level
/// `IPVS_INFO_ATTR_VERSION` and `IPVS_INFO_ATTR_CONN_TAB_SIZE`).
pub(crate) fn decode_info(payload: &IpvsPayload) -> Result<IpvsInfo, String> {
    if payload.cmd != CMD_SET_INFO {
        return Err(format!("command {} is not IPVS_CMD_SET_INFO", payload.cmd));
    }
    let version = top_level(&payload.attrs, INFO_ATTR_VERSION)
        .map(value_of)
        .ok_or("no IPVS_INFO_ATTR_VERSION")?;
    let size = top_level(&payload.attrs, INFO_ATTR_CONN_TAB_SIZE)
        .map(value_of)
        .ok_or("no IPVS_INFO_ATTR_CONN_TAB_SIZE")?;
    let [_, major, minor, patch] = u32_of(&version, "IPVS_INFO_ATTR_VERSION")?.to_be_bytes();
    Ok(IpvsInfo {
        version: (major, minor, patch),
        conn_table_size: u32_of(&size, "IPVS_INFO_ATTR_CONN_TAB_SIZE")?,
    })
}

/// The answer to `IPVS_CMD_GET_CONFIG` (`IPVS_CMD_SET_CONFIG` with top-level
/// timeouts). A timeout the kernel leaves out (its protocol is not built in) reads as 0.
pub(crate) fn decode_config(payload: &IpvsPayload) -> Result<IpvsTimeouts, String> {
    if payload.cmd != CMD_SET_CONFIG {
        return Err(format!(
            "command {} is not IPVS_CMD_SET_CONFIG",
            payload.cmd
        ));
    }
    let get = |kind, name| match top_level(&payload.attrs, kind) {
        Some(nla) => u32_of(&value_of(nla), name),
        None => Ok(0),
    };
    Ok(IpvsTimeouts {
        tcp: get(CMD_ATTR_TIMEOUT_TCP, "IPVS_CMD_ATTR_TIMEOUT_TCP")?,
        tcp_fin: get(CMD_ATTR_TIMEOUT_TCP_FIN, "IPVS_CMD_ATTR_TIMEOUT_TCP_FIN")?,
        udp: get(CMD_ATTR_TIMEOUT_UDP, "IPVS_CMD_ATTR_TIMEOUT_UDP")?,
    })
}

/// The family id in a controller answer (`CTRL_ATTR_FAMILY_ID`), decoded with the
/// `netlink-packet-generic` controller types, or by walking the attributes when those
/// refuse something a newer kernel added.
pub(crate) fn decode_family_id(payload: &[u8]) -> Result<u16, String> {
    if let Ok(message) = GenlMessage::<GenlCtrl>::parse_with_param(payload, GENL_ID_CTRL)
        && let Some(id) = message.payload.nlas.iter().find_map(|a| match a {
            GenlCtrlAttrs::FamilyId(id) => Some(*id),
            _ => None,
        })
    {
        return Ok(id);
    }
    let attrs = attrs_of(
        payload
            .get(4..)
            .ok_or("controller message shorter than genlmsghdr")?,
    )?;
    u16_of(
        need(&attrs, CTRL_ATTR_FAMILY_ID, "CTRL_ATTR_FAMILY_ID")?,
        "CTRL_ATTR_FAMILY_ID",
    )
}

#[cfg(test)]
mod kernel_tests;
#[cfg(test)]
mod tests;
