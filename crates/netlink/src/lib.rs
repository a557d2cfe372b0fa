//! kp-netlink: host adapters that talk netlink to the kernel.
//!
//! Two adapters: conntrack, for kube-proxy's UDP stale-entry cleanup (upstream issues
//! kubernetes#59368, #48370, #125467): after a sync that removes a UDP endpoint, or gives a
//! UDP Service its first endpoint, conntrack entries keep sending a client's datagrams (a DNS
//! resolver or a statsd client reusing one source port) to a dead or black-holed
//! destination until they are deleted.
//!
//! and IPVS ([`ipvs`]), the kernel load balancer behind kube-proxy's IPVS mode: the
//! seam [`IpvsOps`], the generic netlink implementation [`Ipvs`], the checking fake
//! [`FakeIpvs`], and `ipvsadm -Sn` / `-Ln` text ([`save_text`], [`parse_save_text`],
//! [`list_text`]).
//!
//! * [`ConntrackOps`]: the seam the proxier uses: [`ConntrackOps::dump`] (like
//!   `conntrack -L -f ipv4 -p udp`), [`ConntrackOps::delete`] (like `conntrack -D` with an
//!   entry's original tuple) and [`ConntrackOps::delete_matching`] (dump, then delete what a
//!   predicate selects).
//! * [`Conntrack`]: the real implementation, an `NETLINK_NETFILTER` socket speaking
//!   ctnetlink (`NFNL_SUBSYS_CTNETLINK`), created in the network namespace of the calling
//!   thread.
//! * [`FakeConntrack`]: an in-memory table with the kernel's delete semantics, for tests
//!   without a kernel.
//! * [`Flow`], [`Tuple`], [`Family`], [`Status`]: what an entry looks like. This crate knows
//!   nothing of Kubernetes: deciding which flows are stale is the caller's predicate.
//!
//! The [`link`] module manages the IPVS mode's dummy link `kube-ipvs0` and its addresses
//! over rtnetlink ([`link::LinkOps`], [`link::Links`], [`link::FakeLinks`]).
//!
//! The [`nfacct`] module reads and creates the kernel's named nfacct counters, which
//! iptables mode's `-m nfacct` matches feed and two of its metrics report
//! ([`NfacctOps`], [`Nfacct`], [`FakeNfacct`]).
//!
//! Netlink messages are built and parsed with the `netlink-packet-netfilter` types
//! (`ConntrackMessage`, `ConntrackAttribute`, tuples); the socket is `netlink-sys`. This
//! crate adds the request/reply loop (multipart dumps, `NLMSG_DONE`, `NLMSG_ERROR`, ENOBUFS
//! and `NLM_F_DUMP_INTR` retries, sequence numbers, a receive timeout), the attributes the
//! netfilter crate leaves raw (`CTA_ZONE`, `CTA_ID`), and the conversion to [`Flow`].
//!
//! ```no_run
//! use std::net::{IpAddr, SocketAddr};
//! use kp_netlink::{Conntrack, ConntrackOps, Family, proto};
//!
//! // Must run on a thread inside the node's network namespace.
//! let mut ct = Conntrack::new()?;
//! let service: SocketAddr = "10.96.0.53:53".parse()?;
//! let endpoint: IpAddr = "10.244.1.11".parse()?;
//! // Delete UDP entries to the Service that were not DNATed to the serving endpoint.
//! let deleted = ct.delete_matching(Family::V4, |flow| {
//!     flow.original.proto == proto::UDP
//!         && flow.original_dst() == service
//!         && flow.reply.src != endpoint
//! })?;
//! println!("deleted {deleted} stale entries");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod conntrack;
mod error;
mod fake;
mod flow;
pub mod ipvs;
pub mod link;
mod message;
pub mod nfacct;
mod nfsocket;

pub use conntrack::{Conntrack, ConntrackOps, DEFAULT_TIMEOUT, DUMP_ATTEMPTS};
pub use error::{Error, Result};
pub use fake::FakeConntrack;
pub use flow::{Family, Flow, Status, Tuple, proto};
pub use ipvs::{
    FakeIpvs, Forward, Ipvs, IpvsInfo, IpvsOp, IpvsOps, IpvsTimeouts, OpError, ParseError,
    RealServer, ServiceKey, VirtualServer, dump_all, list_text, parse_save_text, save_text,
    scheduler_probe,
};
pub use nfacct::{Counter as NfacctCounter, FakeNfacct, Nfacct, NfacctOps};
