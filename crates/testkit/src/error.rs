//! [`Error`]: the harness's error type (namespaces, links, processes, backends).
//!
//! Client-side outcomes of a request (refused, timed out, unreachable) are not harness
//! failures and have their own classification, [`crate::client::ClientError`].

use std::io;
use std::process::ExitStatus;
use std::time::Duration;

/// A `Result` with the harness's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while building or running the harness.
///
/// Every variant names what was being done (the command line, the namespace, the address),
/// so a failure in a test or in `kube-proxy-rs sandbox` can be understood from the message
/// alone.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The harness needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and the process is not root.
    #[error(
        "network namespaces need root (current euid {euid}); run as root, or set \
         KP_SKIP_NETNS_TESTS=1 to skip network-namespace tests"
    )]
    NotRoot {
        /// The effective uid of the process.
        euid: u32,
    },

    /// A command could not be started at all (e.g. `ip` is not installed).
    #[error("cannot run `{argv}`: {source}")]
    Spawn {
        /// The command line.
        argv: String,
        /// The error from `fork`/`exec`.
        #[source]
        source: io::Error,
    },

    /// A command ran and exited unsuccessfully.
    #[error("`{argv}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        argv: String,
        /// Its exit status.
        status: ExitStatus,
        /// Its standard error (or standard output when stderr was empty), trimmed.
        stderr: String,
    },

    /// A thread could not enter a network namespace with `setns(2)`.
    #[error("cannot enter network namespace {ns}: {source}")]
    Setns {
        /// The namespace name.
        ns: String,
        /// The errno.
        #[source]
        source: nix::Error,
    },

    /// Any other I/O failure, with what was being done.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, e.g. `binding 10.244.1.10:8080 in kp123x4-be0`.
        context: String,
        /// The I/O error.
        #[source]
        source: io::Error,
    },

    /// An argument was rejected before anything was created.
    #[error("invalid {what}: {message}")]
    Invalid {
        /// Which argument, e.g. `namespace role`.
        what: &'static str,
        /// What is wrong with it, quoting the value.
        message: String,
    },

    /// A condition did not become true in time.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// The timeout.
        after: Duration,
    },

    /// A supervised child process exited while it was expected to keep running.
    #[error("{what} (pid {pid}) exited unexpectedly: {status}")]
    ChildExited {
        /// The label given to the child.
        what: String,
        /// Its process id.
        pid: u32,
        /// Its exit status.
        status: ExitStatus,
    },

    /// The test VM cannot be started: qemu, busybox or the prepared guest kernel is missing.
    #[error("cannot boot the test VM: {message}; run scripts/install-deps as root to prepare it")]
    VmUnavailable {
        /// What is missing, with its path.
        message: String,
    },

    /// The test VM ran but did not report the command's exit status (timeout, kernel panic,
    /// a failed mount in the guest's setup).
    #[error("test VM: {message}; console log {} (kept), its end:\n{tail}", console.display())]
    VmFailed {
        /// What happened, e.g. `timed out after 600s`.
        message: String,
        /// The guest's serial console log (the run directory is kept for inspection).
        console: std::path::PathBuf,
        /// The last lines of the console log.
        tail: String,
    },

    /// The guest run was interrupted ([`crate::vm::GuestCommand::interrupt_on`]): qemu was
    /// killed, and everything in the guest with it.
    #[error("the qemu guest was interrupted after {after:?} and stopped")]
    VmInterrupted {
        /// From starting qemu to the interrupt.
        after: Duration,
    },
}

impl Error {
    /// Builds an [`Error::VmUnavailable`].
    pub fn vm_unavailable(message: impl Into<String>) -> Self {
        Error::VmUnavailable {
            message: message.into(),
        }
    }

    /// Builds an [`Error::Io`] with `context`.
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// Builds an [`Error::Invalid`].
    pub fn invalid(what: &'static str, message: impl Into<String>) -> Self {
        Error::Invalid {
            what,
            message: message.into(),
        }
    }
}
