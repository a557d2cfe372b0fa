//! [`watch_manifests`]: the manifest source as a task that keeps the proxy's view in step with
//! the files.
//!
//! The task loads the path, sends the initial events, then watches the path with inotify (via
//! `notify`) and, once a burst of changes has settled, reloads everything and sends the
//! difference. A timer reloads every [`RESYNC_INTERVAL`] too, as a safety net for changes
//! inotify cannot see (a file reached through a symbolic link into a directory outside the
//! path); it sends nothing when nothing changed.
//!
//! # What is watched
//!
//! - The directory that holds the path (not recursively), so that the path being deleted,
//!   renamed, replaced by an editor (write `.x.swp`, rename it over the file) or re-created is
//!   seen at once; of its entries only the path itself and the `..`-prefixed entries of a
//!   mounted ConfigMap (`..data`, `..data_tmp`, `..2026_11_30_...`) matter.
//! - For a directory: the directory and every directory below it that is read (hidden ones,
//!   such as a ConfigMap's timestamped `..2026_...` directories, are neither read nor watched;
//!   a ConfigMap update is seen as the rename of `..data_tmp` over `..data` next to the visible
//!   links). After every reload the watches are brought in line with the directories read: a
//!   new directory is watched (and read once more, so that nothing written before its watch
//!   was set is missed), and a directory that was deleted and re-created, or replaced by a
//!   rename, is watched again. Renaming or writing a hidden file (`.x.swp`) is not a change by
//!   itself; renaming it over a manifest is.
//!
//! The periodic re-read first takes the path's [`Fingerprint`] (every file it would read,
//! hashed in pieces, and the directories it would list): when it equals the one taken before
//! the last load, nothing is parsed, since the load would find what it found. So a large
//! manifest (a `kind: List` of 10,000 Services) is parsed again only when it changed, and the
//! re-read never holds a second copy of every object beside the proxy's.
//!
//! A change is read [`DEBOUNCE`] after the last event of a burst, but never later than
//! [`MAX_DEBOUNCE`] after its first, so an editor's writes, a ConfigMap swap or an `rm -rf` is
//! read once, complete, and a change is applied well within a second.
//!
//! # When an edit breaks something
//!
//! The last good state is kept (see [`crate::last_good`]): an invalid object keeps its last
//! valid version, a file that cannot be read or parsed keeps every object it defined, and the
//! watched path disappearing keeps everything, each with one error saying so. Deleting a file
//! from a watched directory, or an object from a file that still parses, deletes.
//!
//! Errors are passed on once: an error that the previous reload also found is not passed
//! again; fixed and broken again, it is. Warnings (an address with leading zeros, read as
//! upstream reads it; see [`crate::convert`]) are logged (`WARN`) the same way, once.
//!
//! The `notify` library logs `unable to remove watch descriptor from inotify: ... Invalid
//! argument` (at INFO) and `Unable to remove the path from the watches: ... WatchNotFound`
//! (at WARN), both with target `notify::inotify`, when a watched subdirectory is deleted: the
//! kernel has already dropped the watch, and the parent's DELETE event and the directory's
//! DELETE_SELF both ask notify to forget it. Both are expected and harmless; the program's
//! log setup filters them out (`notify::inotify=error`).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use kp_model::SourceEvent;
use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::SourceError;
use crate::last_good::LastGood;
use crate::manifests::{Fingerprint, Loaded, ManifestError, ManifestWarning, load_path_detailed};
use crate::state_dir::StateDir;

/// How long the path must be quiet after a change before it is reloaded, so that an editor's
/// burst of writes (or a ConfigMap's symlink swap) is read once, complete.
pub const DEBOUNCE: Duration = Duration::from_millis(100);

/// The longest a reload waits for a burst of changes to settle, counted from its first event.
pub const MAX_DEBOUNCE: Duration = Duration::from_millis(500);

/// How often the path is re-read even when no change was seen.
pub const RESYNC_INTERVAL: Duration = Duration::from_secs(30);

/// How many times in a row a reload may read the path again because it found directories that
/// were not watched yet.
const MAX_WATCH_ROUNDS: usize = 3;

/// A file modified less than this long ago may still be being written: the reload waits.
pub const STABLE_AFTER: Duration = Duration::from_millis(300);

/// The longest a reload waits for files to stop changing.
pub const MAX_STABLE_WAIT: Duration = Duration::from_secs(3);

/// The default of [`WatchOptions::grace`] (`--manifest-grace-period`).
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);

/// Settings of [`watch_manifests_with`].
#[derive(Debug, Clone, Default)]
pub struct WatchOptions {
    /// How long a file that is still there but became empty, or lost every object it had,
    /// keeps its objects (a file rewritten in place is empty for a moment); zero: no grace.
    pub grace: Duration,
    /// Where each file's last good version is kept ([`StateDir`]); `None`: nowhere.
    pub state_dir: Option<std::sync::Arc<StateDir>>,
}

impl WatchOptions {
    /// The default grace period ([`DEFAULT_GRACE`]) and no state directory.
    pub fn new() -> WatchOptions {
        WatchOptions {
            grace: DEFAULT_GRACE,
            state_dir: None,
        }
    }
}

/// Runs the manifest source for `path` (a file or a directory) until `tx` is closed.
///
/// 1. Fails fast with [`SourceError::Path`] when `path` does not exist or cannot be inspected,
///    and with [`SourceError::Watch`] when it cannot be watched (a directory itself, a file
///    through the directory that holds it).
/// 2. Loads `path`, passes every error to `errors`, then sends the initial events
///    ([`kp_model::SourceEvent`] upserts, then `Synced` for each kind; see
///    [`crate::last_good::LastGood::first`]) as one batch — even when nothing
///    loaded, so the proxy can start. Invalid objects are skipped.
/// 3. Watches (see the module documentation). After each burst of changes, and every
///    [`RESYNC_INTERVAL`], it reloads, merges the result with the last good state
///    ([`LastGood::merge`]), passes to `errors` the errors the previous reload did not have,
///    and sends the difference ([`crate::last_good::LastGood::merge_at`]) as one batch when it
///    is not empty.
///
/// Returns `Ok(())` once `tx` is closed. Uses the default [`WatchOptions`].
pub async fn watch_manifests(
    path: PathBuf,
    tx: mpsc::Sender<Vec<SourceEvent>>,
    errors: impl Fn(&ManifestError) + Send + 'static,
) -> Result<(), SourceError> {
    watch_manifests_with(path, WatchOptions::new(), tx, errors).await
}

/// [`watch_manifests`] with `opts`: a reload waits (up to [`MAX_STABLE_WAIT`]) until no file
/// was modified in the last [`STABLE_AFTER`], so a file being written is not applied half
/// written; and a file that becomes empty or loses every object it had keeps them for
/// `opts.grace` with a warning ([`LastGood::merge_at`]), so a rewrite in place takes no
/// Service down. Deleting a file still removes its objects at once.
pub async fn watch_manifests_with(
    path: PathBuf,
    opts: WatchOptions,
    tx: mpsc::Sender<Vec<SourceEvent>>,
    errors: impl Fn(&ManifestError) + Send + 'static,
) -> Result<(), SourceError> {
    watch_manifests_tuned(path, opts, Tuning::default(), tx, errors).await
}

/// What the tests of the watcher turn: how often the path is re-read, and a count of the
/// loads (each parses every file).
#[derive(Debug, Clone)]
pub(crate) struct Tuning {
    /// [`RESYNC_INTERVAL`] outside tests.
    pub(crate) resync: Duration,
    /// Counts the loads.
    pub(crate) loads: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            resync: RESYNC_INTERVAL,
            loads: Default::default(),
        }
    }
}

/// [`watch_manifests_with`], tuned.
pub(crate) async fn watch_manifests_tuned(
    path: PathBuf,
    opts: WatchOptions,
    tuning: Tuning,
    tx: mpsc::Sender<Vec<SourceEvent>>,
    errors: impl Fn(&ManifestError) + Send + 'static,
) -> Result<(), SourceError> {
    let path_error = |source| SourceError::Path {
        path: path.clone(),
        source,
    };
    let meta = std::fs::metadata(&path).map_err(path_error)?;
    let absolute = std::path::absolute(&path).map_err(path_error)?;

    // Set the watches up before the first load, so no change can slip in between.
    let (notify_tx, mut notify_rx) = mpsc::channel::<()>(1);
    let filter = EventFilter::new(&absolute);
    let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
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
    let mut watches = Watches::new(watcher, &absolute);
    let essential = if meta.is_dir() {
        absolute.clone()
    } else {
        parent_dir(&absolute)
    };
    watches
        .watch(&essential)
        .map_err(|source| SourceError::Watch {
            path: essential.clone(),
            source,
        })?;

    let (mut read, mut loaded) = load_and_watch(&path, &mut watches, &tuning.loads).await;
    if let Some(sd) = &opts.state_dir {
        sd.save_good(&loaded);
        sd.restore(&mut loaded);
    }
    let mut warned = log_warnings(std::mem::take(&mut loaded.warnings), &HashSet::new());
    let (mut state, errs, initial) = LastGood::first(loaded);
    for e in &errs {
        errors(e);
    }
    let mut reported: HashSet<ManifestError> = errs.into_iter().collect();
    if tx.send(initial).await.is_err() {
        return Ok(());
    }

    let mut resync = tokio::time::interval(tuning.resync);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    resync.tick().await; // The first tick is immediate.
    let mut watching = true;
    loop {
        let deadline = state.grace_deadline(opts.grace);
        let periodic = tokio::select! {
            _ = tx.closed() => return Ok(()),
            changed = notify_rx.recv(), if watching => {
                if changed.is_none() {
                    // The watcher is gone (it cannot be while we hold it); keep the timer.
                    warn!("manifest watcher stopped; relying on periodic reloads");
                    watching = false;
                    continue;
                }
                settle(&mut notify_rx).await;
                false
            }
            _ = resync.tick() => true,
            () = sleep_until_opt(deadline) => false,
        };
        // The periodic re-read parses nothing when no file changed since the last load: the
        // load would find what it found (and no grace period is running, which only time ends).
        if periodic
            && deadline.is_none()
            && fingerprint(&path).await == read
            && !watches.update(read.directories())
        {
            continue;
        }
        let (mut now_read, mut loaded) = load_and_watch(&path, &mut watches, &tuning.loads).await;
        let waited = Instant::now();
        while let Some(wait) = recently_written(&loaded, STABLE_AFTER)
            && waited.elapsed() < MAX_STABLE_WAIT
        {
            tokio::time::sleep(wait + Duration::from_millis(10)).await;
            while notify_rx.try_recv().is_ok() {}
            (now_read, loaded) = load_and_watch(&path, &mut watches, &tuning.loads).await;
        }
        read = now_read;
        warned = log_warnings(std::mem::take(&mut loaded.warnings), &warned);
        if let Some(sd) = &opts.state_dir {
            sd.save_good(&loaded);
        }
        let (next, errs, notices, events) =
            state.merge_at(loaded, Instant::now().into_std(), opts.grace);
        for n in &notices {
            warn!("{n}");
        }
        let fresh: HashSet<ManifestError> = errs.into_iter().collect();
        let mut new_errors: Vec<&ManifestError> = fresh.difference(&reported).collect();
        new_errors.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
        for e in new_errors {
            errors(e);
        }
        reported = fresh;
        state = next;
        if events.is_empty() {
            continue;
        }
        debug!(events = events.len(), path = %path.display(), "manifests changed");
        if tx.send(events).await.is_err() {
            return Ok(());
        }
    }
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until_opt(deadline: Option<std::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(Instant::from_std(d)).await,
        None => std::future::pending().await,
    }
}

/// When a file of `loaded` was modified less than `within` ago (it may still be being
/// written): how long until the most recent one is `within` old.
fn recently_written(loaded: &Loaded, within: Duration) -> Option<Duration> {
    let now = std::time::SystemTime::now();
    loaded
        .files
        .keys()
        .filter_map(|f| {
            let modified = std::fs::metadata(f).and_then(|m| m.modified()).ok()?;
            let age = now.duration_since(modified).ok()?;
            within.checked_sub(age).filter(|left| !left.is_zero())
        })
        .max()
}

/// Logs the warnings of a load that the previous load did not have; returns this load's.
fn log_warnings(
    warnings: Vec<ManifestWarning>,
    previous: &HashSet<ManifestWarning>,
) -> HashSet<ManifestWarning> {
    for w in warnings.iter().filter(|w| !previous.contains(*w)) {
        warn!("{w}");
    }
    warnings.into_iter().collect()
}

/// Waits until no change has been seen for [`DEBOUNCE`], or [`MAX_DEBOUNCE`] has passed.
async fn settle(notify_rx: &mut mpsc::Receiver<()>) {
    let start = Instant::now();
    loop {
        tokio::time::sleep(DEBOUNCE).await;
        let mut more = false;
        while notify_rx.try_recv().is_ok() {
            more = true;
        }
        if !more || start.elapsed() + DEBOUNCE > MAX_DEBOUNCE {
            return;
        }
    }
}

/// Loads `path` and brings the watches in line with the directories read; when that added
/// watches, loads again, so that what changed before they were set is seen. Returns the
/// path's [`Fingerprint`] taken just before the load it returns (a change after it makes the
/// next fingerprint differ, so the periodic re-read does not miss it).
async fn load_and_watch(
    path: &Path,
    watches: &mut Watches,
    loads: &std::sync::atomic::AtomicUsize,
) -> (Fingerprint, Loaded) {
    let load = || {
        loads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        load(path)
    };
    let mut read = load().await;
    for _ in 0..MAX_WATCH_ROUNDS {
        if !watches.update(&read.1.directories) {
            break;
        }
        read = load().await;
    }
    read
}

/// Takes the path's fingerprint, then loads it, on the blocking pool; file I/O must not stall
/// the runtime.
async fn load(path: &Path) -> (Fingerprint, Loaded) {
    let owned = path.to_path_buf();
    let read = move || (Fingerprint::of(&owned), load_path_detailed(&owned));
    match tokio::task::spawn_blocking(read.clone()).await {
        Ok(read) => read,
        // Only a panic inside the loader gets here; load on this thread instead.
        Err(_) => read(),
    }
}

/// The path's [`Fingerprint`], taken on the blocking pool.
async fn fingerprint(path: &Path) -> Fingerprint {
    let owned = path.to_path_buf();
    let take = move || Fingerprint::of(&owned);
    match tokio::task::spawn_blocking(take.clone()).await {
        Ok(read) => read,
        Err(_) => take(),
    }
}

/// The directory holding `file` (`/` for the root itself).
fn parent_dir(file: &Path) -> PathBuf {
    match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("/"),
    }
}

/// A directory's identity, to notice one that was replaced under the same name.
type Identity = Option<(u64, u64)>;

#[cfg(unix)]
fn identity(meta: &std::fs::Metadata) -> Identity {
    use std::os::unix::fs::MetadataExt;
    Some((meta.dev(), meta.ino()))
}

#[cfg(not(unix))]
fn identity(_meta: &std::fs::Metadata) -> Identity {
    None
}

/// The directories watched (each non-recursively), by absolute path.
struct Watches {
    watcher: RecommendedWatcher,
    /// The directory holding the path, when the path has one.
    parent: Option<PathBuf>,
    /// What is watched, with the identity of the directory when its watch was set.
    watched: HashMap<PathBuf, Identity>,
    /// Directories whose watch failed and was reported, so it is reported once.
    failed: HashSet<PathBuf>,
}

impl Watches {
    fn new(watcher: RecommendedWatcher, absolute: &Path) -> Self {
        Watches {
            watcher,
            parent: absolute.file_name().map(|_| parent_dir(absolute)),
            watched: HashMap::new(),
            failed: HashSet::new(),
        }
    }

    /// Watches one directory now.
    fn watch(&mut self, dir: &Path) -> notify::Result<()> {
        let id = std::fs::metadata(dir)
            .map_err(|e| notify::Error::io(e).add_path(dir.to_path_buf()))
            .map(|meta| identity(&meta))?;
        self.watcher.watch(dir, RecursiveMode::NonRecursive)?;
        self.watched.insert(dir.to_path_buf(), id);
        Ok(())
    }

    /// Watches the parent and `directories` (as the loader named them), and nothing else;
    /// a directory replaced since its watch was set is watched again. Returns whether a watch
    /// was added.
    fn update(&mut self, directories: &[PathBuf]) -> bool {
        let mut wanted: HashMap<PathBuf, Identity> = HashMap::new();
        let mut seen: HashSet<(u64, u64)> = HashSet::new();
        let candidates = self.parent.iter().cloned().chain(
            directories
                .iter()
                .map(|d| std::path::absolute(d).unwrap_or_else(|_| d.clone())),
        );
        for dir in candidates {
            let Ok(meta) = std::fs::metadata(&dir) else {
                continue;
            };
            let id = identity(&meta);
            // The same directory under two names (a symbolic link) is watched once.
            if meta.is_dir() && id.is_none_or(|id| seen.insert(id)) {
                wanted.insert(dir, id);
            }
        }
        let stale: Vec<PathBuf> = self
            .watched
            .iter()
            .filter(|(dir, id)| wanted.get(*dir) != Some(*id))
            .map(|(dir, _)| dir.clone())
            .collect();
        for dir in stale {
            // Fails when notify already dropped the watch of a deleted directory.
            let _ = self.watcher.unwatch(&dir);
            self.watched.remove(&dir);
        }
        let mut added = false;
        for (dir, id) in wanted {
            if self.watched.contains_key(&dir) {
                continue;
            }
            match self.watcher.watch(&dir, RecursiveMode::NonRecursive) {
                Ok(()) => {
                    debug!(dir = %dir.display(), "watching manifest directory");
                    self.failed.remove(&dir);
                    self.watched.insert(dir, id);
                    added = true;
                }
                Err(e) => {
                    if self.failed.insert(dir.clone()) {
                        warn!(dir = %dir.display(), error = %e,
                            "cannot watch manifest directory; its changes are seen at the periodic reload");
                    }
                }
            }
        }
        added
    }
}

/// Decides which notify events can change what a load would see.
struct EventFilter {
    /// The directory holding the path (absolute), when it has one.
    parent: Option<PathBuf>,
    /// The path's own name in it.
    name: Option<std::ffi::OsString>,
}

impl EventFilter {
    fn new(absolute: &Path) -> Self {
        EventFilter {
            parent: absolute.file_name().map(|_| parent_dir(absolute)),
            name: absolute.file_name().map(|n| n.to_os_string()),
        }
    }

    fn is_relevant(&self, event: &notify::Event) -> bool {
        // Opening and reading (our own loads among them) change nothing.
        if let EventKind::Access(kind) = event.kind
            && !matches!(kind, AccessKind::Close(AccessMode::Write))
        {
            return false;
        }
        event.paths.is_empty() || event.paths.iter().any(|p| self.is_relevant_path(p))
    }

    fn is_relevant_path(&self, path: &Path) -> bool {
        let Some(name) = path.file_name() else {
            return true;
        };
        let bytes = name.as_encoded_bytes();
        let configmap = bytes.starts_with(b"..");
        if path.parent() == self.parent.as_deref() {
            // An entry next to the path: only the path itself and a ConfigMap's entries.
            return Some(name) == self.name.as_deref() || configmap;
        }
        // Inside a watched directory: anything but a hidden file (an editor's swap file).
        configmap || !bytes.starts_with(b".")
    }
}
