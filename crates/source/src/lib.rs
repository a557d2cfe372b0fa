//! kp-source: where Services, EndpointSlices and Nodes come from.
//!
//! There are two sources: a set of manifest files (`--manifests PATH`): ordinary Kubernetes
//! YAML (or JSON), as `kubectl get -o yaml` prints it or as one would `kubectl apply` it; and
//! the API server ([`api`]). The crate has these layers:
//!
//! - [`convert`]: k8s-openapi objects → validated [`kp_model`] objects. Every value that can end
//!   up in a rule (names, IPs, CIDRs, ports, enums) is checked here; an object with a problem is
//!   rejected whole with a [`SourceError::Invalid`] naming the field path. This layer does not
//!   know about files, so the API-server source can reuse it.
//! - [`manifests`]: YAML text and files → a [`manifests::ManifestSet`] plus a list of
//!   [`manifests::ManifestError`]s (one line each, naming file, line, object and field), and
//!   the [`kp_model::SourceEvent`]s that turn one set into another.
//! - [`last_good`]: the state a watcher keeps between loads, so that a bad edit (an invalid
//!   object, a file that does not parse, the path disappearing) keeps the last good objects
//!   instead of deleting live Services.
//! - [`state_dir`]: each file's last good version on disk, so a restart with a broken file
//!   still serves what it last defined.
//! - [`watch`]: the task that loads a path, sends the initial events, then watches the path
//!   (inotify) and sends the differences whenever it changes.
//! - [`api`]: the API-server source: list/watch of Services, EndpointSlices and this node's
//!   Node with upstream kube-proxy's selectors (through kube-rs), validated by [`convert`]
//!   with the same last-good policy, sending only differences, with a health signal.

pub mod api;
pub mod convert;
pub mod digest;
pub mod last_good;
pub mod manifests;
pub mod state_dir;
pub mod watch;

mod error;

pub use error::SourceError;

#[cfg(test)]
mod tests;
