//! The crate's one error type, [`Error`]: every variant says what was attempted (`op`,
//! e.g. "deleting conntrack entry udp src=... (like `conntrack -D ...`)") and, where the
//! kernel or the system said no, its error code ([`Error::code`]). It serves conntrack and
//! IPVS alike.

use std::io;
use std::time::Duration;

use nix::errno::Errno;

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong talking conntrack or IPVS over netlink.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A socket call failed (creating, binding or configuring the `NETLINK_NETFILTER`
    /// socket, `send`, `recv`). `source.raw_os_error()` is the errno.
    #[error("{op}: {source}")]
    Io {
        /// What was attempted.
        op: String,
        /// The system call's error.
        #[source]
        source: io::Error,
    },
    /// The kernel answered the request with an `NLMSG_ERROR` carrying a non-zero code
    /// (e.g. EPERM without CAP_NET_ADMIN, EINVAL for a malformed request).
    #[error("{op}: the kernel answered {} ({code})", errno_name(*code))]
    Kernel {
        /// What was attempted.
        op: String,
        /// The positive errno (netlink carries it negated).
        code: i32,
    },
    /// A reply did not have the netlink framing this crate expects (bad lengths, a
    /// truncated datagram, an `NLMSG_OVERRUN`).
    #[error("{op}: malformed netlink reply: {detail}")]
    Malformed {
        /// What was attempted.
        op: String,
        /// What was wrong.
        detail: String,
    },
    /// The kernel did not answer within the socket's receive timeout.
    #[error("{op}: no answer from the kernel within {after:?}")]
    Timeout {
        /// What was attempted.
        op: String,
        /// The receive timeout that elapsed.
        after: Duration,
    },
    /// A dump lost messages (ENOBUFS) or was interrupted by table changes
    /// (`NLM_F_DUMP_INTR`) on every attempt.
    #[error("{op}: dump incomplete after {attempts} attempts (last: {reason})")]
    DumpIncomplete {
        /// What was attempted.
        op: String,
        /// How many dumps were tried.
        attempts: u32,
        /// `ENOBUFS` or `NLM_F_DUMP_INTR`.
        reason: &'static str,
    },
    /// The kernel has no IPVS: the generic netlink controller does not know the family
    /// `IPVS` (module `ip_vs` not built or not loadable), so no IPVS request can be made.
    #[error(
        "{op}: IPVS is not available in this kernel (no generic netlink family \"IPVS\"; is the ip_vs module loaded?)"
    )]
    IpvsUnavailable {
        /// What was attempted.
        op: String,
    },
    /// The request cannot be expressed: e.g. deleting an entry of a protocol without ports
    /// (ICMP), or a flow whose addresses are not of its family.
    #[error("{op}: {reason}")]
    Unsupported {
        /// What was attempted.
        op: String,
        /// Why it cannot be done.
        reason: String,
    },
}

impl Error {
    /// The errno behind the error, if there is one: the kernel's netlink error code, or
    /// the failed system call's errno.
    pub fn code(&self) -> Option<i32> {
        match self {
            Error::Kernel { code, .. } => Some(*code),
            Error::Io { source, .. } => source.raw_os_error(),
            Error::DumpIncomplete {
                reason: "ENOBUFS", ..
            } => Some(Errno::ENOBUFS as i32),
            Error::IpvsUnavailable { .. } => Some(Errno::ENOENT as i32),
            _ => None,
        }
    }

    /// What was attempted when the error happened.
    pub fn op(&self) -> &str {
        match self {
            Error::Io { op, .. }
            | Error::Kernel { op, .. }
            | Error::Malformed { op, .. }
            | Error::Timeout { op, .. }
            | Error::DumpIncomplete { op, .. }
            | Error::Unsupported { op, .. }
            | Error::IpvsUnavailable { op } => op,
        }
    }
}

/// `ENOENT`-style name of an errno, for messages.
pub(crate) fn errno_name(code: i32) -> String {
    let errno = Errno::from_raw(code);
    if errno == Errno::UnknownErrno {
        format!("errno {code}")
    } else {
        format!("{errno:?}: {}", errno.desc())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_carry_the_code_and_the_operation() {
        let e = Error::Kernel {
            op: "deleting conntrack entry udp".into(),
            code: Errno::EPERM as i32,
        };
        assert_eq!(e.code(), Some(1));
        assert_eq!(e.op(), "deleting conntrack entry udp");
        assert_eq!(
            e.to_string(),
            "deleting conntrack entry udp: the kernel answered EPERM: Operation not permitted (1)"
        );
        let io = Error::Io {
            op: "x".into(),
            source: io::Error::from_raw_os_error(Errno::ENOBUFS as i32),
        };
        assert_eq!(io.code(), Some(Errno::ENOBUFS as i32));
        let unknown = Error::Kernel {
            op: "y".into(),
            code: 99999,
        };
        assert!(unknown.to_string().contains("errno 99999"));
    }
}
