//! The [`Iptables`] runner trait (the seam the proxier uses), its real implementation
//! [`ExecIptables`], and the [`Exec`] seam under it ([`SystemExec`] runs processes,
//! [`ScriptedExec`] records argv + stdin and answers from a closure, for tests).

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};

use super::ir::{IpVersion, Table};
use crate::error::{Error, command_line};

/// How long `iptables-restore` waits for the xtables lock (`--wait=5`).
pub const RESTORE_WAIT_SECONDS: u32 = 5;

/// Which netfilter backend a binary drives, as reported by `iptables --version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NetfilterBackend {
    /// `(nf_tables)`: iptables-nft.
    NfTables,
    /// `(legacy)`, or no backend shown (versions before 1.8).
    Legacy,
}

impl NetfilterBackend {
    /// `"nf_tables"` or `"legacy"`, as `iptables --version` prints it.
    pub fn name(self) -> &'static str {
        match self {
            NetfilterBackend::NfTables => "nf_tables",
            NetfilterBackend::Legacy => "legacy",
        }
    }
}

/// A parsed `iptables --version`: `iptables v1.8.9 (nf_tables)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IptablesVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Patch version.
    pub patch: u32,
    /// Backend.
    pub backend: NetfilterBackend,
}

impl IptablesVersion {
    /// Parses the output of `iptables --version` / `ip6tables --version`
    /// (`iptables v1.8.9 (nf_tables)`, `ip6tables v1.8.7 (legacy)`, `iptables v1.6.1`).
    pub fn parse(output: &str) -> Result<IptablesVersion, String> {
        let line = output.lines().next().unwrap_or("").trim();
        let word = line
            .split_whitespace()
            .find(|w| w.starts_with('v') && w[1..].starts_with(|c: char| c.is_ascii_digit()))
            .ok_or_else(|| "no `vX.Y.Z' in output".to_string())?;
        let mut nums = word[1..].split('.').map(|n| n.parse::<u32>());
        let mut next = |what: &str| match nums.next() {
            Some(Ok(n)) => Ok(n),
            None if what == "patch" => Ok(0),
            _ => Err(format!("bad {what} version in `{word}'")),
        };
        let (major, minor, patch) = (next("major")?, next("minor")?, next("patch")?);
        let backend = if line.contains("(nf_tables)") {
            NetfilterBackend::NfTables
        } else {
            NetfilterBackend::Legacy
        };
        Ok(IptablesVersion {
            major,
            minor,
            patch,
            backend,
        })
    }

    fn at_least(&self, major: u32, minor: u32, patch: u32) -> bool {
        (self.major, self.minor, self.patch) >= (major, minor, patch)
    }

    /// Whether `MASQUERADE --random-fully` is supported (iptables >= 1.6.2).
    pub fn supports_random_fully(&self) -> bool {
        self.at_least(1, 6, 2)
    }

    /// Whether `iptables-restore` accepts `--wait` (iptables >= 1.6.2).
    pub fn supports_restore_wait(&self) -> bool {
        self.at_least(1, 6, 2)
    }
}

/// The runner the proxier drives. Implementations: [`ExecIptables`] (the real
/// binaries) and [`crate::FakeIptables`] (an in-memory checking fake).
pub trait Iptables: Send + Sync {
    /// The family this runner manages: V4 → `iptables-*`, V6 → `ip6tables-*`.
    fn ip_version(&self) -> IpVersion;
    /// Runs `iptables-restore --noflush --counters` (plus `--wait=5` where supported)
    /// with `payload` on stdin. Each `*table ... COMMIT` block is applied atomically;
    /// on failure the error carries the command line, exit status and stderr.
    fn restore(&self, payload: &[u8]) -> Result<(), Error>;
    /// [`restore`](Self::restore) with the payload written by `payload` as it is produced,
    /// so that it need not be held in memory whole: the real runner hands it the tool's
    /// stdin (a pipe), the default collects it into one buffer and calls `restore`.
    ///
    /// `payload` should stop at the first write error it gets (a broken pipe means the tool
    /// exited early; its exit status and stderr are then the error reported).
    fn restore_with(&self, payload: &mut PayloadWriter<'_>) -> Result<(), Error> {
        let mut buf = Vec::new();
        payload(&mut buf).map_err(|source| Error::Io {
            command: "writing the restore payload".to_string(),
            source,
        })?;
        self.restore(&buf)
    }
    /// Runs `iptables-save [-t TABLE]` and returns its output.
    fn save(&self, table: Option<Table>) -> Result<String, Error>;
    /// [`save`](Self::save) with the output handed to `output` as the tool prints it, so
    /// that it need not be held in memory whole (30 MB for the nat table of 10,000 Services):
    /// the real runner hands it the tool's stdout (a pipe, buffered), the default calls
    /// `save` and hands it that text.
    ///
    /// An error `output` returns stops the reading; it is reported as [`Error::Io`] unless
    /// the tool itself failed (then its exit status and stderr are the error).
    fn save_with(&self, table: Option<Table>, output: &mut OutputReader<'_>) -> Result<(), Error> {
        let text = self.save(table)?;
        output(&mut text.as_bytes()).map_err(|source| Error::Io {
            command: "reading the iptables-save output".to_string(),
            source,
        })
    }
    /// Runs `iptables --version` and parses it.
    fn version(&self) -> Result<IptablesVersion, Error>;
    /// Whether `chain` exists in `table`: `iptables -w 5 -t TABLE -S CHAIN`, which lists that
    /// one chain and never the whole table, so it stays cheap on nodes with 100,000 rules
    /// (upstream's canary check runs the same command). Exit status 1 means the chain (or the
    /// table) does not exist.
    ///
    /// # Errors
    /// [`Error::Command`] for any other failure (e.g. status 4 when the xtables lock stayed
    /// held for 5 s), [`Error::BinaryNotFound`] when the binary is missing.
    fn chain_exists(&self, table: Table, chain: &str) -> Result<bool, Error>;
}

/// A boxed runner is a runner (the binary picks the real one or a dry-run printer at run
/// time).
impl<T: Iptables + ?Sized> Iptables for Box<T> {
    fn ip_version(&self) -> IpVersion {
        (**self).ip_version()
    }
    fn restore(&self, payload: &[u8]) -> Result<(), Error> {
        (**self).restore(payload)
    }
    fn restore_with(&self, payload: &mut PayloadWriter<'_>) -> Result<(), Error> {
        (**self).restore_with(payload)
    }
    fn save(&self, table: Option<Table>) -> Result<String, Error> {
        (**self).save(table)
    }
    fn save_with(&self, table: Option<Table>, output: &mut OutputReader<'_>) -> Result<(), Error> {
        (**self).save_with(table, output)
    }
    fn version(&self) -> Result<IptablesVersion, Error> {
        (**self).version()
    }
    fn chain_exists(&self, table: Table, chain: &str) -> Result<bool, Error> {
        (**self).chain_exists(table, chain)
    }
}

/// Writes a command's stdin in pieces (see [`Iptables::restore_with`] and
/// [`Exec::run_with`]); an error stops the writing.
pub type PayloadWriter<'a> = dyn FnMut(&mut dyn std::io::Write) -> std::io::Result<()> + 'a;

/// Reads a command's stdout as it is printed (see [`Iptables::save_with`] and
/// [`Exec::run_reading`]); an error stops the reading.
pub type OutputReader<'a> = dyn FnMut(&mut dyn std::io::BufRead) -> std::io::Result<()> + 'a;

/// The result of running a command through an [`Exec`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOutput {
    /// Exit status; 128 + N when killed by signal N.
    pub status: i32,
    /// Standard output.
    pub stdout: Vec<u8>,
    /// Standard error.
    pub stderr: Vec<u8>,
}

impl ExecOutput {
    /// A successful run printing `stdout`.
    pub fn ok(stdout: impl Into<Vec<u8>>) -> Self {
        ExecOutput {
            status: 0,
            stdout: stdout.into(),
            stderr: Vec::new(),
        }
    }

    /// A failed run with `status` and `stderr`.
    pub fn failed(status: i32, stderr: impl Into<Vec<u8>>) -> Self {
        ExecOutput {
            status,
            stdout: Vec::new(),
            stderr: stderr.into(),
        }
    }
}

/// The process-running seam: runs `argv` (program first) with `stdin` and returns the
/// exit status and outputs. Errors are only for failing to run at all
/// ([`Error::BinaryNotFound`], [`Error::Io`]); a non-zero exit is a normal
/// [`ExecOutput`].
pub trait Exec: Send + Sync {
    /// Runs one command to completion.
    fn run(&self, argv: &[String], stdin: Option<&[u8]>) -> Result<ExecOutput, Error>;

    /// [`run`](Self::run) with stdin written by `stdin` while the command runs. The default
    /// collects it into one buffer first; [`SystemExec`] writes it into the child's pipe,
    /// so a large payload is never held whole. A write error other than a broken pipe (the
    /// child exited without reading everything; its status tells why) is an
    /// [`Error::Io`].
    fn run_with(
        &self,
        argv: &[String],
        stdin: &mut PayloadWriter<'_>,
    ) -> Result<ExecOutput, Error> {
        let mut buf = Vec::new();
        stdin(&mut buf).map_err(|source| Error::Io {
            command: self.command_line(argv),
            source,
        })?;
        self.run(argv, Some(&buf))
    }

    /// [`run`](Self::run) without stdin, with stdout handed to `stdout` while the command
    /// runs instead of collected (the [`ExecOutput`] returned has an empty `stdout`). The
    /// default runs the command to completion first and hands over what it printed;
    /// [`SystemExec`] reads the child's pipe, so a large output is never held whole. An
    /// error of `stdout` is an [`Error::Io`], unless the command exited non-zero (its status
    /// and stderr tell more).
    fn run_reading(
        &self,
        argv: &[String],
        stdout: &mut OutputReader<'_>,
    ) -> Result<ExecOutput, Error> {
        let mut out = self.run(argv, None)?;
        let printed = std::mem::take(&mut out.stdout);
        if out.status == 0 {
            stdout(&mut printed.as_slice()).map_err(|source| Error::Io {
                command: self.command_line(argv),
                source,
            })?;
        }
        Ok(out)
    }

    /// The command line `run(argv, ..)` executes, for error messages (the default is
    /// `argv` joined with spaces, quoting arguments that need it).
    fn command_line(&self, argv: &[String]) -> String {
        command_line(argv)
    }
}

/// Runs real processes (looked up on `PATH`), optionally behind a prefix such as
/// `ip netns exec NAME`.
///
/// Stdin is written from the calling thread (through a 64 KiB [`std::io::BufWriter`]) while
/// two threads drain stdout and stderr, so a child that exits early (or never reads) cannot
/// make the caller hang; a broken pipe while writing is ignored in favour of the child's exit
/// status.
#[derive(Debug, Clone, Default)]
pub struct SystemExec {
    prefix: Vec<String>,
}

impl SystemExec {
    /// Runs commands directly.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs every command as `PREFIX... argv...`, e.g. `["ip", "netns", "exec", "ns1"]`.
    pub fn with_prefix(prefix: Vec<String>) -> Self {
        SystemExec { prefix }
    }
}

impl Exec for SystemExec {
    fn command_line(&self, argv: &[String]) -> String {
        let full: Vec<String> = self.prefix.iter().chain(argv).cloned().collect();
        command_line(&full)
    }

    fn run_with(
        &self,
        argv: &[String],
        stdin: &mut PayloadWriter<'_>,
    ) -> Result<ExecOutput, Error> {
        self.run_streaming(argv, Some(stdin))
    }

    fn run(&self, argv: &[String], stdin: Option<&[u8]>) -> Result<ExecOutput, Error> {
        match stdin {
            Some(data) => self.run_streaming(argv, Some(&mut |w| w.write_all(data))),
            None => self.run_streaming(argv, None),
        }
    }

    fn run_reading(
        &self,
        argv: &[String],
        stdout: &mut OutputReader<'_>,
    ) -> Result<ExecOutput, Error> {
        let (mut child, command) = self.spawn(argv, false)?;
        let (out, stderr) = (child.stdout.take(), child.stderr.take());
        let (read_result, stderr) = std::thread::scope(|s| {
            let err = s.spawn(move || read_all(stderr));
            let read_result = match out {
                Some(pipe) => {
                    let mut r = std::io::BufReader::with_capacity(64 * 1024, pipe);
                    let result = stdout(&mut r);
                    // Whatever the reader left (it stopped early) is drained, so that the
                    // child can finish printing and exit.
                    let _ = std::io::copy(&mut r, &mut std::io::sink());
                    result
                }
                None => Ok(()),
            };
            let stderr = err
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("stderr reader panicked")));
            (read_result, stderr)
        });
        let status = child.wait().map_err(|source| Error::Io {
            command: command.clone(),
            source,
        })?;
        let stderr = stderr.map_err(|source| Error::Io {
            command: command.clone(),
            source,
        })?;
        let status = exit_code(status);
        if status == 0
            && let Err(source) = read_result
        {
            return Err(Error::Io { command, source });
        }
        Ok(ExecOutput {
            status,
            stdout: Vec::new(),
            stderr,
        })
    }
}

impl SystemExec {
    fn spawn(&self, argv: &[String], stdin: bool) -> Result<(std::process::Child, String), Error> {
        let full: Vec<String> = self.prefix.iter().chain(argv).cloned().collect();
        let command = command_line(&full);
        let Some((program, args)) = full.split_first() else {
            return Err(Error::Io {
                command,
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty argv"),
            });
        };
        let child = Command::new(program)
            .args(args)
            .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| {
                if source.kind() == std::io::ErrorKind::NotFound {
                    Error::BinaryNotFound {
                        binary: program.clone(),
                        command: command.clone(),
                    }
                } else {
                    Error::Io {
                        command: command.clone(),
                        source,
                    }
                }
            })?;
        Ok((child, command))
    }
}

/// Reads a child's output pipe to its end (an absent pipe reads as empty).
fn read_all(pipe: Option<impl std::io::Read>) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    if let Some(mut p) = pipe {
        p.read_to_end(&mut out)?;
    }
    Ok(out)
}

impl SystemExec {
    /// Runs `argv` with stdin written by `stdin` (none: `/dev/null`). See [`Exec::run_with`].
    fn run_streaming(
        &self,
        argv: &[String],
        stdin: Option<&mut PayloadWriter<'_>>,
    ) -> Result<ExecOutput, Error> {
        let (mut child, command) = self.spawn(argv, stdin.is_some())?;
        let pipe = child.stdin.take();
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let (write_result, stdout, stderr) = std::thread::scope(|s| {
            let out = s.spawn(move || read_all(stdout));
            let err = s.spawn(move || read_all(stderr));
            let write_result = match (pipe, stdin) {
                (Some(pipe), Some(stdin)) => {
                    let mut w = std::io::BufWriter::with_capacity(64 * 1024, pipe);
                    // Dropping the writer closes the child's stdin.
                    stdin(&mut w).and_then(|()| w.flush())
                }
                _ => Ok(()),
            };
            let joined = |h: std::thread::ScopedJoinHandle<'_, std::io::Result<Vec<u8>>>| {
                h.join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("output reader panicked")))
            };
            (write_result, joined(out), joined(err))
        });
        let status = child.wait().map_err(|source| Error::Io {
            command: command.clone(),
            source,
        })?;
        let io = |source| Error::Io {
            command: command.clone(),
            source,
        };
        let (stdout, stderr) = (stdout.map_err(io)?, stderr.map_err(io)?);
        match write_result {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            Err(source) => return Err(Error::Io { command, source }),
        }
        Ok(ExecOutput {
            status: exit_code(status),
            stdout,
            stderr,
        })
    }
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt as _;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// An [`Exec`] that runs every command through `inner` and keeps the stdin of each
/// `*-restore` run, as text: for tests that drive a real restore (in a namespace) and check
/// what it was given.
pub struct RecordingExec<E> {
    inner: E,
    restores: Mutex<Vec<String>>,
}

impl<E: Exec> RecordingExec<E> {
    /// Records the restores run through `inner`.
    pub fn new(inner: E) -> Self {
        RecordingExec {
            inner,
            restores: Mutex::new(Vec::new()),
        }
    }

    /// How many restores ran.
    pub fn restore_count(&self) -> usize {
        self.restores
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// The stdin of the last restore, if any ran.
    pub fn last_restore(&self) -> Option<String> {
        self.restores
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .last()
            .cloned()
    }
}

impl<E: Exec> Exec for RecordingExec<E> {
    fn command_line(&self, argv: &[String]) -> String {
        self.inner.command_line(argv)
    }

    fn run(&self, argv: &[String], stdin: Option<&[u8]>) -> Result<ExecOutput, Error> {
        if argv.first().is_some_and(|a| a.ends_with("-restore"))
            && let Some(input) = stdin
        {
            self.restores
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(String::from_utf8_lossy(input).into_owned());
        }
        self.inner.run(argv, stdin)
    }

    fn run_reading(
        &self,
        argv: &[String],
        stdout: &mut OutputReader<'_>,
    ) -> Result<ExecOutput, Error> {
        self.inner.run_reading(argv, stdout)
    }
}

/// One call recorded by [`ScriptedExec`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecCall {
    /// The argv (program first).
    pub argv: Vec<String>,
    /// What was written to stdin, if anything.
    pub stdin: Option<Vec<u8>>,
}

type Handler = dyn Fn(&[String], Option<&[u8]>) -> ExecOutput + Send + Sync;

/// A scripted [`Exec`] for tests: records every call and answers with a closure, so a
/// test can assert the exact argv and stdin without running anything.
pub struct ScriptedExec {
    handler: Box<Handler>,
    calls: Mutex<Vec<ExecCall>>,
}

impl ScriptedExec {
    /// Answers every call with `handler(argv, stdin)`.
    pub fn new(
        handler: impl Fn(&[String], Option<&[u8]>) -> ExecOutput + Send + Sync + 'static,
    ) -> Self {
        ScriptedExec {
            handler: Box::new(handler),
            calls: Mutex::new(Vec::new()),
        }
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<ExecCall> {
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Exec for ScriptedExec {
    fn run(&self, argv: &[String], stdin: Option<&[u8]>) -> Result<ExecOutput, Error> {
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(ExecCall {
                argv: argv.to_vec(),
                stdin: stdin.map(<[u8]>::to_vec),
            });
        Ok((self.handler)(argv, stdin))
    }
}

/// Which binaries [`ExecIptables`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Backend {
    /// `iptables`, `iptables-restore`, `iptables-save` (whatever the host's
    /// alternatives point at).
    #[default]
    Default,
    /// `iptables-nft`, `iptables-nft-restore`, `iptables-nft-save`.
    Nft,
    /// `iptables-legacy`, `iptables-legacy-restore`, `iptables-legacy-save`.
    Legacy,
}

impl Backend {
    /// The IPv4 main binary of this backend, as it names the backend in logs:
    /// `iptables-nft`, `iptables-legacy` or `iptables`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Default => "iptables",
            Backend::Nft => "iptables-nft",
            Backend::Legacy => "iptables-legacy",
        }
    }

    /// The other of [`Backend::Nft`] and [`Backend::Legacy`]; `None` for
    /// [`Backend::Default`], which may be either.
    pub fn other(self) -> Option<Backend> {
        match self {
            Backend::Default => None,
            Backend::Nft => Some(Backend::Legacy),
            Backend::Legacy => Some(Backend::Nft),
        }
    }
}

/// One of the three iptables programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tool {
    /// `iptables` itself (for `--version`).
    Main,
    /// `iptables-restore`.
    Restore,
    /// `iptables-save`.
    Save,
}

/// The real [`Iptables`]: runs the binaries chosen by [`IpVersion`] and [`Backend`]
/// through an [`Exec`].
///
/// * `restore` runs `iptables-restore --noflush --counters --wait=5` with the payload on
///   stdin. `--noflush` because the proxier writes only its own chains and must not
///   wipe other users' rules; `--counters` so `[p:b]` values in the payload are honoured
///   rather than ignored; `--wait=5` (only when `iptables --version` says >= 1.6.2, the
///   first restore that accepts it) to wait up to 5 s for the xtables lock held by
///   another iptables invocation instead of failing at once. The `--wait=N` form is used
///   because older restores parse `-w` with an *optional* argument, where `-w 5` would
///   read `5` as the input file name. The version is asked once and cached.
/// * `save` runs `iptables-save` or `iptables-save -t TABLE`; `save_with` runs the same and
///   hands its stdout over as it is printed.
/// * `version` runs `iptables --version`.
/// * `chain_exists` runs `iptables -w 5 -t TABLE -S CHAIN` (`-w 5` only when the version
///   supports waiting, as for `restore`): status 0 → `true`, 1 → `false`.
///
/// A non-zero exit becomes [`Error::Command`] (command line, status, stderr); a missing
/// binary [`Error::BinaryNotFound`] naming it.
pub struct ExecIptables {
    ip_version: IpVersion,
    backend: Backend,
    exec: Arc<dyn Exec>,
    version: Mutex<Option<IptablesVersion>>,
}

impl ExecIptables {
    /// Runs real processes with [`SystemExec`].
    pub fn new(ip_version: IpVersion, backend: Backend) -> Self {
        Self::with_exec(ip_version, backend, Arc::new(SystemExec::new()))
    }

    /// Runs commands through `exec` (e.g. a [`ScriptedExec`] or a [`SystemExec`] with
    /// an `ip netns exec` prefix).
    pub fn with_exec(ip_version: IpVersion, backend: Backend, exec: Arc<dyn Exec>) -> Self {
        ExecIptables {
            ip_version,
            backend,
            exec,
            version: Mutex::new(None),
        }
    }

    /// The binary name for `tool`, e.g. `ip6tables-legacy-restore`.
    pub fn binary(&self, tool: Tool) -> String {
        let family = match self.ip_version {
            IpVersion::V4 => "iptables",
            IpVersion::V6 => "ip6tables",
        };
        let backend = match self.backend {
            Backend::Default => "",
            Backend::Nft => "-nft",
            Backend::Legacy => "-legacy",
        };
        let tool = match tool {
            Tool::Main => "",
            Tool::Restore => "-restore",
            Tool::Save => "-save",
        };
        format!("{family}{backend}{tool}")
    }

    /// The argv `restore` runs, given whether `--wait` is supported.
    pub fn restore_argv(&self, wait: bool) -> Vec<String> {
        let mut argv = vec![
            self.binary(Tool::Restore),
            "--noflush".to_string(),
            "--counters".to_string(),
        ];
        if wait {
            argv.push(format!("--wait={RESTORE_WAIT_SECONDS}"));
        }
        argv
    }

    /// The argv `chain_exists(table, chain)` runs, given whether `-w` is supported.
    pub fn chain_exists_argv(&self, table: Table, chain: &str, wait: bool) -> Vec<String> {
        let mut argv = vec![self.binary(Tool::Main)];
        if wait {
            argv.push("-w".to_string());
            argv.push(RESTORE_WAIT_SECONDS.to_string());
        }
        argv.extend([
            "-t".to_string(),
            table.name().to_string(),
            "-S".to_string(),
            chain.to_string(),
        ]);
        argv
    }

    fn run(&self, argv: &[String], stdin: Option<&[u8]>) -> Result<Vec<u8>, Error> {
        let out = self.exec.run(argv, stdin)?;
        self.check(argv, out)
    }

    /// The command's stdout, or [`Error::Command`] for a non-zero exit.
    fn check(&self, argv: &[String], out: ExecOutput) -> Result<Vec<u8>, Error> {
        if out.status != 0 {
            return Err(Error::Command {
                command: self.exec.command_line(argv),
                status: out.status,
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(out.stdout)
    }

    fn cached_version(&self) -> Result<IptablesVersion, Error> {
        if let Some(v) = *self.version.lock().unwrap_or_else(PoisonError::into_inner) {
            return Ok(v);
        }
        self.version()
    }
}

impl Iptables for ExecIptables {
    fn ip_version(&self) -> IpVersion {
        self.ip_version
    }

    fn restore(&self, payload: &[u8]) -> Result<(), Error> {
        let wait = self.cached_version()?.supports_restore_wait();
        let argv = self.restore_argv(wait);
        tracing::debug!(command = %self.exec.command_line(&argv), bytes = payload.len(), "iptables-restore");
        self.run(&argv, Some(payload)).map(drop)
    }

    fn restore_with(&self, payload: &mut PayloadWriter<'_>) -> Result<(), Error> {
        let wait = self.cached_version()?.supports_restore_wait();
        let argv = self.restore_argv(wait);
        tracing::debug!(command = %self.exec.command_line(&argv), "iptables-restore (streamed)");
        let out = self.exec.run_with(&argv, payload)?;
        self.check(&argv, out).map(drop)
    }

    fn save(&self, table: Option<Table>) -> Result<String, Error> {
        let mut argv = vec![self.binary(Tool::Save)];
        if let Some(t) = table {
            argv.push("-t".to_string());
            argv.push(t.name().to_string());
        }
        let out = self.run(&argv, None)?;
        Ok(String::from_utf8(out)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
    }

    fn save_with(&self, table: Option<Table>, output: &mut OutputReader<'_>) -> Result<(), Error> {
        let mut argv = vec![self.binary(Tool::Save)];
        if let Some(t) = table {
            argv.push("-t".to_string());
            argv.push(t.name().to_string());
        }
        let out = self.exec.run_reading(&argv, output)?;
        self.check(&argv, out).map(drop)
    }

    fn version(&self) -> Result<IptablesVersion, Error> {
        let argv = vec![self.binary(Tool::Main), "--version".to_string()];
        let out = self.run(&argv, None)?;
        let text = String::from_utf8_lossy(&out).into_owned();
        let v = IptablesVersion::parse(&text).map_err(|message| Error::Version {
            command: self.exec.command_line(&argv),
            output: text.trim().to_string(),
            message,
        })?;
        *self.version.lock().unwrap_or_else(PoisonError::into_inner) = Some(v);
        Ok(v)
    }

    fn chain_exists(&self, table: Table, chain: &str) -> Result<bool, Error> {
        let wait = self.cached_version()?.supports_restore_wait();
        let argv = self.chain_exists_argv(table, chain, wait);
        let out = self.exec.run(&argv, None)?;
        match out.status {
            0 => Ok(true),
            1 => Ok(false),
            status => Err(Error::Command {
                command: self.exec.command_line(&argv),
                status,
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Vec<String> {
        vec!["sh".into(), "-c".into(), script.into()]
    }

    #[test]
    fn run_with_streams_stdin_while_the_child_reads_it() {
        // 8 MiB in 1 KiB writes, far more than a pipe holds: the child must be reading
        // while we write, and its stdout (the byte count) must be drained alongside.
        let mut writes = 0usize;
        let out = SystemExec::new()
            .run_with(&sh("wc -c; echo done >&2"), &mut |w| {
                let piece = [b'x'; 1024];
                for _ in 0..8192 {
                    w.write_all(&piece)?;
                    writes += 1;
                }
                Ok(())
            })
            .unwrap();
        assert_eq!(out.status, 0);
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "8388608");
        assert_eq!(String::from_utf8_lossy(&out.stderr).trim(), "done");
        assert_eq!(writes, 8192);
    }

    #[test]
    fn run_with_reports_the_status_of_a_child_that_stops_reading() {
        // The child exits at once with status 3: our writes get a broken pipe, which
        // stops the writer and is not an error of its own; the status is what counts.
        let mut stopped = None;
        let out = SystemExec::new()
            .run_with(&sh("echo bad input >&2; exit 3"), &mut |w| {
                let piece = [b'x'; 65536];
                for i in 0..1024 {
                    if let Err(e) = w.write_all(&piece) {
                        stopped = Some((i, e.kind()));
                        return Err(e);
                    }
                }
                Ok(())
            })
            .unwrap();
        assert_eq!(out.status, 3);
        assert_eq!(String::from_utf8_lossy(&out.stderr).trim(), "bad input");
        let (at, kind) = stopped.expect("the writer saw the broken pipe");
        assert!(at < 1024);
        assert_eq!(kind, std::io::ErrorKind::BrokenPipe);
    }

    #[test]
    fn run_with_passes_on_a_writer_error() {
        let err = SystemExec::new()
            .run_with(&sh("cat >/dev/null"), &mut |_| {
                Err(std::io::Error::other("render failed"))
            })
            .unwrap_err();
        assert!(err.to_string().contains("render failed"), "{err}");
    }

    #[test]
    fn run_reading_hands_over_stdout_while_the_child_prints_it() {
        // 200,000 lines (about 7 MB), far more than a pipe holds: read line by line from
        // the child's pipe, never collected; stderr drained alongside.
        let mut lines = 0usize;
        let mut longest = 0usize;
        let out = SystemExec::new()
            .run_reading(
                &sh("seq -f 'line %g of the output, padded to be longer' 200000; echo done >&2"),
                &mut |r| {
                    let mut line = String::new();
                    while r.read_line(&mut line)? > 0 {
                        lines += 1;
                        longest = longest.max(line.len());
                        line.clear();
                    }
                    Ok(())
                },
            )
            .unwrap();
        assert_eq!(out.status, 0);
        assert!(out.stdout.is_empty());
        assert_eq!(String::from_utf8_lossy(&out.stderr).trim(), "done");
        assert_eq!(lines, 200_000);
        assert!(longest < 64, "{longest}");
    }

    #[test]
    fn run_reading_reports_a_reader_error_and_lets_the_child_finish() {
        // The reader gives up after one line; the rest is drained so the child exits.
        let err = SystemExec::new()
            .run_reading(&sh("seq 1 500000"), &mut |r| {
                let mut line = String::new();
                r.read_line(&mut line)?;
                Err(std::io::Error::other(format!("bad line {}", line.trim())))
            })
            .unwrap_err();
        assert!(err.to_string().contains("bad line 1"), "{err}");
        // A command that fails is reported by its status, whatever the reader said.
        let out = SystemExec::new()
            .run_reading(&sh("echo partial; echo broken >&2; exit 4"), &mut |_| {
                Err(std::io::Error::other("unreadable"))
            })
            .unwrap();
        assert_eq!(out.status, 4);
        assert_eq!(String::from_utf8_lossy(&out.stderr).trim(), "broken");
    }

    #[test]
    fn save_with_streams_iptables_save_through_the_exec() {
        let exec = Arc::new(ScriptedExec::new(|argv, _| {
            match argv.last().map(String::as_str) {
                Some("--version") => ExecOutput::ok("iptables v1.8.9 (nf_tables)\n"),
                Some("nat") => ExecOutput::ok("*nat\n:KUBE-SERVICES - [0:0]\nCOMMIT\n"),
                _ => ExecOutput::failed(1, "iptables-save: bad table"),
            }
        }));
        let ipt = ExecIptables::with_exec(IpVersion::V4, Backend::Nft, exec.clone());
        let mut got = Vec::new();
        ipt.save_with(Some(Table::Nat), &mut |r| {
            let mut line = String::new();
            while r.read_line(&mut line)? > 0 {
                got.push(line.trim_end().to_string());
                line.clear();
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(got, ["*nat", ":KUBE-SERVICES - [0:0]", "COMMIT"]);
        let err = ipt
            .save_with(Some(Table::Mangle), &mut |_| Ok(()))
            .unwrap_err();
        assert!(
            matches!(&err, Error::Command { status: 1, stderr, .. } if stderr.contains("bad table")),
            "{err}"
        );
        assert_eq!(exec.calls()[0].argv.join(" "), "iptables-nft-save -t nat");
    }

    #[test]
    fn the_default_run_with_collects_stdin_for_run() {
        let exec = ScriptedExec::new(|_, stdin| ExecOutput::ok(stdin.unwrap_or_default().to_vec()));
        let out = exec
            .run_with(&["x-restore".to_string()], &mut |w| {
                w.write_all(b"*nat\n")?;
                w.write_all(b"COMMIT\n")
            })
            .unwrap();
        assert_eq!(out.stdout, b"*nat\nCOMMIT\n");
    }

    #[test]
    fn parses_versions() {
        let v = IptablesVersion::parse("iptables v1.8.9 (nf_tables)\n").unwrap();
        assert_eq!((v.major, v.minor, v.patch), (1, 8, 9));
        assert_eq!(v.backend, NetfilterBackend::NfTables);
        assert!(v.supports_random_fully());
        let v = IptablesVersion::parse("ip6tables v1.8.7 (legacy)").unwrap();
        assert_eq!(v.backend, NetfilterBackend::Legacy);
        let v = IptablesVersion::parse("iptables v1.6.1").unwrap();
        assert_eq!(v.backend, NetfilterBackend::Legacy);
        assert!(!v.supports_random_fully());
        assert!(!v.supports_restore_wait());
        assert!(
            IptablesVersion::parse("iptables v1.6.2")
                .unwrap()
                .supports_random_fully()
        );
        assert!(IptablesVersion::parse("iptables 1.8").is_err());
        assert!(IptablesVersion::parse("").is_err());
        assert!(IptablesVersion::parse("iptables vx.y").is_err());
    }

    #[test]
    fn chain_exists_lists_one_chain_and_reads_the_exit_status() {
        let exec = Arc::new(ScriptedExec::new(|argv, _| {
            match (argv[0].as_str(), argv.last().map(String::as_str)) {
                (_, Some("--version")) => ExecOutput::ok("ip6tables v1.8.9 (nf_tables)\n"),
                (_, Some("KUBE-PROXY-CANARY")) => ExecOutput::ok("-N KUBE-PROXY-CANARY\n"),
                (_, Some("GONE")) => ExecOutput::failed(
                    1,
                    "ip6tables v1.8.9 (nf_tables): chain `GONE' in table `nat' is incompatible, use 'nft' tool.",
                ),
                _ => ExecOutput::failed(4, "Another app is currently holding the xtables lock."),
            }
        }));
        let ipt = ExecIptables::with_exec(IpVersion::V6, Backend::Legacy, exec.clone());
        assert!(
            ipt.chain_exists(Table::Mangle, "KUBE-PROXY-CANARY")
                .unwrap()
        );
        assert!(!ipt.chain_exists(Table::Nat, "GONE").unwrap());
        let err = ipt.chain_exists(Table::Filter, "LOCKED").unwrap_err();
        assert!(
            matches!(&err, Error::Command { status: 4, stderr, .. } if stderr.contains("xtables lock")),
            "{err}"
        );
        let argvs: Vec<String> = exec.calls().iter().map(|c| c.argv.join(" ")).collect();
        assert_eq!(
            argvs,
            [
                "ip6tables-legacy --version",
                "ip6tables-legacy -w 5 -t mangle -S KUBE-PROXY-CANARY",
                "ip6tables-legacy -w 5 -t nat -S GONE",
                "ip6tables-legacy -w 5 -t filter -S LOCKED",
            ]
        );
        // Without `-w` support (iptables < 1.6.2) the flag is left out.
        let old = ExecIptables::new(IpVersion::V4, Backend::Default);
        assert_eq!(
            old.chain_exists_argv(Table::Nat, "KUBE-PROXY-CANARY", false)
                .join(" "),
            "iptables -t nat -S KUBE-PROXY-CANARY"
        );
    }

    #[test]
    fn binary_names() {
        let b = |v, be, t| ExecIptables::new(v, be).binary(t);
        assert_eq!(
            b(IpVersion::V4, Backend::Default, Tool::Restore),
            "iptables-restore"
        );
        assert_eq!(
            b(IpVersion::V6, Backend::Legacy, Tool::Save),
            "ip6tables-legacy-save"
        );
        assert_eq!(b(IpVersion::V4, Backend::Nft, Tool::Main), "iptables-nft");
    }
}
