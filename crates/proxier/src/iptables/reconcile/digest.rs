//! Per-chain digests: what a full sync compares so that it rewrites only the chains whose
//! contents in the kernel differ from the render ([`super::full`]).
//!
//! A chain's digest is the first 16 bytes of a SHA-256 over its name and its rules in order,
//! each rule in the `-A CHAIN …` form that `iptables-save` prints and that the render writes.
//! Two spellings are made equal first, because the kernel prints them back differently from
//! what we write (the namespace test `iptables_kernel_holds_exactly_the_rendered_rules` and
//! the proxier's `full_resync_kernel` test check that nothing else differs):
//!
//! - `--probability P`: the render writes 10 decimals, like upstream; `iptables-restore`
//!   stores `lround(P × 2^31)` and `iptables-save` prints that with 11 decimals. Both are
//!   digested as the stored integer ([`Probability::from_f64`]).
//! - `--nfacct-name NAME`: `xt_nfacct` prints two spaces before the name.
//!
//! Only text outside double quotes is normalised, and only where `iptables-restore` reads
//! both spellings as the same rule; so two rules digest alike only if the tool loads them
//! alike. Any other difference (an older iptables that prints a match in another form, a
//! rule someone changed, a foreign rule in one of our chains) makes the digests differ, and
//! the chain is rewritten as every chain was before: a mismatch costs only time.
//!
//! [`TableReader`] reads one table of `iptables-save` line by line (from the tool's stdout,
//! never held whole) into a [`KernelTable`]: the rules of the built-in chains (for the jump
//! rules), the names of other chains, and for each of our chains (`KUBE-…`) its digest in
//! [`OurChains`], a sorted array of 47 bytes per chain (5 MiB for the 110,000 chains of
//! 10,000 Services × 10 endpoints).

use kp_netfilter::{Probability, Table};
use sha2::{Digest as _, Sha256};

use super::super::names::ChainName;
use super::KernelTable;
use crate::ProxierError;

/// A chain's digest (see the module documentation).
pub type Digest = [u8; 16];

/// Digests one chain: [`new`](Self::new) with its name, [`rule`](Self::rule) for each rule
/// line in order, then [`finish`](Self::finish).
#[derive(Clone)]
pub struct ChainHasher(Sha256);

impl ChainHasher {
    /// Starts the digest of chain `name`.
    pub fn new(name: &str) -> Self {
        let mut h = Sha256::new();
        h.update(name.as_bytes());
        h.update(b"\n");
        ChainHasher(h)
    }

    /// Adds one rule line (`-A CHAIN …`, without its newline).
    pub fn rule(&mut self, line: &str) {
        normalised(line, &mut |piece| self.0.update(piece));
        self.0.update(b"\n");
    }

    /// The digest.
    pub fn finish(self) -> Digest {
        let full = self.0.finalize();
        let mut out = [0u8; 16];
        out.copy_from_slice(&full[..16]);
        out
    }
}

/// The digest of chain `name` holding `rules` (lines, each ending in a newline or not).
pub fn chain_digest<'a>(name: &str, rules: impl IntoIterator<Item = &'a str>) -> Digest {
    let mut h = ChainHasher::new(name);
    for r in rules {
        h.rule(r.strip_suffix('\n').unwrap_or(r));
    }
    h.finish()
}

/// Hands `line` to `out` in pieces, with the spellings of the module documentation made
/// equal: a probability becomes `#` and its fixed-point value, `--nfacct-name` is followed by
/// one space. Quoted text (`"…"`, with `\"` inside) is handed over unchanged.
fn normalised(line: &str, out: &mut dyn FnMut(&[u8])) {
    const PROBABILITY: &[u8] = b"--probability ";
    const NFACCT: &[u8] = b"--nfacct-name ";
    let b = line.as_bytes();
    let mut quoted = false;
    let mut from = 0;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' if quoted => i += 1,
            b'"' => quoted = !quoted,
            b'-' if !quoted && (i == 0 || b[i - 1] == b' ') => {
                let rest = &b[i..];
                if rest.starts_with(PROBABILITY) {
                    let start = i + PROBABILITY.len();
                    let end = b[start..]
                        .iter()
                        .position(|c| *c == b' ')
                        .map_or(b.len(), |n| start + n);
                    let value = line[start..end]
                        .parse::<f64>()
                        .ok()
                        .and_then(Probability::from_f64);
                    if let Some(p) = value {
                        out(&b[from..start]);
                        out(b"#");
                        out(&p.0.to_le_bytes());
                        from = end;
                    }
                    i = end;
                    continue;
                }
                if rest.starts_with(NFACCT) {
                    let start = i + NFACCT.len();
                    let mut end = start;
                    while b.get(end) == Some(&b' ') {
                        end += 1;
                    }
                    out(&b[from..start]);
                    from = end;
                    i = end;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    out(&b[from..]);
}

/// What is known of one of our chains in the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    name: ChainName,
    /// `None`: not known (its rules were not printed together), so it never matches.
    digest: Option<Digest>,
    /// The render writes exactly this (set by [`OurChains::mark_same`]).
    same: bool,
}

/// Our chains (`KUBE-…`) in one table of the kernel, each with its [`Digest`], sorted by
/// name; filled by [`TableReader`]. A full sync marks those whose rendered digest is the same
/// ([`mark_same`](Self::mark_same)) and leaves them out of its payload.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OurChains {
    entries: Vec<Entry>,
}

impl OurChains {
    fn find(&self, name: &str) -> Option<usize> {
        self.entries
            .binary_search_by(|e| e.name.as_str().cmp(name))
            .ok()
    }

    /// Chains held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none are held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether the kernel has chain `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.find(name).is_some()
    }

    /// The names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| e.name.as_str())
    }

    /// The kernel's digest of chain `name`, when it has that chain and its digest is known.
    pub fn digest(&self, name: &str) -> Option<Digest> {
        self.find(name).and_then(|i| self.entries[i].digest)
    }

    /// Records that the render writes chain `name` with `digest`: when the kernel holds the
    /// same, the chain is marked unchanged and `true` is returned.
    pub fn mark_same(&mut self, name: &str, digest: &Digest) -> bool {
        match self.find(name) {
            Some(i) if self.entries[i].digest.as_ref() == Some(digest) => {
                self.entries[i].same = true;
                true
            }
            _ => false,
        }
    }

    /// Whether chain `name` was marked unchanged: a full sync leaves it out.
    pub fn is_same(&self, name: &str) -> bool {
        self.find(name).is_some_and(|i| self.entries[i].same)
    }

    /// Chains marked unchanged.
    pub fn same_count(&self) -> usize {
        self.entries.iter().filter(|e| e.same).count()
    }
}

/// How far [`TableReader`] is with one of our chains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Progress {
    /// Declared; no rule seen.
    Declared,
    /// Its rules were digested.
    Done,
    /// Its rules came in two runs: its digest stays unknown.
    Split,
}

/// Reads one table of `iptables-save` output line by line into a [`KernelTable`] with the
/// digests of our chains (see the module documentation). Other chains' rules are skipped
/// without parsing; the built-in chains' go through the typed parser, as in
/// [`crate::iptables::kernel_table_for_sync`].
pub struct TableReader {
    table: Table,
    /// The table's header, the built-in chains and their rules, and `COMMIT`.
    reduced: String,
    /// Names of chains neither built in nor ours.
    others: std::collections::BTreeSet<String>,
    entries: Vec<Entry>,
    progress: Vec<Progress>,
    sorted: bool,
    /// The chain whose rules are being read: its index and hasher (`None`: not digested).
    current: Option<(usize, Option<ChainHasher>)>,
}

impl TableReader {
    /// A reader of `table`'s dump.
    pub fn new(table: Table) -> Self {
        TableReader {
            table,
            reduced: String::with_capacity(4096),
            others: Default::default(),
            entries: Vec::new(),
            progress: Vec::new(),
            sorted: true,
            current: None,
        }
    }

    fn is_ours(chain: &str) -> bool {
        chain.starts_with("KUBE-") && chain.len() <= 28
    }

    fn finish_current(&mut self) {
        if let Some((i, hasher)) = self.current.take() {
            match hasher {
                Some(h) => {
                    self.entries[i].digest = Some(h.finish());
                    self.progress[i] = Progress::Done;
                }
                None => {
                    self.entries[i].digest = None;
                    self.progress[i] = Progress::Split;
                }
            }
        }
    }

    fn sort(&mut self) {
        if self.sorted {
            return;
        }
        let mut both: Vec<(Entry, Progress)> = self
            .entries
            .drain(..)
            .zip(self.progress.drain(..))
            .collect();
        both.sort_by(|a, b| a.0.name.as_str().cmp(b.0.name.as_str()));
        // A name declared twice: keep one, digest unknown.
        both.dedup_by(|later, kept| {
            let same = later.0.name == kept.0.name;
            if same {
                kept.1 = Progress::Split;
            }
            same
        });
        (self.entries, self.progress) = both.into_iter().unzip();
        self.sorted = true;
    }

    /// Reads one line of the dump (without its newline).
    pub fn line(&mut self, line: &str) {
        if let Some(decl) = line.strip_prefix(':') {
            let name = decl.split(' ').next().unwrap_or_default();
            if Self::is_ours(name) {
                self.finish_current();
                self.entries.push(Entry {
                    name: ChainName::from_text(name),
                    digest: None,
                    same: false,
                });
                self.progress.push(Progress::Declared);
                self.sorted = false;
                return;
            }
            if !self.table.is_builtin_chain(name) {
                self.others.insert(name.to_string());
                return;
            }
        } else if let Some(rest) = line.strip_prefix("-A ") {
            let chain = rest.split(' ').next().unwrap_or_default();
            if Self::is_ours(chain) {
                self.rule_of_ours(chain, line);
                return;
            }
            if !self.table.is_builtin_chain(chain) {
                return;
            }
        } else if line.starts_with('#') {
            return;
        }
        self.reduced.push_str(line);
        self.reduced.push('\n');
    }

    fn rule_of_ours(&mut self, chain: &str, line: &str) {
        let same_chain = self
            .current
            .as_ref()
            .is_some_and(|(i, _)| self.entries[*i].name.as_str() == chain);
        if !same_chain {
            self.finish_current();
            self.sort();
            let Ok(i) = self
                .entries
                .binary_search_by(|e| e.name.as_str().cmp(chain))
            else {
                // A rule of a chain the dump did not declare: iptables-save never prints
                // one; the chain is not known to exist, so it is written like a new one.
                return;
            };
            let hasher = match self.progress[i] {
                Progress::Declared => Some(ChainHasher::new(chain)),
                Progress::Done | Progress::Split => None,
            };
            self.current = Some((i, hasher));
        }
        if let Some((_, Some(h))) = self.current.as_mut() {
            h.rule(line);
        }
    }

    /// The table read.
    ///
    /// # Errors
    /// [`ProxierError::ReadState`] when the built-in chains' part does not parse.
    pub fn finish(mut self) -> Result<KernelTable, ProxierError> {
        self.finish_current();
        self.sort();
        for (e, p) in self.entries.iter_mut().zip(&self.progress) {
            match p {
                Progress::Declared => e.digest = Some(ChainHasher::new(e.name.as_str()).finish()),
                Progress::Done => {}
                Progress::Split => e.digest = None,
            }
        }
        let mut out = crate::iptables::kernel_table(&self.reduced, self.table)?;
        out.chains.append(&mut self.others);
        out.ours = OurChains {
            entries: self.entries,
        };
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
