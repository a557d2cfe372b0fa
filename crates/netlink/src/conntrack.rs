//! [`ConntrackOps`], the seam the proxier uses, and [`Conntrack`], its implementation over
//! a ctnetlink socket.
//!
//! A [`Conntrack`] owns one `NETLINK_NETFILTER` socket. A netlink socket belongs to the
//! network namespace of the thread that creates it, so create the handle on a thread inside
//! the namespace whose table you mean (the node's); it keeps talking to that namespace
//! from any thread afterwards.
//!
//! Each request gets a new sequence number and only replies carrying it are read, so
//! leftovers of an abandoned request (after a timeout) are skipped. Dumps are multipart:
//! datagrams are read until `NLMSG_DONE`. A dump that lost messages (`ENOBUFS`) or was
//! marked `NLM_F_DUMP_INTR` is retried, up to [`DUMP_ATTEMPTS`] times.

use std::io;
use std::time::Duration;

use nix::errno::Errno;

use crate::error::{Error, Result};
use crate::flow::{Family, Flow, proto};
use crate::message::{self, Reply};
use crate::nfsocket::{NfSocket, Received};

/// How long [`Conntrack::new`] waits for each datagram of an answer.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// How many times a dump is tried before [`Error::DumpIncomplete`].
pub const DUMP_ATTEMPTS: u32 = 3;

/// Conntrack table operations: the seam between the proxier and the kernel.
///
/// Implemented by [`Conntrack`] (the kernel, over netlink) and
/// [`crate::FakeConntrack`] (in memory).
pub trait ConntrackOps {
    /// Lists the family's entries, all protocols or only `proto` (an `IPPROTO_*` number,
    /// see [`crate::proto`]), like `conntrack -L -f ipv4 -p udp`.
    ///
    /// Entries the kernel sends that cannot be decoded are skipped with a warning.
    ///
    /// # Errors
    ///
    /// [`Error::Kernel`] when the kernel refuses the dump, [`Error::Io`] / [`Error::Timeout`]
    /// for socket failures, [`Error::Malformed`] for broken framing,
    /// [`Error::DumpIncomplete`] when every attempt lost messages.
    fn dump(&mut self, family: Family, proto: Option<u8>) -> Result<Vec<Flow>>;

    /// Deletes the entry with `flow`'s original tuple (and zone; and id, if known, so a
    /// newer entry reusing the tuple survives), like
    /// `conntrack -D -p udp --orig-src 192.168.56.100 --orig-dst 10.96.0.53 --sport 40000
    /// --dport 53`.
    ///
    /// Returns `Ok(true)` when an entry was deleted and `Ok(false)` when there was none
    /// (`ENOENT`: it expired or was deleted already, or its id differs).
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] for protocols without ports (ICMP) or a tuple whose
    /// addresses are not of the flow's family, [`Error::Kernel`] for any other refusal,
    /// [`Error::Io`] / [`Error::Timeout`] for socket failures.
    fn delete(&mut self, flow: &Flow) -> Result<bool>;

    /// Dumps the family's entries and deletes every one `predicate` selects; returns how
    /// many were deleted (entries that vanished in between are not counted). Like
    /// `conntrack -D -f ipv4 -p udp --orig-dst 10.96.0.53 --dport 53`, with an arbitrary
    /// filter.
    ///
    /// # Errors
    ///
    /// The dump's errors, and the first delete that fails (the remaining flows are then
    /// left alone).
    fn delete_matching<P>(&mut self, family: Family, mut predicate: P) -> Result<usize>
    where
        P: FnMut(&Flow) -> bool,
        Self: Sized,
    {
        let flows = self.dump(family, None)?;
        let mut deleted = 0;
        for flow in flows.iter().filter(|f| predicate(f)) {
            if self.delete(flow)? {
                deleted += 1;
            }
        }
        Ok(deleted)
    }
}

impl<T: ConntrackOps + ?Sized> ConntrackOps for &mut T {
    fn dump(&mut self, family: Family, proto: Option<u8>) -> Result<Vec<Flow>> {
        (**self).dump(family, proto)
    }

    fn delete(&mut self, flow: &Flow) -> Result<bool> {
        (**self).delete(flow)
    }
}

impl<T: ConntrackOps + ?Sized> ConntrackOps for Box<T> {
    fn dump(&mut self, family: Family, proto: Option<u8>) -> Result<Vec<Flow>> {
        (**self).dump(family, proto)
    }

    fn delete(&mut self, flow: &Flow) -> Result<bool> {
        (**self).delete(flow)
    }
}

/// The kernel's conntrack table of one network namespace, over a ctnetlink socket.
///
/// Needs `CAP_NET_ADMIN` in that namespace. Not shareable between threads at once
/// (`&mut self`): replies of concurrent requests would interleave on the socket.
#[derive(Debug)]
pub struct Conntrack {
    socket: NfSocket,
}

impl Conntrack {
    /// Opens a ctnetlink socket in the calling thread's network namespace, with
    /// [`DEFAULT_TIMEOUT`] as the receive timeout.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when the socket cannot be created, bound or configured (e.g.
    /// `EPROTONOSUPPORT` without `nfnetlink`).
    pub fn new() -> Result<Conntrack> {
        Conntrack::with_timeout(DEFAULT_TIMEOUT)
    }

    /// Like [`Conntrack::new`], waiting at most `timeout` for each datagram of an answer
    /// (clamped to 1 ms ..= 1 day: a zero `SO_RCVTIMEO` would mean "forever").
    ///
    /// # Errors
    ///
    /// As [`Conntrack::new`].
    pub fn with_timeout(timeout: Duration) -> Result<Conntrack> {
        Ok(Conntrack {
            socket: NfSocket::open(timeout, "opening a ctnetlink socket (NETLINK_NETFILTER)")?,
        })
    }

    /// The receive timeout in use.
    pub fn timeout(&self) -> Duration {
        self.socket.timeout()
    }

    /// One dump attempt: `Ok(Ok(flows))` when complete, `Ok(Err(reason))` when it must be
    /// retried.
    fn dump_once(
        &mut self,
        family: Family,
        proto: Option<u8>,
        op: &str,
    ) -> Result<Result<Vec<Flow>, &'static str>> {
        let seq = self.socket.next_seq();
        self.socket.send(&message::dump_request(family, seq), op)?;
        let mut flows = Vec::new();
        let mut lost = false;
        let mut interrupted = false;
        loop {
            let n = match self.socket.recv(op) {
                Ok(Received::Datagram(n)) => n,
                Ok(Received::Overflow) => {
                    lost = true;
                    continue;
                }
                // After an overflow the DONE itself may be lost: retry rather than fail.
                Err(Error::Timeout { .. }) if lost => return Ok(Err("ENOBUFS")),
                Err(e) => return Err(e),
            };
            let datagram =
                message::parse_datagram(self.socket.datagram(n), seq).map_err(|detail| {
                    Error::Malformed {
                        op: op.to_owned(),
                        detail,
                    }
                })?;
            interrupted |= datagram.interrupted;
            for reply in datagram.replies {
                match reply {
                    Reply::Flow(flow) => {
                        if flow.family == family && proto.is_none_or(|p| flow.original.proto == p) {
                            flows.push(flow);
                        }
                    }
                    Reply::Skipped(why) => tracing::warn!("{op}: skipping an entry: {why}"),
                    Reply::Ack => {}
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
                            Ok(flows)
                        });
                    }
                }
            }
        }
    }
}

impl ConntrackOps for Conntrack {
    fn dump(&mut self, family: Family, proto: Option<u8>) -> Result<Vec<Flow>> {
        let filter = proto.map(|p| format!(" -p {}", proto::name(p)));
        let op = format!(
            "dumping {family} conntrack entries (like `conntrack -L -f {family}{}`)",
            filter.unwrap_or_default()
        );
        let mut reason = "";
        for attempt in 1..=DUMP_ATTEMPTS {
            match self.dump_once(family, proto, &op)? {
                Ok(flows) => return Ok(flows),
                Err(why) => {
                    tracing::debug!("{op}: attempt {attempt} incomplete ({why}), retrying");
                    reason = why;
                }
            }
        }
        Err(Error::DumpIncomplete {
            op,
            attempts: DUMP_ATTEMPTS,
            reason,
        })
    }

    fn delete(&mut self, flow: &Flow) -> Result<bool> {
        let op = delete_op(flow);
        let seq = self.socket.next_seq();
        let request = message::delete_request(flow, seq).map_err(|reason| Error::Unsupported {
            op: op.clone(),
            reason,
        })?;
        self.socket.send(&request, &op)?;
        loop {
            let n = match self.socket.recv(&op)? {
                Received::Datagram(n) => n,
                Received::Overflow => {
                    return Err(Error::Io {
                        op,
                        source: io::Error::from_raw_os_error(Errno::ENOBUFS as i32),
                    });
                }
            };
            let datagram =
                message::parse_datagram(self.socket.datagram(n), seq).map_err(|detail| {
                    Error::Malformed {
                        op: op.clone(),
                        detail,
                    }
                })?;
            for reply in datagram.replies {
                match reply {
                    Reply::Ack => return Ok(true),
                    Reply::Error(code) if code == Errno::ENOENT as i32 => return Ok(false),
                    Reply::Error(code) => return Err(Error::Kernel { op, code }),
                    Reply::Flow(_) | Reply::Skipped(_) | Reply::Done => {}
                }
            }
        }
    }
}

/// "deleting conntrack entry ... (like `conntrack -D ...`)".
fn delete_op(flow: &Flow) -> String {
    let t = &flow.original;
    let zone = if flow.zone != 0 {
        format!(" -w {}", flow.zone)
    } else {
        String::new()
    };
    format!(
        "deleting conntrack entry {flow} (like `conntrack -D -f {} -p {} --orig-src {} \
         --orig-dst {} --sport {} --dport {}{zone}`)",
        flow.family,
        proto::name(t.proto),
        t.src,
        t.dst,
        t.src_port,
        t.dst_port,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_are_described_as_command_lines() {
        let mut flow = Flow::udp(
            "192.168.56.100:40000".parse().unwrap(),
            "10.96.0.53:53".parse().unwrap(),
            "10.244.1.10:53".parse().unwrap(),
        );
        flow.zone = 3;
        let op = delete_op(&flow);
        assert!(
            op.ends_with(
                "(like `conntrack -D -f ipv4 -p udp --orig-src 192.168.56.100 --orig-dst \
                 10.96.0.53 --sport 40000 --dport 53 -w 3`)"
            ),
            "{op}"
        );
    }
}
