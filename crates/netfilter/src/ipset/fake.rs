//! [`FakeIpset`]: an in-memory [`Ipset`] that applies `ipset restore` payloads with
//! ipset's checks, for tests of code that writes sets.
//!
//! Semantics mirror ipset v7.17 on Linux 6.x as measured (see `tests/ipset_kernel.rs`,
//! which runs the same payloads through the real binary in a network namespace):
//!
//! * Lines are read in order; blank lines and lines starting with `#` are skipped.
//!   `-exist` (or `-!`) may appear anywhere on a line.
//! * Like ipset, consecutive `add`/`del` lines of the same command and set are collected
//!   and sent to the kernel together; the collection is sent when a line of another kind
//!   (or another set) has been parsed successfully, at `COMMIT`, and at the end. Every other
//!   command is sent at once, after the collection before it.
//! * **Not a transaction.** A kernel refusal (an existing entry added or a missing one
//!   deleted without `-exist`, a zero prefix, a port outside a bitmap's range, a full set,
//!   an entry comment on a set without the `comment` extension,
//!   `create` of an existing set that `-exist` does not excuse, `flush`/`destroy`/`swap` of
//!   a missing set, `destroy` of a set in use, `swap` of different types or families)
//!   leaves every line before it applied and nothing after it. A line ipset itself cannot
//!   parse (an unknown command or option, an entry of the wrong syntax or family, an
//!   `add`/`del` to a missing set)
//!   also drops the collected `add`/`del` lines before it that were not sent yet. (Real
//!   ipset sends a collection early when its buffer fills up, after some hundreds of
//!   lines; the fake does not model the buffer size, so after a long run of `add`s it may
//!   report fewer lines applied than the kernel has.)
//! * `create NAME TYPE ... -exist` on an existing set succeeds when
//!   [`crate::SetSpec::exist_compatible`] holds, and changes nothing; hashsizes are rounded
//!   up to a power of two, at least 64. Set names are at most 31 characters.
//! * `destroy`/`flush` without a name apply to every set; `swap A B` exchanges contents
//!   and specs; `rename A B` needs `B` to be free.
//!
//! Failures return [`Error::Command`] with command `ipset restore`, status 1 (2 for an
//! unknown command or option) and stderr `ipset v7.17: Error in line N: REASON`, naming
//! the failing line (real ipset omits the line for some syntax errors; the fake always
//! names it).
//!
//! Fault injection: [`FakeIpset::fail_next_restore`] (nothing applied),
//! [`FakeIpset::fail_next_restore_at_line`] (a kernel refusal at line N, earlier lines
//! applied), [`FakeIpset::fail_next_save`], [`FakeIpset::set_in_use`] (a set referenced by
//! an iptables rule cannot be destroyed).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::runner::{Ipset, IpsetVersion};
use super::types::{
    EntryError, MAX_SET_NAME, SetKind, SetSpec, SetState, canonical, parse_create, render_save,
    split_words,
};
use crate::error::Error;

const RESTORE_COMMAND: &str = "ipset restore";

/// The checking fake; see the module documentation for the exact semantics.
pub struct FakeIpset {
    version: IpsetVersion,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    sets: BTreeMap<String, SetState>,
    in_use: BTreeSet<String>,
    restores: usize,
    saves: usize,
    last_payload: Option<Vec<u8>>,
    fail_next: Option<String>,
    fail_at_line: Option<(usize, String)>,
    fail_next_save: Option<String>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Adt {
    Add,
    Del,
}

struct Item {
    line: usize,
    entry: Result<String, String>,
    exist: bool,
}

struct Pending {
    adt: Adt,
    set: String,
    items: Vec<Item>,
}

/// A failure: the line, the status, the reason.
struct Failure(usize, i32, String);

impl State {
    fn set(&self, name: &str) -> Result<&SetState, String> {
        self.sets
            .get(name)
            .ok_or_else(|| "The set with the given name does not exist".to_string())
    }

    /// Sends a collection of add/del lines: applies them in order, stopping at the first
    /// refusal.
    fn commit(
        &mut self,
        pending: Option<Pending>,
        forced: &Option<(usize, String)>,
    ) -> Result<(), Failure> {
        let Some(p) = pending else { return Ok(()) };
        for item in p.items {
            check_forced(forced, item.line)?;
            let fail = |m: String| Failure(item.line, 1, m);
            let entry = item.entry.map_err(fail)?;
            // The set cannot vanish between parsing and sending: other commands send first.
            let set = self
                .sets
                .get_mut(&p.set)
                .ok_or_else(|| fail("The set with the given name does not exist".into()))?;
            set.spec.check_range(&entry).map_err(fail)?;
            match p.adt {
                Adt::Add => {
                    if set.entries.contains(&entry) {
                        if !item.exist {
                            return Err(fail(
                                "Element cannot be added to the set: it's already added".into(),
                            ));
                        }
                    } else if set.spec.kind != SetKind::BitmapPort
                        && set.entries.len() >= set.spec.maxelem as usize
                    {
                        return Err(fail("Hash is full, cannot add more elements".into()));
                    } else {
                        set.entries.insert(entry);
                    }
                }
                Adt::Del => {
                    if !set.entries.remove(&entry) && !item.exist {
                        return Err(fail(
                            "Element cannot be deleted from the set: it's not added".into(),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    fn create(&mut self, mut spec: SetSpec, exist: bool) -> Result<(), String> {
        if let Some(have) = self.sets.get(&spec.name) {
            if exist && spec.exist_compatible(&have.spec) {
                return Ok(());
            }
            return Err("Set cannot be created: set with the same name already exists".into());
        }
        if spec.kind.has_family() {
            spec.hashsize = spec
                .hashsize
                .max(64)
                .checked_next_power_of_two()
                .unwrap_or(1 << 31);
            spec.range = None;
        } else {
            spec.family = Default::default();
            spec.hashsize = super::types::DEFAULT_HASHSIZE;
            spec.maxelem = super::types::DEFAULT_MAXELEM;
        }
        self.sets.insert(spec.name.clone(), SetState::new(spec));
        Ok(())
    }

    fn destroy(&mut self, name: Option<&str>) -> Result<(), String> {
        let in_use = "Set cannot be destroyed: it is in use by a kernel component";
        match name {
            None => {
                if self.sets.keys().any(|n| self.in_use.contains(n)) {
                    return Err(in_use.into());
                }
                self.sets.clear();
            }
            Some(name) => {
                self.set(name)?;
                if self.in_use.contains(name) {
                    return Err(in_use.into());
                }
                self.sets.remove(name);
            }
        }
        Ok(())
    }

    fn flush(&mut self, name: Option<&str>) -> Result<(), String> {
        match name {
            None => self.sets.values_mut().for_each(|s| s.entries.clear()),
            Some(name) => {
                self.set(name)?;
                if let Some(s) = self.sets.get_mut(name) {
                    s.entries.clear();
                }
            }
        }
        Ok(())
    }

    fn swap(&mut self, a: &str, b: &str) -> Result<(), String> {
        let sa = self
            .sets
            .get(a)
            .ok_or("Sets cannot be swapped: the first set does not exist")?;
        let sb = self
            .sets
            .get(b)
            .ok_or("Sets cannot be swapped: the second set does not exist")?;
        if !sa.spec.swappable(&sb.spec) {
            return Err("The sets cannot be swapped: their type does not match".into());
        }
        let (mut sa, mut sb) = (sa.clone(), sb.clone());
        std::mem::swap(&mut sa, &mut sb);
        sa.spec.name = a.to_string();
        sb.spec.name = b.to_string();
        self.sets.insert(a.to_string(), sa);
        self.sets.insert(b.to_string(), sb);
        Ok(())
    }

    fn rename(&mut self, from: &str, to: &str) -> Result<(), String> {
        check_name(to)?;
        self.set(from)?;
        if self.sets.contains_key(to) {
            return Err("Set cannot be renamed: a set with the new name already exists".into());
        }
        if let Some(mut s) = self.sets.remove(from) {
            s.spec.name = to.to_string();
            self.sets.insert(to.to_string(), s);
        }
        Ok(())
    }
}

fn check_forced(forced: &Option<(usize, String)>, line: usize) -> Result<(), Failure> {
    match forced {
        Some((at, msg)) if *at == line => Err(Failure(line, 1, msg.clone())),
        _ => Ok(()),
    }
}

fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_SET_NAME {
        return Err(format!(
            "Syntax error: setname '{name}' is longer than {MAX_SET_NAME} characters"
        ));
    }
    Ok(())
}

/// One parsed line that is not an add/del.
enum Command {
    Create(SetSpec, bool),
    Destroy(Option<String>),
    Flush(Option<String>),
    Swap(String, String),
    Rename(String, String),
    Commit,
}

/// What a line parses to.
enum Parsed {
    Skip,
    Adt(Adt, String, Item),
    Other(Command),
}

fn usage(msg: impl Into<String>) -> (i32, String) {
    (2, msg.into())
}

fn parse_line(st: &State, n: usize, raw: &str) -> Result<Parsed, (i32, String)> {
    let trimmed = raw.trim_start();
    if trimmed.is_empty() || trimmed.starts_with('#') {
        return Ok(Parsed::Skip);
    }
    let mut words = split_words(raw).map_err(|m| (1, format!("Syntax error: {m}")))?;
    let before = words.len();
    words.retain(|w| w != "-exist" && w != "-!");
    let exist = words.len() != before;
    let cmd = words[0].clone();
    let arg = |i: usize| words.get(i).cloned();
    let extra = |from: usize| match words.get(from) {
        Some(w) => Err(usage(format!("Unknown argument: `{w}'"))),
        None => Ok(()),
    };
    Ok(match cmd.as_str() {
        "add" | "del" => {
            let adt = if cmd == "add" { Adt::Add } else { Adt::Del };
            let (Some(name), Some(text)) = (arg(1), arg(2)) else {
                return Err(usage(format!(
                    "Missing second mandatory argument to command {cmd}"
                )));
            };
            let spec = &st.set(&name).map_err(|m| (1, m))?.spec;
            let mut entry = match canonical(spec.kind, spec.family, &text) {
                Ok(e) => Ok(e),
                Err(EntryError::Syntax(m)) => return Err((1, m)),
                Err(EntryError::Kernel(m)) => Err(m),
            };
            match words.get(3).map(String::as_str) {
                Some("comment") if adt == Adt::Add => {
                    if !spec.comment {
                        // Measured: refused like a kernel error (the lines collected
                        // before it are sent).
                        entry = Err(
                            "Comment cannot be used: set was created without comment support"
                                .into(),
                        );
                    }
                    if words.len() < 5 {
                        return Err(usage("Missing mandatory argument of option `comment'"));
                    }
                    extra(5)?;
                }
                _ => extra(3)?,
            }
            let _ = n;
            Parsed::Adt(
                adt,
                name,
                Item {
                    line: n,
                    entry,
                    exist,
                },
            )
        }
        "create" | "-N" | "n" => {
            let (Some(name), Some(kind)) = (arg(1), arg(2)) else {
                return Err(usage("Missing second mandatory argument to command create"));
            };
            check_name(&name).map_err(|m| (1, m))?;
            let kind = SetKind::from_name(&kind)
                .ok_or_else(|| (1, format!("Syntax error: typename '{kind}' is unknown")))?;
            let spec = parse_create(&name, kind, &words[3..]).map_err(|m| {
                if m.contains("needs a range") {
                    usage("Mandatory option `range' is missing")
                } else {
                    (1, format!("Syntax error: {m}"))
                }
            })?;
            Parsed::Other(Command::Create(spec, exist))
        }
        "destroy" | "x" | "flush" | "F" => {
            extra(2)?;
            let name = arg(1);
            Parsed::Other(if matches!(cmd.as_str(), "destroy" | "x") {
                Command::Destroy(name)
            } else {
                Command::Flush(name)
            })
        }
        "swap" | "W" | "rename" | "e" => {
            let (Some(a), Some(b)) = (arg(1), arg(2)) else {
                return Err(usage(format!(
                    "Missing second mandatory argument to command {cmd}"
                )));
            };
            extra(3)?;
            Parsed::Other(if matches!(cmd.as_str(), "swap" | "W") {
                Command::Swap(a, b)
            } else {
                Command::Rename(a, b)
            })
        }
        "COMMIT" => Parsed::Other(Command::Commit),
        other => {
            return Err(usage(format!(
                "No command specified: unknown argument {other}"
            )));
        }
    })
}

impl Default for FakeIpset {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeIpset {
    /// An empty fake reporting `ipset v7.17, protocol version: 7`.
    pub fn new() -> Self {
        FakeIpset {
            version: IpsetVersion {
                major: 7,
                minor: 17,
                protocol: 7,
            },
            state: Mutex::new(State::default()),
        }
    }

    /// Makes `version()` report `version`.
    pub fn with_version(mut self, version: IpsetVersion) -> Self {
        self.version = version;
        self
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every set, sorted by name.
    pub fn sets(&self) -> Vec<SetState> {
        self.lock().sets.values().cloned().collect()
    }

    /// The set named `name`.
    pub fn set(&self, name: &str) -> Option<SetState> {
        self.lock().sets.get(name).cloned()
    }

    /// The state printed like `ipset save` ([`super::render_save`]).
    pub fn save_text(&self) -> String {
        render_save(&self.sets())
    }

    /// Marks `name` as referenced by a kernel component (an iptables `-m set` rule) or not:
    /// while it is, `destroy` of it fails.
    pub fn set_in_use(&self, name: &str, in_use: bool) {
        let mut st = self.lock();
        if in_use {
            st.in_use.insert(name.to_string());
        } else {
            st.in_use.remove(name);
        }
    }

    /// Number of `restore` calls so far (including failed ones).
    pub fn restore_count(&self) -> usize {
        self.lock().restores
    }

    /// Number of `save` calls so far.
    pub fn save_count(&self) -> usize {
        self.lock().saves
    }

    /// The payload of the last `restore` call.
    pub fn last_payload(&self) -> Option<Vec<u8>> {
        self.lock().last_payload.clone()
    }

    /// Makes the next `restore` fail without applying anything, with status 1 and
    /// `stderr`.
    pub fn fail_next_restore(&self, stderr: impl Into<String>) {
        self.lock().fail_next = Some(stderr.into());
    }

    /// Makes the next `restore` fail at 1-based `line` as if the kernel refused it with
    /// `reason`: the lines before it that the kernel received stay applied (see the
    /// module documentation).
    pub fn fail_next_restore_at_line(&self, line: usize, reason: impl Into<String>) {
        self.lock().fail_at_line = Some((line, reason.into()));
    }

    /// Makes the next `save` fail with status 1 and `stderr`.
    pub fn fail_next_save(&self, stderr: impl Into<String>) {
        self.lock().fail_next_save = Some(stderr.into());
    }

    fn error(&self, status: i32, stderr: String) -> Error {
        Error::Command {
            command: RESTORE_COMMAND.to_string(),
            status,
            stderr,
        }
    }

    fn apply(st: &mut State, text: &str, forced: &Option<(usize, String)>) -> Result<(), Failure> {
        let mut pending: Option<Pending> = None;
        for (i, raw) in text.lines().enumerate() {
            let n = i + 1;
            let parsed = parse_line(st, n, raw).map_err(|(status, m)| Failure(n, status, m))?;
            match parsed {
                Parsed::Skip => {}
                Parsed::Adt(adt, set, item) => match pending.as_mut() {
                    Some(p) if p.adt == adt && p.set == set => p.items.push(item),
                    _ => {
                        st.commit(pending.take(), forced)?;
                        pending = Some(Pending {
                            adt,
                            set,
                            items: vec![item],
                        });
                    }
                },
                Parsed::Other(cmd) => {
                    st.commit(pending.take(), forced)?;
                    check_forced(forced, n)?;
                    let fail = |m: String| Failure(n, 1, m);
                    match cmd {
                        Command::Create(spec, exist) => st.create(spec, exist).map_err(fail)?,
                        Command::Destroy(name) => st.destroy(name.as_deref()).map_err(fail)?,
                        Command::Flush(name) => st.flush(name.as_deref()).map_err(fail)?,
                        Command::Swap(a, b) => st.swap(&a, &b).map_err(fail)?,
                        Command::Rename(a, b) => st.rename(&a, &b).map_err(fail)?,
                        Command::Commit => {}
                    }
                }
            }
        }
        st.commit(pending, forced)
    }
}

impl Ipset for FakeIpset {
    fn version(&self) -> Result<IpsetVersion, Error> {
        Ok(self.version)
    }

    fn save(&self) -> Result<Vec<SetState>, Error> {
        let mut st = self.lock();
        st.saves += 1;
        if let Some(stderr) = st.fail_next_save.take() {
            return Err(Error::Command {
                command: "ipset save".to_string(),
                status: 1,
                stderr,
            });
        }
        Ok(st.sets.values().cloned().collect())
    }

    /// Applies `payload` like `ipset restore` (see the module documentation).
    fn restore(&self, payload: &[u8]) -> Result<(), Error> {
        let mut st = self.lock();
        st.restores += 1;
        st.last_payload = Some(payload.to_vec());
        if let Some(msg) = st.fail_next.take() {
            return Err(self.error(1, msg));
        }
        let forced = st.fail_at_line.take();
        let text = String::from_utf8_lossy(payload);
        Self::apply(&mut st, &text, &forced).map_err(|Failure(line, status, m)| {
            self.error(
                status,
                format!(
                    "ipset v{}.{}: Error in line {line}: {m}",
                    self.version.major, self.version.minor
                ),
            )
        })
    }
}
