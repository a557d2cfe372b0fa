//! [`SourceError`]: the crate's error type.

use std::path::PathBuf;

/// Everything that can go wrong in this crate.
///
/// Per-object problems found while loading manifests are not returned as `Err` but collected as
/// [`crate::manifests::ManifestError`] records (file, line, object, field, message), which carry
/// the message of a [`SourceError::Invalid`] when the problem was found by [`crate::convert`].
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// An object failed validation in [`crate::convert`]; the whole object is rejected.
    ///
    /// `Display` is `FIELD: MESSAGE`, e.g.
    /// `spec.ports[0].port: 70000 is out of range 1-65535`.
    #[error("{field}: {message}")]
    Invalid {
        /// The field path inside the object, in the API's JSON spelling
        /// (`spec.ports[1].port`, `metadata.labels["kubernetes.io/service-name"]`).
        field: String,
        /// What is wrong with it, quoting the offending value.
        message: String,
    },

    /// The path given to [`crate::watch::watch_manifests`] cannot be read at start.
    #[error("cannot read manifests {path}: {source}")]
    Path {
        /// The path as given.
        path: PathBuf,
        /// The I/O error (usually "No such file or directory").
        #[source]
        source: std::io::Error,
    },

    /// The file watcher (inotify) could not be set up for the path.
    #[error("cannot watch manifests {path}: {source}")]
    Watch {
        /// The path (or parent directory) that could not be watched.
        path: PathBuf,
        /// The watcher's error.
        #[source]
        source: notify::Error,
    },

    /// The API-server client could not be configured or built ([`crate::api::client`]): an
    /// unreadable or invalid kubeconfig, a `--master` that is not a URL, no in-cluster
    /// environment and no default kubeconfig, or a TLS/auth setup kube-rs refused.
    ///
    /// `Display` is `CONTEXT: ERROR`, e.g.
    /// `cannot read kubeconfig /etc/kube/proxy.conf: failed to read kubeconfig ...`.
    #[error("{context}: {source}")]
    Client {
        /// What was being done, naming the file or URL concerned.
        context: String,
        /// The underlying kube-rs error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl SourceError {
    /// Builds a [`SourceError::Invalid`] for `field`.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        SourceError::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }
}
