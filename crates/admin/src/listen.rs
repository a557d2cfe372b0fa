//! Bind addresses: parsing the `--*-bind-address` flags and opening listening sockets.
//!
//! Upstream listens with Go's `net.Listen("tcp", addr)`. For an unspecified host (`0.0.0.0`
//! or `::`) Go opens one dual-stack `[::]` socket when the host has IPv6, and an IPv4 socket
//! otherwise; [`listen`] does the same (the `[::]` socket is dual-stack under the Linux
//! default `net.ipv6.bindv6only=0`). Like Go, it sets `SO_REUSEADDR`.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use tokio::net::{TcpListener, TcpSocket};

use crate::AdminError;

/// Parses a `--healthz-bind-address` / `--metrics-bind-address` value.
///
/// - empty (or blank): `Ok(None)`, the server is disabled;
/// - `IP:port` or `[IPv6]:port`: that address;
/// - a bare IP (`0.0.0.0`, `::`, `[::1]`): that IP with `default_port`, as upstream's
///   `AppendPortIfNeeded`.
///
/// # Errors
/// [`AdminError::InvalidAddress`] for anything else (host names included: upstream requires
/// an IP).
pub fn parse_bind_address(
    value: &str,
    default_port: u16,
) -> Result<Option<SocketAddr>, AdminError> {
    let trimmed = value.trim();
    if trimmed.is_empty() {
        return Ok(None);
    }
    if let Ok(addr) = trimmed.parse::<SocketAddr>() {
        return Ok(Some(addr));
    }
    let bare = trimmed
        .strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .unwrap_or(trimmed);
    match bare.parse::<IpAddr>() {
        Ok(ip) => Ok(Some(SocketAddr::new(ip, default_port))),
        Err(_) => Err(AdminError::InvalidAddress {
            value: value.to_string(),
            reason: "expected IP:port, [IPv6]:port, a bare IP, or empty to disable".into(),
        }),
    }
}

/// Opens a listening TCP socket on `addr` (see the module docs for unspecified hosts).
///
/// Must be called within a Tokio runtime (the socket is registered with its reactor).
///
/// # Errors
/// [`AdminError::Bind`] with the OS error (`EADDRINUSE` when the port is taken).
pub fn listen(addr: SocketAddr) -> Result<TcpListener, AdminError> {
    let bind_err = |source| AdminError::Bind { addr, source };
    if !addr.ip().is_unspecified() {
        return listen_exact(addr).map_err(bind_err);
    }
    let v6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), addr.port());
    match listen_exact(v6) {
        Ok(l) => Ok(l),
        // A real conflict would conflict for IPv4 as well: report it.
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::AddrInUse | io::ErrorKind::PermissionDenied
            ) =>
        {
            Err(bind_err(e))
        }
        // No IPv6 on this host: IPv4 only, as Go does.
        Err(_) => {
            let v4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), addr.port());
            listen_exact(v4).map_err(bind_err)
        }
    }
}

fn listen_exact(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_bind_addresses_like_upstream() {
        assert_eq!(parse_bind_address("", 10256).ok(), Some(None));
        assert_eq!(parse_bind_address("  ", 10256).ok(), Some(None));
        let some = |s: &str| Some(Some(s.parse::<SocketAddr>().ok()).flatten());
        assert_eq!(
            parse_bind_address("0.0.0.0:10256", 1).ok(),
            some("0.0.0.0:10256")
        );
        assert_eq!(parse_bind_address("[::]:10249", 1).ok(), some("[::]:10249"));
        assert_eq!(
            parse_bind_address("127.0.0.1", 10249).ok(),
            some("127.0.0.1:10249")
        );
        assert_eq!(parse_bind_address("::1", 10249).ok(), some("[::1]:10249"));
        assert_eq!(parse_bind_address("[::1]", 10249).ok(), some("[::1]:10249"));
        assert!(matches!(
            parse_bind_address("localhost:80", 1),
            Err(AdminError::InvalidAddress { .. })
        ));
        assert!(parse_bind_address("1.2.3.4:99999", 1).is_err());
    }

    #[tokio::test]
    async fn listen_reports_a_taken_port() {
        let first = listen(
            "127.0.0.1:0"
                .parse()
                .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0))),
        );
        let Ok(first) = first else {
            panic!("cannot bind an ephemeral port: {first:?}");
        };
        let Ok(addr) = first.local_addr() else {
            panic!("no local address");
        };
        let second = listen(addr);
        assert!(
            matches!(&second, Err(AdminError::Bind { source, .. }) if source.kind() == io::ErrorKind::AddrInUse),
            "{second:?}"
        );
    }
}
