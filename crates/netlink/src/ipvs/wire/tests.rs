//! Golden-byte tests of the IPVS wire format.
//!
//! The expected bytes are written out by hand from the UAPI headers, not produced by the
//! code under test: `struct nlmsghdr` (len u32, type u16, flags u16, seq u32, pid u32,
//! host order: these tests run on little-endian hosts), `struct genlmsghdr` (cmd u8,
//! version u8, reserved u16), and attributes as `struct nlattr` (len u16 counting the
//! 4-byte header but not the padding to 4 bytes, type u16 with `NLA_F_NESTED` = 0x8000
//! on our nests) numbered as in `include/uapi/linux/ip_vs.h` (`IPVS_CMD_*`,
//! `IPVS_CMD_ATTR_*`, `IPVS_SVC_ATTR_*`, `IPVS_DEST_ATTR_*`, `IPVS_INFO_ATTR_*`) and
//! `linux/genetlink.h` (`CTRL_CMD_GETFAMILY` = 3, `CTRL_ATTR_FAMILY_ID` = 1,
//! `CTRL_ATTR_FAMILY_NAME` = 2, `GENL_ID_CTRL` = 0x10). Reply goldens are laid out the
//! way `ip_vs_genl_fill_service` / `ip_vs_genl_fill_dest` / `ip_vs_genl_get_cmd` emit
//! them (nests without `NLA_F_NESTED`, the full 16-byte address, `FLAGS` with mask
//! `~0`, stats nests the decoder must skip). Goldens captured from a real kernel are in
//! `kernel_tests.rs`.

#![cfg(target_endian = "little")]

use std::net::{IpAddr, Ipv4Addr};

use proptest::prelude::*;

use super::*;
use crate::flow::proto;
use crate::ipvs::{IpvsTimeouts, SVC_F_PERSISTENT, netmask_v4};

const FAMILY: u16 = 0x25;

/// 12 zero bytes: the rest of an IPv4 `union nf_inet_addr`.
const PAD12: [u8; 12] = [0; 12];

fn api() -> ServiceKey {
    ServiceKey::new("10.96.0.1".parse().unwrap(), proto::TCP, 443)
}

fn dns6() -> ServiceKey {
    ServiceKey::new("fd00::a".parse().unwrap(), proto::UDP, 53)
}

fn backend() -> RealServer {
    RealServer::new("192.168.56.10".parse().unwrap(), 6443, 1)
}

/// The key nest of `api()`: 48 bytes.
#[rustfmt::skip]
fn api_key_nest() -> Vec<u8> {
    [
        &[0x30, 0x00, 0x01, 0x80][..],                 // IPVS_CMD_ATTR_SERVICE | NESTED, 48
        &[0x06, 0x00, 0x01, 0x00, 0x02, 0x00, 0, 0],   //   SVC_ATTR_AF AF_INET
        &[0x06, 0x00, 0x02, 0x00, 0x06, 0x00, 0, 0],   //   SVC_ATTR_PROTOCOL TCP
        &[0x14, 0x00, 0x03, 0x00, 10, 96, 0, 1],       //   SVC_ATTR_ADDR, 16 bytes
        &PAD12,
        &[0x06, 0x00, 0x04, 0x00, 0x01, 0xbb, 0, 0],   //   SVC_ATTR_PORT 443, network order
    ]
    .concat()
}

#[test]
#[rustfmt::skip]
fn add_service_golden() {
    let expected = [
        &[0x68, 0, 0, 0][..],                          // nlmsg_len 104
        &[0x25, 0x00, 0x05, 0x00],                     // type: family id; NLM_F_REQUEST | NLM_F_ACK
        &[1, 0, 0, 0, 0, 0, 0, 0],                     // seq 1, pid 0
        &[0x01, 0x01, 0, 0],                           // IPVS_CMD_NEW_SERVICE, version 1
        &[0x54, 0x00, 0x01, 0x80],                     // IPVS_CMD_ATTR_SERVICE | NESTED, 84
        &[0x06, 0x00, 0x01, 0x00, 0x02, 0x00, 0, 0],   //   AF
        &[0x06, 0x00, 0x02, 0x00, 0x06, 0x00, 0, 0],   //   PROTOCOL
        &[0x14, 0x00, 0x03, 0x00, 10, 96, 0, 1],       //   ADDR
        &PAD12,
        &[0x06, 0x00, 0x04, 0x00, 0x01, 0xbb, 0, 0],   //   PORT
        &[0x07, 0x00, 0x06, 0x00, b'r', b'r', 0, 0],   //   SCHED_NAME "rr\0" + 1 pad
        &[0x0c, 0x00, 0x07, 0x00, 0, 0, 0, 0],         //   FLAGS: flags 0,
        &[0xff, 0xff, 0xff, 0xff],                     //          mask ~0
        &[0x08, 0x00, 0x08, 0x00, 0, 0, 0, 0],         //   TIMEOUT 0
        &[0x08, 0x00, 0x09, 0x00, 0xff, 0xff, 0xff, 0xff], // NETMASK 255.255.255.255
    ]
    .concat();
    let op = IpvsOp::AddService(VirtualServer::new(api(), "rr"));
    assert_eq!(op_request(FAMILY, &op, 1).unwrap(), expected);

    // SET_SERVICE differs in the command only; the kernel-set HASHED flag is never sent.
    let mut edit = expected.clone();
    edit[16] = CMD_SET_SERVICE;
    let mut vs = VirtualServer::new(api(), "rr");
    vs.flags = SVC_F_HASHED;
    assert_eq!(op_request(FAMILY, &IpvsOp::EditService(vs), 1).unwrap(), edit);

    // Persistence: flags 1, timeout 10800 (0x2a30), a /24 granularity.
    let mut vs = VirtualServer::new(api(), "rr").persistent(10800);
    vs.netmask = netmask_v4(Ipv4Addr::new(255, 255, 255, 0));
    let bytes = op_request(FAMILY, &IpvsOp::AddService(vs), 1).unwrap();
    assert_eq!(bytes[80..84], [1, 0, 0, 0]);
    assert_eq!(bytes[92..96], [0x30, 0x2a, 0, 0]);
    assert_eq!(bytes[100..104], [255, 255, 255, 0]);
}

#[test]
#[rustfmt::skip]
fn add_dest_golden() {
    let expected = [
        &[0x8c, 0, 0, 0][..],                          // nlmsg_len 140
        &[0x25, 0x00, 0x05, 0x00],
        &[2, 0, 0, 0, 0, 0, 0, 0],                     // seq 2
        &[0x05, 0x01, 0, 0],                           // IPVS_CMD_NEW_DEST
        &api_key_nest(),
        &[0x48, 0x00, 0x02, 0x80],                     // IPVS_CMD_ATTR_DEST | NESTED, 72
        &[0x14, 0x00, 0x01, 0x00, 192, 168, 56, 10],   //   DEST_ATTR_ADDR
        &PAD12,
        &[0x06, 0x00, 0x02, 0x00, 0x19, 0x2b, 0, 0],   //   DEST_ATTR_PORT 6443
        &[0x08, 0x00, 0x03, 0x00, 0, 0, 0, 0],         //   FWD_METHOD masq
        &[0x08, 0x00, 0x04, 0x00, 1, 0, 0, 0],         //   WEIGHT 1
        &[0x08, 0x00, 0x05, 0x00, 0, 0, 0, 0],         //   U_THRESH 0
        &[0x08, 0x00, 0x06, 0x00, 0, 0, 0, 0],         //   L_THRESH 0
        &[0x06, 0x00, 0x0b, 0x00, 0x02, 0x00, 0, 0],   //   ADDR_FAMILY AF_INET
    ]
    .concat();
    assert_eq!(op_request(FAMILY, &IpvsOp::AddDest(api(), backend()), 2).unwrap(), expected);

    let mut edit = expected.clone();
    edit[16] = CMD_SET_DEST;
    // Counters are not sent.
    let busy = RealServer { active_conns: 5, inactive_conns: 6, ..backend() };
    assert_eq!(op_request(FAMILY, &IpvsOp::EditDest(api(), busy), 2).unwrap(), edit);

    // Route (3) and weight 0 land in their attributes.
    let routed = RealServer { forward: Forward::Route, weight: 0, ..backend() };
    let bytes = op_request(FAMILY, &IpvsOp::AddDest(api(), routed), 2).unwrap();
    assert_eq!(bytes[104..108], [3, 0, 0, 0]); // FWD_METHOD value
    assert_eq!(bytes[112..116], [0, 0, 0, 0]); // WEIGHT value
}

#[test]
#[rustfmt::skip]
fn delete_goldens() {
    let expected = [
        &[0x44, 0, 0, 0][..],                          // nlmsg_len 68
        &[0x25, 0x00, 0x05, 0x00],
        &[3, 0, 0, 0, 0, 0, 0, 0],
        &[0x03, 0x01, 0, 0],                           // IPVS_CMD_DEL_SERVICE
        &[0x30, 0x00, 0x01, 0x80],                     // service nest, 48
        &[0x06, 0x00, 0x01, 0x00, 0x0a, 0x00, 0, 0],   //   AF_INET6
        &[0x06, 0x00, 0x02, 0x00, 0x11, 0x00, 0, 0],   //   UDP
        &[0x14, 0x00, 0x03, 0x00, 0xfd, 0, 0, 0],      //   fd00::a
        &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x0a],
        &[0x06, 0x00, 0x04, 0x00, 0x00, 0x35, 0, 0],   //   port 53
    ]
    .concat();
    assert_eq!(op_request(FAMILY, &IpvsOp::DelService(dns6()), 3).unwrap(), expected);

    let expected = [
        &[0x6c, 0, 0, 0][..],                          // nlmsg_len 108
        &[0x25, 0x00, 0x05, 0x00],
        &[4, 0, 0, 0, 0, 0, 0, 0],
        &[0x07, 0x01, 0, 0],                           // IPVS_CMD_DEL_DEST
        &api_key_nest(),
        &[0x28, 0x00, 0x02, 0x80],                     // dest nest, 40
        &[0x14, 0x00, 0x01, 0x00, 192, 168, 56, 10],
        &PAD12,
        &[0x06, 0x00, 0x02, 0x00, 0x19, 0x2b, 0, 0],
        &[0x06, 0x00, 0x0b, 0x00, 0x02, 0x00, 0, 0],
    ]
    .concat();
    let op = IpvsOp::DelDest(api(), backend().socket_addr());
    assert_eq!(op_request(FAMILY, &op, 4).unwrap(), expected);
}

#[test]
#[rustfmt::skip]
fn dump_info_flush_and_family_goldens() {
    // IPVS_CMD_GET_SERVICE, NLM_F_REQUEST | NLM_F_DUMP (0x301), no attributes.
    let services = [0x14, 0, 0, 0, 0x25, 0, 0x01, 0x03, 5, 0, 0, 0, 0, 0, 0, 0, 0x04, 0x01, 0, 0];
    assert_eq!(services_request(FAMILY, 5), services);
    // IPVS_CMD_GET_DEST with the key.
    let dests = [
        &[0x44, 0, 0, 0, 0x25, 0, 0x01, 0x03, 6, 0, 0, 0, 0, 0, 0, 0, 0x08, 0x01, 0, 0][..],
        &api_key_nest(),
    ]
    .concat();
    assert_eq!(dests_request(FAMILY, &api(), 6), dests);
    let info = [0x14, 0, 0, 0, 0x25, 0, 0x05, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0x0f, 0x01, 0, 0];
    assert_eq!(info_request(FAMILY, 7), info);
    let flush = [0x14, 0, 0, 0, 0x25, 0, 0x05, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0x11, 0x01, 0, 0];
    assert_eq!(flush_request(FAMILY, 8), flush);
    // CTRL_CMD_GETFAMILY (version 2) to GENL_ID_CTRL with CTRL_ATTR_FAMILY_NAME "IPVS".
    let family = [
        0x20, 0, 0, 0, 0x10, 0x00, 0x05, 0x00, 9, 0, 0, 0, 0, 0, 0, 0,
        0x03, 0x02, 0, 0,
        0x09, 0x00, 0x02, 0x00, b'I', b'P', b'V', b'S', 0, 0, 0, 0,
    ];
    assert_eq!(family_request(9), family);
}

#[test]
#[rustfmt::skip]
fn timeout_config_goldens() {
    // IPVS_CMD_GET_CONFIG (13), NLM_F_REQUEST | NLM_F_ACK, no attributes.
    let get = [0x14, 0, 0, 0, 0x25, 0, 0x05, 0, 10, 0, 0, 0, 0, 0, 0, 0, 0x0d, 0x01, 0, 0];
    assert_eq!(get_config_request(FAMILY, 10), get);
    // IPVS_CMD_SET_CONFIG (12) with all three u32s, like `ipvsadm --set 3600 0 300`.
    let set = [
        &[0x2c, 0, 0, 0, 0x25, 0, 0x05, 0, 11, 0, 0, 0, 0, 0, 0, 0][..], // 44 bytes
        &[0x0c, 0x01, 0, 0],                           // IPVS_CMD_SET_CONFIG
        &[0x08, 0x00, 0x04, 0x00, 0x10, 0x0e, 0, 0],   // TIMEOUT_TCP 3600
        &[0x08, 0x00, 0x05, 0x00, 0, 0, 0, 0],         // TIMEOUT_TCP_FIN 0: unchanged
        &[0x08, 0x00, 0x06, 0x00, 0x2c, 0x01, 0, 0],   // TIMEOUT_UDP 300
    ]
    .concat();
    assert_eq!(set_config_request(FAMILY, &IpvsTimeouts::new(3600, 0, 300), 11), set);

    // The kernel's answer to GET_CONFIG (`ip_vs_genl_get_cmd`): SET_CONFIG with the
    // three timeouts, then the acknowledgement.
    let reply = [
        &[0x2c, 0, 0, 0, 0x25, 0, 0, 0, 10, 0, 0, 0, 0x34, 0x12, 0, 0][..],
        &[0x0c, 0x01, 0, 0],
        &[0x08, 0x00, 0x04, 0x00, 0x84, 0x03, 0, 0],   // 900
        &[0x08, 0x00, 0x05, 0x00, 0x78, 0, 0, 0],      // 120
        &[0x08, 0x00, 0x06, 0x00, 0x2c, 0x01, 0, 0],   // 300
        &[0x24, 0, 0, 0, 0x02, 0, 0x00, 0x01, 10, 0, 0, 0, 0x34, 0x12, 0, 0],
        &[0, 0, 0, 0],
        &get[..16],                                    // the request's header (NLM_F_CAPPED)
    ]
    .concat();
    let messages = parse_datagram(&reply, FAMILY).unwrap();
    assert_eq!(messages.len(), 2);
    let Reply::Ipvs(payload) = &messages[0].reply else {
        panic!("{messages:?}");
    };
    assert_eq!(decode_config(payload), Ok(IpvsTimeouts::KERNEL_DEFAULTS));
    assert_eq!(messages[1].reply, Reply::Ack);

    // Without UDP built in, the kernel leaves IPVS_CMD_ATTR_TIMEOUT_UDP out: 0.
    let mut no_udp = reply[..36].to_vec();
    no_udp[0] = 0x24;
    let messages = parse_datagram(&no_udp, FAMILY).unwrap();
    let Reply::Ipvs(payload) = &messages[0].reply else {
        panic!("{messages:?}");
    };
    assert_eq!(decode_config(payload), Ok(IpvsTimeouts::new(900, 120, 0)));
    // Another command, or a short value, is refused.
    let info = IpvsPayload { cmd: CMD_SET_INFO, attrs: Vec::new() };
    assert!(decode_config(&info).is_err());
    let short = IpvsPayload {
        cmd: CMD_SET_CONFIG,
        attrs: vec![DefaultNla::new(CMD_ATTR_TIMEOUT_TCP, vec![1, 2])],
    };
    assert!(decode_config(&short).unwrap_err().contains("TIMEOUT_TCP"));
}

#[test]
fn unencodable_ops_are_refused_before_sending() {
    let long = IpvsOp::AddService(VirtualServer::new(api(), "sixteen-chars-xx"));
    assert_eq!(op_request(FAMILY, &long, 1), Err(Errno::EINVAL));
    let fifteen = IpvsOp::AddService(VirtualServer::new(api(), "fifteen-chars-x"));
    assert!(op_request(FAMILY, &fifteen, 1).is_ok());
}

/// A services dump datagram: a persistent IPv4 service with a stats nest, an IPv6 one,
/// a firewall-mark service, and `NLMSG_DONE`; seq 7, `NLM_F_MULTI`.
#[rustfmt::skip]
fn services_dump() -> Vec<u8> {
    [
        &[0x7c, 0, 0, 0, 0x25, 0, 0x02, 0, 7, 0, 0, 0, 0x34, 0x12, 0, 0][..], // 124 bytes
        &[0x01, 0x01, 0, 0],                           // IPVS_CMD_NEW_SERVICE
        &[0x68, 0x00, 0x01, 0x00],                     // service nest (no NESTED flag), 104
        &[0x06, 0x00, 0x01, 0x00, 0x02, 0x00, 0, 0],
        &[0x06, 0x00, 0x02, 0x00, 0x06, 0x00, 0, 0],
        &[0x14, 0x00, 0x03, 0x00, 10, 96, 0, 1],
        &PAD12,
        &[0x06, 0x00, 0x04, 0x00, 0x01, 0xbb, 0, 0],
        &[0x07, 0x00, 0x06, 0x00, b'r', b'r', 0, 0],
        &[0x0c, 0x00, 0x07, 0x00, 0x03, 0, 0, 0, 0xff, 0xff, 0xff, 0xff], // PERSISTENT|HASHED
        &[0x08, 0x00, 0x08, 0x00, 0x30, 0x2a, 0, 0],   // timeout 10800
        &[0x08, 0x00, 0x09, 0x00, 0xff, 0xff, 0xff, 0xff],
        &[0x14, 0x00, 0x0a, 0x00],                     // IPVS_SVC_ATTR_STATS, 20
        &[0x08, 0x00, 0x01, 0x00, 5, 0, 0, 0],         //   CONNS 5
        &[0x08, 0x00, 0x02, 0x00, 9, 0, 0, 0],         //   INPKTS 9

        &[0x68, 0, 0, 0, 0x25, 0, 0x02, 0, 7, 0, 0, 0, 0x34, 0x12, 0, 0], // 104 bytes
        &[0x01, 0x01, 0, 0],
        &[0x54, 0x00, 0x01, 0x00],                     // 84
        &[0x06, 0x00, 0x01, 0x00, 0x0a, 0x00, 0, 0],
        &[0x06, 0x00, 0x02, 0x00, 0x11, 0x00, 0, 0],
        &[0x14, 0x00, 0x03, 0x00, 0xfd, 0, 0, 0],
        &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x0a],
        &[0x06, 0x00, 0x04, 0x00, 0x00, 0x35, 0, 0],
        &[0x07, 0x00, 0x06, 0x00, b's', b'h', 0, 0],
        &[0x0c, 0x00, 0x07, 0x00, 0x02, 0, 0, 0, 0xff, 0xff, 0xff, 0xff],
        &[0x08, 0x00, 0x08, 0x00, 0, 0, 0, 0],
        &[0x08, 0x00, 0x09, 0x00, 0x80, 0, 0, 0],      // netmask 128

        &[0x30, 0, 0, 0, 0x25, 0, 0x02, 0, 7, 0, 0, 0, 0x34, 0x12, 0, 0], // 48 bytes
        &[0x01, 0x01, 0, 0],
        &[0x1c, 0x00, 0x01, 0x00],                     // 28
        &[0x06, 0x00, 0x01, 0x00, 0x02, 0x00, 0, 0],
        &[0x08, 0x00, 0x05, 0x00, 1, 0, 0, 0],         // FWMARK 1
        &[0x07, 0x00, 0x06, 0x00, b'r', b'r', 0, 0],

        &[0x14, 0, 0, 0, 0x03, 0, 0x02, 0, 7, 0, 0, 0, 0x34, 0x12, 0, 0], // NLMSG_DONE
        &[0, 0, 0, 0],
    ]
    .concat()
}

#[test]
fn services_dump_is_decoded() {
    let bytes = services_dump();
    let messages = parse_datagram(&bytes, FAMILY).unwrap();
    assert_eq!(messages.len(), 4);
    assert!(messages.iter().all(|m| m.seq == 7 && !m.interrupted));
    assert_eq!(messages[3].reply, Reply::Done);
    let payload = |i: usize| match &messages[i].reply {
        Reply::Ipvs(p) => p.clone(),
        other => panic!("{other:?}"),
    };
    let first = decode_service(&payload(0)).unwrap();
    assert_eq!(
        first,
        VirtualServer {
            flags: SVC_F_PERSISTENT | SVC_F_HASHED,
            ..VirtualServer::new(api(), "rr").persistent(10800)
        }
    );
    let second = decode_service(&payload(1)).unwrap();
    assert_eq!(
        second,
        VirtualServer {
            flags: SVC_F_HASHED,
            ..VirtualServer::new(dns6(), "sh")
        }
    );
    let fwmark = decode_service(&payload(2)).unwrap_err();
    assert!(fwmark.contains("FWM 1"), "{fwmark}");

    // Another family id makes them foreign; the framing still holds.
    let foreign = parse_datagram(&bytes, 0x26).unwrap();
    assert!(matches!(foreign[0].reply, Reply::Skipped(_)));
}

#[rustfmt::skip]
fn dest_entry() -> Vec<u8> {
    [
        &[0x74, 0, 0, 0, 0x25, 0, 0x02, 0, 8, 0, 0, 0, 0x34, 0x12, 0, 0][..], // 116 bytes
        &[0x05, 0x01, 0, 0],                           // IPVS_CMD_NEW_DEST
        &[0x60, 0x00, 0x02, 0x00],                     // dest nest, 96
        &[0x14, 0x00, 0x01, 0x00, 192, 168, 56, 10],
        &PAD12,
        &[0x06, 0x00, 0x02, 0x00, 0x19, 0x2b, 0, 0],
        &[0x08, 0x00, 0x03, 0x00, 0, 0, 0, 0],         // masq
        &[0x08, 0x00, 0x04, 0x00, 1, 0, 0, 0],         // weight 1
        &[0x08, 0x00, 0x05, 0x00, 0, 0, 0, 0],
        &[0x08, 0x00, 0x06, 0x00, 0, 0, 0, 0],
        &[0x08, 0x00, 0x07, 0x00, 2, 0, 0, 0],         // ACTIVE_CONNS 2
        &[0x08, 0x00, 0x08, 0x00, 0x11, 0, 0, 0],      // INACT_CONNS 17
        &[0x08, 0x00, 0x09, 0x00, 0, 0, 0, 0],         // PERSIST_CONNS
        &[0x06, 0x00, 0x0b, 0x00, 0x02, 0x00, 0, 0],   // ADDR_FAMILY
    ]
    .concat()
}

#[test]
fn dest_dump_is_decoded() {
    let bytes = dest_entry();
    let messages = parse_datagram(&bytes, FAMILY).unwrap();
    let Reply::Ipvs(payload) = &messages[0].reply else {
        panic!("{messages:?}");
    };
    let rs = decode_dest(payload, &api().addr).unwrap();
    assert_eq!(
        rs,
        RealServer {
            active_conns: 2,
            inactive_conns: 17,
            ..backend()
        }
    );

    // Without IPVS_DEST_ATTR_ADDR_FAMILY (kernels before 3.18) the service's family
    // applies: drop the last attribute and fix the lengths.
    let mut old = bytes[..bytes.len() - 8].to_vec();
    old[0] -= 8;
    old[20] -= 8;
    let messages = parse_datagram(&old, FAMILY).unwrap();
    let Reply::Ipvs(payload) = &messages[0].reply else {
        panic!("{messages:?}");
    };
    assert_eq!(
        decode_dest(payload, &api().addr).unwrap().addr,
        backend().addr
    );
    let v6: IpAddr = "fd00::1".parse().unwrap();
    let as_v6 = decode_dest(payload, &v6).unwrap();
    assert!(as_v6.addr.is_ipv6());

    // An unknown forwarding method is refused, not guessed.
    let mut odd = bytes.clone();
    odd[56] = 7;
    let messages = parse_datagram(&odd, FAMILY).unwrap();
    let Reply::Ipvs(payload) = &messages[0].reply else {
        panic!("{messages:?}");
    };
    assert!(
        decode_dest(payload, &api().addr)
            .unwrap_err()
            .contains("forwarding")
    );
}

#[test]
#[rustfmt::skip]
fn info_acks_errors_and_the_family_are_decoded() {
    let info = [
        &[0x24, 0, 0, 0, 0x25, 0, 0, 0, 7, 0, 0, 0, 0x34, 0x12, 0, 0][..],
        &[0x0e, 0x01, 0, 0],                           // IPVS_CMD_SET_INFO
        &[0x08, 0x00, 0x01, 0x00, 0x01, 0x02, 0x01, 0x00], // VERSION 0x010201
        &[0x08, 0x00, 0x02, 0x00, 0x00, 0x10, 0, 0],   // CONN_TAB_SIZE 4096
        // NLMSG_ERROR 0 (an ack), NLM_F_CAPPED: the request's header only.
        &[0x24, 0, 0, 0, 0x02, 0, 0x00, 0x01, 7, 0, 0, 0, 0x34, 0x12, 0, 0],
        &[0, 0, 0, 0],
        &[0x14, 0, 0, 0, 0x25, 0, 0x05, 0, 7, 0, 0, 0, 0, 0, 0, 0],
    ]
    .concat();
    let messages = parse_datagram(&info, FAMILY).unwrap();
    assert_eq!(messages.len(), 2);
    let Reply::Ipvs(payload) = &messages[0].reply else {
        panic!("{messages:?}");
    };
    assert_eq!(
        decode_info(payload).unwrap(),
        IpvsInfo { version: (1, 2, 1), conn_table_size: 4096 }
    );
    assert_eq!(messages[1].reply, Reply::Ack);

    let mut esrch = info[36..].to_vec();
    esrch[16..20].copy_from_slice(&(-3i32).to_ne_bytes());
    assert_eq!(parse_datagram(&esrch, FAMILY).unwrap()[0].reply, Reply::Error(3));

    let family = [
        &[0x40, 0, 0, 0, 0x10, 0, 0, 0, 9, 0, 0, 0, 0x34, 0x12, 0, 0][..],
        &[0x01, 0x02, 0, 0],                           // CTRL_CMD_NEWFAMILY
        &[0x06, 0x00, 0x01, 0x00, 0x25, 0x00, 0, 0],   // FAMILY_ID
        &[0x09, 0x00, 0x02, 0x00, b'I', b'P', b'V', b'S', 0, 0, 0, 0],
        &[0x08, 0x00, 0x03, 0x00, 1, 0, 0, 0],         // VERSION
        &[0x08, 0x00, 0x04, 0x00, 0, 0, 0, 0],         // HDRSIZE
        &[0x08, 0x00, 0x05, 0x00, 2, 0, 0, 0],         // MAXATTR
    ]
    .concat();
    let messages = parse_datagram(&family, 0).unwrap();
    let Reply::Ctrl(payload) = &messages[0].reply else {
        panic!("{messages:?}");
    };
    assert_eq!(decode_family_id(payload), Ok(0x25));
    // An attribute the controller types do not know (0x3ff) leaves the fallback.
    let mut newer = payload.clone();
    newer.extend([0x08, 0x00, 0xff, 0x03, 1, 2, 3, 4]);
    assert_eq!(decode_family_id(&newer), Ok(0x25));
    assert!(decode_family_id(&payload[..4]).is_err());
}

#[test]
fn broken_framing_is_an_error() {
    let mut bytes = services_dump();
    bytes[0] = 0xff; // longer than the datagram
    assert!(parse_datagram(&bytes, FAMILY).is_err());
    let mut short = services_dump();
    short[0] = 8; // shorter than nlmsghdr
    short[1] = 0;
    assert!(parse_datagram(&short, FAMILY).is_err());
}

/// Every decoder run over one datagram; results are dropped: only panics matter.
pub(super) fn decode_everything(bytes: &[u8]) {
    let addr: IpAddr = "10.0.0.1".parse().unwrap();
    if let Ok(messages) = parse_datagram(bytes, FAMILY) {
        for m in messages {
            match m.reply {
                Reply::Ipvs(p) => {
                    let _ = decode_service(&p);
                    let _ = decode_dest(&p, &addr);
                    let _ = decode_info(&p);
                    let _ = decode_config(&p);
                }
                Reply::Ctrl(p) => {
                    let _ = decode_family_id(&p);
                }
                _ => {}
            }
        }
    }
}

#[test]
fn corrupted_goldens_never_panic() {
    for golden in [services_dump(), dest_entry()] {
        for i in 0..golden.len() {
            for flip in [0x01u8, 0x04, 0x80, 0xff] {
                let mut corrupt = golden.clone();
                corrupt[i] ^= flip;
                decode_everything(&corrupt);
                decode_everything(&corrupt[..i]);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        decode_everything(&bytes);
        let _ = decode_family_id(&bytes);
    }

    #[test]
    fn arbitrary_attributes_in_a_valid_frame_never_panic(
        cmd in any::<u8>(),
        body in prop::collection::vec(any::<u8>(), 0..256),
    ) {
        // A well-framed IPVS message whose attribute area is random.
        let len = 20 + body.len();
        let mut bytes = Vec::with_capacity(len);
        bytes.extend((len as u32).to_ne_bytes());
        bytes.extend(FAMILY.to_ne_bytes());
        bytes.extend([0x02, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
        bytes.extend([cmd, 1, 0, 0]);
        bytes.extend(&body);
        decode_everything(&bytes);
    }

    #[test]
    fn encoded_services_and_dests_decode_back(
        a in any::<[u8; 16]>(), v4 in any::<bool>(), port in any::<u16>(),
        protocol in prop::sample::select(vec![proto::TCP, proto::UDP, proto::SCTP]),
        sched in "[a-z]{1,15}", flags in any::<u32>(), timeout in any::<u32>(),
        netmask in any::<u32>(), weight in any::<u32>(), fwd in 0u32..5,
    ) {
        let addr = if v4 {
            IpAddr::from([a[0], a[1], a[2], a[3]])
        } else {
            IpAddr::from(a)
        };
        let key = ServiceKey::new(addr, protocol, port);
        let vs = VirtualServer { key, scheduler: sched, flags: flags & !SVC_F_HASHED, timeout, netmask };
        let bytes = op_request(FAMILY, &IpvsOp::AddService(vs.clone()), 1).unwrap();
        let messages = parse_datagram(&bytes, FAMILY).unwrap();
        let Reply::Ipvs(p) = &messages[0].reply else { panic!("{messages:?}") };
        prop_assert_eq!(decode_service(p).unwrap(), vs);

        let rs = RealServer {
            forward: Forward::from_code(fwd).unwrap(),
            ..RealServer::new(addr, port.wrapping_add(1), weight)
        };
        let bytes = op_request(FAMILY, &IpvsOp::AddDest(key, rs.clone()), 2).unwrap();
        let messages = parse_datagram(&bytes, FAMILY).unwrap();
        let Reply::Ipvs(p) = &messages[0].reply else { panic!("{messages:?}") };
        prop_assert_eq!(decode_dest(p, &addr).unwrap(), rs);
    }
}
