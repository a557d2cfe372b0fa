//! The [`Ipset`] runner trait (the seam an IPVS proxier uses) and its real
//! implementation [`ExecIpset`], which runs the `ipset` binary through an [`Exec`].

use std::sync::Arc;

use super::types::{SetState, parse_save};
use crate::error::Error;
use crate::iptables::{Exec, SystemExec};

/// The program [`ExecIpset`] runs.
pub const IPSET_BINARY: &str = "ipset";

/// The oldest ipset upstream kube-proxy's IPVS mode accepts (6.0).
pub const MIN_IPSET_VERSION: (u32, u32) = (6, 0);

/// A parsed `ipset version`: `ipset v7.17, protocol version: 7`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IpsetVersion {
    /// Major version (7).
    pub major: u32,
    /// Minor version (17).
    pub minor: u32,
    /// The netlink protocol version (7), 0 when not printed.
    pub protocol: u32,
}

impl IpsetVersion {
    /// Parses the first `vX.Y` word and the `protocol version: N` of `ipset version`'s
    /// output.
    ///
    /// # Errors
    /// A message when there is no `vX.Y` word.
    pub fn parse(output: &str) -> Result<IpsetVersion, String> {
        let line = output.lines().next().unwrap_or("").trim();
        let word = line
            .split(|c: char| c.is_whitespace() || c == ',')
            .find_map(|w| {
                w.strip_prefix('v')
                    .filter(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
            })
            .ok_or_else(|| "no `vX.Y' in output".to_string())?;
        let mut nums = word.split('.');
        let major = nums.next().and_then(|n| n.parse().ok());
        let minor = nums.next().map_or(Some(0), |n| n.parse().ok());
        let (Some(major), Some(minor)) = (major, minor) else {
            return Err(format!("bad version `v{word}'"));
        };
        let protocol = line
            .split_once("protocol version:")
            .and_then(|(_, p)| p.trim().parse().ok())
            .unwrap_or(0);
        Ok(IpsetVersion {
            major,
            minor,
            protocol,
        })
    }

    /// Whether this is at least `major.minor`.
    pub fn at_least(&self, major: u32, minor: u32) -> bool {
        (self.major, self.minor) >= (major, minor)
    }

    /// Whether upstream kube-proxy would run IPVS mode with it (>= [`MIN_IPSET_VERSION`]).
    pub fn is_supported(&self) -> bool {
        self.at_least(MIN_IPSET_VERSION.0, MIN_IPSET_VERSION.1)
    }
}

impl std::fmt::Display for IpsetVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The ipset runner an IPVS proxier drives: one [`Ipset::restore`] per sync, state read
/// with [`Ipset::save`]. Implementations: [`ExecIpset`] and [`crate::FakeIpset`].
pub trait Ipset: Send + Sync {
    /// `ipset version`, parsed.
    ///
    /// # Errors
    /// [`Error::Command`] or [`Error::Version`].
    fn version(&self) -> Result<IpsetVersion, Error>;

    /// Every set of the network namespace (`ipset save`, parsed with
    /// [`super::parse_save`]): callers filter by name (kube-proxy's start with `KUBE-`).
    ///
    /// # Errors
    /// [`Error::Command`] when ipset fails, [`Error::Parse`] for output not understood.
    fn save(&self) -> Result<Vec<SetState>, Error>;

    /// `ipset restore` with `payload` on stdin. Not a transaction: on failure the lines
    /// before the failing one are normally applied and nothing after it (see
    /// [`crate::FakeIpset`] for the exact rules measured); write idempotent payloads
    /// ([`super::RestoreBuilder`]) and re-read state after a failure.
    ///
    /// # Errors
    /// [`Error::Command`] with ipset's stderr, which names the failing line
    /// (`ipset v7.17: Error in line 3: Element cannot be added to the set: it's already
    /// added`).
    fn restore(&self, payload: &[u8]) -> Result<(), Error>;
}

/// The real [`Ipset`]: runs `ipset` through an [`Exec`].
///
/// A missing binary is reported as [`Error::Io`] with kind `NotFound` and a message
/// naming `ipset`; a non-zero exit as [`Error::Command`].
pub struct ExecIpset {
    exec: Arc<dyn Exec>,
}

impl std::fmt::Debug for ExecIpset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecIpset").finish_non_exhaustive()
    }
}

impl Default for ExecIpset {
    fn default() -> Self {
        Self::new()
    }
}

impl ExecIpset {
    /// Runs `ipset` from `PATH` with [`SystemExec`].
    pub fn new() -> Self {
        Self::with_exec(Arc::new(SystemExec::new()))
    }

    /// Runs commands through `exec` (a [`crate::ScriptedExec`] in tests, a [`SystemExec`]
    /// with an `ip netns exec NAME` prefix in namespace tests).
    pub fn with_exec(exec: Arc<dyn Exec>) -> Self {
        ExecIpset { exec }
    }

    fn run(&self, args: &[&str], stdin: Option<&[u8]>) -> Result<Vec<u8>, Error> {
        let argv: Vec<String> = std::iter::once(IPSET_BINARY)
            .chain(args.iter().copied())
            .map(str::to_string)
            .collect();
        let out = match self.exec.run(&argv, stdin) {
            Ok(out) => out,
            Err(Error::BinaryNotFound { command, .. }) => {
                return Err(Error::Io {
                    command,
                    source: std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "`ipset` not found: is ipset installed and on PATH?",
                    ),
                });
            }
            Err(e) => return Err(e),
        };
        if out.status != 0 {
            return Err(Error::Command {
                command: self.exec.command_line(&argv),
                status: out.status,
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(out.stdout)
    }

    /// `ipset save` as text.
    ///
    /// # Errors
    /// [`Error::Command`] when ipset fails.
    pub fn save_text(&self) -> Result<String, Error> {
        let out = self.run(&["save"], None)?;
        Ok(String::from_utf8(out)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
    }
}

impl Ipset for ExecIpset {
    fn version(&self) -> Result<IpsetVersion, Error> {
        let out = self.run(&["version"], None)?;
        let text = String::from_utf8_lossy(&out).into_owned();
        IpsetVersion::parse(&text).map_err(|message| Error::Version {
            command: format!("{IPSET_BINARY} version"),
            output: text.trim().to_string(),
            message,
        })
    }

    fn save(&self) -> Result<Vec<SetState>, Error> {
        Ok(parse_save(&self.save_text()?)?)
    }

    fn restore(&self, payload: &[u8]) -> Result<(), Error> {
        tracing::debug!(bytes = payload.len(), "ipset restore");
        self.run(&["restore"], Some(payload)).map(drop)
    }
}
