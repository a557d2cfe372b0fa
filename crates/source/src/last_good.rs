//! [`LastGood`]: what a watched manifest path last defined, kept across bad edits.
//!
//! The API server never hands kube-proxy an invalid object, so when an edit to a watched
//! manifest breaks something, the right thing for a proxy is to keep programming what was last
//! valid, report the problem, and wait for the fix. Each reload is therefore merged with the
//! state already applied:
//!
//! - **An invalid object keeps its last valid version.** When an object (same kind and
//!   namespace/name) fails validation or has a field of the wrong type, the version last
//!   loaded stays, and its error ends with `; keeping the last valid version`. An object that
//!   never loaded is simply skipped, as on the first load.
//! - **A file that is not understood whole keeps everything it defined.** When a file cannot be
//!   read (permissions, a dangling link), or any of its documents cannot be parsed as YAML or
//!   holds bytes that are not UTF-8, or an object in it cannot be identified (not a mapping, no `kind`, no
//!   `apiVersion`, a Service, EndpointSlice, Node or ServiceCIDR without a usable `metadata.name`), every
//!   object the file defined at its last good load stays (the watcher remembers which file
//!   defined which object). The objects of its documents that still load are updated or
//!   added as usual. The error (reported once) ends with
//!   `; keeping every object this file defined at its last good load`.
//! - **A path that disappears keeps everything.** When the watched path itself cannot be read
//!   (deleted, renamed away, no permission), or a directory below it cannot be listed, the
//!   objects of every file under it stay, and the error ends with
//!   `; keeping every object last loaded from it`. When it comes back, it is read again
//!   normally: what it no longer defines is deleted.
//! - **Deleting is still possible.** Deleting a file from a watched directory that still exists
//!   deletes the objects it defined; removing an object from a file that still parses deletes
//!   it; so does giving it a kind or `apiVersion` kube-proxy-rs does not read, or a
//!   `service.kubernetes.io/service-proxy-name` or `service.kubernetes.io/headless` label.
//! - **A file rewritten in place keeps its objects for a grace period.** A file that is still
//!   there but became empty, or lost every object it had (`kubectl get -o yaml > file`
//!   truncates first), keeps them for the grace period of [`LastGood::merge_at`], with a
//!   warning; if it is still so afterwards, they go.
//! - **The first load has no last good state** in memory: invalid objects are skipped, and
//!   broken files contribute what they can, completed from their last good copy on disk when
//!   the watcher has a state directory ([`crate::state_dir`]).
//!
//! The state holds a [`Digest`] of each applied object, not the object: keeping an object's
//! last valid version means sending nothing for it, and the tracker holds the one copy. A
//! merge returns the events that bring the tracker from the old state to the new one, with the
//! loaded objects moved into them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use std::hash::Hash;

use kp_model::{ObjectKind, SourceEvent};

use crate::digest::Digest;
use crate::manifests::{Loaded, ManifestError, ManifestSet, ObjectKey};

/// Appended to the error of an invalid object whose last valid version is kept.
pub const KEEP_OBJECT: &str = "keeping the last valid version";
/// Appended to the error that makes a file incomplete, when its objects are kept.
pub const KEEP_FILE: &str = "keeping every object this file defined at its last good load";
/// Appended to the error of an unreadable path, when objects loaded from it are kept.
pub const KEEP_PATH: &str = "keeping every object last loaded from it";

/// The digest of every applied object, by key.
type Applied = BTreeMap<ObjectKey, Digest>;

/// The applied state of a watched path: a digest of each object, and which file defined each
/// of them.
#[derive(Debug, Clone, Default)]
pub struct LastGood {
    applied: Applied,
    files: BTreeMap<PathBuf, BTreeSet<ObjectKey>>,
    /// Files that became empty (or lost every object they had) while still present, with
    /// when that was first seen: their objects are kept until the grace period ends.
    emptied: BTreeMap<PathBuf, Instant>,
}

/// What [`LastGood::merge_at`] says about a file that became empty, for the log (a warning,
/// not a manifest error: nothing is wrong with the file's text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EmptiedNotice {
    /// The file became empty or lost every object it had: its objects are kept for the
    /// grace period.
    Kept {
        /// The file.
        file: PathBuf,
        /// How many objects are kept.
        objects: usize,
        /// The grace period.
        grace: Duration,
    },
    /// The grace period ended with the file still without its objects: they are removed.
    Removed {
        /// The file.
        file: PathBuf,
        /// How many objects go.
        objects: usize,
    },
}

impl std::fmt::Display for EmptiedNotice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EmptiedNotice::Kept {
                file,
                objects,
                grace,
            } => write!(
                f,
                "{}: the file became empty or lost every object it defined (is it being rewritten \
                 in place?); keeping its {objects} object(s) for {}s (--manifest-grace-period). \
                 Replace manifests atomically: write a new file next to it, then rename it over \
                 the old one",
                file.display(),
                grace.as_secs_f64()
            ),
            EmptiedNotice::Removed { file, objects } => write!(
                f,
                "{}: still without its objects after the grace period; removing {objects} \
                 object(s)",
                file.display()
            ),
        }
    }
}

impl LastGood {
    /// The state after a first load, which has nothing to keep: the objects that loaded, the
    /// errors unchanged, and the events a source sends first (an upsert of every object,
    /// Services, then EndpointSlices, then Nodes, then ServiceCIDRs, each by key; then
    /// [`SourceEvent::Synced`] for each kind but ServiceCIDRs, which hold no sync back).
    pub fn first(loaded: Loaded) -> (LastGood, Vec<ManifestError>, Vec<SourceEvent>) {
        let files = loaded
            .files
            .into_iter()
            .map(|(file, load)| (file, load.objects))
            .collect();
        let (applied, mut events) = LastGood::default().events(loaded.set, Applied::new());
        events.extend(
            [
                ObjectKind::Service,
                ObjectKind::EndpointSlice,
                ObjectKind::Node,
            ]
            .map(SourceEvent::Synced),
        );
        let state = LastGood {
            applied,
            files,
            emptied: BTreeMap::new(),
        };
        (state, loaded.errors, events)
    }

    /// Whether the object `key` is applied (loaded, or kept from an earlier load).
    pub fn holds(&self, key: &ObjectKey) -> bool {
        self.applied.contains_key(key)
    }

    /// How many objects are applied.
    pub fn len(&self) -> usize {
        self.applied.len()
    }

    /// Whether no object is applied.
    pub fn is_empty(&self) -> bool {
        self.applied.is_empty()
    }

    /// For every file, the objects it defines (or is kept as defining).
    pub fn files(&self) -> &BTreeMap<PathBuf, BTreeSet<ObjectKey>> {
        &self.files
    }

    /// The state after a reload: `loaded`, plus the last good version of what it could not
    /// load (see the module documentation). Returns the new state, `loaded`'s errors, with
    /// what was kept said at the end of the errors concerned, and the events from `self` to
    /// the new state (an upsert for each new or changed object, a delete for each one gone;
    /// Services, then EndpointSlices, then Nodes, each by key).
    pub fn merge(&self, loaded: Loaded) -> (LastGood, Vec<ManifestError>, Vec<SourceEvent>) {
        let (state, errors, _, events) = self.merge_at(loaded, Instant::now(), Duration::ZERO);
        (state, errors, events)
    }

    /// [`LastGood::merge`], and a file that is still there but became empty or lost every
    /// object it had (a file being rewritten in place: `kubectl get -o yaml > file` truncates
    /// it first) keeps its objects for `grace` from `now`, the first time that was seen; the
    /// notices say when that starts and when it ends. `grace` zero keeps nothing.
    pub fn merge_at(
        &self,
        loaded: Loaded,
        now: Instant,
        grace: Duration,
    ) -> (
        LastGood,
        Vec<ManifestError>,
        Vec<EmptiedNotice>,
        Vec<SourceEvent>,
    ) {
        let mut notices = Vec::new();
        let mut emptied = BTreeMap::new();
        let mut held = Applied::new();
        let Loaded {
            set,
            mut errors,
            files,
            unreadable,
            ..
        } = loaded;
        let mut owners = BTreeMap::new();
        for (file, load) in files {
            let mut owned = load.objects;
            if let Some(position) = load.incomplete {
                let mut kept = false;
                for key in self.files.get(&file).into_iter().flatten() {
                    if self.keep(&set, &mut held, key) {
                        owned.insert(key.clone());
                        kept = true;
                    }
                }
                if kept {
                    note(&mut errors, position, KEEP_FILE);
                }
            }
            for (key, position) in load.rejected {
                if self.keep(&set, &mut held, &key) {
                    owned.insert(key);
                    note(&mut errors, position, KEEP_OBJECT);
                }
            }
            let old = self.files.get(&file);
            if !grace.is_zero()
                && load.incomplete.is_none()
                && let Some(old) = old.filter(|o| !o.is_empty() && o.is_disjoint(&owned))
            {
                let since = self.emptied.get(&file).copied();
                let started = since.unwrap_or(now);
                let missing: Vec<&ObjectKey> = old
                    .iter()
                    .filter(|k| !set.contains(k) && !held.contains_key(*k))
                    .collect();
                if now.saturating_duration_since(started) < grace {
                    if !missing.is_empty() {
                        for key in &missing {
                            if self.keep(&set, &mut held, key) {
                                owned.insert((*key).clone());
                            }
                        }
                        if since.is_none() {
                            notices.push(EmptiedNotice::Kept {
                                file: file.clone(),
                                objects: missing.len(),
                                grace,
                            });
                        }
                        emptied.insert(file.clone(), started);
                    }
                } else if !missing.is_empty() {
                    notices.push(EmptiedNotice::Removed {
                        file: file.clone(),
                        objects: missing.len(),
                    });
                }
            }
            owners.insert(file, owned);
        }
        // Files not seen this time: deleted, unless they are below a path that cannot be read.
        for (file, keys) in &self.files {
            if owners.contains_key(file) {
                continue;
            }
            let Some(&(_, position)) = unreadable.iter().find(|(p, _)| file.starts_with(p)) else {
                continue;
            };
            let owned: BTreeSet<ObjectKey> = keys
                .iter()
                .filter(|key| self.keep(&set, &mut held, key))
                .cloned()
                .collect();
            if !owned.is_empty() {
                note(&mut errors, position, KEEP_PATH);
                owners.insert(file.clone(), owned);
            }
        }
        let (applied, events) = self.events(set, held);
        let state = LastGood {
            applied,
            files: owners,
            emptied,
        };
        (state, errors, notices, events)
    }

    /// When the earliest grace period of an emptied file ends (`None`: no file is in one).
    pub fn grace_deadline(&self, grace: Duration) -> Option<Instant> {
        self.emptied.values().min().map(|since| *since + grace)
    }

    /// Keeps the last good version of `key` (its digest, into `kept`), unless `set` has a
    /// version of it from this load or it is kept already. Returns whether it did.
    fn keep(&self, set: &ManifestSet, kept: &mut Applied, key: &ObjectKey) -> bool {
        if set.contains(key) || kept.contains_key(key) {
            return false;
        }
        match self.applied.get(key) {
            Some(digest) => {
                kept.insert(key.clone(), *digest);
                true
            }
            None => false,
        }
    }

    /// The applied state made of `set` and `kept`, and the events from `self` to it: the
    /// objects of `set` that are new or changed, moved into upserts, and a delete for each
    /// object of `self` in neither.
    fn events(&self, set: ManifestSet, kept: Applied) -> (Applied, Vec<SourceEvent>) {
        let mut applied = kept;
        let mut events = Vec::new();
        let ManifestSet {
            services,
            slices,
            nodes,
            service_cidrs,
        } = set;
        let mut kind = |objects: Vec<(ObjectKey, Digest, SourceEvent)>, of: ObjectKind| {
            for (key, digest, upsert) in objects {
                if self.applied.get(&key) != Some(&digest) {
                    events.push(upsert);
                }
                applied.insert(key, digest);
            }
            for key in self.applied.keys().filter(|k| k.kind() == of) {
                if !applied.contains_key(key) {
                    events.push(key.delete_event());
                }
            }
        };
        kind(
            digested(services, ObjectKey::Service, SourceEvent::ServiceUpsert),
            ObjectKind::Service,
        );
        kind(
            digested(slices, ObjectKey::EndpointSlice, SourceEvent::SliceUpsert),
            ObjectKind::EndpointSlice,
        );
        kind(
            digested(nodes, ObjectKey::Node, SourceEvent::NodeUpsert),
            ObjectKind::Node,
        );
        kind(
            digested(
                service_cidrs,
                ObjectKey::ServiceCidr,
                SourceEvent::ServiceCidrUpsert,
            ),
            ObjectKind::ServiceCidr,
        );
        (applied, events)
    }
}

/// Each object of `objects` with its key, its digest and its upsert event (by key).
fn digested<K, V: Hash>(
    objects: BTreeMap<K, V>,
    key: impl Fn(K) -> ObjectKey,
    upsert: impl Fn(V) -> SourceEvent,
) -> Vec<(ObjectKey, Digest, SourceEvent)> {
    objects
        .into_iter()
        .map(|(k, v)| (key(k), Digest::of(&v), upsert(v)))
        .collect()
}

/// Appends `; text` to the error at `position` (once).
fn note(errors: &mut [ManifestError], position: usize, text: &str) {
    if let Some(error) = errors.get_mut(position)
        && !error.message.ends_with(text)
    {
        error.message = format!("{}; {text}", error.message);
    }
}
