//! UDP: one flow per client address:port.
//!
//! The listener's task receives every datagram. A datagram from a client without a flow
//! creates one: an endpoint from the balancer, and a UDP socket bound to an ephemeral port and
//! connected to it. The datagram and every later one from that client go out on the flow's
//! socket. The flow's task sends the endpoint's replies back to the client *through the
//! listening socket*, so they leave from the address the client sent to (and conntrack can undo
//! the redirect). A flow ends after `udp_timeout` without a datagram in either direction, or
//! when its endpoint answers with ICMP port unreachable (the next datagram then starts a new
//! flow, on the next endpoint).
//!
//! Requests are copied through the receive task's 64 KiB buffer; replies through one 64 KiB
//! buffer per worker thread, used only between two non-blocking calls with no `.await` in
//! between. A flow therefore costs a socket and a small struct, not a buffer.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::os::fd::AsRawFd;

use nix::sys::socket::{MsgFlags, SockaddrStorage};
use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio::sync::Notify;
use tracing::{debug, warn};

use crate::{ListenerState, Shared, Slot, lock};

/// The largest datagram relayed (the largest UDP payload is 65,507 bytes over IPv4).
const MAX_DATAGRAM: usize = 64 * 1024;

/// At most this many replies are forwarded per wake-up, so a busy flow cannot hog a worker.
const REPLY_BATCH: usize = 64;

/// How long receiving pauses after an unexpected error, instead of spinning.
const RECV_BACKOFF: Duration = Duration::from_millis(100);

thread_local! {
    static REPLY_BUF: RefCell<Box<[u8]>> = RefCell::new(vec![0; MAX_DATAGRAM].into_boxed_slice());
}

/// A live flow, shared by the receive loop (which finds it by client address) and its task.
struct Flow {
    /// The socket connected to the flow's endpoint.
    backend: UdpSocket,
    endpoint: SocketAddr,
    /// When a datagram last went either way, in nanoseconds since `epoch`.
    last: AtomicU64,
    epoch: Instant,
    /// Wakes the flow's task to end it (the flow was removed from the table).
    cancel: Notify,
}

impl Flow {
    fn touch(&self) {
        let ns = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last.fetch_max(ns, Ordering::Relaxed);
    }

    fn idle_deadline(&self, timeout: Duration) -> Instant {
        self.epoch + Duration::from_nanos(self.last.load(Ordering::Relaxed)) + timeout
    }
}

type Flows = Arc<Mutex<HashMap<SocketAddr, Arc<Flow>>>>;

/// Removes `client`'s entry if it is still `flow` (and not a newer flow of the same client).
fn remove_flow(flows: &Flows, client: SocketAddr, flow: &Arc<Flow>) {
    let mut map = lock(flows);
    if map.get(&client).is_some_and(|f| Arc::ptr_eq(f, flow)) {
        map.remove(&client);
    }
}

/// Receives client datagrams until the task is aborted. `_closed` disconnects when this task
/// ends; the socket itself stays open while flows still reply through it.
pub(crate) async fn recv_loop(
    socket: Arc<UdpSocket>,
    _closed: crate::CloseSignal,
    st: Arc<ListenerState>,
    shared: Arc<Shared>,
) {
    let flows: Flows = Arc::default();
    let epoch = Instant::now();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let (n, client) = match socket.recv_from(&mut buf).await {
            Ok(got) => got,
            Err(e) => {
                if let Some(count) = st.error_log.hit() {
                    warn!(listener = %st.name(), port = st.port, error = %e,
                        errors_since_last_log = count, "UDP receive failed");
                }
                tokio::time::sleep(RECV_BACKOFF).await;
                continue;
            }
        };
        let datagram = &buf[..n];

        let existing = {
            let map = lock(&flows);
            map.get(&client).map(|f| {
                // Touched under the table lock, so the flow cannot expire in between.
                f.touch();
                Arc::clone(f)
            })
        };
        let flow = match existing {
            Some(flow) => flow,
            None => match new_flow(&socket, &flows, client, epoch, &st, &shared) {
                Some(flow) => flow,
                None => continue,
            },
        };
        match send_now(&flow.backend, datagram, None) {
            Ok(sent) => {
                st.counters.bytes.fetch_add(sent as u64, Ordering::Relaxed);
            }
            // The socket's send buffer is full: UDP may drop.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => {
                debug!(listener = %st.name(), %client, endpoint = %flow.endpoint, error = %e,
                    "cannot forward datagram, ending the flow");
                if e.kind() == io::ErrorKind::ConnectionRefused {
                    endpoint_refused(&st, client.ip());
                }
                remove_flow(&flows, client, &flow);
                flow.cancel.notify_one();
            }
        }
    }
}

/// Counts an endpoint's ICMP refusal and forgets the client's affinity to it.
fn endpoint_refused(st: &ListenerState, client: IpAddr) {
    st.counters.dial_failures.fetch_add(1, Ordering::Relaxed);
    lock(&st.current).balancer.forget(client);
}

/// Creates the flow for a datagram from a new client, or counts why not.
fn new_flow(
    socket: &Arc<UdpSocket>,
    flows: &Flows,
    client: SocketAddr,
    epoch: Instant,
    st: &Arc<ListenerState>,
    shared: &Arc<Shared>,
) -> Option<Arc<Flow>> {
    let no_endpoint = || {
        st.counters.no_endpoint.fetch_add(1, Ordering::Relaxed);
        if let Some(n) = st.no_endpoint_log.hit() {
            debug!(listener = %st.name(), %client, dropped_since_last_log = n,
                "no endpoint, dropping datagram");
        }
    };
    if lock(&st.current).balancer.is_empty() {
        no_endpoint();
        return None;
    }
    let Some(slot) = Slot::acquire(shared, st) else {
        shared.reject(st, client);
        return None;
    };
    let Some(endpoint) = st.next_endpoint(client.ip(), &[]) else {
        no_endpoint();
        return None;
    };
    let backend = match connect(endpoint) {
        Ok(b) => b,
        Err(e) => {
            st.counters.dial_failures.fetch_add(1, Ordering::Relaxed);
            debug!(listener = %st.name(), %client, %endpoint, error = %e, "cannot open flow socket");
            return None;
        }
    };
    let flow = Arc::new(Flow {
        backend,
        endpoint,
        last: AtomicU64::new(0),
        epoch,
        cancel: Notify::new(),
    });
    flow.touch();
    lock(flows).insert(client, Arc::clone(&flow));
    debug!(listener = %st.name(), %client, %endpoint, "new UDP flow");
    tokio::spawn(flow_task(
        Arc::clone(&flow),
        client,
        Arc::clone(socket),
        Arc::clone(flows),
        slot,
    ));
    Some(flow)
}

/// A UDP socket on an ephemeral port of `endpoint`'s family, connected to it.
fn connect(endpoint: SocketAddr) -> io::Result<UdpSocket> {
    let any: IpAddr = match endpoint {
        SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let s = std::net::UdpSocket::bind((any, 0))?;
    s.connect(endpoint)?;
    s.set_nonblocking(true)?;
    UdpSocket::from_std(s)
}

/// Forwards the endpoint's replies to `client` until the flow is idle for `udp_timeout`, is
/// cancelled, or its endpoint refuses.
async fn flow_task(
    flow: Arc<Flow>,
    client: SocketAddr,
    listener: Arc<UdpSocket>,
    flows: Flows,
    slot: Slot,
) {
    let st = &slot.listener;
    let timeout = slot.shared.cfg.udp_timeout;
    loop {
        let deadline = flow.idle_deadline(timeout);
        tokio::select! {
            () = flow.cancel.notified() => break,
            () = tokio::time::sleep_until(deadline.into()) => {
                let mut map = lock(&flows);
                if Instant::now() >= flow.idle_deadline(timeout) {
                    if map.get(&client).is_some_and(|f| Arc::ptr_eq(f, &flow)) {
                        map.remove(&client);
                    }
                    break;
                }
            }
            // ERROR too: an ICMP port unreachable shows as EPOLLERR only.
            ready = flow.backend.ready(Interest::READABLE | Interest::ERROR) => {
                let forwarded = ready.and_then(|r| {
                    if r.is_error() {
                        pending_error(&flow.backend)?;
                    }
                    forward_replies(&flow, &listener, client)
                });
                match forwarded {
                    Ok(0) => {}
                    Ok(n) => {
                        flow.touch();
                        st.counters.bytes.fetch_add(n, Ordering::Relaxed);
                    }
                    Err(e) => {
                        debug!(listener = %st.name(), %client, endpoint = %flow.endpoint, error = %e,
                            "endpoint error, ending the flow");
                        if e.kind() == io::ErrorKind::ConnectionRefused {
                            endpoint_refused(st, client.ip());
                        }
                        remove_flow(&flows, client, &flow);
                        break;
                    }
                }
            }
        }
    }
    debug!(listener = %st.name(), %client, endpoint = %flow.endpoint, "UDP flow ended");
}

/// Sends the replies waiting on the flow's socket to `client` through the listening socket,
/// at most [`REPLY_BATCH`]; returns the bytes received. A reply the listening socket cannot
/// take now is dropped, as UDP may.
fn forward_replies(flow: &Flow, listener: &UdpSocket, client: SocketAddr) -> io::Result<u64> {
    REPLY_BUF.with(|buf| {
        let mut buf = buf.borrow_mut();
        let mut total = 0u64;
        for _ in 0..REPLY_BATCH {
            let n = match flow.backend.try_recv(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            };
            total += n as u64;
            match send_now(listener, &buf[..n], Some(client)) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => debug!(%client, error = %e, "cannot send reply to client"),
            }
        }
        Ok(total)
    })
}

/// Returns the socket's pending error (`SO_ERROR`, e.g. `ECONNREFUSED` after an ICMP port
/// unreachable) as `Err`; without one, clears the error readiness so it does not wake us again.
fn pending_error(socket: &UdpSocket) -> io::Result<()> {
    if let Some(e) = socket.take_error()? {
        return Err(e);
    }
    // `try_io` clears the readiness it was asked about when the closure says WouldBlock.
    let _ = socket.try_io(Interest::ERROR, || {
        Err::<(), _>(io::ErrorKind::WouldBlock.into())
    });
    Ok(())
}

/// Sends one datagram now, with a plain non-blocking `send`/`sendto`: a UDP send needs no
/// readiness (tokio's `try_send` refuses until the runtime has seen the socket writable, which
/// would drop the first datagram of every new flow). `WouldBlock` when the send buffer is full.
fn send_now(socket: &UdpSocket, datagram: &[u8], to: Option<SocketAddr>) -> io::Result<usize> {
    let fd = socket.as_raw_fd();
    let sent = match to {
        None => nix::sys::socket::send(fd, datagram, MsgFlags::MSG_DONTWAIT),
        Some(addr) => nix::sys::socket::sendto(
            fd,
            datagram,
            &SockaddrStorage::from(addr),
            MsgFlags::MSG_DONTWAIT,
        ),
    };
    sent.map_err(io::Error::from)
}
