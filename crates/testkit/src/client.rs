//! Clients: HTTP GET and UDP requests sent from inside a namespace.
//!
//! Outcomes are classified by [`ClientError`], so a test can tell a REJECT rule
//! ([`ClientError::Refused`]: an RST or ICMP port-unreachable) from a DROP rule or a
//! missing backend ([`ClientError::Timeout`]) from a routing hole or an ICMP
//! host/net-unreachable ([`ClientError::Unreachable`]), and all of them from a connection
//! accepted and then reset ([`ClientError::Reset`], a userspace proxy without a working
//! endpoint).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use nix::errno::Errno;

use crate::backend::{bind_with_retry, canonical};
use crate::error::{Error, Result};
use crate::netns::Netns;

/// Why a client request failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The connection was refused: `ECONNREFUSED` (a TCP RST, or an ICMP port-unreachable
    /// as sent by an iptables `REJECT` rule or for a closed UDP port).
    #[error("connection refused")]
    Refused,
    /// Nothing answered within the timeout (e.g. a `DROP` rule, or no route back).
    #[error("timed out")]
    Timeout,
    /// `EHOSTUNREACH`/`ENETUNREACH`: no route, or an ICMP host/net-unreachable.
    #[error("host or network unreachable")]
    Unreachable,
    /// The connection was accepted, then reset (`ECONNRESET`, `EPIPE`) or closed before any
    /// reply: what a userspace-mode proxy does when no endpoint answers.
    #[error("connection reset")]
    Reset,
    /// Anything else (a reset connection, a malformed reply, a harness failure).
    #[error("{0}")]
    Other(#[source] io::Error),
}

impl ClientError {
    /// Classifies an I/O error from `connect`, `send` or `recv`.
    pub fn classify(e: io::Error) -> ClientError {
        if let Some(code) = e.raw_os_error() {
            match Errno::from_raw(code) {
                Errno::ECONNREFUSED => return ClientError::Refused,
                Errno::EHOSTUNREACH | Errno::ENETUNREACH => return ClientError::Unreachable,
                Errno::ETIMEDOUT | Errno::EAGAIN => return ClientError::Timeout,
                Errno::ECONNRESET | Errno::EPIPE | Errno::ECONNABORTED => {
                    return ClientError::Reset;
                }
                _ => {}
            }
        }
        match e.kind() {
            io::ErrorKind::ConnectionRefused => ClientError::Refused,
            io::ErrorKind::HostUnreachable | io::ErrorKind::NetworkUnreachable => {
                ClientError::Unreachable
            }
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => ClientError::Timeout,
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionAborted => ClientError::Reset,
            _ => ClientError::Other(e),
        }
    }

    fn harness(e: Error) -> ClientError {
        ClientError::Other(io::Error::other(e))
    }

    fn invalid(message: String) -> ClientError {
        ClientError::Other(io::Error::new(io::ErrorKind::InvalidData, message))
    }
}

/// A successful HTTP reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpReply {
    /// The status code (the backends of this crate always send 200).
    pub status: u16,
    /// The body; for an [`crate::HttpBackend`] its name plus `"\n"`.
    pub body: String,
    /// Connect plus response time.
    pub elapsed: Duration,
    /// The client's local (source) address of the connection.
    pub local: SocketAddr,
}

impl HttpReply {
    /// The body without trailing whitespace: the backend's name.
    pub fn name(&self) -> &str {
        self.body.trim_end()
    }
}

/// Sends `GET / HTTP/1.1` to `target` from inside `ns` and reads the reply.
///
/// `timeout` bounds the whole exchange (connect plus response).
pub fn http_get(
    ns: &Netns,
    target: SocketAddr,
    timeout: Duration,
) -> Result<HttpReply, ClientError> {
    ns.in_ns(|| get(target, timeout))
        .map_err(ClientError::harness)?
}

/// Sends `n` requests one after the other (each a new connection, each with `timeout`)
/// from ONE thread inside `ns`.
pub fn http_get_many(
    ns: &Netns,
    target: SocketAddr,
    n: usize,
    timeout: Duration,
) -> Vec<Result<HttpReply, ClientError>> {
    match ns.in_ns(|| (0..n).map(|_| get(target, timeout)).collect()) {
        Ok(results) => results,
        Err(e) => {
            let message = e.to_string();
            (0..n)
                .map(|_| Err(ClientError::Other(io::Error::other(message.clone()))))
                .collect()
        }
    }
}

/// Like [`http_get_many`], but calls `go_on` with each result and stops early, without
/// sending the rest, as soon as it returns `false` (e.g. an interrupt flag was set, or the
/// target keeps failing). Returns the results of the requests actually sent.
pub fn http_get_while<F>(
    ns: &Netns,
    target: SocketAddr,
    n: usize,
    timeout: Duration,
    mut go_on: F,
) -> Vec<Result<HttpReply, ClientError>>
where
    F: FnMut(&Result<HttpReply, ClientError>) -> bool + Send,
{
    let sent = ns.in_ns(|| {
        let mut results = Vec::with_capacity(n);
        for _ in 0..n {
            let r = get(target, timeout);
            let more = go_on(&r);
            results.push(r);
            if !more {
                break;
            }
        }
        results
    });
    sent.unwrap_or_else(|e| vec![Err(ClientError::Other(io::Error::other(e.to_string())))])
}

fn get(target: SocketAddr, timeout: Duration) -> Result<HttpReply, ClientError> {
    if timeout.is_zero() {
        return Err(ClientError::Other(io::Error::new(
            io::ErrorKind::InvalidInput,
            "zero timeout",
        )));
    }
    let start = Instant::now();
    let deadline = start + timeout;
    let mut stream = TcpStream::connect_timeout(&target, timeout).map_err(ClientError::classify)?;
    let local = canonical(stream.local_addr().map_err(ClientError::Other)?);
    let remaining = |now: Instant| deadline.saturating_duration_since(now);
    stream
        .set_write_timeout(Some(
            remaining(Instant::now()).max(Duration::from_millis(1)),
        ))
        .map_err(ClientError::Other)?;
    let request = format!(
        "GET / HTTP/1.1\r\nHost: {target}\r\nUser-Agent: kp-testkit\r\nAccept: */*\r\n\
         Connection: close\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .map_err(ClientError::classify)?;

    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(reply) = parse_response(&buf, false).map_err(ClientError::invalid)? {
            return Ok(HttpReply {
                elapsed: start.elapsed(),
                local,
                ..reply
            });
        }
        let left = remaining(Instant::now());
        if left.is_zero() {
            return Err(ClientError::Timeout);
        }
        stream
            .set_read_timeout(Some(left))
            .map_err(ClientError::Other)?;
        match stream.read(&mut chunk) {
            Ok(0) => {
                return match parse_response(&buf, true).map_err(ClientError::invalid)? {
                    Some(reply) => Ok(HttpReply {
                        elapsed: start.elapsed(),
                        local,
                        ..reply
                    }),
                    None if buf.is_empty() => Err(ClientError::Reset),
                    None => Err(ClientError::invalid(format!(
                        "truncated HTTP response from {target}: {:?}",
                        String::from_utf8_lossy(&buf)
                    ))),
                };
            }
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ClientError::classify(e)),
        }
    }
}

/// Parses a complete response in `buf` (`eof`: the peer closed the connection).
///
/// `Ok(None)` means "need more bytes". The returned reply has placeholder `elapsed`/`local`.
fn parse_response(buf: &[u8], eof: bool) -> std::result::Result<Option<HttpReply>, String> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4) else {
        return Ok(None);
    };
    let head = String::from_utf8_lossy(&buf[..end]);
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let (version, code) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let status = match code.parse::<u16>() {
        Ok(s) if version.starts_with("HTTP/1.") => s,
        _ => return Err(format!("malformed HTTP status line {status_line:?}")),
    };
    let mut content_length = None;
    for line in lines {
        if let Some((k, v)) = line.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            content_length = Some(
                v.trim()
                    .parse::<usize>()
                    .map_err(|_| format!("bad Content-Length {v:?}"))?,
            );
        }
    }
    let body = &buf[end..];
    let body = match content_length {
        Some(len) if body.len() >= len => &body[..len],
        Some(_) => return Ok(None),
        None if eof => body,
        None => return Ok(None),
    };
    Ok(Some(HttpReply {
        status,
        body: String::from_utf8_lossy(body).into_owned(),
        elapsed: Duration::ZERO,
        local: SocketAddr::from(([0, 0, 0, 0], 0)),
    }))
}

/// A UDP reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpReply {
    /// The datagram's payload (for an [`crate::UdpEchoBackend`], its name).
    pub data: Vec<u8>,
    /// Where it came from (after the proxy's reverse NAT: the address the request was
    /// sent to).
    pub from: SocketAddr,
    /// The client's local (source) address.
    pub local: SocketAddr,
    /// Send-to-reply time.
    pub elapsed: Duration,
}

impl UdpReply {
    /// The payload as text (lossy UTF-8).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.data).into_owned()
    }
}

/// Sends one datagram to `target` from inside `ns` and waits up to `timeout` for the
/// reply, from a new socket bound to `bind` (a fixed source port) or to an ephemeral port.
///
/// The socket is connected, so an ICMP port-unreachable is reported as
/// [`ClientError::Refused`].
pub fn udp_request(
    ns: &Netns,
    target: SocketAddr,
    payload: &[u8],
    timeout: Duration,
    bind: Option<SocketAddr>,
) -> Result<UdpReply, ClientError> {
    let bind = bind.unwrap_or_else(|| unspecified_for(target));
    let socket = ns
        .in_ns(|| bind_with_retry(|| UdpSocket::bind(bind)))
        .map_err(ClientError::harness)?
        .map_err(|e| {
            ClientError::Other(io::Error::new(e.kind(), format!("binding {bind}: {e}")))
        })?;
    exchange(&socket, target, payload, timeout)
}

fn unspecified_for(target: SocketAddr) -> SocketAddr {
    match target {
        SocketAddr::V4(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
        SocketAddr::V6(_) => SocketAddr::from(([0u16; 8], 0)),
    }
}

fn exchange(
    socket: &UdpSocket,
    target: SocketAddr,
    payload: &[u8],
    timeout: Duration,
) -> Result<UdpReply, ClientError> {
    if timeout.is_zero() {
        return Err(ClientError::Other(io::Error::new(
            io::ErrorKind::InvalidInput,
            "zero timeout",
        )));
    }
    socket.connect(target).map_err(ClientError::classify)?;
    drain(socket);
    let local = canonical(socket.local_addr().map_err(ClientError::Other)?);
    let start = Instant::now();
    socket.send(payload).map_err(ClientError::classify)?;
    socket
        .set_read_timeout(Some(timeout))
        .map_err(ClientError::Other)?;
    let mut buf = vec![0u8; 65536];
    loop {
        match socket.recv(&mut buf) {
            Ok(n) => {
                return Ok(UdpReply {
                    data: buf[..n].to_vec(),
                    from: target,
                    local,
                    elapsed: start.elapsed(),
                });
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                let left = timeout.saturating_sub(start.elapsed());
                if left.is_zero() {
                    return Err(ClientError::Timeout);
                }
                socket
                    .set_read_timeout(Some(left))
                    .map_err(ClientError::Other)?;
            }
            Err(e) => return Err(ClientError::classify(e)),
        }
    }
}

/// Discards late replies and pending ICMP errors of earlier exchanges.
fn drain(socket: &UdpSocket) {
    if socket.set_nonblocking(true).is_err() {
        return;
    }
    let mut buf = [0u8; 2048];
    for _ in 0..1024 {
        match socket.recv(&mut buf) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(_) => {} // a pending error is consumed by reading it
        }
    }
    let _ = socket.set_nonblocking(false);
}

/// A UDP socket created inside a namespace that keeps its source address and port across
/// requests (e.g. to exercise conntrack entries of one flow).
#[derive(Debug)]
pub struct UdpClient {
    socket: UdpSocket,
    local: SocketAddr,
    ns: String,
}

impl UdpClient {
    /// Binds a socket to `bind` inside `ns` (port 0: an ephemeral port, then fixed).
    pub fn bind(ns: &Netns, bind: SocketAddr) -> Result<UdpClient> {
        let socket = ns
            .in_ns(|| bind_with_retry(|| UdpSocket::bind(bind)))?
            .map_err(|e| Error::io(format!("binding UDP client to {bind} in {}", ns.name()), e))?;
        let local = canonical(
            socket
                .local_addr()
                .map_err(|e| Error::io("socket address", e))?,
        );
        Ok(UdpClient {
            socket,
            local,
            ns: ns.name().to_owned(),
        })
    }

    /// The local address (with the port actually bound).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The namespace it was created in.
    pub fn ns_name(&self) -> &str {
        &self.ns
    }

    /// Sends `payload` to `target` and waits up to `timeout` for a reply, like
    /// [`udp_request`] but from this socket's fixed source port.
    pub fn request(
        &self,
        target: SocketAddr,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<UdpReply, ClientError> {
        exchange(&self.socket, target, payload, timeout)
    }

    /// Sends one datagram to `target` without waiting for a reply.
    pub fn send(&self, target: SocketAddr, payload: &[u8]) -> Result<(), ClientError> {
        self.socket.connect(target).map_err(ClientError::classify)?;
        self.socket
            .send(payload)
            .map(drop)
            .map_err(ClientError::classify)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_are_parsed() {
        let full = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbe0\n";
        let reply = parse_response(full, false).unwrap().unwrap();
        assert_eq!((reply.status, reply.name()), (200, "be0"));
        assert_eq!(parse_response(&full[..full.len() - 1], false), Ok(None));
        assert_eq!(
            parse_response(b"HTTP/1.1 503 Unavailable\r\n\r\nno", false),
            Ok(None)
        );
        let r = parse_response(b"HTTP/1.1 503 Unavailable\r\n\r\nno", true)
            .unwrap()
            .unwrap();
        assert_eq!((r.status, r.body.as_str()), (503, "no"));
        assert!(parse_response(b"SSH-2.0\r\n\r\n", true).is_err());
    }

    #[test]
    fn errors_are_classified() {
        let c = |errno: Errno| ClientError::classify(io::Error::from_raw_os_error(errno as i32));
        assert!(matches!(c(Errno::ECONNREFUSED), ClientError::Refused));
        assert!(matches!(c(Errno::EHOSTUNREACH), ClientError::Unreachable));
        assert!(matches!(c(Errno::ENETUNREACH), ClientError::Unreachable));
        assert!(matches!(c(Errno::ETIMEDOUT), ClientError::Timeout));
        assert!(matches!(c(Errno::EAGAIN), ClientError::Timeout));
        assert!(matches!(c(Errno::ECONNRESET), ClientError::Reset));
        assert!(matches!(c(Errno::EPIPE), ClientError::Reset));
        assert!(matches!(c(Errno::EINVAL), ClientError::Other(_)));
        let timed_out = io::Error::new(io::ErrorKind::TimedOut, "connection timed out");
        assert!(matches!(
            ClientError::classify(timed_out),
            ClientError::Timeout
        ));
    }
}
