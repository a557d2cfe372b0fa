//! The data path of kube-proxy's *userspace* proxy mode.
//!
//! In userspace mode the rules send traffic for a Service's ClusterIP:port to a local socket
//! owned by the proxy, one per Service port and protocol. [`Relay`] owns those sockets: for
//! every new TCP connection or UDP client it picks an endpoint round robin (optionally with
//! ClientIP session affinity), connects to it and relays bytes. Its selling point over the
//! kernel modes: when the chosen endpoint refuses or does not answer, the next one is tried,
//! so a client never sees a refused backend while another one works.
//!
//! The proxier drives it with one call, [`Relay::apply`], that states the full set of
//! listeners; the daemon reads [`Relay::listeners`] for metrics.
//!
//! # Design
//!
//! - **No thread per connection.** Listeners, TCP connections and UDP flows are tokio tasks
//!   on the runtime whose [`Handle`](tokio::runtime::Handle) is given to [`Relay::new`]: one
//!   accept (or receive) task per listener, one task per TCP connection (both directions are
//!   driven by the same task), one task per UDP flow.
//! - **TCP bytes never enter user space.** Each direction moves data with `splice(2)` from
//!   the source socket into a pipe and from the pipe into the destination socket. `splice`
//!   needs a pipe on one side, so a socket-to-socket relay needs one; each direction gets its
//!   own so that the two directions never block each other and a half-closed direction can
//!   finish on its own. Data sits in the pipe's kernel pages and is passed on by reference.
//! - **Bounded memory.** A direction only reads from its source when its pipe is empty, and
//!   only what the pipe holds (64 KiB by default); when the destination is slow the pipe stays
//!   full, the source is not read, and TCP flow control pushes back to the sender. Memory per
//!   connection is therefore about two pipes' kernel buffers (2 x 64 KiB) plus the sockets'
//!   own buffers, and under 1 KiB of task state; no user buffer grows.
//! - **File descriptors.** A TCP connection costs 2 sockets + 4 pipe fds = 6 fds, all owned
//!   (`OwnedFd`) and closed when the connection's task ends. A UDP flow costs 1 socket. See
//!   [`raise_fd_limit`] and [`RelayConfig::max_connections`].
//! - **UDP.** One flow per client address:port, with a connected socket towards its endpoint;
//!   replies go back *through the listening socket* (so conntrack can undo the redirect), and
//!   the flow ends after [`RelayConfig::udp_timeout`] without a packet in either direction.
//!   Datagrams are copied through 64 KiB buffers, one per listener (client to endpoint) and
//!   one per worker thread (replies), never one per flow.
//!
//! `splice` into a socket whose peer is gone reports `EPIPE`; like every Rust binary the
//! daemon runs with `SIGPIPE` ignored, so this is an ordinary error that closes the connection.
//!
//! Logging uses `tracing`; payload bytes are never logged.

mod balancer;
mod limit;
mod socket;
mod tcp;
mod udp;

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::balancer::Balancer;
use crate::limit::RateLimit;

pub use crate::socket::raise_fd_limit;

/// The transport protocol of a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// A TCP listener; each accepted connection is relayed to one endpoint.
    Tcp,
    /// A UDP socket; each client address:port is a flow relayed to one endpoint.
    Udp,
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
        })
    }
}

/// Relay-wide settings, fixed for the lifetime of a [`Relay`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayConfig {
    /// The address every listener binds: `0.0.0.0` for an IPv4 proxier, `::` for an IPv6 one
    /// (IPv6 sockets are opened with `IPV6_V6ONLY`, so the two families never share a port).
    pub bind: IpAddr,
    /// The inclusive range listener ports are taken from (`--proxy-port-range`); a new
    /// listener starts at a random port of the range and skips ports in use. `None`: the
    /// kernel picks an ephemeral port.
    pub port_range: Option<(u16, u16)>,
    /// A UDP flow ends after this long without a datagram in either direction
    /// (upstream's default: 250 ms).
    pub udp_timeout: Duration,
    /// The most TCP connections plus UDP flows open at once, across all listeners. A new
    /// connection or flow beyond it is refused (TCP: closed with a reset; UDP: the datagram is
    /// dropped) and counted in [`Relay::rejected_total`].
    pub max_connections: usize,
    /// Connect timeouts per attempt: attempt `i` (0-based) of a connection waits
    /// `dial_timeouts[min(i, len - 1)]`. Empty means the default `[250ms, 500ms, 1s, 2s]`.
    pub dial_timeouts: Vec<Duration>,
}

/// The default connect timeouts, upstream's userspace proxier's: 250 ms, 500 ms, 1 s, 2 s.
fn default_dial_timeouts() -> Vec<Duration> {
    [250, 500, 1000, 2000]
        .into_iter()
        .map(Duration::from_millis)
        .collect()
}

impl Default for RelayConfig {
    /// `0.0.0.0`, kernel-chosen ports, 250 ms UDP timeout, 20,000 connections,
    /// `[250ms, 500ms, 1s, 2s]` connect timeouts.
    fn default() -> Self {
        RelayConfig {
            bind: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            port_range: None,
            udp_timeout: Duration::from_millis(250),
            max_connections: 20_000,
            dial_timeouts: default_dial_timeouts(),
        }
    }
}

/// What one listener serves: one Service port and protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerSpec {
    /// The ServicePortName text, e.g. `default/web:http`; used in logs and stats only.
    pub name: String,
    /// TCP or UDP.
    pub protocol: Protocol,
    /// `sessionAffinity: ClientIP` with this timeout (a client IP keeps its endpoint while
    /// it used it less than this long ago); `None`: no affinity.
    pub affinity: Option<Duration>,
    /// The endpoints (`ip:port`) to relay to. Duplicates count once; empty is allowed (new
    /// connections are then closed and counted in [`ListenerStats::no_endpoint_total`]).
    /// Shared, not copied: the listener keeps this allocation.
    pub endpoints: Arc<[SocketAddr]>,
}

/// Why a listener could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// Binding the listening socket failed (other than "address in use" inside a port range,
    /// which moves on to the next port).
    #[error("cannot bind {protocol} {addr}: {source}")]
    Bind {
        /// TCP or UDP.
        protocol: Protocol,
        /// The address that was tried.
        addr: SocketAddr,
        /// The kernel's error.
        #[source]
        source: std::io::Error,
    },
    /// Every port of [`RelayConfig::port_range`] is in use for this protocol.
    #[error("no free {protocol} port in {}-{}", range.0, range.1)]
    PortRangeExhausted {
        /// TCP or UDP.
        protocol: Protocol,
        /// The inclusive range that was searched.
        range: (u16, u16),
    },
    /// [`RelayConfig::port_range`] is empty or starts at port 0.
    #[error("invalid port range {}-{}", range.0, range.1)]
    InvalidPortRange {
        /// The range as configured.
        range: (u16, u16),
    },
    /// Creating or configuring the socket failed (`socket`, `setsockopt`, `listen`, or
    /// registering it with the runtime).
    #[error("cannot set up {protocol} socket ({op}): {source}")]
    Socket {
        /// TCP or UDP.
        protocol: Protocol,
        /// The operation that failed.
        op: &'static str,
        /// The kernel's error.
        #[source]
        source: std::io::Error,
    },
}

/// A snapshot of one listener, from [`Relay::listeners`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerStats {
    /// The caller's key in [`Relay::apply`].
    pub key: String,
    /// The ServicePortName text of the last applied spec.
    pub name: String,
    /// TCP or UDP.
    pub protocol: Protocol,
    /// The listening port.
    pub port: u16,
    /// The endpoints of the last applied spec, as given.
    pub endpoints: Vec<SocketAddr>,
    /// The session affinity timeout of the last applied spec.
    pub affinity: Option<Duration>,
    /// Open TCP connections / UDP flows of this listener now.
    pub active: usize,
    /// TCP connections admitted / UDP flows created since the listener opened (refused ones
    /// are in `rejected_total` instead).
    pub accepted_total: u64,
    /// Failed backend connects (each retry counts), plus UDP flows ended by an ICMP refusal.
    pub dial_failures_total: u64,
    /// TCP connections closed, or new-client UDP datagrams dropped, because no endpoint
    /// existed or none of them could be reached.
    pub no_endpoint_total: u64,
    /// Connections or flows refused because [`RelayConfig::max_connections`] was reached.
    pub rejected_total: u64,
    /// Bytes relayed in both directions (payload only; best effort).
    pub bytes_total: u64,
}

/// A listener as [`Relay::visit_listeners`] shows it, borrowed while it is visited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerView<'a> {
    /// The caller's key in [`Relay::apply`].
    pub key: &'a str,
    /// The ServicePortName text of the last applied spec.
    pub name: &'a str,
    /// TCP or UDP.
    pub protocol: Protocol,
    /// The listening port.
    pub port: u16,
    /// The endpoints of the last applied spec, as given.
    pub endpoints: &'a [SocketAddr],
    /// The session affinity timeout of the last applied spec.
    pub affinity: Option<Duration>,
    /// See [`ListenerStats::active`].
    pub active: usize,
    /// See [`ListenerStats::accepted_total`].
    pub accepted_total: u64,
    /// See [`ListenerStats::dial_failures_total`].
    pub dial_failures_total: u64,
    /// See [`ListenerStats::no_endpoint_total`].
    pub no_endpoint_total: u64,
    /// See [`ListenerStats::rejected_total`].
    pub rejected_total: u64,
    /// See [`ListenerStats::bytes_total`].
    pub bytes_total: u64,
}

/// Tells [`close_all`] that a listener's task has let go of its socket: the task holds a
/// [`CloseSignal`], whose drop (the task ending or being aborted) marks the [`Closed`] the
/// relay waits on. (A few bytes per listener; a channel would cost half a kilobyte.)
#[derive(Debug, Default)]
pub(crate) struct Closed {
    done: Mutex<bool>,
    changed: std::sync::Condvar,
}

impl Closed {
    /// Waits until the signal was dropped, at most `timeout`; whether it was.
    fn wait(&self, timeout: Duration) -> bool {
        let done = lock(&self.done);
        let (done, _) = self
            .changed
            .wait_timeout_while(done, timeout, |d| !*d)
            .unwrap_or_else(PoisonError::into_inner);
        *done
    }
}

/// The task's side of [`Closed`].
#[derive(Debug)]
pub(crate) struct CloseSignal(Arc<Closed>);

impl Drop for CloseSignal {
    fn drop(&mut self) {
        *lock(&self.0.done) = true;
        self.0.changed.notify_all();
    }
}

/// Locks a mutex, ignoring poisoning: every critical section here leaves its data consistent,
/// and the relay must not crash because some other thread panicked.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// State shared by every listener and connection of one relay.
pub(crate) struct Shared {
    /// The configuration, with an empty `dial_timeouts` replaced by the default.
    pub(crate) cfg: RelayConfig,
    /// TCP connections + UDP flows open now.
    pub(crate) open: AtomicUsize,
    /// Refused at the connection limit, ever.
    pub(crate) rejected: AtomicU64,
    /// Rate limit of the "connection limit reached" warning (10 s).
    pub(crate) reject_log: RateLimit,
}

impl Shared {
    /// Counts a connection or flow refused at the limit and warns at most once per 10 s.
    pub(crate) fn reject(&self, listener: &ListenerState, peer: SocketAddr) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
        listener.counters.rejected.fetch_add(1, Ordering::Relaxed);
        if let Some(n) = self.reject_log.hit() {
            warn!(
                listener = %listener.name(),
                %peer,
                limit = self.cfg.max_connections,
                refused_since_last_log = n,
                "connection limit reached, refusing new connections"
            );
        }
    }
}

/// Per-listener counters; see [`ListenerStats`] for their meaning.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) active: AtomicUsize,
    pub(crate) accepted: AtomicU64,
    pub(crate) dial_failures: AtomicU64,
    pub(crate) no_endpoint: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) bytes: AtomicU64,
}

/// The part of a listener that [`Relay::apply`] replaces (the endpoints are the balancer's).
pub(crate) struct Current {
    pub(crate) name: String,
    pub(crate) balancer: Balancer,
}

/// One listener's state, shared by its accept/receive task and its connections.
pub(crate) struct ListenerState {
    pub(crate) key: String,
    pub(crate) protocol: Protocol,
    pub(crate) port: u16,
    pub(crate) current: Mutex<Current>,
    pub(crate) counters: Counters,
    /// Rate limit of "no endpoint worked" logs.
    pub(crate) no_endpoint_log: RateLimit,
    /// Rate limit of accept/receive error logs.
    pub(crate) error_log: RateLimit,
}

impl ListenerState {
    /// The ServicePortName text, for logs.
    pub(crate) fn name(&self) -> String {
        lock(&self.current).name.clone()
    }

    /// Picks the endpoint for attempt `tried.len()` of a connection from `client`.
    pub(crate) fn next_endpoint(&self, client: IpAddr, tried: &[SocketAddr]) -> Option<SocketAddr> {
        lock(&self.current)
            .balancer
            .next(client, !tried.is_empty(), tried, Instant::now())
    }
}

/// A claim on one of [`RelayConfig::max_connections`], held by a TCP connection or UDP flow;
/// dropping it frees the slot and decrements the listener's `active`.
pub(crate) struct Slot {
    pub(crate) shared: Arc<Shared>,
    pub(crate) listener: Arc<ListenerState>,
}

impl Slot {
    /// Takes a slot if the limit allows, counting the connection as accepted.
    pub(crate) fn acquire(shared: &Arc<Shared>, listener: &Arc<ListenerState>) -> Option<Slot> {
        let max = shared.cfg.max_connections;
        shared
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?;
        listener.counters.active.fetch_add(1, Ordering::Relaxed);
        listener.counters.accepted.fetch_add(1, Ordering::Relaxed);
        Some(Slot {
            shared: Arc::clone(shared),
            listener: Arc::clone(listener),
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.listener
            .counters
            .active
            .fetch_sub(1, Ordering::Relaxed);
        self.shared.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An open listener as [`Relay`] tracks it.
struct Entry {
    state: Arc<ListenerState>,
    task: tokio::task::AbortHandle,
    /// Marked when the task has dropped its socket (the [`CloseSignal`] lives in the task).
    closed: Arc<Closed>,
}

struct Inner {
    shared: Arc<Shared>,
    rt: tokio::runtime::Handle,
    listeners: Mutex<BTreeMap<String, Entry>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for entry in lock(&self.listeners).values() {
            entry.task.abort();
        }
    }
}

/// How long [`Relay::apply`] waits for a closed listener's task to drop its socket.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// The userspace proxy's listeners and their connections. Cheap to clone (an `Arc`); dropping
/// the last clone stops every listener's task (without waiting, unlike [`Relay::shutdown`]);
/// connections and flows still open finish on their own.
#[derive(Clone)]
pub struct Relay {
    inner: Arc<Inner>,
}

impl fmt::Debug for Relay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Relay")
            .field("cfg", &self.inner.shared.cfg)
            .field("listeners", &lock(&self.inner.listeners).len())
            .field("open_connections", &self.open_connections())
            .finish()
    }
}

impl Relay {
    /// A relay with no listeners. Tasks are spawned on `rt`, which must have its I/O and time
    /// drivers enabled (`enable_all`); nothing runs until [`apply`](Relay::apply).
    pub fn new(cfg: RelayConfig, rt: tokio::runtime::Handle) -> Relay {
        let mut cfg = cfg;
        if cfg.dial_timeouts.is_empty() {
            cfg.dial_timeouts = default_dial_timeouts();
        }
        Relay {
            inner: Arc::new(Inner {
                shared: Arc::new(Shared {
                    cfg,
                    open: AtomicUsize::new(0),
                    rejected: AtomicU64::new(0),
                    reject_log: RateLimit::new(Duration::from_secs(10)),
                }),
                rt,
                listeners: Mutex::new(BTreeMap::new()),
            }),
        }
    }

    /// Serves exactly `specs`, keyed by an opaque caller key, and returns the listening port
    /// per key or the error for that key (other keys are unaffected).
    ///
    /// - A new key opens a listener (a TCP listening socket, or a UDP socket) on
    ///   [`RelayConfig::bind`], on a port from [`RelayConfig::port_range`] or chosen by the
    ///   kernel. A key whose open failed is not kept; the next `apply` tries again.
    /// - A key already open with the same protocol keeps its socket and port; its name,
    ///   endpoints and affinity are replaced at once. When the endpoint *set* changes the
    ///   round-robin order is reshuffled and affinity entries for removed endpoints are
    ///   dropped. Open connections and UDP flows are not touched.
    /// - A key absent from `specs`, or whose protocol changed, is closed: it stops accepting
    ///   and its socket is closed before `apply` returns (a TCP port is free at once; a UDP
    ///   socket lives on until its last flow ends, because flows reply through it).
    ///   Established connections and flows are left to finish.
    ///
    /// Synchronous; call it from a blocking thread (`spawn_blocking` or a plain thread), not
    /// from inside an async task: closing a listener waits (up to 2 s) for its task to drop
    /// the socket.
    pub fn apply(
        &self,
        specs: &BTreeMap<String, ListenerSpec>,
    ) -> BTreeMap<String, Result<u16, RelayError>> {
        let inner = &*self.inner;
        let mut listeners = lock(&inner.listeners);

        let stale: Vec<String> = listeners
            .iter()
            .filter(|(key, e)| {
                specs
                    .get(*key)
                    .is_none_or(|s| s.protocol != e.state.protocol)
            })
            .map(|(key, _)| key.clone())
            .collect();
        let closing: Vec<Entry> = stale
            .iter()
            .filter_map(|key| listeners.remove(key))
            .collect();
        close_all(closing);

        let mut out = BTreeMap::new();
        for (key, spec) in specs {
            if let Some(entry) = listeners.get(key) {
                let mut cur = lock(&entry.state.current);
                if cur.name != spec.name {
                    cur.name.clone_from(&spec.name);
                }
                cur.balancer
                    .update(Arc::clone(&spec.endpoints), spec.affinity);
                drop(cur);
                out.insert(key.clone(), Ok(entry.state.port));
                continue;
            }
            match self.open(key, spec) {
                Ok(entry) => {
                    out.insert(key.clone(), Ok(entry.state.port));
                    listeners.insert(key.clone(), entry);
                }
                Err(e) => {
                    warn!(key = %key, name = %spec.name, protocol = %spec.protocol, error = %e,
                        "cannot open userspace proxy listener");
                    out.insert(key.clone(), Err(e));
                }
            }
        }
        out
    }

    /// Opens the socket for a new key and spawns its task.
    fn open(&self, key: &str, spec: &ListenerSpec) -> Result<Entry, RelayError> {
        let inner = &*self.inner;
        let cfg = &inner.shared.cfg;
        let _ctx = inner.rt.enter();
        let closed = Arc::new(Closed::default());
        let tx = CloseSignal(Arc::clone(&closed));
        let make_state = |port: u16| {
            Arc::new(ListenerState {
                key: key.to_owned(),
                protocol: spec.protocol,
                port,
                current: Mutex::new(Current {
                    name: spec.name.clone(),
                    balancer: Balancer::new(Arc::clone(&spec.endpoints), spec.affinity),
                }),
                counters: Counters::default(),
                no_endpoint_log: RateLimit::new(Duration::from_secs(10)),
                error_log: RateLimit::new(Duration::from_secs(10)),
            })
        };
        let registered = |source| RelayError::Socket {
            protocol: spec.protocol,
            op: "register with runtime",
            source,
        };
        let (state, task) = match spec.protocol {
            Protocol::Tcp => {
                let (std_listener, port) = socket::open_tcp(cfg.bind, cfg.port_range)?;
                let listener =
                    tokio::net::TcpListener::from_std(std_listener).map_err(registered)?;
                let state = make_state(port);
                let task = inner.rt.spawn(tcp::accept_loop(
                    tcp::Listening {
                        listener,
                        _closed: tx,
                    },
                    Arc::clone(&state),
                    Arc::clone(&inner.shared),
                ));
                (state, task)
            }
            Protocol::Udp => {
                let (std_socket, port) = socket::open_udp(cfg.bind, cfg.port_range)?;
                let socket = tokio::net::UdpSocket::from_std(std_socket).map_err(registered)?;
                let state = make_state(port);
                let task = inner.rt.spawn(udp::recv_loop(
                    Arc::new(socket),
                    tx,
                    Arc::clone(&state),
                    Arc::clone(&inner.shared),
                ));
                (state, task)
            }
        };
        info!(key = %key, name = %spec.name, protocol = %spec.protocol, port = state.port,
            endpoints = spec.endpoints.len(), "userspace proxy listener open");
        Ok(Entry {
            state,
            task: task.abort_handle(),
            closed,
        })
    }

    /// A snapshot of every listener, sorted by key.
    pub fn listeners(&self) -> Vec<ListenerStats> {
        let mut out = Vec::new();
        self.visit_listeners(None, usize::MAX, &mut |l| {
            out.push(ListenerStats {
                key: l.key.to_owned(),
                name: l.name.to_owned(),
                protocol: l.protocol,
                port: l.port,
                endpoints: l.endpoints.to_vec(),
                affinity: l.affinity,
                active: l.active,
                accepted_total: l.accepted_total,
                dial_failures_total: l.dial_failures_total,
                no_endpoint_total: l.no_endpoint_total,
                rejected_total: l.rejected_total,
                bytes_total: l.bytes_total,
            });
        });
        out
    }

    /// Calls `f` with at most `limit` listeners in key order, starting after the key `after`
    /// (`None`: at the first), without copying them. Returns the key of the last listener
    /// visited when `limit` were visited (more may follow), `None` when the visit reached the
    /// end. Listeners cannot be opened or closed during a visit ([`Relay::apply`] waits), so
    /// keep `f` short and `limit` small when a sync may be waiting; a later visit from the
    /// returned key goes on with the listeners as they are then.
    pub fn visit_listeners(
        &self,
        after: Option<&str>,
        limit: usize,
        f: &mut dyn FnMut(&ListenerView<'_>),
    ) -> Option<String> {
        use std::ops::Bound;
        let listeners = lock(&self.inner.listeners);
        let lower = match after {
            Some(key) => Bound::Excluded(key),
            None => Bound::Unbounded,
        };
        let mut last = None;
        for (visited, (key, e)) in listeners
            .range::<str, _>((lower, Bound::Unbounded))
            .enumerate()
        {
            if visited == limit {
                return last.map(str::to_owned);
            }
            let s = &e.state;
            let c = &s.counters;
            let cur = lock(&s.current);
            f(&ListenerView {
                key,
                name: &cur.name,
                protocol: s.protocol,
                port: s.port,
                endpoints: cur.balancer.endpoints(),
                affinity: cur.balancer.affinity(),
                active: c.active.load(Ordering::Relaxed),
                accepted_total: c.accepted.load(Ordering::Relaxed),
                dial_failures_total: c.dial_failures.load(Ordering::Relaxed),
                no_endpoint_total: c.no_endpoint.load(Ordering::Relaxed),
                rejected_total: c.rejected.load(Ordering::Relaxed),
                bytes_total: c.bytes.load(Ordering::Relaxed),
            });
            last = Some(key.as_str());
        }
        // The end was reached; a full batch that ends exactly at the end says so next time.
        None
    }

    /// TCP connections plus UDP flows open now, across all listeners (including those of
    /// listeners already closed).
    pub fn open_connections(&self) -> usize {
        self.inner.shared.open.load(Ordering::Acquire)
    }

    /// Connections and flows refused because [`RelayConfig::max_connections`] was reached,
    /// since the relay was created.
    pub fn rejected_total(&self) -> u64 {
        self.inner.shared.rejected.load(Ordering::Relaxed)
    }

    /// Closes every listener, as `apply` with no specs would; open connections and flows
    /// finish on their own. A later `apply` opens listeners again.
    pub fn shutdown(&self) {
        let closing: Vec<Entry> = std::mem::take(&mut *lock(&self.inner.listeners))
            .into_values()
            .collect();
        close_all(closing);
    }
}

/// Stops the tasks of `entries` and waits until each has dropped its socket.
fn close_all(entries: Vec<Entry>) {
    for e in &entries {
        e.task.abort();
    }
    let deadline = Instant::now() + CLOSE_WAIT;
    for e in entries {
        let left = deadline.saturating_duration_since(Instant::now());
        e.closed.wait(left);
        let st = &e.state;
        info!(key = %st.key, name = %st.name(), protocol = %st.protocol, port = st.port,
            active = st.counters.active.load(Ordering::Relaxed),
            "userspace proxy listener closed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_is_upstreams() {
        let c = RelayConfig::default();
        assert_eq!(c.bind, IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        assert_eq!(c.port_range, None);
        assert_eq!(c.udp_timeout, Duration::from_millis(250));
        assert_eq!(c.max_connections, 20_000);
        assert_eq!(
            c.dial_timeouts,
            [250, 500, 1000, 2000].map(Duration::from_millis).to_vec()
        );
    }
}
