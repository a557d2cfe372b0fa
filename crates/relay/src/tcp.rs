//! TCP: the accept loop, dialing with retries, and the `splice(2)` relay.
//!
//! One task per listener accepts; one task per connection dials and then drives both
//! directions. A direction is a loop over one pipe: wait until the source is readable,
//! `splice` up to a pipe's worth from the source socket into the (empty) pipe, then wait until
//! the destination is writable and `splice` from the pipe into it until the pipe is empty.
//! Since the pipe is always empty when reading and never empty when writing, an `EAGAIN` is
//! always the socket's, and `try_io` clears the right readiness. A source at EOF makes the
//! direction shut the destination down for writing and end; the other direction goes on
//! (half-close). An error in either direction ends both, and both sockets are closed with a
//! reset so the peers see the failure.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{OFlag, SpliceFFlags, splice};
use nix::sys::socket::{Shutdown, shutdown};
use tokio::io::Interest;
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, warn};

use crate::{ListenerState, Shared, Slot};

/// The most bytes one `splice` moves: the default pipe capacity (16 pages).
const CHUNK: usize = 64 * 1024;

/// How long accepting pauses after an error such as `EMFILE`.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The listening socket and the close signal of [`crate::Relay::apply`], in this order, so
/// that the socket is closed before the signal fires (fields drop in declaration order).
pub(crate) struct Listening {
    pub(crate) listener: TcpListener,
    pub(crate) _closed: crate::CloseSignal,
}

/// Accepts until the task is aborted (the listener is closed by dropping `listening`).
pub(crate) async fn accept_loop(listening: Listening, st: Arc<ListenerState>, shared: Arc<Shared>) {
    loop {
        match listening.listener.accept().await {
            Ok((client, peer)) => match Slot::acquire(&shared, &st) {
                Some(slot) => {
                    tokio::spawn(serve(client, peer, slot));
                }
                None => {
                    // Counted before the close, so whoever sees the reset sees the count.
                    shared.reject(&st, peer);
                    reset(&client);
                    drop(client);
                }
            },
            Err(e) => {
                if let Some(n) = st.error_log.hit() {
                    warn!(listener = %st.name(), port = st.port, error = %e, errors_since_last_log = n,
                        "accept failed");
                }
                if e.kind() != io::ErrorKind::ConnectionAborted {
                    // EMFILE, ENFILE, ENOBUFS, ENOMEM: give closing connections time to free
                    // resources instead of spinning on a ready listener.
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            }
        }
    }
}

/// Sets `SO_LINGER` 0 so that closing the socket sends a reset.
fn reset(s: &TcpStream) {
    if let Err(e) = s.set_zero_linger() {
        debug!(error = %e, "cannot set SO_LINGER");
    }
}

/// One client connection: dial an endpoint, then relay until both directions are done.
async fn serve(client: TcpStream, peer: SocketAddr, slot: Slot) {
    let st = &slot.listener;
    let _ = client.set_nodelay(true);
    let (backend, endpoint) = match dial(st, &slot.shared.cfg.dial_timeouts, peer.ip()).await {
        Ok(found) => found,
        Err(attempts) => {
            st.counters.no_endpoint.fetch_add(1, Ordering::Relaxed);
            // A Service without endpoints is an ordinary state (the kernel modes REJECT
            // without a word); endpoints that all failed are worth a warning.
            if attempts == 0 {
                debug!(listener = %st.name(), %peer, "no endpoints, resetting the client");
            } else if let Some(n) = st.no_endpoint_log.hit() {
                warn!(listener = %st.name(), %peer, attempts, closed_since_last_log = n,
                    "no endpoint accepted the connection, resetting the client");
            }
            reset(&client);
            return;
        }
    };
    let _ = backend.set_nodelay(true);
    let (up, down) = match (Pipe::new(), Pipe::new()) {
        (Ok(up), Ok(down)) => (up, down),
        (Err(e), _) | (_, Err(e)) => {
            // EMFILE/ENFILE: the fd limit is too low for this many connections.
            if let Some(n) = st.error_log.hit() {
                warn!(listener = %st.name(), error = %e, errors_since_last_log = n,
                    "cannot create pipes, closing the connection");
            }
            reset(&client);
            reset(&backend);
            return;
        }
    };
    debug!(listener = %st.name(), %peer, %endpoint, "relaying");
    if let Err(e) = relay(&client, &backend, &up, &down, &st.counters.bytes).await {
        debug!(listener = %st.name(), %peer, %endpoint, error = %e, "connection ended by an error");
        reset(&client);
        reset(&backend);
    }
}

/// Connects to the endpoints the balancer gives, each at most once, attempt `i` waiting
/// `timeouts[min(i, len - 1)]`. `Err(attempts)` when there is no endpoint (0) or every one
/// failed.
async fn dial(
    st: &ListenerState,
    timeouts: &[Duration],
    client: IpAddr,
) -> Result<(TcpStream, SocketAddr), usize> {
    let mut tried: Vec<SocketAddr> = Vec::new();
    loop {
        let Some(endpoint) = st.next_endpoint(client, &tried) else {
            return Err(tried.len());
        };
        let attempt = tried.len();
        tried.push(endpoint);
        let limit = timeouts[attempt.min(timeouts.len() - 1)];
        let error = match tokio::time::timeout(limit, TcpStream::connect(endpoint)).await {
            Ok(Ok(stream)) => return Ok((stream, endpoint)),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer in {limit:?}"),
        };
        st.counters.dial_failures.fetch_add(1, Ordering::Relaxed);
        debug!(listener = %st.name(), %endpoint, attempt, %error, "dial failed, trying the next endpoint");
    }
}

/// A non-blocking, close-on-exec pipe.
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl Pipe {
    fn new() -> io::Result<Pipe> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
        Ok(Pipe { read, write })
    }
}

/// Relays both directions, client → backend through `up` and back through `down`, until
/// both reached EOF (`Ok`) or one failed (`Err`; the other is then dropped mid-way).
async fn relay(
    client: &TcpStream,
    backend: &TcpStream,
    up: &Pipe,
    down: &Pipe,
    bytes: &AtomicU64,
) -> io::Result<()> {
    tokio::try_join!(
        pump(client, backend, up, bytes),
        pump(backend, client, down, bytes)
    )?;
    Ok(())
}

const FLAGS: SpliceFFlags = SpliceFFlags::SPLICE_F_MOVE.union(SpliceFFlags::SPLICE_F_NONBLOCK);

/// One direction: `src` → `pipe` → `dst` until `src` reaches EOF.
async fn pump(src: &TcpStream, dst: &TcpStream, pipe: &Pipe, bytes: &AtomicU64) -> io::Result<()> {
    loop {
        // The pipe is empty here: EAGAIN can only mean `src` has nothing to read.
        let n = loop {
            src.readable().await?;
            match src.try_io(Interest::READABLE, || {
                splice(src, None, &pipe.write, None, CHUNK, FLAGS).map_err(io::Error::from)
            }) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        };
        if n == 0 {
            return match shutdown(dst.as_raw_fd(), Shutdown::Write) {
                Ok(()) | Err(Errno::ENOTCONN) => Ok(()),
                Err(e) => Err(e.into()),
            };
        }
        // The pipe holds `left` bytes here: EAGAIN can only mean `dst` is full.
        let mut left = n;
        while left > 0 {
            dst.writable().await?;
            match dst.try_io(Interest::WRITABLE, || {
                splice(&pipe.read, None, dst, None, left, FLAGS).map_err(io::Error::from)
            }) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(m) => {
                    left -= m;
                    bytes.fetch_add(m as u64, Ordering::Relaxed);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Relay, RelayConfig};

    /// The per-connection task's state stays small (824 bytes in a debug build when written):
    /// the data itself lives in the pipes.
    #[tokio::test]
    async fn a_connection_task_is_small() {
        let relay = Relay::new(RelayConfig::default(), tokio::runtime::Handle::current());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let client = TcpStream::connect(addr).await.unwrap();
        let shared = std::sync::Arc::clone(&relay.inner.shared);
        let state = std::sync::Arc::new(crate::ListenerState {
            key: "k".into(),
            protocol: crate::Protocol::Tcp,
            port: addr.port(),
            current: std::sync::Mutex::new(crate::Current {
                name: "n".into(),
                balancer: crate::balancer::Balancer::new(std::sync::Arc::from([]), None),
            }),
            counters: crate::Counters::default(),
            no_endpoint_log: crate::limit::RateLimit::new(Duration::from_secs(1)),
            error_log: crate::limit::RateLimit::new(Duration::from_secs(1)),
        });
        let slot = Slot::acquire(&shared, &state).unwrap();
        let task = serve(client, addr, slot);
        let size = std::mem::size_of_val(&task);
        assert!(size <= 2048, "connection task state is {size} bytes");
    }
}
