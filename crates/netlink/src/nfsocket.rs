//! The `NETLINK_NETFILTER` socket shared by the nfnetlink adapters (ctnetlink in
//! [`crate::Conntrack`], nfacct in [`crate::Nfacct`]): creation in the calling thread's
//! network namespace, a receive timeout, sequence numbers, and `send`/`recv` that retry on
//! `EINTR` and report `ENOBUFS` (lost messages) apart from other failures; and
//! [`send_whole`], the send of every netlink socket of this crate.

use std::io;
use std::time::Duration;

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};
use nix::errno::Errno;
use nix::sys::socket::{MsgFlags, setsockopt, sockopt};
use nix::sys::time::{TimeVal, TimeValLike};

use crate::error::{Error, Result};

/// The longest receive timeout a socket is given.
const MAX_TIMEOUT: Duration = Duration::from_secs(86_400);
/// Receive buffer: a netlink dump datagram is at most 32 KiB, so this never truncates.
const RECV_BUFFER: usize = 64 * 1024;
/// `SO_RCVBUF` asked for (the kernel caps it at `net.core.rmem_max`).
const SOCKET_RCVBUF: usize = 1 << 20;

/// Sends `data` as one datagram on any of this crate's netlink sockets (netfilter, generic
/// netlink for IPVS, rtnetlink), retrying on `EINTR`. A short send is an error (netlink
/// datagrams are never split).
pub(crate) fn send_whole(socket: &Socket, data: &[u8]) -> io::Result<()> {
    loop {
        match socket.send(data, 0) {
            Ok(n) if n == data.len() => return Ok(()),
            Ok(n) => {
                return Err(io::Error::other(format!(
                    "sent {n} of {} bytes",
                    data.len()
                )));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// What one `recv` produced.
pub(crate) enum Received {
    /// A datagram of this many bytes, in [`NfSocket::datagram`].
    Datagram(usize),
    /// `ENOBUFS`: the socket's receive queue overflowed and messages were lost.
    Overflow,
}

/// One `NETLINK_NETFILTER` socket, bound and connected to the kernel.
#[derive(Debug)]
pub(crate) struct NfSocket {
    socket: Socket,
    seq: u32,
    timeout: Duration,
    buf: Vec<u8>,
}

impl NfSocket {
    /// Opens the socket in the calling thread's network namespace; `timeout` (clamped to
    /// 1 ms ..= 1 day: a zero `SO_RCVTIMEO` would mean "forever") bounds each `recv`.
    /// `op` names the socket's use in errors (e.g. "opening a ctnetlink socket").
    pub(crate) fn open(timeout: Duration, op: &str) -> Result<NfSocket> {
        let io = |what: &str, source: io::Error| Error::Io {
            op: format!("{op}: {what}"),
            source,
        };
        let mut socket = Socket::new(NETLINK_NETFILTER).map_err(|e| io("socket", e))?;
        socket.bind_auto().map_err(|e| io("bind", e))?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(|e| io("connect", e))?;
        if let Err(e) = socket.set_rx_buf_sz(SOCKET_RCVBUF) {
            tracing::debug!("{op}: setting SO_RCVBUF to {SOCKET_RCVBUF}: {e}");
        }
        let timeout = timeout.clamp(Duration::from_millis(1), MAX_TIMEOUT);
        let tv = TimeVal::microseconds(i64::try_from(timeout.as_micros()).unwrap_or(i64::MAX));
        setsockopt(&socket, sockopt::ReceiveTimeout, &tv)
            .map_err(|e| io("setting SO_RCVTIMEO", io::Error::from(e)))?;
        Ok(NfSocket {
            socket,
            seq: 0,
            timeout,
            buf: vec![0; RECV_BUFFER],
        })
    }

    /// The receive timeout in use.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A new sequence number for the next request.
    pub(crate) fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Sends one request whole.
    pub(crate) fn send(&self, request: &[u8], op: &str) -> Result<()> {
        send_whole(&self.socket, request).map_err(|source| Error::Io {
            op: op.to_owned(),
            source,
        })
    }

    /// Receives one datagram (then read it with [`datagram`](Self::datagram)).
    /// [`Error::Timeout`] when nothing came within the timeout.
    pub(crate) fn recv(&mut self, op: &str) -> Result<Received> {
        loop {
            let mut chunk: &mut [u8] = &mut self.buf[..];
            match self.socket.recv(&mut chunk, MsgFlags::MSG_TRUNC.bits()) {
                Ok(n) if n > self.buf.len() => {
                    return Err(Error::Malformed {
                        op: op.to_owned(),
                        detail: format!("datagram of {n} bytes truncated to {}", self.buf.len()),
                    });
                }
                Ok(n) => return Ok(Received::Datagram(n)),
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

    /// The first `n` bytes of the receive buffer (the datagram [`recv`](Self::recv) got).
    pub(crate) fn datagram(&self, n: usize) -> &[u8] {
        &self.buf[..n.min(self.buf.len())]
    }
}
