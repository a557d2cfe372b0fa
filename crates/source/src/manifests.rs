//! Manifest files: YAML (or JSON) text → a [`ManifestSet`] of validated objects, plus one
//! [`ManifestError`] per problem.
//!
//! A file may hold many YAML documents. The text is split on document-marker lines (`---`,
//! `--- ...`, `...`) and each document is parsed on its own, so a broken document costs only
//! itself. A large file is not held whole: it is read once to find its documents, then again
//! as each is parsed, and a document over [`STREAM_ABOVE`] bytes is parsed as it is read
//! (`content.rs`). That includes a document holding bytes that are not UTF-8 (even in a comment): it
//! is skipped whole, with an error naming its first line and the line of the first bad byte,
//! and the file's other documents load ([`ManifestLoader::add_bytes`]); a `kind: List` is one
//! document, so all of its items are skipped, and the error says so. A document is parsed
//! into a [`serde_json::Value`] with serde-saphyr, then:
//!
//! - `kind: List` (and `ServiceList`, `EndpointSliceList`, `NodeList`, `ServiceCIDRList`, as
//!   `kubectl get -o yaml` and the API print them) is unpacked: each entry of `items` is handled as an object (items
//!   of a typed list that lack `kind`/`apiVersion` get the list's). The entries are handled
//!   while the List is parsed, one at a time, and each entry's [`serde_json::Value`] is dropped
//!   before the next is read, so a List of 10,000 Services is never one tree in memory; what
//!   they added stands only if the whole document parses and is a list (see `document.rs`),
//!   so errors, lines and duplicates are those of a List read whole.
//! - `v1` `Service`, `discovery.k8s.io/v1` `EndpointSlice`, `v1` `Node` and
//!   `networking.k8s.io/v1` `ServiceCIDR` are deserialized into k8s-openapi types (with [`serde_path_to_error`], so a type error names its field path) and
//!   converted by [`crate::convert`]. These kinds with another `apiVersion` are skipped with a
//!   warning; every other kind is skipped silently (debug log).
//! - An object seen twice (same kind and namespace/name) keeps its first definition; the second
//!   is an error naming where the first is.
//!
//! Errors never stop a load: [`load_path`] and [`parse_text`] return what loaded together with
//! every error. Each error prints as one line, `FILE:LINE: OBJECT: FIELD: MESSAGE`, where
//! `LINE` is where the document starts or, inside a List, where the item starts. The YAML
//! parser's messages are worded for an operator (`duplicate key "ports"`), without the
//! library's configuration hints. Text from the manifest in an error (a name, a field path, a
//! value, the file name) is printed with its control characters escaped (`\n`, `\u{1b}`;
//! see [`kp_model::escape`]), so a manifest cannot forge log lines.
//!
//! Objects accepted with a warning (an address with leading zeros, read as upstream reads it;
//! see [`crate::convert`]) are listed in [`Loaded::warnings`], in the same one-line form.
//!
//! [`load_path_detailed`] (and [`ManifestLoader::finish_detailed`]) also say, file by file,
//! which objects each file defined, which objects it defines but were rejected, and whether
//! the file was understood whole (read, every document parsed, every object identified by kind
//! and namespace/name); [`crate::last_good`] uses this to keep the last good state of a
//! watched path when an edit breaks it.

use std::borrow::Cow;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};

use kp_model::{
    EndpointSlice, Escaped, NamespacedName, Node, ObjectKind, Service, ServiceCidr, SourceEvent,
    escape,
};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tracing::{debug, warn};

use crate::SourceError;
use crate::convert::{self, ConvertWarning, Converted};

mod content;
mod document;

use content::{BadBytes, Checked, Content, Document};

/// Why a document was not parsed.
enum Unparsed {
    /// It is not YAML (or exceeds the parser's limits).
    Yaml(serde_saphyr::Error),
    /// Its file could not be read again.
    Read(String),
}

/// One problem found while loading manifests. The object it concerns (if any) was skipped (a
/// watcher may keep its last valid version instead; see [`crate::last_good`]).
///
/// `Display` is one line: `FILE:LINE: OBJECT: FIELD: MESSAGE`, leaving out the parts that are
/// unknown, e.g.
/// `cluster.yaml:12: Service default/nginx-svc: spec.ports[0].port: 70000 is out of range 1-65535`.
/// Control characters in any part (a name holding a newline or a terminal escape) are printed
/// escaped (`\n`, `\u{1b}`), so a manifest cannot forge log lines.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ManifestError {
    /// The file (or directory) concerned, as it was named when loading.
    pub file: PathBuf,
    /// 1-based line where the YAML document starts (its first line that is not blank or a
    /// comment); `None` for problems with the whole file.
    pub line: Option<usize>,
    /// The object: `Service default/nginx-svc`, `EndpointSlice default/nginx-svc-7xk2p`,
    /// `Node k8s-master`, `ServiceCIDR kubernetes`; or `document 3` when the document is not a
    /// usable object.
    pub object: Option<String>,
    /// Field path inside the object (`spec.ports[0].port`), when one field is at fault.
    pub field: Option<String>,
    /// What is wrong; a single line.
    pub message: String,
}

impl ManifestError {
    fn new(
        file: &Path,
        line: Option<usize>,
        object: Option<String>,
        field: Option<String>,
        message: impl Into<String>,
    ) -> Self {
        ManifestError {
            file: file.to_path_buf(),
            line,
            object,
            field,
            message: one_line(&message.into()),
        }
    }
}

impl fmt::Display for ManifestError {
    /// Every part is printed through [`kp_model::escape`]: the file name, the object's name,
    /// a field path and the message can all hold text from the manifest.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", escape(&self.file.display().to_string()))?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if let Some(object) = &self.object {
            write!(f, ": {}", Escaped(object))?;
        }
        if let Some(field) = &self.field {
            write!(f, ": {}", Escaped(field))?;
        }
        write!(f, ": {}", Escaped(&self.message))
    }
}

/// A problem that did not stop an object loading (an address with leading zeros, read as
/// upstream reads it): the same record and one-line `Display` as [`ManifestError`], e.g.
/// `t.yaml:1: Service default/web: spec.clusterIP: "172.30.0.041" has leading zeros; read as 172.30.0.41 (...)`.
pub type ManifestWarning = ManifestError;

impl std::error::Error for ManifestError {}

/// Collapses line breaks (and the indentation after them) into single spaces.
fn one_line(text: &str) -> String {
    if !text.contains(['\n', '\r']) {
        return text.to_string();
    }
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The validated objects of a set of manifests, keyed as the tracker keys them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ManifestSet {
    /// Services by namespace/name.
    pub services: BTreeMap<NamespacedName, Service>,
    /// EndpointSlices by their own namespace/name.
    pub slices: BTreeMap<NamespacedName, EndpointSlice>,
    /// Nodes by name.
    pub nodes: BTreeMap<String, Node>,
    /// ServiceCIDRs by name.
    pub service_cidrs: BTreeMap<String, ServiceCidr>,
}

impl ManifestSet {
    /// Whether the set holds no object at all.
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
            && self.slices.is_empty()
            && self.nodes.is_empty()
            && self.service_cidrs.is_empty()
    }

    /// The events that turn `self` into `newer`: an upsert for every object that is new or
    /// changed, a delete for every object that is gone, nothing for unchanged objects.
    ///
    /// Order: Services, then EndpointSlices, then Nodes, then ServiceCIDRs; within a kind, by
    /// key.
    pub fn diff(&self, newer: &ManifestSet) -> Vec<SourceEvent> {
        let mut events = Vec::new();
        diff_map(
            &self.services,
            &newer.services,
            &mut events,
            SourceEvent::ServiceUpsert,
            |k| SourceEvent::ServiceDelete(k.clone()),
        );
        diff_map(
            &self.slices,
            &newer.slices,
            &mut events,
            SourceEvent::SliceUpsert,
            |k| SourceEvent::SliceDelete(k.clone()),
        );
        diff_map(
            &self.nodes,
            &newer.nodes,
            &mut events,
            SourceEvent::NodeUpsert,
            |k| SourceEvent::NodeDelete(k.clone()),
        );
        diff_map(
            &self.service_cidrs,
            &newer.service_cidrs,
            &mut events,
            SourceEvent::ServiceCidrUpsert,
            |k| SourceEvent::ServiceCidrDelete(k.clone()),
        );
        events
    }

    /// The events a source sends first: an upsert for every object (Services, EndpointSlices,
    /// Nodes, ServiceCIDRs), then [`SourceEvent::Synced`] for Services, EndpointSlices and
    /// Nodes (ServiceCIDRs hold no sync back, see [`ObjectKind`]).
    pub fn initial_events(&self) -> Vec<SourceEvent> {
        let mut events = ManifestSet::default().diff(self);
        events.extend(
            [
                ObjectKind::Service,
                ObjectKind::EndpointSlice,
                ObjectKind::Node,
            ]
            .map(SourceEvent::Synced),
        );
        events
    }
}

/// One object's identity: its kind and namespace/name (name for a Node or a ServiceCIDR), as
/// the tracker keys it. `Display` prints it the way errors name objects: `Service default/nginx-svc` (with
/// control characters escaped).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectKey {
    /// A Service, by namespace/name.
    Service(NamespacedName),
    /// An EndpointSlice, by its own namespace/name.
    EndpointSlice(NamespacedName),
    /// A Node, by name.
    Node(String),
    /// A ServiceCIDR, by name.
    ServiceCidr(String),
}

impl ObjectKey {
    /// The object's kind.
    pub fn kind(&self) -> ObjectKind {
        match self {
            ObjectKey::Service(_) => ObjectKind::Service,
            ObjectKey::EndpointSlice(_) => ObjectKind::EndpointSlice,
            ObjectKey::Node(_) => ObjectKind::Node,
            ObjectKey::ServiceCidr(_) => ObjectKind::ServiceCidr,
        }
    }

    /// The event that deletes the object.
    pub fn delete_event(&self) -> SourceEvent {
        match self {
            ObjectKey::Service(name) => SourceEvent::ServiceDelete(name.clone()),
            ObjectKey::EndpointSlice(name) => SourceEvent::SliceDelete(name.clone()),
            ObjectKey::Node(name) => SourceEvent::NodeDelete(name.clone()),
            ObjectKey::ServiceCidr(name) => SourceEvent::ServiceCidrDelete(name.clone()),
        }
    }
}

impl fmt::Display for ObjectKey {
    /// The name is printed through [`kp_model::escape`]: a key can be built from the metadata
    /// of an object that is being rejected.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (kind, name) = match self {
            ObjectKey::Service(name) => ("Service", name),
            ObjectKey::EndpointSlice(name) => ("EndpointSlice", name),
            ObjectKey::Node(name) => return write!(f, "Node {}", Escaped(name)),
            ObjectKey::ServiceCidr(name) => return write!(f, "ServiceCIDR {}", Escaped(name)),
        };
        write!(
            f,
            "{kind} {}/{}",
            Escaped(&name.namespace),
            Escaped(&name.name)
        )
    }
}

impl ManifestSet {
    /// Whether the set holds the object `key`.
    pub fn contains(&self, key: &ObjectKey) -> bool {
        match key {
            ObjectKey::Service(name) => self.services.contains_key(name),
            ObjectKey::EndpointSlice(name) => self.slices.contains_key(name),
            ObjectKey::Node(name) => self.nodes.contains_key(name),
            ObjectKey::ServiceCidr(name) => self.service_cidrs.contains_key(name),
        }
    }

    /// Removes the object `key`.
    fn remove(&mut self, key: &ObjectKey) {
        match key {
            ObjectKey::Service(name) => drop(self.services.remove(name)),
            ObjectKey::EndpointSlice(name) => drop(self.slices.remove(name)),
            ObjectKey::Node(name) => drop(self.nodes.remove(name)),
            ObjectKey::ServiceCidr(name) => drop(self.service_cidrs.remove(name)),
        }
    }

    /// Copies the object `key` from `other` into `self`, replacing any version `self` had.
    /// Returns whether `other` had it.
    pub fn copy_from(&mut self, other: &ManifestSet, key: &ObjectKey) -> bool {
        match key {
            ObjectKey::Service(name) => other
                .services
                .get(name)
                .map(|svc| self.services.insert(name.clone(), svc.clone()))
                .is_some(),
            ObjectKey::EndpointSlice(name) => other
                .slices
                .get(name)
                .map(|slice| self.slices.insert(name.clone(), slice.clone()))
                .is_some(),
            ObjectKey::Node(name) => other
                .nodes
                .get(name)
                .map(|node| self.nodes.insert(name.clone(), node.clone()))
                .is_some(),
            ObjectKey::ServiceCidr(name) => other
                .service_cidrs
                .get(name)
                .map(|sc| self.service_cidrs.insert(name.clone(), sc.clone()))
                .is_some(),
        }
    }
}

fn diff_map<K: Ord, V: PartialEq + Clone>(
    old: &BTreeMap<K, V>,
    new: &BTreeMap<K, V>,
    events: &mut Vec<SourceEvent>,
    upsert: impl Fn(V) -> SourceEvent,
    delete: impl Fn(&K) -> SourceEvent,
) {
    for (key, value) in new {
        if old.get(key) != Some(value) {
            events.push(upsert(value.clone()));
        }
    }
    for key in old.keys() {
        if !new.contains_key(key) {
            events.push(delete(key));
        }
    }
}

/// Loads a file or a directory (see [`ManifestLoader::add_path`]) and returns the objects that
/// loaded and every error. A path that cannot be read is one error naming it.
pub fn load_path(path: &Path) -> (ManifestSet, Vec<ManifestError>) {
    let mut loader = ManifestLoader::new();
    loader.add_path(path);
    loader.finish()
}

/// Like [`load_path`], with what each file defined (see [`Loaded`]).
pub fn load_path_detailed(path: &Path) -> Loaded {
    let mut loader = ManifestLoader::new();
    loader.add_path(path);
    loader.finish_detailed()
}

/// Parses the text of one file (see [`ManifestLoader::add_text`]); `file` only names it in
/// errors.
pub fn parse_text(file: &Path, text: &str) -> (ManifestSet, Vec<ManifestError>) {
    let mut loader = ManifestLoader::new();
    loader.add_text(file, text);
    loader.finish()
}

/// What a load of a path reads, without parsing it: the files [`load_path`] reads there, in
/// order, each with the SHA-256 of its content (or why it could not be read), the directories
/// it lists, and the errors of listing them. The loader reads nothing else, so two equal
/// fingerprints mean two loads find the same; the watcher's periodic re-read uses this to skip
/// the parse when nothing changed ([`crate::watch`]). Files are hashed in pieces, never held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint {
    files: Vec<(PathBuf, Result<[u8; 32], String>)>,
    directories: Vec<PathBuf>,
    errors: Vec<ManifestError>,
}

impl Fingerprint {
    /// The fingerprint of `path` (a file or a directory, as [`load_path`] takes it).
    pub fn of(path: &Path) -> Fingerprint {
        let mut loader = ManifestLoader::new();
        let files = loader
            .list_path(path)
            .into_iter()
            .map(|file| {
                let digest = file_digest(&file).map_err(|e| e.to_string());
                (file, digest)
            })
            .collect();
        Fingerprint {
            files,
            directories: loader.directories,
            errors: loader.errors,
        }
    }

    /// The directories a load lists (as [`Loaded::directories`]).
    pub fn directories(&self) -> &[PathBuf] {
        &self.directories
    }
}

/// The SHA-256 of a file's content, read in pieces.
fn file_digest(file: &Path) -> std::io::Result<[u8; 32]> {
    use sha2::Digest as _;
    use std::io::Read as _;
    let mut input = std::fs::File::open(file)?;
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0; 64 * 1024];
    loop {
        match input.read(&mut buf) {
            Ok(0) => return Ok(hasher.finalize().into()),
            Ok(n) => hasher.update(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Everything one load found: the objects, the errors, and file by file what was defined.
///
/// Error positions (`usize`) are indexes into [`Loaded::errors`].
#[derive(Debug, Clone, Default)]
pub struct Loaded {
    /// The objects that loaded.
    pub set: ManifestSet,
    /// Every problem found, in the order found.
    pub errors: Vec<ManifestError>,
    /// What loaded with a warning (addresses with leading zeros), in the order found; the
    /// caller logs them ([`crate::watch::watch_manifests`] does, each once).
    pub warnings: Vec<ManifestWarning>,
    /// Every file that was read or that failed to be read, as named in errors.
    pub files: BTreeMap<PathBuf, FileLoad>,
    /// Paths whose content is unknown: the loaded path itself when it cannot be inspected, or a
    /// directory that cannot be listed; each with the position of its error. Files at or below
    /// such a path may exist without being in [`Loaded::files`].
    pub unreadable: Vec<(PathBuf, usize)>,
    /// The directories that were listed (the loaded path first, when it is one), as named in
    /// errors; a watcher watches these.
    pub directories: Vec<PathBuf>,
}

/// What one file defined, in a [`Loaded`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileLoad {
    /// The objects of [`Loaded::set`] that come from this file.
    pub objects: BTreeSet<ObjectKey>,
    /// Objects the file defines (identified by kind and namespace/name) that were rejected
    /// (a field failed validation or had the wrong type), each with the position of its error.
    pub rejected: Vec<(ObjectKey, usize)>,
    /// When the file was not understood whole, the position of the first error that says why:
    /// it could not be read, a document could not be parsed as YAML, or an object could not be
    /// identified (not a mapping, no `kind` or `apiVersion`, a Service, EndpointSlice, Node or
    /// ServiceCIDR without a usable `metadata.name`). Such a file may define more objects than
    /// it shows.
    pub incomplete: Option<usize>,
}

/// Where an object was first defined, for duplicate errors.
#[derive(Debug, Clone)]
struct Origin {
    file: PathBuf,
    line: usize,
    /// The serial number of the document that defined it ([`ManifestLoader::documents`]).
    document: u64,
}

/// What the loader did since the document being added started, so that it can be undone
/// when the document does not load after all ([`ManifestLoader::begin_document`]).
#[derive(Debug)]
struct Pending {
    /// The document's file.
    file: PathBuf,
    /// How many errors and warnings there were before it.
    errors: usize,
    warnings: usize,
    /// How many objects it added (each has an [`Origin`] with the document's serial number).
    accepted: usize,
    /// What would have been logged about its skipped objects; logged when it stands.
    skipped: Vec<Skipped>,
}

/// A line about an object that is skipped without an error (logged, not reported).
#[derive(Debug)]
enum Skipped {
    /// A kind a service proxy does not use (debug).
    Kind {
        file: PathBuf,
        line: usize,
        kind: String,
        api_version: String,
    },
    /// A Service, EndpointSlice, Node or ServiceCIDR of another `apiVersion` (warning).
    Version {
        file: PathBuf,
        line: usize,
        object: String,
        kind: String,
        api_version: String,
        expected: &'static str,
    },
    /// An object the proxy ignores, and why (debug).
    Ignored {
        file: PathBuf,
        line: usize,
        object: String,
        why: String,
    },
}

impl Skipped {
    fn log(&self) {
        match self {
            Skipped::Kind {
                file,
                line,
                kind,
                api_version,
            } => debug!(
                file = %escape(&file.display().to_string()), line,
                kind = %Escaped(kind), api_version = %Escaped(api_version),
                "ignoring manifest object of a kind a service proxy does not use"
            ),
            Skipped::Version {
                file,
                line,
                object,
                kind,
                api_version,
                expected,
            } => warn!(
                file = %escape(&file.display().to_string()), line,
                object = %Escaped(object), api_version = %Escaped(api_version),
                "ignoring {kind}: apiVersion is not {expected}"
            ),
            Skipped::Ignored {
                file,
                line,
                object,
                why,
            } => debug!(
                file = %escape(&file.display().to_string()), line,
                object = %Escaped(object), "ignoring object: {why}"
            ),
        }
    }
}

/// Accumulates objects across files and texts, detecting duplicates across all of them.
#[derive(Debug, Default)]
pub struct ManifestLoader {
    set: ManifestSet,
    errors: Vec<ManifestError>,
    warnings: Vec<ManifestWarning>,
    origins: HashMap<ObjectKey, Origin>,
    files: BTreeMap<PathBuf, FileLoad>,
    unreadable: Vec<(PathBuf, usize)>,
    directories: Vec<PathBuf>,
    /// How many documents were started; the last one's serial number.
    documents: u64,
    /// The document being added, while its List items are handed over as they are parsed.
    pending: Option<Pending>,
    /// Documents longer than this are parsed as they are read.
    stream_above: StreamAbove,
}

/// Documents longer than this many bytes (1 MiB; a `kind: List` of about 270 Services) are
/// parsed as they are read from their file, never held; shorter ones are read into memory
/// first, since the parser is about 1.6 times as fast on text as on a reader. A file no longer
/// than this is read whole.
pub const STREAM_ABOVE: usize = 1 << 20;

/// [`STREAM_ABOVE`], or what a test set.
#[derive(Debug)]
struct StreamAbove(usize);

impl Default for StreamAbove {
    fn default() -> Self {
        StreamAbove(STREAM_ABOVE)
    }
}

/// A document's (or a List item's) location, for errors.
struct At<'a> {
    file: &'a Path,
    line: usize,
    /// `document N` (or `document N items[i]` inside a List).
    label: String,
}

impl ManifestLoader {
    /// An empty loader.
    pub fn new() -> Self {
        Self::default()
    }

    /// Loads a file or a directory.
    ///
    /// A directory is read recursively: every file whose name ends in `.yaml`, `.yml` or `.json`
    /// (any case), in path order, skipping hidden files and directories (names starting with
    /// `.`, such as the `..data` directory of a mounted ConfigMap) and following symbolic links
    /// (so the visible links of a ConfigMap mount are read). A file named directly is read
    /// whatever its extension.
    pub fn add_path(&mut self, path: &Path) {
        for file in self.list_path(path) {
            self.add_file(&file);
        }
    }

    /// The files [`ManifestLoader::add_path`] reads at `path`, in order; what cannot be
    /// inspected or listed is recorded as it records it.
    fn list_path(&mut self, path: &Path) -> Vec<PathBuf> {
        match std::fs::metadata(path) {
            Err(e) => {
                self.file_error(path, format!("cannot read: {e}"));
                self.unreadable
                    .push((path.to_path_buf(), self.errors.len().saturating_sub(1)));
                Vec::new()
            }
            Ok(meta) if meta.is_dir() => {
                let mut files = Vec::new();
                let mut visited = HashSet::new();
                self.collect_files(path, &mut files, &mut visited);
                files.sort();
                files
            }
            Ok(_) => vec![path.to_path_buf()],
        }
    }

    fn collect_files(
        &mut self,
        dir: &Path,
        out: &mut Vec<PathBuf>,
        visited: &mut HashSet<PathBuf>,
    ) {
        // Guard against symbolic-link loops.
        if let Ok(canonical) = std::fs::canonicalize(dir)
            && !visited.insert(canonical)
        {
            return;
        }
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) => return self.directory_error(dir, e),
        };
        self.directories.push(dir.to_path_buf());
        for entry in entries {
            let entry = match entry {
                Ok(entry) => entry,
                Err(e) => {
                    self.directory_error(dir, e);
                    continue;
                }
            };
            if entry.file_name().as_encoded_bytes().starts_with(b".") {
                continue;
            }
            let path = entry.path();
            let wanted = path.extension().and_then(|e| e.to_str()).is_some_and(|e| {
                ["yaml", "yml", "json"]
                    .iter()
                    .any(|w| e.eq_ignore_ascii_case(w))
            });
            match std::fs::metadata(&path) {
                Ok(meta) if meta.is_dir() => self.collect_files(&path, out, visited),
                Ok(meta) if meta.is_file() => {
                    if wanted {
                        out.push(path);
                    }
                }
                Ok(_) => {}
                // Only report broken links that look like manifests.
                Err(e) if wanted => self.unreadable_file(&path, format!("cannot read: {e}")),
                Err(_) => {}
            }
        }
    }

    fn directory_error(&mut self, dir: &Path, e: std::io::Error) {
        self.file_error(dir, format!("cannot read directory: {e}"));
        self.unreadable
            .push((dir.to_path_buf(), self.errors.len().saturating_sub(1)));
    }

    /// Reads one file and adds its documents. The file is read once to find its documents,
    /// then again, document by document, as each is parsed: it is never held whole (see
    /// [`content`]).
    fn add_file(&mut self, path: &Path) {
        let limit = self.stream_above.0;
        let read = std::fs::File::open(path).and_then(|mut file| {
            let len = usize::try_from(file.metadata()?.len()).unwrap_or(usize::MAX);
            if len <= limit {
                // Sized as `std::fs::read` sizes it.
                let mut bytes = Vec::with_capacity(len);
                std::io::Read::read_to_end(&mut file, &mut bytes)?;
                return Ok(Err(bytes));
            }
            let found = content::scan(&mut std::io::BufReader::with_capacity(64 * 1024, &file))?;
            Ok(Ok((file, found)))
        });
        match read {
            Ok(Err(bytes)) => self.add_bytes(path, &bytes),
            Ok(Ok((file, found))) => self.add_content(path, Content::File(&file), found),
            Err(e) => self.unreadable_file(path, format!("cannot read: {e}")),
        }
    }

    /// Documents longer than `bytes` are parsed as they are read, never held (see
    /// [`content`]); the default is [`STREAM_ABOVE`]. For the tests, which check that both
    /// ways load the same.
    #[cfg(test)]
    pub(crate) fn stream_documents_above(&mut self, bytes: usize) {
        self.stream_above = StreamAbove(bytes);
    }

    /// Adds the documents of one file's content, which should be UTF-8 text; `file` names it
    /// in errors and in duplicate reports.
    ///
    /// A document (as split by [`ManifestLoader::add_text`]) that holds bytes that are not
    /// UTF-8, even in a comment, is skipped whole with one error naming its first line and
    /// the line of the first bad byte (a `kind: List` document is one document: all its items
    /// are skipped, and the error says so); the other documents load as usual. Such a file is
    /// not understood whole (see [`FileLoad::incomplete`]).
    pub fn add_bytes(&mut self, file: &Path, bytes: &[u8]) {
        match content::scan(&mut &bytes[..]) {
            Ok(found) => self.add_content(file, Content::Bytes(bytes), found),
            // Reading a buffer does not fail.
            Err(e) => self.unreadable_file(file, format!("cannot read: {e}")),
        }
    }

    /// Adds the documents of one file's text; `file` names it in errors and in duplicate
    /// reports.
    pub fn add_text(&mut self, file: &Path, text: &str) {
        self.add_bytes(file, text.as_bytes());
    }

    /// Adds the documents `found` in `content` (see [`content::scan`]): those that hold a
    /// byte that is not UTF-8 are skipped.
    fn add_content(&mut self, file: &Path, content: Content<'_>, found: content::Scan) {
        self.files.entry(file.to_path_buf()).or_default();
        let mut bad = found.bad.iter().peekable();
        for doc in &found.documents {
            let mut inside = Vec::new();
            while let Some(b) = bad.next_if(|b| b.offset < doc.end) {
                if b.offset >= doc.start {
                    inside.push(b);
                } else {
                    self.stray_bad_bytes(file, b);
                }
            }
            if inside.is_empty() {
                self.add_document(file, content, doc);
            } else {
                self.non_utf8_document(file, content, doc, &inside);
            }
        }
        for b in bad {
            self.stray_bad_bytes(file, b);
        }
    }

    /// A document that holds bytes that are not UTF-8: skipped whole, with one error.
    fn non_utf8_document(
        &mut self,
        file: &Path,
        content: Content<'_>,
        doc: &Document,
        bad: &[&BadBytes],
    ) {
        let first = bad[0];
        let more = match bad.len() {
            1 => String::new(),
            n => format!(" (and {} more)", n - 1),
        };
        let described = match content.document_bytes(doc) {
            Ok(bytes) => describe_document(&String::from_utf8_lossy(&bytes)),
            Err(_) => Described::Unknown,
        };
        let skipped = match described {
            Described::List(0) => "this document, a List, is skipped".to_string(),
            Described::List(n) => {
                format!("this document is a List: the whole List ({n} items) is skipped")
            }
            Described::Object(label) => format!("this document ({label}) is skipped"),
            Described::Unknown => "this document is skipped".to_string(),
        };
        let message = format!(
            "not UTF-8 text: invalid byte 0x{:02X} at line {}{more}; {skipped}",
            first.byte, first.line
        );
        self.errors.push(ManifestError::new(
            file,
            Some(doc.start_line),
            Some(format!("document {}", doc.number)),
            None,
            message,
        ));
        self.mark_incomplete(file);
    }

    /// Bytes that are not UTF-8 outside every document (in a comment between documents):
    /// nothing is skipped, but the file is reported.
    fn stray_bad_bytes(&mut self, file: &Path, bad: &BadBytes) {
        self.errors.push(ManifestError::new(
            file,
            Some(bad.line),
            None,
            None,
            format!(
                "not UTF-8 text: invalid byte 0x{:02X} outside any document; ignored",
                bad.byte
            ),
        ));
    }

    /// The objects loaded and the errors found so far. The warnings (see
    /// [`Loaded::warnings`]) are logged here, since the caller does not get them.
    pub fn finish(self) -> (ManifestSet, Vec<ManifestError>) {
        for w in &self.warnings {
            warn!("{w}");
        }
        (self.set, self.errors)
    }

    /// Everything found so far, file by file, warnings included (not logged).
    pub fn finish_detailed(self) -> Loaded {
        Loaded {
            set: self.set,
            errors: self.errors,
            warnings: self.warnings,
            files: self.files,
            unreadable: self.unreadable,
            directories: self.directories,
        }
    }

    fn file_error(&mut self, file: &Path, message: String) {
        self.errors
            .push(ManifestError::new(file, None, None, None, message));
    }

    /// A file-level error for a file whose content is therefore unknown.
    fn unreadable_file(&mut self, file: &Path, message: String) {
        self.file_error(file, message);
        self.mark_incomplete(file);
    }

    /// Marks `file` as not understood whole, because of the last error.
    fn mark_incomplete(&mut self, file: &Path) {
        let position = self.errors.len().saturating_sub(1);
        let entry = self.files.entry(file.to_path_buf()).or_default();
        entry.incomplete.get_or_insert(position);
    }

    /// Records that the object of the last error was rejected; an object that cannot be
    /// identified makes its file incomplete instead.
    fn mark_rejected(&mut self, file: &Path, key: Option<ObjectKey>) {
        match key {
            Some(key) => {
                let position = self.errors.len().saturating_sub(1);
                let entry = self.files.entry(file.to_path_buf()).or_default();
                entry.rejected.push((key, position));
            }
            None => self.mark_incomplete(file),
        }
    }

    /// Parses one document and adds what it defines. The entries of a List's `items` are added
    /// while the document is parsed, one at a time (see [`document`]); they stand only if the
    /// whole document parses and is a list, so the outcome is that of parsing the document
    /// whole first.
    fn add_document(&mut self, file: &Path, content: Content<'_>, doc: &Document) {
        let at = At {
            file,
            line: doc.start_line,
            label: format!("document {}", doc.number),
        };
        self.begin_document(file);
        let parsed = match self.parse_document(&at, content, doc, None) {
            Ok(parsed) => parsed,
            Err(e) => {
                self.end_document(false);
                return self.unparsed(&at, doc, e);
            }
        };
        match (parsed.items, document::list_header(&parsed.value)) {
            (document::Items::Streamed, Some(_)) => self.end_document(true),
            (document::Items::Restart, Some(header)) => {
                // Its items needed the list's kind or apiVersion, which came after them.
                match self.parse_document(&at, content, doc, Some(header)) {
                    Ok(_) => self.end_document(true),
                    // Not expected: the same text parsed a moment ago.
                    Err(e) => {
                        self.end_document(false);
                        self.unparsed(&at, doc, e);
                    }
                }
            }
            _ => {
                // Not a list after all: whatever its items added goes.
                self.end_document(false);
                self.add_value(&at, parsed.value, None);
            }
        }
    }

    /// Parses `doc`, read from `content` as it is parsed, handing its list items to
    /// [`ManifestLoader::add_value`] as they are read.
    fn parse_document(
        &mut self,
        at: &At<'_>,
        content: Content<'_>,
        doc: &Document,
        known: Option<document::ListHeader>,
    ) -> Result<document::ParsedDocument, Unparsed> {
        let mut options = serde_saphyr::Options::default();
        options.with_snippet = false;
        options.budget = Some(budget_for(doc.len()));
        let read_error = |e: std::io::Error| Unparsed::Read(e.to_string());
        if doc.len() <= self.stream_above.0 {
            // Held while parsed: the parser is faster on text than on a reader.
            let bytes = match content {
                Content::Bytes(bytes) => Cow::Borrowed(&bytes[doc.start..doc.end]),
                Content::File(_) => Cow::Owned(content.document_bytes(doc).map_err(read_error)?),
            };
            // The document holds no byte that is not UTF-8, unless the file changed since.
            let text = String::from_utf8_lossy(&bytes);
            let target = document::Target {
                loader: self,
                at,
                first_line: doc.first_line,
                known,
            };
            let input = document::Input::<std::io::Empty>::Text(&text);
            return document::parse(input, options, target).map_err(Unparsed::Yaml);
        }
        let mut reader = Checked::new(content.document(doc).map_err(read_error)?);
        let target = document::Target {
            loader: self,
            at,
            first_line: doc.first_line,
            known,
        };
        let parsed = document::parse(document::Input::Reader(&mut reader), options, target);
        match (reader.error, parsed) {
            (Some(e), _) => Err(Unparsed::Read(e)),
            (None, Ok(parsed)) => Ok(parsed),
            (None, Err(e)) => Err(Unparsed::Yaml(e)),
        }
    }

    /// A document that could not be parsed: one error, and its file is not understood whole.
    fn unparsed(&mut self, at: &At<'_>, doc: &Document, e: Unparsed) {
        match e {
            Unparsed::Yaml(e) => {
                let message = yaml_error_message(&e, doc.first_line);
                self.errors.push(ManifestError::new(
                    at.file,
                    Some(doc.start_line),
                    Some(at.label.clone()),
                    None,
                    format!("cannot parse YAML: {message}"),
                ));
                self.mark_incomplete(at.file);
            }
            Unparsed::Read(e) => self.unreadable_file(at.file, format!("cannot read: {e}")),
        }
    }

    /// Starts a document: from here on, what the loader does can be undone
    /// ([`ManifestLoader::undo_document`]) until [`ManifestLoader::end_document`].
    fn begin_document(&mut self, file: &Path) {
        self.documents += 1;
        self.pending = Some(Pending {
            file: file.to_path_buf(),
            errors: self.errors.len(),
            warnings: self.warnings.len(),
            accepted: 0,
            skipped: Vec::new(),
        });
    }

    /// Undoes what the loader did since the document started: the objects it added, its
    /// errors and warnings, and what they said about its file. The document stays started.
    fn undo_document(&mut self) {
        let Some(pending) = self.pending.as_mut() else {
            return;
        };
        self.errors.truncate(pending.errors);
        self.warnings.truncate(pending.warnings);
        pending.skipped.clear();
        if let Some(load) = self.files.get_mut(&pending.file) {
            load.rejected
                .retain(|&(_, position)| position < pending.errors);
            if load.incomplete.is_some_and(|p| p >= pending.errors) {
                load.incomplete = None;
            }
        }
        if pending.accepted > 0 {
            let document = self.documents;
            let (set, files) = (&mut self.set, &mut self.files);
            self.origins.retain(|key, origin| {
                if origin.document != document {
                    return true;
                }
                set.remove(key);
                if let Some(load) = files.get_mut(&origin.file) {
                    load.objects.remove(key);
                }
                false
            });
            pending.accepted = 0;
        }
    }

    /// Ends the document: what it added stands (`keep`; what was skipped is logged now) or is
    /// undone.
    fn end_document(&mut self, keep: bool) {
        if !keep {
            self.undo_document();
        }
        if let Some(pending) = self.pending.take() {
            for skipped in &pending.skipped {
                skipped.log();
            }
        }
    }

    /// Logs `skipped` now, or when the document being added stands.
    fn skipped(&mut self, skipped: Skipped) {
        match &mut self.pending {
            Some(pending) => pending.skipped.push(skipped),
            None => skipped.log(),
        }
    }

    fn doc_error(&mut self, at: &At<'_>, field: Option<&str>, message: impl Into<String>) {
        self.errors.push(ManifestError::new(
            at.file,
            Some(at.line),
            Some(at.label.clone()),
            field.map(str::to_string),
            message,
        ));
    }

    /// An error about a document (or List item) that is not a usable object.
    fn unidentified(&mut self, at: &At<'_>, field: Option<&str>, message: impl Into<String>) {
        self.doc_error(at, field, message);
        self.mark_incomplete(at.file);
    }

    /// Handles one parsed value: an object or a list of objects. `list` is the item kind and
    /// `apiVersion` of the enclosing typed list (`ServiceList`), whose items may omit
    /// `kind`/`apiVersion`. The items of a list value (a List inside a List) are located at
    /// the value's own line.
    fn add_value(&mut self, at: &At<'_>, mut value: Value, list: Option<(&str, &str)>) {
        let Value::Object(map) = &mut value else {
            let found = value_type(&value);
            return self.unidentified(
                at,
                None,
                format!(
                    "expected a Kubernetes object (a mapping with apiVersion and kind), found {found}"
                ),
            );
        };
        if let Some((item_kind, api_version)) = list {
            map.entry("kind")
                .or_insert_with(|| Value::String(item_kind.to_string()));
            map.entry("apiVersion")
                .or_insert_with(|| Value::String(api_version.to_string()));
        }
        let Some(kind) = map.get("kind").and_then(Value::as_str).map(str::to_string) else {
            return self.unidentified(at, Some("kind"), "missing; not a Kubernetes object");
        };
        let Some(api_version) = map
            .get("apiVersion")
            .and_then(Value::as_str)
            .map(str::to_string)
        else {
            return self.unidentified(at, Some("apiVersion"), format!("missing in a {kind}"));
        };

        if let Some(item_kind) = list_item_kind(&kind) {
            let items = match map.remove("items") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(items)) => items,
                Some(other) => {
                    let found = value_type(&other);
                    return self.unidentified(
                        at,
                        Some("items"),
                        format!("expected a list, found {found}"),
                    );
                }
            };
            for (i, item) in items.into_iter().enumerate() {
                let item_at = At {
                    file: at.file,
                    line: at.line,
                    label: format!("{} items[{i}]", at.label),
                };
                let typed = (!item_kind.is_empty()).then_some((item_kind, api_version.as_str()));
                self.add_value(&item_at, item, typed);
            }
            return;
        }

        let expected_version = match kind.as_str() {
            "Service" | "Node" => "v1",
            "EndpointSlice" => "discovery.k8s.io/v1",
            "ServiceCIDR" => "networking.k8s.io/v1",
            _ => {
                if tracing::enabled!(tracing::Level::DEBUG) {
                    self.skipped(Skipped::Kind {
                        file: at.file.to_path_buf(),
                        line: at.line,
                        kind,
                        api_version,
                    });
                }
                return;
            }
        };
        let object = object_label(&kind, map);
        if api_version != expected_version {
            return self.skipped(Skipped::Version {
                file: at.file.to_path_buf(),
                line: at.line,
                object,
                kind,
                api_version,
                expected: expected_version,
            });
        }
        let key = object_key(&kind, map);

        let at = At {
            file: at.file,
            line: at.line,
            label: object,
        };
        match kind.as_str() {
            "Service" => {
                let Some(svc) = self.typed::<k8s_openapi::api::core::v1::Service>(&at, value, &key)
                else {
                    return;
                };
                let mut warnings = Vec::new();
                match convert::service_with_warnings(&svc, &mut warnings) {
                    Ok(Converted::Object(svc)) => {
                        let key = ObjectKey::Service(svc.name.clone());
                        self.accept(&at, key, warnings, |set| {
                            set.services.insert(svc.name.clone(), svc);
                        });
                    }
                    Ok(Converted::Ignored(why)) => self.ignored(&at, why),
                    Err(e) => self.convert_error(&at, e, key),
                }
            }
            "EndpointSlice" => {
                let Some(slice) =
                    self.typed::<k8s_openapi::api::discovery::v1::EndpointSlice>(&at, value, &key)
                else {
                    return;
                };
                let mut warnings = Vec::new();
                match convert::endpoint_slice_with_warnings(&slice, &mut warnings) {
                    Ok(Converted::Object(slice)) => {
                        let key = ObjectKey::EndpointSlice(slice.name.clone());
                        self.accept(&at, key, warnings, |set| {
                            set.slices.insert(slice.name.clone(), slice);
                        });
                    }
                    Ok(Converted::Ignored(why)) => self.ignored(&at, why),
                    Err(e) => self.convert_error(&at, e, key),
                }
            }
            "ServiceCIDR" => {
                let Some(object) =
                    self.typed::<k8s_openapi::api::networking::v1::ServiceCIDR>(&at, value, &key)
                else {
                    return;
                };
                let mut warnings = Vec::new();
                match convert::service_cidr_with_warnings(&object, &mut warnings) {
                    Ok(sc) => {
                        let key = ObjectKey::ServiceCidr(sc.name.clone());
                        self.accept(&at, key, warnings, |set| {
                            set.service_cidrs.insert(sc.name.clone(), sc);
                        });
                    }
                    Err(e) => self.convert_error(&at, e, key),
                }
            }
            _ => {
                let Some(node) = self.typed::<k8s_openapi::api::core::v1::Node>(&at, value, &key)
                else {
                    return;
                };
                let mut warnings = Vec::new();
                match convert::node_with_warnings(&node, &mut warnings) {
                    Ok(node) => {
                        let key = ObjectKey::Node(node.name.clone());
                        self.accept(&at, key, warnings, |set| {
                            set.nodes.insert(node.name.clone(), node);
                        });
                    }
                    Err(e) => self.convert_error(&at, e, key),
                }
            }
        }
    }

    /// Adds a validated object, with its conversion warnings, unless it was defined before
    /// (then it is a duplicate error).
    fn accept(
        &mut self,
        at: &At<'_>,
        key: ObjectKey,
        warnings: Vec<ConvertWarning>,
        insert: impl FnOnce(&mut ManifestSet),
    ) {
        if self.first_definition(at, key.clone()) {
            insert(&mut self.set);
            let entry = self.files.entry(at.file.to_path_buf()).or_default();
            entry.objects.insert(key);
            for w in warnings {
                self.warnings.push(ManifestError::new(
                    at.file,
                    Some(at.line),
                    Some(at.label.clone()),
                    Some(w.field),
                    w.message,
                ));
            }
        }
    }

    /// Deserializes into a k8s-openapi type; a failure is an error naming the field path.
    fn typed<T: DeserializeOwned>(
        &mut self,
        at: &At<'_>,
        value: Value,
        key: &Option<ObjectKey>,
    ) -> Option<T> {
        match serde_path_to_error::deserialize::<_, T>(value) {
            Ok(object) => Some(object),
            Err(e) => {
                let path = e.path().to_string();
                let field = (path != ".").then_some(path);
                self.doc_error(at, field.as_deref(), e.inner().to_string());
                self.mark_rejected(at.file, key.clone());
                None
            }
        }
    }

    /// An object the proxy ignores (headless, another proxy's): a debug line.
    fn ignored(&mut self, at: &At<'_>, why: String) {
        if tracing::enabled!(tracing::Level::DEBUG) {
            self.skipped(Skipped::Ignored {
                file: at.file.to_path_buf(),
                line: at.line,
                object: at.label.clone(),
                why,
            });
        }
    }

    fn convert_error(&mut self, at: &At<'_>, e: SourceError, key: Option<ObjectKey>) {
        match e {
            SourceError::Invalid { field, message } => self.doc_error(at, Some(&field), message),
            other => self.doc_error(at, None, other.to_string()),
        }
        self.mark_rejected(at.file, key);
    }

    /// Records where an object is defined; false (and an error) when it was defined before.
    fn first_definition(&mut self, at: &At<'_>, key: ObjectKey) -> bool {
        match self.origins.entry(key) {
            Entry::Occupied(first) => {
                let first = first.get();
                let message = format!(
                    "duplicate definition, first defined at {}:{}",
                    first.file.display(),
                    first.line
                );
                self.doc_error(at, None, message);
                false
            }
            Entry::Vacant(slot) => {
                slot.insert(Origin {
                    file: at.file.to_path_buf(),
                    line: at.line,
                    document: self.documents,
                });
                if let Some(pending) = &mut self.pending {
                    pending.accepted += 1;
                }
                true
            }
        }
    }
}

/// The parser's resource limits for a document of `len` bytes: the defaults, raised for large
/// documents so that a `kubectl get -o yaml` List of thousands of objects parses. Every node
/// takes at least a byte of text unless it comes from an alias, and aliases keep their own
/// limits, so scaling with the text keeps the protection against alias bombs.
fn budget_for(len: usize) -> serde_saphyr::Budget {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_nodes = budget.max_nodes.max(len);
    budget.max_events = budget.max_events.max(len.saturating_mul(2));
    budget.max_total_scalar_bytes = budget.max_total_scalar_bytes.max(len);
    budget.max_reader_input_bytes = budget.max_reader_input_bytes.map(|max| max.max(len));
    budget
}

/// The identity of a Service, EndpointSlice, Node or ServiceCIDR, read from the untyped value
/// the way
/// [`crate::convert`] reads it (an absent or empty namespace is `default`); `None` when
/// `metadata.name` (or `metadata.namespace`) is missing, empty or not a string.
fn object_key(kind: &str, map: &serde_json::Map<String, Value>) -> Option<ObjectKey> {
    let meta = map.get("metadata")?;
    let name = meta.get("name")?.as_str().filter(|s| !s.is_empty())?;
    match kind {
        "Node" => return Some(ObjectKey::Node(name.to_string())),
        "ServiceCIDR" => return Some(ObjectKey::ServiceCidr(name.to_string())),
        _ => {}
    }
    let namespace = match meta.get("namespace") {
        None | Some(Value::Null) => "default",
        Some(Value::String(ns)) if ns.is_empty() => "default",
        Some(Value::String(ns)) => ns.as_str(),
        Some(_) => return None,
    };
    let name = NamespacedName::new(namespace, name);
    match kind {
        "Service" => Some(ObjectKey::Service(name)),
        _ => Some(ObjectKey::EndpointSlice(name)),
    }
}

/// The item kind of a list kind the loader unpacks (`""` for `List`, whose items carry
/// their own); `None` for every other kind.
fn list_item_kind(kind: &str) -> Option<&'static str> {
    match kind {
        "List" => Some(""),
        "ServiceList" => Some("Service"),
        "EndpointSliceList" => Some("EndpointSlice"),
        "NodeList" => Some("Node"),
        "ServiceCIDRList" => Some("ServiceCIDR"),
        _ => None,
    }
}

/// `Service default/nginx-svc`, `Node k8s-master`, read from the untyped value so that errors
/// can name the object even when typed deserialization fails.
fn object_label(kind: &str, map: &serde_json::Map<String, Value>) -> String {
    let meta = map.get("metadata");
    let field = |f: &str| {
        meta.and_then(|m| m.get(f))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let name = field("name").unwrap_or("<unnamed>");
    if kind == "Node" || kind == "ServiceCIDR" {
        format!("{kind} {name}")
    } else {
        format!("{kind} {}/{name}", field("namespace").unwrap_or("default"))
    }
}

fn value_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// The parser's message on one line, worded for an operator (see [`OperatorMessages`]), with
/// its line number made relative to the file.
fn yaml_error_message(e: &serde_saphyr::Error, first_line: usize) -> String {
    let e = e.without_snippet();
    let mut message = e.render_with_formatter(&OperatorMessages);
    if let Some(loc) = e.location() {
        let suffix = format!(" at line {}, column {}", loc.line(), loc.column());
        if let Some(stripped) = message.strip_suffix(&suffix) {
            let line = usize::try_from(loc.line()).unwrap_or(1).saturating_sub(1) + first_line;
            message = format!("{stripped} at line {line}, column {}", loc.column());
        }
    }
    one_line(&message)
}

/// serde-saphyr's user-facing messages, with what is still aimed at a programmer removed:
/// `duplicate key "ports"` instead of advice to set `DuplicateKeyPolicy` in `Options`, and any
/// other clause that mentions the library's options or Rust types dropped.
struct OperatorMessages;

impl serde_saphyr::MessageFormatter for OperatorMessages {
    fn format_message<'a>(&self, err: &'a serde_saphyr::Error) -> Cow<'a, str> {
        match err {
            serde_saphyr::Error::DuplicateMappingKey { key: Some(key), .. } => {
                Cow::Owned(format!("duplicate key {key:?}"))
            }
            serde_saphyr::Error::DuplicateMappingKey { key: None, .. } => {
                Cow::Borrowed("duplicate key")
            }
            other => match serde_saphyr::UserMessageFormatter.format_message(other) {
                Cow::Borrowed(text) => strip_library_hints(text),
                Cow::Owned(text) => Cow::Owned(strip_library_hints(&text).into_owned()),
            },
        }
    }
}

/// Drops the sentences and clauses of a parser message that give advice to the program using
/// the library (its `Options`, `...Policy` settings, Rust types like `Option<String>`) rather
/// than to the person writing the YAML. The first clause is always kept.
pub(crate) fn strip_library_hints(text: &str) -> Cow<'_, str> {
    if !is_library_hint(text) {
        return Cow::Borrowed(text);
    }
    let sentences = drop_hint_parts(text, &[". "]);
    Cow::Owned(drop_hint_parts(&sentences, &[", ", "; "]))
}

fn is_library_hint(text: &str) -> bool {
    text.contains("Options") || text.contains("Option<") || text.contains("Policy")
}

/// Splits `text` at `separators`, drops every part after the first that is a library hint,
/// and joins the rest with their own separators.
fn drop_hint_parts(text: &str, separators: &[&str]) -> String {
    let mut kept = String::new();
    let mut rest = text;
    let mut first = true;
    loop {
        let next = separators
            .iter()
            .filter_map(|sep| rest.find(sep).map(|i| (i, sep.len())))
            .min();
        let (part, tail) = match next {
            Some((i, len)) => (&rest[..i + len], Some(&rest[i + len..])),
            None => (rest, None),
        };
        if first || !is_library_hint(part) {
            kept.push_str(part);
        }
        first = false;
        match tail {
            Some(tail) => rest = tail,
            None => break,
        }
    }
    kept.trim_end_matches([',', ';', '.', ' ']).to_string()
}

/// What a skipped document seems to be, for its error.
enum Described {
    /// A `List` (or typed list) of this many items.
    List(usize),
    /// One Service, EndpointSlice, Node or ServiceCIDR: its label (`Service default/web`).
    Object(String),
    /// Anything else, or what does not parse.
    Unknown,
}

/// Reads a document only to say what is being skipped; nothing of it is loaded, or kept
/// (a List's items are counted, not held).
fn describe_document(text: &str) -> Described {
    let mut options = serde_saphyr::Options::default();
    options.with_snippet = false;
    options.budget = Some(budget_for(text.len()));
    let Ok(outline) = document::outline(text, options) else {
        return Described::Unknown;
    };
    match outline.kind.as_ref().and_then(Value::as_str) {
        Some(kind) if list_item_kind(kind).is_some() => Described::List(outline.items.unwrap_or(0)),
        Some(kind @ ("Service" | "EndpointSlice" | "Node" | "ServiceCIDR")) => {
            let mut map = serde_json::Map::new();
            if let Some(metadata) = outline.metadata {
                map.insert("metadata".to_string(), metadata);
            }
            Described::Object(object_label(kind, &map))
        }
        _ => Described::Unknown,
    }
}
