//! Standard output of the one-shot commands (`trace`, `--dry-run`): a reader that goes away
//! early (`trace --json | head -c 100`) ends the command quietly, as SIGPIPE ends `cat` or
//! `iptables-save`, instead of the panic of `println!` ("failed printing to stdout: Broken
//! pipe", exit status 101).
//!
//! Rust starts every program with SIGPIPE ignored, so a write to a closed pipe fails with
//! `EPIPE` instead of killing the process. The daemon needs that: it writes to the stdin of
//! `iptables-restore` and `nft`, and one that exits early must not kill it. So SIGPIPE stays
//! ignored, and [`print`] reports `EPIPE` on standard output as [`ClosedStdout`], which
//! `main` turns into exit status [`CLOSED_STDOUT_STATUS`] (141, the status a shell reports
//! for a tool that SIGPIPE ended), with nothing printed on stderr.

use std::io::Write as _;

/// Standard output was closed by its reader (`EPIPE`): nothing more can be printed.
#[derive(Debug)]
pub struct ClosedStdout;

impl std::fmt::Display for ClosedStdout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("standard output was closed by its reader")
    }
}

impl std::error::Error for ClosedStdout {}

/// Writes `text` to standard output and flushes it.
///
/// # Errors
/// [`ClosedStdout`] when the reader has gone away (a broken pipe); another write error as
/// itself (`writing to standard output: ...`, e.g. a full disk).
pub fn print(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(ClosedStdout.into()),
        Err(e) => Err(anyhow::Error::new(e).context("writing to standard output")),
    }
}

/// Whether `e` is (or wraps) [`ClosedStdout`].
pub fn is_closed_stdout(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<ClosedStdout>())
}

/// The exit status of a command whose reader went away: 141 (128 + SIGPIPE), what a shell
/// reports for a Unix tool that SIGPIPE ended (`cat big | head`; `set -o pipefail` sees it).
/// The process exits with it rather than dying of the signal: restoring SIGPIPE's default
/// action needs `unsafe`, which this crate forbids.
pub const CLOSED_STDOUT_STATUS: u8 = 141;
