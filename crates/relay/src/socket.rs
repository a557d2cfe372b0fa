//! Opening listening sockets (with `nix`, so `IPV6_V6ONLY` can be set before `bind`), port
//! selection inside `--proxy-port-range`, and the file descriptor limit.
//!
//! TCP listeners get `SO_REUSEADDR`, so a port is reusable at once even while connections
//! accepted on it are still open or in `TIME_WAIT`. UDP sockets do not: on UDP the option
//! lets two sockets bind the same port, which would hide a port in use instead of skipping it.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};

use nix::errno::Errno;
use nix::sys::resource::{Resource, getrlimit, setrlimit};
use nix::sys::socket::{
    AddressFamily, Backlog, SockFlag, SockType, SockaddrStorage, bind, listen, setsockopt, socket,
    sockopt,
};

use crate::{Protocol, RelayError};

/// Why one port could not be opened.
enum OpenError {
    /// `EADDRINUSE`: try the next port of the range.
    InUse(RelayError),
    /// Anything else: give up on this listener.
    Fatal(RelayError),
}

/// Creates, configures, binds and (TCP) listens one non-blocking, close-on-exec socket.
fn open_one(protocol: Protocol, addr: SocketAddr) -> Result<OwnedFd, OpenError> {
    let setup = |op: &'static str| {
        move |e: Errno| {
            OpenError::Fatal(RelayError::Socket {
                protocol,
                op,
                source: e.into(),
            })
        }
    };
    let family = if addr.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let ty = match protocol {
        Protocol::Tcp => SockType::Stream,
        Protocol::Udp => SockType::Datagram,
    };
    let fd = socket(
        family,
        ty,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(setup("socket"))?;
    if protocol == Protocol::Tcp {
        setsockopt(&fd, sockopt::ReuseAddr, &true).map_err(setup("SO_REUSEADDR"))?;
    }
    if addr.is_ipv6() {
        setsockopt(&fd, sockopt::Ipv6V6Only, &true).map_err(setup("IPV6_V6ONLY"))?;
    }
    if let Err(e) = bind(fd.as_raw_fd(), &SockaddrStorage::from(addr)) {
        let err = RelayError::Bind {
            protocol,
            addr,
            source: e.into(),
        };
        return Err(if e == Errno::EADDRINUSE {
            OpenError::InUse(err)
        } else {
            OpenError::Fatal(err)
        });
    }
    if protocol == Protocol::Tcp {
        listen(&fd, Backlog::MAXCONN).map_err(setup("listen"))?;
    }
    Ok(fd)
}

/// Opens a socket on `bind`, on a port of `range` (starting at a random one, skipping ports in
/// use) or, without a range, on a port the kernel picks. Returns the socket and its port.
fn open_in_range(
    protocol: Protocol,
    bind: IpAddr,
    range: Option<(u16, u16)>,
) -> Result<(OwnedFd, u16), RelayError> {
    let Some((lo, hi)) = range else {
        return match open_one(protocol, SocketAddr::new(bind, 0)) {
            Ok(fd) => {
                let port = local_port(&fd, protocol)?;
                Ok((fd, port))
            }
            Err(OpenError::InUse(e) | OpenError::Fatal(e)) => Err(e),
        };
    };
    if lo == 0 || lo > hi {
        return Err(RelayError::InvalidPortRange { range: (lo, hi) });
    }
    let span = u32::from(hi - lo) + 1;
    let start = fastrand::u32(0..span);
    for i in 0..span {
        // lo + (start + i) % span <= hi, so the conversion cannot fail.
        let port = u16::try_from(u32::from(lo) + (start + i) % span).unwrap_or(hi);
        match open_one(protocol, SocketAddr::new(bind, port)) {
            Ok(fd) => return Ok((fd, port)),
            Err(OpenError::InUse(_)) => continue,
            Err(OpenError::Fatal(e)) => return Err(e),
        }
    }
    Err(RelayError::PortRangeExhausted {
        protocol,
        range: (lo, hi),
    })
}

/// The port a socket was bound to.
fn local_port(fd: &OwnedFd, protocol: Protocol) -> Result<u16, RelayError> {
    let addr: SockaddrStorage =
        nix::sys::socket::getsockname(fd.as_raw_fd()).map_err(|e| RelayError::Socket {
            protocol,
            op: "getsockname",
            source: e.into(),
        })?;
    addr.as_sockaddr_in()
        .map(|a| a.port())
        .or_else(|| addr.as_sockaddr_in6().map(|a| a.port()))
        .ok_or_else(|| RelayError::Socket {
            protocol,
            op: "getsockname",
            source: io::Error::other("not an inet address"),
        })
}

/// A listening TCP socket on `bind` and its port; see [`open_in_range`].
pub(crate) fn open_tcp(
    bind: IpAddr,
    range: Option<(u16, u16)>,
) -> Result<(std::net::TcpListener, u16), RelayError> {
    let (fd, port) = open_in_range(Protocol::Tcp, bind, range)?;
    Ok((std::net::TcpListener::from(fd), port))
}

/// A bound UDP socket on `bind` and its port; see [`open_in_range`].
pub(crate) fn open_udp(
    bind: IpAddr,
    range: Option<(u16, u16)>,
) -> Result<(std::net::UdpSocket, u16), RelayError> {
    let (fd, port) = open_in_range(Protocol::Udp, bind, range)?;
    Ok((std::net::UdpSocket::from(fd), port))
}

/// Raises `RLIMIT_NOFILE`'s soft limit to the hard limit and returns the new soft limit.
///
/// Every TCP connection costs 6 file descriptors (2 sockets, 2 pipes) and every UDP flow 1, so
/// the common default soft limit of 1024 allows only about 170 connections. When the hard
/// limit is unlimited, the soft limit is raised to the kernel's `fs.nr_open` instead.
///
/// # Errors
///
/// `getrlimit`/`setrlimit` failures, as `std::io::Error`.
pub fn raise_fd_limit() -> io::Result<u64> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft >= hard {
        return Ok(soft);
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => Ok(hard),
        Err(e) if hard == nix::libc::RLIM_INFINITY => {
            let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or(io::Error::from(e))?;
            if nr_open <= soft {
                return Ok(soft);
            }
            setrlimit(Resource::RLIMIT_NOFILE, nr_open, hard)?;
            Ok(nr_open)
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    #[test]
    fn invalid_ranges_are_refused() {
        for range in [(0, 10), (20, 10)] {
            assert!(matches!(
                open_tcp(LOCAL, Some(range)),
                Err(RelayError::InvalidPortRange { range: r }) if r == range
            ));
        }
    }

    #[test]
    fn a_range_skips_ports_in_use_and_reports_exhaustion() {
        // A kernel-chosen port, in use by a plain listener: a one-port range over it is
        // exhausted for TCP; a UDP socket on the same number is a different port space.
        let taken = std::net::TcpListener::bind((LOCAL, 0)).unwrap();
        let port = taken.local_addr().unwrap().port();
        assert!(matches!(
            open_tcp(LOCAL, Some((port, port))),
            Err(RelayError::PortRangeExhausted { protocol: Protocol::Tcp, range }) if range == (port, port)
        ));
        let udp_taken = std::net::UdpSocket::bind((LOCAL, 0)).unwrap();
        let uport = udp_taken.local_addr().unwrap().port();
        assert!(matches!(
            open_udp(LOCAL, Some((uport, uport))),
            Err(RelayError::PortRangeExhausted {
                protocol: Protocol::Udp,
                ..
            })
        ));
        drop(taken);
        let (l, got) = open_tcp(LOCAL, Some((port, port))).unwrap();
        assert_eq!(got, port);
        assert_eq!(l.local_addr().unwrap().port(), port);
    }

    #[test]
    fn kernel_chosen_ports_are_reported() {
        let (l, port) = open_tcp(LOCAL, None).unwrap();
        assert_ne!(port, 0);
        assert_eq!(l.local_addr().unwrap().port(), port);
        let (u, port) = open_udp(LOCAL, None).unwrap();
        assert_eq!(u.local_addr().unwrap().port(), port);
    }

    #[test]
    fn ipv6_sockets_are_v6_only() {
        let Ok((l, port)) = open_tcp(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED), None) else {
            return; // no IPv6 on this host
        };
        let fd = OwnedFd::from(l);
        assert!(nix::sys::socket::getsockopt(&fd, sockopt::Ipv6V6Only).unwrap());
        // The IPv4 port of the same number is still free.
        assert!(std::net::TcpListener::bind((LOCAL, port)).is_ok());
    }

    #[test]
    fn fd_limit_is_raised_to_the_hard_limit() {
        let got = raise_fd_limit().unwrap();
        let (soft, _) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        assert_eq!(got, soft);
    }
}
