//! Building `ipset restore` payloads: [`RestoreBuilder`] writes commands one by one,
//! [`diff`] writes the payload that turns the current sets into the desired ones.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::types::{SetSpec, SetState};

/// The name [`diff`] uses for the temporary set of a swap (see there).
pub const TEMP_SET_NAME: &str = "KUBE-IPSET-SWAP-TMP";

/// Writes an `ipset restore` payload, one command per line.
///
/// `create`, `add` and `del` are written with `-exist`, so the payload is idempotent: a
/// payload that failed half-way (real `ipset restore` keeps the lines before the failing
/// one, see [`crate::FakeIpset`]) can be run again, and a set that already holds an entry
/// (or no longer does) is not an error. `flush`, `destroy` and `swap` fail on a missing
/// set, as in ipset.
#[derive(Debug, Clone, Default)]
pub struct RestoreBuilder {
    out: String,
    lines: usize,
}

impl RestoreBuilder {
    /// An empty payload.
    pub fn new() -> RestoreBuilder {
        RestoreBuilder::default()
    }

    fn line(&mut self, args: std::fmt::Arguments<'_>) -> &mut Self {
        let _ = self.out.write_fmt(args);
        self.out.push('\n');
        self.lines += 1;
        self
    }

    /// `create NAME TYPE OPTIONS -exist` (see [`SetSpec::create_line`]): creates the set,
    /// or does nothing if an [`SetSpec::exist_compatible`] set exists.
    pub fn create(&mut self, spec: &SetSpec) -> &mut Self {
        self.line(format_args!("{}", spec.create_line(true)))
    }

    /// `add NAME ENTRY -exist`.
    pub fn add(&mut self, name: &str, entry: &str) -> &mut Self {
        self.line(format_args!("add {name} {entry} -exist"))
    }

    /// `del NAME ENTRY -exist`.
    pub fn del(&mut self, name: &str, entry: &str) -> &mut Self {
        self.line(format_args!("del {name} {entry} -exist"))
    }

    /// `flush NAME`: removes every entry.
    pub fn flush(&mut self, name: &str) -> &mut Self {
        self.line(format_args!("flush {name}"))
    }

    /// `destroy NAME`: fails while an iptables rule still references the set.
    pub fn destroy(&mut self, name: &str) -> &mut Self {
        self.line(format_args!("destroy {name}"))
    }

    /// `swap A B`: exchanges the two sets' contents and specs (names stay); both must
    /// exist and be [`SetSpec::swappable`].
    pub fn swap(&mut self, a: &str, b: &str) -> &mut Self {
        self.line(format_args!("swap {a} {b}"))
    }

    /// Number of lines written so far.
    pub fn len(&self) -> usize {
        self.lines
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.lines == 0
    }

    /// The payload (empty when nothing was written).
    pub fn finish(&self) -> Vec<u8> {
        self.out.clone().into_bytes()
    }
}

/// The restore payload that turns `current` (as [`crate::Ipset::save`] returned it) into
/// `desired`, touching only what differs; empty when nothing does.
///
/// Per desired set, in the order given (entries sorted; deletes before adds so `maxelem`
/// is never exceeded on the way):
///
/// * missing: `create`, then an `add` per entry;
/// * present and [`SetSpec::same_set`] (hashsize is not compared: the kernel grows it):
///   `del` of stale entries, `add` of missing ones;
/// * present with the same type and family but another `maxelem`, `range` or `comment`
///   extension (which `create -exist` refuses): the desired set is built under
///   [`TEMP_SET_NAME`] (destroyed first if a previous run left it behind), swapped in with
///   `swap`, and the temporary (now holding the old set) destroyed. iptables rules that
///   reference the set keep working throughout;
/// * present with another type or family (`swap` refuses those): `destroy` and a fresh
///   `create` + `add`s. `destroy` fails while an iptables rule references the set, so the
///   caller must remove such references first.
///
/// Desired entries are compared in canonical form ([`SetSpec::canonical_entry`]; an entry
/// that does not canonicalise is written as given, so the restore fails naming its line).
/// Sets in `current` that are not desired are left alone: destroying them is the caller's
/// decision (with [`RestoreBuilder::destroy`], once nothing references them).
pub fn diff(desired: &[SetState], current: &[SetState]) -> Vec<u8> {
    let current: BTreeMap<&str, &SetState> =
        current.iter().map(|s| (s.spec.name.as_str(), s)).collect();
    let mut b = RestoreBuilder::new();
    let mut temp_exists = current.contains_key(TEMP_SET_NAME);
    for want in desired {
        let spec = &want.spec;
        let entries: Vec<String> = want
            .entries
            .iter()
            .map(|e| spec.canonical_entry(e).unwrap_or_else(|_| e.clone()))
            .collect();
        match current.get(spec.name.as_str()) {
            None => {
                b.create(spec);
                for e in &entries {
                    b.add(&spec.name, e);
                }
            }
            Some(have) if spec.same_set(&have.spec) => {
                let wanted: std::collections::BTreeSet<&str> =
                    entries.iter().map(String::as_str).collect();
                for stale in have.entries.iter().filter(|e| !wanted.contains(e.as_str())) {
                    b.del(&spec.name, stale);
                }
                for e in wanted.iter().filter(|e| !have.entries.contains(**e)) {
                    b.add(&spec.name, e);
                }
            }
            Some(have) if spec.swappable(&have.spec) => {
                if temp_exists {
                    b.destroy(TEMP_SET_NAME);
                    temp_exists = false;
                }
                let temp = SetSpec {
                    name: TEMP_SET_NAME.to_string(),
                    ..spec.clone()
                };
                b.create(&temp);
                for e in &entries {
                    b.add(TEMP_SET_NAME, e);
                }
                b.swap(TEMP_SET_NAME, &spec.name);
                b.destroy(TEMP_SET_NAME);
            }
            Some(_) => {
                b.destroy(&spec.name);
                b.create(spec);
                for e in &entries {
                    b.add(&spec.name, e);
                }
            }
        }
    }
    b.finish()
}
