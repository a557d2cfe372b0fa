//! IPVS (the kernel's IP Virtual Server) over generic netlink: the message layer
//! kube-proxy's IPVS mode needs.
//!
//! * [`IpvsOps`]: the seam the proxier uses: [`IpvsOps::info`] (`IPVS_CMD_GET_INFO`),
//!   [`IpvsOps::services`] / [`IpvsOps::destinations`] (dumps, like `ipvsadm -Ln`),
//!   [`IpvsOps::apply`] (a batch of [`IpvsOp`]s, like `ipvsadm -R`) and
//!   [`IpvsOps::flush`] (`ipvsadm -C`); [`IpvsOps::timeouts`] /
//!   [`IpvsOps::set_timeouts`] (`IPVS_CMD_GET_CONFIG` / `IPVS_CMD_SET_CONFIG`, like
//!   `ipvsadm -L --timeout` / `ipvsadm --set`). Also implemented for `&mut T`, `Box<T>`
//!   and `Arc<Mutex<T>>` (a handle shared between threads).
//! * [`Ipvs`]: the real implementation, a `NETLINK_GENERIC` socket talking to the `IPVS`
//!   family of the calling thread's network namespace.
//! * [`FakeIpvs`]: an in-memory table answering like the kernel's `ip_vs_ctl.c` (the same
//!   errno for the same mistake), with fault injection, for tests without a kernel.
//! * [`save_text`] / [`parse_save_text`] / [`list_text`]: `ipvsadm -Sn` and `ipvsadm -Ln`
//!   text, for dumps read by the packet tracer and for humans.
//! * [`scheduler_probe`]: whether the kernel has a scheduler, checked as upstream
//!   kube-proxy does at start-up (add and delete a dummy virtual server using it).
//! * [`scripted_round_trip`]: a fixed add / dump / edit / delete / flush script, so a test
//!   in a guest kernel with IPVS can compare the kernel with [`FakeIpvs`].
//!
//! The wire format follows the kernel's UAPI header `include/uapi/linux/ip_vs.h` and
//! `net/netfilter/ipvs/ip_vs_ctl.c` (which attributes each command requires); the
//! generic netlink header and the controller (`nlctrl`) lookup of the family name `IPVS`
//! come from the `netlink-packet-generic` crate. Its payload trait
//! ([`netlink_packet_generic::GenlFamily`]) fits the IPVS family as is: the IPVS
//! attributes themselves are built and walked here (module `wire`), with
//! `netlink-packet-core`'s attribute buffers, because no maintained crate describes them.
//!
//! Only virtual servers addressed by (address, protocol, port) are modelled; firewall-mark
//! services (`ipvsadm -f`), which kube-proxy never creates, are skipped in dumps with a
//! warning.
//!
//! ```no_run
//! use kp_netlink::{Ipvs, IpvsOp, IpvsOps, RealServer, ServiceKey, VirtualServer, proto};
//!
//! // Must run on a thread inside the node's network namespace.
//! let mut ipvs = Ipvs::new()?;
//! let key = ServiceKey::new("10.96.0.1".parse()?, proto::TCP, 443);
//! let results = ipvs.apply(&[
//!     IpvsOp::AddService(VirtualServer::new(key, "rr")),
//!     IpvsOp::AddDest(key, RealServer::new("192.168.56.10".parse()?, 6443, 1)),
//! ])?;
//! for result in results {
//!     if let Err(e) = result {
//!         eprintln!("{e}");
//!     }
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod fake;
mod script;
mod socket;
mod text;
mod wire;

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use nix::errno::Errno;

pub use fake::{DEFAULT_SCHEDULERS, FakeIpvs};
pub use script::{RoundTripStep, scripted_round_trip};
pub use socket::{BATCH_BYTES, Captured, Direction, Ipvs};
pub use text::{ParseError, list_text, parse_save_text, save_text};

use crate::error::{Error, Result, errno_name};
use crate::flow::proto;

/// `IP_VS_SVC_F_PERSISTENT`: persistent service (`ipvsadm -p`): a client sticks to one
/// real server for [`VirtualServer::timeout`] seconds.
pub const SVC_F_PERSISTENT: u32 = 0x0001;
/// `IP_VS_SVC_F_HASHED`: set by the kernel on every service in its table; ignored by
/// [`VirtualServer::same_config`] and never sent.
pub const SVC_F_HASHED: u32 = 0x0002;
/// `IP_VS_SVC_F_ONEPACKET`: one-packet scheduling (`ipvsadm -o`, UDP).
pub const SVC_F_ONEPACKET: u32 = 0x0004;
/// `IP_VS_SVC_F_SCHED1`: scheduler flag 1 (`sh-fallback` for `sh`, `mh-fallback` for `mh`).
pub const SVC_F_SCHED1: u32 = 0x0008;
/// `IP_VS_SVC_F_SCHED2`: scheduler flag 2 (`sh-port` for `sh`, `mh-port` for `mh`).
pub const SVC_F_SCHED2: u32 = 0x0010;
/// `IP_VS_SVC_F_SCHED3`: scheduler flag 3 (`flag-3`).
pub const SVC_F_SCHED3: u32 = 0x0020;

/// `IP_VS_SCHEDNAME_MAXLEN`: a scheduler name has at most 15 bytes (16 with the NUL).
pub const SCHED_NAME_MAX: usize = 15;

/// The address a [`scheduler_probe`] creates its dummy virtual server on (TEST-NET-2,
/// port 20000, TCP, like upstream kube-proxy's check).
pub const PROBE_ADDR: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 0);
/// The port of the [`scheduler_probe`] dummy.
pub const PROBE_PORT: u16 = 20000;

/// What identifies a virtual server: address, protocol, port. The address family is the
/// address's.
///
/// Ordered by address, then protocol, then port. Displayed like `ipvsadm -Ln` names it:
/// `TCP 10.96.0.1:443`, `UDP [fd00::a]:53`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey {
    /// The virtual IP.
    pub addr: IpAddr,
    /// `IPPROTO_TCP` (6), `IPPROTO_UDP` (17) or `IPPROTO_SCTP` (132); see [`crate::proto`].
    pub protocol: u8,
    /// The virtual port.
    pub port: u16,
}

impl ServiceKey {
    /// A key.
    pub fn new(addr: IpAddr, protocol: u8, port: u16) -> ServiceKey {
        ServiceKey {
            addr,
            protocol,
            port,
        }
    }

    /// The virtual IP and port.
    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::new(self.addr, self.port)
    }
}

/// `TCP`, `UDP`, `SCTP` as ipvsadm prints them; other protocols by number.
pub(crate) fn protocol_name(protocol: u8) -> String {
    match protocol {
        proto::TCP => "TCP".into(),
        proto::UDP => "UDP".into(),
        proto::SCTP => "SCTP".into(),
        n => format!("proto-{n}"),
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", protocol_name(self.protocol), self.socket_addr())
    }
}

/// A virtual server (an IPVS "service"), as `ipvsadm -A` creates it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VirtualServer {
    /// Address, protocol and port.
    pub key: ServiceKey,
    /// The scheduler's name (`rr`, `wrr`, `lc`, `sh`, `mh`, ...; at most
    /// [`SCHED_NAME_MAX`] bytes), i.e. the kernel module `ip_vs_<name>`.
    pub scheduler: String,
    /// `IP_VS_SVC_F_*` flags: [`SVC_F_PERSISTENT`], [`SVC_F_ONEPACKET`],
    /// [`SVC_F_SCHED1`]..[`SVC_F_SCHED3`]. Dumps also carry [`SVC_F_HASHED`], which the
    /// kernel sets; it is stripped when sending.
    pub flags: u32,
    /// Persistence timeout in seconds (meaningful with [`SVC_F_PERSISTENT`]).
    pub timeout: u32,
    /// Persistence granularity as the kernel stores it: for IPv6 a prefix length (128:
    /// per client address); for IPv4 the mask's four octets in network order read as a
    /// native-endian `u32` (`0xffff_ffff`: per client address; see [`netmask_v4`]).
    pub netmask: u32,
}

/// The [`VirtualServer::netmask`] value for an IPv4 mask such as `255.255.255.0`.
pub fn netmask_v4(mask: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(mask.octets())
}

/// The default [`VirtualServer::netmask`] for a family: `0xffff_ffff` for IPv4, 128 for
/// IPv6 (what ipvsadm sends without `-M`).
pub fn default_netmask(addr: &IpAddr) -> u32 {
    match addr {
        IpAddr::V4(_) => u32::MAX,
        IpAddr::V6(_) => 128,
    }
}

impl VirtualServer {
    /// A non-persistent virtual server with the family's default netmask and no flags.
    pub fn new(key: ServiceKey, scheduler: &str) -> VirtualServer {
        VirtualServer {
            key,
            scheduler: scheduler.to_owned(),
            flags: 0,
            timeout: 0,
            netmask: default_netmask(&key.addr),
        }
    }

    /// Makes it persistent (`ipvsadm -p timeout`, upstream's session affinity).
    pub fn persistent(mut self, timeout: u32) -> VirtualServer {
        self.flags |= SVC_F_PERSISTENT;
        self.timeout = timeout;
        self
    }

    /// Whether `other` has the same configuration: everything but the kernel-set
    /// [`SVC_F_HASHED`] flag is compared.
    pub fn same_config(&self, other: &VirtualServer) -> bool {
        VirtualServer {
            flags: self.flags & !SVC_F_HASHED,
            ..self.clone()
        } == VirtualServer {
            flags: other.flags & !SVC_F_HASHED,
            ..other.clone()
        }
    }
}

/// How packets reach a real server (`IP_VS_CONN_F_FWD_MASK` bits of the connection
/// flags; `IPVS_DEST_ATTR_FWD_METHOD`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Forward {
    /// `IP_VS_CONN_F_MASQ` (0): NAT (`ipvsadm -m`); what kube-proxy uses.
    Masq,
    /// `IP_VS_CONN_F_LOCALNODE` (1): the real server is local.
    Local,
    /// `IP_VS_CONN_F_TUNNEL` (2): IP-in-IP (`ipvsadm -i`).
    Tunnel,
    /// `IP_VS_CONN_F_DROUTE` (3): direct routing (`ipvsadm -g`).
    Route,
    /// `IP_VS_CONN_F_BYPASS` (4): cache-cluster bypass.
    Bypass,
}

impl Forward {
    /// The kernel's value.
    pub fn code(self) -> u32 {
        match self {
            Forward::Masq => 0,
            Forward::Local => 1,
            Forward::Tunnel => 2,
            Forward::Route => 3,
            Forward::Bypass => 4,
        }
    }

    /// The method of a kernel value (its `IP_VS_CONN_F_FWD_MASK` bits), if known.
    pub fn from_code(code: u32) -> Option<Forward> {
        Some(match code & 0x7 {
            0 => Forward::Masq,
            1 => Forward::Local,
            2 => Forward::Tunnel,
            3 => Forward::Route,
            4 => Forward::Bypass,
            _ => return None,
        })
    }

    /// The name `ipvsadm -Ln` prints: `Masq`, `Local`, `Tunnel`, `Route`, `Bypass`.
    pub fn name(self) -> &'static str {
        match self {
            Forward::Masq => "Masq",
            Forward::Local => "Local",
            Forward::Tunnel => "Tunnel",
            Forward::Route => "Route",
            Forward::Bypass => "Bypass",
        }
    }
}

/// A real server (an IPVS "destination") of a virtual server, as `ipvsadm -a` adds it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RealServer {
    /// Its address (normally of the virtual server's family; the kernel accepts another
    /// family only with [`Forward::Tunnel`]).
    pub addr: IpAddr,
    /// Its port.
    pub port: u16,
    /// Scheduling weight; 0 quiesces it (no new connections). The kernel stores an `int`
    /// and refuses values above `i32::MAX` with `ERANGE`.
    pub weight: u32,
    /// The forwarding method.
    pub forward: Forward,
    /// Active connections (`ActiveConn` of `ipvsadm -Ln`); read from dumps, ignored when
    /// sending.
    pub active_conns: u32,
    /// Inactive connections (`InActConn`); read from dumps, ignored when sending.
    pub inactive_conns: u32,
}

impl RealServer {
    /// A masquerading real server without connections.
    pub fn new(addr: IpAddr, port: u16, weight: u32) -> RealServer {
        RealServer {
            addr,
            port,
            weight,
            forward: Forward::Masq,
            active_conns: 0,
            inactive_conns: 0,
        }
    }

    /// Its address and port, which identify it within a virtual server.
    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::new(self.addr, self.port)
    }

    /// Whether `other` has the same configuration (address, port, weight, forwarding),
    /// ignoring the connection counters.
    pub fn same_config(&self, other: &RealServer) -> bool {
        (self.addr, self.port, self.weight, self.forward)
            == (other.addr, other.port, other.weight, other.forward)
    }
}

/// One change to the IPVS table, as one netlink request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IpvsOp {
    /// `IPVS_CMD_NEW_SERVICE` (`ipvsadm -A`); `EEXIST` if the key exists, `ENOENT` for an
    /// unknown scheduler.
    AddService(VirtualServer),
    /// `IPVS_CMD_SET_SERVICE` (`ipvsadm -E`): scheduler, flags, timeout, netmask;
    /// `ESRCH` if the key does not exist.
    EditService(VirtualServer),
    /// `IPVS_CMD_DEL_SERVICE` (`ipvsadm -D`), with its real servers; `ESRCH` if missing.
    DelService(ServiceKey),
    /// `IPVS_CMD_NEW_DEST` (`ipvsadm -a`); `ESRCH` without the service, `EEXIST` if the
    /// real server exists, `ERANGE` for a weight above `i32::MAX`.
    AddDest(ServiceKey, RealServer),
    /// `IPVS_CMD_SET_DEST` (`ipvsadm -e`): weight and forwarding; `ENOENT` if missing.
    EditDest(ServiceKey, RealServer),
    /// `IPVS_CMD_DEL_DEST` (`ipvsadm -d`); `ENOENT` if missing.
    DelDest(ServiceKey, SocketAddr),
}

impl IpvsOp {
    /// The virtual server the operation is about.
    pub fn key(&self) -> ServiceKey {
        match self {
            IpvsOp::AddService(vs) | IpvsOp::EditService(vs) => vs.key,
            IpvsOp::DelService(key)
            | IpvsOp::AddDest(key, _)
            | IpvsOp::EditDest(key, _)
            | IpvsOp::DelDest(key, _) => *key,
        }
    }

    /// "adding virtual server TCP 10.96.0.1:443 (like `ipvsadm -A -t 10.96.0.1:443 -s rr`)".
    pub fn describe(&self) -> String {
        let (what, command) = match self {
            IpvsOp::AddService(vs) => (
                format!("adding virtual server {}", vs.key),
                text::service_rule("-A", vs),
            ),
            IpvsOp::EditService(vs) => (
                format!("editing virtual server {}", vs.key),
                text::service_rule("-E", vs),
            ),
            IpvsOp::DelService(key) => (
                format!("deleting virtual server {key}"),
                format!("-D {}", text::service_name(key)),
            ),
            IpvsOp::AddDest(key, rs) => (
                format!("adding real server {} to {key}", rs.socket_addr()),
                text::dest_rule("-a", key, rs),
            ),
            IpvsOp::EditDest(key, rs) => (
                format!("editing real server {} of {key}", rs.socket_addr()),
                text::dest_rule("-e", key, rs),
            ),
            IpvsOp::DelDest(key, dest) => (
                format!("deleting real server {dest} of {key}"),
                format!(
                    "-d {} -r {}",
                    text::service_name(key),
                    text::addr_port(dest)
                ),
            ),
        };
        format!("{what} (like `ipvsadm {command}`)")
    }
}

impl fmt::Display for IpvsOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

/// Why one [`IpvsOp`] of a batch failed: the kernel's answer to its request (or, for a
/// request that cannot be encoded, the errno the kernel would give, without sending).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op}: the kernel answered {} ({code})", errno_name(*code))]
pub struct OpError {
    /// The operation, described like [`IpvsOp::describe`].
    pub op: String,
    /// The positive errno (`EEXIST`, `ESRCH`, `ENOENT`, `ERANGE`, `EINVAL`, `EPERM`...).
    pub code: i32,
}

impl OpError {
    /// An error for `op` with `code`.
    pub fn new(op: &IpvsOp, code: Errno) -> OpError {
        OpError {
            op: op.describe(),
            code: code as i32,
        }
    }

    /// The errno as [`Errno`].
    pub fn errno(&self) -> Errno {
        Errno::from_raw(self.code)
    }
}

/// What `IPVS_CMD_GET_INFO` reports (the first line of `ipvsadm -Ln`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpvsInfo {
    /// `IP_VS_VERSION_CODE` as (major, minor, patch): (1, 2, 1) on every kernel since 2.6.
    pub version: (u8, u8, u8),
    /// The connection hash table's size (`ip_vs_conn_tab_bits`, 4096 by default).
    pub conn_table_size: u32,
}

/// The IPVS connection timeouts of a network namespace, in seconds, as `ipvsadm --set tcp
/// tcpfin udp` sets them and `ipvsadm -L --timeout` prints them (upstream kube-proxy's
/// `--ipvs-tcp-timeout`, `--ipvs-tcpfin-timeout`, `--ipvs-udp-timeout`).
///
/// * `tcp`: idle timeout of an established TCP connection (`IPVS_CMD_ATTR_TIMEOUT_TCP`;
///   the kernel's default 900);
/// * `tcp_fin`: a TCP connection after the FIN (`IPVS_CMD_ATTR_TIMEOUT_TCP_FIN`; 120);
/// * `udp`: a UDP "connection" (`IPVS_CMD_ATTR_TIMEOUT_UDP`; 300).
///
/// When setting ([`IpvsOps::set_timeouts`]) 0 leaves that timeout unchanged, as with
/// ipvsadm and upstream kube-proxy (whose flags default to 0). When reading
/// ([`IpvsOps::timeouts`]) 0 means the kernel did not report it (a protocol not built in).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct IpvsTimeouts {
    /// Established TCP connections, seconds.
    pub tcp: u32,
    /// TCP connections after a FIN, seconds.
    pub tcp_fin: u32,
    /// UDP, seconds.
    pub udp: u32,
}

impl IpvsTimeouts {
    /// The kernel's defaults: 900 s, 120 s, 300 s (`tcp_timeouts[]` and `udp_timeouts[]`
    /// of `ip_vs_proto_tcp.c` / `ip_vs_proto_udp.c`).
    pub const KERNEL_DEFAULTS: IpvsTimeouts = IpvsTimeouts {
        tcp: 900,
        tcp_fin: 120,
        udp: 300,
    };

    /// Timeouts with these three values.
    pub fn new(tcp: u32, tcp_fin: u32, udp: u32) -> IpvsTimeouts {
        IpvsTimeouts { tcp, tcp_fin, udp }
    }

    /// `other` where it is non-zero, `self` elsewhere: what the kernel keeps after
    /// setting `other` on a namespace whose timeouts are `self`.
    pub fn updated_by(self, other: IpvsTimeouts) -> IpvsTimeouts {
        let pick = |new: u32, old: u32| if new == 0 { old } else { new };
        IpvsTimeouts {
            tcp: pick(other.tcp, self.tcp),
            tcp_fin: pick(other.tcp_fin, self.tcp_fin),
            udp: pick(other.udp, self.udp),
        }
    }
}

impl fmt::Display for IpvsTimeouts {
    /// Like `ipvsadm -L --timeout`: `Timeout (tcp tcpfin udp): 900 120 300`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Timeout (tcp tcpfin udp): {} {} {}",
            self.tcp, self.tcp_fin, self.udp
        )
    }
}

/// The largest timeout the kernel accepts: `ip_vs_set_timeout` refuses values above
/// `INT_MAX / HZ` with `EINVAL`. This is the bound for `HZ` = 1000 (the largest `HZ`
/// Linux offers), so it is accepted by every kernel; [`FakeIpvs`] refuses values above
/// it. Debian's kernels (`HZ` = 250) accept up to 8,589,934.
pub const TIMEOUT_MAX: u32 = (i32::MAX / 1000) as u32;

/// The error the default [`IpvsOps::timeouts`] / [`IpvsOps::set_timeouts`] return.
fn timeouts_unsupported(op: &str) -> Error {
    Error::Unsupported {
        op: op.to_owned(),
        reason: "this IpvsOps implementation does not manage IPVS timeouts".to_owned(),
    }
}

/// IPVS table operations: the seam between the proxier and the kernel.
///
/// Implemented by [`Ipvs`] (the kernel, over generic netlink) and [`FakeIpvs`] (in
/// memory). The proxier reads the table with [`IpvsOps::services`] and
/// [`IpvsOps::destinations`], computes the difference to what it wants, and sends it with
/// one [`IpvsOps::apply`].
pub trait IpvsOps: Send {
    /// The IPVS version and connection table size (`IPVS_CMD_GET_INFO`).
    ///
    /// # Errors
    ///
    /// [`Error::IpvsUnavailable`] when the kernel has no IPVS; [`Error::Kernel`],
    /// [`Error::Io`], [`Error::Timeout`], [`Error::Malformed`] otherwise.
    fn info(&mut self) -> Result<IpvsInfo>;

    /// Every virtual server (a dump of `IPVS_CMD_GET_SERVICE`), in the kernel's order.
    /// Flags include the kernel's [`SVC_F_HASHED`].
    ///
    /// # Errors
    ///
    /// As [`IpvsOps::info`], and [`Error::DumpIncomplete`] when every attempt was
    /// interrupted or lost messages.
    fn services(&mut self) -> Result<Vec<VirtualServer>>;

    /// The real servers of `svc` (a dump of `IPVS_CMD_GET_DEST`). A virtual server that
    /// does not exist has none: the kernel answers an empty dump, not an error.
    ///
    /// # Errors
    ///
    /// As [`IpvsOps::services`].
    fn destinations(&mut self, svc: &ServiceKey) -> Result<Vec<RealServer>>;

    /// Applies `ops` in order and returns one result per op, in the same order. A failed
    /// op does not stop the ones after it (the kernel processes each request on its own).
    /// The real implementation sends many requests per `sendmsg`, each with `NLM_F_ACK`,
    /// and matches the acknowledgements by sequence number.
    ///
    /// # Errors
    ///
    /// A top-level error (socket failure, timeout, lost acknowledgements) means the
    /// outcome of some ops is unknown: dump the table again before the next change.
    fn apply(&mut self, ops: &[IpvsOp]) -> Result<Vec<std::result::Result<(), OpError>>>;

    /// Deletes every virtual server and real server (`IPVS_CMD_FLUSH`, `ipvsadm -C`).
    ///
    /// # Errors
    ///
    /// As [`IpvsOps::info`].
    fn flush(&mut self) -> Result<()>;

    /// The namespace's connection timeouts (`IPVS_CMD_GET_CONFIG`, like `ipvsadm -L
    /// --timeout`).
    ///
    /// The default implementation returns [`Error::Unsupported`], so that implementers
    /// written before timeouts existed keep compiling; [`Ipvs`] and [`FakeIpvs`] implement
    /// it.
    ///
    /// # Errors
    ///
    /// As [`IpvsOps::info`], and [`Error::Unsupported`] from the default implementation.
    fn timeouts(&mut self) -> Result<IpvsTimeouts> {
        Err(timeouts_unsupported("reading IPVS timeouts"))
    }

    /// Sets the namespace's connection timeouts (`IPVS_CMD_SET_CONFIG`, like `ipvsadm
    /// --set tcp tcpfin udp`); a field of 0 leaves that timeout as it is.
    ///
    /// The default implementation returns [`Error::Unsupported`] (see
    /// [`IpvsOps::timeouts`]).
    ///
    /// # Errors
    ///
    /// [`Error::Kernel`] with `EINVAL` for a value above `INT_MAX / HZ` (see
    /// [`TIMEOUT_MAX`]), `EPERM` without `CAP_NET_ADMIN`; otherwise as [`IpvsOps::info`].
    fn set_timeouts(&mut self, timeouts: IpvsTimeouts) -> Result<()> {
        let _ = timeouts;
        Err(timeouts_unsupported("setting IPVS timeouts"))
    }
}

impl<T: IpvsOps + ?Sized> IpvsOps for &mut T {
    fn info(&mut self) -> Result<IpvsInfo> {
        (**self).info()
    }
    fn services(&mut self) -> Result<Vec<VirtualServer>> {
        (**self).services()
    }
    fn destinations(&mut self, svc: &ServiceKey) -> Result<Vec<RealServer>> {
        (**self).destinations(svc)
    }
    fn apply(&mut self, ops: &[IpvsOp]) -> Result<Vec<std::result::Result<(), OpError>>> {
        (**self).apply(ops)
    }
    fn flush(&mut self) -> Result<()> {
        (**self).flush()
    }
    fn timeouts(&mut self) -> Result<IpvsTimeouts> {
        (**self).timeouts()
    }
    fn set_timeouts(&mut self, timeouts: IpvsTimeouts) -> Result<()> {
        (**self).set_timeouts(timeouts)
    }
}

impl<T: IpvsOps + ?Sized> IpvsOps for Box<T> {
    fn info(&mut self) -> Result<IpvsInfo> {
        (**self).info()
    }
    fn services(&mut self) -> Result<Vec<VirtualServer>> {
        (**self).services()
    }
    fn destinations(&mut self, svc: &ServiceKey) -> Result<Vec<RealServer>> {
        (**self).destinations(svc)
    }
    fn apply(&mut self, ops: &[IpvsOp]) -> Result<Vec<std::result::Result<(), OpError>>> {
        (**self).apply(ops)
    }
    fn flush(&mut self) -> Result<()> {
        (**self).flush()
    }
    fn timeouts(&mut self) -> Result<IpvsTimeouts> {
        (**self).timeouts()
    }
    fn set_timeouts(&mut self, timeouts: IpvsTimeouts) -> Result<()> {
        (**self).set_timeouts(timeouts)
    }
}

/// A handle shared between threads: each call locks the mutex for its duration, so the
/// proxier and, say, a debug endpoint can use one [`Ipvs`] socket in turn. A mutex
/// poisoned by a panic in another holder is used anyway: the table lives in the kernel,
/// and every call is a complete exchange of its own.
impl<T: IpvsOps + ?Sized> IpvsOps for Arc<Mutex<T>> {
    fn info(&mut self) -> Result<IpvsInfo> {
        lock(self).info()
    }
    fn services(&mut self) -> Result<Vec<VirtualServer>> {
        lock(self).services()
    }
    fn destinations(&mut self, svc: &ServiceKey) -> Result<Vec<RealServer>> {
        lock(self).destinations(svc)
    }
    fn apply(&mut self, ops: &[IpvsOp]) -> Result<Vec<std::result::Result<(), OpError>>> {
        lock(self).apply(ops)
    }
    fn flush(&mut self) -> Result<()> {
        lock(self).flush()
    }
    fn timeouts(&mut self) -> Result<IpvsTimeouts> {
        lock(self).timeouts()
    }
    fn set_timeouts(&mut self, timeouts: IpvsTimeouts) -> Result<()> {
        lock(self).set_timeouts(timeouts)
    }
}

fn lock<T: ?Sized>(shared: &Mutex<T>) -> MutexGuard<'_, T> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Every virtual server with its real servers, dumped through `ops` (one dump of the
/// services, then one per service).
///
/// # Errors
///
/// The dumps' errors.
pub fn dump_all(ops: &mut dyn IpvsOps) -> Result<Vec<(VirtualServer, Vec<RealServer>)>> {
    let services = ops.services()?;
    let mut out = Vec::with_capacity(services.len());
    for vs in services {
        let dests = ops.destinations(&vs.key)?;
        out.push((vs, dests));
    }
    Ok(out)
}

/// Whether the kernel behind `ops` has the scheduler `sched`, checked the way upstream
/// kube-proxy does at start-up: add a dummy TCP virtual server [`PROBE_ADDR`]:[`PROBE_PORT`]
/// using it, then delete it again.
///
/// Returns `Ok(false)` when the kernel answers `ENOENT` (no module `ip_vs_<sched>`). A
/// dummy left behind by an earlier, interrupted probe (`EEXIST`) is deleted and the
/// probe repeated once.
///
/// # Errors
///
/// [`Error::Kernel`] for any other refusal (e.g. `EPERM`), and the errors of
/// [`IpvsOps::apply`].
pub fn scheduler_probe(ops: &mut dyn IpvsOps, sched: &str) -> Result<bool> {
    let key = ServiceKey::new(IpAddr::V4(PROBE_ADDR), proto::TCP, PROBE_PORT);
    let add = IpvsOp::AddService(VirtualServer::new(key, sched));
    let del = IpvsOp::DelService(key);
    for attempt in 0..2 {
        let result = ops.apply(std::slice::from_ref(&add))?.into_iter().next();
        match result {
            Some(Ok(())) => {
                if let Some(Err(e)) = ops.apply(std::slice::from_ref(&del))?.into_iter().next() {
                    tracing::warn!("scheduler probe: removing the dummy: {e}");
                }
                return Ok(true);
            }
            Some(Err(e)) if e.errno() == Errno::ENOENT => return Ok(false),
            Some(Err(e)) if e.errno() == Errno::EEXIST && attempt == 0 => {
                let _ = ops.apply(std::slice::from_ref(&del))?;
            }
            Some(Err(e)) => {
                return Err(Error::Kernel {
                    op: e.op,
                    code: e.code,
                });
            }
            None => {
                return Err(Error::Malformed {
                    op: add.describe(),
                    detail: "no result for the request".into(),
                });
            }
        }
    }
    Err(Error::Kernel {
        op: add.describe(),
        code: Errno::EEXIST as i32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_display_and_order_like_ipvsadm_names_them() {
        let v4 = ServiceKey::new("10.96.0.1".parse().unwrap(), proto::TCP, 443);
        let v6 = ServiceKey::new("fd00::a".parse().unwrap(), proto::UDP, 53);
        let sctp = ServiceKey::new("10.96.0.1".parse().unwrap(), proto::SCTP, 9);
        assert_eq!(v4.to_string(), "TCP 10.96.0.1:443");
        assert_eq!(v6.to_string(), "UDP [fd00::a]:53");
        assert_eq!(sctp.to_string(), "SCTP 10.96.0.1:9");
        let mut keys = vec![v6, sctp, v4];
        keys.sort();
        assert_eq!(keys, [v4, sctp, v6]);
    }

    #[test]
    fn same_config_ignores_what_the_kernel_adds() {
        let key = ServiceKey::new("10.96.0.1".parse().unwrap(), proto::TCP, 443);
        let ours = VirtualServer::new(key, "rr").persistent(10800);
        let mut dumped = ours.clone();
        dumped.flags |= SVC_F_HASHED;
        assert!(ours.same_config(&dumped));
        dumped.timeout = 1;
        assert!(!ours.same_config(&dumped));
        assert_eq!(VirtualServer::new(key, "rr").netmask, u32::MAX);
        let v6 = ServiceKey::new("fd00::1".parse().unwrap(), proto::TCP, 80);
        assert_eq!(VirtualServer::new(v6, "rr").netmask, 128);
        assert_eq!(
            netmask_v4(Ipv4Addr::new(255, 255, 255, 0)).to_ne_bytes(),
            [255, 255, 255, 0]
        );

        let rs = RealServer::new("10.0.0.4".parse().unwrap(), 6443, 1);
        let busy = RealServer {
            active_conns: 3,
            inactive_conns: 9,
            ..rs.clone()
        };
        assert!(rs.same_config(&busy));
        assert!(!rs.same_config(&RealServer { weight: 0, ..busy }));
    }

    #[test]
    fn forward_codes_round_trip() {
        for f in [
            Forward::Masq,
            Forward::Local,
            Forward::Tunnel,
            Forward::Route,
            Forward::Bypass,
        ] {
            assert_eq!(Forward::from_code(f.code()), Some(f));
        }
        assert_eq!(Forward::from_code(5), None);
        // Only the IP_VS_CONN_F_FWD_MASK bits count.
        assert_eq!(Forward::from_code(0x100 | 3), Some(Forward::Route));
    }

    #[test]
    fn ops_describe_themselves_as_ipvsadm_commands() {
        let key = ServiceKey::new("10.96.0.1".parse().unwrap(), proto::TCP, 443);
        let rs = RealServer::new("10.0.0.4".parse().unwrap(), 6443, 1);
        assert_eq!(
            IpvsOp::AddService(VirtualServer::new(key, "rr")).describe(),
            "adding virtual server TCP 10.96.0.1:443 (like `ipvsadm -A -t 10.96.0.1:443 -s rr`)"
        );
        assert_eq!(
            IpvsOp::AddDest(key, rs).describe(),
            "adding real server 10.0.0.4:6443 to TCP 10.96.0.1:443 \
             (like `ipvsadm -a -t 10.96.0.1:443 -r 10.0.0.4:6443 -m -w 1`)"
        );
        assert_eq!(
            IpvsOp::DelDest(key, "10.0.0.4:6443".parse().unwrap()).describe(),
            "deleting real server 10.0.0.4:6443 of TCP 10.96.0.1:443 \
             (like `ipvsadm -d -t 10.96.0.1:443 -r 10.0.0.4:6443`)"
        );
        let e = OpError::new(&IpvsOp::DelService(key), Errno::ESRCH);
        assert_eq!(
            e.to_string(),
            "deleting virtual server TCP 10.96.0.1:443 (like `ipvsadm -D -t 10.96.0.1:443`): \
             the kernel answered ESRCH: No such process (3)"
        );
    }

    #[test]
    fn timeouts_follow_ipvsadm_set() {
        let mut fake = FakeIpvs::new();
        assert_eq!(fake.timeouts().unwrap(), IpvsTimeouts::KERNEL_DEFAULTS);
        fake.set_timeouts(IpvsTimeouts::new(3600, 0, 0)).unwrap();
        assert_eq!(fake.timeouts().unwrap(), IpvsTimeouts::new(3600, 120, 300));
        fake.set_timeouts(IpvsTimeouts::new(0, 30, 60)).unwrap();
        assert_eq!(fake.timeouts().unwrap(), IpvsTimeouts::new(3600, 30, 60));
        fake.set_timeouts(IpvsTimeouts::default()).unwrap();
        assert_eq!(fake.timeouts().unwrap(), IpvsTimeouts::new(3600, 30, 60));
        let err = fake
            .set_timeouts(IpvsTimeouts::new(1, TIMEOUT_MAX + 1, 1))
            .unwrap_err();
        assert_eq!(err.code(), Some(Errno::EINVAL as i32));
        assert_eq!(fake.timeouts().unwrap(), IpvsTimeouts::new(3600, 30, 60));
        fake.set_timeouts(IpvsTimeouts::new(TIMEOUT_MAX, 1, 1))
            .unwrap();
        assert_eq!(
            IpvsTimeouts::KERNEL_DEFAULTS.to_string(),
            "Timeout (tcp tcpfin udp): 900 120 300"
        );
        assert!(matches!(
            FakeIpvs::unavailable().timeouts(),
            Err(Error::IpvsUnavailable { .. })
        ));
    }

    /// An implementer written before timeouts existed: only the required methods.
    struct Minimal;

    impl IpvsOps for Minimal {
        fn info(&mut self) -> Result<IpvsInfo> {
            Ok(IpvsInfo {
                version: (1, 2, 1),
                conn_table_size: 4096,
            })
        }
        fn services(&mut self) -> Result<Vec<VirtualServer>> {
            Ok(Vec::new())
        }
        fn destinations(&mut self, _: &ServiceKey) -> Result<Vec<RealServer>> {
            Ok(Vec::new())
        }
        fn apply(&mut self, ops: &[IpvsOp]) -> Result<Vec<std::result::Result<(), OpError>>> {
            Ok(vec![Ok(()); ops.len()])
        }
        fn flush(&mut self) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn timeouts_default_to_unsupported_and_wrappers_forward() {
        let mut minimal = Minimal;
        assert!(matches!(minimal.timeouts(), Err(Error::Unsupported { .. })));
        let err = minimal
            .set_timeouts(IpvsTimeouts::new(1, 2, 3))
            .unwrap_err();
        assert!(
            err.to_string().contains("does not manage IPVS timeouts"),
            "{err}"
        );

        // &mut, Box and Arc<Mutex> forward every method, the new ones included.
        fn set_through<O: IpvsOps>(mut ops: O) {
            ops.set_timeouts(IpvsTimeouts::new(1, 0, 0)).unwrap();
        }
        let mut fake = FakeIpvs::new();
        set_through(&mut fake);
        let mut boxed: Box<dyn IpvsOps> = Box::new(fake);
        assert_eq!(boxed.timeouts().unwrap().tcp, 1);
        let shared = Arc::new(Mutex::new(FakeIpvs::new()));
        let mut handle = Arc::clone(&shared);
        let key = ServiceKey::new("10.96.0.1".parse().unwrap(), proto::TCP, 443);
        std::thread::spawn(move || {
            handle
                .apply(&[IpvsOp::AddService(VirtualServer::new(key, "rr"))])
                .unwrap();
            handle.set_timeouts(IpvsTimeouts::new(0, 0, 7)).unwrap();
        })
        .join()
        .unwrap();
        let mut mine = Arc::clone(&shared);
        assert_eq!(dump_all(&mut mine).unwrap().len(), 1);
        assert_eq!(mine.timeouts().unwrap().udp, 7);
        assert_eq!(mine.info().unwrap().conn_table_size, 4096);
        // A trait object behind the mutex works too, and a poisoned mutex is still used.
        let dynamic: Arc<Mutex<dyn IpvsOps>> = Arc::new(Mutex::new(FakeIpvs::new()));
        let poisoner = Arc::clone(&dynamic);
        let _ = std::thread::spawn(move || {
            let _guard = poisoner.lock().unwrap();
            panic!("poison the mutex");
        })
        .join();
        let mut dynamic = dynamic;
        assert!(dynamic.flush().is_ok());
        assert_eq!(dynamic.services().unwrap().len(), 0);
        assert!(dynamic.destinations(&key).unwrap().is_empty());
    }

    #[test]
    fn scheduler_probe_adds_and_removes_a_dummy() {
        let mut fake = FakeIpvs::new().with_schedulers(["rr", "sh"]);
        assert!(scheduler_probe(&mut fake, "rr").unwrap());
        assert!(scheduler_probe(&mut fake, "sh").unwrap());
        assert!(!scheduler_probe(&mut fake, "mh").unwrap());
        assert!(fake.state().is_empty(), "the dummy is gone");

        // A dummy left behind is replaced.
        let key = ServiceKey::new(IpAddr::V4(PROBE_ADDR), proto::TCP, PROBE_PORT);
        fake.apply(&[IpvsOp::AddService(VirtualServer::new(key, "rr"))])
            .unwrap()[0]
            .clone()
            .unwrap();
        assert!(scheduler_probe(&mut fake, "sh").unwrap());
        assert!(fake.state().is_empty());

        fake.fail_next_apply(Errno::EPERM as i32);
        let err = scheduler_probe(&mut fake, "rr").unwrap_err();
        assert_eq!(err.code(), Some(Errno::EPERM as i32));
    }
}
