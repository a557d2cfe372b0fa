//! [`Ipvs`]: [`IpvsOps`] over a generic netlink socket.
//!
//! An [`Ipvs`] owns one `NETLINK_GENERIC` socket, created (like [`crate::Conntrack`]'s) in
//! the network namespace of the calling thread; IPVS tables are per namespace, so create
//! it on a thread inside the node's. [`Ipvs::new`] first asks the controller (`nlctrl`)
//! for the id of the family `IPVS`; a kernel without IPVS answers `ENOENT`, reported as
//! [`Error::IpvsUnavailable`].
//!
//! Dumps are multipart and read until `NLMSG_DONE`; one interrupted (`NLM_F_DUMP_INTR`) or
//! short of messages (`ENOBUFS`) is retried up to [`crate::DUMP_ATTEMPTS`] times.
//! [`IpvsOps::apply`] packs up to [`BATCH_BYTES`] of requests into one `send`, each with
//! its own sequence number and `NLM_F_ACK`, and then reads until every one of them is
//! answered; `NETLINK_CAP_ACK` keeps error answers short.
//!
//! [`Ipvs::set_capture`] records every datagram sent and received, for golden files and
//! for a test in a guest kernel ([`super::scripted_round_trip`]).

use std::collections::HashMap;
use std::io;
use std::time::Duration;

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_GENERIC};
use nix::errno::Errno;
use nix::sys::socket::{MsgFlags, setsockopt, sockopt};
use nix::sys::time::{TimeVal, TimeValLike};

use super::wire::{self, Incoming, IpvsPayload, Reply};
use super::{
    IpvsInfo, IpvsOp, IpvsOps, IpvsTimeouts, OpError, RealServer, ServiceKey, VirtualServer,
};
use crate::conntrack::{DEFAULT_TIMEOUT, DUMP_ATTEMPTS};
use crate::error::{Error, Result};

/// How many bytes of requests [`IpvsOps::apply`] sends per `sendmsg` (well below the
/// default `SO_SNDBUF`, and small enough that the acknowledgements fit the receive
/// buffer).
pub const BATCH_BYTES: usize = 32 * 1024;
/// The longest receive timeout [`Ipvs::with_timeout`] sets.
const MAX_TIMEOUT: Duration = Duration::from_secs(86_400);
/// Receive buffer: a netlink dump datagram is at most 32 KiB.
const RECV_BUFFER: usize = 64 * 1024;
/// `SO_RCVBUF` asked for (capped by `net.core.rmem_max`).
const SOCKET_RCVBUF: usize = 1 << 20;

/// Which way a [`Captured`] datagram went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// From us to the kernel.
    Sent,
    /// From the kernel to us.
    Received,
}

/// One datagram recorded by [`Ipvs::set_capture`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Captured {
    /// Which way it went.
    pub direction: Direction,
    /// Its bytes, netlink headers included.
    pub bytes: Vec<u8>,
}

/// The IPVS table of one network namespace, over generic netlink.
///
/// Changing the table needs `CAP_NET_ADMIN` in that namespace (`EPERM` otherwise); so do
/// the dumps. Not shareable between threads at once (`&mut self`).
#[derive(Debug)]
pub struct Ipvs {
    socket: Socket,
    family_id: u16,
    seq: u32,
    timeout: Duration,
    buf: Vec<u8>,
    capture: Option<Vec<Captured>>,
}

/// What one `recv` produced.
enum Received {
    /// A datagram of this many bytes, in `buf`.
    Datagram(usize),
    /// `ENOBUFS`: messages were lost.
    Overflow,
}

impl Ipvs {
    /// Opens a generic netlink socket in the calling thread's network namespace and
    /// resolves the `IPVS` family, with [`DEFAULT_TIMEOUT`] as the receive timeout.
    ///
    /// # Errors
    ///
    /// [`Error::IpvsUnavailable`] when the kernel has no IPVS; [`Error::Io`] when the
    /// socket cannot be created, bound or configured; [`Error::Timeout`],
    /// [`Error::Malformed`] or [`Error::Kernel`] when the controller's answer is
    /// missing, broken or another refusal.
    pub fn new() -> Result<Ipvs> {
        Ipvs::with_timeout(DEFAULT_TIMEOUT)
    }

    /// Like [`Ipvs::new`], waiting at most `timeout` (clamped to 1 ms ..= 1 day) for each
    /// datagram of an answer.
    ///
    /// # Errors
    ///
    /// As [`Ipvs::new`].
    pub fn with_timeout(timeout: Duration) -> Result<Ipvs> {
        let op = "opening a generic netlink socket (NETLINK_GENERIC)";
        let io = |what: &str, source: io::Error| Error::Io {
            op: format!("{op}: {what}"),
            source,
        };
        let mut socket = Socket::new(NETLINK_GENERIC).map_err(|e| io("socket", e))?;
        socket.bind_auto().map_err(|e| io("bind", e))?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(|e| io("connect", e))?;
        if let Err(e) = socket.set_rx_buf_sz(SOCKET_RCVBUF) {
            tracing::debug!("{op}: setting SO_RCVBUF to {SOCKET_RCVBUF}: {e}");
        }
        if let Err(e) = socket.set_cap_ack(true) {
            tracing::debug!("{op}: setting NETLINK_CAP_ACK: {e}");
        }
        let timeout = timeout.clamp(Duration::from_millis(1), MAX_TIMEOUT);
        let tv = TimeVal::microseconds(i64::try_from(timeout.as_micros()).unwrap_or(i64::MAX));
        setsockopt(&socket, sockopt::ReceiveTimeout, &tv)
            .map_err(|e| io("setting SO_RCVTIMEO", io::Error::from(e)))?;
        let mut ipvs = Ipvs {
            socket,
            family_id: 0,
            seq: 0,
            timeout,
            buf: vec![0; RECV_BUFFER],
            capture: None,
        };
        ipvs.family_id = ipvs.resolve_family()?;
        Ok(ipvs)
    }

    /// The message type the controller assigned to the `IPVS` family.
    pub fn family_id(&self) -> u16 {
        self.family_id
    }

    /// The receive timeout in use.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Starts (`true`) or stops recording every datagram sent and received.
    pub fn set_capture(&mut self, on: bool) {
        match (on, self.capture.is_some()) {
            (true, false) => self.capture = Some(Vec::new()),
            (false, true) => self.capture = None,
            _ => {}
        }
    }

    /// The datagrams recorded since capture started or since the last call.
    pub fn take_captured(&mut self) -> Vec<Captured> {
        self.capture
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    fn send(&mut self, request: &[u8], op: &str) -> Result<()> {
        if let Some(capture) = &mut self.capture {
            capture.push(Captured {
                direction: Direction::Sent,
                bytes: request.to_vec(),
            });
        }
        crate::nfsocket::send_whole(&self.socket, request).map_err(|source| Error::Io {
            op: op.to_owned(),
            source,
        })
    }

    fn recv(&mut self, op: &str) -> Result<Received> {
        loop {
            let mut chunk: &mut [u8] = &mut self.buf[..];
            match self.socket.recv(&mut chunk, MsgFlags::MSG_TRUNC.bits()) {
                Ok(n) if n > self.buf.len() => {
                    return Err(Error::Malformed {
                        op: op.to_owned(),
                        detail: format!("datagram of {n} bytes truncated to {}", self.buf.len()),
                    });
                }
                Ok(n) => {
                    if let Some(capture) = &mut self.capture {
                        capture.push(Captured {
                            direction: Direction::Received,
                            bytes: self.buf[..n].to_vec(),
                        });
                    }
                    return Ok(Received::Datagram(n));
                }
                Err(e) => match e.raw_os_error().map(Errno::from_raw) {
                    Some(Errno::EINTR) => {}
                    Some(Errno::ENOBUFS) => return Ok(Received::Overflow),
                    Some(Errno::EAGAIN) => {
                        return Err(Error::Timeout {
                            op: op.to_owned(),
                            after: self.timeout,
                        });
                    }
                    _ => {
                        return Err(Error::Io {
                            op: op.to_owned(),
                            source: e,
                        });
                    }
                },
            }
        }
    }

    /// Receives one datagram and decodes it; an overflow is an error here (used where
    /// lost messages cannot be retried: acknowledgements).
    fn recv_messages(&mut self, op: &str) -> Result<Vec<Incoming>> {
        match self.recv(op)? {
            Received::Datagram(n) => {
                wire::parse_datagram(&self.buf[..n], self.family_id).map_err(|detail| {
                    Error::Malformed {
                        op: op.to_owned(),
                        detail,
                    }
                })
            }
            Received::Overflow => Err(Error::Io {
                op: format!("{op}: answers were lost"),
                source: io::Error::from_raw_os_error(Errno::ENOBUFS as i32),
            }),
        }
    }

    /// Sends a request with `NLM_F_ACK` and returns what came back before the
    /// acknowledgement (data messages of the same sequence number).
    fn exchange(&mut self, request: &[u8], seq: u32, op: &str) -> Result<Vec<Reply>> {
        self.send(request, op)?;
        let mut data = Vec::new();
        loop {
            for incoming in self.recv_messages(op)? {
                if incoming.seq != seq {
                    continue;
                }
                match incoming.reply {
                    Reply::Ack => return Ok(data),
                    Reply::Error(code) => {
                        return Err(Error::Kernel {
                            op: op.to_owned(),
                            code,
                        });
                    }
                    Reply::Done => {}
                    other => data.push(other),
                }
            }
        }
    }

    fn resolve_family(&mut self) -> Result<u16> {
        let op = "looking up the generic netlink family IPVS (CTRL_CMD_GETFAMILY)";
        let seq = self.next_seq();
        let request = wire::family_request(seq);
        let replies = match self.exchange(&request, seq, op) {
            Err(Error::Kernel { code, .. }) if code == Errno::ENOENT as i32 => {
                return Err(Error::IpvsUnavailable { op: op.to_owned() });
            }
            other => other?,
        };
        for reply in replies {
            if let Reply::Ctrl(payload) = reply {
                return wire::decode_family_id(&payload).map_err(|detail| Error::Malformed {
                    op: op.to_owned(),
                    detail,
                });
            }
        }
        Err(Error::Malformed {
            op: op.to_owned(),
            detail: "the controller acknowledged without describing the family".into(),
        })
    }

    /// One dump attempt: `Ok(Ok(messages))` when complete, `Ok(Err(reason))` to retry.
    fn dump_once(
        &mut self,
        request: &dyn Fn(u32) -> Vec<u8>,
        op: &str,
    ) -> Result<Result<Vec<IpvsPayload>, &'static str>> {
        let seq = self.next_seq();
        self.send(&request(seq), op)?;
        let mut out = Vec::new();
        let (mut lost, mut interrupted) = (false, false);
        loop {
            let n = match self.recv(op) {
                Ok(Received::Datagram(n)) => n,
                Ok(Received::Overflow) => {
                    lost = true;
                    continue;
                }
                Err(Error::Timeout { .. }) if lost => return Ok(Err("ENOBUFS")),
                Err(e) => return Err(e),
            };
            let messages =
                wire::parse_datagram(&self.buf[..n], self.family_id).map_err(|detail| {
                    Error::Malformed {
                        op: op.to_owned(),
                        detail,
                    }
                })?;
            for incoming in messages {
                if incoming.seq != seq {
                    continue;
                }
                interrupted |= incoming.interrupted;
                match incoming.reply {
                    Reply::Ipvs(payload) => out.push(payload),
                    Reply::Skipped(why) => tracing::warn!("{op}: skipping a message: {why}"),
                    Reply::Ctrl(_) | Reply::Ack => {}
                    Reply::Error(code) => {
                        return Err(Error::Kernel {
                            op: op.to_owned(),
                            code,
                        });
                    }
                    Reply::Done => {
                        return Ok(if lost {
                            Err("ENOBUFS")
                        } else if interrupted {
                            Err("NLM_F_DUMP_INTR")
                        } else {
                            Ok(out)
                        });
                    }
                }
            }
        }
    }

    fn dump(&mut self, request: &dyn Fn(u32) -> Vec<u8>, op: &str) -> Result<Vec<IpvsPayload>> {
        let mut reason = "";
        for attempt in 1..=DUMP_ATTEMPTS {
            match self.dump_once(request, op)? {
                Ok(messages) => return Ok(messages),
                Err(why) => {
                    tracing::debug!("{op}: attempt {attempt} incomplete ({why}), retrying");
                    reason = why;
                }
            }
        }
        Err(Error::DumpIncomplete {
            op: op.to_owned(),
            attempts: DUMP_ATTEMPTS,
            reason,
        })
    }
}

impl IpvsOps for Ipvs {
    fn info(&mut self) -> Result<IpvsInfo> {
        let op = "reading IPVS version and table size (IPVS_CMD_GET_INFO)";
        let seq = self.next_seq();
        let request = wire::info_request(self.family_id, seq);
        for reply in self.exchange(&request, seq, op)? {
            if let Reply::Ipvs(payload) = reply {
                return wire::decode_info(&payload).map_err(|detail| Error::Malformed {
                    op: op.to_owned(),
                    detail,
                });
            }
        }
        Err(Error::Malformed {
            op: op.to_owned(),
            detail: "acknowledged without an answer".into(),
        })
    }

    fn services(&mut self) -> Result<Vec<VirtualServer>> {
        let op = "dumping IPVS virtual servers (like `ipvsadm -Ln`)";
        let family_id = self.family_id;
        let messages = self.dump(&|seq| wire::services_request(family_id, seq), op)?;
        Ok(messages
            .iter()
            .filter_map(|m| match wire::decode_service(m) {
                Ok(vs) => Some(vs),
                Err(why) => {
                    tracing::warn!("{op}: skipping a virtual server: {why}");
                    None
                }
            })
            .collect())
    }

    fn destinations(&mut self, svc: &ServiceKey) -> Result<Vec<RealServer>> {
        let op = format!(
            "dumping the real servers of {svc} (like `ipvsadm -Ln {}`)",
            super::text::service_name(svc)
        );
        let family_id = self.family_id;
        let messages = self.dump(&|seq| wire::dests_request(family_id, svc, seq), &op)?;
        Ok(messages
            .iter()
            .filter_map(|m| match wire::decode_dest(m, &svc.addr) {
                Ok(rs) => Some(rs),
                Err(why) => {
                    tracing::warn!("{op}: skipping a real server: {why}");
                    None
                }
            })
            .collect())
    }

    fn apply(&mut self, ops: &[IpvsOp]) -> Result<Vec<std::result::Result<(), OpError>>> {
        let op = format!("applying {} IPVS changes", ops.len());
        let mut results: Vec<Option<std::result::Result<(), OpError>>> = vec![None; ops.len()];
        let mut next = 0;
        while next < ops.len() {
            let mut batch = Vec::new();
            let mut pending: HashMap<u32, usize> = HashMap::new();
            while next < ops.len() && batch.len() < BATCH_BYTES {
                let seq = self.next_seq();
                match wire::op_request(self.family_id, &ops[next], seq) {
                    Ok(bytes) => {
                        batch.extend(bytes);
                        pending.insert(seq, next);
                    }
                    Err(errno) => results[next] = Some(Err(OpError::new(&ops[next], errno))),
                }
                next += 1;
            }
            if pending.is_empty() {
                continue;
            }
            self.send(&batch, &op)?;
            while !pending.is_empty() {
                for incoming in self.recv_messages(&op)? {
                    let outcome = match incoming.reply {
                        Reply::Ack => Ok(()),
                        Reply::Error(code) => Err(code),
                        _ => continue,
                    };
                    if let Some(index) = pending.remove(&incoming.seq) {
                        results[index] = Some(outcome.map_err(|code| OpError {
                            op: ops[index].describe(),
                            code,
                        }));
                    }
                }
            }
        }
        Ok(results
            .into_iter()
            .zip(ops)
            .map(|(result, op)| result.unwrap_or_else(|| Err(OpError::new(op, Errno::EIO))))
            .collect())
    }

    fn timeouts(&mut self) -> Result<IpvsTimeouts> {
        let op = "reading IPVS timeouts (IPVS_CMD_GET_CONFIG, like `ipvsadm -L --timeout`)";
        let seq = self.next_seq();
        let request = wire::get_config_request(self.family_id, seq);
        for reply in self.exchange(&request, seq, op)? {
            if let Reply::Ipvs(payload) = reply {
                return wire::decode_config(&payload).map_err(|detail| Error::Malformed {
                    op: op.to_owned(),
                    detail,
                });
            }
        }
        Err(Error::Malformed {
            op: op.to_owned(),
            detail: "acknowledged without an answer".into(),
        })
    }

    fn set_timeouts(&mut self, timeouts: IpvsTimeouts) -> Result<()> {
        let op = format!(
            "setting IPVS timeouts (IPVS_CMD_SET_CONFIG, like `ipvsadm --set {} {} {}`)",
            timeouts.tcp, timeouts.tcp_fin, timeouts.udp
        );
        let seq = self.next_seq();
        let request = wire::set_config_request(self.family_id, &timeouts, seq);
        self.exchange(&request, seq, &op).map(drop)
    }

    fn flush(&mut self) -> Result<()> {
        let op = "flushing the IPVS table (like `ipvsadm -C`)";
        let seq = self.next_seq();
        let request = wire::flush_request(self.family_id, seq);
        self.exchange(&request, seq, op).map(drop)
    }
}
