//! Manifest files: YAML (or JSON) text → a [`ManifestSet`] of validated objects, plus one
//! [`ManifestError`] per problem.
//!
//! A file may hold many YAML documents. The text is split on document-marker lines (`---`,
//! `--- ...`, `...`) and each document is parsed on its own, so a broken document costs only
//! itself. A document is parsed into a [`serde_json::Value`] with serde-saphyr, then:
//!
//! - `kind: List` (and `ServiceList`, `EndpointSliceList`, `NodeList`, as `kubectl get -o yaml`
//!   and the API print them) is unpacked: each entry of `items` is handled as an object (items
//!   of a typed list that lack `kind`/`apiVersion` get the list's).
//! - `v1` `Service`, `discovery.k8s.io/v1` `EndpointSlice` and `v1` `Node` are deserialized into
//!   k8s-openapi types (with [`serde_path_to_error`], so a type error names its field path) and
//!   converted by [`crate::convert`]. These kinds with another `apiVersion` are skipped with a
//!   warning; every other kind is skipped silently (debug log).
//! - An object seen twice (same kind and namespace/name) keeps its first definition; the second
//!   is an error naming where the first is.
//!
//! Errors never stop a load: [`load_path`] and [`parse_text`] return what loaded together with
//! every error. Each error prints as one line, `FILE:LINE: OBJECT: FIELD: MESSAGE`.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};

use kp_model::{EndpointSlice, NamespacedName, Node, ObjectKind, Service, SourceEvent};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tracing::{debug, warn};

use crate::SourceError;
use crate::convert::{self, Converted};

/// One problem found while loading manifests. The object it concerns (if any) was skipped.
///
/// `Display` is one line: `FILE:LINE: OBJECT: FIELD: MESSAGE`, leaving out the parts that are
/// unknown, e.g.
/// `cluster.yaml:12: Service default/nginx-svc: spec.ports[0].port: 70000 is out of range 1-65535`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ManifestError {
    /// The file (or directory) concerned, as it was named when loading.
    pub file: PathBuf,
    /// 1-based line where the YAML document starts (its first line that is not blank or a
    /// comment); `None` for problems with the whole file.
    pub line: Option<usize>,
    /// The object: `Service default/nginx-svc`, `EndpointSlice default/nginx-svc-7xk2p`,
    /// `Node k8s-master`; or `document 3` when the document is not a usable object.
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
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if let Some(object) = &self.object {
            write!(f, ": {object}")?;
        }
        if let Some(field) = &self.field {
            write!(f, ": {field}")?;
        }
        write!(f, ": {}", self.message)
    }
}

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
}

impl ManifestSet {
    /// Whether the set holds no object at all.
    pub fn is_empty(&self) -> bool {
        self.services.is_empty() && self.slices.is_empty() && self.nodes.is_empty()
    }

    /// The events that turn `self` into `newer`: an upsert for every object that is new or
    /// changed, a delete for every object that is gone, nothing for unchanged objects.
    ///
    /// Order: Services, then EndpointSlices, then Nodes; within a kind, by key.
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
        events
    }

    /// The events a source sends first: an upsert for every object (Services, EndpointSlices,
    /// Nodes), then [`SourceEvent::Synced`] for each of the three [`ObjectKind`]s.
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

/// Parses the text of one file (see [`ManifestLoader::add_text`]); `file` only names it in
/// errors.
pub fn parse_text(file: &Path, text: &str) -> (ManifestSet, Vec<ManifestError>) {
    let mut loader = ManifestLoader::new();
    loader.add_text(file, text);
    loader.finish()
}

/// Where an object was first defined, for duplicate errors.
#[derive(Debug, Clone)]
struct Origin {
    file: PathBuf,
    line: usize,
}

/// Accumulates objects across files and texts, detecting duplicates across all of them.
#[derive(Debug, Default)]
pub struct ManifestLoader {
    set: ManifestSet,
    errors: Vec<ManifestError>,
    origins: HashMap<(ObjectKind, String), Origin>,
}

/// One YAML document of a file.
struct Document<'a> {
    /// The document's text (including a `--- ` marker line when content follows the marker).
    text: &'a str,
    /// 1-based line of the first line of `text` in the file.
    first_line: usize,
    /// 1-based line of the first line that is not blank or a comment (what errors report).
    start_line: usize,
    /// 1-based number of the document among the file's non-empty documents.
    number: usize,
}

/// A document's location, for errors.
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
        match std::fs::metadata(path) {
            Err(e) => self.file_error(path, format!("cannot read: {e}")),
            Ok(meta) if meta.is_dir() => {
                let mut files = Vec::new();
                let mut visited = HashSet::new();
                self.collect_files(path, &mut files, &mut visited);
                files.sort();
                for file in files {
                    self.add_file(&file);
                }
            }
            Ok(_) => self.add_file(path),
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
            Err(e) => return self.file_error(dir, format!("cannot read directory: {e}")),
        };
        for entry in entries {
            let entry = match entry {
                Ok(entry) => entry,
                Err(e) => {
                    self.file_error(dir, format!("cannot read directory: {e}"));
                    continue;
                }
            };
            if entry.file_name().as_encoded_bytes().starts_with(b".") {
                continue;
            }
            let path = entry.path();
            match std::fs::metadata(&path) {
                Ok(meta) if meta.is_dir() => self.collect_files(&path, out, visited),
                Ok(meta) if meta.is_file() => {
                    let wanted = path.extension().and_then(|e| e.to_str()).is_some_and(|e| {
                        ["yaml", "yml", "json"]
                            .iter()
                            .any(|w| e.eq_ignore_ascii_case(w))
                    });
                    if wanted {
                        out.push(path);
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    // Only report broken links that look like manifests.
                    let wanted = path.extension().and_then(|e| e.to_str()).is_some_and(|e| {
                        ["yaml", "yml", "json"]
                            .iter()
                            .any(|w| e.eq_ignore_ascii_case(w))
                    });
                    if wanted {
                        self.file_error(&path, format!("cannot read: {e}"));
                    }
                }
            }
        }
    }

    /// Reads one file and adds its documents.
    fn add_file(&mut self, path: &Path) {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) => return self.file_error(path, format!("cannot read: {e}")),
        };
        match String::from_utf8(bytes) {
            Ok(text) => self.add_text(path, &text),
            Err(e) => self.file_error(path, format!("cannot read: not UTF-8 text: {e}")),
        }
    }

    /// Adds the documents of one file's text; `file` names it in errors and in duplicate
    /// reports.
    pub fn add_text(&mut self, file: &Path, text: &str) {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        for doc in split_documents(text) {
            self.add_document(file, &doc);
        }
    }

    /// The objects loaded and the errors found so far.
    pub fn finish(self) -> (ManifestSet, Vec<ManifestError>) {
        (self.set, self.errors)
    }

    fn file_error(&mut self, file: &Path, message: String) {
        self.errors
            .push(ManifestError::new(file, None, None, None, message));
    }

    fn add_document(&mut self, file: &Path, doc: &Document<'_>) {
        let at = At {
            file,
            line: doc.start_line,
            label: format!("document {}", doc.number),
        };
        let mut options = serde_saphyr::Options::default();
        options.with_snippet = false;
        match serde_saphyr::from_str_with_options::<Value>(doc.text, options) {
            Ok(value) => self.add_value(&at, value, None),
            Err(e) => {
                let message = yaml_error_message(&e, doc.first_line);
                self.errors.push(ManifestError::new(
                    file,
                    Some(doc.start_line),
                    Some(at.label),
                    None,
                    format!("cannot parse YAML: {message}"),
                ));
            }
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

    /// Handles one parsed value: an object or a list of objects. `list_kind` is the kind of
    /// the enclosing typed list (`ServiceList`), whose items may omit `kind`/`apiVersion`.
    fn add_value(&mut self, at: &At<'_>, mut value: Value, list: Option<(&str, &str)>) {
        let Value::Object(map) = &mut value else {
            let found = value_type(&value);
            return self.doc_error(
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
            return self.doc_error(at, Some("kind"), "missing; not a Kubernetes object");
        };
        let Some(api_version) = map
            .get("apiVersion")
            .and_then(Value::as_str)
            .map(str::to_string)
        else {
            return self.doc_error(at, Some("apiVersion"), format!("missing in a {kind}"));
        };

        let item_kind = match kind.as_str() {
            "List" => Some(""),
            "ServiceList" => Some("Service"),
            "EndpointSliceList" => Some("EndpointSlice"),
            "NodeList" => Some("Node"),
            _ => None,
        };
        if let Some(item_kind) = item_kind {
            let items = match map.remove("items") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(items)) => items,
                Some(other) => {
                    let found = value_type(&other);
                    return self.doc_error(
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
            _ => {
                debug!(
                    file = %at.file.display(), line = at.line, %kind, %api_version,
                    "ignoring manifest object of a kind a service proxy does not use"
                );
                return;
            }
        };
        let object = object_label(&kind, map);
        if api_version != expected_version {
            warn!(
                file = %at.file.display(), line = at.line, %object, %api_version,
                "ignoring {kind}: apiVersion is not {expected_version}"
            );
            return;
        }

        let at = At {
            file: at.file,
            line: at.line,
            label: object,
        };
        match kind.as_str() {
            "Service" => {
                let Some(svc) = self.typed::<k8s_openapi::api::core::v1::Service>(&at, value)
                else {
                    return;
                };
                match convert::service(&svc) {
                    Ok(Converted::Object(svc)) => {
                        if self.first_definition(&at, ObjectKind::Service, svc.name.to_string()) {
                            self.set.services.insert(svc.name.clone(), svc);
                        }
                    }
                    Ok(Converted::Ignored(why)) => ignored(&at, &why),
                    Err(e) => self.convert_error(&at, e),
                }
            }
            "EndpointSlice" => {
                let Some(slice) =
                    self.typed::<k8s_openapi::api::discovery::v1::EndpointSlice>(&at, value)
                else {
                    return;
                };
                match convert::endpoint_slice(&slice) {
                    Ok(Converted::Object(slice)) => {
                        let key = slice.name.to_string();
                        if self.first_definition(&at, ObjectKind::EndpointSlice, key) {
                            self.set.slices.insert(slice.name.clone(), slice);
                        }
                    }
                    Ok(Converted::Ignored(why)) => ignored(&at, &why),
                    Err(e) => self.convert_error(&at, e),
                }
            }
            _ => {
                let Some(node) = self.typed::<k8s_openapi::api::core::v1::Node>(&at, value) else {
                    return;
                };
                match convert::node(&node) {
                    Ok(node) => {
                        if self.first_definition(&at, ObjectKind::Node, node.name.clone()) {
                            self.set.nodes.insert(node.name.clone(), node);
                        }
                    }
                    Err(e) => self.convert_error(&at, e),
                }
            }
        }
    }

    /// Deserializes into a k8s-openapi type; a failure is an error naming the field path.
    fn typed<T: DeserializeOwned>(&mut self, at: &At<'_>, value: Value) -> Option<T> {
        match serde_path_to_error::deserialize::<_, T>(value) {
            Ok(object) => Some(object),
            Err(e) => {
                let path = e.path().to_string();
                let field = (path != ".").then_some(path);
                self.doc_error(at, field.as_deref(), e.inner().to_string());
                None
            }
        }
    }

    fn convert_error(&mut self, at: &At<'_>, e: SourceError) {
        match e {
            SourceError::Invalid { field, message } => self.doc_error(at, Some(&field), message),
            other => self.doc_error(at, None, other.to_string()),
        }
    }

    /// Records where an object is defined; false (and an error) when it was defined before.
    fn first_definition(&mut self, at: &At<'_>, kind: ObjectKind, key: String) -> bool {
        match self.origins.entry((kind, key)) {
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
                });
                true
            }
        }
    }
}

fn ignored(at: &At<'_>, why: &str) {
    debug!(file = %at.file.display(), line = at.line, object = %at.label, "ignoring object: {why}");
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
    if kind == "Node" {
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

/// The parser's message on one line, with its line number made relative to the file.
fn yaml_error_message(e: &serde_saphyr::Error, first_line: usize) -> String {
    let e = e.without_snippet();
    let mut message = e.to_string();
    if let Some(loc) = e.location() {
        let suffix = format!(" at line {}, column {}", loc.line(), loc.column());
        if let Some(stripped) = message.strip_suffix(&suffix) {
            let line = usize::try_from(loc.line()).unwrap_or(1).saturating_sub(1) + first_line;
            message = format!("{stripped} at line {line}, column {}", loc.column());
        }
    }
    one_line(&message)
}

/// Whether a line starts a document (`---`, optionally followed by a space and content).
fn is_document_start(line: &str) -> bool {
    line == "---" || line.starts_with("--- ") || line.starts_with("---\t")
}

/// Whether a line ends a document (`...`, optionally followed by a comment).
fn is_document_end(line: &str) -> bool {
    line == "..." || line.starts_with("... ") || line.starts_with("...\t")
}

/// Whether a line carries no content: blank, a comment, or a directive (`%YAML 1.2`).
fn is_blank(line: &str) -> bool {
    let t = line.trim_start();
    t.is_empty() || t.starts_with('#') || line.starts_with('%')
}

/// Splits a file's text into its non-empty documents.
fn split_documents(text: &str) -> Vec<Document<'_>> {
    struct Chunk {
        start: usize,
        first_line: usize,
        start_line: Option<usize>,
    }
    fn finish<'a>(text: &'a str, chunk: &Chunk, end: usize, docs: &mut Vec<Document<'a>>) {
        if let Some(start_line) = chunk.start_line {
            let number = docs.len() + 1;
            docs.push(Document {
                text: &text[chunk.start..end],
                first_line: chunk.first_line,
                start_line,
                number,
            });
        }
    }
    let mut docs = Vec::new();
    let mut chunk = Chunk {
        start: 0,
        first_line: 1,
        start_line: None,
    };
    let mut offset = 0;
    for (index, raw) in text.split_inclusive('\n').enumerate() {
        let line_no = index + 1;
        let line = raw.trim_end_matches(['\n', '\r']);
        let next = offset + raw.len();
        if is_document_start(line) {
            finish(text, &chunk, offset, &mut docs);
            let rest = line[3..].trim();
            chunk = if rest.is_empty() || rest.starts_with('#') {
                Chunk {
                    start: next,
                    first_line: line_no + 1,
                    start_line: None,
                }
            } else {
                // Content on the marker line (`--- {a: 1}`, `--- !tag`): keep the marker.
                Chunk {
                    start: offset,
                    first_line: line_no,
                    start_line: Some(line_no),
                }
            };
        } else if is_document_end(line) {
            finish(text, &chunk, offset, &mut docs);
            chunk = Chunk {
                start: next,
                first_line: line_no + 1,
                start_line: None,
            };
        } else if chunk.start_line.is_none() && !is_blank(line) {
            chunk.start_line = Some(line_no);
        }
        offset = next;
    }
    finish(text, &chunk, text.len(), &mut docs);
    docs
}
