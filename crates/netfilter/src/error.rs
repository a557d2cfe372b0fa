//! The crate's error types: one [`Error`] enum for everything that can fail, and the
//! [`ParseError`] (line + message) that both parsers return.

use std::fmt;

/// A syntax or structure error in `iptables-save` output or `iptables-restore` input.
///
/// `line` is 1-based and counts every line of the input (comments and blank lines
/// included), like `iptables-restore`'s own "Error occurred at line: N".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ParseError {
    /// 1-based line number in the parsed text.
    pub line: usize,
    /// What is wrong with that line.
    pub message: String,
}

impl ParseError {
    /// Builds an error for `line`.
    pub fn new(line: usize, message: impl Into<String>) -> Self {
        ParseError {
            line,
            message: message.into(),
        }
    }
}

/// Everything that can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Text could not be parsed (see [`ParseError`]).
    #[error("parse error at {0}")]
    Parse(#[from] ParseError),
    /// A command ran and exited non-zero (or was killed). `command` is the full command
    /// line as it would be typed in a shell, `status` the exit status (128 + signal number
    /// when the process was killed by a signal), `stderr` its standard error, trimmed.
    #[error("`{command}` failed with exit status {status}: {stderr}")]
    Command {
        /// The command line, e.g. `iptables-restore --noflush --counters --wait=5`.
        command: String,
        /// Exit status; 128 + N when killed by signal N.
        status: i32,
        /// The command's standard error output (lossy UTF-8, trimmed).
        stderr: String,
    },
    /// The binary to run does not exist (not on `PATH` or not installed).
    #[error("`{binary}` not found: is iptables installed and on PATH? (running `{command}`)")]
    BinaryNotFound {
        /// The program name that could not be found, e.g. `ip6tables-legacy-restore`.
        binary: String,
        /// The full command line that was attempted.
        command: String,
    },
    /// Spawning or talking to a command failed for another I/O reason.
    #[error("running `{command}`: {source}")]
    Io {
        /// The full command line.
        command: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// `iptables --version` printed something this crate cannot understand.
    #[error("cannot parse the output of `{command}` ({output:?}): {message}")]
    Version {
        /// The command line that was run.
        command: String,
        /// What it printed.
        output: String,
        /// Why it could not be parsed.
        message: String,
    },
}

/// Renders an argv as a shell-like command line (arguments with spaces or quotes are
/// double-quoted) for error messages and logs.
pub(crate) fn command_line(argv: &[String]) -> String {
    struct Line<'a>(&'a [String]);
    impl fmt::Display for Line<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            for (i, arg) in self.0.iter().enumerate() {
                if i > 0 {
                    f.write_str(" ")?;
                }
                if arg.is_empty() || arg.chars().any(|c| c.is_whitespace() || c == '"') {
                    write!(f, "{arg:?}")?;
                } else {
                    f.write_str(arg)?;
                }
            }
            Ok(())
        }
    }
    Line(argv).to_string()
}
