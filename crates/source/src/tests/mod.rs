//! Unit tests of the crate: validation messages, manifest loading (and a `kind: List` loaded
//! while it is parsed), diffs, the last good state kept across bad edits, the watcher, and
//! input handled as upstream handles it.

mod convert;
mod input;
mod last_good;
mod list;
mod manifests;
mod watch;

use std::path::Path;

use crate::manifests::{ManifestSet, parse_text};

/// Parses `text` as file `t.yaml`; returns the set and the errors as their one-line texts.
pub(crate) fn parse(text: &str) -> (ManifestSet, Vec<String>) {
    let (set, errors) = parse_text(Path::new("t.yaml"), text);
    (set, errors.iter().map(ToString::to_string).collect())
}

/// The errors of `text`, which must load nothing.
pub(crate) fn errors_only(text: &str) -> Vec<String> {
    let (set, errors) = parse(text);
    assert!(set.is_empty(), "expected nothing to load, got {set:?}");
    errors
}

/// A Service `default/web` with `spec` (lines indented by two spaces) appended.
pub(crate) fn service_yaml(spec: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: default\nspec:\n{spec}"
    )
}

/// An IPv4 EndpointSlice `default/web-abc` of Service `web` with `rest` appended.
pub(crate) fn slice_yaml(rest: &str) -> String {
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-abc\n  \
         namespace: default\n  labels:\n    kubernetes.io/service-name: web\naddressType: IPv4\n{rest}"
    )
}
