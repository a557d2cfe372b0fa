//! The IPVS mode's dummy link (`kube-ipvs0`) and its addresses, over rtnetlink.
//!
//! Upstream kube-proxy's IPVS proxier binds every Service IP (ClusterIP, external and
//! load-balancer IPs) to a dummy interface so the kernel accepts packets to them as local,
//! then lets IPVS take them. Mirrored here ([`LinkOps`]):
//!
//! * [`LinkOps::ensure_dummy`]: `ip link add kube-ipvs0 type dummy` when absent; an existing
//!   link of that name is accepted whatever its type, and the link is left DOWN (upstream
//!   never sets it up: the addresses are local either way);
//! * [`LinkOps::add_addresses`]: `ip addr add X/32 dev kube-ipvs0` (`/128` for IPv6), scope
//!   global, no flags (upstream sets neither a scope nor `nodad`); `EEXIST` counts as success;
//! * [`LinkOps::del_addresses`]: `ip addr del`; an address already absent (`EADDRNOTAVAIL`)
//!   counts as success;
//! * [`LinkOps::local_addresses`]: every address on every link, so the proxier can tell
//!   whether a load-balancer IP is already local on another interface.
//!
//! [`Links`] is the real implementation: one `NETLINK_ROUTE` socket (`netlink-sys`) in the
//! network namespace of the thread that creates it, speaking `netlink-packet-route`
//! messages synchronously. Address changes are batched: up to [`BATCH`] requests are
//! written with one `send`, then their acknowledgements are read and matched by sequence
//! number, so thousands of addresses take milliseconds, not one round trip each.
//! [`FakeLinks`] is an in-memory checking fake with fault injection.
//!
//! The maintained `rtnetlink` crate (0.24, on `netlink-packet-core` 0.9 like this crate) is
//! not used: it is async only (a tokio runtime per handle), sends one request per write, and
//! pulls a second `nix`; its message crate `netlink-packet-route` is used directly instead.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::IpAddr;
use std::time::Duration;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR,
    NetlinkBuffer, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage, AddressScope};
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkInfo, LinkMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};
use nix::errno::Errno;
use nix::sys::socket::{setsockopt, sockopt};
use nix::sys::time::{TimeVal, TimeValLike};

/// The dummy interface upstream kube-proxy's IPVS mode uses.
pub const KUBE_IPVS0: &str = "kube-ipvs0";

/// How many requests [`Links`] writes with one `send` before reading their answers.
pub const BATCH: usize = 256;

/// How long [`Links`] waits for each datagram of an answer.
pub const LINK_TIMEOUT: Duration = Duration::from_secs(5);

const RECV_BUFFER: usize = 256 * 1024;
const SOCKET_RCVBUF: usize = 4 << 20;

/// `Result` with [`LinkError`].
pub type LinkResult<T> = std::result::Result<T, LinkError>;

/// What can go wrong managing links and addresses.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The link does not exist (`ENODEV`).
    #[error("{op}: no link named {name:?}")]
    NoSuchLink {
        /// What was attempted.
        op: String,
        /// The link name.
        name: String,
    },
    /// The kernel cannot create `type dummy` links (no `dummy` driver built in or loadable:
    /// `EOPNOTSUPP`, "Unknown device type"). IPVS mode cannot work on such a kernel.
    #[error(
        "creating dummy link {name:?}: this kernel has no dummy link type (CONFIG_DUMMY; \
         `ip link add {name} type dummy` fails the same way)"
    )]
    DummyUnsupported {
        /// The link that was to be created.
        name: String,
    },
    /// A name the kernel would refuse (empty, longer than 15 bytes, `/`, whitespace).
    #[error("invalid link name {name:?}")]
    InvalidName {
        /// The name.
        name: String,
    },
    /// The kernel refused the request with this (positive) errno.
    #[error("{op}: the kernel answered {} ({code})", Errno::from_raw(*code).desc())]
    Kernel {
        /// What was attempted.
        op: String,
        /// The errno.
        code: i32,
    },
    /// A socket call failed.
    #[error("{op}: {source}")]
    Io {
        /// What was attempted.
        op: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// No answer within [`LINK_TIMEOUT`], or an answer that cannot be decoded.
    #[error("{op}: {detail}")]
    Protocol {
        /// What was attempted.
        op: String,
        /// What went wrong.
        detail: String,
    },
}

impl LinkError {
    /// The errno behind the error, if any (`ENODEV` for [`LinkError::NoSuchLink`],
    /// `EOPNOTSUPP` for [`LinkError::DummyUnsupported`]).
    pub fn code(&self) -> Option<i32> {
        match self {
            LinkError::NoSuchLink { .. } => Some(Errno::ENODEV as i32),
            LinkError::DummyUnsupported { .. } => Some(Errno::EOPNOTSUPP as i32),
            LinkError::Kernel { code, .. } => Some(*code),
            LinkError::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// Link and address operations the IPVS proxier needs; see the module documentation for
/// the upstream behaviour each mirrors. Implemented by [`Links`] and [`FakeLinks`].
pub trait LinkOps: Send {
    /// Creates a `type dummy` link `name` if no link of that name exists (left DOWN);
    /// returns its ifindex.
    ///
    /// # Errors
    /// [`LinkError::DummyUnsupported`] when the kernel has no dummy links,
    /// [`LinkError::InvalidName`], [`LinkError::Kernel`] / [`LinkError::Io`] otherwise.
    fn ensure_dummy(&mut self, name: &str) -> LinkResult<u32>;

    /// The ifindex of link `name`, `None` when there is none.
    ///
    /// # Errors
    /// Socket and kernel failures other than "no such link".
    fn link_index(&mut self, name: &str) -> LinkResult<Option<u32>>;

    /// The addresses (both families) on link `name`.
    ///
    /// # Errors
    /// [`LinkError::NoSuchLink`] when it does not exist.
    fn addresses(&mut self, name: &str) -> LinkResult<Vec<IpAddr>>;

    /// Adds each address as a host address (`/32`, `/128`, scope global) to link `name`;
    /// one result per address, in order (`EEXIST` is success).
    ///
    /// # Errors
    /// The outer error when the link does not exist ([`LinkError::NoSuchLink`]) or the
    /// socket fails; kernel refusals of single addresses are in the inner results.
    fn add_addresses(&mut self, name: &str, addrs: &[IpAddr]) -> LinkResult<Vec<LinkResult<()>>>;

    /// Removes each host address from link `name`; one result per address
    /// (`EADDRNOTAVAIL`, already absent, is success).
    ///
    /// # Errors
    /// As [`LinkOps::add_addresses`].
    fn del_addresses(&mut self, name: &str, addrs: &[IpAddr]) -> LinkResult<Vec<LinkResult<()>>>;

    /// Deletes link `name`; `false` when it did not exist.
    ///
    /// # Errors
    /// Kernel and socket failures.
    fn delete_link(&mut self, name: &str) -> LinkResult<bool>;

    /// Every address on every link, with the link's name, sorted.
    ///
    /// # Errors
    /// Kernel and socket failures.
    fn local_addresses(&mut self) -> LinkResult<Vec<(String, IpAddr)>>;
}

fn check_name(name: &str) -> LinkResult<()> {
    if name.is_empty()
        || name.len() > 15
        || name.contains('/')
        || name.chars().any(char::is_whitespace)
    {
        return Err(LinkError::InvalidName {
            name: name.to_string(),
        });
    }
    Ok(())
}

fn host_prefix(addr: &IpAddr) -> u8 {
    if addr.is_ipv4() { 32 } else { 128 }
}

/// The real [`LinkOps`] over a `NETLINK_ROUTE` socket in the creating thread's network
/// namespace (it keeps talking to that namespace from any thread). Needs `CAP_NET_ADMIN`
/// there for changes.
#[derive(Debug)]
pub struct Links {
    socket: Socket,
    seq: u32,
    buf: Vec<u8>,
}

/// One decoded answer.
enum Answer {
    Ack(u32),
    Error(u32, i32),
    Done(u32),
    Message(u32, RouteNetlinkMessage),
    Other,
}

impl Links {
    /// Opens the socket.
    ///
    /// # Errors
    /// [`LinkError::Io`] when it cannot be created, bound or configured.
    pub fn new() -> LinkResult<Links> {
        let op = "opening a NETLINK_ROUTE socket";
        let io = |what: &str, source: io::Error| LinkError::Io {
            op: format!("{op}: {what}"),
            source,
        };
        let mut socket = Socket::new(NETLINK_ROUTE).map_err(|e| io("socket", e))?;
        socket.bind_auto().map_err(|e| io("bind", e))?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(|e| io("connect", e))?;
        if let Err(e) = socket.set_rx_buf_sz(SOCKET_RCVBUF) {
            tracing::debug!("{op}: setting SO_RCVBUF: {e}");
        }
        let tv = TimeVal::microseconds(LINK_TIMEOUT.as_micros() as i64);
        setsockopt(&socket, sockopt::ReceiveTimeout, &tv)
            .map_err(|e| io("setting SO_RCVTIMEO", io::Error::from(e)))?;
        Ok(Links {
            socket,
            seq: 0,
            buf: vec![0; RECV_BUFFER],
        })
    }

    fn serialize(&mut self, flags: u16, message: RouteNetlinkMessage, out: &mut Vec<u8>) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = self.seq;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(message));
        packet.finalize();
        let start = out.len();
        out.resize(start + packet.buffer_len(), 0);
        packet.serialize(&mut out[start..]);
        self.seq
    }

    fn send(&self, data: &[u8], op: &str) -> LinkResult<()> {
        crate::nfsocket::send_whole(&self.socket, data).map_err(|source| LinkError::Io {
            op: op.to_string(),
            source,
        })
    }

    /// Reads one datagram and decodes its messages.
    fn recv(&mut self, op: &str) -> LinkResult<Vec<Answer>> {
        let n = loop {
            let mut chunk: &mut [u8] = &mut self.buf[..];
            match self.socket.recv(&mut chunk, 0) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.raw_os_error() == Some(Errno::EAGAIN as i32) => {
                    return Err(LinkError::Protocol {
                        op: op.to_string(),
                        detail: format!("no answer from the kernel within {LINK_TIMEOUT:?}"),
                    });
                }
                Err(source) => {
                    return Err(LinkError::Io {
                        op: op.to_string(),
                        source,
                    });
                }
            }
        };
        let mut answers = Vec::new();
        let mut offset = 0;
        let malformed = |detail: String| LinkError::Protocol {
            op: op.to_string(),
            detail: format!("malformed netlink reply: {detail}"),
        };
        while offset < n {
            let buf = NetlinkBuffer::new_checked(&self.buf[offset..n])
                .map_err(|e| malformed(e.to_string()))?;
            let len = buf.length() as usize;
            if len < 16 {
                return Err(malformed(format!("message length {len}")));
            }
            let seq = buf.sequence_number();
            let kind = buf.message_type();
            let bytes = &self.buf[offset..offset + len];
            offset += (len + 3) & !3;
            let answer = match kind {
                NLMSG_ERROR | NLMSG_DONE => {
                    let payload = &bytes[16..];
                    let code = payload
                        .get(..4)
                        .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                        .unwrap_or(0);
                    match (kind, code) {
                        (NLMSG_DONE, 0) => Answer::Done(seq),
                        (_, 0) => Answer::Ack(seq),
                        (_, c) => Answer::Error(seq, c.saturating_neg()),
                    }
                }
                _ => match NetlinkMessage::<RouteNetlinkMessage>::deserialize(bytes) {
                    Ok(m) => match m.payload {
                        NetlinkPayload::InnerMessage(inner) => Answer::Message(seq, inner),
                        _ => Answer::Other,
                    },
                    Err(e) => {
                        tracing::debug!("{op}: skipping an undecodable message: {e}");
                        Answer::Other
                    }
                },
            };
            answers.push(answer);
        }
        Ok(answers)
    }

    /// Sends the requests (each with `NLM_F_ACK`) in batches of [`BATCH`] and returns the
    /// errno (0 for success) of each, in order; `messages` of other types are collected
    /// into `replies`.
    fn transact(
        &mut self,
        flags: u16,
        requests: Vec<RouteNetlinkMessage>,
        op: &str,
        mut replies: Option<&mut Vec<RouteNetlinkMessage>>,
    ) -> LinkResult<Vec<i32>> {
        let mut codes = Vec::with_capacity(requests.len());
        let mut requests = requests.into_iter().peekable();
        while requests.peek().is_some() {
            let mut out = Vec::new();
            let mut pending: HashMap<u32, usize> = HashMap::new();
            let base = codes.len();
            for (i, req) in requests.by_ref().take(BATCH).enumerate() {
                let seq = self.serialize(flags | NLM_F_REQUEST | NLM_F_ACK, req, &mut out);
                pending.insert(seq, base + i);
                codes.push(i32::MIN);
            }
            self.send(&out, op)?;
            while !pending.is_empty() {
                for answer in self.recv(op)? {
                    match answer {
                        Answer::Ack(seq) | Answer::Done(seq) => {
                            if let Some(i) = pending.remove(&seq) {
                                codes[i] = 0;
                            }
                        }
                        Answer::Error(seq, code) => {
                            if let Some(i) = pending.remove(&seq) {
                                codes[i] = code;
                            }
                        }
                        Answer::Message(seq, m) => {
                            if pending.contains_key(&seq)
                                && let Some(r) = replies.as_deref_mut()
                            {
                                r.push(m);
                            }
                        }
                        Answer::Other => {}
                    }
                }
            }
        }
        Ok(codes)
    }

    /// A dump request: every message until `NLMSG_DONE`.
    fn dump(
        &mut self,
        request: RouteNetlinkMessage,
        op: &str,
    ) -> LinkResult<Vec<RouteNetlinkMessage>> {
        let mut out = Vec::new();
        let seq = self.serialize(NLM_F_REQUEST | NLM_F_DUMP, request, &mut out);
        self.send(&out, op)?;
        let mut messages = Vec::new();
        loop {
            for answer in self.recv(op)? {
                match answer {
                    Answer::Done(s) if s == seq => return Ok(messages),
                    Answer::Error(s, code) if s == seq => {
                        return Err(LinkError::Kernel {
                            op: op.to_string(),
                            code,
                        });
                    }
                    Answer::Message(s, m) if s == seq => messages.push(m),
                    _ => {}
                }
            }
        }
    }

    fn required_index(&mut self, name: &str, op: &str) -> LinkResult<u32> {
        self.link_index(name)?.ok_or_else(|| LinkError::NoSuchLink {
            op: op.to_string(),
            name: name.to_string(),
        })
    }

    fn address_message(index: u32, addr: &IpAddr) -> AddressMessage {
        let mut m = AddressMessage::default();
        m.header.family = if addr.is_ipv4() {
            AddressFamily::Inet
        } else {
            AddressFamily::Inet6
        };
        m.header.prefix_len = host_prefix(addr);
        m.header.scope = AddressScope::Universe;
        m.header.index = index;
        if addr.is_ipv4() {
            m.attributes.push(AddressAttribute::Local(*addr));
        }
        m.attributes.push(AddressAttribute::Address(*addr));
        m
    }

    fn change_addresses(
        &mut self,
        name: &str,
        addrs: &[IpAddr],
        add: bool,
    ) -> LinkResult<Vec<LinkResult<()>>> {
        let verb = if add { "add" } else { "del" };
        let op = format!("ip addr {verb} ... dev {name}");
        let index = self.required_index(name, &op)?;
        let requests = addrs
            .iter()
            .map(|a| {
                let m = Self::address_message(index, a);
                if add {
                    RouteNetlinkMessage::NewAddress(m)
                } else {
                    RouteNetlinkMessage::DelAddress(m)
                }
            })
            .collect();
        let flags = if add { NLM_F_CREATE | NLM_F_EXCL } else { 0 };
        let codes = self.transact(flags, requests, &op, None)?;
        let benign = if add {
            Errno::EEXIST
        } else {
            Errno::EADDRNOTAVAIL
        } as i32;
        Ok(codes
            .into_iter()
            .zip(addrs)
            .map(|(code, a)| match code {
                0 => Ok(()),
                c if c == benign => Ok(()),
                c if c == Errno::ENODEV as i32 => Err(LinkError::NoSuchLink {
                    op: format!("ip addr {verb} {a}/{} dev {name}", host_prefix(a)),
                    name: name.to_string(),
                }),
                code => Err(LinkError::Kernel {
                    op: format!("ip addr {verb} {a}/{} dev {name}", host_prefix(a)),
                    code,
                }),
            })
            .collect())
    }

    fn all_addresses(&mut self) -> LinkResult<Vec<(u32, IpAddr)>> {
        let messages = self.dump(
            RouteNetlinkMessage::GetAddress(AddressMessage::default()),
            "ip addr show",
        )?;
        let mut out = Vec::new();
        for m in messages {
            let RouteNetlinkMessage::NewAddress(m) = m else {
                continue;
            };
            let local = m.attributes.iter().find_map(|a| match a {
                AddressAttribute::Local(ip) => Some(*ip),
                _ => None,
            });
            let address = m.attributes.iter().find_map(|a| match a {
                AddressAttribute::Address(ip) => Some(*ip),
                _ => None,
            });
            if let Some(ip) = local.or(address) {
                out.push((m.header.index, ip));
            }
        }
        Ok(out)
    }
}

impl LinkOps for Links {
    fn ensure_dummy(&mut self, name: &str) -> LinkResult<u32> {
        check_name(name)?;
        if let Some(index) = self.link_index(name)? {
            return Ok(index);
        }
        let op = format!("ip link add {name} type dummy");
        let mut m = LinkMessage::default();
        m.attributes.push(LinkAttribute::IfName(name.to_string()));
        m.attributes
            .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(
                InfoKind::Dummy,
            )]));
        let codes = self.transact(
            NLM_F_CREATE | NLM_F_EXCL,
            vec![RouteNetlinkMessage::NewLink(m)],
            &op,
            None,
        )?;
        match codes[0] {
            0 => {}
            c if c == Errno::EEXIST as i32 => {}
            c if c == Errno::EOPNOTSUPP as i32 => {
                return Err(LinkError::DummyUnsupported {
                    name: name.to_string(),
                });
            }
            code => return Err(LinkError::Kernel { op, code }),
        }
        self.required_index(name, &op)
    }

    fn link_index(&mut self, name: &str) -> LinkResult<Option<u32>> {
        check_name(name)?;
        let op = format!("ip link show {name}");
        let mut m = LinkMessage::default();
        m.attributes.push(LinkAttribute::IfName(name.to_string()));
        let mut replies = Vec::new();
        let codes = self.transact(
            0,
            vec![RouteNetlinkMessage::GetLink(m)],
            &op,
            Some(&mut replies),
        )?;
        match codes[0] {
            0 => {}
            c if c == Errno::ENODEV as i32 => return Ok(None),
            code => return Err(LinkError::Kernel { op, code }),
        }
        Ok(replies.into_iter().find_map(|r| match r {
            RouteNetlinkMessage::NewLink(l) => Some(l.header.index),
            _ => None,
        }))
    }

    fn addresses(&mut self, name: &str) -> LinkResult<Vec<IpAddr>> {
        let index = self.required_index(name, &format!("ip addr show dev {name}"))?;
        let mut out: Vec<IpAddr> = self
            .all_addresses()?
            .into_iter()
            .filter(|(i, _)| *i == index)
            .map(|(_, a)| a)
            .collect();
        out.sort();
        Ok(out)
    }

    fn add_addresses(&mut self, name: &str, addrs: &[IpAddr]) -> LinkResult<Vec<LinkResult<()>>> {
        self.change_addresses(name, addrs, true)
    }

    fn del_addresses(&mut self, name: &str, addrs: &[IpAddr]) -> LinkResult<Vec<LinkResult<()>>> {
        self.change_addresses(name, addrs, false)
    }

    fn delete_link(&mut self, name: &str) -> LinkResult<bool> {
        let op = format!("ip link del {name}");
        let Some(index) = self.link_index(name)? else {
            return Ok(false);
        };
        let mut m = LinkMessage::default();
        m.header.index = index;
        let codes = self.transact(0, vec![RouteNetlinkMessage::DelLink(m)], &op, None)?;
        match codes[0] {
            0 => Ok(true),
            c if c == Errno::ENODEV as i32 => Ok(false),
            code => Err(LinkError::Kernel { op, code }),
        }
    }

    fn local_addresses(&mut self) -> LinkResult<Vec<(String, IpAddr)>> {
        let links = self.dump(
            RouteNetlinkMessage::GetLink(LinkMessage::default()),
            "ip link show",
        )?;
        let names: BTreeMap<u32, String> = links
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => l.attributes.iter().find_map(|a| match a {
                    LinkAttribute::IfName(n) => Some((l.header.index, n.clone())),
                    _ => None,
                }),
                _ => None,
            })
            .collect();
        let mut out: Vec<(String, IpAddr)> = self
            .all_addresses()?
            .into_iter()
            .map(|(i, a)| {
                (
                    names.get(&i).cloned().unwrap_or_else(|| format!("if{i}")),
                    a,
                )
            })
            .collect();
        out.sort();
        Ok(out)
    }
}

/// An in-memory [`LinkOps`] with the kernel's checks: addresses on a missing link fail
/// with [`LinkError::NoSuchLink`] (`ENODEV`), adding an existing address and deleting a
/// missing one succeed, as in [`Links`]. Starts with `lo` (index 1, `127.0.0.1`, `::1`).
///
/// Fault injection: [`FakeLinks::without_dummy`] (a kernel with no dummy links),
/// [`FakeLinks::fail_address`] (one address refused with an errno),
/// [`FakeLinks::add_link`] (a link of another kind, e.g. the node's `eth0` with its IPs).
#[derive(Debug, Clone)]
pub struct FakeLinks {
    links: BTreeMap<String, (u32, Vec<IpAddr>)>,
    next_index: u32,
    dummy_supported: bool,
    fail: HashMap<IpAddr, i32>,
    calls: usize,
}

impl Default for FakeLinks {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeLinks {
    /// A namespace with only `lo`.
    pub fn new() -> FakeLinks {
        let lo = vec![
            IpAddr::from([127, 0, 0, 1]),
            IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
        ];
        FakeLinks {
            links: BTreeMap::from([("lo".to_string(), (1, lo))]),
            next_index: 2,
            dummy_supported: true,
            fail: HashMap::new(),
            calls: 0,
        }
    }

    /// A kernel without dummy links: [`LinkOps::ensure_dummy`] of a new link fails with
    /// [`LinkError::DummyUnsupported`].
    pub fn without_dummy(mut self) -> FakeLinks {
        self.dummy_supported = false;
        self
    }

    /// Adds a link `name` (any kind) carrying `addrs`; returns its index.
    pub fn add_link(&mut self, name: &str, addrs: &[IpAddr]) -> u32 {
        let index = self.next_index;
        self.next_index += 1;
        self.links.insert(name.to_string(), (index, addrs.to_vec()));
        index
    }

    /// Makes every later add or delete of `addr` fail with errno `code`.
    pub fn fail_address(&mut self, addr: IpAddr, code: i32) {
        self.fail.insert(addr, code);
    }

    /// How many [`LinkOps`] calls were made.
    pub fn calls(&self) -> usize {
        self.calls
    }

    fn link_mut(&mut self, name: &str, op: &str) -> LinkResult<&mut (u32, Vec<IpAddr>)> {
        self.links
            .get_mut(name)
            .ok_or_else(|| LinkError::NoSuchLink {
                op: op.to_string(),
                name: name.to_string(),
            })
    }

    fn change(
        &mut self,
        name: &str,
        addrs: &[IpAddr],
        add: bool,
    ) -> LinkResult<Vec<LinkResult<()>>> {
        self.calls += 1;
        let verb = if add { "add" } else { "del" };
        let fail = self.fail.clone();
        let link = self.link_mut(name, &format!("ip addr {verb} ... dev {name}"))?;
        Ok(addrs
            .iter()
            .map(|a| {
                if let Some(code) = fail.get(a) {
                    return Err(LinkError::Kernel {
                        op: format!("ip addr {verb} {a}/{} dev {name}", host_prefix(a)),
                        code: *code,
                    });
                }
                let pos = link.1.iter().position(|x| x == a);
                match (add, pos) {
                    (true, None) => link.1.push(*a),
                    (false, Some(p)) => {
                        link.1.remove(p);
                    }
                    _ => {}
                }
                Ok(())
            })
            .collect())
    }
}

impl LinkOps for FakeLinks {
    fn ensure_dummy(&mut self, name: &str) -> LinkResult<u32> {
        self.calls += 1;
        check_name(name)?;
        if let Some((index, _)) = self.links.get(name) {
            return Ok(*index);
        }
        if !self.dummy_supported {
            return Err(LinkError::DummyUnsupported {
                name: name.to_string(),
            });
        }
        Ok(self.add_link(name, &[]))
    }

    fn link_index(&mut self, name: &str) -> LinkResult<Option<u32>> {
        self.calls += 1;
        check_name(name)?;
        Ok(self.links.get(name).map(|(i, _)| *i))
    }

    fn addresses(&mut self, name: &str) -> LinkResult<Vec<IpAddr>> {
        self.calls += 1;
        let mut out = self
            .link_mut(name, &format!("ip addr show dev {name}"))?
            .1
            .clone();
        out.sort();
        Ok(out)
    }

    fn add_addresses(&mut self, name: &str, addrs: &[IpAddr]) -> LinkResult<Vec<LinkResult<()>>> {
        self.change(name, addrs, true)
    }

    fn del_addresses(&mut self, name: &str, addrs: &[IpAddr]) -> LinkResult<Vec<LinkResult<()>>> {
        self.change(name, addrs, false)
    }

    fn delete_link(&mut self, name: &str) -> LinkResult<bool> {
        self.calls += 1;
        Ok(self.links.remove(name).is_some())
    }

    fn local_addresses(&mut self) -> LinkResult<Vec<(String, IpAddr)>> {
        self.calls += 1;
        let mut out: Vec<(String, IpAddr)> = self
            .links
            .iter()
            .flat_map(|(n, (_, addrs))| addrs.iter().map(move |a| (n.clone(), *a)))
            .collect();
        out.sort();
        Ok(out)
    }
}
