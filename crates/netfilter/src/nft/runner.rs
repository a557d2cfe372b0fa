//! The [`Nft`] runner trait and its real implementation [`ExecNft`], which runs the `nft`
//! binary through an [`Exec`] (so tests can script it and namespace tests can prefix it with
//! `ip netns exec NAME`).

use std::sync::Arc;

use super::listing::{TableObjects, parse_objects};
use super::syntax::family_name;
use crate::error::Error;
use crate::iptables::{Exec, ExecOutput, IpVersion, PayloadWriter, SystemExec};

/// The program [`ExecNft`] runs.
pub const NFT_BINARY: &str = "nft";

/// A parsed `nft --version`: `nftables v1.0.6 (Lester Gooch #5)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NftVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Patch version (0 when not printed).
    pub patch: u32,
}

impl NftVersion {
    /// Parses the first `vX.Y[.Z]` word of `nft --version`'s output.
    ///
    /// # Errors
    /// A message when there is no such word.
    pub fn parse(output: &str) -> Result<NftVersion, String> {
        let line = output.lines().next().unwrap_or("").trim();
        let word = line
            .split_whitespace()
            .find_map(|w| {
                w.strip_prefix('v')
                    .filter(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
            })
            .ok_or_else(|| "no `vX.Y.Z' in output".to_string())?;
        let mut nums = word.split('.').map(str::parse::<u32>);
        let mut next = |what: &str| match nums.next() {
            Some(Ok(n)) => Ok(n),
            None if what == "patch" => Ok(0),
            _ => Err(format!("bad {what} version in `v{word}'")),
        };
        Ok(NftVersion {
            major: next("major")?,
            minor: next("minor")?,
            patch: next("patch")?,
        })
    }

    /// Whether this is at least `major.minor.patch`.
    pub fn at_least(&self, major: u32, minor: u32, patch: u32) -> bool {
        (self.major, self.minor, self.patch) >= (major, minor, patch)
    }
}

impl std::fmt::Display for NftVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The nftables runner a proxier drives. [`ExecNft`] is the real one; tests and dry runs may
/// wrap it or replace it.
pub trait Nft: Send + Sync {
    /// Applies `payload` (`nft -f` input) as ONE transaction: the kernel commits every
    /// command or none. Command line: `nft -f -` with the payload on stdin.
    ///
    /// # Errors
    /// [`Error::Command`] with nft's stderr (which names the failing line) when the kernel or
    /// the parser rejects the payload; nothing was changed then.
    fn apply(&self, payload: &[u8]) -> Result<(), Error>;

    /// [`apply`](Self::apply) with the payload written by `payload` as it is produced, so
    /// that it need not be held in memory whole: [`ExecNft`] hands it `nft`'s stdin (a pipe,
    /// through [`Exec::run_with`]); the default collects it into one buffer and calls
    /// `apply`. Still one transaction: `nft -f` reads its whole input before it commits.
    ///
    /// `payload` should stop at the first write error it gets (a broken pipe means nft
    /// exited early; its exit status and stderr are then the error reported).
    ///
    /// # Errors
    /// As [`apply`](Self::apply); [`Error::Io`] when `payload` fails other than by a broken
    /// pipe.
    fn apply_with(&self, payload: &mut PayloadWriter<'_>) -> Result<(), Error> {
        let mut buf = Vec::new();
        payload(&mut buf).map_err(|source| Error::Io {
            command: "writing the nft payload".to_string(),
            source,
        })?;
        self.apply(&buf)
    }

    /// The full listing of one table (`nft list table ip|ip6 TABLE`), or `None` when the table
    /// does not exist. Slow for big tables (it prints every rule and element): meant for
    /// tests, debugging and failure logs, not for every sync.
    ///
    /// # Errors
    /// [`Error::Command`] for any failure other than a missing table.
    fn list_table(&self, family: IpVersion, table: &str) -> Result<Option<String>, Error>;

    /// The listing of one chain with its rules (`nft list chain ip|ip6 TABLE CHAIN`), or
    /// `None` when the chain or its table does not exist. Cheap when the chain is small: the
    /// proxier's periodic check that nobody flushed or deleted its table lists one base chain.
    ///
    /// # Errors
    /// [`Error::Command`] for any failure other than a missing chain or table.
    fn list_chain(
        &self,
        family: IpVersion,
        table: &str,
        chain: &str,
    ) -> Result<Option<String>, Error>;

    /// The chains (with their hooks), sets (with their timeouts) and maps of one table,
    /// without rules or elements: `nft list chains ip|ip6`, `nft -t list sets ip|ip6` and
    /// `nft -t list maps ip|ip6`, parsed.
    /// Cheap even for tables with 100,000 rules (tens of milliseconds).
    ///
    /// # Errors
    /// [`Error::Command`] when nft fails; [`Error::Parse`] when its output is not understood.
    fn list_objects(&self, family: IpVersion, table: &str) -> Result<TableObjects, Error>;

    /// Deletes the table with everything in it (`nft delete table ip|ip6 TABLE`); `Ok(false)`
    /// when it did not exist (checked first with `nft list tables ip|ip6`).
    ///
    /// # Errors
    /// [`Error::Command`] when nft fails.
    fn delete_table(&self, family: IpVersion, table: &str) -> Result<bool, Error>;

    /// `nft --version`, parsed.
    ///
    /// # Errors
    /// [`Error::Command`] or [`Error::Version`].
    fn version(&self) -> Result<NftVersion, Error>;
}

/// The real [`Nft`]: runs `nft` through an [`Exec`].
///
/// A missing binary is reported as [`Error::Io`] with kind `NotFound` and a message naming
/// `nft` (the crate's [`Error::BinaryNotFound`] speaks of iptables); a non-zero exit as
/// [`Error::Command`] carrying the command line, the exit status and nft's stderr.
pub struct ExecNft {
    exec: Arc<dyn Exec>,
}

impl std::fmt::Debug for ExecNft {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecNft").finish_non_exhaustive()
    }
}

impl Default for ExecNft {
    fn default() -> Self {
        Self::new()
    }
}

impl ExecNft {
    /// Runs `nft` from `PATH` with [`SystemExec`].
    pub fn new() -> Self {
        Self::with_exec(Arc::new(SystemExec::new()))
    }

    /// Runs commands through `exec` (a [`crate::ScriptedExec`] in tests, a [`SystemExec`] with
    /// an `ip netns exec NAME` prefix in namespace tests).
    pub fn with_exec(exec: Arc<dyn Exec>) -> Self {
        ExecNft { exec }
    }

    fn argv(args: &[&str]) -> Vec<String> {
        std::iter::once(NFT_BINARY)
            .chain(args.iter().copied())
            .map(str::to_string)
            .collect()
    }

    fn run(&self, args: &[&str], stdin: Option<&[u8]>) -> Result<Vec<u8>, Error> {
        let argv = Self::argv(args);
        let out = self.exec.run(&argv, stdin);
        self.finish(&argv, out)
    }

    /// [`run`](Self::run) with stdin written by `stdin` while nft runs.
    fn run_with(&self, args: &[&str], stdin: &mut PayloadWriter<'_>) -> Result<Vec<u8>, Error> {
        let argv = Self::argv(args);
        let out = self.exec.run_with(&argv, stdin);
        self.finish(&argv, out)
    }

    /// nft's stdout, or the error of a run that failed.
    fn finish(&self, argv: &[String], out: Result<ExecOutput, Error>) -> Result<Vec<u8>, Error> {
        let out = match out {
            Ok(out) => out,
            Err(Error::BinaryNotFound { command, .. }) => {
                return Err(Error::Io {
                    command,
                    source: std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "`nft` not found: is nftables installed and on PATH?",
                    ),
                });
            }
            Err(e) => return Err(e),
        };
        if out.status != 0 {
            return Err(Error::Command {
                command: self.exec.command_line(argv),
                status: out.status,
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(out.stdout)
    }

    fn run_text(&self, args: &[&str]) -> Result<String, Error> {
        let out = self.run(args, None)?;
        Ok(String::from_utf8(out)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
    }

    /// Whether `table` exists in `family` (`nft list tables ip|ip6`).
    ///
    /// # Errors
    /// [`Error::Command`] when nft fails.
    pub fn table_exists(&self, family: IpVersion, table: &str) -> Result<bool, Error> {
        let fam = family_name(family);
        let text = self.run_text(&["list", "tables", fam])?;
        Ok(text.lines().any(|l| {
            let mut w = l.split_whitespace();
            w.next() == Some("table") && w.next() == Some(fam) && w.next() == Some(table)
        }))
    }
}

/// Whether an nft failure means "no such table/object".
fn is_not_found(e: &Error) -> bool {
    matches!(e, Error::Command { stderr, .. } if stderr.contains("No such file or directory"))
}

impl Nft for ExecNft {
    fn apply(&self, payload: &[u8]) -> Result<(), Error> {
        tracing::debug!(bytes = payload.len(), "nft -f -");
        self.run(&["-f", "-"], Some(payload)).map(drop)
    }

    fn apply_with(&self, payload: &mut PayloadWriter<'_>) -> Result<(), Error> {
        tracing::debug!("nft -f - (streamed)");
        self.run_with(&["-f", "-"], payload).map(drop)
    }

    fn list_table(&self, family: IpVersion, table: &str) -> Result<Option<String>, Error> {
        match self.run_text(&["list", "table", family_name(family), table]) {
            Ok(text) => Ok(Some(text)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn list_chain(
        &self,
        family: IpVersion,
        table: &str,
        chain: &str,
    ) -> Result<Option<String>, Error> {
        match self.run_text(&["list", "chain", family_name(family), table, chain]) {
            Ok(text) => Ok(Some(text)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn list_objects(&self, family: IpVersion, table: &str) -> Result<TableObjects, Error> {
        let fam = family_name(family);
        let chains = self.run_text(&["list", "chains", fam])?;
        let sets = self.run_text(&["-t", "list", "sets", fam])?;
        let maps = self.run_text(&["-t", "list", "maps", fam])?;
        let mut text = chains;
        for part in [sets, maps] {
            text.push('\n');
            text.push_str(&part);
        }
        Ok(parse_objects(&text, fam, table)?)
    }

    fn delete_table(&self, family: IpVersion, table: &str) -> Result<bool, Error> {
        if !self.table_exists(family, table)? {
            return Ok(false);
        }
        let payload = format!("delete table {} {table}\n", family_name(family));
        self.apply(payload.as_bytes())?;
        Ok(true)
    }

    fn version(&self) -> Result<NftVersion, Error> {
        let text = self.run_text(&["--version"])?;
        NftVersion::parse(&text).map_err(|message| Error::Version {
            command: format!("{NFT_BINARY} --version"),
            output: text.trim().to_string(),
            message,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_versions() {
        let v = NftVersion::parse("nftables v1.0.6 (Lester Gooch #5)\n").unwrap();
        assert_eq!((v.major, v.minor, v.patch), (1, 0, 6));
        assert!(v.at_least(1, 0, 1) && !v.at_least(1, 1, 0));
        assert_eq!(v.to_string(), "1.0.6");
        assert_eq!(
            NftVersion::parse("nftables v1.1").unwrap(),
            NftVersion {
                major: 1,
                minor: 1,
                patch: 0
            }
        );
        assert!(NftVersion::parse("nftables").is_err());
        assert!(NftVersion::parse("").is_err());
        assert!(NftVersion::parse("nftables vx").is_err());
    }

    use crate::iptables::{ExecOutput, ScriptedExec};

    fn argv(call: &crate::iptables::ExecCall) -> Vec<&str> {
        call.argv.iter().map(String::as_str).collect()
    }

    #[test]
    fn apply_runs_one_nft_f_with_the_payload_on_stdin() {
        let exec = Arc::new(ScriptedExec::new(|_, _| ExecOutput::ok("")));
        let nft = ExecNft::with_exec(exec.clone());
        nft.apply(b"add table ip t\n").unwrap();
        let calls = exec.calls();
        assert_eq!(calls.len(), 1);
        assert_eq!(argv(&calls[0]), ["nft", "-f", "-"]);
        assert_eq!(calls[0].stdin.as_deref(), Some(&b"add table ip t\n"[..]));
    }

    #[test]
    fn apply_with_streams_the_payload_into_one_nft_f() {
        let exec = Arc::new(ScriptedExec::new(|_, _| ExecOutput::ok("")));
        let nft = ExecNft::with_exec(exec.clone());
        nft.apply_with(&mut |w| {
            w.write_all(b"add table ip t\n")?;
            w.write_all(b"add chain ip t c\n")
        })
        .unwrap();
        let calls = exec.calls();
        assert_eq!(calls.len(), 1);
        assert_eq!(argv(&calls[0]), ["nft", "-f", "-"]);
        assert_eq!(
            calls[0].stdin.as_deref(),
            Some(&b"add table ip t\nadd chain ip t c\n"[..])
        );
    }

    /// Through a real process (a shell standing in for nft): a large payload written in
    /// pieces reaches its stdin whole, and a failure carries the status and stderr.
    #[test]
    fn apply_with_writes_into_the_tools_stdin() {
        let counting = ExecNft::with_exec(Arc::new(SystemExec::with_prefix(vec![
            "sh".into(),
            "-c".into(),
            "test \"$(wc -c)\" -eq 2000000 || { echo short >&2; exit 1; }".into(),
        ])));
        counting
            .apply_with(&mut |w| {
                for _ in 0..20_000 {
                    w.write_all(&[b'x'; 100])?;
                }
                Ok(())
            })
            .unwrap();
        let failing = ExecNft::with_exec(Arc::new(SystemExec::with_prefix(vec![
            "sh".into(),
            "-c".into(),
            "echo '/dev/stdin:1:1-3: Error: syntax error' >&2; exit 1".into(),
        ])));
        match failing.apply_with(&mut |w| w.write_all(b"bad\n")) {
            Err(Error::Command { status, stderr, .. }) => {
                assert_eq!(status, 1);
                assert!(stderr.contains("syntax error"), "{stderr}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn failures_carry_command_status_and_stderr() {
        let exec = Arc::new(ScriptedExec::new(|_, _| {
            ExecOutput::failed(
                1,
                "/dev/stdin:2:1-20: Error: Could not process rule: No such file or directory\n",
            )
        }));
        let nft = ExecNft::with_exec(exec);
        match nft.apply(b"x\n") {
            Err(Error::Command {
                command,
                status,
                stderr,
            }) => {
                assert_eq!(command, "nft -f -");
                assert_eq!(status, 1);
                assert!(stderr.starts_with("/dev/stdin:2:1-20: Error"), "{stderr}");
            }
            other => panic!("{other:?}"),
        }
        // A missing table is not an error for list_table.
        assert_eq!(nft.list_table(IpVersion::V6, "t").unwrap(), None);
    }

    #[test]
    fn listings_and_delete() {
        let exec = Arc::new(ScriptedExec::new(|argv, _| {
            let args: Vec<&str> = argv.iter().map(String::as_str).collect();
            match args.as_slice() {
                ["nft", "list", "tables", "ip"] => ExecOutput::ok("table ip filter\ntable ip t\n"),
                ["nft", "list", "tables", "ip6"] => ExecOutput::ok("table ip6 filter\n"),
                ["nft", "list", "chains", "ip"] => ExecOutput::ok(
                    "table ip t {\n\tchain c {\n\t\ttype nat hook output priority -100; policy accept;\n\t}\n}\n",
                ),
                ["nft", "-t", "list", "sets", "ip"] => {
                    ExecOutput::ok("table ip t {\n\tset s {\n\t\ttype ipv4_addr\n\t}\n}\n")
                }
                ["nft", "list", "table", "ip", "t"] => ExecOutput::ok("table ip t {\n}\n"),
                ["nft", "list", "chain", "ip", "t", "c"] => ExecOutput::ok(
                    "table ip t {\n\tchain c {\n\t\ttype nat hook output priority -100; policy accept;\n\t\tjump x\n\t}\n}\n",
                ),
                ["nft", "list", "chain", ..] => ExecOutput::failed(
                    1,
                    "Error: No such file or directory\nlist chain ip6 t c\n              ^\n",
                ),
                ["nft", "--version"] => ExecOutput::ok("nftables v1.0.6 (Lester Gooch #5)\n"),
                _ => ExecOutput::ok(""),
            }
        }));
        let nft = ExecNft::with_exec(exec.clone());
        let o = nft.list_objects(IpVersion::V4, "t").unwrap();
        assert!(o.exists && o.chains.contains_key("c") && o.sets.contains_key("s"));
        assert_eq!(
            nft.list_table(IpVersion::V4, "t").unwrap().as_deref(),
            Some("table ip t {\n}\n")
        );
        let chain = nft.list_chain(IpVersion::V4, "t", "c").unwrap().unwrap();
        assert!(chain.lines().any(|l| l.trim() == "jump x"), "{chain}");
        assert_eq!(nft.list_chain(IpVersion::V6, "t", "c").unwrap(), None);
        assert!(nft.delete_table(IpVersion::V4, "t").unwrap());
        assert!(!nft.delete_table(IpVersion::V6, "t").unwrap());
        assert_eq!(nft.version().unwrap().to_string(), "1.0.6");
        let calls = exec.calls();
        let delete = calls
            .iter()
            .find(|c| c.stdin.is_some())
            .expect("the delete is applied as a transaction");
        assert_eq!(argv(delete), ["nft", "-f", "-"]);
        assert_eq!(delete.stdin.as_deref(), Some(&b"delete table ip t\n"[..]));
        assert_eq!(
            calls.iter().filter(|c| c.stdin.is_some()).count(),
            1,
            "nothing is deleted when the table is absent"
        );
    }

    #[test]
    fn a_missing_binary_names_nft() {
        let nft = ExecNft::with_exec(Arc::new(SystemExec::with_prefix(vec![
            "/nonexistent/kp-no-such-binary".into(),
        ])));
        match nft.version() {
            Err(Error::Io { source, .. }) => {
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
                assert!(source.to_string().contains("nft"));
            }
            other => panic!("{other:?}"),
        }
    }
}
