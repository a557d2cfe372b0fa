//! One ICMP echo request from inside a network namespace (the sandbox's ping line), over a
//! raw socket: no `ping` program needed (iputils is often absent), root only.

use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use kp_testkit::Netns;

use crate::sandbox::words::{PING_ANSWERED, PING_NO_ANSWER, PING_UNREACHABLE, with_detail};
use nix::sys::socket::{
    AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType, SockaddrIn, recvfrom, sendto,
    setsockopt, socket, sockopt::ReceiveTimeout,
};
use nix::sys::time::{TimeVal, TimeValLike};

/// What one echo request got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ping {
    /// An echo reply from the address, after this long.
    Answered(Duration),
    /// An ICMP destination unreachable about our request, from this router.
    Unreachable(Ipv4Addr),
    /// Nothing within the timeout.
    NoAnswer,
}

impl std::fmt::Display for Ping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ping::Answered(d) => f.write_str(&with_detail(
                PING_ANSWERED,
                &format!("{:.2} ms", d.as_secs_f64() * 1e3),
            )),
            Ping::Unreachable(from) => {
                f.write_str(&with_detail(PING_UNREACHABLE, &from.to_string()))
            }
            Ping::NoAnswer => f.write_str(PING_NO_ANSWER.word),
        }
    }
}

/// The Internet checksum of `data`.
fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An echo request with identifier `id` and sequence 1.
fn echo_request(id: u16) -> Vec<u8> {
    let mut pkt = vec![8, 0, 0, 0];
    pkt.extend_from_slice(&id.to_be_bytes());
    pkt.extend_from_slice(&1u16.to_be_bytes());
    pkt.extend_from_slice(b"kube-proxy-rs ping");
    let sum = checksum(&pkt);
    pkt[2..4].copy_from_slice(&sum.to_be_bytes());
    pkt
}

/// Reads an IPv4 packet a raw ICMP socket received: `Some` when it is about our request
/// `id` to `target` (an echo reply from it, or a destination unreachable quoting it).
fn classify(packet: &[u8], target: Ipv4Addr, id: u16, elapsed: Duration) -> Option<Ping> {
    let ihl = usize::from(*packet.first()? & 0x0f) * 4;
    let src = Ipv4Addr::new(
        *packet.get(12)?,
        *packet.get(13)?,
        *packet.get(14)?,
        *packet.get(15)?,
    );
    let icmp = packet.get(ihl..)?;
    let id_of = |echo: &[u8]| echo.get(4..6).map(|b| u16::from_be_bytes([b[0], b[1]]));
    match *icmp.first()? {
        0 if src == target && id_of(icmp) == Some(id) => Some(Ping::Answered(elapsed)),
        3 => {
            // The quoted datagram: its IP header, then our echo request.
            let inner = icmp.get(8..)?;
            let inner_ihl = usize::from(*inner.first()? & 0x0f) * 4;
            let dst = Ipv4Addr::new(
                *inner.get(16)?,
                *inner.get(17)?,
                *inner.get(18)?,
                *inner.get(19)?,
            );
            let echo = inner.get(inner_ihl..)?;
            (dst == target && *echo.first()? == 8 && id_of(echo) == Some(id))
                .then_some(Ping::Unreachable(src))
        }
        _ => None,
    }
}

/// Sends one ICMP echo request from `ns` to `target` and waits up to `timeout`.
///
/// # Errors
/// Entering the namespace or the socket calls failed (e.g. not root).
pub fn ping(ns: &Netns, target: IpAddr, timeout: Duration) -> anyhow::Result<Ping> {
    let IpAddr::V4(target) = target else {
        anyhow::bail!("ping {target}: only IPv4 is supported");
    };
    ns.in_ns(|| -> anyhow::Result<Ping> {
        let fd = socket(
            AddressFamily::Inet,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::Icmp,
        )?;
        let id = (std::process::id() as u16) ^ 0x6b70;
        let start = Instant::now();
        let dest = SockaddrIn::from(SocketAddrV4::new(target, 0));
        sendto(fd.as_raw_fd(), &echo_request(id), &dest, MsgFlags::empty())?;
        let mut buf = [0u8; 1500];
        loop {
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Ok(Ping::NoAnswer);
            }
            let wait = TimeVal::microseconds(left.as_micros().max(1) as i64);
            setsockopt(&fd, ReceiveTimeout, &wait)?;
            match recvfrom::<SockaddrIn>(fd.as_raw_fd(), &mut buf) {
                Ok((n, _)) => {
                    if let Some(p) = classify(&buf[..n], target, id, start.elapsed()) {
                        return Ok(p);
                    }
                }
                Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    })?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_echo_request_checksums_to_zero() {
        let pkt = echo_request(0x1234);
        assert_eq!(checksum(&pkt), 0);
        assert_eq!(&pkt[..2], &[8, 0]);
    }

    #[test]
    fn replies_and_unreachables_are_told_apart() {
        let target = Ipv4Addr::new(10, 96, 138, 71);
        let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, 1, 0, 0];
        ip.extend_from_slice(&target.octets());
        ip.extend_from_slice(&[192, 168, 56, 100]);
        let mut reply = ip.clone();
        let mut echo = echo_request(7);
        echo[0] = 0;
        reply.extend_from_slice(&echo);
        let d = Duration::from_millis(1);
        assert_eq!(classify(&reply, target, 7, d), Some(Ping::Answered(d)));
        assert_eq!(classify(&reply, target, 8, d), None);
        // From the node: unreachable, quoting our request to the target.
        let node = Ipv4Addr::new(192, 168, 56, 10);
        let mut unreach = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, 1, 0, 0];
        unreach.extend_from_slice(&node.octets());
        unreach.extend_from_slice(&[192, 168, 56, 100]);
        unreach.extend_from_slice(&[3, 0, 0, 0, 0, 0, 0, 0]);
        let mut quoted = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, 1, 0, 0, 192, 168, 56, 100];
        quoted.extend_from_slice(&target.octets());
        quoted.extend_from_slice(&echo_request(7)[..8]);
        unreach.extend_from_slice(&quoted);
        assert_eq!(
            classify(&unreach, target, 7, d),
            Some(Ping::Unreachable(node))
        );
        assert_eq!(Ping::Answered(d).to_string(), "answered (1.00 ms)");
        assert_eq!(Ping::NoAnswer.to_string(), "no answer");
    }
}
