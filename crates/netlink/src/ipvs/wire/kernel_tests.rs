//! The decoder and encoder checked against datagrams a real kernel exchanged: Linux
//! 6.1 (Debian's `6.1.0-57-amd64`) in the `kp_testkit::vm` guest, recorded with
//! `Ipvs::set_capture` by the `golden_captures_of_a_known_table` trial of
//! `tests/kernel_vm.rs` (`KP_IPVS_PRINT_GOLDEN=1` prints them again) into
//! `src/ipvs/testdata/kernel_*.hex`.
//!
//! What they showed beyond the hand-written goldens of `tests.rs`: the kernel adds
//! `IPVS_SVC_ATTR_STATS64` (12) next to `_STATS`, and `IPVS_DEST_ATTR_TUN_TYPE` (13, u8),
//! `_TUN_PORT` (14), `_TUN_FLAGS` (15) and `_STATS64` (12) to every real server, all of
//! which the decoders skip; nests come without `NLA_F_NESTED`; `NLMSG_DONE` arrives in a
//! datagram of its own; several acknowledgements may share a datagram. The decoders
//! needed no change.

#![cfg(target_endian = "little")]

use std::net::{IpAddr, Ipv4Addr};

use super::tests::decode_everything;
use super::*;
use crate::flow::proto;
use crate::ipvs::{IpvsTimeouts, SVC_F_PERSISTENT, SVC_F_SCHED1, SVC_F_SCHED2, netmask_v4};

const APPLY: &str = include_str!("../testdata/kernel_apply.hex");
const SERVICES: &str = include_str!("../testdata/kernel_services_dump.hex");
const DESTS_API: &str = include_str!("../testdata/kernel_dests_api.hex");
const DESTS_DNS6: &str = include_str!("../testdata/kernel_dests_dns6.hex");
const INFO: &str = include_str!("../testdata/kernel_info.hex");
const CONFIG: &str = include_str!("../testdata/kernel_config.hex");

/// The datagrams of a capture file: `# datagram sent|received N bytes` starts one, hex
/// pairs follow; other `#` lines are comments.
fn datagrams(text: &str) -> Vec<(bool, Vec<u8>)> {
    let mut out: Vec<(bool, usize, Vec<u8>)> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# datagram ") {
            let mut words = rest.split(' ');
            let sent = words.next() == Some("sent");
            let len = words.next().and_then(|n| n.parse().ok()).expect("length");
            out.push((sent, len, Vec::new()));
        } else if !line.starts_with('#') {
            let (_, _, bytes) = out.last_mut().expect("a datagram header first");
            bytes.extend(
                line.split_whitespace()
                    .map(|b| u8::from_str_radix(b, 16).expect("hex byte")),
            );
        }
    }
    for (_, len, bytes) in &out {
        assert_eq!(*len, bytes.len(), "declared length");
    }
    out.into_iter().map(|(s, _, b)| (s, b)).collect()
}

/// The one request of a capture and every message of the datagrams received for it.
fn exchange(text: &str) -> (Vec<u8>, u16, Vec<Incoming>) {
    let all = datagrams(text);
    let (sent, request) = &all[0];
    assert!(sent);
    assert!(all[1..].iter().all(|(sent, _)| !sent));
    let family = u16::from_ne_bytes([request[4], request[5]]);
    let received = all[1..]
        .iter()
        .flat_map(|(_, bytes)| parse_datagram(bytes, family).expect("framing"))
        .collect();
    (request.clone(), family, received)
}

fn seq_of(request: &[u8]) -> u32 {
    u32::from_ne_bytes(request[8..12].try_into().unwrap())
}

fn payloads(messages: &[Incoming], seq: u32) -> Vec<IpvsPayload> {
    assert!(messages.iter().all(|m| m.seq == seq && !m.interrupted));
    messages
        .iter()
        .filter_map(|m| match &m.reply {
            Reply::Ipvs(p) => Some(p.clone()),
            _ => None,
        })
        .collect()
}

fn key(s: &str, protocol: u8) -> ServiceKey {
    let a: std::net::SocketAddr = s.parse().unwrap();
    ServiceKey::new(a.ip(), protocol, a.port())
}

fn api() -> VirtualServer {
    VirtualServer {
        netmask: netmask_v4(Ipv4Addr::new(255, 255, 255, 0)),
        ..VirtualServer::new(key("10.96.0.1:443", proto::TCP), "rr").persistent(10800)
    }
}

fn dns6() -> VirtualServer {
    VirtualServer {
        flags: SVC_F_SCHED1 | SVC_F_SCHED2,
        ..VirtualServer::new(key("[fd00:10:96::a]:53", proto::UDP), "sh")
    }
}

fn sctp() -> VirtualServer {
    VirtualServer::new(key("10.96.0.20:7777", proto::SCTP), "wlc")
}

fn rs(s: &str, weight: u32, forward: Forward) -> RealServer {
    let a: std::net::SocketAddr = s.parse().unwrap();
    RealServer {
        forward,
        ..RealServer::new(a.ip(), a.port(), weight)
    }
}

fn api_dests() -> [RealServer; 3] {
    [
        rs("192.168.56.10:6443", 1, Forward::Masq),
        rs("192.168.56.11:6443", 0, Forward::Route),
        rs("192.168.56.12:6443", 5, Forward::Tunnel),
    ]
}

fn dns6_dest() -> RealServer {
    rs("[fd00:10:244::5]:53", 3, Forward::Masq)
}

fn hashed(vs: VirtualServer) -> VirtualServer {
    VirtualServer {
        flags: vs.flags | SVC_F_HASHED,
        ..vs
    }
}

#[test]
fn the_kernels_services_dump_decodes_to_the_known_table() {
    let (request, family, messages) = exchange(SERVICES);
    assert_eq!(family, 0x20);
    assert_eq!(request, services_request(family, seq_of(&request)));
    assert_eq!(messages.last().map(|m| &m.reply), Some(&Reply::Done));
    let services: Vec<_> = payloads(&messages, seq_of(&request))
        .iter()
        .map(|p| decode_service(p).unwrap())
        .collect();
    // The kernel's hash order.
    assert_eq!(services, [hashed(dns6()), hashed(sctp()), hashed(api())]);
    assert_eq!(services[2].flags, SVC_F_PERSISTENT | SVC_F_HASHED);
}

#[test]
fn the_kernels_dest_dumps_decode_to_the_known_real_servers() {
    let (request, family, messages) = exchange(DESTS_API);
    assert_eq!(request, dests_request(family, &api().key, seq_of(&request)));
    assert_eq!(messages.last().map(|m| &m.reply), Some(&Reply::Done));
    let dests: Vec<_> = payloads(&messages, seq_of(&request))
        .iter()
        .map(|p| decode_dest(p, &api().key.addr).unwrap())
        .collect();
    // Newest first, connection counters 0.
    let mut want = api_dests().to_vec();
    want.reverse();
    assert_eq!(dests, want);

    let (request, family, messages) = exchange(DESTS_DNS6);
    assert_eq!(
        request,
        dests_request(family, &dns6().key, seq_of(&request))
    );
    let dests: Vec<_> = payloads(&messages, seq_of(&request))
        .iter()
        .map(|p| decode_dest(p, &dns6().key.addr).unwrap())
        .collect();
    assert_eq!(dests, [dns6_dest()]);
    // The family comes from IPVS_DEST_ATTR_ADDR_FAMILY, not from the service.
    let v4: IpAddr = "10.0.0.1".parse().unwrap();
    let p = &payloads(&messages, seq_of(&request))[0];
    assert_eq!(decode_dest(p, &v4).unwrap().addr, dns6_dest().addr);
}

#[test]
fn the_kernels_info_and_config_answers_decode() {
    let (request, family, messages) = exchange(INFO);
    assert_eq!(request, info_request(family, seq_of(&request)));
    let p = payloads(&messages, seq_of(&request));
    assert_eq!(
        decode_info(&p[0]),
        Ok(IpvsInfo {
            version: (1, 2, 1),
            conn_table_size: 4096
        })
    );
    assert_eq!(messages.last().map(|m| &m.reply), Some(&Reply::Ack));

    let (request, family, messages) = exchange(CONFIG);
    assert_eq!(request, get_config_request(family, seq_of(&request)));
    let p = payloads(&messages, seq_of(&request));
    assert_eq!(decode_config(&p[0]), Ok(IpvsTimeouts::new(3600, 120, 60)));
    assert_eq!(messages.last().map(|m| &m.reply), Some(&Reply::Ack));
}

/// The batch the kernel accepted is byte for byte what `op_request` encodes, and every
/// request of it was acknowledged.
#[test]
fn the_batch_the_kernel_accepted_is_what_we_encode() {
    let all = datagrams(APPLY);
    let (sent, batch) = &all[0];
    assert!(sent);
    let family = u16::from_ne_bytes([batch[4], batch[5]]);
    let first = seq_of(batch);
    let api = api();
    let dns6 = dns6();
    let mut ops = vec![
        IpvsOp::AddService(api.clone()),
        IpvsOp::AddService(dns6.clone()),
        IpvsOp::AddService(sctp()),
    ];
    ops.extend(api_dests().into_iter().map(|d| IpvsOp::AddDest(api.key, d)));
    ops.push(IpvsOp::AddDest(dns6.key, dns6_dest()));
    let encoded: Vec<u8> = ops
        .iter()
        .zip(first..)
        .flat_map(|(op, seq)| op_request(family, op, seq).unwrap())
        .collect();
    assert_eq!(*batch, encoded);

    let mut acked: Vec<u32> = all[1..]
        .iter()
        .flat_map(|(sent, bytes)| {
            assert!(!sent);
            parse_datagram(bytes, family).unwrap()
        })
        .map(|m| {
            assert_eq!(m.reply, Reply::Ack);
            m.seq
        })
        .collect();
    acked.sort();
    assert_eq!(acked, (first..first + ops.len() as u32).collect::<Vec<_>>());
}

/// Every received datagram, with each byte flipped and cut at each length: no panic.
#[test]
fn corrupted_kernel_answers_never_panic() {
    for text in [SERVICES, DESTS_API, DESTS_DNS6, INFO, CONFIG, APPLY] {
        for (_, golden) in datagrams(text) {
            for i in 0..golden.len() {
                for flip in [0x01u8, 0x80, 0xff] {
                    let mut corrupt = golden.clone();
                    corrupt[i] ^= flip;
                    decode_everything(&corrupt);
                }
                decode_everything(&golden[..i]);
            }
        }
    }
}
