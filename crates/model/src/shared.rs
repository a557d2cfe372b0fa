//! Shared immutable text: [`SharedStr`], [`HintSet`], and the [`Interner`] that makes equal
//! values share one allocation.
//!
//! At 10,000 Services the same few strings (namespaces, port names, node names, zones) appear
//! hundreds of thousands of times across objects and snapshots. Holding them as reference
//! counted text makes every copy a pointer, and interning makes equal texts one allocation.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use crate::{EndpointSlice, EndpointTopology, NamespacedName, Service};

/// Immutable, cheaply cloned text (an `Arc<str>`).
///
/// It dereferences to `str`, compares, hashes, orders and prints (`Display` and `Debug`)
/// exactly like the `String` it replaces, and compares equal to `str`, `&str` and `String`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct SharedStr(Arc<str>);

impl SharedStr {
    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether both values share one allocation.
    pub fn ptr_eq(a: &Self, b: &Self) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }

    /// Number of values sharing this allocation.
    fn share_count(&self) -> usize {
        Arc::strong_count(&self.0)
    }
}

impl Deref for SharedStr {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for SharedStr {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for SharedStr {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SharedStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

impl fmt::Debug for SharedStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl From<&str> for SharedStr {
    fn from(s: &str) -> Self {
        SharedStr(Arc::from(s))
    }
}

impl From<&String> for SharedStr {
    fn from(s: &String) -> Self {
        SharedStr(Arc::from(s.as_str()))
    }
}

impl From<String> for SharedStr {
    fn from(s: String) -> Self {
        SharedStr(Arc::from(s))
    }
}

impl From<&SharedStr> for SharedStr {
    fn from(s: &SharedStr) -> Self {
        s.clone()
    }
}

impl From<Arc<str>> for SharedStr {
    fn from(s: Arc<str>) -> Self {
        SharedStr(s)
    }
}

impl From<SharedStr> for String {
    fn from(s: SharedStr) -> Self {
        s.0.to_string()
    }
}

impl PartialEq<str> for SharedStr {
    fn eq(&self, other: &str) -> bool {
        *self.0 == *other
    }
}

impl PartialEq<&str> for SharedStr {
    fn eq(&self, other: &&str) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<String> for SharedStr {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<SharedStr> for str {
    fn eq(&self, other: &SharedStr) -> bool {
        *self == *other.0
    }
}

impl PartialEq<SharedStr> for &str {
    fn eq(&self, other: &SharedStr) -> bool {
        **self == *other.0
    }
}

impl PartialEq<SharedStr> for String {
    fn eq(&self, other: &SharedStr) -> bool {
        **self == *other.0
    }
}

/// A set of topology hint names (`hints.forZones[].name` or `hints.forNodes[].name`): sorted,
/// without duplicates, shared between the EndpointSlice and the snapshot's endpoints.
///
/// `Debug` prints it like a `BTreeSet`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HintSet(Arc<[SharedStr]>);

impl HintSet {
    /// Whether `name` is in the set.
    pub fn contains(&self, name: &str) -> bool {
        self.0.binary_search_by(|h| h.as_str().cmp(name)).is_ok()
    }

    /// The names, sorted.
    pub fn iter(&self) -> std::slice::Iter<'_, SharedStr> {
        self.0.iter()
    }

    /// Number of names.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether both values share one allocation.
    pub fn ptr_eq(a: &Self, b: &Self) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }
}

impl<S: Into<SharedStr>> FromIterator<S> for HintSet {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Self {
        let mut names: Vec<SharedStr> = iter.into_iter().map(Into::into).collect();
        names.sort_unstable();
        names.dedup();
        HintSet(names.into())
    }
}

impl<'a> IntoIterator for &'a HintSet {
    type Item = &'a SharedStr;
    type IntoIter = std::slice::Iter<'a, SharedStr>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl fmt::Debug for HintSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.0.iter()).finish()
    }
}

/// Makes equal texts and hint sets share one allocation.
///
/// Values nobody else holds any more are dropped from the table now and then (when it has
/// doubled since the last sweep), so a long-running proxy does not keep names of nodes and
/// zones that are gone.
#[derive(Debug, Default)]
pub struct Interner {
    strs: HashSet<SharedStr>,
    hints: HashSet<HintSet>,
    topologies: HashSet<Arc<EndpointTopology>>,
    sweep_at: usize,
}

/// The table size under which the interner never sweeps.
const MIN_SWEEP: usize = 1024;

impl Interner {
    /// An empty interner.
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces `s` by the shared copy of its text.
    pub fn str(&mut self, s: &mut SharedStr) {
        if let Some(shared) = self.strs.get(s.as_str()) {
            if !SharedStr::ptr_eq(shared, s) {
                *s = shared.clone();
            }
            return;
        }
        self.maybe_sweep();
        self.strs.insert(s.clone());
    }

    /// Replaces `h` by the shared copy of its set, after interning its names.
    pub fn hints(&mut self, h: &mut HintSet) {
        if let Some(shared) = self.hints.get(h) {
            if !HintSet::ptr_eq(shared, h) {
                *h = shared.clone();
            }
            return;
        }
        let mut names: Vec<SharedStr> = h.0.to_vec();
        for n in &mut names {
            self.str(n);
        }
        *h = HintSet(names.into());
        self.maybe_sweep();
        self.hints.insert(h.clone());
    }

    /// Interns the namespace of `name` (names themselves are mostly unique).
    pub fn namespace(&mut self, name: &mut NamespacedName) {
        self.str(&mut name.namespace);
    }

    /// Interns the repeated texts of a Service: its namespace and port names.
    pub fn service(&mut self, svc: &mut Service) {
        self.namespace(&mut svc.name);
        for p in &mut svc.ports {
            self.str(&mut p.name);
        }
    }

    /// Interns the repeated texts of an EndpointSlice: namespaces, port names, and each
    /// endpoint's node name, zone and hints.
    pub fn endpoint_slice(&mut self, slice: &mut EndpointSlice) {
        self.namespace(&mut slice.name);
        self.namespace(&mut slice.service);
        for p in &mut slice.ports {
            self.str(&mut p.name);
        }
        for e in &mut slice.endpoints {
            if let Some(n) = &mut e.node_name {
                self.str(n);
            }
            if let Some(t) = &mut e.topology {
                self.topology(t);
            }
        }
    }

    /// Replaces `t` by the shared copy of an equal topology, after interning its texts.
    pub fn topology(&mut self, t: &mut Arc<EndpointTopology>) {
        if let Some(shared) = self.topologies.get(t) {
            if !Arc::ptr_eq(shared, t) {
                *t = shared.clone();
            }
            return;
        }
        let inner = Arc::make_mut(t);
        if let Some(z) = &mut inner.zone {
            self.str(z);
        }
        if let Some(h) = &mut inner.zone_hints {
            self.hints(h);
        }
        if let Some(h) = &mut inner.node_hints {
            self.hints(h);
        }
        self.maybe_sweep();
        self.topologies.insert(t.clone());
    }

    /// Drops values only the table holds, when the tables doubled since the last sweep.
    fn maybe_sweep(&mut self) {
        let len = self.strs.len() + self.hints.len() + self.topologies.len();
        if len < self.sweep_at.max(MIN_SWEEP) {
            return;
        }
        // Topologies first: dropping one releases its texts and hint sets.
        self.topologies.retain(|t| Arc::strong_count(t) > 1);
        self.hints.retain(|h| Arc::strong_count(&h.0) > 1);
        self.strs.retain(|s| s.share_count() > 1);
        self.sweep_at = 2 * (self.strs.len() + self.hints.len() + self.topologies.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_str_behaves_like_string() {
        let s = SharedStr::from("http");
        assert_eq!(s, "http");
        assert_eq!("http", s);
        assert_eq!(s, String::from("http"));
        assert_eq!(format!("{s} {s:?}"), "http \"http\"");
        let (a, b) = (SharedStr::from("a"), SharedStr::from("b"));
        assert!(a < b);
        assert_eq!(SharedStr::default(), "");
        assert_eq!(String::from(s.clone()), "http");
    }

    #[test]
    fn hint_sets_are_sorted_sets() {
        let h: HintSet = ["zb", "za", "zb"].into_iter().collect();
        assert_eq!(h.len(), 2);
        assert!(h.contains("za") && h.contains("zb") && !h.contains("zc"));
        assert_eq!(format!("{h:?}"), r#"{"za", "zb"}"#);
        let same: HintSet = ["za", "zb"].into_iter().collect();
        assert_eq!(h, same);
    }

    #[test]
    fn interner_shares_and_sweeps() {
        let mut i = Interner::new();
        let mut a = SharedStr::from("node-a");
        let mut b = SharedStr::from("node-a");
        i.str(&mut a);
        i.str(&mut b);
        assert!(SharedStr::ptr_eq(&a, &b));
        let mut h1: HintSet = ["z"].into_iter().collect();
        let mut h2: HintSet = ["z"].into_iter().collect();
        i.hints(&mut h1);
        i.hints(&mut h2);
        assert!(HintSet::ptr_eq(&h1, &h2));
        drop((a, b));
        for n in 0..2 * MIN_SWEEP {
            i.str(&mut SharedStr::from(format!("n{n}")));
        }
        assert!(i.strs.len() < MIN_SWEEP, "unused names are swept");
        assert!(i.strs.contains("z"), "names still held stay");
    }

    /// Endpoints with the same zone and hints share one allocation, and the snapshot's
    /// endpoint record stays small (the tracker holds 100,000 of each at 10,000 Services).
    #[test]
    fn endpoint_topologies_are_shared_and_records_small() {
        let mut i = Interner::new();
        let topo = |zone: &str| {
            EndpointTopology::of(Some(zone.into()), Some(["z"].into_iter().collect()), None)
                .unwrap()
        };
        let (mut a, mut b, mut c) = (topo("z"), topo("z"), topo("y"));
        i.topology(&mut a);
        i.topology(&mut b);
        i.topology(&mut c);
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
        // The texts inside are interned too: the hint sets of both are one.
        let (ha, hc) = (
            a.zone_hints.as_ref().unwrap(),
            c.zone_hints.as_ref().unwrap(),
        );
        assert!(HintSet::ptr_eq(ha, hc));
        assert!(EndpointTopology::of(None, None, None).is_none());
        assert!(std::mem::size_of::<crate::Endpoint>() <= 32);
        assert!(std::mem::size_of::<crate::EndpointEntry>() <= 48);
    }
}
