//! A streaming backend for the bulk-throughput measurement: it accepts TCP connections and
//! writes a fixed 256 KiB buffer in a loop until the client closes (or the backend is
//! dropped), so a client reading from it measures how fast bytes move from a backend to the
//! client through whatever is in between (a ClusterIP's DNAT, the userspace relay, nothing).
//!
//! The listening socket is created inside the backend's namespace
//! ([`kp_testkit::Netns::in_ns`]); one thread accepts (polling a stop flag), one thread per
//! connection writes. Dropping the [`StreamBackend`] stops and joins them.

use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context;

/// Bytes per `write` of a streaming connection.
pub const STREAM_CHUNK: usize = 256 * 1024;

/// How often the accept loop and blocked writers look at the stop flag.
const POLL: Duration = Duration::from_millis(50);

#[derive(Debug, Default)]
struct Shared {
    stop: AtomicBool,
    bytes: AtomicU64,
    connections: AtomicU64,
}

/// A backend that streams bytes to every client until it closes; see the
/// [module documentation](self).
#[derive(Debug)]
pub struct StreamBackend {
    local: SocketAddr,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl StreamBackend {
    /// Binds `bind` inside `ns` and starts serving.
    ///
    /// # Errors
    /// Entering the namespace or binding fails.
    pub fn start(ns: &kp_testkit::Netns, bind: SocketAddr) -> anyhow::Result<StreamBackend> {
        let listener = ns
            .in_ns(|| TcpListener::bind(bind))
            .context("entering the backend namespace")?
            .with_context(|| format!("binding the stream backend to {bind} in {}", ns.name()))?;
        let local = listener.local_addr().context("listener address")?;
        listener
            .set_nonblocking(true)
            .context("setting O_NONBLOCK")?;
        let shared = Arc::new(Shared::default());
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("stream-accept".into())
                .spawn(move || accept_loop(&listener, &shared))
                .context("spawning the stream backend thread")?
        };
        Ok(StreamBackend {
            local,
            shared,
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Bytes written to clients so far.
    pub fn bytes(&self) -> u64 {
        self.shared.bytes.load(Ordering::Relaxed)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::Relaxed)
    }
}

impl Drop for StreamBackend {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn wait_readable(listener: &TcpListener) {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd as _;
    let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
    let ms = u16::try_from(POLL.as_millis()).unwrap_or(u16::MAX);
    if poll(&mut fds, PollTimeout::from(ms)).is_err() {
        std::thread::sleep(POLL);
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    let mut writers: Vec<JoinHandle<()>> = Vec::new();
    while !shared.stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                shared.connections.fetch_add(1, Ordering::Relaxed);
                let shared = Arc::clone(shared);
                if let Ok(h) = std::thread::Builder::new()
                    .name("stream-conn".into())
                    .spawn(move || stream_to(stream, &shared))
                {
                    writers.push(h);
                }
                writers.retain(|h| !h.is_finished());
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_readable(listener),
            Err(_) => std::thread::sleep(POLL),
        }
    }
    for h in writers {
        let _ = h.join();
    }
}

/// Writes the buffer in a loop until a write fails (the client closed) or the stop flag.
fn stream_to(mut stream: TcpStream, shared: &Shared) {
    if stream.set_nonblocking(false).is_err() || stream.set_write_timeout(Some(POLL)).is_err() {
        return;
    }
    let buf = vec![0x5a_u8; STREAM_CHUNK];
    while !shared.stop.load(Ordering::Relaxed) {
        match stream.write(&buf) {
            Ok(0) => return,
            Ok(n) => {
                shared.bytes.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(_) => return,
        }
    }
}
