//! [`watch_manifests`]: the manifest source as a task that keeps the proxy's view in step with
//! the files.
//!
//! The task loads the path, sends the initial events, then watches the path with inotify (via
//! `notify`) and, after each burst of changes, reloads everything and sends the difference. A
//! timer reloads every [`RESYNC_INTERVAL`] too, as a safety net for changes inotify cannot see
//! (a file reached through a symbolic link into another directory, a watch lost when a
//! directory is replaced); it sends nothing when nothing changed.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kp_model::SourceEvent;
use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::SourceError;
use crate::manifests::{ManifestError, ManifestSet, load_path};

/// How long to wait after a change before reloading, so that an editor's burst of writes (or a
/// ConfigMap's symlink swap) is read once, complete.
pub const DEBOUNCE: Duration = Duration::from_millis(100);

/// How often the path is re-read even when no change was seen.
pub const RESYNC_INTERVAL: Duration = Duration::from_secs(30);

/// Runs the manifest source for `path` (a file or a directory) until `tx` is closed.
///
/// 1. Fails fast with [`SourceError::Path`] when `path` does not exist or cannot be inspected,
///    and with [`SourceError::Watch`] when the watch cannot be set up.
/// 2. Loads `path` ([`load_path`]), passes every error to `errors`, then sends the initial
///    events ([`ManifestSet::initial_events`]: all upserts, then `Synced` for each kind) as one
///    batch — even when nothing loaded, so the proxy can start.
/// 3. Watches: a directory recursively; a file through its parent directory (non-recursively),
///    reacting to events naming the file itself or a hidden `..`-prefixed entry (editors
///    replace a file by renaming over it; a mounted ConfigMap swaps its `..data` link). After
///    each event it waits [`DEBOUNCE`], reloads everything, passes to `errors` only the errors
///    that were not reported by the previous load (a problem left in a file is reported once,
///    not at every reload; fixed and broken again, it is reported again), and sends
///    `old.diff(new)` as one batch when it is not empty. Every [`RESYNC_INTERVAL`] it reloads
///    the same way without waiting for an event.
///
/// A file that disappears loads as empty (with an error), so its objects are deleted. Returns
/// `Ok(())` once `tx` is closed.
pub async fn watch_manifests(
    path: PathBuf,
    tx: mpsc::Sender<Vec<SourceEvent>>,
    errors: impl Fn(&ManifestError) + Send + 'static,
) -> Result<(), SourceError> {
    let meta = std::fs::metadata(&path).map_err(|source| SourceError::Path {
        path: path.clone(),
        source,
    })?;

    // Set the watch up before the first load, so no change can slip in between.
    let (notify_tx, mut notify_rx) = mpsc::channel::<()>(1);
    let filter = EventFilter::new(&path, meta.is_dir());
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        match res {
            Ok(event) if filter.is_relevant(&event) => {
                // A full channel already holds a pending reload; that one will see this change.
                let _ = notify_tx.try_send(());
            }
            Ok(_) => {}
            Err(e) => {
                warn!(error = %e, "manifest watch error; reloading");
                let _ = notify_tx.try_send(());
            }
        }
    })
    .map_err(|source| SourceError::Watch {
        path: path.clone(),
        source,
    })?;
    let (watch_path, mode) = if meta.is_dir() {
        (path.clone(), RecursiveMode::Recursive)
    } else {
        (parent_dir(&path), RecursiveMode::NonRecursive)
    };
    watcher
        .watch(&watch_path, mode)
        .map_err(|source| SourceError::Watch {
            path: watch_path.clone(),
            source,
        })?;

    let (mut current, errs) = load(&path).await;
    for e in &errs {
        errors(e);
    }
    let mut reported: HashSet<ManifestError> = errs.into_iter().collect();
    if tx.send(current.initial_events()).await.is_err() {
        return Ok(());
    }

    let mut resync = tokio::time::interval(RESYNC_INTERVAL);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    resync.tick().await; // The first tick is immediate.
    let mut watching = true;
    loop {
        tokio::select! {
            _ = tx.closed() => return Ok(()),
            changed = notify_rx.recv(), if watching => {
                if changed.is_none() {
                    // The watcher is gone (it cannot be while we hold it); keep the timer.
                    warn!("manifest watcher stopped; relying on periodic reloads");
                    watching = false;
                    continue;
                }
                tokio::time::sleep(DEBOUNCE).await;
                while notify_rx.try_recv().is_ok() {}
            }
            _ = resync.tick() => {}
        }
        let (newer, errs) = load(&path).await;
        let fresh: HashSet<ManifestError> = errs.into_iter().collect();
        let mut new_errors: Vec<&ManifestError> = fresh.difference(&reported).collect();
        new_errors.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
        for e in new_errors {
            errors(e);
        }
        reported = fresh;
        let events = current.diff(&newer);
        current = newer;
        if events.is_empty() {
            continue;
        }
        debug!(events = events.len(), path = %path.display(), "manifests changed");
        if tx.send(events).await.is_err() {
            return Ok(());
        }
    }
}

/// Loads on the blocking pool; file I/O must not stall the runtime.
async fn load(path: &Path) -> (ManifestSet, Vec<ManifestError>) {
    let owned = path.to_path_buf();
    match tokio::task::spawn_blocking(move || load_path(&owned)).await {
        Ok(loaded) => loaded,
        // Only a panic inside the loader gets here; load on this thread instead.
        Err(_) => load_path(path),
    }
}

/// The directory holding `file` (`.` for a bare file name).
fn parent_dir(file: &Path) -> PathBuf {
    match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Decides which notify events can change what a load would see.
struct EventFilter {
    /// For a watched file: its file name; `None` when watching a directory.
    file_name: Option<std::ffi::OsString>,
}

impl EventFilter {
    fn new(path: &Path, is_dir: bool) -> Self {
        let file_name = if is_dir {
            None
        } else {
            path.file_name().map(|n| n.to_os_string())
        };
        EventFilter { file_name }
    }

    fn is_relevant(&self, event: &notify::Event) -> bool {
        // Opening and reading (our own loads among them) change nothing.
        if let EventKind::Access(kind) = event.kind
            && !matches!(kind, AccessKind::Close(AccessMode::Write))
        {
            return false;
        }
        let Some(name) = &self.file_name else {
            return true;
        };
        event.paths.is_empty()
            || event.paths.iter().any(|p| {
                p.file_name().is_some_and(|n| {
                    n == name.as_os_str() || n.as_encoded_bytes().starts_with(b"..")
                })
            })
    }
}
