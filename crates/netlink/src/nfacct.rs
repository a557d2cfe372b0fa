//! nfacct: the kernel's named packet/byte counters (`nfnetlink_acct`), which iptables rules
//! feed with `-m nfacct --nfacct-name NAME` and which kube-proxy's iptables mode reads for
//! two of its metrics (upstream `pkg/proxy/util/nfacct`).
//!
//! * [`NfacctOps`]: the seam: [`get`](NfacctOps::get) a counter by name,
//!   [`add`](NfacctOps::add) one, [`ensure`](NfacctOps::ensure) it exists (get, then add when
//!   missing: upstream's `Ensure`).
//! * [`Nfacct`]: the kernel's counters of the calling thread's network namespace (nfacct
//!   objects are per namespace), over a `NETLINK_NETFILTER` socket.
//! * [`FakeNfacct`]: an in-memory set of counters with the kernel's semantics, for tests.
//!
//! The messages are nfnetlink messages of subsystem `NFNL_SUBSYS_ACCT` (7), as
//! `linux/netfilter/nfnetlink_acct.h` defines them:
//!
//! * add: `NFNL_MSG_ACCT_NEW` with `NLM_F_REQUEST | NLM_F_CREATE | NLM_F_ACK` and
//!   `NFACCT_NAME`; the kernel answers `EBUSY` when the name exists (its counters are kept);
//! * get: `NFNL_MSG_ACCT_GET` with `NLM_F_REQUEST | NLM_F_ACK` and `NFACCT_NAME`; the kernel
//!   answers one `NFNL_MSG_ACCT_NEW` message (`NFACCT_NAME`, `NFACCT_PKTS`, `NFACCT_BYTES`
//!   as big-endian u64, `NFACCT_USE`, ...) and the ACK, or `ENOENT` for an unknown name.
//!
//! `nfgenmsg.nfgen_family` is `AF_UNSPEC`, as the kernel's own replies and the `nfacct`
//! tool (libnetfilter_acct) use; the kernel ignores it for this subsystem.
//!
//! No maintained crate speaks this subsystem: `netlink-packet-netfilter` (0.4, the newest)
//! decodes ctnetlink, nflog and nftables and hands other subsystems over as raw attributes
//! ([`NetfilterMessageInner::Other`]). This module uses that generic form for both
//! directions (framing, the nfgenmsg header and the attribute layout come from the crate),
//! and the crate's socket ([`crate::nfsocket`]) shared with [`crate::Conntrack`]; what it
//! adds is the subsystem's message types and attribute numbers and the request/reply loop.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use netlink_packet_core::{
    DefaultNla, NLM_F_ACK, NLM_F_CREATE, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage,
    NetlinkPayload, Nla, ParseableParametrized,
};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
    NetfilterSubsystem,
};
use nix::errno::Errno;

use crate::error::{Error, Result};
use crate::message::{Control, control, messages};
use crate::nfsocket::{NfSocket, Received};

/// `NFNL_SUBSYS_ACCT` (`linux/netfilter/nfnetlink.h`).
pub const NFNL_SUBSYS_ACCT: u8 = 7;
/// `NFNL_MSG_ACCT_NEW`: create a counter; also the type of the kernel's counter messages.
const NFNL_MSG_ACCT_NEW: u8 = 0;
/// `NFNL_MSG_ACCT_GET`: read a counter (or, with `NLM_F_DUMP`, all of them).
const NFNL_MSG_ACCT_GET: u8 = 1;
/// `NFACCT_NAME`: NUL-terminated name.
const NFACCT_NAME: u16 = 1;
/// `NFACCT_PKTS`: packets, big-endian u64.
const NFACCT_PKTS: u16 = 2;
/// `NFACCT_BYTES`: bytes, big-endian u64.
const NFACCT_BYTES: u16 = 3;
/// `NLA_TYPE_MASK`: an attribute's type without the nested / byte-order flags.
const NLA_TYPE_MASK: u16 = 0x3fff;

/// The longest counter name in bytes (`NFACCT_NAME_MAX` is 32 with the NUL).
pub const NFACCT_NAME_MAX: usize = 31;

/// The name [`Nfacct::new`] asks for to learn whether the kernel has nfacct: an answer,
/// or `ENOENT` for a name that does not exist, means it has (upstream probes the same way).
const PROBE_NAME: &str = "kube-proxy-rs-probe";

/// How long [`Nfacct::new`] waits for each answer.
pub const NFACCT_TIMEOUT: Duration = Duration::from_secs(5);

/// One nfacct counter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counter {
    /// Its name (at most [`NFACCT_NAME_MAX`] bytes).
    pub name: String,
    /// Packets counted by rules that name it.
    pub packets: u64,
    /// Bytes of those packets.
    pub bytes: u64,
}

/// nfacct counter operations: the seam between the proxier (and the metrics) and the kernel.
///
/// Implemented by [`Nfacct`] (the kernel, over netlink) and [`FakeNfacct`] (in memory).
pub trait NfacctOps {
    /// The counter called `name`, or `None` when there is none (`ENOENT`), like
    /// `nfacct get NAME`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a name that is empty, has a NUL or is longer than
    /// [`NFACCT_NAME_MAX`]; [`Error::Kernel`] when the kernel refuses (`EPERM` without
    /// `CAP_NET_ADMIN`, `EOPNOTSUPP` without `nfnetlink_acct`); [`Error::Io`] /
    /// [`Error::Timeout`] / [`Error::Malformed`] for socket and framing failures.
    fn get(&mut self, name: &str) -> Result<Option<Counter>>;

    /// Creates the counter `name` with zero counts, like `nfacct add NAME`. Returns
    /// `Ok(false)` when it exists already (`EBUSY`; its counts are kept).
    ///
    /// # Errors
    /// As [`get`](Self::get).
    fn add(&mut self, name: &str) -> Result<bool>;

    /// Makes sure the counter `name` exists: gets it, and adds it when it is missing
    /// (upstream's `Ensure`).
    ///
    /// # Errors
    /// As [`get`](Self::get).
    fn ensure(&mut self, name: &str) -> Result<()> {
        if self.get(name)?.is_none() {
            self.add(name)?;
        }
        Ok(())
    }
}

impl<T: NfacctOps + ?Sized> NfacctOps for Box<T> {
    fn get(&mut self, name: &str) -> Result<Option<Counter>> {
        (**self).get(name)
    }

    fn add(&mut self, name: &str) -> Result<bool> {
        (**self).add(name)
    }

    fn ensure(&mut self, name: &str) -> Result<()> {
        (**self).ensure(name)
    }
}

/// Why `name` cannot be a counter's name, if it cannot.
pub fn check_name(name: &str) -> std::result::Result<(), String> {
    if name.is_empty() {
        return Err("an nfacct counter name cannot be empty".into());
    }
    if name.len() > NFACCT_NAME_MAX {
        return Err(format!(
            "nfacct counter name {name:?} has {} bytes, more than the kernel's {NFACCT_NAME_MAX}",
            name.len()
        ));
    }
    if name.contains('\0') {
        return Err(format!("nfacct counter name {name:?} contains a NUL byte"));
    }
    Ok(())
}

/// The request `cmd` (`NFNL_MSG_ACCT_*`) for counter `name`.
fn request(cmd: u8, flags: u16, name: &str, seq: u32) -> Vec<u8> {
    let mut value = name.as_bytes().to_vec();
    value.push(0);
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = seq;
    let mut packet = NetlinkMessage::new(
        header,
        NetlinkPayload::from(NetfilterMessage::new(
            NetfilterHeader::new(NetfilterProtoFamily::Unspec, 0, 0),
            NetfilterMessageInner::Other {
                subsys: NetfilterSubsystem::Other(NFNL_SUBSYS_ACCT),
                message_type: cmd,
                attributes: vec![DefaultNla::new(NFACCT_NAME, value)],
            },
        )),
    );
    packet.finalize();
    let mut buf = vec![0; packet.buffer_len()];
    packet.serialize(&mut buf);
    buf
}

/// `NFNL_MSG_ACCT_GET` of `name` (like `nfacct get NAME`).
pub(crate) fn get_request(name: &str, seq: u32) -> Vec<u8> {
    request(NFNL_MSG_ACCT_GET, NLM_F_REQUEST | NLM_F_ACK, name, seq)
}

/// `NFNL_MSG_ACCT_NEW` of `name` (like `nfacct add NAME`).
pub(crate) fn add_request(name: &str, seq: u32) -> Vec<u8> {
    request(
        NFNL_MSG_ACCT_NEW,
        NLM_F_REQUEST | NLM_F_CREATE | NLM_F_ACK,
        name,
        seq,
    )
}

/// One message of an nfacct reply, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    /// A counter (`NFNL_MSG_ACCT_NEW` from the kernel).
    Counter(Counter),
    /// An nfacct message that could not be decoded, with the reason.
    Skipped(String),
    /// `NLMSG_DONE`.
    Done,
    /// `NLMSG_ERROR` with code 0.
    Ack,
    /// `NLMSG_ERROR` with a non-zero code: the positive errno.
    Error(i32),
}

/// Decodes one received datagram, keeping the messages whose sequence number is `seq`.
/// Errors describe broken framing.
pub(crate) fn parse_datagram(buf: &[u8], seq: u32) -> std::result::Result<Vec<Reply>, String> {
    let mut out = Vec::new();
    for (offset, message) in messages(buf)? {
        if message.sequence_number() != seq {
            continue;
        }
        let message_type = message.message_type();
        let payload = message.payload();
        out.push(match control(message_type, payload, offset)? {
            Some(Control::Noop) => continue,
            Some(Control::Ack) => Reply::Ack,
            Some(Control::Done) => Reply::Done,
            Some(Control::Error(code)) => Reply::Error(code),
            None if (message_type >> 8) as u8 == NFNL_SUBSYS_ACCT => {
                match decode_counter(payload, message_type) {
                    Ok(c) => Reply::Counter(c),
                    Err(why) => Reply::Skipped(why),
                }
            }
            None => Reply::Skipped(format!("unexpected message type {message_type:#06x}")),
        });
    }
    Ok(out)
}

/// A [`Counter`] from the payload (`nfgenmsg` + attributes) of an nfacct message.
fn decode_counter(payload: &[u8], message_type: u16) -> std::result::Result<Counter, String> {
    let message = NetfilterMessage::parse_with_param(payload, message_type)
        .map_err(|e| format!("undecodable nfacct message: {e}"))?;
    let NetfilterMessageInner::Other {
        message_type: NFNL_MSG_ACCT_NEW,
        attributes,
        ..
    } = message.inner
    else {
        return Err(format!(
            "unexpected nfacct message type {message_type:#06x}"
        ));
    };
    let (mut name, mut packets, mut bytes) = (None, None, None);
    for nla in &attributes {
        let mut value = vec![0u8; nla.value_len()];
        nla.emit_value(&mut value);
        match nla.kind() & NLA_TYPE_MASK {
            NFACCT_NAME => {
                let text = value.split(|b| *b == 0).next().unwrap_or_default();
                name = Some(
                    String::from_utf8(text.to_vec())
                        .map_err(|_| "NFACCT_NAME is not UTF-8".to_string())?,
                );
            }
            NFACCT_PKTS => packets = Some(be64(&value, "NFACCT_PKTS")?),
            NFACCT_BYTES => bytes = Some(be64(&value, "NFACCT_BYTES")?),
            // NFACCT_USE, NFACCT_FLAGS, NFACCT_QUOTA, NFACCT_PAD: not needed.
            _ => {}
        }
    }
    match (name, packets, bytes) {
        (Some(name), Some(packets), Some(bytes)) => Ok(Counter {
            name,
            packets,
            bytes,
        }),
        _ => Err("nfacct message without NFACCT_NAME, NFACCT_PKTS and NFACCT_BYTES".into()),
    }
}

fn be64(value: &[u8], what: &str) -> std::result::Result<u64, String> {
    let bytes: [u8; 8] = value
        .try_into()
        .map_err(|_| format!("{what} has {} bytes, expected 8", value.len()))?;
    Ok(u64::from_be_bytes(bytes))
}

/// The kernel's nfacct counters of one network namespace, over a `NETLINK_NETFILTER`
/// socket.
///
/// The socket belongs to the network namespace of the thread that creates the handle, like
/// [`crate::Conntrack`]'s. Needs `CAP_NET_ADMIN` there (nfnetlink asks it of every request).
#[derive(Debug)]
pub struct Nfacct {
    socket: NfSocket,
}

impl Nfacct {
    /// Opens the socket in the calling thread's network namespace and checks that the
    /// kernel has nfacct, by asking for a counter that need not exist: an answer or
    /// `ENOENT` means it has (upstream's `nfacct.New`).
    ///
    /// # Errors
    /// [`Error::Io`] when the socket cannot be opened; the probe's error when the kernel
    /// refuses it (`EOPNOTSUPP`: no `nfnetlink_acct`; `EPERM`: no `CAP_NET_ADMIN`).
    pub fn new() -> Result<Nfacct> {
        let mut n = Nfacct::without_probe(NFACCT_TIMEOUT)?;
        n.get(PROBE_NAME).map_err(|e| match e {
            Error::Kernel { code, .. } => Error::Kernel {
                op: "probing the kernel's nfacct subsystem (NFNL_SUBSYS_ACCT)".into(),
                code,
            },
            other => other,
        })?;
        Ok(n)
    }

    /// Opens the socket without probing, waiting at most `timeout` for each answer.
    ///
    /// # Errors
    /// [`Error::Io`] when the socket cannot be opened.
    pub fn without_probe(timeout: Duration) -> Result<Nfacct> {
        Ok(Nfacct {
            socket: NfSocket::open(timeout, "opening an nfacct socket (NETLINK_NETFILTER)")?,
        })
    }

    /// Sends `request` (built with sequence number `seq`) and reads until the ACK or an
    /// error; returns the counters received before it.
    fn exchange(&mut self, request: &[u8], seq: u32, op: &str) -> Result<Vec<Counter>> {
        self.socket.send(request, op)?;
        let mut counters = Vec::new();
        loop {
            let n = match self.socket.recv(op)? {
                Received::Datagram(n) => n,
                Received::Overflow => {
                    return Err(Error::Io {
                        op: op.to_owned(),
                        source: std::io::Error::from_raw_os_error(Errno::ENOBUFS as i32),
                    });
                }
            };
            let replies = parse_datagram(self.socket.datagram(n), seq).map_err(|detail| {
                Error::Malformed {
                    op: op.to_owned(),
                    detail,
                }
            })?;
            for reply in replies {
                match reply {
                    Reply::Counter(c) => counters.push(c),
                    Reply::Skipped(why) => tracing::warn!("{op}: skipping a message: {why}"),
                    Reply::Ack | Reply::Done => return Ok(counters),
                    Reply::Error(code) => {
                        return Err(Error::Kernel {
                            op: op.to_owned(),
                            code,
                        });
                    }
                }
            }
        }
    }
}

fn checked(name: &str, op: &str) -> Result<()> {
    check_name(name).map_err(|reason| Error::Unsupported {
        op: op.to_owned(),
        reason,
    })
}

impl NfacctOps for Nfacct {
    fn get(&mut self, name: &str) -> Result<Option<Counter>> {
        let op = format!("reading nfacct counter {name:?} (like `nfacct get {name}`)");
        checked(name, &op)?;
        let seq = self.socket.next_seq();
        match self.exchange(&get_request(name, seq), seq, &op) {
            Ok(counters) => Ok(counters.into_iter().find(|c| c.name == name)),
            Err(Error::Kernel { code, .. }) if code == Errno::ENOENT as i32 => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn add(&mut self, name: &str) -> Result<bool> {
        let op = format!("creating nfacct counter {name:?} (like `nfacct add {name}`)");
        checked(name, &op)?;
        let seq = self.socket.next_seq();
        match self.exchange(&add_request(name, seq), seq, &op) {
            Ok(_) => Ok(true),
            Err(Error::Kernel { code, .. }) if code == Errno::EBUSY as i32 => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// In-memory nfacct counters with the kernel's answers, for tests. Clones share the
/// counters, so a test keeps one to look at or bump what the code under test created.
#[derive(Debug, Clone, Default)]
pub struct FakeNfacct {
    counters: Arc<Mutex<BTreeMap<String, Counter>>>,
    /// `Some(errno)`: every request fails with it (a kernel without nfacct: `EOPNOTSUPP`).
    fail: Option<i32>,
}

impl FakeNfacct {
    /// No counters yet; every request works.
    pub fn new() -> Self {
        Self::default()
    }

    /// A kernel without nfacct: every request fails with `EOPNOTSUPP`.
    pub fn unsupported() -> Self {
        FakeNfacct {
            fail: Some(Errno::EOPNOTSUPP as i32),
            ..Self::default()
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Counter>> {
        self.counters.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets the counts of `name`, creating it if needed (as traffic through a rule would).
    pub fn set(&self, name: &str, packets: u64, bytes: u64) {
        self.lock().insert(
            name.to_string(),
            Counter {
                name: name.to_string(),
                packets,
                bytes,
            },
        );
    }

    /// The counters now, by name.
    pub fn counters(&self) -> BTreeMap<String, Counter> {
        self.lock().clone()
    }

    fn check(&self, name: &str, op: &str) -> Result<()> {
        checked(name, op)?;
        match self.fail {
            Some(code) => Err(Error::Kernel {
                op: op.to_owned(),
                code,
            }),
            None => Ok(()),
        }
    }
}

impl NfacctOps for FakeNfacct {
    fn get(&mut self, name: &str) -> Result<Option<Counter>> {
        self.check(name, &format!("reading nfacct counter {name:?}"))?;
        Ok(self.lock().get(name).cloned())
    }

    fn add(&mut self, name: &str) -> Result<bool> {
        self.check(name, &format!("creating nfacct counter {name:?}"))?;
        let mut counters = self.lock();
        if counters.contains_key(name) {
            return Ok(false);
        }
        counters.insert(
            name.to_string(),
            Counter {
                name: name.to_string(),
                ..Counter::default()
            },
        );
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq_of(bytes: &[u8]) -> u32 {
        u32::from_ne_bytes(bytes[8..12].try_into().unwrap())
    }

    /// `struct nlmsghdr` (native endian) + `struct nfgenmsg` + `NFACCT_NAME`, laid out by
    /// hand from `linux/netlink.h`, `nfnetlink.h` and `nfnetlink_acct.h`.
    fn hand_built(msg_type: u16, flags: u16, seq: u32, name: &str) -> Vec<u8> {
        let mut attr_value = name.as_bytes().to_vec();
        attr_value.push(0);
        let attr_len = 4 + attr_value.len();
        let padded = (attr_len + 3) & !3;
        let total = 16 + 4 + padded;
        let mut b = Vec::new();
        b.extend_from_slice(&u32::try_from(total).unwrap().to_ne_bytes());
        b.extend_from_slice(&msg_type.to_ne_bytes());
        b.extend_from_slice(&flags.to_ne_bytes());
        b.extend_from_slice(&seq.to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes()); // pid: the kernel fills it in
        b.extend_from_slice(&[0, 0, 0, 0]); // AF_UNSPEC, NFNETLINK_V0, res_id 0
        b.extend_from_slice(&u16::try_from(attr_len).unwrap().to_ne_bytes());
        b.extend_from_slice(&NFACCT_NAME.to_ne_bytes());
        b.extend_from_slice(&attr_value);
        b.resize(total, 0);
        b
    }

    #[test]
    fn get_and_add_requests_are_the_kernel_layout() {
        let get = get_request("ct_state_invalid_dropped_pkts", 7);
        // NFNL_SUBSYS_ACCT << 8 | NFNL_MSG_ACCT_GET; NLM_F_REQUEST | NLM_F_ACK.
        assert_eq!(
            get,
            hand_built(0x0701, 0x0001 | 0x0004, 7, "ct_state_invalid_dropped_pkts")
        );
        assert_eq!(seq_of(&get), 7);
        let add = add_request("localhost_nps_accepted_pkts", 9);
        // NFNL_MSG_ACCT_NEW; NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE.
        assert_eq!(
            add,
            hand_built(
                0x0700,
                0x0001 | 0x0004 | 0x0400,
                9,
                "localhost_nps_accepted_pkts"
            )
        );
        // The name attribute: 4 + 28 + NUL = 32 bytes, no padding needed.
        assert_eq!(add.len(), 16 + 4 + 32);
    }

    /// A counter message as the kernel's `nfnl_acct_fill_info` writes it: NAME, PKTS and
    /// BYTES (each u64 preceded by an `NFACCT_PAD` when unaligned; here they are aligned
    /// after a 12-byte name), USE.
    fn kernel_counter(seq: u32, name: &str, packets: u64, bytes: u64) -> Vec<u8> {
        let mut attrs = Vec::new();
        let mut push = |kind: u16, value: &[u8]| {
            let len = 4 + value.len();
            attrs.extend_from_slice(&u16::try_from(len).unwrap().to_ne_bytes());
            attrs.extend_from_slice(&kind.to_ne_bytes());
            attrs.extend_from_slice(value);
            attrs.resize((attrs.len() + 3) & !3, 0);
        };
        let mut n = name.as_bytes().to_vec();
        n.push(0);
        push(NFACCT_NAME, &n);
        push(NFACCT_PKTS, &packets.to_be_bytes());
        push(NFACCT_BYTES, &bytes.to_be_bytes());
        push(4, &1u32.to_be_bytes()); // NFACCT_USE
        push(8, &[]); // NFACCT_PAD, ignored
        let total = 16 + 4 + attrs.len();
        let mut b = Vec::new();
        b.extend_from_slice(&u32::try_from(total).unwrap().to_ne_bytes());
        b.extend_from_slice(&0x0700u16.to_ne_bytes());
        b.extend_from_slice(&0u16.to_ne_bytes());
        b.extend_from_slice(&seq.to_ne_bytes());
        b.extend_from_slice(&1234u32.to_ne_bytes());
        b.extend_from_slice(&[0, 0, 0, 0]);
        b.extend_from_slice(&attrs);
        b
    }

    /// An `NLMSG_ERROR` with `errno` (0: an ACK) for the request with `seq`.
    fn kernel_error(seq: u32, errno: i32) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&36u32.to_ne_bytes());
        b.extend_from_slice(&2u16.to_ne_bytes()); // NLMSG_ERROR
        b.extend_from_slice(&0u16.to_ne_bytes());
        b.extend_from_slice(&seq.to_ne_bytes());
        b.extend_from_slice(&1234u32.to_ne_bytes());
        b.extend_from_slice(&(-errno).to_ne_bytes());
        // The request's header, echoed.
        b.extend_from_slice(&hand_built(0x0701, 5, seq, "x")[..16]);
        b
    }

    #[test]
    fn counter_replies_are_decoded() {
        let mut datagram = kernel_counter(3, "ct_state_inv", 17, 2040);
        datagram.extend(kernel_error(3, 0));
        assert_eq!(
            parse_datagram(&datagram, 3).unwrap(),
            vec![
                Reply::Counter(Counter {
                    name: "ct_state_inv".into(),
                    packets: 17,
                    bytes: 2040,
                }),
                Reply::Ack,
            ]
        );
        // Other requests' leftovers are ignored.
        assert!(parse_datagram(&datagram, 4).unwrap().is_empty());
        assert_eq!(
            parse_datagram(&kernel_error(5, Errno::ENOENT as i32), 5).unwrap(),
            vec![Reply::Error(Errno::ENOENT as i32)]
        );
    }

    #[test]
    fn incomplete_or_broken_messages_are_skipped_or_refused() {
        // A counter message without PKTS/BYTES is skipped, not fatal.
        let mut short = kernel_counter(1, "x", 1, 1);
        short.truncate(16 + 4 + 8);
        short[..4].copy_from_slice(&28u32.to_ne_bytes());
        assert!(matches!(
            parse_datagram(&short, 1).unwrap().as_slice(),
            [Reply::Skipped(_)]
        ));
        // A length beyond the datagram is broken framing.
        let mut broken = kernel_counter(1, "x", 1, 1);
        broken.truncate(10);
        assert!(parse_datagram(&broken, 1).is_err());
    }

    #[test]
    fn names_are_checked_before_anything_is_sent() {
        assert!(check_name("localhost_nps_accepted_pkts").is_ok());
        assert!(check_name(&"x".repeat(31)).is_ok());
        assert!(
            check_name(&"x".repeat(32))
                .unwrap_err()
                .contains("32 bytes")
        );
        assert!(check_name("").is_err());
        assert!(check_name("a\0b").is_err());
        let mut fake = FakeNfacct::new();
        assert!(matches!(
            fake.get(&"x".repeat(40)),
            Err(Error::Unsupported { .. })
        ));
    }

    #[test]
    fn the_fake_answers_like_the_kernel() {
        let mut fake = FakeNfacct::new();
        assert_eq!(fake.get("a").unwrap(), None);
        assert!(fake.add("a").unwrap());
        assert!(!fake.add("a").unwrap(), "EBUSY: exists already");
        let view = fake.clone();
        view.set("a", 5, 300);
        fake.ensure("a").unwrap();
        assert_eq!(
            fake.get("a").unwrap().unwrap().packets,
            5,
            "ensure keeps counts"
        );
        fake.ensure("b").unwrap();
        assert_eq!(view.counters().len(), 2);
        let mut none = FakeNfacct::unsupported();
        let err = none.ensure("a").unwrap_err();
        assert_eq!(err.code(), Some(Errno::EOPNOTSUPP as i32));
    }
}
