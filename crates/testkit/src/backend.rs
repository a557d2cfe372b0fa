//! Backends ("pods"): a tiny HTTP server and a UDP echo server inside a namespace.
//!
//! Both answer with their name, so a test can see which backend a Service connection
//! was balanced to, and both record the peer (source) address of every connection or
//! datagram, so a test can see whether the client IP was preserved or masqueraded.
//! Their sockets are created inside the namespace (with [`Netns::in_ns`]); the serving
//! threads poll a stop flag and end promptly when the backend is dropped.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::netns::Netns;

/// How often idle serving loops look at the stop flag.
const POLL: Duration = Duration::from_millis(5);
/// How long a connection may stay idle before the server closes it.
const IDLE: Duration = Duration::from_secs(5);
/// The largest request head accepted.
const MAX_HEAD: usize = 16 * 1024;

#[derive(Debug, Default)]
struct Shared {
    stop: AtomicBool,
    peers: Mutex<Vec<SocketAddr>>,
    requests: AtomicU64,
}

impl Shared {
    fn record(&self, peer: SocketAddr) {
        let peer = canonical(peer);
        self.peers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(peer);
    }

    fn peers(&self) -> Vec<SocketAddr> {
        self.peers.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// Runs `bind` until it does not fail with `EADDRINUSE`, for at most one second.
///
/// A socket closed a moment ago can still be held by a child process that another
/// thread just forked and that has not yet exec'd (its copy of the fd table keeps the
/// socket until `exec` closes it), so rebinding a fixed port right after closing it fails
/// transiently when tests spawn processes in parallel.
pub(crate) fn bind_with_retry<T>(mut bind: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    let start = Instant::now();
    loop {
        match bind() {
            Err(e)
                if e.kind() == io::ErrorKind::AddrInUse
                    && start.elapsed() < Duration::from_secs(1) =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

/// Turns an IPv4-mapped IPv6 socket address (`[::ffff:10.0.0.1]:80`, as a dual-stack
/// `[::]` socket reports IPv4 peers) into the plain IPv4 one.
pub fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

/// A minimal HTTP/1.1 server answering every request with `200 OK` and body `NAME\n`.
///
/// Responses carry `Content-Type: text/plain`, `Content-Length` and `Connection: close`,
/// unless the request asked for `Connection: keep-alive`, which is honoured. Each
/// connection is served on its own thread. Stops (and joins its threads) on drop.
#[derive(Debug)]
pub struct HttpBackend {
    name: String,
    local: SocketAddr,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl HttpBackend {
    /// Binds `bind` inside `ns` (port 0 picks a free port; see
    /// [`HttpBackend::local_addr`]) and starts serving.
    pub fn start(ns: &Netns, bind: SocketAddr, name: impl Into<String>) -> Result<HttpBackend> {
        let name = name.into();
        let listener = ns
            .in_ns(|| bind_with_retry(|| TcpListener::bind(bind)))?
            .map_err(|e| {
                Error::io(
                    format!("binding HTTP backend {name} to {bind} in {}", ns.name()),
                    e,
                )
            })?;
        let local = listener
            .local_addr()
            .map_err(|e| Error::io("listener address", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("setting O_NONBLOCK", e))?;
        let shared = Arc::new(Shared::default());
        let body = format!("{name}\n");
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name(format!("http-{name}"))
                .spawn(move || accept_loop(&listener, &shared, &body))
                .map_err(|e| Error::io("spawning the HTTP backend thread", e))?
        };
        Ok(HttpBackend {
            name,
            local,
            shared,
            thread: Some(thread),
        })
    }

    /// The name it answers with (without the newline).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The peer address of every accepted connection, oldest first (IPv4-mapped
    /// addresses are shown as IPv4).
    pub fn peers(&self) -> Vec<SocketAddr> {
        self.shared.peers()
    }

    /// The peer IPs of [`HttpBackend::peers`].
    pub fn peer_ips(&self) -> Vec<IpAddr> {
        self.peers().into_iter().map(|p| p.ip()).collect()
    }

    /// How many requests it has answered.
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::Relaxed)
    }

    /// Forgets the recorded peers.
    pub fn clear_peers(&self) {
        self.shared
            .peers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}

impl Drop for HttpBackend {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::warn!("HTTP backend {} thread panicked", self.name);
        }
    }
}

/// Blocks until `listener` has a connection to accept or `timeout` passes (`poll(2)`).
fn wait_readable(listener: &TcpListener, timeout: Duration) {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd as _;
    let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
    let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
    if poll(&mut fds, PollTimeout::from(ms)).is_err() {
        std::thread::sleep(POLL);
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>, body: &str) {
    let mut handlers: Vec<JoinHandle<()>> = Vec::new();
    while !shared.stopped() {
        match listener.accept() {
            Ok((stream, peer)) => {
                shared.record(peer);
                let shared = Arc::clone(shared);
                let body = body.to_owned();
                match std::thread::Builder::new()
                    .name("http-conn".into())
                    .spawn(move || serve_connection(stream, &shared, &body))
                {
                    Ok(h) => handlers.push(h),
                    Err(e) => tracing::warn!("spawning an HTTP connection thread: {e}"),
                }
                handlers.retain(|h| !h.is_finished());
            }
            // Sleep until a connection arrives (no added latency), waking up now and then
            // to check the stop flag.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_readable(listener, POLL * 10),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                ) => {}
            Err(e) => {
                tracing::warn!("HTTP backend accept: {e}");
                std::thread::sleep(POLL * 10);
            }
        }
    }
    for h in handlers {
        let _ = h.join();
    }
}

fn serve_connection(mut stream: TcpStream, shared: &Shared, body: &str) {
    if stream.set_nonblocking(false).is_err() || stream.set_read_timeout(Some(POLL * 20)).is_err() {
        return;
    }
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let mut idle_since = Instant::now();
    loop {
        // Serve every complete request head in the buffer.
        while let Some(end) = find_head_end(&buf) {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            let (keep_alive, content_length) = parse_request_head(&head);
            let total = end + content_length;
            if buf.len() < total {
                break; // wait for the rest of the body
            }
            buf.drain(..total);
            shared.requests.fetch_add(1, Ordering::Relaxed);
            let response = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
                 Connection: {}\r\n\r\n{body}",
                body.len(),
                if keep_alive { "keep-alive" } else { "close" }
            );
            if stream.write_all(response.as_bytes()).is_err() {
                return;
            }
            if !keep_alive {
                let _ = stream.flush();
                let _ = stream.shutdown(std::net::Shutdown::Write);
                // Drain what the client may still send so close() does not turn into RST.
                let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
                let _ = stream.read(&mut chunk);
                return;
            }
            idle_since = Instant::now();
        }
        if buf.len() > MAX_HEAD || shared.stopped() || idle_since.elapsed() > IDLE {
            return;
        }
        match stream.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                idle_since = Instant::now();
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

/// The length of the request head including the blank line, if complete.
fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}

/// `(keep_alive, content_length)` of a request head: keep-alive only when asked for.
fn parse_request_head(head: &str) -> (bool, usize) {
    let mut keep_alive = false;
    let mut content_length = 0;
    for line in head.split("\r\n").skip(1) {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if key.eq_ignore_ascii_case("connection") {
            keep_alive = value
                .split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("keep-alive"));
        } else if key.eq_ignore_ascii_case("content-length") {
            content_length = value.parse().unwrap_or(0);
        }
    }
    (keep_alive, content_length)
}

/// A UDP server replying to every datagram with its name (the bytes of the name, no
/// newline). Stops on drop.
#[derive(Debug)]
pub struct UdpEchoBackend {
    name: String,
    local: SocketAddr,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl UdpEchoBackend {
    /// Binds `bind` inside `ns` and starts answering.
    ///
    /// Bind a specific address rather than a wildcard when the backend has several: a
    /// wildcard socket replies from the address the routing table prefers.
    pub fn start(ns: &Netns, bind: SocketAddr, name: impl Into<String>) -> Result<UdpEchoBackend> {
        let name = name.into();
        let socket = ns
            .in_ns(|| bind_with_retry(|| UdpSocket::bind(bind)))?
            .map_err(|e| {
                Error::io(
                    format!("binding UDP backend {name} to {bind} in {}", ns.name()),
                    e,
                )
            })?;
        let local = socket
            .local_addr()
            .map_err(|e| Error::io("socket address", e))?;
        socket
            .set_read_timeout(Some(POLL * 4))
            .map_err(|e| Error::io("setting a read timeout", e))?;
        let shared = Arc::new(Shared::default());
        let thread = {
            let shared = Arc::clone(&shared);
            let reply = name.clone().into_bytes();
            std::thread::Builder::new()
                .name(format!("udp-{name}"))
                .spawn(move || {
                    let mut buf = vec![0u8; 65536];
                    while !shared.stopped() {
                        match socket.recv_from(&mut buf) {
                            Ok((_, peer)) => {
                                shared.record(peer);
                                shared.requests.fetch_add(1, Ordering::Relaxed);
                                if let Err(e) = socket.send_to(&reply, peer) {
                                    tracing::warn!("UDP backend reply to {peer}: {e}");
                                }
                            }
                            Err(e)
                                if matches!(
                                    e.kind(),
                                    io::ErrorKind::WouldBlock
                                        | io::ErrorKind::TimedOut
                                        | io::ErrorKind::Interrupted
                                ) => {}
                            // e.g. ECONNREFUSED left by an ICMP error for an earlier reply
                            Err(e) => tracing::debug!("UDP backend recv: {e}"),
                        }
                    }
                })
                .map_err(|e| Error::io("spawning the UDP backend thread", e))?
        };
        Ok(UdpEchoBackend {
            name,
            local,
            shared,
            thread: Some(thread),
        })
    }

    /// The name it answers with.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The address it is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The source address of every datagram received, oldest first.
    pub fn peers(&self) -> Vec<SocketAddr> {
        self.shared.peers()
    }

    /// How many datagrams it has answered.
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::Relaxed)
    }
}

impl Drop for UdpEchoBackend {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::warn!("UDP backend {} thread panicked", self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_heads_are_parsed() {
        let head = "GET / HTTP/1.1\r\nHost: x\r\nConnection: Keep-Alive\r\n\r\n";
        assert_eq!(find_head_end(head.as_bytes()), Some(head.len()));
        assert_eq!(parse_request_head(head), (true, 0));
        assert_eq!(
            parse_request_head("POST / HTTP/1.1\r\ncontent-length: 5\r\n\r\n"),
            (false, 5)
        );
        assert_eq!(
            parse_request_head("GET / HTTP/1.1\r\nConnection: close\r\n\r\n"),
            (false, 0)
        );
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\n"), None);
    }

    #[test]
    fn mapped_addresses_are_canonical() {
        let mapped: SocketAddr = "[::ffff:10.0.0.1]:80".parse().unwrap();
        assert_eq!(canonical(mapped), "10.0.0.1:80".parse().unwrap());
        let v6: SocketAddr = "[fd00::1]:80".parse().unwrap();
        assert_eq!(canonical(v6), v6);
    }
}
